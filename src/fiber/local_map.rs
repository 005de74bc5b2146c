//! The map that holds one fiber's (or one plain thread's) fiber-local values: the record owns
//! one (`FiberRecord::locals`), the thread-local context one per plain thread (`context.rs`),
//! and `fiber_local!`'s keys (`local.rs`) look values up in whichever is current. Apart from
//! `local.rs`, so that `context.rs` can hold a map without importing the keys that read it.

use std::any::Any;
use std::cell::UnsafeCell;

/// One fiber's (or plain thread's) values. Touched only by its owner.
#[derive(Default)]
pub(crate) struct Locals {
    map: UnsafeCell<Vec<(usize, Box<dyn Any + Send>)>>,
}

impl Locals {
    /// The value for `key`, created with `init` if absent. The pointee is a heap box that no
    /// later insertion moves.
    pub(super) fn get_or_init<T: Send + 'static>(&self, key: usize, init: fn() -> T) -> *const T {
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
