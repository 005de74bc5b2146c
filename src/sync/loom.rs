//! The park seam of `vt::sync` and `vt::channel` on top of the crate's loom facade
//! (`crate::loom`, re-exported here whole): who is waiting (`Fiber`, `current`, `current_id`)
//! and how it waits.
//!
//! Under `cfg(loom)` the runtime's park/unpark is replaced by loom threads' park/unpark: loom
//! cannot switch corosensei stacks, but it can explore every interleaving of "register,
//! re-check, park" against "pop, transition, unpark". A timed wait is modelled as a timer that
//! has already fired (`crate::loom::expired`), so the models exercise exactly the race where a
//! timeout meets a wake-up (see `arch/sync.md`, `arch/loom.md`).

pub(crate) use crate::loom::*;
pub(crate) use imp::*;

#[cfg(not(loom))]
mod imp {
    pub(crate) use crate::fiber::handle::{Fiber, current};

    // Parking goes through `wait_list::park`, which records the wait reason for dumps.

    /// Whether a wait about to park must end instead, for a stop request that cannot unwind
    /// here (`fiber::stop::due_without_unwinding`: a build without unwinding). Only timed waits
    /// end so (`timed`): they have an error to return; an untimed one parks on, and its
    /// caller sees the stop at its next switch point where one can act (`is_cancelled`).
    #[inline]
    pub(crate) fn stop_due(timed: bool) -> bool {
        timed && crate::fiber::stop::due_without_unwinding()
    }

    /// Who is calling, as a number that no other live caller has: the running fiber's record
    /// (its address; a channel that remembers it also holds a counted handle to it, so it is
    /// not reused meanwhile), or 0 on a plain thread.
    #[inline]
    pub(crate) fn current_id() -> usize {
        crate::fiber::context::current_fiber() as usize
    }
}

#[cfg(loom)]
mod imp {
    use std::time::Instant;

    pub(crate) use loom::thread::{Thread as Fiber, current, park};

    use loom::sync::atomic::AtomicBool;
    use std::cell::RefCell;

    loom::thread_local! {
        /// The model thread's stop request (a stand-in for its fiber record's `stop` byte),
        /// installed by `stop_flag`.
        static STOP: RefCell<Option<loom::sync::Arc<AtomicBool>>> = RefCell::new(None);
    }

    /// Makes `flag` the calling model thread's stop request: a canceller sets it (Release)
    /// and unparks the thread, as `CancelHandle::cancel` does to a fiber.
    pub(crate) fn stop_flag(flag: loom::sync::Arc<AtomicBool>) {
        STOP.with(|s| *s.borrow_mut() = Some(flag));
    }

    /// Whether the model thread has been asked to stop, at a park. Loom cannot unwind a model
    /// thread (its own state would be poisoned), so a wait that sees it runs what the unwind
    /// would run instead (`Waiter::wait_or_abandon`), timed or not.
    pub(crate) fn stop_due(_timed: bool) -> bool {
        STOP.with(|s| s.borrow().as_ref().is_some_and(|f| f.load(loom::sync::atomic::Ordering::Acquire)))
    }

    /// A timed park: the model treats the timer as having fired already, so this only yields.
    pub(crate) fn park_until(_deadline: Instant) {
        loom::thread::yield_now();
    }

    /// A number per model thread, never 0 (model threads stand in for fibers, so every one may
    /// use a channel's fast slot).
    pub(crate) fn current_id() -> usize {
        // loom's ThreadId has no accessor for its number; its Debug form is "ThreadId(n)".
        let id = format!("{:?}", loom::thread::current().id());
        let n: usize =
            id.trim_start_matches("ThreadId(").trim_end_matches(')').parse().expect("loom thread id");
        n + 1
    }
}
