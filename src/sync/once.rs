//! `Once` and `LazyLock`: std's APIs over the run-once protocol of `OnceLock` (`OnceCore` in
//! `once_lock.rs`): callers that find another caller initialising park their fiber (or plain
//! thread) until it finishes. Unlike a `OnceLock`, both are poisoned by a panicking
//! initialiser, as std's are: later `call_once`s and accesses panic, `call_once_force` runs
//! again and is told.

use std::cell::UnsafeCell;
use std::fmt;
use std::ops::Deref;
use std::panic::{RefUnwindSafe, UnwindSafe};

use super::loom;
use super::once_lock::{OnceCore, POISONED};

/// `static INIT: vt::sync::Once = vt::sync::Once::new(); INIT.call_once(setup);`
///
/// Runs a one-time initialisation; callers that arrive while it runs park their fiber.
///
/// Same API and poisoning as [`std::sync::Once`]; `new` is `const`, so it can be a `static`.
///
/// ```
/// use virtual_threads as vt;
///
/// static INIT: vt::sync::Once = vt::sync::Once::new();
/// let mut runs = 0;
/// INIT.call_once(|| runs += 1);
/// INIT.call_once(|| runs += 1);
/// assert_eq!(runs, 1);
/// assert!(INIT.is_completed());
/// ```
pub struct Once {
    core: OnceCore,
}

/// What [`Once::call_once_force`]'s closure is told: whether an earlier initialisation
/// panicked.
#[derive(Debug)]
pub struct OnceState {
    poisoned: bool,
}

impl OnceState {
    /// Whether an earlier initialiser panicked.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }
}

const POISONED_ONCE: &str = "Once instance has previously been poisoned";

impl Once {
    loom::loom_const_fn! {
        /// A `Once` that has not run.
        pub fn new() -> Once {
            Once { core: OnceCore::new() }
        }
    }

    /// Runs `f` if no call has completed; other callers park until it returns. Once it
    /// returned, every later call returns at once, and what `f` did is visible to them.
    ///
    /// # Panics
    /// If an earlier `f` panicked (the `Once` is poisoned); the panic of `f` itself propagates
    /// and poisons it.
    pub fn call_once<F: FnOnce()>(&self, f: F) {
        if self.core.is_completed() {
            return;
        }
        if self.core.call(false, POISONED, |_| f()).is_err() {
            panic!("{POISONED_ONCE}");
        }
    }

    /// As [`call_once`](Once::call_once), but runs `f` even if the `Once` is poisoned,
    /// telling it so; if `f` returns, the `Once` is complete.
    pub fn call_once_force<F: FnOnce(&OnceState)>(&self, f: F) {
        if self.core.is_completed() {
            return;
        }
        let _ = self.core.call(true, POISONED, |poisoned| f(&OnceState { poisoned }));
    }

    /// Whether a call completed.
    pub fn is_completed(&self) -> bool {
        self.core.is_completed()
    }

    /// Parks until a call completed.
    ///
    /// # Panics
    /// If the `Once` is poisoned.
    pub fn wait(&self) {
        if self.core.wait(false).is_err() {
            panic!("{POISONED_ONCE}");
        }
    }

    /// Parks until a call completed, through poisoning.
    pub fn wait_force(&self) {
        let _ = self.core.wait(true);
    }
}

impl Default for Once {
    fn default() -> Once {
        Once::new()
    }
}

impl fmt::Debug for Once {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Once").finish_non_exhaustive()
    }
}

impl UnwindSafe for Once {}
impl RefUnwindSafe for Once {}

/// `static TABLE: vt::sync::LazyLock<Vec<u64>> = vt::sync::LazyLock::new(build_table);`
///
/// A value initialised on first access by `F`; accesses that arrive while it runs park their
/// fiber.
///
/// Same API as [`std::sync::LazyLock`]; `new` is `const`, so it can be a `static`. If `F`
/// panics, the `LazyLock` is poisoned and every later access panics, as std's.
///
/// ```
/// use virtual_threads as vt;
/// use std::collections::HashMap;
///
/// static TABLE: vt::sync::LazyLock<HashMap<u32, &str>> =
///     vt::sync::LazyLock::new(|| HashMap::from([(1, "one"), (2, "two")]));
/// assert_eq!(TABLE[&2], "two");
/// ```
pub struct LazyLock<T, F = fn() -> T> {
    once: Once,
    data: UnsafeCell<Data<T, F>>,
}

enum Data<T, F> {
    Init(F),
    Value(T),
    /// `F` was taken and panicked.
    Poisoned,
}

// `data` is written only by the caller that runs the `Once` (exclusive while it runs), and only
// read (`&T`) after the `Once` completed, which orders the write before every read.
// SAFETY: by the above; sharing it shares `&T` (`T: Sync`), and any thread may run `F`
// (`F: Send`) and drop or create `T` there (`T: Send`): std's bounds.
unsafe impl<T: Sync + Send, F: Send> Sync for LazyLock<T, F> {}

impl<T: RefUnwindSafe + UnwindSafe, F: UnwindSafe> RefUnwindSafe for LazyLock<T, F> {}
impl<T: UnwindSafe, F: UnwindSafe> UnwindSafe for LazyLock<T, F> {}

const POISONED_LAZY: &str = "LazyLock instance has previously been poisoned";

impl<T, F: FnOnce() -> T> LazyLock<T, F> {
    loom::loom_const_fn! {
        /// A `LazyLock` that runs `f` on first access.
        pub fn new(f: F) -> LazyLock<T, F> {
            LazyLock { once: Once::new(), data: UnsafeCell::new(Data::Init(f)) }
        }
    }

    /// The value, running the initialiser if nobody has; equivalent to `&*this`.
    ///
    /// # Panics
    /// If the initialiser panicked, now or before.
    pub fn force(this: &LazyLock<T, F>) -> &T {
        this.once.call_once_force(|state| {
            if state.is_poisoned() {
                panic!("{POISONED_LAZY}");
            }
            // SAFETY: the `Once` runs one caller at a time here, so this is the only access.
            let data = unsafe { &mut *this.data.get() };
            let Data::Init(f) = std::mem::replace(data, Data::Poisoned) else {
                unreachable!("a LazyLock runs its initialiser once")
            };
            // A panic here leaves `Poisoned` and poisons the `Once`.
            *data = Data::Value(f());
        });
        // SAFETY: the `Once` completed (it returned without panicking), so `data` holds the
        // value and is never written again while `this` is borrowed.
        match unsafe { &*this.data.get() } {
            Data::Value(value) => value,
            _ => unreachable!("a completed LazyLock holds its value"),
        }
    }

    /// Consumes the `LazyLock`: its value if initialised, else its initialiser.
    ///
    /// # Panics
    /// If it is poisoned.
    pub fn into_inner(this: LazyLock<T, F>) -> Result<T, F> {
        match this.data.into_inner() {
            Data::Value(value) => Ok(value),
            Data::Init(f) => Err(f),
            Data::Poisoned => panic!("{POISONED_LAZY}"),
        }
    }
}

impl<T, F: FnOnce() -> T> Deref for LazyLock<T, F> {
    type Target = T;

    fn deref(&self) -> &T {
        LazyLock::force(self)
    }
}

impl<T: Default> Default for LazyLock<T> {
    fn default() -> LazyLock<T> {
        LazyLock::new(T::default)
    }
}

impl<T: fmt::Debug, F> fmt::Debug for LazyLock<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_tuple("LazyLock");
        if self.once.is_completed() {
            // SAFETY: completed: the value is written and only read from now on.
            if let Data::Value(value) = unsafe { &*self.data.get() } {
                d.field(value);
            }
        } else {
            d.field(&format_args!("<uninit>"));
        }
        d.finish()
    }
}

#[cfg(all(test, loom))]
#[path = "tests/loom_once.rs"]
mod loom_tests;
