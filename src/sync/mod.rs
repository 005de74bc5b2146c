//! Fiber-aware synchronisation: std's `Mutex`, `RwLock`, `Condvar`, `Once`, `OnceLock`, `LazyLock`
//! and `Barrier`,
//! plus `Semaphore` and crossbeam's `WaitGroup`, whose waiters park their *fiber* (or, called
//! from a plain OS thread, that thread), so the same code works in both.
//!
//! Every primitive is an atomic state word for the uncontended path (one compare-and-swap to
//! lock, one to unlock, no allocation) plus, for the contended path, a FIFO `wait_list` of
//! heap-allocated waiters behind a short inner lock that is never held across a park. Every
//! park goes through `wait_list::park` with a `WaitReason`. Fairness: `Mutex` allows bounded
//! barging (a woken waiter that loses once gets the lock handed over next time); `RwLock`,
//! `Semaphore` hand off strictly in FIFO order. The protocol, and why no wake-up is lost, is in
//! `arch/sync.md`.
//!
//! Poisoning, `LockResult`, `TryLockError` and `PoisonError` are std's own types.
//!
//! A difference from std that stays: scheduling is cooperative, so a fiber that spins on
//! `try_lock` (or any busy-wait) without a switch point keeps its carrier from running the
//! fiber that would release it; the CPU-starvation warning names such a fiber. Block instead,
//! or put `vt::yield_now()` in the loop.

mod barrier;
mod condvar;
pub(crate) mod loom;
mod mutex;
mod once;
mod once_lock;
mod poison;
mod rw_lock;
mod semaphore;
mod wait_group;
pub(crate) mod wait_list;

pub use barrier::{Barrier, BarrierWaitResult};
pub use condvar::{Condvar, WaitTimeoutResult};
pub use mutex::{Mutex, MutexGuard};
pub use once::{LazyLock, Once, OnceState};
pub use once_lock::OnceLock;
pub use rw_lock::{RwLock, RwLockReadGuard, RwLockWriteGuard};
pub use semaphore::{Semaphore, SemaphorePermit};
pub use std::sync::{LockResult, PoisonError, TryLockError, TryLockResult};
pub use wait_group::WaitGroup;
