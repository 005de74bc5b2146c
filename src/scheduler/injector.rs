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
