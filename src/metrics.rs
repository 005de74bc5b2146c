//! `Runtime::metrics()`: a snapshot of what the runtime did, read without disturbing it.
//!
//! Counters live where they are written (per carrier, or in the supervisor) and are summed on
//! read. The diagnostics work extends this with per-carrier scheduling counters.

use std::fmt;
use std::panic::Location;
use std::sync::atomic::Ordering;

use crate::scheduler::Shared;

/// A snapshot of a runtime's counters. `Debug` and `Display` print it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Metrics {
    /// Carriers the runtime aims to have running fibers.
    pub carriers_target: usize,
    /// Carriers not retired now (compensating ones included).
    pub carriers_current: usize,
    /// The most carriers that existed at once.
    pub carriers_peak: usize,
    /// Carriers blocked in the OS now (detected, or inside `blocking`).
    pub carriers_blocked: usize,
    /// Times the supervisor caught a carrier blocked.
    pub detections: u64,
    /// Compensating carriers started or woken.
    pub compensations: u64,
    /// Locations known to block, with how often fibers from them ran and were caught blocking.
    pub known_blocking: Vec<BlockingLocation>,
    /// Unfinished fibers that have parked at least once (the registry that dropping the runtime
    /// unwinds): an upper bound on the fibers parked now.
    pub fibers_registered: usize,
}

/// A code location the supervisor learned blocks its carrier.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct BlockingLocation {
    /// The spawn site of the fibers that blocked.
    pub location: &'static Location<'static>,
    /// Fibers from it that ran.
    pub runs: u64,
    /// Times a carrier was caught blocked in one of them.
    pub caught: u64,
}

impl Metrics {
    pub(crate) fn read(rt: &Shared) -> Metrics {
        let known = rt.known.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Metrics {
            carriers_target: rt.target,
            carriers_current: rt.active.load(Ordering::Relaxed),
            carriers_peak: rt.peak.load(Ordering::Relaxed),
            carriers_blocked: rt.blocked.load(Ordering::Relaxed),
            detections: rt.detections.load(Ordering::Relaxed),
            compensations: rt.compensations.load(Ordering::Relaxed),
            known_blocking: known
                .into_iter()
                .map(|k| BlockingLocation { location: k.location, runs: k.runs, caught: k.caught })
                .collect(),
            fibers_registered: rt.registry.len(),
        }
    }
}

impl fmt::Display for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "carriers: {} target, {} now, {} peak, {} blocked",
            self.carriers_target, self.carriers_current, self.carriers_peak, self.carriers_blocked
        )?;
        writeln!(f, "supervisor: {} detections, {} compensations", self.detections, self.compensations)?;
        writeln!(f, "fibers that parked and have not finished: {}", self.fibers_registered)?;
        for k in &self.known_blocking {
            writeln!(f, "known blocking: {} ({} runs, caught {} times)", k.location, k.runs, k.caught)?;
        }
        Ok(())
    }
}
