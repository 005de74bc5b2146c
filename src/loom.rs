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
    pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

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

    /// Every deadline has passed: timed waits give up at once, racing their wake-up.
    pub(crate) fn expired(_deadline: Instant) -> bool {
        true
    }
}
