//! `RwLock<T>`: std's API and poisoning (writers poison); waiters park their fiber.
//!
//! One state word: bit 0 `WRITER`, bit 1 `QUEUED` (the wait queue is non-empty; changed only
//! with the inner `queue` lock held), bits 2.. the reader count. Uncontended `read`/`write` and
//! their unlocks are one atomic read-modify-write each.
//!
//! Fairness is strict FIFO hand-off, phase-fair: once anyone is queued, new readers queue too
//! (no writer starves behind a stream of readers), and the releaser that leaves the lock free
//! grants it under the inner lock to the front of the queue: one writer, or every reader up to
//! the next queued writer, together. `downgrade` turns the writer into a reader in place and
//! grants the readers at the front of the queue with it. Protocol and proof sketch:
//! `arch/sync.md`.
//!
//! The state, poison flag and queue are a `RawRwLock`, not generic over `T`, so that a read
//! guard can hold it and a pointer to the data, as std's does, and be covariant in `T`.

use std::cell::UnsafeCell;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::ptr::NonNull;
use std::sync::{LockResult, PoisonError, TryLockError, TryLockResult};

use super::loom::{self, Arc, AtomicUsize, Ordering};
use super::poison;
use super::wait_list::{Entry, Outcome, WaitQueue, Waiter};
use crate::fiber::wait::WaitReason;

const WRITER: usize = 1;
const QUEUED: usize = 2;
const READER: usize = 4;

/// `let config = vt::sync::RwLock::new(cfg); let port = config.read().unwrap().port;`
///
/// A reader-writer lock whose waiters park their fiber (or plain thread).
///
/// Same API and poisoning as [`std::sync::RwLock`].
pub struct RwLock<T: ?Sized> {
    raw: RawRwLock,
    data: UnsafeCell<T>,
}

/// Everything of the lock but the data.
struct RawRwLock {
    /// Bit 0 `WRITER`, bit 1 `QUEUED`, bits 2.. reader count.
    state: AtomicUsize,
    poison: poison::Flag,
    queue: loom::Mutex<WaitQueue<QueuedAccess>>,
}

/// A parked `read` or `write` call.
#[derive(Debug)]
struct QueuedAccess {
    waiter: Arc<Waiter>,
    write: bool,
}

impl Entry for QueuedAccess {
    fn waiter(&self) -> &Waiter {
        &self.waiter
    }
}

// SAFETY: readers share `&T` across threads (needs `T: Sync`) and a writer may run on any
// thread (needs `T: Send`), exactly std's bounds.
unsafe impl<T: ?Sized + Send + Sync> Sync for RwLock<T> {}
// SAFETY: owning the lock owns the `T`; the state and queue are `Send`.
unsafe impl<T: ?Sized + Send> Send for RwLock<T> {}

/// RAII guard of shared access; `!Send`, like std's, and covariant in `T`, like std's.
#[must_use = "if unused the RwLock will immediately unlock"]
pub struct RwLockReadGuard<'a, T: ?Sized + 'a> {
    /// The data: a pointer (covariant), not a `&RwLock<T>` (invariant through its cell).
    data: NonNull<T>,
    raw: &'a RawRwLock,
    _borrow: PhantomData<&'a T>,
}

/// RAII guard of exclusive access; `!Send`, like std's.
#[must_use = "if unused the RwLock will immediately unlock"]
pub struct RwLockWriteGuard<'a, T: ?Sized + 'a> {
    lock: &'a RwLock<T>,
    poison: poison::Guard,
    _not_send: PhantomData<*const ()>,
}

// SAFETY: a shared read guard only hands out `&T`.
unsafe impl<T: ?Sized + Sync> Sync for RwLockReadGuard<'_, T> {}
// SAFETY: a `&RwLockWriteGuard` only hands out `&T`.
unsafe impl<T: ?Sized + Sync> Sync for RwLockWriteGuard<'_, T> {}

// As std's: poisoning reports a writer's panic, so the lock is unwind-safe.
impl<T: ?Sized> UnwindSafe for RwLock<T> {}
impl<T: ?Sized> RefUnwindSafe for RwLock<T> {}

impl<T> RwLock<T> {
    loom::loom_const_fn! {
        /// Creates an unlocked lock.
        pub fn new(value: T) -> RwLock<T> {
            RwLock {
                raw: RawRwLock {
                    state: AtomicUsize::new(0),
                    poison: poison::Flag::new(),
                    queue: loom::Mutex::new(WaitQueue::new()),
                },
                data: UnsafeCell::new(value),
            }
        }
    }

    /// Consumes the lock and returns the value; `Err` (still holding it) if poisoned.
    pub fn into_inner(self) -> LockResult<T> {
        let Self { raw, data } = self;
        raw.poison.result(data.into_inner())
    }
}

impl<T: ?Sized> RwLock<T> {
    /// Acquires shared access, parking while a writer holds the lock or anyone is queued.
    pub fn read(&self) -> LockResult<RwLockReadGuard<'_, T>> {
        if !self.raw.try_read_fast() {
            self.raw.lock_contended(false);
        }
        self.read_guard()
    }

    /// Acquires exclusive access, parking while anyone holds the lock or is queued.
    pub fn write(&self) -> LockResult<RwLockWriteGuard<'_, T>> {
        // Acquire pairs with the Release of the previous holders' unlocks.
        if self.raw.state.compare_exchange(0, WRITER, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.raw.lock_contended(true);
        }
        self.write_guard()
    }

    /// Acquires shared access if that needs no wait.
    pub fn try_read(&self) -> TryLockResult<RwLockReadGuard<'_, T>> {
        if self.raw.try_read_fast() { Ok(self.read_guard()?) } else { Err(TryLockError::WouldBlock) }
    }

    /// Acquires exclusive access if the lock is free.
    pub fn try_write(&self) -> TryLockResult<RwLockWriteGuard<'_, T>> {
        // Acquire pairs with the Release of the previous holders' unlocks.
        match self.raw.state.compare_exchange(0, WRITER, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => Ok(self.write_guard()?),
            Err(_) => Err(TryLockError::WouldBlock),
        }
    }

    /// Whether a writer panicked while holding the lock.
    pub fn is_poisoned(&self) -> bool {
        self.raw.poison.get()
    }

    /// Clears the poisoned state.
    pub fn clear_poison(&self) {
        self.raw.poison.clear();
    }

    /// The value, through a unique borrow (no locking needed).
    pub fn get_mut(&mut self) -> LockResult<&mut T> {
        self.raw.poison.result(self.data.get_mut())
    }

    /// Precondition: the caller holds a read lock, which the guard takes over.
    fn read_guard(&self) -> LockResult<RwLockReadGuard<'_, T>> {
        self.raw.poison.result(RwLockReadGuard::new(self))
    }

    fn write_guard(&self) -> LockResult<RwLockWriteGuard<'_, T>> {
        poison::map_result(self.raw.poison.guard(), |poison| RwLockWriteGuard {
            lock: self,
            poison,
            _not_send: PhantomData,
        })
    }
}

impl<'a, T: ?Sized> RwLockReadGuard<'a, T> {
    /// Precondition: the caller holds a read lock of `lock`, which the guard takes over.
    fn new(lock: &'a RwLock<T>) -> Self {
        // SAFETY of later dereferences: `UnsafeCell::get` is never null, and the read lock
        // held by this guard keeps writers out for `'a`.
        let data = NonNull::new(lock.data.get()).expect("UnsafeCell::get is not null");
        RwLockReadGuard { data, raw: &lock.raw, _borrow: PhantomData }
    }
}

impl<'a, T: ?Sized> RwLockWriteGuard<'a, T> {
    /// Turns exclusive access into shared access without letting a writer in between; the
    /// readers queued at the front (up to the next queued writer) get the lock with it, as
    /// std's `downgrade` lets waiting readers in.
    pub fn downgrade(s: Self) -> RwLockReadGuard<'a, T> {
        let lock = s.lock;
        // As when the guard drops: poison if the writer is panicking (it is not, here, unless
        // called from a destructor during unwinding), then hand over without unlocking.
        lock.raw.poison.done(&s.poison);
        std::mem::forget(s);
        lock.raw.downgrade();
        RwLockReadGuard::new(lock)
    }
}

impl RawRwLock {
    fn try_read_fast(&self) -> bool {
        let mut state = self.state.load(Ordering::Relaxed);
        while state & (WRITER | QUEUED) == 0 {
            // Acquire pairs with the Release of the last writer's unlock.
            match self.state.compare_exchange_weak(
                state,
                state + READER,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => state = now,
            }
        }
        false
    }

    fn lock_contended(&self, write: bool) {
        let waiter = Arc::new(Waiter::new());
        loop {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            let state = self.state.load(Ordering::Relaxed);
            let free = if write { state == 0 } else { state & (WRITER | QUEUED) == 0 };
            if free {
                let next = if write { WRITER } else { state + READER };
                // Acquire pairs with the Release of the previous holders' unlocks.
                if self.state.compare_exchange(state, next, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                    return;
                }
                continue;
            }
            // Fails if a holder unlocked meanwhile: retry. Relaxed: `queue` orders QUEUED.
            if state & QUEUED == 0
                && self
                    .state
                    .compare_exchange(state, state | QUEUED, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            queue.push_back(QueuedAccess { waiter: waiter.clone(), write });
            drop(queue);
            let reason = if write { WaitReason::RwLockWrite } else { WaitReason::RwLockRead };
            // The releaser set our share of the state before granting; its Release on the
            // waiter state, seen by `wait`'s Acquire, orders the previous holders' writes.
            // A runtime's drop may unwind us from inside the park. Still waiting: the
            // cancelled entry stays queued, and whoever grants it releases its share at once
            // (`grant_next`). Already granted: release the lock we were handed.
            let abandon = |outcome: Option<Outcome>| {
                if outcome.is_some() {
                    self.unlock_share(write);
                }
            };
            let outcome = waiter.wait_or_abandon(reason, None, abandon);
            debug_assert_eq!(outcome, Outcome::Granted(0), "rwlock waiters are only granted");
            return;
        }
    }

    /// Precondition: the caller holds a read lock.
    fn read_unlock(&self) {
        // Release pairs with the next writer's Acquire (its CAS or its grant).
        let prev = self.state.fetch_sub(READER, Ordering::Release);
        if prev == READER | QUEUED {
            // Last reader out with waiters queued: the lock is free (state == QUEUED), and
            // everyone else now queues behind QUEUED, so we alone grant it.
            self.grant_next();
        }
    }

    /// Precondition: the caller holds the write lock.
    fn write_unlock(&self) {
        // Release pairs with the next holder's Acquire.
        if self.state.compare_exchange(WRITER, 0, Ordering::Release, Ordering::Relaxed).is_err() {
            self.grant_next();
        }
    }

    fn unlock_share(&self, write: bool) {
        if write { self.write_unlock() } else { self.read_unlock() }
    }

    /// Hands the lock to the front of the queue: one writer, or every reader before the next
    /// writer. Precondition: the caller is the releaser that left no holder while QUEUED is set
    /// (state is QUEUED, or WRITER | QUEUED for a releasing writer); nobody else can change the
    /// state until we store it, so plain stores are exact.
    ///
    /// An entry whose waiter was cancelled (only a runtime's drop unwinding it does that) is
    /// granted its share like any other, and the share is released at once on its behalf,
    /// after the queue lock is dropped: the next waiters are granted as if it had held the
    /// lock for an instant.
    fn grant_next(&self) {
        self.grant_front(0);
    }

    /// The writer becomes a reader. Precondition: the caller holds the write lock; while it
    /// does, nobody else changes the state (arrivals only queue under the queue lock, and
    /// QUEUED is already set if anyone did), so plain stores are exact.
    fn downgrade(&self) {
        // Release: our writes are published to the readers granted below and to later ones.
        if self.state.compare_exchange(WRITER, READER, Ordering::Release, Ordering::Relaxed).is_ok() {
            return;
        }
        // Ours is a read share now: the readers at the front of the queue join it.
        self.grant_front(READER);
    }

    /// Grants the front of the queue on top of `holders` (0 for a hand-off: one writer, or
    /// every reader before the next writer; `READER` for a downgrade: the readers before the
    /// next writer), stores the new state, then wakes them. Cancelled entries give their
    /// share back after the queue lock is dropped (see `grant_next`).
    fn grant_front(&self, mut holders: usize) {
        let mut granted = Vec::new();
        let mut abandoned = Vec::new();
        {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            if holders == 0 {
                let first = queue.pop_front().expect("QUEUED set with an empty queue");
                holders = if first.write { WRITER } else { READER };
                granted.push(first);
            }
            while holders != WRITER && queue.front().is_some_and(|e| !e.write) {
                granted.extend(queue.pop_front());
                holders += READER;
            }
            let rest = if queue.is_empty() { 0 } else { QUEUED };
            // Release: with the grants below, publishes the previous holders' writes.
            self.state.store(holders | rest, Ordering::Release);
            granted.retain(|entry| {
                entry.waiter.grant(0) || {
                    abandoned.push(entry.write);
                    false
                }
            });
        }
        for entry in &granted {
            entry.waiter.unpark();
        }
        // A cancelled waiter (a runtime's drop unwound it) gives its share back; after a
        // downgrade ours keeps the count above zero, so that grants nobody.
        for write in abandoned {
            self.unlock_share(write);
        }
    }
}

impl<T: ?Sized> Deref for RwLockReadGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: `data` points into the lock's cell, alive for `'a`, and a read guard exists
        // only while no writer holds the lock.
        unsafe { self.data.as_ref() }
    }
}

impl<T: ?Sized> Drop for RwLockReadGuard<'_, T> {
    fn drop(&mut self) {
        self.raw.read_unlock();
    }
}

impl<T: ?Sized> Deref for RwLockWriteGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the write guard holds the lock exclusively.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T: ?Sized> DerefMut for RwLockWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the write guard holds the lock exclusively and is borrowed uniquely.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T: ?Sized> Drop for RwLockWriteGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.raw.poison.done(&self.poison);
        self.lock.raw.write_unlock();
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLockReadGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLockWriteGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RwLock");
        match self.try_read() {
            Ok(guard) => d.field("data", &&*guard),
            Err(TryLockError::Poisoned(err)) => d.field("data", &&**err.get_ref()),
            Err(TryLockError::WouldBlock) => d.field("data", &format_args!("<locked>")),
        };
        d.field("poisoned", &self.raw.poison.get()).finish_non_exhaustive()
    }
}

impl<T: Default> Default for RwLock<T> {
    fn default() -> RwLock<T> {
        RwLock::new(T::default())
    }
}

impl<T> From<T> for RwLock<T> {
    fn from(value: T) -> RwLock<T> {
        RwLock::new(value)
    }
}

#[cfg(all(test, loom))]
#[path = "tests/loom_rw_lock.rs"]
mod loom_tests;
