//! `OnceLock<T>`: std's API; callers that find another caller initialising park their fiber.
//!
//! A state byte goes `INCOMPLETE → RUNNING → COMPLETE` (or back to `INCOMPLETE` if the
//! initialiser panics, as std does: the next caller retries). Waiters re-check the state under
//! the inner lock that the initialiser takes after publishing it, so none sleeps through the
//! end of an initialisation.

use std::cell::UnsafeCell;
use std::fmt;
use std::mem::MaybeUninit;
use std::sync::PoisonError;

use super::loom::{self, Arc, AtomicU8, Ordering};
use super::wait_list::{WaitReason, Waiter};

const INCOMPLETE: u8 = 0;
const RUNNING: u8 = 1;
const COMPLETE: u8 = 2;

/// A cell written once; readers of an unfinished initialisation park their fiber.
///
/// Same API as [`std::sync::OnceLock`].
pub struct OnceLock<T> {
    state: AtomicU8,
    waiters: loom::Mutex<Vec<Arc<Waiter>>>,
    value: UnsafeCell<MaybeUninit<T>>,
}

// SAFETY: the value is written once, before COMPLETE is published, and only shared (`&T`)
// after: sharing the cell shares `&T` (needs `T: Sync`) and may move `T` into it from another
// thread (needs `T: Send`), std's bounds.
unsafe impl<T: Sync + Send> Sync for OnceLock<T> {}
// SAFETY: owning the cell owns the `T`.
unsafe impl<T: Send> Send for OnceLock<T> {}

impl<T> OnceLock<T> {
    loom::loom_const_fn! {
        /// Creates an empty cell.
        pub fn new() -> OnceLock<T> {
            OnceLock {
                state: AtomicU8::new(INCOMPLETE),
                waiters: loom::Mutex::new(Vec::new()),
                value: UnsafeCell::new(MaybeUninit::uninit()),
            }
        }
    }

    /// The value, if initialised.
    pub fn get(&self) -> Option<&T> {
        // Acquire pairs with the Release store of COMPLETE after the value was written.
        if self.state.load(Ordering::Acquire) == COMPLETE {
            // SAFETY: COMPLETE is published only after the value is written, and it is never
            // written again while `&self` lives.
            Some(unsafe { (*self.value.get()).assume_init_ref() })
        } else {
            None
        }
    }

    /// The value, if initialised, through a unique borrow.
    pub fn get_mut(&mut self) -> Option<&mut T> {
        if self.state.load(Ordering::Relaxed) == COMPLETE {
            // SAFETY: COMPLETE means the value is written; `&mut self` is the only access.
            Some(unsafe { self.value.get_mut().assume_init_mut() })
        } else {
            None
        }
    }

    /// Initialises the cell with `value`; `Err(value)` if it already held one.
    pub fn set(&self, value: T) -> Result<(), T> {
        let mut value = Some(value);
        self.get_or_init(|| value.take().expect("initialiser runs once"));
        match value {
            None => Ok(()),
            Some(value) => Err(value),
        }
    }

    /// The value, running `f` to initialise it if nobody has; concurrent callers park until
    /// the one running `f` finishes. If `f` panics, the cell stays empty and the panic
    /// propagates; a later caller runs its own `f`.
    pub fn get_or_init<F: FnOnce() -> T>(&self, f: F) -> &T {
        if let Some(value) = self.get() {
            return value;
        }
        self.initialize(f);
        self.get().expect("initialised above")
    }

    /// Parks until the cell is initialised, then returns the value.
    pub fn wait(&self) -> &T {
        loop {
            if let Some(value) = self.get() {
                return value;
            }
            self.wait_while(|state| state != COMPLETE);
        }
    }

    /// Takes the value out, leaving the cell empty.
    pub fn take(&mut self) -> Option<T> {
        // Relaxed: `&mut self` proves no other access, and its creation ordered the rest.
        if self.state.load(Ordering::Relaxed) == COMPLETE {
            self.state.store(INCOMPLETE, Ordering::Relaxed);
            // SAFETY: the value was written and the state now says it is gone, so it is read
            // exactly once.
            Some(unsafe { self.value.get_mut().assume_init_read() })
        } else {
            None
        }
    }

    /// Consumes the cell, returning its value if initialised.
    pub fn into_inner(mut self) -> Option<T> {
        self.take()
    }

    fn initialize<F: FnOnce() -> T>(&self, f: F) {
        let mut f = Some(f);
        loop {
            // Acquire (on failure) pairs with the Release store of COMPLETE.
            match self.state.compare_exchange(INCOMPLETE, RUNNING, Ordering::Acquire, Ordering::Acquire) {
                Ok(_) => {
                    let reset = ResetOnUnwind(self);
                    let value = (f.take().expect("initialiser runs once"))();
                    // SAFETY: RUNNING gives this caller the only access to the value slot.
                    unsafe { (*self.value.get()).write(value) };
                    std::mem::forget(reset);
                    self.finish(COMPLETE);
                    return;
                }
                Err(COMPLETE) => return,
                Err(_) => self.wait_while(|state| state == RUNNING),
            }
        }
    }

    /// Parks while `blocked(state)` holds, re-checked under the lock `finish` takes.
    fn wait_while(&self, blocked: impl Fn(u8) -> bool) {
        let waiter = Arc::new(Waiter::new());
        {
            let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
            // Acquire pairs with the Release store in `finish`.
            if !blocked(self.state.load(Ordering::Acquire)) {
                return;
            }
            waiters.push(waiter.clone());
        }
        // A broadcast wake-up: a waiter that a runtime's drop unwinds here leaves nothing to
        // hand on (unlike a lock or a message), so a plain `wait` is enough.
        waiter.wait(WaitReason::Once, None);
    }

    /// Publishes `state` (COMPLETE, or INCOMPLETE after a panic) and wakes every waiter.
    fn finish(&self, state: u8) {
        // Release pairs with the Acquire loads in `get` and `wait_while`.
        self.state.store(state, Ordering::Release);
        let waiters = std::mem::take(&mut *self.waiters.lock().unwrap_or_else(PoisonError::into_inner));
        for waiter in waiters {
            if waiter.wake(0) {
                waiter.unpark();
            }
        }
    }
}

/// Puts a cell whose initialiser panicked back to INCOMPLETE and wakes its waiters.
struct ResetOnUnwind<'a, T>(&'a OnceLock<T>);

impl<T> Drop for ResetOnUnwind<'_, T> {
    fn drop(&mut self) {
        self.0.finish(INCOMPLETE);
    }
}

impl<T> Drop for OnceLock<T> {
    fn drop(&mut self) {
        drop(self.take());
    }
}

impl<T> Default for OnceLock<T> {
    fn default() -> OnceLock<T> {
        OnceLock::new()
    }
}

impl<T> From<T> for OnceLock<T> {
    fn from(value: T) -> OnceLock<T> {
        let cell = OnceLock::new();
        let _ = cell.set(value);
        cell
    }
}

impl<T: Clone> Clone for OnceLock<T> {
    fn clone(&self) -> OnceLock<T> {
        match self.get() {
            Some(value) => OnceLock::from(value.clone()),
            None => OnceLock::new(),
        }
    }
}

impl<T: PartialEq> PartialEq for OnceLock<T> {
    fn eq(&self, other: &OnceLock<T>) -> bool {
        self.get() == other.get()
    }
}

impl<T: Eq> Eq for OnceLock<T> {}

impl<T: fmt::Debug> fmt::Debug for OnceLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_tuple("OnceLock");
        match self.get() {
            Some(value) => d.field(value),
            None => d.field(&format_args!("<uninit>")),
        };
        d.finish()
    }
}
