//! The partitioned global injector: work from outside the carriers, and local-queue overflow.
//!
//! One queue per shard, each on its own cache line, so submitters on different threads do not
//! fight over one queue (tokio's single mutex-guarded injector is a known contention point).
//! A plain thread picks a shard once (a per-thread hint, no shared counter); a carrier spills
//! to its own shard. Carriers drain every shard, each starting at its own, so shards are served
//! fairly and do not all get hit at the same index.

use crossbeam_deque::{Injector as Queue, Steal, Worker};

use super::CachePadded;
use crate::fiber::FiberRef;

pub(crate) struct Injector {
    shards: Box<[CachePadded<Queue<FiberRef>>]>,
    mask: usize,
}

impl Injector {
    /// Two shards per carrier, rounded up to a power of two.
    pub(crate) fn new(carriers: usize) -> Injector {
        let n = (carriers * 2).next_power_of_two().max(2);
        Injector { shards: (0..n).map(|_| CachePadded(Queue::new())).collect(), mask: n - 1 }
    }

    pub(crate) fn shards(&self) -> usize {
        self.shards.len()
    }

    pub(crate) fn push(&self, shard: usize, f: FiberRef) {
        self.shards[shard & self.mask].push(f);
    }

    /// Takes a batch from the first non-empty shard, starting at `start`, into `local`, and
    /// returns one fiber to run.
    pub(crate) fn steal_into(&self, start: usize, local: &Worker<FiberRef>) -> Option<FiberRef> {
        for k in 0..self.shards.len() {
            let shard = &self.shards[(start + k) & self.mask];
            loop {
                match shard.steal_batch_and_pop(local) {
                    Steal::Success(f) => return Some(f),
                    Steal::Empty => break,
                    Steal::Retry => std::hint::spin_loop(),
                }
            }
        }
        None
    }

    /// Takes one fiber (used at shutdown, without a local queue).
    pub(crate) fn pop_any(&self) -> Option<FiberRef> {
        for shard in self.shards.iter() {
            loop {
                match shard.steal() {
                    Steal::Success(f) => return Some(f),
                    Steal::Empty => break,
                    Steal::Retry => std::hint::spin_loop(),
                }
            }
        }
        None
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.shards.iter().all(|s| s.is_empty())
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! A push to any shard followed by `notify` is never missed by a carrier that registers as
    //! a sleeper and then checks every shard. Loom cannot instrument crossbeam's `Injector`, so
    //! each shard is a loom `Mutex<VecDeque>` with the real shard count, mask and scan order;
    //! the carriers and the real `Idle` are the idle model's (`idle::loom_tests`). The lock
    //! orders a push and a re-check more strongly than crossbeam's SeqCst tail CAS and loads
    //! do; `arch/loom.md` says why the protocol holds for those too.
    use std::collections::VecDeque;

    use super::super::idle::loom_tests::{Queues, check};
    use crate::sync::loom::Mutex;

    /// The injector's shape: `Injector::new`'s shard count, `push`'s mask, `steal_into`'s
    /// scan from the carrier's own shard, `is_empty` over all shards.
    struct Shards {
        shards: Box<[Mutex<VecDeque<u32>>]>,
        mask: usize,
    }

    impl Shards {
        fn new(carriers: usize) -> Shards {
            let n = (carriers * 2).next_power_of_two().max(2);
            Shards { shards: (0..n).map(|_| Mutex::new(VecDeque::new())).collect(), mask: n - 1 }
        }

        fn push(&self, shard: usize, f: u32) {
            self.shards[shard & self.mask].lock().unwrap().push_back(f);
        }
    }

    impl Queues for Shards {
        fn take_unsearched(&self, me: usize) -> bool {
            (0..self.shards.len())
                .any(|k| self.shards[(me + k) & self.mask].lock().unwrap().pop_front().is_some())
        }

        fn steal(&self, _me: usize) -> bool {
            false
        }

        fn visible(&self, _me: usize, _can_search: &dyn Fn() -> bool) -> bool {
            !self.shards.iter().all(|s| s.lock().unwrap().is_empty())
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
