//! Fiber ids: unique for the life of the process, handed out in blocks so that spawning
//! touches no counter shared by all carriers.

use std::cell::Cell;
use std::fmt;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};

/// A fiber's identifier: unique for the life of the process, never reused, and ordered by
/// creation within each carrier's block of ids (blocks are handed out in increasing order).
/// Plain OS threads that call [`current`](crate::current) get one too.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FiberId(pub(crate) NonZeroU64);

impl FiberId {
    /// Stands in an unused record; never handed out (ids start at 1, this is `u64::MAX`).
    pub(crate) const PLACEHOLDER: FiberId = FiberId(NonZeroU64::MAX);

    /// The id as a number, e.g. for logs.
    pub fn as_u64(self) -> u64 {
        self.0.get()
    }
}

impl fmt::Debug for FiberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FiberId({})", self.0)
    }
}

impl fmt::Display for FiberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Ids are handed out in blocks so that spawning touches no counter shared by all carriers.
pub(crate) const ID_BLOCK: u64 = 1024;
static NEXT_ID_BLOCK: AtomicU64 = AtomicU64::new(1);

/// Reserves a block of ids `[start, start + ID_BLOCK)`.
pub(crate) fn reserve_ids() -> (u64, u64) {
    let start = NEXT_ID_BLOCK.fetch_add(ID_BLOCK, Ordering::Relaxed);
    (start, start + ID_BLOCK)
}

/// Takes the next id from a block, refilling it when it runs out.
#[inline]
pub(crate) fn next_id(block: &mut (u64, u64)) -> FiberId {
    if block.0 == block.1 {
        *block = reserve_ids();
    }
    let id = block.0;
    block.0 += 1;
    FiberId(NonZeroU64::new(id).expect("ids start at 1"))
}

/// A block of ids a carrier hands out, one per spawn: a test, and one store per id (a block
/// kept as one pair was stored back whole, and its id tested for zero).
#[derive(Default)]
pub(crate) struct IdBlock {
    /// The next id to hand out; equal to `end` when the block is used up (or, `(0, 0)`, not
    /// reserved yet), so an id handed out is never 0: blocks start at 1 and only grow.
    next: Cell<u64>,
    end: Cell<u64>,
}

impl IdBlock {
    #[inline]
    pub(crate) fn take(&self) -> FiberId {
        let id = self.next.get();
        if id == self.end.get() {
            return self.refill();
        }
        self.next.set(id + 1);
        // SAFETY: `id` lies in a reserved block (`next` differs from `end`), whose ids are at
        // least 1 (see `next`).
        FiberId(unsafe { NonZeroU64::new_unchecked(id) })
    }

    /// The block is used up: reserves the next one and hands out its first id.
    #[cold]
    #[inline(never)]
    fn refill(&self) -> FiberId {
        let (start, end) = reserve_ids();
        self.next.set(start + 1);
        self.end.set(end);
        FiberId(NonZeroU64::new(start).expect("ids start at 1"))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{ID_BLOCK, IdBlock};

    #[test]
    fn a_block_hands_out_increasing_ids_across_its_refills() {
        let block = IdBlock::default();
        let ids: Vec<u64> = (0..2 * ID_BLOCK + 3).map(|_| block.take().as_u64()).collect();
        assert!(ids[0] >= 1);
        // Within a block one after another; a refill's block lies above (others reserve too).
        assert!(ids.windows(2).all(|w| w[1] > w[0]), "not increasing: {ids:?}");
        let contiguous = ids.windows(2).filter(|w| w[1] == w[0] + 1).count() as u64;
        assert!(contiguous >= 2 * ID_BLOCK - 1, "{contiguous} steps of one");
    }
}
