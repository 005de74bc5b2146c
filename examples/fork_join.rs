//! Fork-join, workload W1 of `benches/README.md`: one op spawns n fibers that each
//! return their index, joins them in spawn order, sums the results and checks the sum. It measures
//! what a fiber costs from spawn to join: ops per second (median, min and max over the timed ops)
//! and nanoseconds per fiber (the median op divided by n). The same op on OS threads
//! (`std::thread::spawn` and `join`) runs alternated with the fibers' ops, a few times, and the
//! last line is the ratio: what a virtual thread saves over a thread on this machine.
//!
//! Run: `cargo run --release --example fork_join -- --n 100000`
//! Flags: `--n N` fibers per op (default 10,000), `--iters K` timed ops (default 200),
//! `--carriers C` (default: the runtime's, one per usable CPU), `--no-threads` (fibers only: for
//! instruction counts under cachegrind). Ctrl-C or SIGTERM stops it with the ops timed so far.

use std::time::Instant;
use virtual_threads as vt;

#[path = "common/args.rs"]
mod args;
#[path = "common/bench.rs"]
mod bench;

const ABOUT: &str = "workload W1 (benches/README.md): spawn n fibers, join them in spawn order, sum; \
                     the same on OS threads for comparison";

/// Timed ops on OS threads: each spawns n threads, so a few suffice (~1 ms per 10 threads).
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
    let rt = bench::setup(carriers).unwrap_or_else(|e| fail(&e));
    let expected = n * (n - 1) / 2;
    let check = |sum: u64| {
        if sum != expected {
            fail(&format!("wrong sum {sum}, expected {expected}"));
        }
    };
    let op = || {
        let start = Instant::now();
        let sum = fork_join(n);
        let secs = start.elapsed().as_secs_f64();
        check(sum);
        secs
    };
    let thread_op = || {
        let start = Instant::now();
        let sum = fork_join_threads(n).unwrap_or_else(|e| fail(&e));
        let secs = start.elapsed().as_secs_f64();
        check(sum);
        secs
    };
    let warm_up = (iters / 10).max(3);
    let thread_ops = if threads { THREAD_OPS.min(iters) } else { 0 };
    let carriers = rt.carriers();
    let alongside =
        if threads { format!(", alternated with {thread_ops} ops on OS threads") } else { String::new() };
    println!("fork_join: {n} fibers per op, {carriers} carriers, {iters} ops ({warm_up} warm-up){alongside}");

    bench::time(&rt, warm_up, op);
    if threads && !bench::stopped() {
        thread_op(); // warm-up: the first thousands of threads grow the process's maps
    }
    // The fibers' ops in `thread_ops + 1` stretches, an op on threads between two: each side
    // runs in the same minutes as the other, as this host's speed moves from minute to minute.
    let stretches = thread_ops + 1;
    let (mut vt_secs, mut thread_secs) = (Vec::with_capacity(iters), Vec::new());
    for s in 0..stretches {
        let count = iters * (s + 1) / stretches - iters * s / stretches;
        vt_secs.extend(bench::time(&rt, count, op));
        if s < thread_ops && !bench::stopped() {
            thread_secs.push(thread_op());
        }
    }
    let done = vt_secs.len();
    let Some((median, fastest, slowest)) = bench::spread(&mut vt_secs) else {
        bench::nothing_timed("fork_join")
    };
    bench::say_if_stopped(done, iters);
    let (ops, min, max) = (1.0 / median, 1.0 / slowest, 1.0 / fastest);
    println!("  fibers      {ops:>9.0} ops/s  median of {done} (min {min:.0}, max {max:.0})");
    println!("  per fiber   {:>9.1} ns     spawn, run, join (median)", median * 1e9 / n as f64);
    if let Some((t_median, t_fastest, t_slowest)) = bench::spread(&mut thread_secs) {
        let (ops, min, max) = (1.0 / t_median, 1.0 / t_slowest, 1.0 / t_fastest);
        println!(
            "  OS threads  {ops:>9.1} ops/s  median of {} (min {min:.1}, max {max:.1})",
            thread_secs.len()
        );
        println!("  per thread  {:>9.1} µs     spawn, run, join (median)", t_median * 1e6 / n as f64);
        println!("  fibers / OS threads: {:.0}x the throughput", t_median / median);
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

/// Reports an error on stderr and exits with status 1.
fn fail(message: &str) -> ! {
    eprintln!("fork_join: {message}");
    std::process::exit(1)
}
