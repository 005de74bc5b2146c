//! The crate's only `thread_local!`: which carrier (if any) this OS thread is.
//!
//! Fibers migrate between carriers, and LLVM may keep a thread-local's address in a register
//! across a function that switches stacks. So every read goes through an `#[inline(never)]`
//! accessor that returns a raw pointer, and callers use the pointer only until their next
//! switch point (`park`, `yield_now`, ...), never across one. See `arch/decisions/0001-migration-and-thread-locals.md`.

use std::cell::Cell;
use std::ptr;

use crate::fiber::FiberRecord;
use crate::scheduler::carrier::Carrier;

thread_local! {
    static CARRIER: Cell<*const Carrier> = const { Cell::new(ptr::null()) };
    /// Set while the runtime's drop unwinds a fiber on this (non-carrier) thread.
    static CANCELLING: Cell<*const FiberRecord> = const { Cell::new(ptr::null()) };
    /// Per-thread state of plain (non-carrier) threads: a block of fiber ids and an injector
    /// shard hint.
    /// Fiber-local values of a plain thread (the `fiber_local!` fallback).
    static PLAIN_LOCALS: crate::fiber::local::Locals = crate::fiber::local::Locals::default();
    static PLAIN: Cell<PlainThread> = const { Cell::new(PlainThread { id: 0, ids: (0, 0), shard: usize::MAX }) };
}

#[derive(Clone, Copy)]
pub(crate) struct PlainThread {
    /// This thread's own `FiberId` (0 until asked for).
    pub(crate) id: u64,
    /// A block of ids `[next, end)` reserved for spawns from this thread.
    pub(crate) ids: (u64, u64),
    /// Injector shard this thread submits to (`usize::MAX` until chosen).
    pub(crate) shard: usize,
}

/// The carrier this thread is, or null. Valid until the caller's next switch point.
#[inline(never)]
pub(crate) fn carrier() -> *const Carrier {
    std::hint::black_box(CARRIER.with(Cell::get))
}

pub(crate) fn set_carrier(c: *const Carrier) {
    CARRIER.with(|cell| cell.set(c));
}

/// The fiber being unwound by a runtime's drop on this thread, or null.
#[inline(never)]
pub(crate) fn cancelling() -> *const FiberRecord {
    std::hint::black_box(CANCELLING.with(Cell::get))
}

pub(crate) fn set_cancelling(f: *const FiberRecord) {
    CANCELLING.with(|cell| cell.set(f));
}

/// The fiber running on this thread right now, or null on a plain thread.
/// Valid until the caller's next switch point.
#[inline(never)]
pub(crate) fn current_fiber() -> *const FiberRecord {
    // The body inlined, not a call to `running_fiber`: this function is already the
    // non-inlined frame that the thread-local rule asks for (a nested call cost ~8
    // instructions per use; a channel's blocking receive makes one per wait).
    running_fiber_here().0
}

/// The fiber running on this thread (or null) and whether the runtime's drop is unwinding it,
/// from one call: `yield_now` and every park ask both at each switch, and each accessor call
/// is a real call (see the module doc). Valid until the caller's next switch point.
#[inline(never)]
pub(crate) fn running_fiber() -> (*const FiberRecord, bool) {
    running_fiber_here()
}

/// `running_fiber`'s body, for the accessors above only (each is itself `#[inline(never)]`).
#[inline(always)]
fn running_fiber_here() -> (*const FiberRecord, bool) {
    // A runtime may be dropped (and its fibers unwound) from inside another runtime's fiber:
    // the fiber being unwound is the current one then.
    let x = CANCELLING.with(Cell::get);
    if !x.is_null() {
        return (x, true);
    }
    let c = CARRIER.with(Cell::get);
    if !c.is_null() {
        // SAFETY: a non-null carrier pointer refers to the `Carrier` living on this thread's
        // stack for as long as the thread runs its loop, which encloses every fiber it resumes.
        return (unsafe { (*c).current() }, false);
    }
    (std::ptr::null(), false)
}

/// Reads and updates this plain thread's state. Never called across a switch (plain threads do
/// not switch).
#[inline(never)]
pub(crate) fn with_plain<R>(f: impl FnOnce(&mut PlainThread) -> R) -> R {
    PLAIN.with(|cell| {
        let mut p = cell.get();
        let r = f(&mut p);
        cell.set(p);
        r
    })
}

/// Runs `f` with this plain thread's fiber-local map.
#[inline(never)]
pub(crate) fn with_plain_locals<R>(f: impl FnOnce(&crate::fiber::local::Locals) -> R) -> R {
    PLAIN_LOCALS.with(f)
}
