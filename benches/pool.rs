//! `vt::join` and `vt::ThreadPool` against what a user would pick instead, in one process.
//!
//! What it guards:
//! - fork-join: a recursive parallel sum of 10M `u64` (sequential below `CUTOFF` elements) on
//!   `vt::join`, against the same code on `rayon::join` (the target: within 1.5× of
//!   rayon's time). A regression in join's spawn/park path shows here.
//! - blocking jobs: 10,000 jobs that each sleep 1 ms, on `ThreadPool::unbounded()` with
//!   `vt::sleep`, against 64 std threads taking the same jobs with `std::thread::sleep` (a
//!   persistent pool fed by one atomic counter: the cheapest a thread pool can be).
//!
//! Run: `cargo bench --bench pool` (under a minute); `cargo bench --bench pool -- fork` runs
//! criterion's groups whose name contains `fork`. Two parts: criterion's groups (its report and
//! change detection), then a table: each op of each side in turn (interleaved), `ROUNDS` rounds
//! after a warm-up, median time per op with min and max, and the ratio of the medians.
//! vt gets one carrier per core, rayon one thread per core.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::Criterion;
use virtual_threads as vt;

const ELEMENTS: u64 = 10_000_000;
const CUTOFF: usize = 8 * 1024;
const JOBS: usize = 10_000;
const NAP: Duration = Duration::from_millis(1);
const STD_THREADS: usize = 64;
const ROUNDS: usize = 11;

fn sum_vt(xs: &[u64]) -> u64 {
    if xs.len() <= CUTOFF {
        return xs.iter().sum();
    }
    let (a, b) = xs.split_at(xs.len() / 2);
    let (x, y) = vt::join(|| sum_vt(a), || sum_vt(b));
    x + y
}

fn sum_rayon(xs: &[u64]) -> u64 {
    if xs.len() <= CUTOFF {
        return xs.iter().sum();
    }
    let (a, b) = xs.split_at(xs.len() / 2);
    let (x, y) = rayon::join(|| sum_rayon(a), || sum_rayon(b));
    x + y
}

/// 64 std threads that, once per op, take job numbers from a shared counter until none is left.
struct StdPool {
    next: Arc<AtomicUsize>,
    start: Arc<Barrier>,
    done: Arc<Barrier>,
}

impl StdPool {
    fn new() -> StdPool {
        let pool = StdPool {
            next: Arc::new(AtomicUsize::new(JOBS)),
            start: Arc::new(Barrier::new(STD_THREADS + 1)),
            done: Arc::new(Barrier::new(STD_THREADS + 1)),
        };
        for _ in 0..STD_THREADS {
            let (next, start, done) = (pool.next.clone(), pool.start.clone(), pool.done.clone());
            std::thread::spawn(move || {
                loop {
                    start.wait();
                    while next.fetch_add(1, Ordering::Relaxed) < JOBS {
                        std::thread::sleep(NAP);
                    }
                    done.wait();
                }
            });
        }
        pool
    }

    fn op(&self) {
        self.next.store(0, Ordering::Relaxed);
        self.start.wait();
        self.done.wait();
    }
}

struct Sides {
    vt: vt::Runtime,
    rayon: rayon::ThreadPool,
    data: Vec<u64>,
    unbounded: vt::ThreadPool,
    std: StdPool,
}

impl Sides {
    fn fork_join_vt(&self) {
        let s = self.vt.block_on(|| sum_vt(&self.data));
        assert_eq!(s, ELEMENTS * (ELEMENTS - 1) / 2);
    }

    fn fork_join_rayon(&self) {
        let s = self.rayon.install(|| sum_rayon(&self.data));
        assert_eq!(s, ELEMENTS * (ELEMENTS - 1) / 2);
    }

    fn blocking_vt(&self) {
        self.vt.block_on(|| {
            for _ in 0..JOBS {
                self.unbounded.execute(|| vt::sleep(NAP));
            }
            self.unbounded.join();
        });
    }

    fn blocking_std(&self) {
        self.std.op();
    }
}

type Op = fn(&Sides);

/// Median, min and max seconds per op of each side, over interleaved rounds.
fn table(sides: &Sides, name: &str, ops: [(&str, Op); 2]) {
    let mut secs = [Vec::new(), Vec::new()];
    for round in 0..ROUNDS + 2 {
        for (i, (_, op)) in ops.iter().enumerate() {
            let start = Instant::now();
            op(sides);
            if round >= 2 {
                secs[i].push(start.elapsed().as_secs_f64());
            }
        }
    }
    println!("{name}: median of {ROUNDS} interleaved rounds (min, max)");
    let mut medians = [0.0; 2];
    for (i, (label, _)) in ops.iter().enumerate() {
        secs[i].sort_by(f64::total_cmp);
        medians[i] = secs[i][ROUNDS / 2];
        let ms = |s: f64| s * 1e3;
        println!(
            "  {label:<34} {:>9.2} ms  ({:.2}, {:.2})",
            ms(medians[i]),
            ms(secs[i][0]),
            ms(secs[i][ROUNDS - 1])
        );
    }
    println!("  ratio {} / {}: {:.2}", ops[0].0, ops[1].0, medians[0] / medians[1]);
}

fn main() {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let vt = vt::Runtime::builder().carriers(cores).build().expect("runtime");
    let unbounded = vt::ThreadPoolBuilder::new().handle(vt.handle()).build();
    let sides = Sides {
        rayon: rayon::ThreadPoolBuilder::new().num_threads(cores).build().expect("rayon pool"),
        data: (0..ELEMENTS).collect(),
        unbounded,
        std: StdPool::new(),
        vt,
    };
    let fork_join: [(&str, Op); 2] =
        [("vt::join", Sides::fork_join_vt), ("rayon::join", Sides::fork_join_rayon)];
    let blocking: [(&str, Op); 2] = [
        ("std pool, 64 threads (thread::sleep)", Sides::blocking_std),
        ("ThreadPool::unbounded (vt::sleep)", Sides::blocking_vt),
    ];

    // `cargo bench` passes `--bench`; `cargo test --benches` does not, and criterion then runs
    // each op once, which is the smoke test: no table.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    let bench = has("--bench") && !has("--test") && !has("--list");
    let filter = args.iter().find(|a| !a.starts_with('-')).cloned().unwrap_or_default();
    let groups = [("fork_join_sum_10M", fork_join), ("blocking_jobs_10k_x_1ms", blocking)];

    let mut c = Criterion::default().configure_from_args().sample_size(10);
    for (group, ops) in &groups {
        let mut g = c.benchmark_group(*group);
        g.measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_millis(500));
        for (label, op) in ops.iter() {
            g.bench_function(*label, |b| b.iter(|| op(&sides)));
        }
        g.finish();
    }
    c.final_summary();

    if !bench {
        return;
    }
    println!("\n{cores} cores; vt: {cores} carriers; rayon: {cores} threads");
    for (group, ops) in groups.into_iter().filter(|(g, _)| g.contains(filter.as_str())) {
        table(&sides, group, ops);
    }
}
