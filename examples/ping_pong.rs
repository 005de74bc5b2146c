//! Ping-pong, workload W4 of `benches/README.md`: fiber A sends a u64 to fiber B over a
//! channel of capacity 1, B sends it back over a second one; r round trips per op, and the
//! caller joins both. It measures the park/unpark path (each round trip is two parks, two
//! unparks and two resumptions): nanoseconds per round trip (median, min and max over the ops).
//! Small and deterministic enough to count instructions under
//! `valgrind --tool=cachegrind` (with `VT_STACK_GUARD=mprotect`, which valgrind needs).
//!
//! Run: `cargo run --release --example ping_pong`
//! Flags: `--rounds R` round trips per op (default 10,000), `--iters K` timed ops (default 50),
//! `--carriers C` (default: the runtime's, one per usable CPU).
//! Ctrl-C or SIGTERM stops it after the op under way, with the ops timed so far.

use std::time::Instant;
use virtual_threads as vt;

#[path = "common/args.rs"]
mod args;
#[path = "common/bench.rs"]
mod bench;

const ABOUT: &str = "workload W4 (benches/README.md): two fibers bounce a u64 over channels of capacity 1";

/// One op: `rounds` round trips between two fibers.
fn ping_pong(rounds: u64) {
    let (to_b, from_a) = vt::channel::bounded::<u64>(1);
    let (to_a, from_b) = vt::channel::bounded::<u64>(1);
    let a = vt::spawn(move || {
        for i in 0..rounds {
            to_b.send(i).unwrap();
            assert_eq!(from_b.recv().unwrap(), i, "the ball came back changed");
        }
    });
    let b = vt::spawn(move || {
        for _ in 0..rounds {
            let ball = from_a.recv().unwrap();
            to_a.send(ball).unwrap();
        }
    });
    a.join().unwrap();
    b.join().unwrap();
}

fn main() {
    let (rounds, iters, carriers) = parse_args().unwrap_or_else(|e| bench::fail("ping_pong", &e));
    let rt = bench::runtime("ping_pong", carriers);
    let run = bench::run(&rt, iters, 3, || {
        let start = Instant::now();
        ping_pong(rounds);
        start.elapsed().as_secs_f64() * 1e9 / rounds as f64
    });
    let carriers = rt.carriers();
    println!(
        "ping_pong: {rounds} round trips per op, {carriers} carriers, {iters} ops ({} warm-up)",
        run.warm_up
    );
    run.say_if_stopped("ping_pong");
    let per = bench::spread(run.ops);
    println!("  per round trip {:>8.1} ns  median (min {:.1}, max {:.1})", per.median, per.min, per.max);
}

/// The flags; `--help` lists them.
fn parse_args() -> Result<(u64, usize, Option<usize>), String> {
    let a = args::parse(
        "ping_pong",
        ABOUT,
        &[
            args::flag("--rounds", "R", "10000", "round trips per op"),
            args::flag("--iters", "K", "50", "timed ops"),
            args::flag("--carriers", "C", "", "carriers (default: one per usable CPU)"),
        ],
    );
    Ok((a.positive("--rounds").unwrap() as u64, a.positive("--iters").unwrap(), a.get("--carriers")))
}
