//! `Shared`: the state every carrier (and every thread that spawns or wakes a fiber) sees, with
//! the part of each carrier that other threads touch (`CarrierSlot`), the counters, the coarse
//! clock, and the shared record pool. Its fields are the scheduler's own: code outside
//! `scheduler/` reads it through a few methods (`config`, `stacks`, `stamp`, `is_shut_down`,
//! `counters`, and the spawn and shutdown paths), so the layout can change behind them. A
//! carrier's life (start, wake, compensate, retire, revive, stop) is in `lifecycle.rs`.

use std::ptr::NonNull;

use std::panic::Location;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering};

use crate::loom::StdMutex as Mutex;
use std::thread::Thread;
use std::time::Instant;

use super::config::Config;
use super::lazy_table::LazyTable;
use crate::fiber::context;
use crate::fiber::stack::SizeClass;
use crate::fiber::{FiberRecord, FiberRef, NO_HOME};
use crate::scheduler::reactor::Reactor;
use crate::scheduler::time::TimerHeap;

use super::queue::idle::Idle;
use super::queue::{inbox, run_queue};
use super::{Injector, Roots, compactor, locations, shutdown};

/// Aligns a value to its own cache line pair (the adjacent-line prefetcher pulls lines in
/// pairs), so per-carrier state is never falsely shared.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct CachePadded<T>(pub(crate) T);

impl<T> std::ops::Deref for CachePadded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The part of a carrier that other threads touch, in four groups of whole line pairs, so that
/// a line one thread writes often is not a line another reads often (a shared line costs two
/// transfers, one per side, and a cross-core transfer 38–391 ns on the project's machine:
/// `arch/performance.md`). `repr(C)` keeps the order; each `LineBreak` starts a new pair.
#[repr(C)]
pub(crate) struct CarrierSlot {
    // 1. Read by other threads, written seldom: at start, by the supervisor, in a trace.
    pub(super) stealer: run_queue::Remote<FiberRef>,
    pub(super) thread: OnceLock<Thread>,
    /// The carrier's trace ring while a trace runs, else null: the one load the wake and spawn
    /// hooks make (`trace/`). The switch tests `TRACING` in `flags` instead.
    pub(super) trace: AtomicPtr<super::trace::Ring>,
    /// `IN_BLOCKING`, `CAUGHT` and `TRACING`, in one word so that a switch out tests all three
    /// with one load (`Carrier::switched_out`; all are rare).
    pub(super) flags: AtomicU8,
    /// A spare carrier parked until compensation needs it again.
    pub(super) retired: AtomicBool,
    /// The carrier thread's kernel id, for `/proc/self/task/<tid>/stat`.
    pub(super) tid: AtomicI32,
    pub(super) locations: locations::LocationMap,
    /// The CPU this carrier is pinned to now, or `NOT_PINNED` (written by the carrier when it
    /// pins itself, then by the supervisor's affinity policy: `affinity.rs`).
    pub(super) cpu: AtomicUsize,
    /// Times the affinity policy let this carrier float off a shared CPU.
    pub(super) floats: AtomicU64,
    _wake: LineBreak,
    // 2. What the carrier reads or writes on every round of its loop and the others touch to
    //    wake it (the inbox, `on_reactor`) or weigh it every `GLOBAL_CHECK_INTERVAL` ticks
    //    (`home_len`): one line for the owner's loop, not two.
    /// Fibers at home here, made runnable by another thread (`inbox.rs`). Not stealable.
    pub(super) inbox: inbox::Inbox<FiberRef>,
    /// The carrier sleeps (or is about to) in `epoll_wait` on its poll set: waking it takes
    /// the set's eventfd. Raised by every idle carrier, and by a retired spare.
    pub(super) on_reactor: AtomicBool,
    /// Fibers in this carrier's private home queue (written by the carrier alone), for the
    /// supervisor and dumps: fibers that only this carrier may run.
    pub(super) home_len: AtomicUsize,
    _timers: LineBreak,
    // 3. The timers: written when they change (a sleep here, a timer fired here or by another
    //    carrier); read by the others every `GLOBAL_CHECK_INTERVAL` ticks (foreign timers).
    pub(super) timers: Mutex<TimerHeap>,
    /// Earliest deadline in `timers`, in ns since the runtime's epoch (`u64::MAX`: none).
    pub(super) next_deadline: AtomicU64,
    _own: LineBreak,
    // 4. Written by this carrier at every switch or event; read by the supervisor every
    //    interval, by `Runtime::metrics`, by a compensating carrier, and by a placing one every
    //    64 first starts (`stats.started`, `stats.finished`: `carrier/place.rs`).
    /// Bumped by the carrier at every fiber switch (single writer); the supervisor samples it.
    pub(super) progress: AtomicU64,
    /// Location of the fiber running now (its spawn site, or its `blocking` call site), or null
    /// between fibers. Written by the carrier at every switch; sampled by the supervisor.
    pub(super) location: AtomicPtr<Location<'static>>,
    /// The fiber this carrier runs next (a `FiberRef` as a raw pointer, or null). Only the
    /// owner puts fibers here; a compensating carrier may take one out of a blocked owner.
    pub(super) lifo: AtomicPtr<FiberRecord>,
    /// Scheduling counters, written by this carrier alone (summed by `Runtime::metrics`).
    pub(super) stats: Stats,
}

/// A zero-sized field that starts the next group of a `repr(C)` struct on a new line pair.
#[derive(Default)]
#[repr(align(128))]
struct LineBreak;

/// `CarrierSlot::flags`: the fiber running here declared (or is known) to block its thread;
/// the carrier counts itself in `Shared::blocked` while this is set.
pub(super) const IN_BLOCKING: u8 = 1;
/// `CarrierSlot::flags`: set by the supervisor when it catches this carrier blocked; the
/// carrier records the location in its map when the fiber switches out, and clears it.
pub(super) const CAUGHT: u8 = 2;
/// `CarrierSlot::flags`: a trace runs (`trace` is set): the switch out records the slice in
/// its cold path, so a switch pays nothing more for the trace while none runs (ADR 0013).
pub(super) const TRACING: u8 = 4;

impl CarrierSlot {
    pub(super) fn in_blocking(&self, order: Ordering) -> bool {
        self.flags.load(order) & IN_BLOCKING != 0
    }

    /// Blocked in the OS, by its own count or the supervisor's catch.
    pub(super) fn held(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & (IN_BLOCKING | CAUGHT) != 0
    }

    /// The supervisor caught the carrier blocked (see `CAUGHT`).
    pub(super) fn catch(&self) {
        self.flags.fetch_or(CAUGHT, Ordering::Release);
    }

    /// The carrier's trace ring, while a trace runs: each trace hook's one branch.
    #[inline(always)]
    pub(super) fn tracing(&self) -> Option<&super::trace::Ring> {
        let p = self.trace.load(Ordering::Relaxed);
        // SAFETY: a non-null pointer is a ring the recorder keeps until the runtime's state
        // (which holds this slot) is dropped (`Recorder::start`, `attach`).
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// Points the carrier at its trace ring (`Recorder::start`, `attach`), or at none (`stop`).
    /// The ring before the bit: the switch's cold path reads the ring once it sees the bit.
    pub(super) fn set_trace(&self, ring: *mut super::trace::Ring) {
        self.trace.store(ring, Ordering::Release);
        if ring.is_null() {
            self.flags.fetch_and(!TRACING, Ordering::Release);
        } else {
            self.flags.fetch_or(TRACING, Ordering::Release);
        }
    }

    pub(super) fn new(stealer: run_queue::Remote<FiberRef>) -> CarrierSlot {
        CarrierSlot {
            stealer,
            inbox: inbox::Inbox::new(),
            home_len: AtomicUsize::new(0),
            timers: Mutex::new(TimerHeap::default()),
            next_deadline: AtomicU64::new(u64::MAX),
            thread: OnceLock::new(),
            progress: AtomicU64::new(0),
            trace: AtomicPtr::new(std::ptr::null_mut()),
            on_reactor: AtomicBool::new(false),
            lifo: AtomicPtr::new(std::ptr::null_mut()),
            location: AtomicPtr::new(std::ptr::null_mut()),
            flags: AtomicU8::new(0),
            tid: AtomicI32::new(0),
            locations: locations::LocationMap::default(),
            retired: AtomicBool::new(false),
            cpu: AtomicUsize::new(NOT_PINNED),
            floats: AtomicU64::new(0),
            stats: Stats::default(),
            _wake: LineBreak,
            _timers: LineBreak,
            _own: LineBreak,
        }
    }
}

/// One carrier's counters. Single writer (the carrier), so a bump is a load and a store, not a
/// locked instruction; readers sum them with relaxed loads and never disturb the carrier.
#[derive(Default)]
pub(crate) struct Stats {
    pub(super) spawned: AtomicU64,
    /// Fibers whose first run was here (their home, unless migration is on).
    pub(super) started: AtomicU64,
    pub(super) finished: AtomicU64,
    pub(super) parks: AtomicU64,
    pub(super) unparks: AtomicU64,
    pub(super) steals: AtomicU64,
    pub(super) injector_pushes: AtomicU64,
    pub(super) injector_pops: AtomicU64,
    /// Fibers about to start that this carrier placed on another by load (`carrier/place.rs`).
    pub(super) placed: AtomicU64,
    pub(super) timer_wakeups: AtomicU64,
    pub(super) io_wakeups: AtomicU64,
    pub(super) idle_ns: AtomicU64,
    pub(super) stack_hits: AtomicU64,
    pub(super) stack_misses: AtomicU64,
    /// Compacted stacks this carrier copied back, and their bytes.
    pub(super) restores: AtomicU64,
    pub(super) restored_bytes: AtomicU64,
}

/// Adds `n` to a single-writer counter.
#[inline]
pub(crate) fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// Counters of work that came from outside the carriers (plain threads, the runtime's drop):
/// rare paths, so shared atomics are fine here.
#[derive(Default)]
pub(crate) struct RemoteStats {
    pub(super) spawned: AtomicU64,
    pub(super) finished: AtomicU64,
    pub(super) unparks: AtomicU64,
    pub(super) injector_pushes: AtomicU64,
    pub(super) restores: AtomicU64,
    pub(super) restored_bytes: AtomicU64,
}

/// The runtime's coarse clock for dumps: nanoseconds since the epoch, refreshed by the
/// supervisor every interval and by a carrier when it wakes, so stamping a fiber's state costs
/// one load of a line that is written ~100 times a second, not a clock read.
pub(crate) struct Clock {
    ns: AtomicU64,
    /// `config.fiber_roots`: whether anything advances `ns`.
    pub(crate) on: bool,
}

impl Clock {
    /// The clock, which reads 0 while roots are off: nothing advances it then (every writer
    /// tests `on` first), so a stamp is one load without a test of `on`, and a fiber stamped
    /// with it keeps the 0 it was spawned with.
    #[inline]
    pub(crate) fn stamp(&self) -> u64 {
        self.ns.load(Ordering::Relaxed)
    }
}

/// State shared by a runtime's carriers and by everyone who schedules onto it.
///
/// Its six mutexes, and the order in which a thread may hold them (outer first; nothing not
/// listed after a lock is ever taken while it is held):
///
/// ```text
///  threads ──► unstarted                  start_carrier registers the thread it spawns
///  slots[i].timers ──► records            a fired or cleared timer entry may drop a record's
///        │                                last reference (`runtime_ref::recycle_record`)
///        └──► spares, and the leaf locks   `time::fire` schedules what it wakes under the lock:
///             of the injector shards and   the fiber's home inbox may revive a spare, a full
///             `Idle::sleepers`             deque spills, a sleeping carrier is woken
///  records ──► the roots' shards, slabs    `alloc_record` carves a new slab under it
///  spares, known                          leaves: nothing is taken while they are held
/// ```
/// The drop's `Drain` state (`shutdown.rs`) is a leaf too: it is let go before any fiber is
/// unwound.
pub(crate) struct Shared {
    /// Counted references (see [`RuntimeRef`]; `runtime_ref.rs` counts them).
    pub(super) refs: AtomicUsize,
    pub(super) config: Config,
    /// Made in chunks as carriers start (`lazy_table.rs`): `max_carriers` may be large.
    pub(super) slots: LazyTable<CachePadded<CarrierSlot>>,
    pub(super) injector: Injector,
    pub(super) idle: Idle,
    pub(super) roots: Roots,
    pub(super) clock: CachePadded<Clock>,
    pub(super) remote: CachePadded<RemoteStats>,
    /// The compactor's counters (written by the supervisor only).
    pub(super) compaction: CachePadded<compactor::CompactionStats>,
    pub(super) shutdown: AtomicBool,
    /// The drop's hand-over of fibers to unwind on their home carriers (`shutdown.rs`).
    pub(super) drain: shutdown::Drain,
    pub(super) epoch: Instant,
    pub(super) stacks: &'static SizeClass,
    pub(super) reactor: Reactor,
    /// Carriers the runtime aims to have running fibers (`config.carriers`).
    pub(super) target: usize,
    /// Slots `0..started` have (or had) a thread.
    pub(super) started: AtomicUsize,
    /// Carriers not retired.
    pub(super) active: AtomicUsize,
    /// Carriers blocked in the OS (detected by the supervisor or declared by `blocking`).
    pub(super) blocked: AtomicUsize,
    pub(super) peak: AtomicUsize,
    pub(super) detections: AtomicU64,
    pub(super) compensations: AtomicU64,
    /// Retired spare carriers, parked, to reuse before starting new threads.
    pub(super) spares: Mutex<Vec<usize>>,
    /// The deques of slots made that have no thread yet (`None`: started); slots past its end
    /// are not made.
    pub(super) unstarted: Mutex<Vec<Option<run_queue::Local<FiberRef>>>>,
    /// Carrier threads to join at shutdown.
    pub(super) threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    pub(super) supervisor_thread: OnceLock<Thread>,
    pub(super) supervisor_sleeping: AtomicBool,
    pub(super) known: Mutex<Vec<locations::Known>>,
    /// Unused fiber records, beyond what the carriers cache.
    pub(super) records: Mutex<Vec<RecordPtr>>,
    /// The execution trace's recorder (`trace/`).
    pub(super) trace: super::trace::Recorder,
}

/// An unused fiber record in a pool.
pub(crate) struct RecordPtr(pub(crate) NonNull<FiberRecord>);

// SAFETY: an unused record is owned by the pool that holds it, and `FiberRecord` is `Send`.
unsafe impl Send for RecordPtr {}

/// `CarrierSlot::cpu` of a carrier that may run on any CPU.
pub(crate) const NOT_PINNED: usize = usize::MAX;

/// Records a carrier caches before handing half to the shared pool.
pub(crate) const RECORD_CACHE: usize = 256;

impl Drop for Shared {
    fn drop(&mut self) {
        // The roots own every record; the pools only point into them.
        self.records.get_mut().unwrap_or_else(|e| e.into_inner()).clear();
        self.roots.free_all();
    }
}

impl Shared {
    /// The settings the runtime was built with.
    #[inline]
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// The size class of the runtime's default stacks.
    #[inline]
    pub(crate) fn stacks(&self) -> &'static SizeClass {
        self.stacks
    }

    /// The coarse clock, to stamp a new fiber's state with; 0 when fiber roots are off.
    #[inline]
    pub(crate) fn stamp(&self) -> u64 {
        self.clock.stamp()
    }

    /// Whether the runtime's drop has begun (`begin_shutdown`). SeqCst, against that store:
    /// see the callers.
    #[inline]
    pub(crate) fn is_shut_down(&self) -> bool {
        self.shutdown.load(Ordering::SeqCst)
    }

    /// Room for `config.max_carriers` carrier slots, and their reactor; no slot is made and no
    /// thread started yet (a slot is made, in a chunk of 64, and a carrier opens its poll set,
    /// when it starts: `LazyTable`).
    pub(crate) fn new(config: Config) -> Shared {
        let reactor = Reactor::new(config.max_carriers);
        let n = config.carriers;
        let stacks = SizeClass::get(config.stack_size);
        Shared {
            refs: AtomicUsize::new(0),
            slots: LazyTable::new(config.max_carriers),
            injector: Injector::new(n),
            idle: Idle::new(n),
            roots: Roots::new(config.max_carriers),
            clock: CachePadded(Clock { ns: AtomicU64::new(0), on: config.fiber_roots }),
            remote: CachePadded(RemoteStats::default()),
            compaction: CachePadded(Default::default()),
            shutdown: AtomicBool::new(false),
            drain: Default::default(),
            epoch: Instant::now(),
            stacks,
            config,
            records: Mutex::new(Vec::new()),
            trace: Default::default(),
            reactor,
            target: n,
            started: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            blocked: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            detections: AtomicU64::new(0),
            compensations: AtomicU64::new(0),
            spares: Mutex::new(Vec::new()),
            unstarted: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            supervisor_thread: OnceLock::new(),
            supervisor_sleeping: AtomicBool::new(false),
            known: Mutex::new(Vec::new()),
        }
    }

    /// Slots `0..started()` have had a thread; the others are empty.
    pub(crate) fn started(&self) -> usize {
        self.started.load(Ordering::Acquire)
    }

    /// An unused record from the shared pool, or a new one.
    pub(crate) fn alloc_record(&self) -> NonNull<FiberRecord> {
        let mut pool = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = pool.pop() {
            return r.0;
        }
        let mut spares = Vec::new();
        let r = self.roots.alloc(self.roots.outside(), self.stacks, &mut spares);
        pool.extend(spares.into_iter().map(RecordPtr));
        r
    }

    /// Moves up to `n` pooled records into a carrier's cache.
    pub(crate) fn take_records(&self, into: &mut Vec<NonNull<FiberRecord>>, n: usize) {
        let mut pool = self.records.lock().unwrap_or_else(|e| e.into_inner());
        let k = pool.len().min(n);
        let start = pool.len() - k;
        into.extend(pool.drain(start..).map(|r| r.0));
    }

    /// Returns unused records to the shared pool.
    pub(crate) fn give_records(&self, records: impl Iterator<Item = NonNull<FiberRecord>>) {
        self.records.lock().unwrap_or_else(|e| e.into_inner()).extend(records.map(RecordPtr));
    }

    /// Nanoseconds since this runtime's epoch (0 for instants before it).
    pub(crate) fn ns_since_epoch(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos().min(u64::MAX as u128 - 1) as u64
    }

    /// Refreshes the coarse clock (never moving it back).
    pub(crate) fn tick_clock(&self) {
        if self.clock.on {
            self.clock.ns.fetch_max(self.ns_since_epoch(Instant::now()), Ordering::Relaxed);
        }
    }

    /// A carrier woke from idle: if the supervisor slept too, the coarse clock is stale; bring
    /// it forward. Only then: carriers writing the clock line at every wake made it bounce
    /// between them (measured: `arch/diagnostics.md`).
    pub(crate) fn refresh_clock_after_idle(&self, now: Instant) {
        if !self.clock.on {
            return;
        }
        let now = self.ns_since_epoch(now);
        let stale = 2 * self.config.supervisor_interval.as_nanos() as u64;
        if self.clock.ns.load(Ordering::Relaxed).saturating_add(stale) < now {
            self.clock.ns.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// Queues a new fiber spawned from a thread that is not one of this runtime's carriers (or
    /// from a carrier of another runtime).
    pub(crate) fn schedule_spawned_remote(&self, rec: FiberRef) {
        self.remote.spawned.fetch_add(1, Ordering::Relaxed);
        self.trace_spawn_remote(&rec);
        self.queue_new(rec, |f| self.schedule_remote(f));
    }

    /// A new fiber that must start on carrier `index` (`vt::Builder::carrier`): homed there
    /// before it is queued, so that only that carrier takes it (its inbox is not stolen from,
    /// and a fiber with a home is not handed to a spare). From any thread, a carrier of this
    /// runtime or not.
    pub(crate) fn schedule_spawned_on(&self, index: usize, rec: FiberRef) {
        debug_assert!(index < self.target && !rec.started.get());
        self.remote.spawned.fetch_add(1, Ordering::Relaxed);
        self.trace_spawn_remote(&rec);
        rec.home.store(index, Ordering::Relaxed);
        self.queue_new(rec, |f| self.push_inbox(index, f));
    }

    /// Queues a new fiber with `queue`, unless the runtime's drop has begun.
    fn queue_new(&self, rec: FiberRef, queue: impl FnOnce(FiberRef)) {
        // SeqCst, against the drop's store: a spawn through a handle that sees `shutdown`
        // unwinds the fiber itself (never queued, so never started: any thread will do), so its
        // join returns. One queued is unwound by the drop (`cancel_all`, or `drain_queues`),
        // unless it was queued after the drop emptied the queues: then nothing else will touch
        // it, and it is unwound here. Not on seeing `shutdown` after the push: a carrier that had
        // not stopped yet may have taken the fiber and be running it (its coroutine was taken
        // from under it: a drop by a thread that the new fiber spawned and joined).
        if self.is_shut_down() {
            shutdown::cancel(rec);
        } else {
            let again = rec.clone();
            queue(rec);
            if self.drain.queues_orphaned() {
                shutdown::cancel(again);
            }
        }
    }

    /// Makes a fiber runnable from a thread that is not one of this runtime's carriers.
    pub(crate) fn schedule_remote(&self, f: FiberRef) {
        if self.clock.on {
            self.tick_clock();
            f.since.store(self.clock.ns.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        let home = f.home.load(Ordering::Relaxed);
        if home != NO_HOME {
            self.push_inbox(home, f);
            return;
        }
        self.remote.injector_pushes.fetch_add(1, Ordering::Relaxed);
        let shard = context::with_plain(|p| {
            if p.shard == usize::MAX {
                // Spread plain threads over the shards by their thread id's hash.
                p.shard = thread_hash() % self.injector.shards();
            }
            p.shard
        });
        self.injector.push(shard, f);
        self.notify();
    }

    /// Queues a fiber that must run on carrier `index` and wakes that carrier if it sleeps.
    pub(crate) fn push_inbox(&self, index: usize, f: FiberRef) {
        self.slots[index].inbox.push(f);
        if index >= self.target && self.revive(index) {
            return;
        }
        if self.idle.notify_carrier(index) {
            self.unpark_carrier(index);
        }
    }

    /// Earliest timer deadline over all carriers (ns since epoch), or `u64::MAX`.
    pub(crate) fn earliest_deadline(&self) -> u64 {
        self.slots
            .upto(self.started())
            .map(|s| s.next_deadline.load(Ordering::Relaxed))
            .min()
            .unwrap_or(u64::MAX)
    }
}

/// A per-thread value for picking a shard: the address of a stack slot (threads' stacks are
/// megabytes apart), mixed. Touches nothing shared.
fn thread_hash() -> usize {
    let probe = 0u8;
    let a = std::hint::black_box(&probe) as *const u8 as usize as u64;
    ((a >> 12).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize
}
