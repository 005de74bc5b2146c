//! The partitioned global injector: work from outside the carriers, and local-queue overflow.
//!
//! One queue per shard, each on its own cache line, so submitters on different threads do not
//! fight over one queue (tokio's single mutex-guarded injector is a known contention point).
//! A plain thread picks a shard once (a per-thread hint, no shared counter); a carrier spills
//! to its own shard. Carriers drain every shard, each starting at its own, so shards are served
//! fairly and do not all get hit at the same index.
//!
//! A shard is a ring of fiber pointers (`VecDeque<FiberRef>`) under a small lock, beside an
//! atomic length that lets `is_empty` and the carriers' quick checks read without locking. A
//! carrier's spill gathers 128 pointers privately (a [`Batch`], allocated once per carrier)
//! and appends them under one acquisition; a steal copies up to [`STEAL_BATCH`] out under one
//! (a whole spill, [`LONE_STEAL_BATCH`], in a runtime of one carrier).
//! Neither touches the fibers' records: an earlier intrusive list (fibers linked through a
//! field of their records) allocated nothing either, but a spill wrote 128 records that had
//! sat in the deque long enough to be cold, and a steal walked its batch's links under the
//! lock, a cache miss per fiber in series (`arch/performance.md`). A ring
//! allocates only when a shard outgrows every length it had before (it keeps its capacity;
//! one that drained after a burst gives back what is well past its present need).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering, fence};
use std::sync::{MutexGuard, PoisonError};

use crate::loom::StdMutex as Mutex;

use super::CachePadded;
use super::queue::run_queue::Local;
use crate::fiber::FiberRef;

/// Most fibers one `steal_into` takes from a shard (crossbeam's injector took up to 33), so one
/// carrier does not take the whole backlog while the others look on.
const STEAL_BATCH: usize = 32;

/// The same in a runtime of one carrier, where no other carrier looks on: a whole spill
/// (half the deque), so that the fibers a spawner's full deque spilled come back in one
/// steal, not four, each of which ran the idle search's checks after the deque ran dry
/// (`arch/performance.md`). A spare started while that carrier blocks steals from its deque as
/// from any other's.
const LONE_STEAL_BATCH: usize = super::queue::run_queue::CAPACITY / 2;

/// A ring keeps capacity for this many fibers however far it drains, so the steady state of a
/// busy runtime never allocates; past it, a ring that drained to an eighth of its capacity
/// halves it (amortised: a burst of a million spawns does not hold 8 MB for ever).
const KEEP_CAPACITY: usize = 4096;

/// Fibers gathered privately for one `push_batch` (a carrier's spill, its flush when retiring).
/// Owns one run-queue entry per fiber; the carrier keeps one and reuses its buffer.
pub(crate) type Batch = Vec<FiberRef>;

/// One shard: the ring under a lock, and its length for lock-free looks.
struct Shard {
    queue: Mutex<VecDeque<FiberRef>>,
    /// `queue`'s length, written under the lock after every change. Read without it as a hint
    /// (skip a shard that looks empty) and by `is_empty` after a SeqCst fence, which is what
    /// the idle protocol needs (see `is_empty`).
    len: AtomicUsize,
}

impl Shard {
    fn lock(&self) -> MutexGuard<'_, VecDeque<FiberRef>> {
        // Nothing panics with the lock held (a growth that cannot allocate aborts), so a
        // poisoned lock still guards a consistent ring.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn looks_empty(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }

    /// Stores the length (Relaxed: the pusher's `notify` fences before it reads the idle
    /// counts, see `is_empty`) and gives back capacity a burst left behind.
    fn settle(&self, q: &mut VecDeque<FiberRef>) {
        self.len.store(q.len(), Ordering::Relaxed);
        if q.capacity() > KEEP_CAPACITY && q.len() < q.capacity() / 8 {
            q.shrink_to((q.capacity() / 2).max(KEEP_CAPACITY));
        }
    }
}

pub(crate) struct Injector {
    shards: Box<[CachePadded<Shard>]>,
    mask: usize,
    /// `STEAL_BATCH`, or `LONE_STEAL_BATCH` for one carrier.
    batch: usize,
}

impl Injector {
    /// Two shards per carrier, rounded up to a power of two.
    pub(crate) fn new(carriers: usize) -> Injector {
        let n = (carriers * 2).next_power_of_two().max(2);
        let shard = || CachePadded(Shard { queue: Mutex::new(VecDeque::new()), len: AtomicUsize::new(0) });
        let batch = if carriers == 1 { LONE_STEAL_BATCH } else { STEAL_BATCH };
        Injector { shards: (0..n).map(|_| shard()).collect(), mask: n - 1, batch }
    }

    pub(crate) fn shards(&self) -> usize {
        self.shards.len()
    }

    /// Queues one fiber (a plain thread's `schedule_remote`).
    pub(crate) fn push(&self, shard: usize, f: FiberRef) {
        let s = &self.shards[shard & self.mask];
        let mut q = s.lock();
        q.push_back(f);
        s.len.store(q.len(), Ordering::Relaxed);
    }

    /// Appends the whole of `batch`, in its order, under one acquisition of the shard's lock;
    /// `batch` is left empty, its buffer kept for the next one.
    pub(crate) fn push_batch(&self, shard: usize, batch: &mut Batch) {
        if batch.is_empty() {
            return;
        }
        let s = &self.shards[shard & self.mask];
        let mut q = s.lock();
        q.extend(batch.drain(..));
        s.len.store(q.len(), Ordering::Relaxed);
    }

    /// Takes a batch from the first non-empty shard, starting at `start`: up to half the
    /// shard, at most the batch (`STEAL_BATCH`, `LONE_STEAL_BATCH`) and what fits in `local`,
    /// under one lock. All but the oldest go to `local`, in order; the oldest is returned to
    /// run.
    pub(crate) fn steal_into(&self, start: usize, local: &Local<FiberRef>) -> Option<FiberRef> {
        let room = local.free();
        for k in 0..self.shards.len() {
            let s = &self.shards[(start + k) & self.mask];
            if s.looks_empty() {
                continue;
            }
            let mut q = s.lock();
            // Empty only if another carrier emptied the shard after our look.
            let Some(first) = q.pop_front() else { continue };
            // Pointer copies into our own deque: short enough to do under the lock.
            let n = (q.len() + 1).div_ceil(2).min(self.batch).min(room + 1) - 1;
            // Read from the ring's two slices, not through `drain`, whose every step reloaded
            // the ring's fields (the deque's stores are atomic, so they might have changed):
            // the front `n` are copied into `local`, which owns them from then on, and then
            // leave the ring without being dropped. One `extend` per slice: a chain of the two
            // cost a test of which one it was in per fiber.
            let (a, b) = q.as_slices();
            let k = n.min(a.len());
            for part in [&a[..k], &b[..n - k]] {
                // SAFETY: each of the first `n` entries is read once here, and `forget` below
                // takes it out of the ring without a drop, so each reference has one owner:
                // `local`.
                let rest = local.extend(part.iter().map(|f| unsafe { std::ptr::read(f) }));
                // `n` fits in `local`, so every copy went in (one left over would be lost).
                debug_assert_eq!(rest.len(), 0);
            }
            q.drain(..n).for_each(std::mem::forget);
            s.settle(&mut q);
            return Some(first);
        }
        None
    }

    /// Fibers queued, summed over the shards without their locks (a moment's estimate, for the
    /// supervisor).
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.len.load(Ordering::Relaxed)).sum()
    }

    /// The coarse-clock stamp of the oldest fiber queued here (`FiberRecord::since`, set when it
    /// was queued), if any and if the clock runs (fiber roots on): how long work has waited for
    /// a carrier, for the supervisor. Takes each non-empty shard's lock for a look at its front.
    pub(crate) fn oldest_stamp(&self) -> Option<u64> {
        self.shards
            .iter()
            .filter(|s| !s.looks_empty())
            .filter_map(|s| s.lock().front().map(|f| f.since.load(Ordering::Relaxed)))
            .filter(|&t| t != 0)
            .min()
    }

    /// Takes one fiber (used at shutdown, without a local queue). Takes every shard's lock
    /// until one holds a fiber, without a look at the lengths first: the drop's hand-over with
    /// a spawn that queues at the same moment rests on the lock (`Drain::queues_orphaned`).
    pub(crate) fn pop_any(&self) -> Option<FiberRef> {
        self.shards.iter().find_map(|s| {
            let mut q = s.lock();
            let f = q.pop_front();
            s.settle(&mut q);
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
    use crate::fiber::id::FiberId;
    use crate::fiber::schedule::RuntimeRef;
    use crate::fiber::stage::StageVTable;
    use crate::fiber::{FiberRecord, Init};
    use crate::scheduler::Shared;

    static NO_STAGE: StageVTable =
        StageVTable { run: |_| unreachable!("never run"), fail: |_, _| {}, drop_result: |_| false };

    /// `n` fibers of `rt` that never run, each held only by the returned reference (its
    /// run-queue entry), so the record goes back to `rt`'s pool when that is dropped.
    fn fibers(rt: &RuntimeRef, n: usize) -> Vec<FiberRef> {
        (0..n)
            .map(|_| {
                let init = Init {
                    id: FiberId::PLACEHOLDER,
                    name: None,
                    spawned_at: Location::caller(),
                    runtime: Some(rt.clone()),
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
        inj.push_batch(3, &mut fs.by_ref().take(69).collect());
        inj.push(1, fs.next().unwrap());
        let mut last: Batch = fs.collect();
        assert_eq!(last.len(), 29);
        inj.push_batch(1, &mut last);
        assert!(last.is_empty(), "the batch was taken whole");
        inj.push_batch(1, &mut Batch::new());
        assert_eq!(inj.shards[1].len.load(Ordering::Relaxed), 100);
        assert_eq!(inj.shards[1].lock().len(), 100);
        assert!(inj.shards[0].looks_empty() && !inj.is_empty());

        // Steals from shard 0 onwards find shard 1: half of it (below either cap).
        let (local, _) = crate::scheduler::queue::run_queue::new(256);
        let mut got = Vec::new();
        let mut sizes = Vec::new();
        while let Some(f) = inj.steal_into(0, &local) {
            sizes.push(1 + local.len());
            got.push(f);
            while let Some(f) = local.pop() {
                got.push(f);
            }
        }
        assert_eq!(sizes, [50, 25, 13, 6, 3, 2, 1]);
        assert_eq!(ptrs(&got), order);
        assert!(inj.is_empty() && inj.shards[1].lock().is_empty());

        // Shards stay separate: a steal starting at shard 1 takes shard 1's first.
        let mut got = got.into_iter();
        inj.push_batch(0, &mut got.by_ref().take(3).collect());
        inj.push_batch(1, &mut got.by_ref().take(2).collect());
        let f = inj.steal_into(1, &local).unwrap();
        assert_eq!(FiberRef::as_ptr(&f), order[3]);
        assert_eq!(local.len(), 0, "half of 2 is 1: nothing beside the one returned");
        let f = inj.pop_any().unwrap();
        assert_eq!(FiberRef::as_ptr(&f), order[0]);
        assert_eq!([0, 1].map(|i| inj.shards[i].len.load(Ordering::Relaxed)), [2, 1]);
        drop((f, got, local, inj));
    }

    /// A steal takes half the shard, capped at 32 among several carriers and at a whole spill
    /// (128) for a lone one.
    #[test]
    fn a_steal_is_capped_by_the_number_of_carriers() {
        let runtime = runtime();
        let rt = runtime.handle().runtime().clone();
        for (carriers, want) in [
            (2, &[32, 32, 32, 32, 32, 32, 32, 32, 22, 11, 6, 3, 1, 1][..]),
            (1, &[128, 86, 43, 22, 11, 5, 3, 1, 1][..]),
        ] {
            let inj = Injector::new(carriers);
            inj.push_batch(0, &mut fibers(&rt, 300));
            let (local, _) = crate::scheduler::queue::run_queue::new(256);
            let mut sizes = Vec::new();
            while let Some(f) = inj.steal_into(0, &local) {
                sizes.push(1 + local.len());
                drop(f);
                while local.pop().is_some() {}
            }
            assert_eq!(sizes, want, "{carriers} carriers");
        }
    }

    /// A shard that a burst grew gives the memory back as it drains, down to what the steady
    /// state keeps, so one burst of spawns does not hold its ring for ever.
    #[test]
    fn a_drained_shard_gives_back_what_a_burst_grew() {
        let runtime = runtime();
        let rt = runtime.handle().runtime().clone();
        let inj = Injector::new(1);
        let n = 16 * KEEP_CAPACITY;
        inj.push_batch(0, &mut fibers(&rt, n));
        assert!(inj.shards[0].lock().capacity() >= n);
        let (local, _) = crate::scheduler::queue::run_queue::new(256);
        let mut taken = 0;
        while let Some(f) = inj.steal_into(0, &local) {
            taken += 1 + local.len();
            drop(f);
            while local.pop().is_some() {}
        }
        assert_eq!(taken, n, "every fiber came out once");
        let cap = inj.shards[0].lock().capacity();
        assert!(
            (KEEP_CAPACITY..2 * KEEP_CAPACITY).contains(&cap),
            "capacity {cap} after draining; kept: {KEEP_CAPACITY}"
        );
    }

    /// A steal from a shard whose ring wraps past its end copies both parts in order, and each
    /// reference moves once: none released by the steal, none left behind in the shard.
    #[test]
    fn a_steal_across_the_rings_end_keeps_the_order_and_moves_each_reference_once() {
        let runtime = runtime();
        let rt = runtime.handle().runtime().clone();
        let inj = Injector::new(1);
        let (local, _) = crate::scheduler::queue::run_queue::new(256);
        let first = fibers(&rt, 8);
        let mut order = ptrs(&first);
        inj.push_batch(0, &mut first.into_iter().collect());
        // Take the front half, then fill the ring to its capacity: the back now wraps.
        let mut got = vec![inj.steal_into(0, &local).unwrap()];
        got.extend(std::iter::from_fn(|| local.pop()));
        assert_eq!(got.len(), 4);
        let cap = inj.shards[0].lock().capacity();
        let more = fibers(&rt, cap - 4);
        order.extend(ptrs(&more));
        inj.push_batch(0, &mut more.into_iter().collect());
        assert!(!inj.shards[0].lock().as_slices().1.is_empty(), "the ring wraps");
        let pool = pooled(&rt);
        while let Some(f) = inj.steal_into(0, &local) {
            got.push(f);
            got.extend(std::iter::from_fn(|| local.pop()));
            assert_eq!(pooled(&rt), pool, "a steal released a reference");
        }
        assert_eq!(ptrs(&got), order);
        assert!(inj.is_empty() && inj.shards[0].lock().is_empty());
        drop(got);
        assert_eq!(pooled(&rt), pool + order.len(), "a reference was lost or kept twice");
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
        inj.push_batch(0, &mut fs.by_ref().take(20).collect());
        inj.push(3, fs.next().unwrap());
        inj.push_batch(2, &mut fs.collect());
        // A partly stolen shard too, and a private batch that is dropped unpushed.
        let (local, _) = crate::scheduler::queue::run_queue::new(256);
        let first = inj.steal_into(0, &local).unwrap();
        let mut unpushed = Batch::new();
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
#[path = "tests/loom_injector.rs"]
mod loom_tests;
