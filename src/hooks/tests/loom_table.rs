//! The futex table's wait and wake race (`arch/hooks.md`, "No lost wake"), on loom threads:
//! the real `Table`, a loom word, and a loom thread's park and unpark for the fiber's.
use loom::sync::atomic::AtomicU32;
use loom::thread;

use super::*;
use crate::loom::Arc;

const ADDR: usize = 0x1000;

/// One waiter (this thread: wait while the word is 0, parking with `park`) against one waker
/// (another thread: store 1, then wake one). Returns the waiter's outcome and the wake's count.
fn wait_against_a_wake(park: impl FnMut() -> Parked) -> (Waited, usize) {
    let table = Arc::new(Table::new());
    let word = Arc::new(AtomicU32::new(0));
    let (t, w) = (table.clone(), word.clone());
    let waker = thread::spawn(move || {
        w.store(1, Ordering::SeqCst);
        t.wake(ADDR, u32::MAX, 1).expect("not a signal handler")
    });
    let me = Waiter::new(ADDR, u32::MAX, thread::current());
    let got = table.wait(&me, || word.load(Ordering::SeqCst) == 0, park).expect("not a signal handler");
    (got, waker.join().unwrap())
}

#[test]
fn loom_a_wake_after_the_word_changes_is_never_lost() {
    loom::model(|| {
        // An untimed wait: parks until unparked. A lost wake leaves it parked for ever, which
        // loom reports as a deadlock.
        let (got, woke) = wait_against_a_wake(|| {
            thread::park();
            Parked::Again
        });
        match got {
            Waited::Woken => assert_eq!(woke, 1),
            Waited::Changed => assert_eq!(woke, 0),
            Waited::Stopped => unreachable!("an untimed wait never stops"),
        }
    });
}

#[test]
fn loom_a_counted_wake_is_never_swallowed_by_a_timeout() {
    // A wait whose deadline has passed at its first look (loom's model of a timer), racing a
    // wake: a wake that counts the waiter must be the waiter's outcome.
    loom::model(|| {
        let (got, woke) = wait_against_a_wake(|| Parked::Stop);
        assert_eq!(woke == 1, got == Waited::Woken, "woke {woke}, waiter {got:?}");
    });
}
