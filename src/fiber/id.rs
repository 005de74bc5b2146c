//! Fiber ids: unique for the life of the process, handed out in blocks so that spawning
//! touches no counter shared by all carriers.

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
