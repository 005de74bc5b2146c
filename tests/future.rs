//! Async interop (`vt::future`): a fiber waiting on a future parks, not its carrier; the
//! waker keeps a wake that comes before the park and is harmless after the fiber finished;
//! async code awaits a fiber's `JoinHandle`.

use std::future::{Future, IntoFuture};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use virtual_threads as vt;

/// A future that is ready once the gate is opened; until then it leaves its waker with the
/// gate, once per waiting fiber (so `waiters` counts fibers). Woken by whoever opens it (here a
/// plain thread, as a tokio worker would).
#[derive(Default)]
struct Gate {
    open: AtomicBool,
    waiting: Mutex<Vec<Waker>>,
}

impl Gate {
    fn wait(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(|cx| {
            let mut waiting = self.waiting.lock().unwrap();
            if self.open.load(Ordering::Acquire) {
                return Poll::Ready(());
            }
            // `block_on` may poll again before the gate opens: its park may return spuriously.
            // With the `hooks` feature it does, now and then: a fiber whose lock of `waiting`
            // above waited in a hooked futex gives its park token back afterwards (in case the
            // park was ended by someone else's unpark, arch/hooks.md "No lost wake"), so its
            // next park, `block_on`'s, returns at once. A second waker of the same fiber would
            // count it twice.
            if !waiting.iter().any(|w| w.will_wake(cx.waker())) {
                waiting.push(cx.waker().clone());
            }
            Poll::Pending
        })
    }

    fn waiters(&self) -> usize {
        self.waiting.lock().unwrap().len()
    }

    fn open(&self) {
        let wakers = {
            let mut waiting = self.waiting.lock().unwrap();
            self.open.store(true, Ordering::Release);
            std::mem::take(&mut *waiting)
        };
        wakers.into_iter().for_each(Waker::wake);
    }
}

/// Waits (on a plain thread) until `cond` holds, for at most 20 s.
fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(20), "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_thousand_fibers_wait_on_futures_at_once() {
    let rt = vt::Runtime::builder().carriers(2).max_carriers(2).build().unwrap();
    let gate = Arc::new(Gate::default());
    let fibers: Vec<_> = (0..1000u64)
        .map(|i| {
            let gate = gate.clone();
            rt.spawn(move || {
                vt::future::block_on(gate.wait());
                i
            })
        })
        .collect();
    // All 1,000 are pending at once: with two carriers, that is only possible if a waiting
    // fiber frees its carrier.
    wait_until("1,000 futures are pending", || gate.waiters() == 1000);
    gate.open();
    let sum: u64 = fibers.into_iter().map(|f| f.join().unwrap()).sum();
    assert_eq!(sum, 999 * 1000 / 2);
}

#[test]
fn a_fiber_waiting_on_a_future_leaves_its_carrier_to_others() {
    // One carrier and no spare: if the waiting fiber held the carrier, the fiber that
    // completes the future could never run.
    let rt = vt::Runtime::builder().carriers(1).max_carriers(1).build().unwrap();
    let gate = Arc::new(Gate::default());
    let (done_tx, done_rx) = mpsc::channel();
    let waiter = {
        let gate = gate.clone();
        rt.spawn(move || {
            vt::future::block_on(gate.wait());
            done_tx.send(std::thread::current().id()).unwrap();
        })
    };
    wait_until("the future is pending", || gate.waiters() == 1);
    let opener = {
        let gate = gate.clone();
        rt.spawn(move || {
            gate.open();
            std::thread::current().id()
        })
    };
    let waiter_thread = done_rx.recv_timeout(Duration::from_secs(20)).expect("the waiting fiber resumed");
    assert_eq!(opener.join().unwrap(), waiter_thread, "both ran on the one carrier");
    waiter.join().unwrap();
}

#[test]
fn a_wake_during_the_poll_is_not_lost() {
    let rt = vt::Runtime::builder().carriers(1).build().unwrap();
    let polls = rt.block_on(|| {
        let mut polls = 0;
        vt::future::block_on(std::future::poll_fn(|cx| {
            polls += 1;
            if polls == 100 {
                return Poll::Ready(());
            }
            // Woken before the fiber parks: the park must return at once.
            cx.waker().wake_by_ref();
            Poll::Pending
        }));
        polls
    });
    assert_eq!(polls, 100);
}

#[test]
fn a_waker_woken_after_its_fiber_finished_is_harmless() {
    let rt = vt::Runtime::builder().carriers(2).build().unwrap();
    let kept: Arc<Mutex<Option<Waker>>> = Arc::default();
    let k = kept.clone();
    rt.spawn(move || {
        vt::future::block_on(std::future::poll_fn(|cx| {
            *k.lock().unwrap() = Some(cx.waker().clone());
            Poll::Ready(())
        }))
    })
    .join()
    .unwrap();
    // The waker outlives its fiber (it counts the fiber's record, so the record is not
    // handed to a new fiber meanwhile). Waking it, while new fibers spawn, park and finish
    // on the same carriers, must neither crash nor disturb them; valgrind's run of this
    // file (.ci/valgrind) would see a use after free.
    let stale = kept.lock().unwrap().take().unwrap();
    let waker_thread = std::thread::spawn(move || {
        for _ in 0..1000 {
            stale.wake_by_ref();
            let clone = stale.clone(); // a wake that gives back a count, after one that takes one
            clone.wake();
        }
    });
    let fibers: Vec<_> = (0..1000u64)
        .map(|i| {
            rt.spawn(move || {
                let (tx, rx) = vt::channel::bounded(1);
                let sender = vt::spawn(move || tx.send(i).unwrap());
                let v = rx.recv().unwrap();
                sender.join().unwrap();
                v
            })
        })
        .collect();
    waker_thread.join().unwrap();
    assert_eq!(fibers.into_iter().map(|f| f.join().unwrap()).sum::<u64>(), 999 * 1000 / 2);
}

#[test]
fn block_on_on_a_plain_thread_blocks_the_thread() {
    let gate = Arc::new(Gate::default());
    let g = gate.clone();
    let opener = std::thread::spawn(move || {
        wait_until("the future is pending", || g.waiters() == 1);
        g.open();
    });
    vt::future::block_on(gate.wait());
    opener.join().unwrap();
}

#[test]
fn async_code_awaits_a_fiber() {
    let rt = vt::Runtime::builder().carriers(2).build().unwrap();
    let (tx, rx) = vt::channel::bounded::<u64>(1);
    let fiber = rt.spawn(move || rx.recv().unwrap() * 2);
    let mut fut = pin!(fiber.into_future());
    // Not finished yet: the first poll is pending (and starts the joiner).
    assert!(fut.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending());
    tx.send(21).unwrap();
    assert_eq!(vt::future::block_on(fut).unwrap(), 42);

    // A finished fiber's handle is ready at the first poll; a panic comes back as `Err`.
    let fiber = rt.spawn(|| 7);
    while !fiber.is_finished() {
        std::thread::yield_now();
    }
    let mut fut = pin!(fiber.into_future());
    match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(r) => assert_eq!(r.unwrap(), 7),
        Poll::Pending => panic!("a finished fiber's future is ready"),
    }
    let fiber = rt.spawn(|| -> u64 { panic!("boom") });
    let err = vt::future::block_on(async move { fiber.await }).unwrap_err();
    assert_eq!(err.downcast_ref::<&str>(), Some(&"boom"));
}

#[test]
fn the_future_of_a_join_handle_is_send() {
    fn send<T: Send>(_: &T) {}
    let fiber = vt::spawn(|| 1u8);
    let fut = fiber.into_future();
    send(&fut);
    assert_eq!(vt::future::block_on(fut).unwrap(), 1);
}

#[test]
fn awaiting_a_fiber_whose_runtime_is_dropped_is_an_error() {
    let rt = vt::Runtime::builder().carriers(1).build().unwrap();
    let forever = rt.spawn(|| vt::sleep(Duration::MAX));
    let mut fut = pin!(forever.into_future());
    assert!(fut.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending());
    drop(rt); // unwinds the sleeper and the fiber that joins it
    assert!(vt::future::block_on(fut).is_err());
}
