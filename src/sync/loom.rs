//! std ↔ loom switch for the atomics, inner locks, cells and the park seam used by `vt::sync`
//! and `vt::channel`, and for the atomics of the scheduler's idle protocol and the fiber's state
//! and join words (STYLE habit 7; what each model covers: `arch/loom.md`).
//!
//! Under `cfg(loom)` every atomic, inner lock and `Arc` of the wait protocol is loom's, and the
//! runtime's park/unpark is replaced by loom threads' park/unpark: loom cannot switch corosensei
//! stacks, but it can explore every interleaving of "register, re-check, park" against "pop,
//! transition, unpark". A timed wait is modelled as a timer that has already fired, so the
//! models exercise exactly the race where a timeout meets a wake-up (see `arch/sync.md`).
//! If the crate grows a root `crate::loom` facade, this module should re-export from it.

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

    pub(crate) use crate::{Fiber, current};
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicUsize, Ordering, fence};
    pub(crate) use std::sync::{Arc, Mutex, MutexGuard};

    // Parking goes through `wait_list::park`, which records the wait reason for dumps.

    /// Who is calling, as a number that no other live caller has: the running fiber's record
    /// (its address; a channel that remembers it also holds a counted handle to it, so it is
    /// not reused meanwhile), or 0 on a plain thread.
    #[inline]
    pub(crate) fn current_id() -> usize {
        crate::runtime::context::current_fiber() as usize
    }

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
    pub(crate) use loom::thread::{Thread as Fiber, current, park};

    /// A timed park: the model treats the timer as having fired already, so this only yields.
    pub(crate) fn park_until(_deadline: Instant) {
        loom::thread::yield_now();
    }

    /// Every deadline has passed: timed waits give up at once, racing their wake-up.
    pub(crate) fn expired(_deadline: Instant) -> bool {
        true
    }

    /// A number per model thread, never 0 (model threads stand in for fibers, so every one may
    /// use a channel's fast slot).
    pub(crate) fn current_id() -> usize {
        // loom's ThreadId has no accessor for its number; its Debug form is "ThreadId(n)".
        let id = format!("{:?}", loom::thread::current().id());
        let n: usize =
            id.trim_start_matches("ThreadId(").trim_end_matches(')').parse().expect("loom thread id");
        n + 1
    }
}
