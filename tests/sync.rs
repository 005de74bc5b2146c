//! `vt::sync` under fibers, plain threads and both mixed. No sleeps paper over races: every
//! test synchronises; timing-dependent checks use generous bounds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use virtual_threads as vt;
use vt::sync::{Barrier, Condvar, Mutex, OnceLock, RwLock, Semaphore, TryLockError, WaitGroup};

fn rt() -> vt::Runtime {
    vt::Runtime::builder().carriers(2).build().unwrap()
}

/// A tiny xorshift, so that each fiber yields at its own pseudo-random points.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn mutex_count_is_exact_under_random_yields() {
    const FIBERS: u64 = 1_000;
    const INCREMENTS: u64 = 1_000;
    let count = Arc::new(Mutex::new(0u64));
    rt().block_on(|| {
        let handles: Vec<_> = (0..FIBERS)
            .map(|f| {
                let count = count.clone();
                vt::spawn(move || {
                    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (f + 1).wrapping_mul(0x1234_5678_9ABC_DEF1));
                    for _ in 0..INCREMENTS {
                        let r = rng.next();
                        if r % 8 == 0 {
                            vt::yield_now();
                        }
                        let mut guard = count.lock().unwrap();
                        let seen = *guard;
                        if r % 64 == 1 {
                            // Yield while holding the lock: others must queue and wait.
                            vt::yield_now();
                        }
                        *guard = seen + 1;
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
    assert_eq!(*count.lock().unwrap(), FIBERS * INCREMENTS);
}

#[test]
fn mutex_fibers_and_threads_mixed() {
    let count = Arc::new(Mutex::new(0usize));
    rt().block_on(|| {
        let fibers: Vec<_> = (0..8)
            .map(|_| {
                let count = count.clone();
                vt::spawn(move || {
                    for _ in 0..5_000 {
                        *count.lock().unwrap() += 1;
                    }
                })
            })
            .collect();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let count = count.clone();
                std::thread::spawn(move || {
                    for _ in 0..5_000 {
                        *count.lock().unwrap() += 1;
                    }
                })
            })
            .collect();
        fibers.into_iter().for_each(|h| h.join().unwrap());
        threads.into_iter().for_each(|h| h.join().unwrap());
    });
    assert_eq!(*count.lock().unwrap(), 12 * 5_000);
}

#[test]
fn mutex_try_lock_and_accessors() {
    let mut m = Mutex::new(vec![1]);
    {
        let guard = m.lock().unwrap();
        assert!(matches!(m.try_lock(), Err(TryLockError::WouldBlock)));
        assert_eq!(*guard, vec![1]);
    }
    m.try_lock().unwrap().push(2);
    m.get_mut().unwrap().push(3);
    assert_eq!(format!("{m:?}"), "Mutex { data: [1, 2, 3], poisoned: false, .. }");
    assert_eq!(m.into_inner().unwrap(), vec![1, 2, 3]);
}

#[test]
fn mutex_poisoning() {
    let m = Arc::new(Mutex::new(1));
    let m2 = m.clone();
    let joined = rt().block_on(move || {
        vt::spawn(move || {
            let _guard = m2.lock().unwrap();
            panic!("poison it");
        })
        .join()
    });
    assert!(joined.is_err());
    assert!(m.is_poisoned());
    let err = m.lock().unwrap_err();
    assert_eq!(**err.get_ref(), 1);
    drop(err);
    assert!(matches!(m.try_lock(), Err(TryLockError::Poisoned(_))));
    m.clear_poison();
    assert_eq!(*m.lock().unwrap(), 1);
    // A panic that started before the lock was taken does not poison it.
    let m3 = Arc::new(Mutex::new(0));
    struct LockOnDrop(Arc<Mutex<i32>>);
    impl Drop for LockOnDrop {
        fn drop(&mut self) {
            *self.0.lock().unwrap() += 1;
        }
    }
    let m4 = m3.clone();
    let _ = std::thread::spawn(move || {
        let _d = LockOnDrop(m4);
        panic!("unwinding");
    })
    .join();
    assert!(!m3.is_poisoned());
    assert_eq!(Arc::try_unwrap(m3).unwrap().into_inner().unwrap(), 1);
}

#[test]
fn condvar_producer_consumer() {
    const ITEMS: usize = 20_000;
    struct Queue {
        items: Mutex<std::collections::VecDeque<usize>>,
        not_empty: Condvar,
        not_full: Condvar,
    }
    let q = Arc::new(Queue {
        items: Mutex::new(Default::default()),
        not_empty: Condvar::new(),
        not_full: Condvar::new(),
    });
    let ((s1, n1), p2, c2) = rt().block_on(|| {
        // Two producers (a fiber and a thread), two consumers (likewise); capacity 4.
        let produce = |q: Arc<Queue>, base: usize| {
            move || {
                for i in 0..ITEMS / 2 {
                    let mut items = q.not_full.wait_while(q.items.lock().unwrap(), |v| v.len() >= 4).unwrap();
                    items.push_back(base + i);
                    drop(items);
                    q.not_empty.notify_one();
                }
            }
        };
        let consume = |q: Arc<Queue>| {
            move || {
                let (mut sum, mut count) = (0usize, 0usize);
                for _ in 0..ITEMS / 2 {
                    let mut items =
                        q.not_empty.wait_while(q.items.lock().unwrap(), |v| v.is_empty()).unwrap();
                    sum += items.pop_front().unwrap();
                    count += 1;
                    drop(items);
                    q.not_full.notify_one();
                }
                (sum, count)
            }
        };
        let p1 = vt::spawn(produce(q.clone(), 0));
        let p2 = std::thread::spawn(produce(q.clone(), ITEMS / 2));
        let c1 = vt::spawn(consume(q.clone()));
        let c2 = std::thread::spawn(consume(q.clone()));
        p1.join().unwrap();
        // The threads are joined outside: `std`'s join would block this fiber's carrier, and
        // the fibers at home there with it (the consumer the producer thread waits for).
        (c1.join().unwrap(), p2, c2)
    });
    p2.join().unwrap();
    let (s2, n2) = c2.join().unwrap();
    let (sum, count) = (s1 + s2, n1 + n2);
    assert_eq!(count, ITEMS);
    assert_eq!(sum, ITEMS * (ITEMS - 1) / 2);
}

#[test]
fn condvar_wait_timeout_and_notify_all() {
    let m = Mutex::new(0);
    let cv = Condvar::new();
    let start = Instant::now();
    let (guard, res) = cv.wait_timeout(m.lock().unwrap(), Duration::from_millis(20)).unwrap();
    assert!(res.timed_out());
    assert!(start.elapsed() >= Duration::from_millis(20));
    drop(guard);
    let (guard, res) =
        cv.wait_timeout_while(m.lock().unwrap(), Duration::from_secs(10), |v| *v != 0).unwrap();
    assert!(!res.timed_out(), "condition already false");
    drop(guard);

    let shared = Arc::new((Mutex::new(false), Condvar::new(), AtomicUsize::new(0)));
    rt().block_on(|| {
        let waiters: Vec<_> = (0..16)
            .map(|_| {
                let shared = shared.clone();
                vt::spawn(move || {
                    let (m, cv, woke) = &*shared;
                    let _g = cv.wait_while(m.lock().unwrap(), |go| !*go).unwrap();
                    woke.fetch_add(1, Ordering::Relaxed);
                })
            })
            .collect();
        *shared.0.lock().unwrap() = true;
        shared.1.notify_all();
        waiters.into_iter().for_each(|h| h.join().unwrap());
    });
    assert_eq!(shared.2.load(Ordering::Relaxed), 16);
}

#[test]
fn condvar_notify_one_is_never_swallowed_by_a_timeout() {
    // A consumer waits with tiny timeouts while a producer posts tokens with notify_one; every
    // token must be consumed (a timeout that races the notify must not lose it).
    const TOKENS: usize = 2_000;
    let shared = Arc::new((Mutex::new(0usize), Condvar::new()));
    rt().block_on(|| {
        let consumer = {
            let shared = shared.clone();
            vt::spawn(move || {
                let (m, cv) = &*shared;
                let mut taken = 0;
                let mut guard = m.lock().unwrap();
                while taken < TOKENS {
                    if *guard > 0 {
                        *guard -= 1;
                        taken += 1;
                        continue;
                    }
                    guard = cv.wait_timeout(guard, Duration::from_micros(50)).unwrap().0;
                }
                taken
            })
        };
        let (m, cv) = &*shared;
        for i in 0..TOKENS {
            *m.lock().unwrap() += 1;
            cv.notify_one();
            if i % 16 == 0 {
                vt::yield_now();
            }
        }
        assert_eq!(consumer.join().unwrap(), TOKENS);
    });
}

#[test]
fn rwlock_readers_share_writers_exclude() {
    const READERS: usize = 6;
    let lock = Arc::new(RwLock::new(0usize));
    rt().block_on(|| {
        // Every reader must be inside at once to pass the barrier: reads are concurrent.
        let barrier = Arc::new(Barrier::new(READERS));
        let mut fibers = Vec::new();
        let mut threads = Vec::new();
        for i in 0..READERS {
            let (lock, barrier) = (lock.clone(), barrier.clone());
            let body = move || {
                let guard = lock.read().unwrap();
                barrier.wait();
                *guard
            };
            if i % 2 == 0 {
                fibers.push(vt::spawn(body));
            } else {
                threads.push(std::thread::spawn(body));
            }
        }
        fibers.into_iter().for_each(|h| assert_eq!(h.join().unwrap(), 0));
        threads.into_iter().for_each(|h| assert_eq!(h.join().unwrap(), 0));

        // Writers exclude readers and each other.
        let active = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let (lock, active) = (lock.clone(), active.clone());
                vt::spawn(move || {
                    for n in 0..500 {
                        if (i + n) % 4 == 0 {
                            let mut guard = lock.write().unwrap();
                            assert_eq!(active.fetch_add(1000, Ordering::SeqCst), 0);
                            if n % 50 == 0 {
                                vt::yield_now();
                            }
                            *guard += 1;
                            active.fetch_sub(1000, Ordering::SeqCst);
                        } else {
                            let _guard = lock.read().unwrap();
                            assert!(active.fetch_add(1, Ordering::SeqCst) < 1000);
                            if n % 50 == 1 {
                                vt::yield_now();
                            }
                            active.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().for_each(|h| h.join().unwrap());
    });
    assert_eq!(*lock.read().unwrap(), 16 * 500 / 4);
    assert!(lock.try_write().is_ok());
    let r = lock.read().unwrap();
    assert!(lock.try_read().is_ok());
    assert!(matches!(lock.try_write(), Err(TryLockError::WouldBlock)));
    drop(r);
}

#[test]
fn rwlock_poisoning_by_writers_only() {
    let lock = Arc::new(RwLock::new(5));
    let l2 = lock.clone();
    let _ = std::thread::spawn(move || {
        let _r = l2.read().unwrap();
        panic!("reader panics");
    })
    .join();
    assert!(!lock.is_poisoned());
    let l3 = lock.clone();
    let joined = rt().block_on(move || {
        vt::spawn(move || {
            let _w = l3.write().unwrap();
            panic!("writer panics");
        })
        .join()
    });
    assert!(joined.is_err());
    assert!(lock.is_poisoned());
    assert_eq!(*lock.read().unwrap_err().into_inner(), 5);
    lock.clear_poison();
    assert_eq!(*lock.write().unwrap(), 5);
}

#[test]
fn semaphore_bound_is_never_exceeded() {
    const LIMIT: usize = 3;
    let sem = Arc::new(Semaphore::new(LIMIT));
    let active = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    rt().block_on(|| {
        let mut fibers = Vec::new();
        let mut threads = Vec::new();
        for i in 0..40 {
            let (sem, active, peak) = (sem.clone(), active.clone(), peak.clone());
            let body = move || {
                for n in 0..200 {
                    let permit = if n % 3 == 0 {
                        match sem.acquire_timeout(Duration::from_micros(20)) {
                            Some(p) => p,
                            None => continue,
                        }
                    } else {
                        sem.acquire()
                    };
                    let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(now <= LIMIT, "{now} holders");
                    peak.fetch_max(now, Ordering::SeqCst);
                    if n % 7 == 0 {
                        vt::yield_now();
                    }
                    active.fetch_sub(1, Ordering::SeqCst);
                    drop(permit);
                }
            };
            if i % 8 == 0 {
                threads.push(std::thread::spawn(body));
            } else {
                fibers.push(vt::spawn(body));
            }
        }
        fibers.into_iter().for_each(|h| h.join().unwrap());
        threads.into_iter().for_each(|h| h.join().unwrap());
    });
    assert!(peak.load(Ordering::SeqCst) >= 1);
    // Permits are conserved, even across timeouts that raced a release.
    assert_eq!(sem.available_permits(), LIMIT);
    let p = sem.try_acquire().unwrap();
    p.forget();
    assert_eq!(sem.available_permits(), LIMIT - 1);
    sem.release();
    assert_eq!(sem.available_permits(), LIMIT);
}

#[test]
fn barrier_with_fibers_and_threads_mixed() {
    const PARTIES: usize = 8;
    const ROUNDS: usize = 50;
    let barrier = Arc::new(Barrier::new(PARTIES));
    let arrived = Arc::new(AtomicUsize::new(0));
    let leaders = Arc::new(AtomicUsize::new(0));
    rt().block_on(|| {
        let mut fibers = Vec::new();
        let mut threads = Vec::new();
        for i in 0..PARTIES {
            let (barrier, arrived, leaders) = (barrier.clone(), arrived.clone(), leaders.clone());
            let body = move || {
                for round in 0..ROUNDS {
                    arrived.fetch_add(1, Ordering::SeqCst);
                    if barrier.wait().is_leader() {
                        leaders.fetch_add(1, Ordering::SeqCst);
                    }
                    // Nobody leaves a generation before everyone has arrived in it.
                    assert!(arrived.load(Ordering::SeqCst) >= (round + 1) * PARTIES);
                    barrier.wait();
                }
            };
            if i % 2 == 0 {
                fibers.push(vt::spawn(body));
            } else {
                threads.push(std::thread::spawn(body));
            }
        }
        fibers.into_iter().for_each(|h| h.join().unwrap());
        threads.into_iter().for_each(|h| h.join().unwrap());
    });
    assert_eq!(leaders.load(Ordering::SeqCst), ROUNDS);
    assert!(Barrier::new(1).wait().is_leader());
}

#[test]
fn wait_group_waits_for_every_member() {
    let done = Arc::new(AtomicUsize::new(0));
    rt().block_on(|| {
        for _ in 0..5 {
            let wg = WaitGroup::new();
            for i in 0..100 {
                let (wg, done) = (wg.clone(), done.clone());
                let body = move || {
                    if i % 3 == 0 {
                        vt::yield_now();
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                    drop(wg);
                };
                if i % 10 == 0 {
                    std::thread::spawn(body);
                } else {
                    vt::spawn(body);
                }
            }
            // Two waiters: each drops its own membership and waits for the rest.
            let other = wg.clone();
            let h = vt::spawn(move || other.wait());
            wg.wait();
            h.join().unwrap();
        }
    });
    assert_eq!(done.load(Ordering::SeqCst), 500);
}

#[test]
fn once_lock_initialises_once_under_a_race() {
    let cell = Arc::new(OnceLock::new());
    let inits = Arc::new(AtomicUsize::new(0));
    rt().block_on(|| {
        let start = Arc::new(Barrier::new(40));
        let mut fibers = Vec::new();
        let mut threads = Vec::new();
        for i in 0..40 {
            let (cell, inits, start) = (cell.clone(), inits.clone(), start.clone());
            let body = move || {
                start.wait();
                *cell.get_or_init(|| {
                    inits.fetch_add(1, Ordering::SeqCst);
                    // Stay in the initialiser a while so others find it RUNNING and park.
                    for _ in 0..10 {
                        vt::yield_now();
                    }
                    i
                })
            };
            if i % 10 == 0 {
                threads.push(std::thread::spawn(body));
            } else {
                fibers.push(vt::spawn(body));
            }
        }
        let first = cell.wait();
        fibers.into_iter().for_each(|h| assert_eq!(h.join().unwrap(), *first));
        threads.into_iter().for_each(|h| assert_eq!(h.join().unwrap(), *first));
    });
    assert_eq!(inits.load(Ordering::SeqCst), 1);
    assert!(cell.set(99).is_err());
}

#[test]
fn once_lock_retries_after_a_panicking_initialiser() {
    let cell = Arc::new(OnceLock::new());
    let c2 = cell.clone();
    let panicked = Arc::new(AtomicBool::new(false));
    let p2 = panicked.clone();
    let r = std::thread::spawn(move || {
        c2.get_or_init(|| {
            p2.store(true, Ordering::SeqCst);
            panic!("init fails");
        });
    })
    .join();
    assert!(r.is_err() && panicked.load(Ordering::SeqCst));
    assert_eq!(cell.get(), None);
    assert_eq!(*cell.get_or_init(|| 7), 7);
    let mut cell = Arc::try_unwrap(cell).unwrap();
    assert_eq!(cell.take(), Some(7));
    assert_eq!(cell.get(), None);
    assert_eq!(cell.set(8), Ok(()));
    assert_eq!(cell.into_inner(), Some(8));
}

/// Calls `f` from `fibers` fibers and `threads` plain threads at once; each first counts itself
/// in `arrived`. Returns when all have returned.
fn contend(fibers: usize, threads: usize, arrived: &Arc<AtomicUsize>, f: impl Fn() + Send + Sync + 'static) {
    let f = Arc::new(f);
    rt().block_on(|| {
        let fiber_handles: Vec<_> = (0..fibers)
            .map(|_| {
                let (f, arrived) = (f.clone(), arrived.clone());
                vt::spawn(move || {
                    arrived.fetch_add(1, Ordering::SeqCst);
                    f();
                })
            })
            .collect();
        let thread_handles: Vec<_> = (0..threads)
            .map(|_| {
                let (f, arrived) = (f.clone(), arrived.clone());
                std::thread::spawn(move || {
                    arrived.fetch_add(1, Ordering::SeqCst);
                    f();
                })
            })
            .collect();
        fiber_handles.into_iter().for_each(|h| h.join().unwrap());
        thread_handles.into_iter().for_each(|h| h.join().unwrap());
    });
}

/// Waits (yielding, fiber or thread) until `n` callers arrived, so that the others are inside
/// the call, most of them parked, while the initialiser runs.
fn wait_for_arrivals(arrived: &AtomicUsize, n: usize) {
    while arrived.load(Ordering::SeqCst) < n {
        vt::yield_now();
    }
}

#[test]
fn once_runs_once_under_contention_from_fibers_and_threads() {
    static ONCE: vt::sync::Once = vt::sync::Once::new();
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    static DONE: AtomicBool = AtomicBool::new(false);
    let arrived = Arc::new(AtomicUsize::new(0));
    let a = arrived.clone();
    contend(200, 4, &arrived, move || {
        ONCE.call_once(|| {
            RUNS.fetch_add(1, Ordering::SeqCst);
            wait_for_arrivals(&a, 204);
            DONE.store(true, Ordering::Relaxed);
        });
        // What the initialiser did is visible to every caller once `call_once` returns.
        assert!(DONE.load(Ordering::Relaxed));
        assert!(ONCE.is_completed());
    });
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
    ONCE.wait();
}

#[test]
fn lazy_lock_initialises_once_under_contention_from_fibers_and_threads() {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    static ARRIVED: AtomicUsize = AtomicUsize::new(0);
    static TABLE: vt::sync::LazyLock<Vec<u64>> = vt::sync::LazyLock::new(|| {
        RUNS.fetch_add(1, Ordering::SeqCst);
        wait_for_arrivals(&ARRIVED, 104);
        (0..1000).collect()
    });
    let arrived = Arc::new(AtomicUsize::new(0));
    contend(100, 4, &arrived, || {
        ARRIVED.fetch_add(1, Ordering::SeqCst);
        assert_eq!(TABLE.iter().sum::<u64>(), 499_500);
    });
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
    assert_eq!(vt::sync::LazyLock::force(&TABLE).len(), 1000);
}

#[test]
fn once_and_lazy_lock_poisoning() {
    let once = vt::sync::Once::new();
    let r = std::panic::catch_unwind(|| once.call_once(|| panic!("first")));
    assert!(r.is_err() && !once.is_completed());
    // Poisoned: call_once and wait panic, call_once_force runs and is told.
    assert!(std::panic::catch_unwind(|| once.call_once(|| {})).is_err());
    assert!(std::panic::catch_unwind(|| once.wait()).is_err());
    let mut told = None;
    once.call_once_force(|state| told = Some(state.is_poisoned()));
    assert_eq!(told, Some(true));
    assert!(once.is_completed());
    once.call_once(|| unreachable!());
    once.wait();
    once.wait_force();

    let lazy = vt::sync::LazyLock::new(|| -> u32 { panic!("init") });
    assert!(std::panic::catch_unwind(|| *lazy).is_err());
    assert!(std::panic::catch_unwind(|| *lazy).is_err());
    let lazy = vt::sync::LazyLock::new(|| 7);
    assert_eq!(format!("{lazy:?}"), "LazyLock(<uninit>)");
    assert_eq!(*lazy, 7);
    assert_eq!(format!("{lazy:?}"), "LazyLock(7)");
    assert_eq!(vt::sync::LazyLock::into_inner(lazy).ok(), Some(7));
}

/// A panicking initialiser poisons a `Once` for the callers parked on it too: those of
/// `call_once` panic, those of `call_once_force` run their own.
#[test]
fn once_poisoning_reaches_parked_callers() {
    let once = Arc::new(vt::sync::Once::new());
    let arrived = Arc::new(AtomicUsize::new(0));
    let (panicked, forced) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (o, a, p, fo) = (once.clone(), arrived.clone(), panicked.clone(), forced.clone());
    let tried = Arc::new(AtomicUsize::new(0));
    contend(20, 2, &arrived, move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            o.call_once(|| {
                wait_for_arrivals(&a, 22);
                panic!("initialiser");
            })
        }));
        if r.is_err() {
            p.fetch_add(1, Ordering::SeqCst);
        }
        // Force only once every caller has had its `call_once`.
        tried.fetch_add(1, Ordering::SeqCst);
        wait_for_arrivals(&tried, 22);
        o.call_once_force(|_| {
            fo.fetch_add(1, Ordering::SeqCst);
        });
    });
    assert_eq!(panicked.load(Ordering::SeqCst), 22, "every call_once saw the panic or the poison");
    assert_eq!(forced.load(Ordering::SeqCst), 1);
    assert!(once.is_completed());
}

#[test]
fn rwlock_downgrade_lets_readers_in_and_keeps_writers_out() {
    // One carrier, so the queue's order is known: the reader queues before the writer. (On
    // two, the writer could queue first, and a reader behind a queued writer waits for it:
    // FIFO hand-off. The test read a timeout on a fresh clone that way.)
    let rt = vt::Runtime::builder().carriers(1).build().unwrap();
    rt.block_on(|| {
        let lock = Arc::new(RwLock::new(0u32));
        let mut w = lock.write().unwrap();
        *w = 1;
        // A reader and then a writer arrive while the writer holds the lock, and queue.
        let (tx, rx) = vt::channel::bounded::<u32>(1);
        let l = lock.clone();
        let reader = vt::spawn(move || tx.send(*l.read().unwrap()).unwrap());
        let wrote = Arc::new(AtomicBool::new(false));
        let (l, wr) = (lock.clone(), wrote.clone());
        let writer = vt::spawn(move || {
            *l.write().unwrap() = 2;
            wr.store(true, Ordering::SeqCst);
        });
        // Behind the two in the carrier's queue: they run, and park on the lock, first.
        vt::yield_now();
        let r = vt::sync::RwLockWriteGuard::downgrade(w);
        assert_eq!(*r, 1);
        // The reader gets in while we still read; the writer does not.
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(1));
        reader.join().unwrap();
        assert!(lock.try_write().is_err());
        assert!(!wrote.load(Ordering::SeqCst));
        drop(r);
        writer.join().unwrap();
        assert_eq!(*lock.read().unwrap(), 2);
        // Uncontended: downgrade, then another reader, then a writer once both are gone.
        let r = vt::sync::RwLockWriteGuard::downgrade(lock.write().unwrap());
        let r2 = lock.try_read().unwrap();
        assert_eq!((*r, *r2), (2, 2));
        drop((r, r2));
        assert!(lock.try_write().is_ok());
    });
}

/// std's `test_read_guard_covariance`: a read guard of `&'a i32` is usable where a shorter
/// lifetime is expected. This only has to compile.
#[test]
fn rwlock_read_guard_is_covariant() {
    fn do_stuff<'a>(_: vt::sync::RwLockReadGuard<'_, &'a i32>, _: &'a i32) {}
    let j: i32 = 5;
    let lock = RwLock::new(&j);
    {
        let i = 6;
        do_stuff(lock.read().unwrap(), &i);
    }
    drop(lock);
}

/// `Mutex`, `RwLock`, `OnceLock`, `Once` and `LazyLock` are unwind-safe as std's are, so
/// `catch_unwind` needs no `AssertUnwindSafe` around them (compile-time assertions).
#[test]
fn locks_are_unwind_safe() {
    fn both<T: std::panic::UnwindSafe + std::panic::RefUnwindSafe>() {}
    both::<Mutex<std::cell::Cell<u8>>>();
    both::<RwLock<std::cell::Cell<u8>>>();
    both::<OnceLock<u8>>();
    both::<vt::sync::Once>();
    both::<vt::sync::LazyLock<u8>>();
    let m = Mutex::new(0);
    let r = std::panic::catch_unwind(|| {
        let _g = m.lock().unwrap();
        panic!("poison");
    });
    assert!(r.is_err() && m.is_poisoned());
}

/// A `OnceLock` may be dropped after what its value borrows, as std's may (the drop check:
/// did not compile before), and a taken or never-set cell drops nothing twice.
#[test]
fn once_lock_may_outlive_what_its_value_borrows() {
    let cell = vt::sync::OnceLock::new();
    {
        let local = String::from("borrowed");
        cell.set(&local).unwrap();
        assert_eq!(cell.get().map(|s| s.len()), Some(8));
    }
    // `cell` (holding a dangling `&String` it never reads again) is dropped here.

    let drops = std::sync::Arc::new(());
    let mut cell = vt::sync::OnceLock::new();
    cell.set(drops.clone()).unwrap();
    assert_eq!(std::sync::Arc::strong_count(&drops), 2);
    assert!(cell.take().is_some());
    assert_eq!((cell.get(), std::sync::Arc::strong_count(&drops)), (None, 1));
    cell.set(drops.clone()).unwrap();
    drop(cell);
    assert_eq!(std::sync::Arc::strong_count(&drops), 1);
}
