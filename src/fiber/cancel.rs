//! Stopping fibers: a stop request on the record, acted on at the fiber's switch points by
//! unwinding with a payload. `CancelHandle::cancel` asks the whole fiber to stop (`Cancelled`);
//! `vt::timeout`/`vt::deadline` open a scope on the fiber's stack whose end passing stops the
//! closure and only it (`Elapsed`); `vt::uncancellable` defers both. Level-triggered: the
//! request stays, so every later switch point in the stopped scope unwinds again.
//!
//! The cost off the stop path is one byte (`FiberRecord::stop`) loaded before each park and
//! yield; everything else is behind `stop != 0`: acting on a request at a switch point is
//! `stop.rs`, the state it reads `stop_state.rs`, and this file asks for stops. A parked fiber
//! woken by a cancellation returns from its park as from a spurious wake-up, and its wait
//! loop's next park stops it. A fiber never starts an unwind while it is already unwinding (a
//! second panic in a destructor would abort), and the runtime's own waits that must outlive a
//! frame (`scope`, `join`, `blocking`) wait before the unwind, not during it. Design, and what
//! a wait during a cancellation unwind does: `arch/decisions/0004-cancellation.md`.

use std::fmt;
use std::panic::{AssertUnwindSafe, Location, catch_unwind, resume_unwind};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::context;
use super::handle::Fiber;
use super::join::JoinHandle;
use super::stop::{Cancelled, DeadlineUnwind, earliest, pending, with_state};
use super::stop_state::{CANCEL, DEADLINE, DeadlineScope};
use super::{DONE, FiberRecord};

/// The error of [`timeout`] and [`deadline`]: the closure was stopped at its deadline.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Elapsed;

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("deadline has elapsed")
    }
}

impl std::error::Error for Elapsed {}

impl From<Elapsed> for std::io::Error {
    fn from(_: Elapsed) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::TimedOut, Elapsed)
    }
}

/// Runs `f` with a deadline `dur` from now. If `f` is still running when it passes, `f` is
/// stopped at its next wait (any park, sleep, lock, channel operation, socket call, join or
/// `yield_now`, or [`check_cancelled`](crate::check_cancelled)), unwound back to this call,
/// and `Err(Elapsed)` is returned; the rest of the fiber goes on. Deadlines nest: an inner one
/// stops only its own closure, an outer one passes through the inner ones, and a cancellation
/// of the whole fiber ([`Cancelled`]) is never turned into `Elapsed`.
///
/// On a plain thread the same holds for this crate's waits (`vt::sync`, channels, `join`,
/// `vt::sleep`, `vt::park`): std's own blocking calls do not see the deadline.
///
/// ```
/// use virtual_threads as vt;
/// use std::time::Duration;
/// let (_tx, rx) = vt::channel::unbounded::<u32>();
/// let r = vt::timeout(Duration::from_millis(10), || rx.recv());
/// assert_eq!(r, Err(vt::Elapsed));
/// ```
pub fn timeout<F, T>(dur: Duration, f: F) -> Result<T, Elapsed>
where
    F: FnOnce() -> T,
{
    match Instant::now().checked_add(dur) {
        Some(at) => deadline(at, f),
        None => Ok(f()),
    }
}

/// [`timeout`] with an absolute deadline.
pub fn deadline<F, T>(at: Instant, f: F) -> Result<T, Elapsed>
where
    F: FnOnce() -> T,
{
    let rec = context::current_fiber();
    let result = if rec.is_null() {
        let p = context::plain_stop();
        let scope = DeadlineScope { at, shield: p.shield, outer: p.deadlines };
        context::set_plain_deadlines(&scope);
        struct Pop(*const DeadlineScope);
        impl Drop for Pop {
            fn drop(&mut self) {
                context::set_plain_deadlines(self.0);
            }
        }
        let _pop = Pop(scope.outer);
        (catch_unwind(AssertUnwindSafe(f)), ptr::from_ref(&scope).addr())
    } else {
        // SAFETY: the running fiber's record outlives its run, and its address is stable, so
        // it may be kept across the switch points in `f` (its carrier is not).
        let rec = unsafe { &*rec };
        let scope = DeadlineScope {
            at,
            shield: rec.shield.load(Ordering::Relaxed).into(),
            outer: rec.deadlines.get(),
        };
        rec.deadlines.set(&scope);
        rec.stop.fetch_or(DEADLINE, Ordering::Relaxed);
        struct Pop<'a>(&'a FiberRecord, *const DeadlineScope);
        impl Drop for Pop<'_> {
            fn drop(&mut self) {
                self.0.deadlines.set(self.1);
                if self.1.is_null() {
                    self.0.stop.fetch_and(!DEADLINE, Ordering::Relaxed);
                }
            }
        }
        let _pop = Pop(rec, scope.outer);
        (catch_unwind(AssertUnwindSafe(f)), ptr::from_ref(&scope).addr())
    };
    match result {
        (Ok(v), _) => Ok(v),
        (Err(p), me) if p.downcast_ref::<DeadlineUnwind>().is_some_and(|d| d.0 == me) => Err(Elapsed),
        (Err(p), _) => resume_unwind(p),
    }
}

/// Runs `f` so that nothing stops it: a cancellation of this fiber, or a deadline of an
/// enclosing [`timeout`], waits until `f` returns, and then stops the fiber at its next switch
/// point. For cleanup and commit steps that must finish (ZIO's `uninterruptible`, Trio's
/// shield). A `timeout` opened inside `f` still works. Dumps show the fiber held here.
#[track_caller]
pub fn uncancellable<F, T>(f: F) -> T
where
    F: FnOnce() -> T,
{
    shield(Some(Location::caller()), f)
}

/// Runs `f` as a wait that a stop request must not interrupt (the runtime's waits for work that
/// borrows the frame: a scope's fibers, a `join`'s other half, a `blocking` closure), so that
/// it never has to wait during an unwind.
pub(crate) fn shielded<T>(f: impl FnOnce() -> T) -> T {
    shield(None, f)
}

/// Defers stop requests while `f` runs, on a fiber or a plain thread. `at` is the user's
/// `uncancellable` call that dumps name; the runtime's own shielded waits pass `None`.
fn shield<T>(at: Option<&'static Location<'static>>, f: impl FnOnce() -> T) -> T {
    let rec = context::current_fiber();
    if rec.is_null() {
        let depth = context::plain_stop().shield;
        context::set_plain_shield(depth + 1);
        struct Exit(u32);
        impl Drop for Exit {
            fn drop(&mut self) {
                context::set_plain_shield(self.0);
            }
        }
        let _exit = Exit(depth);
        return f();
    }
    // SAFETY: as in `deadline`.
    let rec = unsafe { &*rec };
    let depth = rec.shield.load(Ordering::Relaxed);
    if let (0, Some(at)) = (depth, at) {
        rec.shield_at.store(ptr::from_ref(at).cast_mut(), Ordering::Relaxed);
    }
    rec.shield
        .store(depth.checked_add(1).expect("uncancellable sections nested 65,535 deep"), Ordering::Relaxed);
    struct Exit<'a>(&'a FiberRecord, u16);
    impl Drop for Exit<'_> {
        fn drop(&mut self) {
            self.0.shield.store(self.1, Ordering::Relaxed);
            if self.1 == 0 {
                self.0.shield_at.store(ptr::null_mut(), Ordering::Relaxed);
            }
        }
    }
    let _exit = Exit(rec, depth);
    f()
}

/// Parks (for `reason`) until `done()`, shielded: a stop request that the caller would act on
/// (its cancellation, or the deadline of a `timeout` around it) calls `on_stop` once (the
/// caller stops what it waits for) and the wait goes on; the caller acts on the stop after it.
/// The park wakes at such a deadline by itself.
pub(crate) fn wait_shielded(
    reason: super::wait::WaitReason,
    mut done: impl FnMut() -> bool,
    mut on_stop: impl FnMut(),
) {
    let mut stopped = false;
    while !done() {
        let wake_at = if stopped {
            None
        } else {
            let (now, at) = with_state(|stop, shield, scopes| {
                let at = if stop & DEADLINE != 0 { earliest(shield, scopes, None) } else { None };
                (pending(stop, shield, scopes).is_some(), at)
            });
            if now {
                stopped = true;
                on_stop();
                continue;
            }
            at
        };
        shielded(|| super::park::park_for(reason, wake_at));
    }
}

/// Whether the calling fiber has been asked to stop as a whole (deferred or not).
pub(crate) fn whole_fiber_cancelled() -> bool {
    let rec = context::current_fiber();
    // SAFETY: as in `with_state`.
    !rec.is_null() && unsafe { &*rec }.stop.load(Ordering::Acquire) & CANCEL != 0
}

/// Whether `payload` is a cancellation's (a whole fiber's [`Cancelled`]).
pub(crate) fn is_cancel_payload(payload: &(dyn std::any::Any + Send)) -> bool {
    payload.is::<Cancelled>()
}

/// A handle that stops one fiber without owning its join, like tokio's `AbortHandle`: from
/// [`JoinHandle::cancel_handle`](crate::JoinHandle::cancel_handle). Cheap to clone;
/// `Send + Sync`.
#[derive(Clone)]
pub struct CancelHandle {
    fiber: Fiber,
}

impl CancelHandle {
    pub(crate) fn new(fiber: Fiber) -> CancelHandle {
        CancelHandle { fiber }
    }

    /// Asks the fiber to stop: it unwinds with [`Cancelled`] at its current wait, or at its
    /// next switch point; a fiber that has not started never runs. Does nothing to a finished
    /// fiber. Returns at once (it does not wait for the fiber to stop).
    pub fn cancel(&self) {
        cancel(&self.fiber);
    }

    /// Whether the fiber has finished (returned, panicked or stopped).
    pub fn is_finished(&self) -> bool {
        self.fiber.record().is_none_or(|r| super::join::has_finished(r))
    }

    /// The fiber's handle.
    pub fn fiber(&self) -> &Fiber {
        &self.fiber
    }
}

/// Stopping, on the join handle (the hand-off in `join.rs` knows nothing of it).
impl<T> JoinHandle<T> {
    /// Asks the fiber to stop: it unwinds with [`Cancelled`](crate::Cancelled) at its current
    /// wait or its next switch point (every destructor runs), and [`join`](Self::join) returns
    /// `Err` holding that payload. A fiber that has not started never runs; a finished one is
    /// left as it is. Returns at once.
    pub fn cancel(&self) {
        cancel(&self.fiber);
    }

    /// A handle that cancels this fiber without owning its join; `Clone + Send + Sync`.
    pub fn cancel_handle(&self) -> CancelHandle {
        CancelHandle::new(Fiber::clone(&self.fiber))
    }
}

impl fmt::Debug for CancelHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelHandle").field("fiber", &self.fiber).finish()
    }
}

/// Sets the fiber's `CANCEL` request and wakes it from its park (a spurious wake-up for a wait
/// that defers it: the waiter loops and parks again).
pub(crate) fn cancel(fiber: &Fiber) {
    let Some(rec) = fiber.record() else { return };
    if rec.state() == DONE {
        return;
    }
    // Release pairs with the Acquire loads at the switch points: whatever the canceller wrote
    // before is visible to the unwind. The unpark's own ordering carries it too when the fiber
    // was parked.
    if rec.stop.fetch_or(CANCEL, Ordering::Release) & CANCEL == 0 {
        let now = now_ms();
        rec.cancelled_at.store(now, Ordering::Relaxed);
        LAST_CANCEL_MS.store(now, Ordering::Relaxed);
    }
    fiber.unpark();
}

/// When any fiber was last asked to stop (`now_ms`): the supervisor looks for slow stops only
/// for a while after one (`slow_stops_due`).
static LAST_CANCEL_MS: AtomicU32 = AtomicU32::new(0);

/// How long a stopped fiber may take before it is reported (`slow_stop`).
pub(crate) const SLOW_STOP_MS: u32 = 1_000;

/// Whether the supervisor should look for slow stops now: a stop was asked for within the last
/// two report periods, or the last look found one still pending (`pending`).
pub(crate) fn slow_stops_due(pending: bool) -> bool {
    let last = LAST_CANCEL_MS.load(Ordering::Relaxed);
    pending || (last != 0 && now_ms().wrapping_sub(last) <= 2 * SLOW_STOP_MS)
}

/// The supervisor's look at one live fiber: `Some(ms)` once, the first time it is found asked to
/// stop `ms` ago (at least `SLOW_STOP_MS`) and still running: a loop that never reaches a
/// switch point, or an `uncancellable` section that does not end. `pending` is set if it is
/// asked to stop and not yet reported (so the next look happens).
pub(crate) fn slow_stop(rec: &FiberRecord, pending: &mut bool) -> Option<u32> {
    if rec.stop.load(Ordering::Relaxed) & CANCEL == 0 || rec.state() == DONE {
        return None;
    }
    let at = rec.cancelled_at.load(Ordering::Relaxed);
    if at == REPORTED {
        return None;
    }
    let ago = now_ms().wrapping_sub(at);
    if ago < SLOW_STOP_MS {
        *pending = true;
        return None;
    }
    // Once: a racing look (there is one supervisor per runtime, and a record belongs to one)
    // cannot report it twice.
    rec.cancelled_at.compare_exchange(at, REPORTED, Ordering::Relaxed, Ordering::Relaxed).ok().map(|_| ago)
}

/// `FiberRecord::cancelled_at` once its slow stop was reported.
const REPORTED: u32 = u32::MAX;

/// Milliseconds since the first call in the process (at least 1, below `u32::MAX`): when a
/// fiber was asked to stop, for the slow-stop report. Wraps after 49 days; the report compares
/// with wrapping arithmetic.
pub(crate) fn now_ms() -> u32 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let ms = crate::platform::fork::init_once(&EPOCH, Instant::now).elapsed().as_millis() as u32;
    ms.clamp(1, u32::MAX - 1)
}
