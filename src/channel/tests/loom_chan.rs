//! A timed wait meets a hand-off (the timer is modelled as already fired): the message is
//! delivered exactly once or stays with its sender, never lost, never both.
use std::time::Duration;

use crate::channel::bounded;
use crate::channel::error::RecvTimeoutError;

const LONG: Duration = Duration::from_secs(60);

#[test]
fn rendezvous_timed_recv_races_timed_send() {
    ::loom::model(|| {
        let (tx, rx) = bounded::<u32>(0);
        let sender = ::loom::thread::spawn(move || tx.send_timeout(7, LONG).is_ok());
        let got = rx.recv_timeout(LONG);
        let sent = sender.join().unwrap();
        assert_eq!(got.is_ok(), sent, "got {got:?}, sent {sent}");
        assert!(got.is_ok() || got == Err(RecvTimeoutError::Timeout) || !sent);
    });
}

#[test]
fn buffered_timed_recv_races_send() {
    ::loom::model(|| {
        let (tx, rx) = bounded::<u32>(1);
        let sender = ::loom::thread::spawn(move || tx.send(7).unwrap());
        let got = rx.recv_timeout(LONG);
        sender.join().unwrap();
        // Either the timed receive got it, or it is still buffered; never both.
        let rest: Vec<u32> = rx.try_iter().collect();
        match got {
            Ok(v) => assert_eq!((v, rest.len()), (7, 0)),
            Err(_) => assert_eq!(rest, [7]),
        }
    });
}

/// Blocking ping-pong: the second round of each side reuses its first round's slot.
#[test]
fn ping_pong_reuses_slots() {
    ::loom::model(|| {
        let (ping_tx, ping_rx) = bounded::<u32>(1);
        let (pong_tx, pong_rx) = bounded::<u32>(0);
        let echo = ::loom::thread::spawn(move || {
            for _ in 0..2 {
                let v = ping_rx.recv().unwrap();
                pong_tx.send(v + 1).unwrap();
            }
        });
        for i in 0..2 {
            ping_tx.send(i).unwrap();
            assert_eq!(pong_rx.recv(), Ok(i + 1));
        }
        echo.join().unwrap();
    });
}

/// The fast slot: a receiver parked in it meets two senders at once. One claims the slot,
/// the other either waits for it to be re-armed or goes to the buffer under the inner
/// lock (which must see the armed slot and serve it rather than buffer, invariant 1);
/// both messages arrive, once each.
#[test]
fn fast_recv_races_two_senders() {
    ::loom::model(|| {
        let (tx, rx) = bounded::<u32>(1);
        let tx2 = tx.clone();
        let s1 = ::loom::thread::spawn(move || tx.send(1).unwrap());
        let s2 = ::loom::thread::spawn(move || tx2.send(2).unwrap());
        let mut got = [rx.recv().unwrap(), rx.recv().unwrap()];
        s1.join().unwrap();
        s2.join().unwrap();
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
        assert_eq!(rx.try_recv(), Err(crate::channel::error::TryRecvError::Disconnected));
    });
}

/// The last sender leaves while the receiver arms or waits in the fast slot: it gets the
/// message, then `Err`, and never parks for good.
#[test]
fn fast_recv_races_disconnect() {
    ::loom::model(|| {
        let (tx, rx) = bounded::<u32>(1);
        let sender = ::loom::thread::spawn(move || {
            tx.send(7).unwrap();
            drop(tx);
        });
        assert_eq!(rx.recv(), Ok(7));
        assert!(rx.recv().is_err());
        sender.join().unwrap();
    });
}

/// A second receiver (not the fast slot's owner) queues under the inner lock while the
/// owner may be parked in the fast slot; one sender sends two messages: each receiver gets
/// one, FIFO among the waiting ones is not checked, loss or duplication is.
#[test]
fn fast_owner_and_queued_receiver_share_two_sends() {
    ::loom::model(|| {
        let (tx, rx) = bounded::<u32>(1);
        let rx2 = rx.clone();
        let other = ::loom::thread::spawn(move || rx2.recv().unwrap());
        let sender = ::loom::thread::spawn(move || {
            tx.send(1).unwrap();
            tx.send(2).unwrap();
        });
        let mine = rx.recv().unwrap();
        let theirs = other.join().unwrap();
        sender.join().unwrap();
        let mut got = [mine, theirs];
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
    });
}

/// A `select!` send arm (tried without registering, then under the inner lock) races a
/// timed receive parked in the fast slot: delivered exactly when the select reports it.
#[test]
fn select_send_races_fast_timed_recv() {
    ::loom::model(|| {
        let (tx, rx) = bounded::<u32>(0);
        let sender = ::loom::thread::spawn(move || {
            crate::select! {
                send(tx, 7) -> r => r.is_ok(),
                default(LONG) => false,
            }
        });
        let got = rx.recv_timeout(LONG);
        let sent = sender.join().unwrap();
        assert_eq!(got.is_ok(), sent, "got {got:?}, sent {sent}");
    });
}

/// A `select!` send arm waits as a watcher (its message not made yet) while a blocking
/// receiver arrives: the receiver's arrival wakes it, it makes the message and hands it
/// over; neither parks for good, the message arrives once.
#[test]
fn lazy_select_send_meets_blocking_recv() {
    ::loom::model(|| {
        let (tx, rx) = bounded::<u32>(0);
        let (_idle_tx, idle) = bounded::<u32>(0);
        let sender = ::loom::thread::spawn(move || {
            crate::select! {
                send(tx, 7) -> r => r.is_ok(),
                recv(idle) -> _ => false,
            }
        });
        assert_eq!(rx.recv(), Ok(7));
        assert!(sender.join().unwrap());
    });
}

/// The dynamic `Select::ready` waits as a watcher for a receive while a sender buffers a
/// message: the wake-up is not lost.
#[test]
fn select_ready_meets_send() {
    ::loom::model(|| {
        let (tx, rx) = bounded::<u32>(1);
        let sender = ::loom::thread::spawn(move || tx.send(7).unwrap());
        let mut sel = crate::channel::Select::new();
        sel.recv(&rx);
        assert_eq!(sel.ready(), 0);
        sender.join().unwrap();
        assert_eq!(rx.recv(), Ok(7));
    });
}

/// A `Select::select` send waits as a watcher that sends; a receiver polls once, then
/// blocks: it picks the select (and waits for the message), or the select holds it. The
/// message arrives once; neither parks for good.
#[test]
fn receive_picks_or_is_held_by_a_select_send() {
    ::loom::model(|| {
        let (tx, rx) = bounded::<u32>(0);
        let sender = ::loom::thread::spawn(move || {
            let mut sel = crate::channel::Select::new();
            sel.send(&tx);
            let op = sel.select();
            op.send(&tx, 7).unwrap();
        });
        let got = match rx.try_recv() {
            Ok(v) => v,
            Err(_) => rx.recv().unwrap(),
        };
        assert_eq!(got, 7);
        sender.join().unwrap();
    });
}

#[test]
fn select_timeout_races_send() {
    ::loom::model(|| {
        let (tx1, rx1) = bounded::<u32>(0);
        let (_tx2, rx2) = bounded::<u32>(0);
        let sender = ::loom::thread::spawn(move || tx1.send_timeout(7, LONG).is_ok());
        let got = crate::select! {
            recv(rx1) -> m => m.ok(),
            recv(rx2) -> m => m.ok(),
            default(LONG) => None,
        };
        let sent = sender.join().unwrap();
        assert_eq!(got.is_some(), sent);
    });
}

/// A stop meets a send to a parked receiver. Loom cannot unwind a model thread, so the stop
/// is modelled without one: at its park the receiver's wait runs what the unwind runs (the
/// wait's abandon path: `Waiter::wait_or_abandon`, or the fast slot's guard in `wait_fast`)
/// and ends as `Timeout`. The message is delivered, or the receiver is stopped and the message
/// is still in the channel: never both, never neither. `me` picks the wait: a model thread's
/// id arms the fast slot, 0 (a plain thread's) queues a waiter, as every receiver behind the
/// fast slot's owner does.
fn stop_races_a_send(me_is_zero: bool) {
    use ::loom::sync::Arc;
    use ::loom::sync::atomic::{AtomicBool, Ordering};
    ::loom::model(move || {
        let (tx, rx) = bounded::<u32>(1);
        let flag = Arc::new(AtomicBool::new(false));
        let stop = flag.clone();
        let kept = rx.clone(); // the channel outlives the stopped receiver
        let receiver = ::loom::thread::spawn(move || {
            crate::sync::loom::stop_flag(stop);
            let me = if me_is_zero { 0 } else { crate::sync::loom::current_id() };
            rx.chan.recv_locked(me, None)
        });
        // The canceller: `CancelHandle::cancel` sets the stop and unparks, here while nobody
        // else can hold the channel's inner lock (loom's `Thread::unpark` also resumes a thread
        // blocked on a loom lock, as if it were free). The receiver may be parked, or not yet.
        flag.store(true, Ordering::Release);
        receiver.thread().unpark();
        let sender = ::loom::thread::spawn(move || tx.send(7).unwrap());
        sender.join().unwrap();
        let got = receiver.join().unwrap();
        let left = kept.try_recv();
        match got {
            Ok(v) => assert_eq!((v, left), (7, Err(crate::channel::error::TryRecvError::Disconnected))),
            Err(e) => {
                assert_eq!(e, RecvTimeoutError::Timeout, "stopped");
                assert_eq!(left, Ok(7), "a stopped receiver's message is still in the channel");
            }
        }
    });
}

#[test]
fn stop_races_a_send_to_a_receiver_in_the_fast_slot() {
    stop_races_a_send(false);
}

#[test]
fn stop_races_a_send_to_a_queued_receiver() {
    stop_races_a_send(true);
}
