//! A push to any shard followed by `notify` is never missed by a carrier that registers as
//! a sleeper and then checks every shard. Loom cannot run the real shards (they hold fiber
//! records), so each is a loom `Mutex<VecDeque>` beside a loom atomic length,
//! with the real shard count, mask and scan order and the real orderings: the length is
//! stored under the lock (Relaxed), a carrier skips a shard whose length reads 0 before
//! locking it, and the re-check is a SeqCst fence and Relaxed loads of the lengths. The
//! real shard is the same ring under a lock, with fibers for numbers. The carriers and
//! the real `Idle` are the idle model's (`queue/tests/loom_idle.rs`).
use std::collections::VecDeque;

use crate::loom::{AtomicUsize, Mutex, Ordering, fence};
use crate::scheduler::queue::idle::loom_tests::{Queues, check};

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
