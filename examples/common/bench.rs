//! The timing harness the workload examples share (W1 `fork_join`, W3 `chained_fork`, W4
//! `ping_pong`, W5 `yield_many`, W7 `sleep_many`): the runtime from `--carriers`, untimed
//! warm-up ops, the timed ops (all inside one fiber), and the median with the extremes. Each
//! example includes it with `#[path = "common/bench.rs"] mod bench;`, beside `args.rs`.
//!
//! It also stops a run on Ctrl-C or SIGTERM (`soak` and `echo_client` use that part alone): the
//! first ends the run after the op under way, so the example reports the ops it timed and exits
//! 0, as a finished run does; a second ends the process at once (status 128 + the signal).

#![allow(dead_code)] // each example uses part of it

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use virtual_threads as vt;
use vt::signal::{Signal, Signals};

/// The runtime an example measures: `carriers` carriers, or the runtime's default (one per
/// usable CPU), recording an execution trace into `$VT_TRACE` when that is set, as the default
/// runtime does. Takes over Ctrl-C and SIGTERM (`stop_on_signals`). Exits with status 1, naming
/// `program`, if either cannot be set up.
pub fn runtime(program: &str, carriers: Option<usize>) -> vt::Runtime {
    let mut builder = vt::Runtime::builder();
    if let Some(c) = carriers {
        builder = builder.carriers(c);
    }
    if let Some(path) = std::env::var_os("VT_TRACE").filter(|p| !p.is_empty()) {
        builder = builder.trace(path);
    }
    let rt = builder.build().unwrap_or_else(|e| fail(program, &format!("cannot build the runtime: {e}")));
    stop_on_signals(program);
    rt
}

/// Set by the first SIGINT or SIGTERM; `STOP_LOCK` and `STOP_WAKE` let `sleep` wait for it.
static STOP: AtomicBool = AtomicBool::new(false);
static STOP_LOCK: Mutex<()> = Mutex::new(());
static STOP_WAKE: Condvar = Condvar::new();

/// Takes over SIGINT and SIGTERM: the first sets the flag `stopped` reads, the second ends the
/// process with status 128 + the signal. Exits with status 1, naming `program`, if it cannot.
pub fn stop_on_signals(program: &str) {
    let mut signals = Signals::new(&[Signal::INT, Signal::TERM])
        .unwrap_or_else(|e| fail(program, &format!("cannot take over Ctrl-C and SIGTERM: {e}")));
    // A plain thread, which `Signals::wait` blocks: it must not hold a carrier of the run.
    let watcher = move || {
        signals.wait();
        {
            // Set under the lock, so that a `sleep` between its look and its wait hears it.
            let _guard = STOP_LOCK.lock().unwrap();
            STOP.store(true, Ordering::Relaxed);
        }
        STOP_WAKE.notify_all();
        std::process::exit(128 + signals.wait().as_raw());
    };
    let started = std::thread::Builder::new().name("stop".into()).spawn(watcher);
    started.unwrap_or_else(|e| fail(program, &format!("cannot start the signal thread: {e}")));
}

/// Whether Ctrl-C or SIGTERM asked the run to stop.
pub fn stopped() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Sleeps for `d`, or until a stop is asked; returns `stopped()`.
pub fn sleep(d: Duration) -> bool {
    let guard = STOP_LOCK.lock().unwrap();
    drop(STOP_WAKE.wait_timeout_while(guard, d, |_| !stopped()).unwrap());
    stopped()
}

/// What one run measured: a value per timed op, in op order (fewer than `iters` if a signal
/// stopped the run), and how many untimed ops warmed up the stacks, records and caches before
/// them.
pub struct Run<T> {
    pub ops: Vec<T>,
    pub iters: usize,
    pub warm_up: usize,
}

impl<T> Run<T> {
    /// Says that a signal stopped the run early, if it did; exits 0 if it timed nothing.
    pub fn say_if_stopped(&self, program: &str) {
        if self.ops.is_empty() {
            println!("{program}: stopped by a signal before any timed op");
            std::process::exit(0);
        }
        if self.ops.len() < self.iters {
            println!("  stopped by a signal after {} of {} ops", self.ops.len(), self.iters);
        }
    }
}

/// Runs `op` `(iters / 10).max(min_warm_up)` times untimed, then `iters` times, keeping what
/// each of those returns; all inside one fiber of `rt`, so the ops spawn from a carrier as a
/// program's fibers do. The caller's thread blocks meanwhile. A stop (`stopped`) ends it after
/// the op under way.
pub fn run<T: Send>(rt: &vt::Runtime, iters: usize, min_warm_up: usize, op: impl Fn() -> T + Sync) -> Run<T> {
    let warm_up = (iters / 10).max(min_warm_up);
    timed(rt, warm_up, &op);
    Run { ops: timed(rt, iters, op), iters, warm_up }
}

/// Runs `op` `count` times inside one fiber of `rt`, fewer if a stop is asked, and returns what
/// each run returned.
pub fn timed<T: Send>(rt: &vt::Runtime, count: usize, op: impl Fn() -> T + Sync) -> Vec<T> {
    rt.block_on(|| (0..count).map_while(|_| (!stopped()).then(&op)).collect())
}

/// The median and the extremes of a sample.
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// The spread of `values` (in any order; not empty). The median of an even count is the upper
/// of the middle two.
pub fn spread(mut values: Vec<f64>) -> Spread {
    values.sort_by(f64::total_cmp);
    Spread { median: values[values.len() / 2], min: values[0], max: values[values.len() - 1] }
}

/// Reports an error on stderr and exits with status 1.
pub fn fail(program: &str, message: &str) -> ! {
    eprintln!("{program}: {message}");
    std::process::exit(1)
}
