//! Short OS-blocking calls from fibers: each call blocks its carrier for a few milliseconds and
//! then switches, so no carrier ever stalls for a whole supervisor interval, yet the carriers
//! spend nearly all their time asleep in the kernel while fibers wait. The supervisor must see
//! that from the carriers' off-CPU time (`arch/supervisor.md`) and compensate.
//!
//! Two runs, each beside its peer in the same process:
//! 1. `--fibers` fibers (default 10,000) each calling `std::thread::sleep(--ms)` on a runtime of
//!    `--carriers` carriers (default 2); the peer is the time a perfect pool of `max_carriers`
//!    (256) threads would take.
//! 2. `vt::ThreadPool::new(--pool)` (default 64) running `10 × --pool` jobs of `--ms` of OS
//!    blocking, against `--pool` std threads running the same jobs, alternated `--rounds` times;
//!    the median ratio is printed.
//!
//! Run: `cargo run --release --example short_blocking`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};
use virtual_threads as vt;

#[path = "common/args.rs"]
mod args;
#[path = "common/bench.rs"]
mod bench;

/// 10,000 fibers × one short OS sleep each, on their own runtime.
fn fibers(n: usize, carriers: usize, block: Duration) -> (Duration, usize) {
    let rt = vt::Runtime::builder().carriers(carriers).build().expect("runtime");
    let done = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let d = done.clone();
    rt.block_on(move || {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let d = d.clone();
                vt::spawn(move || {
                    std::thread::sleep(block);
                    d.fetch_add(1, Ordering::Relaxed);
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
    let took = start.elapsed();
    let peak = rt.metrics().carriers_peak;
    assert_eq!(done.load(Ordering::Relaxed), n);
    (took, peak)
}

/// `jobs` jobs of `block` each on `vt::ThreadPool::new(size)`, on its own runtime.
fn vt_pool(size: usize, jobs: usize, block: Duration) -> Duration {
    let rt = vt::Runtime::builder().build().expect("runtime");
    rt.block_on(move || {
        let pool = vt::ThreadPool::new(size);
        let start = Instant::now();
        for _ in 0..jobs {
            pool.execute(move || std::thread::sleep(block));
        }
        pool.join();
        start.elapsed()
    })
}

/// The same jobs on `size` plain threads taking them from a channel.
fn std_pool(size: usize, jobs: usize, block: Duration) -> Duration {
    let (tx, rx) = mpsc::channel::<()>();
    let rx = Arc::new(std::sync::Mutex::new(rx));
    let start = Instant::now();
    for _ in 0..jobs {
        tx.send(()).unwrap();
    }
    drop(tx);
    let threads: Vec<_> = (0..size)
        .map(|_| {
            let rx = rx.clone();
            std::thread::spawn(move || {
                while rx.lock().unwrap().recv().is_ok() {
                    std::thread::sleep(block);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    start.elapsed()
}

fn main() {
    let a = args::parse(
        "short_blocking",
        "short OS-blocking calls from fibers: 10,000 fibers on 2 carriers, and a pool against std threads",
        &[
            args::flag("--fibers", "N", "10000", "fibers, each one std::thread::sleep"),
            args::flag("--carriers", "N", "2", "carriers of the fibers' runtime"),
            args::flag("--ms", "N", "10", "milliseconds each call blocks"),
            args::flag("--pool", "N", "64", "the pool's bound and the std threads' count (jobs: 10x)"),
            args::flag("--rounds", "N", "5", "alternated rounds of the pool run"),
        ],
    );
    let block = Duration::from_millis(a.value("--ms"));
    let (n, carriers) = (a.value::<usize>("--fibers"), a.positive("--carriers").unwrap());
    let (size, rounds) = (a.positive("--pool").unwrap(), a.positive("--rounds").unwrap());
    let (took, peak) = fibers(n, carriers, block);
    let ideal = block * n.div_ceil(256) as u32;
    println!(
        "{n} fibers x std::thread::sleep({} ms) on {carriers} carriers: {:.2} s (peak {peak} carriers; \
         256 threads would take {:.2} s)",
        block.as_millis(),
        took.as_secs_f64(),
        ideal.as_secs_f64()
    );
    let jobs = 10 * size;
    let (mut vts, mut stds, mut ratios) = (vec![], vec![], vec![]);
    for _ in 0..rounds {
        let s = std_pool(size, jobs, block).as_secs_f64();
        let v = vt_pool(size, jobs, block).as_secs_f64();
        stds.push(s);
        vts.push(v);
        ratios.push(v / s);
    }
    println!(
        "{jobs} jobs x {} ms OS blocking: vt::ThreadPool::new({size}) {:.0} ms, {size} std threads {:.0} ms \
         (medians of {rounds} alternated rounds); vt/std {:.2}x",
        block.as_millis(),
        bench::spread(vts).median * 1e3,
        bench::spread(stds).median * 1e3,
        bench::spread(ratios).median
    );
}
