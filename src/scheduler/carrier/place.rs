//! Placement by load: a carrier that is home to far more started fibers than another sends
//! fibers about to start to that one (`arch/decisions/0014-placement-by-load.md`).
//!
//! A started fiber never leaves its home (ADR 0003), and a carrier whose fibers keep yielding
//! never goes idle to steal, so a burst of long-lived fibers started on one carrier would stay
//! there. The load is what a carrier's own counters already say: fibers started here less
//! those finished here (`Stats::started`, `Stats::finished`, written by the carrier alone), the
//! started fibers at home here, running, queued or parked. No new write on any hot path.
//!
//! 1. At a first start, the carrier tests the start count it is about to store against
//!    `place_mask`: every `PLACE_EVERY`th start (the mask `PLACE_EVERY - 1`), at every start
//!    while it places (mask 0), never with placement off (mask `u64::MAX`; a count is never 0
//!    there). A load of the mask, an `and` and a branch on a count the start stores anyway.
//! 2. On that cold path (`place`) it compares its load with the others' (relaxed loads of
//!    their counters; carriers held by the supervisor, retired or spares are no candidates):
//!    once its own is above `2 * least + PLACE_SLACK`, and then while it stays above
//!    `least + PLACE_SLACK / 2` (`lighter`), every other fiber about to start is pushed to the
//!    least loaded carrier's injector shard, marked `PLACED`; it looks again every
//!    `PLACE_RECHECK` starts. Keeping every other one bounds the overshoot: the target's load
//!    shows what it was sent only once it starts them.
//! 3. The target starts them at its next look at the injector (every 61 switches of a busy
//!    carrier; an idle one is woken by the push), its own shard first. A `PLACED` fiber is
//!    started wherever it is taken, never placed again: no ping-pong.
//! 4. While placing, the placer leaves the injector alone at its own 61st switch (it would
//!    take back what it placed), and looks at the loads again there: once balanced, or once
//!    the target is held (a hog or a blocked call the supervisor caught), it stops placing and
//!    takes from the injector again.
//! 5. Also there, it watches the target's switch count: one that has not moved for two
//!    supervisor intervals while fibers were placed there means a fiber holds that carrier
//!    (a hog, or a blocked call the supervisor has not caught yet); the placer stops, takes
//!    from the injector again, and leaves that carrier out until its count moves.
//!
//! Never stranded: a placed fiber sits in the injector, which every carrier, the supervisor's
//! spares (`starved_in_injector`), the deadlock report and shutdown see. If its target hogs or
//! blocks before it looks, the placer takes it back after two supervisor intervals (step 5);
//! at the latest the supervisor's hog rule starts a spare that takes it; any idle carrier may
//! take it at any time.

use super::*;
use crate::fiber::PLACED;

/// Starts between looks at the loads while not placing: short-lived fibers pay one test per
/// start and a look at two of their own counters per 64.
pub(super) const PLACE_EVERY: u64 = 64;
/// `place_mask` while not placing.
pub(super) const PLACE_MASK: u64 = PLACE_EVERY - 1;
/// `place_mask` with placement off.
pub(super) const PLACE_OFF: u64 = u64::MAX;
/// Fibers at home beyond twice the least loaded carrier's before a carrier places: two
/// carriers about even never trade, and a fork-join's few live fibers never place.
pub(super) const PLACE_SLACK: u64 = 32;
/// Starts between looks at the loads while placing.
const PLACE_RECHECK: u32 = 16;
/// `place_to` while not placing.
pub(super) const NO_PLACE: usize = usize::MAX;

/// The rule: the least loaded of `others` (index, load), if `mine` is above twice its load plus
/// `PLACE_SLACK`, or, once `placing`, still above its load plus half the slack. The gap between
/// the two is hysteresis: carriers about even never start trading, and a burst that started
/// placing goes on until about even rather than stopping at two to one.
pub(super) fn lighter(mine: u64, others: impl Iterator<Item = (usize, u64)>, placing: bool) -> Option<usize> {
    let (i, least) = others.min_by_key(|&(_, load)| load)?;
    let bound = if placing {
        least.saturating_add(PLACE_SLACK / 2)
    } else {
        least.saturating_mul(2).saturating_add(PLACE_SLACK)
    };
    (mine > bound).then_some(i)
}

/// Started fibers at home on the carrier of `slot`: started there less finished there.
/// Finished first: read racily from another carrier it may be a little old, never negative.
fn load(slot: &CarrierSlot) -> u64 {
    let finished = slot.stats.finished.load(Ordering::Relaxed);
    slot.stats.started.load(Ordering::Relaxed).saturating_sub(finished)
}

impl Carrier {
    /// `place_mask` for a new carrier: off with placement off, with migration (any carrier
    /// takes a started fiber), with one carrier, and on spares (they retire; their fibers are
    /// the blocked carriers' overflow).
    pub(super) fn initial_place_mask(rt: &Shared, index: usize) -> u64 {
        let c = &rt.config;
        if c.place_by_load && !c.migrate_started_fibers && rt.target > 1 && index < rt.target {
            PLACE_MASK
        } else {
            PLACE_OFF
        }
    }

    /// The first-start cold path (step 2): `Ok` when `f` went to another carrier.
    #[cold]
    #[inline(never)]
    pub(super) fn place(&self, f: FiberRef, known: bool) -> Result<(), FiberRef> {
        // A known blocker keeps its own hand-off; a placed fiber is never placed again; one
        // spawned onto this carrier by name (`Builder::carrier`, homed before its first run)
        // stays where its spawner put it.
        if known || f.carrier.load(Ordering::Relaxed) == PLACED || f.home.load(Ordering::Relaxed) != NO_HOME {
            return Err(f);
        }
        let calls = self.place_calls.get() + 1;
        let to = if self.place_to.get() != NO_PLACE && calls < PLACE_RECHECK {
            self.place_calls.set(calls);
            self.place_to.get()
        } else {
            self.place_calls.set(0);
            match self.lightest() {
                Some(to) => to,
                None => return Err(f),
            }
        };
        // Every other one: the kept half raises this carrier's load as the placed half will
        // raise the target's once it starts them.
        if self.place_calls.get() % 2 == 1 {
            return Err(f);
        }
        f.carrier.store(PLACED, Ordering::Relaxed);
        // Claimed by `run_fiber`: queued again as a new fiber is (`set_yielded`'s doc).
        f.set_yielded();
        let stats = &self.slot().stats;
        bump(&stats.placed, 1);
        bump(&stats.injector_pushes, 1);
        self.rt.injector.push(to, f);
        // A push made visible: an idle target (or any sleeper) looks (`arch/scheduler.md`,
        // idle step 2).
        self.rt.notify();
        Ok(())
    }

    /// Looks at the loads (step 2) and sets the placing state from them: the carrier to place
    /// on, if any.
    fn lightest(&self) -> Option<usize> {
        let rt = &self.rt;
        let (shunned, stalled_at) = self.place_shun.get();
        let mine = load(self.slot());
        let placing = self.place_to.get() != NO_PLACE;
        let to = if mine <= PLACE_SLACK / 2 || (!placing && mine <= PLACE_SLACK) {
            None
        } else {
            let n = rt.started().min(rt.target);
            lighter(
                mine,
                rt.slots
                    .upto(n)
                    .enumerate()
                    .filter(|&(i, s)| i != self.index && !s.retired.load(Ordering::Relaxed) && !s.held())
                    .filter(|&(i, s)| i != shunned || s.progress.load(Ordering::Relaxed) != stalled_at)
                    .map(|(i, s)| (i, load(s))),
                placing,
            )
        };
        if let Some(to) = to.filter(|&to| to != self.place_to.get()) {
            // A new target: its switch count is watched from now (step 5).
            let progress = rt.slots[to].progress.load(Ordering::Relaxed);
            self.place_watch.set((progress, rt.ns_since_epoch(Instant::now())));
        }
        self.place_to.set(to.unwrap_or(NO_PLACE));
        self.place_mask.set(if to.is_some() { 0 } else { PLACE_MASK });
        to
    }

    /// Whether the target has made no switch for two supervisor intervals (step 5). A clock
    /// read, at most once per 61 switches and only while placing.
    fn target_stalled(&self, to: usize) -> bool {
        let rt = &self.rt;
        let progress = rt.slots[to].progress.load(Ordering::Relaxed);
        let now = rt.ns_since_epoch(Instant::now());
        let (seen, since) = self.place_watch.get();
        if progress != seen {
            self.place_watch.set((progress, now));
            return false;
        }
        let stalled = now.saturating_sub(since) >= 2 * rt.config.supervisor_interval.as_nanos() as u64;
        if stalled {
            self.place_shun.set((to, progress));
        }
        stalled
    }

    /// At the 61st switch (step 4): whether this carrier still places, and so leaves the
    /// injector to the others this time.
    #[cold]
    #[inline(never)]
    pub(super) fn still_placing(&self) -> bool {
        self.place_calls.set(0);
        if self.target_stalled(self.place_to.get()) {
            self.place_to.set(NO_PLACE);
            self.place_mask.set(PLACE_MASK);
            return false;
        }
        self.lightest().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_placing_only_well_above_the_least_loaded() {
        let starts = |mine, others: &[(usize, u64)]| lighter(mine, others.iter().copied(), false);
        // Even, or within the slack: never.
        assert_eq!(starts(100, &[(1, 100)]), None);
        assert_eq!(starts(PLACE_SLACK, &[(1, 0)]), None);
        assert_eq!(starts(2 * 10 + PLACE_SLACK, &[(1, 10)]), None);
        // Just past it: on the least loaded one.
        assert_eq!(starts(2 * 10 + PLACE_SLACK + 1, &[(1, 10)]), Some(1));
        assert_eq!(starts(500, &[(0, 300), (2, 1), (3, 40)]), Some(2));
        // No candidate (one carrier, or every other held or retired): never.
        assert_eq!(starts(1_000, &[]), None);
        // Loads near the counters' range do not wrap into a placement.
        assert_eq!(starts(u64::MAX, &[(1, u64::MAX / 2 + 1)]), None);
    }

    #[test]
    fn once_placing_goes_on_until_about_even() {
        let goes_on = |mine, others: &[(usize, u64)]| lighter(mine, others.iter().copied(), true);
        // Below the starting rule, still clearly above: on.
        assert_eq!(goes_on(2 * 60, &[(1, 60)]), Some(1));
        assert_eq!(goes_on(60 + PLACE_SLACK / 2 + 1, &[(1, 60)]), Some(1));
        // Within half the slack: off, so that a burst ends about even, not two to one.
        assert_eq!(goes_on(60 + PLACE_SLACK / 2, &[(1, 60)]), None);
        assert_eq!(goes_on(60, &[(1, 60)]), None);
        assert_eq!(goes_on(u64::MAX, &[(1, u64::MAX)]), None);
    }

    #[test]
    fn the_masks_test_as_the_rule_says() {
        // Every PLACE_EVERY-th start looks; with placement off, no count (never 0) does.
        let looks = |mask: u64| (1..=1_000u64).filter(|n| n & mask == 0).count();
        assert_eq!(looks(PLACE_MASK), 1_000 / PLACE_EVERY as usize);
        assert_eq!(looks(0), 1_000);
        assert_eq!(looks(PLACE_OFF), 0);
    }
}
