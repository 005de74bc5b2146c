//! The real steps on a loom word, with loom cells for the record's `stage` and `waiter`
//! and a loom thread (its park and unpark) for the joiner, as for a plain-thread joiner.
//! A fiber joiner parks through the state word instead, modelled in `state.rs`.
use loom::alloc::Track;
use loom::cell::UnsafeCell;
use loom::sync::atomic::AtomicU8;
use loom::thread::{self, Thread};

use super::*;
use crate::loom::Arc;

/// The parts of a fiber record the hand-off touches.
struct Record {
    join: AtomicU8,
    stage: UnsafeCell<Option<Track<u32>>>,
    waiter: UnsafeCell<Option<Thread>>,
}

impl Record {
    fn new() -> Arc<Record> {
        Arc::new(Record {
            join: AtomicU8::new(EMPTY),
            stage: UnsafeCell::new(None),
            waiter: UnsafeCell::new(None),
        })
    }

    fn take_result(&self) -> Option<Track<u32>> {
        // SAFETY: loom checks that the hand-off leaves the cell to one thread at a time.
        self.stage.with_mut(|s| unsafe { (*s).take() })
    }

    /// The fiber's last steps: store the result (`put_stage`), then `complete`.
    fn finish(&self) {
        // SAFETY: as in `take_result`.
        self.stage.with_mut(|s| unsafe { *s = Some(Track::new(7)) });
        match publish_result(&self.join) {
            Completion::WakeJoiner => {
                // SAFETY: as in `take_result`.
                if let Some(w) = self.waiter.with_mut(|w| unsafe { (*w).take() }) {
                    w.unpark();
                }
            }
            Completion::DropResult => drop(self.take_result().expect("the result is dropped once")),
            Completion::Kept => {}
        }
    }
}

/// `JoinHandle::join` against the fiber finishing: the joiner always wakes (else loom
/// reports a deadlock) and takes the result exactly once.
#[test]
fn loom_join_races_completion() {
    loom::model(|| {
        let rec = Record::new();
        let fiber = {
            let rec = rec.clone();
            thread::spawn(move || rec.finish())
        };
        // SAFETY: as in `take_result`.
        let publish_handle = || rec.waiter.with_mut(|w| unsafe { *w = Some(thread::current()) });
        wait_for_result(&rec.join, publish_handle, thread::park);
        let r = rec.take_result().expect("the joiner finds the result");
        assert_eq!(*r.get_ref(), 7);
        mark_taken(&rec.join);
        assert!(!detach(&rec.join), "the handle's drop after a join drops nothing");
        fiber.join().unwrap();
        assert!(rec.take_result().is_none(), "the result was taken once");
    });
}

/// A handle dropped without joining against the fiber finishing: exactly one side drops
/// the result (twice panics in `expect`; never fails the last check).
#[test]
fn loom_detach_races_completion() {
    loom::model(|| {
        let rec = Record::new();
        let fiber = {
            let rec = rec.clone();
            thread::spawn(move || rec.finish())
        };
        if detach(&rec.join) {
            drop(rec.take_result().expect("the result is dropped once"));
        }
        fiber.join().unwrap();
        assert!(rec.take_result().is_none(), "nobody dropped the result");
    });
}
