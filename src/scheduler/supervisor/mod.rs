//! The supervisor: notices carriers stuck in something that blocks their OS thread, and
//! compensates with extra carriers so the runnable fibers behind them do not wait.
//!
//! Every `supervisor_interval` it samples each carrier's progress counter (bumped at every
//! switch) and the location of the fiber it runs. A carrier that runs the same fiber from one
//! sample to the next is *stalled*; if its thread sleeps in the kernel (state `S`/`D` in
//! `/proc/self/task/<tid>/stat`), or it has been stalled for ten samples (a CPU loop that never
//! yields) while fibers wait behind it that nobody else takes, it is *blocked*: the supervisor
//! counts it, flags it so that the carrier records the location in its own map when it comes
//! back, and starts (or wakes) a compensating carrier.
//! Locations caught often enough become *known blocking*, and fibers from them compensate at
//! once, with no detection delay. With every carrier asleep, the supervisor sleeps too (until
//! a carrier wakes it, or until the compactor has fibers to compact: `fiber/compact.rs`).
//! What procfs says of a carrier thread is read in `kernel.rs`; the stack pools' scavenge,
//! which the supervisor also schedules, is `scavenger.rs`; what it reports on stderr besides the
//! diagnostics' reports, `reports.rs`. See `arch/supervisor.md`.

mod kernel;
mod reports;
mod scavenger;

use std::collections::{HashMap, HashSet};
use std::panic::Location;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kernel::{OffCpu, Reading, steal_ticks, thread_stat};
use reports::{Saturation, SlowStops, report_blocked};
use scavenger::Scavenger;

use super::Shared;
use super::compactor::Compactor;
use super::locations::Known;
use crate::fiber::schedule::RuntimeRef;

/// Samples without progress before a stalled carrier in the kernel counts as blocked: one
/// sample means the same fiber ran through a whole interval without a switch, and a thread
/// asleep in the kernel for that long is blocked (detection within 1–2 intervals).
const STALL_SAMPLES: u32 = 1;
/// Samples without progress before a carrier running on the CPU counts as blocked (a fiber that
/// computes for ~100 ms without a switch starves the fibers queued behind it).
const CPU_STALL_SAMPLES: u32 = 10;
/// Samples in which nobody took from a stalled carrier's non-empty deque before its fibers count
/// as waiting. While other carriers steal from it, a long fiber starves nobody: the fork_join
/// example's root fiber spawns and joins for seconds without a switch while the other carrier
/// runs its children, and was warned about and compensated for (a spare on a full machine).
const WAIT_SAMPLES: u32 = 5;
/// Samples for which a carrier started by a surge (`surge`) stays counted blocked before its
/// own off-CPU time has been judged: its first window may not be readable yet (the thread has
/// not published its id).
const PRESUMED_SAMPLES: u8 = 2;
/// Carriers beyond this many times the target are a runaway compensation, said once
/// (`diagnostics::report_runaway`).
const RUNAWAY_FACTOR: usize = 4;
/// Windows in a row a carrier must spend mostly asleep in the kernel before the off-CPU rule
/// counts it blocked (`OffCpu`).
const OFF_CPU_SAMPLES: u8 = 2;
/// ZIO's rule after its false-positive bug: more than 64 runs at a location, and at least half
/// of them caught blocking, make it known-blocking.
const KNOWN_MIN_RUNS: u64 = 64;

#[derive(Default)]
struct Watch {
    progress: u64,
    stalled: u32,
    /// This carrier is counted in `Shared::blocked` by the supervisor.
    blocked: bool,
    /// The carrier thread's CPU time (clock ticks) at the first stalled sample, if procfs said.
    cpu_at_stall: Option<u64>,
    /// The carrier's CPU and that CPU's steal time (clock ticks) at the first stalled sample.
    steal_at_stall: Option<(usize, u64)>,
    /// The carrier's deque's `taken` count at the last sample, and for how many samples in a
    /// row it held fibers and nobody took one.
    taken: usize,
    untaken: u32,
    /// For the "blocked" report: the progress count it watches, and since when (the sample
    /// that saw it change) the carrier has run one fiber without a switch, declared blocking
    /// sections included. A time, not a count of samples: on a loaded host the supervisor's
    /// ticks stretch, and 100 samples took up to 1.6 s instead of 1 s.
    report_progress: u64,
    same_since: Option<Instant>,
    /// The carrier's own polls of its epoll set at the last tick (`Reactor::owner_polls`).
    owner_polls: u64,
    /// The off-CPU rule's view of this carrier (`OffCpu`).
    off: OffCpu,
    /// Counted blocked as a CPU hog for the sake of fibers starving in the injector
    /// (`starved_in_injector`), not of its own queues.
    for_injector: bool,
}

/// Panics of the supervisor's loop it is restarted after, before it gives up.
const RESTARTS: u32 = 3;

/// The supervisor thread's body: `run`, restarted after a panic (a bug of ours), which is said
/// on stderr. A supervisor that vanished silently left the runtime without compensation, the
/// deadlock report or the blocked-carrier warning, and a fiber waiting behind a carrier stuck in
/// the OS waited for ever with nothing said. Its state is rebuilt from the runtime's counters at
/// the restart (the first tick samples afresh).
pub(crate) fn serve(rt: RuntimeRef) {
    for restart in 1..=RESTARTS + 1 {
        let r = rt.clone();
        let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(r))) else {
            return;
        };
        let what = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("a panic without a message");
        let next = if restart <= RESTARTS {
            "restarting it"
        } else {
            "giving up: from now on no carrier is compensated when blocked, and no deadlock or blocked carrier is reported"
        };
        eprintln!(
            "virtual-threads: the supervisor of runtime {:?} panicked ({what}): a bug in virtual-threads, please report it; {next} ({restart} of {})",
            rt.config.thread_name,
            RESTARTS + 1
        );
    }
}

/// The supervisor thread's body, until the runtime shuts down.
fn run(rt: RuntimeRef) {
    rt.supervisor_thread.get_or_init(std::thread::current);
    let every = rt.config.supervisor_interval;
    let mut watch: Vec<Watch> = Vec::new();
    let mut totals: HashMap<usize, Known> = HashMap::new();
    let mut tick: u64 = 0;
    let mut aggregated: u64 = 0;
    let mut profile = Profile::default();
    let mut runaway_reported = false;
    let mut starving: HashSet<usize> = HashSet::new();
    let mut reported: HashSet<usize> = HashSet::new();
    let mut quiet: Option<(u64, usize)> = None;
    let mut compactor = Compactor::new(&rt);
    let mut scavenger = Scavenger::new();
    let mut saturation = Saturation::default();
    let mut affinity = super::affinity::Policy::new(&rt);
    let mut slow_stops = SlowStops { next: Instant::now(), pending: false };
    while !rt.shutdown.load(Ordering::Acquire) {
        #[cfg(test)]
        super::test_hooks::supervisor_tick(&rt);
        rt.tick_clock();
        let started = rt.started();
        watch.resize_with(started, Watch::default);
        let mut running = 0;
        let waiting = stealable(&rt, started);
        let mut starved = starved_in_injector(&rt, &watch);
        for (i, w) in watch.iter_mut().enumerate() {
            report_blocked(&rt, i, w, &mut reported);
            if sample(&rt, i, w, &mut starving, &mut profile, waiting > 0, &mut starved) {
                running += 1;
            }
        }
        surge(&rt, &mut watch, waiting);
        if watch.iter().any(|w| w.blocked) {
            // Whatever moved the counts this tick (a surge's carrier that took the last
            // unblocked carrier's place, a spare that retired while counted), `target` carriers
            // stay unblocked while the supervisor counts some blocked: two loads when they do.
            rt.compensate();
        }
        poll_unread_sets(&rt, &mut watch);
        saturation.check(&rt);
        if !runaway_reported {
            let active = rt.active.load(Ordering::Relaxed);
            if active > RUNAWAY_FACTOR * rt.target {
                runaway_reported = true;
                crate::scheduler::diagnostics::report_runaway(&rt, active);
            }
        }
        if let Some(a) = &mut affinity {
            a.check(&rt);
        }
        tick += 1;
        let idle = running == 0 && watch.iter().all(|w| !w.blocked);
        // Also before an idle sleep, so that what the last burst caught is learnt now.
        let detections = rt.detections.load(Ordering::Relaxed);
        if (tick % 8 == 0 && detections > 0) || (idle && detections != aggregated) {
            aggregated = detections;
            aggregate(&rt, &mut totals, &profile);
            rt.shrink();
        }
        if let Some(c) = &mut compactor {
            c.run_if_due(&rt);
        }
        scavenger.run_if_due();
        slow_stops.run_if_due(&rt);
        if idle {
            sleep_until_work(&rt, every, &mut quiet, compactor.as_mut(), &mut scavenger);
        } else {
            std::thread::park_timeout(every);
        }
    }
}

/// Reads, without blocking, every poll set its carrier has not read since the last tick: a
/// carrier blocked in the OS, or computing in one fiber without a switch point, leaves readiness
/// there unread, and a fiber at home on another carrier may wait on a socket registered there (a
/// socket handed between fibers, shared, or a migrated fiber: `reactor/`). Idle carriers
/// read the sets of blocked carriers too, but an idle runtime's carriers sleep in their own
/// `epoll_wait`, and no one else notices a computing carrier: so the supervisor, which ticks
/// while any carrier is not asleep, does (Go's sysmon polls the network when nobody has for
/// 10 ms). A set whose owner sleeps in it is skipped (`try_poll`). Woken fibers go to their
/// home's inbox (or the injector).
fn poll_unread_sets(rt: &Shared, watch: &mut [Watch]) {
    for (i, w) in watch.iter_mut().enumerate() {
        let polls = rt.reactor.owner_polls(i);
        if polls == w.owner_polls {
            rt.reactor.try_poll(i, false);
        }
        w.owner_polls = polls;
    }
}

/// Looks at carrier `i` once. Returns whether it is running a fiber. `work_waits`: fibers that
/// any carrier may run are queued (`stealable`). `starved`: how many more CPU hogs may be
/// counted blocked for fibers that starve in the injector (`starved_in_injector`).
fn sample(
    rt: &Shared,
    i: usize,
    w: &mut Watch,
    starving: &mut HashSet<usize>,
    profile: &mut Profile,
    work_waits: bool,
    starved: &mut usize,
) -> bool {
    let slot = &rt.slots[i];
    let loc = slot.location.load(Ordering::Acquire);
    let progress = slot.progress.load(Ordering::Relaxed);
    let in_blocking = slot.in_blocking(Ordering::Acquire);
    // The off-CPU rule looks only while the carrier runs fibers and others wait that a
    // compensating carrier could take: reading costs ~0.4 µs a carrier, and nothing is read
    // while no work waits.
    let off_cpu = if !loc.is_null() && !in_blocking && work_waits {
        w.off.judge(slot, rt.config.supervisor_interval).map(|off| {
            // `schedstat` folds a running thread's time in only at the scheduler's tick or a
            // switch, so a computing thread can look idle over one interval: it must also
            // sleep in the kernel now. What the fiber running now does is also a sample of
            // its spawn site's time (`Profile`).
            let asleep = w.off.in_kernel();
            profile.add(loc, asleep);
            off && asleep
        })
    } else {
        w.off.last = None;
        None
    };
    if loc.is_null() || progress != w.progress || in_blocking {
        // Progressing, idle, or in a declared blocking section (the carrier counted itself).
        // Progressing may still be blocked: a carrier whose fibers each block for less than an
        // interval switches at every sample, yet sleeps in the kernel while work waits.
        let presumed = w.off.presumed > 0 && off_cpu.is_none() && !loc.is_null();
        w.off.presumed = w.off.presumed.saturating_sub(1);
        // Two windows in a row before a carrier is counted (then one keeps it counted): a
        // carrier waiting a few milliseconds for a `std::sync::Mutex` whose holder the OS
        // descheduled, on a loaded machine, is no reason for another thread.
        w.off.streak = if off_cpu == Some(true) { w.off.streak.saturating_add(1) } else { 0 };
        let off = off_cpu == Some(true) && (w.blocked || w.off.streak >= OFF_CPU_SAMPLES);
        if off {
            w.off.presumed = 0;
            rt.detections.fetch_add(1, Ordering::Relaxed);
            rt.trace_blocked(i, slot);
            // The fiber running now is asleep in the kernel (`judge` looked): the carrier
            // records its location when it switches out, so that short blocking calls are
            // learnt too.
            slot.catch();
            if !w.blocked {
                w.blocked = true;
                rt.blocked.fetch_add(1, Ordering::AcqRel);
                rt.compensate();
            }
            w.off.counted = true;
        } else if w.blocked && !presumed {
            w.blocked = false;
            w.for_injector = false;
            w.off.counted = false;
            rt.blocked.fetch_sub(1, Ordering::AcqRel);
            rt.shrink();
        }
        w.progress = progress;
        w.stalled = 0;
        w.untaken = 0;
        return !loc.is_null();
    }
    w.stalled += 1;
    // A stall asleep in the kernel (a pool's worker fiber running short blocking jobs back to
    // back never switches) is evidence for `surge` as the off-CPU rule's is; a CPU hog is not.
    w.off.counted = off_cpu == Some(true);
    let taken = slot.stealer.taken();
    w.untaken = if taken == w.taken && !slot.stealer.is_empty() { w.untaken + 1 } else { 0 };
    w.taken = taken;
    if !w.blocked && w.stalled >= STALL_SAMPLES {
        let stat = thread_stat(slot.tid.load(Ordering::Relaxed));
        // Asleep in the kernel now, and (where `schedstat` was read) for most of the window: a
        // fiber that computes without a switch on a loaded machine, descheduled for most of the
        // window and caught in a short wait (a page fault, a lock of the kernel's or the
        // runtime's), is not blocked; one that blocks is caught a window later at most.
        let in_kernel = stat.is_some_and(|s| matches!(s.state, b'S' | b'D')) && off_cpu != Some(false);
        if w.stalled == 1 {
            w.cpu_at_stall = stat.map(|s| s.cpu_ticks);
            w.steal_at_stall = stat.and_then(|s| s.processor).and_then(|c| steal_ticks(c).map(|t| (c, t)));
        }
        // Fibers wait behind a fiber that hogs its carrier only if nobody else can take them:
        // the LIFO slot, the home queue and the inbox (fibers at home there) are its alone, the
        // deque is stealable. A spare can take the deque's that nobody took and a LIFO fiber
        // with no home here (`find_work` takes a caught carrier's); fibers at home there can
        // only wait for it (`decisions/0003-home-carriers.md`), so for them alone the hog is
        // reported but no carrier is started that none of them could use.
        let takeable = w.untaken >= WAIT_SAMPLES || lifo_may_run_elsewhere(rt, i);
        let behind = takeable
            || !slot.lifo.load(Ordering::Relaxed).is_null()
            || slot.home_len.load(Ordering::Relaxed) > 0
            || slot.inbox.maybe_nonempty();
        // Or fibers starve in the injector, behind every carrier at once.
        let waiting = behind || *starved > 0;
        let long = !in_kernel && w.stalled >= CPU_STALL_SAMPLES;
        let hogging = long && waiting;
        let spare_helps = long && (takeable || *starved > 0);
        if spare_helps && !takeable {
            *starved -= 1;
            w.for_injector = true;
        }
        if hogging && rt.idle.sleeping_count() == 0 {
            // Every carrier busy and this one held by one fiber for ~100 ms: the queued
            // fibers starve unless the spare we are about to start takes them. Unless the
            // host took the carrier's CPU for most of that time (a VM's vCPU descheduled:
            // steal time), which is no fault of the fiber's and not worth a warning.
            let every = rt.config.supervisor_interval;
            let window = every * (w.stalled - 1);
            let host_took_it = stolen_since_stall(w).is_some_and(|stolen| 2 * stolen >= window);
            if !host_took_it && starving.insert(loc as usize) {
                crate::scheduler::diagnostics::warn_starvation(
                    rt,
                    i,
                    every * w.stalled,
                    cpu_since_stall(w, stat.map(|s| s.cpu_ticks), every),
                );
            }
        }
        if in_kernel || spare_helps {
            w.blocked = true;
            rt.blocked.fetch_add(1, Ordering::AcqRel);
            rt.detections.fetch_add(1, Ordering::Relaxed);
            rt.trace_blocked(i, slot);
            // The carrier records the location in its own map when it comes back.
            slot.catch();
            rt.compensate();
        }
    } else if w.blocked && lifo_may_run_elsewhere(rt, i) {
        // Still blocked, and a fiber sits in its hand-off slot that another carrier may take
        // (`find_work` takes a caught carrier's): the fiber running there keeps waking fibers
        // into that slot (a loop of `try_send`s), and a hand-off into an empty slot wakes no
        // idle carrier, so after the first one, taken at the detection, each would wait for
        // ever. Wake one at every sample while this lasts.
        rt.notify();
    }
    true
}

/// How many CPU hogs may be counted blocked this tick for the fibers waiting in the injector:
/// none unless its oldest fiber has waited as long as a hog must stall to count (nobody took it:
/// every carrier runs one fiber without a switch point), then one per such fiber, and at most
/// `target` at a time, so that a burst of long computations adds at most as many carriers again.
/// Fibers spawned from a plain thread queue there, behind no carrier in particular, so the
/// per-carrier rule (fibers untaken in *its* queues) never saw them: 7 waited 10 s behind 6
/// spinning carriers with `max_carriers` far off. (Go's sysmon preempts a goroutine that runs
/// 10 ms; fibers cannot be preempted, so a carrier is added instead.)
fn starved_in_injector(rt: &Shared, watch: &[Watch]) -> usize {
    let Some(oldest) = rt.injector.oldest_stamp() else { return 0 };
    let hog = (rt.config.supervisor_interval * CPU_STALL_SAMPLES).as_nanos() as u64;
    if rt.ns_since_epoch(Instant::now()).saturating_sub(oldest) < hog {
        return 0;
    }
    let counted = watch.iter().filter(|w| w.blocked && w.for_injector).count();
    rt.injector.len().min(rt.target.saturating_sub(counted))
}

/// Fibers queued that any carrier may take: the injector, the deques and the hand-off slots
/// (a moment's estimate). Fibers at home on a carrier are not counted: no compensating carrier
/// may run them.
fn stealable(rt: &Shared, started: usize) -> usize {
    rt.injector.len()
        + rt.slots
            .upto(started)
            .map(|s| s.stealer.len() + usize::from(!s.lifo.load(Ordering::Relaxed).is_null()))
            .sum::<usize>()
}

/// Compensation for short blocking calls grows geometrically. A carrier found off-CPU is
/// counted blocked and `compensate` adds carriers until `target` run unblocked; each of those
/// is judged a window later, so alone the runtime would grow by `target` carriers per interval
/// (64 carriers for a pool of 64 short blocking jobs after 320 ms). So for every carrier whose
/// off-CPU time was measured this sample, one more carrier is started (or a spare woken), up to
/// the fibers waiting and `max_carriers`, and counted blocked at once, presumed to block as the
/// others do; it is judged like any other at its first window, and uncounted (then retired) if
/// it runs on the CPU or finds nothing to do. The measured count doubles at each interval
/// while the evidence lasts; on a saturated CPU, time waiting for a CPU is not off-CPU time
/// (`OffCpu::judge`), so the growth stops there.
fn surge(rt: &Shared, watch: &mut Vec<Watch>, waiting: usize) {
    // Only carriers asleep for nearly all of their last window (a sleep, a read that waits):
    // carriers that contend for a `std::sync::Mutex` also sleep in the kernel, more the more
    // carriers there are, and doubling them fed on itself (a tree of 4096 fibers, each taking
    // one lock, grew a runtime of 2 carriers to 41 under load).
    let measured =
        watch.iter().filter(|w| w.off.counted && w.off.deep && w.blocked && w.off.presumed == 0).count();
    let mut n = measured.min(waiting.saturating_sub(rt.target));
    while n > 0 {
        let Some(i) = rt.carrier_for_blocking() else { return };
        n -= 1;
        if watch.len() <= i {
            watch.resize_with(i + 1, Watch::default);
        }
        let w = &mut watch[i];
        if w.blocked {
            continue;
        }
        w.blocked = true;
        rt.blocked.fetch_add(1, Ordering::AcqRel);
        w.off.counted = true;
        w.off.presumed = PRESUMED_SAMPLES;
        let slot = &rt.slots[i];
        // A woken spare's counters run on from its past; a new thread's start from zero now.
        w.off.last = w.off.read(slot).or(Some(Reading { at: Instant::now(), exec: 0, delay: 0, idle: 0 }));
        w.progress = slot.progress.load(Ordering::Relaxed);
    }
}

/// A sampling profile of spawn sites while work waits: at each judged sample, the site of the
/// fiber running and whether its thread slept in the kernel. A site whose fibers each block
/// for a millisecond switches long before a sample can catch the carrier stalled, so the
/// stall rule's caught-per-run count never reaches half; but the share of samples that find
/// it asleep estimates the share of its running time spent blocked, whatever its calls' length.
#[derive(Default)]
struct Profile {
    /// Per site (its address): samples, and samples asleep in the kernel.
    sites: HashMap<usize, (u64, u64)>,
}

/// Samples of a site before its asleep share may make it known blocking.
const PROFILE_MIN_SAMPLES: u64 = 32;

impl Profile {
    fn add(&mut self, loc: *mut Location<'static>, asleep: bool) {
        let e = self.sites.entry(loc as usize).or_default();
        e.0 += 1;
        e.1 += u64::from(asleep);
    }

    /// Whether the samples say the site spends at least half its running time blocked.
    fn blocking(&self, loc: &'static Location<'static>) -> bool {
        self.sites
            .get(&(loc as *const _ as usize))
            .is_some_and(|&(samples, asleep)| samples >= PROFILE_MIN_SAMPLES && 2 * asleep >= samples)
    }
}

/// Whether carrier `i`'s hand-off slot holds a fiber that may run on another carrier (not
/// homed on `i`).
fn lifo_may_run_elsewhere(rt: &Shared, i: usize) -> bool {
    let p = rt.slots[i].lifo.load(Ordering::Acquire);
    if p.is_null() {
        return false;
    }
    // SAFETY: the slot holds record pointers, and records are freed only with the runtime's
    // state, which `rt` keeps alive: even one taken meanwhile is live memory, and `home` is an
    // atomic (a stale read costs one needless wake-up).
    let home = unsafe { &*p }.home.load(Ordering::Relaxed);
    home != i
}

/// Steal time on the stalled carrier's CPU since its first stalled sample.
fn stolen_since_stall(w: &Watch) -> Option<Duration> {
    let (cpu, start) = w.steal_at_stall?;
    let now = steal_ticks(cpu)?;
    let hz = u64::try_from(crate::platform::clock_ticks_per_sec()).unwrap_or(100).max(1);
    Some(Duration::from_nanos(now.saturating_sub(start).saturating_mul(1_000_000_000 / hz)))
}

/// How much CPU time the carrier's thread used while it stalled, and over how long a window
/// (from the first stalled sample, which came up to an interval after the stall began), if
/// procfs said. A thread the host hardly ran (a busy machine, a VM whose vCPU was descheduled)
/// is not a fiber hogging its carrier, and the starvation warning says so.
fn cpu_since_stall(w: &Watch, now: Option<u64>, every: Duration) -> Option<(Duration, Duration)> {
    let (start, now) = (w.cpu_at_stall?, now?);
    let hz = u64::try_from(crate::platform::clock_ticks_per_sec()).unwrap_or(100).max(1);
    let used = Duration::from_nanos(now.saturating_sub(start).saturating_mul(1_000_000_000 / hz));
    Some((used, every * (w.stalled - 1)))
}

/// Sums the carriers' location maps and marks known-blocking locations in every map. Runs only
/// once something was caught blocking; `totals` is reused between runs.
fn aggregate(rt: &Shared, totals: &mut HashMap<usize, Known>, profile: &Profile) {
    let started = rt.started();
    totals.clear();
    for slot in rt.slots.upto(started) {
        for (loc, e) in slot.locations.iter() {
            let k =
                totals.entry(loc as *const _ as usize).or_insert(Known { location: loc, runs: 0, caught: 0 });
            k.runs += e.runs.load(Ordering::Relaxed);
            k.caught += e.caught.load(Ordering::Relaxed);
        }
    }
    // A site is known by ZIO's rule over its runs, or, with as many runs behind it, by the
    // sampling profile's share of its time (short calls).
    let known: Vec<Known> = totals
        .values()
        .filter(|k| k.runs > KNOWN_MIN_RUNS && (2 * k.caught >= k.runs || profile.blocking(k.location)))
        .cloned()
        .collect();
    if known.is_empty() {
        return;
    }
    for slot in rt.slots.upto(started) {
        for (loc, e) in slot.locations.iter() {
            if known.iter().any(|k| std::ptr::eq(k.location, loc)) {
                e.known.store(true, Ordering::Relaxed);
            }
        }
    }
    *rt.known.lock().unwrap_or_else(|e| e.into_inner()) = known;
}

/// Switches so far on every carrier, and plain-thread `vt` calls so far: if neither moved,
/// nothing happened that could change the deadlock check's answer.
fn activity(rt: &Shared) -> (u64, usize) {
    let switches = rt.slots.upto(rt.started()).map(|s| s.progress.load(Ordering::SeqCst)).sum();
    (switches, crate::fiber::wait::PLAIN_CALLS.load(Ordering::SeqCst))
}

fn all_idle(rt: &Shared) -> bool {
    let started = rt.started();
    !(rt.slots.upto(started).any(|s| !s.location.load(Ordering::SeqCst).is_null())
        || rt.idle.sleeping_count() < rt.active.load(Ordering::SeqCst))
}

/// Every carrier is idle: sleep until one wakes (it unparks us), with a long timeout as a
/// safety net. The flag and the re-check pair with `Shared::supervisor_wake` (Dekker-style,
/// SeqCst on both sides): either we see a running carrier, or it sees us sleeping. The first
/// time in a quiet episode, wake after the deadlock report's quiet period and check.
/// `checked` is what `activity` read when the deadlock check last ran, so that an idle runtime
/// is checked once per quiet episode, not once per quiet period (idle means idle, even with a
/// million parked fibers). A compaction pass that falls due meanwhile runs without ending the
/// wait: it does not count as activity (unless it wakes a fiber an unpark left to it, and then
/// a carrier runs, which does).
fn sleep_until_work(
    rt: &Shared,
    every: Duration,
    checked: &mut Option<(u64, usize)>,
    mut compactor: Option<&mut Compactor>,
    scavenger: &mut Scavenger,
) {
    // Parks until `until`, or earlier for a compaction pass or a scavenge, which it runs.
    let mut wait = |until: Instant| {
        let due = [compactor.as_ref().and_then(|c| c.due(rt)), scavenger.due()].into_iter().flatten().min();
        let due = due.filter(|&d| d < until);
        std::thread::park_timeout(due.unwrap_or(until).saturating_duration_since(Instant::now()));
        if let Some(c) = compactor.as_mut() {
            c.run_if_due(rt);
        }
        scavenger.run_if_due();
    };
    rt.supervisor_sleeping.store(true, Ordering::SeqCst);
    if !all_idle(rt) {
        // A carrier is searching or about to run something: sample again next tick. Not
        // flagged as sleeping: the tick comes anyway, and a flag up for it made every carrier
        // that left an idle wait meanwhile unpark us (a futex wake and an early tick, hundreds
        // a second under an HTTP load).
        rt.supervisor_sleeping.store(false, Ordering::Relaxed);
        std::thread::park_timeout(every);
    } else if !rt.shutdown.load(Ordering::SeqCst) {
        let before = activity(rt);
        match rt.config.deadlock_report.filter(|_| rt.config.fiber_roots) {
            Some(period) if *checked != Some(before) => {
                // The whole period must pass with nothing moving: a park can return early (a
                // waking carrier unparks us, or spuriously), and checking then would judge a
                // fiber that parked a moment ago (found by tests/stress.rs under VT_DEADLOCK_ABORT).
                let until = Instant::now() + period;
                loop {
                    wait(until);
                    if rt.shutdown.load(Ordering::SeqCst) || !all_idle(rt) || activity(rt) != before {
                        break;
                    }
                    if Instant::now() >= until {
                        *checked = Some(before);
                        crate::scheduler::deadlock::check_deadlock(rt);
                        break;
                    }
                }
            }
            _ => {
                let until = Instant::now() + every.max(Duration::from_secs(1)) * 100;
                loop {
                    wait(until);
                    let moved = activity(rt) != before;
                    if rt.shutdown.load(Ordering::SeqCst) || !all_idle(rt) || moved || Instant::now() >= until
                    {
                        break;
                    }
                }
            }
        }
    }
    rt.supervisor_sleeping.store(false, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_since_stall_measures_the_window_after_the_first_stalled_sample() {
        let hz = crate::platform::clock_ticks_per_sec() as u64;
        let every = Duration::from_millis(10);
        let w = Watch { stalled: 10, cpu_at_stall: Some(1_000), ..Watch::default() };
        let (used, window) = cpu_since_stall(&w, Some(1_000 + hz / 100), every).unwrap();
        assert_eq!((used, window), (Duration::from_millis(10), Duration::from_millis(90)));
        // Unknown at either end: nothing to say.
        let unknown = Watch { stalled: 10, ..Watch::default() };
        assert_eq!(cpu_since_stall(&unknown, Some(5), every), None);
        assert_eq!(cpu_since_stall(&w, None, every), None);
    }

    /// A panic in the supervisor's loop (a bug of ours) restarts it: it goes on ticking. Before,
    /// the thread ended, silently, and the runtime went on without compensation or reports.
    #[test]
    fn a_panicking_supervisor_is_restarted() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicUsize};

        use crate::scheduler::test_hooks::SUPERVISOR_TICK;

        let rt = crate::runtime::Runtime::builder()
            .carriers(1)
            .supervisor_interval(Duration::from_millis(2))
            .build()
            .unwrap();
        let me = rt.handle().runtime().ptr() as usize;
        let ticks = Arc::new(AtomicUsize::new(0));
        let counted = ticks.clone();
        *SUPERVISOR_TICK.lock().unwrap() = Some(Arc::new(move |rt, _| {
            if std::ptr::from_ref(rt) as usize == me && counted.fetch_add(1, Ordering::Relaxed) == 0 {
                panic!("a supervisor bug, provoked by a test");
            }
        }));
        // A carrier that keeps switching: the supervisor does not sleep as idle meanwhile.
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let busy = rt.spawn(move || {
            while !s.load(Ordering::Relaxed) {
                crate::yield_now();
            }
        });
        let limit = Instant::now() + Duration::from_secs(30);
        while ticks.load(Ordering::Relaxed) < 5 && Instant::now() < limit {
            std::thread::sleep(Duration::from_millis(1));
        }
        *SUPERVISOR_TICK.lock().unwrap() = None;
        stop.store(true, Ordering::Relaxed);
        assert!(busy.join().is_ok());
        let n = ticks.load(Ordering::Relaxed);
        assert!(n >= 5, "the supervisor ticked {n} time(s): it did not come back after its panic");
    }
}
