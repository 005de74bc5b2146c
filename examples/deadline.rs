//! Deadline: fan out n fibers that each sleep a random 1–50 ms and then compute; keep the
//! results that arrive within a 30 ms deadline, stop the rest, and print how many finished and
//! how many were stopped. With `--parked`, it measures instead how long after its deadline a
//! `vt::TaskScope` of n fibers parked on a channel returns (every fiber stopped and finished).
//!
//! Run: `cargo run --release --example deadline`
//! Flags: `--fibers N` (10,000), `--deadline-ms D` (30), `--max-sleep-ms S` (50), `--carriers C`
//! (default: one per usable CPU), `--parked` with `--iters K` (10).

use std::time::{Duration, Instant};
use virtual_threads as vt;

#[path = "common/args.rs"]
mod args;

const ABOUT: &str =
    "fan out fibers that sleep 1-50 ms and compute; keep what arrives within a deadline, stop the rest";

/// Some work for a fiber after its sleep: a few thousand rounds of xorshift.
fn compute(seed: u64) -> u64 {
    let mut x = seed | 1;
    for _ in 0..2_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    x
}

fn fan_out(fibers: u64, deadline: Duration, max_sleep_ms: u64) {
    let start = Instant::now();
    let at = start + deadline;
    let mut set = vt::JoinSet::new();
    for i in 0..fibers {
        set.spawn(move || {
            let ms = 1 + compute(i) % max_sleep_ms;
            vt::sleep(Duration::from_millis(ms));
            compute(i ^ ms)
        });
    }
    let mut kept = Vec::new();
    // The results that arrive before the deadline; then the rest are stopped.
    let _ = vt::deadline(at, || {
        while let Some(r) = set.join_next() {
            kept.push(r.expect("a fiber of the fan-out panicked"));
        }
    });
    let in_time = start.elapsed();
    set.cancel_all();
    let (mut stopped, mut late) = (0u64, 0u64);
    while let Some(r) = set.join_next() {
        match r {
            Err(p) if p.is::<vt::Cancelled>() => stopped += 1,
            // Finished between the deadline and the stop: too late, dropped.
            _ => late += 1,
        }
    }
    let all = start.elapsed();
    println!(
        "deadline: {fibers} fibers, each sleeping 1-{max_sleep_ms} ms then computing; deadline {} ms",
        deadline.as_millis()
    );
    println!("  finished  {:>6}  (results kept, by {:.1} ms)", kept.len(), in_time.as_secs_f64() * 1e3);
    println!("  stopped   {stopped:>6}  (all gone {:.1} ms after the start)", all.as_secs_f64() * 1e3);
    if late > 0 {
        println!("  late      {late:>6}  (finished after the deadline, before their stop: dropped)");
    }
}

/// Milliseconds from the deadline to the return of a task scope of `fibers` fibers parked on
/// a channel.
fn parked(fibers: u64, deadline: Duration) -> f64 {
    let (_tx, rx) = vt::channel::unbounded::<u64>();
    let at = Instant::now() + deadline;
    let r = vt::TaskScope::new().deadline(at).all_ok(|s| {
        for _ in 0..fibers {
            let rx = &rx;
            s.spawn(move || rx.recv().map_err(|_| ()));
        }
    });
    assert!(matches!(r, Err(vt::TaskError::Elapsed)), "the scope should have elapsed");
    Instant::now().saturating_duration_since(at).as_secs_f64() * 1e3
}

fn main() {
    let a = args::parse(
        "deadline",
        ABOUT,
        &[
            args::flag("--fibers", "N", "10000", "fibers to fan out"),
            args::flag("--deadline-ms", "D", "30", "the deadline, in ms from the start"),
            args::flag("--max-sleep-ms", "S", "50", "each fiber sleeps 1..=S ms before computing"),
            args::flag("--carriers", "C", "", "carriers (default: one per usable CPU)"),
            args::flag(
                "--parked",
                "",
                "",
                "measure how long after its deadline a scope of parked fibers returns",
            ),
            args::flag("--iters", "K", "10", "with --parked: timed ops"),
        ],
    );
    let fibers = a.positive("--fibers").unwrap() as u64;
    let deadline = Duration::from_millis(a.positive("--deadline-ms").unwrap() as u64);
    let max_sleep_ms = a.positive("--max-sleep-ms").unwrap() as u64;
    let mut builder = vt::Runtime::builder();
    if let Some(c) = a.get("--carriers") {
        builder = builder.carriers(c);
    }
    let rt = builder.build().unwrap_or_else(|e| {
        eprintln!("deadline: cannot build the runtime: {e}");
        std::process::exit(1)
    });
    if a.switch("--parked") {
        let iters = a.positive("--iters").unwrap();
        let mut ms: Vec<f64> = rt.block_on(|| {
            parked(fibers, deadline); // warm-up: stacks and records
            (0..iters).map(|_| parked(fibers, deadline)).collect()
        });
        ms.sort_by(f64::total_cmp);
        println!(
            "deadline --parked: a task scope of {fibers} fibers parked on a channel, {} carriers, {iters} ops",
            rt.carriers()
        );
        println!(
            "  returned {:.1} ms after its deadline  median (min {:.1}, max {:.1})",
            ms[iters / 2],
            ms[0],
            ms[iters - 1]
        );
        return;
    }
    rt.block_on(|| fan_out(fibers, deadline, max_sleep_ms));
}
