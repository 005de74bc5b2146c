//! The workload suite W1–W7 of `benches/README.md`: this runtime against the runtimes a
//! user would pick instead, measured side by side in one process.
//!
//! What it guards: the scheduler's hot paths — spawn and join (W1), spawn and a one-shot signal
//! (W2), spawn from a fiber (W3), park/unpark through channels (W4), yield (W5) — and the cost of
//! a parked fiber (W6) and of timers (W7). A regression shows as a falling ratio in the table.
//!
//! Run: `cargo bench --bench workloads` (about 2 minutes on 2 cores, much of it std threads);
//! `cargo bench --bench workloads -- W4` runs the workloads whose name contains `W4`;
//! `cargo test --benches` runs each op once as a smoke test. `WORKLOADS_RUNTIMES=tokio,rayon`
//! keeps only those peers (vt always runs), `WORKLOADS_ROUNDS=41` times 41 rounds instead of 11,
//! `WORKLOADS_PARTS=table,w7` only those parts
//! (`criterion`, `table`, `w6`, `w7`); `.ci/scaling` uses both for its short runs at several
//! widths. The run has three parts:
//! 1. criterion groups `W1_fork_join` … `W5_yield_many`, one function per runtime: criterion's
//!    report and its change detection against the previous run. Its samples run back to back;
//!    std's ops are too slow for 10 samples in 2 s, so criterion warns and takes one op each.
//! 2. the table of medians: one op of every runtime in turn (interleaved), 11 rounds after a
//!    warm-up, median ops/s with min and max, and how many times faster this runtime is. Each op
//!    starts on a quiet machine: after the previous op, the threads it left (std's detached
//!    threads, still exiting) are waited out, then 5 ms for idle workers to stop spinning.
//! 3. W6 (bytes per parked task, each runtime in fresh child processes, so that neither reuses
//!    the other's freed memory) and W7 (wall time of 10,000 10 ms sleeps against the ideal).
//!
//! Every runtime gets one worker per core and the same sizes. `migrate` is vt itself built with
//! the `unsafe` opt-in `migrate_started_fibers(true)`: the row the sound default (started
//! fibers stay on their home carrier) is held to (`arch/decisions/0003-home-carriers.md`: within 5%, W5 at least as fast).
//! `unpinned` is vt with `pin_carriers(false)`: what pinning (the default pins each carrier until
//! its CPU is shared) buys on this machine. `VT_PIN_CARRIERS` in the environment would force one
//! policy on every vt row: leave it unset here.
//! Where a peer's shape needed a
//! choice, it is the one that measured fastest for that peer:
//! - vt: one `Runtime` with `carriers = cores`; the op's caller is the fiber `block_on` runs.
//! - tokio: multi-thread runtime, `worker_threads = cores`; the caller is the `block_on` future
//!   (as fast as, or faster than, a caller that is itself a spawned task).
//! - may: `workers = cores`; the caller is the main thread (a caller coroutine measured 3× slower).
//!   `may` has no bounded channel: W4 uses its `mpsc` channel, which never holds more than one
//!   message in a ping-pong anyway. It has no W6/W7 row (only vt and tokio are asked for there;
//!   `may` also cannot hold 100,000 coroutines: one mmap + guard per stack exhausts
//!   `vm.max_map_count` near 32,000).
//! - rayon: a pool of `cores` threads, used where the workload fits. W1 is `par_iter` with one
//!   index per job: rayon's own fork-join unit, results in index order; it is a join tree (no
//!   handles, no allocation per task), so it is a floor for fork-join, not a spawn. W2 and W3 use
//!   `rayon::spawn` (fire and forget) from inside the pool (as fast as spawning from outside) and
//!   a std channel as the signal. W4/W5 need a task that blocks or yields, which rayon lacks.
//! - std: OS threads, W1–W3 at the same n = 10,000; `std::sync::mpsc` as the signal.
//! - bare (W1 and W5): not a runtime but the floor, corosensei with no scheduler: for W5 a
//!   round-robin loop of coroutines on one thread per core (`w5::bare`), for W1 spawn-run-drop
//!   on pooled stacks (`w1::bare`). `bare1` is the same on one thread and `vt1` vt on one
//!   carrier: the targets are stated as vt1 / bare1 and as vt's speed-up over vt1
//!   (`floor_table`). Floors run after the peers' interleaved rounds (see `FLOORS`).
//!
//! Every table starts and ends with the host's cross-core latency mode (`host_mode`: a
//! round-trip probe between CPUs 0 and 1): this VM moves between a fast and a slow mode, and
//! figures from the two are never compared. `WORKLOADS_PARTS=floor` is the short run for the
//! floor (W1 and W5: vt, vt1, tokio, bare, bare1; about 20 s). `WORKLOADS_PARTS=skew`: the
//! price of home carriers when the heavy half of 1,000 long-lived tasks started on one carrier
//! (`skew.rs`). `WORKLOADS_PARTS=skew_tcp`: the same question for a TCP server's connections
//! accepted while one carrier is busy, with one acceptor or one per carrier (`skew_tcp.rs`).

use std::io::Write;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode};
use virtual_threads as vt;
use vt::{channel, sync};

/// W1–W3: tasks per op.
const N: usize = 10_000;
/// W4: round trips per op.
const ROUND_TRIPS: u64 = 10_000;
/// W5: tasks per op, and yields per task.
const YIELDERS: usize = 1_000;
const YIELDS: usize = 1_000;
/// W6: parked tasks.
const PARKED: usize = 100_000;
/// W7: sleeping tasks, and how long each sleeps.
const SLEEPERS: usize = 10_000;
const NAP: Duration = Duration::from_millis(10);

/// Rows of the table that are floors rather than peers (the `bare` loops): measured after the
/// interleaved rounds of the peers, on their own (warm-up, then the same rounds back to back).
/// In the rounds, a third entry of any kind, even one that does nothing, moved vt's and tokio's
/// W5 medians by a third on this VM (vt 35 → 20–24 ops/s, tokio 21 → 19–26), after W1 had run;
/// the peers' rotation stays as it was.
const FLOORS: &[&str] = &["bare", "bare1"];

/// Timed rounds of the table (WORKLOADS.md asks for at least 10; std's slow ops keep it near
/// that), each runtime's warm-up before them, the pause after each op (see `settle`), and W6's
/// child processes per runtime.
const ROUNDS: usize = 11;

/// Rounds of the table and of W7: `ROUNDS`, or `WORKLOADS_ROUNDS` from the environment (more
/// rounds narrow the medians; on this 2-vCPU machine an op's speed can double from one minute to
/// the next, and 11 rounds do not resolve 5%).
fn rounds() -> usize {
    std::env::var("WORKLOADS_ROUNDS").ok().and_then(|r| r.parse().ok()).filter(|&r| r > 0).unwrap_or(ROUNDS)
}
const WARM_UP: Duration = Duration::from_millis(200);
const SETTLE: Duration = Duration::from_millis(5);
const W6_RUNS: usize = 5;

/// The runtimes, each built once with one worker per core (`may`'s is global).
struct Peers {
    vt: vt::Runtime,
    /// vt with started fibers migrating between carriers (the `unsafe` opt-in): the column the
    /// home-carrier default is measured against (`arch/decisions/0003-home-carriers.md`).
    vt_migrate: vt::Runtime,
    /// vt with carriers never pinned (`pin_carriers(false)`): the `unpinned` row, against the
    /// default (pinned until a carrier's CPU is shared).
    vt_unpinned: vt::Runtime,
    tokio: tokio::runtime::Runtime,
    rayon: rayon::ThreadPool,
    /// vt with one carrier: the `vt1` row, beside `bare1`, and the base of the 2-carrier
    /// speed-up (`floor_table`).
    vt1: vt::Runtime,
    /// The `bare` floors' coroutine stacks, carved once (see `w5::bare`), as vt's come from its
    /// pool: per thread, its share of W5's t coroutines, for `cores` threads and for one.
    bare_stacks: Vec<Mutex<Vec<corosensei::stack::DefaultStack>>>,
    bare1_stacks: Vec<Mutex<Vec<corosensei::stack::DefaultStack>>>,
}

type Op = fn(&Peers);

/// One row of the suite: a workload and the op of every runtime it fits.
struct Workload {
    id: &'static str,
    size: &'static str,
    ops: &'static [(&'static str, Op)],
}

/// `ops!(w1: vt, tokio)` is `&[("vt", w1::vt), ("tokio", w1::tokio)]`.
macro_rules! ops {
    ($workload:ident: $($runtime:ident),+) => {
        &[$((stringify!($runtime), $workload::$runtime as Op)),+]
    };
}

#[rustfmt::skip]
const SUITE: &[Workload] = &[
    Workload { id: "W1_fork_join", size: "n = 10,000", ops: ops!(w1: vt, vt1, migrate, unpinned, tokio, may, rayon, std, bare, bare1) },
    Workload { id: "W2_fork_many", size: "n = 10,000", ops: ops!(w2: vt, migrate, unpinned, tokio, may, rayon, std) },
    Workload { id: "W3_chained_fork", size: "n = 10,000", ops: ops!(w3: vt, migrate, unpinned, tokio, may, rayon, std) },
    Workload { id: "W4_ping_pong", size: "r = 10,000", ops: ops!(w4: vt, migrate, unpinned, tokio, may) },
    Workload { id: "W5_yield_many", size: "t = y = 1,000", ops: ops!(w5: vt, vt1, migrate, unpinned, tokio, may, bare, bare1) },
];

impl Workload {
    fn runtimes(&self) -> Vec<&'static str> {
        self.ops.iter().map(|&(runtime, _)| runtime).collect()
    }
}

fn main() {
    if let Ok(which) = std::env::var(W6_CHILD) {
        w6::child(&which);
        return;
    }
    let args = Args::parse();
    let mut criterion = Criterion::default().configure_from_args();
    let peers = Peers::new();
    if args.part("criterion") || !args.bench {
        for w in SUITE.iter().filter(|w| args.wants(w.id, &w.runtimes())) {
            criterion_group(&mut criterion, &peers, &args.ops(w), w.id);
        }
        criterion.final_summary();
    }
    if !args.bench {
        return; // `cargo test --benches`: criterion ran each op once; that is the smoke test
    }
    if args.part("table") {
        print_table(&peers, &args, SUITE.iter().filter(|w| args.wants(w.id, &w.runtimes())));
    }
    if args.part("floor") {
        // W1 and W5 only, with the floor's rows unless `WORKLOADS_RUNTIMES` says otherwise.
        let args = Args { runtimes: args.runtimes.clone().or(Some(floor_runtimes())), ..args.clone() };
        let suite =
            SUITE.iter().filter(|w| FLOOR_WORKLOADS.contains(&w.id) && args.wants(w.id, &w.runtimes()));
        print_table(&peers, &args, suite);
        if args.wants("W1_fork_join", &["vt"]) {
            w1::spread(&peers);
        }
    }
    if args.part("skew") && args.wants("skew", &["vt", "tokio"]) {
        skew::report(&peers);
    }
    if args.part("skew_tcp") && args.wants("skew_tcp", &["vt", "tokio"]) {
        skew_tcp::report();
    }
    if args.part("w6") && args.wants("W6_parked_memory", &["vt", "tokio"]) {
        w6::report();
    }
    if args.part("w7") && args.wants("W7_sleep_many", &["vt", "tokio"]) {
        println!("\nW7: {}", host_mode());
        w7::report(&peers);
    }
    peers.report_floats();
}

impl Peers {
    /// Says which vt carriers floated off a shared CPU during the run (the default policy,
    /// `runtime::Builder::pin_carriers`): a row whose carriers floated ran partly unpinned, which
    /// moves fork-join figures by a third on this machine (`arch/performance.md`, "CPU affinity").
    fn report_floats(&self) {
        for (name, rt) in [("vt", &self.vt), ("migrate", &self.vt_migrate)] {
            let floats: Vec<u64> = rt.metrics().per_carrier.iter().map(|c| c.floats).collect();
            if floats.iter().any(|&f| f > 0) {
                println!(
                    "note: {name}'s carriers floated off a shared CPU during the run ({floats:?} times per carrier)"
                );
            }
        }
    }

    fn new() -> Peers {
        let cores = cores();
        may::config().set_workers(cores);
        Peers {
            vt: vt::Runtime::builder().carriers(cores).build().expect("vt runtime"),
            // SAFETY: the workloads' fibers hold no `!Send` value and no thread-local reference
            // across a switch point.
            vt_migrate: unsafe { vt::Runtime::builder().carriers(cores).migrate_started_fibers(true) }
                .build()
                .expect("vt runtime"),
            vt_unpinned: vt::Runtime::builder()
                .carriers(cores)
                .pin_carriers(false)
                .build()
                .expect("vt runtime"),
            tokio: tokio_runtime(cores),
            rayon: rayon::ThreadPoolBuilder::new().num_threads(cores).build().expect("rayon pool"),
            vt1: vt::Runtime::builder().carriers(1).build().expect("vt runtime"),
            bare_stacks: bare_stacks(cores),
            bare1_stacks: bare_stacks(1),
        }
    }
}

/// W5's t coroutine stacks, split over `threads` threads.
fn bare_stacks(threads: usize) -> Vec<Mutex<Vec<corosensei::stack::DefaultStack>>> {
    (0..threads)
        .map(|i| {
            let n = YIELDERS / threads + usize::from(i < YIELDERS % threads);
            let stack = || corosensei::stack::DefaultStack::new(64 * 1024).expect("a bare stack");
            Mutex::new((0..n).map(|_| stack()).collect())
        })
        .collect()
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn tokio_runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_time()
        .build()
        .expect("tokio runtime")
}

// ---------------------------------------------------------------------------------------------
// The ops. Each runs one whole workload and panics if its result is wrong.

mod w1 {
    //! W1 fork_join: spawn n tasks, each returns its index; join all in spawn order and sum.
    use super::*;

    pub fn vt(p: &Peers) {
        on(&p.vt);
    }

    /// The same op on the runtime built with the `unsafe` opt-in `migrate_started_fibers`.
    pub fn migrate(p: &Peers) {
        on(&p.vt_migrate);
    }

    /// The same op with carriers never pinned.
    pub fn unpinned(p: &Peers) {
        on(&p.vt_unpinned);
    }

    /// The same op on one carrier.
    pub fn vt1(p: &Peers) {
        on(&p.vt1);
    }

    /// Where one more op's fibers started and how they got there, on all carriers: the
    /// spawner's carrier runs what the others do not take, so this says how parallel the op
    /// was (the floor's speed-up of all carriers over one).
    pub fn spread(p: &Peers) {
        let before = p.vt.metrics().per_carrier;
        vt(p);
        let after = p.vt.metrics().per_carrier;
        let delta = |f: fn(&vt::CarrierMetrics) -> u64| -> Vec<u64> {
            after.iter().zip(&before).map(|(a, b)| f(a) - f(b)).collect()
        };
        println!(
            "W1 on {} carriers, one more op: fibers started per carrier {:?}, stolen {:?}, from the injector {:?}",
            cores(),
            delta(|c| c.fibers_started),
            delta(|c| c.steals),
            delta(|c| c.injector_pops),
        );
    }

    /// The floor of a fiber's life, with no scheduler: corosensei's spawn-run-drop on pooled
    /// stacks, each thread doing its share of the n tasks: a stack from the thread's pool, a
    /// coroutine on it, one resume to its return, the stack back to the pool. One thread per
    /// core: rayon's threads, through `broadcast` (a few µs to wake them, as vt's op wakes its
    /// carriers; starting threads per op would cost a third of the op).
    pub fn bare(p: &Peers) {
        let parts = p.rayon.broadcast(|ctx| bare_part(&p.bare_stacks, ctx.index()));
        check_sum(parts.into_iter().sum());
    }

    /// The same floor on the calling thread.
    pub fn bare1(p: &Peers) {
        check_sum(bare_part(&p.bare1_stacks, 0));
    }

    fn bare_part(pools: &[Mutex<Vec<corosensei::stack::DefaultStack>>], thread: usize) -> u64 {
        use corosensei::{Coroutine, CoroutineResult};
        let mut pool = pools[thread].lock().unwrap();
        let mut sum = 0;
        for i in (thread..N).step_by(pools.len()) {
            let stack = pool.pop().expect("a pooled stack");
            let mut co = Coroutine::with_stack(stack, move |_, ()| i as u64);
            match co.resume(()) {
                CoroutineResult::Return(v) => sum += v,
                CoroutineResult::Yield(()) => unreachable!("W1's tasks do not yield"),
            }
            pool.push(co.into_stack());
        }
        sum
    }

    fn on(rt: &vt::Runtime) {
        let sum = rt.block_on(|| {
            let tasks: Vec<_> = (0..N).map(|i| vt::spawn(move || i as u64)).collect();
            tasks.into_iter().map(|t| t.join().unwrap()).sum()
        });
        check_sum(sum);
    }

    pub fn tokio(p: &Peers) {
        let sum = p.tokio.block_on(async {
            let tasks: Vec<_> = (0..N).map(|i| tokio::spawn(async move { i as u64 })).collect();
            let mut sum = 0;
            for t in tasks {
                sum += t.await.unwrap();
            }
            sum
        });
        check_sum(sum);
    }

    pub fn may(_: &Peers) {
        let tasks: Vec<_> = (0..N).map(|i| may_go(move || i as u64)).collect();
        check_sum(tasks.into_iter().map(|t| t.join().unwrap()).sum());
    }

    pub fn rayon(p: &Peers) {
        use rayon::prelude::*;
        let each: Vec<u64> =
            p.rayon.install(|| (0..N).into_par_iter().with_max_len(1).map(|i| i as u64).collect());
        check_sum(each.into_iter().sum());
    }

    pub fn std(_: &Peers) {
        let tasks: Vec<_> = (0..N).map(|i| std::thread::spawn(move || i as u64)).collect();
        check_sum(tasks.into_iter().map(|t| t.join().unwrap()).sum());
    }

    fn check_sum(sum: u64) {
        let n = N as u64;
        assert_eq!(sum, n * (n - 1) / 2, "W1: wrong sum");
    }
}

mod w2 {
    //! W2 fork_many: spawn n tasks that each decrement a shared counter; the one that takes it to
    //! zero completes a one-shot signal, which the caller waits on.
    use super::*;

    pub fn vt(p: &Peers) {
        on(&p.vt);
    }

    /// The same op on the runtime built with the `unsafe` opt-in `migrate_started_fibers`.
    pub fn migrate(p: &Peers) {
        on(&p.vt_migrate);
    }

    /// The same op with carriers never pinned.
    pub fn unpinned(p: &Peers) {
        on(&p.vt_unpinned);
    }

    fn on(rt: &vt::Runtime) {
        rt.block_on(|| {
            let (done, signal) = channel::oneshot::channel();
            let count = Countdown::new(N, done);
            for _ in 0..N {
                let count = count.clone();
                vt::spawn(move || {
                    if let Some(done) = count.arrive() {
                        done.send(()).unwrap();
                    }
                });
            }
            signal.recv().unwrap();
        });
    }

    pub fn tokio(p: &Peers) {
        p.tokio.block_on(async {
            let (done, signal) = tokio::sync::oneshot::channel();
            let count = Countdown::new(N, done);
            for _ in 0..N {
                let count = count.clone();
                tokio::spawn(async move {
                    if let Some(done) = count.arrive() {
                        done.send(()).unwrap();
                    }
                });
            }
            signal.await.unwrap();
        });
    }

    pub fn may(_: &Peers) {
        let signal = Arc::new(may::sync::SyncFlag::new());
        let count = Countdown::new(N, signal.clone());
        for _ in 0..N {
            let count = count.clone();
            may_go(move || {
                if let Some(done) = count.arrive() {
                    done.fire();
                }
            });
        }
        signal.wait();
    }

    pub fn rayon(p: &Peers) {
        let (done, signal) = std::sync::mpsc::channel();
        let count = Countdown::new(N, done);
        p.rayon.spawn(move || {
            for _ in 0..N {
                let count = count.clone();
                rayon::spawn(move || {
                    if let Some(done) = count.arrive() {
                        done.send(()).unwrap();
                    }
                });
            }
        });
        signal.recv().unwrap();
    }

    pub fn std(_: &Peers) {
        let (done, signal) = std::sync::mpsc::channel();
        let count = Countdown::new(N, done);
        for _ in 0..N {
            let count = count.clone();
            std::thread::spawn(move || {
                if let Some(done) = count.arrive() {
                    done.send(()).unwrap();
                }
            });
        }
        signal.recv().unwrap();
    }
}

mod w3 {
    //! W3 chained_fork: task i spawns task i + 1 and returns without waiting; task n completes a
    //! one-shot signal, which the caller waits on.
    use super::*;

    pub fn vt(p: &Peers) {
        on(&p.vt);
    }

    /// The same op on the runtime built with the `unsafe` opt-in `migrate_started_fibers`.
    pub fn migrate(p: &Peers) {
        on(&p.vt_migrate);
    }

    /// The same op with carriers never pinned.
    pub fn unpinned(p: &Peers) {
        on(&p.vt_unpinned);
    }

    fn on(rt: &vt::Runtime) {
        fn link(i: usize, done: channel::oneshot::Sender<()>) {
            match i {
                N => done.send(()).unwrap(),
                _ => drop(vt::spawn(move || link(i + 1, done))),
            }
        }
        rt.block_on(|| {
            let (done, signal) = channel::oneshot::channel();
            vt::spawn(move || link(1, done));
            signal.recv().unwrap();
        });
    }

    pub fn tokio(p: &Peers) {
        fn link(i: usize, done: tokio::sync::oneshot::Sender<()>) {
            match i {
                N => done.send(()).unwrap(),
                _ => drop(tokio::spawn(async move { link(i + 1, done) })),
            }
        }
        p.tokio.block_on(async {
            let (done, signal) = tokio::sync::oneshot::channel();
            tokio::spawn(async move { link(1, done) });
            signal.await.unwrap();
        });
    }

    pub fn may(_: &Peers) {
        fn link(i: usize, done: Arc<may::sync::SyncFlag>) {
            match i {
                N => done.fire(),
                _ => drop(may_go(move || link(i + 1, done))),
            }
        }
        let signal = Arc::new(may::sync::SyncFlag::new());
        let done = signal.clone();
        may_go(move || link(1, done));
        signal.wait();
    }

    pub fn rayon(p: &Peers) {
        fn link(i: usize, done: std::sync::mpsc::Sender<()>) {
            match i {
                N => done.send(()).unwrap(),
                _ => rayon::spawn(move || link(i + 1, done)),
            }
        }
        let (done, signal) = std::sync::mpsc::channel();
        p.rayon.spawn(move || link(1, done));
        signal.recv().unwrap();
    }

    pub fn std(_: &Peers) {
        fn link(i: usize, done: std::sync::mpsc::Sender<()>) {
            match i {
                N => done.send(()).unwrap(),
                _ => drop(std::thread::spawn(move || link(i + 1, done))),
            }
        }
        let (done, signal) = std::sync::mpsc::channel();
        std::thread::spawn(move || link(1, done));
        signal.recv().unwrap();
    }
}

mod w4 {
    //! W4 ping_pong: A sends a u64 to B over a channel of capacity 1, B sends it back over a
    //! second one; r round trips; the caller joins both.
    use super::*;

    pub fn vt(p: &Peers) {
        on(&p.vt);
    }

    /// The same op on the runtime built with the `unsafe` opt-in `migrate_started_fibers`.
    pub fn migrate(p: &Peers) {
        on(&p.vt_migrate);
    }

    /// The same op with carriers never pinned.
    pub fn unpinned(p: &Peers) {
        on(&p.vt_unpinned);
    }

    fn on(rt: &vt::Runtime) {
        rt.block_on(|| {
            let ((to_b, from_a), (to_a, from_b)) = (channel::bounded(1), channel::bounded(1));
            let a = vt::spawn(move || {
                for i in 0..ROUND_TRIPS {
                    to_b.send(i).unwrap();
                    assert_eq!(from_b.recv().unwrap(), i, "W4: wrong reply");
                }
            });
            let b = vt::spawn(move || {
                for _ in 0..ROUND_TRIPS {
                    to_a.send(from_a.recv().unwrap()).unwrap();
                }
            });
            a.join().unwrap();
            b.join().unwrap();
        });
    }

    pub fn tokio(p: &Peers) {
        use tokio::sync::mpsc::channel;
        p.tokio.block_on(async {
            let ((to_b, mut from_a), (to_a, mut from_b)) = (channel(1), channel(1));
            let a = tokio::spawn(async move {
                for i in 0..ROUND_TRIPS {
                    to_b.send(i).await.unwrap();
                    assert_eq!(from_b.recv().await.unwrap(), i, "W4: wrong reply");
                }
            });
            let b = tokio::spawn(async move {
                for _ in 0..ROUND_TRIPS {
                    to_a.send(from_a.recv().await.unwrap()).await.unwrap();
                }
            });
            a.await.unwrap();
            b.await.unwrap();
        });
    }

    pub fn may(_: &Peers) {
        use may::sync::mpsc::channel;
        let ((to_b, from_a), (to_a, from_b)) = (channel(), channel());
        let a = may_go(move || {
            for i in 0..ROUND_TRIPS {
                to_b.send(i).unwrap();
                assert_eq!(from_b.recv().unwrap(), i, "W4: wrong reply");
            }
        });
        let b = may_go(move || {
            for _ in 0..ROUND_TRIPS {
                to_a.send(from_a.recv().unwrap()).unwrap();
            }
        });
        a.join().unwrap();
        b.join().unwrap();
    }
}

mod w5 {
    //! W5 yield_many: t tasks each yield to the scheduler y times; the caller joins all.
    use super::*;

    pub fn vt(p: &Peers) {
        on(&p.vt);
    }

    /// The same op on the runtime built with the `unsafe` opt-in `migrate_started_fibers`.
    pub fn migrate(p: &Peers) {
        on(&p.vt_migrate);
    }

    /// The same op with carriers never pinned.
    pub fn unpinned(p: &Peers) {
        on(&p.vt_unpinned);
    }

    fn on(rt: &vt::Runtime) {
        rt.block_on(|| {
            let tasks: Vec<_> =
                (0..YIELDERS).map(|_| vt::spawn(|| (0..YIELDS).for_each(|_| vt::yield_now()))).collect();
            tasks.into_iter().for_each(|t| t.join().unwrap());
        });
    }

    pub fn tokio(p: &Peers) {
        p.tokio.block_on(async {
            let tasks: Vec<_> = (0..YIELDERS)
                .map(|_| {
                    tokio::spawn(async {
                        for _ in 0..YIELDS {
                            tokio::task::yield_now().await;
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
    }

    pub fn may(_: &Peers) {
        let tasks: Vec<_> =
            (0..YIELDERS).map(|_| may_go(|| (0..YIELDS).for_each(|_| may::coroutine::yield_now()))).collect();
        tasks.into_iter().for_each(|t| t.join().unwrap());
    }

    /// The same op on one carrier.
    pub fn vt1(p: &Peers) {
        on(&p.vt1);
    }

    /// The floor W5's target is stated against: no scheduler, just corosensei. One thread per
    /// core, each resuming its share of the t coroutines round-robin until all have yielded y
    /// times (stacks carved once, in `Peers::new`, as vt's come from its pool). The threads are
    /// started per op, about 50 µs of a 20 ms op.
    pub fn bare(p: &Peers) {
        bare_on(&p.bare_stacks);
    }

    /// The same floor on one thread.
    pub fn bare1(p: &Peers) {
        bare_on(&p.bare1_stacks);
    }

    fn bare_on(pools: &[Mutex<Vec<corosensei::stack::DefaultStack>>]) {
        use corosensei::{Coroutine, CoroutineResult, Yielder};
        std::thread::scope(|s| {
            for stacks in pools {
                s.spawn(move || {
                    let mut stacks = stacks.lock().unwrap();
                    let mut tasks: Vec<_> = stacks
                        .drain(..)
                        .map(|stack| {
                            Coroutine::with_stack(stack, |y: &Yielder<(), ()>, ()| {
                                (0..YIELDS).for_each(|_| y.suspend(()));
                            })
                        })
                        .collect();
                    let mut live = tasks.len();
                    while live > 0 {
                        live = 0;
                        for t in tasks.iter_mut().filter(|t| !t.done()) {
                            if let CoroutineResult::Yield(()) = t.resume(()) {
                                live += 1;
                            }
                        }
                    }
                    stacks.extend(tasks.into_iter().map(Coroutine::into_stack));
                });
            }
        });
    }
}

#[path = "workloads/skew.rs"]
mod skew;
#[path = "workloads/skew_tcp.rs"]
mod skew_tcp;

mod w6 {
    //! W6 parked_memory: spawn n tasks that each wait on one shared gate (a write-locked
    //! `RwLock` that each task read-locks); once all have started (a countdown and a one-shot
    //! signal), read RSS; open the gate; join all. Each runtime runs in a fresh child process.
    //!
    //! `vt+compact` is vt with stack compaction (`compact_parked_after(10 ms)`): it reads RSS
    //! once all n have started *and* the compactor has compacted all n (WORKLOADS.md reads it
    //! once all have started: compaction needs the tasks to stay parked a while), and reports
    //! how long after "all started" that was.
    use super::*;

    /// One run's result: RSS growth per parked task, spawn-loop time per task, time per task
    /// from opening the gate to the last join (for `vt+compact`, every task's stack is copied
    /// back on the way), and for `vt+compact` the wait from "all started" to "all compacted".
    pub struct Parked {
        bytes: f64,
        spawn_ns: f64,
        wake_ns: f64,
        compact_ms: f64,
    }

    pub fn child(which: &str) {
        let parked = match which {
            "vt" => vt(None),
            "vt+compact" => vt(Some(Duration::from_millis(10))),
            "tokio" => tokio(),
            other => panic!("W6: unknown runtime {other}"),
        };
        println!("{} {} {} {}", parked.bytes, parked.spawn_ns, parked.wake_ns, parked.compact_ms);
    }

    fn vt(compact: Option<Duration>) -> Parked {
        // SAFETY: W6's tasks lend their stacks to nobody (they only count and read-lock).
        let builder = unsafe { vt::Runtime::builder().compact_parked_after(compact) };
        let rt = builder.carriers(cores()).build().expect("vt runtime");
        let handle = rt.handle();
        rt.block_on(|| {
            let gate = Arc::new(sync::RwLock::new(()));
            let closed = gate.write().unwrap();
            let (all_in, started) = channel::oneshot::channel();
            let count = Countdown::new(PARKED, all_in);
            let mut tasks = Vec::with_capacity(PARKED);
            let before = rss_bytes();
            let spawning = Instant::now();
            for _ in 0..PARKED {
                let (gate, count) = (gate.clone(), count.clone());
                tasks.push(vt::spawn(move || {
                    if let Some(all_in) = count.arrive() {
                        all_in.send(()).unwrap();
                    }
                    let _open = gate.read().unwrap();
                }));
            }
            let spawn_time = spawning.elapsed();
            started.recv().unwrap();
            let all_started = Instant::now();
            let mut compact_ms = 0.0;
            if compact.is_some() {
                while handle.metrics().stack_compactions < PARKED as u64 {
                    vt::sleep(Duration::from_millis(1));
                }
                compact_ms = all_started.elapsed().as_secs_f64() * 1e3;
            }
            let parked = rss_bytes();
            let waking = Instant::now();
            drop(closed);
            tasks.into_iter().for_each(|t| t.join().unwrap());
            Parked { compact_ms, ..Parked::new(before, parked, spawn_time, waking.elapsed()) }
        })
    }

    fn tokio() -> Parked {
        let rt = tokio_runtime(cores());
        rt.block_on(async {
            let gate = Arc::new(tokio::sync::RwLock::new(()));
            let closed = gate.write().await;
            let (all_in, started) = tokio::sync::oneshot::channel();
            let count = Countdown::new(PARKED, all_in);
            let mut tasks = Vec::with_capacity(PARKED);
            let before = rss_bytes();
            let spawning = Instant::now();
            for _ in 0..PARKED {
                let (gate, count) = (gate.clone(), count.clone());
                tasks.push(tokio::spawn(async move {
                    if let Some(all_in) = count.arrive() {
                        all_in.send(()).unwrap();
                    }
                    let _open = gate.read().await;
                }));
            }
            let spawn_time = spawning.elapsed();
            started.await.unwrap();
            let parked = rss_bytes();
            let waking = Instant::now();
            drop(closed);
            for t in tasks {
                t.await.unwrap();
            }
            Parked::new(before, parked, spawn_time, waking.elapsed())
        })
    }

    impl Parked {
        fn new(before: u64, parked: u64, spawn_time: Duration, wake_time: Duration) -> Parked {
            Parked {
                bytes: parked.saturating_sub(before) as f64 / PARKED as f64,
                spawn_ns: spawn_time.as_nanos() as f64 / PARKED as f64,
                wake_ns: wake_time.as_nanos() as f64 / PARKED as f64,
                compact_ms: 0.0,
            }
        }
    }

    /// Runs each runtime's W6 in `W6_RUNS` fresh processes, alternating, and prints medians.
    pub fn report() {
        println!(
            "\nW6 parked_memory   n = 100,000 tasks parked on one gate; median of {W6_RUNS} fresh processes"
        );
        let mut runs: [(&str, Vec<Parked>); 3] = [("vt", vec![]), ("vt+compact", vec![]), ("tokio", vec![])];
        for _ in 0..W6_RUNS {
            for (which, results) in &mut runs {
                results.push(run_child(which));
            }
        }
        for (which, results) in &runs {
            let memory = Stats::of(results.iter().map(|r| r.bytes).collect());
            let spawn = Stats::of(results.iter().map(|r| r.spawn_ns).collect());
            let (m, s) = (&memory, &spawn);
            let bytes = format!("{} B/task ({} – {})", num(m.median), num(m.min), num(m.max));
            let ns = format!("{} ns/task ({} – {})", num(s.median), num(s.min), num(s.max));
            let w = Stats::of(results.iter().map(|r| r.wake_ns).collect());
            let wake = format!("{} ns/task ({} – {})", num(w.median), num(w.min), num(w.max));
            let c = Stats::of(results.iter().map(|r| r.compact_ms).collect());
            let compacted = if c.max > 0.0 {
                format!("   all compacted {:.0} ms after all started ({:.0} – {:.0})", c.median, c.min, c.max)
            } else {
                String::new()
            };
            println!("  {which:<10} {bytes:<30} spawn {ns:<28} wake+join {wake:<28}{compacted}");
        }
    }

    fn run_child(which: &str) -> Parked {
        let exe = std::env::current_exe().expect("current_exe");
        let out = Command::new(exe).env(W6_CHILD, which).output().expect("W6: start child");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "W6 {which} failed: {}", String::from_utf8_lossy(&out.stderr));
        let mut fields = text.split_whitespace().map(|f| f.parse::<f64>().expect("W6: child output"));
        let mut field = || fields.next().expect("W6: child output");
        let (bytes, spawn_ns, wake_ns, compact_ms) = (field(), field(), field(), field());
        Parked { bytes, spawn_ns, wake_ns, compact_ms }
    }

    /// Resident set size from `/proc/self/statm` (its second field, in pages).
    fn rss_bytes() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
        let pages: u64 = statm.split_whitespace().nth(1).and_then(|f| f.parse().ok()).expect("statm");
        // SAFETY: sysconf only reads a system constant; _SC_PAGESIZE is always supported.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        pages * page as u64
    }
}

mod w7 {
    //! W7 sleep_many: spawn n tasks that each sleep 10 ms; join all; wall time against 10 ms.
    use super::*;

    fn vt(p: &Peers) {
        on(&p.vt);
    }

    fn migrate(p: &Peers) {
        on(&p.vt_migrate);
    }

    fn on(rt: &vt::Runtime) {
        rt.block_on(|| {
            let tasks: Vec<_> = (0..SLEEPERS).map(|_| vt::spawn(|| vt::sleep(NAP))).collect();
            tasks.into_iter().for_each(|t| t.join().unwrap());
        });
    }

    fn tokio(p: &Peers) {
        p.tokio.block_on(async {
            let tasks: Vec<_> = (0..SLEEPERS).map(|_| tokio::spawn(tokio::time::sleep(NAP))).collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
    }

    pub fn report(p: &Peers) {
        println!(
            "\nW7 sleep_many      n = 10,000 tasks sleep 10 ms; wall time per op, median of {}",
            rounds()
        );
        let ops: [(&str, Op); 3] = [("vt", vt), ("migrate", migrate), ("tokio", tokio)];
        for (which, wall) in ops.iter().zip(interleaved(p, &ops)) {
            let ms = Stats::of(wall.iter().map(|d| d.as_secs_f64() * 1e3).collect());
            println!(
                "  {:<8} {:>6.2} ms ({:.2} – {:.2})   {:+.2} ms over the 10 ms ideal",
                which.0,
                ms.median,
                ms.min,
                ms.max,
                ms.median - 10.0
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Shared pieces.

/// The counter of W2 (and W6's "all started"): the task that takes it to zero gets the signal's
/// sending half and completes it.
struct Countdown<S> {
    left: AtomicUsize,
    signal: Mutex<Option<S>>,
}

impl<S> Countdown<S> {
    fn new(n: usize, signal: S) -> Arc<Self> {
        Arc::new(Countdown { left: AtomicUsize::new(n), signal: Mutex::new(Some(signal)) })
    }

    /// Counts one arrival; returns the signal to the last arrival only.
    fn arrive(&self) -> Option<S> {
        // AcqRel: the last arrival sees every earlier task's work before it completes the signal.
        let last = self.left.fetch_sub(1, Ordering::AcqRel) == 1;
        last.then(|| self.signal.lock().unwrap().take().expect("signal taken once"))
    }
}

/// `may`'s spawn is `unsafe` (its `go!` macro only hides that).
fn may_go<F, T>(f: F) -> may::coroutine::JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    // SAFETY: may requires that a coroutine touch no thread-local storage and stay within its
    // stack. The closures here only spawn, count, and block through may's own primitives (join,
    // mpsc, SyncFlag, yield_now), with shallow stacks.
    unsafe { may::coroutine::spawn(f) }
}

/// Environment variable that turns this binary into a W6 child for one runtime.
const W6_CHILD: &str = "WORKLOADS_W6_CHILD";

/// Median, min and max of some samples.
struct Stats {
    median: f64,
    min: f64,
    max: f64,
}

impl Stats {
    fn of(mut samples: Vec<f64>) -> Stats {
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let median = if n % 2 == 1 { samples[n / 2] } else { (samples[n / 2 - 1] + samples[n / 2]) / 2.0 };
        Stats { median, min: samples[0], max: samples[n - 1] }
    }
}

/// Times `ROUNDS` ops of each runtime, one of each in turn, after a warm-up of each (one op, and
/// more until `WARM_UP` has passed).
fn interleaved(p: &Peers, ops: &[(&str, Op)]) -> Vec<Vec<Duration>> {
    for (_, op) in ops {
        let start = Instant::now();
        op(p);
        while start.elapsed() < WARM_UP {
            op(p);
        }
    }
    let rounds = rounds();
    let mut times = vec![Vec::with_capacity(rounds); ops.len()];
    for round in 0..rounds {
        // Each round starts with the next runtime, so that none always runs first (right after
        // another runtime's op) or last.
        for i in (0..ops.len()).map(|i| (i + round) % ops.len()) {
            let threads = thread_count();
            let start = Instant::now();
            (ops[i].1)(p);
            times[i].push(start.elapsed());
            settle(threads);
        }
    }
    times
}

/// Waits until the threads an op left behind (std's detached threads, still exiting after
/// they signalled) are gone, and then `SETTLE` more for idle workers to stop spinning, so that one
/// runtime's leftovers do not land on the next one's time.
fn settle(threads_before: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while thread_count() > threads_before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(SETTLE);
}

/// The process's thread count, from `/proc/self/status`.
fn thread_count() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let threads = status.lines().find_map(|l| l.strip_prefix("Threads:"));
    threads.and_then(|n| n.trim().parse().ok()).unwrap_or(0)
}

/// One criterion group per workload, one function per runtime: 10 samples of one or more ops.
/// An op that takes longer than 0.2 s (std threads) gets 10 samples of one op each, and
/// criterion warns that 10 samples do not fit in 2 s; that is expected.
fn criterion_group(c: &mut Criterion, p: &Peers, ops: &[(&'static str, Op)], id: &str) {
    let mut group = c.benchmark_group(id);
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));
    for &(runtime, op) in ops {
        group.bench_function(runtime, |b| b.iter(|| op(p)));
    }
    group.finish();
}

/// The workloads and rows of the `floor` part (`WORKLOADS_PARTS=floor`): W1 and W5 for vt on
/// all cores and on one carrier, tokio, and corosensei's bare loops on all cores and on one
/// thread; its table ends with `floor_table`.
const FLOOR_WORKLOADS: &[&str] = &["W1_fork_join", "W5_yield_many"];

fn floor_runtimes() -> Vec<String> {
    ["vt1", "tokio", "bare", "bare1"].map(String::from).to_vec()
}

/// Prints the table of medians (ops/s) with min and max, and this runtime's speed-up on each;
/// then, for W1 and W5 where the `vt1` and `bare1` rows ran, `floor_table`.
fn print_table<'a>(p: &Peers, args: &Args, suite: impl Iterator<Item = &'a Workload>) {
    let mode = host_mode();
    let machine = cpu_model();
    println!("\nWorkloads W1–W5: ops/s, median of {} interleaved rounds after warm-up (min – max)", rounds());
    println!(
        "machine: {machine}, {} cores; every runtime has {} workers but the rows `vt1` and `bare1` (one)",
        cores(),
        cores()
    );
    println!("{mode}\n");
    println!(
        "{:<16} {:<14} {:<7} {:>9}  {:>21}  {:>11}",
        "workload", "size", "runtime", "ops/s", "min – max", "vt speed-up"
    );
    let mut summary = Vec::new();
    let mut medians: Vec<(&str, Vec<(&str, f64)>)> = Vec::new();
    for w in suite {
        // Peers in the interleaved rounds, floors after them (see `FLOORS`).
        let (floors, mut ops): (Vec<_>, Vec<_>) =
            args.ops(w).into_iter().partition(|(r, _)| FLOORS.contains(r));
        let mut samples = interleaved(p, &ops);
        for &floor in &floors {
            samples.extend(interleaved(p, &[floor]));
            ops.push(floor);
        }
        let rates: Vec<Stats> = samples
            .into_iter()
            .map(|t| Stats::of(t.iter().map(|t| 1.0 / t.as_secs_f64()).collect()))
            .collect();
        let vt = rates[0].median;
        medians.push((w.id, ops.iter().zip(&rates).map(|((r, _), s)| (*r, s.median)).collect()));
        let name = w.id.replacen('_', " ", 1);
        let mut line = format!("{name:<16} vt {} ops/s", num(vt));
        for (i, ((runtime, _), r)) in ops.iter().zip(&rates).enumerate() {
            let (id, size) = if i == 0 { (name.as_str(), w.size) } else { ("", "") };
            let range = format!("{} – {}", num(r.min), num(r.max));
            let speed_up = times(vt / r.median);
            println!("{id:<16} {size:<14} {runtime:<7} {:>9}  {range:>21}  {speed_up:>11}", num(r.median));
            if i > 0 {
                line += &format!("  {runtime} {} (vt = {speed_up})", num(r.median));
            }
        }
        summary.push(line);
    }
    println!("\nSummary (medians, ops/s; \"vt = 4.0x\" means this runtime is 4 times faster):");
    summary.iter().for_each(|line| println!("{line}"));
    floor_table(&medians);
    let after = host_mode();
    println!("\nbefore the table: {mode}\nafter the table:  {after}");
    if after.fast != mode.fast {
        println!("note: the host changed latency mode during the table: its figures mix the two modes");
    }
    std::io::stdout().flush().ok();
}

/// The floor: time per fiber (W1: spawn, run, join) and per yield (W5) for corosensei's bare
/// loops and vt, on one carrier and on all, with the ratios the targets are stated in
/// (`arch/performance.md`, "The floor"): vt1 / bare1 (W5 at most 2x, W1 at most 3x) and the
/// speed-up of all carriers over one (W5 at least 1.8x, W1 at least 1.6x on 2 cores).
fn floor_table(medians: &[(&str, Vec<(&str, f64)>)]) {
    let rows: Vec<_> = medians
        .iter()
        .filter_map(|(id, rates)| {
            let per_op = match *id {
                "W1_fork_join" => N as f64,
                "W5_yield_many" => (YIELDERS * YIELDS) as f64,
                _ => return None,
            };
            let ns =
                |runtime: &str| rates.iter().find(|(r, _)| *r == runtime).map(|(_, ops)| 1e9 / ops / per_op);
            Some((*id, ns("bare1")?, ns("vt1")?, ns("bare"), ns("vt")?))
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let unit = |id: &str| if id.starts_with("W1") { "per fiber" } else { "per yield" };
    println!(
        "\nThe floor: ns per fiber (W1) or per yield (W5), medians; `1`: one carrier or thread, else {}; speed-up: vt over vt1",
        cores()
    );
    println!(
        "{:<16} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>11}",
        "workload", "", "bare1", "vt1", "vt1/bare1", "bare", "vt", "vt speed-up"
    );
    for (id, bare1, vt1, bare, vt) in rows {
        let bare = bare.map_or("-".to_string(), |b| format!("{b:.1}"));
        println!(
            "{:<16} {:>9} {bare1:>9.1} {vt1:>9.1} {:>10} {bare:>9} {vt:>9.1} {:>11}",
            id.replacen('_', " ", 1),
            unit(id),
            times(vt1 / bare1),
            times(vt1 / vt),
        );
    }
}

/// The host's cross-core latency mode. On the project's 2-vCPU guest a cache-line round trip
/// between the two CPUs reads 38–95 ns in some minutes and 334–391 ns in others, and every
/// figure that moves data between carriers moves with it: tables from the two modes are never
/// compared, so each report says which it ran in.
struct HostMode {
    round_trip_ns: Option<f64>,
    fast: bool,
}

impl std::fmt::Display for HostMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let load = load.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
        match self.round_trip_ns {
            None => write!(f, "host mode: one CPU, no cross-core probe; load average {load}"),
            Some(ns) => write!(
                f,
                "host mode: cross-core round trip {ns:.0} ns, {} mode (fast 38–95 ns, slow 334–391 ns on the project's machine); load average {load}",
                if self.fast { "fast" } else { "slow" },
            ),
        }
    }
}

/// Measures the cross-core round trip: two threads pinned to CPUs 0 and 1 bounce a cache line
/// (an atomic counter each increments in turn) 1,000 times per batch, 21 batches; the median
/// batch's time per round trip. Under 200 ns is the fast mode. About 10 ms.
fn host_mode() -> HostMode {
    use std::sync::atomic::AtomicU64;
    const BATCH: u64 = 1_000;
    const BATCHES: usize = 21;
    let cpus = pinnable_cpus();
    if cpus.len() < 2 {
        return HostMode { round_trip_ns: None, fast: true };
    }
    let line = AtomicU64::new(0);
    let mask = affinity();
    let times = std::thread::scope(|s| {
        s.spawn(|| {
            pin_to(cpus[1]);
            // Answers each odd value with the next even one until the last batch's last.
            let last = 2 * BATCH * BATCHES as u64;
            let mut seen = 0;
            while seen < last {
                let v = line.load(Ordering::Acquire);
                if v % 2 == 1 && v > seen {
                    line.store(v + 1, Ordering::Release);
                    seen = v + 1;
                }
                std::hint::spin_loop();
            }
        });
        pin_to(cpus[0]);
        let mut times = Vec::with_capacity(BATCHES);
        let mut v = 0;
        for _ in 0..BATCHES {
            let start = Instant::now();
            for _ in 0..BATCH {
                line.store(v + 1, Ordering::Release);
                while line.load(Ordering::Acquire) != v + 2 {
                    std::hint::spin_loop();
                }
                v += 2;
            }
            times.push(start.elapsed().as_nanos() as f64 / BATCH as f64);
        }
        if let Some(mask) = &mask {
            set_affinity(mask); // the bench's main thread runs where it ran before
        }
        times
    });
    let ns = Stats::of(times).median;
    HostMode { round_trip_ns: Some(ns), fast: ns < 200.0 }
}

/// The calling thread's CPU mask.
fn affinity() -> Option<libc::cpu_set_t> {
    // SAFETY: `set` is a plain bitmask the call fills; its size is passed with it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0).then_some(set)
    }
}

fn set_affinity(set: &libc::cpu_set_t) {
    // SAFETY: `set` is a valid mask of the size passed.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
}

/// The CPUs this thread may run on.
fn pinnable_cpus() -> Vec<usize> {
    let Some(set) = affinity() else { return Vec::new() };
    // SAFETY: reads a bit of a valid mask.
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// Pins the calling thread to one CPU (the probe's threads only).
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed `cpu_set_t` is an empty mask; `CPU_SET` sets a bit within it.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        set
    };
    set_affinity(&set);
}

/// Formats a number with thousands separators, or with one decimal below 10.
fn num(x: f64) -> String {
    if x < 10.0 {
        return format!("{x:.1}");
    }
    let digits = format!("{x:.0}");
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Formats a ratio: `4.4x`, `0.49x`, `120x`.
fn times(x: f64) -> String {
    match x {
        100.0.. => format!("{x:.0}x"),
        1.0.. => format!("{x:.1}x"),
        _ => format!("{x:.2}x"),
    }
}

fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info.lines().find_map(|l| l.strip_prefix("model name")?.split(':').nth(1));
    model.map_or("unknown CPU".into(), |m| m.trim().to_string())
}

/// The command line as far as this file needs it; criterion parses the rest.
#[derive(Clone)]
struct Args {
    /// `cargo bench` (not `cargo test --benches`, not `--list`).
    bench: bool,
    filter: Option<String>,
    /// `WORKLOADS_RUNTIMES=vt,tokio`: only these runtimes (vt always runs: the ratios are to it).
    runtimes: Option<Vec<String>>,
    /// `WORKLOADS_PARTS=table,w7`: only these parts of the run (`criterion`, `table`, `floor`,
    /// `w6`, `w7`, `skew`, `skew_tcp`), for a short run such as the 16-core scaling script (`.ci/scaling`).
    /// `floor`, `skew` and `skew_tcp` are not run unless named.
    parts: Option<Vec<String>>,
}

impl Args {
    fn parse() -> Args {
        // Criterion's options that take a value: their value is not the filter.
        #[rustfmt::skip]
        const VALUED: &[&str] = &[
            "--color", "-c", "--save-baseline", "-s", "--baseline", "-b", "--baseline-lenient",
            "--load-baseline", "--sample-size", "--warm-up-time", "--measurement-time",
            "--nresamples", "--noise-threshold", "--confidence-level", "--significance-level",
            "--profile-time", "--plotting-backend", "--output-format", "--format",
        ];
        let args: Vec<String> = std::env::args().skip(1).collect();
        let has = |flag: &str| args.iter().any(|a| a == flag);
        let filter = args.iter().enumerate().find_map(|(i, a)| {
            let after_valued = i > 0 && VALUED.contains(&args[i - 1].as_str());
            (!a.starts_with('-') && !after_valued).then(|| a.clone())
        });
        let list = |var: &str| {
            std::env::var(var).ok().map(|v| v.split(',').map(|x| x.trim().to_string()).collect::<Vec<_>>())
        };
        Args {
            bench: has("--bench") && !has("--test") && !has("--list") && !has("--profile-time"),
            filter,
            runtimes: list("WORKLOADS_RUNTIMES"),
            parts: list("WORKLOADS_PARTS"),
        }
    }

    /// Whether this part of the run is wanted (all are, unless `WORKLOADS_PARTS` says).
    fn part(&self, part: &str) -> bool {
        match &self.parts {
            Some(parts) => parts.iter().any(|x| x == part),
            None => part != "floor" && part != "skew" && part != "skew_tcp",
        }
    }

    /// The runtimes of a workload this run measures, vt first.
    fn ops(&self, w: &Workload) -> Vec<(&'static str, Op)> {
        let keep = |r: &str| r == "vt" || self.runtimes.as_ref().is_none_or(|rs| rs.iter().any(|x| x == r));
        w.ops.iter().copied().filter(|&(r, _)| keep(r)).collect()
    }

    /// Whether the filter, matched as criterion matches it (`W1_fork_join/vt` contains it),
    /// selects the workload or one of its runtimes.
    fn wants(&self, id: &str, runtimes: &[&str]) -> bool {
        let Some(f) = self.filter.as_deref() else {
            return true;
        };
        id.contains(f) || runtimes.iter().any(|r| format!("{id}/{r}").contains(f))
    }
}
