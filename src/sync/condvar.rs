//! `Condvar`: std's API over [`super::Mutex`]; waiters park their fiber.
//!
//! A waiter enqueues itself *before* it releases the mutex, so any notify that follows a state
//! change made under the mutex finds it: no notification is lost. Notifications go FIFO. A
//! timed-out waiter must win `cancel` on its waiter; if a notify won first, the wait counts as
//! notified (not timed out), so `notify_one` is never swallowed by a timeout. Waits have no
//! spurious wake-ups, though callers should loop on their condition as with std.
//! Protocol: `arch/sync.md`.

use std::fmt;
use std::sync::{LockResult, PoisonError};
use std::time::{Duration, Instant};

use super::loom::{self, Arc};
use super::mutex::MutexGuard;
use super::poison;
use super::wait_list::{Outcome, WaitQueue, Waiter};
use crate::fiber::wait::WaitReason;

/// `let mut ready = cv.wait_while(lock.lock().unwrap(), |r| !*r).unwrap();`
///
/// A condition variable whose waiters park their fiber (or plain thread).
///
/// Same API as [`std::sync::Condvar`], for [`super::Mutex`].
pub struct Condvar {
    queue: loom::Mutex<WaitQueue<Arc<Waiter>>>,
}

/// Whether a timed wait on a [`Condvar`] ended by its timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    /// True if the wait ended because the timeout elapsed.
    pub fn timed_out(&self) -> bool {
        self.0
    }
}

impl Condvar {
    loom::loom_const_fn! {
        /// Creates a condition variable with no waiters.
        pub fn new() -> Condvar {
            Condvar { queue: loom::Mutex::new(WaitQueue::new()) }
        }
    }

    /// Releases the guard's mutex, parks until notified, and locks it again.
    pub fn wait<'a, T: ?Sized>(&self, guard: MutexGuard<'a, T>) -> LockResult<MutexGuard<'a, T>> {
        let (result, _) = self.wait_until(guard, None);
        result
    }

    /// Waits while `condition` returns true, re-checking it after each notification.
    pub fn wait_while<'a, T: ?Sized, F>(
        &self,
        mut guard: MutexGuard<'a, T>,
        mut condition: F,
    ) -> LockResult<MutexGuard<'a, T>>
    where
        F: FnMut(&mut T) -> bool,
    {
        while condition(&mut *guard) {
            guard = self.wait(guard)?;
        }
        Ok(guard)
    }

    /// Like [`Condvar::wait`], giving up after `dur`.
    pub fn wait_timeout<'a, T: ?Sized>(
        &self,
        guard: MutexGuard<'a, T>,
        dur: Duration,
    ) -> LockResult<(MutexGuard<'a, T>, WaitTimeoutResult)> {
        let (result, timed_out) = self.wait_until(guard, Instant::now().checked_add(dur));
        poison::map_result(result, |g| (g, WaitTimeoutResult(timed_out)))
    }

    /// Like [`Condvar::wait_while`], giving up after `dur` in total.
    pub fn wait_timeout_while<'a, T: ?Sized, F>(
        &self,
        mut guard: MutexGuard<'a, T>,
        dur: Duration,
        mut condition: F,
    ) -> LockResult<(MutexGuard<'a, T>, WaitTimeoutResult)>
    where
        F: FnMut(&mut T) -> bool,
    {
        let deadline = Instant::now().checked_add(dur);
        loop {
            if !condition(&mut *guard) {
                return Ok((guard, WaitTimeoutResult(false)));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok((guard, WaitTimeoutResult(true)));
            }
            let (result, _) = self.wait_until(guard, deadline);
            guard = match result {
                Ok(guard) => guard,
                Err(err) => {
                    return Err(PoisonError::new((err.into_inner(), WaitTimeoutResult(false))));
                }
            };
        }
    }

    /// Wakes one waiter, the longest-waiting one.
    pub fn notify_one(&self) {
        let woken = self.queue.lock().unwrap_or_else(PoisonError::into_inner).pop_accepted(|w| w.wake(0));
        if let Some(waiter) = woken {
            waiter.unpark();
        }
    }

    /// Wakes every waiter.
    pub fn notify_all(&self) {
        let all = self.queue.lock().unwrap_or_else(PoisonError::into_inner).take_all();
        for waiter in all {
            // A cancelled waiter (timed out) is skipped; it needs no unpark.
            if waiter.wake(0) {
                waiter.unpark();
            }
        }
    }

    /// Returns the relocked guard and whether the wait timed out.
    fn wait_until<'a, T: ?Sized>(
        &self,
        guard: MutexGuard<'a, T>,
        deadline: Option<Instant>,
    ) -> (LockResult<MutexGuard<'a, T>>, bool) {
        let waiter = Arc::new(Waiter::new());
        self.queue.lock().unwrap_or_else(PoisonError::into_inner).push_back(waiter.clone());
        let mutex = guard.lock;
        drop(guard);
        let abandon = |outcome| match outcome {
            None => self.queue.lock().unwrap_or_else(PoisonError::into_inner).remove(&waiter),
            // A notification nobody will act on: hand it to the next waiter.
            Some(Outcome::Woken(_) | Outcome::Granted(_)) => self.notify_one(),
            Some(Outcome::TimedOut) => {}
        };
        let timed_out = match waiter.wait_or_abandon(WaitReason::Condvar, deadline, abandon) {
            Outcome::TimedOut => {
                self.queue.lock().unwrap_or_else(PoisonError::into_inner).remove(&waiter);
                true
            }
            Outcome::Woken(_) | Outcome::Granted(_) => false,
        };
        (mutex.lock(), timed_out)
    }
}

impl Default for Condvar {
    fn default() -> Condvar {
        Condvar::new()
    }
}

impl fmt::Debug for Condvar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Condvar").finish_non_exhaustive()
    }
}
