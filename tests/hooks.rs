//! Unchanged std blocking code on fibers: with the `hooks` feature it parks the fiber, so two
//! carriers serve thousands of such fibers with no compensating carrier; without it, the same
//! code blocks carriers and the supervisor starts more (each test asserts the side it is built
//! for). `arch/hooks.md`.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use virtual_threads as vt;

mod common;

const HOOKED: bool = cfg!(feature = "hooks");

fn two_carriers() -> vt::Runtime {
    vt::Runtime::builder().carriers(2).build().unwrap()
}

/// Two carriers whose supervisor looks every 50 ms instead of 10, for the tests that assert no
/// carrier was added: 10,000 fibers carve about as many stacks, and two carriers mapping at once
/// wait on the process's memory-map lock for a few milliseconds, which at 10 ms has looked like
/// a blocked carrier (one compensation, 2026-12-02, on an otherwise idle machine). A std call
/// the hooks failed to park would hold its carrier far longer than two such windows.
/// `VT_TEST_SUPERVISOR_MS` overrides it (`common::supervisor_interval`).
#[cfg(feature = "hooks")]
fn two_patient_carriers() -> vt::Runtime {
    vt::Runtime::builder().carriers(2).supervisor_interval(common::supervisor_interval(50)).build().unwrap()
}

/// Runs `n` fibers of `body` on `rt` and waits for all of them.
fn run_all(rt: &vt::Runtime, n: usize, body: impl Fn(usize) + Send + Sync + Clone + 'static) {
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let body = body.clone();
            rt.spawn(move || body(i))
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn std_thread_sleep_in_ten_thousand_fibers_parks_them_on_two_carriers() {
    let rt = two_carriers();
    // Without hooks each sleep holds a carrier thread for its 10 ms, so the set is cut to what
    // the supervisor's compensation gets through in a test's time.
    let n = if HOOKED { 10_000 } else { 200 };
    let slept = Arc::new(AtomicUsize::new(0));
    let t = Instant::now();
    let s = slept.clone();
    run_all(&rt, n, move |_| {
        let before = Instant::now();
        std::thread::sleep(Duration::from_millis(10));
        assert!(before.elapsed() >= Duration::from_millis(10), "woke early");
        s.fetch_add(1, Ordering::Relaxed);
    });
    let took = t.elapsed();
    eprintln!("{n} fibers x std::thread::sleep(10 ms) on 2 carriers: {took:?}");
    assert_eq!(slept.load(Ordering::Relaxed), n);
    let m = rt.metrics();
    if HOOKED {
        // 10,000 sleeps of 10 ms on 2 carriers: blocking, 50 s; parked, one timer round plus
        // the spawns (the bound is generous for a loaded CI machine; benches measure speed).
        assert!(took < Duration::from_secs(2), "took {took:?}");
        assert_eq!(m.compensations, 0, "{m}");
        assert_eq!(m.carriers_peak, 2, "{m}");
    } else {
        assert!(m.compensations >= 1 && m.carriers_peak > 2, "{m}");
    }
}

#[test]
fn every_libc_sleep_parks_and_sleeps_at_least_its_time() {
    let rt = two_carriers();
    let d = Duration::from_millis(20);
    let calls: [(&str, fn()); 6] = [
        ("nanosleep", || std::thread::sleep(Duration::from_millis(20))),
        ("clock_nanosleep relative", || {
            let ts = libc::timespec { tv_sec: 0, tv_nsec: 20_000_000 };
            // SAFETY: a valid timespec; no remainder asked for.
            let r = unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, 0, &ts, std::ptr::null_mut()) };
            assert_eq!(r, 0);
        }),
        ("clock_nanosleep absolute monotonic", || abs_sleep(libc::CLOCK_MONOTONIC)),
        ("clock_nanosleep absolute realtime", || abs_sleep(libc::CLOCK_REALTIME)),
        ("usleep", || {
            // SAFETY: usleep has no preconditions.
            assert_eq!(unsafe { libc::usleep(20_000) }, 0);
        }),
        ("sleep(0)", || {
            // SAFETY: sleep has no preconditions.
            assert_eq!(unsafe { libc::sleep(0) }, 0);
        }),
    ];
    for (name, call) in calls {
        // 200 fibers per call: blocking would take 200 × 20 ms / 2 carriers = 2 s.
        let n = if HOOKED { 200 } else { 4 };
        let t = Instant::now();
        run_all(&rt, n, move |_| {
            let before = Instant::now();
            call();
            if name != "sleep(0)" {
                assert!(before.elapsed() >= d, "{name} woke early");
            }
        });
        if HOOKED {
            assert!(t.elapsed() < Duration::from_secs(1), "{name}: {:?}", t.elapsed());
        }
    }
    if HOOKED {
        assert_eq!(rt.metrics().compensations, 0, "{}", rt.metrics());
    }
}

/// Sleeps 20 ms to an absolute deadline on `clock`.
fn abs_sleep(clock: libc::clockid_t) {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec.
    assert_eq!(unsafe { libc::clock_gettime(clock, &mut ts) }, 0);
    ts.tv_nsec += 20_000_000;
    if ts.tv_nsec >= 1_000_000_000 {
        ts.tv_sec += 1;
        ts.tv_nsec -= 1_000_000_000;
    }
    // SAFETY: as above.
    let r = unsafe { libc::clock_nanosleep(clock, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
    assert_eq!(r, 0);
}

#[test]
fn bad_sleep_arguments_fail_as_the_kernel_says_and_errno_survives_a_park() {
    let rt = two_carriers();
    rt.spawn(|| {
        let bad = libc::timespec { tv_sec: 0, tv_nsec: 1_000_000_000 };
        // SAFETY: valid pointers; the value is out of range on purpose.
        assert_eq!(unsafe { libc::nanosleep(&bad, std::ptr::null_mut()) }, -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EINVAL));
        // SAFETY: as above.
        let r = unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, 0, &bad, std::ptr::null_mut()) };
        assert_eq!(r, libc::EINVAL);
        // A CPU-time clock cannot be slept on: the kernel's answer, passed through.
        let ok = libc::timespec { tv_sec: 0, tv_nsec: 1 };
        // SAFETY: valid pointers.
        let r = unsafe { libc::clock_nanosleep(libc::CLOCK_THREAD_CPUTIME_ID, 0, &ok, std::ptr::null_mut()) };
        assert_ne!(r, 0);
        // errno as it was before the sleep, whatever ran on the carrier meanwhile.
        // SAFETY: this thread's errno slot.
        unsafe { *libc::__errno_location() = libc::ENOTTY };
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ENOTTY));
    })
    .join()
    .unwrap();
}

#[test]
fn plain_threads_and_the_runtime_s_own_threads_sleep_for_real() {
    // On a plain thread nothing changes: the sleep takes its time on the thread.
    let t = Instant::now();
    std::thread::sleep(Duration::from_millis(20));
    assert!(t.elapsed() >= Duration::from_millis(20));
    // A `vt::blocking` helper is a plain thread too: its sleep blocks the helper, not a carrier.
    let rt = two_carriers();
    let took = rt
        .spawn(|| {
            vt::blocking(|| {
                let t = Instant::now();
                std::thread::sleep(Duration::from_millis(20));
                t.elapsed()
            })
        })
        .join()
        .unwrap();
    assert!(took >= Duration::from_millis(20));
}

#[test]
#[cfg(feature = "hooks")]
fn a_dump_names_the_hooked_call_a_fiber_is_parked_in() {
    let rt = two_carriers();
    let h = rt.spawn(|| std::thread::sleep(Duration::from_millis(500)));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let parked =
            rt.dump().fibers().iter().any(|f| {
                matches!(f.state, vt::FiberState::Parked { reason: vt::WaitReason::HookedSleep, .. })
            });
        if parked {
            break;
        }
        assert!(Instant::now() < deadline, "no fiber parked in a hooked sleep: {}", rt.dump());
        vt::yield_now();
    }
    assert!(rt.dump().to_string().contains("hooked libc sleep"), "{}", rt.dump());
    h.join().unwrap();
}

#[test]
#[cfg(feature = "hooks")]
fn dropping_the_runtime_under_fibers_parked_in_hooked_sleeps_does_not_abort() {
    // The drop unwinds each parked fiber from its wait; a hooked wait sits under C frames, which
    // cannot unwind: the hook stops the unwind and returns early, and the fiber ends normally.
    let rt = two_carriers();
    let n = 50;
    let handles: Vec<_> = (0..n).map(|_| rt.spawn(|| std::thread::sleep(Duration::from_secs(60)))).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.metrics().fibers_live > 0 && Instant::now() < deadline {
        let parked =
            rt.dump().fibers().iter().filter(|f| matches!(f.state, vt::FiberState::Parked { .. })).count();
        if parked == n {
            break;
        }
        std::thread::yield_now();
    }
    let t = Instant::now();
    drop(rt);
    assert!(t.elapsed() < Duration::from_secs(30), "the drop waited for the sleeps");
    drop(handles);
}

/// Asserts the runtime got through with its own two carriers: nothing blocked one.
#[cfg(feature = "hooks")]
fn assert_no_compensation(rt: &vt::Runtime) {
    let m = rt.metrics();
    assert_eq!((m.compensations, m.carriers_peak), (0, 2), "{m}");
}

#[test]
#[cfg(feature = "hooks")]
fn a_std_mutex_guard_held_across_vt_waits_parks_the_other_ten_thousand_fibers() {
    // Without hooks this deadlocks: a fiber waiting for the guard blocks its carrier in the
    // kernel, and the holder, at home on that carrier, never runs again.
    let rt = two_patient_carriers();
    let n = 10_000;
    let m = Arc::new(std::sync::Mutex::new(0usize));
    let m2 = m.clone();
    run_all(&rt, n, move |i| {
        let mut g = m2.lock().unwrap();
        let v = *g;
        vt::yield_now(); // the guard held across a switch: nobody else may get in
        if i % 500 == 0 {
            vt::sleep(Duration::from_millis(1));
        }
        *g = v + 1;
    });
    assert_eq!(*m.lock().unwrap(), n);
    assert_no_compensation(&rt);
}

#[test]
#[cfg(feature = "hooks")]
fn std_condvar_and_barrier_in_ten_thousand_fibers() {
    let rt = two_patient_carriers();
    let n = 10_000;
    // Each fiber checks in and waits on a Condvar until all have: the last one's notify_all
    // ends every wait.
    let state = Arc::new((std::sync::Mutex::new(0usize), std::sync::Condvar::new()));
    let s = state.clone();
    run_all(&rt, n, move |_| {
        let (m, cv) = &*s;
        let mut g = m.lock().unwrap();
        *g += 1;
        if *g == n {
            cv.notify_all();
        }
        while *g < n {
            g = cv.wait(g).unwrap();
        }
    });
    assert_eq!(*state.0.lock().unwrap(), n);
    // A std Barrier of 100 parties, 100 times over.
    let barrier = Arc::new(std::sync::Barrier::new(100));
    let leaders = Arc::new(AtomicUsize::new(0));
    let (b, l) = (barrier.clone(), leaders.clone());
    run_all(&rt, 100, move |_| {
        for _ in 0..100 {
            if b.wait().is_leader() {
                l.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    assert_eq!(leaders.load(Ordering::Relaxed), 100);
    assert_no_compensation(&rt);
}

#[test]
#[cfg(feature = "hooks")]
fn std_park_timeout_and_rwlock_and_once_park_fibers() {
    let rt = two_patient_carriers();
    let n = 10_000;
    let t = Instant::now();
    // Timed futex waits nobody ends. std's park token belongs to the OS thread, so the fibers
    // of one carrier share it and may end each other's waits early (std allows that); the set
    // still takes at least one deadline, and parks rather than blocks.
    run_all(&rt, n, |_| std::thread::park_timeout(Duration::from_millis(10)));
    assert!(
        t.elapsed() >= Duration::from_millis(10) && t.elapsed() < Duration::from_secs(5),
        "{:?}",
        t.elapsed()
    );
    // A writer holds a std RwLock across a vt sleep while readers queue.
    let lock = Arc::new(std::sync::RwLock::new(0u64));
    let once = Arc::new(std::sync::OnceLock::new());
    let (l2, o2) = (lock.clone(), once.clone());
    run_all(&rt, 1000, move |i| {
        let v = *o2.get_or_init(|| {
            vt::sleep(Duration::from_millis(5)); // others wait in the Once meanwhile
            7u64
        });
        if i % 10 == 0 {
            let mut w = l2.write().unwrap();
            let x = *w;
            vt::yield_now();
            *w = x + v;
        } else {
            let r = l2.read().unwrap();
            assert_eq!(*r % 7, 0);
        }
    });
    assert_eq!(*lock.read().unwrap(), 700);
    assert_no_compensation(&rt);
}

#[test]
#[cfg(feature = "hooks")]
fn a_plain_thread_and_fibers_share_a_std_mutex_and_condvar() {
    // Wakes cross both ways: a plain thread's unlock wakes fibers (the table first), a fiber's
    // notify wakes the thread (the kernel after).
    let rt = two_carriers();
    let state = Arc::new((std::sync::Mutex::new(0usize), std::sync::Condvar::new()));
    let s = state.clone();
    let fibers: Vec<_> = (0..100)
        .map(|_| {
            let s = s.clone();
            rt.spawn(move || {
                for _ in 0..100 {
                    let (m, cv) = &*s;
                    *m.lock().unwrap() += 1;
                    cv.notify_all();
                }
            })
        })
        .collect();
    {
        let (m, cv) = &*state;
        let mut g = m.lock().unwrap();
        while *g < 100 * 100 {
            g = cv.wait(g).unwrap();
        }
    }
    for f in fibers {
        f.join().unwrap();
    }
    assert_eq!(*state.0.lock().unwrap(), 10_000);
}

#[test]
#[cfg(feature = "hooks")]
fn dropping_the_runtime_under_a_std_condvar_wait_waits_for_a_late_notify() {
    // The drop cannot unwind a fiber out of a std Condvar wait (C frames): it ends each futex
    // wait of it at once, and std waits again, until the word changes. Between those waits the
    // drop's park must really wait. It once spun instead (its back-off sleep was hooked, ended
    // at once), contended for the drop's own lock, and that contended lock re-entered the
    // drop's park until the fiber's stack overflowed: 2.2-2.6 s into the drop (2026-12-06, std's
    // sync suites on fibers). The notify comes later than that, from a plain thread.
    let rt = two_carriers();
    let shared = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
    let s = shared.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    rt.spawn(move || {
        let (m, cv) = &*s;
        let mut g = m.lock().unwrap();
        tx.send(()).unwrap();
        while !*g {
            g = cv.wait(g).unwrap();
        }
    });
    rx.recv().unwrap();
    let s = shared.clone();
    let late = Duration::from_secs(4);
    let notifier = std::thread::spawn(move || {
        // The fiber holds the lock until its wait: this lock comes after, so the notify does.
        std::thread::sleep(late);
        *s.0.lock().unwrap() = true;
        s.1.notify_all();
    });
    let t = Instant::now();
    drop(rt);
    assert!(t.elapsed() >= late - Duration::from_millis(100), "the drop returned before the notify");
    notifier.join().unwrap();
}

/// Two carriers, patient ones with hooks (`two_patient_carriers`), for the tests that run the
/// same std code in both builds and assert the side they are built for.
fn two_carriers_for_either_side() -> vt::Runtime {
    #[cfg(feature = "hooks")]
    return two_patient_carriers();
    #[cfg(not(feature = "hooks"))]
    return two_carriers();
}

/// With hooks the std calls parked and two carriers did it alone; without, they held their
/// carriers and the set finished only on carriers the supervisor added.
fn assert_carriers_added_only_without_hooks(m: &vt::Metrics) {
    if HOOKED {
        assert_eq!((m.compensations, m.carriers_peak), (0, 2), "{m}");
    } else {
        assert!(m.compensations >= 1 && m.carriers_peak > 2, "{m}");
    }
}

/// A `std::net` echo of 4 connections whose server accepts all of them before it echoes any.
/// Without hooks the acceptor's `accept` and each client's read of its echo hold their carrier
/// (at most two such fibers on two carriers), so the rest of the clients, and with them the
/// echo, run only on carriers the supervisor starts for the fibers queued behind the blocked
/// ones: the set finishes, with compensation. With hooks they park and two carriers do it alone
/// (`tests/hooks_io.rs` scales this to 10,000 connections).
#[test]
fn a_std_net_echo_needs_added_carriers_only_without_hooks() {
    let rt = two_carriers_for_either_side();
    let n = 4;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let m = common::within(Duration::from_secs(60), "the std::net echo", move || {
        let h = rt.handle();
        let server = rt.spawn(move || {
            let conns: Vec<_> = (0..n).map(|_| listener.accept().unwrap().0).collect();
            let echoes: Vec<_> =
                conns.into_iter().map(|s| h.spawn(move || io::copy(&mut &s, &mut &s).unwrap())).collect();
            echoes.into_iter().map(|e| e.join().unwrap()).sum::<u64>()
        });
        let clients: Vec<_> = (0..n)
            .map(|i| {
                rt.spawn(move || {
                    let mut s = TcpStream::connect(addr).unwrap();
                    s.write_all(&[i; 100]).unwrap();
                    s.shutdown(std::net::Shutdown::Write).unwrap();
                    let mut back = Vec::new();
                    s.read_to_end(&mut back).unwrap();
                    assert_eq!(back, [i; 100], "client {i}");
                })
            })
            .collect();
        for c in clients {
            c.join().unwrap();
        }
        assert_eq!(server.join().unwrap(), 400);
        rt.metrics()
    });
    assert_carriers_added_only_without_hooks(&m);
}

/// Eight fibers wait on a std `Condvar` until all of them have checked in. Without hooks each
/// waiter holds its carrier, and the last ones to check in run only on carriers the supervisor
/// starts for them; with hooks the waits park and two carriers do it alone
/// (`std_condvar_and_barrier_in_ten_thousand_fibers` scales this to 10,000).
#[test]
fn a_std_condvar_wait_needs_added_carriers_only_without_hooks() {
    let rt = two_carriers_for_either_side();
    let n = 8;
    let m = common::within(Duration::from_secs(60), "the std Condvar", move || {
        let state = Arc::new((std::sync::Mutex::new(0usize), std::sync::Condvar::new()));
        run_all(&rt, n, move |_| {
            let (count, all_in) = &*state;
            let mut c = count.lock().unwrap();
            *c += 1;
            all_in.notify_all();
            while *c < n {
                c = all_in.wait(c).unwrap();
            }
        });
        rt.metrics()
    });
    assert_carriers_added_only_without_hooks(&m);
}

/// A fiber holds a std `MutexGuard` across a `vt::sleep` while another fiber of its only
/// carrier locks the same mutex. Without hooks the second lock blocks the carrier, and the
/// holder, at home there, can never run again to unlock: a deadlock that no added carrier can
/// end (the supervisor reports the blocked carrier). With hooks the second lock parks, the
/// holder wakes and unlocks, and both finish on the one carrier. Run in a child process, which a
/// watchdog ends once the deadlock has lasted 5 s.
#[test]
fn a_std_mutex_guard_across_a_vt_sleep_deadlocks_its_carrier_only_without_hooks() {
    if std::env::var("VT_HOOKS_CHILD").as_deref() == Ok("mutex") {
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if done_rx.recv_timeout(Duration::from_secs(5)).is_err() {
                println!("child: stuck");
                // Not through the runtime's drop, which would wait for the stuck fibers.
                std::process::exit(0);
            }
        });
        let rt = vt::Runtime::builder()
            .carriers(1)
            .supervisor_interval(common::supervisor_interval(10))
            .deadlock_report(None)
            .build()
            .unwrap();
        let m = Arc::new(std::sync::Mutex::new(0));
        let (held_tx, held_rx) = vt::channel::bounded::<()>(1);
        let m1 = m.clone();
        let holder = rt.spawn(move || {
            let mut g = m1.lock().unwrap();
            held_tx.send(()).unwrap();
            vt::sleep(Duration::from_millis(50));
            *g += 1;
        });
        let m2 = m.clone();
        let locker = rt.spawn(move || {
            held_rx.recv().unwrap();
            *m2.lock().unwrap() += 1;
        });
        holder.join().unwrap();
        locker.join().unwrap();
        let metrics = rt.metrics();
        println!("child: ok {} {}", *m.lock().unwrap(), metrics.carriers_peak);
        done_tx.send(()).unwrap();
        return;
    }
    let out = common::rerun_self(
        "a_std_mutex_guard_across_a_vt_sleep_deadlocks_its_carrier_only_without_hooks",
        "VT_HOOKS_CHILD",
        "mutex",
    )
    .output()
    .expect("re-exec the test binary");
    if HOOKED {
        let (stdout, _) = common::child_output(&out, "child: ok");
        assert!(stdout.contains("child: ok 2 1"), "both locked, on the one carrier: {stdout}");
    } else {
        let (_, stderr) = common::child_output(&out, "child: stuck");
        assert!(stderr.contains("carrier 0 blocked"), "the blocked carrier is reported: {stderr}");
    }
}
