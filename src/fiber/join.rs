//! `JoinHandle`: where a fiber's result (or panic) waits for whoever joins it.
//!
//! The result lives in the fiber's record (the stage that held its closure). A state word
//! makes the hand-off race-free without a lock:
//! 1. The fiber writes its result, then swaps the state to `DONE` (AcqRel).
//! 2. A joiner that finds `EMPTY` stores its `Fiber` handle, then CASes `EMPTY → WAITING`
//!    (AcqRel) and parks until it sees `DONE`.
//! 3. A handle dropped without joining swaps in `DETACHED`.
//!
//! If the swap in 1 returns `WAITING`, the joiner's handle is visible (its CAS released it) and
//! the fiber unparks it; if the CAS in 2 fails, the result is already there. If 1 sees
//! `DETACHED`, or 3 sees `DONE`, that side drops the result. Exactly one party takes or drops
//! the result, and then tells the fiber's scope, if any.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::thread;

use super::park::Fiber;
use super::{FiberRecord, STAGE_RESULT};

const EMPTY: u8 = 0;
const WAITING: u8 = 1;
const DONE: u8 = 2;
const DETACHED: u8 = 3;
const TAKEN: u8 = 4;

/// Step 1 (the fiber's side), after it stored its result in the stage. Called once.
pub(crate) fn complete(rec: &FiberRecord) {
    match rec.join.swap(DONE, Ordering::AcqRel) {
        WAITING => {
            // SAFETY: WAITING means the joiner stored its handle before its Release CAS, which
            // our Acquire swap observed; the joiner does not touch it again until DONE.
            if let Some(w) = unsafe { (*rec.waiter.get()).take() } {
                w.unpark();
            }
        }
        DETACHED => {
            // Nobody will join: the result is ours to drop.
            // SAFETY: the stage holds this fiber's result; the handle is gone.
            let panicked = unsafe { (rec.vtable.get().drop_result)(rec) };
            scope_done(rec, panicked);
        }
        _ => {}
    }
}

/// The result was taken or dropped: tell the scope (once; the caller is the only party).
fn scope_done(rec: &FiberRecord, unhandled_panic: bool) {
    // SAFETY: exactly one party reaches here per fiber (see the module doc), so the cell is
    // not touched concurrently.
    if let Some(scope) = unsafe { (*rec.scope.get()).take() } {
        scope.fiber_done(unhandled_panic);
    }
}

/// An owned permission to join a fiber (wait for it to finish and take its result), like
/// `std::thread::JoinHandle`. Dropping it detaches the fiber, which keeps running.
pub struct JoinHandle<T> {
    pub(crate) fiber: Fiber,
    pub(crate) _result: PhantomData<fn() -> T>,
}

impl<T> JoinHandle<T> {
    fn rec(&self) -> &FiberRecord {
        self.fiber.record().expect("a join handle refers to a fiber")
    }

    /// Waits for the fiber to finish. `Err` holds the payload of the fiber's panic (or, if its
    /// runtime was dropped first, a `&'static str` saying it was cancelled).
    /// Called from a fiber, this parks the fiber; from a plain thread, it blocks the thread.
    pub fn join(self) -> thread::Result<T> {
        let rec = self.rec();
        if rec.join.load(Ordering::Acquire) != DONE {
            // SAFETY: the fiber reads `waiter` only after seeing WAITING, not yet published.
            unsafe { *rec.waiter.get() = Some(crate::current()) };
            if rec.join.compare_exchange(EMPTY, WAITING, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                while rec.join.load(Ordering::Acquire) != DONE {
                    crate::park();
                }
            }
        }
        debug_assert_eq!(rec.stage_kind.get(), STAGE_RESULT);
        // SAFETY: DONE was observed with Acquire, so the fiber's write of its result happened
        // before; it is a `thread::Result<T>` (this handle's type), and we are the only taker.
        let r = unsafe { rec.take_stage::<thread::Result<T>>() };
        rec.join.store(TAKEN, Ordering::Relaxed);
        scope_done(rec, false);
        r
    }

    /// Whether the fiber has finished (its result is ready); does not block.
    pub fn is_finished(&self) -> bool {
        self.rec().join.load(Ordering::Acquire) == DONE
    }

    /// The fiber's handle.
    pub fn fiber(&self) -> &Fiber {
        &self.fiber
    }
}

impl<T> Drop for JoinHandle<T> {
    fn drop(&mut self) {
        let rec = self.rec();
        if rec.join.load(Ordering::Relaxed) == TAKEN {
            return;
        }
        if rec.join.swap(DETACHED, Ordering::AcqRel) == DONE {
            // SAFETY: DONE: the result is in the stage and nobody else will take it.
            let panicked = unsafe { (rec.vtable.get().drop_result)(rec) };
            scope_done(rec, panicked);
        }
    }
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle")
            .field("fiber", &self.fiber)
            .field("finished", &self.is_finished())
            .finish()
    }
}
