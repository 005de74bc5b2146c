//! Yield-many, workload W5 of `benches/README.md`: t fibers each yield y times; the
//! caller joins all. It measures the scheduler's round trip through the run queue (a yield is
//! one switch out, one queue push, one pop and one switch in): nanoseconds per yield (median,
//! min and max over the ops). Small and deterministic enough to count instructions under
//! `valgrind --tool=cachegrind` (with `VT_STACK_GUARD=mprotect`, which valgrind needs).
//!
//! Run: `cargo run --release --example yield_many`
//! Flags: `--fibers T` (default 1,000), `--yields Y` per fiber (default 1,000), `--iters K`
//! timed ops (default 20), `--carriers C` (default: the runtime's, one per usable CPU).
//! Ctrl-C or SIGTERM stops it after the op under way, with the ops timed so far.

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
    let (fibers, yields, iters, carriers) = parse_args().unwrap_or_else(|e| bench::fail("yield_many", &e));
    let rt = bench::runtime("yield_many", carriers);
    let run = bench::run(&rt, iters, 2, || {
        let start = Instant::now();
        yield_many(fibers, yields);
        start.elapsed().as_secs_f64() * 1e9 / (fibers * yields) as f64
    });
    let carriers = rt.carriers();
    println!(
        "yield_many: {fibers} fibers x {yields} yields per op, {carriers} carriers, {iters} ops ({} warm-up)",
        run.warm_up
    );
    run.say_if_stopped("yield_many");
    let per = bench::spread(run.ops);
    println!("  per yield {:>8.1} ns  median (min {:.1}, max {:.1})", per.median, per.min, per.max);
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
