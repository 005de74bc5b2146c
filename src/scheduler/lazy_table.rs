//! `LazyTable`: a table of up to `capacity` entries whose memory comes in chunks of `CHUNK`
//! the first time an entry of the chunk is needed. A runtime has room for `max_carriers`
//! carriers but starts only what compensation needs: with every slot made up front,
//! `max_carriers(1_000_000)` took 28 s to build and `VT_MAX_CARRIERS=100000000` aborted on an
//! 11 GB allocation. Here the up-front cost is one pointer-sized cell per 64 entries.
//!
//! A chunk, once made, is never moved or freed before the table: `&T`s live as long as it.

use std::sync::OnceLock;

/// Entries per chunk: a carrier slot is a few cache lines, so a chunk is ~20 KiB.
pub(crate) const CHUNK: usize = 64;

pub(crate) struct LazyTable<T> {
    chunks: Box<[OnceLock<Box<[T]>>]>,
    capacity: usize,
}

impl<T> LazyTable<T> {
    /// Room for `capacity` entries; makes none.
    pub(crate) fn new(capacity: usize) -> LazyTable<T> {
        LazyTable { chunks: (0..capacity.div_ceil(CHUNK)).map(|_| OnceLock::new()).collect(), capacity }
    }

    /// How many entries the table can hold.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entry `i`, if its chunk has been made.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.chunks.get(i / CHUNK)?.get()?.get(i % CHUNK)
    }

    /// Entry `i`, making its chunk first if need be: `make(j)` builds entry `j` for every `j` of
    /// the chunk that are below `capacity`, in order. Panics if `i >= capacity`.
    pub(crate) fn get_or_make(&self, i: usize, mut make: impl FnMut(usize) -> T) -> &T {
        assert!(i < self.capacity, "entry {i} of a table of {}", self.capacity);
        let base = i / CHUNK * CHUNK;
        let chunk = self.chunks[i / CHUNK]
            .get_or_init(|| (base..(base + CHUNK).min(self.capacity)).map(&mut make).collect());
        &chunk[i - base]
    }

    /// Entries `0..n` that have been made, in order (a chunk not made ends the walk).
    pub(crate) fn upto(&self, n: usize) -> impl Iterator<Item = &T> {
        self.chunks.iter().map_while(OnceLock::get).flat_map(|c| c.iter()).take(n)
    }

    /// Every entry made so far, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.upto(self.capacity)
    }
}

impl<T> std::ops::Index<usize> for LazyTable<T> {
    type Output = T;

    /// Entry `i`, which must have been made: callers index slots of carriers that started.
    #[inline]
    fn index(&self, i: usize) -> &T {
        match self.get(i) {
            Some(t) => t,
            None => panic!("entry {i} of a lazy table was never made"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_made_on_first_use_and_walks_stop_at_the_first_missing_one() {
        let t: LazyTable<usize> = LazyTable::new(3 * CHUNK + 5);
        assert_eq!(t.capacity(), 3 * CHUNK + 5);
        assert!(t.get(0).is_none());
        assert_eq!(t.iter().count(), 0);
        assert_eq!(*t.get_or_make(1, |j| j * 10), 10);
        assert_eq!(t.get(CHUNK - 1), Some(&((CHUNK - 1) * 10)));
        assert!(t.get(CHUNK).is_none());
        // The last chunk is short: entries past the capacity are never made.
        assert_eq!(*t.get_or_make(3 * CHUNK + 4, |j| j), 3 * CHUNK + 4);
        assert!(t.get(3 * CHUNK + 5).is_none());
        assert_eq!(t.iter().count(), CHUNK, "the walk stops at chunk 1, not made");
        assert_eq!(t.upto(3).copied().collect::<Vec<_>>(), [0, 10, 20]);
        // Made once: a second maker is not called.
        assert_eq!(*t.get_or_make(2, |_| unreachable!()), 20);
        assert_eq!(t[2], 20);
    }

    #[test]
    fn a_million_entries_cost_nothing_until_used() {
        let t: LazyTable<[u8; 4096]> = LazyTable::new(1_000_000);
        assert!(t.get(999_999).is_none());
        assert_eq!(t.get_or_make(999_999, |_| [7; 4096])[0], 7);
    }
}
