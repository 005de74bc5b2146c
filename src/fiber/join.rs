//! `JoinHandle`: where a fiber's result (or panic) waits for whoever joins it.
//!
//! The result lives in the fiber's record (the stage that held its closure). A state word
//! makes the hand-off race-free without a lock:
//! 1. The fiber writes its result, then swaps the state to `DONE` (AcqRel).
//! 2. A joiner that finds `EMPTY` stores its `Fiber` handle, then CASes `EMPTY → WAITING`
//!    (AcqRel) and parks until it sees `DONE`.
//! 3. A handle dropped without joining swaps in `DETACHED`.
//!
//! If the swap in 1 returns `WAITING`, the joiner's handle is visible (its CAS released it) and
//! the fiber unparks it; if the CAS in 2 fails, the result is already there. If 1 sees
//! `DETACHED`, or 3 sees `DONE`, that side drops the result. Exactly one party takes or drops
//! the result, and then tells the fiber's scope, if any.
//!
//! The steps on the word are functions over [`JoinWord`], so the loom models
//! (`tests/loom_join.rs`) run them on loom's atomic (`arch/loom.md`).

use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU8, Ordering};
use std::thread;

use super::FiberRecord;
use super::handle::Fiber;
use super::stage::STAGE_RESULT;

const EMPTY: u8 = 0;
const WAITING: u8 = 1;
const DONE: u8 = 2;
const DETACHED: u8 = 3;
const TAKEN: u8 = 4;

/// The join word's atomic: std's in a fiber record, loom's in the models, which thus run the
/// same steps as the runtime. (If the record's word comes from `crate::loom` one day,
/// this trait can go.)
trait JoinWord {
    fn load(&self, order: Ordering) -> u8;
    fn store(&self, value: u8, order: Ordering);
    fn swap(&self, value: u8, order: Ordering) -> u8;
    fn compare_exchange(&self, current: u8, new: u8, success: Ordering, failure: Ordering) -> Result<u8, u8>;
}

// Inlined, so that each call's ordering is a constant: called with an ordering unknown to it,
// `load` was a real call with a switch on the ordering (`arch/performance.md`, "Moved from the code").
macro_rules! join_word {
    ($atomic:ty) => {
        impl JoinWord for $atomic {
            #[inline(always)]
            fn load(&self, order: Ordering) -> u8 {
                <$atomic>::load(self, order)
            }
            #[inline(always)]
            fn store(&self, value: u8, order: Ordering) {
                <$atomic>::store(self, value, order)
            }
            #[inline(always)]
            fn swap(&self, value: u8, order: Ordering) -> u8 {
                <$atomic>::swap(self, value, order)
            }
            #[inline(always)]
            fn compare_exchange(
                &self,
                current: u8,
                new: u8,
                success: Ordering,
                failure: Ordering,
            ) -> Result<u8, u8> {
                <$atomic>::compare_exchange(self, current, new, success, failure)
            }
        }
    };
}
join_word!(AtomicU8);
#[cfg(loom)]
join_word!(loom::sync::atomic::AtomicU8);

/// Who must act on a result once it is published (step 1).
#[derive(Debug)]
enum Completion {
    /// Nobody yet: the handle will find it.
    Kept,
    /// A joiner waits: unpark it.
    WakeJoiner,
    /// The handle is gone: the result is the fiber's to drop.
    DropResult,
}

/// Step 1: the result is in the stage; publish it.
fn publish_result(join: &impl JoinWord) -> Completion {
    // AcqRel: Release publishes the result; Acquire sees the joiner's handle (WAITING).
    match join.swap(DONE, Ordering::AcqRel) {
        WAITING => Completion::WakeJoiner,
        DETACHED => Completion::DropResult,
        _ => Completion::Kept,
    }
}

/// Step 2: returns once the result is in the stage (DONE seen with Acquire). `publish_handle`
/// stores the joiner's handle where the fiber will look; `park` waits for an unpark and may
/// return spuriously.
fn wait_for_result(join: &impl JoinWord, publish_handle: impl FnOnce(), mut park: impl FnMut()) {
    if join.load(Ordering::Acquire) != DONE {
        publish_handle();
        // Release publishes the handle to the fiber's swap; Acquire on failure sees the result.
        if join.compare_exchange(EMPTY, WAITING, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            while join.load(Ordering::Acquire) != DONE {
                park();
            }
        }
    }
}

/// After the joiner took the result: the handle's drop has nothing left to do. Relaxed: only
/// the same thread, in that drop, reads it.
fn mark_taken(join: &impl JoinWord) {
    join.store(TAKEN, Ordering::Relaxed);
}

/// Step 3: the handle is dropped. Returns true when the result is there and is the caller's
/// to drop.
fn detach(join: &impl JoinWord) -> bool {
    if join.load(Ordering::Relaxed) == TAKEN {
        return false;
    }
    // AcqRel: Acquire sees the result (DONE); Release orders the handle's uses before the
    // fiber's drop of the result (DETACHED).
    join.swap(DETACHED, Ordering::AcqRel) == DONE
}

/// Step 1 (the fiber's side), after it stored its result in the stage. Called once. Inlined
/// into the end of a fiber's run: when the handle keeps the result, the swap is all it does, and
/// a frame of its own around that swap cost a call, two saved registers and a return per fiber
/// (`arch/performance.md`); waking a joiner is a call, and dropping a result nobody will take
/// calls the stage's vtable.
#[inline(always)]
pub(crate) fn complete(rec: &FiberRecord) {
    match publish_result(&rec.join) {
        Completion::WakeJoiner => wake_joiner(rec),
        // The result's drop is a call already (the stage's vtable), so no second frame around
        // it: a detached fiber (every W3 link) ends with one call, not two.
        // SAFETY: DETACHED: the handle is gone, and the fiber just put its result in the stage,
        // which nobody else will take.
        Completion::DropResult => unsafe { drop_unjoined_result(rec) },
        Completion::Kept => {}
    }
}

/// `complete` found the joiner waiting.
#[inline(never)]
fn wake_joiner(rec: &FiberRecord) {
    // SAFETY: WAITING means the joiner stored its handle before its Release CAS, which our
    // Acquire swap observed; the joiner does not touch it again until DONE.
    if let Some(w) = unsafe { (*rec.waiter.get()).take() } {
        w.unpark_joiner();
    }
}

/// Nobody will join: `complete` found the handle gone, or the handle's drop found the result
/// there. The result is the caller's to drop.
///
/// # Safety
/// The stage holds this fiber's result, and the caller is the one party to it (see the
/// module doc).
#[inline(always)]
unsafe fn drop_unjoined_result(rec: &FiberRecord) {
    // SAFETY: the caller's contract.
    let panicked = unsafe { (rec.vtable.get().drop_result)(rec) };
    scope_done(rec, panicked);
}

/// `drop_unjoined_result` for the handle's drop, out of line: the handle's drop is inlined
/// where the handle goes, and a result there is the rare case.
///
/// # Safety
/// As for `drop_unjoined_result`.
#[inline(never)]
unsafe fn drop_detached_result(rec: &FiberRecord) {
    // SAFETY: the caller's contract.
    unsafe { drop_unjoined_result(rec) }
}

/// The result was taken or dropped: tell the scope (once; the caller is the only party).
/// Most fibers have none: a test, and the telling out of line.
#[inline]
fn scope_done(rec: &FiberRecord, unhandled_panic: bool) {
    // SAFETY: exactly one party reaches here per fiber (see the module doc), so the cell is
    // not touched concurrently.
    if unsafe { (*rec.scope.get()).is_some() } {
        tell_scope(rec, unhandled_panic);
    }
}

/// `scope_done` with a scope: takes it out of the record and tells it.
#[cold]
#[inline(never)]
fn tell_scope(rec: &FiberRecord, unhandled_panic: bool) {
    // SAFETY: as in `scope_done`, whose caller is the only party.
    if let Some(scope) = unsafe { (*rec.scope.get()).take() } {
        scope.fiber_done(unhandled_panic);
    }
}

/// `JoinHandle::join` found no result yet: waits for it, parking the calling fiber or blocking
/// the calling thread. If the wait unwinds (the joiner is cancelled), the handle, still the
/// caller's, is dropped and detaches.
#[inline(never)]
fn wait_for_join(rec: &FiberRecord) {
    // SAFETY: the fiber reads `waiter` only after seeing WAITING, not yet published.
    let publish_handle = || unsafe { *rec.waiter.get() = Some(crate::fiber::handle::current()) };
    wait_for_result(&rec.join, publish_handle, || super::park::park_for(super::wait::WaitReason::Join, None));
}

/// `let h: vt::JoinHandle<u64> = vt::spawn(|| 1 + 1); let two = h.join().unwrap();`
///
/// An owned permission to join a fiber (wait for it to finish and take its result), like
/// `std::thread::JoinHandle`. Dropping it detaches the fiber, which keeps running.
pub struct JoinHandle<T> {
    /// Always a fiber's handle (`new`), dropped by hand: the join and the handle's drop give
    /// its record reference up directly, not through `Fiber`'s drop, a call that tests the
    /// tag again (`arch/performance.md`).
    pub(crate) fiber: ManuallyDrop<Fiber>,
    pub(crate) _result: PhantomData<fn() -> T>,
}

/// Whether the fiber of `rec` has finished: its result was published (and perhaps taken), or
/// its record says so.
pub(crate) fn has_finished(rec: &FiberRecord) -> bool {
    matches!(rec.join.load(Ordering::Acquire), DONE | TAKEN) || rec.state() == super::DONE
}

impl<T> JoinHandle<T> {
    /// The handle of a fiber just spawned, from the reference `FiberRecord::init` made for it.
    #[inline(always)]
    pub(crate) fn new(rec: super::FiberRef) -> JoinHandle<T> {
        JoinHandle { fiber: ManuallyDrop::new(Fiber::from_record(rec)), _result: PhantomData }
    }

    #[inline(always)]
    fn rec(&self) -> &FiberRecord {
        // SAFETY: a join handle's is a fiber's handle (`new`).
        unsafe { self.fiber.record_unchecked() }
    }

    /// Waits for the fiber to finish. `Err` holds the payload of the fiber's panic (or, if its
    /// runtime was dropped first, a `&'static str` saying it was cancelled).
    /// Called from a fiber, this parks the fiber; from a plain thread, it blocks the thread.
    #[inline]
    pub fn join(self) -> thread::Result<T> {
        let rec = self.rec();
        // Inlined where it is called, up to the wait, which is a call: a join that finds the
        // result there (W1's, whose children finish before their joins) then costs no frame
        // and no result returned through memory (`arch/performance.md`).
        if rec.join.load(Ordering::Acquire) != DONE {
            wait_for_join(rec);
        }
        debug_assert_eq!(rec.stage_kind.get(), STAGE_RESULT);
        // SAFETY: DONE was observed with Acquire, so the fiber's write of its result happened
        // before; it is a `thread::Result<T>` (this handle's type), and we are the only taker.
        let r = unsafe { rec.take_stage::<thread::Result<T>>() };
        mark_taken(&rec.join);
        scope_done(rec, false);
        // With the result taken, the handle's drop would only read `TAKEN` and return: skip
        // it (a call and the join word's load per join), and release the fiber reference
        // alone. Not earlier: a join unwound while it waits needs that drop to detach.
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `this` is neither used nor dropped again, so its fiber handle moves out
        // once; a join handle's is a fiber's.
        drop(unsafe { ManuallyDrop::take(&mut this.fiber).into_record_unchecked() });
        r
    }

    /// Whether the fiber has finished (its result is ready); does not block.
    pub fn is_finished(&self) -> bool {
        self.rec().join.load(Ordering::Acquire) == DONE
    }

    /// The fiber's handle.
    pub fn fiber(&self) -> &Fiber {
        &self.fiber
    }
}

impl<T> Drop for JoinHandle<T> {
    // Inlined where the handle goes, up to dropping a result, which is a call: detaching a
    // fiber that has not finished (W3's) then costs no frame (`arch/performance.md`).
    #[inline]
    fn drop(&mut self) {
        // Taken out first, so that the reference is released even when the result's
        // destructor panics below.
        // SAFETY: taken once, here; a join handle's is a fiber's.
        let rec = unsafe { ManuallyDrop::take(&mut self.fiber).into_record_unchecked() };
        if detach(&rec.join) {
            // SAFETY: DONE: the result is in the stage and nobody else will take it.
            unsafe { drop_detached_result(&rec) };
        }
    }
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle")
            .field("fiber", &*self.fiber)
            .field("finished", &self.is_finished())
            .finish()
    }
}

#[cfg(all(test, loom))]
#[path = "tests/loom_join.rs"]
mod loom_tests;
