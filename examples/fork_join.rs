//! Fork-join, workload W1 of `benches/README.md`: one op spawns n fibers that each
//! return their index, joins them in spawn order, sums the results and checks the sum. It measures
//! what a fiber costs from spawn to join: ops per second (median, min and max over the timed ops)
//! and nanoseconds per fiber (the median op divided by n).
//!
//! Run: `cargo run --release --example fork_join -- --n 100000`
//! Flags: `--n N` fibers per op (default 10,000), `--iters K` timed ops (default 200),
//! `--carriers C` (default: the runtime's, one per usable CPU).

use std::time::Instant;
use virtual_threads as vt;

#[path = "common/args.rs"]
mod args;
#[path = "common/bench.rs"]
mod bench;

const ABOUT: &str = "workload W1 (benches/README.md): spawn n fibers, join them in spawn order, sum";

/// One op: spawn n fibers, join them in spawn order, return the sum of their results.
fn fork_join(n: u64) -> u64 {
    let fibers: Vec<_> = (0..n).map(|i| vt::spawn(move || i)).collect();
    fibers.into_iter().map(|f| f.join().unwrap()).sum()
}

fn main() {
    let (n, iters, carriers) = parse_args().unwrap_or_else(|e| bench::fail("fork_join", &e));
    let rt = bench::runtime("fork_join", carriers);
    let expected = n * (n - 1) / 2;
    let run = bench::run(&rt, iters, 3, || {
        let start = Instant::now();
        let sum = fork_join(n);
        let secs = start.elapsed().as_secs_f64();
        if sum != expected {
            bench::fail("fork_join", &format!("wrong sum {sum}, expected {expected}"));
        }
        secs
    });
    let secs = bench::spread(run.ops);
    let carriers = rt.carriers();
    println!("fork_join: {n} fibers per op, {carriers} carriers, {iters} ops ({} warm-up)", run.warm_up);
    let (ops, min, max) = (1.0 / secs.median, 1.0 / secs.max, 1.0 / secs.min);
    println!("  throughput {ops:>10.0} ops/s  median (min {min:.0}, max {max:.0})");
    let per_fiber = secs.median * 1e9 / n as f64;
    println!("  per fiber  {per_fiber:>10.1} ns     median (spawn, run, join)");
}

/// The flags; `--help` lists them.
fn parse_args() -> Result<(u64, usize, Option<usize>), String> {
    let a = args::parse(
        "fork_join",
        ABOUT,
        &[
            args::flag("--n", "N", "10000", "fibers per op"),
            args::flag("--iters", "K", "200", "timed ops"),
            args::flag("--carriers", "C", "", "carriers (default: one per usable CPU)"),
        ],
    );
    Ok((a.positive("--n").unwrap() as u64, a.positive("--iters").unwrap(), a.get("--carriers")))
}
