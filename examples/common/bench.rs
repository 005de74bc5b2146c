//! What the workload examples share: the runtime from `--carriers`, a warm-up, timed ops on it,
//! medians, and a stop on Ctrl-C or SIGTERM. A stopped run reports the ops it timed and exits 0,
//! as a finished one does; a second signal ends the process at once (status 130). Each example
//! includes it with `#[path = "common/bench.rs"] mod bench;`.

#![allow(dead_code)] // each example uses part of it

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use virtual_threads as vt;
use vt::signal::{Signal, Signals};

/// Set by the first SIGINT or SIGTERM; guarded by `STOP_LOCK` for `sleep`'s wait.
static STOP: AtomicBool = AtomicBool::new(false);
static STOP_LOCK: Mutex<()> = Mutex::new(());
static STOP_WAKE: Condvar = Condvar::new();

/// Builds the runtime (`carriers`, or one per usable CPU) and takes over Ctrl-C and SIGTERM, so
/// that `stopped` turns true at the first of them. Errors name what failed.
pub fn setup(carriers: Option<usize>) -> Result<vt::Runtime, String> {
    let mut builder = vt::Runtime::builder();
    if let Some(c) = carriers {
        builder = builder.carriers(c);
    }
    let rt = builder.build().map_err(|e| format!("cannot build the runtime: {e}"))?;
    stop_on_signals()?;
    Ok(rt)
}

/// The first SIGINT or SIGTERM sets the stop flag; the second ends the process with 130.
pub fn stop_on_signals() -> Result<(), String> {
    let mut signals = Signals::new(&[Signal::INT, Signal::TERM])
        .map_err(|e| format!("cannot handle Ctrl-C and SIGTERM: {e}"))?;
    // A plain thread: `Signals::wait` blocks it, and it must not take a carrier from the work.
    std::thread::Builder::new()
        .name("stop".into())
        .spawn(move || {
            signals.wait();
            {
                let _guard = STOP_LOCK.lock().unwrap();
                STOP.store(true, Ordering::Relaxed);
            }
            STOP_WAKE.notify_all();
            let sig = signals.wait();
            std::process::exit(128 + sig.as_raw());
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    Ok(())
}

/// Whether Ctrl-C or SIGTERM asked the run to stop.
pub fn stopped() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Sleeps for `d`, or until a stop is asked; returns `stopped()`.
pub fn sleep(d: Duration) -> bool {
    let guard = STOP_LOCK.lock().unwrap();
    let _ = STOP_WAKE.wait_timeout_while(guard, d, |_| !stopped()).unwrap();
    stopped()
}

/// Runs `op` `count` times on `rt` (one `block_on`), fewer if a stop is asked, and returns what
/// each run returned.
pub fn time<T: Send>(rt: &vt::Runtime, count: usize, op: impl Fn() -> T + Sync) -> Vec<T> {
    rt.block_on(|| (0..count).map_while(|_| (!stopped()).then(&op)).collect())
}

/// `warm_up` ops, then `iters` timed ones (fewer if stopped), on `rt`.
pub fn run<T: Send>(rt: &vt::Runtime, warm_up: usize, iters: usize, op: impl Fn() -> T + Sync) -> Vec<T> {
    time(rt, warm_up, &op);
    time(rt, iters, &op)
}

/// Median, min and max of `samples` (sorts them); `None` if there are none.
pub fn spread(samples: &mut [f64]) -> Option<(f64, f64, f64)> {
    samples.sort_by(f64::total_cmp);
    Some((*samples.get(samples.len() / 2)?, samples[0], *samples.last()?))
}

/// Says that a signal stopped the run before all `asked` ops, if it did.
pub fn say_if_stopped(done: usize, asked: usize) {
    if done < asked {
        println!("  stopped by a signal after {done} of {asked} ops");
    }
}

/// For a run stopped before any timed op: says so and exits 0.
pub fn nothing_timed(program: &str) -> ! {
    println!("{program}: stopped by a signal before any timed op");
    std::process::exit(0)
}
