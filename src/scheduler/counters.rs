//! One reading of the scheduler's counters, for `Runtime::metrics` (`runtime/metrics.rs` names
//! and documents each figure). The counters are single-writer atomics spread over the carriers'
//! slots and a few shared ones; this sums them with relaxed loads, never disturbing a carrier.

use std::sync::atomic::{AtomicU64, Ordering};

use super::locations::Known;
use super::shared::Stats;
use super::{NOT_PINNED, Shared};

/// The runtime's counters at one moment, summed over the carriers (and work from outside them).
pub(crate) struct Counters {
    pub(crate) spawned: u64,
    pub(crate) finished: u64,
    pub(crate) switches: u64,
    pub(crate) parks: u64,
    pub(crate) unparks: u64,
    pub(crate) steals: u64,
    pub(crate) injector_pushes: u64,
    pub(crate) injector_pops: u64,
    pub(crate) timer_wakeups: u64,
    pub(crate) io_wakeups: u64,
    pub(crate) idle_ns: u64,
    pub(crate) stack_hits: u64,
    pub(crate) stack_misses: u64,
    pub(crate) stacks_in_use: u64,
    pub(crate) stacks_carved: usize,
    pub(crate) stack_bytes_reserved: usize,
    pub(crate) compactions: u64,
    pub(crate) restores: u64,
    pub(crate) saved_bytes: u64,
    pub(crate) restored_bytes: u64,
    pub(crate) compaction_releases: u64,
    pub(crate) unparks_during_compaction: u64,
    pub(crate) carriers_target: usize,
    pub(crate) carriers_active: usize,
    pub(crate) carriers_peak: usize,
    pub(crate) carriers_blocked: usize,
    pub(crate) detections: u64,
    pub(crate) compensations: u64,
    pub(crate) known_blocking: Vec<Known>,
    /// One entry per carrier slot that has had a thread, in slot order.
    pub(crate) per_carrier: Vec<CarrierCounters>,
}

/// One carrier's counters at one moment.
pub(crate) struct CarrierCounters {
    pub(crate) switches: u64,
    pub(crate) started: u64,
    pub(crate) placed: u64,
    pub(crate) steals: u64,
    pub(crate) injector_pops: u64,
    pub(crate) idle_ns: u64,
    /// The CPU it is pinned to now, if any.
    pub(crate) cpu: Option<usize>,
    pub(crate) floats: u64,
}

impl Shared {
    /// Reads every counter once.
    pub(crate) fn counters(&self) -> Counters {
        let known_blocking = self.known.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let started = self.started();
        let sum = |field: fn(&Stats) -> &AtomicU64| -> u64 {
            self.slots.upto(started).map(|s| field(&s.stats).load(Ordering::Relaxed)).sum()
        };
        let remote = &self.remote;
        // Finished before spawned: a fiber counted finished was spawned earlier, so the live
        // count (spawned - finished) never reads negative on a running runtime.
        let finished = sum(|s| &s.finished) + remote.finished.load(Ordering::Relaxed);
        let spawned = sum(|s| &s.spawned) + remote.spawned.load(Ordering::Relaxed);
        // A carrier counts a fiber `started` when it binds it to a coroutine (and its stack),
        // and `finished` in its own slot only when it gives that coroutine back, or when the
        // bind failed (counted started too): so their difference is the stacks fibers hold.
        // Finished first, as above, so it never reads below the truth.
        let finished_here = sum(|s| &s.finished);
        let stacks_in_use = sum(|s| &s.started).saturating_sub(finished_here);
        let (stacks_carved, stack_bytes_reserved, _) = self.stacks.usage();
        // Restores before compactions, as finished before spawned above.
        let restores = sum(|s| &s.restores) + remote.restores.load(Ordering::Relaxed);
        let restored_bytes = sum(|s| &s.restored_bytes) + remote.restored_bytes.load(Ordering::Relaxed);
        let compactions = self.compaction.compactions.load(Ordering::Relaxed);
        let saved_bytes = self.compaction.saved_bytes.load(Ordering::Relaxed);
        Counters {
            spawned,
            finished,
            switches: self.slots.upto(started).map(|s| s.progress.load(Ordering::Relaxed)).sum(),
            parks: sum(|s| &s.parks),
            unparks: sum(|s| &s.unparks) + remote.unparks.load(Ordering::Relaxed),
            steals: sum(|s| &s.steals),
            injector_pushes: sum(|s| &s.injector_pushes) + remote.injector_pushes.load(Ordering::Relaxed),
            injector_pops: sum(|s| &s.injector_pops),
            timer_wakeups: sum(|s| &s.timer_wakeups),
            io_wakeups: sum(|s| &s.io_wakeups),
            idle_ns: sum(|s| &s.idle_ns),
            stack_hits: sum(|s| &s.stack_hits),
            stack_misses: sum(|s| &s.stack_misses),
            stacks_in_use,
            stacks_carved,
            stack_bytes_reserved,
            compactions,
            restores,
            saved_bytes,
            restored_bytes,
            compaction_releases: self.compaction.releases.load(Ordering::Relaxed),
            unparks_during_compaction: self.compaction.unparks_met.load(Ordering::Relaxed),
            carriers_target: self.target,
            carriers_active: self.active.load(Ordering::Relaxed),
            carriers_peak: self.peak.load(Ordering::Relaxed),
            carriers_blocked: self.blocked.load(Ordering::Relaxed),
            detections: self.detections.load(Ordering::Relaxed),
            compensations: self.compensations.load(Ordering::Relaxed),
            known_blocking,
            per_carrier: self
                .slots
                .upto(started)
                .map(|s| CarrierCounters {
                    switches: s.progress.load(Ordering::Relaxed),
                    started: s.stats.started.load(Ordering::Relaxed),
                    placed: s.stats.placed.load(Ordering::Relaxed),
                    steals: s.stats.steals.load(Ordering::Relaxed),
                    injector_pops: s.stats.injector_pops.load(Ordering::Relaxed),
                    idle_ns: s.stats.idle_ns.load(Ordering::Relaxed),
                    cpu: Some(s.cpu.load(Ordering::Relaxed)).filter(|&c| c != NOT_PINNED),
                    floats: s.floats.load(Ordering::Relaxed),
                })
                .collect(),
        }
    }
}
