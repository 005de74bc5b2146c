//! The `vt-trace` thread: drains the rings every `DRAIN_EVERY` and writes Chrome trace-event
//! JSON (the "JSON Object Format": `{"traceEvents": [...]}`), which Perfetto's UI and trace
//! processor load. Carriers are threads (`tid` = carrier index) of one process; a run slice is
//! a complete event (`"ph":"X"`) named after its fiber; a wake is a flow (`"s"` in the waker's
//! slice, `"f"` on the woken fiber's next slice).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::panic::Location;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{BY_THREAD, BY_TIMER, End, Event, Inner, Kind, Ring, TraceSummary, now};
use crate::fiber::wait::{WAIT_TIMED, WaitReason};

const DRAIN_EVERY: Duration = Duration::from_millis(5);
/// The track of plain threads and the supervisor.
pub(crate) const RUNTIME_TID: u64 = 100_000;

struct Clock {
    t0: Instant,
    c0: u64,
    /// Microseconds per tick, refined at each drain (the longer the window, the better).
    us_per_tick: f64,
}

impl Clock {
    fn refine(&mut self) {
        let ns = self.t0.elapsed().as_nanos() as f64;
        let ticks = now().wrapping_sub(self.c0) as f64;
        if ns > 1e6 && ticks > 0.0 {
            self.us_per_tick = ns / 1e3 / ticks;
        }
    }

    fn us(&self, ts: u64) -> f64 {
        (ts as i64).wrapping_sub(self.c0 as i64) as f64 * self.us_per_tick
    }

    /// Nanoseconds since the trace started (0 for what came before).
    fn ns(&self, ts: u64) -> u64 {
        (self.us(ts) * 1e3).max(0.0) as u64
    }
}

struct Out {
    w: BufWriter<File>,
    line: String,
    first: bool,
    events: u64,
    /// Fibers' names as their `Name` events spelt them (bytes: a character may straddle two).
    names: HashMap<u64, Vec<u8>>,
    /// Spawn sites as JSON string contents, by address: formatted once each.
    sites: HashMap<u64, Box<str>>,
    /// Flows started by a wake, waiting for the woken fiber's next slice.
    flows: HashMap<u64, u64>,
    next_flow: u64,
    tracks: Vec<bool>,
}

/// `started`: the `Instant` and the counter read together before any carrier could record.
pub(super) fn run(
    inner: &Arc<Inner>,
    file: File,
    first_drops: Vec<u64>,
    started: (Instant, u64),
) -> io::Result<TraceSummary> {
    let mut clock = Clock { t0: started.0, c0: started.1, us_per_tick: 1e-3 };
    let mut out = Out {
        w: BufWriter::with_capacity(1 << 20, file),
        line: String::with_capacity(512),
        first: true,
        events: 0,
        names: HashMap::new(),
        sites: HashMap::new(),
        flows: HashMap::new(),
        next_flow: 1,
        tracks: Vec::new(),
    };
    out.w.write_all(b"{\"traceEvents\":[\n")?;
    out.raw(format_args!(
        "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":1,\"args\":{{\"name\":\"virtual-threads\"}}}}"
    ))?;
    out.raw(format_args!(
        "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":{RUNTIME_TID},\"args\":{{\"name\":\"plain threads and supervisor\"}}}}"
    ))?;
    let mut batch = Vec::new();
    let mut rings: Vec<Option<Arc<Ring>>> = Vec::new();
    let mut tagged: Vec<(u64, Event)> = Vec::new();
    loop {
        let last = inner.stop.load(Ordering::Acquire);
        if !last {
            std::thread::park_timeout(DRAIN_EVERY);
        }
        rings.clone_from(&inner.rings.lock().unwrap_or_else(|e| e.into_inner()));
        let mut carrier_of = Vec::new();
        for (i, r) in rings.iter().enumerate() {
            if let Some(r) = r {
                let before = batch.len();
                r.drain(&mut batch);
                carrier_of.push((before, batch.len(), i as u64));
            }
        }
        let plain_from = batch.len();
        batch.append(&mut inner.plain.lock().unwrap_or_else(|e| e.into_inner()));
        clock.refine();
        // Each event with its track, in time order: the writer's state (names, flows) follows
        // the order things happened in, whichever ring they came through.
        tagged.clear();
        for &(from, to, c) in &carrier_of {
            tagged.extend(batch[from..to].iter().map(|e| (c, *e)));
        }
        tagged.extend(batch[plain_from..].iter().map(|e| (RUNTIME_TID, *e)));
        batch.clear();
        tagged.sort_unstable_by_key(|(_, e)| e.ts);
        for (tid, e) in &tagged {
            out.event(&clock, *tid, e)?;
        }
        if last {
            break;
        }
    }
    let mut dropped = inner.plain_drops.load(Ordering::Relaxed);
    let end = clock.us(now());
    for (i, r) in rings.iter().enumerate() {
        let Some(r) = r else { continue };
        let d = r.drops() - first_drops.get(i).copied().unwrap_or(0);
        if d > 0 {
            dropped += d;
            out.raw(format_args!(
                "{{\"ph\":\"i\",\"s\":\"t\",\"cat\":\"trace\",\"name\":\"{d} events dropped (buffer full)\",\"pid\":1,\"tid\":{i},\"ts\":{end:.3}}}"
            ))?;
        }
    }
    let events = out.events;
    write!(
        out.w,
        "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{{\"producer\":\"virtual-threads\",\"events\":{events},\"dropped\":{dropped}}}}}\n"
    )?;
    out.w.flush()?;
    if dropped > 0 {
        eprintln!(
            "virtual-threads: the trace lost {dropped} events: a carrier's buffer was full (the writer thread fell behind)"
        );
    }
    Ok(TraceSummary { path: Default::default(), events, dropped })
}

fn site_of(z: u64) -> Option<&'static Location<'static>> {
    // SAFETY: the recorder only ever stores `&'static Location` pointers (or 0) in a site field.
    (z != 0).then(|| unsafe { &*(z as *const Location<'static>) })
}

fn end_name(a: u8) -> &'static str {
    match a {
        x if x == End::Yield as u8 => "yield",
        x if x == End::Park as u8 => "park",
        _ => "finish",
    }
}

impl Out {
    fn raw(&mut self, args: std::fmt::Arguments<'_>) -> io::Result<()> {
        if !self.first {
            self.w.write_all(b",\n")?;
        }
        self.first = false;
        self.events += 1;
        self.w.write_fmt(args)
    }

    fn track(&mut self, tid: u64) -> io::Result<()> {
        if tid == RUNTIME_TID {
            return Ok(());
        }
        let i = tid as usize;
        if self.tracks.len() <= i {
            self.tracks.resize(i + 1, false);
        }
        if !self.tracks[i] {
            self.tracks[i] = true;
            self.raw(format_args!(
                "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":1,\"tid\":{tid},\"args\":{{\"name\":\"carrier {tid}\"}}}}"
            ))?;
            self.raw(format_args!(
                "{{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":1,\"tid\":{tid},\"args\":{{\"sort_index\":{tid}}}}}"
            ))?;
        }
        Ok(())
    }

    fn event(&mut self, clock: &Clock, tid: u64, e: &Event) -> io::Result<()> {
        self.track(tid)?;
        let ts = clock.us(e.ts).max(0.0);
        let mut l = std::mem::take(&mut self.line);
        l.clear();
        let kind = e.kind;
        if kind == Kind::Slice as u8 {
            let id = e.x;
            let t = clock.ns(e.ts);
            if let Some(flow) = self.flows.remove(&id) {
                l.push_str("{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"wake\",\"name\":\"wake\",\"id\":");
                push_u64(&mut l, flow);
                l.push_str(",\"pid\":1,\"tid\":");
                push_u64(&mut l, tid);
                l.push_str(",\"ts\":");
                push_us(&mut l, t);
                l.push('}');
                self.raw_line(&l)?;
                l.clear();
            }
            l.push_str("{\"ph\":\"X\",\"cat\":\"run\",\"name\":\"");
            match self.names.get(&id) {
                Some(n) => escape(&mut l, &String::from_utf8_lossy(n)),
                None => {
                    l.push_str("fiber ");
                    push_u64(&mut l, id);
                }
            }
            l.push_str("\",\"pid\":1,\"tid\":");
            push_u64(&mut l, tid);
            l.push_str(",\"ts\":");
            push_us(&mut l, t);
            l.push_str(",\"dur\":");
            push_us(&mut l, clock.ns(e.y).saturating_sub(t));
            l.push_str(",\"args\":{\"fiber\":");
            push_u64(&mut l, id);
            l.push_str(",\"resumes\":");
            push_u64(&mut l, u64::from(e.c));
            l.push_str(",\"then\":\"");
            l.push_str(end_name(e.a));
            l.push('"');
            if e.a == End::Park as u8 {
                let _ = write!(l, ",\"wait\":\"{}\"", WaitReason::from_code(e.b as u8));
                if e.b as u8 & WAIT_TIMED != 0 {
                    l.push_str(",\"timed\":true");
                }
            }
            self.push_site(&mut l, e.z);
            l.push_str("}}");
            if e.a == End::Finish as u8 {
                self.names.remove(&id);
            }
        } else if kind == Kind::Spawn as u8 {
            l.push_str("{\"ph\":\"i\",\"s\":\"t\",\"cat\":\"spawn\",\"name\":\"spawn\",\"pid\":1,\"tid\":");
            push_u64(&mut l, tid);
            l.push_str(",\"ts\":");
            push_us(&mut l, clock.ns(e.ts));
            l.push_str(",\"args\":{\"fiber\":");
            push_u64(&mut l, e.x);
            l.push_str(",\"parent\":");
            push_u64(&mut l, e.y);
            self.push_site(&mut l, e.z);
            l.push_str("}}");
        } else if kind == Kind::Name as u8 {
            let mut b = [0u8; 18];
            b[..8].copy_from_slice(&e.y.to_le_bytes());
            b[8..16].copy_from_slice(&e.z.to_le_bytes());
            b[16..].copy_from_slice(&e.b.to_le_bytes());
            let name = self.names.entry(e.x).or_default();
            if e.c == 0 {
                name.clear();
            }
            name.extend_from_slice(&b[..(e.a as usize).min(18)]);
            self.line = l;
            return Ok(());
        } else if kind == Kind::Wake as u8 {
            if self.flows.contains_key(&e.x) {
                // Woken again before it ran: the first wake's flow stands.
                self.line = l;
                return Ok(());
            }
            let flow = self.next_flow;
            self.next_flow += 1;
            self.flows.insert(e.x, flow);
            l.push_str("{\"ph\":\"s\",\"cat\":\"wake\",\"name\":\"wake\",\"id\":");
            push_u64(&mut l, flow);
            l.push_str(",\"pid\":1,\"tid\":");
            push_u64(&mut l, tid);
            l.push_str(",\"ts\":");
            push_us(&mut l, clock.ns(e.ts));
            l.push_str(",\"args\":{\"fiber\":");
            push_u64(&mut l, e.x);
            l.push_str(",\"by\":");
            match e.a {
                BY_TIMER => l.push_str("\"timer\""),
                BY_THREAD => l.push_str("\"thread\""),
                _ => push_u64(&mut l, e.y),
            }
            if e.b != 0 {
                l.push_str(",\"cancel\":true");
            }
            l.push_str("}}");
        } else if kind == Kind::Idle as u8 {
            // An idle period that began before the trace is shown from the trace's start.
            let end = clock.ns(e.ts);
            let start = end.saturating_sub(e.x);
            l.push_str("{\"ph\":\"X\",\"cat\":\"idle\",\"name\":\"idle\",\"pid\":1,\"tid\":");
            push_u64(&mut l, tid);
            l.push_str(",\"ts\":");
            push_us(&mut l, start);
            l.push_str(",\"dur\":");
            push_us(&mut l, end - start);
            l.push('}');
        } else {
            let (name, args) = match kind {
                k if k == Kind::Steal as u8 => ("steal", format!("\"from\":{},\"fibers\":{}", e.x, e.y)),
                k if k == Kind::CarrierStart as u8 => {
                    ("carrier started", format!("\"compensating\":{}", e.a == 1))
                }
                k if k == Kind::CarrierRetire as u8 => ("carrier retired", String::new()),
                k if k == Kind::Blocked as u8 => {
                    ("carrier blocked in the OS", format!("\"carrier\":{}", e.x))
                }
                k if k == Kind::Compensate as u8 => {
                    ("compensating carrier", format!("\"carrier\":{},\"revived\":{}", e.x, e.a == 1))
                }
                k if k == Kind::Panic as u8 => ("panic", format!("\"fiber\":{}", e.x)),
                k if k == Kind::Blocking as u8 => ("blocking section", format!("\"fiber\":{}", e.x)),
                _ => ("unknown", String::new()),
            };
            let _ = write!(
                l,
                "{{\"ph\":\"i\",\"s\":\"t\",\"cat\":\"runtime\",\"name\":\"{name}\",\"pid\":1,\"tid\":{tid},\"ts\":{ts:.3},\"args\":{{{args}"
            );
            if let Some(at) = site_of(e.z) {
                l.push_str(if args.is_empty() { "\"site\":\"" } else { ",\"site\":\"" });
                escape(&mut l, &at.to_string());
                l.push('"');
            }
            l.push_str("}}");
        }
        let r = self.raw_line(&l);
        self.line = l;
        r
    }

    fn raw_line(&mut self, l: &str) -> io::Result<()> {
        if !self.first {
            self.w.write_all(b",\n")?;
        }
        self.first = false;
        self.events += 1;
        self.w.write_all(l.as_bytes())
    }

    /// `,"site":"file:line:col"`, formatted once per site.
    fn push_site(&mut self, l: &mut String, z: u64) {
        let Some(at) = site_of(z) else { return };
        let s = self.sites.entry(z).or_insert_with(|| {
            let mut s = String::new();
            escape(&mut s, &at.to_string());
            s.into_boxed_str()
        });
        l.push_str(",\"site\":\"");
        l.push_str(s);
        l.push('"');
    }
}

fn push_u64(l: &mut String, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &buf[i..] {
        l.push(d as char);
    }
}

/// `ns` as microseconds with three decimals (the trace-event format's unit), without the
/// float formatting that cost the writer most of its time.
fn push_us(l: &mut String, ns: u64) {
    push_u64(l, ns / 1000);
    let f = ns % 1000;
    l.push('.');
    for d in [f / 100, f / 10 % 10, f % 10] {
        l.push((b'0' + d as u8) as char);
    }
}

/// Writes `s` as the inside of a JSON string.
fn escape(out: &mut String, s: &str) {
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}
