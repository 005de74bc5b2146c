//! The timing harness the workload examples share (W1 `fork_join`, W3 `chained_fork`, W4
//! `ping_pong`, W5 `yield_many`, W7 `sleep_many`): the runtime from `--carriers`, untimed
//! warm-up ops, the timed ops (all inside one fiber), and the median with the extremes. Each
//! example includes it with `#[path = "common/bench.rs"] mod bench;`, beside `args.rs`.

#![allow(dead_code)] // each example uses part of it

use virtual_threads as vt;

/// The runtime an example measures: `carriers` carriers, or the runtime's default (one per
/// usable CPU). Exits with status 1, naming `program`, if it cannot be built.
pub fn runtime(program: &str, carriers: Option<usize>) -> vt::Runtime {
    let mut builder = vt::Runtime::builder();
    if let Some(c) = carriers {
        builder = builder.carriers(c);
    }
    builder.build().unwrap_or_else(|e| fail(program, &format!("cannot build the runtime: {e}")))
}

/// What one run measured: a value per timed op, in op order, and how many untimed ops warmed up
/// the stacks, records and caches before them.
pub struct Run<T> {
    pub ops: Vec<T>,
    pub warm_up: usize,
}

/// Runs `op` `(iters / 10).max(min_warm_up)` times untimed, then `iters` times, keeping what
/// each of those returns; all inside one fiber of `rt`, so the ops spawn from a carrier as a
/// program's fibers do. The caller's thread blocks meanwhile.
pub fn run<T: Send>(rt: &vt::Runtime, iters: usize, min_warm_up: usize, op: impl Fn() -> T + Sync) -> Run<T> {
    let warm_up = (iters / 10).max(min_warm_up);
    let ops = rt.block_on(|| {
        for _ in 0..warm_up {
            op();
        }
        (0..iters).map(|_| op()).collect()
    });
    Run { ops, warm_up }
}

/// The median and the extremes of a sample.
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// The spread of `values` (in any order; not empty). The median of an even count is the upper
/// of the middle two.
pub fn spread(mut values: Vec<f64>) -> Spread {
    values.sort_by(f64::total_cmp);
    Spread { median: values[values.len() / 2], min: values[0], max: values[values.len() - 1] }
}

/// Reports an error on stderr and exits with status 1.
pub fn fail(program: &str, message: &str) -> ! {
    eprintln!("{program}: {message}");
    std::process::exit(1)
}
