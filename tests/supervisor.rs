//! The supervisor: blocked carriers are detected and compensated, learned locations are
//! compensated at once, the carrier count stays within bounds and returns to its target.

use std::panic::Location;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use virtual_threads as vt;

/// Waits until `cond` holds, failing after a generous deadline.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn fibers_queued_behind_blocked_carriers_still_run() {
    let rt = vt::Runtime::builder().carriers(2).build().unwrap();
    let started = Arc::new(AtomicUsize::new(0));
    let sleepers: Vec<_> = (0..2)
        .map(|_| {
            let s = started.clone();
            rt.spawn(move || {
                s.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_secs(2)); // blocks the carrier thread
            })
        })
        .collect();
    eventually("both carriers blocked", || started.load(Ordering::SeqCst) == 2);
    let t = Instant::now();
    let done = Arc::new(AtomicUsize::new(0));
    let short: Vec<_> = (0..1000)
        .map(|_| {
            let d = done.clone();
            rt.spawn(move || {
                d.fetch_add(1, Ordering::Relaxed);
            })
        })
        .collect();
    for h in short {
        h.join().unwrap();
    }
    let took = t.elapsed();
    assert_eq!(done.load(Ordering::Relaxed), 1000);
    assert!(took < Duration::from_millis(1500), "short fibers waited for the sleepers: {took:?}");
    assert!(sleepers.iter().all(|h| !h.is_finished()), "the sleepers were still asleep");
    let m = rt.metrics();
    assert!(m.detections >= 1 && m.compensations >= 1, "{m}");
    for h in sleepers {
        h.join().unwrap();
    }
    eventually("carriers back to the target", || rt.metrics().carriers_current == 2);
}

#[test]
fn blocking_on_one_carrier_lets_other_fibers_run_at_once() {
    // A long interval: only `blocking` itself can explain the others running.
    let rt = vt::Runtime::builder().carriers(1).supervisor_interval(Duration::from_secs(30)).build().unwrap();
    let entered = Arc::new(AtomicUsize::new(0));
    let e = entered.clone();
    let blocker = rt.spawn(move || {
        vt::blocking(|| {
            e.store(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1500));
        })
    });
    eventually("the blocking section began", || entered.load(Ordering::SeqCst) == 1);
    let t = Instant::now();
    let hs: Vec<_> = (0..100).map(|i| rt.spawn(move || i * 2)).collect();
    let sum: u32 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(sum, 9900);
    assert!(t.elapsed() < Duration::from_millis(1000), "{:?}", t.elapsed());
    assert!(!blocker.is_finished());
    assert_eq!(rt.metrics().detections, 0, "no detection was needed");
    blocker.join().unwrap();
    eventually("carriers back to the target", || rt.metrics().carriers_current == 1);
}

/// Every fiber spawned here shares one spawn location.
fn spawn_sleeper(rt: &vt::Runtime, ms: u64) -> vt::JoinHandle<()> {
    rt.spawn(move || std::thread::sleep(Duration::from_millis(ms)))
}

#[test]
fn a_location_that_keeps_blocking_becomes_known_and_is_compensated_without_delay() {
    let rt = vt::Runtime::builder().carriers(1).max_carriers(8).build().unwrap();
    // Learn: 80 fibers from one location, each blocking long enough to be caught.
    let hs: Vec<_> = (0..80).map(|_| spawn_sleeper(&rt, 60)).collect();
    hs.into_iter().for_each(|h| h.join().unwrap());
    eventually("the location is known blocking", || {
        rt.metrics().known_blocking.iter().any(|k| k.location.file().ends_with("supervisor.rs"))
    });
    let known = rt.metrics().known_blocking;
    assert!(known.iter().all(|k| k.runs > 64 && 2 * k.caught >= k.runs), "{known:?}");
    // Use: a fiber from the known location is compensated as it starts, so a fiber queued
    // behind it on the single carrier runs without waiting for a detection.
    let before = rt.metrics().detections;
    let blocker = spawn_sleeper(&rt, 1000);
    let quick = rt.spawn(|| Location::caller().line());
    let t = Instant::now();
    quick.join().unwrap();
    assert!(t.elapsed() < Duration::from_millis(800), "{:?}", t.elapsed());
    assert!(!blocker.is_finished());
    assert_eq!(rt.metrics().detections, before, "compensated without a detection");
    blocker.join().unwrap();
}

/// `vt::blocking` runs its closure on a helper thread: a hundred blockers at once complete
/// without any carrier blocking, so none is compensated for.
#[test]
fn a_hundred_blockers_complete_on_helper_threads_without_extra_carriers() {
    let rt = vt::Runtime::builder().carriers(2).max_carriers(8).build().unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let hs: Vec<_> = (0..100)
        .map(|_| {
            let d = done.clone();
            rt.spawn(move || {
                vt::blocking(|| std::thread::sleep(Duration::from_millis(20)));
                d.fetch_add(1, Ordering::Relaxed);
            })
        })
        .collect();
    hs.into_iter().for_each(|h| h.join().unwrap());
    assert_eq!(done.load(Ordering::Relaxed), 100);
    let m = rt.metrics();
    assert_eq!(m.carriers_peak, 2, "no carrier blocked, none was added: {m}");
}

/// On a 1-carrier runtime, a fiber in `vt::blocking` leaves its carrier to the other started
/// fibers homed there (before, the carrier blocked with it, and they could run nowhere else).
#[test]
fn blocking_keeps_the_callers_carrier_running_its_other_fibers() {
    let rt = vt::Runtime::builder().carriers(1).max_carriers(1).build().unwrap();
    let ticks = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ticker = {
        let (ticks, stop) = (ticks.clone(), stop.clone());
        rt.spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                ticks.fetch_add(1, Ordering::SeqCst);
                vt::sleep(Duration::from_millis(1));
            }
        })
    };
    eventually("the ticker started", || ticks.load(Ordering::SeqCst) > 0);
    let during = {
        let ticks = ticks.clone();
        rt.spawn(move || {
            let before = ticks.load(Ordering::SeqCst);
            vt::blocking(|| std::thread::sleep(Duration::from_millis(300)));
            ticks.load(Ordering::SeqCst) - before
        })
    };
    let during = during.join().unwrap();
    stop.store(true, Ordering::SeqCst);
    ticker.join().unwrap();
    // 300 ms of 1 ms sleeps: ~250 ticks; 10 leaves room for a loaded machine.
    assert!(during >= 10, "the ticker homed on the same carrier ticked {during} times meanwhile");
}

#[test]
fn a_carrier_blocked_while_its_home_fibers_wait_is_reported() {
    if std::env::var("VT_SUPERVISOR_CHILD").as_deref() == Ok("blocked") {
        let rt = vt::Runtime::builder().carriers(1).deadlock_report(None).build().unwrap();
        let (tx, rx) = vt::channel::bounded::<()>(1);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
        // Homed on the only carrier once it has run: parked on a receive.
        let waiter = rt.spawn(move || {
            ready_tx.send(()).unwrap();
            rx.recv().unwrap();
        });
        ready_rx.recv().unwrap();
        let blocker = vt::Builder::new()
            .name("sleepy".into())
            .spawn_on(&rt.handle(), move || {
                tx.send(()).unwrap(); // wakes the waiter: it can run only on this carrier
                std::thread::sleep(Duration::from_millis(1600)); // blocks the carrier
            })
            .unwrap();
        blocker.join().unwrap();
        waiter.join().unwrap();
        println!("child: ok");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["a_carrier_blocked_while_its_home_fibers_wait_is_reported", "--exact", "--nocapture"])
        .env("VT_SUPERVISOR_CHILD", "blocked")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("child: ok"), "stdout: {stdout}\nstderr: {stderr}");
    let line =
        stderr.lines().find(|l| l.contains("blocked")).unwrap_or_else(|| panic!("no report: {stderr}"));
    assert!(line.contains("\"sleepy\""), "names the fiber: {line}");
    assert!(line.contains("tests/supervisor.rs"), "names its spawn site: {line}");
    assert!(line.contains("1 fiber that can run only on this carrier"), "counts who waits: {line}");
    assert!(line.contains("vt::blocking"), "says the fix: {line}");
    assert_eq!(stderr.matches("carrier 0 blocked").count(), 1, "once: {stderr}");
}

#[test]
fn home_carriers_still_compensate_for_unstarted_fibers() {
    // The default: started fibers stay on their home carrier, so only unstarted ones can move to
    // a compensating carrier.
    let rt = vt::Runtime::builder().carriers(1).build().unwrap();
    let entered = Arc::new(AtomicUsize::new(0));
    let e = entered.clone();
    let blocker = rt.spawn(move || {
        e.store(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(1500));
    });
    eventually("the blocker runs", || entered.load(Ordering::SeqCst) == 1);
    let t = Instant::now();
    let hs: Vec<_> = (0..50).map(|i| rt.spawn(move || i)).collect();
    assert_eq!(hs.into_iter().map(|h| h.join().unwrap()).sum::<i32>(), 1225);
    assert!(t.elapsed() < Duration::from_millis(1200), "{:?}", t.elapsed());
    blocker.join().unwrap();
}
