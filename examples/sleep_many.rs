//! Sleep-many, workload W7 of `benches/README.md`: n fibers each sleep 10 ms; the
//! caller joins all. It measures the timers (arming, firing, waking 10,000 fibers) against the
//! ideal: milliseconds over 10 ms per op (median, min and max over the ops), and when the last
//! fiber had armed its timer (how long the spawns and first runs took).
//!
//! Run: `cargo run --release --example sleep_many`
//! Flags: `--fibers N` (default 10,000), `--iters K` timed ops (default 30), `--carriers C`
//! (default: the runtime's, one per usable CPU).
//! Ctrl-C or SIGTERM stops it after the op under way, with the ops timed so far.

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
    let (fibers, iters, carriers) = parse_args().unwrap_or_else(|e| bench::fail("sleep_many", &e));
    let rt = bench::runtime("sleep_many", carriers);
    let run = bench::run(&rt, iters, 2, || {
        let (wall, armed) = sleep_many(fibers);
        (wall.as_secs_f64() * 1e3 - 10.0, armed.as_secs_f64() * 1e3)
    });
    let carriers = rt.carriers();
    println!(
        "sleep_many: {fibers} fibers sleep 10 ms per op, {carriers} carriers, {iters} ops ({} warm-up)",
        run.warm_up
    );
    run.say_if_stopped("sleep_many");
    let over = bench::spread(run.ops.iter().map(|o| o.0).collect());
    let armed = bench::spread(run.ops.iter().map(|o| o.1).collect());
    println!(
        "  over the ideal {:>+7.2} ms  median (min {:+.2}, max {:+.2})",
        over.median, over.min, over.max
    );
    println!("  last sleep began {:>6.2} ms  into the op (median)", armed.median);
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
