//! `FiberRef`: the counted reference to a `FiberRecord` (the runtime's own `Arc`, so that the
//! last drop recycles the record into its runtime's pool instead of freeing it), with the
//! run-reference hand-offs of park and finish.

use std::ptr::NonNull;
use std::sync::atomic::{Ordering, fence};

use super::FiberRecord;

/// A counted reference to a [`FiberRecord`] (the runtime's own `Arc`, so that the last drop
/// recycles the record instead of freeing it).
#[repr(transparent)] // `handle::Fiber` reads its pointer as one
pub(crate) struct FiberRef(pub(super) NonNull<FiberRecord>);

// SAFETY: `FiberRecord` is `Send + Sync` (see its impls); the count keeps it alive.
unsafe impl Send for FiberRef {}
// SAFETY: as above.
unsafe impl Sync for FiberRef {}

impl FiberRef {
    pub(crate) fn as_ptr(this: &FiberRef) -> *const FiberRecord {
        this.0.as_ptr()
    }

    /// Gives up the reference as a raw pointer (for an atomic slot); see `from_raw`.
    pub(crate) fn into_raw(this: FiberRef) -> *mut FiberRecord {
        let p = this.0.as_ptr();
        std::mem::forget(this);
        p
    }

    /// Takes back a reference given up by `into_raw`; `None` for null.
    ///
    /// # Safety
    /// `p` is null or came from `into_raw`, and is taken back once.
    pub(crate) unsafe fn from_raw(p: *mut FiberRecord) -> Option<FiberRef> {
        NonNull::new(p).map(FiberRef)
    }

    /// Takes a new reference to the record at `ptr`.
    ///
    /// # Safety
    /// `ptr` must point to a live record (someone holds a reference for the duration).
    pub(crate) unsafe fn clone_from_ptr(ptr: *const FiberRecord) -> FiberRef {
        // SAFETY: live by the caller's guarantee.
        let r = unsafe { &*ptr };
        r.refs.fetch_add(1, Ordering::Relaxed);
        FiberRef(NonNull::from(r))
    }
}

impl FiberRef {
    /// Takes a reference to the record at `ptr` if it describes a fiber now (its count is not
    /// zero), as `Weak::upgrade` does; `None` for a record sitting unused in a pool. Used by
    /// dumps, which walk every record the runtime ever allocated.
    ///
    /// # Safety
    /// `ptr` must point to a record that stays allocated for the call (records are freed only
    /// when their runtime's state is, see `scheduler::roots`).
    pub(crate) unsafe fn upgrade(ptr: NonNull<FiberRecord>) -> Option<FiberRef> {
        // SAFETY: allocated, by the caller's guarantee; only its atomics are touched here.
        let refs = unsafe { &ptr.as_ref().refs };
        let mut n = refs.load(Ordering::Relaxed);
        loop {
            if n == 0 {
                return None;
            }
            // Acquire pairs with the Release store in `init`: the fields that describe this
            // fiber are visible before we read them.
            match refs.compare_exchange_weak(n, n + 1, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Some(FiberRef(ptr)),
                Err(actual) => n = actual,
            }
        }
    }
}

impl FiberRef {
    /// The run reference of a fiber that the caller just made runnable from parked (a
    /// `notify` or `end_compaction` that returned true). The carrier that parked the fiber
    /// left its own reference with the parked fiber instead of dropping it
    /// (`Carrier::run_claimed`), and whoever makes it runnable takes that reference over: a
    /// park and the unpark that ends it touch the count not at all (they cost a locked
    /// decrement and increment on the record's line before).
    ///
    /// # Safety
    /// The caller won the fiber's transition from parked to runnable (only one party can),
    /// and takes its reference once for that transition.
    pub(crate) unsafe fn take_parked_ref(r: &FiberRecord) -> FiberRef {
        FiberRef(NonNull::from(r))
    }

    /// Drops `this` (the carrier's reference to a fiber that just finished) together with the
    /// fiber's reference to itself: one atomic operation for both. When those were the last
    /// (nobody holds a handle: a detached fiber), returns the record, cleared (its runtime
    /// reference still in it), for the carrier to keep (`Carrier::give_record`): the
    /// carrier is at hand, where `recycle` would look it up again through the thread-local.
    #[inline]
    pub(crate) fn release_finished(this: FiberRef) -> Option<NonNull<FiberRecord>> {
        let ptr = this.0;
        std::mem::forget(this);
        // SAFETY: the record is live (we hold two of its references, given up here).
        let r = unsafe { ptr.as_ref() };
        // Release/Acquire as in `Drop`.
        if r.refs.fetch_sub(2, Ordering::Release) == 2 {
            fence(Ordering::Acquire);
            // SAFETY: those were the last two references: nobody else holds the record.
            unsafe { r.clear() };
            return Some(ptr);
        }
        None
    }
}

impl Clone for FiberRef {
    fn clone(&self) -> FiberRef {
        // Relaxed, as `Arc::clone`: a new reference is made from an existing one.
        self.refs.fetch_add(1, Ordering::Relaxed);
        FiberRef(self.0)
    }
}

impl std::ops::Deref for FiberRef {
    type Target = FiberRecord;
    fn deref(&self) -> &FiberRecord {
        // SAFETY: the count keeps the record live and not reused while `self` exists.
        unsafe { self.0.as_ref() }
    }
}

impl Drop for FiberRef {
    // Inlined: a join handle's drop (in the caller's crate) releases its reference with the
    // atomic alone, the recycling a call only when it was the last.
    #[inline]
    fn drop(&mut self) {
        // Release/Acquire as in `Arc::drop`: every use happens before the record is reused.
        if self.refs.fetch_sub(1, Ordering::Release) == 1 {
            fence(Ordering::Acquire);
            // SAFETY: that was the last reference, ours, given up just now.
            unsafe { FiberRecord::recycle(self.0) };
        }
    }
}

impl std::fmt::Debug for FiberRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}
