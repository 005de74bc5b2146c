//! What fiber/ needs from whoever runs its fibers, declared here and implemented by the
//! scheduler (tokio's `task::Schedule` is the model): make a fiber runnable, take back a record
//! whose last reference is gone, arm a timed park's timer, unwind another fiber while the
//! runtime's drop unwinds this one, read the runtime's coarse clock.
//!
//! fiber/ names no scheduler, runtime, time or scope item (`arch/layers.txt`). Every record
//! holds a [`RuntimeRef`], an opaque counted pointer to its runtime's state; the scheduler
//! gives it its meaning (its inherent methods, `Clone`, `Drop`, `Deref` and the [`Schedule`]
//! impl are in `scheduler/runtime_ref.rs`). The dispatch is static: one implementation, known
//! when the crate builds, so the hot paths call the scheduler directly as before.

use std::ptr::NonNull;
use std::time::Instant;

use super::{FiberRecord, FiberRef};

/// Why a fiber is being made runnable; decides where it is queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// Another fiber woke it: the waker's LIFO slot, so it runs next with warm caches.
    Unpark,
    /// The fiber it was joining finished: back of the local deque. A joiner woken into the
    /// LIFO slot would run before its next child, find it unfinished and park again, once per
    /// child; behind the queue it finds most of them done.
    Joiner,
    /// Its timer expired: back of the local deque. Timers fire in batches, so the caller
    /// notifies idle carriers once per batch (`time::fire`), not once per fiber.
    Timer,
}

/// The state a [`RuntimeRef`] points to: opaque to fiber/ (it is the scheduler's `Shared`).
pub(crate) enum RuntimeState {}

/// A counted reference to the runtime a fiber belongs to (held by every record, handle and
/// carrier, so the runtime's state outlives anything that may still schedule onto it). Opaque
/// here: see the module doc.
pub(crate) struct RuntimeRef(NonNull<RuntimeState>);

impl RuntimeRef {
    /// Takes over a counted reference to the state at `state`.
    ///
    /// # Safety
    /// `state` is the scheduler's state, and the caller gives this value one counted reference
    /// to it (the scheduler's `RuntimeRef::new`, `from_shared` and stock keep the count).
    #[inline(always)]
    pub(crate) const unsafe fn from_raw(state: NonNull<RuntimeState>) -> RuntimeRef {
        RuntimeRef(state)
    }

    /// The state this points to (for the scheduler to read as its own type).
    #[inline(always)]
    pub(crate) const fn as_raw(&self) -> NonNull<RuntimeState> {
        self.0
    }
}

// SAFETY: the state is the scheduler's `Shared`, which is `Sync` (atomics and mutexes); the
// reference count keeps it alive.
unsafe impl Send for RuntimeRef {}
// SAFETY: as above.
unsafe impl Sync for RuntimeRef {}

/// What fiber/ asks of the scheduler; implemented for [`RuntimeRef`] by the scheduler.
pub(crate) trait Schedule {
    /// Makes `f` runnable, from anywhere (`wake` says where it queues).
    fn schedule(f: FiberRef, wake: Wake);

    /// A record's last reference is gone (it is cleared, and holds its runtime's reference
    /// still): put it back in a pool of its runtime, and decide what becomes of that reference
    /// (a carrier's cache keeps it in the record, see `Caches::records`).
    ///
    /// # Safety
    /// `rec` is such a record: unused, cleared, and the caller's alone.
    unsafe fn recycle(rec: NonNull<FiberRecord>);

    /// Arms a timer that unparks `rec` at `deadline`, on the carrier running it, and returns
    /// its generation (for [`disarm`](Schedule::disarm)). Called by the fiber itself, just
    /// before it parks.
    fn arm_timer(rec: &FiberRecord, deadline: Instant) -> u64;

    /// Ends a timed park armed with `generation`: true if the fiber disarmed its timer, false
    /// if the timer had fired (its deadline passed).
    fn disarm(rec: &FiberRecord, generation: u64) -> bool;

    /// Called from a fiber that the runtime's drop is unwinding and that waits: unwinds another
    /// fiber of the runtime meanwhile. False when there was none to unwind.
    fn cancel_one(&self) -> bool;

    /// The runtime's coarse clock, which stamps fibers' states for dumps (0 when it does not).
    fn stamp(&self) -> u64;

    /// `rec`, running on this thread, panicked (the panic hook): the execution trace notes it.
    fn panicked(rec: &FiberRecord);
}
