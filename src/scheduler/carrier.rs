//! A carrier: one OS thread that runs fibers, pinned to a CPU.
//!
//! The carrier owns its hot state (`Carrier`, on its own thread's stack, reached by fibers only
//! through `fiber::context` and `here`): the local deque, the LIFO slot, a stack cache, a block of fiber
//! ids and a stock of runtime references. Everything here is touched by this thread alone; what
//! other threads need is in `CarrierSlot`. Every field uses interior mutability because fibers
//! running on this carrier reach it too, through a shared reference, between switch points.
//!
//! The loop is split into named steps: `next_local` → `search` (rounds of `find_work`) →
//! `park_idle`, and `run_fiber` → `run_claimed` → `finish`; the switch path is inlined into the
//! loop. See `arch/scheduler.md`.

use std::cell::{Cell, UnsafeCell};
use std::collections::VecDeque;
use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use corosensei::CoroutineResult;

use super::injector::Batch;
use super::locations;
use super::run_queue::{self, Local};
use super::shutdown;
use super::{CarrierSlot, RECORD_CACHE, RuntimeRef, STOCK_BATCH, Shared, Wake, bump};
use crate::fiber::context::{self, CarrierState, Running};
use crate::fiber::coroutine::new_coroutine;
use crate::fiber::id::{self as fid, FiberId};
use crate::fiber::stack::{FiberStack, SizeClass};
use crate::fiber::{Claim, Co, FiberRecord, FiberRef, NO_HOME, Suspend};

/// The carrier this thread is, or null. Valid until the caller's next switch point (see
/// `fiber::context`, which keeps the pointer opaque).
#[inline(always)]
pub(crate) fn here() -> *const Carrier {
    context::carrier().cast::<Carrier>()
}

/// Aborts the process if dropped: armed around fiber resumes, where a panic is a runtime bug
/// (see `run_claimed`).
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        eprintln!("virtual-threads: internal error: a fiber's switch panicked; aborting");
        std::process::abort();
    }
}

/// Local queue capacity; when full, half of it spills to the injector (256 as in Go and tokio).
const LOCAL_CAP: usize = run_queue::CAPACITY;
/// Fibers taken from the LIFO slot in a row before the deque gets a turn (tokio: 3).
const MAX_LIFO_STREAK: u32 = 3;
/// Every this many ticks the inbox, the injector and the timers go first, so they never starve
/// behind a busy local queue (Go and tokio: 61, a prime that avoids lock-step patterns).
const GLOBAL_CHECK_INTERVAL: u32 = 61;
/// Stacks a carrier keeps for itself before handing half back to the shared pool.
const STACK_CACHE: usize = 64;
/// Finished fibers' coroutines a carrier keeps, stack and all, for the next fibers' first runs
/// (`take_coroutine`). Short fibers run back to back need one or two; beyond this, a finished
/// one's stack goes to the stack cache, which is free (`retire_coroutine`).
const COROUTINE_CACHE: usize = 16;
/// How many more fibers at home than another running carrier make a carrier leave unstarted
/// fibers to it (`Carrier::weigh`): enough that two carriers about even do not trade.
const HEAVIER_BY: usize = 16;
/// Rounds of re-searching before a carrier without work parks its thread; past
/// `PATIENT_ROUNDS`, only while fibers still arrive in some deque (see `search`).
const SPIN_ROUNDS: u32 = 8;
/// Rounds in which a searcher leaves a busy carrier's only queued fiber alone (see
/// `find_work`); with the backoff between rounds, a few microseconds at most.
const PATIENT_ROUNDS: u32 = 3;
/// Most references a carrier keeps in stock.
const MAX_STOCK: usize = 4 * STOCK_BATCH;
/// How often a busy carrier polls the reactor without blocking.
const REACTOR_POLL_INTERVAL: Duration = Duration::from_millis(1);

pub(crate) struct Carrier {
    index: usize,
    rt: RuntimeRef,
    /// `rt.slots[index]`, resolved once: the hot paths reach it several times per switch, and
    /// the indexing (a bounds check and a multiply behind two loads) showed in the profile.
    slot: NonNull<CarrierSlot>,
    worker: Local<FiberRef>,
    /// Started fibers at home here, runnable, each with the deque's `pushed()` count when it
    /// was queued: it runs once everything queued in the deque before it has left (`home_due`),
    /// so the two queues together run in arrival order, as one deque did when fibers migrated.
    /// Private: only this carrier ever runs them. The `VecDeque` keeps its capacity, so a
    /// steady state allocates nothing.
    home: UnsafeCell<VecDeque<(FiberRef, usize)>>,
    /// A compensating carrier beyond the target count: it retires when no longer needed.
    is_spare: bool,
    lifo_streak: Cell<u32>,
    /// This carrier has clearly more fibers at home than another that runs (read every
    /// `GLOBAL_CHECK_INTERVAL` ticks, `weigh`): it leaves unstarted fibers to the lighter one.
    heavier: Cell<bool>,
    tick: Cell<u32>,
    rng: Cell<u64>,
    stacks: UnsafeCell<Vec<FiberStack>>,
    /// Coroutines of the runtime's default stack class, each suspended between two fibers.
    coroutines: UnsafeCell<Vec<Co>>,
    /// The stack cache's last operation was a take (see `take_stack`).
    taking: Cell<bool>,
    records: UnsafeCell<Vec<NonNull<FiberRecord>>>,
    /// A spill's fibers on their way to the injector: one buffer, reused, so a spill never
    /// allocates. Empty between spills.
    spill: UnsafeCell<Batch>,
    ids: Cell<(u64, u64)>,
    stock: Cell<usize>,
    searching: Cell<bool>,
    /// The fiber running now (registered with `fiber::context`, which reads it).
    current: Running,
    progress: Cell<u64>,
    last_poll: Cell<Instant>,
}

impl Carrier {
    /// The carrier thread's body.
    pub(crate) fn run(index: usize, rt: RuntimeRef, worker: Local<FiberRef>) {
        let slot = NonNull::from(&*rt.slots[index]);
        let c = Carrier {
            index,
            slot,
            worker,
            home: UnsafeCell::new(VecDeque::with_capacity(LOCAL_CAP)),
            is_spare: index >= rt.target,
            lifo_streak: Cell::new(0),
            heavier: Cell::new(false),
            tick: Cell::new(0),
            rng: Cell::new(0x2545_F491_4F6C_DD1D ^ ((index as u64 + 1) << 17)),
            stacks: UnsafeCell::new(Vec::with_capacity(STACK_CACHE)),
            coroutines: UnsafeCell::new(Vec::with_capacity(COROUTINE_CACHE)),
            taking: Cell::new(false),
            records: UnsafeCell::new(Vec::with_capacity(RECORD_CACHE)),
            spill: UnsafeCell::new(Batch::with_capacity(LOCAL_CAP / 2 + 1)),
            ids: Cell::new((0, 0)),
            stock: Cell::new(0),
            // Counted as a searcher since `start_carrier` (`Idle::start_searching`).
            searching: Cell::new(true),
            current: Running::new(),
            progress: Cell::new(0),
            last_poll: Cell::new(Instant::now()),
            rt,
        };
        // The overflow report runs on an alternate signal stack: the fiber's own is exhausted.
        let _altstack = crate::fiber::overflow::ensure_altstack();
        context::set_carrier((&raw const c).cast::<CarrierState>(), &c.current);
        // A panic here is a runtime bug; a carrier that silently died would leave the fibers
        // queued or pinned on it waiting for ever (found by tests/stress.rs).
        if catch_unwind(AssertUnwindSafe(|| c.run_loop())).is_err() {
            eprintln!("virtual-threads: internal error: carrier {index} panicked; aborting");
            std::process::abort();
        }
        c.exit();
        context::set_carrier(std::ptr::null(), std::ptr::null());
        let stock = c.stock.replace(0);
        c.rt.release_stock(stock);
        // The runtime's drop unwinds the fibers homed here on this thread, before it exits
        // (their thread-locals live here): `scheduler/shutdown.rs`.
        shutdown::serve(&c.rt, index);
    }

    fn slot(&self) -> &CarrierSlot {
        // SAFETY: `slot` points into `self.rt.slots`, a boxed slice that never moves and lives
        // as long as the `Shared` that `self.rt` keeps alive.
        unsafe { self.slot.as_ref() }
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.rt
    }

    pub(crate) fn runtime_ref(&self) -> &RuntimeRef {
        &self.rt
    }

    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// The fiber this carrier is running, or null between fibers.
    pub(crate) fn current(&self) -> *const FiberRecord {
        self.current.get()
    }

    /// A runtime reference for a new fiber, from the local stock.
    #[inline]
    pub(crate) fn take_ref(&self) -> RuntimeRef {
        if self.stock.get() == 0 {
            self.rt.acquire_stock(STOCK_BATCH);
            self.stock.set(STOCK_BATCH);
        }
        self.stock.set(self.stock.get() - 1);
        // SAFETY: we just took one unit out of the stock we own.
        unsafe { self.rt.take_from_stock() }
    }

    /// Takes back a dropped runtime reference into the stock. A full stock gives half of itself
    /// back in one atomic subtraction: given back one at a time, the 10,000 references of a
    /// W1 op that spawns all before joining any (the stock fills after 256) each cost an
    /// atomic on the runtime's count, a line every carrier shares (7% of W1's samples).
    #[inline]
    pub(crate) fn stock_ref(&self) {
        let s = self.stock.get() + 1;
        if s <= MAX_STOCK {
            self.stock.set(s);
            return;
        }
        self.stock.set(MAX_STOCK / 2);
        self.rt.release_stock(s - MAX_STOCK / 2);
    }

    #[inline]
    pub(crate) fn next_id(&self) -> FiberId {
        let mut block = self.ids.get();
        let id = fid::next_id(&mut block);
        self.ids.set(block);
        id
    }

    /// A stack of `class`: from the local cache for the runtime's default class.
    #[inline(always)]
    pub(crate) fn take_stack(&self, class: &'static SizeClass) -> io::Result<FiberStack> {
        // SAFETY: the cache is touched only by this thread, in short sections that do not
        // re-enter (no switch point, no user code).
        let cache = unsafe { &mut *self.stacks.get() };
        if !std::ptr::eq(class, self.rt.stacks) || cache.is_empty() {
            return self.take_stack_slow(class);
        }
        bump(&self.slot().stats.stack_hits, 1);
        // Only in a run of takes (a burst of first runs, as in W6 and W7) is the next stack
        // about to be used; when takes and gives alternate (short fibers back to back: W1,
        // W3) the next take gets back the stack just given, already hot.
        if self.taking.replace(true) && cache.len() > 1 {
            cache[cache.len() - 2].prefetch_top();
        }
        Ok(cache.pop().expect("checked non-empty"))
    }

    /// `take_stack` for another size class, or with an empty cache (refilled in a batch).
    #[cold]
    #[inline(never)]
    fn take_stack_slow(&self, class: &'static SizeClass) -> io::Result<FiberStack> {
        if !std::ptr::eq(class, self.rt.stacks) {
            return class.take();
        }
        // SAFETY: as in `take_stack`.
        let cache = unsafe { &mut *self.stacks.get() };
        bump(&self.slot().stats.stack_misses, 1);
        class.take_batch(cache, STACK_CACHE / 2);
        match cache.pop() {
            Some(s) => Ok(s),
            None => class.take(),
        }
    }

    /// An unused fiber record: from the local cache, else a batch from the shared pool, else new.
    #[inline]
    pub(crate) fn alloc_record(&self) -> NonNull<FiberRecord> {
        // SAFETY: the cache is touched only by this thread, in short non-reentrant sections.
        let cache = unsafe { &mut *self.records.get() };
        if let Some(r) = cache.pop() {
            // The next spawn's record: `init` writes all of it, and after a burst of spawns
            // the pool's records have gone cold (W1 cycles through 10,000 of them per op).
            if let Some(next) = cache.last() {
                let p = next.as_ptr() as usize;
                for line in 0..std::mem::size_of::<FiberRecord>().div_ceil(64) {
                    crate::platform::prefetch(p + line * 64);
                }
            }
            return r;
        }
        self.rt.take_records(cache, RECORD_CACHE / 2);
        cache.pop().unwrap_or_else(|| self.rt.roots.alloc(self.index, self.rt.stacks, cache))
    }

    /// Takes an unused record into the local cache (half the cache goes to the shared pool
    /// when it is full).
    pub(crate) fn give_record(&self, r: NonNull<FiberRecord>) {
        // SAFETY: as in `alloc_record`.
        let cache = unsafe { &mut *self.records.get() };
        if cache.len() >= RECORD_CACHE {
            self.rt.give_records(cache.drain(..RECORD_CACHE / 2));
        }
        cache.push(r);
    }

    /// Makes sure a stack of `class` can be had for a fiber about to be spawned here.
    #[inline]
    pub(crate) fn ensure_stack(&self, class: &'static SizeClass) -> io::Result<()> {
        if !std::ptr::eq(class, self.rt.stacks) {
            return class.ensure_available();
        }
        // SAFETY: as in `take_stack`.
        if unsafe { !(*self.stacks.get()).is_empty() } {
            return Ok(());
        }
        self.refill_stacks(class)
    }

    /// `ensure_stack` with an empty cache: one stack through it, which refills it in a batch.
    #[cold]
    #[inline(never)]
    fn refill_stacks(&self, class: &'static SizeClass) -> io::Result<()> {
        let s = self.take_stack(class)?;
        self.give_stack(s);
        Ok(())
    }

    #[inline(always)]
    fn give_stack(&self, s: FiberStack) {
        // SAFETY: as in `take_stack`.
        let cache = unsafe { &mut *self.stacks.get() };
        if !std::ptr::eq(s.class(), self.rt.stacks) || cache.len() >= STACK_CACHE {
            return self.give_stack_slow(s);
        }
        self.taking.set(false);
        cache.push(s);
    }

    /// `give_stack` for another size class (dropping it returns it to its own pool), or with
    /// a full cache (half of it goes back to the shared pool).
    #[cold]
    #[inline(never)]
    fn give_stack_slow(&self, s: FiberStack) {
        if !std::ptr::eq(s.class(), self.rt.stacks) {
            return;
        }
        self.taking.set(false);
        // SAFETY: as in `take_stack`.
        let cache = unsafe { &mut *self.stacks.get() };
        self.rt.stacks.give_batch(cache.drain(..STACK_CACHE / 2));
        cache.push(s);
    }

    /// A coroutine for a fiber of `class` at its first run: a finished fiber's, suspended
    /// between fibers, else a new one on a stack from the cache.
    #[inline(always)]
    fn take_coroutine(&self, class: &'static SizeClass) -> io::Result<Co> {
        // SAFETY: as in `take_stack`.
        let cache = unsafe { &mut *self.coroutines.get() };
        if std::ptr::eq(class, self.rt.stacks) {
            if let Some(co) = cache.pop() {
                bump(&self.slot().stats.stack_hits, 1);
                return Ok(co);
            }
        }
        self.take_stack(class).map(new_coroutine)
    }

    /// A finished fiber's coroutine: kept for the next fiber if it can run one (the runtime's
    /// stack class, room in the cache), else its stack goes back.
    #[inline(always)]
    fn give_coroutine(&self, co: Co, class: &'static SizeClass) {
        // SAFETY: as in `take_stack`.
        let cache = unsafe { &mut *self.coroutines.get() };
        if !co.done() && std::ptr::eq(class, self.rt.stacks) && cache.len() < COROUTINE_CACHE {
            cache.push(co);
        } else {
            self.give_stack(retire_coroutine(co));
        }
    }

    /// Makes a fiber of this runtime runnable from this carrier.
    pub(crate) fn schedule_local(&self, f: FiberRef, wake: Wake) {
        let stats = &self.slot().stats;
        if wake != Wake::Timer {
            bump(&stats.unparks, 1);
        }
        if let Some(now) = self.rt.clock.stamp() {
            f.since.store(now, Ordering::Relaxed);
        }
        let home = f.home.load(Ordering::Relaxed);
        if home != NO_HOME && home != self.index {
            self.rt.push_inbox(home, f);
            return;
        }
        match wake {
            Wake::Unpark => {
                // Direct hand-off (Go's runnext): the woken fiber runs next here.
                if let Some(prev) = self.lifo_put(f) {
                    if self.push_back(prev) {
                        self.rt.notify();
                    }
                }
            }
            // A timer wake is one of a batch: `time::fire` notifies once for all of them.
            Wake::Timer => {
                self.push_back(f);
            }
            Wake::Joiner => {
                if self.push_back(f) {
                    self.rt.notify();
                }
            }
        }
    }

    /// A fiber just spawned here: to the back of the local deque (stealable), then wake an idle
    /// carrier. Its own entry point, not a `Wake` kind: a new fiber has no home, and spawns are
    /// the hottest call of all.
    #[inline]
    pub(crate) fn schedule_spawned(&self, f: FiberRef) {
        debug_assert_eq!(f.home.load(Ordering::Relaxed), NO_HOME);
        bump(&self.slot().stats.spawned, 1);
        if let Err(f) = self.worker.push(f) {
            self.push_full(f);
        }
        self.rt.notify();
    }

    /// Back of the local deque (spilling half to the injector when full); fibers at home here
    /// go to the home queue instead, where no one can steal them. Returns whether it went
    /// where another carrier may take it (worth a `notify`).
    fn push_back(&self, f: FiberRef) -> bool {
        if f.home.load(Ordering::Relaxed) == self.index {
            self.home_push(f);
            return false;
        }
        if let Err(f) = self.worker.push(f) {
            self.push_full(f);
        }
        true
    }

    /// The records of the two fibers that will most likely run next, for `prefetch_ahead`
    /// (0 where there is none): the home queue's front while it holds fibers (a loop of
    /// started fibers, such as yielders, lives there), else the deque's.
    #[inline]
    fn peek_next_two(&self) -> (usize, usize) {
        // SAFETY: as in `home_push`.
        let home = unsafe { &*self.home.get() };
        match (home.front(), home.get(1)) {
            (Some((a, _)), b) => {
                (FiberRef::as_ptr(a) as usize, b.map_or(0, |(b, _)| FiberRef::as_ptr(b) as usize))
            }
            (None, _) => self.worker.peek_words(),
        }
    }

    /// Queues a fiber at home here behind everything queued so far (see `home`).
    #[inline]
    fn home_push(&self, f: FiberRef) {
        // SAFETY: only this carrier's thread touches `home`, never reentrantly: no method that
        // borrows it runs fiber code or calls back into another that does.
        let home = unsafe { &mut *self.home.get() };
        home.push_back((f, self.worker.pushed()));
        self.slot().home_len.store(home.len(), Ordering::Relaxed);
    }

    /// The oldest fiber of the home queue, if everything queued in the deque before it has left
    /// (`due_only`), or in any case.
    #[inline]
    fn home_pop(&self, due_only: bool) -> Option<FiberRef> {
        // SAFETY: as in `home_push`.
        let home = unsafe { &mut *self.home.get() };
        let &(_, mark) = home.front()?;
        if due_only && mark > self.worker.taken() {
            return None;
        }
        let (f, _) = home.pop_front()?;
        self.slot().home_len.store(home.len(), Ordering::Relaxed);
        Some(f)
    }

    /// Moves what other threads woke for this carrier into the home queue, in arrival order.
    #[cold]
    #[inline(never)]
    fn drain_inbox(&self) {
        for f in self.slot().inbox.take_all() {
            self.home_push(f);
        }
    }

    /// A push onto a full deque: spill half of it, then push.
    #[cold]
    #[inline(never)]
    fn push_full(&self, f: FiberRef) {
        self.spill();
        // Half the slots are free now (only this carrier fills them). Were they not, the fiber
        // goes to the injector: a run-queue entry is never dropped.
        if let Err(f) = self.worker.push(f) {
            self.rt.injector.push(self.index, f);
        }
    }

    /// The older half of a full deque to the injector: gathered privately, then appended
    /// under one lock, with no allocation (the buffer is kept) and no record touched.
    #[cold]
    #[inline(never)]
    fn spill(&self) {
        // SAFETY: only this carrier's thread touches `spill`, and not reentrantly: nothing
        // below runs fiber code.
        let spill = unsafe { &mut *self.spill.get() };
        self.worker.take_into(spill, LOCAL_CAP / 2);
        bump(&self.slot().stats.injector_pushes, spill.len() as u64);
        self.rt.injector.push_batch(self.index, spill);
    }

    fn lifo_take(&self) -> Option<FiberRef> {
        let slot = &self.slot().lifo;
        if slot.load(Ordering::Relaxed).is_null() {
            return None;
        }
        // SAFETY: the slot holds null or a pointer from `FiberRef::into_raw`; the swap takes it
        // out exactly once.
        unsafe { FiberRef::from_raw(slot.swap(std::ptr::null_mut(), Ordering::Acquire)) }
    }

    fn lifo_put(&self, f: FiberRef) -> Option<FiberRef> {
        let p = self.slot().lifo.swap(FiberRef::into_raw(f), Ordering::AcqRel);
        // SAFETY: as in `lifo_take`.
        unsafe { FiberRef::from_raw(p) }
    }

    fn run_loop(&self) {
        while !self.rt.shutdown.load(Ordering::Acquire) {
            // A spare retires between fibers, handing its deque to the others; not while
            // fibers at home on it wait, which no one else may run.
            if self.is_spare
                && self.slot().home_len.load(Ordering::Relaxed) == 0
                && self.rt.try_retire(self.index)
            {
                self.retire();
                continue;
            }
            let Some(f) = self.next_local().or_else(|| self.search()) else {
                if self.is_spare && self.rt.try_retire(self.index) {
                    self.retire();
                } else {
                    self.park_idle();
                }
                continue;
            };
            // Woken as a searcher but found work: stop counting as one (and wake another if
            // this was the last), or other carriers' notifications would wait on a search
            // that is not happening.
            self.found_work();
            // The one call site, so that the switch path is inlined into the loop.
            self.run_fiber(f);
        }
    }

    /// Nothing local: search the other queues for a few rounds, backing off between them.
    #[inline(never)]
    fn search(&self) -> Option<FiberRef> {
        let mut pushed = self.deques_pushed();
        for round in 0..SPIN_ROUNDS {
            let found = self.find_work(round >= PATIENT_ROUNDS);
            if found.is_some() || self.rt.shutdown.load(Ordering::Relaxed) {
                return found;
            }
            // What a spinner can take is unstarted fibers (started ones stay at home), which
            // arrive at the tails of the carriers' deques. Past the grace rounds, when no tail
            // moved over a round, only wakes and I/O remain, which reach a parked carrier as
            // well: park, and let the reactor gain a poller, rather than spin on (Go's spinning
            // Ms stop likewise). An HTTP server under wrk spent 20% of its samples here.
            let now = self.deques_pushed();
            if round >= PATIENT_ROUNDS && now == pushed {
                return None;
            }
            pushed = now;
            for _ in 0..(16 << round.min(4)) {
                std::hint::spin_loop();
            }
        }
        None
    }

    /// Fibers ever pushed onto every started carrier's deque: moves while carriers spawn.
    fn deques_pushed(&self) -> usize {
        let slots = &self.rt.slots[..self.rt.started()];
        slots.iter().fold(0, |sum, s| sum.wrapping_add(s.stealer.pushed()))
    }

    /// The fast path: this carrier's own queues.
    fn next_local(&self) -> Option<FiberRef> {
        let tick = self.tick.get().wrapping_add(1);
        self.tick.set(tick);
        if tick % GLOBAL_CHECK_INTERVAL == 0 {
            self.poll_reactor_if_due();
            self.fire_timers();
            // A retired spare, or a carrier blocked in the OS, cannot fire its own timers, and
            // the idle path that fires them for it may never run while every carrier is busy.
            self.fire_foreign_timers();
            // The injector first: the local queues may never be empty (fibers that keep
            // yielding), and they are checked right after. Not while clearly heavier than
            // another carrier: its fibers would stay here once started; the lighter one takes
            // them (it looks at the injector on its own ticks).
            if !self.weigh() {
                if let Some(f) = self.steal_injector() {
                    return Some(f);
                }
            }
            if let Some(f) = self.steal_if_lighter() {
                return Some(f);
            }
        }
        // One load of a line that only other threads' wakes write: usually empty.
        if self.slot().inbox.maybe_nonempty() {
            self.drain_inbox();
        }
        if let Some(f) = self.lifo_take() {
            let streak = self.lifo_streak.get();
            if streak < MAX_LIFO_STREAK {
                self.lifo_streak.set(streak + 1);
                return Some(f);
            }
            // Too many hand-offs in a row: queue it behind the others.
            self.push_back(f);
        }
        self.lifo_streak.set(0);
        if let Some(f) = self.home_pop(true) {
            return Some(f);
        }
        if (self.heavier.get() || self.rt.idle.any_idle()) && self.slot().home_len.load(Ordering::Relaxed) > 0
        {
            // Unstarted fibers wait in the deque ahead of the home queue's oldest, and another
            // carrier is idle: leave them to it. Once started here they could never move, so
            // a carrier that started every fiber it spawned before the others woke would run
            // them all (W5 read 85/15 between two carriers). It runs a fiber at home meanwhile
            // and makes sure an idle carrier looks (a searcher already does: then this is a
            // fence and a load). The same while this carrier is clearly heavier than another
            // (`weigh`), which takes them with `steal_if_lighter`. Otherwise arrival order holds.
            self.rt.notify();
            if let Some(f) = self.home_pop(false) {
                return Some(f);
            }
        }
        if let Some(f) = self.worker.pop() {
            return Some(f);
        }
        self.home_pop(false)
    }

    /// Fibers at home stay where they started, so a carrier that is never idle (its own
    /// fibers keep yielding) would never steal, and a busier one would start every fiber it
    /// spawns: balance is set at start (`arch/decisions/0003-home-carriers.md`). So every
    /// `GLOBAL_CHECK_INTERVAL` ticks a carrier with no unstarted fibers of its own takes half of
    /// the unstarted ones of a carrier with more fibers waiting at home than it has. A few
    /// relaxed loads of other carriers' lines per 61 switches; nothing when migration is on.
    /// Sets and returns `heavier`: whether another running carrier (not retired, not blocked)
    /// has `HEAVIER_BY` fewer fibers at home than this one. Every `GLOBAL_CHECK_INTERVAL` ticks:
    /// a few relaxed loads of other carriers' lines. Never with migration on.
    #[cold]
    #[inline(never)]
    fn weigh(&self) -> bool {
        let rt = &self.rt;
        let n = rt.started();
        let mine = self.slot().home_len.load(Ordering::Relaxed);
        let heavier = !rt.config.migrate_started_fibers
            && n > 1
            && mine > HEAVIER_BY
            && rt.slots[..n].iter().enumerate().any(|(i, s)| {
                i != self.index
                    && !s.retired.load(Ordering::Relaxed)
                    && !s.in_blocking.load(Ordering::Relaxed)
                    && !s.caught.load(Ordering::Relaxed)
                    && s.home_len.load(Ordering::Relaxed) + HEAVIER_BY < mine
            });
        self.heavier.set(heavier);
        heavier
    }

    #[cold]
    #[inline(never)]
    fn steal_if_lighter(&self) -> Option<FiberRef> {
        let rt = &self.rt;
        let n = rt.started();
        if n == 1 || rt.config.migrate_started_fibers || self.worker.len() > 0 {
            return None;
        }
        let mine = self.slot().home_len.load(Ordering::Relaxed);
        let start = self.next_rand() as usize % n;
        for k in 0..n.min(4) {
            let victim = (start + k) % n;
            let vslot = &rt.slots[victim];
            if victim == self.index
                || vslot.home_len.load(Ordering::Relaxed) <= mine + 1
                || vslot.stealer.is_empty()
            {
                continue;
            }
            let before = self.worker.len();
            if let Some(f) = vslot.stealer.steal_into(&self.worker, LOCAL_CAP / 2) {
                let got = 1 + self.worker.len().saturating_sub(before) as u64;
                bump(&self.slot().stats.steals, got);
                return Some(f);
            }
        }
        None
    }

    /// A batch from the injector into the local deque, counted.
    fn steal_injector(&self) -> Option<FiberRef> {
        let before = self.worker.len();
        let f = self.rt.injector.steal_into(self.index, &self.worker)?;
        let got = 1 + self.worker.len().saturating_sub(before) as u64;
        bump(&self.slot().stats.injector_pops, got);
        Some(f)
    }

    /// The slow path: timers, the injector, then other carriers. Until `take_last`, a
    /// victim's only queued fiber is left to it (see `PATIENT_ROUNDS`).
    fn find_work(&self, take_last: bool) -> Option<FiberRef> {
        if self.slot().inbox.maybe_nonempty() {
            self.drain_inbox();
            if let Some(f) = self.home_pop(false) {
                return Some(f);
            }
        }
        if self.fire_timers() > 0 {
            if let Some(f) = self.lifo_take().or_else(|| self.worker.pop()).or_else(|| self.home_pop(false)) {
                return Some(f);
            }
        }
        if let Some(f) = self.steal_injector() {
            return Some(f);
        }
        // A carrier busy in a long fiber cannot fire its own timers; an idle one does it.
        if self.fire_foreign_timers() > 0 {
            if let Some(f) = self.lifo_take().or_else(|| self.worker.pop()).or_else(|| self.home_pop(false)) {
                return Some(f);
            }
        }
        let n = self.rt.started();
        // A runtime of one carrier has no one to steal from. One of several whose others have
        // not started yet still counts itself as searching: a carrier that is neither searching
        // nor asleep looks busy, and a busy carrier with fibers queued starts them all itself
        // (`next_local`), where they would stay (found when a second carrier started late).
        if (n == 1 && self.rt.target == 1) || !(self.searching.get() || self.rt.idle.try_search()) {
            return None;
        }
        if n == 1 {
            self.searching.set(true);
            return None;
        }
        self.searching.set(true);
        let start = self.next_rand() as usize % n;
        for k in 0..n {
            let victim = (start + k) % n;
            if victim == self.index {
                continue;
            }
            let vslot = &self.rt.slots[victim];
            // A carrier running a fiber that just spawned or woke one runs it itself in a
            // moment, with warm caches; taking it moves a sequential chain (W3) to this carrier
            // and back, fiber by fiber. Go gives `runnext` the same grace (3 µs).
            let patient = !take_last && !vslot.location.load(Ordering::Relaxed).is_null();
            // Take about half of the victim's queue.
            if !patient || vslot.stealer.len() >= 2 {
                let before = self.worker.len();
                if let Some(f) = vslot.stealer.steal_into(&self.worker, LOCAL_CAP / 2) {
                    let got = 1 + self.worker.len().saturating_sub(before) as u64;
                    bump(&self.slot().stats.steals, got);
                    return Some(f);
                }
            }
            // A blocked carrier cannot run the fiber it was about to run next: take it.
            if vslot.in_blocking.load(Ordering::Relaxed) || vslot.caught.load(Ordering::Relaxed) {
                let p = vslot.lifo.swap(std::ptr::null_mut(), Ordering::Acquire);
                // SAFETY: as in `lifo_take`.
                if let Some(f) = unsafe { FiberRef::from_raw(p) } {
                    if f.home.load(Ordering::Relaxed) == NO_HOME {
                        return Some(f);
                    }
                    // At home on the blocked carrier: it may run nowhere else.
                    self.rt.push_inbox(victim, f);
                }
            }
        }
        None
    }

    /// Leaving the searching state with work in hand: if we were the last searcher, wake
    /// another carrier, since there may be more work than one carrier can take.
    fn found_work(&self) {
        if self.searching.replace(false) && self.rt.idle.stop_search() {
            self.rt.notify();
        }
    }

    fn next_rand(&self) -> u64 {
        // xorshift64*: a private generator, no shared state.
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    #[inline(always)]
    fn run_fiber(&self, f: FiberRef) {
        debug_assert!({
            let home = f.home.load(Ordering::Relaxed);
            home == NO_HOME || home == self.index
        });
        match f.try_claim() {
            Claim::Claimed => {}
            Claim::Compacted => self.restore(&f),
            Claim::Lost => return,
        }
        // One call site, so that it is inlined here as before compaction existed.
        self.run_claimed(f);
    }

    /// Starts the loads that this switch and the next two will wait on, so that they overlap
    /// the bookkeeping and the fibers' runs instead of forming a chain of misses (queue entry →
    /// record → saved stack pointer → the stack line a resume pops registers from): this
    /// fiber's stack lines, the next queued fiber's (its record was prefetched one switch ago),
    /// and the record of the one after it. Two stack lines each: the resume pops the saved
    /// registers around `parked_sp`, then returns through the frames just above it, and where
    /// the fiber's frames happen to straddle a line the second was a miss on every switch
    /// (W5 +10% in a build whose fiber frames sat 48 bytes deeper: `arch/performance.md`).
    #[inline]
    fn prefetch_ahead(&self, f: &FiberRecord) {
        use crate::platform::prefetch;
        let sp = f.parked_sp.load(Ordering::Relaxed);
        if sp != 0 {
            prefetch(sp);
            prefetch(sp + 64);
        }
        let (next, after) = self.peek_next_two();
        if next != 0 {
            // SAFETY: a run-queue slot only ever holds a record pointer this carrier pushed, and
            // records are freed only when the runtime is dropped, so even a stale one (taken by
            // a thief meanwhile) is live memory; `parked_sp` is atomic, and only a hint here.
            let sp = unsafe { &*(next as *const FiberRecord) }.parked_sp.load(Ordering::Relaxed);
            if sp != 0 {
                prefetch(sp);
                prefetch(sp + 64);
            }
        }
        if after != 0 {
            prefetch(after);
            prefetch(after + 64);
            prefetch(after + 127);
        }
    }

    /// A fiber parked long ago: copy its stack back before it runs (see `fiber/compact.rs`).
    #[cold]
    #[inline(never)]
    fn restore(&self, f: &FiberRecord) {
        // SAFETY: we claimed it (exclusive), and the claim cleared `COMPACTED`.
        let bytes = unsafe { f.restore_stack() };
        let stats = &self.slot().stats;
        bump(&stats.restores, 1);
        bump(&stats.restored_bytes, bytes as u64);
    }

    fn run_claimed(&self, mut f: FiberRef) {
        self.prefetch_ahead(&f);
        let slot = self.slot();
        self.current.set(FiberRef::as_ptr(&f));
        if !f.started.get() {
            // One look-up of the spawn site serves the hand-off and the count of runs.
            let site = slot.locations.entry(f.spawned_at());
            let known = site.is_some_and(|e| e.known.load(Ordering::Relaxed));
            if known && !self.is_spare {
                match self.give_known_blocker_away(f) {
                    Ok(()) => {
                        // Its run is counted where it starts.
                        self.current.set(std::ptr::null());
                        return;
                    }
                    Err(back) => f = back,
                }
            }
            f.started.set(true);
            if !self.rt.config.migrate_started_fibers {
                f.home.store(self.index, Ordering::Relaxed);
            }
            bump(&slot.stats.started, 1);
            // SAFETY: we popped `f`: exclusive access.
            if !unsafe { f.bind(self.take_coroutine(f.class())) } {
                // No stack: its join handle got the error; it is finished.
                bump(&slot.stats.finished, 1);
                FiberRecord::finish_now(&f);
                self.current.set(std::ptr::null());
                return;
            }
            if let Some(e) = site {
                locations::count_run(e);
            }
            if known {
                // Known to block: the whole fiber is a blocking section, compensated at once.
                f.blocking_depth.set(1);
                f.blocking_at.set(Some(f.spawned_at()));
            }
        }
        match f.blocking_at.get() {
            Some(at) if f.blocking_depth.get() > 0 => self.enter_blocking(at),
            _ => slot.location.store(f.spawned_at() as *const _ as *mut _, Ordering::Release),
        }
        f.carrier.store(self.index as u32, Ordering::Relaxed);
        if let Some(now) = self.rt.clock.stamp() {
            f.since.store(now, Ordering::Relaxed);
        }
        // The fiber body catches every panic itself; one escaping a resume is a runtime bug,
        // and unwinding on could drop a half-switched fiber's record. A guard rather than
        // `catch_unwind`: that costs a call and register spills around every resume, the guard
        // nothing until it fires.
        let abort = AbortOnUnwind;
        let after = loop {
            let p = self.progress.get() + 1;
            self.progress.set(p);
            slot.progress.store(p, Ordering::Relaxed);
            // SAFETY: we popped `f` from a queue (or it was just handed to us), so this carrier
            // is the only one running it: exclusive access to its coroutine.
            let co = unsafe { f.co_mut() }.as_mut().expect("a runnable fiber has its coroutine");
            // The record: a coroutine between fibers takes it as its next fiber's.
            let why = match co.resume(FiberRef::as_ptr(&f)) {
                CoroutineResult::Yield(why) => why,
                // Only a cancelled fiber's coroutine returns; taken as finished.
                CoroutineResult::Return(()) => Suspend::Finished,
            };
            if why != Suspend::Park {
                break why;
            }
            bump(&slot.stats.parks, 1);
            if f.try_set_parked() {
                break Suspend::Park;
            }
            // An unpark came while it was switching out: run it again at once.
        };
        std::mem::forget(abort);
        self.switched_out();
        match after {
            Suspend::Yield => {
                if let Some(now) = self.rt.clock.stamp() {
                    f.since.store(now, Ordering::Relaxed);
                }
                f.set_yielded();
                self.current.set(std::ptr::null());
                // What `schedule_local` decides for a yield, without its dispatch on the wake
                // kind: a fiber that ran here is at home here, or has none.
                debug_assert!(
                    matches!(f.home.load(Ordering::Relaxed), NO_HOME)
                        || f.home.load(Ordering::Relaxed) == self.index
                );
                if f.home.load(Ordering::Relaxed) == NO_HOME {
                    if let Err(f) = self.worker.push(f) {
                        self.push_full(f);
                    }
                } else {
                    self.home_push(f);
                }
            }
            Suspend::Park => {
                self.current.set(std::ptr::null());
                // The run reference stays with the parked fiber: whoever unparks it takes it
                // over (`FiberRef::take_parked_ref`).
                std::mem::forget(f);
            }
            Suspend::Finished => {
                self.finish(&f);
                self.current.set(std::ptr::null());
                FiberRef::release_finished(f);
            }
        }
    }

    /// A fiber about to start here whose spawn site is known to block (`locations.rs`) starts
    /// on a carrier of its own instead (`Shared::carrier_for_blocking`), so that it does not
    /// hold up the fibers at home here. Only with fibers at home: where they migrate,
    /// compensation already frees them. `Err` gives the fiber back to run here; `Ok` means it
    /// went to the other carrier's inbox with its run reference, queued `RUNNING` as a yielded
    /// fiber is (we hold its claim).
    #[cold]
    #[inline(never)]
    fn give_known_blocker_away(&self, f: FiberRef) -> Result<(), FiberRef> {
        if self.rt.config.migrate_started_fibers {
            return Err(f);
        }
        let Some(i) = self.rt.carrier_for_blocking() else { return Err(f) };
        f.home.store(i, Ordering::Relaxed);
        f.set_yielded();
        self.rt.push_inbox(i, f);
        Ok(())
    }

    /// Bookkeeping when a fiber leaves this carrier: the supervisor's view and blocking state.
    fn switched_out(&self) {
        let slot = self.slot();
        // This carrier is the only writer of `location`: a load and a store, not a swap (one
        // locked instruction fewer per switch).
        let loc = slot.location.load(Ordering::Relaxed);
        slot.location.store(std::ptr::null_mut(), Ordering::Release);
        if slot.caught.load(Ordering::Relaxed) && slot.caught.swap(false, Ordering::Acquire) && !loc.is_null()
        {
            // SAFETY: `location` only ever holds `&'static Location` pointers.
            slot.locations.record_caught(unsafe { &*loc });
        }
        self.exit_blocking();
    }

    /// The running fiber is about to block this thread (a `blocking` section, or a fiber from a
    /// known-blocking location): count this carrier as blocked and compensate now.
    pub(crate) fn enter_blocking(&self, at: &'static std::panic::Location<'static>) {
        let slot = self.slot();
        slot.location.store(at as *const _ as *mut _, Ordering::Release);
        if !slot.in_blocking.swap(true, Ordering::AcqRel) {
            self.rt.blocked.fetch_add(1, Ordering::AcqRel);
            self.rt.compensate();
        }
    }

    /// The blocking section ended (or its fiber switched out).
    pub(crate) fn exit_blocking(&self) {
        let slot = self.slot();
        if slot.in_blocking.load(Ordering::Relaxed) && slot.in_blocking.swap(false, Ordering::AcqRel) {
            self.rt.blocked.fetch_sub(1, Ordering::AcqRel);
            self.rt.shrink();
        }
    }

    /// Marks the current fiber's location again (after a blocking section inside it ended).
    pub(crate) fn set_location(&self, at: &'static std::panic::Location<'static>) {
        self.slot().location.store(at as *const _ as *mut _, Ordering::Release);
    }

    /// A spare that is no longer needed: hand its queued fibers to the others and park until
    /// compensation needs it again (spare threads are reused, not churned).
    fn retire(&self) {
        // A carrier woken as a searcher is counted as one: give that up first, or `notify`
        // would wait for a search that never happens.
        if self.searching.replace(false) {
            self.rt.idle.stop_search();
        }
        self.flush_to_injector();
        self.rt.notify();
        let slot = self.slot();
        while slot.retired.load(Ordering::Acquire) && !self.rt.shutdown.load(Ordering::Acquire) {
            std::thread::park();
        }
    }

    fn flush_to_injector(&self) {
        // SAFETY: as in `spill`.
        let rest = unsafe { &mut *self.spill.get() };
        if let Some(f) = self.lifo_take() {
            if f.home.load(Ordering::Relaxed) == self.index {
                // At home here (woken into the LIFO slot): it may run nowhere else, so it goes
                // to this carrier's inbox, which brings a retiring spare back (`Shared::revive`).
                self.rt.push_inbox(self.index, f);
            } else {
                rest.push(f);
            }
        }
        // The same for the home queue (empty when a spare retires: see `run_loop`; at
        // shutdown, the runtime's drop finds these in the inbox).
        while let Some(f) = self.home_pop(false) {
            self.rt.push_inbox(self.index, f);
        }
        self.worker.take_into(rest, usize::MAX);
        self.rt.injector.push_batch(self.index, rest);
    }

    fn finish(&self, f: &FiberRef) {
        // SAFETY: the fiber just returned on this carrier: nobody else can touch it.
        let co = unsafe { take_finished(f.co_mut()) }.expect("a finished fiber had its coroutine");
        self.give_coroutine(co, f.class());
        bump(&self.slot().stats.finished, 1);
        f.set_done();
    }

    /// Fires this carrier's expired timers. Returns how many fibers it woke.
    fn fire_timers(&self) -> usize {
        let slot = self.slot();
        let next = slot.next_deadline.load(Ordering::Relaxed);
        if next == u64::MAX {
            return 0;
        }
        let now = self.rt.ns_since_epoch(Instant::now());
        if now < next {
            return 0;
        }
        let n = crate::time::fire(&self.rt, self.index, now, false);
        bump(&slot.stats.timer_wakeups, n as u64);
        n
    }

    fn fire_foreign_timers(&self) -> usize {
        let now = self.rt.ns_since_epoch(Instant::now());
        let mut woken = 0;
        for (i, slot) in self.rt.slots[..self.rt.started()].iter().enumerate() {
            if i != self.index && slot.next_deadline.load(Ordering::Relaxed) <= now {
                woken += crate::time::fire(&self.rt, i, now, true);
            }
        }
        bump(&self.slot().stats.timer_wakeups, woken as u64);
        woken
    }

    /// Work that another thread could have made visible since we last looked.
    fn work_visible(&self) -> bool {
        let rt = &self.rt;
        !self.slot().inbox.is_empty()
            || !rt.injector.is_empty()
            || (rt.idle.can_search()
                && rt.slots[..rt.started()]
                    .iter()
                    .enumerate()
                    .any(|(i, s)| i != self.index && !s.stealer.is_empty()))
            || rt.earliest_deadline() <= rt.ns_since_epoch(Instant::now())
            || rt.shutdown.load(Ordering::SeqCst)
    }

    /// Nothing to do: register as a sleeper, look once more, then park the thread until woken
    /// or until the earliest timer is due (see `idle.rs` for why no wake-up is lost).
    fn park_idle(&self) {
        let idle = &self.rt.idle;
        if self.searching.replace(false) {
            idle.stop_search();
        }
        let slot = self.slot();
        // One idle carrier sleeps in epoll_wait as the reactor's poller (so readiness and
        // timers share one wait); the others park their thread. The flag must be up before the
        // carrier registers as a sleeper: whoever pops it from the sleepers list then sees the
        // flag (SeqCst, paired with `unpark_carrier`) and wakes it through the eventfd. Raised
        // after registering, a wake could land in the thread's park token while the carrier
        // then blocks in epoll_wait for ever (found by the W3 chained_fork bench).
        let mut poller = self.rt.reactor.try_poller();
        if poller.is_some() {
            slot.on_reactor.store(true, Ordering::SeqCst);
        }
        idle.register(self.index);
        let visible = self.work_visible();
        if !visible {
            let slept = Instant::now();
            let timeout = match self.rt.earliest_deadline() {
                u64::MAX => None,
                at => Some(Duration::from_nanos(at.saturating_sub(self.rt.ns_since_epoch(Instant::now())))),
            };
            match (&mut poller, timeout) {
                (Some(p), t) => {
                    let n = self.rt.reactor.poll(p, t);
                    bump(&slot.stats.io_wakeups, n as u64);
                }
                (None, None) => std::thread::park(),
                (None, Some(t)) if !t.is_zero() => std::thread::park_timeout(t),
                (None, Some(_)) => {}
            }
            let woke = Instant::now();
            bump(&slot.stats.idle_ns, woke.saturating_duration_since(slept).as_nanos() as u64);
            self.rt.refresh_clock_after_idle(woke);
        }
        if poller.take().is_some() {
            slot.on_reactor.store(false, Ordering::Relaxed);
        }
        match idle.unregister(self.index) {
            super::idle::Unregister::WasNotified => self.searching.set(true),
            // Work seen on the re-check is looked for as a searcher, so that taking it from the
            // injector wakes the next carrier (step 3) as stealing it would: otherwise a second
            // fiber pushed while we counted as searching waits behind the first (found by the
            // loom model of the idle protocol, `arch/loom.md`, finding 3).
            super::idle::Unregister::Removed if visible => self.searching.set(idle.try_search()),
            super::idle::Unregister::Removed => {}
        }
        self.rt.supervisor_wake();
    }

    /// Under load no carrier sleeps in the reactor, so busy carriers poll it without blocking,
    /// at most once per `REACTOR_POLL_INTERVAL` each (Go's scheduler and sysmon do the same).
    fn poll_reactor_if_due(&self) {
        let now = Instant::now();
        if now.duration_since(self.last_poll.get()) < REACTOR_POLL_INTERVAL {
            return;
        }
        self.last_poll.set(now);
        if let Some(mut p) = self.rt.reactor.try_poller() {
            let n = self.rt.reactor.poll(&mut p, Some(Duration::ZERO));
            bump(&self.slot().stats.io_wakeups, n as u64);
        }
    }

    /// Shutdown: hand every queued fiber to the injector (the runtime's drop unwinds them) and
    /// the stack cache back to the pool.
    fn exit(&self) {
        if self.searching.replace(false) {
            self.rt.idle.stop_search();
        }
        self.flush_to_injector();
        // SAFETY: as in `take_stack`; no fiber runs any more.
        let cache = unsafe { &mut *self.stacks.get() };
        // SAFETY: as in `take_stack`.
        let coroutines = unsafe { &mut *self.coroutines.get() };
        cache.extend(coroutines.drain(..).map(retire_coroutine));
        self.rt.stacks.give_batch(cache.drain(..));
        // SAFETY: as in `alloc_record`.
        let records = unsafe { &mut *self.records.get() };
        self.rt.give_records(records.drain(..));
    }
}

/// The stack of a coroutine that has finished its last fiber (suspended with `Finished`, or
/// returned), without resuming it to return: its stack holds only `fiber_loop`'s frame and
/// corosensei's entry frames, with nothing to drop, so it can be abandoned where it stands.
#[inline]
fn retire_coroutine(mut co: Co) -> FiberStack {
    // SAFETY: the coroutine is suspended at `fiber_loop`'s `Finished` (or done): the frames on
    // its stack own nothing with a destructor (a record pointer and references), which is
    // `force_reset`'s condition.
    unsafe { co.force_reset() };
    co.into_stack()
}

/// `co.take()` for a coroutine that has just returned, read a word at a time. The switch back
/// from the fiber has just written its saved stack pointer with an 8-byte store, and `take`
/// copies the coroutine with 16-byte loads: a load that spans that store cannot be forwarded
/// from it and waits for it to reach the cache (W1's profile had 15% of the carrier loop's
/// samples there). Word loads are each forwarded from the store that wrote them.
///
/// # Safety
/// The caller has exclusive access to the coroutine.
#[inline(always)]
unsafe fn take_finished(co: &mut Option<crate::fiber::Co>) -> Option<crate::fiber::Co> {
    use std::mem::{MaybeUninit, align_of, size_of};
    type Slot = Option<crate::fiber::Co>;
    const WORDS: usize = size_of::<Slot>() / size_of::<usize>();
    const _: () =
        assert!(size_of::<Slot>() % size_of::<usize>() == 0 && align_of::<Slot>() >= align_of::<usize>());
    // Words as `MaybeUninit`: a padding byte (corosensei's layout is its own) is copied as
    // it is, never read as an integer.
    let src = (co as *mut Slot).cast::<MaybeUninit<usize>>();
    let mut out = MaybeUninit::<Slot>::uninit();
    let dst = out.as_mut_ptr().cast::<MaybeUninit<usize>>();
    for i in 0..WORDS {
        // SAFETY: `i < WORDS` words lie within both, which are word-aligned (the asserts
        // above); volatile keeps LLVM from merging them into wider loads.
        unsafe { dst.add(i).write(src.add(i).read_volatile()) };
    }
    // SAFETY: the slot's value now lives in `out`: overwrite it without dropping it. `out`
    // holds a bitwise copy of a valid value.
    unsafe {
        (co as *mut Slot).write(None);
        out.assume_init()
    }
}
