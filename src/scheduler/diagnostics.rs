//! Fiber dumps, the CPU-starvation warning and the SIGQUIT dump (the panic hook that names the
//! fiber is `fiber/panic_hook.rs`).
//!
//! The fiber roots are the runtime's record arena (`scheduler::roots`): every record the
//! runtime ever allocated, live or pooled. A dump walks it and takes a counted reference to each
//! record that describes a fiber now (`FiberRef::upgrade`), so spawning registers nothing and a
//! finished fiber is out of the dump the moment its record is. What a dump says of a fiber comes
//! from atomics the fiber and its carrier write anyway or cheaply (state word, wait reason,
//! carrier, a coarse timestamp). See `arch/diagnostics.md`.

use crate::loom::StdMutex as Mutex;
use std::collections::HashMap;
use std::fmt;
use std::panic::Location;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::fiber::schedule::RuntimeRef;
use crate::fiber::{FiberRef, PARKED, RUNNABLE, RUNNING};
use crate::platform::signal as sys;
use crate::scheduler::Shared;

use crate::fiber::wait::{WAIT_TIMED, WAIT_UNWINDING, WaitReason};

/// What a fiber was doing when the dump saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FiberState {
    /// Running on carrier `carrier`.
    Running {
        /// The carrier's index.
        carrier: usize,
    },
    /// Running on carrier `carrier`, inside a [`blocking`](crate::blocking) section (or a
    /// fiber from a location the supervisor knows blocks) that started at `at`.
    Blocking {
        /// The carrier's index.
        carrier: usize,
        /// Where the blocking section was entered (or the fiber's spawn site).
        at: &'static Location<'static>,
    },
    /// Queued, waiting for a carrier.
    Runnable,
    /// Parked until something wakes it.
    Parked {
        /// What it waits for.
        reason: WaitReason,
        /// A deadline will wake it if nothing else does (a sleep, a `*_timeout` call).
        timed: bool,
    },
}

impl fmt::Display for FiberState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FiberState::Running { carrier } => write!(f, "running on carrier {carrier}"),
            FiberState::Blocking { carrier, at } => {
                write!(f, "blocking carrier {carrier} in a blocking section at {at}")
            }
            FiberState::Runnable => f.write_str("runnable"),
            FiberState::Parked { reason, timed: false } => write!(f, "parked on {reason}"),
            FiberState::Parked { reason, timed: true } => write!(f, "parked on {reason} (with a deadline)"),
        }
    }
}

/// One live fiber in a [`FiberDump`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct FiberInfo {
    /// The fiber's id.
    pub id: crate::fiber::id::FiberId,
    /// Its name, if it was given one.
    pub name: Option<String>,
    /// What it was doing.
    pub state: FiberState,
    /// Where it was spawned.
    pub spawned_at: &'static Location<'static>,
    /// How long it has been in `state`, at the resolution of the runtime's coarse clock (the
    /// supervisor interval). For a fiber queued by `yield_now`, since its last run began: a
    /// yield does not stamp the fiber (`arch/performance.md`, the floor's log).
    pub for_: Duration,
    /// It was asked to stop (`JoinHandle::cancel`, a `CancelHandle`, its scope) and has not
    /// finished yet.
    pub cancelled: bool,
    /// It runs inside a [`vt::uncancellable`](crate::uncancellable) section entered here (the
    /// outermost), which defers any stop.
    pub uncancellable_at: Option<&'static Location<'static>>,
}

/// Every live fiber of a runtime at one moment: [`Runtime::dump`](crate::Runtime::dump).
///
/// `Display` prints one line per group of fibers sharing a state and a spawn location, with a
/// count, so 100,000 fibers parked at the same place read as one line; the alternate form
/// (`{:#}`) lists every fiber's id under its group. Fibers are seen one at a time while the
/// runtime runs, so a dump of a busy runtime is not an atomic snapshot.
#[derive(Clone, Debug)]
pub struct FiberDump {
    fibers: Vec<FiberInfo>,
    carriers: usize,
    roots: bool,
}

impl FiberDump {
    /// The fibers, in no particular order.
    pub fn fibers(&self) -> &[FiberInfo] {
        &self.fibers
    }

    /// How many live fibers the dump holds.
    pub fn len(&self) -> usize {
        self.fibers.len()
    }

    /// Whether the dump holds no fiber.
    pub fn is_empty(&self) -> bool {
        self.fibers.is_empty()
    }

    /// Fibers grouped by state (carrier and deadline aside) and spawn location, largest group
    /// first.
    pub fn groups(&self) -> Vec<FiberGroup<'_>> {
        let mut map: HashMap<(GroupState, usize), Vec<&FiberInfo>> = HashMap::new();
        for f in &self.fibers {
            map.entry((GroupState::of(f.state), f.spawned_at as *const _ as usize)).or_default().push(f);
        }
        let mut groups: Vec<FiberGroup<'_>> = map
            .into_values()
            .map(|mut fibers| {
                fibers.sort_by_key(|f| f.id);
                FiberGroup { fibers }
            })
            .collect();
        groups.sort_by(|a, b| {
            b.fibers.len().cmp(&a.fibers.len()).then_with(|| a.fibers[0].id.cmp(&b.fibers[0].id))
        });
        groups
    }
}

/// The part of a state that groups fibers: carriers and deadlines vary inside a group.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum GroupState {
    Running,
    Blocking(usize),
    Runnable,
    Parked(WaitReason),
}

impl GroupState {
    fn of(s: FiberState) -> GroupState {
        match s {
            FiberState::Running { .. } => GroupState::Running,
            FiberState::Blocking { at, .. } => GroupState::Blocking(at as *const _ as usize),
            FiberState::Runnable => GroupState::Runnable,
            FiberState::Parked { reason, .. } => GroupState::Parked(reason),
        }
    }
}

/// Fibers of a [`FiberDump`] that share a state and a spawn location.
#[derive(Clone, Debug)]
pub struct FiberGroup<'a> {
    fibers: Vec<&'a FiberInfo>,
}

impl<'a> FiberGroup<'a> {
    /// The fibers of the group, by id.
    pub fn fibers(&self) -> &[&'a FiberInfo] {
        &self.fibers
    }

    /// How many fibers the group holds.
    pub fn len(&self) -> usize {
        self.fibers.len()
    }

    /// Always false: a group has at least one fiber.
    pub fn is_empty(&self) -> bool {
        self.fibers.is_empty()
    }

    /// The state the group's fibers share (the first fiber's, for carrier and deadline).
    pub fn state(&self) -> FiberState {
        self.fibers[0].state
    }

    /// Where the group's fibers were spawned.
    pub fn spawned_at(&self) -> &'static Location<'static> {
        self.fibers[0].spawned_at
    }
}

/// Fibers named on a group's line in the compact form.
const NAMED_PER_GROUP: usize = 3;

impl fmt::Display for FiberGroup<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.fibers.len();
        let state = match self.state() {
            // The carrier differs between members: name it per fiber instead.
            FiberState::Running { .. } if n > 1 => "running".to_string(),
            s => s.to_string(),
        };
        let (lo, hi) = self
            .fibers
            .iter()
            .fold((Duration::MAX, Duration::ZERO), |(lo, hi), x| (lo.min(x.for_), hi.max(x.for_)));
        let age =
            if lo == hi { format!("for {}", Age(lo)) } else { format!("for {}–{}", Age(lo), Age(hi)) };
        let noun = if n == 1 { "fiber" } else { "fibers" };
        write!(f, "{n} {noun} {state}, spawned at {}, {age}", self.spawned_at())?;
        // Stops asked for and not done yet, and the sections deferring them.
        let cancelled = self.fibers.iter().filter(|x| x.cancelled).count();
        if cancelled > 0 {
            write!(f, ", {cancelled} cancelled")?;
        }
        if let Some(at) = self.fibers.iter().find_map(|x| x.uncancellable_at) {
            write!(f, ", in an uncancellable section at {at}")?;
        }
        f.write_str(":")?;
        let shown = if f.alternate() { n } else { n.min(NAMED_PER_GROUP) };
        for (k, x) in self.fibers[..shown].iter().enumerate() {
            write!(f, "{} fiber {}", if k == 0 { "" } else { "," }, x.id)?;
            if let Some(name) = &x.name {
                write!(f, " {name:?}")?;
            }
            if let (FiberState::Running { carrier }, true) = (x.state, n > 1) {
                write!(f, " (carrier {carrier})")?;
            }
        }
        if shown < n {
            write!(f, " and {} more", n - shown)?;
        }
        Ok(())
    }
}

impl fmt::Display for FiberDump {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.roots {
            return writeln!(
                f,
                "fiber dump unavailable: this runtime was built with fiber_roots(false) \
                 (runtime::Builder::fiber_roots(true) enables it)"
            );
        }
        let count = |p: fn(&FiberState) -> bool| self.fibers.iter().filter(|x| p(&x.state)).count();
        writeln!(
            f,
            "fiber dump: {} live fibers ({} running, {} blocking, {} runnable, {} parked) on {} carriers",
            self.fibers.len(),
            count(|s| matches!(s, FiberState::Running { .. })),
            count(|s| matches!(s, FiberState::Blocking { .. })),
            count(|s| matches!(s, FiberState::Runnable)),
            count(|s| matches!(s, FiberState::Parked { .. })),
            self.carriers,
        )?;
        for g in self.groups() {
            if f.alternate() {
                writeln!(f, "  {g:#}")?;
            } else {
                writeln!(f, "  {g}")?;
            }
        }
        Ok(())
    }
}

/// A duration as a person reads it in a report.
struct Age(Duration);

impl fmt::Display for Age {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d < Duration::from_millis(1) {
            write!(f, "<1 ms")
        } else if d < Duration::from_secs(10) {
            write!(f, "{} ms", d.as_millis())
        } else if d < Duration::from_secs(600) {
            write!(f, "{} s", d.as_secs())
        } else {
            write!(f, "{} min", d.as_secs() / 60)
        }
    }
}

/// Walks the runtime's fiber roots. Safe from any thread, a fiber included; costs the carriers
/// one reference-count increment per live fiber.
pub(crate) fn collect(rt: &Shared) -> FiberDump {
    let roots = rt.config.fiber_roots;
    let mut fibers = Vec::new();
    if roots {
        let now = rt.ns_since_epoch(Instant::now());
        rt.roots.for_each_live(|f| {
            if let Some(info) = describe(rt, &f, now) {
                fibers.push(info);
            }
        });
    }
    FiberDump { fibers, carriers: rt.active.load(Ordering::Relaxed), roots }
}

fn describe(rt: &Shared, f: &FiberRef, now: u64) -> Option<FiberInfo> {
    let state = match f.state() {
        RUNNING if f.is_queued_running() => FiberState::Runnable,
        RUNNING => {
            let carrier = f.carrier.load(Ordering::Relaxed) as usize;
            match rt.slots.get(carrier) {
                Some(slot) if slot.in_blocking(Ordering::Acquire) => {
                    let at = slot.location.load(Ordering::Acquire);
                    if at.is_null() {
                        FiberState::Running { carrier }
                    } else {
                        // SAFETY: `location` only ever holds `&'static Location` pointers.
                        FiberState::Blocking { carrier, at: unsafe { &*at } }
                    }
                }
                _ => FiberState::Running { carrier },
            }
        }
        RUNNABLE => FiberState::Runnable,
        PARKED => {
            let w = f.wait.load(Ordering::Relaxed);
            FiberState::Parked { reason: WaitReason::from_code(w), timed: w & WAIT_TIMED != 0 }
        }
        _ => return None, // finished: its handle keeps the record, not the fiber
    };
    let since = f.since.load(Ordering::Relaxed);
    Some(FiberInfo {
        id: f.id(),
        name: f.name().map(str::to_owned),
        state,
        spawned_at: f.spawned_at(),
        for_: Duration::from_nanos(now.saturating_sub(since)),
        cancelled: f.stop.load(Ordering::Relaxed) & crate::fiber::stop_state::CANCEL != 0,
        // SAFETY: `shield_at` is null or a `&'static Location` stored by `uncancellable`.
        uncancellable_at: unsafe { f.shield_at.load(Ordering::Relaxed).as_ref() },
    })
}

/// The supervisor caught a fiber computing for ~100 ms without a switch while every carrier is
/// busy: warn once per spawn location (cats-effect's starvation checker).
/// `cpu`: the CPU time the carrier's thread got over a window of the stall, if known.
pub(crate) fn warn_starvation(
    rt: &Shared,
    carrier: usize,
    ran_for: Duration,
    cpu: Option<(Duration, Duration)>,
) {
    let dump = collect(rt);
    let line = dump
        .fibers
        .iter()
        .find(|f| f.state == FiberState::Running { carrier })
        .map(|f| {
            let name = f.name.as_deref().map(|n| format!(" {n:?}")).unwrap_or_default();
            format!("fiber {}{name}, spawned at {}", f.id, f.spawned_at)
        })
        .unwrap_or_else(|| "a fiber".into());
    // A thread that was on a CPU for under half the window was mostly waiting for one: the
    // machine is oversubscribed, and the stall may not be the fiber's doing.
    let host = match cpu {
        Some((used, window)) if 2 * used < window => format!(
            " Its thread was on a CPU for only {} ms of the last {} ms: the machine is busy, so \
             the stall may be the system's rather than the fiber's.",
            used.as_millis(),
            window.as_millis()
        ),
        _ => String::new(),
    };
    eprintln!(
        "virtual-threads: CPU starvation: {line} has run on carrier {carrier} for {} ms without a \
         switch while every carrier is busy; the fibers queued behind it wait. Call vt::yield_now() \
         in long loops, or run the computation in vt::blocking (on a helper thread) so the carrier runs the \
         fibers queued behind it. (Reported once per spawn location.){host}",
        ran_for.as_millis()
    );
}

/// Every carrier up to `max_carriers` has been blocked in the OS for a while and fibers wait
/// to run: say how many carriers, where their fibers came from and how to raise the bound.
/// Called once per runtime by the supervisor.
pub(crate) fn report_saturation(rt: &Shared) {
    let max = rt.config.max_carriers;
    let sites = carrier_sites(rt);
    let waiting = collect(rt).fibers.iter().filter(|f| f.state == FiberState::Runnable).count();
    let waiting = match waiting {
        0 => "fibers wait".to_owned(),
        1 => "1 fiber waits".to_owned(),
        n => format!("{n} fibers wait"),
    };
    eprintln!(
        "virtual-threads: all {max} carriers (max_carriers) are blocked (in the OS, or each in \
         one fiber for long without a switch) and {waiting} to run; none runs until a carrier \
         comes back. The blocked carriers' fibers were spawned (or entered vt::blocking): {sites}. \
         Raise the bound with runtime::Builder::max_carriers(n) (VT_MAX_CARRIERS=n for the \
         default runtime), or wait with vt's own calls (vt::sync, vt::channel, vt::sleep, joins), \
         which park the fiber and free its carrier. (Reported once.)"
    );
}

/// Compensation ran away: more than `RUNAWAY_FACTOR` times the target carriers exist, each a
/// thread, because fibers keep blocking their carriers in the OS (a client library's blocking
/// socket calls grew one runtime to 50 carriers with no word said). Said once per runtime, with
/// the sites the carriers' fibers came from, so that the user can move those calls to
/// `vt::blocking` or to `vt`'s own waits.
pub(crate) fn report_runaway(rt: &Shared, active: usize) {
    eprintln!(
        "virtual-threads: {active} carriers run for a target of {}: fibers keep their carriers \
         waiting in the OS, and the runtime compensates with a thread each (up to max_carriers, \
         {}). The carriers' fibers were spawned (or entered vt::blocking): {}. Wait with vt's own \
         calls (vt::sleep, vt::sync, vt::channel, vt::net, joins), which park the fiber and free \
         its carrier, or run the call in vt::blocking. (Reported once.)",
        rt.target,
        rt.config.max_carriers,
        carrier_sites(rt)
    );
}

/// A runtime's drop has waited `waited` for carriers whose fibers do not switch out (blocked
/// in the OS, or computing): it cannot end before they do. Said once per drop, naming them.
pub(crate) fn report_drop_waits(rt: &Shared, waited: Duration) {
    eprintln!(
        "virtual-threads: dropping a Runtime has waited {} ms for carriers still running a fiber \
         that does not switch out (blocked in the OS, or computing); it returns once they do. \
         Their fibers were spawned (or entered vt::blocking): {}. If such a call waits for the \
         thread that drops the runtime (a std channel, lock or join), it never returns: drop \
         the runtime from a thread no fiber waits for, or wait with vt's own calls, which park \
         the fiber.",
        waited.as_millis(),
        carrier_sites(rt)
    );
}

/// Where each running carrier's fiber was spawned, or entered `vt::blocking`, grouped and most
/// frequent first: "3 at src/main.rs:12:14, 1 at ...". The carriers' own record of it, kept
/// even with fiber roots off.
fn carrier_sites(rt: &Shared) -> String {
    let mut sites: Vec<(&'static Location<'static>, usize)> = Vec::new();
    for slot in rt.slots.upto(rt.started()) {
        let loc = slot.location.load(Ordering::Acquire);
        if loc.is_null() {
            continue;
        }
        // SAFETY: `location` only ever holds `&'static Location` pointers.
        let loc: &'static Location<'static> = unsafe { &*loc };
        match sites.iter_mut().find(|(l, _)| l == &loc) {
            Some((_, n)) => *n += 1,
            None => sites.push((loc, 1)),
        }
    }
    sites.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
    let sites: Vec<String> = sites.iter().map(|(l, n)| format!("{n} at {l}")).collect();
    if sites.is_empty() { "none running now".to_owned() } else { sites.join(", ") }
}

// --- Panics: name the fiber, not just its carrier thread. ---

/// The supervisor found carrier `carrier` blocked in the OS for `blocked_for` while `waiting`
/// fibers that can run only there (started on it) wait: say which fiber blocks it, and the fix.
pub(crate) fn report_blocked(rt: &Shared, carrier: usize, blocked_for: Duration, waiting: usize) {
    let dump = collect(rt);
    let line = dump
        .fibers
        .iter()
        .find(|f| match f.state {
            FiberState::Running { carrier: c } | FiberState::Blocking { carrier: c, .. } => c == carrier,
            _ => false,
        })
        .map(|f| {
            let name = f.name.as_deref().map(|n| format!(" {n:?}")).unwrap_or_default();
            format!("fiber {}{name}, spawned at {},", f.id, f.spawned_at)
        })
        .unwrap_or_else(|| "a fiber".into());
    let (fibers, they, wait) =
        if waiting == 1 { ("fiber", "it", "waits") } else { ("fibers", "they", "wait") };
    if let Some(reason) = unwinding_wait(rt, carrier) {
        // Already a vt wait: "use its vt twin" would be wrong advice.
        eprintln!(
            "virtual-threads: carrier {carrier} blocked: {line} waits ({reason}) while it unwinds \
             from a panic (in a destructor), for {} ms, while {waiting} {fibers} that can run only \
             on this carrier ({they} started there) {wait} behind it. A fiber does not switch out \
             while it unwinds (the other fibers of its carrier would see \
             std::thread::panicking()), so its wait holds the carrier: if it waits for one of \
             those fibers, it waits for ever. Do not wait for other fibers in a destructor while \
             std::thread::panicking(), or stop the fiber with JoinHandle::cancel instead of a \
             panic (a stopped fiber's destructors may park). (Reported once per spawn location.)",
            blocked_for.as_millis()
        );
        return;
    }
    eprintln!(
        "virtual-threads: carrier {carrier} blocked: {line} has blocked its OS thread for {} ms \
         while {waiting} {fibers} that can run only on this carrier ({they} started there) {wait} \
         behind it. Run the blocking call in vt::blocking(|| ...), or use its vt twin (vt::sleep, \
         vt::sync::Mutex, vt::channel, vt::net, vt::fs), so that the fiber parks instead. If it \
         waits for a std::sync::Mutex, a fiber of this carrier may hold the guard across a \
         switch point and can never release it: use vt::sync::Mutex, or release the guard before \
         any vt call. (Reported once per spawn location.)",
        blocked_for.as_millis()
    );
}

/// What the fiber running on `carrier` waits for while it unwinds from a panic, on the
/// carrier's thread (`WAIT_UNWINDING`), if it does. `None` too with fiber roots off.
fn unwinding_wait(rt: &Shared, carrier: usize) -> Option<WaitReason> {
    let mut found = None;
    rt.roots.for_each_live(|f| {
        let w = f.wait.load(Ordering::Relaxed);
        if w & WAIT_UNWINDING != 0
            && f.state() == RUNNING
            && f.carrier.load(Ordering::Relaxed) as usize == carrier
        {
            found = Some(WaitReason::from_code(w));
        }
    });
    found
}

// --- SIGQUIT: print every opted-in runtime's dump, as the JVM prints its thread dump. ---

/// Runtimes that asked for a dump on SIGQUIT, the read end of the handler's pipe once its
/// thread runs, and in which process of the fork line (`platform::forks()`) all that is true.
/// Its lock also serialises installing the handler.
struct Sigquit {
    rts: Vec<RuntimeRef>,
    reader: Option<i32>,
    forks: u64,
}

static ON_SIGQUIT: Mutex<Sigquit> = Mutex::new(Sigquit { rts: Vec::new(), reader: None, forks: 0 });

/// Taken by a child's runtime that dumps on SIGQUIT, and by the parent's SIGQUIT thread at any
/// time. A leaf: the SIGQUIT thread is started under it, and a thread's start takes no lock.
fn hold_sigquit_list_across_fork() {
    crate::platform::fork::hold_across_fork(|| Box::new(sigquit()));
}
crate::platform::fork::at_load!(hold_sigquit_list_across_fork);

fn sigquit() -> std::sync::MutexGuard<'static, Sigquit> {
    ON_SIGQUIT.lock().unwrap_or_else(|e| e.into_inner())
}

/// Adds a runtime to those dumped on SIGQUIT, installing the handler and its thread once per
/// process.
pub(crate) fn dump_on_sigquit(rt: &RuntimeRef) -> std::io::Result<()> {
    let mut q = sigquit();
    let forks = crate::platform::forks();
    if q.forks != forks {
        // A child forked since: the runtimes and the reading thread were the parent's, and the
        // pipe is shared with the parent, whose thread would print the parent's dump for the
        // child's SIGQUIT. The handler is still installed; the child needs a pipe and thread of
        // its own. Dropping the parent's runtimes' references would touch runtimes that have no
        // threads here.
        std::mem::forget(std::mem::take(&mut q.rts));
        if let Some(fd) = q.reader.take() {
            sys::close_read_end(fd);
        }
        q.forks = forks;
    }
    if q.reader.is_none() {
        let read_fd = sys::sigquit_pipe()?;
        crate::platform::fork::spawn(std::thread::Builder::new().name("vt-sigquit".into()), move || {
            sigquit_thread(read_fd)
        })?;
        q.reader = Some(read_fd);
    }
    if !sys::sigquit_installed() {
        sys::install_sigquit()?;
    }
    q.rts.push(rt.clone());
    Ok(())
}

/// The runtime is going away: stop dumping it.
pub(crate) fn forget_sigquit(rt: &Shared) {
    if sys::sigquit_installed() {
        sigquit().rts.retain(|r| !std::ptr::eq(r.ptr(), rt));
    }
}

fn sigquit_thread(fd: i32) {
    while sys::wait_forwarded(fd) {
        let rts: Vec<RuntimeRef> = sigquit().rts.clone();
        for rt in rts {
            eprintln!("virtual-threads: SIGQUIT\n{}", collect(&rt));
        }
    }
}
