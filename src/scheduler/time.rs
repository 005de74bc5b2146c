//! Timers: `sleep`, `park_timeout` and every other timed wait.
//!
//! Each carrier keeps a min-heap of deadlines for the fibers that parked on it, behind a mutex
//! that only its owner takes in the common case, and publishes its earliest deadline in an
//! atomic so that an idle carrier can sleep exactly until the next timer of any carrier, and
//! fire timers of a carrier that is busy in a long fiber. Cancellation is lazy: a fiber whose
//! timed park ended early moves its `timer_gen` on (`disarm`), and the stale entry is discarded
//! when it expires. Deadlines usually arrive in order (sleeps of one length, armed one after
//! another), so those go to a FIFO lane, armed and fired in O(1); only an earlier deadline than
//! the lane's last goes to the heap. See `arch/scheduler.md` (timers).

use std::cmp::Ordering as CmpOrdering;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::fiber::schedule::Wake;
use crate::fiber::{FiberRecord, FiberRef};
use crate::scheduler::Shared;

/// A carrier's pending timers: a lane of deadlines armed in order, and a heap of the rest: a
/// heap pop sifts through the whole array, in the lane a pop is a load (`arch/performance.md`).
#[derive(Default)]
pub(crate) struct TimerHeap {
    /// Non-decreasing deadlines, in arming order.
    lane: VecDeque<Entry>,
    heap: BinaryHeap<Entry>,
    seq: u64,
}

struct Entry {
    /// Deadline in ns since the runtime's epoch.
    at: u64,
    /// Insertion order, so equal deadlines fire first-in first-out.
    seq: u64,
    /// The fiber's `timer_gen` when armed: a mismatch means the park already ended.
    generation: u64,
    fiber: FiberRef,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    /// Reversed: `BinaryHeap` is a max-heap and we want the earliest deadline on top.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

impl TimerHeap {
    pub(crate) fn clear(&mut self) {
        self.lane.clear();
        self.heap.clear();
    }

    fn push(&mut self, e: Entry) {
        match self.lane.back() {
            Some(last) if e.at < last.at => self.heap.push(e),
            _ => self.lane.push_back(e),
        }
    }

    /// The earliest entry, from whichever holds it (equal deadlines: the one armed first).
    fn peek(&self) -> Option<&Entry> {
        match (self.lane.front(), self.heap.peek()) {
            (Some(l), Some(h)) => Some(if (l.at, l.seq) <= (h.at, h.seq) { l } else { h }),
            (l, h) => l.or(h),
        }
    }

    /// Removes the earliest entry if it is due by `now`.
    fn pop_due(&mut self, now: u64) -> Option<Entry> {
        let from_lane = match (self.lane.front(), self.heap.peek()) {
            (Some(l), Some(h)) => (l.at, l.seq) <= (h.at, h.seq),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => return None,
        };
        if from_lane {
            self.lane.front().is_some_and(|e| e.at <= now).then(|| self.lane.pop_front()).flatten()
        } else {
            self.heap.peek().is_some_and(|e| e.at <= now).then(|| self.heap.pop()).flatten()
        }
    }
}

/// Arms a timer that unparks `rec` at `deadline`, on the carrier running it, and returns its
/// generation (for `disarm`). Called by the fiber itself, just before it parks. Never inlined:
/// inlined into `park_fiber` it made every untimed park save more registers
/// (`arch/performance.md`).
#[inline(never)]
pub(crate) fn arm_timer(rec: &FiberRecord, deadline: Instant) -> u64 {
    let c = crate::scheduler::carrier::here();
    debug_assert!(!c.is_null(), "a fiber parks only on a carrier");
    // SAFETY: a fiber runs on a carrier; the pointer is that live carrier, used before the
    // switch point that follows.
    let c = unsafe { &*c };
    let rt = c.shared();
    let at = rt.ns_since_epoch(deadline);
    // SAFETY: the running fiber's record is kept alive by its carrier.
    let fiber = unsafe { FiberRef::clone_from_ptr(rec) };
    let generation = rec.timer_gen.load(Ordering::Relaxed);
    let slot = &rt.slots[c.index()];
    let mut t = slot.timers.lock().unwrap_or_else(|e| e.into_inner());
    t.seq += 1;
    let seq = t.seq;
    t.push(Entry { at, seq, generation, fiber });
    if at < slot.next_deadline.load(Ordering::Relaxed) {
        slot.next_deadline.store(at, Ordering::Relaxed);
    }
    generation
}

/// Ends a timed park of `rec` armed with `generation`: returns true if the fiber disarmed its
/// timer, false if the timer had fired (its deadline passed). The fiber and `fire` race with
/// the same CAS, so exactly one of them ends the timed wait.
pub(crate) fn disarm(rec: &FiberRecord, generation: u64) -> bool {
    rec.timer_gen.compare_exchange(generation, generation + 1, Ordering::Relaxed, Ordering::Relaxed).is_ok()
}

/// Fires the expired timers of carrier `index`'s heap. With `try_only`, gives up if the heap is
/// locked (another carrier is firing it). Returns how many fibers it woke.
pub(crate) fn fire(rt: &Shared, index: usize, now: u64, try_only: bool) -> usize {
    let slot = &rt.slots[index];
    let mut t = if try_only {
        match slot.timers.try_lock() {
            Ok(t) => t,
            Err(_) => return 0,
        }
    } else {
        slot.timers.lock().unwrap_or_else(|e| e.into_inner())
    };
    let mut woken = 0;
    while let Some(e) = t.pop_due(now) {
        // Take the wait's end from the fiber (see `disarm`); a fiber that disarmed first, or
        // parks again already, keeps it. Waking a fiber that is not parked yet (still switching
        // out) leaves its token, which ends the park at once.
        if disarm(&e.fiber, e.generation) && e.fiber.notify() {
            // SAFETY: `notify` returned true: we moved the fiber from parked to runnable. The
            // entry's own reference drops at the end of this block.
            let run = unsafe { FiberRef::take_parked_ref(&e.fiber) };
            crate::scheduler::schedule(run, Wake::Timer);
            woken += 1;
        }
    }
    slot.next_deadline.store(t.peek().map_or(u64::MAX, |e| e.at), Ordering::Relaxed);
    drop(t);
    if woken > 0 {
        // One notification for the batch (each costs a fence and a read of the idle counts):
        // a carrier it wakes steals half of what is queued, and wakes the next if there is
        // more (`idle.rs`, step 3).
        rt.notify();
    }
    woken
}
