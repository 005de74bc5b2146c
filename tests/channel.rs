//! `vt::channel` and `vt::select!` under fibers, plain threads and both mixed: exactly-once
//! delivery, disconnection of every flavour from either side, timeouts racing hand-offs, and
//! select fairness. No sleeps paper over races.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use virtual_threads as vt;
use vt::channel::{
    self, RecvError, RecvTimeoutError, SendError, SendTimeoutError, TryRecvError, TrySendError,
};

fn rt() -> vt::Runtime {
    vt::Runtime::builder().carriers(2).build().unwrap()
}

/// Runs `f` on a fiber (`fiber == true`) or a plain thread; joins like either.
fn run_on<T: Send + 'static>(fiber: bool, f: impl FnOnce() -> T + Send + 'static) -> Box<dyn FnOnce() -> T> {
    if fiber {
        let h = vt::spawn(f);
        Box::new(move || h.join().unwrap())
    } else {
        let h = std::thread::spawn(f);
        Box::new(move || h.join().unwrap())
    }
}

/// `producers × consumers`, half fibers and half threads, through `(tx, rx)`: every message
/// arrives exactly once (count, checksum, and a seen-set).
fn exactly_once(
    (tx, rx): (channel::Sender<u64>, channel::Receiver<u64>),
    producers: u64,
    consumers: usize,
    per_producer: u64,
) {
    rt().block_on(move || {
        let senders: Vec<_> = (0..producers)
            .map(|p| {
                let tx = tx.clone();
                run_on(p % 2 == 0, move || {
                    for i in 0..per_producer {
                        tx.send(p * per_producer + i).unwrap();
                    }
                })
            })
            .collect();
        drop(tx);
        let receivers: Vec<_> = (0..consumers)
            .map(|c| {
                let rx = rx.clone();
                run_on(c % 2 == 1, move || rx.iter().collect::<Vec<u64>>())
            })
            .collect();
        drop(rx);
        senders.into_iter().for_each(|join| join());
        let total = producers * per_producer;
        let mut seen = vec![false; total as usize];
        let (mut count, mut sum) = (0u64, 0u64);
        for join in receivers {
            for msg in join() {
                assert!(!std::mem::replace(&mut seen[msg as usize], true), "{msg} twice");
                count += 1;
                sum += msg;
            }
        }
        assert_eq!(count, total);
        assert_eq!(sum, total * (total - 1) / 2);
    });
}

#[test]
fn bounded_8x8_400k_exactly_once() {
    exactly_once(channel::bounded(16), 8, 8, 50_000);
}

#[test]
fn rendezvous_4x4_exactly_once() {
    exactly_once(channel::bounded(0), 4, 4, 10_000);
}

#[test]
fn unbounded_4x4_exactly_once() {
    exactly_once(channel::unbounded(), 4, 4, 25_000);
}

#[test]
fn fifo_order_per_producer() {
    let (tx, rx) = channel::bounded(2);
    rt().block_on(|| {
        let h = vt::spawn(move || (0..10_000).for_each(|i| tx.send(i).unwrap()));
        assert!(rx.iter().eq(0..10_000));
        h.join().unwrap();
    });
}

#[test]
fn accessors_and_iterators() {
    let (tx, rx) = channel::bounded::<i32>(3);
    assert_eq!((tx.capacity(), rx.capacity()), (Some(3), Some(3)));
    assert!(tx.is_empty() && !tx.is_full());
    tx.send(1).unwrap();
    tx.send(2).unwrap();
    assert_eq!((tx.len(), rx.len()), (2, 2));
    assert!(rx.try_iter().eq([1, 2]));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    tx.send(3).unwrap();
    drop(tx);
    assert!(rx.into_iter().eq([3]));
    let (tx, rx) = channel::unbounded::<i32>();
    assert_eq!(tx.capacity(), None);
    assert!(tx.same_channel(&tx.clone()) && rx.same_channel(&rx.clone()));
    let (tx0, _rx0) = channel::bounded::<i32>(0);
    assert!(tx0.is_full());
    assert_eq!(tx0.try_send(1), Err(TrySendError::Full(1)));
    drop(rx);
    assert_eq!(tx.send(5), Err(SendError(5)));
}

#[test]
fn errors_display_and_give_values_back() {
    fn is_error<E: std::error::Error + Send + Sync + 'static>(_: &E) {}
    let e = SendError(String::from("x"));
    is_error(&e);
    assert_eq!(e.to_string(), "sending on a disconnected channel");
    assert_eq!(format!("{e:?}"), "SendError { .. }");
    assert_eq!(e.into_inner(), "x");
    let e = TrySendError::Full(1);
    is_error(&e);
    assert!(e.is_full() && e.to_string() == "sending on a full channel");
    let e = SendTimeoutError::Timeout(2);
    is_error(&e);
    assert!(e.is_timeout() && e.into_inner() == 2);
    is_error(&RecvError);
    is_error(&TryRecvError::Empty);
    is_error(&RecvTimeoutError::Timeout);
    assert_eq!(RecvTimeoutError::Timeout.to_string(), "timed out waiting on receive operation");
    assert_eq!(TryRecvError::from(RecvError), TryRecvError::Disconnected);
}

/// Disconnection by the last sender, for every multi-message flavour: buffered messages are
/// still received, then `Err`; a receiver parked meanwhile wakes with `Err`.
#[test]
fn sender_side_disconnect_every_flavour() {
    rt().block_on(|| {
        for cap in [None, Some(0), Some(1), Some(4)] {
            let (tx, rx) = match cap {
                None => channel::unbounded(),
                Some(n) => channel::bounded(n),
            };
            let tx2 = tx.clone();
            if cap != Some(0) {
                tx.send(1).unwrap();
            }
            drop(tx);
            if cap != Some(0) {
                assert_eq!(rx.recv(), Ok(1));
            }
            assert_eq!(rx.try_recv(), Err(TryRecvError::Empty), "a sender is still alive");
            // A receiver (fiber and thread) that is parked, or about to park, when the last
            // sender goes wakes with an error.
            let waiting: Vec<_> = [true, false]
                .into_iter()
                .map(|fiber| {
                    let rx = rx.clone();
                    run_on(fiber, move || rx.recv())
                })
                .collect();
            drop(tx2);
            for join in waiting {
                assert_eq!(join(), Err(RecvError));
            }
            assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
            assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Err(RecvTimeoutError::Disconnected));
            assert_eq!(rx.iter().count(), 0);
        }
    });
}

/// Disconnection by the last receiver: every send fails with its value back, including a
/// sender parked on a full (or rendezvous) channel.
#[test]
fn receiver_side_disconnect_every_flavour() {
    rt().block_on(|| {
        for cap in [None, Some(0), Some(1)] {
            let (tx, rx) = match cap {
                None => channel::unbounded::<String>(),
                Some(n) => channel::bounded(n),
            };
            let rx2 = rx.clone();
            if cap == Some(1) {
                tx.send("fill".into()).unwrap();
            }
            let parked: Vec<_> = if cap.is_some() {
                [true, false]
                    .into_iter()
                    .map(|fiber| {
                        let tx = tx.clone();
                        run_on(fiber, move || tx.send(format!("blocked {fiber}")))
                    })
                    .collect()
            } else {
                Vec::new()
            };
            drop(rx);
            drop(rx2);
            for join in parked {
                let SendError(msg) = join().unwrap_err();
                assert!(msg.starts_with("blocked"));
            }
            assert_eq!(tx.send("late".into()), Err(SendError("late".into())));
            assert_eq!(tx.try_send("try".into()), Err(TrySendError::Disconnected("try".into())));
            assert_eq!(
                tx.send_timeout("t".into(), Duration::from_secs(5)),
                Err(SendTimeoutError::Disconnected("t".into()))
            );
        }
    });
}

#[test]
fn buffered_messages_are_dropped_when_the_receivers_go() {
    let token = Arc::new(());
    let (tx, rx) = channel::bounded(4);
    tx.send(token.clone()).unwrap();
    tx.send(token.clone()).unwrap();
    assert_eq!(Arc::strong_count(&token), 3);
    drop(rx);
    assert_eq!(Arc::strong_count(&token), 1);
}

#[test]
fn rendezvous_send_completes_only_when_taken() {
    let (tx, rx) = channel::bounded(0);
    let taken = Arc::new(AtomicUsize::new(0));
    rt().block_on(|| {
        let t2 = taken.clone();
        let sender = vt::spawn(move || {
            for i in 0..100 {
                tx.send(i).unwrap();
                // The receiver increments `taken` only after `recv` returned this message, and
                // `send` returned only after the receiver took it: it may lag by at most one.
                assert!(t2.load(Ordering::SeqCst) >= i);
            }
        });
        for i in 0..100 {
            assert_eq!(rx.recv(), Ok(i));
            taken.fetch_add(1, Ordering::SeqCst);
        }
        sender.join().unwrap();
    });
    let (tx, rx) = channel::bounded::<i32>(0);
    assert_eq!(tx.send_timeout(1, Duration::from_millis(10)), Err(SendTimeoutError::Timeout(1)));
    assert_eq!(rx.recv_timeout(Duration::from_millis(10)), Err(RecvTimeoutError::Timeout));
}

#[test]
fn oneshot_semantics() {
    rt().block_on(|| {
        let (tx, rx) = channel::oneshot::channel();
        let h = vt::spawn(move || tx.send(String::from("hi")));
        assert_eq!(rx.recv(), Ok(String::from("hi")));
        assert_eq!(h.join().unwrap(), Ok(()));

        let (tx, rx) = channel::oneshot::channel::<i32>();
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        assert_eq!(rx.recv_timeout(Duration::from_millis(5)), Err(RecvTimeoutError::Timeout));
        let h = std::thread::spawn(move || rx.recv());
        drop(tx);
        assert_eq!(h.join().unwrap(), Err(RecvError));

        let (tx, rx) = channel::oneshot::channel::<i32>();
        drop(rx);
        assert_eq!(tx.send(3), Err(3));

        let (tx, rx) = channel::oneshot::channel::<i32>();
        tx.send(4).unwrap();
        assert_eq!(rx.try_recv(), Ok(4));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    });
}

#[test]
fn timeouts_exact_and_generous() {
    let (_tx, rx) = channel::bounded::<i32>(1);
    let start = Instant::now();
    assert_eq!(rx.recv_timeout(Duration::from_millis(30)), Err(RecvTimeoutError::Timeout));
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(30), "{waited:?}");
    assert!(waited < Duration::from_secs(10), "{waited:?}");
}

/// Timed sends race timed receives with tiny timeouts, many rounds: what the senders report
/// as sent is exactly what the receivers got (plus what is still buffered), once each.
fn timeouts_race(cap: usize, fibers: bool) {
    const MESSAGES: u64 = 3_000;
    let (tx, rx) = channel::bounded::<u64>(cap);
    let (sent, mut got) = rt().block_on(move || {
        let receiver = {
            let rx = rx.clone();
            run_on(fibers, move || {
                let mut got = Vec::new();
                let mut i = 0u64;
                loop {
                    i += 1;
                    match rx.recv_timeout(Duration::from_micros(i % 40)) {
                        Ok(v) => got.push(v),
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => return got,
                    }
                }
            })
        };
        let sender = run_on(!fibers, move || {
            let mut sent = Vec::new();
            for v in 0..MESSAGES {
                match tx.send_timeout(v, Duration::from_micros(v % 50)) {
                    Ok(()) => sent.push(v),
                    Err(SendTimeoutError::Timeout(back)) => assert_eq!(back, v),
                    Err(SendTimeoutError::Disconnected(_)) => unreachable!(),
                }
            }
            sent
        });
        let sent = sender();
        let mut got = receiver();
        got.extend(rx.try_iter());
        (sent, got)
    });
    got.sort_unstable();
    assert!(!sent.is_empty());
    assert_eq!(got, sent, "delivered + timed out must equal sent, each once");
}

#[test]
fn timeouts_racing_hand_offs_lose_nothing() {
    for cap in [0, 1] {
        timeouts_race(cap, true);
        timeouts_race(cap, false);
    }
}

/// The fast slot (`arch/sync.md`): the first fiber to block on a channel owns it for the
/// channel's life. Its hand-offs, with the two fibers on two carriers, keep order and lose
/// nothing; once it has finished, other receivers (a fiber, a plain thread) are still served.
#[test]
fn fast_slot_owner_then_other_receivers() {
    const ROUNDS: u64 = 20_000;
    rt().block_on(|| {
        let (tx, rx) = channel::bounded::<u64>(1);
        let (back_tx, back_rx) = channel::bounded::<u64>(0);
        let rx1 = rx.clone();
        let owner = vt::spawn(move || {
            for i in 0..ROUNDS {
                assert_eq!(rx1.recv(), Ok(i));
                back_tx.send(i).unwrap();
            }
        });
        for i in 0..ROUNDS {
            tx.send(i).unwrap();
            assert_eq!(back_rx.recv(), Ok(i));
        }
        owner.join().unwrap();
        let rx2 = rx.clone();
        let fiber = vt::spawn(move || rx2.recv().unwrap());
        let thread = std::thread::spawn(move || rx.recv().unwrap());
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        let mut got = [fiber.join().unwrap(), thread.join().unwrap()];
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
    });
}

#[test]
fn select_is_fair_between_ready_arms() {
    const ROUNDS: usize = 10_000;
    let (tx1, rx1) = channel::unbounded();
    let (tx2, rx2) = channel::unbounded();
    for i in 0..ROUNDS {
        tx1.send(i).unwrap();
        tx2.send(i).unwrap();
    }
    let (mut first, mut second) = (0, 0);
    for _ in 0..ROUNDS {
        vt::select! {
            recv(rx1) -> m => { m.unwrap(); first += 1; }
            recv(rx2) -> m => { m.unwrap(); second += 1; }
        }
    }
    assert_eq!(first + second, ROUNDS);
    assert!(first * 10 >= ROUNDS * 3 && second * 10 >= ROUNDS * 3, "{first} vs {second}");
}

#[test]
fn select_send_and_recv_arms_and_defaults() {
    let (tx1, rx1) = channel::bounded::<i32>(1);
    let (tx2, rx2) = channel::bounded::<i32>(1);
    // Nothing ready: `default` runs at once; `default(timeout)` after the timeout.
    tx2.send(0).unwrap();
    let r = vt::select! {
        recv(rx1) -> _m => 1,
        send(tx2, 5) -> _r => 2,
        default => 3,
    };
    assert_eq!(r, 3);
    let start = Instant::now();
    let r = vt::select! {
        recv(rx1) -> _m => 1,
        default(Duration::from_millis(20)) => 3,
    };
    assert_eq!(r, 3);
    assert!(start.elapsed() >= Duration::from_millis(20));
    // A ready send arm.
    assert_eq!(rx2.recv(), Ok(0));
    vt::select! {
        recv(rx1) -> _m => panic!("empty"),
        send(tx2, 6) -> r => assert_eq!(r, Ok(())),
    }
    assert_eq!(rx2.try_recv(), Ok(6));
    // A disconnected channel's arm is ready and reports the disconnection.
    drop(tx1);
    vt::select! {
        recv(rx1) -> m => assert_eq!(m, Err(RecvError)),
        default(Duration::from_secs(5)) => panic!("a disconnected arm is ready"),
    }
    drop(rx2);
    vt::select! {
        send(tx2, 7) -> r => assert_eq!(r, Err(SendError(7))),
    }
}

#[test]
fn select_blocks_until_a_counterpart_arrives() {
    rt().block_on(|| {
        for round in 0..200 {
            let (tx1, rx1) = channel::bounded::<usize>(0);
            let (tx2, rx2) = channel::bounded::<usize>(0);
            let (tx3, rx3) = channel::bounded::<usize>(0);
            // The counterpart is a fiber or a thread; it sends on one channel or receives.
            let counterpart = run_on(round % 2 == 0, move || match round % 3 {
                0 => {
                    tx1.send(round).unwrap();
                    None
                }
                1 => {
                    tx2.send(round).unwrap();
                    None
                }
                _ => Some(rx3.recv().unwrap()),
            });
            let got = vt::select! {
                recv(rx1) -> m => (1, m.unwrap()),
                recv(rx2) -> m => (2, m.unwrap()),
                send(tx3, round) -> r => { r.unwrap(); (3, round) }
            };
            assert_eq!(got, (round % 3 + 1, round));
            let other = counterpart();
            assert_eq!(other, (round % 3 == 2).then_some(round));
        }
    });
}

/// A selecting sender with a timeout races receivers with timeouts on two rendezvous
/// channels: each message the select reports as sent was received exactly once, and nothing
/// else was.
#[test]
fn select_timeouts_racing_hand_offs_lose_nothing() {
    const MESSAGES: usize = 2_000;
    rt().block_on(|| {
        let (tx1, rx1) = channel::bounded::<usize>(0);
        let (tx2, rx2) = channel::bounded::<usize>(0);
        let receivers: Vec<_> = [(rx1, true), (rx2, false)]
            .into_iter()
            .map(|(rx, fiber)| {
                run_on(fiber, move || {
                    let mut got = Vec::new();
                    let mut i = 0u64;
                    loop {
                        i += 1;
                        match rx.recv_timeout(Duration::from_micros(i % 30)) {
                            Ok(v) => got.push(v),
                            Err(RecvTimeoutError::Timeout) => {}
                            Err(RecvTimeoutError::Disconnected) => return got,
                        }
                    }
                })
            })
            .collect();
        let mut sent = HashSet::new();
        for v in 0..MESSAGES {
            let ok = vt::select! {
                send(tx1, v) -> r => r.is_ok(),
                send(tx2, v) -> r => r.is_ok(),
                default(Duration::from_micros((v % 40) as u64)) => false,
            };
            if ok {
                sent.insert(v);
            }
        }
        drop((tx1, tx2));
        let mut got = HashSet::new();
        for join in receivers {
            for v in join() {
                assert!(got.insert(v), "{v} delivered twice");
            }
        }
        assert_eq!(got, sent);
    });
}

/// A 16 KiB message passed by value through every kind of operation, in fibers given the
/// stack `arch/guide.md`'s limits section advises for big messages (the default does not hold the
/// copies a debug build makes: this needs between 384 KiB and 1 MiB unoptimised).
#[test]
fn big_messages_need_the_advised_stack() {
    type Big = [u8; 16 << 10];
    rt().block_on(|| {
        let (tx, rx) = channel::bounded::<Big>(0);
        let big = || vt::Builder::new().stack_size(1 << 20);
        let h = big()
            .spawn(move || {
                let mut sum = 0u64;
                for _ in 0..3 {
                    let m = vt::select! { recv(rx) -> m => m.unwrap() };
                    sum += u64::from(m[0]) + u64::from(m[(16 << 10) - 1]);
                }
                let mut sel = channel::Select::new();
                sel.recv(&rx);
                let m = sel.select().recv(&rx).unwrap();
                sum + u64::from(m[1])
            })
            .unwrap();
        let s = big()
            .spawn(move || {
                tx.send([1; 16 << 10]).unwrap();
                vt::select! { send(tx, [2; 16 << 10]) -> r => r.unwrap() }
                tx.send_timeout([3; 16 << 10], Duration::from_secs(30)).unwrap();
                tx.send([4; 16 << 10]).unwrap();
            })
            .unwrap();
        s.join().unwrap();
        assert_eq!(h.join().unwrap(), 2 + 4 + 6 + 4);
    });
}

/// `after` and `tick` count a due firing as a buffered message, as crossbeam's timers do:
/// `len` 1, not empty, full (their capacity is 1), until it is received.
#[test]
fn a_due_timer_firing_counts_as_buffered() {
    let body = || {
        let due = channel::after(Duration::ZERO);
        assert_eq!(due.capacity(), Some(1));
        assert_eq!((due.len(), due.is_empty(), due.is_full()), (1, false, true));
        assert!(due.try_recv().is_ok());
        assert_eq!((due.len(), due.is_empty(), due.is_full()), (0, true, false));

        let later = channel::after(Duration::from_secs(600));
        assert_eq!((later.len(), later.is_empty(), later.is_full()), (0, true, false));

        let tick = channel::tick(Duration::from_millis(20));
        assert_eq!((tick.len(), tick.is_empty(), tick.is_full()), (0, true, false));
        let start = Instant::now();
        vt::sleep(Duration::from_millis(30));
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert_eq!((tick.len(), tick.is_empty(), tick.is_full()), (1, false, true));
        tick.recv().unwrap();
        // The next firing is a period after the one just taken.
        assert_eq!(tick.len(), 0);
    };
    rt().block_on(body);
    body();
}

/// Every `never()` receiver is the same channel (nothing can tell two apart); other
/// channels are the same only as clones of one handle.
#[test]
fn same_channel_for_never_timers_and_clones() {
    let n1 = channel::never::<u8>();
    assert!(n1.same_channel(&channel::never()));
    assert!(n1.same_channel(&n1.clone()));
    let (_tx, rx) = channel::bounded::<u8>(0);
    assert!(!n1.same_channel(&rx) && !rx.same_channel(&n1));
    let a = channel::after(Duration::ZERO);
    assert!(a.same_channel(&a.clone()) && !a.same_channel(&channel::after(Duration::ZERO)));
    let t = channel::tick(Duration::from_secs(1));
    assert!(t.same_channel(&t.clone()) && !t.same_channel(&channel::tick(Duration::from_secs(1))));
    assert!(!a.same_channel(&t));
}
