//! Skew: the price of home carriers when a phase change strands work. Started fibers never
//! leave their home carrier (the sound default), so fibers that all started on one carrier
//! stay there when the load they carry changes; work-stealing runtimes that move started tasks
//! (tokio, vt's `unsafe` opt-in `migrate_started_fibers`) rebalance.
//!
//! One op: 1,000 long-lived tasks, of which the heavy half all start while the other carrier
//! is busy: the calling fiber spins (not yields) until a busy fiber runs, so that the other
//! carrier took it; the 500 heavy tasks are spawned and start (each counts itself and waits on
//! a gate); the busy fiber stops; then the 500 light ones are spawned and start wherever they
//! are taken. Timed: from opening the gate to the last join, while every heavy task does
//! `UNITS` units of ~1 µs of arithmetic with a yield after each, and every light one only
//! yields as often. Two kinds of busy fiber:
//! - `hog` (the rows `skewed`): it spins without a switch point. Nothing else runs on its
//!   carrier, so the heavy half starts on the spawner's; placement by load cannot help (it
//!   places nothing on a carrier the supervisor holds, and what it placed before comes back),
//!   only migration or an acceptor per carrier (`skew_tcp.rs`) does.
//! - `coop`: it spins ~50 µs, then yields, over and over: its carrier runs fibers, so it never
//!   goes idle to steal, and without placement the heavy half starts on the spawner's carrier
//!   all the same. With placement by load (the default; `coop, off` turns it off) the
//!   spawner's carrier sends every other fiber about to start to the busy one once it is home
//!   to 32 more than twice as many (`arch/decisions/0014-placement-by-load.md`).
//!
//! `balanced` is the same op without a busy fiber: the heavy tasks spread as they start. Run:
//! `WORKLOADS_PARTS=skew cargo bench --bench workloads` (about 15 s).
use super::*;
use std::sync::atomic::AtomicBool;

/// Tasks per op, half heavy.
const TASKS: usize = 1_000;
/// Yields per task in the timed phase, each after one unit of work for a heavy task.
const UNITS: usize = 100;
/// Iterations of `spin` in one unit (about 1 µs on the project's machine).
const SPIN: u64 = 1_000;
/// Units the cooperative busy fiber spins between its yields (~50 µs).
const BUSY_UNITS: u64 = 50;

/// What keeps the other carrier busy while the heavy half starts.
#[derive(Clone, Copy, PartialEq)]
enum Busy {
    /// Nothing: the heavy half spreads as it starts.
    Balanced,
    /// A spin with no switch point.
    Hog,
    /// ~50 µs of spinning, then a yield, over and over.
    Coop,
}

/// `n` steps of arithmetic the optimiser cannot remove: the skew parts' unit of work.
pub(super) fn spin(n: u64) -> u64 {
    let mut x = 0u64;
    for i in 0..n {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
    }
    x
}

/// The hog's flags: it has started, and it may stop.
struct Hog {
    on: AtomicBool,
    stop: AtomicBool,
}

fn vt_op(rt: &vt::Runtime, busy: Busy) -> Duration {
    rt.block_on(|| {
        let gate = Arc::new(sync::RwLock::new(()));
        let closed = gate.write().unwrap();
        let started = Arc::new(AtomicUsize::new(0));
        let hog = Arc::new(Hog { on: AtomicBool::new(false), stop: AtomicBool::new(false) });
        let hogging = (busy != Busy::Balanced).then(|| {
            let hog2 = hog.clone();
            let h = vt::spawn(move || {
                hog2.on.store(true, Ordering::Release);
                while !hog2.stop.load(Ordering::Acquire) {
                    if busy == Busy::Coop {
                        spin(BUSY_UNITS * SPIN);
                        vt::yield_now();
                    }
                    std::hint::spin_loop();
                }
            });
            // Spinning, not yielding: this carrier cannot take the hog, so the other did.
            while !hog.on.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            h
        });
        let half = |heavy: bool| -> Vec<vt::JoinHandle<()>> {
            (0..TASKS / 2)
                .map(|_| {
                    let (gate, started) = (gate.clone(), started.clone());
                    vt::spawn(move || {
                        started.fetch_add(1, Ordering::Relaxed);
                        drop(gate.read().unwrap());
                        for _ in 0..UNITS {
                            if heavy {
                                spin(SPIN);
                            }
                            vt::yield_now();
                        }
                    })
                })
                .collect()
        };
        let mut tasks = half(true);
        while started.load(Ordering::Relaxed) < TASKS / 2 {
            vt::yield_now();
        }
        hog.stop.store(true, Ordering::Release);
        if let Some(h) = hogging {
            h.join().unwrap();
        }
        tasks.extend(half(false));
        while started.load(Ordering::Relaxed) < TASKS {
            vt::yield_now();
        }
        let start = Instant::now();
        drop(closed);
        tasks.into_iter().for_each(|t| t.join().unwrap());
        start.elapsed()
    })
}

fn tokio_op(rt: &tokio::runtime::Runtime, busy: Busy) -> Duration {
    rt.block_on(async {
        let gate = Arc::new(tokio::sync::RwLock::new(()));
        let closed = gate.clone().write_owned().await;
        let started = Arc::new(AtomicUsize::new(0));
        let hog = Arc::new(Hog { on: AtomicBool::new(false), stop: AtomicBool::new(false) });
        let hogging = (busy != Busy::Balanced).then(|| {
            let hog2 = hog.clone();
            let h = tokio::spawn(async move {
                hog2.on.store(true, Ordering::Release);
                while !hog2.stop.load(Ordering::Acquire) {
                    if busy == Busy::Coop {
                        spin(BUSY_UNITS * SPIN);
                        tokio::task::yield_now().await;
                    }
                    std::hint::spin_loop();
                }
            });
            while !hog.on.load(Ordering::Acquire) {
                std::hint::spin_loop();
            }
            h
        });
        let half = |heavy: bool| -> Vec<tokio::task::JoinHandle<()>> {
            (0..TASKS / 2)
                .map(|_| {
                    let (gate, started) = (gate.clone(), started.clone());
                    tokio::spawn(async move {
                        started.fetch_add(1, Ordering::Relaxed);
                        drop(gate.read().await);
                        for _ in 0..UNITS {
                            if heavy {
                                spin(SPIN);
                            }
                            tokio::task::yield_now().await;
                        }
                    })
                })
                .collect()
        };
        let mut tasks = half(true);
        while started.load(Ordering::Relaxed) < TASKS / 2 {
            tokio::task::yield_now().await;
        }
        hog.stop.store(true, Ordering::Release);
        if let Some(h) = hogging {
            h.await.unwrap();
        }
        tasks.extend(half(false));
        while started.load(Ordering::Relaxed) < TASKS {
            tokio::task::yield_now().await;
        }
        let start = Instant::now();
        drop(closed);
        for t in tasks {
            t.await.unwrap();
        }
        start.elapsed()
    })
}

/// The runtimes of the rows: the suite's, and vt with placement by load off.
struct Rts<'a> {
    p: &'a Peers,
    unplaced: vt::Runtime,
}

/// The rows, each one op returning its timed phase.
type Row = (&'static str, fn(&Rts) -> Duration);
const ROWS: &[Row] = &[
    ("vt skewed", |r| vt_op(&r.p.vt, Busy::Hog)),
    ("vt balanced", |r| vt_op(&r.p.vt, Busy::Balanced)),
    ("migrate skewed", |r| vt_op(&r.p.vt_migrate, Busy::Hog)),
    ("tokio skewed", |r| tokio_op(&r.p.tokio, Busy::Hog)),
    ("tokio balanced", |r| tokio_op(&r.p.tokio, Busy::Balanced)),
    ("vt coop", |r| vt_op(&r.p.vt, Busy::Coop)),
    ("vt coop, off", |r| vt_op(&r.unplaced, Busy::Coop)),
    ("migrate coop", |r| vt_op(&r.p.vt_migrate, Busy::Coop)),
    ("tokio coop", |r| tokio_op(&r.p.tokio, Busy::Coop)),
];

/// The rows in rotated order, `rounds()` times after one warm-up op each; medians of the
/// timed phase, and the ratios the skew is judged by.
pub fn report(p: &Peers) {
    println!(
        "\nSkew: 1,000 tasks, the heavy 500 started while the other carrier is busy ({UNITS} x ~1 µs units each); timed phase, median of {} rounds\n{}",
        rounds(),
        host_mode()
    );
    let r = Rts {
        p,
        unplaced: vt::Runtime::builder().carriers(cores()).place_by_load(false).build().expect("vt runtime"),
    };
    for (_, op) in ROWS {
        op(&r); // warm-up
    }
    let mut ms = vec![Vec::new(); ROWS.len()];
    for round in 0..rounds() {
        for i in (0..ROWS.len()).map(|i| (i + round) % ROWS.len()) {
            ms[i].push(ROWS[i].1(&r).as_secs_f64() * 1e3);
        }
    }
    let med: Vec<Stats> = ms.into_iter().map(Stats::of).collect();
    for ((name, _), s) in ROWS.iter().zip(&med) {
        println!("  {name:<15} {:>7.2} ms ({:.2} – {:.2})", s.median, s.min, s.max);
    }
    let m = |name: &str| med[ROWS.iter().position(|(n, _)| *n == name).unwrap()].median;
    println!(
        "  throughput, vt skewed over: tokio skewed {}, vt balanced {}, migrate skewed {}; tokio skewed over tokio balanced {}",
        times(m("tokio skewed") / m("vt skewed")),
        times(m("vt balanced") / m("vt skewed")),
        times(m("migrate skewed") / m("vt skewed")),
        times(m("tokio balanced") / m("tokio skewed")),
    );
    println!(
        "  throughput, vt coop over: vt coop, off {}, tokio coop {}, vt balanced {}, migrate coop {}",
        times(m("vt coop, off") / m("vt coop")),
        times(m("tokio coop") / m("vt coop")),
        times(m("vt balanced") / m("vt coop")),
        times(m("migrate coop") / m("vt coop")),
    );
    // Where the work ran: the skew is in the setup, not in the timing.
    for (name, rt, busy) in [
        ("vt skewed", &p.vt, Busy::Hog),
        ("vt balanced", &p.vt, Busy::Balanced),
        ("vt coop", &p.vt, Busy::Coop),
        ("vt coop, off", &r.unplaced, Busy::Coop),
    ] {
        let before = rt.metrics().per_carrier;
        vt_op(rt, busy);
        let after = rt.metrics().per_carrier;
        let delta = |f: fn(&vt::CarrierMetrics) -> u64| -> Vec<u64> {
            after.iter().enumerate().map(|(i, a)| f(a) - before.get(i).map_or(0, f)).collect()
        };
        println!(
            "  {name}: switches per carrier in one more op {:?}, fibers started {:?}, placed {:?}",
            delta(|c| c.switches),
            delta(|c| c.fibers_started),
            delta(|c| c.fibers_placed)
        );
    }
}
