//! Fiber dumps, metrics, the deadlock report, the CPU-starvation warning and the SIGQUIT dump.
//! Reports that go to stderr are checked in a child process (this test binary re-executed).

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::panic::Location;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use virtual_threads as vt;
use vt::{FiberDump, FiberState, WaitReason};

mod common;

const CHILD: &str = "VT_DIAG_TEST_CHILD";

/// Polls the dump until `cond` holds (a generous 30 s bound: the fibers get there on their own).
fn dump_until(rt: &vt::Runtime, what: &str, cond: impl Fn(&FiberDump) -> bool) -> FiberDump {
    let start = Instant::now();
    loop {
        let d = rt.dump();
        if cond(&d) {
            return d;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "timed out waiting for {what}; last dump:\n{d}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn parked_on(d: &FiberDump, reason: WaitReason) -> usize {
    d.fibers()
        .iter()
        .filter(|f| matches!(f.state, FiberState::Parked { reason: r, .. } if r == reason))
        .count()
}

#[test]
fn dump_shows_each_state_and_location() {
    let rt = vt::Runtime::builder().carriers(2).deadlock_report(None).build().unwrap();
    let stop = Arc::new(AtomicBool::new(false));

    // Parked on a channel receive.
    let (tx, rx) = vt::channel::bounded::<u32>(0);
    let recv_site = Location::caller();
    let recv = rt.spawn(move || rx.recv());
    // Parked on a mutex held by this (plain) thread.
    let m = Arc::new(vt::sync::Mutex::new(0));
    let guard = m.lock().unwrap();
    let m2 = m.clone();
    let lock =
        vt::Builder::new().name("locker".into()).spawn_on(&rt.handle(), move || *m2.lock().unwrap()).unwrap();
    // Parked in a long sleep (the runtime's drop unwinds it).
    let _sleeper = rt.spawn(|| vt::sleep(Duration::from_secs(3600)));
    // Parked on a socket: accept with no client.
    let listener = vt::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let _acceptor = rt.spawn(move || listener.accept().map(|_| ()));
    // Running: spins until told to stop.
    let s = stop.clone();
    let spinner = rt.spawn(move || {
        while !s.load(Ordering::Relaxed) {
            std::hint::spin_loop();
        }
    });

    let d = dump_until(&rt, "every fiber in place", |d| {
        parked_on(d, WaitReason::ChannelRecv) == 1
            && parked_on(d, WaitReason::Mutex) == 1
            && parked_on(d, WaitReason::Sleep) == 1
            && parked_on(d, WaitReason::NetRead) == 1
            && d.fibers().iter().any(|f| matches!(f.state, FiberState::Running { .. }))
    });
    let text = d.to_string();
    assert!(text.starts_with("fiber dump: 5 live fibers"), "{text}");
    assert!(text.contains("parked on channel receive"), "{text}");
    assert!(text.contains("parked on Mutex::lock"), "{text}");
    assert!(text.contains("parked on sleep (with a deadline)"), "{text}");
    assert!(text.contains("parked on socket read"), "{text}");
    assert!(text.contains("running on carrier"), "{text}");
    assert!(text.contains("\"locker\""), "names the fiber: {text}");
    let recv_info = d
        .fibers()
        .iter()
        .find(|f| matches!(f.state, FiberState::Parked { reason: WaitReason::ChannelRecv, .. }))
        .unwrap();
    assert_eq!(recv_info.spawned_at.file(), recv_site.file());
    assert_eq!(recv_info.spawned_at.line(), recv_site.line() + 1, "the spawn call's line");
    assert!(text.contains(&format!("tests/diagnostics.rs:{}", recv_site.line() + 1)), "{text}");

    // The spinner stops first: a fiber at home on its carrier cannot run while it spins.
    stop.store(true, Ordering::Relaxed);
    spinner.join().unwrap();
    drop(guard);
    assert_eq!(lock.join().unwrap(), 0);
    tx.send(7).unwrap();
    assert_eq!(recv.join().unwrap(), Ok(7));
    let d = dump_until(&rt, "the finished fibers to leave the dump", |d| d.len() == 2);
    assert_eq!(parked_on(&d, WaitReason::Sleep) + parked_on(&d, WaitReason::NetRead), 2, "{d}");
}

/// `vt::blocking` runs its closure on a helper thread: the fiber shows as parked on it, and its
/// carrier as free.
#[test]
fn a_blocking_section_shows_as_parked_on_its_helper() {
    let rt = vt::Runtime::builder().carriers(1).deadlock_report(None).build().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let h = rt.spawn(move || vt::blocking(move || rx.recv().unwrap()));
    let d = dump_until(&rt, "the blocking fiber", |d| {
        d.fibers().iter().any(|f| matches!(f.state, FiberState::Parked { reason: WaitReason::Blocking, .. }))
    });
    assert!(d.to_string().contains("parked on vt::blocking on a helper thread"), "{d}");
    tx.send(()).unwrap();
    h.join().unwrap();
}

#[test]
fn a_hundred_thousand_parked_fibers_dump_as_one_group() {
    const N: usize = 100_000;
    let rt = vt::Runtime::builder().carriers(2).deadlock_report(None).build().unwrap();
    let (tx, rx) = vt::channel::bounded::<()>(0);
    let handles: Vec<_> = (0..N)
        .map(|_| {
            let rx = rx.clone();
            rt.spawn(move || rx.recv().is_err())
        })
        .collect();
    let d = dump_until(&rt, "every fiber parked", |d| parked_on(d, WaitReason::ChannelRecv) == N);
    let groups = d.groups();
    assert_eq!(groups.len(), 1, "{d}");
    assert_eq!(groups[0].len(), N);
    let text = d.to_string();
    assert_eq!(text.lines().count(), 2, "a header and one group line: {text}");
    assert!(
        text.contains(&format!("{N} fibers parked on channel receive, spawned at tests/diagnostics.rs")),
        "{text}"
    );
    assert!(text.contains(&format!("and {} more", N - 3)), "{text}");
    assert_eq!(format!("{d:#}").matches(" fiber ").count(), N, "the alternate form names every fiber");
    drop((tx, rx));
    assert!(handles.into_iter().all(|h| h.join().unwrap()));
}

#[test]
fn metrics_add_up() {
    let rt = vt::Runtime::builder().carriers(2).deadlock_report(None).build().unwrap();
    let (tx, rx) = vt::channel::unbounded::<u64>();
    // 1,000 fibers that finish, 10 that stay parked, spawned from a fiber and from this thread.
    let sum = rt.block_on(|| {
        let hs: Vec<_> = (0..500u64).map(|i| vt::spawn(move || i)).collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
    });
    let hs: Vec<_> = (0..500u64).map(|i| rt.spawn(move || i)).collect();
    let sum2: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(sum + sum2, 2 * (0..500).sum::<u64>());
    let waiters: Vec<_> = (0..10)
        .map(|_| {
            let rx = rx.clone();
            rt.spawn(move || rx.recv().unwrap())
        })
        .collect();
    // The count first: a fiber whose join already returned may still be finishing, and a dump
    // taken meanwhile lists it.
    let start = Instant::now();
    while rt.metrics().fibers_live != 10 && start.elapsed() < Duration::from_secs(30) {
        std::thread::yield_now();
    }
    let d = dump_until(&rt, "10 parked fibers", |d| parked_on(d, WaitReason::ChannelRecv) == 10);
    let m = rt.metrics();
    assert_eq!(m.fibers_spawned, 1 + 500 + 500 + 10, "{m}");
    assert_eq!(m.fibers_spawned, m.fibers_finished + m.fibers_live, "{m}");
    assert_eq!(m.fibers_live, d.len() as u64, "live fibers are the dumped ones: {m}\n{d}");
    assert!(m.switches >= m.fibers_spawned, "{m}");
    assert!(m.parks >= 10, "{m}");
    assert!(m.stack_pool_hits + m.stack_pool_misses > 0, "{m}");
    assert!(m.stacks_carved > 0 && m.stack_bytes_reserved >= m.stacks_carved * 16 * 1024, "{m}");
    for i in 0..10 {
        tx.send(i).unwrap();
    }
    let got: u64 = waiters.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(got, 45);
    // A join returns once the result is published; the carrier counts the finish just after.
    let start = Instant::now();
    while rt.metrics().fibers_live != 0 && start.elapsed() < Duration::from_secs(30) {
        std::thread::yield_now();
    }
    let m = rt.metrics();
    assert_eq!((m.fibers_live, m.fibers_finished), (0, m.fibers_spawned), "{m}");
    assert!(m.unparks >= 10, "{m}");
    assert!(m.to_string().contains("fibers: 1011 spawned, 1011 finished, 0 live"), "{m}");
}

#[test]
fn fiber_roots_off_gives_an_empty_dump_that_says_why() {
    let rt = vt::Runtime::builder().carriers(1).fiber_roots(false).build().unwrap();
    let (tx, rx) = vt::channel::bounded::<()>(0);
    let h = rt.spawn(move || rx.recv());
    let d = rt.dump();
    assert!(d.is_empty());
    assert!(d.to_string().contains("fiber_roots(false)"), "{d}");
    drop(tx);
    assert!(h.join().unwrap().is_err());
}

/// Runs `case` in a child copy of this test binary; returns (exit code, signal, stderr).
fn run_child(test: &str, case: &str) -> (Option<i32>, Option<i32>, String) {
    let out = common::rerun_self(test, CHILD, case)
        .env("VT_DEADLOCK_ABORT", "1")
        .output()
        .expect("re-exec the test binary");
    (out.status.code(), out.status.signal(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_real_deadlock_is_reported_with_the_dump() {
    if std::env::var(CHILD).as_deref() == Ok("deadlock") {
        let rt = vt::Runtime::builder()
            .carriers(2)
            .deadlock_report(Some(Duration::from_millis(200)))
            .build()
            .unwrap();
        // Each fiber waits for the other's message before sending its own.
        let (tx_a, rx_a) = vt::channel::bounded::<()>(1);
        let (tx_b, rx_b) = vt::channel::bounded::<()>(1);
        let a = vt::Builder::new()
            .name("alice".into())
            .spawn_on(&rt.handle(), move || {
                rx_a.recv().unwrap();
                tx_b.send(()).unwrap();
            })
            .unwrap();
        let _b = vt::Builder::new()
            .name("bob".into())
            .spawn_on(&rt.handle(), move || {
                rx_b.recv().unwrap();
                tx_a.send(()).unwrap();
            })
            .unwrap();
        // Waiting in join cannot wake anyone: the report still fires (and aborts the child).
        let _ = a.join();
        unreachable!("the deadlock report aborts under VT_DEADLOCK_ABORT");
    }
    let (_, signal, stderr) = run_child("a_real_deadlock_is_reported_with_the_dump", "deadlock");
    assert_eq!(signal, Some(libc::SIGABRT), "stderr: {stderr}");
    assert!(stderr.contains("possible deadlock: all fibers are asleep"), "stderr: {stderr}");
    assert!(
        stderr.contains("2 fibers parked on channel receive")
            || stderr.matches("parked on channel receive").count() == 2,
        "stderr: {stderr}"
    );
    assert!(stderr.contains("\"alice\"") && stderr.contains("\"bob\""), "stderr: {stderr}");
    assert_eq!(stderr.matches("possible deadlock").count(), 1, "reported once: {stderr}");
}

#[test]
fn no_report_for_fibers_a_plain_thread_wakes_later() {
    if std::env::var(CHILD).as_deref() == Ok("woken-later") {
        let rt = vt::Runtime::builder()
            .carriers(2)
            .deadlock_report(Some(Duration::from_millis(100)))
            .build()
            .unwrap();
        let (tx, rx) = vt::channel::bounded::<u32>(0);
        let parked = rt.spawn(move || rx.recv().unwrap());
        let f = Arc::new(std::sync::Mutex::new(None));
        let f2 = f.clone();
        let (ptx, prx) = vt::channel::bounded::<()>(1);
        let parker = rt.spawn(move || {
            *f2.lock().unwrap() = Some(vt::current());
            ptx.send(()).unwrap();
            vt::park();
            7
        });
        // A plain thread inside vt calls (a receive, a sleep, then a send and an unpark) for
        // well over the quiet period, with no gap between them: it may wake a fiber, so no
        // report.
        let waker = std::thread::spawn(move || {
            prx.recv().unwrap();
            vt::sleep(Duration::from_millis(600));
            tx.send(5).unwrap();
            f.lock().unwrap().take().unwrap().unpark();
        });
        assert_eq!(parked.join().unwrap(), 5);
        assert_eq!(parker.join().unwrap(), 7);
        waker.join().unwrap();
        // A fiber in a long timed wait is not asleep for good either.
        rt.block_on(|| vt::sleep(Duration::from_millis(400)));
        println!("child done");
        return;
    }
    let (code, signal, stderr) = run_child("no_report_for_fibers_a_plain_thread_wakes_later", "woken-later");
    assert_eq!((code, signal), (Some(0), None), "stderr: {stderr}");
    assert!(!stderr.contains("possible deadlock"), "stderr: {stderr}");
}

/// A fiber that waits on another runtime (`block_on` on it, a join of its fiber, a channel one
/// of its fibers feeds) is woken by that runtime, which the waiting fiber's runtime does not
/// see: no report while that runtime still has work (8 of 8 runs reported, and so aborted under
/// `VT_DEADLOCK_ABORT`, before).
#[test]
fn no_report_for_fibers_that_wait_on_another_runtime() {
    if std::env::var(CHILD).as_deref() == Ok("cross-runtime") {
        let quiet = Duration::from_millis(100);
        let a = vt::Runtime::builder().carriers(1).deadlock_report(Some(quiet)).build().unwrap();
        let b = vt::Runtime::builder().carriers(1).deadlock_report(Some(quiet)).build().unwrap();
        let work = Duration::from_millis(800);
        let hb = b.handle();
        let v = a.block_on(move || {
            hb.block_on(move || {
                vt::sleep(work);
                1
            })
        });
        assert_eq!(v, 1);
        let theirs = b.spawn(move || {
            vt::sleep(work);
            2
        });
        assert_eq!(a.block_on(move || theirs.join().unwrap()), 2);
        let (tx, rx) = vt::channel::bounded::<u32>(0);
        let feeder = b.spawn(move || {
            vt::sleep(work);
            tx.send(3).unwrap();
        });
        assert_eq!(a.block_on(move || rx.recv().unwrap()), 3);
        feeder.join().unwrap();
        println!("child done");
        return;
    }
    let (code, signal, stderr) =
        run_child("no_report_for_fibers_that_wait_on_another_runtime", "cross-runtime");
    assert_eq!((code, signal), (Some(0), None), "stderr: {stderr}");
    assert!(!stderr.contains("possible deadlock"), "stderr: {stderr}");
}

#[test]
fn cpu_starvation_is_warned_once_per_location() {
    if std::env::var(CHILD).as_deref() == Ok("starve") {
        let rt = vt::Runtime::builder().carriers(1).max_carriers(1).deadlock_report(None).build().unwrap();
        let hog = |ms| {
            move || {
                let t = Instant::now();
                while t.elapsed() < Duration::from_millis(ms) {
                    std::hint::spin_loop();
                }
            }
        };
        rt.block_on(|| {
            let queued = vt::spawn(|| 1);
            hog(400)();
            assert_eq!(queued.join().unwrap(), 1);
        });
        return;
    }
    let (code, _, stderr) = run_child("cpu_starvation_is_warned_once_per_location", "starve");
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert!(stderr.contains("CPU starvation"), "stderr: {stderr}");
    assert!(stderr.contains("tests/diagnostics.rs"), "names the spawn site: {stderr}");
    assert_eq!(stderr.matches("CPU starvation").count(), 1, "once per location: {stderr}");
}

/// A fiber that runs for long without a switch starves nobody while other carriers take what
/// is queued behind it (the fork_join example's root: it spawns and joins for the whole run
/// while the other carrier runs its children). No warning then, and no spare carrier: the
/// warning and the compensation follow the same rule. On a loaded host the OS may keep the
/// other carrier's thread off every CPU for longer than the supervisor waits for a steal: no
/// steal in 5 samples means a fiber queued for 4 intervals (3 if a stale unpark cut one
/// short), and then the queued fibers do starve and a warning is right. So each child
/// measures how long it was queued, and the strict claim holds whenever none waited 30 ms.
#[test]
fn a_long_fiber_whose_queue_another_carrier_drains_is_not_reported() {
    const EVERY: Duration = Duration::from_millis(10);
    if std::env::var(CHILD).as_deref() == Ok("drained") {
        let rt = vt::Runtime::builder()
            .carriers(2)
            .supervisor_interval(EVERY)
            .deadlock_report(None)
            .build()
            .unwrap();
        let done = Arc::new(AtomicUsize::new(0));
        let longest_us = Arc::new(AtomicUsize::new(0));
        let (d, l) = (done.clone(), longest_us.clone());
        let spawned = rt.block_on(move || {
            let start = Instant::now();
            let mut spawned = 0;
            // 400 ms without a switch (four times the stall that warns): keep up to 64 children
            // queued, which only the other carrier can run.
            while start.elapsed() < Duration::from_millis(400) {
                if spawned - d.load(Ordering::Acquire) < 64 {
                    let (d, l, queued) = (d.clone(), l.clone(), Instant::now());
                    drop(vt::spawn(move || {
                        l.fetch_max(queued.elapsed().as_micros() as usize, Ordering::Relaxed);
                        d.fetch_add(1, Ordering::Release)
                    }));
                    spawned += 1;
                } else {
                    std::hint::spin_loop();
                }
            }
            spawned
        });
        assert!(done.load(Ordering::Acquire) > 64, "the other carrier ran the children");
        assert!(spawned > 64);
        let longest = Duration::from_micros(longest_us.load(Ordering::Relaxed) as u64);
        let drained = longest < 3 * EVERY;
        println!("longest queued {} ms, drained: {drained}", longest.as_millis());
        if drained {
            assert_eq!(
                rt.metrics().compensations,
                0,
                "no spare carrier for a queue that drains: {}",
                rt.metrics()
            );
        }
        return;
    }
    let out = common::rerun_self(
        "a_long_fiber_whose_queue_another_carrier_drains_is_not_reported",
        CHILD,
        "drained",
    )
    .env("VT_DEADLOCK_ABORT", "1")
    .output()
    .expect("re-exec the test binary");
    let (stdout, stderr) = common::child_output(&out, "longest queued");
    if stdout.contains("drained: true") {
        assert!(!stderr.contains("CPU starvation"), "stdout: {stdout}\nstderr: {stderr}");
    } else {
        // Held off by the host: a warning is due, once.
        assert!(stderr.matches("CPU starvation").count() <= 1, "stdout: {stdout}\nstderr: {stderr}");
    }
}

/// std's panic hook names the thread, which inside a fiber is its carrier: the runtime's hook
/// adds a line naming the fiber, then calls the hook that was there (here a user's, which
/// calls std's), and stays out of the way on plain threads.
#[test]
fn a_panic_in_a_fiber_names_the_fiber_and_chains_to_the_previous_hook() {
    if std::env::var(CHILD).as_deref() == Ok("panic-names") {
        let std_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            eprintln!("user hook saw a panic at {}", info.location().unwrap());
            std_hook(info)
        }));
        // threadpool's own test_name: a job asks the thread's name and gets the carrier's.
        let pool = vt::ThreadPool::with_name("named-pool".into(), 1);
        let name = pool.spawn(|| std::thread::current().name().map(str::to_owned)).join().unwrap();
        assert!(name.is_some_and(|n| n.starts_with("vt-default")), "the carrier thread");
        pool.execute(|| panic!("boom in a pool"));
        pool.join();
        assert_eq!(pool.panic_count(), 1);
        let h = vt::Builder::new().name("worker".into()).spawn(|| panic!("boom in a fiber")).unwrap();
        assert!(h.join().is_err());
        let plain = std::thread::Builder::new().name("plain".into()).spawn(|| panic!("boom on a thread"));
        assert!(plain.unwrap().join().is_err());
        println!("child done");
        return;
    }
    let test = "a_panic_in_a_fiber_names_the_fiber_and_chains_to_the_previous_hook";
    let (code, _, stderr) = run_child(test, "panic-names");
    assert_eq!(code, Some(0), "stderr: {stderr}");
    let named = |name: &str| {
        stderr.lines().find(|l| l.starts_with("fiber ") && l.contains(&format!(" \"{name}\" (spawned at ")))
    };
    let pool_line = named("named-pool").unwrap_or_else(|| panic!("names the pool's fiber: {stderr}"));
    assert!(pool_line.contains(") panicked on carrier thread 'vt-default-"), "{pool_line}");
    let worker = named("worker").unwrap_or_else(|| panic!("names the fiber: {stderr}"));
    assert!(worker.contains("(spawned at tests/diagnostics.rs:"), "names the spawn site: {worker}");
    // Each fiber's line comes first, then the previous hook's (the user's, then std's).
    for msg in ["boom in a pool", "boom in a fiber"] {
        let at = stderr.find(msg).unwrap_or_else(|| panic!("std's hook ran: {stderr}"));
        let before = &stderr[..at];
        let ours = before.rfind("panicked on carrier thread").unwrap_or_else(|| panic!("{stderr}"));
        assert!(before.rfind("user hook saw") > Some(ours), "{stderr}");
    }
    assert_eq!(stderr.matches("user hook saw").count(), 3, "chained every time: {stderr}");
    assert!(stderr.contains("thread 'plain'") && stderr.contains("boom on a thread"), "{stderr}");
    assert_eq!(
        stderr.matches("panicked on carrier thread").count(),
        2,
        "nothing for a plain thread: {stderr}"
    );
}

/// A test harness that captures a test's output (libtest without `--nocapture`) captures the
/// runtime's line naming a panicking fiber along with std's message: a passing test that
/// provokes panics prints no panic text.
#[test]
fn a_captured_test_prints_nothing_of_the_panics_it_provokes() {
    let test = "a_panic_in_a_fiber_names_the_fiber_and_chains_to_the_previous_hook";
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--test-threads=1"])
        .env(CHILD, "panic-names")
        .env("VT_DEADLOCK_ABORT", "1")
        .output()
        .expect("re-exec the test binary");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("test result: ok. 1 passed"), "the child ran the test: {stdout}");
    for text in [&stdout, &stderr] {
        assert!(!text.contains("panicked") && !text.contains("boom"), "printed: {stdout}\n{stderr}");
    }
}

/// With stderr a pipe nobody reads any more, a panicking fiber still unwinds into its join's
/// `Err`: the line naming it is skipped (writing it would fail, and a failing `eprint!` in the
/// panic hook aborts the process).
#[test]
fn a_panic_with_stderr_closed_still_unwinds() {
    if std::env::var(CHILD).as_deref() == Ok("closed-stderr") {
        let h = vt::spawn(|| panic!("boom with nobody reading"));
        assert!(h.join().is_err());
        println!("child done");
        return;
    }
    let test = "a_panic_with_stderr_closed_still_unwinds";
    let mut child = common::rerun_self(test, CHILD, "closed-stderr")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("re-exec the test binary");
    drop(child.stderr.take()); // the reader goes before the child writes anything
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{:?} {stdout}", out.status);
    assert!(stdout.contains("child done"), "{stdout}");
}

#[test]
fn sigquit_prints_the_dump() {
    if std::env::var(CHILD).as_deref() == Ok("sigquit") {
        let rt =
            vt::Runtime::builder().carriers(1).dump_on_sigquit(true).deadlock_report(None).build().unwrap();
        let (_tx, rx) = vt::channel::bounded::<()>(0);
        let h = rt.spawn(move || rx.recv());
        while rt.dump().fibers().iter().all(|f| !matches!(f.state, FiberState::Parked { .. })) {
            std::thread::yield_now();
        }
        println!("ready");
        let _ = h.join(); // the parent kills us
        unreachable!();
    }
    let text = dump_on_sigquit_of_child("sigquit_prints_the_dump", "sigquit", &[]);
    assert!(text.contains("SIGQUIT") && text.contains("1 fiber parked on channel receive"), "stderr: {text}");
}

/// The default runtime has no builder: `VT_DUMP_ON_SIGQUIT=1` turns its dump on SIGQUIT on.
#[test]
fn vt_dump_on_sigquit_turns_the_default_runtimes_dump_on() {
    if std::env::var(CHILD).as_deref() == Ok("sigquit-default") {
        let (_tx, rx) = vt::channel::bounded::<()>(0);
        let h = vt::spawn(move || rx.recv());
        while vt::dump().fibers().iter().all(|f| !matches!(f.state, FiberState::Parked { .. })) {
            std::thread::yield_now();
        }
        println!("ready");
        let _ = h.join(); // the parent kills us
        unreachable!();
    }
    let test = "vt_dump_on_sigquit_turns_the_default_runtimes_dump_on";
    let text = dump_on_sigquit_of_child(test, "sigquit-default", &[("VT_DUMP_ON_SIGQUIT", "1")]);
    assert!(text.contains("SIGQUIT") && text.contains("1 fiber parked on channel receive"), "stderr: {text}");
    assert!(text.contains("spawned at tests/diagnostics.rs:"), "stderr: {text}");
}

/// Runs `test` as `case` in a child with `envs`, waits for it to print "ready", sends it SIGQUIT
/// and returns its stderr once it holds a whole line about a fiber parked on a channel (or what
/// came before the child's exit, or after 60 s). The whole line: stderr is unbuffered, so the
/// dump arrives in many writes, and "spawned at" follows the state in a later one.
fn dump_on_sigquit_of_child(test: &str, case: &str, envs: &[(&str, &str)]) -> String {
    let mut child = common::rerun_self(test, CHILD, case)
        .envs(envs.iter().copied())
        .env("VT_DEADLOCK_ABORT", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("ready") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the child exited before it was ready");
    }
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGQUIT) }, 0);
    let mut err = child.stderr.take().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let mut buf = [0u8; 4096];
        let whole_line = |text: &[u8]| {
            let text = String::from_utf8_lossy(text);
            text.find("parked on channel receive").is_some_and(|at| text[at..].contains('\n'))
        };
        while !whole_line(&text) {
            match err.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => text.extend_from_slice(&buf[..n]),
            }
        }
        let _ = done_tx.send(());
        String::from_utf8_lossy(&text).into_owned()
    });
    // Killing the child ends a read that waits for more (EOF), whatever came by then.
    let _ = done_rx.recv_timeout(Duration::from_secs(60));
    let _ = child.kill();
    let _ = child.wait();
    reader.join().unwrap()
}

/// `Handle::current()`, `vt::metrics()` and `vt::dump()` are the caller's runtime inside a
/// fiber, and the process-wide default runtime on a plain thread.
#[test]
fn handle_current_metrics_and_dump_are_the_callers_runtime_or_the_default() {
    let rt =
        vt::Runtime::builder().carriers(1).thread_name("inspected").deadlock_report(None).build().unwrap();
    let (tx, rx) = vt::channel::bounded::<()>(0);
    let parked = rt.spawn(move || rx.recv());
    let (in_rt, carrier) = rt.block_on(|| {
        while vt::dump().fibers().iter().all(|f| !matches!(f.state, FiberState::Parked { .. })) {
            vt::yield_now();
        }
        let carrier = vt::Handle::current().spawn(|| std::thread::current().name().map(str::to_owned));
        (vt::dump(), carrier.join().unwrap())
    });
    assert!(carrier.is_some_and(|n| n.starts_with("inspected")), "Handle::current() spawned onto rt");
    let id = parked.fiber().id();
    let ours = in_rt.fibers().iter().find(|f| f.id == id).expect("vt::dump() in rt lists rt's fibers");
    assert!(matches!(ours.state, FiberState::Parked { reason: WaitReason::ChannelRecv, .. }), "{in_rt}");
    assert_eq!(rt.block_on(|| vt::metrics().carriers_target), 1);
    assert!(rt.block_on(vt::metrics).fibers_spawned >= 3, "the parked fiber, block_on's and the spawned one");

    // From this plain thread: the default runtime, where that parked fiber is not.
    let spawned = vt::metrics().fibers_spawned;
    vt::spawn(|| ()).join().unwrap();
    assert!(vt::Handle::current().metrics().fibers_spawned > spawned);
    let default_dump = vt::dump();
    let not_ours = |f: &vt::FiberInfo| f.id != id || f.spawned_at != ours.spawned_at;
    assert!(default_dump.fibers().iter().all(not_ours), "rt's fiber in the default's dump: {default_dump}");
    drop(tx);
    assert!(parked.join().unwrap().is_err());
}

/// A stopped fiber shows as cancelled in the dump, and the section that defers its stop is
/// named.
#[test]
fn dump_shows_cancelled_fibers_and_their_uncancellable_section() {
    let rt = vt::Runtime::builder().carriers(1).build().unwrap();
    let (in_tx, in_rx) = vt::channel::bounded::<()>(0);
    let (go_tx, go_rx) = vt::channel::bounded::<()>(0);
    let h = rt.spawn(move || {
        vt::uncancellable(|| {
            in_tx.send(()).unwrap();
            go_rx.recv().unwrap();
        });
        vt::yield_now(); // the deferred stop acts at this next switch point
    });
    in_rx.recv().unwrap();
    h.cancel();
    let text = loop {
        let dump = rt.dump();
        let me = dump.fibers().iter().find(|f| f.id == h.fiber().id()).cloned();
        if let Some(f) = me.filter(|f| matches!(f.state, vt::FiberState::Parked { .. })) {
            assert!(f.cancelled);
            let at = f.uncancellable_at.expect("the section is named");
            assert!(at.file().ends_with("diagnostics.rs"), "{at}");
            break dump.to_string();
        }
        std::thread::yield_now();
    };
    assert!(text.contains("1 cancelled") && text.contains("uncancellable section at"), "{text}");
    go_tx.send(()).unwrap();
    assert!(h.join().unwrap_err().downcast_ref::<vt::Cancelled>().is_some());
}

/// A cancelled fiber that keeps computing without a switch point is reported once, with its
/// spawn site, after about a second.
#[test]
fn a_cancelled_fiber_that_does_not_stop_is_reported_once() {
    if std::env::var(CHILD).as_deref() == Ok("slow-stop") {
        let rt = vt::Runtime::builder().carriers(2).build().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let (running_tx, running_rx) = std::sync::mpsc::channel::<()>();
        let h = vt::Builder::new()
            .name("spinner".into())
            .spawn_on(&rt.handle(), move || {
                running_tx.send(()).unwrap();
                while !s.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
                vt::yield_now(); // stopped here, once let go
            })
            .unwrap();
        running_rx.recv().unwrap();
        h.cancel();
        std::thread::sleep(Duration::from_millis(2_500));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(h.join().unwrap_err().downcast_ref::<vt::Cancelled>().is_some());
        return;
    }
    let (code, signal, stderr) =
        run_child("a_cancelled_fiber_that_does_not_stop_is_reported_once", "slow-stop");
    assert_eq!((code, signal), (Some(0), None), "stderr: {stderr}");
    assert_eq!(stderr.matches("was cancelled").count(), 1, "reported once: {stderr}");
    assert!(
        stderr.contains("\"spinner\"")
            && stderr.contains("diagnostics.rs")
            && stderr.contains("check_cancelled"),
        "stderr: {stderr}"
    );
}
