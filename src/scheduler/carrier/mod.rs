//! A carrier: one OS thread that runs fibers, pinned to a CPU.
//!
//! The carrier owns its hot state (`Carrier`, on its own thread's stack, reached by fibers only
//! through `fiber::context` and `here`): the local deque, the LIFO slot, a stack cache, a block of fiber
//! ids and a stock of runtime references. Everything here is touched by this thread alone; what
//! other threads need is in `CarrierSlot`. Every field uses interior mutability because fibers
//! running on this carrier reach it too, through a shared reference, between switch points.
//!
//! The loop is split into named steps: `next_local` → `search` (rounds of `find_work`) →
//! `park_idle`, and `run_fiber` → `run_claimed` → `finish`, or `yield_at_home`, which may hand
//! the carrier straight to the next fiber; the switch path is inlined into the loop. See
//! `arch/scheduler.md`. One `impl Carrier` per concern:
//! - `mod.rs`: the state, the thread's body and its loop, references and ids;
//! - `caches.rs`: the caches of stacks, coroutines and records;
//! - `queues.rs`: putting fibers in the LIFO slot, the home queue, the deque and the injector;
//! - `search.rs`: finding work (local, stealing, the injector, timers, the reactor) and sleeping;
//! - `switch.rs`: running a fiber, and what its switch out asks of the carrier;
//! - `traced.rs`: what the execution trace records of it, out of line (`scheduler/trace/`).

use std::cell::{Cell, UnsafeCell};
use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use corosensei::CoroutineResult;

use super::injector::Batch;
use super::locations;
use super::trace::{self, Event, Kind};
use super::{CarrierSlot, RECORD_CACHE, STOCK_BATCH, Shared, bump};
use crate::fiber::context::{self, CarrierState, Running};
use crate::fiber::coroutine::new_coroutine;
use crate::fiber::id::{self as fid, FiberId};
use crate::fiber::schedule::{RuntimeRef, Wake};
use crate::fiber::stack::{FiberStack, SizeClass};
use crate::fiber::{Claim, Co, FiberRecord, FiberRef, NO_HOME, Suspend};
use crate::scheduler::queue::home_queue::HomeQueue;
use crate::scheduler::queue::run_queue::{self, Local};

mod caches;
use caches::{Borrowed, Caches};
mod place;
use place::NO_PLACE;
mod queues;
mod search;
mod switch;
mod traced;
pub(crate) use traced::trace_panic;

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
/// The spin score (`Carrier::spin_score`) at start and at most: a carrier spins from the start,
/// and after this many searches in a row spun in vain it stops.
const SPIN_SCORE_MAX: u32 = 32;
/// What a search that found work only after spinning adds to the score.
const SPIN_PAID: u32 = 8;
/// With a score of 0, every this many searches spin all the same, to notice when spinning
/// pays again.
const SPIN_PROBE: u32 = 16;
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
    /// The home queue and the caches of stacks, coroutines, records and the spill buffer,
    /// behind one `UnsafeCell` with one safety argument (`caches.rs`).
    caches: UnsafeCell<Caches>,
    /// Which of `caches`' fields is borrowed now (debug builds; nothing in release).
    borrowed: Borrowed,
    /// A compensating carrier beyond the target count: it retires when no longer needed.
    is_spare: bool,
    lifo_streak: Cell<u32>,
    /// This carrier has clearly more fibers at home than another that runs (read every
    /// `GLOBAL_CHECK_INTERVAL` ticks, `weigh`): it leaves unstarted fibers to the lighter one.
    heavier: Cell<bool>,
    /// Placement by load (`place.rs`): the start count's bits that must be 0 for a first
    /// start to take the cold path, the carrier it places on (`NO_PLACE`: none), and the
    /// starts since it last looked at the loads while placing.
    place_mask: Cell<u64>,
    place_to: Cell<usize>,
    place_calls: Cell<u32>,
    /// The target's switch count when this carrier last saw it move, and when (ns since the
    /// runtime's epoch); and a carrier left out while its switch count stays as it was when it
    /// stalled (`place.rs`, step 5).
    place_watch: Cell<(u64, u64)>,
    place_shun: Cell<(usize, u64)>,
    /// Ticks (fibers taken from the local queues) until the next look at timers, the
    /// injector, the reactor and the other carriers' loads: a countdown from
    /// `GLOBAL_CHECK_INTERVAL`, where a counter's modulo divided by 61 on every switch.
    ticks_left: Cell<u32>,
    /// `config.fork_yield`, copied: read by every spawn here, where the runtime's copy is two
    /// loads away.
    fork_yield: u32,
    rng: Cell<u64>,
    /// The stack cache's last operation was a take (see `take_stack`).
    taking: Cell<bool>,
    ids: fid::IdBlock,
    stock: Cell<usize>,
    searching: Cell<bool>,
    /// Whether spinning pays here lately (`search`): raised by `SPIN_PAID` when a search found
    /// work only after spinning, lowered by 1 when it spun in vain; at 0 a search looks once
    /// and parks. Fork-join finds work while spinning; a server, whose work arrives as I/O
    /// through the carriers' epoll sets, almost never does (`arch/performance.md`).
    spin_score: Cell<u32>,
    /// Searches since the last one that spun (for `SPIN_PROBE`).
    unspun: Cell<u32>,
    /// The fiber running now (registered with `fiber::context`, which reads it).
    current: Running,
    last_poll: Cell<Instant>,
    /// While a trace runs, the mark: when the last slice here ended (or an idle wait, a search
    /// that found work, a wake between slices), the next slice's start, and `resumes()` then
    /// (`traced.rs`).
    trace_mark: Cell<u64>,
    trace_mark_progress: Cell<u64>,
}

impl Carrier {
    /// The carrier thread's loop, to its exit; the thread then serves the runtime's drop
    /// (`lifecycle.rs`, `shutdown::serve`).
    pub(crate) fn run(index: usize, rt: RuntimeRef, worker: Local<FiberRef>) {
        let slot = NonNull::from(&*rt.slots[index]);
        let c = Carrier {
            index,
            slot,
            worker,
            caches: UnsafeCell::new(Caches {
                home: HomeQueue::with_capacity(LOCAL_CAP),
                stacks: Vec::with_capacity(STACK_CACHE),
                coroutines: Vec::with_capacity(COROUTINE_CACHE),
                records: Vec::with_capacity(RECORD_CACHE),
                spill: Batch::with_capacity(LOCAL_CAP / 2 + 1),
            }),
            borrowed: Borrowed::default(),
            is_spare: index >= rt.target,
            lifo_streak: Cell::new(0),
            heavier: Cell::new(false),
            place_mask: Cell::new(Carrier::initial_place_mask(&rt, index)),
            place_to: Cell::new(NO_PLACE),
            place_calls: Cell::new(0),
            place_watch: Cell::new((0, 0)),
            place_shun: Cell::new((NO_PLACE, 0)),
            ticks_left: Cell::new(GLOBAL_CHECK_INTERVAL),
            fork_yield: rt.config().fork_yield,
            rng: Cell::new(0x2545_F491_4F6C_DD1D ^ ((index as u64 + 1) << 17)),
            taking: Cell::new(false),
            ids: fid::IdBlock::default(),
            stock: Cell::new(0),
            // Counted as a searcher since `start_carrier` (`Idle::start_searching`).
            searching: Cell::new(true),
            spin_score: Cell::new(SPIN_SCORE_MAX),
            unspun: Cell::new(0),
            current: Running::new(),
            last_poll: Cell::new(Instant::now()),
            trace_mark: Cell::new(0),
            trace_mark_progress: Cell::new(0),
            rt,
        };
        c.rt.trace_attach(index);
        if let Some(ring) = c.slot().tracing() {
            c.trace_mark_now();
            let mut e = Event::new(Kind::CarrierStart, 0, 0, 0);
            e.a = u8::from(c.is_spare);
            ring.push(e);
        }
        // The overflow report runs on an alternate signal stack: the fiber's own is exhausted.
        let _altstack = crate::fiber::overflow::ensure_altstack();
        // SAFETY: `c` lives on this thread's stack until after the null registration below,
        // which ends the thread's loop; `current` is its field.
        unsafe { context::set_carrier((&raw const c).cast::<CarrierState>(), &c.current) };
        // A panic here is a runtime bug; a carrier that silently died would leave the fibers
        // queued or pinned on it waiting for ever (found by tests/stress.rs).
        if catch_unwind(AssertUnwindSafe(|| c.run_loop())).is_err() {
            eprintln!("virtual-threads: internal error: carrier {index} panicked; aborting");
            std::process::abort();
        }
        c.exit();
        // SAFETY: null registers no carrier.
        unsafe { context::set_carrier(std::ptr::null(), std::ptr::null()) };
        let stock = c.stock.replace(0);
        c.rt.release_stock(stock);
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

    /// The fork-yield setting (`runtime::Builder::fork_yield`).
    #[inline(always)]
    pub(crate) fn fork_yield(&self) -> u32 {
        self.fork_yield
    }

    /// The fiber this carrier is running, or null between fibers.
    pub(crate) fn current(&self) -> *const FiberRecord {
        self.current.get()
    }

    /// Takes back a runtime reference dropped on this carrier into the stock. A full stock
    /// gives half of itself back in one atomic subtraction: given back one at a time, each
    /// would cost an atomic on the runtime's count, a line every carrier shares
    /// (`arch/performance.md`).
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
        self.ids.take()
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
            let Some(f) = self.next_local().or_else(|| self.search_noted()) else {
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
}
