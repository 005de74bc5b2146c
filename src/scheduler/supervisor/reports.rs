//! What the supervisor tells the user on stderr, beside the deadlock and starvation reports of
//! `diagnostics.rs`: the compensation bound full with every carrier blocked (`Saturation`), a
//! carrier blocked in the OS with fibers that can run only there behind it (`report_blocked`),
//! and a cancelled fiber that does not stop (`SlowStops`). Each is said once. See
//! `arch/supervisor.md`.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::kernel::thread_stat;
use super::{Watch, lifo_may_run_elsewhere};
use crate::scheduler::Shared;

/// How long every carrier up to `max_carriers` must stay blocked, with fibers waiting and no
/// carrier switching, before the supervisor says so (`Saturation`): long enough that a burst of
/// short blocking calls (which keeps the bound full while the carriers still move) says nothing.
const SATURATED_FOR: Duration = Duration::from_secs(1);
/// How long a carrier stays blocked in the OS, with fibers waiting that can run only on it,
/// before the supervisor reports it on stderr (`diagnostics::report_blocked`).
const REPORT_BLOCKED_AFTER: Duration = Duration::from_secs(1);

/// Compensation's dead end: every carrier up to `max_carriers` is blocked in the OS and fibers
/// wait to run, so nothing runs until a carrier comes back, maybe never (300 jobs waiting in a
/// `std::sync::Barrier` of 300 under the default bound of 256). Said once per runtime, after
/// `SATURATED_FOR` with no carrier switching, so that the user hears why the program stalls.
#[derive(Default)]
pub(super) struct Saturation {
    /// When the current stretch began, and the carriers' summed progress then.
    since: Option<(Instant, u64)>,
    reported: bool,
}

impl Saturation {
    pub(super) fn check(&mut self, rt: &Shared) {
        if self.reported {
            return;
        }
        let active = rt.active.load(Ordering::Acquire);
        let saturated = active >= rt.config.max_carriers
            && rt.blocked.load(Ordering::Acquire) >= active
            && work_waits(rt);
        if !saturated {
            self.since = None;
            return;
        }
        let progress = rt.slots.upto(rt.started()).map(|s| s.progress.load(Ordering::Relaxed)).sum();
        match self.since {
            Some((at, p)) if p == progress => {
                if at.elapsed() >= SATURATED_FOR {
                    self.reported = true;
                    crate::scheduler::diagnostics::report_saturation(rt);
                }
            }
            // A carrier switched meanwhile: the bound is full but the carriers move.
            _ => self.since = Some((Instant::now(), progress)),
        }
    }
}

/// Whether a fiber is queued anywhere (injector, deques, LIFO slots, inboxes).
fn work_waits(rt: &Shared) -> bool {
    !rt.injector.is_empty()
        || rt.slots.upto(rt.started()).any(|s| {
            !s.stealer.is_empty()
                || !s.lifo.load(Ordering::Relaxed).is_null()
                || s.home_len.load(Ordering::Relaxed) > 0
                || s.inbox.maybe_nonempty()
        })
}

/// Reports carrier `i` on stderr, once per spawn site (or `blocking` call site), when it has
/// been blocked in the OS for `REPORT_BLOCKED_AFTER` while fibers that can run only there wait
/// behind it: started fibers stay on their home carrier, so no compensating carrier can take
/// them, and they wait as long as the block lasts (for ever, if they hold what it waits for).
pub(super) fn report_blocked(rt: &Shared, i: usize, w: &mut Watch, reported: &mut HashSet<usize>) {
    let slot = &rt.slots[i];
    let loc = slot.location.load(Ordering::Acquire);
    let progress = slot.progress.load(Ordering::Relaxed);
    if loc.is_null() || progress != w.report_progress || w.same_since.is_none() {
        w.report_progress = progress;
        w.same_since = Some(Instant::now());
        return;
    }
    let blocked_for = w.same_since.map_or(Duration::ZERO, |since| since.elapsed());
    // From then on at every sample until said: one look at the thread's state could catch it
    // between two of its sleeps (a wait during an unwind sleeps 1 ms at a time), or runnable on
    // a loaded machine, and the report then never came (2 of 4 runs).
    if blocked_for < REPORT_BLOCKED_AFTER || reported.contains(&(loc as usize)) {
        return;
    }
    let waiting = home_waiting(rt, i);
    if waiting == 0 {
        return;
    }
    let in_kernel =
        thread_stat(slot.tid.load(Ordering::Relaxed)).is_some_and(|s| matches!(s.state, b'S' | b'D'));
    if in_kernel {
        reported.insert(loc as usize);
        crate::scheduler::diagnostics::report_blocked(rt, i, blocked_for, waiting);
    }
}

/// Fibers queued that can run only on carrier `i`: those in its home queue, at least one if
/// its inbox holds any (woken by other threads; the inbox has no length), and the one in its
/// hand-off slot if it is homed there.
fn home_waiting(rt: &Shared, i: usize) -> usize {
    let slot = &rt.slots[i];
    let queued = slot.home_len.load(Ordering::Relaxed) + usize::from(slot.inbox.maybe_nonempty());
    queued + usize::from(!lifo_may_run_elsewhere(rt, i) && !slot.lifo.load(Ordering::Acquire).is_null())
}

/// Reports, once each, fibers asked to stop (`JoinHandle::cancel`) that have not stopped within
/// `cancel::SLOW_STOP_MS`: a loop that never reaches a switch point or `vt::check_cancelled`,
/// or an `uncancellable` section that does not end. It walks the live fibers at most once per
/// period, and only for a while after a stop was asked for (`cancel::slow_stops_due`).
pub(super) struct SlowStops {
    pub(super) next: Instant,
    /// The last walk found a stop not yet due for a report.
    pub(super) pending: bool,
}

impl SlowStops {
    pub(super) fn run_if_due(&mut self, rt: &Shared) {
        let now = Instant::now();
        if now < self.next || !crate::fiber::cancel::slow_stops_due(self.pending) {
            return;
        }
        self.next = now + Duration::from_millis(u64::from(crate::fiber::cancel::SLOW_STOP_MS) / 4);
        let mut pending = false;
        rt.roots.for_each_live(|f| {
            if let Some(ms) = crate::fiber::cancel::slow_stop(&f, &mut pending) {
                let name = f.name().map(|n| format!(" {n:?}")).unwrap_or_default();
                // SAFETY: `shield_at` is null or a `&'static Location` stored by `uncancellable`.
                let held = match unsafe { f.shield_at.load(Ordering::Relaxed).as_ref() } {
                    Some(at) => format!("an uncancellable section entered at {at} holds it"),
                    None => "it has not reached a switch point: a loop that never waits needs \
                             vt::check_cancelled()"
                        .to_string(),
                };
                eprintln!(
                    "virtual-threads: fiber {}{name}, spawned at {}, was cancelled {ms} ms ago and has not \
                     stopped: {held}. (Reported once per fiber.)",
                    f.id(),
                    f.spawned_at()
                );
            }
        });
        self.pending = pending;
    }
}
