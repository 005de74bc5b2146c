//! Spawning: the fiber `Builder`, `spawn`, and the one function that creates every fiber.

use std::io;
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, Location, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use corosensei::Coroutine;

use super::join::{self, JoinHandle};
use super::park::next_id;
use super::stack::{FiberStack, SizeClass, usable_size};
use super::{Co, FiberRecord, FiberYielder, Init, STAGE_CLOSURE, STAGE_RESULT, StageVTable, Suspend};
use crate::runtime::context;
use crate::scheduler::RuntimeRef;

/// What `join` returns for a fiber that its runtime's drop unwound before it finished.
pub(crate) const CANCELLED: &str = "fiber cancelled: its runtime was dropped before it finished";

/// Fiber factory, like `std::thread::Builder`: a name and a stack size for the next fiber.
#[derive(Debug, Default, Clone)]
pub struct Builder {
    name: Option<String>,
    stack_size: Option<usize>,
}

impl Builder {
    /// A builder with the runtime's defaults.
    pub fn new() -> Builder {
        Builder::default()
    }

    /// Names the fiber; the name shows in panics' messages, dumps and
    /// [`Fiber::name`](crate::Fiber::name).
    ///
    /// A panic in a fiber prints a line naming the fiber (id, name, spawn site) before the
    /// message of the panic hook that was set when the first runtime started (std's names the
    /// thread, which is the carrier: `std::thread::current()` inside a fiber is its carrier
    /// thread; [`vt::current`](crate::current) is the fiber). A hook set after that replaces
    /// the runtime's, which then prints nothing.
    pub fn name(mut self, name: String) -> Builder {
        self.name = Some(name);
        self
    }

    /// The fiber's usable stack in bytes (rounded up to whole pages), instead of the runtime's
    /// default (128 KiB unless `runtime::Builder::stack_size` says otherwise). It is reserved
    /// address space: only the pages the fiber touches cost memory.
    pub fn stack_size(mut self, bytes: usize) -> Builder {
        self.stack_size = Some(bytes);
        self
    }

    /// Spawns the fiber on the current runtime: the caller's if it is a fiber, otherwise the
    /// process-wide default runtime (started on first use).
    ///
    /// Errors: `InvalidInput` for a stack size out of range; `OutOfMemory` when no stack can be
    /// had (the message names the limit and how to raise it).
    #[track_caller]
    pub fn spawn<F, T>(self, f: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let at = Location::caller();
        if self.name.is_none() && self.stack_size.is_none() {
            return spawn_here(f, at);
        }
        // SAFETY: `F` and `T` are 'static: nothing borrowed can dangle.
        crate::runtime::with_current_runtime(|rt| unsafe { self.spawn_unchecked_at(rt, f, at, None) })
    }

    /// Spawns the fiber on the runtime `handle` refers to.
    #[track_caller]
    pub fn spawn_on<F, T>(self, handle: &crate::Handle, f: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let at = Location::caller();
        // SAFETY: `F` and `T` are 'static: nothing borrowed can dangle.
        unsafe { self.spawn_unchecked_at(handle.runtime(), f, at, None) }
    }

    /// # Safety
    /// If `F` or `T` borrow anything, the caller must wait for the fiber's result to be taken
    /// or dropped (its join to complete, or its scope to end) before the borrowed data goes
    /// away, on every path, panics included.
    pub(crate) unsafe fn spawn_unchecked_at<F, T>(
        self,
        rt: &RuntimeRef,
        f: F,
        at: &'static Location<'static>,
        scope: Option<Arc<crate::scope::ScopeData>>,
    ) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        let class = match self.stack_size {
            Some(bytes) => SizeClass::get(usable_size(bytes)?),
            None => rt.stacks,
        };
        let c = context::carrier();
        // SAFETY: a non-null carrier pointer is this thread's live carrier; it is used only
        // until `schedule_local` below, before any switch point.
        let any_carrier = (!c.is_null()).then(|| unsafe { &*c });
        let local = any_carrier.filter(|c| std::ptr::eq(c.shared(), rt.ptr()));

        // The stack is bound at first run; make sure now that one can be had, so that running
        // out is this call's error rather than a surprise later.
        match local {
            Some(c) => c.ensure_stack(class)?,
            None => class.ensure_available()?,
        }
        let id = match any_carrier {
            Some(c) => c.next_id(),
            None => context::with_plain(|p| next_id(&mut p.ids)),
        };
        let (slot, runtime) = match local {
            Some(c) => (c.alloc_record(), c.take_ref()),
            None => (rt.alloc_record(), rt.clone()),
        };
        // The spawner's depth: the fiber running on this thread, whichever runtime it is of.
        let depth = match any_carrier.map(|c| c.current()).filter(|me| !me.is_null()) {
            // SAFETY: the fiber running on this carrier: live while it runs, and this is it.
            Some(me) => unsafe { (*me).depth.get() }.saturating_add(1),
            None => 0,
        };
        let init = Init {
            depth,
            id,
            name: self.name.map(String::into_boxed_str),
            spawned_at: at,
            runtime,
            class,
            vtable: &Erased::<F, T>::VTABLE,
            scope,
            since: rt.clock.stamp().unwrap_or(0),
        };
        // SAFETY: `slot` came from a pool (or is new): unused and ours.
        let (rec, for_handle) = unsafe { prepare::<F, T>(slot, init, f) };
        let handle = JoinHandle::new(for_handle);
        match local {
            Some(c) => {
                c.schedule_spawned(rec);
                fork_yield(c);
            }
            None => {
                rt.remote.spawned.fetch_add(1, Ordering::Relaxed);
                // SeqCst, against the drop's store: a spawn through a handle either is queued
                // before the drop looks for live fibers, or sees `shutdown` and unwinds the
                // fiber itself (never started: any thread will do), so its join returns.
                if rt.shutdown.load(Ordering::SeqCst) {
                    crate::runtime::cancel(rec);
                } else {
                    let again = rec.clone();
                    rt.schedule_remote(rec);
                    if rt.shutdown.load(Ordering::SeqCst) {
                        crate::runtime::cancel(again);
                    }
                }
            }
        }
        Ok(handle)
    }
}

/// The type-erased operations on a fiber's stage, one table per closure and result type.
struct Erased<F, T>(PhantomData<(F, T)>);

impl<F: FnOnce() -> T + Send, T: Send> Erased<F, T> {
    const VTABLE: StageVTable =
        StageVTable { run: run_closure::<F, T>, fail: fail_start::<F, T>, drop_result: drop_result::<T> };
}

/// A coroutine for fibers, on `stack`: not started; its first resume names its first fiber.
pub(crate) fn new_coroutine(stack: FiberStack) -> Co {
    Coroutine::with_stack(stack, fiber_loop)
}

/// Every fiber coroutine's body: runs one fiber after another. After a fiber's result is
/// published it suspends with `Finished`, and its carrier keeps it in a cache, stack and all;
/// the next resume hands it a new fiber's record, and a null one ends it. Reusing it skips
/// building a coroutine and entering it through corosensei's trampoline, which were ~60 of
/// the ~620 instructions of a chained spawn (W3).
fn fiber_loop(y: &FiberYielder, mut me: *const FiberRecord) {
    while !me.is_null() {
        debug_assert!(std::ptr::eq(me, context::current_fiber()));
        // SAFETY: `me` is the record this coroutine was resumed for, and it outlives the
        // fiber's run: the carrier resuming it holds a reference. Its address is stable, so
        // `me` stays valid across switches even though the carrier may change.
        let rec: &FiberRecord = unsafe { &*me };
        rec.set_yielder(y);
        // SAFETY: the stage holds the closure of the fiber spawned with this vtable (a record
        // is resumed for a new fiber once, at its first run), consumed here.
        unsafe { (rec.vtable.get().run)(rec) };
        if catch_unwind(AssertUnwindSafe(|| rec.locals.clear())).is_err() {
            eprintln!(
                "virtual-threads: a fiber_local! destructor panicked; aborting (as std does for thread_local!)"
            );
            std::process::abort();
        }
        join::complete(rec);
        if rec.cancelled.load(Ordering::Acquire) {
            // The runtime's drop is unwinding its fibers: nothing will run another here.
            return;
        }
        me = y.suspend(Suspend::Finished);
    }
}

/// A fiber's closure, run on its coroutine: its panic caught, its result put in the stage.
///
/// # Safety
/// The stage holds an `F` (the closure of a fiber spawned with this vtable), consumed here;
/// the caller of spawn guaranteed that what it borrows outlives the fiber. The caller is the
/// fiber's coroutine, at the fiber's first run.
unsafe fn run_closure<F: FnOnce() -> T + Send, T: Send>(me: &FiberRecord) {
    // SAFETY: see the function's contract.
    let f = unsafe { me.take_stage::<F>() };
    let result = if me.cancelled.load(Ordering::Acquire) {
        // Cancelled before it ever ran: drop the closure (its captures' destructors run here).
        let _ = catch_unwind(AssertUnwindSafe(move || drop(f)));
        Err(Box::new(CANCELLED) as Box<dyn std::any::Any + Send>)
    } else {
        match catch_unwind(AssertUnwindSafe(f)) {
            // The runtime's drop unwound it (corosensei's private unwind payload).
            Err(_) if me.cancelled.load(Ordering::Acquire) => Err(Box::new(CANCELLED) as _),
            r => r,
        }
    };
    // SAFETY: the stage is empty (the closure was moved out above) and only this fiber writes
    // it until it publishes DONE.
    unsafe { me.put_stage(result, STAGE_RESULT) };
}

/// # Safety
/// As for [`run_closure`].
unsafe fn fail_start<F: FnOnce() -> T + Send, T: Send>(rec: &FiberRecord, e: io::Error) {
    // SAFETY: see the function's contract.
    let f = unsafe { rec.take_stage::<F>() };
    let _ = catch_unwind(AssertUnwindSafe(move || drop(f)));
    let r: std::thread::Result<T> = Err(Box::new(format!("fiber could not start: {e}")));
    // SAFETY: the stage is empty now, and the fiber never runs: we are its only user.
    unsafe { rec.put_stage(r, STAGE_RESULT) };
    join::complete(rec);
}

/// Drops a result nobody will take; a panic's payload goes to the fiber's scope, if any, which
/// resumes the first one it gets (as rayon's scope does). Returns whether it was a panic.
///
/// # Safety
/// The stage holds this fiber's `thread::Result<T>`, and the caller is the only party that
/// may take it (see `join.rs`).
unsafe fn drop_result<T>(rec: &FiberRecord) -> bool {
    // SAFETY: see the function's contract.
    match unsafe { rec.take_stage::<std::thread::Result<T>>() } {
        Ok(_) => false,
        Err(payload) => {
            // SAFETY: as the only party to the result, the caller is also the only one to touch
            // the scope cell until it tells the scope (`join::scope_done`), after this.
            if let Some(scope) = unsafe { &*rec.scope.get() } {
                scope.keep_panic(payload);
            }
            true
        }
    }
}

/// The fork-yield rule: a fiber that spawns many children in a row yields every `fork_yield`
/// spawns, so that the children start on other carriers instead of piling up behind it
/// (ZIO's `MaxForksBeforeYield`). Off when the setting is 0.
#[inline]
fn fork_yield(c: &crate::scheduler::carrier::Carrier) {
    let every = c.shared().config.fork_yield;
    let me = c.current();
    if every == 0 || me.is_null() {
        return;
    }
    // SAFETY: `me` is the fiber running on this carrier: live while it runs.
    let me = unsafe { &*me };
    let n = me.spawns.get() + 1;
    me.spawns.set(n);
    if n >= every {
        crate::yield_now(); // resets the count
    }
}

/// Spawns a new fiber on the current runtime (the caller's, or the process-wide default one
/// when called from a plain thread) and returns a handle to join it.
///
/// # Panics
/// If no stack can be allocated, as `std::thread::spawn` panics when the OS cannot create a
/// thread; use [`Builder::spawn`] to get the `io::Error` instead.
#[track_caller]
pub fn spawn<F, T>(f: F) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let at = at_caller();
    let c = context::carrier();
    if c.is_null() {
        return spawn_here(f, at).unwrap_or_else(|e| spawn_failed(e));
    }
    // SAFETY: a non-null carrier pointer is this thread's live carrier; used only before the
    // fork-yield at the end of `spawn_local`, its one switch point.
    let c = unsafe { &*c };
    // Checked here rather than inside: the handle then travels in a register, not in an
    // `io::Result` in memory (moving that enum cost a store-forwarding stall per spawn).
    if let Err(e) = c.ensure_stack(c.shared().stacks) {
        spawn_failed(e);
    }
    // SAFETY: `F` and `T` are 'static; `c` as above; a stack can be had.
    unsafe { spawn_local(c, f, at) }
}

#[cold]
#[inline(never)]
fn spawn_failed(e: io::Error) -> ! {
    panic!("failed to spawn fiber: {e}")
}

#[track_caller]
#[inline(always)]
fn at_caller() -> &'static Location<'static> {
    Location::caller()
}

/// A spawn with the default settings onto the current runtime: on a carrier, the runtime's
/// most common call, with one thread-local look (not the two of `with_current_runtime` and
/// `spawn_unchecked_at`) and none of the general path's branches on settings it lacks.
#[inline]
fn spawn_here<F, T>(f: F, at: &'static Location<'static>) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let c = context::carrier();
    if c.is_null() {
        // SAFETY: `F` and `T` are 'static: nothing borrowed can dangle.
        return crate::runtime::with_current_runtime(|rt| unsafe {
            Builder::new().spawn_unchecked_at(rt, f, at, None)
        });
    }
    // SAFETY: a non-null carrier pointer is this thread's live carrier; `spawn_local` uses it
    // only before its one switch point, the fork-yield at its very end.
    let c = unsafe { &*c };
    c.ensure_stack(c.shared().stacks)?;
    // SAFETY: `F` and `T` are 'static; `c` as above; a stack can be had.
    Ok(unsafe { spawn_local(c, f, at) })
}

/// `spawn_unchecked_at` for a fiber of the carrier's own runtime, with the runtime's default
/// stack, no name and no scope.
///
/// # Safety
/// As for `spawn_unchecked_at`; `c` is this thread's carrier, not used after this returns, and
/// its `ensure_stack` for the runtime's class just succeeded.
#[inline(always)]
unsafe fn spawn_local<F, T>(
    c: &crate::scheduler::carrier::Carrier,
    f: F,
    at: &'static Location<'static>,
) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let rt = c.shared();
    let class = rt.stacks;
    let id = c.next_id();
    let slot = c.alloc_record();
    let runtime = c.take_ref();
    let me = c.current();
    // SAFETY: the fiber running on this carrier: live while it runs, and this is it.
    let depth = if me.is_null() { 0 } else { unsafe { (*me).depth.get() }.saturating_add(1) };
    let init = Init {
        depth,
        id,
        name: None,
        spawned_at: at,
        runtime,
        class,
        vtable: &Erased::<F, T>::VTABLE,
        scope: None,
        since: rt.clock.stamp().unwrap_or(0),
    };
    // SAFETY: `slot` came from the carrier's pool: unused and ours; the caller's contract
    // covers what `f` borrows.
    let (rec, for_handle) = unsafe { prepare::<F, T>(slot, init, f) };
    c.schedule_spawned(rec);
    fork_yield(c);
    // The handle is built here, from the reference kept in a register: built before the calls
    // above, it sat in a stack slot written with 8-byte stores and read back with a 16-byte load.
    JoinHandle::new(for_handle)
}

/// Fills a fresh record and its stage: the fiber's queue reference and its join handle's.
///
/// # Safety
/// `slot` is an unused record owned by the caller.
#[inline(always)]
unsafe fn prepare<F, T>(
    slot: std::ptr::NonNull<FiberRecord>,
    init: Init,
    f: F,
) -> (super::FiberRef, super::FiberRef)
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    // SAFETY: `slot` is unused and ours (the caller's contract).
    let (rec, for_handle) = unsafe { FiberRecord::init(slot, init) };
    // SAFETY: the record is not queued yet: we are its only user.
    unsafe { rec.put_stage(f, STAGE_CLOSURE) };
    (rec, for_handle)
}
