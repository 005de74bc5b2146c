//! The one door to blocking: `park`/`unpark`, `yield_now`, `sleep`, and the `Fiber` handle.
//!
//! Inside a fiber these switch to the carrier, which runs other fibers meanwhile; on a plain
//! OS thread they fall back to `std::thread`'s, so code written against them works in both.
//! Semantics are `std::thread::park`'s: one token, an `unpark` before the `park` is not lost,
//! and a `park` may return spuriously, so callers loop on their condition.
//!
//! A fiber never switches out while it is unwinding (`std::thread::panicking()`): std keeps
//! the panic count per OS thread, and another fiber on the same carrier would see it. Such a
//! park waits on the carrier thread instead (the supervisor compensates for a long wait).

use std::fmt;
use std::num::NonZeroU64;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{FiberRecord, FiberRef, Suspend};
use crate::diagnostics::{PlainCall, WAIT_TIMED, WaitReason};
use crate::runtime::context;
use crate::scheduler::Wake;

/// A fiber's identifier: unique for the life of the process, never reused, and ordered by
/// creation within each carrier's block of ids (blocks are handed out in increasing order).
/// Plain OS threads that call [`current`](crate::current) get one too.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FiberId(NonZeroU64);

impl FiberId {
    /// Stands in an unused record; never handed out (ids start at 1, this is `u64::MAX`).
    pub(crate) const PLACEHOLDER: FiberId = FiberId(NonZeroU64::MAX);

    /// The id as a number, e.g. for logs.
    pub fn as_u64(self) -> u64 {
        self.0.get()
    }
}

impl fmt::Debug for FiberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FiberId({})", self.0)
    }
}

impl fmt::Display for FiberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Ids are handed out in blocks so that spawning touches no counter shared by all carriers.
pub(crate) const ID_BLOCK: u64 = 1024;
static NEXT_ID_BLOCK: AtomicU64 = AtomicU64::new(1);

/// Reserves a block of ids `[start, start + ID_BLOCK)`.
pub(crate) fn reserve_ids() -> (u64, u64) {
    let start = NEXT_ID_BLOCK.fetch_add(ID_BLOCK, Ordering::Relaxed);
    (start, start + ID_BLOCK)
}

/// Takes the next id from a block, refilling it when it runs out.
#[inline]
pub(crate) fn next_id(block: &mut (u64, u64)) -> FiberId {
    if block.0 == block.1 {
        *block = reserve_ids();
    }
    let id = block.0;
    block.0 += 1;
    FiberId(NonZeroU64::new(id).expect("ids start at 1"))
}

/// A handle to a fiber (or to a plain OS thread that asked for [`current`]): its id, its name,
/// and [`unpark`](Fiber::unpark). Cheap to clone; `Send + Sync`.
///
/// One word: a fiber's counted record pointer, or (low bit set) an `Arc` of a plain thread's
/// handle and id. A [`JoinHandle`](crate::JoinHandle) holds one, so a spawn returns its handle
/// in a register; as an enum of two words it went through memory, and the caller's 16-byte
/// load of it missed store forwarding on every spawn (W1's profile).
pub struct Fiber {
    tagged: NonNull<()>,
}

/// The low bit of `Fiber::tagged` for a plain thread (records and `Arc`s are 8-aligned).
const THREAD_TAG: usize = 1;

/// What a `Fiber` of a plain thread points to.
struct PlainThread {
    thread: std::thread::Thread,
    id: FiberId,
}

/// A `Fiber` taken apart, borrowed from it.
enum View<'a> {
    Fiber(&'a FiberRef),
    Thread(&'a PlainThread),
}

// SAFETY: both things a `Fiber` can own, a `FiberRef` and an `Arc<PlainThread>`, are `Send`
// and `Sync`; the tag only says which one it is.
unsafe impl Send for Fiber {}
// SAFETY: as above.
unsafe impl Sync for Fiber {}

const _: () = assert!(std::mem::align_of::<FiberRecord>() > THREAD_TAG);
const _: () = assert!(std::mem::align_of::<PlainThread>() > THREAD_TAG);
const _: () = assert!(std::mem::size_of::<Option<Fiber>>() == std::mem::size_of::<usize>());

impl Fiber {
    pub(crate) fn from_record(rec: FiberRef) -> Fiber {
        let p = FiberRef::into_raw(rec);
        // SAFETY: `into_raw` gives the record's pointer, never null.
        Fiber { tagged: unsafe { NonNull::new_unchecked(p.cast()) } }
    }

    /// Gives up the handle as one pointer, its count included (a waker's data: `future.rs`).
    pub(crate) fn into_raw(self) -> *const () {
        std::mem::ManuallyDrop::new(self).tagged.as_ptr()
    }

    /// Takes back a handle given up by [`Fiber::into_raw`].
    ///
    /// # Safety
    /// `p` comes from `into_raw`, and each such pointer is taken back once.
    pub(crate) unsafe fn from_raw(p: *const ()) -> Fiber {
        // SAFETY: `into_raw` gave the non-null `tagged` pointer, with the count it owns.
        Fiber { tagged: unsafe { NonNull::new_unchecked(p.cast_mut()) } }
    }

    fn from_thread(thread: std::thread::Thread, id: FiberId) -> Fiber {
        let p = Arc::into_raw(Arc::new(PlainThread { thread, id })).cast_mut();
        // SAFETY: an `Arc`'s pointer is non-null and 8-aligned, so the tagged one is non-null.
        Fiber { tagged: unsafe { NonNull::new_unchecked(p.map_addr(|a| a | THREAD_TAG).cast()) } }
    }

    fn view(&self) -> View<'_> {
        let p = self.tagged.as_ptr();
        if p.addr() & THREAD_TAG == 0 {
            // SAFETY: untagged, `tagged` is the pointer of a `FiberRef` this handle owns, and
            // `FiberRef` is a transparent wrapper of that pointer: the field can be read as one.
            View::Fiber(unsafe { &*(&self.tagged as *const NonNull<()>).cast::<FiberRef>() })
        } else {
            // SAFETY: tagged, it is `Arc::into_raw` of a `PlainThread` this handle owns.
            View::Thread(unsafe { &*p.map_addr(|a| a & !THREAD_TAG).cast::<PlainThread>() })
        }
    }

    /// This fiber's id.
    pub fn id(&self) -> FiberId {
        match self.view() {
            View::Fiber(r) => r.id(),
            View::Thread(t) => t.id,
        }
    }

    /// The name given by [`Builder::name`](crate::Builder::name), or the thread's name.
    pub fn name(&self) -> Option<&str> {
        match self.view() {
            View::Fiber(r) => r.name(),
            View::Thread(t) => t.thread.name(),
        }
    }

    /// Makes the fiber's token available: if it is parked it becomes runnable, otherwise its
    /// next `park` returns at once. Called from a fiber, the woken fiber runs next on the
    /// caller's carrier (a direct hand-off that keeps caches warm).
    pub fn unpark(&self) {
        match self.view() {
            View::Fiber(r) => unpark_record(r),
            View::Thread(t) => t.thread.unpark(),
        }
    }

    /// Wakes a fiber waiting in `join` for a fiber that just finished: it goes to the back of
    /// the run queue, not into the LIFO slot (see `Wake::Joiner`).
    pub(crate) fn unpark_joiner(&self) {
        match self.view() {
            View::Fiber(r) => wake_record(r, Wake::Joiner),
            View::Thread(t) => t.thread.unpark(),
        }
    }

    /// Whether this handle is for the fiber running this code. The handle counts its record,
    /// so an equal pointer cannot be another fiber that reuses the record.
    pub(crate) fn is_running_fiber(&self) -> bool {
        match self.view() {
            View::Fiber(r) => std::ptr::eq(FiberRef::as_ptr(r), context::current_fiber()),
            View::Thread(_) => false,
        }
    }

    pub(crate) fn record(&self) -> Option<&FiberRef> {
        match self.view() {
            View::Fiber(r) => Some(r),
            View::Thread(_) => None,
        }
    }
}

impl Clone for Fiber {
    fn clone(&self) -> Fiber {
        match self.view() {
            View::Fiber(r) => Fiber::from_record(r.clone()),
            View::Thread(_) => {
                let p = self.tagged.as_ptr().map_addr(|a| a & !THREAD_TAG).cast::<PlainThread>();
                // SAFETY: `p` is a live `Arc<PlainThread>`'s pointer (this handle owns a count).
                unsafe { Arc::increment_strong_count(p) };
                Fiber { tagged: self.tagged }
            }
        }
    }
}

impl Drop for Fiber {
    fn drop(&mut self) {
        let p = self.tagged.as_ptr();
        if p.addr() & THREAD_TAG == 0 {
            // SAFETY: the `FiberRef` this handle owns, given up by `from_record`; taken back once.
            drop(unsafe { FiberRef::from_raw(p.cast()) });
        } else {
            // SAFETY: the `Arc` count this handle owns (`from_thread`, `clone`); given up once.
            drop(unsafe { Arc::from_raw(p.map_addr(|a| a & !THREAD_TAG).cast::<PlainThread>()) });
        }
    }
}

impl fmt::Debug for Fiber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fiber").field("id", &self.id()).field("name", &self.name()).finish()
    }
}

pub(crate) fn unpark_record(r: &FiberRef) {
    wake_record(r, Wake::Unpark);
}

fn wake_record(r: &FiberRef, wake: Wake) {
    if r.notify() {
        // SAFETY: `notify` returned true: we moved the fiber from parked to runnable.
        let run = unsafe { FiberRef::take_parked_ref(r) };
        crate::scheduler::schedule(run, wake);
    }
}

/// The calling fiber, or the calling thread when it is not a fiber. Inside a fiber,
/// `std::thread::current()` is the carrier thread that runs it (its name is the carrier's, such
/// as `vt-carrier-0`); this is the fiber, with the name given to `vt::Builder::name` or
/// `ThreadPool::with_name`.
pub fn current() -> Fiber {
    let rec = context::current_fiber();
    if rec.is_null() {
        let id = context::with_plain(|p| {
            if p.id == 0 {
                p.id = next_id(&mut p.ids).as_u64();
            }
            p.id
        });
        let id = FiberId(NonZeroU64::new(id).expect("ids start at 1"));
        return Fiber::from_thread(std::thread::current(), id);
    }
    // SAFETY: `current_fiber` returned the record of the fiber running on this thread; the
    // carrier holds a reference to it while the fiber runs, so it is live.
    let rec = unsafe { FiberRef::clone_from_ptr(rec) };
    Fiber::from_record(rec)
}

/// The running fiber's record, or `None` on a plain thread, and whether the runtime's drop is
/// unwinding it (`context::running_fiber`). Valid until the next switch point, but the record
/// itself lives at least as long as the fiber runs.
fn running() -> Option<(&'static FiberRecord, bool)> {
    let (rec, cancelling) = context::running_fiber();
    // SAFETY: see `current`: the record outlives the fiber's run, and callers use the
    // reference only while the fiber runs (the 'static is a local convenience, never stored).
    (!rec.is_null()).then(|| (unsafe { &*rec }, cancelling))
}

/// Blocks the calling fiber until its token is available (see [`Fiber::unpark`]); may return
/// spuriously. On a plain thread this is `std::thread::park`.
pub fn park() {
    park_for(WaitReason::Park, None);
}

/// Like [`park`], but returns after `dur` at the latest.
pub fn park_timeout(dur: Duration) {
    match Instant::now().checked_add(dur) {
        Some(d) => park_for(WaitReason::Park, Some(d)),
        None => park_for(WaitReason::Park, None),
    }
}

/// Every park of the crate goes through here, saying why, so dumps can tell (Go's
/// `gopark(reason)`). Semantics of [`park`]/[`park_timeout`]; on a plain thread the wait counts
/// as "a plain thread inside a vt call" for the deadlock report, unless it is a join (which only
/// a finishing fiber can end).
pub(crate) fn park_for(reason: WaitReason, deadline: Option<Instant>) {
    match running() {
        Some((rec, cancelling)) => {
            park_fiber(rec, cancelling, reason, deadline);
        }
        None => {
            let _call = (!reason.waits_for_fibers()).then(PlainCall::enter);
            match deadline {
                None => std::thread::park(),
                Some(d) => std::thread::park_timeout(d.saturating_duration_since(Instant::now())),
            }
        }
    }
}

/// Returns true when the park ended because its deadline passed (its timer fired), so that a
/// sleep need not read the clock again.
#[inline(never)]
fn park_fiber(rec: &FiberRecord, cancelling: bool, reason: WaitReason, deadline: Option<Instant>) -> bool {
    if rec.take_token() {
        return false;
    }
    if cancelling {
        // The runtime is being dropped and is unwinding this fiber (on its home carrier's
        // thread, or the dropping thread): nothing will ever run it again. Whatever it waits for (a scoped fiber, a joined one)
        // can only finish by being unwound too, so unwind another fiber, then return (a
        // spurious wake-up: the caller re-checks its condition).
        if !crate::runtime::cancel_one(rec.runtime()) {
            std::thread::sleep(Duration::from_millis(1)); // waits on a plain thread, if anything
        }
        return false;
    }
    if std::thread::panicking() {
        park_unwinding(rec, deadline);
        return false;
    }
    rec.wait.store(reason.code() | if deadline.is_some() { WAIT_TIMED } else { 0 }, Ordering::Relaxed);
    if let Some(now) = rec.runtime().clock.stamp() {
        rec.since.store(now, Ordering::Relaxed);
    }
    let armed = deadline.map(|d| crate::time::arm_timer(rec, d));
    rec.suspend(Suspend::Park);
    // Disarm, unless the timer fired: the timer and this fiber race to move the generation on
    // (`time::fire`), and whoever wins owns the park's end. A timer that fires later must not
    // wake a later park.
    armed.is_some_and(|g| !crate::time::disarm(rec, g))
}

/// How long a fiber being unwound by its runtime's drop waits for its borrowers on the thread
/// before it unwinds others from its wait (borrowers of the same runtime that the drop's order
/// has not reached, and that only this thread may unwind).
const NESTED_UNWIND_AFTER: Duration = Duration::from_millis(100);

/// A guard for a fiber whose frame others borrow while it waits (`block_on`, `scope`, `join`,
/// `ThreadPool::scope`, `blocking`): dropped while unwinding (the runtime's drop unwinding the
/// fiber from its wait, or a panic), it waits until `done()` says the borrowers have finished,
/// so the frame is never freed under them, whichever runtime or thread they run on. Waiting in
/// an unwind does not switch: in a runtime's drop it unwinds other fibers meanwhile
/// (`park_fiber`'s cancelling branch), elsewhere it waits on the OS thread.
pub(crate) struct WaitOnUnwind<F: FnMut() -> bool> {
    done: F,
    reason: WaitReason,
    armed: bool,
}

impl<F: FnMut() -> bool> WaitOnUnwind<F> {
    pub(crate) fn new(reason: WaitReason, done: F) -> WaitOnUnwind<F> {
        WaitOnUnwind { done, reason, armed: true }
    }

    /// The wait it guards is over (the borrowers are done): a later unwind need not wait.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl<F: FnMut() -> bool> Drop for WaitOnUnwind<F> {
    fn drop(&mut self) {
        if !self.armed || !std::thread::panicking() || (self.done)() {
            return;
        }
        let start = Instant::now();
        let mut said = false;
        while !(self.done)() {
            if !said && start.elapsed() >= Duration::from_secs(1) {
                said = true;
                eprintln!(
                    "virtual-threads: a fiber being unwound (its runtime dropped) waits for work that borrows \
                     from its stack ({}) to finish before its frame is freed",
                    self.reason
                );
            }
            if !context::cancelling().is_null() && start.elapsed() < NESTED_UNWIND_AFTER {
                // The drop unwinds this fiber: wait on the thread first. A park here unwinds
                // another fiber from this one's stack (`park_fiber`), which valgrind could not
                // follow (bug 11 in `arch/reliability.md`); borrowers on another runtime or
                // thread finish by themselves.
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            // Timed: `done` may turn true with nobody to unpark this fiber or thread (a
            // record marked finished just after its result was published).
            park_for(self.reason, Instant::now().checked_add(Duration::from_millis(1)));
        }
    }
}

/// Whether the fiber of `f` has finished (its closure is gone), for `WaitOnUnwind`.
pub(crate) fn finished(f: &Fiber) -> bool {
    f.record().is_none_or(|r| r.state() == super::DONE)
}

/// A park while the fiber unwinds: wait on this carrier thread without switching.
#[cold]
fn park_unwinding(rec: &FiberRecord, deadline: Option<Instant>) {
    let mut pause = Duration::from_micros(10);
    while !rec.take_token() {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

/// Lets other fibers run: the calling fiber goes to the back of its carrier's run queue.
/// On a plain thread this is `std::thread::yield_now`.
pub fn yield_now() {
    match running() {
        Some((rec, false)) if !std::thread::panicking() => {
            rec.spawns.set(0);
            rec.suspend(Suspend::Yield);
        }
        Some(_) => {}
        None => {
            crate::diagnostics::plain_activity();
            std::thread::yield_now();
        }
    }
}

/// Puts the calling fiber to sleep for at least `dur`; its carrier runs other fibers meanwhile.
/// On a plain thread this is `std::thread::sleep`.
pub fn sleep(dur: Duration) {
    let Some((rec, cancelling)) = running() else {
        let _call = PlainCall::enter();
        std::thread::sleep(dur);
        return;
    };
    let now = Instant::now();
    let Some(deadline) = now.checked_add(dur) else {
        // "For ever": park until the runtime's drop unwinds this fiber.
        while context::cancelling().is_null() {
            park_for(WaitReason::Sleep, None);
        }
        return;
    };
    if now < deadline {
        // The first park without a second clock read (one per sleep showed in W7's profile);
        // if its own timer ended it, the deadline has passed and there is nothing to re-check.
        if park_fiber(rec, cancelling, WaitReason::Sleep, Some(deadline)) || !context::cancelling().is_null()
        {
            return;
        }
    }
    sleep_until(deadline);
}

/// Puts the calling fiber to sleep until `deadline`.
pub fn sleep_until(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        match running() {
            Some((rec, cancelling)) => {
                if park_fiber(rec, cancelling, WaitReason::Sleep, Some(deadline)) {
                    return;
                }
            }
            None => {
                let _call = PlainCall::enter();
                std::thread::sleep(deadline - now);
            }
        }
        if !context::cancelling().is_null() {
            return;
        }
    }
}
