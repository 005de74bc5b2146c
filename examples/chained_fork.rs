//! Chained fork, workload W3 of `benches/README.md`: fiber i spawns fiber i + 1 and returns
//! without waiting; fiber n completes a one-shot signal, which the caller waits on. It measures
//! a spawn that the spawner does not join, one link at a time: nanoseconds per link (median,
//! min and max over the ops). Small and deterministic enough to count instructions under
//! `valgrind --tool=cachegrind` (with `VT_STACK_GUARD=mprotect`, which valgrind needs).
//!
//! Run: `cargo run --release --example chained_fork`
//! Flags: `--n N` links per op (default 10,000), `--iters K` timed ops (default 200),
//! `--carriers C` (default: the runtime's, one per usable CPU).
//! Ctrl-C or SIGTERM stops it after the op under way, with the ops timed so far.

use std::time::Instant;
use virtual_threads as vt;
use vt::channel::oneshot;

#[path = "common/args.rs"]
mod args;
#[path = "common/bench.rs"]
mod bench;

const ABOUT: &str = "workload W3 (benches/README.md): fiber i spawns fiber i + 1 and returns";

/// One link: spawn the next (or signal the end) and return without waiting.
fn link(i: usize, n: usize, done: oneshot::Sender<usize>) {
    if i == n {
        done.send(i).unwrap();
    } else {
        drop(vt::spawn(move || link(i + 1, n, done)));
    }
}

/// One op: a chain of `n` fibers; returns the last link's index.
fn chained_fork(n: usize) -> usize {
    let (done, signal) = oneshot::channel();
    drop(vt::spawn(move || link(1, n, done)));
    signal.recv().unwrap()
}

fn main() {
    let (n, iters, carriers) = parse_args().unwrap_or_else(|e| bench::fail("chained_fork", &e));
    let rt = bench::runtime("chained_fork", carriers);
    let run = bench::run(&rt, iters, 2, || {
        let start = Instant::now();
        let last = chained_fork(n);
        let secs = start.elapsed().as_secs_f64();
        if last != n {
            bench::fail("chained_fork", &format!("the chain ended at link {last}, expected {n}"));
        }
        secs * 1e9 / n as f64
    });
    let carriers = rt.carriers();
    println!("chained_fork: {n} links per op, {carriers} carriers, {iters} ops ({} warm-up)", run.warm_up);
    run.say_if_stopped("chained_fork");
    let per = bench::spread(run.ops);
    println!("  per link {:>8.1} ns  median (min {:.1}, max {:.1})", per.median, per.min, per.max);
}

/// The flags; `--help` lists them.
fn parse_args() -> Result<(usize, usize, Option<usize>), String> {
    let a = args::parse(
        "chained_fork",
        ABOUT,
        &[
            args::flag("--n", "N", "10000", "links per op"),
            args::flag("--iters", "K", "200", "timed ops"),
            args::flag("--carriers", "C", "", "carriers (default: one per usable CPU)"),
        ],
    );
    Ok((a.positive("--n").unwrap(), a.positive("--iters").unwrap(), a.get("--carriers")))
}
