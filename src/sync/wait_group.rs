//! `WaitGroup`: crossbeam's shape. Every clone is a member; dropping a member marks it done;
//! `wait(self)` drops the caller's own membership and parks until no member is left.
//!
//! The member count is an atomic; only the drop that takes it to zero takes the inner lock, to
//! wake the waiters. A waiter re-checks the count under that lock before it parks, so the last
//! drop either sees it queued or happened before its check (proof: `arch/sync.md`).

use std::fmt;
use std::sync::PoisonError;

use super::loom::{self, Arc, AtomicUsize, Ordering};
use super::wait_list::Waiter;
use crate::fiber::wait::WaitReason;

/// `let wg = vt::sync::WaitGroup::new(); let w = wg.clone(); vt::spawn(move || { work(); drop(w) }); wg.wait();`
///
/// Waits until a group of fibers or threads is done.
///
/// ```
/// use virtual_threads as vt;
///
/// let wg = vt::sync::WaitGroup::new();
/// for _ in 0..4 {
///     let wg = wg.clone();
///     vt::spawn(move || drop(wg));
/// }
/// wg.wait();
/// ```
pub struct WaitGroup {
    inner: Arc<Inner>,
}

struct Inner {
    members: AtomicUsize,
    waiters: loom::Mutex<Vec<Arc<Waiter>>>,
}

impl WaitGroup {
    /// Creates a group with one member: the returned handle.
    pub fn new() -> WaitGroup {
        WaitGroup {
            inner: Arc::new(Inner { members: AtomicUsize::new(1), waiters: loom::Mutex::new(Vec::new()) }),
        }
    }

    /// Drops this member and parks until every other member is dropped.
    pub fn wait(self) {
        let inner = self.inner.clone();
        drop(self);
        // Acquire pairs with the members' AcqRel decrements: their work is visible after.
        if inner.members.load(Ordering::Acquire) == 0 {
            return;
        }
        let waiter = Arc::new(Waiter::new());
        {
            let mut waiters = inner.waiters.lock().unwrap_or_else(PoisonError::into_inner);
            // Re-checked under the lock the last member takes after reaching zero.
            if inner.members.load(Ordering::Acquire) == 0 {
                return;
            }
            waiters.push(waiter.clone());
        }
        // A broadcast wake-up: a waiter that a runtime's drop unwinds here leaves nothing to
        // hand on (unlike a lock or a message), so a plain `wait` is enough.
        waiter.wait(WaitReason::WaitGroup, None);
    }
}

impl Drop for WaitGroup {
    fn drop(&mut self) {
        // AcqRel: Release publishes this member's work; Acquire lets the last member publish
        // everyone's through the wake below.
        if self.inner.members.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let waiters = std::mem::take(&mut *self.inner.waiters.lock().unwrap_or_else(PoisonError::into_inner));
        for waiter in waiters {
            if waiter.wake(0) {
                waiter.unpark();
            }
        }
    }
}

impl Clone for WaitGroup {
    fn clone(&self) -> WaitGroup {
        // Relaxed: a new member is made from a live one, so the count cannot be zero here.
        self.inner.members.fetch_add(1, Ordering::Relaxed);
        WaitGroup { inner: self.inner.clone() }
    }
}

impl Default for WaitGroup {
    fn default() -> WaitGroup {
        WaitGroup::new()
    }
}

impl fmt::Debug for WaitGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitGroup").field("members", &self.inner.members.load(Ordering::Relaxed)).finish()
    }
}
