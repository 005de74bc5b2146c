//! `OnceLock<T>`: std's API; callers that find another caller initialising park their fiber.
//!
//! A state byte goes `INCOMPLETE → RUNNING → COMPLETE` (or, if the initialiser panics, back to
//! `INCOMPLETE` for a `OnceLock`, as std does: the next caller retries; to `POISONED` for a
//! `Once`). Waiters re-check the state under the inner lock that the initialiser takes after
//! publishing it, so none sleeps through the end of an initialisation. `OnceCore` is that
//! protocol, shared with `Once` and `LazyLock` (`once.rs`).

use std::cell::UnsafeCell;
use std::fmt;
use std::sync::PoisonError;

use super::loom::{self, Arc, AtomicU8, Ordering};
use super::wait_list::Waiter;
use crate::fiber::wait::WaitReason;

const INCOMPLETE: u8 = 0;
const RUNNING: u8 = 1;
const COMPLETE: u8 = 2;
/// A `Once` whose initialiser panicked; a `OnceLock` never gets here.
pub(super) const POISONED: u8 = 3;

/// The run-once protocol: the state byte and the parked waiters.
pub(super) struct OnceCore {
    state: AtomicU8,
    waiters: loom::Mutex<Vec<Arc<Waiter>>>,
}

/// `OnceCore::call` or `wait` found the core poisoned and was not told to go on anyway.
pub(super) struct Poisoned;

impl OnceCore {
    loom::loom_const_fn! {
        pub(super) fn new() -> OnceCore {
            OnceCore { state: AtomicU8::new(INCOMPLETE), waiters: loom::Mutex::new(Vec::new()) }
        }
    }

    /// Whether an initialisation finished; after `true`, what it wrote is visible.
    pub(super) fn is_completed(&self) -> bool {
        // Acquire pairs with the Release store of COMPLETE in `finish`.
        self.state.load(Ordering::Acquire) == COMPLETE
    }

    /// Runs `init` unless an initialisation completed, parking while another caller runs one.
    /// `init` gets whether the core was poisoned; it runs on a poisoned core only if `force`,
    /// else `Err(Poisoned)`. If `init` panics the core goes to `on_panic` (INCOMPLETE: the
    /// next caller retries; POISONED) and the waiters are woken.
    pub(super) fn call(&self, force: bool, on_panic: u8, init: impl FnOnce(bool)) -> Result<(), Poisoned> {
        let mut init = Some(init);
        loop {
            // Acquire pairs with the Release store of COMPLETE (or POISONED) in `finish`.
            let state = self.state.load(Ordering::Acquire);
            match state {
                COMPLETE => return Ok(()),
                POISONED if !force => return Err(Poisoned),
                INCOMPLETE | POISONED => {
                    // Acquire on failure: as the load above.
                    if self
                        .state
                        .compare_exchange(state, RUNNING, Ordering::Acquire, Ordering::Acquire)
                        .is_ok()
                    {
                        let reset = ResetOnUnwind(self, on_panic);
                        (init.take().expect("initialiser runs once"))(state == POISONED);
                        std::mem::forget(reset);
                        self.finish(COMPLETE);
                        return Ok(());
                    }
                }
                _ => self.wait_while(|state| state == RUNNING),
            }
        }
    }

    /// Parks until an initialisation completed; unless `force`, `Err` once it is poisoned.
    pub(super) fn wait(&self, force: bool) -> Result<(), Poisoned> {
        loop {
            // Acquire pairs with the Release store in `finish`.
            match self.state.load(Ordering::Acquire) {
                COMPLETE => return Ok(()),
                POISONED if !force => return Err(Poisoned),
                _ => self.wait_while(|state| state != COMPLETE && (force || state != POISONED)),
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

    /// Publishes `state` (COMPLETE, or `on_panic` after a panic) and wakes every waiter.
    fn finish(&self, state: u8) {
        // Release pairs with the Acquire loads in `is_completed`, `call` and `wait_while`.
        self.state.store(state, Ordering::Release);
        let waiters = std::mem::take(&mut *self.waiters.lock().unwrap_or_else(PoisonError::into_inner));
        for waiter in waiters {
            if waiter.wake(0) {
                waiter.unpark();
            }
        }
    }
}

/// Puts a core whose initialiser panicked in its `on_panic` state and wakes its waiters.
struct ResetOnUnwind<'a>(&'a OnceCore, u8);

impl Drop for ResetOnUnwind<'_> {
    fn drop(&mut self) {
        self.0.finish(self.1);
    }
}

/// `static CONFIG: vt::sync::OnceLock<Config> = vt::sync::OnceLock::new(); let c = CONFIG.get_or_init(load);`
///
/// A cell written once; readers of an unfinished initialisation park their fiber.
///
/// Same API as [`std::sync::OnceLock`].
pub struct OnceLock<T> {
    core: OnceCore,
    /// An `Option`, not a `MaybeUninit` with a `Drop` impl of our own: with no `Drop` impl the
    /// drop check lets a cell outlive what its value borrows, as std's (which says so with the
    /// unstable `#[may_dangle]`) does: `cell.set(&local)` with `local` dropped first compiles.
    value: UnsafeCell<Option<T>>,
}

// SAFETY: the value is written once, before COMPLETE is published, and only shared (`&T`)
// after: sharing the cell shares `&T` (needs `T: Sync`) and may move `T` into it from another
// thread (needs `T: Send`), std's bounds.
unsafe impl<T: Sync + Send> Sync for OnceLock<T> {}
// SAFETY: owning the cell owns the `T`.
unsafe impl<T: Send> Send for OnceLock<T> {}

// std's bounds: a caught panic in an initialiser leaves the cell empty, never half-written.
impl<T: std::panic::RefUnwindSafe + std::panic::UnwindSafe> std::panic::RefUnwindSafe for OnceLock<T> {}
impl<T: std::panic::UnwindSafe> std::panic::UnwindSafe for OnceLock<T> {}

impl<T> OnceLock<T> {
    loom::loom_const_fn! {
        /// Creates an empty cell.
        pub fn new() -> OnceLock<T> {
            OnceLock { core: OnceCore::new(), value: UnsafeCell::new(None) }
        }
    }

    /// The value, if initialised.
    pub fn get(&self) -> Option<&T> {
        if self.core.is_completed() {
            // SAFETY: COMPLETE is published only after the value is written, and it is never
            // written again while `&self` lives.
            unsafe { (*self.value.get()).as_ref() }
        } else {
            None
        }
    }

    /// The value, if initialised, through a unique borrow.
    pub fn get_mut(&mut self) -> Option<&mut T> {
        // `&mut self` is the only access; the value is `Some` exactly when COMPLETE.
        self.value.get_mut().as_mut()
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
        // A `OnceLock` is never poisoned.
        let _ = self.core.wait(true);
        self.get().expect("completed")
    }

    /// Takes the value out, leaving the cell empty.
    pub fn take(&mut self) -> Option<T> {
        // Relaxed: `&mut self` proves no other access, and its creation ordered the rest.
        if self.core.state.load(Ordering::Relaxed) == COMPLETE {
            self.core.state.store(INCOMPLETE, Ordering::Relaxed);
        }
        self.value.get_mut().take()
    }

    /// Consumes the cell, returning its value if initialised.
    pub fn into_inner(mut self) -> Option<T> {
        self.take()
    }

    fn initialize<F: FnOnce() -> T>(&self, f: F) {
        // An initialiser's panic leaves the cell INCOMPLETE: never poisoned, so never `Err`.
        let _ = self.core.call(false, INCOMPLETE, |_| {
            let value = f();
            // SAFETY: RUNNING gives this caller the only access to the value slot (empty: the
            // state was INCOMPLETE).
            unsafe { *self.value.get() = Some(value) };
        });
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
