//! Placement by load (`arch/decisions/0014-placement-by-load.md`): a carrier that starts a
//! burst of long-lived fibers while the other carrier is busy sends half of them there before
//! they start; a fiber placed on a carrier that then never yields still starts elsewhere.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use virtual_threads as vt;

mod common;

/// Long-lived fibers in the burst.
const BURST: usize = 200;

/// What the other carrier does while the burst starts.
#[derive(Clone, Copy)]
enum Busy {
    /// A loop of `yield_now`: the carrier runs fibers, so it never goes idle to steal.
    Yielding,
    /// A loop with no switch point: nothing else runs on that carrier until it ends.
    Hogging,
}

/// Per carrier: fibers started during the burst and fibers placed elsewhere.
struct Burst {
    started: Vec<u64>,
    placed: Vec<u64>,
}

/// On a runtime of two carriers: a busy fiber takes one carrier (the spawner spins without a
/// switch point until it runs, so the other carrier took it), then `BURST` fibers are spawned
/// on the spawner's carrier; each counts itself and waits on a gate. Once all have started
/// (synchronised on the count, not timed), the busy fiber stops and the gate opens.
fn burst(rt: &vt::Runtime, busy: Busy) -> Burst {
    let before = rt.metrics().per_carrier;
    rt.block_on(|| {
        let running = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (running.clone(), stop.clone());
        let busy_fiber = vt::spawn(move || {
            r.store(true, Ordering::Release);
            while !s.load(Ordering::Acquire) {
                match busy {
                    Busy::Yielding => vt::yield_now(),
                    Busy::Hogging => std::hint::spin_loop(),
                }
            }
        });
        while !running.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        let gate = Arc::new(vt::sync::RwLock::new(()));
        let closed = gate.write().unwrap();
        let started = Arc::new(AtomicUsize::new(0));
        let fibers: Vec<_> = (0..BURST)
            .map(|_| {
                let (gate, started) = (gate.clone(), started.clone());
                vt::spawn(move || {
                    started.fetch_add(1, Ordering::Relaxed);
                    drop(gate.read().unwrap());
                })
            })
            .collect();
        while started.load(Ordering::Relaxed) < BURST {
            vt::yield_now();
        }
        stop.store(true, Ordering::Release);
        busy_fiber.join().unwrap();
        drop(closed);
        fibers.into_iter().for_each(|f| f.join().unwrap());
    });
    let after = rt.metrics().per_carrier;
    // A spare started meanwhile has no entry before.
    let was = |i: usize| before.get(i).cloned().unwrap_or_default();
    Burst {
        started: after.iter().enumerate().map(|(i, a)| a.fibers_started - was(i).fibers_started).collect(),
        placed: after.iter().enumerate().map(|(i, a)| a.fibers_placed - was(i).fibers_placed).collect(),
    }
}

/// Two carriers. `interval`: the supervisor's; a placer gives up on a target that made no
/// switch for two of them, which a carrier thread the OS leaves waiting for a CPU that long
/// (tests run side by side on a loaded machine) looks like.
fn runtime(place: bool, interval: Duration) -> vt::Runtime {
    vt::Runtime::builder()
        .carriers(2)
        .max_carriers(4)
        .place_by_load(place)
        .supervisor_interval(interval)
        .build()
        .unwrap()
}

const PATIENT: Duration = Duration::from_millis(200);

#[test]
fn a_burst_beside_a_yielding_carrier_is_placed_on_both() {
    let b = common::within(Duration::from_secs(120), "the burst", || {
        burst(&runtime(true, PATIENT), Busy::Yielding)
    });
    // The spawner's carrier keeps about half: it places every other fiber once it is home to
    // 32 more than twice the other's.
    assert_eq!(b.started.len(), 2, "no spare: nothing blocked ({:?})", b.started);
    let placed: u64 = b.placed.iter().sum();
    assert!(placed >= BURST as u64 / 4, "placed {placed} of {BURST} ({:?})", b.placed);
    assert!(b.started.iter().all(|&n| n >= BURST as u64 / 4), "started per carrier {:?}", b.started);
}

#[test]
fn without_placement_a_burst_beside_a_yielding_carrier_starts_on_one() {
    let b = common::within(Duration::from_secs(120), "the burst", || {
        burst(&runtime(false, PATIENT), Busy::Yielding)
    });
    assert_eq!(b.placed.iter().sum::<u64>(), 0);
    // The burst, and on the other carrier the busy fiber alone.
    assert!(b.started.iter().any(|&n| n >= BURST as u64), "started per carrier {:?}", b.started);
}

#[test]
fn a_fiber_placed_on_a_carrier_that_never_yields_still_starts() {
    // The hog does not yield until every fiber of the burst has started: the burst finishes
    // only if the fibers placed on its carrier before the supervisor caught it start elsewhere
    // (the placer stops placing and takes them back, or a spare takes them). Started: the
    // burst, the hog and `block_on`'s fiber.
    let b = common::within(Duration::from_secs(120), "the burst beside a hog", || {
        burst(&runtime(true, Duration::from_millis(5)), Busy::Hogging)
    });
    assert!(b.placed.iter().sum::<u64>() > 0, "nothing was placed, so nothing was tested: {:?}", b.placed);
    assert_eq!(b.started.iter().sum::<u64>(), BURST as u64 + 2, "started per carrier {:?}", b.started);
}

/// Drops `n` on drop: counts the fibers that ended, by running or by the runtime's unwinding.
struct Ended(Arc<AtomicUsize>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn placed_fibers_waiting_show_in_the_dump_and_end_with_the_runtime() {
    // A long supervisor interval keeps the hog's carrier unheld and the placer patient (two
    // intervals, 10 s) while the test looks: what was placed there waits in the injector. A
    // loaded machine that delays the look past that fails the count, not silently.
    let rt = vt::Runtime::builder()
        .carriers(2)
        .max_carriers(2)
        .place_by_load(true)
        .supervisor_interval(Duration::from_secs(5))
        .build()
        .unwrap();
    let running = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let (started, ended) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (r, s) = (running.clone(), stop.clone());
    let hog = rt.spawn(move || {
        r.store(true, Ordering::Release);
        while !s.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
    });
    let (st, en, r, s) = (started.clone(), ended.clone(), running.clone(), stop.clone());
    let (_keep, never) = vt::channel::unbounded::<()>();
    // The spawner keeps its carrier busy after the burst, yielding: an idle carrier would take
    // the placed fibers back from the injector at once.
    let spawner = rt.spawn(move || {
        // Spinning, not yielding: this carrier cannot take the hog, so the other did.
        while !r.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        for _ in 0..BURST {
            let (st, en, never) = (st.clone(), Ended(en.clone()), never.clone());
            vt::spawn(move || {
                let _ended = en;
                st.fetch_add(1, Ordering::Relaxed);
                let _ = never.recv();
            });
        }
        while !s.load(Ordering::Acquire) {
            vt::yield_now();
        }
    });
    let placed = || rt.metrics().per_carrier.iter().map(|c| c.fibers_placed).sum::<u64>() as usize;
    // Every fiber of the burst either started (on the spawner's carrier) or was placed.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while started.load(Ordering::Relaxed) + placed() < BURST {
        assert!(std::time::Instant::now() < deadline, "the burst never finished starting");
        std::thread::sleep(Duration::from_millis(1));
    }
    let waiting = BURST - started.load(Ordering::Relaxed);
    assert!(waiting > 0 && waiting == placed(), "placed {} of {BURST}, {waiting} not started", placed());
    let runnable = rt.dump().fibers().iter().filter(|f| matches!(f.state, vt::FiberState::Runnable)).count();
    assert!(runnable >= waiting, "{runnable} runnable in the dump, {waiting} placed and waiting");
    // The drop unwinds every fiber of the burst, started or not (the hog stops first: a fiber
    // that never switches holds the drop too).
    stop.store(true, Ordering::Release);
    hog.join().unwrap();
    spawner.join().unwrap();
    drop(rt);
    assert_eq!(ended.load(Ordering::Relaxed), BURST);
}
