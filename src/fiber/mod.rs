//! Fibers: a stackful coroutine plus the record the scheduler moves between queues.
//!
//! A fiber is a `corosensei` coroutine on a pooled [`stack::FiberStack`], owned by a
//! reference-counted [`FiberRecord`]. Its life is a small state machine in one atomic word,
//! drawn once, in `state.rs` (spawn → RUNNING and queued → RUNNING → PARKED → RUNNABLE → ...
//! → DONE). fiber/ is the bottom layer but the loom facade and platform/ (`arch/layers.md`):
//! what it needs from the scheduler it declares in `schedule.rs`. See `arch/fiber.md`.

pub(crate) mod cancel;
pub(crate) mod compact;
pub(crate) mod context;
pub(crate) mod coroutine;
mod counted;
pub(crate) mod handle;
pub(crate) mod id;
pub(crate) mod join;
pub(crate) mod local;
mod local_map;
pub(crate) mod overflow;
pub(crate) mod panic_hook;
pub(crate) mod park;
pub(crate) mod schedule;
pub(crate) mod scope_data;
pub(crate) mod sleep;
#[cfg(feature = "tracing")]
pub(crate) mod spans;
pub(crate) mod stack;
pub(crate) mod stage;
pub(crate) mod state;
pub(crate) mod stop;
pub(crate) mod stop_state;
pub(crate) mod wait;

use std::cell::{Cell, UnsafeCell};
use std::mem::MaybeUninit;
use std::panic::Location;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use corosensei::{Coroutine, Yielder};

use schedule::{RuntimeRef, Schedule};
use stack::{FiberStack, SizeClass};
use stage::{STAGE_BYTES, STAGE_CLOSURE, STAGE_EMPTY, STAGE_RESULT, STAGE_SAVED, StageBuf, StageVTable};

pub(crate) use counted::FiberRef;
use id::FiberId;

/// What a fiber asks of its carrier when it switches out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Suspend {
    /// Put me at the back of a run queue.
    Yield,
    /// Mark me parked unless an unpark already came.
    Park,
    /// My fiber is finished (its result published): the coroutine is free to run the next
    /// fiber's closure, resumed with that fiber's record (see `coroutine::fiber_loop`).
    Finished,
}

/// A fiber's coroutine. It is resumed with the record of the fiber it runs (ignored but by a
/// coroutine that finished one fiber and waits for the next; null ends it), and outlives its
/// fibers: a finished one goes back to its carrier's cache with its stack, so the next fiber
/// skips building a coroutine and entering it through corosensei's trampoline.
pub(crate) type Co = Coroutine<*const FiberRecord, Suspend, (), FiberStack>;
pub(crate) type FiberYielder = Yielder<*const FiberRecord, Suspend>;

use state::StateWord;
pub(crate) use state::{Claim, DONE, PARKED, RUNNABLE, RUNNING};

/// A carrier index meaning "not pinned".
pub(crate) const NO_HOME: usize = usize::MAX;
/// `FiberRecord::carrier` of a fiber that has not run yet.
pub(crate) const NOT_RUN: u32 = u32::MAX;
/// `FiberRecord::carrier` of a fiber that has not run yet and that a carrier placed on another
/// by load (`scheduler/carrier/place.rs`): whoever starts it, starts it where it is.
pub(crate) const PLACED: u32 = u32::MAX - 1;

/// Everything the runtime knows about one fiber. Records are pooled per runtime and reused:
/// the fields that describe one fiber are rewritten in `init` while the record is unreachable
/// (reference count zero, sitting in a pool), so other threads see them only as immutable.
///
/// Laid out by hand, by who touches what (`LAYOUT` below checks it): the compiler's order spread
/// the fields a switch touches over four of the record's five lines, and with a thousand fibers
/// in turn those misses bound a yield. The record is not aligned to a line: 64-byte alignment
/// slowed a wake-up storm more than it saved in misses (`arch/fiber.md`).
#[repr(C)]
pub(crate) struct FiberRecord {
    // Bytes 0-63: what every switch reads or writes (claim, resume bookkeeping, suspend,
    // yield, park), so that a switch misses on at most two lines of the record, not four.
    /// State word: `RUNNING | RUNNABLE | PARKED | DONE`, plus the `NOTIFIED` flag.
    state: StateWord,
    /// The carrier that last ran the fiber, for dumps; before its first run `NOT_RUN`, or
    /// `PLACED` once a carrier placed it on another by load (never placed again).
    pub(crate) carrier: AtomicU32,
    /// Spawns since this fiber last yielded, for the fork-yield rule.
    pub(crate) spawns: Cell<u32>,
    /// Nesting depth of `blocking` sections (1 for a whole fiber from a known-blocking
    /// location): while positive, the carrier running the fiber counts itself as blocked.
    pub(crate) blocking_depth: Cell<u32>,
    pub(crate) started: Cell<bool>,
    /// It sits in a run queue while `RUNNING` in the state word: new (`init`), or after a
    /// yield (`set_yielded`). Written by whoever queued it and by the carrier that pops it, in
    /// that order through the queue's Release/Acquire; atomic only because dumps read it.
    queued_running: AtomicBool,
    /// Set before the runtime's drop unwinds this fiber.
    pub(crate) cancelled: AtomicBool,
    /// What the fiber parked on last (`WaitReason` code, `WAIT_TIMED` flag), for dumps. Written
    /// by the fiber before it parks; atomics because a dump reads them while the fiber runs.
    pub(crate) wait: AtomicU8,
    /// Stop requests (`cancel.rs`): `CANCEL` (the whole fiber), `DEADLINE` (a `vt::timeout` is
    /// open on its stack). Zero for almost every fiber, so a switch point pays one load of a
    /// byte on a line it already touches, and the rest is in `stop::stop_point`.
    pub(crate) stop: AtomicU8,
    /// Carrier this fiber must run on (its home once started, or `pinned` where migration is on),
    /// or `NO_HOME`. Written by
    /// the fiber while running; read by whoever schedules it, after the state word's
    /// Release/Acquire hand-off.
    pub(crate) home: AtomicUsize,
    spawned_at: Cell<&'static Location<'static>>,
    /// Call site of the outermost `blocking` section (or the spawn site, when known-blocking).
    pub(crate) blocking_at: Cell<Option<&'static Location<'static>>>,
    /// Set by the fiber itself when it first runs; it lives on the fiber's own stack, whose
    /// address does not change when the fiber migrates.
    yielder: Cell<*const FiberYielder>,
    /// When the fiber entered its present state (ns since the runtime's epoch, at the runtime's
    /// coarse clock), for dumps; written only with fiber roots on.
    pub(crate) since: AtomicU64,
    // Bytes 64-127: the coroutine (its saved stack pointer, read and written by every switch).
    /// The coroutine, built at the first run. Stacks are bound at first run, not at spawn, so
    /// a queued fiber holds none and a carrier that runs short fibers back to back reuses the
    /// same few cache-hot stacks (binding at spawn touched a cold stack page per spawn).
    co: UnsafeCell<Option<Co>>,
    /// The stack pointer just before the fiber last switched out to park (`suspend`): where
    /// the live part of a parked fiber's stack begins, less `compact::red_zone()`. Atomic so
    /// that the compactor may read it before claiming the fiber, to visit stacks in address
    /// order (a Relaxed store is a plain store).
    pub(crate) parked_sp: AtomicUsize,
    /// Nesting depth of sections in which the fiber lends its stack to other fibers or threads
    /// (`scope`, `join`, `block_on`, `ThreadPool::scope`, `no_compaction`): never compacted
    /// while positive, since they may write into it while it is parked.
    pub(crate) lent: Cell<u32>,
    pub(crate) pin_depth: Cell<u32>,
    /// Generations below the first fiber spawned from a plain thread (its spawner's depth plus
    /// one). Whatever borrows from a fiber's frame (`scope`, `join`, `block_on`) was spawned
    /// after that frame began, by the fiber or one of its descendants, so it is deeper: the
    /// runtime's drop unwinds the deepest fibers first (bug 11 in `arch/reliability.md`).
    pub(crate) depth: Cell<u32>,
    /// Depth of `vt::uncancellable` sections: a stop request waits while positive. Written by
    /// the fiber; atomic because dumps read it.
    pub(crate) shield: AtomicU16,
    // Bytes 128-191: what a join reads (the hand-off, the result) and what dropping a handle
    // writes, apart from what the fiber's carrier writes as it runs: a join on a fiber that
    // finished on another carrier moves at most two lines across, not three.
    pub(crate) stage: UnsafeCell<StageBuf>,
    /// References (`FiberRef`s); at zero the record goes back to its runtime's pool. Besides
    /// the handles, a live fiber holds one to itself and one *run reference*: held by the queue
    /// entry, the carrier running it, or, while parked, by the parked state itself (see
    /// `FiberRef::take_parked_ref`).
    refs: AtomicUsize,
    /// The join hand-off (`join.rs`).
    pub(crate) join: AtomicU8,
    pub(crate) stage_kind: Cell<u8>,
    /// When the fiber was first asked to stop (ms since `cancel::now_ms`'s epoch, at least
    /// 1), 0 if never, `u32::MAX` once a slow stop was reported: the supervisor's report.
    pub(crate) cancelled_at: AtomicU32,
    // The rest: spawn and finish.
    pub(crate) vtable: Cell<&'static StageVTable>,
    /// The size class of this fiber's stack.
    class: Cell<&'static SizeClass>,
    /// The fiber or thread waiting in `join`.
    pub(crate) waiter: UnsafeCell<Option<handle::Fiber>>,
    /// The scope this fiber belongs to, told once its result is taken or dropped.
    pub(crate) scope: UnsafeCell<Option<Arc<scope_data::ScopeData>>>,
    /// The runtime this fiber belongs to; holds one counted reference while the record is live,
    /// and while it waits unused in a carrier's cache (`Caches::records`), so that a spawn
    /// from the cache and a finish into it touch no reference count; `None` in a runtime's pool.
    runtime: UnsafeCell<Option<RuntimeRef>>,
    name: UnsafeCell<Option<Box<str>>>,
    id: Cell<FiberId>,
    pub(crate) locals: local_map::Locals,
    /// Moved on (a CAS from the armed value) by whichever of the fiber and its timer ends a
    /// timed park first (`time::disarm`), so a late timer does not wake a later park and the
    /// fiber knows when its deadline passed. Never reset, not even when the record is reused.
    pub(crate) timer_gen: AtomicU64,
    /// Link of a carrier's inbox (`scheduler/queue/inbox.rs`), where this fiber waits when a thread
    /// other than its home carrier makes it runnable. Meaningful only while it is queued there
    /// (it holds its run reference then, so it is in no other queue).
    pub(crate) inbox_next: crate::loom::AtomicUsize,
    /// The call site of the outermost `vt::uncancellable` section, for dumps.
    pub(crate) shield_at: std::sync::atomic::AtomicPtr<Location<'static>>,
    /// The innermost `vt::timeout` open on the fiber's stack (a list through its frames), or
    /// null. Touched by the fiber only.
    pub(crate) deadlines: Cell<*const stop_state::DeadlineScope>,
}

/// The layout the comments in `FiberRecord` describe, checked when the crate builds: the
/// switch's fields in the first 64 bytes, the coroutine in the next 64, the join's in the
/// third, five lines' worth in all.
#[cfg(not(loom))]
const LAYOUT: () = {
    use std::mem::{offset_of, size_of};
    assert!(offset_of!(FiberRecord, since) + size_of::<u64>() <= 64, "the switch's bytes overflowed");
    assert!(offset_of!(FiberRecord, stop) < 64, "the stop byte left the switch's line");
    assert!(offset_of!(FiberRecord, co) == 64, "the coroutine does not start at 64");
    assert!(offset_of!(FiberRecord, depth) + size_of::<u32>() <= 128, "the coroutine's bytes overflowed");
    assert!(offset_of!(FiberRecord, stage) == 128, "the stage does not start at 128");
    assert!(offset_of!(FiberRecord, stage_kind) < 192, "the join's bytes overflowed");
    assert!(size_of::<FiberRecord>() <= 5 * 64, "the record grew past 320 bytes");
};
// Loom's atomics (the state word's, the inbox link's) are larger: the layout is the real build's.
#[cfg(not(loom))]
const _: () = LAYOUT;

// Why: the `Coroutine` is `!Send` because the data on its stack may be `!Send`. By default a
// started fiber runs only on its home carrier's OS thread, so nothing on its stack ever crosses
// threads; only records move (a record is `Send`: the rest of this comment). With the `unsafe`
// opt-in `migrate_started_fibers`, whoever built the runtime promised that no `!Send` value or
// thread-local borrow is held across a switch point. The `Cell`/`UnsafeCell` fields are touched
// only by [1] the thread currently running the fiber (exclusive by the state machine: a fiber is
// RUNNING on one carrier at a time, and every hand-off goes through the state word or a queue,
// both of which synchronise), [2] `init`, while the record is in no one's hands (refs == 0),
// [3] the join protocol, whose state word orders `waiter` and `stage` (see `join.rs`), or
// [4] the runtime's drop after all carriers have stopped, or [5] the compactor while it holds
// the parked fiber in the `COMPACTING` state (`compact.rs`: it reads `lent` and puts the saved
// stack in the stage; the state word's Acquire/Release hand the fiber over, as to a carrier).
// `id`, `name`, `spawned_at`, `class` and `runtime` are written only in [2] and read-only while
// the record is live.
// SAFETY: by the argument above.
unsafe impl Send for FiberRecord {}
// SAFETY: as above.
unsafe impl Sync for FiberRecord {}

impl std::fmt::Debug for FiberRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fiber")
            .field("id", &self.id())
            .field("name", &self.name())
            .field("spawned_at", &self.spawned_at())
            .field("state", &self.state)
            .finish()
    }
}

/// Where a spawned fiber's description comes from.
pub(crate) struct Init {
    pub(crate) id: FiberId,
    pub(crate) name: Option<Box<str>>,
    pub(crate) spawned_at: &'static Location<'static>,
    /// The fiber's runtime reference, or `None` when the record holds it already (it comes
    /// from a carrier's cache, whose records keep theirs).
    pub(crate) runtime: Option<RuntimeRef>,
    pub(crate) class: &'static SizeClass,
    pub(crate) vtable: &'static StageVTable,
    pub(crate) scope: Option<Arc<scope_data::ScopeData>>,
    /// The coarse clock at spawn (0 with fiber roots off).
    pub(crate) since: u64,
    /// See `FiberRecord::depth`.
    pub(crate) depth: u32,
}

static NO_VTABLE: StageVTable = StageVTable {
    run: |_| unreachable!("an unused record has no closure"),
    fail: |_, _| {},
    drop_result: |_| false,
};

impl FiberRecord {
    /// A blank record, for a pool that ran dry (`Roots::alloc` places it in a slab).
    pub(crate) fn blank(class: &'static SizeClass) -> FiberRecord {
        FiberRecord {
            refs: AtomicUsize::new(0),
            state: StateWord::new(DONE),
            join: AtomicU8::new(0),
            id: Cell::new(FiberId::PLACEHOLDER),
            name: UnsafeCell::new(None),
            spawned_at: Cell::new(Location::caller()),
            runtime: UnsafeCell::new(None),
            class: Cell::new(class),
            co: UnsafeCell::new(None),
            stage: UnsafeCell::new(StageBuf([MaybeUninit::uninit(); STAGE_BYTES])),
            stage_kind: Cell::new(STAGE_EMPTY),
            vtable: Cell::new(&NO_VTABLE),
            waiter: UnsafeCell::new(None),
            scope: UnsafeCell::new(None),
            yielder: Cell::new(std::ptr::null()),
            started: Cell::new(false),
            queued_running: AtomicBool::new(false),
            home: AtomicUsize::new(NO_HOME),
            pin_depth: Cell::new(0),
            timer_gen: AtomicU64::new(0),
            inbox_next: crate::loom::AtomicUsize::new(0),
            cancelled: AtomicBool::new(false),
            stop: AtomicU8::new(0),
            shield: AtomicU16::new(0),
            shield_at: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
            deadlines: Cell::new(std::ptr::null()),
            cancelled_at: AtomicU32::new(0),
            locals: local_map::Locals::default(),
            spawns: Cell::new(0),
            depth: Cell::new(0),
            wait: AtomicU8::new(0),
            since: AtomicU64::new(0),
            carrier: AtomicU32::new(NOT_RUN),
            parked_sp: AtomicUsize::new(0),
            lent: Cell::new(0),
            blocking_depth: Cell::new(0),
            blocking_at: Cell::new(None),
        }
    }

    /// Prepares an unused record (from a pool or `blank`) for a new fiber and returns two
    /// references to it (one for the queue, one for the join handle). A third, the fiber's
    /// reference to itself, lives until the fiber finishes (`release_finished`, `finish_now`): it
    /// keeps a parked fiber that nobody else refers to findable by the roots, so the runtime's
    /// drop can still unwind it. The caller then writes the closure into the stage.
    ///
    /// # Safety
    /// `ptr` must be an unused record: reference count zero, owned by the caller.
    #[inline(always)]
    pub(crate) unsafe fn init(ptr: NonNull<FiberRecord>, init: Init) -> (FiberRef, FiberRef) {
        // SAFETY: unused and owned by the caller: nobody else looks at it.
        let r = unsafe { ptr.as_ref() };
        debug_assert_eq!(r.refs.load(Ordering::Relaxed), 0);
        r.id.set(init.id);
        // No check for an old value on the spawn path: `name` and `scope` are `None` in an
        // unused record (`blank`, and `recycle` takes them), and so is `runtime` unless the
        // record holds its reference already (`Init::runtime`).
        // SAFETY: as above, exclusive; writing over the three drops nothing (see above).
        unsafe {
            debug_assert!((*r.name.get()).is_none() && (*r.scope.get()).is_none());
            debug_assert_eq!((*r.runtime.get()).is_none(), init.runtime.is_some());
            r.name.get().write(init.name);
            if let Some(rt) = init.runtime {
                r.runtime.get().write(Some(rt));
            }
            r.scope.get().write(init.scope);
        }
        r.spawned_at.set(init.spawned_at);
        r.class.set(init.class);
        r.vtable.set(init.vtable);
        // Queued while `RUNNING`, like a yielded fiber: the carrier that pops it runs it
        // without a claim CAS (one locked instruction fewer per fiber; see `try_claim`).
        r.state.reset(RUNNING);
        r.join.store(0, Ordering::Relaxed);
        r.started.set(false);
        r.queued_running.store(true, Ordering::Relaxed);
        r.home.store(NO_HOME, Ordering::Relaxed);
        r.pin_depth.set(0);
        r.cancelled.store(false, Ordering::Relaxed);
        // `shield`, `shield_at` and `deadlines` are back to zero when a fiber ends (their guards
        // run on every path), and `cancelled_at` means something only with `CANCEL` set.
        r.stop.store(0, Ordering::Relaxed);
        debug_assert!(r.shield.load(Ordering::Relaxed) == 0 && r.deadlines.get().is_null());
        r.spawns.set(0);
        r.depth.set(init.depth);
        r.yielder.set(std::ptr::null());
        r.blocking_depth.set(0);
        r.blocking_at.set(None);
        r.wait.store(0, Ordering::Relaxed);
        r.since.store(init.since, Ordering::Relaxed);
        r.carrier.store(NOT_RUN, Ordering::Relaxed);
        // The last incarnation's, else: the carrier prefetches it before a first run, and a
        // stale one may lie in a trimmed stack, costing a page walk for nothing.
        r.parked_sp.store(0, Ordering::Relaxed);
        r.lent.set(0);
        // Release: a dump that upgrades this record (`FiberRef::upgrade`) sees the fields above.
        // One store for all three references: no read-modify-write on the spawn path.
        r.refs.store(3, Ordering::Release);
        (FiberRef(ptr), FiberRef(ptr))
    }

    pub(crate) fn id(&self) -> FiberId {
        self.id.get()
    }

    pub(crate) fn name(&self) -> Option<&str> {
        // SAFETY: written only while the record is unused; read-only while live.
        unsafe { (*self.name.get()).as_deref() }
    }

    pub(crate) fn spawned_at(&self) -> &'static Location<'static> {
        self.spawned_at.get()
    }

    pub(crate) fn runtime(&self) -> &RuntimeRef {
        // SAFETY: set in `init` and cleared only when the record is unused.
        unsafe { (*self.runtime.get()).as_ref() }.expect("a live fiber belongs to a runtime")
    }

    pub(crate) fn class(&self) -> &'static SizeClass {
        self.class.get()
    }

    /// Gives an unused record its runtime's reference, to keep while it waits in a carrier's
    /// cache.
    ///
    /// # Safety
    /// The record is unused (count zero) and the caller's alone, and holds no reference now.
    #[inline(always)]
    pub(crate) unsafe fn set_runtime(&self, rt: RuntimeRef) {
        // SAFETY: exclusive (the caller's contract); `None`, so nothing is dropped unseen.
        unsafe {
            debug_assert!((*self.runtime.get()).is_none());
            self.runtime.get().write(Some(rt));
        }
    }

    /// Takes an unused record's runtime reference, as it leaves a carrier's cache for a
    /// runtime's pool (whose records hold none: they would keep the runtime alive).
    ///
    /// # Safety
    /// The record is unused (count zero) and the caller's alone.
    #[inline(always)]
    pub(crate) unsafe fn take_runtime(&self) -> RuntimeRef {
        // SAFETY: exclusive (the caller's contract).
        unsafe { (*self.runtime.get()).take() }.expect("an unused record out of a cache holds its runtime")
    }

    /// Gives the fiber its coroutine at its first run; or, when `co` is an error (no stack),
    /// drops the closure and completes the fiber's join with that error. Returns false then.
    ///
    /// # Safety
    /// As for [`co_mut`](Self::co_mut).
    #[inline(always)]
    pub(crate) unsafe fn bind(&self, co: std::io::Result<Co>) -> bool {
        debug_assert_eq!(self.stage_kind.get(), STAGE_CLOSURE);
        match co {
            Ok(co) => {
                // SAFETY: exclusive access to `co` (the caller's precondition); it is `None`
                // before the first run, so writing over it drops nothing.
                unsafe {
                    debug_assert!((*self.co.get()).is_none());
                    self.co.get().write(Some(co));
                }
                true
            }
            Err(e) => {
                // SAFETY: as above.
                unsafe { (self.vtable.get().fail)(self, e) };
                false
            }
        }
    }

    /// # Safety
    /// The caller has exclusive access to the fiber: it is about to be queued for the first
    /// time, or the caller is the carrier that popped it.
    #[allow(clippy::mut_from_ref)] // exclusive access is the caller's documented precondition
    pub(crate) unsafe fn co_mut(&self) -> &mut Option<Co> {
        // SAFETY: exclusivity is the caller's precondition.
        unsafe { &mut *self.co.get() }
    }

    pub(crate) fn set_yielder(&self, y: &FiberYielder) {
        self.yielder.set(y);
    }

    /// Switches out to the carrier. Must be called by the fiber itself, while it runs.
    #[inline(never)]
    pub(crate) fn suspend(&self, why: Suspend) {
        // One store, in the frame that switches: everything live on the stack lies above this
        // point, or within `red_zone()` below it (the switch's own pushes). Stored for yields
        // too (read only for parked fibers): a test and a branch would cost more than the store.
        self.parked_sp.store(compact::stack_pointer(), Ordering::Relaxed);
        let y = self.yielder.get();
        debug_assert!(!y.is_null(), "suspend before the fiber started");
        // What the resume passes in is this fiber's own record: only `coroutine::fiber_loop`,
        // between fibers, is resumed for another.
        #[cfg(feature = "tracing")]
        let held = spans::leave();
        // SAFETY: the yielder lives on the coroutine's own stack for the coroutine's whole life
        // (which spans its fibers') and was stored by the fiber when it started; we are that
        // fiber (precondition), so the yielder is live and belongs to the coroutine now running.
        let _ = unsafe { (*y).suspend(why) };
        #[cfg(feature = "tracing")]
        spans::enter_again(held);
    }

    pub(crate) fn state(&self) -> u32 {
        self.state.state()
    }

    /// Claims a queued fiber to run it (`RUNNABLE → RUNNING`, keeping the token; a new or
    /// yielded one is `RUNNING` already). Fails if it is not runnable. Every queue entry is a
    /// fiber that became runnable, so today a claim fails only on a bug; the check keeps such a
    /// bug from running one fiber on two carriers.
    pub(crate) fn try_claim(&self) -> Claim {
        if self.queued_running.load(Ordering::Relaxed) {
            self.queued_running.store(false, Ordering::Relaxed);
            return Claim::Claimed;
        }
        self.state.try_claim()
    }

    /// Carrier side, after the fiber switched out with `Suspend::Yield` and before it is
    /// queued. A yield leaves the state word `RUNNING`: only the queue entry's owner can run
    /// the fiber, as after a claim, and an unpark meanwhile leaves its token as it would on a
    /// `RUNNABLE` fiber. That saves the two locked operations of a round trip through
    /// `RUNNABLE` (a large share of the carrier's switch code: `arch/fiber.md`). A new
    /// fiber starts out the same way (`init`): nobody but its queue entry's owner can run it
    /// either, and an unpark before its first run leaves a token on `RUNNING` as on `RUNNABLE`.
    pub(crate) fn set_yielded(&self) {
        self.queued_running.store(true, Ordering::Relaxed);
    }

    /// Whether it sits in a queue while `RUNNING` (new, or yielded): for dumps, `RUNNING`
    /// then means runnable.
    pub(crate) fn is_queued_running(&self) -> bool {
        self.queued_running.load(Ordering::Relaxed)
    }

    /// See [`StateWord::try_begin_compaction`].
    pub(crate) fn try_begin_compaction(&self) -> bool {
        self.state.try_begin_compaction()
    }

    /// See [`StateWord::end_compaction`].
    pub(crate) fn end_compaction(&self, compacted: bool) -> bool {
        self.state.end_compaction(compacted)
    }

    /// See [`StateWord::take_compacted`].
    pub(crate) fn take_compacted(&self) -> bool {
        self.state.take_compacted()
    }

    /// The whole state word, flags included: the compactor's first look at a record it may
    /// claim (only a word that is exactly `PARKED`). A hint, hence Relaxed: the claim decides.
    pub(crate) fn state_word(&self) -> u32 {
        self.state.load(Ordering::Relaxed)
    }

    /// Carrier side, after the fiber switched out with `Suspend::Park`. Returns false when a
    /// token was waiting: the token is consumed and the fiber must be resumed again.
    pub(crate) fn try_set_parked(&self) -> bool {
        self.state.try_set_parked()
    }

    pub(crate) fn set_done(&self) {
        self.state.set_done()
    }

    /// Marks a fiber finished where no carrier runs it (it could not start, or the runtime's
    /// drop unwound it) and gives up its reference to itself.
    pub(crate) fn finish_now(this: &FiberRef) {
        this.set_done();
        // SAFETY: the self-reference was taken in `init` and is given up once, here or in
        // `release_finished`; `this` is another live reference, so the count stays positive.
        drop(FiberRef(this.0));
    }

    /// Fiber side: consumes the token if there is one.
    pub(crate) fn take_token(&self) -> bool {
        self.state.take_token()
    }

    /// Makes the fiber runnable if it is parked, or leaves a token. Returns true when the
    /// caller must schedule it (the PARKED → RUNNABLE transition is the caller's to finish).
    pub(crate) fn notify(&self) -> bool {
        self.state.notify()
    }

    /// Drops what a record about to be reused still holds in its stage: a result nobody took
    /// (the join and detach paths take or drop it first, so this is rare), or the saved stack
    /// of a fiber that could not be unwound.
    ///
    /// # Safety
    /// No references remain (called from `recycle`).
    #[cold]
    unsafe fn drop_stage(&self) {
        match self.stage_kind.get() {
            STAGE_RESULT => {
                // SAFETY: the stage holds this fiber's result, and nobody else will look at it.
                unsafe { (self.vtable.get().drop_result)(self) };
            }
            // SAFETY: the stage holds a `SavedStack` (its kind says so), ours alone.
            STAGE_SAVED => drop(unsafe { self.take_stage::<compact::SavedStack>() }),
            _ => {}
        }
    }

    /// The last reference is gone: clear what described this fiber and hand the record back
    /// to its runtime's pool.
    ///
    /// The record's pointer alone is passed (not a reference beside it): one register to keep
    /// across the carrier's look-up, not two.
    ///
    /// # Safety
    /// `ptr` is a record whose last counted reference the caller has just given up: unused,
    /// and the caller's alone.
    #[inline(never)]
    unsafe fn recycle(ptr: NonNull<FiberRecord>) {
        // SAFETY: the contract: unused, ours, and allocated (records are freed only with their
        // runtime's state, which the record's reference keeps).
        unsafe { ptr.as_ref().clear() };
        // The pool belongs to the runtime, which the record's reference keeps alive until the
        // end.
        // SAFETY: as above; cleared now.
        unsafe { RuntimeRef::recycle(ptr) };
    }

    /// `recycle`'s first half: clears what described this fiber. Its runtime reference stays:
    /// whoever takes the record back decides what becomes of it.
    ///
    /// # Safety
    /// No counted reference to the record remains: the caller has it alone.
    #[inline(always)]
    unsafe fn clear(&self) {
        // SAFETY: the contract: exclusive access.
        unsafe {
            if let Some(co) = (*self.co.get()).take() {
                // Only a fiber that could not be unwound keeps its coroutine this long; its
                // stack may still be in use by frames that never returned.
                std::mem::forget(co);
            }
            if self.stage_kind.get() != STAGE_EMPTY {
                self.drop_stage();
            }
            // Each is usually `None` by now (no name; the joiner's handle taken by its wake;
            // the scope's taken when it was told): one test for the three, and their drops out
            // of line, so that the recycling's frame needs no registers for them.
            if (*self.name.get()).is_some() | (*self.waiter.get()).is_some() | (*self.scope.get()).is_some() {
                self.drop_description();
            }
        }
        self.vtable.set(&NO_VTABLE);
    }

    /// `clear` found a name, a joiner's handle or a scope still set: drops them.
    ///
    /// # Safety
    /// As for `clear`: no references remain.
    #[cold]
    #[inline(never)]
    unsafe fn drop_description(&self) {
        // SAFETY: exclusive (the caller's contract).
        unsafe {
            *self.name.get() = None;
            *self.waiter.get() = None;
            *self.scope.get() = None;
        }
    }
}
