//! Sleep-many, workload W7 of `benches/README.md`: n fibers each sleep 10 ms; the
//! caller joins all. It measures the timers (arming, firing, waking 10,000 fibers) against the
//! ideal: milliseconds over 10 ms per op (median, min and max over the ops), and when the last
//! fiber had armed its timer (how long the spawns and first runs took).
//!
//! Run: `cargo run --release --example sleep_many`
//! Flags: `--fibers N` (default 10,000), `--iters K` timed ops (default 30), `--carriers C`
//! (default: the runtime's, one per usable CPU).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use virtual_threads as vt;

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
    let mut builder = vt::Runtime::builder();
    if let Some(c) = carriers {
        builder = builder.carriers(c);
    }
    let rt = builder.build().unwrap_or_else(|e| fail(&format!("cannot build the runtime: {e}")));
    let warm_up = (iters / 10).max(2);
    let mut ops: Vec<(f64, f64)> = rt.block_on(|| {
        let op = || {
            let (wall, armed) = sleep_many(fibers);
            (wall.as_secs_f64() * 1e3 - 10.0, armed.as_secs_f64() * 1e3)
        };
        for _ in 0..warm_up {
            op();
        }
        (0..iters).map(|_| op()).collect()
    });
    ops.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (median, fastest, slowest) = (ops[iters / 2].0, ops[0].0, ops[iters - 1].0);
    let mut armed: Vec<f64> = ops.iter().map(|o| o.1).collect();
    armed.sort_by(f64::total_cmp);
    let carriers = rt.carriers();
    println!(
        "sleep_many: {fibers} fibers sleep 10 ms per op, {carriers} carriers, {iters} ops ({warm_up} warm-up)"
    );
    println!("  over the ideal {median:>+7.2} ms  median (min {fastest:+.2}, max {slowest:+.2})");
    println!("  last sleep began {:>6.2} ms  into the op (median)", armed[iters / 2]);
}

/// `--fibers N`, `--iters K`, `--carriers C`, by hand.
fn parse_args() -> Result<(usize, usize, Option<usize>), String> {
    let (mut fibers, mut iters, mut carriers) = (10_000, 30, None);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let known = ["--fibers", "--iters", "--carriers"].contains(&flag.as_str());
        let number = args.next().filter(|_| known).and_then(|v| v.parse::<usize>().ok());
        let number =
            number.ok_or(format!("bad argument {flag} (usage: --fibers N --iters K --carriers C)"))?;
        match flag.as_str() {
            "--fibers" if number > 0 => fibers = number,
            "--iters" if number > 0 => iters = number,
            "--carriers" => carriers = Some(number),
            _ => return Err(format!("{flag} must be at least 1")),
        }
    }
    Ok((fibers, iters, carriers))
}

/// Reports an error on stderr and exits with status 1.
fn fail(message: &str) -> ! {
    eprintln!("sleep_many: {message}");
    std::process::exit(1)
}
