//! The execution trace (`arch/diagnostics.md`, "The execution trace"): what it records agrees
//! with the runtime's counters, wakes name their waker, it can be started and stopped at run
//! time, bad use is a clear error, and `VT_TRACE` traces the default runtime to a finished file.
//! The files are read here with plain string scans of the writer's own format; strict JSON and
//! Perfetto's parser are checked in `benches/` (`vt-trace-report`'s tests).

use std::io;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use virtual_threads as vt;

mod common;
use common::block_in_os;

const CHILD: &str = "VT_TRACE_TEST_CHILD";

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vt-trace-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// The trace's events, one per line as the writer puts them.
fn lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.starts_with("{\"ph\"")).collect()
}

/// The number after `"key":` in `line`.
fn num(line: &str, key: &str) -> Option<u64> {
    let pat = format!("\"{key}\":");
    let at = line.find(&pat)? + pat.len();
    let digits: String = line[at..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Waits until every fiber has finished: each one's last run slice is recorded before the
/// carrier counts it finished.
fn quiesce(rt: &vt::Runtime) {
    while rt.metrics().fibers_live > 0 {
        std::thread::yield_now();
    }
}

#[test]
fn a_traced_run_agrees_with_the_runtimes_counters() {
    let path = temp("counters.json");
    let rt = vt::Runtime::builder().carriers(2).trace(&path).build().unwrap();
    rt.block_on(|| {
        // Fork-join with waits on channels, joins and sleeps.
        let (tx, rx) = vt::channel::bounded::<u64>(4);
        let hs: Vec<_> = (0..500u64)
            .map(|i| {
                let tx = tx.clone();
                vt::spawn(move || {
                    if i % 50 == 0 {
                        vt::sleep(Duration::from_millis(1));
                    }
                    tx.send(i).unwrap();
                })
            })
            .collect();
        drop(tx);
        let sum: u64 = rx.iter().sum();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(sum, 500 * 499 / 2);
    });
    quiesce(&rt);
    let m = rt.metrics();
    let summary = rt.trace_stop().unwrap();
    assert_eq!(summary.dropped, 0);
    let text = std::fs::read_to_string(&path).unwrap();
    let events = lines(&text);
    assert_eq!(summary.events as usize, events.len());
    let spawns = events.iter().filter(|l| l.contains("\"cat\":\"spawn\"")).count() as u64;
    let resumes: u64 =
        events.iter().filter(|l| l.contains("\"cat\":\"run\"")).map(|l| num(l, "resumes").unwrap()).sum();
    let compensations =
        events.iter().filter(|l| l.contains("\"name\":\"compensating carrier\"")).count() as u64;
    assert_eq!(spawns, m.fibers_spawned, "spawn events against Metrics::fibers_spawned");
    assert_eq!(resumes, m.switches, "resumes in run slices against Metrics::switches");
    assert_eq!(compensations, m.compensations);
    let parks_on_channels = events.iter().filter(|l| l.contains("\"wait\":\"channel")).count();
    assert!(parks_on_channels > 0, "no slice ended parked on a channel");
    assert!(text.trim_end().ends_with("}}"), "the JSON is closed");
}

#[test]
fn compensating_carriers_and_blocked_carriers_are_in_the_trace() {
    let path = temp("compensation.json");
    let rt = vt::Runtime::builder().carriers(1).max_carriers(3).trace(&path).build().unwrap();
    rt.block_on(|| {
        let waiting: Vec<_> = (0..4).map(|_| vt::spawn(vt::yield_now)).collect();
        // Blocks its carrier in the OS with fibers waiting behind it: the supervisor
        // compensates. Not a sleep, which the `hooks` feature turns into a park.
        vt::spawn(|| block_in_os(Duration::from_millis(600))).join().unwrap();
        for h in waiting {
            h.join().unwrap();
        }
    });
    quiesce(&rt);
    let m = rt.metrics();
    rt.trace_stop().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let events = lines(&text);
    let compensations =
        events.iter().filter(|l| l.contains("\"name\":\"compensating carrier\"")).count() as u64;
    assert_eq!(compensations, m.compensations);
    assert!(m.compensations >= 1, "the supervisor did not compensate: {m:?}");
    assert!(events.iter().any(|l| l.contains("\"name\":\"carrier blocked in the OS\"")));
    assert!(
        events
            .iter()
            .any(|l| l.contains("\"name\":\"carrier started\"") && l.contains("\"compensating\":true"))
    );
}

#[test]
fn a_wake_names_its_waker_and_the_wait_names_its_reason() {
    let path = temp("wake.json");
    let rt = vt::Runtime::builder().carriers(1).build().unwrap();
    rt.trace_start(&path).unwrap();
    let (waiter, waker) = rt.block_on(|| {
        let (tx, rx) = vt::channel::bounded::<u32>(0);
        let waiter =
            vt::Builder::new().name("the \"waiter\"".into()).spawn(move || rx.recv().unwrap()).unwrap();
        let wid = waiter.fiber().id().as_u64();
        // Let the waiter park on its receive first.
        while !vt::dump()
            .fibers()
            .iter()
            .any(|f| f.id.as_u64() == wid && matches!(f.state, vt::FiberState::Parked { .. }))
        {
            vt::yield_now();
        }
        let waker = vt::spawn(move || tx.send(7).unwrap());
        let kid = waker.fiber().id().as_u64();
        assert_eq!(waiter.join().unwrap(), 7);
        waker.join().unwrap();
        (wid, kid)
    });
    quiesce(&rt);
    rt.trace_stop().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let events = lines(&text);
    let flow = events
        .iter()
        .find(|l| {
            l.contains("\"ph\":\"s\"") && num(l, "fiber") == Some(waiter) && num(l, "by") == Some(waker)
        })
        .unwrap_or_else(|| panic!("no wake of {waiter} by {waker}:\n{text}"));
    let id = num(flow, "id").unwrap();
    assert!(
        events.iter().any(|l| l.contains("\"ph\":\"f\"") && num(l, "id") == Some(id)),
        "the flow has no end"
    );
    assert!(
        events.iter().any(|l| l.contains("\"cat\":\"run\"")
            && num(l, "fiber") == Some(waiter)
            && l.contains("\"then\":\"park\"")
            && l.contains("\"wait\":\"channel receive\"")),
        "{text}"
    );
    // The name, escaped, names the waiter's slices.
    assert!(events.iter().any(|l| l.contains("\"name\":\"the \\\"waiter\\\"\"")), "{text}");
}

#[test]
fn trace_start_and_stop_say_what_is_wrong() {
    let rt = vt::Runtime::builder().carriers(1).build().unwrap();
    let e = rt.trace_stop().unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    let bad = temp("no-such-dir").join("x").join("trace.json");
    let e = rt.trace_start(&bad).unwrap_err();
    assert!(e.to_string().contains("no-such-dir"), "{e}");
    let e = vt::Runtime::builder().carriers(1).trace(&bad).build().unwrap_err();
    assert!(e.to_string().contains("no-such-dir"), "{e}");
    let path = temp("twice.json");
    rt.trace_start(&path).unwrap();
    let e = rt.trace_start(temp("other.json")).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
    rt.block_on(|| vt::spawn(|| 1).join().unwrap());
    quiesce(&rt);
    let s = rt.trace_stop().unwrap();
    assert_eq!(s.path, path);
    assert!(s.events > 0);
    // A second trace on the same runtime holds only its own events.
    let second = temp("second.json");
    rt.trace_start(&second).unwrap();
    let s2 = rt.trace_stop().unwrap();
    let text = std::fs::read_to_string(&second).unwrap();
    assert!(!text.contains("\"cat\":\"run\""), "{text}");
    assert_eq!(s2.events as usize, lines(&text).len());
}

#[test]
fn vt_trace_traces_the_default_runtime_to_a_finished_file() {
    if std::env::var(CHILD).as_deref() == Ok("default") {
        let n: u64 = (0..100u64).map(|i| vt::spawn(move || i)).map(|h| h.join().unwrap()).sum();
        assert_eq!(n, 4950);
        // `exit` finishes the file (the default runtime is never dropped).
        std::process::exit(0);
    }
    let path = temp("default.json");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "vt_trace_traces_the_default_runtime_to_a_finished_file", "--nocapture"])
        .env(CHILD, "default")
        .env("VT_TRACE", &path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.trim_end().ends_with("}}"), "unfinished: {}", &text[text.len().saturating_sub(200)..]);
    let spawns = lines(&text).iter().filter(|l| l.contains("\"cat\":\"spawn\"")).count();
    assert!(spawns >= 100, "{spawns} spawns");
}

#[test]
fn a_panic_is_in_the_trace() {
    let path = temp("panic.json");
    let rt = vt::Runtime::builder().carriers(1).trace(&path).build().unwrap();
    let h = rt.spawn(|| panic!("on purpose"));
    let id = h.fiber().id().as_u64();
    assert!(h.join().is_err());
    quiesce(&rt);
    rt.trace_stop().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        lines(&text).iter().any(|l| l.contains("\"name\":\"panic\"") && num(l, "fiber") == Some(id)),
        "{text}"
    );
}
