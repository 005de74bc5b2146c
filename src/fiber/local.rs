//! Fiber-local storage: `fiber_local!`, the fiber-safe replacement for `thread_local!`.
//!
//! A fiber may resume on another carrier after any switch point, so a `thread_local!` read in a
//! fiber can observe (or, if its address was cached, write) another fiber's or another thread's
//! value. A fiber-local's value lives in the fiber's own record instead, on the heap, and moves
//! with the fiber: a reference to it stays valid across `yield_now`, `park` and migration.
//! On a plain OS thread the same key falls back to a per-thread value.
//!
//! Values are created on first access and dropped when the fiber finishes, inside the fiber.

use std::fmt;

use crate::fiber::context;

/// A key for a fiber-local value; declare one with [`fiber_local!`](crate::fiber_local).
pub struct LocalKey<T: Send + 'static> {
    init: fn() -> T,
}

impl<T: Send + 'static> fmt::Debug for LocalKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LocalKey { .. }")
    }
}

impl<T: Send + 'static> LocalKey<T> {
    #[doc(hidden)]
    pub const fn new(init: fn() -> T) -> LocalKey<T> {
        LocalKey { init }
    }

    /// Runs `f` with a reference to this fiber's value, creating it on first use. The
    /// reference may be held across switch points: the value moves with the fiber.
    ///
    /// # Panics
    /// If the initialiser accesses the key it is initialising.
    pub fn with<F, R>(&'static self, f: F) -> R
    where
        F: FnOnce(&T) -> R,
    {
        let key = self as *const Self as usize;
        let rec = context::current_fiber();
        if rec.is_null() {
            return context::with_plain_locals(|locals| {
                // SAFETY: the thread's map lives as long as the thread, and entries are never
                // removed while it runs; `f` runs on this thread.
                f(unsafe { &*locals.get_or_init(key, self.init) })
            });
        }
        // SAFETY: the running fiber's record lives at least as long as the fiber runs, which
        // encloses `f`; the record's address does not change when the fiber migrates.
        let rec = unsafe { &*rec };
        // SAFETY: entries of a fiber's map are removed only when the fiber finishes, after `f`.
        f(unsafe { &*rec.locals.get_or_init(key, self.init) })
    }
}

/// `vt::fiber_local! { static REQUEST_ID: Cell<u64> = Cell::new(0); } REQUEST_ID.with(|id| id.set(7));`
///
/// Declares fiber-local values, like `thread_local!` but one value per fiber, safe when fibers
/// migrate between carriers. Access with `KEY.with(|v| ...)`. The type must be `Send` (the value
/// moves with its fiber); use `Cell`/`RefCell` for mutation.
///
/// ```
/// use std::cell::Cell;
/// virtual_threads::fiber_local! {
///     static REQUESTS: Cell<u32> = Cell::new(0);
/// }
/// let rt = virtual_threads::Runtime::new().unwrap();
/// let n = rt.block_on(|| {
///     REQUESTS.with(|r| r.set(r.get() + 1));
///     virtual_threads::yield_now(); // may resume on another carrier: the value follows
///     REQUESTS.with(|r| r.get())
/// });
/// assert_eq!(n, 1);
/// ```
#[macro_export]
macro_rules! fiber_local {
    () => {};
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = $init:expr; $($rest:tt)*) => {
        $(#[$attr])*
        $vis static $name: $crate::LocalKey<$t> = $crate::LocalKey::new({
            fn __vt_init() -> $t {
                $init
            }
            __vt_init
        });
        $crate::fiber_local!($($rest)*);
    };
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = $init:expr) => {
        $crate::fiber_local!($(#[$attr])* $vis static $name: $t = $init;);
    };
}
