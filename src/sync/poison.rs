//! Poisoning as std does it: a guard notes whether its thread was already panicking when it
//! took the lock; if it is panicking when the guard drops (and was not before), the lock is
//! poisoned. Only `Mutex` and `RwLock`'s writers poison, as in std.
//!
//! Inside a fiber, `std::thread::panicking()` reads the carrier thread's panic count, which is
//! the fiber's own while it unwinds: a fiber does not give up its carrier between the start of
//! a panic and the guard's drop unless a destructor parks, the rare case the runtime must
//! account for (see the seam notes in `arch/sync.md`).

use std::sync::{LockResult, PoisonError};

use super::loom::{AtomicBool, Ordering};

/// The poisoned bit of one lock.
#[derive(Debug)]
pub(crate) struct Flag {
    poisoned: AtomicBool,
}

/// Whether the thread was panicking when it took the lock.
#[derive(Debug)]
pub(crate) struct Guard {
    panicking: bool,
}

impl Flag {
    super::loom::loom_const_fn! {
        pub(crate) fn new() -> Flag {
            Flag { poisoned: AtomicBool::new(false) }
        }
    }

    /// Notes the panic state at lock time; `Err` if the lock is already poisoned.
    pub(crate) fn guard(&self) -> LockResult<Guard> {
        let guard = Guard { panicking: std::thread::panicking() };
        if self.get() { Err(PoisonError::new(guard)) } else { Ok(guard) }
    }

    /// Called as the lock is released: poisons it if a panic started while it was held.
    pub(crate) fn done(&self, guard: &Guard) {
        if !guard.panicking && std::thread::panicking() {
            // Relaxed: the unlock that follows (Release) publishes it with the data.
            self.poisoned.store(true, Ordering::Relaxed);
        }
    }

    pub(crate) fn get(&self) -> bool {
        // Relaxed: read after the lock's Acquire, which orders it with the poisoning holder.
        self.poisoned.load(Ordering::Relaxed)
    }

    /// `value`, wrapped in `Err` if the lock is poisoned.
    pub(crate) fn result<T>(&self, value: T) -> LockResult<T> {
        if self.get() { Err(PoisonError::new(value)) } else { Ok(value) }
    }

    pub(crate) fn clear(&self) {
        self.poisoned.store(false, Ordering::Relaxed);
    }
}

/// Maps the guard inside a `LockResult`, keeping the poisoned state.
pub(crate) fn map_result<T, U>(result: LockResult<T>, f: impl FnOnce(T) -> U) -> LockResult<U> {
    match result {
        Ok(t) => Ok(f(t)),
        Err(e) => Err(PoisonError::new(f(e.into_inner()))),
    }
}
