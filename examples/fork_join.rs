//! Fork-join, workload W1 of `benches/README.md`: one op spawns n fibers that each
//! return their index, joins them in spawn order, sums the results and checks the sum. It measures
//! what a fiber costs from spawn to join: ops per second (median, min and max over the timed ops)
//! and nanoseconds per fiber (the median op divided by n). The same op on OS threads
//! (`std::thread::spawn` and `join`) runs a few times between the fibers' ops, and the last line
//! is the ratio: what a virtual thread saves over a thread on this machine.
//!
//! Run: `cargo run --release --example fork_join -- --n 100000`
//! Flags: `--n N` fibers per op (default 10,000), `--iters K` timed ops (default 200),
//! `--carriers C` (default: the runtime's, one per usable CPU), `--no-threads` (fibers only, as
//! for instruction counts under cachegrind).
//! Ctrl-C or SIGTERM stops it after the op under way, with the ops timed so far.

use std::time::Instant;
use virtual_threads as vt;

#[path = "common/args.rs"]
mod args;
#[path = "common/bench.rs"]
mod bench;

const ABOUT: &str = "workload W1 (benches/README.md): spawn n fibers, join them in spawn order, sum; \
                     the same on OS threads for comparison";

/// Timed ops on OS threads: a thread costs a few hundred fibers, so a few ops suffice.
const THREAD_OPS: usize = 3;

/// One op: spawn n fibers, join them in spawn order, return the sum of their results.
fn fork_join(n: u64) -> u64 {
    let fibers: Vec<_> = (0..n).map(|i| vt::spawn(move || i)).collect();
    fibers.into_iter().map(|f| f.join().unwrap()).sum()
}

/// The same op on OS threads; an error names the thread that could not start.
fn fork_join_threads(n: u64) -> Result<u64, String> {
    let mut threads = Vec::with_capacity(n as usize);
    for i in 0..n {
        let t = std::thread::Builder::new().spawn(move || i).map_err(|e| {
            format!("OS thread {i} of {n} did not start: {e} (rerun with a smaller --n, or --no-threads)")
        })?;
        threads.push(t);
    }
    Ok(threads.into_iter().map(|t| t.join().unwrap()).sum())
}

fn main() {
    let (n, iters, carriers, threads) = parse_args();
    let rt = bench::runtime("fork_join", carriers);
    let expected = n * (n - 1) / 2;
    let timed = |sum: &dyn Fn() -> u64| {
        let start = Instant::now();
        let got = sum();
        let secs = start.elapsed().as_secs_f64();
        if got != expected {
            bench::fail("fork_join", &format!("wrong sum {got}, expected {expected}"));
        }
        secs
    };
    let fibers_op = || timed(&|| fork_join(n));
    let threads_op = || timed(&|| fork_join_threads(n).unwrap_or_else(|e| bench::fail("fork_join", &e)));

    let warm_up = (iters / 10).max(3);
    let thread_ops = if threads { THREAD_OPS.min(iters) } else { 0 };
    let carriers = rt.carriers();
    let beside = if threads { format!(", {thread_ops} on OS threads between them") } else { String::new() };
    // Printed before the run, once Ctrl-C is taken over: a caller can wait for this line.
    println!("fork_join: {n} fibers per op, {carriers} carriers, {iters} ops ({warm_up} warm-up){beside}");

    bench::timed(&rt, warm_up, fibers_op);
    if threads && !bench::stopped() {
        threads_op(); // untimed: the first thousands of threads grow the process's maps
    }
    // The fibers' ops in `thread_ops + 1` stretches with a threads' op between two, from this
    // thread (not a carrier, whose CPU a thread it starts would inherit): each side is timed
    // in the same minutes as the other, as this host's speed moves from minute to minute.
    let stretches = thread_ops + 1;
    let (mut fiber_secs, mut thread_secs) = (Vec::with_capacity(iters), Vec::new());
    for s in 0..stretches {
        fiber_secs.extend(bench::timed(&rt, iters * (s + 1) / stretches - iters * s / stretches, fibers_op));
        if s < thread_ops && !bench::stopped() {
            thread_secs.push(threads_op());
        }
    }
    let run = bench::Run { ops: fiber_secs, iters, warm_up };
    run.say_if_stopped("fork_join");
    let done = run.ops.len();
    let secs = bench::spread(run.ops);
    let (ops, min, max) = (1.0 / secs.median, 1.0 / secs.max, 1.0 / secs.min);
    println!("  fibers      {ops:>9.0} ops/s  median of {done} (min {min:.0}, max {max:.0})");
    println!("  per fiber   {:>9.1} ns     spawn, run, join (median)", secs.median * 1e9 / n as f64);
    if !thread_secs.is_empty() {
        let count = thread_secs.len();
        let t = bench::spread(thread_secs);
        let (ops, min, max) = (1.0 / t.median, 1.0 / t.max, 1.0 / t.min);
        println!("  OS threads  {ops:>9.1} ops/s  median of {count} (min {min:.1}, max {max:.1})");
        println!("  per thread  {:>9.1} µs     spawn, run, join (median)", t.median * 1e6 / n as f64);
        println!("  fibers / OS threads: {:.0}x the throughput", t.median / secs.median);
    }
}

/// The flags; `--help` lists them.
fn parse_args() -> (u64, usize, Option<usize>, bool) {
    let a = args::parse(
        "fork_join",
        ABOUT,
        &[
            args::flag("--n", "N", "10000", "fibers per op"),
            args::flag("--iters", "K", "200", "timed ops"),
            args::flag("--carriers", "C", "", "carriers (default: one per usable CPU)"),
            args::flag("--no-threads", "", "", "leave out the same work on OS threads"),
        ],
    );
    (
        a.positive("--n").unwrap() as u64,
        a.positive("--iters").unwrap(),
        a.get("--carriers"),
        !a.switch("--no-threads"),
    )
}
