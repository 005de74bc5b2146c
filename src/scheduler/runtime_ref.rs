//! The scheduler's side of [`RuntimeRef`] (declared, opaque, in `fiber/schedule.rs`): the
//! counted reference to a runtime's [`Shared`] state, and the [`Schedule`] implementation that
//! fiber/ calls through to make fibers runnable and give records back.

use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::Shared;
use super::carrier;
use crate::fiber::schedule::{RuntimeRef, RuntimeState, Schedule, Wake};
use crate::fiber::{FiberRecord, FiberRef};

/// References to a runtime's state ([`RuntimeRef`], held by every fiber record, handle and
/// carrier) are counted in `Shared::refs`.
///
/// Counting every spawn on one atomic would put a cache line shared by all carriers on the
/// spawn path: a carrier's cached records keep their references between fibers, counted a
/// batch at a time as records come from and go to the runtime's pool (`Caches::records`), and
/// references dropped on a carrier go to its local stock, given back in batches (`MAX_STOCK`).
pub(crate) const STOCK_BATCH: usize = 64;

impl RuntimeRef {
    pub(crate) fn new(shared: Shared) -> RuntimeRef {
        shared.refs.store(1, Ordering::Relaxed);
        // SAFETY: the state is a `Shared`, and the count of 1 is this reference's.
        unsafe { RuntimeRef::from_raw(NonNull::from(Box::leak(Box::new(shared))).cast::<RuntimeState>()) }
    }

    /// Adds `n` references at once and returns them as a stock count.
    pub(crate) fn acquire_stock(&self, n: usize) {
        self.refs.fetch_add(n, Ordering::Relaxed);
    }

    /// A new counted reference to `shared`.
    ///
    /// # Safety
    /// `shared` must be owned by a `RuntimeRef` allocation that some live reference keeps alive.
    pub(crate) unsafe fn from_shared(shared: &Shared) -> RuntimeRef {
        shared.refs.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the state is a `Shared`, and the reference was just counted.
        unsafe { RuntimeRef::from_raw(NonNull::from(shared).cast::<RuntimeState>()) }
    }

    /// Materialises one reference from a stock the caller owns.
    ///
    /// # Safety
    /// The caller must own at least one unit of stock (from `acquire_stock`) and give it up.
    pub(crate) unsafe fn take_from_stock(&self) -> RuntimeRef {
        // SAFETY: the same state; the unit of stock the caller gives up is its count.
        unsafe { RuntimeRef::from_raw(self.as_raw()) }
    }

    /// Gives back `n` units of stock.
    pub(crate) fn release_stock(&self, n: usize) {
        if n > 0 {
            // SAFETY: the caller owned `n` references, and `self` is one more, so this cannot
            // reach zero here.
            unsafe { self.release(n) };
        }
    }

    /// # Safety
    /// The caller gives up `n` references it owns.
    unsafe fn release(&self, n: usize) {
        // Release/Acquire as in `Arc::drop`: every use of the state happens before its free.
        if self.refs.fetch_sub(n, Ordering::Release) == n {
            std::sync::atomic::fence(Ordering::Acquire);
            // SAFETY: the count reached zero: no other reference exists, and the pointer came
            // from `Box::leak` in `new`.
            drop(unsafe { Box::from_raw(self.ptr().cast_mut()) });
        }
    }

    /// The state, as the `Shared` every `RuntimeRef` points to (see `new`, `from_shared`).
    #[inline(always)]
    pub(crate) fn ptr(&self) -> *const Shared {
        self.as_raw().as_ptr().cast::<Shared>().cast_const()
    }
}

impl Clone for RuntimeRef {
    fn clone(&self) -> RuntimeRef {
        self.refs.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the same state; the reference was just counted.
        unsafe { RuntimeRef::from_raw(self.as_raw()) }
    }
}

impl std::ops::Deref for RuntimeRef {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        // SAFETY: every `RuntimeRef` points to a `Shared` (see `ptr`), and the reference count
        // keeps it alive while `self` exists.
        unsafe { &*self.ptr() }
    }
}

impl Drop for RuntimeRef {
    fn drop(&mut self) {
        let c = carrier::here();
        if !c.is_null() {
            // SAFETY: a non-null carrier pointer is the live carrier of this thread.
            let c = unsafe { &*c };
            if std::ptr::eq(c.shared(), self.ptr()) {
                c.stock_ref();
                return;
            }
        }
        // SAFETY: this reference is being dropped: we own it and give it up.
        unsafe { self.release(1) };
    }
}

/// A record's last reference is gone: put it in a pool of its runtime. On one of the
/// runtime's carriers it goes to the carrier's own cache with its runtime reference still in
/// it (`Caches::records`); elsewhere to the runtime's pool, and the reference is dropped. Inlined
/// into `FiberRecord::recycle`, its one caller, which is already a call of its own: a second
/// frame cost a tail jump and three registers saved again per fiber (`arch/performance.md`).
///
/// # Safety
/// The record's last reference is gone: it is unused, cleared, and the caller's alone.
#[inline(always)]
pub(crate) unsafe fn recycle_record(ptr: NonNull<FiberRecord>) {
    // SAFETY: the contract.
    let rec = unsafe { ptr.as_ref() };
    let c = carrier::here();
    if !c.is_null() {
        // SAFETY: a non-null carrier pointer is this thread's live carrier.
        let c = unsafe { &*c };
        if std::ptr::eq(c.shared(), rec.runtime().ptr()) {
            c.give_record(ptr);
            return;
        }
    }
    // SAFETY: as above.
    unsafe { recycle_elsewhere(ptr) };
}

/// `recycle_record` off the record's runtime's carriers: the record goes to the runtime's pool,
/// without its reference. Out of line: the recycling on a carrier keeps a smaller frame.
///
/// # Safety
/// The record's last reference is gone: it is unused, and the caller's.
#[cold]
#[inline(never)]
unsafe fn recycle_elsewhere(ptr: NonNull<FiberRecord>) {
    // SAFETY: the caller's contract.
    let rt = unsafe { ptr.as_ref().take_runtime() };
    // The pool belongs to the runtime, which `rt` keeps alive until after this.
    rt.give_records(std::iter::once(ptr));
}

/// Makes `f` runnable, from anywhere.
pub(crate) fn schedule(f: FiberRef, wake: Wake) {
    let c = carrier::here();
    if !c.is_null() {
        // SAFETY: a non-null carrier pointer is the live carrier of this thread; we use it
        // before any switch point.
        let c = unsafe { &*c };
        if std::ptr::eq(c.shared(), f.runtime().ptr()) {
            c.schedule_local(f, wake);
            return;
        }
    }
    schedule_elsewhere(f, wake);
}

/// `schedule` from a thread that is not one of `f`'s runtime's carriers. Out of line, so that
/// the carrier's path keeps a small frame: with this inlined, its saved registers came and went
/// with unrelated changes elsewhere (W4 ±8 instructions per round trip, `arch/performance.md`).
#[cold]
#[inline(never)]
fn schedule_elsewhere(f: FiberRef, wake: Wake) {
    let rt = f.runtime().clone();
    rt.trace_wake_remote(&f);
    if matches!(wake, Wake::Unpark | Wake::Joiner) {
        rt.remote.unparks.fetch_add(1, Ordering::Relaxed);
    }
    rt.schedule_remote(f);
}

impl Schedule for RuntimeRef {
    #[inline(always)]
    fn schedule(f: FiberRef, wake: Wake) {
        schedule(f, wake);
    }

    #[inline(always)]
    unsafe fn recycle(rec: NonNull<FiberRecord>) {
        // SAFETY: the trait method's contract, which is this one's.
        unsafe { recycle_record(rec) };
    }

    #[inline(always)]
    fn arm_timer(rec: &FiberRecord, deadline: Instant) -> u64 {
        crate::scheduler::time::arm_timer(rec, deadline)
    }

    #[inline(always)]
    fn disarm(rec: &FiberRecord, generation: u64) -> bool {
        crate::scheduler::time::disarm(rec, generation)
    }

    fn cancel_one(&self) -> bool {
        super::shutdown::cancel_one(self)
    }

    #[inline(always)]
    fn stamp(&self) -> u64 {
        self.clock.stamp()
    }

    fn panicked(rec: &FiberRecord) {
        super::carrier::trace_panic(rec.id().as_u64());
        #[cfg(feature = "tracing")]
        tracing::error!(
            target: "virtual_threads",
            fiber = rec.id().as_u64(),
            name = rec.name().unwrap_or(""),
            spawned_at = %rec.spawned_at(),
            "a fiber panicked"
        );
    }
}
