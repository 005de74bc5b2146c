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

/// A send and a receive on the same rendezvous channel in one select; nobody
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

/// With one arm that is never ready before two that always are, each ready arm
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

/// A send arm's message is evaluated only if that arm is chosen (crossbeam's `recv_in_send`).
#[test]
fn send_message_evaluated_only_when_chosen() {
    rt().block_on(|| {
        let (s, _r) = channel::bounded::<()>(1);
        s.send(()).unwrap();
        #[allow(unreachable_code)]
        let chose_default = vt::select! {
            send(s, panic!("evaluated the message of an arm that was not chosen")) -> _ => false,
            default => true,
        };
        assert!(chose_default);

        // The message expression may itself use the channel: it runs once the arm is chosen.
        let (s, r) = channel::bounded::<()>(2);
        s.send(()).unwrap();
        vt::select! {
            send(s, assert_eq!(r.recv(), Ok(()))) -> res => assert_eq!(res, Ok(())),
        }
        assert_eq!(r.try_recv(), Ok(()));

        // Counted: of two ready send arms exactly one message is made, 1,000 times over.
        let (s1, r1) = channel::unbounded::<u32>();
        let (s2, r2) = channel::unbounded::<u32>();
        let made = std::cell::Cell::new(0);
        for _ in 0..1000 {
            vt::select! {
                send(s1, { made.set(made.get() + 1); 1 }) -> res => res.unwrap(),
                send(s2, { made.set(made.get() + 1); 2 }) -> res => res.unwrap(),
            }
        }
        assert_eq!(made.get(), 1000);
        assert_eq!(r1.try_iter().count() + r2.try_iter().count(), 1000);
    });
}

/// A lazy send arm that has to wait: the select parks until a receiver comes, then makes the
/// message once and hands it over; on every flavour, from fibers and plain threads.
#[test]
fn lazy_send_arm_waits_for_a_receiver() {
    rt().block_on(|| {
        for cap in [0, 1] {
            for fiber_receiver in [true, false] {
                let (s, r) = channel::bounded::<u32>(cap);
                if cap == 1 {
                    s.send(0).unwrap(); // full
                }
                let receiver = move || {
                    let mut got = Vec::new();
                    while let Ok(v) = r.recv() {
                        got.push(v);
                    }
                    got
                };
                let h: Box<dyn FnOnce() -> Vec<u32>> = if fiber_receiver {
                    let h = vt::spawn(receiver);
                    Box::new(move || h.join().unwrap())
                } else {
                    let h = std::thread::spawn(receiver);
                    Box::new(move || h.join().unwrap())
                };
                let (_never_tx, never_rx) = channel::bounded::<u32>(0);
                let mut made = 0;
                vt::select! {
                    send(s, { made += 1; 7 }) -> res => res.unwrap(),
                    recv(never_rx) -> _ => unreachable!(),
                }
                drop(s);
                let got = h();
                assert_eq!(made, 1);
                assert_eq!(got.last(), Some(&7), "cap {cap}");
            }
        }
    });
}

fn make_pair() -> (channel::Sender<i32>, channel::Receiver<i32>) {
    let (s, r) = channel::bounded(1);
    s.send(5).unwrap();
    (s.clone(), r)
}

/// Channel operands may be any expression, temporaries included (E0716 before).
#[test]
fn temporaries_as_operands_and_trailing_commas() {
    rt().block_on(|| {
        let got = vt::select! {
            recv(make_pair().1) -> v => v,
        };
        assert_eq!(got, Ok(5));
        let (s, r) = channel::unbounded::<i32>();
        let pair = [(s, r)];
        vt::select! {
            send(pair[0].0.clone(), 3,) -> res => res.unwrap(),
            default(Duration::from_secs(5),) => unreachable!(),
        }
        let got = vt::select! {
            recv(&pair[0].1,) -> v => v.unwrap(),
            default => 0,
        };
        assert_eq!(got, 3);
        // `default` without a timeout, both spellings; a block body without a comma.
        let got = vt::select! {
            recv(channel::never::<i32>()) -> _ => 1
            ,
            default => { 2 }
        };
        assert_eq!(got, 2);
        let got = vt::select! {
            recv(channel::never::<i32>()) -> _ => 1,
            default() => 3,
        };
        assert_eq!(got, 3);
    });
}

/// `select_biased!` takes the first ready arm, every time.
#[test]
fn select_biased_takes_the_first_ready_arm() {
    rt().block_on(|| {
        let (tx1, rx1) = channel::unbounded::<u32>();
        let (tx2, rx2) = channel::unbounded::<u32>();
        for _ in 0..1000 {
            tx1.send(1).unwrap();
            tx2.send(2).unwrap();
        }
        let (_idle_tx, idle) = channel::bounded::<u32>(0);
        for _ in 0..1000 {
            let got = vt::select_biased! {
                recv(idle) -> _ => 0,
                recv(rx1) -> v => v.unwrap(),
                recv(rx2) -> v => v.unwrap(),
            };
            assert_eq!(got, 1);
        }
        assert_eq!(rx2.len(), 1000);
        // A send arm first: it wins whenever it is ready.
        let (s, r) = channel::bounded::<u32>(1);
        let got = vt::select_biased! {
            send(s, 9) -> _ => 9,
            recv(rx2) -> v => v.unwrap(),
        };
        assert_eq!((got, r.try_recv()), (9, Ok(9)));
    });
}

/// `never`, `after` and `tick`, alone and in selects, from a fiber and a plain thread.
#[test]
fn never_after_tick() {
    let body = || {
        let start = Instant::now();
        let never = channel::never::<u32>();
        assert_eq!(never.try_recv(), Err(channel::TryRecvError::Empty));
        assert_eq!(never.recv_timeout(Duration::from_millis(20)), Err(channel::RecvTimeoutError::Timeout));

        let after = channel::after(Duration::from_millis(50));
        assert_eq!(after.try_recv(), Err(channel::TryRecvError::Empty));
        let at = after.recv().unwrap();
        assert!(at >= start + Duration::from_millis(50) && Instant::now() >= at);
        // Once only, and never disconnected.
        assert_eq!(after.recv_timeout(Duration::from_millis(20)), Err(channel::RecvTimeoutError::Timeout));

        // In a select: the timer arm wins over a channel nobody sends on, and over `never`.
        let (_tx, idle) = channel::bounded::<u32>(0);
        let t0 = Instant::now();
        let fired = vt::select! {
            recv(idle) -> _ => unreachable!(),
            recv(never) -> _ => unreachable!(),
            recv(channel::after(Duration::from_millis(30))) -> at => at.unwrap(),
        };
        assert!(fired >= t0 + Duration::from_millis(30));
        // The timeout wins over a later timer.
        let timed_out = vt::select! {
            recv(channel::after(Duration::from_secs(60))) -> _ => false,
            default(Duration::from_millis(20)) => true,
        };
        assert!(timed_out);

        // A tick delivers again and again, each instant after the previous one.
        let tick = channel::tick(Duration::from_millis(10));
        let mut last = start;
        for _ in 0..5 {
            let at = vt::select! { recv(tick) -> at => at.unwrap() };
            assert!(at > last);
            last = at;
        }
        assert!(last >= start + Duration::from_millis(50));
    };
    rt().block_on(body);
    body();
}

/// The dynamic `Select`: indices, receives completed at selection, sends chosen when ready
/// and completed by the caller, `try_select`/`select_timeout`, `ready` and its variants,
/// `remove`, and crossbeam's errors.
#[test]
fn dynamic_select() {
    rt().block_on(|| {
        let chans: Vec<_> = (0..40).map(|_| channel::unbounded::<usize>()).collect();
        // Empty: nothing ready.
        let mut sel = channel::Select::new();
        for (_, r) in &chans {
            sel.recv(r);
        }
        assert_eq!(sel.try_select().err(), Some(channel::TrySelectError));
        assert_eq!(sel.try_ready(), Err(channel::TryReadyError));
        assert_eq!(sel.select_timeout(Duration::from_millis(10)).err(), Some(channel::SelectTimeoutError));
        assert_eq!(sel.ready_timeout(Duration::from_millis(10)), Err(channel::ReadyTimeoutError));
        // A fiber sends on channel 33 later: select parks until then (more than 32 operations).
        let s = chans[33].0.clone();
        let h = vt::spawn(move || {
            vt::sleep(Duration::from_millis(10));
            s.send(99).unwrap();
        });
        let op = sel.select();
        let i = op.index();
        assert_eq!((i, op.recv(&chans[i].1)), (33, Ok(99)));
        h.join().unwrap();
        // ready() does not take the message.
        chans[5].0.send(5).unwrap();
        assert_eq!(sel.ready(), 5);
        assert_eq!(sel.try_ready(), Ok(5));
        assert_eq!(chans[5].1.try_recv(), Ok(5));
        // remove keeps the other indices.
        chans[7].0.send(7).unwrap();
        sel.remove(7);
        assert_eq!(sel.try_ready(), Err(channel::TryReadyError));
        assert!(sel.try_select().is_err());
        assert_eq!(chans[7].1.try_recv(), Ok(7));

        // Sends: crossbeam's example, only the last operation is ready.
        let (s1, _r1) = channel::bounded::<()>(0);
        let (_s2, r2) = channel::bounded::<()>(0);
        let (s3, r3) = channel::bounded::<()>(1);
        let mut sel = channel::Select::new();
        let _o1 = sel.send(&s1);
        let _o2 = sel.recv(&r2);
        let o3 = sel.send(&s3);
        let op = sel.select();
        assert_eq!(op.index(), o3);
        op.send(&s3, ()).unwrap();
        assert_eq!(r3.try_recv(), Ok(()));

        // A disconnected send is ready and hands the message back.
        let (s, r) = channel::bounded::<i32>(0);
        drop(r);
        let mut sel = channel::Select::new();
        let o = sel.send(&s);
        let op = sel.select();
        assert_eq!(op.index(), o);
        assert_eq!(op.send(&s, 10), Err(channel::SendError(10)));

        // A disconnected receive is ready and completes with Err.
        let (s, r) = channel::unbounded::<i32>();
        drop(s);
        let mut sel = channel::Select::new();
        sel.recv(&r);
        assert_eq!(sel.select().recv(&r), Err(channel::RecvError));
    });
}

/// A dynamic `Select` sending on a rendezvous channel meets a receiving one, and a blocked
/// plain receive; many rounds, fibers and a plain thread.
#[test]
fn dynamic_select_send_meets_receivers() {
    rt().block_on(|| {
        const N: u32 = 2000;
        let (s, r) = channel::bounded::<u32>(0);
        let r2 = r.clone();
        let sel_receiver = vt::spawn(move || {
            let mut got = Vec::new();
            loop {
                let mut sel = channel::Select::new();
                sel.recv(&r2);
                match sel.select().recv(&r2) {
                    Ok(v) => got.push(v),
                    Err(_) => return got,
                }
            }
        });
        let plain_receiver = std::thread::spawn(move || r.iter().collect::<Vec<u32>>());
        let (_idle_tx, idle) = channel::bounded::<u32>(0);
        for i in 0..N {
            let mut sel = channel::Select::new();
            let o = sel.send(&s);
            sel.recv(&idle);
            let op = sel.select();
            assert_eq!(op.index(), o);
            op.send(&s, i).unwrap();
        }
        drop(s);
        let mut all = sel_receiver.join().unwrap();
        all.extend(plain_receiver.join().unwrap());
        all.sort_unstable();
        assert_eq!(all, (0..N).collect::<Vec<_>>());
    });
}

/// Crossbeam's contract: a selected operation must be completed, with the handle it was
/// selected for.
#[test]
fn selected_operation_misuse_panics() {
    let (s, r) = channel::unbounded::<i32>();
    s.send(1).unwrap();
    let (s2, r2) = channel::unbounded::<i32>();
    let dropped = std::panic::catch_unwind(|| {
        let mut sel = channel::Select::new();
        sel.recv(&r);
        drop(sel.select());
    });
    assert!(dropped.is_err());
    s.send(1).unwrap();
    let wrong = std::panic::catch_unwind(|| {
        let mut sel = channel::Select::new();
        sel.recv(&r);
        let _ = sel.select().recv(&r2);
    });
    assert!(wrong.is_err());
    let wrong_kind = std::panic::catch_unwind(|| {
        let mut sel = channel::Select::new();
        sel.send(&s2);
        let _ = sel.select().recv(&r2);
    });
    assert!(wrong_kind.is_err());
}

/// `Sender`/`Receiver` are unwind-safe as crossbeam's are (a compile-time check).
#[test]
fn handles_are_unwind_safe() {
    fn assert_unwind_safe<T: std::panic::UnwindSafe + std::panic::RefUnwindSafe>() {}
    assert_unwind_safe::<channel::Sender<std::cell::Cell<u8>>>();
    assert_unwind_safe::<channel::Receiver<std::cell::Cell<u8>>>();
    let (s, r) = channel::unbounded::<i32>();
    let caught = std::panic::catch_unwind(|| {
        s.send(1).unwrap();
        panic!("caught");
    });
    assert!(caught.is_err());
    assert_eq!(r.recv(), Ok(1));
}

/// A receiver that only polls (`try_recv` and a yield) on a rendezvous channel meets a select
/// waiting to send there, lazy arm or dynamic `Select` alike: the poll wakes the select, which
/// makes its message and offers it in a send slot that the next poll takes.
#[test]
fn polling_receiver_meets_waiting_select_send() {
    rt().block_on(|| {
        const N: u32 = 300;
        let (s, r) = channel::bounded::<u32>(0);
        let poller = vt::spawn(move || {
            let mut got = Vec::new();
            loop {
                match r.try_recv() {
                    Ok(v) => got.push(v),
                    Err(channel::TryRecvError::Empty) => vt::yield_now(),
                    Err(channel::TryRecvError::Disconnected) => return got,
                }
            }
        });
        let (_idle_tx, idle) = channel::bounded::<u32>(0);
        for i in 0..N {
            if i % 2 == 0 {
                vt::select! {
                    send(s, i) -> res => res.unwrap(),
                    recv(idle) -> _ => unreachable!(),
                }
            } else {
                let mut sel = channel::Select::new();
                sel.recv(&idle);
                let o = sel.send(&s);
                let op = sel.select();
                assert_eq!(op.index(), o);
                op.send(&s, i).unwrap();
            }
        }
        drop(s);
        assert_eq!(poller.join().unwrap(), (0..N).collect::<Vec<_>>());
    });
}

// ---- a representative subset of crossbeam-channel's select tests, rewritten onto vt; each
// body runs in fibers of a 2-carrier runtime (some with plain threads mixed in) ----

/// Runs `f(i)` for `i` in `0..n`, even `i` on fibers, odd on plain threads, and joins them.
fn spawn_mixed<F: Fn(usize) + Send + Sync + 'static>(n: usize, f: F) {
    let f = std::sync::Arc::new(f);
    let joins: Vec<Box<dyn FnOnce()>> = (0..n)
        .map(|i| {
            let f = f.clone();
            if i % 2 == 0 {
                let h = vt::spawn(move || f(i));
                Box::new(move || h.join().unwrap()) as Box<dyn FnOnce()>
            } else {
                let h = std::thread::spawn(move || f(i));
                Box::new(move || h.join().unwrap()) as Box<dyn FnOnce()>
            }
        })
        .collect();
    joins.into_iter().for_each(|join| join());
}

/// crossbeam `smoke1`/`smoke2`: the ready one of several arms completes.
#[test]
fn cb_smoke() {
    rt().block_on(|| {
        let (s1, r1) = channel::unbounded::<usize>();
        let (s2, r2) = channel::unbounded::<usize>();
        s1.send(1).unwrap();
        vt::select! {
            recv(r1) -> v => assert_eq!(v, Ok(1)),
            recv(r2) -> _ => panic!(),
        }
        s2.send(2).unwrap();
        vt::select! {
            recv(r1) -> _ => panic!(),
            recv(r2) -> v => assert_eq!(v, Ok(2)),
        }
        let rs: Vec<_> = (0..5).map(|_| channel::unbounded::<usize>()).collect();
        rs[4].0.send(4).unwrap();
        vt::select! {
            recv(rs[0].1) -> _ => panic!(),
            recv(rs[1].1) -> _ => panic!(),
            recv(rs[2].1) -> _ => panic!(),
            recv(rs[3].1) -> _ => panic!(),
            recv(rs[4].1) -> v => assert_eq!(v, Ok(4)),
        }
    });
}

/// crossbeam `disconnected`: a disconnected channel's arm is ready, also while waiting.
#[test]
fn cb_disconnected() {
    rt().block_on(|| {
        let (s1, r1) = channel::unbounded::<i32>();
        let (s2, r2) = channel::unbounded::<i32>();
        drop(s1);
        vt::select! {
            recv(r1) -> v => assert!(v.is_err()),
            recv(r2) -> _ => panic!(),
            default(Duration::from_secs(5)) => panic!(),
        }
        r2.try_recv().unwrap_err();
        let h = vt::spawn(move || {
            vt::sleep(Duration::from_millis(20));
            drop(s2);
        });
        vt::select! {
            recv(r2) -> v => assert!(v.is_err()),
            default(Duration::from_secs(5)) => panic!(),
        }
        h.join().unwrap();
    });
}

/// crossbeam `unblocks`: a waiting select completes when a counterpart comes, receive or send.
#[test]
fn cb_unblocks() {
    rt().block_on(|| {
        let (s1, r1) = channel::bounded::<i32>(0);
        let (_s2, r2) = channel::bounded::<i32>(0);
        let h = vt::spawn(move || {
            vt::sleep(Duration::from_millis(20));
            s1.send(2).unwrap();
        });
        vt::select! {
            recv(r1) -> v => assert_eq!(v, Ok(2)),
            recv(r2) -> _ => panic!(),
            default(Duration::from_secs(5)) => panic!(),
        }
        h.join().unwrap();
        let (s1, r1) = channel::bounded::<i32>(0);
        let (s2, _r2) = channel::bounded::<i32>(0);
        let h = vt::spawn(move || {
            vt::sleep(Duration::from_millis(20));
            assert_eq!(r1.recv(), Ok(1));
        });
        vt::select! {
            send(s1, 1) -> _ => {},
            send(s2, 2) -> _ => panic!(),
            default(Duration::from_secs(5)) => panic!(),
        }
        h.join().unwrap();
    });
}

/// crossbeam `both_ready`: a select sending on a rendezvous channel and one receiving on it
/// meet, each in its own fiber.
#[test]
fn cb_both_ready() {
    rt().block_on(|| {
        let (s1, r1) = channel::bounded::<i32>(0);
        let (s2, r2) = channel::bounded::<i32>(0);
        let h = vt::spawn(move || {
            vt::sleep(Duration::from_millis(20));
            s1.send(1).unwrap();
            assert_eq!(r2.recv(), Ok(2));
        });
        for _ in 0..2 {
            vt::select! {
                recv(r1) -> v => assert_eq!(v, Ok(1)),
                send(s2, 2) -> _ => {},
            }
        }
        h.join().unwrap();
    });
}

/// crossbeam `matching` and `matching_with_leftover`: selects that each both send and receive
/// on one rendezvous channel pair up with each other (never with themselves); with an odd
/// count, a plain send takes the leftover.
#[test]
fn cb_matching() {
    for threads in [44usize, 55] {
        rt().block_on(move || {
            let (s, r) = channel::bounded::<usize>(0);
            let (s2, r2) = (s.clone(), r.clone());
            let h = vt::spawn(move || {
                spawn_mixed(threads, move |i| {
                    vt::select! {
                        recv(r2) -> v => assert_ne!(v.unwrap(), i),
                        send(s2, i) -> _ => {},
                    }
                })
            });
            if threads % 2 == 1 {
                s.send(!0).unwrap();
            }
            h.join().unwrap();
            assert_eq!(r.try_recv(), Err(channel::TryRecvError::Empty));
        });
    }
}

/// crossbeam `channel_through_channel`: channels sent through channels, received with select.
#[test]
fn cb_channel_through_channel() {
    rt().block_on(|| {
        const COUNT: usize = 1000;
        type T = Box<dyn std::any::Any + Send>;
        for cap in [0, 1, 2] {
            let (s, r) = channel::bounded::<T>(cap);
            let h = vt::spawn(move || {
                let mut s = s;
                for _ in 0..COUNT {
                    let (new_s, new_r) = channel::bounded::<T>(cap);
                    let new_r: T = Box::new(Some(new_r));
                    vt::select! { send(s, new_r) -> _ => {} }
                    s = new_s;
                }
            });
            let mut r = r;
            for _ in 0..COUNT {
                r = vt::select! {
                    recv(r) -> msg => msg.unwrap()
                        .downcast_mut::<Option<channel::Receiver<T>>>()
                        .unwrap()
                        .take()
                        .unwrap(),
                };
            }
            h.join().unwrap();
        }
    });
}

/// crossbeam `stress_mixed`-like: one side selects over a send and a receive, the other side
/// does plain operations; every message arrives, in order, once.
#[test]
fn cb_stress_mixed() {
    rt().block_on(|| {
        const COUNT: usize = 10_000;
        let (s1, r1) = channel::bounded::<usize>(0);
        let (s2, r2) = channel::bounded::<usize>(0);
        let h = vt::spawn(move || {
            for i in 0..COUNT {
                s1.send(i).unwrap();
                assert_eq!(r2.recv(), Ok(i));
            }
        });
        // Nobody ever receives here: a send arm on it is never ready.
        let (idle_s, _idle_r) = channel::bounded::<usize>(0);
        let (mut sent, mut got) = (0, 0);
        while got < COUNT || sent < COUNT {
            vt::select! {
                recv(if got < COUNT { r1.clone() } else { channel::never() }) -> v => {
                    assert_eq!(v, Ok(got));
                    got += 1;
                },
                send(if sent < got { s2.clone() } else { idle_s.clone() }, sent) -> res => {
                    if res.is_ok() {
                        sent += 1;
                    }
                },
            }
        }
        h.join().unwrap();
    });
}

/// crossbeam `fairness2`-like on the dynamic `Select`: with every operation ready, each is
/// chosen about equally often (40,000 trials over 4 operations: 25% ± 5%).
#[test]
fn cb_dynamic_select_fairness() {
    rt().block_on(|| {
        const TRIALS: usize = 40_000;
        let chans: Vec<_> = (0..4).map(|_| channel::unbounded::<()>()).collect();
        let mut hits = [0usize; 4];
        for _ in 0..TRIALS {
            for (s, _) in &chans {
                s.try_send(()).unwrap();
            }
            let mut sel = channel::Select::new();
            for (_, r) in &chans {
                sel.recv(r);
            }
            let op = sel.select();
            let i = op.index();
            op.recv(&chans[i].1).unwrap();
            hits[i] += 1;
            for (_, r) in &chans {
                while r.try_recv().is_ok() {}
            }
        }
        for &h in &hits {
            let share = h as f64 / TRIALS as f64;
            assert!((0.20..=0.30).contains(&share), "{hits:?}");
        }
    });
}

/// An operand may make a temporary anywhere inside it, also in a call's arguments
/// (`opt.unwrap_or(&never())`: E0716 before), and may be a reference to a reference.
#[test]
#[allow(clippy::unnecessary_literal_unwrap)] // the operands' shapes are the point
fn temporaries_inside_operand_calls_live_through_the_select() {
    let (s, r) = channel::unbounded::<i32>();
    let none: Option<&channel::Receiver<i32>> = None;
    let got = vt::select! {
        recv(none.unwrap_or(&channel::never())) -> _ => 1,
        default => 2,
    };
    assert_eq!(got, 2);
    s.send(4).unwrap();
    let got = vt::select! {
        recv(Some(&r).unwrap_or(&channel::never())) -> v => v.unwrap(),
        default => 0,
    };
    assert_eq!(got, 4);
    vt::select! {
        send(&&&&s, 5) -> res => res.unwrap(),
        recv(&&&&channel::never::<i32>()) -> _ => unreachable!(),
    }
    let got = vt::select! {
        recv(Some(r).unwrap_or_else(channel::never)) -> v => v.unwrap(),
        default => 0,
    };
    assert_eq!(got, 5);
}

/// The dynamic `Select` is `Clone`, `Send` and `Sync`, as crossbeam's: fibers select on
/// their own copies of one set of operations (copied from a shared reference, or made before
/// and moved in), indices unchanged; each message arrives once.
#[test]
fn a_select_is_clone_send_and_sync() {
    fn assert_send_sync<T: Send + Sync + Clone>(_: &T) {}
    rt().block_on(|| {
        const FIBERS: usize = 8;
        let (s, r) = channel::unbounded::<usize>();
        let (_idle_tx, idle) = channel::bounded::<usize>(0);
        let mut sel = channel::Select::new();
        let op_idle = sel.recv(&idle);
        let op_r = sel.recv(&r);
        assert_send_sync(&sel);
        for i in 0..2 * FIBERS {
            s.send(i).unwrap();
        }
        let (r, idle) = (&r, &idle);
        let got = vt::scope(|scope| {
            let shared = &sel;
            let mut handles = Vec::new();
            for k in 0..2 * FIBERS {
                let moved = sel.clone();
                handles.push(scope.spawn(move || {
                    let mut mine = if k % 2 == 0 { shared.clone() } else { moved };
                    let op = mine.select();
                    assert_ne!(op.index(), op_idle);
                    assert_eq!(op.index(), op_r);
                    let _ = idle;
                    op.recv(r).unwrap()
                }));
            }
            handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
        });
        let mut got = got;
        got.sort_unstable();
        assert_eq!(got, (0..2 * FIBERS).collect::<Vec<_>>());
        // The original still selects, biased copies stay biased.
        s.send(99).unwrap();
        let op = sel.clone().select();
        assert_eq!((op.index(), op.recv(r)), (op_r, Ok(99)));
        let mut biased = channel::Select::new_biased();
        biased.recv(r);
        biased.recv(r);
        s.send(1).unwrap();
        s.send(2).unwrap();
        for _ in 0..2 {
            let op = biased.clone().select();
            assert_eq!(op.index(), 0);
            op.recv(r).unwrap();
        }
    });
}

// ---- a select waiting to send is a counterpart, and a chosen send holds its receiver ----

/// Waits (yielding) until fiber `id` is parked on `reason`.
fn until_parked(h: &vt::Handle, id: vt::FiberId, reason: vt::WaitReason) {
    let t0 = Instant::now();
    while !h
        .dump()
        .fibers()
        .iter()
        .any(|f| f.id == id && matches!(f.state, vt::FiberState::Parked { reason: r, .. } if r == reason))
    {
        assert!(t0.elapsed() < Duration::from_secs(60), "fiber {id:?} never parked on {reason}");
        vt::yield_now();
    }
}

/// A sender parked in `select!` or `Select::select` on a rendezvous channel is found by the
/// first non-blocking receive (`try_recv`, `select!` with `default`, `ready()` then
/// `try_recv`), as a sender parked in `send` is; before, they saw an empty channel.
#[test]
fn non_blocking_receives_meet_a_sender_parked_in_a_select() {
    let rt = rt();
    let h = rt.handle();
    within(Duration::from_secs(120), move || {
        rt.block_on(|| {
            let (s, r) = channel::bounded::<u32>(0);
            let (_idle_tx, idle) = channel::bounded::<u32>(0);
            for (round, how) in (0..4).flat_map(|round| (0..3).map(move |how| (round, how))) {
                let msg = round * 10 + how;
                let (s, idle2) = (s.clone(), idle.clone());
                let sender = vt::spawn(move || {
                    let idle = idle2;
                    if round % 2 == 0 {
                        vt::select! {
                            send(s, msg) -> res => res.unwrap(),
                            recv(idle) -> _ => unreachable!(),
                        }
                    } else {
                        let mut sel = channel::Select::new();
                        let op_s = sel.send(&s);
                        sel.recv(&idle);
                        let op = sel.select();
                        assert_eq!(op.index(), op_s);
                        op.send(&s, msg).unwrap();
                    }
                });
                until_parked(&h, sender.fiber().id(), vt::WaitReason::Select);
                let got = match how {
                    0 => r.try_recv(),
                    1 => vt::select! {
                        recv(r) -> v => Ok(v.unwrap()),
                        default => Err(channel::TryRecvError::Empty),
                    },
                    _ => {
                        let mut sel = channel::Select::new();
                        sel.recv(&idle);
                        let op_r = sel.recv(&r);
                        assert_eq!(sel.ready_timeout(Duration::from_secs(30)), Ok(op_r));
                        r.try_recv()
                    }
                };
                assert_eq!(got, Ok(msg), "round {round}, receive {how}");
                sender.join().unwrap();
            }
        });
    });
}

/// The other order: a receiver waits in `ready()` first, then a select comes to send; the
/// select's arrival wakes the `ready()` (before, both slept for ever: crossbeam ready
/// `fairness2`), and the receive that follows gets the message.
#[test]
fn a_receiver_waiting_in_ready_wakes_for_a_select_that_comes_to_send() {
    let rt = rt();
    let h = rt.handle();
    within(Duration::from_secs(120), move || {
        rt.block_on(|| {
            let (s, r) = channel::bounded::<u32>(0);
            for round in 0..6u32 {
                let r2 = r.clone();
                let receiver = vt::spawn(move || {
                    let mut sel = channel::Select::new();
                    sel.recv(&r2);
                    assert_eq!(sel.ready(), 0);
                    r2.try_recv()
                });
                until_parked(&h, receiver.fiber().id(), vt::WaitReason::Select);
                if round % 2 == 0 {
                    vt::select! { send(s, round) -> res => res.unwrap() }
                } else {
                    let mut sel = channel::Select::new();
                    sel.send(&s);
                    sel.select().send(&s, round).unwrap();
                }
                assert_eq!(receiver.join().unwrap(), Ok(round));
            }
        });
    });
}

/// A `select!` send arm chosen for a waiting receiver holds that receiver while its message
/// is made, even when making it receives from the same rendezvous channel: the next sender
/// serves the select's own receive, not the held receiver (which would leave the select
/// waiting for ever). The held receiver waits past its deadline meanwhile.
#[test]
fn a_chosen_send_holds_its_receiver_while_the_message_is_made() {
    let rt = rt();
    let h = rt.handle();
    within(Duration::from_secs(120), move || {
        rt.block_on(|| {
            // 0: a fiber in `recv` (the fast slot); 1: a fiber in `recv_timeout` (a queued
            // slot with a deadline); 2: a plain thread in `recv`.
            for how in 0..3 {
                let (s, r) = channel::bounded::<u32>(0);
                let r1 = r.clone();
                let receive = move || match how {
                    1 => r1.recv_timeout(Duration::from_millis(200)).map_err(|_| channel::RecvError),
                    _ => r1.recv(),
                };
                let first: Box<dyn FnOnce() -> Result<u32, channel::RecvError>> = if how == 2 {
                    let (parked_tx, parked_rx) = std::sync::mpsc::channel();
                    let t = std::thread::spawn(move || {
                        parked_tx.send(()).unwrap();
                        receive()
                    });
                    parked_rx.recv().unwrap();
                    // The thread cannot be watched parking: wait until the channel is ready
                    // to send, which on a rendezvous channel means a receiver waits.
                    let mut sel = channel::Select::new();
                    sel.send(&s);
                    assert_eq!(sel.ready_timeout(Duration::from_secs(60)), Ok(0));
                    Box::new(move || t.join().unwrap())
                } else {
                    let f = vt::spawn(receive);
                    let reason = vt::WaitReason::ChannelRecv;
                    until_parked(&h, f.fiber().id(), reason);
                    Box::new(move || f.join().unwrap())
                };
                let s2 = s.clone();
                let selecting = vt::spawn(move || {
                    vt::select! {
                        send(s, r.recv().unwrap() + 1) -> res => res.unwrap(),
                    }
                });
                until_parked(&h, selecting.fiber().id(), vt::WaitReason::ChannelRecv);
                if how == 1 {
                    // Past the held receiver's deadline: it is held, so it still gets the message.
                    vt::sleep(Duration::from_millis(300));
                }
                s2.send(41).unwrap();
                assert_eq!(first(), Ok(42), "receiver {how}");
                selecting.join().unwrap();
            }
        });
    });
}

/// Every party selects over a receive and a send on one rendezvous channel (dynamic `Select`
/// and `select!`, fibers and plain threads, copies of one `Select` too), and one plain
/// sender joins: they pair up, everyone finishes, and each message arrives once, never at
/// its own sender. A send chosen without holding its receiver deadlocked here: two chosen
/// senders were left, both sending.
#[test]
fn selects_over_send_and_receive_on_one_channel_all_pair_up() {
    use std::sync::Mutex;
    within(Duration::from_secs(240), || {
        let rt = rt();
        for round in 0..200 {
            let parties = [21, 55][round % 2];
            let (s, r) = channel::bounded::<usize>(0);
            let got = std::sync::Arc::new(Mutex::new(Vec::new()));
            rt.block_on(|| {
                let (s, r, got) = (&s, &r, &got);
                let mut shared = channel::Select::new();
                let op_r = shared.recv(r);
                let op_s = shared.send(s);
                let shared = &shared;
                std::thread::scope(|threads| {
                    vt::scope(|fibers| {
                        for i in 0..parties {
                            let party = move || {
                                let received = match (round + i) % 5 {
                                    0 => vt::select! {
                                        recv(r) -> v => Some(v.unwrap()),
                                        send(s, i) -> res => { res.unwrap(); None },
                                    },
                                    1 | 2 => {
                                        let mut sel = channel::Select::new();
                                        let o_r = sel.recv(r);
                                        let o_s = sel.send(s);
                                        let op = sel.select();
                                        match op.index() {
                                            x if x == o_r => Some(op.recv(r).unwrap()),
                                            x if x == o_s => op.send(s, i).map(|()| None).unwrap(),
                                            _ => unreachable!(),
                                        }
                                    }
                                    _ => {
                                        let op = shared.clone().select();
                                        match op.index() {
                                            x if x == op_r => Some(op.recv(r).unwrap()),
                                            x if x == op_s => op.send(s, i).map(|()| None).unwrap(),
                                            _ => unreachable!(),
                                        }
                                    }
                                };
                                if let Some(v) = received {
                                    assert_ne!(v, i, "a party received its own message");
                                    got.lock().unwrap().push(v);
                                }
                            };
                            if i % 4 == 3 {
                                threads.spawn(party);
                            } else {
                                fibers.spawn(party);
                            }
                        }
                        s.send(usize::MAX).unwrap();
                    });
                });
            });
            assert_eq!(r.try_recv(), Err(channel::TryRecvError::Empty));
            let got = got.lock().unwrap();
            // `parties + 1` parties, paired: half of them received, each message once.
            assert_eq!(got.len(), parties.div_ceil(2), "round {round}");
            let distinct: std::collections::HashSet<_> = got.iter().collect();
            assert_eq!(distinct.len(), got.len(), "round {round}: a message arrived twice");
        }
    });
}

/// A held receiver is given back when the send that held it cannot complete: its message
/// expression panicked, or its `SelectedOperation` was dropped unsent. A receive that picked
/// such a sender retries (`try_recv` reports the channel empty); a plain receiver gets the
/// next sender's message.
#[test]
fn a_held_receiver_is_given_back_when_the_send_fails() {
    let rt = rt();
    let h = rt.handle();
    within(Duration::from_secs(120), move || {
        rt.block_on(|| {
            let (s, r) = channel::bounded::<u32>(0);
            // The receiver waits first; the select holds it, then its message panics.
            let r1 = r.clone();
            let receiver = vt::spawn(move || r1.recv());
            until_parked(&h, receiver.fiber().id(), vt::WaitReason::ChannelRecv);
            let s1 = s.clone();
            let panicked = vt::spawn(move || {
                vt::select! { send(s1, panic!("no message")) -> _ => {} }
            });
            assert!(panicked.join().is_err());
            s.send(1).unwrap();
            assert_eq!(receiver.join().unwrap(), Ok(1));

            // The select waits first; a `try_recv` picks it, then its message panics.
            let (go_tx, go_rx) = channel::bounded::<()>(0);
            let s1 = s.clone();
            let panicking = vt::spawn(move || {
                vt::select! { send(s1, { go_rx.recv().unwrap(); panic!("no message") }) -> _ => {} }
            });
            until_parked(&h, panicking.fiber().id(), vt::WaitReason::Select);
            let go = vt::spawn(move || go_tx.send(()).unwrap());
            assert_eq!(r.try_recv(), Err(channel::TryRecvError::Empty));
            assert!(panicking.join().is_err());
            go.join().unwrap();

            // A `Select` send chosen for a waiting receiver, its operation dropped unsent.
            let r1 = r.clone();
            let receiver = vt::spawn(move || r1.recv());
            until_parked(&h, receiver.fiber().id(), vt::WaitReason::ChannelRecv);
            let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut sel = channel::Select::new();
                sel.send(&s);
                drop(sel.select());
            }));
            assert!(dropped.is_err());
            s.send(2).unwrap();
            assert_eq!(receiver.join().unwrap(), Ok(2));
        });
    });
}

/// A selected send on a buffered channel reserves no room: forgetting its operation
/// (`mem::forget`) leaves the channel as it was, and dropping it returns (crossbeam's
/// `forget_select_bounded` asserts that its drop hangs there).
#[test]
fn a_forgotten_selected_send_reserves_no_room() {
    let (s, r) = channel::bounded::<u8>(1);
    let mut sel = channel::Select::new();
    sel.send(&s);
    std::mem::forget(sel.select());
    drop(sel);
    assert_eq!(s.try_send(1), Ok(()));
    assert_eq!(r.try_recv(), Ok(1));
    drop((s, r));
}

/// crossbeam's import style: `use vt::channel::select` brings the macro alone, so a module
/// of the user's named `select` beside it compiles (E0255 before: the import was a module).
mod crossbeam_style_imports {
    use virtual_threads::channel::{select, select_biased, unbounded};

    #[allow(dead_code)]
    mod select {}

    #[test]
    fn the_macros_come_from_the_channel_module() {
        let (s, r) = unbounded::<i32>();
        s.send(1).unwrap();
        select! { recv(r) -> v => assert_eq!(v, Ok(1)) }
        s.send(2).unwrap();
        select_biased! { recv(r) -> v => assert_eq!(v, Ok(2)) }
    }
}
