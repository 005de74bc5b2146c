//! Reads a `virtual-threads` trace (Chrome trace-event JSON, as `scheduler/trace/writer.rs`
//! writes it) and derives what the report shows: the carriers' timelines, the wait profile per
//! wait reason and per spawn site, each fiber's longest waits, and the totals that must agree
//! with `Runtime::metrics` (fibers spawned, switches, compensating carriers).

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

/// One run slice, idle period or instant on a carrier's track (microseconds).
#[derive(Clone, Debug)]
pub struct Slice {
    pub fiber: u64,
    pub name: String,
    pub ts: f64,
    pub dur: f64,
    /// `yield`, `park` or `finish`; `idle` for an idle period.
    pub then: String,
    pub wait: Option<String>,
    pub site: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct Track {
    pub name: String,
    pub slices: Vec<Slice>,
    pub idle: Vec<(f64, f64)>,
    /// Instants: (time, what).
    pub marks: Vec<(f64, String)>,
}

/// One finished wait of a fiber: parked for `dur` (until its wake, or its next run when the
/// wake is not in the trace).
#[derive(Clone, Debug)]
pub struct Wait {
    pub reason: String,
    pub site: String,
    pub dur: f64,
}

/// Count, total, p50, p99 and max of a set of waits (microseconds).
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub count: usize,
    pub total: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Stats {
    fn of(mut d: Vec<f64>) -> Stats {
        if d.is_empty() {
            return Stats::default();
        }
        d.sort_by(f64::total_cmp);
        let at = |q: f64| d[((d.len() as f64 * q).ceil() as usize).clamp(1, d.len()) - 1];
        Stats { count: d.len(), total: d.iter().sum(), p50: at(0.50), p99: at(0.99), max: d[d.len() - 1] }
    }
}

/// What a fiber did over the trace.
#[derive(Clone, Debug, Default)]
pub struct FiberSummary {
    pub id: u64,
    pub name: String,
    pub site: String,
    pub slices: usize,
    pub run: f64,
    pub parked: f64,
    /// Its longest waits, longest first: (duration, reason).
    pub longest: Vec<(f64, String)>,
}

/// The trace's totals, for the agreement with `Runtime::metrics`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub fibers_spawned: u64,
    pub run_slices: u64,
    /// Resumes summed over the run slices: `Metrics::switches`.
    pub switches: u64,
    pub compensations: u64,
    pub blocked: u64,
    pub panics: u64,
    pub events: u64,
    pub dropped: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub tracks: Vec<Track>,
    pub start: f64,
    pub end: f64,
    pub totals: Totals,
    pub by_reason: Vec<(String, Stats)>,
    pub by_site: Vec<(String, Stats)>,
    pub fibers: Vec<FiberSummary>,
}

fn s(v: &Value, k: &str) -> Option<String> {
    v.get(k).and_then(Value::as_str).map(str::to_owned)
}

fn n(v: &Value, k: &str) -> Option<u64> {
    v.get(k).and_then(Value::as_u64)
}

fn f(v: &Value, k: &str) -> f64 {
    v.get(k).and_then(Value::as_f64).unwrap_or(0.0)
}

/// Parses and analyses a trace. Errors name what is wrong with the file.
pub fn analyze(text: &str, longest_per_fiber: usize) -> Result<Report, String> {
    let root: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let events = root
        .get("traceEvents")
        .and_then(Value::as_array)
        .ok_or("no \"traceEvents\" array: not a trace-event file in the object format")?;
    let mut r = Report { start: f64::MAX, end: f64::MIN, ..Report::default() };
    let mut tracks: BTreeMap<u64, Track> = BTreeMap::new();
    let mut wakes: HashMap<u64, Vec<f64>> = HashMap::new();
    let mut sites: HashMap<u64, String> = HashMap::new();
    for e in events {
        let ph = s(e, "ph").unwrap_or_default();
        let tid = n(e, "tid").unwrap_or(0);
        let args = e.get("args").cloned().unwrap_or(Value::Null);
        let ts = f(e, "ts");
        if ph != "M" {
            r.start = r.start.min(ts);
            r.end = r.end.max(ts + f(e, "dur"));
        }
        let cat = s(e, "cat").unwrap_or_default();
        let name = s(e, "name").unwrap_or_default();
        let track = || Track { name: format!("carrier {tid}"), ..Track::default() };
        match (ph.as_str(), cat.as_str()) {
            ("M", _) if name == "thread_name" => {
                tracks.entry(tid).or_insert_with(track).name = s(&args, "name").unwrap_or_default();
            }
            ("X", "run") => {
                let fiber = n(&args, "fiber").unwrap_or(0);
                r.totals.run_slices += 1;
                r.totals.switches += n(&args, "resumes").unwrap_or(1);
                let site = s(&args, "site");
                if let Some(site) = &site {
                    sites.entry(fiber).or_insert_with(|| site.clone());
                }
                tracks.entry(tid).or_insert_with(track).slices.push(Slice {
                    fiber,
                    name,
                    ts,
                    dur: f(e, "dur"),
                    then: s(&args, "then").unwrap_or_default(),
                    wait: s(&args, "wait"),
                    site,
                });
            }
            ("X", "idle") => tracks.entry(tid).or_insert_with(track).idle.push((ts, f(e, "dur"))),
            ("s", "wake") => wakes.entry(n(&args, "fiber").unwrap_or(0)).or_default().push(ts),
            ("i", "spawn") => {
                r.totals.fibers_spawned += 1;
                if let (Some(fiber), Some(site)) = (n(&args, "fiber"), s(&args, "site")) {
                    sites.insert(fiber, site);
                }
            }
            ("i", _) => {
                match name.as_str() {
                    "compensating carrier" => r.totals.compensations += 1,
                    "carrier blocked in the OS" => r.totals.blocked += 1,
                    "panic" => r.totals.panics += 1,
                    _ => {}
                }
                let what = match n(&args, "carrier") {
                    Some(c) => format!("{name} (carrier {c})"),
                    None => name.clone(),
                };
                tracks.entry(tid).or_insert_with(track).marks.push((ts, what));
            }
            _ => {}
        }
    }
    if let Some(other) = root.get("otherData") {
        r.totals.events = n(other, "events").unwrap_or(0);
        r.totals.dropped = n(other, "dropped").unwrap_or(0);
    }
    if r.start > r.end {
        r.start = 0.0;
        r.end = 0.0;
    }

    // Each fiber's slices in time order give its waits: from a slice that ended parked to the
    // first wake after it (else its next slice).
    let mut per_fiber: HashMap<u64, Vec<&Slice>> = HashMap::new();
    for t in tracks.values() {
        for sl in &t.slices {
            per_fiber.entry(sl.fiber).or_default().push(sl);
        }
    }
    let mut waits = Vec::new();
    let mut fibers = Vec::new();
    for (id, mut sl) in per_fiber {
        sl.sort_by(|a, b| a.ts.total_cmp(&b.ts));
        let mut w = wakes.remove(&id).unwrap_or_default();
        w.sort_by(f64::total_cmp);
        let site = sites.get(&id).cloned().unwrap_or_else(|| "(spawned before the trace)".into());
        let mut fs = FiberSummary {
            id,
            name: sl[0].name.clone(),
            site: site.clone(),
            slices: sl.len(),
            ..FiberSummary::default()
        };
        for (k, s) in sl.iter().enumerate() {
            fs.run += s.dur;
            if s.then != "park" {
                continue;
            }
            let parked_at = s.ts + s.dur;
            let next = sl.get(k + 1).map(|n| n.ts);
            let i = w.partition_point(|&t| t < parked_at);
            let until = match (w.get(i), next) {
                (Some(&wake), Some(next)) if wake <= next => Some(wake),
                (Some(&wake), None) => Some(wake),
                (_, next) => next,
            };
            let Some(until) = until else { continue };
            let reason = s.wait.clone().unwrap_or_else(|| "park".into());
            let dur = (until - parked_at).max(0.0);
            fs.parked += dur;
            fs.longest.push((dur, reason.clone()));
            waits.push(Wait { reason, site: site.clone(), dur });
        }
        fs.longest.sort_by(|a, b| b.0.total_cmp(&a.0));
        fs.longest.truncate(longest_per_fiber);
        fibers.push(fs);
    }
    fibers.sort_by(|a, b| {
        let la = a.longest.first().map_or(0.0, |w| w.0);
        let lb = b.longest.first().map_or(0.0, |w| w.0);
        lb.total_cmp(&la).then(a.id.cmp(&b.id))
    });
    let group = |key: &dyn Fn(&Wait) -> String| {
        let mut m: HashMap<String, Vec<f64>> = HashMap::new();
        for w in &waits {
            m.entry(key(w)).or_default().push(w.dur);
        }
        let mut v: Vec<(String, Stats)> = m.into_iter().map(|(k, d)| (k, Stats::of(d))).collect();
        v.sort_by(|a, b| b.1.total.total_cmp(&a.1.total).then(a.0.cmp(&b.0)));
        v
    };
    r.by_reason = group(&|w| w.reason.clone());
    r.by_site = group(&|w| w.site.clone());
    r.fibers = fibers;
    for t in tracks.values_mut() {
        t.slices.sort_by(|a, b| a.ts.total_cmp(&b.ts));
        t.idle.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    r.tracks = tracks.into_values().collect();
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = r#"{"traceEvents":[
{"ph":"M","name":"thread_name","pid":1,"tid":0,"args":{"name":"carrier 0"}},
{"ph":"i","s":"t","cat":"spawn","name":"spawn","pid":1,"tid":0,"ts":1.0,"args":{"fiber":2,"parent":1,"site":"a.rs:1:1"}},
{"ph":"X","cat":"run","name":"fiber 2","pid":1,"tid":0,"ts":2.0,"dur":1.0,"args":{"fiber":2,"resumes":2,"then":"park","wait":"channel receive","site":"a.rs:1:1"}},
{"ph":"s","cat":"wake","name":"wake","id":1,"pid":1,"tid":0,"ts":13.0,"args":{"fiber":2,"by":3}},
{"ph":"X","cat":"run","name":"fiber 2","pid":1,"tid":0,"ts":20.0,"dur":1.0,"args":{"fiber":2,"resumes":1,"then":"finish","site":"a.rs:1:1"}},
{"ph":"i","s":"t","cat":"runtime","name":"compensating carrier","pid":1,"tid":100000,"ts":5.0,"args":{"carrier":1,"revived":false}}
],"otherData":{"events":6,"dropped":0}}"#;

    #[test]
    fn waits_end_at_the_wake_and_totals_count_what_metrics_count() {
        let r = analyze(TRACE, 3).unwrap();
        assert_eq!(
            r.totals,
            Totals {
                fibers_spawned: 1,
                run_slices: 2,
                switches: 3,
                compensations: 1,
                blocked: 0,
                panics: 0,
                events: 6,
                dropped: 0
            }
        );
        assert_eq!(r.by_reason.len(), 1);
        assert_eq!(r.by_reason[0].0, "channel receive");
        assert_eq!(r.by_reason[0].1.count, 1);
        assert!((r.by_reason[0].1.total - 10.0).abs() < 1e-9, "parked 3.0 → woken 13.0");
        assert_eq!(r.by_site[0].0, "a.rs:1:1");
        assert_eq!(r.fibers[0].longest[0].1, "channel receive");
    }

    #[test]
    fn a_file_that_is_not_a_trace_is_an_error_naming_why() {
        assert!(analyze("[1,2", 3).unwrap_err().contains("not JSON"));
        assert!(analyze("{}", 3).unwrap_err().contains("traceEvents"));
    }
}
