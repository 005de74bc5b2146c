//! Models the hand-off between a waker (pop, transition, unpark after unlocking) and a
//! waiter (register under the lock, park in a loop, cancel at a deadline).
use super::*;
use crate::sync::loom::{Arc, Mutex};

/// A waker and a timed waiter race; exactly one of "granted" and "timed out" happens, and
/// the waker learns which through its `grant` result.
#[test]
fn grant_races_timeout() {
    ::loom::model(|| {
        let queue = Arc::new(Mutex::new(WaitQueue::<Arc<Waiter>>::new()));
        let waiter = Arc::new(Waiter::new());
        queue.lock().unwrap().push_back(waiter.clone());
        let q2 = queue.clone();
        let waker = ::loom::thread::spawn(move || {
            let popped = q2.lock().unwrap().pop_accepted(|w| w.grant(0));
            popped.map(|w| w.unpark()).is_some()
        });
        let outcome = waiter.wait(WaitReason::ChannelRecv, Some(Instant::now()));
        if outcome == Outcome::TimedOut {
            queue.lock().unwrap().remove(&waiter);
        }
        let granted = waker.join().unwrap();
        assert_eq!(granted, outcome == Outcome::Granted(0));
    });
}

/// An untimed waiter is never left parked: the wake-up is either seen before parking or
/// its unpark token ends the park.
#[test]
fn no_lost_wakeup() {
    ::loom::model(|| {
        let queue = Arc::new(Mutex::new(WaitQueue::<Arc<Waiter>>::new()));
        let flag = Arc::new(crate::sync::loom::AtomicBool::new(false));
        let (q2, f2) = (queue.clone(), flag.clone());
        let waker = ::loom::thread::spawn(move || {
            f2.store(true, Ordering::Release);
            let popped = q2.lock().unwrap().pop_accepted(|w| w.wake(0));
            if let Some(w) = popped {
                w.unpark();
            }
        });
        // Register, re-check, park: the primitives' pattern.
        loop {
            let waiter = Arc::new(Waiter::new());
            {
                let mut q = queue.lock().unwrap();
                if flag.load(Ordering::Acquire) {
                    break;
                }
                q.push_back(waiter.clone());
            }
            assert_eq!(waiter.wait(WaitReason::Condvar, None), Outcome::Woken(0));
        }
        waker.join().unwrap();
    });
}
