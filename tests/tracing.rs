//! `tracing` spans and fibers. A subscriber (tracing-subscriber's `Registry`) keeps the spans
//! entered on a thread in a per-thread stack, and fibers share their carrier's thread. With the
//! cargo feature `tracing`, a span entered in a fiber stays that fiber's across its waits and no
//! other fiber sees it, and a spawned fiber runs inside its spawner's span. Without it, the
//! same program attributes events to other fibers' spans: the test asserts that too, so the
//! reason for the feature stays on record. `.ci/run` runs this file both ways.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use virtual_threads as vt;

mod common;
use common::block_in_os;

/// What the layer saw: for each span, its `n`; for each event, its `n` and the `n` of the span
/// current when it was recorded (`None`: no span).
#[derive(Default)]
struct Seen {
    span_n: HashMap<u64, u64>,
    events: Vec<(u64, Option<u64>, Option<u64>)>,
    /// The runtime's own events (target `virtual_threads`): their messages.
    runtime: Vec<String>,
}

struct Record(Arc<Mutex<Seen>>);

struct N(Option<u64>, String);

impl Visit for N {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "n" {
            self.0 = Some(value);
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.1 = format!("{value:?}");
        }
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Record {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut n = N(None, String::new());
        attrs.record(&mut n);
        if let Some(n) = n.0 {
            self.0.lock().unwrap().span_n.insert(id.into_u64(), n);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut n = N(None, String::new());
        event.record(&mut n);
        if event.metadata().target() == "virtual_threads" {
            self.0.lock().unwrap().runtime.push(n.1);
            return;
        }
        let Some(n) = n.0 else { return };
        let current = ctx.lookup_current().map(|s| s.id().into_u64());
        let parent = ctx.lookup_current().and_then(|s| s.parent().map(|p| p.id().into_u64()));
        let mut seen = self.0.lock().unwrap();
        let span_n = current.and_then(|id| seen.span_n.get(&id).copied());
        let parent_n = parent.and_then(|id| seen.span_n.get(&id).copied());
        seen.events.push((n, span_n, parent_n));
    }
}

fn seen() -> Arc<Mutex<Seen>> {
    static SEEN: OnceLock<Arc<Mutex<Seen>>> = OnceLock::new();
    SEEN.get_or_init(|| {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let subscriber = tracing_subscriber::registry().with(Record(seen.clone()));
        tracing::subscriber::set_global_default(subscriber).unwrap();
        seen
    })
    .clone()
}

const FIBERS: u64 = 1_000;

#[test]
fn each_fibers_events_carry_its_own_span_across_a_wait() {
    let seen = seen();
    let rt = vt::Runtime::builder().carriers(2).build().unwrap();
    rt.block_on(|| {
        // Every fiber enters its span, then all wait at once (so that each wait switches to
        // fibers that entered theirs), then each logs inside its span.
        let barrier = Arc::new(vt::sync::Barrier::new(FIBERS as usize));
        let hs: Vec<_> = (0..FIBERS)
            .map(|n| {
                let barrier = barrier.clone();
                vt::spawn(move || {
                    // A root span: without the feature, a span made while other fibers' spans
                    // are on the thread's stack would get the last one as parent, and a chain
                    // of 1,000 parents closes recursively, deeper than a fiber's stack.
                    let span = tracing::info_span!(parent: None, "request", n);
                    let _in = span.enter();
                    barrier.wait();
                    tracing::info!(n, "after the wait");
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
    let seen = seen.lock().unwrap();
    let mine: Vec<_> = seen.events.iter().filter(|(n, ..)| *n < FIBERS).collect();
    assert_eq!(mine.len(), FIBERS as usize);
    let wrong = mine.iter().filter(|(n, span, _)| *span != Some(*n)).count();
    if cfg!(feature = "tracing") {
        assert_eq!(wrong, 0, "events attributed to another fiber's span");
    } else {
        // The mix-up the feature exists for: the carrier thread's span stack holds every
        // fiber's span, and an event goes to whichever was entered last.
        assert!(wrong > FIBERS as usize / 2, "only {wrong} of {FIBERS} events went to another span");
    }
}

#[test]
fn a_spawned_fiber_runs_inside_its_spawners_span() {
    let seen = seen();
    let rt = vt::Runtime::builder().carriers(2).build().unwrap();
    let n = 5_000_000u64;
    rt.block_on(move || {
        let span = tracing::info_span!("parent", n);
        let _in = span.enter();
        vt::spawn(move || {
            vt::yield_now();
            let child = tracing::info_span!("child", n = n + 1);
            let _c = child.enter();
            tracing::info!(n = n + 2, "in the child");
        })
        .join()
        .unwrap();
    });
    let seen = seen.lock().unwrap();
    let ev = seen.events.iter().find(|(e, ..)| *e == n + 2).expect("the child's event");
    assert_eq!(ev.1, Some(n + 1), "the child's own span is current");
    if cfg!(feature = "tracing") {
        assert_eq!(ev.2, Some(n), "the child's span has the spawner's as parent");
    }
}

#[test]
fn the_runtimes_notable_events_go_through_tracing() {
    let seen = seen();
    let rt = vt::Runtime::builder().carriers(1).max_carriers(2).build().unwrap();
    rt.block_on(|| {
        assert!(vt::spawn(|| panic!("on purpose")).join().is_err());
        // Blocks the carrier in the OS with a fiber waiting behind it: the supervisor reports
        // it and compensates. Not a sleep, which the `hooks` feature turns into a park.
        let waiting = vt::spawn(vt::yield_now);
        vt::spawn(|| block_in_os(std::time::Duration::from_millis(600))).join().unwrap();
        waiting.join().unwrap();
    });
    let m = rt.metrics();
    assert!(m.compensations >= 1, "the supervisor did not compensate: {m:?}");
    let seen = seen.lock().unwrap();
    let has = |what: &str| seen.runtime.iter().any(|m| m.contains(what));
    if cfg!(feature = "tracing") {
        assert!(has("a fiber panicked"), "{:?}", seen.runtime);
        assert!(has("compensating carrier"), "{:?}", seen.runtime);
        if m.detections > 0 {
            assert!(has("a carrier is blocked in the OS"), "{:?}", seen.runtime);
        }
    } else {
        assert!(seen.runtime.is_empty(), "{:?}", seen.runtime);
    }
}
