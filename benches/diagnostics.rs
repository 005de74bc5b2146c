//! What the diagnostics cost.
//!
//! 1. Fiber roots on against off (`runtime::Builder::fiber_roots`), interleaved in one run,
//!    medians: W1 fork_join (spawn-heavy; the bound is 10%) and W4 ping_pong (a park and
//!    an unpark per message: the state timestamps are written there).
//! 2. `Runtime::dump()` of 100,000 parked fibers, and `Runtime::metrics()` on a busy runtime.
//!
//! Run: `cargo bench --bench diagnostics`.

use std::time::{Duration, Instant};

use virtual_threads as vt;

mod common;
use common::{median, w1};

/// W4: 100 pairs exchange 1,000 messages each over rendezvous channels.
fn w4(rt: &vt::Runtime) -> Duration {
    let t = Instant::now();
    rt.block_on(|| {
        let hs: Vec<_> = (0..100)
            .map(|_| {
                let (a_tx, a_rx) = vt::channel::bounded::<u32>(0);
                let (b_tx, b_rx) = vt::channel::bounded::<u32>(0);
                let p = vt::spawn(move || {
                    for i in 0..1000 {
                        a_tx.send(i).unwrap();
                        b_rx.recv().unwrap();
                    }
                });
                let q = vt::spawn(move || {
                    for _ in 0..1000 {
                        let v = a_rx.recv().unwrap();
                        b_tx.send(v).unwrap();
                    }
                });
                (p, q)
            })
            .collect();
        for (p, q) in hs {
            p.join().unwrap();
            q.join().unwrap();
        }
    });
    t.elapsed()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let carriers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let on = vt::Runtime::builder().carriers(carriers).build().unwrap();
    let off = vt::Runtime::builder().carriers(carriers).fiber_roots(false).build().unwrap();
    for (name, op, rounds) in
        [("W1 fork_join", w1 as fn(&vt::Runtime) -> Duration, 41), ("W4 ping_pong", w4, 15)]
    {
        for _ in 0..3 {
            op(&on);
            op(&off);
        }
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for k in 0..rounds {
            // Alternate which goes first, so neither always runs on a warmer machine.
            if k % 2 == 0 {
                a.push(op(&on));
                b.push(op(&off));
            } else {
                b.push(op(&off));
                a.push(op(&on));
            }
        }
        let (a, b) = (median(a), median(b));
        println!(
            "{name:14} fiber_roots on {:>9.3} ms  off {:>9.3} ms  (on/off = {:.3}, {rounds} rounds, medians)",
            a.as_secs_f64() * 1e3,
            b.as_secs_f64() * 1e3,
            a.as_secs_f64() / b.as_secs_f64()
        );
    }
    drop(off);

    const N: usize = 100_000;
    let (tx, rx) = vt::channel::bounded::<()>(0);
    let hs: Vec<_> = (0..N)
        .map(|_| {
            let rx = rx.clone();
            on.spawn(move || rx.recv().is_err())
        })
        .collect();
    while on.metrics().parks < N as u64 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let times: Vec<_> = (0..9)
        .map(|_| {
            let t = Instant::now();
            let d = on.dump();
            let s = d.to_string();
            assert_eq!(d.len(), N);
            std::hint::black_box(s);
            t.elapsed()
        })
        .collect();
    println!("dump of {N} parked fibers (walk + Display): median {:?}", median(times));
    let times: Vec<_> = (0..101)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(on.metrics());
            t.elapsed()
        })
        .collect();
    println!("metrics() read: median {:?}", median(times));
    drop((tx, rx));
    assert!(hs.into_iter().all(|h| h.join().unwrap()));
}
