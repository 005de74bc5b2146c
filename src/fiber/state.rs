//! A fiber's state word and its legal transitions, apart from everything else in the record so
//! that loom can check them (the models in `tests/loom_state.rs`; `arch/loom.md`). The one
//! diagram of a fiber's life (`fiber/mod.rs` and `arch/fiber.md` point here):
//!
//! ```text
//!   spawn ──► RUNNING, queued ──(carrier pops it: no CAS)──► RUNNING ──(returns)──► DONE
//!                                                         ▲   │   │
//!     RUNNABLE ──(carrier pops it, claims: CAS)───────────┘   │   └─(yield_now)──► RUNNING, queued
//!        ▲ unpark: PARKED → RUNNABLE                          │
//!        └────────────────── PARKED ◄─────────────────────────┘ park (the carrier CASes RUNNING
//!                             │   ▲                               → PARKED after the switch, so a
//!            compactor claims ▼   │ lets go (COMPACTED set         fiber is never resumed while it
//!                          COMPACTING  if it saved the stack)      is still switching out)
//! ```
//! "RUNNING, queued" is `RUNNING` in this word while the record's `queued_running` flag is set
//! (`FiberRecord::set_yielded`, `try_claim`): a new or yielded fiber sits in a queue, and only
//! the queue entry's owner can run it, so popping it needs no CAS. The flag lives beside the
//! word, not in it, and the loom models here cover the word alone: only the thread that owns
//! the queue entry writes or reads it (set when it queues the fiber, cleared when it pops it;
//! a steal hands the entry over through the deque's own synchronisation; dumps only read it
//! for display), so there is no interleaving to check, while in the word, which unparkers CAS concurrently,
//! setting it would cost every yield and every spawn a locked read-modify-write. `NOTIFIED` is a flag beside
//! the state: an `unpark` that finds the fiber not parked (running, queued, or compacting)
//! leaves a token that its next `park` consumes, so no wake-up is lost. See `arch/fiber.md`.
//!
//! Stack compaction (`compact.rs`, `arch/compaction.md`) adds a state and a flag. The
//! compactor claims a parked fiber with `PARKED → COMPACTING`, so that nobody resumes it while
//! its stack is copied out and released; an unpark meanwhile finds it not parked and only
//! leaves `NOTIFIED`, and the compactor schedules the fiber when it lets go. The `COMPACTED`
//! flag then rides along (`PARKED|COMPACTED → RUNNABLE|COMPACTED`) until a claim clears it and
//! tells the claimer to copy the stack back before resuming the fiber. For everyone but the
//! compactor, `COMPACTING` reads as `PARKED` (`state`).

use crate::loom::{self, AtomicU32, Ordering};

pub(crate) const RUNNING: u32 = 0;
pub(crate) const RUNNABLE: u32 = 1;
pub(crate) const PARKED: u32 = 2;
pub(crate) const DONE: u32 = 3;
/// Parked, and held by the compactor: nobody else may make it runnable (see the module doc).
/// A state rather than a flag, so that `notify` tells it from `PARKED` with the one test it
/// makes anyway.
pub(crate) const COMPACTING: u32 = 4;
pub(crate) const STATE_MASK: u32 = 7;
/// The unpark token (see the module doc).
pub(crate) const NOTIFIED: u32 = 8;
/// The fiber's live stack is saved in its record, and its pages were released: whoever claims
/// it copies the stack back first.
pub(crate) const COMPACTED: u32 = 16;

/// What a claim found (`try_claim`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum Claim {
    /// Not runnable: someone else claimed it (a bug today; see `try_claim`).
    Lost,
    /// Claimed; its stack is in place.
    Claimed,
    /// Claimed; its stack is compacted and must be restored before it runs.
    Compacted,
}

/// Bits 0–2: the state (`RUNNING | RUNNABLE | PARKED | DONE | COMPACTING`); bit 3: `NOTIFIED`;
/// bit 4: `COMPACTED`.
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

    /// The state without the flags; a fiber held by the compactor is `PARKED`.
    pub(crate) fn state(&self) -> u32 {
        match self.0.load(Ordering::Acquire) & STATE_MASK {
            COMPACTING => PARKED,
            s => s,
        }
    }

    /// Sets the word of a record nobody else can see (`FiberRecord::init`): Relaxed, because
    /// handing the record out publishes it. Inline: a spawn's one store, and as a call from
    /// another codegen unit it was a call through the GOT.
    #[inline]
    pub(crate) fn reset(&self, state: u32) {
        self.0.store(state, Ordering::Relaxed);
    }

    /// Claims a runnable fiber to run it (`RUNNABLE → RUNNING`, keeping the token). Fails if
    /// it is not runnable. Every queue entry is a fiber that became runnable, so today a claim
    /// fails only on a bug; the check keeps such a bug from running one fiber on two carriers.
    /// A compacted fiber comes back as `Claim::Compacted`: the flag is read from the value the
    /// CAS replaced, so a hot fiber pays nothing for it but the branch on the result.
    pub(crate) fn try_claim(&self) -> Claim {
        let mut s = self.0.load(Ordering::Relaxed);
        loop {
            if s & STATE_MASK != RUNNABLE {
                return Claim::Lost;
            }
            // Acquire pairs with the Release of whoever made it runnable (unpark's CAS or the
            // park CAS of the previous carrier), so its stack is visible here (and, for a
            // compacted fiber, the saved copy, through the unpark that read the compactor's
            // Release).
            match self.0.compare_exchange_weak(s, s & NOTIFIED, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) if s & COMPACTED != 0 => return Claim::Compacted,
                Ok(_) => return Claim::Claimed,
                Err(actual) => s = actual,
            }
        }
    }

    /// The compactor claims a fiber that is parked and not compacted (`PARKED → COMPACTING`).
    /// On success it has the fiber to itself until `end_compaction`.
    pub(crate) fn try_begin_compaction(&self) -> bool {
        // Acquire pairs with `try_set_parked`'s Release: everything the fiber wrote on its
        // stack before it switched out is visible to the copy.
        self.0.compare_exchange(PARKED, COMPACTING, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// The compactor lets go of a fiber it claimed; `compacted` says whether its stack is now
    /// saved and released. Returns true when an unpark came meanwhile: the fiber is then
    /// runnable and the caller must schedule it (the unpark left that to us).
    pub(crate) fn end_compaction(&self, compacted: bool) -> bool {
        let keep = if compacted { COMPACTED } else { 0 };
        let mut s = self.0.load(Ordering::Relaxed);
        loop {
            debug_assert_eq!(s & !NOTIFIED, COMPACTING);
            let (next, wake) =
                if s & NOTIFIED != 0 { (RUNNABLE | keep, true) } else { (PARKED | keep, false) };
            // Release publishes the saved stack to whoever claims the fiber next (through
            // notify's Acquire, or our own queue push); Acquire (on the woken path) reads the
            // notifier's Release, so the fiber sees what its waker published.
            match self.0.compare_exchange_weak(s, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return wake,
                Err(actual) => s = actual,
            }
        }
    }

    /// Clears `COMPACTED` where no claim does it (the runtime's drop unwinds fibers without
    /// claiming them). Returns whether it was set.
    pub(crate) fn take_compacted(&self) -> bool {
        self.0.fetch_and(!COMPACTED, Ordering::Acquire) & COMPACTED != 0
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
        // Most parks find no token: a plain load spares them a locked CAS that would fail. Missing a token that lands just after the load is harmless: the
        // carrier's `try_set_parked` CAS fails on it and consumes it, so the park returns.
        if self.0.load(Ordering::Relaxed) & NOTIFIED == 0 {
            return false;
        }
        self.0.compare_exchange(RUNNING | NOTIFIED, RUNNING, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// Makes the fiber runnable if it is parked, or leaves a token. Returns true when the
    /// caller must schedule it (the PARKED → RUNNABLE transition is the caller's to finish).
    pub(crate) fn notify(&self) -> bool {
        let mut s = self.0.load(Ordering::Relaxed);
        loop {
            let (next, wake) = match s & STATE_MASK {
                // PARKED → RUNNABLE, keeping `COMPACTED` (a parked word carries no other flag).
                PARKED => (s ^ (PARKED ^ RUNNABLE), true),
                DONE => return false,
                // Running or runnable: leave a token for its next park. Parked but held by the
                // compactor (COMPACTING): leave the token too; the compactor schedules the
                // fiber when it lets go (`end_compaction` reads the token with an RMW after
                // this one). If a token is already waiting, write it again all the same.
                // Returning on the load alone would leave this unpark unordered with the park that consumes the
                // earlier token, and that park could miss what this caller published and park
                // for good (found by `loom_state_park_races_two_unparks`). Written, the CAS
                // either is what the park's Acquire reads or, failing on a consumed token,
                // loops and leaves a fresh one.
                _ => (s | NOTIFIED, false),
            };
            // AcqRel: Acquire pairs with `try_set_parked`'s Release (the parked fiber's writes),
            // Release publishes the caller's writes (the message it is waking the fiber for).
            match self.0.compare_exchange_weak(s, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return wake,
                Err(actual) => s = actual,
            }
        }
    }
}

impl std::fmt::Debug for StateWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.load(Ordering::Relaxed);
        let name = match s & STATE_MASK {
            RUNNING => "Running",
            RUNNABLE => "Runnable",
            PARKED => "Parked",
            DONE => "Done",
            _ => "Compacting",
        };
        f.write_str(name)?;
        for (flag, what) in [(NOTIFIED, "+Notified"), (COMPACTED, "+Compacted")] {
            if s & flag != 0 {
                f.write_str(what)?;
            }
        }
        Ok(())
    }
}

#[cfg(all(test, loom))]
#[path = "tests/loom_state.rs"]
mod loom_tests;
