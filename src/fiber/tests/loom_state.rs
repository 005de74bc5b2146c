//! A fiber parks in a loop on a condition (`while !ready { park() }`, as every caller of
//! `park` does) while unparkers set the condition and call `notify`. Loom threads stand in
//! for carriers: the fiber's code runs on whichever thread claimed it, and its "stack" is a
//! loom cell, so two carriers running it at once, or one not seeing what the last one
//! wrote, is reported. Corosensei's switch itself is not modelled (`arch/loom.md`).
//!
//! With a compactor (the supervisor's `compact.rs`), one more thread claims the parked
//! fiber, "copies its stack out" (reads the cell, marks it saved), and lets go; whoever
//! claims a compacted fiber "copies it back" first. The fiber checks at every run that its
//! stack is in place, and loom reports a copy that overlaps a run.
use ::loom::cell::UnsafeCell;
use ::loom::thread;

use super::*;
use crate::loom::{Arc, AtomicBool, AtomicUsize};

struct Fiber {
    state: StateWord,
    /// The fiber's own memory, touched by whichever carrier runs it.
    stack: UnsafeCell<u32>,
    /// The stack is compacted: saved in the record, its pages released.
    saved: UnsafeCell<bool>,
    running: AtomicBool,
    /// The condition the fiber waits for: unparks so far.
    woken: AtomicUsize,
    wanted: usize,
    /// The fiber calls `yield_now` once before it starts waiting.
    yields: AtomicBool,
    /// The fiber returned. (Not read off the state word: loom 0.7 can order a plain store,
    /// like `set_done`'s, before a concurrent RMW that did not see it:
    /// https://github.com/tokio-rs/loom/issues/254.)
    finished: AtomicBool,
    /// Ways a `park` returned: a token taken by the fiber, a token found by the carrier
    /// switching it out, a claim after `notify` (or the compactor) made it runnable.
    by_token: AtomicUsize,
    by_failed_park: AtomicUsize,
    by_claim: AtomicUsize,
}

/// Where the fiber stopped.
enum Switch {
    Yield,
    Park,
    Return,
}

impl Fiber {
    /// The fiber's body from where it last switched out to its next switch.
    fn run_slice(&self) -> Switch {
        assert!(!self.running.swap(true, Ordering::Relaxed), "two carriers run one fiber");
        // SAFETY: loom checks that no other thread touches the cell meanwhile.
        assert!(!self.saved.with(|s| unsafe { *s }), "a fiber ran on a compacted stack");
        self.stack.with_mut(|s| {
            // SAFETY: as above.
            unsafe { *s += 1 };
        });
        let out = loop {
            if self.yields.swap(false, Ordering::Relaxed) {
                break Switch::Yield;
            }
            if self.woken.load(Ordering::Acquire) == self.wanted {
                self.finished.store(true, Ordering::Relaxed);
                break Switch::Return;
            }
            // `park_fiber`: a waiting token makes the park return at once.
            if self.state.take_token() {
                self.by_token.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            break Switch::Park;
        };
        self.running.store(false, Ordering::Relaxed);
        out
    }

    /// `Carrier::run_fiber`: claim it, copy its stack back if it was compacted, run it.
    fn claim_and_run(&self) {
        match self.state.try_claim() {
            Claim::Lost => panic!("a fiber made runnable is claimable"),
            Claim::Compacted => {
                // `FiberRecord::restore_stack`.
                // SAFETY: loom checks the cells' accesses.
                self.saved.with_mut(|s| unsafe { assert!(std::mem::replace(&mut *s, false)) });
                // SAFETY: as above.
                self.stack.with_mut(|s| unsafe { *s += 1 });
            }
            Claim::Claimed => {}
        }
        self.by_claim.fetch_add(1, Ordering::Relaxed);
        self.run_claimed();
    }

    /// `Carrier::run_claimed`: run it; after a park, mark it parked unless a token waits.
    /// A yield leaves the word `RUNNING` (`FiberRecord::set_yielded`), and this carrier
    /// runs it again, as if it had popped it from its queue (a concurrent unpark leaves its
    /// token across the yield).
    fn run_claimed(&self) {
        loop {
            match self.run_slice() {
                Switch::Return => {
                    self.state.set_done();
                    return;
                }
                Switch::Yield => {}
                Switch::Park if self.state.try_set_parked() => return,
                Switch::Park => {
                    self.by_failed_park.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Someone made the condition true and unparks the fiber (`unpark_record`); if it
    /// must be scheduled, this thread is also the carrier that pops and runs it.
    fn unpark(&self) {
        self.woken.fetch_add(1, Ordering::Release);
        if self.state.notify() {
            self.claim_and_run();
        }
    }

    /// The supervisor's compaction of one fiber (`compact.rs`); if an unpark came while it
    /// held the fiber, it schedules it, and this thread is the carrier that runs it.
    fn compact(&self) {
        if !self.state.try_begin_compaction() {
            return;
        }
        // SAFETY: loom checks the cells' accesses.
        let _copy = self.stack.with(|s| unsafe { *s });
        // SAFETY: as above.
        self.saved.with_mut(|s| unsafe { *s = true });
        if self.state.end_compaction(true) {
            self.claim_and_run();
        }
    }
}

fn check(unparkers: usize, yields: bool, compactor: bool) {
    ::loom::model(move || {
        let f = Arc::new(Fiber {
            state: StateWord::new(RUNNING),
            stack: UnsafeCell::new(0),
            saved: UnsafeCell::new(false),
            running: AtomicBool::new(false),
            woken: AtomicUsize::new(0),
            wanted: unparkers,
            yields: AtomicBool::new(yields),
            finished: AtomicBool::new(false),
            by_token: AtomicUsize::new(0),
            by_failed_park: AtomicUsize::new(0),
            by_claim: AtomicUsize::new(0),
        });
        let mut handles: Vec<_> = (0..unparkers)
            .map(|_| {
                let f = f.clone();
                thread::spawn(move || f.unpark())
            })
            .collect();
        if compactor {
            let f = f.clone();
            handles.push(thread::spawn(move || f.compact()));
        }
        // This thread is the carrier that claimed the fiber first.
        f.run_claimed();
        for h in handles {
            h.join().unwrap();
        }
        // No lost wake-up: every unpark happened, so the fiber saw its condition and ended.
        assert!(f.finished.load(Ordering::Relaxed), "the fiber stayed parked");
        // Each unpark made at most one park return: the token is consumed once.
        let returns = f.by_token.load(Ordering::Relaxed)
            + f.by_failed_park.load(Ordering::Relaxed)
            + f.by_claim.load(Ordering::Relaxed);
        assert!(returns <= unparkers, "{returns} park returns for {unparkers} unparks");
    });
}

#[test]
fn loom_state_park_races_unpark() {
    check(1, false, false);
}

#[test]
fn loom_state_park_races_two_unparks() {
    check(2, false, false);
}

#[test]
fn loom_state_yield_then_park_races_unpark() {
    check(1, true, false);
}

#[test]
fn loom_state_compaction_races_unpark() {
    check(1, false, true);
}

#[test]
fn loom_state_compaction_races_two_unparks() {
    check(2, false, true);
}
