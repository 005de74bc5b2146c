//! Yield-many, workload W5 of `benches/README.md`: t fibers each yield y times; the
//! caller joins all. It measures the scheduler's round trip through the run queue (a yield is
//! one switch out, one queue push, one pop and one switch in): nanoseconds per yield (median,
//! min and max over the ops). Small and deterministic enough to count instructions under
//! `valgrind --tool=cachegrind` (with `VT_STACK_GUARD=mprotect`, which valgrind needs).
//!
//! Run: `cargo run --release --example yield_many`
//! Flags: `--fibers T` (default 1,000), `--yields Y` per fiber (default 1,000), `--iters K`
//! timed ops (default 20), `--carriers C` (default: the runtime's, one per usable CPU). Ctrl-C or
//! SIGTERM stops it with the ops timed so far.

use std::time::Instant;
use virtual_threads as vt;

#[path = "common/args.rs"]
mod args;
#[path = "common/bench.rs"]
mod bench;

const ABOUT: &str = "workload W5 (benches/README.md): t fibers each yield y times";

/// One op: `fibers` fibers, each yielding `yields` times.
fn yield_many(fibers: usize, yields: usize) {
    let handles: Vec<_> = (0..fibers)
        .map(|_| {
            vt::spawn(move || {
                for _ in 0..yields {
                    vt::yield_now();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

fn main() {
    let (fibers, yields, iters, carriers) = parse_args().unwrap_or_else(|e| fail(&e));
    let rt = bench::setup(carriers).unwrap_or_else(|e| fail(&e));
    let warm_up = (iters / 10).max(2);
    let carriers = rt.carriers();
    println!(
        "yield_many: {fibers} fibers x {yields} yields per op, {carriers} carriers, {iters} ops ({warm_up} warm-up)"
    );
    let mut secs = bench::run(&rt, warm_up, iters, || {
        let start = Instant::now();
        yield_many(fibers, yields);
        start.elapsed().as_secs_f64()
    });
    let done = secs.len();
    let Some((median, fastest, slowest)) = bench::spread(&mut secs) else {
        bench::nothing_timed("yield_many")
    };
    bench::say_if_stopped(done, iters);
    let per = |s: f64| s * 1e9 / (fibers * yields) as f64;
    let (median, fastest, slowest) = (per(median), per(fastest), per(slowest));
    println!("  per yield {median:>8.1} ns  median (min {fastest:.1}, max {slowest:.1})");
}

/// The flags; `--help` lists them.
fn parse_args() -> Result<(usize, usize, usize, Option<usize>), String> {
    let a = args::parse(
        "yield_many",
        ABOUT,
        &[
            args::flag("--fibers", "T", "1000", "fibers per op"),
            args::flag("--yields", "Y", "1000", "yields per fiber"),
            args::flag("--iters", "K", "20", "timed ops"),
            args::flag("--carriers", "C", "", "carriers (default: one per usable CPU)"),
        ],
    );
    Ok((
        a.positive("--fibers").unwrap(),
        a.positive("--yields").unwrap(),
        a.positive("--iters").unwrap(),
        a.get("--carriers"),
    ))
}

/// Reports an error on stderr and exits with status 1.
fn fail(message: &str) -> ! {
    eprintln!("yield_many: {message}");
    std::process::exit(1)
}
