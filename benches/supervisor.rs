//! What the supervisor costs and how fast it compensates.
//!
//! 1. Overhead with nothing blocking: W1 (fork_join) and W5 (yield_many) on a runtime whose
//!    supervisor samples every 10 ms (the default) against one whose supervisor effectively never
//!    samples (an interval of an hour), interleaved in one run; medians.
//! 2. Compensation latency: on a 1-carrier runtime a fiber blocks its carrier in
//!    `std::thread::sleep`; a fiber queued behind it records when it starts. Reported for an
//!    unknown location (detection: target under 2 intervals) and, after the location has been
//!    learned, for a known-blocking one (target under 100 µs).
//!
//! Run: `cargo bench --bench supervisor`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use virtual_threads as vt;

mod common;
use common::{median, w1};

fn w5(rt: &vt::Runtime) -> Duration {
    let t = Instant::now();
    rt.block_on(|| {
        let hs: Vec<_> = (0..1000)
            .map(|_| {
                vt::spawn(|| {
                    for _ in 0..1000 {
                        vt::yield_now();
                    }
                })
            })
            .collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
    });
    t.elapsed()
}

/// Every blocker comes from this one spawn site, so it can become known-blocking.
fn spawn_blocker(rt: &vt::Runtime, began: Arc<AtomicU64>, epoch: Instant) -> vt::JoinHandle<()> {
    rt.spawn(move || {
        began.store(epoch.elapsed().as_nanos() as u64, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(60));
    })
}

/// Time from a blocker starting to the first fiber queued behind it running. Starts once the
/// spares of the previous round have retired, so only compensation can explain the time.
fn compensation_latency(rt: &vt::Runtime) -> Duration {
    while rt.metrics().carriers_current > rt.metrics().carriers_target {
        std::thread::sleep(Duration::from_millis(1));
    }
    let epoch = Instant::now();
    let began = Arc::new(AtomicU64::new(0));
    let blocker = spawn_blocker(rt, began.clone(), epoch);
    let behind = rt.spawn(move || epoch.elapsed().as_nanos() as u64);
    let ran = behind.join().unwrap();
    blocker.join().unwrap();
    Duration::from_nanos(ran.saturating_sub(began.load(Ordering::SeqCst)))
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` and criterion-style listing: nothing to run
    }
    let carriers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let on = vt::Runtime::builder().carriers(carriers).build().unwrap();
    let off = vt::Runtime::builder()
        .carriers(carriers)
        .supervisor_interval(Duration::from_secs(3600))
        .build()
        .unwrap();
    for (name, op) in [("W1 fork_join", w1 as fn(&vt::Runtime) -> Duration), ("W5 yield_many", w5)] {
        for _ in 0..3 {
            op(&on);
            op(&off);
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..21 {
            a.push(op(&on));
            b.push(op(&off));
        }
        let (a, b) = (median(a), median(b));
        println!(
            "{name:14} supervisor on {:>9.3} ms  off {:>9.3} ms  (on/off = {:.3})",
            a.as_secs_f64() * 1e3,
            b.as_secs_f64() * 1e3,
            a.as_secs_f64() / b.as_secs_f64()
        );
    }
    drop((on, off));

    let interval = Duration::from_millis(10);
    let rt =
        vt::Runtime::builder().carriers(1).max_carriers(8).supervisor_interval(interval).build().unwrap();
    let unknown: Vec<_> = (0..9).map(|_| compensation_latency(&rt)).collect();
    // Learn the location: more than 64 runs, most of them caught.
    let epoch = Instant::now();
    let hs: Vec<_> = (0..80).map(|_| spawn_blocker(&rt, Arc::new(AtomicU64::new(0)), epoch)).collect();
    hs.into_iter().for_each(|h| h.join().unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    while rt.metrics().known_blocking.is_empty() && Instant::now() < deadline {
        std::thread::sleep(interval);
    }
    let known: Vec<_> = (0..9).map(|_| compensation_latency(&rt)).collect();
    println!(
        "compensation latency, supervisor_interval {interval:?}: unknown location median {:?} (target < {:?}); \
         known-blocking location median {:?} (target < 100µs; known: {})",
        median(unknown),
        interval * 2,
        median(known),
        !rt.metrics().known_blocking.is_empty()
    );
}
