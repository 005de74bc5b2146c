//! `Barrier`: std's API; the first `n - 1` arrivals of each generation park their fiber, the
//! `n`-th (the leader) wakes them all and starts the next generation.
//!
//! The count and the waiters of the current generation live under one inner lock, so the
//! leader takes exactly the waiters of its own generation: an early arrival of the next
//! generation cannot be released by the previous one.

use std::fmt;
use std::sync::PoisonError;

use super::loom::{self, Arc};
use super::wait_list::{Outcome, Waiter};
use crate::fiber::wait::WaitReason;

/// `let barrier = vt::sync::Barrier::new(n); barrier.wait();`
///
/// Lets `n` fibers or threads wait until all of them have arrived.
///
/// Same API as [`std::sync::Barrier`].
pub struct Barrier {
    n: usize,
    synced: loom::Mutex<Synced>,
}

/// The current generation: guarded by `Barrier::synced`.
struct Synced {
    arrived: usize,
    waiters: Vec<Arc<Waiter>>,
}

/// What [`Barrier::wait`] returns: exactly one caller per generation is the leader.
#[derive(Debug)]
pub struct BarrierWaitResult(bool);

impl BarrierWaitResult {
    /// True for the one caller per generation that arrived last.
    pub fn is_leader(&self) -> bool {
        self.0
    }
}

impl Barrier {
    loom::loom_const_fn! {
        /// Creates a barrier for `n` parties; with `n` 0 or 1 nobody ever waits.
        pub fn new(n: usize) -> Barrier {
            Barrier { n, synced: loom::Mutex::new(Synced { arrived: 0, waiters: Vec::new() }) }
        }
    }

    /// Parks until `n` parties have called `wait` in this generation.
    pub fn wait(&self) -> BarrierWaitResult {
        let mut synced = self.synced.lock().unwrap_or_else(PoisonError::into_inner);
        synced.arrived += 1;
        if synced.arrived < self.n {
            let waiter = Arc::new(Waiter::new());
            synced.waiters.push(waiter.clone());
            drop(synced);
            // A broadcast wake-up: a waiter that a runtime's drop unwinds here leaves nothing to
            // hand on (unlike a lock or a message), so a plain `wait` is enough.
            let outcome = waiter.wait(WaitReason::Barrier, None);
            debug_assert_eq!(outcome, Outcome::Woken(0));
            return BarrierWaitResult(false);
        }
        synced.arrived = 0;
        let waiters = std::mem::take(&mut synced.waiters);
        drop(synced);
        for waiter in waiters {
            // Release (in `wake`) publishes every arrival's writes, gathered by the inner lock.
            let woken = waiter.wake(0);
            debug_assert!(woken, "barrier waiters never cancel");
            waiter.unpark();
        }
        BarrierWaitResult(true)
    }
}

impl fmt::Debug for Barrier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Barrier").field("n", &self.n).finish_non_exhaustive()
    }
}
