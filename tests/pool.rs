//! `vt::ThreadPool` (the threadpool crate's semantics on fibers) and rayon-style fork-join on
//! `vt::join`. Tests wait on latches, never on sleeps; the sleeps inside jobs only make them
//! park.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use virtual_threads as vt;

/// Opens once `count_up` has been called `target` times; waiters park their fiber (or thread).
struct Latch {
    count: AtomicUsize,
    target: usize,
    waiters: Mutex<Vec<vt::Fiber>>,
}

impl Latch {
    fn new(target: usize) -> Arc<Latch> {
        Arc::new(Latch { count: AtomicUsize::new(0), target, waiters: Mutex::new(Vec::new()) })
    }

    fn count_up(&self) {
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.target {
            for w in std::mem::take(&mut *self.waiters.lock().unwrap()) {
                w.unpark();
            }
        }
    }

    fn is_open(&self) -> bool {
        self.count.load(Ordering::Acquire) >= self.target
    }

    fn wait(&self) {
        while !self.is_open() {
            {
                let mut w = self.waiters.lock().unwrap();
                if self.is_open() {
                    return;
                }
                w.push(vt::current());
            }
            vt::park();
        }
    }
}

/// Counts jobs running at once and remembers the most.
#[derive(Default)]
struct Concurrency {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Concurrency {
    fn enter(&self) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
    }
    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

fn runtime(carriers: usize) -> vt::Runtime {
    vt::Runtime::builder().carriers(carriers).build().unwrap()
}

#[test]
fn bounded_pool_never_runs_more_than_n_and_runs_every_job() {
    let rt = runtime(2);
    rt.block_on(|| {
        let pool = vt::ThreadPool::new(3);
        let c = Arc::new(Concurrency::default());
        let ran = Arc::new(AtomicUsize::new(0));
        for i in 0..300 {
            let (c, ran) = (c.clone(), ran.clone());
            pool.execute(move || {
                c.enter();
                vt::yield_now();
                if i % 3 == 0 {
                    vt::sleep(Duration::from_micros(200));
                }
                vt::yield_now();
                c.leave();
                ran.fetch_add(1, Ordering::Relaxed);
            });
        }
        pool.join();
        assert_eq!(ran.load(Ordering::Relaxed), 300);
        assert!(c.most() <= 3, "{} jobs ran at once in a pool of 3", c.most());
        assert_eq!((pool.active_count(), pool.queued_count(), pool.panic_count()), (0, 0, 0));
    });
}

#[test]
fn submitters_on_many_plain_threads_lose_no_job() {
    let pool = vt::ThreadPool::new(2);
    let ran = Arc::new(AtomicUsize::new(0));
    let c = Arc::new(Concurrency::default());
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (pool, ran, c) = (pool.clone(), ran.clone(), c.clone());
            std::thread::spawn(move || {
                for _ in 0..2000 {
                    let (ran, c) = (ran.clone(), c.clone());
                    pool.execute(move || {
                        c.enter();
                        c.leave();
                        ran.fetch_add(1, Ordering::Relaxed);
                    });
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    pool.join();
    assert_eq!(ran.load(Ordering::Relaxed), 8000);
    assert!(c.most() <= 2);
    assert_eq!((pool.active_count(), pool.queued_count()), (0, 0));
}

#[test]
fn counts_show_running_and_queued_jobs() {
    let rt = runtime(2);
    rt.block_on(|| {
        let pool = vt::ThreadPool::new(2);
        assert_eq!(pool.max_count(), 2);
        let (started, gate) = (Latch::new(2), Latch::new(1));
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..5 {
            let (started, gate, ran) = (started.clone(), gate.clone(), ran.clone());
            pool.execute(move || {
                started.count_up();
                gate.wait();
                ran.fetch_add(1, Ordering::Relaxed);
            });
        }
        started.wait();
        assert_eq!((pool.active_count(), pool.queued_count()), (2, 3));
        gate.count_up();
        pool.join();
        assert_eq!(ran.load(Ordering::Relaxed), 5);
        assert_eq!((pool.active_count(), pool.queued_count()), (0, 0));
    });
}

#[test]
fn panics_are_counted_before_join_returns_and_the_pool_goes_on() {
    let pool = vt::ThreadPool::new(2);
    let ran = Arc::new(AtomicUsize::new(0));
    for round in 1..=3 {
        for i in 0..20 {
            let ran = ran.clone();
            pool.execute(move || {
                if i % 4 == 0 {
                    panic!("job {i} fails on purpose");
                }
                ran.fetch_add(1, Ordering::Relaxed);
            });
        }
        pool.join();
        assert_eq!(pool.panic_count(), 5 * round);
        assert_eq!(ran.load(Ordering::Relaxed), 15 * round);
    }
    let h = pool.spawn(|| -> u32 { panic!("spawned job fails on purpose") });
    assert!(h.join().is_err());
    pool.join();
    assert_eq!(pool.panic_count(), 16);
}

#[test]
fn join_waits_for_queued_jobs_from_several_waiters_and_again() {
    let pool = vt::ThreadPool::new(1);
    let ran = Arc::new(AtomicUsize::new(0));
    let gate = Latch::new(1);
    {
        let gate = gate.clone();
        pool.execute(move || gate.wait());
    }
    for _ in 0..50 {
        let ran = ran.clone();
        pool.execute(move || {
            vt::sleep(Duration::from_micros(50));
            ran.fetch_add(1, Ordering::Relaxed);
        });
    }
    let joined = Latch::new(4);
    let mut waiters: Vec<_> = (0..3)
        .map(|_| {
            let (pool, ran, joined) = (pool.clone(), ran.clone(), joined.clone());
            std::thread::spawn(move || {
                pool.join();
                assert_eq!(ran.load(Ordering::Relaxed), 50);
                joined.count_up();
            })
        })
        .collect();
    let fiber = {
        let (pool, ran, joined) = (pool.clone(), ran.clone(), joined.clone());
        vt::spawn(move || {
            pool.join();
            assert_eq!(ran.load(Ordering::Relaxed), 50);
            joined.count_up();
        })
    };
    assert!(!joined.is_open());
    gate.count_up();
    pool.join();
    assert_eq!(ran.load(Ordering::Relaxed), 50);
    joined.wait();
    for w in waiters.drain(..) {
        w.join().unwrap();
    }
    fiber.join().unwrap();
    pool.join(); // idle: returns at once
}

#[test]
fn scope_jobs_borrow_and_a_panic_surfaces_at_the_end() {
    let pool = vt::ThreadPool::new(2);
    let mut squares = vec![0u64; 100];
    let base = 3u64;
    pool.scope(|s| {
        for (i, sq) in squares.iter_mut().enumerate() {
            let base = &base;
            s.execute(move || {
                vt::yield_now();
                *sq = i as u64 * i as u64 + base;
            });
        }
    });
    assert!(squares.iter().enumerate().all(|(i, &v)| v == (i * i) as u64 + 3));

    let finished = AtomicUsize::new(0);
    let r = catch_unwind(AssertUnwindSafe(|| {
        pool.scope(|s| {
            for i in 0..10 {
                let finished = &finished;
                s.execute(move || {
                    vt::sleep(Duration::from_micros(100));
                    assert!(i != 7, "scoped job {i} fails on purpose");
                    finished.fetch_add(1, Ordering::Relaxed);
                });
            }
        })
    }));
    assert!(r.is_err());
    // Every other job finished before the scope returned.
    assert_eq!(finished.load(Ordering::Relaxed), 9);
    assert_eq!(pool.panic_count(), 1);
}

#[derive(Debug, PartialEq)]
struct Payload(u32);

/// rayon's scope resumes the first panic's own payload; so do ours (std's panics with a message
/// of its own). A fiber joined through its handle gives its panic to the joiner instead.
#[test]
fn scopes_resume_the_first_panics_own_payload() {
    let rt = runtime(2);
    let payload =
        |r: std::thread::Result<()>| *r.expect_err("the scope panics").downcast::<Payload>().unwrap();
    let ran = AtomicUsize::new(0);
    let r = catch_unwind(AssertUnwindSafe(|| {
        rt.block_on(|| {
            vt::scope(|s| {
                s.spawn(|| std::panic::panic_any(Payload(7)));
                for _ in 0..10 {
                    s.spawn(|| ran.fetch_add(1, Ordering::Relaxed));
                }
            })
        })
    }));
    assert_eq!(payload(r), Payload(7));
    assert_eq!(ran.load(Ordering::Relaxed), 10, "the other fibers finished first");

    // Several panics: one of theirs comes out, never a message of the runtime's.
    let r = catch_unwind(AssertUnwindSafe(|| {
        vt::scope(|s| {
            for i in 0..4 {
                s.spawn(move || std::panic::panic_any(Payload(i)));
            }
        })
    }));
    assert!(payload(r).0 < 4);

    // Joined: the joiner has the payload, and the scope returns normally.
    let joined = vt::scope(|s| s.spawn(|| std::panic::panic_any(Payload(3))).join());
    assert_eq!(*joined.unwrap_err().downcast::<Payload>().unwrap(), Payload(3));

    // The caller's own panic wins over its fibers'.
    let r = catch_unwind(AssertUnwindSafe(|| {
        vt::scope(|s| {
            s.spawn(|| std::panic::panic_any(Payload(1)));
            std::panic::panic_any(Payload(2));
        })
    }));
    assert_eq!(payload(r), Payload(2));

    // A pool's scope too.
    let pool = vt::ThreadPool::new(2);
    let r = catch_unwind(AssertUnwindSafe(|| {
        pool.scope(|s| {
            s.execute(|| std::panic::panic_any(Payload(9)));
            s.execute(|| {
                ran.fetch_add(1, Ordering::Relaxed);
            });
        })
    }));
    assert_eq!(payload(r), Payload(9));
    assert_eq!((pool.panic_count(), ran.load(Ordering::Relaxed)), (1, 11));
}

/// rayon's `s.spawn(|s| ...)` becomes `s.spawn(|| ...)` with the scope captured (`arch/guide.md`'s
/// before/after): nested spawns borrow from the caller like rayon's.
#[test]
fn rayon_style_nested_spawns_capture_the_scope() {
    let mut leaves = [0u32; 4];
    let (a, b) = leaves.split_at_mut(2);
    vt::scope(|s| {
        s.spawn(|| {
            a[0] = 1;
            s.spawn(|| a[1] = 2);
        });
        s.spawn(|| b.iter_mut().for_each(|x| *x = 3));
    });
    assert_eq!(leaves, [1, 2, 3, 3]);
}

#[test]
fn set_num_threads_raises_and_lowers_the_bound() {
    let rt = runtime(2);
    rt.block_on(|| {
        let pool = vt::ThreadPool::new(1);
        let (started, gate) = (Latch::new(4), Latch::new(1));
        for _ in 0..4 {
            let (started, gate) = (started.clone(), gate.clone());
            pool.execute(move || {
                started.count_up();
                gate.wait();
            });
        }
        assert_eq!(pool.queued_count(), 3);
        pool.set_num_threads(4); // starts the three queued jobs
        started.wait();
        assert_eq!((pool.active_count(), pool.queued_count(), pool.max_count()), (4, 0, 4));

        pool.set_num_threads(2);
        assert_eq!(pool.max_count(), 2);
        let c = Arc::new(Concurrency::default());
        for _ in 0..40 {
            let c = c.clone();
            pool.execute(move || {
                c.enter();
                vt::sleep(Duration::from_micros(100));
                c.leave();
            });
        }
        gate.count_up();
        pool.join();
        assert!(c.most() <= 2, "{} jobs ran at once after lowering the bound to 2", c.most());
        assert_eq!(pool.active_count(), 0);
    });
}

#[test]
fn unbounded_pool_runs_10_000_parking_jobs() {
    let pool = vt::ThreadPool::unbounded();
    assert_eq!(pool.max_count(), usize::MAX);
    let ran = Arc::new(AtomicUsize::new(0));
    for _ in 0..10_000 {
        let ran = ran.clone();
        pool.execute(move || {
            vt::sleep(Duration::from_millis(1));
            ran.fetch_add(1, Ordering::Relaxed);
        });
    }
    pool.join();
    assert_eq!(ran.load(Ordering::Relaxed), 10_000);
    assert_eq!(pool.queued_count(), 0);
}

#[test]
fn spawn_returns_results_and_waits_for_a_slot_when_full() {
    let rt = runtime(2);
    rt.block_on(|| {
        let pool = vt::ThreadPool::new(2);
        let c = Arc::new(Concurrency::default());
        let handles: Vec<_> = (0..40u64)
            .map(|i| {
                let c = c.clone();
                pool.spawn(move || {
                    c.enter();
                    vt::yield_now();
                    vt::sleep(Duration::from_micros(50));
                    c.leave();
                    i * 2
                })
            })
            .collect();
        let sum: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(sum, 39 * 40);
        assert!(c.most() <= 2);
        pool.join();
        assert_eq!((pool.active_count(), pool.queued_count()), (0, 0));

        let unbounded = vt::ThreadPool::unbounded();
        let h = unbounded.spawn(|| vt::current().id());
        assert!(h.join().is_ok());
    });
}

#[test]
fn dropping_a_pool_with_queued_jobs_still_runs_them() {
    struct Token(Arc<Latch>);
    impl Drop for Token {
        fn drop(&mut self) {
            self.0.count_up();
        }
    }
    let (gate, gone) = (Latch::new(1), Latch::new(11));
    let ran = Arc::new(AtomicUsize::new(0));
    let pool = vt::ThreadPool::new(1);
    {
        let (gate, token) = (gate.clone(), Token(gone.clone()));
        pool.execute(move || {
            gate.wait();
            drop(token);
        });
    }
    for _ in 0..10 {
        let (ran, token) = (ran.clone(), Token(gone.clone()));
        pool.execute(move || {
            ran.fetch_add(1, Ordering::Relaxed);
            drop(token);
        });
    }
    drop(pool);
    gate.count_up();
    gone.wait(); // every job ran and its closure is gone
    assert_eq!(ran.load(Ordering::Relaxed), 10);
}

#[test]
fn jobs_run_on_the_runtime_the_pool_was_built_on() {
    let rt = vt::Runtime::builder().carriers(1).thread_name("pool-home").build().unwrap();
    let on_home = || std::thread::current().name().is_some_and(|n| n.starts_with("pool-home"));
    // Built inside a fiber of `rt`, used from a plain thread.
    let pool = rt.block_on(|| vt::ThreadPool::new(2));
    assert!(pool.spawn(on_home).join().unwrap());
    // Built on a plain thread, pointed at `rt` by the builder.
    let pool = vt::ThreadPoolBuilder::new().num_threads(1).handle(rt.handle()).build();
    assert!(pool.spawn(on_home).join().unwrap());
}

/// threadpool's own idioms, as its tests write them: names are `String`s, so `"x".into()`
/// must infer (with `impl Into<String>` it did not: E0283), and the deprecated names stay.
#[test]
#[allow(deprecated)]
fn threadpools_idioms_compile_and_mean_what_they_mean() {
    let named =
        |pool: &vt::ThreadPool| pool.spawn(|| vt::current().name().map(str::to_owned)).join().unwrap();
    let pool = vt::ThreadPool::with_name("w".into(), 2);
    assert_eq!(named(&pool).as_deref(), Some("w"));
    assert_eq!(pool.max_count(), 2);
    // threadpool's text, field for field and in its order (its own test compares it).
    assert_eq!(
        format!("{pool:?}"),
        r#"ThreadPool { name: Some("w"), queued_count: 0, active_count: 0, max_count: 2 }"#
    );

    let pool = vt::ThreadPoolBuilder::new().thread_name("b".into()).num_threads(3).build();
    assert_eq!((named(&pool).as_deref(), pool.max_count()), (Some("b"), 3));

    let pool = vt::ThreadPool::new_with_name("old".into(), 1);
    assert_eq!((named(&pool).as_deref(), pool.max_count()), (Some("old"), 1));
    pool.set_threads(4);
    assert_eq!(pool.max_count(), 4);

    // One job per CPU, as threadpool's `default()`; never unbounded, never zero.
    let pool = vt::ThreadPool::default();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!((1..=cpus).contains(&pool.max_count()), "{} of {cpus}", pool.max_count());
    assert_eq!(
        format!("{pool:?}"),
        format!(
            "ThreadPool {{ name: None, queued_count: 0, active_count: 0, max_count: {} }}",
            pool.max_count()
        )
    );
    // A running job is active, one behind it queued.
    let pool = vt::ThreadPool::new(1);
    let (go_tx, go_rx) = vt::channel::bounded::<()>(0);
    let (started_tx, started_rx) = vt::channel::bounded::<()>(0);
    pool.execute(move || {
        started_tx.send(()).unwrap();
        go_rx.recv().unwrap();
    });
    started_rx.recv().unwrap();
    pool.execute(|| {});
    assert_eq!(
        format!("{pool:?}"),
        "ThreadPool { name: None, queued_count: 1, active_count: 1, max_count: 1 }"
    );
    go_tx.send(()).unwrap();
    pool.join();
    assert_eq!(named(&pool), None);
}

#[test]
#[should_panic(expected = "at least one thread")]
fn a_pool_of_zero_panics() {
    let _ = vt::ThreadPool::new(0);
}

/// Divide-and-conquer code written for `rayon::join`.
fn sum(xs: &[u64]) -> u64 {
    if xs.len() <= 1024 {
        return xs.iter().sum();
    }
    let (a, b) = xs.split_at(xs.len() / 2);
    let (x, y) = vt::join(|| sum(a), || sum(b));
    x + y
}

/// rayon's quicksort demo, on `vt::join`.
fn quicksort(v: &mut [u32]) {
    if v.len() <= 256 {
        v.sort_unstable();
        return;
    }
    let pivot = v[v.len() / 2];
    let mut lo = 0;
    for i in 0..v.len() {
        if v[i] < pivot {
            v.swap(i, lo);
            lo += 1;
        }
    }
    let (left, right) = v.split_at_mut(lo);
    let mut eq = 0;
    for i in 0..right.len() {
        if right[i] == pivot {
            right.swap(i, eq);
            eq += 1;
        }
    }
    vt::join(|| quicksort(left), || quicksort(&mut right[eq..]));
}

#[test]
fn recursive_fork_join_on_one_and_two_carriers() {
    let xs: Vec<u64> = (0..500_000).collect();
    let mut data: Vec<u32> = (0..100_000u32).map(|i| i.wrapping_mul(2_654_435_761) % 10_007).collect();
    let mut sorted = data.clone();
    sorted.sort_unstable();
    for carriers in [1, 2] {
        let rt = runtime(carriers);
        let total = rt.block_on(|| sum(&xs));
        assert_eq!(total, 499_999 * 500_000 / 2, "on {carriers} carrier(s)");
        let mut v = data.clone();
        rt.block_on(|| quicksort(&mut v));
        assert_eq!(v, sorted, "on {carriers} carrier(s)");
    }
    // From a plain thread, on the default runtime.
    assert_eq!(sum(&xs), 499_999 * 500_000 / 2);
    quicksort(&mut data);
    assert_eq!(data, sorted);
}

/// Runs `join` on a plain thread; the receiver hears when it returned.
fn join_on_a_thread(pool: &vt::ThreadPool) -> std::sync::mpsc::Receiver<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let pool = pool.clone();
    std::thread::spawn(move || {
        pool.join();
        let _ = tx.send(());
    });
    rx
}

/// A pool's runtime dropped with jobs pending: they will never finish, and `join` returns
/// instead of waiting for ever, whether it was waiting when the runtime went or came after.
#[test]
fn join_returns_once_the_pools_runtime_is_dropped() {
    for join_first in [true, false] {
        let rt = runtime(2);
        let pool = vt::ThreadPoolBuilder::new().num_threads(2).handle(rt.handle()).build();
        let started = Latch::new(2);
        for _ in 0..8 {
            let started = started.clone();
            // Two run (and park for ever), six wait in the queue for a slot.
            pool.execute(move || {
                started.count_up();
                vt::sleep(Duration::from_secs(3600));
            });
        }
        started.wait();
        let waiting = join_first.then(|| join_on_a_thread(&pool));
        drop(rt);
        let joined = waiting.unwrap_or_else(|| join_on_a_thread(&pool));
        assert!(
            joined.recv_timeout(Duration::from_secs(20)).is_ok(),
            "join returned (join first: {join_first})"
        );
    }
}
