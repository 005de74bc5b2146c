//! `vt-trace-report` on traces the runtime wrote: its totals agree with `Runtime::metrics`
//! (fibers spawned, switches, compensating carriers), its HTML is self-contained, and the trace
//! passes a strict check of the trace-event format (the JSON object form that Perfetto's
//! importer reads: every field typed, no field or phase it does not know).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use virtual_threads as vt;

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vt-trace-report-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn report(args: &[&Path]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_vt-trace-report")).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn summary_value(summary: &str, key: &str) -> u64 {
    let line =
        summary.lines().find(|l| l.starts_with(&format!("{key}="))).unwrap_or_else(|| panic!("{summary}"));
    line[key.len() + 1..].split_whitespace().next().unwrap().parse().unwrap()
}

/// The trace-event format's rules as Perfetto's JSON importer reads them, for the phases the
/// runtime writes: a strict schema check by hand.
fn check_trace_event_format(doc: &Value) {
    let top = doc.as_object().expect("the object form");
    for k in top.keys() {
        assert!(
            ["traceEvents", "displayTimeUnit", "otherData"].contains(&k.as_str()),
            "unknown top-level field {k}"
        );
    }
    assert!(matches!(top.get("displayTimeUnit").and_then(Value::as_str), Some("ms" | "ns")));
    let known = ["ph", "name", "cat", "pid", "tid", "ts", "dur", "id", "s", "bp", "args"];
    for e in top["traceEvents"].as_array().expect("traceEvents is an array") {
        let o = e.as_object().expect("an event is an object");
        for k in o.keys() {
            assert!(known.contains(&k.as_str()), "unknown field {k} in {e}");
        }
        let has = |k: &str| o.contains_key(k);
        let ph = o["ph"].as_str().expect("ph is a string");
        assert!(o["pid"].is_u64(), "{e}");
        assert!(o.get("name").is_none_or(Value::is_string), "{e}");
        assert!(o.get("args").is_none_or(Value::is_object), "{e}");
        if ph != "M" {
            assert!(o["tid"].is_u64() && o["ts"].as_f64().is_some_and(|t| t >= 0.0), "{e}");
        }
        match ph {
            "X" => assert!(has("name") && o["dur"].as_f64().is_some_and(|d| d >= 0.0), "{e}"),
            "i" => assert!(has("name") && matches!(o["s"].as_str(), Some("t" | "p" | "g")), "{e}"),
            "s" => assert!(has("cat") && has("name") && o["id"].is_u64(), "{e}"),
            "f" => assert!(has("cat") && o["id"].is_u64() && o["bp"] == "e", "{e}"),
            "M" => assert!(
                matches!(o["name"].as_str(), Some("process_name" | "thread_name" | "thread_sort_index"))
                    && has("args"),
                "{e}"
            ),
            other => panic!("phase {other} is not one the runtime writes: {e}"),
        }
    }
}

#[test]
fn the_reports_totals_agree_with_the_runtimes_metrics() {
    let trace = temp("metrics.json");
    let rt = vt::Runtime::builder().carriers(1).max_carriers(3).trace(&trace).build().unwrap();
    rt.block_on(|| {
        let (tx, rx) = vt::channel::bounded::<u64>(2);
        let hs: Vec<_> = (0..300u64)
            .map(|i| {
                let tx = tx.clone();
                vt::spawn(move || tx.send(i).unwrap())
            })
            .collect();
        drop(tx);
        assert_eq!(rx.iter().sum::<u64>(), 300 * 299 / 2);
        // A carrier blocked in the OS with fibers waiting: the supervisor compensates.
        let waiting: Vec<_> = (0..4).map(|_| vt::spawn(vt::yield_now)).collect();
        vt::spawn(|| std::thread::sleep(Duration::from_millis(600))).join().unwrap();
        for h in hs.into_iter().chain(waiting) {
            h.join().unwrap();
        }
    });
    while rt.metrics().fibers_live > 0 {
        std::thread::yield_now();
    }
    let m = rt.metrics();
    rt.trace_stop().unwrap();
    let summary = report(&[Path::new("--summary"), &trace]);
    assert_eq!(summary_value(&summary, "fibers_spawned"), m.fibers_spawned, "{summary}");
    assert_eq!(summary_value(&summary, "switches"), m.switches, "{summary}");
    assert_eq!(summary_value(&summary, "compensations"), m.compensations, "{summary}");
    assert!(m.compensations >= 1, "{m:?}");
    assert_eq!(summary_value(&summary, "dropped"), 0);
    assert!(
        summary.contains("wait[channel send]=") || summary.contains("wait[channel receive]="),
        "{summary}"
    );

    check_trace_event_format(&serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap());

    let html = temp("metrics.html");
    report(&[&trace, &html]);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains(&format!("<b id=\"switches\">{}</b>", m.switches)));
    assert!(page.contains("Wait profile by wait reason") && page.contains("<td>channel "));
    // Self-contained: nothing is fetched.
    assert!(!page.contains("src=") && !page.contains("href="), "the report links out");
}

#[test]
fn a_file_that_is_not_a_trace_is_a_clear_error() {
    let bad = temp("bad.json");
    std::fs::write(&bad, "{\"traceEvents\": 3}").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vt-trace-report")).arg(&bad).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("traceEvents"));
}
