//! The one door to blocking: `park` and `yield_now` (`sleep` is a timed park: `sleep.rs`; the
//! `Fiber` handle, whose `unpark` ends a park, is `handle.rs`).
//!
//! Inside a fiber these switch to the carrier, which runs other fibers meanwhile; on a plain
//! OS thread they fall back to `std::thread`'s, so code written against them works in both.
//! Semantics are `std::thread::park`'s: one token, an `unpark` before the `park` is not lost,
//! and a `park` may return spuriously, so callers loop on their condition.
//!
//! A fiber never switches out while it is unwinding (`std::thread::panicking()`): std keeps
//! the panic count per OS thread, and another fiber on the same carrier would see it. Such a
//! park waits on the carrier thread instead (the supervisor compensates for a long wait).

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::context;
use super::handle::Fiber;
use super::schedule::{RuntimeRef, Schedule};
use super::stop;
use super::wait::{PlainCall, WAIT_TIMED, WAIT_UNWINDING, WaitReason, plain_activity};
use super::{FiberRecord, Suspend};

/// The fiber running this code, borrowed from a guard that lives in the fiber's own frame: the
/// record outlives the fiber's run (its carrier holds a reference while it runs, its parked
/// state while it is parked), and the guard (`!Send`, a local) cannot outlive the frame.
pub(super) struct Me {
    rec: NonNull<FiberRecord>,
    /// The runtime's drop is unwinding this fiber (`context::running_fiber`).
    pub(super) cancelling: bool,
    _in_this_frame: PhantomData<*const ()>,
}

impl Me {
    #[inline(always)]
    pub(super) fn record(&self) -> &FiberRecord {
        // SAFETY: see the type's doc: the record lives at least as long as this guard.
        unsafe { self.rec.as_ref() }
    }
}

/// The running fiber, or `None` on a plain thread.
#[inline(always)]
pub(super) fn running() -> Option<Me> {
    let (rec, cancelling) = context::running_fiber();
    NonNull::new(rec.cast_mut()).map(|rec| Me { rec, cancelling, _in_this_frame: PhantomData })
}

/// `let me = vt::current(); waiters.push(me); vt::park(); // until someone calls me.unpark()`
///
/// Blocks the calling fiber until its token is available (see [`Fiber::unpark`]); may return
/// spuriously. On a plain thread this is `std::thread::park`.
pub fn park() {
    park_for(WaitReason::Park, None);
}

/// `vt::park_timeout(Duration::from_millis(50)); // woken by unpark, or after 50 ms`
///
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
        Some(me) => {
            park_fiber(me.record(), me.cancelling, reason, deadline);
        }
        None => park_thread(reason, deadline),
    }
}

/// `park_for` on a plain thread: std's park, woken at the deadline of a `vt::timeout` around
/// it, which then unwinds. Out of line: a fiber's park does not carry its code.
#[inline(never)]
fn park_thread(reason: WaitReason, deadline: Option<Instant>) {
    let _call = (!reason.waits_for_fibers()).then(PlainCall::enter);
    let stops = !context::plain_stop().deadlines.is_null();
    let deadline = if stops { stop::plain_park_deadline(deadline) } else { deadline };
    match deadline {
        None => std::thread::park(),
        Some(d) => std::thread::park_timeout(d.saturating_duration_since(Instant::now())),
    }
    if stops {
        stop::plain_stop_point();
    }
}

/// Returns true when the park ended because its deadline passed (its timer fired), so that
/// a sleep need not read the clock again.
#[inline(never)]
pub(super) fn park_fiber(
    rec: &FiberRecord,
    cancelling: bool,
    reason: WaitReason,
    deadline: Option<Instant>,
) -> bool {
    // A stop request (`cancel.rs`): one load of a byte on a line the park touches anyway,
    // before the switch only. A fiber that a cancellation wakes from this park returns as from
    // a spurious wake-up: its wait loop re-checks and parks again, and that park stops it. So
    // nothing is live across the switch for the stop, and the rest is out of line.
    if rec.stop.load(Ordering::Relaxed) != 0 {
        return park_stopping(rec, cancelling, reason, deadline);
    }
    park_plain(rec, cancelling, reason, deadline)
}

/// `park_fiber` of a fiber with a stop request or an open `vt::timeout`: it may unwind here,
/// and its park wakes at the deadline of a `timeout` scope that may stop it.
#[cold]
#[inline(never)]
fn park_stopping(rec: &FiberRecord, cancelling: bool, reason: WaitReason, deadline: Option<Instant>) -> bool {
    let deadline = stop::stop_point_before_park(rec, deadline);
    let fired = park_plain(rec, cancelling, reason, deadline);
    // A timer that a `vt::timeout` scope's deadline set (above) firing means that deadline
    // passed, and the stop point unwinds: `fired` is only ever the caller's own.
    stop::stop_point(rec);
    fired
}

#[inline(always)]
fn park_plain(rec: &FiberRecord, cancelling: bool, reason: WaitReason, deadline: Option<Instant>) -> bool {
    if rec.take_token() {
        return false;
    }
    if cancelling {
        // The runtime is being dropped and is unwinding this fiber (on its home carrier's
        // thread, or the dropping thread): nothing will ever run it again. Whatever it waits for (a scoped fiber, a joined one)
        // can only finish by being unwound too, so unwind another fiber, then return (a
        // spurious wake-up: the caller re-checks its condition).
        if !rec.runtime().cancel_one() {
            // Waits on a plain thread, if anything: a real sleep, which a hooked one, ended at
            // once for a fiber being unwound, is not. Without it a fiber the drop cannot unwind
            // (a std `Condvar` wait in a loop) spins, and contends for the drop's lock.
            #[cfg(all(feature = "hooks", not(loom)))]
            let _off = crate::loom::HooksOff::enter();
            std::thread::sleep(Duration::from_millis(1));
        }
        return false;
    }
    if std::thread::panicking() {
        if may_park_while_unwinding(rec) {
            return park_counted(rec, reason, deadline);
        }
        park_unwinding(rec, reason, deadline);
        return false;
    }
    park_switch(rec, reason, deadline)
}

/// The park's switch: records why, arms the timer, switches out, and disarms. Returns whether
/// the timer ended the park.
#[inline(always)]
fn park_switch(rec: &FiberRecord, reason: WaitReason, deadline: Option<Instant>) -> bool {
    rec.wait.store(reason.code() | if deadline.is_some() { WAIT_TIMED } else { 0 }, Ordering::Relaxed);
    rec.since.store(rec.runtime().stamp(), Ordering::Relaxed);
    let armed = deadline.map(|d| RuntimeRef::arm_timer(rec, d));
    rec.suspend(Suspend::Park);
    // Disarm, unless the timer fired: the timer and this fiber race to move the generation on
    // (`time::fire`), and whoever wins owns the park's end. A timer that fires later must not
    // wake a later park.
    armed.is_some_and(|g| !RuntimeRef::disarm(rec, g))
}

/// A park during an unwind that switches out (`may_park_while_unwinding`), counted on this
/// thread until the fiber runs again here (its home).
#[cold]
#[inline(never)]
fn park_counted(rec: &FiberRecord, reason: WaitReason, deadline: Option<Instant>) -> bool {
    context::add_unwinds_parked(1);
    let fired = park_switch(rec, reason, deadline);
    context::add_unwinds_parked(-1);
    fired
}

/// Whether a park during an unwind may switch out (the ADR 0004 exception): the fiber is
/// being stopped (a cancellation or deadline unwinds it, and its destructor waits, perhaps for
/// a fiber of this very carrier), or another fiber already switched out while unwinding here,
/// so that `panicking()` no longer tells whether this one unwinds. Only on a home carrier: the
/// unwind then ends on the thread that counts it. Other fibers of the carrier see
/// `thread::panicking()` while it waits; the alternative was a deadlock.
#[cold]
fn may_park_while_unwinding(rec: &FiberRecord) -> bool {
    rec.home.load(Ordering::Relaxed) != super::NO_HOME
        && (rec.stop.load(Ordering::Relaxed) != 0 || context::unwinds_parked() != 0)
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

/// A park while the fiber unwinds: wait on this carrier thread without switching. Marked in
/// the record, so that the supervisor's "blocked" report can say why the carrier is held.
#[cold]
fn park_unwinding(rec: &FiberRecord, reason: WaitReason, deadline: Option<Instant>) {
    rec.wait.store(reason.code() | WAIT_UNWINDING, Ordering::Relaxed);
    let mut pause = Duration::from_micros(10);
    while !rec.take_token() {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
    rec.wait.store(reason.code(), Ordering::Relaxed);
}

/// `for chunk in work.chunks(1024) { crunch(chunk); vt::yield_now(); }`
///
/// Lets other fibers run: the calling fiber goes to the back of its carrier's run queue.
/// On a plain thread this is `std::thread::yield_now`.
pub fn yield_now() {
    // The pair tested as it comes, not through `running`'s `Option`, whose matching cost a
    // yield flag shuffling.
    let (rec, cancelling) = context::running_fiber();
    if rec.is_null() {
        plain_activity();
        std::thread::yield_now();
        return;
    }
    if cancelling || std::thread::panicking() {
        return;
    }
    // SAFETY: as in `Me`: the record of the fiber running on this thread, live while it runs;
    // used before the switch only.
    let rec = unsafe { &*rec };
    if rec.stop.load(Ordering::Relaxed) != 0 {
        stop::stop_point(rec);
    }
    rec.spawns.set(0);
    rec.suspend(Suspend::Yield);
}
