//! The crate's only `thread_local!`: which carrier (if any) this OS thread is, and the fiber it
//! runs. At the bottom, in fiber/, with the carrier opaque: the scheduler registers its carrier
//! (`set_carrier`) together with the [`Running`] cell embedded in it, and reads its own type
//! back (`scheduler::carrier::here`); fiber/ reads only the running fiber.
//!
//! Fibers may migrate between carriers (the `unsafe` opt-in), and LLVM may keep a thread-local's address in a register
//! across a function that switches stacks. So every read goes through an `#[inline(never)]`
//! accessor that returns a raw pointer, and callers use the pointer only until their next
//! switch point (`park`, `yield_now`, ...), never across one. See `arch/decisions/0001-migration-and-thread-locals.md`.

use std::cell::Cell;
use std::ptr;

use super::FiberRecord;
use super::local_map::Locals;
use super::stop_state::{DeadlineScope, PlainStop};

/// The fiber a carrier runs now (null between fibers): a field of the scheduler's `Carrier`,
/// written by it at every switch, read here through the pointer `set_carrier` registered.
pub(crate) struct Running(Cell<*const FiberRecord>);

impl Running {
    pub(crate) const fn new() -> Running {
        Running(Cell::new(ptr::null()))
    }

    #[inline(always)]
    pub(crate) fn get(&self) -> *const FiberRecord {
        self.0.get()
    }

    #[inline(always)]
    pub(crate) fn set(&self, f: *const FiberRecord) {
        self.0.set(f)
    }
}

/// The carrier this thread is, as fiber/ sees it: opaque.
pub(crate) enum CarrierState {}

thread_local! {
    static CARRIER: Cell<*const CarrierState> = const { Cell::new(ptr::null()) };
    /// The `Running` cell of that carrier (null with it).
    static RUNNING: Cell<*const Running> = const { Cell::new(ptr::null()) };
    /// Set while the runtime's drop unwinds a fiber on this (non-carrier) thread.
    static CANCELLING: Cell<*const FiberRecord> = const { Cell::new(ptr::null()) };
    /// Per-thread state of plain (non-carrier) threads: a block of fiber ids and an injector
    /// shard hint.
    /// Fiber-local values of a plain thread (the `fiber_local!` fallback).
    static PLAIN_LOCALS: Locals = Locals::default();
    /// Fibers that switched out while unwinding on this carrier thread (`park.rs`), so that
    /// `panicking()` here may be theirs.
    static UNWINDS_PARKED: Cell<u32> = const { Cell::new(0) };
    /// A plain thread's open `vt::timeout`s and `uncancellable` depth (`cancel.rs`).
    static PLAIN_STOP: Cell<PlainStop> = const { Cell::new(PlainStop::NONE) };
    static PLAIN: Cell<PlainThread> = const { Cell::new(PlainThread { id: 0, ids: (0, 0), shard: usize::MAX }) };
    /// In a child process forked from a fiber: that fiber (it runs as this plain thread now).
    static FORKED: Cell<*const FiberRecord> = const { Cell::new(ptr::null()) };
    /// `ARMED_CARRIER` while `RUNNING` is set, `ARMED_CANCELLING` while `CANCELLING` is: zero on
    /// every thread whose hooked calls cannot park (`hooks_armed`).
    static ARMED: Cell<u8> = const { Cell::new(0) };
}

const ARMED_CARRIER: u8 = 1;
const ARMED_CANCELLING: u8 = 2;

fn set_armed(bit: u8, on: bool) {
    ARMED.with(|cell| cell.set(if on { cell.get() | bit } else { cell.get() & !bit }));
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

/// The carrier this thread is (the scheduler's, opaque here), or null. Valid until the
/// caller's next switch point.
#[inline(never)]
pub(crate) fn carrier() -> *const CarrierState {
    opaque(CARRIER.with(Cell::get))
}

/// `p`, through a barrier the optimiser cannot see through, so that an accessor's result is
/// never taken for the same across two calls. What `std::hint::black_box` gave the accessors,
/// without its store to the stack and load back, on `carrier`'s calls from every spawn and
/// every record's recycling (`arch/performance.md`).
#[inline(always)]
fn opaque<T>(mut p: *const T) -> *const T {
    // SAFETY: a template of a comment only: it tells the compiler that `p` and memory may have
    // changed, which costs no instruction and does nothing.
    unsafe { std::arch::asm!("/* {0} */", inout(reg) p, options(nostack, preserves_flags)) };
    p
}

/// Registers this thread's carrier and the `Running` cell in it (both null: none).
///
/// # Safety
/// Until this thread registers null again, `c` is the scheduler's carrier living on this
/// thread's stack (or null) and `running` points into it (or is null): the accessors here
/// dereference `running`, and the scheduler reads `c` as its `Carrier`.
pub(crate) unsafe fn set_carrier(c: *const CarrierState, running: *const Running) {
    CARRIER.with(|cell| cell.set(c));
    RUNNING.with(|cell| cell.set(running));
    set_armed(ARMED_CARRIER, !running.is_null());
}

/// Called in a child process right after `fork`, on its only thread (the forking one): if that
/// thread is a carrier, it stops being one. Its runtime has no other thread here, and its epoll
/// sets and eventfds are the parent's own kernel objects: a carrier loop here would sleep in
/// them and take the parent's wake-ups. So the fiber that forked goes on as a plain thread —
/// its spawns go to the child's fresh default runtime, its waits block the thread — and
/// `fiber_loop` ends the child when it returns (`is_forked_fiber`).
///
/// Async-signal-safe (the child of a multithreaded process may call only such): const-initialised
/// thread-locals without destructors, read and written in place.
pub(crate) fn forget_carrier_after_fork() {
    let running = RUNNING.with(Cell::get);
    if running.is_null() {
        return;
    }
    // SAFETY: a non-null pointer refers to the `Running` cell of the carrier on this thread's
    // stack (see `running_fiber_here`); in the child that stack is this thread's copy.
    FORKED.with(|cell| cell.set(unsafe { (*running).get() }));
    CARRIER.with(|cell| cell.set(ptr::null()));
    RUNNING.with(|cell| cell.set(ptr::null()));
    set_armed(ARMED_CARRIER, false);
}

/// Whether `me` is the fiber that called `fork` in this (child) process.
#[inline(never)]
pub(crate) fn is_forked_fiber(me: *const FiberRecord) -> bool {
    std::ptr::eq(opaque(FORKED.with(Cell::get)), me)
}

/// The fiber being unwound by a runtime's drop on this thread, or null.
#[inline(never)]
pub(crate) fn cancelling() -> *const FiberRecord {
    opaque(CANCELLING.with(Cell::get))
}

pub(crate) fn set_cancelling(f: *const FiberRecord) {
    CANCELLING.with(|cell| cell.set(f));
    set_armed(ARMED_CANCELLING, !f.is_null());
}

/// The fiber running on this thread right now, or null on a plain thread.
/// Valid until the caller's next switch point.
#[inline(never)]
pub(crate) fn current_fiber() -> *const FiberRecord {
    // The body inlined, not a call to `running_fiber`: this function is already the
    // non-inlined frame that the thread-local rule asks for, and a nested call would cost
    // every use (a channel's blocking receive makes one per wait).
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
    let c = RUNNING.with(Cell::get);
    if !c.is_null() {
        // SAFETY: a non-null pointer refers to the `Running` cell of the carrier living on this
        // thread's stack for as long as the thread runs its loop, which encloses every fiber it
        // resumes.
        return (unsafe { (*c).get() }, false);
    }
    (std::ptr::null(), false)
}

/// What a hooked libc call made on this thread should do (the `hooks` feature,
/// `arch/hooks.md`).
#[cfg(all(feature = "hooks", not(loom)))]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum HookGate {
    /// Call the real function: not a fiber (a plain thread, a helper, the supervisor, a carrier
    /// between fibers), a fiber unwinding a panic (std counts panics per OS thread, so an
    /// unwinding fiber never switches), or one of the runtime's own waits (`loom::HooksOff`).
    Pass,
    /// Park the calling fiber.
    Park,
    /// The runtime's drop is unwinding the calling fiber: nothing will wake a park; end the
    /// call early, as `vt::sleep` and `park` do then.
    Cancelling,
}

/// Whether a hooked call on this thread may do anything but pass through: false on every
/// thread that is neither a carrier nor unwinding a fiber for a runtime's drop, where
/// `hook_gate` can only say `Pass`. Inlined into each hook, unlike the other accessors (module
/// doc): one byte of a const-initialised thread-local with no destructor (no lazy set-up),
/// read once at a hook's entry before any switch point of that call, and set on every
/// carrier alike, so a migrated fiber would read the same answer. `arch/hooks.md` ("Cost on a
/// plain thread").
#[cfg(all(feature = "hooks", not(loom)))]
#[inline(always)]
pub(crate) fn hooks_armed() -> bool {
    ARMED.with(Cell::get) != 0
}

/// The `HookGate` of this thread now (`Pass` wherever `hooks_armed` is false). Valid until the
/// caller's next switch point.
#[cfg(all(feature = "hooks", not(loom)))]
#[inline(never)]
pub(crate) fn hook_gate() -> HookGate {
    let c = RUNNING.with(Cell::get);
    let fiber = if c.is_null() {
        ptr::null()
    } else {
        // SAFETY: as in `running_fiber_here`: the carrier's `Running` cell outlives every fiber
        // the carrier resumes, and this thread is that carrier.
        unsafe { (*c).get() }
    };
    if !CANCELLING.with(Cell::get).is_null() {
        // The runtime's own waits go to the kernel during a drop's unwind too: the drop's park
        // (`Cancelling`) takes the drop's own lock, whose contended wait would re-enter it.
        return if crate::loom::hooks_off() { HookGate::Pass } else { HookGate::Cancelling };
    }
    if fiber.is_null() || std::thread::panicking() || crate::loom::hooks_off() {
        return HookGate::Pass;
    }
    HookGate::Park
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
pub(crate) fn with_plain_locals<R>(f: impl FnOnce(&Locals) -> R) -> R {
    PLAIN_LOCALS.with(f)
}

/// This plain thread's stop state (`cancel.rs`). Plain threads do not switch.
#[inline(never)]
pub(crate) fn plain_stop() -> PlainStop {
    PLAIN_STOP.with(Cell::get)
}

pub(crate) fn set_plain_deadlines(d: *const DeadlineScope) {
    PLAIN_STOP.with(|c| c.set(PlainStop { deadlines: d, ..c.get() }));
}

pub(crate) fn set_plain_shield(shield: u32) {
    PLAIN_STOP.with(|c| c.set(PlainStop { shield, ..c.get() }));
}

/// Fibers parked mid-unwind on this thread (`park::may_park_while_unwinding`).
#[inline(never)]
pub(crate) fn unwinds_parked() -> u32 {
    UNWINDS_PARKED.with(Cell::get)
}

#[inline(never)]
pub(crate) fn add_unwinds_parked(n: i32) {
    UNWINDS_PARKED.with(|c| c.set(c.get().wrapping_add_signed(n)));
}

#[cfg(all(test, feature = "hooks", not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_s_own_waits_pass_through_while_a_drop_unwinds_a_fiber() {
        // The drop's park (the `Cancelling` answer) takes the drop's own lock: were a contended
        // wait for that lock answered `Cancelling` too, it would re-enter the drop's park, once
        // per contended lock, until the fiber's stack overflowed (std's sync suites met that).
        // Only the pointer's nullness is read here; the record is never touched.
        let fake = ptr::NonNull::<FiberRecord>::dangling().as_ptr();
        set_cancelling(fake);
        let in_drop = hook_gate();
        let own_wait = {
            let _off = crate::loom::HooksOff::enter();
            hook_gate()
        };
        set_cancelling(ptr::null());
        assert_eq!((in_drop, own_wait), (HookGate::Cancelling, HookGate::Pass));
    }
}
