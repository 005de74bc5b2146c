//! Which carriers sleep, which search for work, and whom to wake.
//!
//! The protocol (tokio's and Go's shape; proof sketch in `arch/scheduler.md`):
//! 1. A carrier that finds no work registers as a sleeper (under the `sleepers` lock, which
//!    also bumps the sleeping count with a SeqCst RMW), then checks every queue once more, and
//!    only then parks its thread.
//! 2. Whoever makes work available pushes it, then (SeqCst fence) reads the counts: if nobody
//!    is searching and someone sleeps, it pops one sleeper, counts it as searching, and unparks
//!    its thread. One, not all: no thundering herd.
//! 3. A searching carrier that finds work stops searching and, if it was the last searcher,
//!    wakes one more sleeper (the work may be more than it can take).
//!
//! Either the waker sees the sleeper (step 2) or the sleeper's re-check sees the work (step 1);
//! std's thread park token covers an unpark that lands before the park. At most half the
//! carriers search at once, so an idle runtime does not burn every core stealing.
//!
//! The atomics and the lock come from `crate::loom`, so the loom models
//! (`tests/loom_idle.rs`) run this very `Idle` (what they cover: `arch/loom.md`).

use crate::loom::{AtomicUsize, Mutex, Ordering, fence};

/// Low half: searching carriers; high half: sleeping carriers.
const SLEEPER: usize = 1 << 32;
const SEARCHING_MASK: usize = SLEEPER - 1;

pub(crate) struct Idle {
    /// `searching | sleeping << 32`. Read on every notify (a line all carriers read, written
    /// only when a carrier goes to sleep or wakes).
    counts: AtomicUsize,
    sleepers: Mutex<Vec<usize>>,
    carriers: usize,
}

/// What happened to a carrier that tried to stop sleeping on its own.
pub(crate) enum Unregister {
    /// It took itself off the list: it is neither sleeping nor searching.
    Removed,
    /// Someone had already popped it and counted it as searching.
    WasNotified,
}

impl Idle {
    pub(crate) fn new(carriers: usize) -> Idle {
        Idle { counts: AtomicUsize::new(0), sleepers: Mutex::new(Vec::with_capacity(carriers)), carriers }
    }

    /// Step 2: after making work visible, wake one sleeper if nobody is searching.
    /// Returns the carrier to unpark. `Shared::notify` makes its two steps itself, so that the
    /// first (a fence, a load and a test: `notify_needed`) is inlined into every spawn and the
    /// second is a call only when a sleeper must be woken; the loom models call this.
    #[cfg_attr(not(loom), allow(dead_code))]
    pub(crate) fn notify_one(&self) -> Option<usize> {
        if !self.notify_needed() {
            return None;
        }
        self.pop_sleeper()
    }

    /// `notify_one`'s first step, apart so that its callers can inline it: whether a sleeper
    /// must be woken (nobody searches and someone sleeps).
    #[inline]
    pub(crate) fn notify_needed(&self) -> bool {
        // Pairs with the SeqCst RMW in `register`: either we see the sleeper or it sees our work.
        fence(Ordering::SeqCst);
        wake_needed(self.counts.load(Ordering::Relaxed))
    }

    pub(crate) fn pop_sleeper(&self) -> Option<usize> {
        let mut s = self.sleepers.lock().unwrap_or_else(|e| e.into_inner());
        let i = s.pop()?;
        // One sleeper becomes one searcher.
        self.counts.fetch_sub(SLEEPER - 1, Ordering::SeqCst);
        Some(i)
    }

    /// Wakes a specific carrier if it sleeps (work was put in its private inbox). Returns true
    /// if the caller must unpark it.
    ///
    /// Most such wakes find no carrier asleep, and the lock is skipped then: the pusher's fence
    /// and the sleeper's registration (a SeqCst RMW, then a fenced re-check of its inbox) are
    /// step 2's store-buffering pair, so either this sees `sleeping > 0` or the sleeper's
    /// re-check sees the pushed fiber.
    pub(crate) fn notify_carrier(&self, index: usize) -> bool {
        fence(Ordering::SeqCst);
        if self.counts.load(Ordering::Relaxed) < SLEEPER {
            return false;
        }
        let mut s = self.sleepers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pos) = s.iter().position(|&i| i == index) {
            s.swap_remove(pos);
            self.counts.fetch_sub(SLEEPER - 1, Ordering::SeqCst);
            true
        } else {
            false
        }
    }

    /// Step 1, first half.
    pub(crate) fn register(&self, index: usize) {
        let mut s = self.sleepers.lock().unwrap_or_else(|e| e.into_inner());
        s.push(index);
        self.counts.fetch_add(SLEEPER, Ordering::SeqCst);
    }

    /// A registered carrier that found work on its re-check, or that woke by timeout.
    pub(crate) fn unregister(&self, index: usize) -> Unregister {
        let mut s = self.sleepers.lock().unwrap_or_else(|e| e.into_inner());
        match s.iter().position(|&i| i == index) {
            Some(pos) => {
                s.swap_remove(pos);
                self.counts.fetch_sub(SLEEPER, Ordering::SeqCst);
                Unregister::Removed
            }
            None => Unregister::WasNotified,
        }
    }

    /// Tries to become a searcher; refused when half the carriers already search.
    pub(crate) fn try_search(&self) -> bool {
        let c = self.counts.load(Ordering::Relaxed);
        if 2 * (c & SEARCHING_MASK) >= self.carriers {
            return false;
        }
        self.counts.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// A carrier thread about to start counts as searching from the moment it is spawned
    /// (`Shared::start_carrier`): until its loop runs it is neither busy nor asleep, and a busy
    /// carrier that saw no idle one would start every fiber it spawned itself, where they would
    /// stay (`Carrier::next_local`). Its first search ends it as any search does.
    pub(crate) fn start_searching(&self) {
        self.counts.fetch_add(1, Ordering::SeqCst);
    }

    /// Whether some carrier is idle (searching or asleep): a hint, read without a fence.
    #[inline]
    pub(crate) fn any_idle(&self) -> bool {
        self.counts.load(Ordering::Relaxed) != 0
    }

    /// Carriers sleeping now.
    pub(crate) fn sleeping_count(&self) -> usize {
        self.counts.load(Ordering::SeqCst) / SLEEPER
    }

    /// Whether a carrier could start searching now.
    pub(crate) fn can_search(&self) -> bool {
        2 * (self.counts.load(Ordering::SeqCst) & SEARCHING_MASK) < self.carriers
    }

    /// Stops searching. Returns true if this was the last searcher (step 3).
    pub(crate) fn stop_search(&self) -> bool {
        self.counts.fetch_sub(1, Ordering::SeqCst) & SEARCHING_MASK == 1
    }
}

/// Whether counts `c` have nobody searching and someone sleeping: `c & SEARCHING_MASK == 0 &&
/// c >= SLEEPER` as one compare. Rotated, the sleepers are the low half and the searchers the
/// high, and the word lies in 1..2^32 exactly then (every spawn's test: 5 instructions, not 7).
#[inline(always)]
fn wake_needed(c: usize) -> bool {
    const _: () = assert!(SLEEPER == 1 << 32 && usize::BITS == 64);
    c.rotate_right(32).wrapping_sub(1) < SEARCHING_MASK
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{SEARCHING_MASK, SLEEPER, wake_needed};

    #[test]
    fn the_rotated_test_is_nobody_searching_and_someone_asleep() {
        let halves = [0, 1, 2, 7, SEARCHING_MASK - 1, SEARCHING_MASK];
        for searching in halves {
            for sleeping in halves {
                let c = searching | sleeping << 32;
                let plain = c & SEARCHING_MASK == 0 && c >= SLEEPER;
                assert_eq!(wake_needed(c), plain, "searching {searching}, sleeping {sleeping}");
            }
        }
    }
}

#[cfg(all(test, loom))]
#[path = "tests/loom_idle.rs"]
pub(crate) mod loom_tests;
