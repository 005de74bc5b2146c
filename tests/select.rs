//! `select!`, `select_biased!` and the dynamic `Select`: the choice among ready arms, timeouts
//! whatever the arms refer to, lazily evaluated send messages, temporaries as operands,
//! `never`/`after`/`tick`, and a representative subset of crossbeam-channel's select tests
//! rewritten onto `vt`, each body in a fiber of a 2-carrier runtime.

use std::time::{Duration, Instant};

use virtual_threads as vt;
use vt::channel;

fn rt() -> vt::Runtime {
    vt::Runtime::builder().carriers(2).build().unwrap()
}

/// Runs `f` on a plain thread and fails if it has not returned within `limit` (a select that
/// spins for ever must fail the test, not hang it).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).expect("did not return in time")
}

/// Issue 21, bug 1: a send and a receive on the same rendezvous channel in one select; nobody
/// else is there, so neither can complete, and the timeout must end the select.
#[test]
fn send_and_recv_on_one_rendezvous_channel_time_out() {
    for fiber in [true, false] {
        let took = within(Duration::from_secs(20), move || {
            let body = || {
                let (s, r) = channel::bounded::<i32>(0);
                let start = Instant::now();
                vt::select! {
                    send(s, 0) -> _ => panic!("nobody receives"),
                    recv(r) -> _ => panic!("nobody sends"),
                    default(Duration::from_millis(100)) => {}
                }
                start.elapsed()
            };
            if fiber { rt().block_on(body) } else { body() }
        });
        assert!(took >= Duration::from_millis(100), "{took:?}");
    }
}

/// Issue 21, bug 2: with one arm that is never ready before two that always are, each ready arm
/// must win half of the time (Go's `test_select_fairness`, crossbeam's `fairness1`). 40,000
/// trials: one standard deviation is 0.25%, the tolerance ±5% is 20 of them.
#[test]
fn select_chooses_uniformly_among_ready_arms() {
    rt().block_on(|| {
        const TRIALS: usize = 40_000;
        let (_idle_tx, idle) = channel::bounded::<()>(1);
        let (tx1, rx1) = channel::bounded::<()>(1);
        let (tx2, rx2) = channel::bounded::<()>(1);
        let mut hits = [0usize; 3];
        for _ in 0..TRIALS {
            tx1.try_send(()).ok();
            tx2.try_send(()).ok();
            vt::select! {
                recv(idle) -> _ => hits[0] += 1,
                recv(rx1) -> _ => hits[1] += 1,
                recv(rx2) -> _ => hits[2] += 1,
            }
        }
        assert_eq!(hits[0], 0);
        for &h in &hits[1..] {
            let share = h as f64 / TRIALS as f64;
            assert!((0.45..=0.55).contains(&share), "{hits:?}");
        }
    });
}
