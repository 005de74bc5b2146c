//! `runtime::Builder`: settings in, a validated `Config` and a started `Runtime` out.

use std::ffi::OsString;
use std::io;
use std::time::Duration;

use super::Runtime;
use crate::fiber::stack::{DEFAULT_STACK_SIZE, usable_size};
use crate::scheduler::config::{Affinity, Config};

/// Default time between two supervisor samples: 10 ms detects a blocked carrier in ~2 ticks
/// (10–20 ms, Go's sysmon works at this scale) at ~0.15% of one core; a 1 ms tick measured
/// false positives from plain OS descheduling. See `arch/supervisor.md`.
pub const DEFAULT_SUPERVISOR_INTERVAL: Duration = Duration::from_millis(10);

/// Default bound on carriers, compensating ones included: Java's virtual-thread scheduler
/// allows 256; blocking pools far larger than the core count were a pain point (cats-effect).
pub const DEFAULT_MAX_CARRIERS: usize = 256;

/// The most carriers a runtime may have, counting compensating ones: Linux's `PID_MAX_LIMIT`
/// (2^22), past which no process can have threads. Above it `carriers` and `max_carriers` are
/// `InvalidInput` (a number near `usize::MAX` overflowed a capacity computation and panicked).
const CARRIERS_LIMIT: usize = 1 << 22;

/// `let rt = vt::Runtime::builder().carriers(4).stack_size(256 << 10).build()?;`
///
/// Settings for a [`Runtime`]. Setters take and return the builder by value, so calls chain:
/// `Runtime::builder().carriers(2).build()`. Nothing is checked or started until
/// [`build`](Builder::build), which reports invalid settings as `io::ErrorKind::InvalidInput`.
#[derive(Debug, Clone)]
pub struct Builder {
    carriers: Option<usize>,
    max_carriers: Option<usize>,
    pin_carriers: Option<bool>,
    migrate_started_fibers: bool,
    place_by_load: bool,
    stack_size: usize,
    fiber_roots: bool,
    supervisor_interval: Duration,
    thread_name: String,
    fork_yield: u32,
    deadlock_report: Option<Duration>,
    dump_on_sigquit: bool,
    compact_parked_after: Option<Duration>,
    trace: Option<std::path::PathBuf>,
}

/// Default quiet period before a "possible deadlock" report (see [`Builder::deadlock_report`]).
pub const DEFAULT_DEADLOCK_QUIET: Duration = Duration::from_secs(1);

impl Default for Builder {
    fn default() -> Builder {
        Builder::new()
    }
}

impl Builder {
    /// The defaults: one carrier per CPU this process may use, pinned; 128 KiB stacks.
    pub fn new() -> Builder {
        Builder {
            carriers: None,
            max_carriers: None,
            pin_carriers: None,
            migrate_started_fibers: false,
            place_by_load: true,
            stack_size: DEFAULT_STACK_SIZE,
            fiber_roots: true,
            supervisor_interval: DEFAULT_SUPERVISOR_INTERVAL,
            thread_name: "vt-carrier".into(),
            fork_yield: 0,
            deadlock_report: Some(DEFAULT_DEADLOCK_QUIET),
            dump_on_sigquit: false,
            compact_parked_after: None,
            trace: None,
        }
    }

    /// Carrier threads to run fibers on. Default: the CPUs this process may use (its affinity
    /// mask and cgroup CPU quota, not the machine's core count). Must be at least 1.
    pub fn carriers(mut self, n: usize) -> Builder {
        self.carriers = Some(n);
        self
    }

    /// The most carriers that may exist at once, compensating carriers (started while others
    /// are blocked in the OS) included. Default: the larger of 256 and `carriers`. Must be at
    /// least `carriers` and at most 2^22 (Linux's limit on threads). Costs nothing until
    /// carriers start: slots are made as they do.
    pub fn max_carriers(mut self, n: usize) -> Builder {
        self.max_carriers = Some(n);
        self
    }

    /// Pin each carrier to one CPU always (`true`), or never (`false`).
    ///
    /// By default each carrier is pinned to one CPU until the supervisor sees that CPU shared:
    /// a carrier that waited for its CPU a tenth of the time, twice in a row over ~50 ms
    /// windows (another process, a load generator or a sidecar, runs there), floats, free to
    /// run on any CPU this process may use, and is pinned again after a while to look once
    /// more (after 10 s, doubling each time it has to float again, up to 5 minutes). A pinned
    /// carrier cannot leave a CPU another process keeps busy, and started fibers cannot leave
    /// their carrier: on a shared host, pinning alone costs throughput (figures in `arch/performance.md`,
    /// "CPU affinity"). [`Metrics::per_carrier`](crate::Metrics::per_carrier) says where each
    /// carrier is pinned now.
    ///
    /// The environment variable `VT_PIN_CARRIERS=1` (or `0`) forces pinning on (or off) for
    /// every runtime of the process, over this setting; any other value makes `build` fail with
    /// `InvalidInput`. Failing to pin is not an error.
    pub fn pin_carriers(mut self, pin: bool) -> Builder {
        self.pin_carriers = Some(pin);
        self
    }

    /// Let fibers that have started move between carriers at switch points, as Loom's virtual
    /// threads do (default `false`: a started fiber runs only on its *home* carrier, the OS
    /// thread where it first ran; fibers that have not started are still stolen freely).
    ///
    /// Migration lets an idle carrier take a started fiber from a busy one, which balances
    /// long-lived fibers (yield loops, ping-pong) across carriers; the home mode balances them
    /// only when they start. `vt::pinned(|| ...)` keeps a fiber on its carrier for a section in
    /// this mode.
    ///
    /// # Safety
    /// With migration on, the OS thread under a fiber may change at any switch point (`park`,
    /// `yield_now`, `sleep`, `join`, `block_on`, a wait on a `vt::sync` lock, a channel or a
    /// socket). Every fiber of this runtime must then hold **no `!Send` value** (an `Rc`, a
    /// `std::sync::MutexGuard`, a `RefCell` borrow of a thread-local, `stdout().lock()`) and
    /// **no reference obtained from a `thread_local!`** across a switch point, in its own code
    /// and in every library it calls; LLVM may keep a thread-local's address in a register
    /// across the switch, so even a plain `thread_local!` access before and after one can read
    /// the old thread's slot. Breaking this is undefined behaviour (measured: corrupted heaps
    /// and wrong reference counts). Sections that cannot keep the contract go inside
    /// `vt::pinned`. See `arch/decisions/0003-home-carriers.md`.
    pub unsafe fn migrate_started_fibers(mut self, migrate: bool) -> Builder {
        self.migrate_started_fibers = migrate;
        self
    }

    /// Place fibers about to start on the carrier with the least load when this one has far
    /// more (default `true`).
    ///
    /// A started fiber never leaves its home carrier, so a carrier that starts a burst of
    /// long-lived fibers while the others are busy (their own fibers keep yielding, so they
    /// never go idle to steal) would be home to all of them for good. With this on, a carrier
    /// counts the started fibers at home on it (its *load*); every 64th fiber it starts, and at
    /// every fiber while it places, it compares that with the other carriers' loads, and while
    /// its own is above twice the least plus 32 it sends every other fiber about to start to
    /// the least loaded carrier instead, which starts it at its next look at the injector (every
    /// 61 switches, or at once when idle). A placed fiber is never placed again.
    ///
    /// It cannot move a fiber that has started, and a carrier held by a fiber that never yields
    /// (or blocked in the OS) gets nothing placed once it has made no switch for two supervisor
    /// intervals; a fiber placed there just before is taken back then (or, at the latest, by a
    /// carrier the supervisor starts for it). Short-lived fibers (fork-join) never raise a load, so they pay one test per
    /// start. Off, or with [`migrate_started_fibers`](Builder::migrate_started_fibers), fibers
    /// start where they are taken. See `arch/decisions/0014-placement-by-load.md`.
    ///
    /// The environment variable `VT_PLACE_BY_LOAD=1` (or `0`) forces it on (or off) for every
    /// runtime of the process, over this setting; any other value makes `build` fail with
    /// `InvalidInput`.
    pub fn place_by_load(mut self, on: bool) -> Builder {
        self.place_by_load = on;
        self
    }

    /// Default usable stack per fiber, in bytes, rounded up to whole pages. Default 128 KiB;
    /// between 16 KiB and 1 GiB. Stacks are reserved address space: a fiber costs only the
    /// pages it touches.
    pub fn stack_size(mut self, bytes: usize) -> Builder {
        self.stack_size = bytes;
        self
    }

    /// Keep what [`Runtime::dump`] needs (default `true`): how long each fiber has been in its
    /// state, and the walk over every live fiber. The registry itself costs nothing per spawn
    /// (it is the pool of fiber records); what `false` saves is a timestamp store at each
    /// switch. With it off, dumps are empty and the deadlock report is off.
    pub fn fiber_roots(mut self, on: bool) -> Builder {
        self.fiber_roots = on;
        self
    }

    /// How often the supervisor samples the carriers (default 10 ms). A carrier stuck in the
    /// kernel for one to two intervals gets a compensating carrier. Must not be zero.
    pub fn supervisor_interval(mut self, every: Duration) -> Builder {
        self.supervisor_interval = every;
        self
    }

    /// Name prefix of the carrier threads (default `vt-carrier`; threads are `prefix-N`).
    pub fn thread_name(mut self, name: impl Into<String>) -> Builder {
        self.thread_name = name.into();
        self
    }

    /// When every fiber has been parked for `quiet` and nothing the runtime knows of can wake
    /// one (no timer, no socket, no plain thread inside a `vt` call), print "possible deadlock:
    /// all fibers are asleep" and the fiber dump to stderr, once. Default: 1 s. `None` turns the
    /// report off. A plain thread that holds a `Sender` or `Fiber` handle outside any `vt` call
    /// is invisible to the runtime, hence "possible": raise `quiet` above the longest such
    /// pause of your program. `VT_DEADLOCK_ABORT=1` in the environment makes a report abort
    /// the process (for CI). Needs `fiber_roots`. `Some(Duration::ZERO)` is `InvalidInput`.
    pub fn deadlock_report(mut self, quiet: Option<Duration>) -> Builder {
        self.deadlock_report = quiet;
        self
    }

    /// Print the fiber dump to stderr when the process receives SIGQUIT (Ctrl-\\), as the JVM
    /// prints its thread dump (default `false`). This replaces SIGQUIT's default action (core
    /// dump) for the whole process; the handler only writes a byte to a pipe, and a small
    /// thread prints the dump of every runtime that asked for it. The default runtime, which has
    /// no builder, takes it from `VT_DUMP_ON_SIGQUIT=1`.
    pub fn dump_on_sigquit(mut self, on: bool) -> Builder {
        self.dump_on_sigquit = on;
        self
    }

    /// A fiber that spawns this many fibers in a row yields once, so its children start on
    /// other carriers (ZIO's fork-yield rule). Default 0: off, because the spawner's yields
    /// cost more than the earlier start of its children gains (`arch/performance.md`).
    pub fn fork_yield(mut self, every: u32) -> Builder {
        self.fork_yield = every;
        self
    }

    /// Compact the stack of every fiber that has been parked for `after` (default `None`:
    /// never). A parked fiber costs at least one resident page of stack (4 KiB), although its
    /// live frames are usually a few hundred bytes to a few KiB: compaction copies that live part
    /// into a heap buffer of its size and gives the stack's pages back to the OS; the fiber's
    /// next resumption copies it back first (a page fault and a small copy, only for fibers
    /// that were parked this long: a fiber woken sooner pays nothing). What it saves per parked
    /// fiber and what a resumption pays: `arch/compaction.md`.
    ///
    /// The supervisor compacts: it looks about every `after` (at least every
    /// `supervisor_interval`) while fibers park, so a fiber is compacted between `after` and
    /// about `2 × after` into its park (earlier by up to two supervisor intervals: park times
    /// are read off a coarse clock), at most 4,096 fibers per supervisor tick. It needs
    /// `fiber_roots` (on by default). Guard pages stay in place. Fibers inside
    /// [`vt::scope`](crate::scope), [`vt::join`](crate::join), `block_on`, `ThreadPool::scope`
    /// or [`vt::no_compaction`](crate::no_compaction) are skipped, as are fibers whose live stack
    /// is larger than 16 KiB. An unpark that arrives while the compactor holds a fiber is delayed
    /// until it lets go (at most one batch of 64 fibers), never lost.
    ///
    /// Errors at `build`: `InvalidInput` for `Some(Duration::ZERO)`, or with `fiber_roots(false)`.
    ///
    /// # Safety
    /// While a fiber of this runtime is parked, nothing but the fiber itself may read or write
    /// its stack, except through the APIs listed above (which keep it resident). A compacted
    /// stack's memory is given back: a write into it from another thread is lost and a read
    /// sees zeros. Safe code can break this only by parking (a `vt` wait, `sleep`, `join`, a
    /// lock or a channel) while threads borrow the fiber's locals, as in
    /// `std::thread::scope(|s| { s.spawn(|| use(&local)); vt::sleep(d) })` or the same with
    /// `crossbeam::scope`; wrap such sections in [`vt::no_compaction`](crate::no_compaction).
    /// Unsafe code that hands a pointer into a fiber's stack to another thread must do the same.
    pub unsafe fn compact_parked_after(mut self, after: Option<Duration>) -> Builder {
        self.compact_parked_after = after;
        self
    }

    /// Records an execution trace into `path` from the moment the runtime starts until it is
    /// dropped or [`Runtime::trace_stop`] is called: what each carrier ran (fiber run slices),
    /// when it slept or stole, which fiber woke which, why each fiber parked, spawns, panics,
    /// and the supervisor's blocked carriers and compensations. The file is Chrome trace-event
    /// JSON: open it in Perfetto (<https://ui.perfetto.dev>, which loads it in the browser
    /// without uploading it) or turn it into a self-contained HTML report with a wait profile
    /// (`cargo run -p vt-bench --bin vt-trace-report -- trace.json report.html`). The default
    /// runtime takes it from `VT_TRACE=path`. Off by default; the cost when off is one
    /// predictable branch per hook, and when on what `README.md` ("Seeing what happened")
    /// measures. Errors at `build`: the file cannot be created (the error names it).
    pub fn trace(mut self, path: impl Into<std::path::PathBuf>) -> Builder {
        self.trace = Some(path.into());
        self
    }

    /// Validates the settings and starts the carriers.
    ///
    /// Errors: `InvalidInput` for 0 carriers, `max_carriers < carriers`, a stack size out of
    /// range, a zero supervisor interval or a thread name with a NUL byte; otherwise the OS
    /// error from starting a thread.
    pub fn build(self) -> io::Result<Runtime> {
        Runtime::start(self.config()?)
    }

    /// The settings the process-wide default runtime takes from the environment:
    /// `VT_CARRIERS`, `VT_MAX_CARRIERS`, `VT_STACK_SIZE` (bytes, or with a `K`, `M` or `G`
    /// suffix: `1M`), `VT_DUMP_ON_SIGQUIT` (`1` or `0`: [`dump_on_sigquit`](Builder::dump_on_sigquit))
    /// and `VT_TRACE` (a path: [`trace`](Builder::trace)). `var` reads one variable (`std::env::var_os`, or a test's table); unset or
    /// empty ones leave the builder's value. A value that is not a number is `InvalidInput`
    /// naming the variable; one out of range is caught by `build`, whose error the caller
    /// completes with [`env_note`].
    pub(crate) fn with_env(mut self, var: impl Fn(&str) -> Option<OsString>) -> io::Result<Builder> {
        let read = |name: &str, parse: fn(&str) -> Option<usize>, what: &str| -> io::Result<Option<usize>> {
            let Some(raw) = var(name) else { return Ok(None) };
            let text = raw.to_str().map(str::trim).unwrap_or("\u{fffd}");
            if text.is_empty() {
                return Ok(None);
            }
            parse(text).map(Some).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{name}={raw:?} in the environment is not {what}"),
                )
            })
        };
        let count = |t: &str| t.parse().ok();
        if let Some(n) = read("VT_CARRIERS", count, "a number of carriers")? {
            self = self.carriers(n);
        }
        if let Some(n) = read("VT_MAX_CARRIERS", count, "a number of carriers")? {
            self = self.max_carriers(n);
        }
        if let Some(bytes) =
            read("VT_STACK_SIZE", parse_size, "a size in bytes (such as 262144, 256K or 1M)")?
        {
            self = self.stack_size(bytes);
        }
        let switch = |t: &str| match t {
            "1" => Some(1),
            "0" => Some(0),
            _ => None,
        };
        if let Some(on) = read("VT_DUMP_ON_SIGQUIT", switch, "1 (dump on SIGQUIT) or 0")? {
            self = self.dump_on_sigquit(on == 1);
        }
        if let Some(path) = var("VT_TRACE").filter(|p| !p.is_empty()) {
            self = self.trace(path);
        }
        Ok(self)
    }

    fn config(self) -> io::Result<Config> {
        let invalid = |msg: String| Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        let carriers = self.carriers.unwrap_or_else(crate::platform::usable_cpus);
        if carriers == 0 {
            return invalid("a runtime needs at least 1 carrier, got carriers(0)".into());
        }
        for (name, n) in [("carriers", Some(carriers)), ("max_carriers", self.max_carriers)] {
            if let Some(n) = n.filter(|&n| n > CARRIERS_LIMIT) {
                return invalid(format!(
                    "{name}({n}) is above the limit of {CARRIERS_LIMIT} carriers (no process can have \
                     more threads)"
                ));
            }
        }
        let max_carriers = self.max_carriers.unwrap_or(DEFAULT_MAX_CARRIERS.max(carriers));
        if max_carriers < carriers {
            return invalid(format!("max_carriers({max_carriers}) is below carriers({carriers})"));
        }
        if self.supervisor_interval.is_zero() {
            return invalid("supervisor_interval must be greater than zero".into());
        }
        if self.deadlock_report.is_some_and(|d| d.is_zero()) {
            return invalid(
                "deadlock_report's quiet period must be greater than zero (None turns it off)".into(),
            );
        }
        if self.compact_parked_after.is_some_and(|d| d.is_zero()) {
            return invalid("compact_parked_after must be greater than zero (None turns it off)".into());
        }
        if self.compact_parked_after.is_some() && !self.fiber_roots {
            return invalid(
                "compact_parked_after needs fiber_roots(true): the compactor finds parked fibers \
                 through the roots"
                    .into(),
            );
        }
        if self.thread_name.contains('\0') {
            return invalid("thread_name must not contain a NUL byte".into());
        }
        Ok(Config {
            carriers,
            max_carriers,
            affinity: affinity(self.pin_carriers, std::env::var_os("VT_PIN_CARRIERS"))?,
            migrate_started_fibers: self.migrate_started_fibers,
            place_by_load: env_switch("VT_PLACE_BY_LOAD", std::env::var_os("VT_PLACE_BY_LOAD"))?
                .unwrap_or(self.place_by_load),
            stack_size: usable_size(self.stack_size)?,
            fiber_roots: self.fiber_roots,
            supervisor_interval: self.supervisor_interval,
            thread_name: self.thread_name,
            fork_yield: self.fork_yield,
            deadlock_report: self.deadlock_report,
            dump_on_sigquit: self.dump_on_sigquit,
            compact_parked_after: self.compact_parked_after,
            trace: self.trace,
        })
    }
}

/// Where carriers run: `VT_PIN_CARRIERS` (`0` or `1`) over the builder's `pin_carriers`, over
/// the adaptive default.
fn affinity(pin: Option<bool>, env: Option<OsString>) -> io::Result<Affinity> {
    let forced = env_switch("VT_PIN_CARRIERS", env)?;
    Ok(match forced.or(pin) {
        None => Affinity::Adaptive,
        Some(true) => Affinity::Pinned,
        Some(false) => Affinity::Floating,
    })
}

/// A `0` or `1` switch from the environment (`None` when unset or empty), which goes over
/// the builder's setting.
fn env_switch(name: &str, env: Option<OsString>) -> io::Result<Option<bool>> {
    match env.as_ref().map(|v| v.to_str().map(str::trim)) {
        None | Some(Some("")) => Ok(None),
        Some(Some("1")) => Ok(Some(true)),
        Some(Some("0")) => Ok(Some(false)),
        Some(_) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{name}={:?} in the environment is not 0 (off) or 1 (on); unset it for the default",
                env.unwrap_or_default()
            ),
        )),
    }
}

/// The environment variables of [`Builder::with_env`] that are set, as `NAME=value` pairs, for
/// an error message: a bound of the default runtime out of range names where it came from.
pub(crate) fn env_note(var: impl Fn(&str) -> Option<OsString>) -> String {
    let set: Vec<String> = ["VT_CARRIERS", "VT_MAX_CARRIERS", "VT_STACK_SIZE"]
        .into_iter()
        .filter_map(|name| {
            var(name).filter(|v| !v.is_empty()).map(|v| format!("{name}={}", v.to_string_lossy()))
        })
        .collect();
    if set.is_empty() { String::new() } else { format!(" (the environment sets {})", set.join(", ")) }
}

/// `262144`, `256K`, `256KiB`, `1M`, `1g`: bytes, or binary kilo-, mega- and gigabytes.
fn parse_size(text: &str) -> Option<usize> {
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (n, unit) = text.split_at(digits);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return None,
    };
    n.parse::<usize>().ok()?.checked_mul(1 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vt_place_by_load_forces_either_and_rejects_anything_else() {
        let env = |v: &str| Some(OsString::from(v));
        assert_eq!(env_switch("VT_PLACE_BY_LOAD", None).unwrap(), None);
        assert_eq!(env_switch("VT_PLACE_BY_LOAD", env(" ")).unwrap(), None);
        assert_eq!(env_switch("VT_PLACE_BY_LOAD", env("0")).unwrap(), Some(false));
        assert_eq!(env_switch("VT_PLACE_BY_LOAD", env("1")).unwrap(), Some(true));
        let e = env_switch("VT_PLACE_BY_LOAD", env("on")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("VT_PLACE_BY_LOAD=\"on\""), "{e}");
    }

    #[test]
    fn vt_pin_carriers_forces_either_and_rejects_anything_else() {
        let env = |v: &str| Some(OsString::from(v));
        assert_eq!(affinity(None, None).unwrap(), Affinity::Adaptive);
        assert_eq!(affinity(Some(true), None).unwrap(), Affinity::Pinned);
        assert_eq!(affinity(Some(false), env("")).unwrap(), Affinity::Floating);
        assert_eq!(affinity(Some(true), env("0")).unwrap(), Affinity::Floating);
        assert_eq!(affinity(None, env(" 1 ")).unwrap(), Affinity::Pinned);
        let e = affinity(None, env("yes")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("VT_PIN_CARRIERS=\"yes\""), "{e}");
    }

    #[test]
    fn invalid_settings_are_invalid_input() {
        let kind = |b: Builder| b.config().unwrap_err().kind();
        assert_eq!(kind(Builder::new().carriers(0)), io::ErrorKind::InvalidInput);
        assert_eq!(kind(Builder::new().carriers(4).max_carriers(2)), io::ErrorKind::InvalidInput);
        assert_eq!(kind(Builder::new().stack_size(1024)), io::ErrorKind::InvalidInput);
        assert_eq!(kind(Builder::new().supervisor_interval(Duration::ZERO)), io::ErrorKind::InvalidInput);
        assert_eq!(kind(Builder::new().thread_name("a\0b")), io::ErrorKind::InvalidInput);
        // SAFETY: never built: the contract of compaction does not come into play.
        let compact = |after| unsafe { Builder::new().compact_parked_after(after) };
        assert_eq!(kind(compact(Some(Duration::ZERO))), io::ErrorKind::InvalidInput);
        assert_eq!(
            kind(compact(Some(Duration::from_secs(1))).fiber_roots(false)),
            io::ErrorKind::InvalidInput
        );
        assert!(compact(None).fiber_roots(false).config().is_ok());
        assert!(compact(Some(Duration::from_nanos(1))).config().is_ok());
        assert!(Builder::new().carriers(3).config().unwrap().max_carriers >= 3);
        for b in [Builder::new().carriers(usize::MAX), Builder::new().max_carriers(usize::MAX)] {
            let e = b.config().unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            assert!(e.to_string().contains(&format!("carriers({})", usize::MAX)), "names the setting: {e}");
        }
        assert_eq!(kind(Builder::new().carriers(CARRIERS_LIMIT + 1)), io::ErrorKind::InvalidInput);
        assert_eq!(
            Builder::new().max_carriers(CARRIERS_LIMIT).config().unwrap().max_carriers,
            CARRIERS_LIMIT
        );
    }

    fn env<'a>(vars: &'a [(&str, &str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        |name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
    }

    #[test]
    fn the_environment_sets_the_default_runtimes_bounds_and_names_a_bad_value() {
        let vars = [("VT_CARRIERS", " 3 "), ("VT_MAX_CARRIERS", "9"), ("VT_STACK_SIZE", "256K")];
        let c = Builder::new().with_env(env(&vars)).unwrap().config().unwrap();
        assert_eq!((c.carriers, c.max_carriers, c.stack_size), (3, 9, 256 * 1024));
        assert!(!c.dump_on_sigquit);
        let c = Builder::new().with_env(env(&[("VT_DUMP_ON_SIGQUIT", "1")])).unwrap().config().unwrap();
        assert!(c.dump_on_sigquit);
        let on = Builder::new().dump_on_sigquit(true);
        assert!(!on.with_env(env(&[("VT_DUMP_ON_SIGQUIT", "0")])).unwrap().config().unwrap().dump_on_sigquit);
        // Unset or empty: the builder's own values.
        let c = Builder::new().carriers(2).with_env(env(&[("VT_CARRIERS", "")])).unwrap().config().unwrap();
        assert_eq!((c.carriers, c.stack_size), (2, DEFAULT_STACK_SIZE));
        for (name, value) in [
            ("VT_CARRIERS", "two"),
            ("VT_MAX_CARRIERS", "-1"),
            ("VT_STACK_SIZE", "1 parsec"),
            ("VT_DUMP_ON_SIGQUIT", "yes"),
        ] {
            let e = Builder::new().with_env(env(&[(name, value)])).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            assert!(e.to_string().starts_with(&format!("{name}=\"{value}\"")), "{e}");
        }
        // In range is `build`'s to check; the note says where the values came from.
        let vars = [("VT_CARRIERS", "4"), ("VT_MAX_CARRIERS", "2")];
        let e = Builder::new().with_env(env(&vars)).unwrap().config().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(env_note(env(&vars)), " (the environment sets VT_CARRIERS=4, VT_MAX_CARRIERS=2)");
        assert_eq!(env_note(env(&[])), "");
    }

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("262144"), Some(262_144));
        assert_eq!(parse_size("64K"), Some(65_536));
        assert_eq!(parse_size("64kib"), Some(65_536));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("2 MiB"), Some(2 << 20));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        for bad in ["", "K", "1.5M", "1T", "-1", "99999999999999999999G"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }
}
