//! The one door to blocking for `vt::sync` and `vt::channel`: a heap-allocated [`Waiter`] per
//! contended wait, a FIFO [`WaitQueue`] of them, and [`park`], the only function that parks.
//!
//! A waiter is a one-shot state machine. It starts `WAITING`; exactly one compare-and-swap takes
//! it out of that state, and whoever wins decides the outcome:
//!
//! ```text
//!            wake(op)  by another party      → WOKEN(op)    "retry your operation"
//! WAITING ── grant(op) by another party      → GRANTED(op)  "it is done for you"
//!    │       cancel()  by the waiter itself  → CANCELLED    "nobody did anything for you"
//!    └────── hold(op)  by another party      → HELD(op) ─┬─ grant_held → GRANTED(op)
//!                                                         └─ release_held → WOKEN(op)
//! ```
//!
//! `HELD` is a channel's reservation: a sender whose message is not made yet (a `select!` send
//! arm, a `Select` send) has chosen this receiver and will complete it once the message exists.
//! A held waiter keeps waiting past its deadline, and nobody else can take it; only the
//! runtime's drop, unwinding it, cancels it (`abandon`), and the holder's `grant_held` then
//! fails and it keeps its message.
//!
//! The waiter loops on `park` until its state leaves `WAITING`, so a stale unpark token or a
//! spurious wake-up costs one extra loop. A timed-out waiter must win `cancel` to report a
//! timeout; if it loses, it was woken or granted and acts on that instead, so a timeout never
//! swallows a lock, a permit or a message. The waker unparks only after releasing its own
//! inner lock, holding its own `Arc` of the waiter. Nodes live on the heap, never on the
//! waiting fiber's stack, so nothing writes into a parked stack. The full protocol and its proof
//! sketch are in `arch/sync.md`.

use std::collections::VecDeque;
use std::time::Instant;

use super::loom::{self, AtomicUsize, Fiber, Ordering};

use crate::fiber::wait::WaitReason;

/// Parks the calling fiber (or plain thread) until an unpark, a spurious wake-up or `deadline`.
///
/// Every park of `vt::sync` and `vt::channel` goes through here, so that the reason can be
/// recorded in one place. Callers loop on their own condition.
pub(crate) fn park(reason: WaitReason, deadline: Option<Instant>) {
    // The fiber records the reason for dumps (Go's `gopark(reason)`).
    #[cfg(not(loom))]
    crate::fiber::park::park_for(reason, deadline);
    #[cfg(loom)]
    {
        let _ = reason;
        match deadline {
            None => loom::park(),
            Some(deadline) => loom::park_until(deadline),
        }
    }
}

/// Packed waiter state: bits 0-2 are the tag, bits 3.. the index of the operation that a wake
/// or grant refers to (a `select!` arm; 0 for single operations).
const WAITING: usize = 0;
const CANCELLED: usize = 1;
const WOKEN: usize = 2;
const GRANTED: usize = 3;
const HELD: usize = 4;
const TAG_MASK: usize = 7;
const OP_SHIFT: usize = 3;

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Another party asks the waiter to retry operation `op` (lock released, disconnection...).
    Woken(usize),
    /// Another party completed operation `op` for the waiter (lock handed over, message
    /// delivered or taken, permit granted).
    Granted(usize),
    /// The waiter cancelled itself at its deadline; nobody did anything on its behalf.
    TimedOut,
}

impl Outcome {
    fn decode(state: usize) -> Outcome {
        let op = state >> OP_SHIFT;
        match state & TAG_MASK {
            WOKEN => Outcome::Woken(op),
            GRANTED => Outcome::Granted(op),
            CANCELLED => Outcome::TimedOut,
            _ => unreachable!("a waiter left WAITING without a transition"),
        }
    }
}

/// One contended wait of one fiber or thread: lives on the heap (usually in an `Arc` held by
/// the waiter and by the queue it is in), never on the waiting stack.
#[derive(Debug)]
pub(crate) struct Waiter {
    /// `WAITING`, `CANCELLED`, or `WOKEN`, `GRANTED`, `HELD` with `op << OP_SHIFT`; see the
    /// module docs.
    state: AtomicUsize,
    fiber: Fiber,
}

impl Waiter {
    /// A waiter for the calling fiber or thread.
    pub(crate) fn new() -> Waiter {
        Waiter { state: AtomicUsize::new(WAITING), fiber: loom::current() }
    }

    /// Whether this waiter is for the calling fiber, so that [`Waiter::reset`] can make it
    /// ready for another wait without a new counted handle (two locked operations on the
    /// fiber's record saved per blocking call).
    pub(crate) fn is_for_running_fiber(&self) -> bool {
        #[cfg(not(loom))]
        return self.fiber.is_running_fiber();
        #[cfg(loom)]
        return false;
    }

    /// Makes a finished waiter reusable for the same fiber.
    ///
    /// Precondition: the waiter is in no queue, so no party can still transition it; a waker
    /// that is between its transition and its unpark only leaves a spare unpark token, which
    /// `wait` tolerates.
    pub(crate) fn reset(&self) {
        // Relaxed: only the owner reads the state from here on, until it publishes the waiter
        // again under a queue's inner lock, which orders this store for the next waker.
        self.state.store(WAITING, Ordering::Relaxed);
    }

    fn transition(&self, to: usize) -> bool {
        // Release pairs with the Acquire loads in `wait`/`cancel`: what the waker wrote before
        // (a message in a slot, the protected data of a handed-over lock) is visible to the
        // waiter once it sees the new state. Relaxed on failure: the loser touches nothing the
        // waiter owns.
        self.state.compare_exchange(WAITING, to, Ordering::Release, Ordering::Relaxed).is_ok()
    }

    /// Asks the waiter to retry operation `op`. Returns false if it already left `WAITING`.
    /// The caller must call [`Waiter::unpark`] after releasing its inner lock.
    pub(crate) fn wake(&self, op: usize) -> bool {
        self.transition(WOKEN | op << OP_SHIFT)
    }

    /// Tells the waiter that operation `op` was completed on its behalf. Returns false if it
    /// already left `WAITING`, in which case the caller must undo what it prepared.
    /// The caller must call [`Waiter::unpark`] after releasing its inner lock.
    pub(crate) fn grant(&self, op: usize) -> bool {
        self.transition(GRANTED | op << OP_SHIFT)
    }

    /// Reserves operation `op` of the waiter for the caller, who completes it later with
    /// [`Waiter::grant_held`] or gives it back with [`Waiter::release_held`]. Returns false if
    /// the waiter already left `WAITING`. Called under the inner lock of the queue the waiter's
    /// entry is in; the caller removes that entry.
    pub(crate) fn hold(&self, op: usize) -> bool {
        // Relaxed: nothing is handed over yet; `grant_held` publishes the completion.
        self.state
            .compare_exchange(WAITING, HELD | op << OP_SHIFT, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Completes a held operation. False only if the runtime's drop cancelled the waiter
    /// meanwhile (`abandon`): the caller takes back what it prepared. Unpark afterwards.
    pub(crate) fn grant_held(&self, op: usize) -> bool {
        // Release, as `transition`: the message written before is visible to the waiter.
        let held = HELD | op << OP_SHIFT;
        self.state
            .compare_exchange(held, GRANTED | op << OP_SHIFT, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// Gives a held operation back: the waiter retries it (as after `wake(op)`). Unpark
    /// afterwards if it returns true.
    pub(crate) fn release_held(&self, op: usize) -> bool {
        let held = HELD | op << OP_SHIFT;
        self.state
            .compare_exchange(held, WOKEN | op << OP_SHIFT, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    }

    /// Called by the waiter itself: leave `WAITING` with nobody having acted on its behalf.
    /// False if another party decided first (woken, granted or holding it).
    pub(crate) fn cancel(&self) -> bool {
        // Relaxed on success: a cancelled waiter reclaims its slot under the owning queue's
        // inner lock, which orders that. The loser reads the winner's outcome with `wait`.
        self.state.compare_exchange(WAITING, CANCELLED, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }

    /// The runtime's drop unwinds the waiter: cancel it even if held (the holder's
    /// `grant_held` then fails). `None` if it was cancelled here, else the outcome another
    /// party decided first (Acquire: the waiter acts on what the winner did).
    fn abandon(&self) -> Option<Outcome> {
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            if state != WAITING && state & TAG_MASK != HELD {
                return Some(Outcome::decode(state));
            }
            match self.state.compare_exchange(state, CANCELLED, Ordering::Acquire, Ordering::Acquire) {
                Ok(_) => return None,
                Err(actual) => state = actual,
            }
        }
    }

    /// Whether the waiter is still waiting (racy by design: a hint for skipping stale entries).
    pub(crate) fn is_waiting(&self) -> bool {
        self.state.load(Ordering::Relaxed) == WAITING
    }

    /// Wakes the waiter's fiber or thread. Call after a successful `wake`/`grant`, outside any
    /// inner lock.
    pub(crate) fn unpark(&self) {
        self.fiber.unpark();
    }

    /// Like [`Waiter::wait`], for a wait that the runtime's drop may abandon: dropping a
    /// runtime unwinds its parked fibers from inside their park. If that happens here,
    /// `abandon` runs on the way out, with `None` if the waiter was still waiting (it is
    /// cancelled now, so counterparts treat its entries as stale; the caller removes them),
    /// or with the outcome another party decided first, whose grant or wake-up the caller
    /// must hand on (a lock, a permit, a message, a notification): nobody else will use it.
    /// `abandon` runs during unwinding, so it must not park or panic.
    ///
    /// A stop request that cannot unwind at the park (a build without unwinding, for a timed
    /// wait; any wait of a loom model, which stands in for the unwind so) takes the same way
    /// out without the unwind: `abandon` runs here, and the wait ends as `TimedOut`, one that
    /// nobody acted on for the caller. The caller's `TimedOut` path then returns the timeout
    /// error its API has (its own clean-up finds the waiter's entries gone already). Where
    /// unwinding works, this costs nothing: the check is a constant `false`.
    pub(crate) fn wait_or_abandon(
        &self,
        reason: WaitReason,
        deadline: Option<Instant>,
        abandon: impl FnOnce(Option<Outcome>),
    ) -> Outcome {
        self.wait_or_abandon_timing_out(reason, deadline, deadline.is_some(), abandon)
    }

    /// [`Waiter::wait_or_abandon`] whose caller says whether it has a timeout to report
    /// (`times_out`) apart from the park's wake-up time (a `select!`'s timer arm wakes it
    /// without a deadline of the call's own): only then may a stop that cannot unwind end it.
    pub(crate) fn wait_or_abandon_timing_out(
        &self,
        reason: WaitReason,
        deadline: Option<Instant>,
        times_out: bool,
        abandon: impl FnOnce(Option<Outcome>),
    ) -> Outcome {
        struct OnUnwind<'a, F: FnOnce(Option<Outcome>)>(&'a Waiter, Option<F>);
        impl<F: FnOnce(Option<Outcome>)> Drop for OnUnwind<'_, F> {
            fn drop(&mut self) {
                if let Some(abandon) = self.1.take() {
                    abandon(self.0.abandon());
                }
            }
        }
        let mut guard = OnUnwind(self, Some(abandon));
        match self.wait_until(reason, deadline, Some(times_out)) {
            Some(outcome) => {
                guard.1 = None; // returned normally: nothing to hand on
                outcome
            }
            None => {
                drop(guard); // what the unwind would have run
                Outcome::TimedOut
            }
        }
    }

    /// Parks until another party wakes or grants this waiter, or until `deadline` passes and
    /// `cancel` wins. A held waiter waits for its holder, past the deadline. Called only by
    /// the fiber or thread that created the waiter.
    pub(crate) fn wait(&self, reason: WaitReason, deadline: Option<Instant>) -> Outcome {
        self.wait_until(reason, deadline, None).expect("a wait that a stop does not end")
    }

    /// `wait`; if `stoppable` (saying whether the caller has a timeout to report), `None` when
    /// a stop request that cannot unwind came at a park (`loom::stop_due`), where the park's
    /// stop point would have unwound.
    fn wait_until(
        &self,
        reason: WaitReason,
        deadline: Option<Instant>,
        stoppable: Option<bool>,
    ) -> Option<Outcome> {
        let stop_due = || stoppable.is_some_and(loom::stop_due);
        loop {
            // Acquire pairs with the Release of `transition` and `grant_held`.
            let state = self.state.load(Ordering::Acquire);
            if state & TAG_MASK == HELD {
                if stop_due() {
                    return None;
                }
                park(reason, None);
                continue;
            }
            if state != WAITING {
                return Some(Outcome::decode(state));
            }
            if let Some(deadline) = deadline {
                if loom::expired(deadline) {
                    if self.cancel() {
                        return Some(Outcome::TimedOut);
                    }
                    continue;
                }
            }
            if stop_due() {
                return None;
            }
            park(reason, deadline);
        }
    }
}

/// Something queued in a [`WaitQueue`]: a waiter, possibly with per-wait data.
pub(crate) trait Entry {
    /// The waiter this entry wakes.
    fn waiter(&self) -> &Waiter;
}

impl Entry for loom::Arc<Waiter> {
    fn waiter(&self) -> &Waiter {
        self
    }
}

/// A FIFO of waiters. It has no lock of its own: each primitive keeps it inside its inner lock
/// (`Synced`) next to whatever else that lock guards.
///
/// Entries whose waiter has already left `WAITING` (cancelled at a deadline, or won by another
/// arm of a `select!`) are *stale*; whoever meets one at the front may drop it.
#[derive(Debug)]
pub(crate) struct WaitQueue<E> {
    entries: VecDeque<E>,
    /// Stale entries `remove` left in place since the last sweep (some may have been popped
    /// since: it only paces the sweeps).
    left_in_place: usize,
}

impl<E: Entry> WaitQueue<E> {
    pub(crate) const fn new() -> Self {
        WaitQueue { entries: VecDeque::new(), left_in_place: 0 }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn push_back(&mut self, entry: E) {
        self.entries.push_back(entry);
    }

    pub(crate) fn push_front(&mut self, entry: E) {
        self.entries.push_front(entry);
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &E> {
        self.entries.iter()
    }

    pub(crate) fn get(&self, i: usize) -> Option<&E> {
        self.entries.get(i)
    }

    pub(crate) fn remove_at(&mut self, i: usize) -> Option<E> {
        self.entries.remove(i)
    }

    pub(crate) fn front(&self) -> Option<&E> {
        self.entries.front()
    }

    pub(crate) fn pop_front(&mut self) -> Option<E> {
        self.entries.pop_front()
    }

    /// Pops entries from the front until `accept` returns true for one, which is returned;
    /// the rejected ones are dropped (they are stale). `accept` usually calls `wake`/`grant`.
    pub(crate) fn pop_accepted(&mut self, mut accept: impl FnMut(&E) -> bool) -> Option<E> {
        while let Some(entry) = self.entries.pop_front() {
            if accept(&entry) {
                return Some(entry);
            }
        }
        None
    }

    /// Removes the entry of `waiter`, a waiter that has left `WAITING` (cancelled, timed out or
    /// woken) and will not wait again. Waiters that leave together (a deadline or a stop reaching
    /// thousands of fibers parked on one channel) leave in about the order they came, or its
    /// reverse, so the search looks a little way in from both ends; one not found there stays
    /// in place: it is stale, and whoever meets it at the front drops it (as for a `select!`'s
    /// losing arms). When the entries left so are half the queue, one pass sweeps every stale
    /// entry out. A scan of the whole queue per removal made 10,000 leavers quadratic.
    pub(crate) fn remove(&mut self, waiter: &Waiter) {
        const LOOK: usize = 16;
        let n = self.entries.len();
        let is = |e: &E| std::ptr::eq(e.waiter(), waiter);
        for k in 0..n.div_ceil(2).min(LOOK) {
            if is(&self.entries[k]) {
                self.entries.remove(k);
                return;
            }
            if is(&self.entries[n - 1 - k]) {
                self.entries.remove(n - 1 - k);
                return;
            }
        }
        if n <= 2 * LOOK {
            return; // every entry was looked at: it is not here
        }
        self.left_in_place += 1;
        if self.left_in_place * 2 > n {
            self.entries.retain(|e| e.waiter().is_waiting());
            self.left_in_place = 0;
        }
    }

    /// Removes every entry of `waiter` (a `select!` may queue several here).
    pub(crate) fn remove_all(&mut self, waiter: &Waiter) {
        self.entries.retain(|e| !std::ptr::eq(e.waiter(), waiter));
    }

    /// Empties the queue (for "wake everyone").
    pub(crate) fn take_all(&mut self) -> VecDeque<E> {
        std::mem::take(&mut self.entries)
    }
}

#[cfg(all(test, loom))]
#[path = "tests/loom_wait_list.rs"]
mod loom_tests;
