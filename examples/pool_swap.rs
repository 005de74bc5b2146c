//! Moving a program from a thread pool to virtual threads. Each job fetches a record (a 5 ms
//! blocking wait standing for a remote call) and processes it (hashes 64 KiB). The same jobs
//! and driver run on a hand-written pool of std threads, on `vt::ThreadPool::new(n)` and on
//! `vt::ThreadPool::unbounded()`; only the line that builds the pool differs.
//!
//! Run: `cargo run --release --example pool_swap` (flags: `--jobs N`, default 2000;
//! `--threads N`, the bound of the first two pools, default 16).

use std::hash::{DefaultHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::{Duration, Instant};
use virtual_threads as vt;

#[path = "common/args.rs"]
mod args;

/// The job: the same code on every pool. `vt::sleep` parks a fiber, and on a plain thread it
/// is `std::thread::sleep`.
fn fetch_and_process(id: u64) -> u64 {
    vt::sleep(Duration::from_millis(5)); // the remote call
    let record: Vec<u8> = (0..64 * 1024u64).map(|i| (i ^ id) as u8).collect();
    let mut h = DefaultHasher::new();
    h.write(&record);
    h.finish()
}

/// What the driver needs of a pool: threadpool's two methods.
trait Pool {
    fn execute<F: FnOnce() + Send + 'static>(&self, f: F);
    fn join(&self);
}

impl Pool for vt::ThreadPool {
    fn execute<F: FnOnce() + Send + 'static>(&self, f: F) {
        vt::ThreadPool::execute(self, f)
    }
    fn join(&self) {
        vt::ThreadPool::join(self)
    }
}

/// The thread pool the program started with: n threads taking boxed jobs from a channel.
struct StdPool {
    jobs: mpsc::Sender<Box<dyn FnOnce() + Send>>,
    pending: Arc<(Mutex<usize>, Condvar)>,
}

impl StdPool {
    fn new(n: usize) -> StdPool {
        let (jobs, rx) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let (rx, pending) = (Arc::new(Mutex::new(rx)), Arc::new((Mutex::new(0), Condvar::new())));
        for _ in 0..n {
            let (rx, pending) = (rx.clone(), pending.clone());
            std::thread::spawn(move || {
                loop {
                    // The guard must go before the job runs, or the jobs would run one at a time.
                    let Ok(job) = rx.lock().unwrap().recv() else { break };
                    job();
                    *pending.0.lock().unwrap() -= 1;
                    pending.1.notify_all();
                }
            });
        }
        StdPool { jobs, pending }
    }
}

impl Pool for StdPool {
    fn execute<F: FnOnce() + Send + 'static>(&self, f: F) {
        *self.pending.0.lock().unwrap() += 1;
        self.jobs.send(Box::new(f)).unwrap();
    }
    fn join(&self) {
        let _idle = self.pending.1.wait_while(self.pending.0.lock().unwrap(), |n| *n > 0).unwrap();
    }
}

/// The driver: submit every job, wait for all, report the time and a checksum.
fn run(name: &str, pool: &impl Pool, jobs: u64) -> Duration {
    let checksum = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    for id in 0..jobs {
        let checksum = checksum.clone();
        pool.execute(move || {
            checksum.fetch_add(fetch_and_process(id), Ordering::Relaxed);
        });
    }
    pool.join();
    let (took, sum) = (start.elapsed(), checksum.load(Ordering::Relaxed));
    println!("{name:<30} {:>8.1} ms   checksum {sum:016x}", took.as_secs_f64() * 1e3);
    took
}

fn main() {
    let a = args::parse(
        "pool_swap",
        "the same jobs on std threads, vt::ThreadPool::new(n) and vt::ThreadPool::unbounded()",
        &[
            args::flag("--jobs", "N", "2000", "jobs, each a 5 ms blocking call then hashing 64 KiB"),
            args::flag("--threads", "N", "16", "std threads, and the bound of ThreadPool::new"),
        ],
    );
    let (jobs, n): (u64, usize) = (a.value("--jobs"), a.positive("--threads").unwrap());
    println!("{jobs} jobs, each a 5 ms blocking call then hashing 64 KiB");
    let std = run(&format!("std threads ({n})"), &StdPool::new(n), jobs);
    let bounded = run(&format!("vt::ThreadPool::new({n})"), &vt::ThreadPool::new(n), jobs);
    let unbounded = run("vt::ThreadPool::unbounded()", &vt::ThreadPool::unbounded(), jobs);
    let x = |t: Duration| std.as_secs_f64() / t.as_secs_f64();
    println!("vs std threads: new({n}) {:.1}x, unbounded {:.1}x faster", x(bounded), x(unbounded));
}
