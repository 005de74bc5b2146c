//! Acting on a stop request (`cancel.rs` asks for one): at each switch point a fiber whose
//! `stop` byte is set, or a plain thread inside a `vt::timeout`, unwinds with the stop's
//! payload if a stop is due, and a park wakes at the end of a `timeout` scope that may stop it.
//! Below `park.rs`, which calls it; `arch/decisions/0004-cancellation.md`.

use std::fmt;
use std::panic::resume_unwind;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::FiberRecord;
use super::context;
use super::stop_state::{CANCEL, DEADLINE, DeadlineScope};

/// The unwind payload of a fiber stopped by [`JoinHandle::cancel`](crate::JoinHandle::cancel) or
/// a [`CancelHandle`](crate::CancelHandle): `join` returns `Err` holding it.
///
/// ```
/// use virtual_threads as vt;
/// let h = vt::spawn(|| loop { vt::sleep(std::time::Duration::from_millis(1)) });
/// h.cancel();
/// let payload = h.join().unwrap_err();
/// assert!(payload.downcast_ref::<vt::Cancelled>().is_some());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cancelled;

impl fmt::Display for Cancelled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("fiber cancelled")
    }
}

impl std::error::Error for Cancelled {}

/// The unwind payload of a deadline: the address of the scope that fired, which alone catches
/// it (Trio's marker), so an outer deadline passes through inner `timeout`s.
pub(super) struct DeadlineUnwind(pub(super) usize);

/// What a switch point must do.
pub(super) enum Stop {
    Cancel,
    Deadline(*const DeadlineScope),
}

/// The stop request a switch point acts on now, if any: a whole-fiber cancellation outside any
/// `uncancellable` section, else the outermost elapsed deadline not deferred by a section
/// opened inside it.
pub(super) fn pending(stop: u8, shield: u32, mut scope: *const DeadlineScope) -> Option<Stop> {
    if stop & CANCEL != 0 && shield == 0 {
        return Some(Stop::Cancel);
    }
    if stop & DEADLINE == 0 || scope.is_null() {
        return None;
    }
    let now = Instant::now();
    let mut fired = None;
    while !scope.is_null() {
        // SAFETY: the list holds the scopes of `deadline` calls still running on this stack
        // (each pops itself before its frame ends), read only by the fiber or thread that owns
        // that stack.
        let s = unsafe { &*scope };
        if s.shield == shield && now >= s.at {
            fired = Some(Stop::Deadline(scope));
        }
        scope = s.outer;
    }
    fired
}

/// Unwinds with the stop's payload. Without unwinding (`panic = "abort"`) there is nothing to
/// do: the stop stays visible to `is_cancelled` (`arch/guide.md`).
fn raise(stop: Stop) {
    if cfg!(panic = "abort") {
        return;
    }
    match stop {
        Stop::Cancel => resume_unwind(Box::new(Cancelled)),
        Stop::Deadline(s) => resume_unwind(Box::new(DeadlineUnwind(s.addr()))),
    }
}

/// A switch point of a fiber whose `stop` byte is not zero: unwinds if a stop is due. Never
/// while the fiber unwinds already (a panic in a destructor during unwinding aborts).
#[cold]
#[inline(never)]
pub(crate) fn stop_point(rec: &FiberRecord) {
    stop_point_inline(rec);
}

/// `stop_point`'s body, inlined into the park's out-of-line stop path (`park::park_stopping`):
/// every frame between the stop and the catch costs the unwind two look-ups of its unwind
/// table and a personality call, in each of its two phases.
#[inline(always)]
fn stop_point_inline(rec: &FiberRecord) {
    // Not during an unwind, nor while the runtime's drop unwinds this fiber (its waits are
    // spurious wake-ups then, `park::park_fiber`).
    if std::thread::panicking() || !context::cancelling().is_null() {
        return;
    }
    if let Some(stop) = pending(
        rec.stop.load(Ordering::Acquire),
        rec.shield.load(Ordering::Relaxed).into(),
        rec.deadlines.get(),
    ) {
        raise(stop);
    }
}

/// A park of a fiber whose `stop` byte is not zero, before it parks: unwinds if a stop is due,
/// else returns when the park must wake: at `deadline`, or earlier at the end of a `timeout`
/// scope that may stop the fiber.
#[inline(always)]
pub(crate) fn stop_point_before_park(rec: &FiberRecord, deadline: Option<Instant>) -> Option<Instant> {
    stop_point_inline(rec);
    if rec.stop.load(Ordering::Relaxed) & DEADLINE == 0 || !context::cancelling().is_null() {
        return deadline;
    }
    earliest(rec.shield.load(Ordering::Relaxed).into(), rec.deadlines.get(), deadline)
}

pub(super) fn earliest(
    shield: u32,
    mut scope: *const DeadlineScope,
    mut deadline: Option<Instant>,
) -> Option<Instant> {
    if std::thread::panicking() {
        return deadline;
    }
    while !scope.is_null() {
        // SAFETY: as in `pending`.
        let s = unsafe { &*scope };
        if s.shield == shield {
            deadline = Some(deadline.map_or(s.at, |d| d.min(s.at)));
        }
        scope = s.outer;
    }
    deadline
}

/// Whether the fiber has been asked to stop (its whole self, or a deadline it runs under), with
/// the fiber's pending request just as its next switch point would see it; `false` inside an
/// [`uncancellable`](crate::uncancellable) section, which defers it. For loops that never wait
/// (Go's `ctx.Err()`).
pub fn is_cancelled() -> bool {
    with_state(|stop, shield, scopes| pending(stop, shield, scopes).is_some())
}

/// Stops the calling fiber here if it has been asked to stop ([`is_cancelled`]): unwinds with
/// [`Cancelled`], or back to the `timeout` whose deadline passed. A switch point for loops that
/// never wait. Does nothing while the fiber is already unwinding.
pub fn check_cancelled() {
    if std::thread::panicking() {
        return;
    }
    if let Some(stop) = with_state(pending) {
        raise(stop);
    }
}

/// Whether a stop is due for the caller that its switch point cannot act on by unwinding: in a
/// build without unwinding (`panic = "abort"`), where `raise` does nothing. A timed wait asks
/// this before it parks and, if so, ends as if its deadline had passed, so the caller gets the
/// timeout error its API already has (`arch/decisions/0004-cancellation.md`). Always false where
/// unwinding works: there the park's stop point unwinds instead.
#[cfg_attr(loom, allow(dead_code))] // loom models stand in for the stop themselves
#[inline]
pub(crate) fn due_without_unwinding() -> bool {
    cfg!(panic = "abort") && !std::thread::panicking() && is_cancelled()
}

/// Reads the stop state of the calling fiber, or of this plain thread (deadlines only).
pub(super) fn with_state<R>(f: impl FnOnce(u8, u32, *const DeadlineScope) -> R) -> R {
    let rec = context::current_fiber();
    if rec.is_null() {
        let p = context::plain_stop();
        let stop = if p.deadlines.is_null() { 0 } else { DEADLINE };
        return f(stop, p.shield, p.deadlines);
    }
    // SAFETY: the running fiber's record outlives its run; used before any switch point.
    let rec = unsafe { &*rec };
    f(rec.stop.load(Ordering::Acquire), rec.shield.load(Ordering::Relaxed).into(), rec.deadlines.get())
}

/// A plain thread's park inside `vt::timeout`: the deadline it must wake at.
#[cold]
pub(crate) fn plain_park_deadline(deadline: Option<Instant>) -> Option<Instant> {
    let p = context::plain_stop();
    earliest(p.shield, p.deadlines, deadline)
}

/// A plain thread's wait inside `vt::timeout`, after its park: unwinds if the deadline passed.
#[cold]
pub(crate) fn plain_stop_point() {
    if std::thread::panicking() {
        return;
    }
    let p = context::plain_stop();
    if let Some(stop) = pending(DEADLINE, p.shield, p.deadlines) {
        raise(stop);
    }
}
