//! The loom facade: std ↔ loom switch for the atomics, inner locks and cells of the scheduler's
//! queues and idle protocol, the fiber's state and join words, and (through `sync::loom`, which
//! adds the park seam) `vt::sync` and `vt::channel` (STYLE habit 7; what each model covers:
//! `arch/loom.md`). The bottom layer but one (`arch/layers.txt`): it imports nothing from the
//! crate, so every layer may use it.
//!
//! A timed wait is modelled as a timer that has already fired, so the models exercise exactly
//! the race where a timeout meets a wake-up (see `arch/sync.md`): `expired` says so here.

pub(crate) use imp::*;

/// Declares a constructor that is `const` except under `cfg(loom)`, where loom's atomics and
/// locks cannot be built in a const context.
macro_rules! loom_const_fn {
    ($(#[$attr:meta])* $vis:vis fn $($rest:tt)*) => {
        #[cfg(not(loom))]
        $(#[$attr])* $vis const fn $($rest)*
        #[cfg(loom)]
        $(#[$attr])* $vis fn $($rest)*
    };
}
pub(crate) use loom_const_fn;

#[cfg(not(loom))]
mod imp {
    use std::time::Instant;

    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicUsize, Ordering, fence};
    pub(crate) use std::sync::{Arc, MutexGuard};

    #[cfg(feature = "hooks")]
    pub(crate) use super::hooks_off::{HooksOff, Mutex, Mutex as StdMutex, hooks_off};
    #[cfg(not(feature = "hooks"))]
    pub(crate) use std::sync::{Mutex, Mutex as StdMutex};

    /// Whether `deadline` has passed.
    pub(crate) fn expired(deadline: Instant) -> bool {
        Instant::now() >= deadline
    }

    /// `std::cell::UnsafeCell` behind loom's closure-based interface, so that loom can check
    /// every access to a message slot.
    #[derive(Debug)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

#[cfg(loom)]
mod imp {
    use std::time::Instant;

    pub(crate) use loom::cell::UnsafeCell;
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicUsize, Ordering, fence};
    pub(crate) use loom::sync::{Arc, Mutex, MutexGuard};
    /// The runtime's std locks stay std's in loom builds (statics need a `const` constructor).
    pub(crate) use std::sync::Mutex as StdMutex;

    /// Every deadline has passed: timed waits give up at once, racing their wake-up.
    pub(crate) fn expired(_deadline: Instant) -> bool {
        true
    }
}

/// The runtime's own std locks under the `hooks` feature (`arch/hooks.md`, "The runtime's own
/// waits"): a contended `lock` marks the thread so that the futex hook passes its wait straight
/// to the kernel. Parking a fiber there would switch inside runtime code that assumes no switch
/// (a carrier's scheduling code between fibers takes these locks too) and could hold one lock
/// across a park on another.
#[cfg(all(not(loom), feature = "hooks"))]
mod hooks_off {
    use std::cell::Cell;
    use std::fmt;
    use std::sync::{LockResult, MutexGuard, TryLockError, TryLockResult};

    thread_local! {
        /// Nesting depth of the runtime's own waits on this thread.
        static OFF: Cell<u32> = const { Cell::new(0) };
    }

    /// Whether this thread is in one of the runtime's own waits (the hooks pass through).
    #[inline(never)]
    pub(crate) fn hooks_off() -> bool {
        OFF.with(|c| c.get() != 0)
    }

    /// Marks a wait of the runtime's own (a `Condvar` wait on one of its locks) for as long as
    /// it lives. Never held across a fiber switch.
    pub(crate) struct HooksOff(());

    impl HooksOff {
        #[inline(never)]
        pub(crate) fn enter() -> HooksOff {
            OFF.with(|c| c.set(c.get() + 1));
            HooksOff(())
        }
    }

    impl Drop for HooksOff {
        #[inline(never)]
        fn drop(&mut self) {
            OFF.with(|c| c.set(c.get() - 1));
        }
    }

    /// `std::sync::Mutex` whose contended `lock` is a `HooksOff` wait. The guard is std's.
    #[derive(Default)]
    pub(crate) struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) const fn new(t: T) -> Mutex<T> {
            Mutex(std::sync::Mutex::new(t))
        }

        pub(crate) fn into_inner(self) -> LockResult<T> {
            self.0.into_inner()
        }
    }

    impl<T: ?Sized> Mutex<T> {
        #[inline]
        pub(crate) fn lock(&self) -> LockResult<MutexGuard<'_, T>> {
            match self.0.try_lock() {
                Ok(g) => Ok(g),
                Err(TryLockError::Poisoned(e)) => Err(e),
                Err(TryLockError::WouldBlock) => {
                    let _off = HooksOff::enter();
                    self.0.lock()
                }
            }
        }

        #[inline]
        pub(crate) fn try_lock(&self) -> TryLockResult<MutexGuard<'_, T>> {
            self.0.try_lock()
        }

        pub(crate) fn get_mut(&mut self) -> LockResult<&mut T> {
            self.0.get_mut()
        }
    }

    impl<T: ?Sized + fmt::Debug> fmt::Debug for Mutex<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.0.fmt(f)
        }
    }
}
