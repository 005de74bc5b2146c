//! A fiber's state word and its legal transitions, apart from everything else in the record so
//! that loom can check them (the models at the foot of this file; `arch/loom.md`).
//!
//! ```text
//!   spawn ──► RUNNABLE ──(carrier pops it)──► RUNNING ──(returns)──► DONE
//!                ▲                             │   │
//!                │ unpark: PARKED → RUNNABLE    │   └─(yield_now)──► RUNNABLE (back of a queue)
//!                └──────────── PARKED ◄─────────┘ park (the carrier CASes RUNNING → PARKED
//!                                                  after the switch, so a fiber is never
//!                                                  resumed while it is still switching out)
//! ```
//! `NOTIFIED` is a flag beside the state: an `unpark` that finds the fiber not parked leaves a
//! token that its next `park` consumes, so no wake-up is lost. See `arch/fiber.md`.

use crate::sync::loom::{self, AtomicU32, Ordering};

pub(crate) const RUNNING: u32 = 0;
pub(crate) const RUNNABLE: u32 = 1;
pub(crate) const PARKED: u32 = 2;
pub(crate) const DONE: u32 = 3;
pub(crate) const STATE_MASK: u32 = 3;
/// The unpark token (see the module doc).
pub(crate) const NOTIFIED: u32 = 4;

/// Bits 0–1: the state (`RUNNING | RUNNABLE | PARKED | DONE`); bit 2: `NOTIFIED`.
pub(crate) struct StateWord(AtomicU32);

impl StateWord {
    loom::loom_const_fn! {
        pub(crate) fn new(state: u32) -> StateWord {
            StateWord(AtomicU32::new(state))
        }
    }

    /// The whole word, token included (for dumps and `Debug`).
    pub(crate) fn load(&self, order: Ordering) -> u32 {
        self.0.load(order)
    }

    /// The state without the token.
    pub(crate) fn state(&self) -> u32 {
        self.0.load(Ordering::Acquire) & STATE_MASK
    }

    /// Sets the word of a record nobody else can see (`FiberRecord::init`): Relaxed, because
    /// handing the record out publishes it.
    pub(crate) fn reset(&self, state: u32) {
        self.0.store(state, Ordering::Relaxed);
    }

    /// Claims a runnable fiber to run it (`RUNNABLE → RUNNING`, keeping the token). Fails if
    /// it is not runnable. Every queue entry is a fiber that became runnable, so today a claim
    /// fails only on a bug; the check keeps such a bug from running one fiber on two carriers.
    pub(crate) fn try_claim(&self) -> bool {
        let mut s = self.0.load(Ordering::Relaxed);
        loop {
            if s & STATE_MASK != RUNNABLE {
                return false;
            }
            // Acquire pairs with the Release of whoever made it runnable (unpark's CAS or the
            // park CAS of the previous carrier), so its stack is visible here.
            match self.0.compare_exchange_weak(s, s & NOTIFIED, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(actual) => s = actual,
            }
        }
    }

    /// Carrier side, after the fiber switched out with `Suspend::Yield`.
    pub(crate) fn set_runnable(&self) {
        self.0.fetch_or(RUNNABLE, Ordering::Release);
    }

    /// Carrier side, after the fiber switched out with `Suspend::Park`. Returns false when a
    /// token was waiting: the token is consumed and the fiber must be resumed again.
    pub(crate) fn try_set_parked(&self) -> bool {
        // Release pairs with unpark's Acquire CAS: the next carrier to run this fiber sees
        // everything it wrote before parking.
        match self.0.compare_exchange(RUNNING, PARKED, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => true,
            Err(_) => {
                // Consume the token with an RMW, Acquire, as `take_token` does: it reads the
                // last `notify` to write the word and pairs with it, so the fiber, resumed at
                // once, sees what that waker published. A Relaxed CAS failure followed by a
                // plain store saw only some earlier notify and could wipe a later one's write:
                // the fiber re-checked, missed its condition and parked for good (found by
                // `loom_state_park_races_unpark` and `_two_unparks`).
                self.0.swap(RUNNING, Ordering::Acquire);
                false
            }
        }
    }

    pub(crate) fn set_done(&self) {
        self.0.store(DONE, Ordering::Release);
    }

    /// Fiber side: consumes the token if there is one.
    pub(crate) fn take_token(&self) -> bool {
        self.0.compare_exchange(RUNNING | NOTIFIED, RUNNING, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// Makes the fiber runnable if it is parked, or leaves a token. Returns true when the
    /// caller must schedule it (the PARKED → RUNNABLE transition is the caller's to finish).
    pub(crate) fn notify(&self) -> bool {
        let mut s = self.0.load(Ordering::Relaxed);
        loop {
            let next = match s & STATE_MASK {
                PARKED => RUNNABLE,
                DONE => return false,
                // A token is already waiting: write it again all the same. Returning on the
                // load alone would leave this unpark unordered with the park that consumes the
                // earlier token, and that park could miss what this caller published and park
                // for good (found by `loom_state_park_races_two_unparks`). Written, the CAS
                // either is what the park's Acquire reads or, failing on a consumed token,
                // loops and leaves a fresh one.
                _ => s | NOTIFIED,
            };
            // AcqRel: Acquire pairs with `try_set_parked`'s Release (the parked fiber's writes),
            // Release publishes the caller's writes (the message it is waking the fiber for).
            match self.0.compare_exchange_weak(s, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return next == RUNNABLE,
                Err(actual) => s = actual,
            }
        }
    }
}

impl std::fmt::Debug for StateWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.load(Ordering::Relaxed);
        let name = ["Running", "Runnable", "Parked", "Done"][(s & STATE_MASK) as usize];
        if s & NOTIFIED != 0 { write!(f, "{name}+Notified") } else { f.write_str(name) }
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! A fiber parks in a loop on a condition (`while !ready { park() }`, as every caller of
    //! `park` does) while unparkers set the condition and call `notify`. Loom threads stand in
    //! for carriers: the fiber's code runs on whichever thread claimed it, and its "stack" is a
    //! loom cell, so two carriers running it at once, or one not seeing what the last one
    //! wrote, is reported. Corosensei's switch itself is not modelled (`arch/loom.md`).
    use ::loom::cell::UnsafeCell;
    use ::loom::thread;

    use super::*;
    use crate::sync::loom::{Arc, AtomicBool, AtomicUsize};

    struct Fiber {
        state: StateWord,
        /// The fiber's own memory, touched by whichever carrier runs it.
        stack: UnsafeCell<u32>,
        running: AtomicBool,
        /// The condition the fiber waits for: unparks so far.
        woken: AtomicUsize,
        wanted: usize,
        /// The fiber calls `yield_now` once before it starts waiting.
        yields: AtomicBool,
        /// The fiber returned. (Not read off the state word: loom 0.7 can order a plain store,
        /// like `set_done`'s, before a concurrent RMW that did not see it, tokio-rs/loom#254.)
        finished: AtomicBool,
        /// Ways a `park` returned: a token taken by the fiber, a token found by the carrier
        /// switching it out, a claim after `notify` made it runnable.
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
            self.stack.with_mut(|s| {
                // SAFETY: loom checks that no other thread touches the cell meanwhile.
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

        /// `Carrier::run_claimed`: run it; after a park, mark it parked unless a token waits.
        /// A yield makes it runnable, and this carrier claims it again, as if it had popped it
        /// from its queue (a concurrent unpark leaves its token across the claim).
        fn run_claimed(&self) {
            loop {
                match self.run_slice() {
                    Switch::Return => {
                        self.state.set_done();
                        return;
                    }
                    Switch::Yield => {
                        self.state.set_runnable();
                        assert!(self.state.try_claim(), "a yielded fiber is claimable");
                    }
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
                assert!(self.state.try_claim(), "a fiber made runnable by notify is claimable");
                self.by_claim.fetch_add(1, Ordering::Relaxed);
                self.run_claimed();
            }
        }
    }

    fn check(unparkers: usize, yields: bool) {
        ::loom::model(move || {
            let f = Arc::new(Fiber {
                state: StateWord::new(RUNNING),
                stack: UnsafeCell::new(0),
                running: AtomicBool::new(false),
                woken: AtomicUsize::new(0),
                wanted: unparkers,
                yields: AtomicBool::new(yields),
                finished: AtomicBool::new(false),
                by_token: AtomicUsize::new(0),
                by_failed_park: AtomicUsize::new(0),
                by_claim: AtomicUsize::new(0),
            });
            let handles: Vec<_> = (0..unparkers)
                .map(|_| {
                    let f = f.clone();
                    thread::spawn(move || f.unpark())
                })
                .collect();
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
        check(1, false);
    }

    #[test]
    fn loom_state_park_races_two_unparks() {
        check(2, false);
    }

    #[test]
    fn loom_state_yield_then_park_races_unpark() {
        check(1, true);
    }
}
