//! `Semaphore`: a counting semaphore whose waiters park their fiber.
//!
//! One state word: bit 0 `QUEUED` (the wait queue is non-empty; changed only with the inner
//! `queue` lock held), bits 1.. the free permits. Uncontended acquire and release are one
//! compare-and-swap each. Fairness is strict FIFO hand-off: once anyone is queued, acquirers
//! queue too, and `release` grants its permit straight to the first waiter instead of freeing
//! it, so a permit never goes to a latecomer while someone waits. A timed-out acquirer that
//! loses `cancel` to a grant owns the permit and returns it. Protocol: `arch/sync.md`.

use std::fmt;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use super::loom::{self, Arc, AtomicUsize, Ordering};
use super::wait_list::{Outcome, WaitQueue, Waiter};
use crate::fiber::wait::WaitReason;

const QUEUED: usize = 1;
const PERMIT: usize = 2;

/// `let slots = vt::sync::Semaphore::new(100); let _permit = slots.acquire();`
///
/// A counting semaphore: at most `permits` holders at a time.
///
/// ```
/// use virtual_threads as vt;
///
/// let sem = vt::sync::Semaphore::new(2);
/// let a = sem.acquire();
/// let _b = sem.acquire();
/// assert!(sem.try_acquire().is_none());
/// drop(a);
/// assert!(sem.try_acquire().is_some());
/// ```
pub struct Semaphore {
    /// Bit 0 `QUEUED`, bits 1.. free permits.
    state: AtomicUsize,
    queue: loom::Mutex<WaitQueue<Arc<Waiter>>>,
}

/// One permit of a [`Semaphore`], given back on drop.
#[must_use = "if unused the permit is released at once"]
pub struct SemaphorePermit<'a> {
    sem: &'a Semaphore,
}

impl Semaphore {
    loom::loom_const_fn! {
        /// Creates a semaphore with `permits` free permits.
        ///
        /// # Panics
        /// If `permits` exceeds `usize::MAX / 2`.
        pub fn new(permits: usize) -> Semaphore {
            assert!(permits <= usize::MAX / PERMIT, "too many permits");
            Semaphore {
                state: AtomicUsize::new(permits * PERMIT),
                queue: loom::Mutex::new(WaitQueue::new()),
            }
        }
    }

    /// Takes a permit, parking while none is free.
    pub fn acquire(&self) -> SemaphorePermit<'_> {
        if !self.try_acquire_fast() {
            let acquired = self.acquire_contended(None);
            debug_assert!(acquired, "an untimed acquire cannot time out");
        }
        SemaphorePermit { sem: self }
    }

    /// Takes a permit if one is free and nobody is queued for it.
    pub fn try_acquire(&self) -> Option<SemaphorePermit<'_>> {
        // `then`, not `then_some`: a permit built eagerly and dropped would release a permit.
        self.try_acquire_fast().then(|| SemaphorePermit { sem: self })
    }

    /// Takes a permit, parking for at most `dur`.
    pub fn acquire_timeout(&self, dur: Duration) -> Option<SemaphorePermit<'_>> {
        let acquired = self.try_acquire_fast() || self.acquire_contended(Instant::now().checked_add(dur));
        acquired.then(|| SemaphorePermit { sem: self })
    }

    /// Adds a permit: wakes the first waiter with it, or frees it.
    ///
    /// Pairs with [`SemaphorePermit::forget`]; calling it without a matching forgotten permit
    /// raises the semaphore's capacity.
    pub fn release(&self) {
        let mut state = self.state.load(Ordering::Relaxed);
        while state & QUEUED == 0 {
            // Release pairs with the next acquirer's Acquire.
            match self.state.compare_exchange_weak(
                state,
                state + PERMIT,
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => return,
                Err(now) => state = now,
            }
        }
        self.release_contended();
    }

    /// The number of free permits right now (racy by design: a snapshot).
    pub fn available_permits(&self) -> usize {
        self.state.load(Ordering::Relaxed) / PERMIT
    }

    fn try_acquire_fast(&self) -> bool {
        let mut state = self.state.load(Ordering::Relaxed);
        while state & QUEUED == 0 && state >= PERMIT {
            // Acquire pairs with the Release of the `release` that freed the permit.
            match self.state.compare_exchange_weak(
                state,
                state - PERMIT,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => state = now,
            }
        }
        false
    }

    fn acquire_contended(&self, deadline: Option<Instant>) -> bool {
        let waiter = Arc::new(Waiter::new());
        loop {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            let state = self.state.load(Ordering::Relaxed);
            if state & QUEUED == 0 {
                let next = if state >= PERMIT { state - PERMIT } else { state | QUEUED };
                // Acquire pairs with the Release of the `release` that freed the permit.
                // Relaxed would do for setting QUEUED (`queue` orders it); one CAS serves both.
                if self.state.compare_exchange(state, next, Ordering::Acquire, Ordering::Relaxed).is_err() {
                    continue;
                }
                if state >= PERMIT {
                    return true;
                }
            }
            queue.push_back(waiter.clone());
            drop(queue);
            let abandon = |outcome| match outcome {
                None => self.remove_waiter(&waiter),
                // Granted a permit nobody will use: give it back.
                Some(Outcome::Granted(_)) => self.release(),
                Some(_) => {}
            };
            return match waiter.wait_or_abandon(WaitReason::Semaphore, deadline, abandon) {
                // `release` handed its permit over; its Release on the waiter's state is seen
                // by `wait`'s Acquire.
                Outcome::Granted(_) => true,
                Outcome::TimedOut => {
                    self.remove_waiter(&waiter);
                    false
                }
                Outcome::Woken(_) => unreachable!("semaphore waiters are only granted"),
            };
        }
    }

    /// Takes a cancelled waiter out of the queue.
    fn remove_waiter(&self, waiter: &Waiter) {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        queue.remove(waiter);
        if queue.is_empty() {
            // Read-modify-write: QUEUED may be clear already (a release emptied the queue),
            // and then fast paths run concurrently.
            self.state.fetch_and(!QUEUED, Ordering::Relaxed);
        }
    }

    fn release_contended(&self) {
        let granted = {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            // Cancelled waiters at the front are dropped; they remove nothing else.
            let granted = queue.pop_accepted(|w| w.grant(0));
            if queue.is_empty() {
                // QUEUED may already be clear: a timed-out waiter that emptied the queue
                // cleared it, and then fast paths run concurrently, so read-modify-write.
                // Release pairs with the next fast-path acquirer's Acquire.
                let free = if granted.is_some() { 0 } else { PERMIT };
                let _ = self.state.fetch_update(Ordering::Release, Ordering::Relaxed, |state| {
                    Some((state & !QUEUED) + free)
                });
            }
            granted
        };
        if let Some(waiter) = granted {
            waiter.unpark();
        }
    }
}

impl SemaphorePermit<'_> {
    /// Keeps the permit taken for good; give it back later with [`Semaphore::release`].
    pub fn forget(self) {
        std::mem::forget(self);
    }
}

impl Drop for SemaphorePermit<'_> {
    fn drop(&mut self) {
        self.sem.release();
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("available_permits", &self.available_permits())
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for SemaphorePermit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SemaphorePermit").finish_non_exhaustive()
    }
}
