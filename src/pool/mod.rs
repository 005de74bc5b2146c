//! `ThreadPool`: the `threadpool` crate's API on fibers, so that a program built on a thread
//! pool moves to virtual threads by changing the line that builds the pool.
//!
//! A pool is a FIFO queue of entries plus at most `max_count` *slots*. A slot is the right to
//! run one job; every running job runs in a fiber that holds one. When its job is done, the
//! fiber keeps the slot and takes the next entry itself, or gives the slot back once the queue
//! is empty. So a queued `execute` job costs a boxed closure and no fiber, `queued_count` is
//! the queue's length, and the bound needs no semaphore per job. `unbounded()` is the same pool
//! with `max_count == usize::MAX`: every job finds a free slot at once and gets its own fiber.
//!
//! `spawn` must return a fiber's `JoinHandle` at once, so a spawned job that finds no free slot
//! is a fiber parked on a *ticket* in the queue; whoever pops the ticket hands it their slot.
//!
//! No entry is stranded: a submitter pushes, then looks for a free slot; a fiber that gives
//! its slot back frees it, then looks at the queue (`Shared::pump` on both sides). A SeqCst
//! fence sits between the write and the read on each side, so at least one of them sees the
//! other's write (Dekker), and an entry is never left queued while every slot is free.
//!
//! `join` waits until the pool is idle (nothing queued or running) at some moment after the
//! call, as threadpool's does: `pending` counts jobs submitted and not finished, and the job
//! that takes it to zero bumps `Synced::generation` and unparks every joiner.
//!
//! Jobs run on the runtime that was current where the pool was built (the caller's, or the
//! process-wide default from a plain thread), or on the one given to the builder; a pool whose
//! runtime has been dropped runs nothing more.

use std::any::Any;
use std::fmt;
use std::panic::{AssertUnwindSafe, Location, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Mutex, PoisonError};

use crossbeam_deque::{Injector, Steal};

use crate::fiber::context;
use crate::fiber::handle::Fiber;
use crate::fiber::join::JoinHandle;
use crate::fiber::schedule::RuntimeRef;
use crate::runtime::spawn::Builder as FiberBuilder;

mod builder;
mod scope;

pub use builder::ThreadPoolBuilder;
pub use scope::PoolScope;

/// A worker fiber yields after this many jobs in a row, so that a queue of jobs that never
/// block does not keep the other fibers of its carrier waiting.
const YIELD_EVERY: u32 = 16;

type Job = Box<dyn FnOnce() + Send + 'static>;

enum Entry {
    Job(Job),
    /// A spawned fiber waiting for a slot: set `granted`, then unpark `fiber`.
    Ticket {
        granted: Arc<AtomicBool>,
        fiber: Fiber,
    },
}

/// `let pool = vt::ThreadPool::new(16); pool.execute(|| work()); pool.join();`
///
/// A pool of at most `max_count` jobs running at once, each in a fiber, with the `threadpool`
/// crate's methods. Clones share the pool. Dropping the last handle waits for nothing: queued
/// jobs still run, and everything is freed when the last one finishes.
///
/// Unlike a thread pool's jobs, these may block freely on `vt` calls (`vt::sleep`, locks,
/// channels, joins, sockets): a blocked job parks its fiber and frees its carrier, though it
/// keeps its slot. `std::thread::sleep` and other OS-blocking calls still block the carrier.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use virtual_threads as vt;
///
/// let pool = vt::ThreadPool::new(4);
/// let done = Arc::new(AtomicUsize::new(0));
/// for _ in 0..100 {
///     let done = done.clone();
///     pool.execute(move || {
///         vt::sleep(std::time::Duration::from_millis(1)); // parks the fiber, not the carrier
///         done.fetch_add(1, Ordering::Relaxed);
///     });
/// }
/// pool.join();
/// assert_eq!(done.load(Ordering::Relaxed), 100);
/// ```
#[derive(Clone)]
pub struct ThreadPool {
    shared: Arc<Shared>,
}

struct Shared {
    queue: Injector<Entry>,
    /// Entries in `queue`: raised before a push, lowered after a pop.
    queued: AtomicUsize,
    /// Slots taken.
    active: AtomicUsize,
    max: AtomicUsize,
    /// Jobs submitted and not finished, plus one per `submit` in progress.
    pending: AtomicUsize,
    panics: AtomicUsize,
    rt: RuntimeRef,
    fiber_name: Option<String>,
    stack_size: Option<usize>,
    synced: Mutex<Synced>,
}

/// Held by every fiber the pool starts, and dropped with it: when that happens because the
/// runtime is being dropped (its fibers are unwound, unstarted ones dropped), the pool learns
/// that its pending jobs will never finish (`Shared::stopped`). Every pending job has a fiber
/// (running it, holding the slot it waits for, or parked on a ticket), so one is dropped then.
struct StopWatch(Arc<Shared>);

impl Drop for StopWatch {
    fn drop(&mut self) {
        if self.0.rt.is_shut_down() {
            self.0.stopped();
        }
    }
}

/// What the starter of a fiber holds for its job.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Held {
    /// A `pending` count and a slot.
    SlotAndJob,
    /// A `pending` count (a ticket's fiber waits for its slot).
    Job,
}

struct Synced {
    /// Bumped each time `pending` reaches zero.
    generation: u64,
    joiners: Vec<Fiber>,
}

impl ThreadPool {
    /// A pool that runs at most `n` jobs at once, on the current runtime.
    ///
    /// # Panics
    /// If `n` is 0, as threadpool's does.
    #[track_caller]
    pub fn new(n: usize) -> ThreadPool {
        ThreadPoolBuilder::new().num_threads(n).build()
    }

    /// Like [`new`](ThreadPool::new), with the pool's fibers named `name` (shown in panics'
    /// messages and dumps). A `String`, as threadpool's, so that `"w".into()` compiles.
    #[track_caller]
    pub fn with_name(name: String, n: usize) -> ThreadPool {
        ThreadPoolBuilder::new().num_threads(n).thread_name(name).build()
    }

    /// threadpool's old name for [`with_name`](ThreadPool::with_name), kept as it keeps it.
    #[deprecated(since = "1.4.0", note = "use ThreadPool::with_name")]
    #[track_caller]
    pub fn new_with_name(name: String, n: usize) -> ThreadPool {
        ThreadPool::with_name(name, n)
    }

    /// A pool that gives every job a fiber of its own at once, like Java's
    /// `Executors.newVirtualThreadPerTaskExecutor()`. `max_count` is `usize::MAX`.
    pub fn unbounded() -> ThreadPool {
        ThreadPoolBuilder::new().build()
    }

    /// Runs `f` as soon as a slot is free. A panic in `f` is counted by
    /// [`panic_count`](ThreadPool::panic_count) and goes no further.
    ///
    /// # Panics
    /// If no fiber stack can be had (the job is dropped).
    #[track_caller]
    pub fn execute<F>(&self, f: F)
    where
        F: FnOnce() + Send + 'static,
    {
        let s = &self.shared;
        s.pending.fetch_add(1, Ordering::Relaxed);
        // Taking a slot only while nothing is queued keeps jobs in submission order (best
        // effort: an entry being pushed concurrently may be overtaken).
        if s.queued.load(Ordering::Relaxed) == 0 && s.try_acquire() {
            let shared = Arc::clone(s);
            s.start(Held::SlotAndJob, move || shared.work(f));
        } else {
            s.submit(Entry::Job(Box::new(f)));
        }
    }

    /// Runs `f` as soon as a slot is free and returns its fiber's handle; `join` on it gives
    /// `f`'s result, or `Err` with its panic (which [`panic_count`](ThreadPool::panic_count)
    /// also counts). A job that has to wait for a slot waits as a parked fiber.
    ///
    /// # Panics
    /// If no fiber stack can be had.
    #[track_caller]
    pub fn spawn<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let s = &self.shared;
        s.pending.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::clone(s);
        if s.queued.load(Ordering::Relaxed) == 0 && s.try_acquire() {
            return s.start(Held::SlotAndJob, move || shared.run_spawned(f));
        }
        let granted = Arc::new(AtomicBool::new(false));
        let wait = Arc::clone(&granted);
        let h = s.start(Held::Job, move || {
            // Acquire pairs with the Release store in `Shared::grant`.
            while !wait.load(Ordering::Acquire) {
                crate::fiber::park::park_for(crate::fiber::wait::WaitReason::PoolSlot, None);
            }
            shared.run_spawned(f)
        });
        s.submit(Entry::Ticket { granted, fiber: h.fiber().clone() });
        h
    }

    /// Waits until the pool is idle: every job submitted before the call, and any submitted
    /// meanwhile, has finished. Several threads or fibers may wait at once, and again later.
    /// Called from one of the pool's own jobs it waits for itself, for ever.
    pub fn join(&self) {
        let s = &self.shared;
        // Acquire pairs with the AcqRel decrements in `job_done`: the jobs' effects and their
        // panic counts are visible once the pool is seen idle.
        if s.pending.load(Ordering::Acquire) == 0 {
            return;
        }
        let generation = {
            let mut synced = s.synced();
            // Re-checked under the lock that the job taking `pending` to zero takes after it.
            if s.pending.load(Ordering::Acquire) == 0 {
                return;
            }
            // A pool whose runtime is gone runs nothing more: its pending jobs never finish.
            // Looked at under the lock that `Shared::stopped` takes after the runtime's drop
            // has begun, so either this sees the drop or `stopped` sees this joiner.
            if s.rt.is_shut_down() {
                drop(synced);
                s.drop_queued_if_stopped();
                return;
            }
            synced.joiners.push(crate::fiber::handle::current());
            synced.generation
        };
        while s.synced().generation == generation {
            crate::fiber::park::park_for(crate::fiber::wait::WaitReason::PoolJoin, None);
        }
    }

    /// Jobs running now (slots taken).
    pub fn active_count(&self) -> usize {
        self.shared.active.load(Ordering::Relaxed)
    }

    /// Jobs waiting for a slot.
    pub fn queued_count(&self) -> usize {
        self.shared.queued.load(Ordering::Relaxed)
    }

    /// Jobs that have panicked since the pool was built.
    pub fn panic_count(&self) -> usize {
        self.shared.panics.load(Ordering::Relaxed)
    }

    /// The most jobs that run at once (`usize::MAX` for an unbounded pool).
    pub fn max_count(&self) -> usize {
        self.shared.max.load(Ordering::Relaxed)
    }

    /// Changes the bound. Raising it starts queued jobs at once; lowering it lets running
    /// jobs finish, and their fibers then give their slots back.
    ///
    /// # Panics
    /// If `n` is 0, as threadpool's does.
    #[track_caller]
    pub fn set_num_threads(&self, n: usize) {
        assert!(n > 0, "a ThreadPool needs at least one thread (got 0)");
        self.shared.max.store(n, Ordering::Relaxed);
        self.shared.pump();
    }

    /// threadpool's old name for [`set_num_threads`](ThreadPool::set_num_threads), kept as it
    /// keeps it.
    #[deprecated(since = "1.3.0", note = "use ThreadPool::set_num_threads")]
    #[track_caller]
    pub fn set_threads(&self, n: usize) {
        self.set_num_threads(n)
    }
}

impl Default for ThreadPool {
    /// A pool of one job per CPU this process may use, as threadpool's `default()` (on the
    /// current runtime).
    fn default() -> ThreadPool {
        ThreadPool::new(crate::platform::usable_cpus())
    }
}

impl Shared {
    fn synced(&self) -> std::sync::MutexGuard<'_, Synced> {
        self.synced.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Spawns a fiber on the pool's runtime with the pool's settings; `held` is what the
    /// caller took for the job, given back if the fiber cannot be had.
    #[track_caller]
    fn start<F, T>(self: &Arc<Self>, held: Held, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let mut b = FiberBuilder::new();
        if let Some(name) = &self.fiber_name {
            b = b.name(name.clone());
        }
        if let Some(bytes) = self.stack_size {
            b = b.stack_size(bytes);
        }
        // Dropped with the fiber's closure, run or not: tells the pool if the runtime is going.
        let watch = StopWatch(Arc::clone(self));
        let f = move || {
            let _watch = watch;
            f()
        };
        // SAFETY: `F` and `T` are 'static, so nothing the fiber holds can dangle.
        match unsafe { b.spawn_unchecked_at(&self.rt, f, Location::caller(), None) } {
            Ok(h) => h,
            Err(e) => {
                // The job went with the closure.
                if held == Held::SlotAndJob {
                    self.release();
                }
                self.job_done();
                panic!("failed to spawn a pool fiber: {e}")
            }
        }
    }

    fn try_acquire(&self) -> bool {
        let max = self.max.load(Ordering::Relaxed);
        // Relaxed: a slot guards no data (jobs travel through the queue or the spawn); the
        // fences in `pump` order it against the queue.
        self.active.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |a| (a < max).then_some(a + 1)).is_ok()
    }

    fn release(&self) {
        self.active.fetch_sub(1, Ordering::Relaxed);
    }

    fn pop(&self) -> Option<Entry> {
        loop {
            match self.queue.steal() {
                Steal::Success(e) => {
                    self.queued.fetch_sub(1, Ordering::Relaxed);
                    return Some(e);
                }
                Steal::Empty => return None,
                Steal::Retry => std::hint::spin_loop(),
            }
        }
    }

    /// The pool's runtime is being dropped (a fiber of the pool's is unwound, or its unstarted
    /// closure dropped): drop what is queued and wake the joiners, which return, since the
    /// jobs pending will never finish (`join` waited for ever).
    fn stopped(&self) {
        self.drop_queued_if_stopped();
        self.wake_joiners();
    }

    /// Ends the joiners' wait (`join` returns once `generation` moved).
    fn wake_joiners(&self) {
        let joiners = {
            let mut synced = self.synced();
            synced.generation += 1;
            std::mem::take(&mut synced.joiners)
        };
        for j in joiners {
            j.unpark();
        }
    }

    /// Drops the queued entries if the pool's runtime has been dropped (nothing will run them):
    /// a scoped job's drop tells its scope, which a runtime's drop may be unwinding and which
    /// waits for its jobs' closures to be gone.
    fn drop_queued_if_stopped(&self) {
        if self.rt.is_shut_down() {
            while let Some(e) = self.pop() {
                drop(e);
            }
        }
    }

    /// Queues an entry and starts it if a slot is free.
    fn submit(self: &Arc<Self>, e: Entry) {
        // Holds the pool busy while `pump` may hold a slot that finds the entry gone, so that
        // a joiner never sees it idle with a slot taken.
        self.pending.fetch_add(1, Ordering::Relaxed);
        self.queued.fetch_add(1, Ordering::Relaxed);
        self.queue.push(e);
        self.pump();
        self.job_done();
    }

    /// Starts queued entries while a slot is free. Called after anything that may have made
    /// both an entry and a free slot visible: a push, a slot given back, a raised bound.
    fn pump(self: &Arc<Self>) {
        loop {
            // SeqCst: the Dekker pair of the module doc. Acquire/Release cannot stop both the
            // submitter's read of `active` and the releaser's read of the queue from missing
            // the other's write.
            fence(Ordering::SeqCst);
            if self.queue.is_empty() || !self.try_acquire() {
                return;
            }
            match self.pop() {
                Some(e) => self.dispatch(e),
                // Someone else took it: give the slot back and look again.
                None => self.release(),
            }
        }
    }

    /// Hands a slot the caller holds to an entry.
    fn dispatch(self: &Arc<Self>, e: Entry) {
        match e {
            Entry::Job(job) => {
                let shared = Arc::clone(self);
                self.start(Held::SlotAndJob, move || shared.work(job));
            }
            Entry::Ticket { granted, fiber } => Shared::grant(&granted, &fiber),
        }
    }

    fn grant(granted: &AtomicBool, fiber: &Fiber) {
        // Release pairs with the Acquire load in the ticket's wait loop.
        granted.store(true, Ordering::Release);
        fiber.unpark();
    }

    /// The body of a fiber that holds a slot: runs `first`, then the queued jobs after it,
    /// until the queue is empty or the bound was lowered.
    fn work(self: Arc<Self>, first: impl FnOnce()) {
        self.run(first);
        let mut in_a_row = 1;
        loop {
            match self.next_entry() {
                Some(Entry::Job(job)) => {
                    if in_a_row % YIELD_EVERY == 0 {
                        crate::fiber::park::yield_now();
                    }
                    in_a_row += 1;
                    self.run(job);
                }
                Some(Entry::Ticket { granted, fiber }) => return Shared::grant(&granted, &fiber),
                None => return,
            }
        }
    }

    /// The body of a `spawn`ed job once it holds a slot.
    fn run_spawned<T>(self: Arc<Self>, f: impl FnOnce() -> T) -> T {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(v) => {
                self.after_spawned();
                v
            }
            Err(p) => {
                let p = self.count_panic(p);
                self.after_spawned();
                // The join handle gets the payload.
                resume_unwind(p)
            }
        }
    }

    fn after_spawned(self: &Arc<Self>) {
        // The join handle waits for this fiber: another fiber takes over the slot.
        if let Some(e) = self.next_entry() {
            self.dispatch(e);
        }
    }

    fn run(&self, job: impl FnOnce()) {
        if let Err(p) = catch_unwind(AssertUnwindSafe(job)) {
            drop(self.count_panic(p));
        }
    }

    /// Counts a job's panic, unless it is the runtime's drop unwinding the fiber, which must
    /// go on unwinding.
    fn count_panic(&self, p: Box<dyn Any + Send>) -> Box<dyn Any + Send> {
        if cancelling() {
            resume_unwind(p);
        }
        // Ordered before `join` returns by `job_done`'s AcqRel decrement, which follows.
        self.panics.fetch_add(1, Ordering::Relaxed);
        p
    }

    /// A slot holder's job is done: returns the entry to hand the slot to, or `None` once the
    /// slot is given back; then marks the job finished.
    fn next_entry(self: &Arc<Self>) -> Option<Entry> {
        let max = self.max.load(Ordering::Relaxed);
        let over =
            self.active.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |a| (a > max).then(|| a - 1));
        let next = match over {
            // The bound was lowered: this slot goes, and the others, still at or over it, go
            // on. `pump` still looks, as the bound read above may be stale: one raised since
            // then pumped before this slot was free.
            Ok(_) => {
                self.pump();
                None
            }
            Err(_) => self.pop().or_else(|| {
                self.release();
                self.pump();
                None
            }),
        };
        // After the slot was given back, so that a joiner sees no slot taken once idle.
        self.job_done();
        next
    }

    fn job_done(&self) {
        // AcqRel: Release publishes the job's effects to the joiner's Acquire load; Acquire
        // orders the whole pool's work before the wake-up below.
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.wake_joiners();
        }
    }
}

/// Whether the runtime's drop is unwinding the current fiber (its unwind must not be caught).
fn cancelling() -> bool {
    !context::cancelling().is_null()
}

impl PartialEq for ThreadPool {
    /// Whether both handles refer to the same pool.
    fn eq(&self, other: &ThreadPool) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl Eq for ThreadPool {}

impl fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThreadPool")
            // threadpool's fields, in its order: code and tests compare the text.
            .field("name", &self.shared.fiber_name)
            .field("queued_count", &self.queued_count())
            .field("active_count", &self.active_count())
            .field("max_count", &self.max_count())
            .finish()
    }
}
