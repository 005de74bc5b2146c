//! Fiber-local storage: `fiber_local!`, the fiber-safe replacement for `thread_local!`.
//!
//! A fiber may resume on another carrier after any switch point, so a `thread_local!` read in a
//! fiber can observe (or, if its address was cached, write) another fiber's or another thread's
//! value. A fiber-local's value lives in the fiber's own record instead, on the heap, and moves
//! with the fiber: a reference to it stays valid across `yield_now`, `park` and migration.
//! On a plain OS thread the same key falls back to a per-thread value.
//!
//! Values are created on first access and dropped when the fiber finishes, inside the fiber.

use std::any::Any;
use std::cell::UnsafeCell;
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

/// One fiber's (or plain thread's) values. Touched only by its owner.
#[derive(Default)]
pub(crate) struct Locals {
    map: UnsafeCell<Vec<(usize, Box<dyn Any + Send>)>>,
}

impl Locals {
    /// The value for `key`, created with `init` if absent. The pointee is a heap box that no
    /// later insertion moves.
    fn get_or_init<T: Send + 'static>(&self, key: usize, init: fn() -> T) -> *const T {
        if let Some(v) = self.find::<T>(key) {
            return v;
        }
        // The initialiser may use other fiber-locals: hold no borrow of the map while it runs.
        let value: Box<dyn Any + Send> = Box::new(init());
        assert!(self.find::<T>(key).is_none(), "fiber_local! initialiser accessed its own key");
        // SAFETY: owner-only access, no outstanding borrow of the vector itself.
        let map = unsafe { &mut *self.map.get() };
        map.push((key, value));
        map.last().and_then(|(_, v)| v.downcast_ref::<T>()).expect("just inserted") as *const T
    }

    fn find<T: 'static>(&self, key: usize) -> Option<*const T> {
        // SAFETY: owner-only access; the shared borrow ends before this returns.
        let map = unsafe { &*self.map.get() };
        map.iter().find(|(k, _)| *k == key).and_then(|(_, v)| v.downcast_ref::<T>()).map(|v| v as *const T)
    }

    /// Drops every value (the fiber is finishing). Destructors may touch other fiber-locals,
    /// re-creating them, so repeat a few rounds, as std does for thread-locals.
    #[inline]
    pub(crate) fn clear(&self) {
        // Most fibers never use a fiber-local: look before taking the vector (the take's
        // stores and the drop of the empty one cost every fiber something), in the caller,
        // with the rounds out of line.
        // SAFETY: owner-only access; the shared borrow ends here.
        if unsafe { !(*self.map.get()).is_empty() } {
            self.clear_rounds();
        }
    }

    #[cold]
    #[inline(never)]
    fn clear_rounds(&self) {
        for _ in 0..8 {
            // SAFETY: owner-only access; the vector is moved out before any destructor runs.
            let values = std::mem::take(unsafe { &mut *self.map.get() });
            if values.is_empty() {
                return;
            }
            drop(values);
        }
    }
}

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
