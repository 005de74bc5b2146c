//! The carriers' CPU affinity policy (the default, `Affinity::Adaptive`): pinned while their
//! CPU is theirs, floating while it is shared.
//!
//! A pinned carrier keeps its caches and never pays a migration, but it cannot leave a CPU that
//! another process keeps busy (a load generator, a sidecar, a build), and its started fibers
//! cannot leave it: they all run at the share of the CPU the OS gives it. So the supervisor
//! reads each pinned carrier's run-queue delay (how long it waited, runnable, for its CPU:
//! `/proc/self/task/<tid>/schedstat`) every `WINDOW`. A carrier that waited a tenth of two
//! windows in a row floats: it may run on any CPU the process may use, where the OS balances
//! it. After a while it is pinned again, to look once more: 10 s the first time, doubling each
//! time it has to float again soon after, up to 5 minutes; a carrier that stays pinned through
//! a whole such period starts again from 10 s. Spares (compensating carriers) are never
//! pinned. See `arch/scheduler.md`, "CPU affinity".

use std::time::{Duration, Instant};

use std::sync::atomic::Ordering;

use super::{NOT_PINNED, Shared};
use crate::platform::thread::{process_cpus, run_delay, set_affinity};

/// How often each pinned carrier's run-queue delay is read.
const WINDOW: Duration = Duration::from_millis(50);
/// A window is contended when the carrier waited at least `1 / CONTENDED_SHARE` of it.
const CONTENDED_SHARE: u32 = 10;
/// Contended windows in a row that make a carrier float (one could be a burst of our own).
const CONTENDED_WINDOWS: u32 = 2;
/// How long a carrier floats the first time before it is pinned again.
const FIRST_FLOAT: Duration = Duration::from_secs(10);
/// The longest it floats at once.
const MAX_FLOAT: Duration = Duration::from_secs(300);

/// The supervisor's view of every carrier's affinity.
pub(crate) struct Policy {
    /// Where a floating carrier may run: the CPUs of the process's main thread.
    anywhere: Vec<usize>,
    next: Instant,
    carriers: Vec<Carrier>,
}

#[derive(Clone)]
struct Carrier {
    /// Its run-queue delay at the last look, and when that was.
    last: Option<(Duration, Instant)>,
    /// Contended windows in a row.
    contended: u32,
    /// While it floats: the CPU it was pinned to, and when to pin it there again.
    floating: Option<(usize, Instant)>,
    /// How long the next float lasts.
    next_float: Duration,
    /// When it was last pinned again after floating (for the reset of `next_float`).
    pinned_again: Option<Instant>,
}

impl Default for Carrier {
    fn default() -> Carrier {
        Carrier { last: None, contended: 0, floating: None, next_float: FIRST_FLOAT, pinned_again: None }
    }
}

/// Whether a carrier that waited `waited` for its CPU over `window` had it contended.
fn contended(waited: Duration, window: Duration) -> bool {
    waited * CONTENDED_SHARE >= window && !window.is_zero()
}

impl Policy {
    /// The policy of an adaptive runtime; `None` for one pinned always or never.
    pub(crate) fn new(rt: &Shared) -> Option<Policy> {
        (rt.config.affinity == super::config::Affinity::Adaptive).then(|| Policy {
            // The main thread's CPUs: the runtime may be built on a pinned carrier of another.
            anywhere: process_cpus(),
            next: Instant::now() + WINDOW,
            carriers: Vec::new(),
        })
    }

    /// Looks at every carrier once per `WINDOW`; called at each supervisor tick.
    pub(crate) fn check(&mut self, rt: &Shared) {
        let now = Instant::now();
        if now < self.next || self.anywhere.len() < 2 {
            return;
        }
        self.next = now + WINDOW;
        let started = rt.started();
        self.carriers.resize(started, Carrier::default());
        for (i, c) in self.carriers.iter_mut().enumerate() {
            let slot = &rt.slots[i];
            let tid = slot.tid.load(Ordering::Relaxed);
            if tid == 0 {
                continue;
            }
            if let Some((cpu, until)) = c.floating {
                if now >= until && set_affinity(tid, &[cpu]).is_ok() {
                    slot.cpu.store(cpu, Ordering::Relaxed);
                    c.floating = None;
                    c.pinned_again = Some(now);
                    c.last = None;
                }
                continue;
            }
            let cpu = slot.cpu.load(Ordering::Relaxed);
            if cpu == NOT_PINNED {
                c.last = None;
                continue;
            }
            let Some(delay) = run_delay(tid) else { continue };
            let previous = c.last.replace((delay, now));
            let Some((before, at)) = previous else { continue };
            if c.pinned_again.is_some_and(|p| now - p >= c.next_float) {
                // Pinned through a whole float's length: whatever shared its CPU is gone.
                c.next_float = FIRST_FLOAT;
                c.pinned_again = None;
            }
            c.contended = if contended(delay.saturating_sub(before), now - at) { c.contended + 1 } else { 0 };
            if c.contended >= CONTENDED_WINDOWS && set_affinity(tid, &self.anywhere).is_ok() {
                slot.cpu.store(NOT_PINNED, Ordering::Relaxed);
                slot.floats.fetch_add(1, Ordering::Relaxed);
                c.floating = Some((cpu, now + c.next_float));
                c.next_float = (c.next_float * 2).min(MAX_FLOAT);
                c.contended = 0;
                c.pinned_again = None;
                c.last = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenth_of_the_window_spent_waiting_is_contention() {
        let window = Duration::from_millis(50);
        assert!(!contended(Duration::ZERO, window));
        assert!(!contended(Duration::from_micros(4_900), window));
        assert!(contended(Duration::from_millis(5), window));
        assert!(contended(Duration::from_millis(30), window));
        assert!(!contended(Duration::from_millis(5), Duration::ZERO));
    }
}
