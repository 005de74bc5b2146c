//! Sleep-many, workload W7 of `benches/README.md`: n fibers each sleep 10 ms; the
//! caller joins all. It measures the timers (arming, firing, waking 10,000 fibers) against the
//! ideal: milliseconds over 10 ms per op (median, min and max over the ops), and when the last
//! fiber had armed its timer (how long the spawns and first runs took).
//!
//! Run: `cargo run --release --example sleep_many`
//! Flags: `--fibers N` (default 10,000), `--iters K` timed ops (default 30), `--carriers C`
//! (default: the runtime's, one per usable CPU). Ctrl-C or SIGTERM stops it with the ops timed so
//! far.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use virtual_threads as vt;

#[path = "common/args.rs"]
mod args;
#[path = "common/bench.rs"]
mod bench;

const ABOUT: &str =
    "workload W7 (benches/README.md): n fibers each sleep 10 ms; the op's time against the ideal";

const NAP: Duration = Duration::from_millis(10);

/// One op; returns (wall, when the last fiber began its sleep), both from the op's start.
fn sleep_many(fibers: usize) -> (Duration, Duration) {
    let start = Instant::now();
    // Nanoseconds after `start` at which the last fiber began to sleep (a max, not a count: a
    // shared counter the fibers all write would be a workload of its own).
    let last_armed = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..fibers)
        .map(|_| {
            let last = last_armed.clone();
            vt::spawn(move || {
                last.fetch_max(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
                vt::sleep(NAP);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    (start.elapsed(), Duration::from_nanos(last_armed.load(Ordering::Relaxed)))
}

fn main() {
    let (fibers, iters, carriers) = parse_args().unwrap_or_else(|e| fail(&e));
    let rt = bench::setup(carriers).unwrap_or_else(|e| fail(&e));
    let warm_up = (iters / 10).max(2);
    let carriers = rt.carriers();
    println!(
        "sleep_many: {fibers} fibers sleep 10 ms per op, {carriers} carriers, {iters} ops ({warm_up} warm-up)"
    );
    let ops = bench::run(&rt, warm_up, iters, || {
        let (wall, armed) = sleep_many(fibers);
        (wall.as_secs_f64() * 1e3 - 10.0, armed.as_secs_f64() * 1e3)
    });
    let (mut over, mut armed): (Vec<f64>, Vec<f64>) = ops.into_iter().unzip();
    let done = over.len();
    let Some((median, fastest, slowest)) = bench::spread(&mut over) else {
        bench::nothing_timed("sleep_many")
    };
    bench::say_if_stopped(done, iters);
    println!("  over the ideal {median:>+7.2} ms  median (min {fastest:+.2}, max {slowest:+.2})");
    let armed = bench::spread(&mut armed).expect("as many as the ops").0;
    println!("  last sleep began {armed:>6.2} ms  into the op (median)");
}

/// The flags; `--help` lists them.
fn parse_args() -> Result<(usize, usize, Option<usize>), String> {
    let a = args::parse(
        "sleep_many",
        ABOUT,
        &[
            args::flag("--fibers", "N", "10000", "fibers per op"),
            args::flag("--iters", "K", "30", "timed ops"),
            args::flag("--carriers", "C", "", "carriers (default: one per usable CPU)"),
        ],
    );
    Ok((a.positive("--fibers").unwrap(), a.positive("--iters").unwrap(), a.get("--carriers")))
}

/// Reports an error on stderr and exits with status 1.
fn fail(message: &str) -> ! {
    eprintln!("sleep_many: {message}");
    std::process::exit(1)
}
