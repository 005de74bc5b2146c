//! Stopping fibers (`JoinHandle::cancel`, `CancelHandle`): at every kind of wait, from another
//! fiber and from a plain thread; destructors run once, `join` says `Cancelled`, nothing
//! leaks, no message is lost; level-triggered; the two hard cases of ADR 0004 on one carrier.

mod common;

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use virtual_threads as vt;

use common::within;

/// Counts its drops.
struct Tracked(Arc<AtomicUsize>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn rt(carriers: usize) -> vt::Runtime {
    vt::Runtime::builder().carriers(carriers).build().unwrap()
}

/// Waits (polling the dump, yielding) until fiber `id` is parked.
fn until_parked(rt: &vt::Runtime, id: vt::FiberId) {
    let start = Instant::now();
    loop {
        let parked =
            rt.dump().fibers().iter().any(|f| f.id == id && matches!(f.state, vt::FiberState::Parked { .. }));
        if parked {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "fiber {id:?} never parked");
        std::thread::yield_now();
    }
}

fn assert_cancelled<T: std::fmt::Debug>(r: std::thread::Result<T>) {
    match r {
        Err(p) => assert!(p.downcast_ref::<vt::Cancelled>().is_some(), "join's payload is not Cancelled"),
        Ok(v) => panic!("the fiber finished normally with {v:?}"),
    }
}

/// Spawns `wait` (made fresh for each canceller) in a fiber, lets it park, cancels it from a
/// plain thread and then from another fiber, and checks the stop: payload, destructors once,
/// live fibers back to their count before.
fn stops_at<W>(what: &str, rt: &vt::Runtime, make: impl Fn() -> W)
where
    W: FnOnce() + Send + 'static,
{
    let before = rt.metrics().fibers_live;
    for from_fiber in [false, true] {
        let drops = Arc::new(AtomicUsize::new(0));
        let tracked = Tracked(drops.clone());
        let wait = make();
        let h = rt.spawn(move || {
            let _t = tracked;
            wait();
        });
        until_parked(rt, h.fiber().id());
        if from_fiber {
            let c = h.cancel_handle();
            rt.spawn(move || c.cancel()).join().unwrap();
        } else {
            h.cancel();
        }
        assert_cancelled(h.join());
        assert_eq!(
            drops.load(Ordering::SeqCst),
            1,
            "{what}: destructors ran {} times",
            drops.load(Ordering::SeqCst)
        );
    }
    // The canceller fibers and the stopped ones are gone.
    until_live(rt, before, what);
}

/// Waits until the runtime counts `n` live fibers (a joined fiber's record is finished just
/// after its result is published).
fn until_live(rt: &vt::Runtime, n: u64, what: &str) {
    let start = Instant::now();
    while rt.metrics().fibers_live != n {
        assert!(start.elapsed() < Duration::from_secs(10), "{what}: live fibers did not come back to {n}");
        std::thread::yield_now();
    }
}

#[test]
fn stops_at_park_sleep_and_yield() {
    let rt = rt(2);
    stops_at("park", &rt, || {
        || loop {
            vt::park()
        }
    });
    stops_at("sleep", &rt, || || vt::sleep(Duration::from_secs(3600)));
    stops_at("park_timeout", &rt, || {
        || loop {
            vt::park_timeout(Duration::from_secs(3600))
        }
    });
    // A fiber that only yields is never parked: cancel it while it runs.
    let h = rt.spawn(|| {
        loop {
            vt::yield_now()
        }
    });
    h.cancel();
    assert_cancelled(h.join());
}

#[test]
fn stops_at_join_and_block_on() {
    let rt = rt(2);
    stops_at("join", &rt, || {
        || {
            // The joined fiber ends when this one's sender is dropped by the unwind.
            let (tx, rx) = vt::channel::bounded::<()>(0);
            let joined = vt::spawn(move || {
                let _ = rx.recv();
            });
            let _tx = tx;
            let _ = joined.join();
        }
    });
    stops_at("future::block_on", &rt, || {
        || {
            vt::future::block_on(std::future::pending::<()>());
        }
    });
}

#[test]
fn stops_at_sync_waits() {
    let rt = rt(2);
    let m = Arc::new(vt::sync::Mutex::new(0u32));
    let held = m.clone();
    let (release_tx, release_rx) = vt::channel::bounded::<()>(0);
    let (locked_tx, locked_rx) = vt::channel::bounded::<()>(0);
    let holder = rt.spawn(move || {
        let _g = held.lock().unwrap();
        locked_tx.send(()).unwrap();
        release_rx.recv().unwrap();
    });
    locked_rx.recv().unwrap();
    let m2 = m.clone();
    stops_at("Mutex::lock", &rt, move || {
        let m = m2.clone();
        move || drop(m.lock())
    });
    let rw = Arc::new(vt::sync::RwLock::new(0u32));
    let w = rw.write().unwrap();
    let rw2 = rw.clone();
    stops_at("RwLock::read", &rt, move || {
        let rw = rw2.clone();
        move || drop(rw.read())
    });
    drop(w);
    let pair = Arc::new((vt::sync::Mutex::new(false), vt::sync::Condvar::new()));
    let p2 = pair.clone();
    stops_at("Condvar::wait", &rt, move || {
        let p = p2.clone();
        move || {
            let mut g = p.0.lock().unwrap();
            while !*g {
                g = p.1.wait(g).unwrap();
            }
        }
    });
    let sem = Arc::new(vt::sync::Semaphore::new(0));
    let s2 = sem.clone();
    stops_at("Semaphore::acquire", &rt, move || {
        let s = s2.clone();
        move || drop(s.acquire())
    });
    // A barrier's waiter that is stopped stays counted (Barrier has no way to leave), so each
    // canceller gets a fresh one.
    stops_at("Barrier::wait", &rt, move || {
        let fresh = Arc::new(vt::sync::Barrier::new(2));
        move || {
            fresh.wait();
        }
    });
    // The lock is still usable, and it was not poisoned by the waiters that stopped.
    release_tx.send(()).unwrap();
    holder.join().unwrap();
    *m.lock().unwrap() += 1;
    assert_eq!(*m.lock().unwrap(), 1);
}

#[test]
fn stops_at_channel_operations_and_keeps_messages() {
    let rt = rt(2);
    let (tx, rx) = vt::channel::bounded::<u64>(1);
    let r2 = rx.clone();
    let _keep_tx = tx.clone();
    stops_at("recv", &rt, move || {
        let rx = r2.clone();
        move || {
            let _ = rx.recv();
        }
    });
    tx.send(1).unwrap(); // now full
    let t2 = tx.clone();
    stops_at("send on a full channel", &rt, move || {
        let tx = t2.clone();
        move || {
            let _ = tx.send(2);
        }
    });
    // The message sent before is still there; the stopped senders' were never sent.
    assert_eq!(rx.try_recv(), Ok(1));
    assert!(rx.try_recv().is_err());
    let (a_tx, a) = vt::channel::unbounded::<u32>();
    let (b_tx, b) = vt::channel::unbounded::<u32>();
    let (a2, b2) = (a.clone(), b.clone());
    stops_at("select!", &rt, move || {
        let (a, b) = (a2.clone(), b2.clone());
        move || {
            vt::select! {
                recv(a) -> _m => {},
                recv(b) -> _m => {},
            }
        }
    });
    let (a3, b3) = (a.clone(), b.clone());
    stops_at("Select", &rt, move || {
        let (a, b) = (a3.clone(), b3.clone());
        move || {
            let mut sel = vt::channel::Select::new();
            sel.recv(&a);
            sel.recv(&b);
            let _ = sel.ready();
        }
    });
    // Both channels still deliver to a live receiver.
    a_tx.send(7).unwrap();
    b_tx.send(8).unwrap();
    assert_eq!(a.recv(), Ok(7));
    assert_eq!(b.recv(), Ok(8));
}

#[test]
fn stops_at_net_and_blocking() {
    let rt = rt(2);
    let listener = Arc::new(vt::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let l2 = listener.clone();
    stops_at("accept", &rt, move || {
        let l = l2.clone();
        move || {
            let _ = l.accept();
        }
    });
    // A connection whose peer sends nothing: the read waits.
    stops_at("read", &rt, || {
        || {
            let l = vt::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let _peer = vt::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 16];
            let _ = s.read(&mut buf);
        }
    });
    // The closure of `blocking` cannot be stopped: the fiber waits for it, then stops.
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let go_rx = Arc::new(std::sync::Mutex::new(go_rx));
    let ran = Arc::new(AtomicUsize::new(0));
    let r2 = ran.clone();
    let h = rt.spawn(move || {
        let r = r2.clone();
        vt::blocking(move || {
            go_rx.lock().unwrap().recv().unwrap();
            r.fetch_add(1, Ordering::SeqCst);
        });
        r2.fetch_add(100, Ordering::SeqCst); // not reached
    });
    until_parked(&rt, h.fiber().id());
    h.cancel();
    go_tx.send(()).unwrap();
    assert_cancelled(h.join());
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the closure ran to its end, the fiber stopped after it");
}

#[test]
fn a_fiber_cancelled_before_it_starts_never_runs() {
    let rt = rt(1);
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let h = rt.block_on(move || {
        let h = vt::spawn(move || r.fetch_add(1, Ordering::SeqCst));
        h.cancel(); // queued behind this fiber on the only carrier
        h
    });
    assert_cancelled(h.join());
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

#[test]
fn cancellation_is_level_triggered() {
    let rt = rt(1);
    let caught = Arc::new(AtomicUsize::new(0));
    let c = caught.clone();
    let h = rt.spawn(move || {
        loop {
            // Catching the stop and waiting again is stopped again.
            let r = std::panic::catch_unwind(|| vt::sleep(Duration::from_secs(3600)));
            assert!(r.is_err());
            c.fetch_add(1, Ordering::SeqCst);
            if c.load(Ordering::SeqCst) == 3 {
                vt::park(); // stopped here, for good
            }
        }
    });
    until_parked(&rt, h.fiber().id());
    h.cancel();
    assert_cancelled(h.join());
    assert_eq!(caught.load(Ordering::SeqCst), 3);
}

#[test]
fn cancel_handle_is_send_sync_clone_and_reports_finished() {
    fn check<T: Send + Sync + Clone>() {}
    check::<vt::CancelHandle>();
    let rt = rt(1);
    let h = rt.spawn(|| 5);
    let c = h.cancel_handle();
    assert_eq!(h.join().unwrap(), 5);
    assert!(c.is_finished());
    c.cancel(); // on a finished fiber: nothing
}

/// Hard case 1 (ADR 0004): on one carrier, a fiber inside `vt::scope`, whose fibers started on
/// that carrier and wait, is cancelled. The scope stops them and waits for them before the
/// owner's unwind goes on.
#[test]
fn cancelled_owner_of_a_scope_on_one_carrier() {
    within(Duration::from_secs(60), "a cancelled scope owner", || {
        let rt = rt(1);
        let drops = Arc::new(AtomicUsize::new(0));
        let d = drops.clone();
        let (started_tx, started_rx) = vt::channel::unbounded::<()>();
        let h = rt.spawn(move || {
            let (_tx, rx) = vt::channel::unbounded::<()>();
            vt::scope(|s| {
                for _ in 0..10 {
                    let t = Tracked(d.clone());
                    let rx = &rx;
                    let started = started_tx.clone();
                    s.spawn(move || {
                        let _t = t;
                        started.send(()).unwrap();
                        let _ = rx.recv();
                    });
                }
                vt::park();
                loop {
                    vt::park();
                }
            })
        });
        for _ in 0..10 {
            started_rx.recv().unwrap();
        }
        h.cancel();
        assert_cancelled(h.join());
        assert_eq!(drops.load(Ordering::SeqCst), 10);
        until_live(&rt, 0, "a cancelled scope owner");
    });
}

/// Hard case 2 (ADR 0004): on one carrier, a cancelled fiber's destructor takes a
/// `vt::sync::Mutex` that another fiber of the same carrier holds.
#[test]
fn destructor_of_a_cancelled_fiber_waits_for_a_same_carrier_lock() {
    within(Duration::from_secs(60), "a destructor waiting on a same-carrier lock", || {
        let rt = rt(1);
        let m = Arc::new(vt::sync::Mutex::new(0u32));
        struct TakesLock(Arc<vt::sync::Mutex<u32>>);
        impl Drop for TakesLock {
            fn drop(&mut self) {
                *self.0.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            }
        }
        let (go_tx, go_rx) = vt::channel::bounded::<()>(0);
        let (held_tx, held_rx) = vt::channel::bounded::<()>(0);
        let m1 = m.clone();
        let holder = rt.spawn(move || {
            let _g = m1.lock().unwrap();
            held_tx.send(()).unwrap();
            // Holds the lock across a wait on this same carrier.
            go_rx.recv().unwrap();
        });
        held_rx.recv().unwrap();
        let m2 = m.clone();
        let victim = rt.spawn(move || {
            let _t = TakesLock(m2);
            vt::park();
            loop {
                vt::park();
            }
        });
        until_parked(&rt, victim.fiber().id());
        victim.cancel();
        // The victim's destructor now waits for the lock; the holder must still run.
        go_tx.send(()).unwrap();
        holder.join().unwrap();
        assert_cancelled(victim.join());
        assert_eq!(*m.lock().unwrap_or_else(|e| e.into_inner()), 1);
        until_live(&rt, 0, "a destructor waiting on a lock");
    });
}

#[test]
fn timeout_stops_only_its_closure() {
    let rt = rt(2);
    rt.block_on(|| {
        let (tx, rx) = vt::channel::unbounded::<u32>();
        let start = Instant::now();
        assert_eq!(vt::timeout(Duration::from_millis(20), || rx.recv()), Err(vt::Elapsed));
        assert!(start.elapsed() >= Duration::from_millis(20));
        // The rest of the fiber goes on, and waits normally.
        tx.send(3).unwrap();
        assert_eq!(rx.recv(), Ok(3));
        assert_eq!(vt::timeout(Duration::from_secs(60), || 7), Ok(7));
        assert!(!vt::is_cancelled());
        // A deadline already past stops the closure at its first wait.
        let past = Instant::now();
        assert_eq!(vt::deadline(past, || vt::sleep(Duration::from_secs(3600))), Err(vt::Elapsed));
    });
}

#[test]
fn nested_timeouts() {
    let rt = rt(1);
    rt.block_on(|| {
        // The inner deadline ends only its own closure.
        let r = vt::timeout(Duration::from_secs(60), || {
            let inner = vt::timeout(Duration::from_millis(10), || vt::sleep(Duration::from_secs(3600)));
            assert_eq!(inner, Err(vt::Elapsed));
            vt::sleep(Duration::from_millis(1));
            5
        });
        assert_eq!(r, Ok(5));
        // The outer deadline passes through the inner one.
        let after_inner = Arc::new(AtomicUsize::new(0));
        let a = after_inner.clone();
        let r = vt::timeout(Duration::from_millis(10), || {
            let inner = vt::timeout(Duration::from_secs(60), || vt::sleep(Duration::from_secs(3600)));
            a.fetch_add(1, Ordering::SeqCst);
            inner
        });
        assert_eq!(r, Err(vt::Elapsed));
        assert_eq!(after_inner.load(Ordering::SeqCst), 0, "the inner timeout swallowed the outer one");
    });
}

#[test]
fn a_timeout_never_swallows_a_cancellation() {
    let rt = rt(1);
    let reached = Arc::new(AtomicUsize::new(0));
    let r = reached.clone();
    let h = rt.spawn(move || {
        let x = vt::timeout(Duration::from_secs(60), || vt::sleep(Duration::from_secs(3600)));
        r.fetch_add(1, Ordering::SeqCst);
        x
    });
    until_parked(&rt, h.fiber().id());
    h.cancel();
    assert_cancelled(h.join());
    assert_eq!(reached.load(Ordering::SeqCst), 0);
}

#[test]
fn uncancellable_defers_the_stop_to_the_next_switch_point() {
    let rt = rt(1);
    let steps = Arc::new(AtomicUsize::new(0));
    let s = steps.clone();
    let (in_tx, in_rx) = vt::channel::bounded::<()>(0);
    let h = rt.spawn(move || {
        vt::uncancellable(|| {
            in_tx.send(()).unwrap();
            // Cancelled meanwhile: these waits still complete.
            vt::sleep(Duration::from_millis(30));
            assert!(!vt::is_cancelled());
            vt::check_cancelled();
            s.fetch_add(1, Ordering::SeqCst);
        });
        assert!(vt::is_cancelled());
        s.fetch_add(1, Ordering::SeqCst);
        vt::yield_now(); // stopped here
        s.fetch_add(100, Ordering::SeqCst);
    });
    in_rx.recv().unwrap();
    h.cancel();
    assert_cancelled(h.join());
    assert_eq!(steps.load(Ordering::SeqCst), 2);
    // A deadline is deferred the same way; one opened inside the section still works.
    rt.block_on(|| {
        let r = vt::timeout(Duration::from_millis(5), || {
            vt::uncancellable(|| {
                vt::sleep(Duration::from_millis(20));
                assert_eq!(vt::timeout(Duration::from_millis(5), vt::park), Err(vt::Elapsed));
            });
            vt::sleep(Duration::from_secs(3600));
        });
        assert_eq!(r, Err(vt::Elapsed));
    });
}

#[test]
fn check_cancelled_stops_a_loop_that_never_waits() {
    let rt = rt(2);
    let (running_tx, running_rx) = std::sync::mpsc::channel::<()>();
    let h = rt.spawn(move || {
        let mut n = 0u64;
        running_tx.send(()).unwrap();
        loop {
            n = n.wrapping_add(1);
            if n % 1024 == 0 {
                vt::check_cancelled();
            }
        }
    });
    running_rx.recv().unwrap();
    h.cancel();
    assert_cancelled(h.join());
    // A deadline stops it too.
    rt.block_on(|| {
        let r = vt::timeout(Duration::from_millis(10), || {
            loop {
                vt::check_cancelled();
                std::hint::spin_loop();
            }
        });
        assert_eq!(r, Err(vt::Elapsed));
    });
}

#[test]
fn timeout_on_a_plain_thread() {
    let (_tx, rx) = vt::channel::unbounded::<u32>();
    assert_eq!(vt::timeout(Duration::from_millis(10), || rx.recv()), Err(vt::Elapsed));
    let m = vt::sync::Mutex::new(());
    let _g = m.lock().unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            assert!(vt::timeout(Duration::from_millis(10), || m.lock().is_ok()).is_err());
        });
    });
    assert_eq!(vt::timeout(Duration::from_millis(10), || 1), Ok(1));
    assert!(!vt::is_cancelled());
}

/// ADR 0004: a cancellation that unwinds through a `vt::sync::Mutex` guard poisons the lock,
/// as a panic would: the critical section was left halfway.
#[test]
fn a_stop_inside_a_critical_section_poisons_the_lock() {
    let rt = rt(1);
    let m = Arc::new(vt::sync::Mutex::new(0u32));
    let m2 = m.clone();
    rt.block_on(move || {
        let r = vt::timeout(Duration::from_millis(5), || {
            let mut g = m2.lock().unwrap();
            *g += 1;
            vt::sleep(Duration::from_secs(3600));
        });
        assert_eq!(r, Err(vt::Elapsed));
    });
    assert!(m.is_poisoned());
    // Inside `uncancellable`, the section finishes and nothing is poisoned.
    let m = Arc::new(vt::sync::Mutex::new(0u32));
    let m3 = m.clone();
    rt.block_on(move || {
        let r = vt::timeout(Duration::from_millis(5), || {
            vt::uncancellable(|| {
                let mut g = m3.lock().unwrap();
                vt::sleep(Duration::from_millis(20));
                *g += 1;
            });
            vt::sleep(Duration::from_secs(3600));
        });
        assert_eq!(r, Err(vt::Elapsed));
    });
    assert!(!m.is_poisoned());
    assert_eq!(*m.lock().unwrap(), 1);
}

#[test]
fn join_set_joins_in_completion_order() {
    let rt = rt(2);
    rt.block_on(|| {
        let mut set = vt::JoinSet::new();
        // Each fiber waits for its turn, given in reverse spawn order.
        let (turns, gates): (Vec<_>, Vec<_>) = (0..5).map(|_| vt::channel::bounded::<()>(1)).unzip();
        for (i, gate) in gates.into_iter().enumerate() {
            set.spawn(move || {
                gate.recv().unwrap();
                i
            });
        }
        assert_eq!(set.len(), 5);
        let mut order = Vec::new();
        for t in turns.iter().rev() {
            t.send(()).unwrap();
            order.push(set.join_next().unwrap().unwrap());
        }
        assert_eq!(order, [4, 3, 2, 1, 0]);
        assert!(set.join_next().is_none());
        assert!(set.is_empty());
        // A panic is handed over as `Err`, with its payload.
        set.spawn(|| panic!("boom"));
        let p = set.join_next().unwrap().unwrap_err();
        assert_eq!(p.downcast_ref::<&str>(), Some(&"boom"));
    });
}

#[test]
fn join_set_cancel_all_and_drop() {
    let rt = rt(1);
    let drops = Arc::new(AtomicUsize::new(0));
    let before = rt.metrics().fibers_live;
    let d = drops.clone();
    rt.block_on(move || {
        let mut set = vt::JoinSet::new();
        for _ in 0..100 {
            let t = Tracked(d.clone());
            set.spawn(move || {
                let _t = t;
                vt::park();
                loop {
                    vt::park();
                }
            });
        }
        vt::yield_now(); // let some start: both started and queued ones are stopped
        set.cancel_all();
        let mut n = 0;
        while let Some(r) = set.join_next() {
            assert_cancelled::<()>(r);
            n += 1;
        }
        assert_eq!(n, 100);
        // Dropping a set stops what is left in it.
        let mut set = vt::JoinSet::new();
        let handles: Vec<_> = (0..100)
            .map(|_| {
                let t = Tracked(d.clone());
                set.spawn(move || {
                    let _t = t;
                    vt::sleep(Duration::from_secs(3600));
                })
            })
            .collect();
        drop(set);
        for h in handles {
            while !h.is_finished() {
                vt::yield_now();
            }
        }
    });
    assert_eq!(drops.load(Ordering::SeqCst), 200);
    until_live(&rt, before, "JoinSet");
}

#[test]
fn task_scope_all_ok_stops_the_rest_at_the_first_error() {
    let rt = rt(2);
    rt.block_on(|| {
        let stopped = AtomicUsize::new(0);
        let r = vt::TaskScope::new().all_ok(|s| {
            for i in 0..20u32 {
                let stopped = &stopped;
                s.spawn(move || {
                    if i == 7 {
                        return Err(format!("task {i} failed"));
                    }
                    let r = vt::timeout(Duration::from_secs(60), || vt::sleep(Duration::from_secs(3600)));
                    let _ = r;
                    stopped.fetch_add(1, Ordering::SeqCst); // not reached: stopped in the sleep
                    Ok(i)
                });
            }
        });
        match r {
            Err(vt::TaskError::Failed(e)) => assert_eq!(e, "task 7 failed"),
            other => panic!("expected the first error, got {other:?}"),
        }
        assert_eq!(stopped.load(Ordering::SeqCst), 0);
        // All succeed: values in spawn order.
        let r = vt::TaskScope::new().all_ok(|s| {
            for i in 0..10u64 {
                s.spawn(move || {
                    vt::sleep(Duration::from_millis(10 - i));
                    Ok::<_, ()>(i)
                });
            }
        });
        assert_eq!(r.unwrap(), (0..10).collect::<Vec<_>>());
        // A panic decides it too.
        let r = vt::TaskScope::new().all_ok(|s| {
            s.spawn(|| -> Result<(), ()> { panic!("task panicked") });
            s.spawn(|| {
                vt::sleep(Duration::from_secs(3600));
                Ok(())
            });
        });
        assert!(matches!(r, Err(vt::TaskError::Panicked(_))));
    });
}

#[test]
fn task_scope_any_ok_stops_the_rest_at_the_first_success() {
    let rt = rt(2);
    rt.block_on(|| {
        let r = vt::TaskScope::new().any_ok(|s| {
            s.spawn(|| Err::<u32, _>("first fails"));
            s.spawn(|| {
                vt::sleep(Duration::from_secs(3600));
                Ok(1)
            });
            s.spawn(|| {
                vt::sleep(Duration::from_millis(5));
                Ok(2)
            });
        });
        assert_eq!(r.unwrap(), 2);
        let r = vt::TaskScope::new().any_ok(|s| {
            s.spawn(|| Err::<u32, _>("a"));
            s.spawn(|| Err("b"));
        });
        assert!(matches!(r, Err(vt::TaskError::Failed("a" | "b"))));
        let r = vt::TaskScope::new().any_ok(|_: &vt::Tasks<'_, '_, u32, ()>| {});
        assert!(matches!(r, Err(vt::TaskError::Empty)));
    });
}

/// A deadline stops a scope of 10,000 fibers parked on a channel: the scope returns soon after
/// it, every fiber stopped and finished. The bound is generous (a loaded 2-core CI machine);
/// the speed target, 50 ms, is measured by `examples/deadline.rs --parked` (`arch/fiber.md`).
///
/// Their stacks come back: no fiber holds one once the scope has returned.
#[test]
fn task_scope_deadline_stops_ten_thousand_parked_fibers() {
    let rt = rt(2);
    let before = rt.metrics().stacks_in_use;
    let late = rt.block_on(|| {
        let (_tx, rx) = vt::channel::unbounded::<u32>();
        let at = Instant::now() + Duration::from_millis(200);
        let r = vt::TaskScope::new().deadline(at).all_ok(|s| {
            for _ in 0..10_000 {
                let rx = &rx;
                s.spawn(move || rx.recv().map_err(|_| ()));
            }
        });
        assert!(matches!(r, Err(vt::TaskError::Elapsed)), "{r:?}");
        Instant::now().saturating_duration_since(at)
    });
    println!("10,000 fibers stopped {late:?} after the deadline");
    assert!(late < Duration::from_secs(3), "took {late:?}");
    until_live(&rt, 0, "the task scope's fibers");
    let m = rt.metrics();
    assert_eq!(m.stacks_in_use, before, "stacks still held after the stop: {m}");
}

/// A mass cancellation gives every stack back: 5,000 fibers, all started and parked, are
/// stopped together; afterwards no fiber holds a stack, and a second round reuses the first
/// one's stacks. The runtime's stack size is this test's alone, so no other
/// test's fibers share its pool.
#[test]
fn a_mass_cancellation_gives_every_stack_back() {
    let rt = vt::Runtime::builder().carriers(2).stack_size(136 * 1024).build().unwrap();
    let before = rt.metrics().stacks_in_use;
    let mut carved = Vec::new();
    for _ in 0..2 {
        rt.block_on(|| {
            let (_tx, rx) = vt::channel::unbounded::<u32>();
            let parked = AtomicUsize::new(0);
            vt::scope(|s| {
                for _ in 0..5_000 {
                    s.spawn(|| {
                        parked.fetch_add(1, Ordering::SeqCst);
                        let _ = rx.recv();
                    });
                }
                // Every fiber has its stack before the stop.
                while parked.load(Ordering::SeqCst) < 5_000 {
                    vt::yield_now();
                }
                let m = vt::Handle::current().metrics();
                assert!(m.stacks_in_use >= 5_000, "the parked fibers' stacks are not counted: {m}");
                s.cancel();
            });
        });
        until_live(&rt, 0, "a mass cancellation");
        let m = rt.metrics();
        assert_eq!(m.stacks_in_use, before, "stacks still held after the stop: {m}");
        carved.push(m.stacks_carved);
    }
    // Another carrier's caches (64 stacks and 16 idle coroutines each) are out of reach of a
    // carrier that runs short, so a round may carve that many; a leak would be 5,000.
    let slack = 80 * rt.metrics().per_carrier.len() as u64;
    assert!(
        carved[1] <= carved[0] + slack,
        "the second round carved new stacks ({carved:?}): the first one's were not given back"
    );
}

#[test]
fn scope_cancel_stops_its_fibers_together() {
    let rt = rt(2);
    rt.block_on(|| {
        let (_tx, rx) = vt::channel::unbounded::<u32>();
        let finished = AtomicUsize::new(0);
        vt::scope(|s| {
            for _ in 0..100 {
                s.spawn(|| {
                    let _ = rx.recv();
                    finished.fetch_add(1, Ordering::SeqCst);
                });
            }
            s.cancel();
            assert!(s.is_cancelled());
            // Spawned after: stopped too.
            s.spawn(|| {
                vt::park();
                finished.fetch_add(1, Ordering::SeqCst);
            });
        });
        assert_eq!(finished.load(Ordering::SeqCst), 0);
    });
}

#[test]
fn stops_at_a_signal_wait() {
    let rt = rt(2);
    stops_at("signal::wait_for", &rt, || {
        || {
            let _ = vt::signal::wait_for(&[vt::signal::Signal::USR2]);
        }
    });
}
