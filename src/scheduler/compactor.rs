//! Stack compaction's policy, run by the supervisor: which parked fibers to compact, when, and
//! in what batches. The mechanism (the saved stack, the red zone, the copy back) is the
//! fiber's: `fiber/compact.rs`, whose module doc draws the whole scheme (`arch/compaction.md`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::fiber::schedule::Wake;

use super::{Shared, bump};
use crate::fiber::compact::{SavedStack, red_zone};
use crate::fiber::stack::ARENAS;
use crate::fiber::stage::STAGE_SAVED;
use crate::fiber::{FiberRecord, FiberRef, PARKED};

/// The largest live part compacted. Compaction gives back every page of the stack and keeps
/// the live bytes, so it saves the unused part of the live part's lowest page plus any page
/// below (on average a few KiB), whatever the live part's size, while the copies grow with it:
/// up to 4 pages they stay cheap next to a park that lasted `after` (debug builds need that
/// much: their frames are several times larger).
pub(crate) const MAX_SAVED: usize = 16 * 1024;

/// Fibers held claimed at once: an unpark of one of them waits for the whole batch (copies and
/// one `madvise` per run), so a batch stays well under a millisecond.
const BATCH: usize = 64;

/// Candidates (fibers parked for long enough) per supervisor tick at most: a pass over a
/// million parked fibers would otherwise hold the supervisor (and its blocked-carrier
/// detection) for a second or more. The walk goes on from where it stopped at the next tick.
const BUDGET: usize = 4096;

/// Counters the compactor writes (single writer: the supervisor), summed into `Metrics`.
#[derive(Debug, Default)]
pub(crate) struct CompactionStats {
    pub(crate) compactions: AtomicU64,
    pub(crate) saved_bytes: AtomicU64,
    pub(crate) releases: AtomicU64,
    /// Unparks that found the fiber held by the compactor (it scheduled them when it let go).
    pub(crate) unparks_met: AtomicU64,
}

/// One claimed fiber of a batch.
struct Claimed {
    fiber: FiberRef,
    /// Its stack's usable part.
    low: usize,
    top: usize,
}

/// The supervisor's compaction state.
pub(crate) struct Compactor {
    after: Duration,
    /// Bytes below a parked fiber's recorded stack pointer that are copied too (`red_zone`).
    red_zone: usize,
    /// Earliest next pass.
    next: Instant,
    /// Parks counted over all carriers when the last pass started: a pass finds nothing new
    /// unless some fiber parked since, or the last pass left fibers too young to compact.
    parks_seen: u64,
    young: bool,
    /// Where a pass that ran out of budget stopped in the roots: (shard, index).
    cursor: Option<(usize, usize)>,
    batch: Vec<Claimed>,
    chunk: Vec<std::ptr::NonNull<FiberRecord>>,
    /// Fibers parked for long enough, with the stack pointer they parked at (read unclaimed,
    /// so only a hint for the order: the claim reads it again).
    candidates: Vec<(usize, std::ptr::NonNull<FiberRecord>)>,
}

impl Compactor {
    /// `None` when the runtime does not compact.
    pub(crate) fn new(rt: &Shared) -> Option<Compactor> {
        let after = rt.config.compact_parked_after?;
        Some(Compactor {
            after,
            red_zone: red_zone()?,
            next: later(after),
            parks_seen: 0,
            young: false,
            cursor: None,
            batch: Vec::with_capacity(BATCH),
            chunk: Vec::new(),
            candidates: Vec::new(),
        })
    }

    /// When the next pass is due, or `None` if it would find nothing (nothing parked since the
    /// last one, and nothing left over).
    pub(crate) fn due(&self, rt: &Shared) -> Option<Instant> {
        (self.young || self.cursor.is_some() || parks(rt) != self.parks_seen).then_some(self.next)
    }

    /// Runs a pass if one is due.
    pub(crate) fn run_if_due(&mut self, rt: &Shared) {
        if self.due(rt).is_some_and(|at| at <= Instant::now()) {
            self.pass(rt);
        }
    }

    /// One walk over every fiber record (or over the next `BUDGET` candidates of one):
    /// compacts the fibers parked for longer than `after`, in the order of their stacks'
    /// addresses, so that a batch holds neighbours and their release takes few calls.
    fn pass(&mut self, rt: &Shared) {
        let mut cursor = match self.cursor.take() {
            Some(c) => c,
            None => {
                self.parks_seen = parks(rt);
                self.young = false;
                (0, 0)
            }
        };
        let now = rt.ns_since_epoch(Instant::now());
        let after = self.after.as_nanos().min(u64::MAX as u128) as u64;
        // `since` is the coarse clock at the park (late by up to two supervisor ticks, so a
        // fiber may be compacted that much early).
        let old = |r: &FiberRecord| now.saturating_sub(r.since.load(Ordering::Relaxed)) >= after;
        let mut chunk = std::mem::take(&mut self.chunk);
        let mut candidates = std::mem::take(&mut self.candidates);
        while candidates.len() < BUDGET && rt.roots.chunk(&mut cursor, &mut chunk) {
            for &p in &chunk {
                // SAFETY: records are freed only with the runtime's state, which the
                // supervisor's reference keeps alive; only atomics are read before the claim.
                let r = unsafe { p.as_ref() };
                if r.state_word() != PARKED {
                    continue; // running, runnable, done, unused, or compacted already
                }
                if !old(r) {
                    self.young = true;
                    continue;
                }
                candidates.push((r.parked_sp.load(Ordering::Relaxed), p));
            }
        }
        candidates.sort_unstable_by_key(|&(sp, _)| sp);
        for (_, p) in candidates.drain(..) {
            // SAFETY: as above.
            let r = unsafe { p.as_ref() };
            if !r.try_begin_compaction() {
                continue; // woken meanwhile
            }
            // SAFETY: the claim succeeded on a parked fiber, which holds a reference to itself
            // until it finishes, and it cannot run until we let go.
            let fiber = unsafe { FiberRef::clone_from_ptr(p.as_ptr()) };
            if old(&fiber) {
                self.save(rt, fiber);
            } else {
                // It woke and parked again since the walk saw it.
                self.young = true;
                let_go(rt, fiber);
            }
        }
        self.chunk = chunk;
        self.candidates = candidates;
        self.flush(rt);
        if cursor.0 < rt.roots.shards() {
            // The budget ran out: more next tick, from here.
            self.cursor = Some(cursor);
            self.next = later(rt.config.supervisor_interval);
        } else {
            self.next = later(self.after.max(rt.config.supervisor_interval));
        }
    }

    /// Copies out the live part of a claimed fiber's stack, or lets it go if it must not (or
    /// need not) be compacted.
    fn save(&mut self, rt: &Shared, fiber: FiberRef) {
        // Read again under the claim (the claim's Acquire orders it after the park).
        let sp = fiber.parked_sp.load(Ordering::Relaxed);
        let range = ARENAS.usable_range(sp);
        let eligible = match range {
            Some((low, top)) if fiber.lent.get() == 0 => {
                let at = sp.saturating_sub(self.red_zone).max(low) & !15;
                (top - at <= MAX_SAVED).then_some((low, top, at))
            }
            _ => None,
        };
        let Some((low, top, at)) = eligible else {
            let_go(rt, fiber);
            return;
        };
        // SAFETY: `at..top` lies in the usable part of this fiber's stack (checked above), which
        // is mapped read-write; the fiber is parked and claimed, so nobody writes it meanwhile
        // (the contract of `compact_parked_after`; see the module doc).
        let live = unsafe { std::slice::from_raw_parts(at as *const u8, top - at) };
        let saved = SavedStack { at, bytes: live.into() };
        bump(&rt.compaction.saved_bytes, saved.bytes.len() as u64);
        // A parked fiber's stage is empty: its closure was taken at its first run, and its result
        // is put there only after its last park (`fiber_loop` publishes it and suspends without
        // parking; a result dropped by the fiber is taken out before its destructor, which may
        // park). SAFETY: so, and the claim gives us the record as a carrier has it.
        unsafe { fiber.put_stage(saved, STAGE_SAVED) };
        self.batch.push(Claimed { fiber, low, top });
        if self.batch.len() == BATCH {
            self.flush(rt);
        }
    }

    /// Releases the stacks of the batch, one `madvise` per run of adjacent slots (stacks carved
    /// one after another from an arena are neighbours, guard pages between them), and lets the
    /// fibers go.
    fn flush(&mut self, rt: &Shared) {
        self.batch.sort_unstable_by_key(|c| c.low);
        let page = crate::platform::page_size();
        let mut i = 0;
        while i < self.batch.len() {
            let start = self.batch[i].low;
            let mut end = self.batch[i].top;
            i += 1;
            // The next slot's guard page starts where this one's stack ends.
            while i < self.batch.len() && self.batch[i].low == end + page {
                end = self.batch[i].top;
                i += 1;
            }
            // A failed call leaves the memory as it was: restoring then rewrites the same bytes.
            // SAFETY: `start..end` covers the usable parts of claimed, parked fibers' stacks
            // (live parts saved above, the rest dead) and the guard pages between them, which
            // stay guards; the fibers cannot run until `end_compaction` below.
            let _ = unsafe { crate::platform::release(start, end - start) };
            bump(&rt.compaction.releases, 1);
        }
        for c in self.batch.drain(..) {
            bump(&rt.compaction.compactions, 1);
            if c.fiber.end_compaction(true) {
                // An unpark came while we held it; it left the scheduling to us.
                bump(&rt.compaction.unparks_met, 1);
                // SAFETY: `end_compaction` returned true: we made the fiber runnable. Our own
                // reference (`c.fiber`) drops with `c`.
                let run = unsafe { FiberRef::take_parked_ref(&c.fiber) };
                super::schedule(run, Wake::Unpark);
            }
        }
    }
}

/// `d` from now, or a year from now if that overflows (an `after` of `Duration::MAX` means
/// "never", in practice).
fn later(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d).unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

/// Lets go of a claimed fiber left as it was, scheduling it if an unpark came meanwhile.
fn let_go(rt: &Shared, fiber: FiberRef) {
    if fiber.end_compaction(false) {
        bump(&rt.compaction.unparks_met, 1);
        // SAFETY: `end_compaction` returned true: we made the fiber runnable; `fiber`, our own
        // reference, drops on return.
        let run = unsafe { FiberRef::take_parked_ref(&fiber) };
        super::schedule(run, Wake::Unpark);
    }
}

/// Parks so far, summed over the carriers.
fn parks(rt: &Shared) -> u64 {
    rt.slots.upto(rt.started()).map(|s| s.stats.parks.load(Ordering::Relaxed)).sum()
}
