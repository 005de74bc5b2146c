//! `Mutex<T>`: std's API and poisoning; contended waiters park their fiber, not the carrier.
//!
//! One state byte holds `LOCKED` and `QUEUED` (the wait queue is non-empty). Uncontended lock
//! and unlock are one compare-and-swap each, with no allocation and no inner lock. The inner
//! lock (`queue`) is taken only on the slow paths, and `QUEUED` is set and cleared only while it
//! is held, so an unlocker that sees `QUEUED` always finds the waiter it must wake.
//!
//! Fairness is *bounded barging*: unlock wakes the first waiter and releases the lock, so a
//! running fiber may take it first (throughput, no lock convoy); a waiter that loses that race
//! goes back to the *front* of the queue marked `handoff`, and the next unlock hands it the lock
//! directly without releasing it. So a waiter is overtaken at most once after being woken:
//! FIFO, starvation-free. Each contended `lock` allocates one `Arc<Waiter>`, reused across
//! its retries. Protocol and proof sketch: `arch/sync.md`.

use std::cell::UnsafeCell;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::{LockResult, PoisonError, TryLockError, TryLockResult};

use super::loom::{self, Arc, AtomicU8, Ordering};
use super::poison;
use super::wait_list::{Outcome, WaitQueue, Waiter};
use crate::fiber::wait::WaitReason;

/// The lock is held.
const LOCKED: u8 = 1;
/// At least one waiter is queued; changed only with the inner `queue` lock held.
const QUEUED: u8 = 2;
/// Lock attempts spent spinning before queueing: enough to ride out a holder running on
/// another carrier for a few hundred nanoseconds, short enough not to starve its own carrier.
const SPINS: u32 = if cfg!(loom) { 0 } else { 40 };

/// `static COUNT: vt::sync::Mutex<u64> = vt::sync::Mutex::new(0); *COUNT.lock().unwrap() += 1;`
///
/// A mutual-exclusion lock whose waiters park their fiber (or plain thread).
///
/// Same API and poisoning as [`std::sync::Mutex`].
///
/// ```
/// use virtual_threads as vt;
/// use std::sync::Arc;
///
/// let count = Arc::new(vt::sync::Mutex::new(0));
/// let handles: Vec<_> = (0..4)
///     .map(|_| {
///         let count = count.clone();
///         vt::spawn(move || *count.lock().unwrap() += 1)
///     })
///     .collect();
/// for h in handles {
///     h.join().unwrap();
/// }
/// assert_eq!(*count.lock().unwrap(), 4);
/// ```
pub struct Mutex<T: ?Sized> {
    /// Bit 0 `LOCKED`, bit 1 `QUEUED`.
    state: AtomicU8,
    poison: poison::Flag,
    queue: loom::Mutex<WaitQueue<QueuedLocker>>,
    data: UnsafeCell<T>,
}

/// A parked `lock` call.
#[derive(Debug)]
struct QueuedLocker {
    waiter: Arc<Waiter>,
    /// This waiter already lost one race after being woken: hand it the lock directly.
    handoff: bool,
}

impl super::wait_list::Entry for QueuedLocker {
    fn waiter(&self) -> &Waiter {
        &self.waiter
    }
}

// SAFETY: the lock gives one holder at a time `&mut T`, so sharing the `Mutex` only moves `T`
// between threads (needs `T: Send`), as std's `Mutex` does.
unsafe impl<T: ?Sized + Send> Sync for Mutex<T> {}
// SAFETY: owning the `Mutex` owns the `T`; the state and queue are `Send`.
unsafe impl<T: ?Sized + Send> Send for Mutex<T> {}

// As std's: poisoning reports a holder's panic, so the lock is unwind-safe.
impl<T: ?Sized> std::panic::UnwindSafe for Mutex<T> {}
impl<T: ?Sized> std::panic::RefUnwindSafe for Mutex<T> {}

/// RAII guard of a locked [`Mutex`]; unlocks on drop. `!Send`, like std's.
#[must_use = "if unused the Mutex will immediately unlock"]
pub struct MutexGuard<'a, T: ?Sized + 'a> {
    pub(super) lock: &'a Mutex<T>,
    poison: poison::Guard,
    _not_send: PhantomData<*const ()>,
}

// SAFETY: a `&MutexGuard` only hands out `&T`, which is safe to share when `T: Sync`.
unsafe impl<T: ?Sized + Sync> Sync for MutexGuard<'_, T> {}

impl<T> Mutex<T> {
    loom::loom_const_fn! {
        /// Creates an unlocked mutex.
        pub fn new(value: T) -> Mutex<T> {
            Mutex {
                state: AtomicU8::new(0),
                poison: poison::Flag::new(),
                queue: loom::Mutex::new(WaitQueue::new()),
                data: UnsafeCell::new(value),
            }
        }
    }

    /// Consumes the mutex and returns the value; `Err` (still holding it) if poisoned.
    pub fn into_inner(self) -> LockResult<T> {
        let Self { poison, data, .. } = self;
        poison.result(data.into_inner())
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Acquires the lock, parking the calling fiber (or thread) while another holds it.
    ///
    /// `Err` if a holder panicked; the guard is inside the error. Locking a mutex that the
    /// caller already holds deadlocks.
    pub fn lock(&self) -> LockResult<MutexGuard<'_, T>> {
        // Acquire pairs with the Release of the unlock that freed it.
        if self.state.compare_exchange(0, LOCKED, Ordering::Acquire, Ordering::Relaxed).is_err()
            && !self.lock_contended()
        {
            unreachable!("only a loom model's stop ends a lock wait without the lock");
        }
        // SAFETY: the lock is held by this caller from here until the guard drops.
        unsafe { MutexGuard::new(self) }
    }

    /// Acquires the lock if it is free right now.
    pub fn try_lock(&self) -> TryLockResult<MutexGuard<'_, T>> {
        let mut state = self.state.load(Ordering::Relaxed);
        // Barging past queued waiters is allowed here as in `lock`'s slow path.
        while state & LOCKED == 0 {
            // Acquire pairs with the Release of the unlock that freed it.
            match self.state.compare_exchange_weak(
                state,
                state | LOCKED,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                // SAFETY: the lock was just taken by this caller.
                Ok(_) => return unsafe { MutexGuard::new(self) }.map_err(TryLockError::from),
                Err(now) => state = now,
            }
        }
        Err(TryLockError::WouldBlock)
    }

    /// Whether a holder panicked.
    pub fn is_poisoned(&self) -> bool {
        self.poison.get()
    }

    /// Clears the poisoned state.
    pub fn clear_poison(&self) {
        self.poison.clear();
    }

    /// The value, through a unique borrow (no locking needed).
    pub fn get_mut(&mut self) -> LockResult<&mut T> {
        self.poison.result(self.data.get_mut())
    }

    /// The lock's slow path. False only when a stop request that cannot unwind ended the wait
    /// (a loom model's stand-in for the unwind, `Waiter::wait_or_abandon`): the lock then went
    /// to the next waiter, as the unwind's `abandon` hands it on.
    fn lock_contended(&self) -> bool {
        if self.spin() {
            return true;
        }
        let waiter = Arc::new(Waiter::new());
        let mut handoff = false;
        loop {
            {
                let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
                let state = self.state.load(Ordering::Relaxed);
                if state & LOCKED == 0 {
                    // Acquire pairs with the Release of the unlock that freed it.
                    if self
                        .state
                        .compare_exchange(state, state | LOCKED, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                    {
                        return true;
                    }
                    continue;
                }
                // Fails if the holder unlocked meanwhile (state changed): then retry the lock.
                // Relaxed: the queue's inner lock orders QUEUED with the unlocker's slow path.
                if state & QUEUED == 0
                    && self
                        .state
                        .compare_exchange(state, state | QUEUED, Ordering::Relaxed, Ordering::Relaxed)
                        .is_err()
                {
                    continue;
                }
                waiter.reset();
                let entry = QueuedLocker { waiter: waiter.clone(), handoff };
                if handoff {
                    queue.push_front(entry);
                } else {
                    queue.push_back(entry);
                }
            }
            match waiter.wait_or_abandon(WaitReason::Mutex, None, |outcome| self.abandon(&waiter, outcome)) {
                // The unlocker kept LOCKED set and handed it over; its Release on the waiter's
                // state, seen by `wait`'s Acquire, orders the previous holder's writes.
                Outcome::Granted(_) => return true,
                Outcome::Woken(_) => handoff = true,
                // Untimed: only a stop that `abandon` already dealt with.
                Outcome::TimedOut => return false,
            }
        }
    }

    /// Spins a little while the lock is held and nobody is queued; true if it got the lock.
    fn spin(&self) -> bool {
        for _ in 0..SPINS {
            std::hint::spin_loop();
            let state = self.state.load(Ordering::Relaxed);
            if state & QUEUED != 0 {
                return false;
            }
            // Acquire pairs with the Release of the unlock that freed it.
            if state == 0
                && self.state.compare_exchange(0, LOCKED, Ordering::Acquire, Ordering::Relaxed).is_ok()
            {
                return true;
            }
        }
        false
    }

    /// Releases the lock.
    ///
    /// Precondition: the caller holds the lock (it owns the guard being dropped).
    fn unlock(&self) {
        // Release pairs with the next locker's Acquire.
        if self.state.compare_exchange(LOCKED, 0, Ordering::Release, Ordering::Relaxed).is_err() {
            self.unlock_contended();
        }
    }

    fn unlock_contended(&self) {
        let next = {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            // State is LOCKED, with QUEUED or without, and stays so while we hold `queue`: only
            // we clear LOCKED, and QUEUED changes only under `queue`. It may be clear already:
            // the last waiter abandoned its wait (`abandon`) after our fast path failed, and the
            // queue is empty. So plain stores are exact, and storing after the transition is
            // safe: the waiter needs `queue` to go on either way.
            debug_assert_ne!(self.state.load(Ordering::Relaxed) & LOCKED, 0);
            loop {
                let Some(next) = queue.pop_front() else {
                    // Every entry was abandoned (see `abandon`): the lock is simply free.
                    self.state.store(0, Ordering::Release);
                    break None;
                };
                let rest = if queue.is_empty() { 0 } else { QUEUED };
                if next.handoff {
                    // Ownership passes with the grant: LOCKED stays set.
                    if next.waiter.grant(0) {
                        self.state.store(LOCKED | rest, Ordering::Relaxed);
                        break Some(next);
                    }
                } else if next.waiter.wake(0) {
                    // Release pairs with the Acquire of whoever locks next (barger or `next`).
                    self.state.store(rest, Ordering::Release);
                    break Some(next);
                }
                // Cancelled: its fiber was unwound by a runtime's drop; try the next one.
            }
        };
        if let Some(next) = next {
            next.waiter.unpark();
        }
    }

    /// A wait in `lock_contended` abandoned by a runtime's drop (see `wait_or_abandon`).
    fn abandon(&self, waiter: &Waiter, outcome: Option<Outcome>) {
        match outcome {
            None => {
                let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
                queue.remove(waiter);
                if queue.is_empty() {
                    // Read-modify-write: the holder may be unlocking on its fast path.
                    self.state.fetch_and(!QUEUED, Ordering::Relaxed);
                }
            }
            // Handed the lock: pass it on.
            Some(Outcome::Granted(_)) => self.unlock(),
            // Woken to retry after an unlock: retry once, so the next waiter gets woken by
            // our unlock rather than by nobody. The unlocker stores the state after its wake,
            // under `queue`: read it under `queue` too, or its own LOCKED, about to be
            // cleared, reads as another holder's and nobody wakes the next waiter (found by
            // `loom_tests::stop_races_a_lock_hand_off`).
            Some(Outcome::Woken(_)) => {
                let state = {
                    let _queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
                    self.state.load(Ordering::Relaxed)
                };
                if state & LOCKED == 0
                    && self
                        .state
                        .compare_exchange(state, state | LOCKED, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
                {
                    self.unlock();
                }
            }
            Some(Outcome::TimedOut) => unreachable!("untimed wait"),
        }
    }
}

impl<'a, T: ?Sized> MutexGuard<'a, T> {
    /// # Safety
    /// The caller holds `lock`'s lock and gives it to the guard.
    unsafe fn new(lock: &'a Mutex<T>) -> LockResult<MutexGuard<'a, T>> {
        poison::map_result(lock.poison.guard(), |poison| MutexGuard { lock, poison, _not_send: PhantomData })
    }
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock, so no `&mut T` exists elsewhere.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock and is borrowed uniquely, so this is the only access.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T: ?Sized> Drop for MutexGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.poison.done(&self.poison);
        self.lock.unlock();
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T: ?Sized + fmt::Display> fmt::Display for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Mutex");
        match self.try_lock() {
            Ok(guard) => d.field("data", &&*guard),
            Err(TryLockError::Poisoned(err)) => d.field("data", &&**err.get_ref()),
            Err(TryLockError::WouldBlock) => d.field("data", &format_args!("<locked>")),
        };
        d.field("poisoned", &self.poison.get()).finish_non_exhaustive()
    }
}

impl<T: Default> Default for Mutex<T> {
    fn default() -> Mutex<T> {
        Mutex::new(T::default())
    }
}

impl<T> From<T> for Mutex<T> {
    fn from(value: T) -> Mutex<T> {
        Mutex::new(value)
    }
}

#[cfg(all(test, loom))]
#[path = "tests/loom_mutex.rs"]
mod loom_tests;

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The holder's unlock found `QUEUED` set (its fast path failed), and before it took the
    /// queue's lock the only waiter abandoned its wait (a runtime's drop unwinding it), which
    /// clears `QUEUED`: the slow path then finds the lock held with nobody queued, and frees it.
    #[test]
    fn an_unlock_whose_only_waiter_abandoned_meanwhile_frees_the_lock() {
        let m = Mutex::new(());
        let guard = m.lock().unwrap();
        let waiter = Arc::new(Waiter::new());
        m.state.fetch_or(QUEUED, Ordering::Relaxed);
        m.queue.lock().unwrap().push_back(QueuedLocker { waiter: waiter.clone(), handoff: false });
        // The holder's fast path: fails, `QUEUED` is set.
        assert!(m.state.compare_exchange(LOCKED, 0, Ordering::Release, Ordering::Relaxed).is_err());
        m.abandon(&waiter, None);
        m.unlock_contended();
        std::mem::forget(guard); // unlocked above
        assert_eq!(m.state.load(Ordering::Relaxed), 0);
        drop(m.try_lock().expect("the lock is free"));
    }
}
