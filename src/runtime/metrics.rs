//! `Runtime::metrics()`: a snapshot of what the runtime did, read without disturbing it.
//!
//! Counters live where they are written — each carrier's own `Stats` (single writer, a load
//! and a store per bump, on the carrier's own cache lines), the supervisor's, and a few shared
//! ones for work from plain threads — and are summed on read. See `arch/diagnostics.md`.

use std::fmt;
use std::panic::Location;
use std::time::Duration;

use crate::scheduler::Shared;

/// A snapshot of a runtime's counters. `Debug` and `Display` print it.
///
/// Counters are read one at a time while the runtime runs, so two of them may disagree by
/// the work done during the read; on a quiet runtime they add up
/// (`fibers_spawned == fibers_finished + fibers_live`).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Metrics {
    /// Fibers spawned on this runtime.
    pub fibers_spawned: u64,
    /// Fibers that finished (returned, panicked, could not start, or were cancelled by the
    /// runtime's drop).
    pub fibers_finished: u64,
    /// Fibers spawned and not finished: running, runnable or parked.
    pub fibers_live: u64,
    /// Times a carrier switched into a fiber (first runs and resumptions).
    pub switches: u64,
    /// Times a fiber parked (switched out to wait).
    pub parks: u64,
    /// Times a parked fiber was made runnable by another fiber or a plain thread (timers and
    /// I/O are counted apart).
    pub unparks: u64,
    /// Fibers a carrier took from another carrier's deque.
    pub steals: u64,
    /// Fibers pushed into the global injector (from plain threads, and a full local deque's
    /// overflow).
    pub injector_pushes: u64,
    /// Fibers carriers took from the injector.
    pub injector_pops: u64,
    /// Fibers woken by their timer (sleeps, timed waits).
    pub timer_wakeups: u64,
    /// Fibers woken by socket readiness.
    pub io_wakeups: u64,
    /// Time carriers spent asleep with nothing to do, summed over carriers.
    pub idle_time: Duration,
    /// Stacks a carrier found in its own cache.
    pub stack_pool_hits: u64,
    /// Times a carrier's stack cache was empty and it went to the shared pool (or carved).
    pub stack_pool_misses: u64,
    /// Stacks that this runtime's fibers hold now: a fiber takes one at its first run and gives
    /// it back (to its carrier's cache, and from there to the shared pool) when it finishes,
    /// however it ends (returned, panicked, stopped). A stopped or finished fiber that kept its
    /// stack would show here.
    pub stacks_in_use: u64,
    /// Stacks of this runtime's default size carved so far (process-wide: stacks outlive
    /// runtimes and are shared by runtimes with the same stack size).
    pub stacks_carved: u64,
    /// Address space reserved by those stacks, guard pages included. Only the pages fibers
    /// touched are memory.
    pub stack_bytes_reserved: u64,
    /// Pooled stacks whose pages were given back to the kernel after sitting unused for two
    /// seconds or more (process-wide, all sizes): memory a burst of fibers no longer holds.
    pub stacks_scavenged: u64,
    /// Parked fibers whose stacks were compacted (`runtime::Builder::compact_parked_after`).
    pub stack_compactions: u64,
    /// Compacted stacks copied back (the fiber woke, or the runtime's drop unwound it).
    pub stack_restores: u64,
    /// Bytes of compacted stacks held on the heap now.
    pub compacted_stack_bytes: u64,
    /// `madvise` calls that gave compacted stacks' pages back (one per run of adjacent stacks).
    pub compaction_releases: u64,
    /// Unparks that found their fiber held by the compactor: it was scheduled when the
    /// compactor let go (a wake-up delayed by at most one batch, never lost).
    pub unparks_during_compaction: u64,
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
    /// The same work counted per carrier (index order, spares after the first
    /// `carriers_target`): how evenly the fibers spread. Started fibers stay on their home
    /// carrier, so the balance is set when fibers start (`arch/scheduler.md`).
    pub per_carrier: Vec<CarrierMetrics>,
}

/// One carrier's share of the work (see [`Metrics::per_carrier`]).
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct CarrierMetrics {
    /// Times it switched into a fiber.
    pub switches: u64,
    /// Fibers that started on it (and so have it as their home), whoever spawned them.
    pub fibers_started: u64,
    /// Fibers about to start here that it sent to a carrier with far fewer started fibers at
    /// home ([`Builder::place_by_load`](crate::runtime::Builder::place_by_load)).
    pub fibers_placed: u64,
    /// Fibers it took from other carriers' deques.
    pub steals: u64,
    /// Fibers it took from the injector.
    pub injector_pops: u64,
    /// Time it slept with nothing to do.
    pub idle_time: Duration,
    /// The CPU it is pinned to now; `None` while it may run on any (never pinned, a spare, or
    /// floating off a CPU that other work shares: [`Builder::pin_carriers`](crate::runtime::Builder::pin_carriers)).
    pub cpu: Option<usize>,
    /// Times it was let float off a CPU that other work shared.
    pub floats: u64,
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
        let c = rt.counters();
        Metrics {
            fibers_spawned: c.spawned,
            fibers_finished: c.finished,
            fibers_live: c.spawned.saturating_sub(c.finished),
            switches: c.switches,
            parks: c.parks,
            unparks: c.unparks,
            steals: c.steals,
            injector_pushes: c.injector_pushes,
            injector_pops: c.injector_pops,
            timer_wakeups: c.timer_wakeups,
            io_wakeups: c.io_wakeups,
            idle_time: Duration::from_nanos(c.idle_ns),
            stack_pool_hits: c.stack_hits,
            stack_pool_misses: c.stack_misses,
            stacks_in_use: c.stacks_in_use,
            stacks_carved: c.stacks_carved as u64,
            stack_bytes_reserved: c.stack_bytes_reserved as u64,
            stacks_scavenged: crate::fiber::stack::SizeClass::scavenged() as u64,
            stack_compactions: c.compactions,
            stack_restores: c.restores,
            compacted_stack_bytes: c.saved_bytes.saturating_sub(c.restored_bytes),
            compaction_releases: c.compaction_releases,
            unparks_during_compaction: c.unparks_during_compaction,
            carriers_target: c.carriers_target,
            carriers_current: c.carriers_active,
            carriers_peak: c.carriers_peak,
            carriers_blocked: c.carriers_blocked,
            detections: c.detections,
            compensations: c.compensations,
            known_blocking: c
                .known_blocking
                .into_iter()
                .map(|k| BlockingLocation { location: k.location, runs: k.runs, caught: k.caught })
                .collect(),
            per_carrier: c
                .per_carrier
                .into_iter()
                .map(|s| CarrierMetrics {
                    switches: s.switches,
                    fibers_started: s.started,
                    fibers_placed: s.placed,
                    steals: s.steals,
                    injector_pops: s.injector_pops,
                    idle_time: Duration::from_nanos(s.idle_ns),
                    cpu: s.cpu,
                    floats: s.floats,
                })
                .collect(),
        }
    }
}

impl fmt::Display for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fibers: {} spawned, {} finished, {} live",
            self.fibers_spawned, self.fibers_finished, self.fibers_live
        )?;
        writeln!(
            f,
            "scheduling: {} switches, {} parks, {} unparks, {} steals, injector {} in / {} out",
            self.switches, self.parks, self.unparks, self.steals, self.injector_pushes, self.injector_pops
        )?;
        writeln!(
            f,
            "wake-ups: {} by timers, {} by I/O; carriers idle {:.3} s in all",
            self.timer_wakeups,
            self.io_wakeups,
            self.idle_time.as_secs_f64()
        )?;
        writeln!(
            f,
            "stacks: {} in use, {} carved ({} MiB reserved), carrier cache {} hits / {} misses, {} given back \
             idle",
            self.stacks_in_use,
            self.stacks_carved,
            self.stack_bytes_reserved >> 20,
            self.stack_pool_hits,
            self.stack_pool_misses,
            self.stacks_scavenged
        )?;
        writeln!(
            f,
            "compaction: {} stacks compacted, {} restored, {} KiB held now, {} madvise calls, {} unparks \
             waited for it",
            self.stack_compactions,
            self.stack_restores,
            self.compacted_stack_bytes >> 10,
            self.compaction_releases,
            self.unparks_during_compaction
        )?;
        writeln!(
            f,
            "carriers: {} target, {} now, {} peak, {} blocked",
            self.carriers_target, self.carriers_current, self.carriers_peak, self.carriers_blocked
        )?;
        writeln!(f, "supervisor: {} detections, {} compensations", self.detections, self.compensations)?;
        for (i, c) in self.per_carrier.iter().enumerate() {
            writeln!(
                f,
                "carrier {i}: {} switches, {} fibers started, {} placed elsewhere, {} stolen, {} from the injector, idle {:.3} s, {}",
                c.switches,
                c.fibers_started,
                c.fibers_placed,
                c.steals,
                c.injector_pops,
                c.idle_time.as_secs_f64(),
                match (c.cpu, c.floats) {
                    (Some(cpu), 0) => format!("pinned to CPU {cpu}"),
                    (Some(cpu), n) => format!("pinned to CPU {cpu} (floated {n} times)"),
                    (None, 0) => "not pinned".to_string(),
                    (None, n) => format!("not pinned (floated {n} times)"),
                }
            )?;
        }
        for k in &self.known_blocking {
            writeln!(f, "known blocking: {} ({} runs, caught {} times)", k.location, k.runs, k.caught)?;
        }
        Ok(())
    }
}
