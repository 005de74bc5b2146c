//! `Shared`: the state every carrier (and every thread that spawns or wakes a fiber) sees, with
//! the part of each carrier that other threads touch (`CarrierSlot`), the counters, the coarse
//! clock, and the shared record pool. Starting, retiring and reviving carriers and waking them
//! are here too: they change this state under its locks.

use std::ptr::NonNull;

use std::panic::Location;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::Thread;
use std::time::Instant;

use super::config::Config;
use crate::fiber::context;
use crate::fiber::stack::SizeClass;
use crate::fiber::{FiberRecord, FiberRef, NO_HOME};
use crate::scheduler::reactor::Reactor;
use crate::scheduler::time::TimerHeap;

use crate::fiber::schedule::RuntimeRef;

use super::{Idle, Injector, Roots, carrier, compactor, inbox, locations, run_queue, shutdown, supervisor};

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

/// The part of a carrier that other threads touch.
pub(crate) struct CarrierSlot {
    pub(crate) stealer: run_queue::Remote<FiberRef>,
    /// Fibers at home here, made runnable by another thread (`inbox.rs`). Not stealable.
    pub(crate) inbox: inbox::Inbox<FiberRef>,
    /// Fibers in this carrier's private home queue (written by the carrier alone), for the
    /// supervisor and dumps: fibers that only this carrier may run.
    pub(crate) home_len: AtomicUsize,
    pub(crate) timers: Mutex<TimerHeap>,
    /// Earliest deadline in `timers`, in ns since the runtime's epoch (`u64::MAX`: none).
    pub(crate) next_deadline: AtomicU64,
    pub(crate) thread: OnceLock<Thread>,
    /// Bumped by the carrier at every fiber switch (single writer); the supervisor samples it.
    pub(crate) progress: AtomicU64,
    /// The carrier sleeps (or is about to) in `epoll_wait` on its poll set: waking it takes
    /// the set's eventfd. Raised by every idle carrier, and by a retired spare.
    pub(crate) on_reactor: AtomicBool,
    /// The fiber this carrier runs next (a `FiberRef` as a raw pointer, or null). Only the
    /// owner puts fibers here; a compensating carrier may take one out of a blocked owner.
    pub(crate) lifo: AtomicPtr<FiberRecord>,
    /// Location of the fiber running now (its spawn site, or its `blocking` call site), or null
    /// between fibers. Written by the carrier at every switch; sampled by the supervisor.
    pub(crate) location: AtomicPtr<Location<'static>>,
    /// The fiber running here declared (or is known) to block its thread; the carrier counts
    /// itself in `Shared::blocked` while this is set.
    pub(crate) in_blocking: AtomicBool,
    /// Set by the supervisor when it catches this carrier blocked; the carrier records the
    /// location in its map when the fiber switches out, and clears it.
    pub(crate) caught: AtomicBool,
    /// The carrier thread's kernel id, for `/proc/self/task/<tid>/stat`.
    pub(crate) tid: AtomicI32,
    pub(crate) locations: locations::LocationMap,
    /// A spare carrier parked until compensation needs it again.
    pub(crate) retired: AtomicBool,
    /// The CPU this carrier is pinned to now, or `NOT_PINNED` (written by the carrier when it
    /// pins itself, then by the supervisor's affinity policy: `affinity.rs`).
    pub(crate) cpu: AtomicUsize,
    /// Times the affinity policy let this carrier float off a shared CPU.
    pub(crate) floats: AtomicU64,
    /// Scheduling counters, written by this carrier alone (summed by `Runtime::metrics`).
    pub(crate) stats: Stats,
}

/// One carrier's counters. Single writer (the carrier), so a bump is a load and a store, not a
/// locked instruction; readers sum them with relaxed loads and never disturb the carrier.
#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) spawned: AtomicU64,
    /// Fibers whose first run was here (their home, unless migration is on).
    pub(crate) started: AtomicU64,
    pub(crate) finished: AtomicU64,
    pub(crate) parks: AtomicU64,
    pub(crate) unparks: AtomicU64,
    pub(crate) steals: AtomicU64,
    pub(crate) injector_pushes: AtomicU64,
    pub(crate) injector_pops: AtomicU64,
    pub(crate) timer_wakeups: AtomicU64,
    pub(crate) io_wakeups: AtomicU64,
    pub(crate) idle_ns: AtomicU64,
    pub(crate) stack_hits: AtomicU64,
    pub(crate) stack_misses: AtomicU64,
    /// Compacted stacks this carrier copied back, and their bytes.
    pub(crate) restores: AtomicU64,
    pub(crate) restored_bytes: AtomicU64,
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
    pub(crate) spawned: AtomicU64,
    pub(crate) finished: AtomicU64,
    pub(crate) unparks: AtomicU64,
    pub(crate) injector_pushes: AtomicU64,
    pub(crate) restores: AtomicU64,
    pub(crate) restored_bytes: AtomicU64,
}

/// The runtime's coarse clock for dumps: nanoseconds since the epoch, refreshed by the
/// supervisor every interval and by a carrier when it wakes, so stamping a fiber's state costs
/// one load of a line that is written ~100 times a second, not a clock read.
pub(crate) struct Clock {
    ns: AtomicU64,
    /// `config.fiber_roots`, beside the clock so a stamp reads one line.
    pub(crate) on: bool,
}

impl Clock {
    /// The clock when roots are on, else 0 (callers skip the store then).
    #[inline]
    pub(crate) fn stamp(&self) -> Option<u64> {
        self.on.then(|| self.ns.load(Ordering::Relaxed))
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
    pub(crate) config: Config,
    pub(crate) slots: Box<[CachePadded<CarrierSlot>]>,
    pub(crate) injector: Injector,
    pub(crate) idle: Idle,
    pub(crate) roots: Roots,
    pub(crate) clock: CachePadded<Clock>,
    pub(crate) remote: CachePadded<RemoteStats>,
    /// The compactor's counters (written by the supervisor only).
    pub(crate) compaction: CachePadded<compactor::CompactionStats>,
    pub(crate) shutdown: AtomicBool,
    /// The drop's hand-over of fibers to unwind on their home carriers (`shutdown.rs`).
    pub(crate) drain: shutdown::Drain,
    pub(crate) epoch: Instant,
    pub(crate) stacks: &'static SizeClass,
    pub(crate) reactor: Reactor,
    /// Carriers the runtime aims to have running fibers (`config.carriers`).
    pub(crate) target: usize,
    /// Slots `0..started` have (or had) a thread.
    started: AtomicUsize,
    /// Carriers not retired.
    pub(crate) active: AtomicUsize,
    /// Carriers blocked in the OS (detected by the supervisor or declared by `blocking`).
    pub(crate) blocked: AtomicUsize,
    pub(crate) peak: AtomicUsize,
    pub(crate) detections: AtomicU64,
    pub(crate) compensations: AtomicU64,
    /// Retired spare carriers, parked, to reuse before starting new threads.
    spares: Mutex<Vec<usize>>,
    /// The deques of slots that have no thread yet.
    unstarted: Mutex<Vec<Option<run_queue::Local<FiberRef>>>>,
    /// Carrier threads to join at shutdown.
    pub(crate) threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    pub(crate) supervisor_thread: OnceLock<Thread>,
    pub(crate) supervisor_sleeping: AtomicBool,
    pub(crate) known: Mutex<Vec<supervisor::Known>>,
    /// Unused fiber records, beyond what the carriers cache.
    pub(super) records: Mutex<Vec<RecordPtr>>,
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
    /// State for `config.max_carriers` carrier slots, and their reactor; no thread is started
    /// yet (a carrier opens its poll set when it starts).
    pub(crate) fn new(config: Config) -> Shared {
        let reactor = Reactor::new(config.max_carriers);
        let n = config.carriers;
        let (workers, stealers): (Vec<_>, Vec<_>) =
            (0..config.max_carriers).map(|_| run_queue::new(run_queue::CAPACITY)).unzip();
        let stacks = SizeClass::get(config.stack_size);
        Shared {
            refs: AtomicUsize::new(0),
            slots: stealers
                .into_iter()
                .map(|stealer| {
                    CachePadded(CarrierSlot {
                        stealer,
                        inbox: inbox::Inbox::new(),
                        home_len: AtomicUsize::new(0),
                        timers: Mutex::new(TimerHeap::default()),
                        next_deadline: AtomicU64::new(u64::MAX),
                        thread: OnceLock::new(),
                        progress: AtomicU64::new(0),
                        on_reactor: AtomicBool::new(false),
                        lifo: AtomicPtr::new(std::ptr::null_mut()),
                        location: AtomicPtr::new(std::ptr::null_mut()),
                        in_blocking: AtomicBool::new(false),
                        caught: AtomicBool::new(false),
                        tid: AtomicI32::new(0),
                        locations: locations::LocationMap::default(),
                        retired: AtomicBool::new(false),
                        cpu: AtomicUsize::new(NOT_PINNED),
                        floats: AtomicU64::new(0),
                        stats: Stats::default(),
                    })
                })
                .collect(),
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
            reactor,
            target: n,
            started: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
            blocked: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            detections: AtomicU64::new(0),
            compensations: AtomicU64::new(0),
            spares: Mutex::new(Vec::new()),
            unstarted: Mutex::new(workers.into_iter().map(Some).collect()),
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

    /// Starts the carrier thread of slot `i` (its deque waits in `unstarted`), unless the
    /// runtime is shutting down.
    ///
    /// The spawn and the registration of the thread for the drop to join happen under the
    /// `threads` lock, after a look at `shutdown` under it too. The drop sets `shutdown`, then
    /// takes the threads to join under that lock, so a carrier either is in what it takes or
    /// is never started. Registered outside the lock, a carrier that a fiber's `vt::blocking`
    /// started could come just after the drop took the list: never joined, it kept running
    /// fibers while the drop unwound the others, and whatever it held when it stopped was
    /// never unwound (found by `tests/stress.rs`; `arch/reliability.md`, bug 10).
    pub(crate) fn start_carrier(
        &self,
        i: usize,
        core: Option<crate::platform::CoreId>,
    ) -> std::io::Result<()> {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        if self.shutdown.load(Ordering::Acquire) {
            // The drop has taken (or will take) the threads to join: start nothing more. The
            // fibers this would have run are unwound by the drop.
            return Ok(());
        }
        let Some(worker) = self.unstarted.lock().unwrap_or_else(|e| e.into_inner())[i].take() else {
            // Another thread compensating at the same time started this slot first: the
            // caller's loop sees the new carrier in `active` and stops.
            return Ok(());
        };
        // Before the thread exists: a fiber on it may register a socket with its set at once.
        if let Err(e) = self.reactor.open(i) {
            // Put the deque back, so that a later attempt can start the slot.
            self.unstarted.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(worker);
            return Err(e);
        }
        // SAFETY: the caller holds a reference to this runtime (we are inside it), so the count
        // is positive and the new reference is sound.
        let rt = unsafe { RuntimeRef::from_shared(self) };
        let name = format!("{}-{i}", self.config.thread_name);
        self.active.fetch_add(1, Ordering::AcqRel);
        self.started.fetch_max(i + 1, Ordering::AcqRel);
        // Counted as a searcher until its loop runs (`Idle::start_searching`); `Carrier::run`
        // starts with `searching` set, so its first search or sleep ends it.
        self.idle.start_searching();
        let spawned = std::thread::Builder::new().name(name).spawn(move || {
            match core {
                // Not fatal: a carrier that cannot be pinned still runs fibers.
                Some(c) if crate::platform::pin_to(c) => rt.slots[i].cpu.store(c.id, Ordering::Relaxed),
                Some(_) => {}
                // A spare started by a pinned carrier would inherit its one CPU.
                None => crate::platform::thread::unpin_current(),
            }
            rt.slots[i].thread.get_or_init(std::thread::current);
            rt.slots[i].tid.store(crate::platform::gettid(), Ordering::Relaxed);
            carrier::Carrier::run(i, rt, worker);
        });
        #[cfg(test)]
        super::test_hooks::carrier_spawned(self, i);
        match spawned {
            Ok(t) => {
                threads.push(t);
                drop(threads);
                self.peak.fetch_max(self.active.load(Ordering::Relaxed), Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.active.fetch_sub(1, Ordering::AcqRel);
                self.idle.stop_search();
                Err(e)
            }
        }
    }

    /// Makes sure `target` carriers can run fibers while some are blocked: wakes a retired
    /// spare, or starts a new carrier, within `max_carriers`.
    pub(crate) fn compensate(&self) {
        loop {
            let active = self.active.load(Ordering::Acquire);
            let blocked = self.blocked.load(Ordering::Acquire);
            if active.saturating_sub(blocked) >= self.target
                || active >= self.config.max_carriers
                || self.shutdown.load(Ordering::Acquire)
            {
                return;
            }
            let spare = self.spares.lock().unwrap_or_else(|e| e.into_inner()).pop();
            if let Some(i) = spare {
                self.active.fetch_add(1, Ordering::AcqRel);
                self.slots[i].retired.store(false, Ordering::Release);
                self.unpark_carrier(i);
            } else {
                let next = {
                    let u = self.unstarted.lock().unwrap_or_else(|e| e.into_inner());
                    u.iter().position(Option::is_some)
                };
                match next {
                    Some(i) if self.start_carrier(i, None).is_ok() => {}
                    // Out of slots or threads: nothing more to do.
                    _ => return,
                }
            }
            self.compensations.fetch_add(1, Ordering::Relaxed);
            self.peak.fetch_max(self.active.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// A carrier of its own for a fiber from a known-blocking spawn site, which is about to
    /// start on a regular carrier: a retired spare woken, or a new carrier started, within
    /// `max_carriers`. `None` when the bound is reached (or the runtime stops): the fiber then
    /// runs where it is and is compensated for, as before.
    ///
    /// Why: a started fiber stays on its home carrier, so a fiber that blocks its carrier holds
    /// up every fiber at home there for as long as it blocks; compensation can move only
    /// unstarted fibers. Starting the blocker elsewhere (placing an unstarted fiber is free)
    /// leaves its spawner's carrier, and the fibers at home on it, running.
    pub(crate) fn carrier_for_blocking(&self) -> Option<usize> {
        if self.shutdown.load(Ordering::Acquire)
            || self.active.load(Ordering::Acquire) >= self.config.max_carriers
        {
            return None;
        }
        let spare = self.spares.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let i = match spare {
            Some(i) => {
                self.active.fetch_add(1, Ordering::AcqRel);
                self.slots[i].retired.store(false, Ordering::Release);
                self.unpark_carrier(i);
                i
            }
            None => {
                let next = {
                    let u = self.unstarted.lock().unwrap_or_else(|e| e.into_inner());
                    u.iter().position(Option::is_some)?
                };
                self.start_carrier(next, None).ok()?;
                // Another thread may have taken that slot first; then it is started all the same.
                if next >= self.started() {
                    return None;
                }
                next
            }
        };
        self.compensations.fetch_add(1, Ordering::Relaxed);
        self.peak.fetch_max(self.active.load(Ordering::Relaxed), Ordering::Relaxed);
        Some(i)
    }

    /// A spare carrier with nothing to do while enough others run: retire it (park it as a
    /// spare) unless that would leave fewer than `target` unblocked carriers.
    pub(crate) fn try_retire(&self, i: usize) -> bool {
        let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        // Fibers in its inbox are at home on it: they may run nowhere else (see `revive`).
        if !self.slots[i].inbox.is_empty() {
            return false;
        }
        let mut active = self.active.load(Ordering::Acquire);
        loop {
            let blocked = self.blocked.load(Ordering::Acquire);
            if active.saturating_sub(blocked) <= self.target {
                return false;
            }
            match self.active.compare_exchange(active, active - 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(a) => active = a,
            }
        }
        self.slots[i].retired.store(true, Ordering::Release);
        spares.push(i);
        true
    }

    /// More carriers run than the target now that a block ended: wake one sleeping spare so it
    /// retires (a busy spare retires by itself between fibers).
    pub(crate) fn shrink(&self) {
        let surplus =
            self.active.load(Ordering::Acquire).saturating_sub(self.blocked.load(Ordering::Acquire));
        if surplus <= self.target {
            return;
        }
        for i in self.target..self.started() {
            if !self.slots[i].retired.load(Ordering::Acquire) && self.idle.notify_carrier(i) {
                self.unpark_carrier(i);
                return;
            }
        }
    }

    /// A carrier became busy: if the supervisor sleeps (every carrier was idle), wake it.
    pub(crate) fn supervisor_wake(&self) {
        // SeqCst pairs with `supervisor::sleep_until_work`.
        if self.supervisor_sleeping.load(Ordering::SeqCst) {
            if let Some(t) = self.supervisor_thread.get() {
                t.unpark();
            }
        }
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

    /// Brings back a retired spare carrier that has work only it may run (a fiber pinned to it
    /// woke). Under the `spares` lock, which orders it with `try_retire`'s inbox check: either
    /// this finds the spare retired, or the spare sees the work and does not retire.
    pub(crate) fn revive(&self, i: usize) -> bool {
        let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        let Some(pos) = spares.iter().position(|&s| s == i) else { return false };
        spares.swap_remove(pos);
        self.active.fetch_add(1, Ordering::AcqRel);
        self.slots[i].retired.store(false, Ordering::Release);
        drop(spares);
        self.unpark_carrier(i);
        true
    }

    /// Wakes one sleeping carrier if work was made visible and nobody is looking for it.
    /// Inline: every spawn calls it, and most calls end at the fence and one load (someone
    /// searches, or nobody sleeps); as a call it cost a frame with register saves.
    #[inline]
    pub(crate) fn notify(&self) {
        if self.idle.notify_needed() {
            self.notify_slow();
        }
    }

    /// `notify` once a sleeper must be woken.
    #[inline(never)]
    fn notify_slow(&self) {
        if let Some(i) = self.idle.pop_sleeper() {
            self.unpark_carrier(i);
        }
    }

    /// Wakes carrier `i`: through its poll set's eventfd when it sleeps in `epoll_wait` (every
    /// idle carrier and retired spare does), otherwise through its thread's park token.
    pub(crate) fn unpark_carrier(&self, i: usize) {
        // Pairs with the SeqCst store of `on_reactor` before the carrier's re-check (in
        // `Carrier::park_idle` and `Carrier::retire`): either we see the carrier polling, or its
        // re-check sees the work (or the revival) we made visible. The fence covers callers
        // whose own store was weaker than SeqCst (`retired` is stored Release).
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.slots[i].on_reactor.load(Ordering::SeqCst) {
            self.reactor.wake(i);
        } else if let Some(t) = self.slots[i].thread.get() {
            t.unpark();
        }
    }

    /// Earliest timer deadline over all carriers (ns since epoch), or `u64::MAX`.
    pub(crate) fn earliest_deadline(&self) -> u64 {
        self.slots[..self.started()]
            .iter()
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
