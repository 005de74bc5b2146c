//! The partitioned global injector: work from outside the carriers, and local-queue overflow.
//!
//! One queue per shard, each on its own cache line, so submitters on different threads do not
//! fight over one queue (tokio's single mutex-guarded injector is a known contention point).
//! A plain thread picks a shard once (a per-thread hint, no shared counter); a carrier spills
//! to its own shard. Carriers drain every shard, each starting at its own, so shards are served
//! fairly and do not all get hit at the same index.
//!
//! A shard is an intrusive FIFO: fibers are linked through their record's `next` field, so no
//! push or steal allocates (crossbeam's injector allocated a block every 63 pushes and freed it
//! when drained, which put malloc and free on the spill path of every busy carrier). Its head
//! and tail sit under a small lock; a carrier's spill links 128 fibers privately (a [`Chain`])
//! and appends them under one acquisition, and a steal detaches up to [`STEAL_BATCH`] under one.
//! Beside the lock, an atomic length lets `is_empty` and the carriers' quick checks read without
//! locking.
//!
//! # Why one `next` field is enough
//! A fiber is linked into at most one chain at a time, and only its run-queue entry touches
//! `next`. A run-queue entry is the `FiberRef` that stands for "this fiber is runnable and not
//! yet claimed": it is created only by a transition to `RUNNABLE` (spawn; `notify` or
//! `end_compaction` returning true, which only one caller can see, since the transition is a
//! CAS on the state word) or by the carrier a fiber yielded to (`set_yielded`: the fiber stays
//! `RUNNING`, and that carrier is the only one running it), moved from queue to queue (local
//! deque, LIFO slot, inbox, injector, a chain) by pop-then-push, and consumed once, by the
//! claim (`FiberRecord::try_claim`) or by the runtime's drop (`cancel_one`). No transition makes
//! a queued fiber runnable again (`notify` only leaves a token on a `RUNNABLE` or `RUNNING`
//! fiber; the others start from `PARKED` or `COMPACTING`), so a second entry cannot exist
//! before the first is consumed. Hence whoever holds the entry (the chain that owns it, or the
//! lock of the shard whose chain does) is the only one to read or write the fiber's `next`.
//! Every unlink resets `next` to null, so a fiber outside every chain has a null `next`.

use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering, fence};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crossbeam_deque::Worker;

use super::CachePadded;
use crate::fiber::{FiberRecord, FiberRef};

/// Most fibers one `steal_into` takes from a shard (crossbeam's injector took up to 33), so one
/// carrier does not take the whole backlog while the others look on.
const STEAL_BATCH: usize = 32;

/// A FIFO of fibers linked through `FiberRecord::next`, owning one reference (the run-queue
/// entry) to each: a shard's queue under its lock, or a batch a carrier builds privately and
/// hands to `push_batch` whole.
pub(crate) struct Chain {
    /// Pointers from `FiberRef::into_raw`, each standing for a reference this chain owns.
    head: *mut FiberRecord,
    tail: *mut FiberRecord,
    len: usize,
}

// SAFETY: a chain owns `FiberRef`s, which are `Send`, and the `next` links it follows are its
// own to touch wherever it goes (module doc: only the holder of a fiber's run-queue entry
// touches them).
unsafe impl Send for Chain {}

impl Chain {
    pub(crate) const fn new() -> Chain {
        Chain { head: ptr::null_mut(), tail: ptr::null_mut(), len: 0 }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `f`, which must be a run-queue entry: the chain takes it over.
    pub(crate) fn push(&mut self, f: FiberRef) {
        // A fiber already linked somewhere would have a non-null `next` (unless it is a tail):
        // a cheap catch of a second run-queue entry in debug builds.
        debug_assert!(f.next.get().is_null(), "a fiber in two run queues");
        let p = FiberRef::into_raw(f);
        if self.tail.is_null() {
            self.head = p;
        } else {
            // SAFETY: the chain owns a reference to its tail, so the record is live, and its
            // `next` is the chain's to write (module doc).
            unsafe { (*self.tail).next.set(p) };
        }
        self.tail = p;
        self.len += 1;
    }

    /// Takes the oldest fiber out.
    fn pop(&mut self) -> Option<FiberRef> {
        // SAFETY: `head` is null or a pointer from `into_raw` whose reference the chain owns;
        // unlinking it here gives that reference back exactly once.
        let f = unsafe { FiberRef::from_raw(self.head) }?;
        self.head = f.next.replace(ptr::null_mut());
        if self.head.is_null() {
            self.tail = ptr::null_mut();
        }
        self.len -= 1;
        Some(f)
    }

    /// Moves all of `other` to the back of `self`.
    fn append(&mut self, mut other: Chain) {
        if other.is_empty() {
            return;
        }
        if self.tail.is_null() {
            self.head = other.head;
        } else {
            // SAFETY: as in `push`: our tail is live and its `next` is ours.
            unsafe { (*self.tail).next.set(other.head) };
        }
        self.tail = other.tail;
        self.len += other.len;
        // `other`'s references now belong to `self`: leave it empty for its drop.
        other.head = ptr::null_mut();
        other.tail = ptr::null_mut();
        other.len = 0;
    }

    /// Detaches the oldest `n` fibers (`n <= len`) as a chain of their own.
    fn split_front(&mut self, n: usize) -> Chain {
        debug_assert!(n <= self.len);
        if n == self.len {
            return std::mem::replace(self, Chain::new());
        }
        if n == 0 {
            return Chain::new();
        }
        let mut last = self.head;
        for _ in 1..n {
            // SAFETY: `last` is one of the chain's first `n < len` records: live, linked, and
            // its `next` is ours to read.
            last = unsafe { (*last).next.get() };
        }
        // SAFETY: as above; `last` has a successor, since `n < len`.
        let rest = unsafe { (*last).next.replace(ptr::null_mut()) };
        let front = Chain { head: self.head, tail: last, len: n };
        self.head = rest;
        self.len -= n;
        front
    }
}

impl Drop for Chain {
    /// Gives back every reference still linked (a dropped injector, or a chain abandoned by a
    /// panic), oldest first.
    fn drop(&mut self) {
        while self.pop().is_some() {}
    }
}

/// One shard: the chain under a lock, and its length for lock-free looks.
struct Shard {
    queue: Mutex<Chain>,
    /// `queue`'s length, written under the lock after every change. Read without it as a hint
    /// (skip a shard that looks empty) and by `is_empty` after a SeqCst fence, which is what
    /// the idle protocol needs (see `is_empty`).
    len: AtomicUsize,
}

impl Shard {
    fn lock(&self) -> MutexGuard<'_, Chain> {
        // Nothing panics with the lock held (pointer updates only), so a poisoned lock still
        // guards a consistent chain.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn looks_empty(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }
}

pub(crate) struct Injector {
    shards: Box<[CachePadded<Shard>]>,
    mask: usize,
}

impl Injector {
    /// Two shards per carrier, rounded up to a power of two.
    pub(crate) fn new(carriers: usize) -> Injector {
        let n = (carriers * 2).next_power_of_two().max(2);
        let shard = || CachePadded(Shard { queue: Mutex::new(Chain::new()), len: AtomicUsize::new(0) });
        Injector { shards: (0..n).map(|_| shard()).collect(), mask: n - 1 }
    }

    pub(crate) fn shards(&self) -> usize {
        self.shards.len()
    }

    /// Queues one fiber (a plain thread's `schedule_remote`).
    pub(crate) fn push(&self, shard: usize, f: FiberRef) {
        let mut one = Chain::new();
        one.push(f);
        self.push_batch(shard, one);
    }

    /// Appends a whole chain, in its order, under one acquisition of the shard's lock.
    pub(crate) fn push_batch(&self, shard: usize, batch: Chain) {
        if batch.is_empty() {
            return;
        }
        let s = &self.shards[shard & self.mask];
        let mut q = s.lock();
        q.append(batch);
        // Relaxed: the pusher's `notify` fences before it reads the idle counts (`is_empty`).
        s.len.store(q.len(), Ordering::Relaxed);
    }

    /// Takes a batch from the first non-empty shard, starting at `start`: up to half the
    /// shard, at most `STEAL_BATCH`, under one lock. All but the oldest go to `local`, in
    /// order; the oldest is returned to run.
    pub(crate) fn steal_into(&self, start: usize, local: &Worker<FiberRef>) -> Option<FiberRef> {
        for k in 0..self.shards.len() {
            let s = &self.shards[(start + k) & self.mask];
            if s.looks_empty() {
                continue;
            }
            let mut batch = {
                let mut q = s.lock();
                let n = q.len().div_ceil(2).min(STEAL_BATCH);
                let batch = q.split_front(n);
                s.len.store(q.len(), Ordering::Relaxed);
                batch
            };
            // Empty only if another carrier emptied the shard after our look.
            let Some(first) = batch.pop() else { continue };
            while let Some(f) = batch.pop() {
                local.push(f);
            }
            return Some(first);
        }
        None
    }

    /// Takes one fiber (used at shutdown, without a local queue).
    pub(crate) fn pop_any(&self) -> Option<FiberRef> {
        self.shards.iter().filter(|s| !s.looks_empty()).find_map(|s| {
            let mut q = s.lock();
            let f = q.pop();
            s.len.store(q.len(), Ordering::Relaxed);
            f
        })
    }

    /// Whether every shard is empty, as the idle protocol's re-check needs it (`idle.rs`,
    /// steps 1–2): a carrier registers as a sleeper (a SeqCst RMW), then calls this; a pusher
    /// stores the length under the lock, then `notify` fences (SeqCst) and reads the counts.
    /// With a SeqCst fence on both sides, either the pusher sees the sleeper or this sees the
    /// length ([atomics.order]/4.3–4.4; loom models SeqCst fences exactly, see `loom_tests`).
    pub(crate) fn is_empty(&self) -> bool {
        fence(Ordering::SeqCst);
        self.shards.iter().all(|s| s.looks_empty())
    }
}

#[cfg(test)]
mod tests {
    use std::panic::Location;

    use super::*;
    use crate::fiber::FiberId;
    use crate::fiber::{Init, StageVTable};
    use crate::scheduler::{RuntimeRef, Shared};

    static NO_STAGE: StageVTable =
        StageVTable { make: |_, _| unreachable!("never run"), fail: |_, _| {}, drop_result: |_| false };

    /// `n` fibers of `rt` that never run, each held only by the returned reference (its
    /// run-queue entry), so the record goes back to `rt`'s pool when that is dropped.
    fn fibers(rt: &RuntimeRef, n: usize) -> Vec<FiberRef> {
        (0..n)
            .map(|_| {
                let init = Init {
                    id: FiberId::PLACEHOLDER,
                    name: None,
                    spawned_at: Location::caller(),
                    runtime: rt.clone(),
                    class: rt.stacks,
                    vtable: &NO_STAGE,
                    scope: None,
                    since: 0,
                    depth: 0,
                };
                // SAFETY: a record fresh from the runtime's pool: unused and ours.
                let (f, join) = unsafe { FiberRecord::init(rt.alloc_record(), init) };
                // Gives up the fiber's reference to itself; then drop the join handle's.
                FiberRecord::finish_now(&f);
                drop(join);
                f
            })
            .collect()
    }

    /// Records in the runtime's pool: one more for every record whose last reference went.
    fn pooled(rt: &Shared) -> usize {
        rt.records.lock().unwrap().len()
    }

    fn ptrs(fs: &[FiberRef]) -> Vec<*const FiberRecord> {
        fs.iter().map(FiberRef::as_ptr).collect()
    }

    fn chain(fs: Vec<FiberRef>) -> Chain {
        let mut c = Chain::new();
        fs.into_iter().for_each(|f| c.push(f));
        c
    }

    /// A runtime whose carrier never touches the records made here (nothing is spawned on
    /// it); the injectors under test are the tests' own.
    fn runtime() -> crate::Runtime {
        crate::Runtime::builder().carriers(1).build().unwrap()
    }

    #[test]
    fn fifo_batches_steals_and_lengths() {
        let runtime = runtime();
        let rt = runtime.handle().runtime().clone();
        let inj = Injector::new(1);
        assert_eq!(inj.shards(), 2);
        assert!(inj.is_empty() && inj.pop_any().is_none());

        let fs = fibers(&rt, 100);
        let order = ptrs(&fs);
        let mut fs = fs.into_iter();
        // One single push, a batch of 69, one more single push, then a batch of 29, all to the
        // same shard (`3 & mask` is shard 1): FIFO across all four.
        inj.push(1, fs.next().unwrap());
        inj.push_batch(3, chain(fs.by_ref().take(69).collect()));
        inj.push(1, fs.next().unwrap());
        let last = chain(fs.collect());
        assert_eq!(last.len(), 29);
        inj.push_batch(1, last);
        inj.push_batch(1, Chain::new());
        assert_eq!(inj.shards[1].len.load(Ordering::Relaxed), 100);
        assert_eq!(inj.shards[1].lock().len(), 100);
        assert!(inj.shards[0].looks_empty() && !inj.is_empty());

        // Steals from shard 0 onwards find shard 1: half of it, capped at STEAL_BATCH.
        let local = Worker::new_fifo();
        let mut got = Vec::new();
        let mut sizes = Vec::new();
        while let Some(f) = inj.steal_into(0, &local) {
            sizes.push(1 + local.len());
            got.push(f);
            while let Some(f) = local.pop() {
                got.push(f);
            }
        }
        assert_eq!(sizes, [32, 32, 18, 9, 5, 2, 1, 1]);
        assert_eq!(ptrs(&got), order);
        assert!(inj.is_empty() && inj.shards[1].lock().is_empty());

        // Shards stay separate: a steal starting at shard 1 takes shard 1's first.
        let mut got = got.into_iter();
        inj.push_batch(0, chain(got.by_ref().take(3).collect()));
        inj.push_batch(1, chain(got.by_ref().take(2).collect()));
        let f = inj.steal_into(1, &local).unwrap();
        assert_eq!(FiberRef::as_ptr(&f), order[3]);
        assert_eq!(local.len(), 0, "half of 2 is 1: nothing beside the one returned");
        let f = inj.pop_any().unwrap();
        assert_eq!(FiberRef::as_ptr(&f), order[0]);
        assert_eq!([0, 1].map(|i| inj.shards[i].len.load(Ordering::Relaxed)), [2, 1]);
        drop((f, got, local, inj));
    }

    /// Dropping an injector that still holds fibers gives back each reference exactly once:
    /// none while another reference remains (no double release), all once the others go (no
    /// leak). Run under valgrind in the performance log's entry for this change.
    #[test]
    fn dropping_a_nonempty_injector_releases_each_reference_once() {
        let runtime = runtime();
        let rt = runtime.handle().runtime().clone();
        let inj = Injector::new(2);
        let fs = fibers(&rt, 40);
        let kept = fs.clone();
        let pool = pooled(&rt);
        let mut fs = fs.into_iter();
        inj.push_batch(0, chain(fs.by_ref().take(20).collect()));
        inj.push(3, fs.next().unwrap());
        inj.push_batch(2, chain(fs.collect()));
        // A partly stolen shard too, and a private chain that is dropped unpushed.
        let local = Worker::new_fifo();
        let first = inj.steal_into(0, &local).unwrap();
        let mut unpushed = Chain::new();
        unpushed.push(first);
        while let Some(f) = local.pop() {
            unpushed.push(f);
        }
        assert_eq!(unpushed.len(), 10);
        drop(unpushed);
        drop(inj);
        assert_eq!(pooled(&rt), pool, "a record was recycled while referenced");
        drop(kept);
        assert_eq!(pooled(&rt), pool + 40, "a reference was leaked");
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! A push to any shard followed by `notify` is never missed by a carrier that registers as
    //! a sleeper and then checks every shard. Loom cannot run the real shards (their chains
    //! hold fiber records), so each is a loom `Mutex<VecDeque>` beside a loom atomic length,
    //! with the real shard count, mask and scan order and the real orderings: the length is
    //! stored under the lock (Relaxed), a carrier skips a shard whose length reads 0 before
    //! locking it, and the re-check is a SeqCst fence and Relaxed loads of the lengths. The
    //! real shard is a lock too, so only the chain's pointer work is left out. The carriers and
    //! the real `Idle` are the idle model's (`idle::loom_tests`).
    use std::collections::VecDeque;

    use super::super::idle::loom_tests::{Queues, check};
    use crate::sync::loom::{AtomicUsize, Mutex, Ordering, fence};

    struct Shard {
        queue: Mutex<VecDeque<u32>>,
        len: AtomicUsize,
    }

    /// The injector's shape: `Injector::new`'s shard count, `push`'s mask, `steal_into`'s
    /// scan from the carrier's own shard, `is_empty` over all shards.
    struct Shards {
        shards: Box<[Shard]>,
        mask: usize,
    }

    impl Shards {
        fn new(carriers: usize) -> Shards {
            let n = (carriers * 2).next_power_of_two().max(2);
            let shard = || Shard { queue: Mutex::new(VecDeque::new()), len: AtomicUsize::new(0) };
            Shards { shards: (0..n).map(|_| shard()).collect(), mask: n - 1 }
        }

        fn push(&self, shard: usize, f: u32) {
            let s = &self.shards[shard & self.mask];
            let mut q = s.queue.lock().unwrap();
            q.push_back(f);
            s.len.store(q.len(), Ordering::Relaxed);
        }
    }

    impl Queues for Shards {
        fn take_unsearched(&self, me: usize) -> bool {
            (0..self.shards.len()).any(|k| {
                let s = &self.shards[(me + k) & self.mask];
                if s.len.load(Ordering::Relaxed) == 0 {
                    return false;
                }
                let mut q = s.queue.lock().unwrap();
                let took = q.pop_front().is_some();
                s.len.store(q.len(), Ordering::Relaxed);
                took
            })
        }

        fn steal(&self, _me: usize) -> bool {
            false
        }

        fn visible(&self, _me: usize, _can_search: &dyn Fn() -> bool) -> bool {
            fence(Ordering::SeqCst);
            self.shards.iter().any(|s| s.len.load(Ordering::Relaxed) > 0)
        }
    }

    /// Plain threads schedule two fibers (`schedule_remote`: push to the thread's shard, then
    /// `notify`) into the shards that carrier 0 scans last and next to last; each of the two
    /// sleeping carriers must take one.
    #[test]
    fn loom_injector_push_to_any_shard_wakes_a_carrier() {
        check(
            2,
            2,
            2,
            || Shards::new(2),
            |m| {
                for (f, shard) in [(1, 3), (2, 2)] {
                    m.queues.push(shard, f);
                    m.notify();
                }
            },
        );
    }
}
