//! Per-carrier maps of code locations: how many fibers from each spawn site (or `blocking`
//! call site) a carrier started, and how many it was caught blocking in.
//!
//! A fixed open-addressing table of atomics, keyed by `&'static Location` pointer identity:
//! recording allocates nothing, and the supervisor reads every carrier's table without racing
//! its writer. Only the owning carrier inserts keys and bumps counters; the supervisor reads
//! them and writes only the `known` flags.

use std::panic::Location;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// Entries per carrier; a program has few distinct spawn sites. When the table is full, new
/// locations are simply not tracked.
const CAPACITY: usize = 128;
/// Probes before giving up on a key.
const MAX_PROBES: usize = 8;

type Loc = Location<'static>;

/// A known-blocking location and what made it so (summed over carriers by the supervisor, which
/// keeps the list in `Shared::known`).
#[derive(Clone, Debug)]
pub(crate) struct Known {
    pub(crate) location: &'static Location<'static>,
    pub(crate) runs: u64,
    pub(crate) caught: u64,
}

#[derive(Default)]
pub(crate) struct Entry {
    key: AtomicPtr<Loc>,
    /// Fibers from this location that started on this carrier.
    pub(crate) runs: AtomicU64,
    /// Times this carrier was caught blocked while running code from this location.
    pub(crate) caught: AtomicU64,
    /// Set by the supervisor: the location is known to block; compensate as soon as it runs.
    pub(crate) known: AtomicBool,
}

pub(crate) struct LocationMap {
    entries: Box<[Entry]>,
    /// The index of the entry `entry` returned last (owner only): fibers mostly come in runs
    /// from one spawn site, and a key, once stored, never changes, so one compare finds it
    /// again without the hash and the probe (`arch/performance.md`, the floor's log). Always
    /// below `CAPACITY`, the length of `entries`, so read without a bounds check. (A pointer
    /// into `entries` would save the scaling too, but one taken before the map moves, and with
    /// it the box, is not guaranteed to stay valid under Rust's aliasing rules for `Box`.)
    last: AtomicUsize,
}

impl Default for LocationMap {
    fn default() -> LocationMap {
        LocationMap { entries: (0..CAPACITY).map(|_| Entry::default()).collect(), last: AtomicUsize::new(0) }
    }
}

fn slot_of(loc: &'static Loc) -> usize {
    let p = loc as *const Loc as usize as u64;
    ((p >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57) as usize % CAPACITY
}

/// Counts one run of a fiber from `e`'s location (owner side: single writer).
pub(crate) fn count_run(e: &Entry) {
    e.runs.store(e.runs.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

impl LocationMap {
    /// The entry for `loc`, inserting it (owner only). `None` when the table is full around it.
    #[inline]
    pub(crate) fn entry(&self, loc: &'static Loc) -> Option<&Entry> {
        // SAFETY: `last` is always below `CAPACITY` (see the field), the length of `entries`
        // (`default` builds exactly that many, and nothing changes them).
        let e = unsafe { self.entries.get_unchecked(self.last.load(Ordering::Relaxed)) };
        if std::ptr::eq(e.key.load(Ordering::Relaxed), loc) {
            return Some(e);
        }
        self.find(loc)
    }

    /// `entry` for a location other than the last one asked for.
    #[inline(never)]
    fn find(&self, loc: &'static Loc) -> Option<&Entry> {
        let want = loc as *const Loc as *mut Loc;
        let start = slot_of(loc);
        for k in 0..MAX_PROBES {
            let i = (start + k) % CAPACITY;
            let e = &self.entries[i];
            let key = e.key.load(Ordering::Relaxed);
            if key.is_null() {
                // Release: the supervisor that sees the key (Acquire) sees zeroed counters.
                e.key.store(want, Ordering::Release);
            } else if key != want {
                continue;
            }
            self.last.store(i, Ordering::Relaxed);
            return Some(e);
        }
        None
    }

    /// Every tracked location with its entry (supervisor side).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&'static Loc, &Entry)> {
        self.entries.iter().filter_map(|e| {
            let k = e.key.load(Ordering::Acquire);
            // SAFETY: keys are only ever `&'static Location` pointers stored by `entry`.
            (!k.is_null()).then(|| (unsafe { &*k }, e))
        })
    }

    /// Counts a run of `loc` and says whether it is known-blocking (the carrier does both
    /// with one `entry` at a fiber's first run; the unit tests use this).
    #[cfg(test)]
    pub(crate) fn record_run(&self, loc: &'static Loc) -> bool {
        match self.entry(loc) {
            Some(e) => {
                count_run(e);
                e.known.load(Ordering::Relaxed)
            }
            None => false,
        }
    }

    pub(crate) fn record_caught(&self, loc: &'static Loc) {
        if let Some(e) = self.entry(loc) {
            e.caught.store(e.caught.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn here() -> &'static Loc {
        Location::caller()
    }

    #[test]
    fn counts_runs_and_catches_per_location() {
        let m = LocationMap::default();
        let a = here();
        let b = here();
        assert!(!std::ptr::eq(a, b));
        for _ in 0..3 {
            m.record_run(a);
        }
        m.record_run(b);
        m.record_caught(a);
        let mut seen: Vec<_> = m
            .iter()
            .map(|(l, e)| (l.line(), e.runs.load(Ordering::Relaxed), e.caught.load(Ordering::Relaxed)))
            .collect();
        seen.sort();
        assert_eq!(seen, vec![(a.line(), 3, 1), (b.line(), 1, 0)]);
    }
}
