//! Structured concurrency: `scope` (fibers that borrow from the caller), `join` (fork-join of
//! two closures), and `pinned` (stay on this carrier for a section).
//!
//! Borrowing is sound for the same reason as `std::thread::scope`: `scope` does not return
//! until every fiber spawned in it has finished *and* its result has been dropped or taken
//! (the count drops in the result packet's destructor), on every path, panics included.

use std::fmt;
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, Location, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::fiber::NO_HOME;
use crate::fiber::compact::Lent;
use crate::fiber::context;
use crate::fiber::handle::{Fiber, current};
use crate::fiber::join::JoinHandle;
use crate::fiber::park::{WaitOnUnwind, finished};
use crate::fiber::wait::WaitReason;
use crate::fiber::{cancel, stop};
use crate::runtime::spawn::Builder;

use crate::fiber::scope_data::{FirstPanic, ScopeData};

/// A scope to spawn fibers that may borrow from outside it; see [`scope`].
pub struct Scope<'scope, 'env: 'scope> {
    data: Arc<ScopeData>,
    /// Its fibers, to stop them together (`cancel`), and whether they were.
    fibers: crate::loom::StdMutex<Fibers>,
    cancelled: AtomicBool,
    scope: PhantomData<&'scope mut &'scope ()>,
    env: PhantomData<&'env mut &'env ()>,
}

/// A handle to join a fiber spawned in a [`Scope`].
pub struct ScopedJoinHandle<'scope, T> {
    inner: JoinHandle<T>,
    _scope: PhantomData<&'scope ()>,
}

/// `vt::scope(|s| { s.spawn(|| left.sort()); s.spawn(|| right.sort()); });`
///
/// Creates a scope for spawning fibers that borrow from the caller's stack, like
/// `std::thread::scope`. Every fiber spawned in it is joined before `scope` returns.
///
/// # Panics
/// If `f` panics (its panic is resumed), or if a spawned fiber panicked and was not joined:
/// then the first such fiber's panic is resumed with its own payload, as rayon's scope does
/// (std's scope panics with a message of its own instead). A fiber joined through its
/// [`ScopedJoinHandle`] hands its panic to the joiner as `Err`, and the scope leaves it be.
///
/// ```
/// use virtual_threads as vt;
/// let mut counts = [0u32; 4];
/// vt::scope(|s| {
///     for c in counts.iter_mut() {
///         s.spawn(move || *c += 1);
///     }
/// });
/// assert_eq!(counts, [1; 4]);
/// ```
#[track_caller]
pub fn scope<'env, F, T>(f: F) -> T
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T,
{
    // The scoped fibers may write into this fiber's stack while it parks (below, or in `f`).
    let _lent = Lent::new();
    let scope = Scope {
        data: Arc::new(ScopeData {
            running: AtomicUsize::new(0),
            a_fiber_panicked: AtomicBool::new(false),
            first_panic: FirstPanic::default(),
            main: current(),
        }),
        fibers: crate::loom::StdMutex::new(Fibers::default()),
        cancelled: AtomicBool::new(false),
        scope: PhantomData,
        env: PhantomData,
    };
    // Unwound from a wait (the runtime's drop), the frame still outlives the scoped fibers.
    let _wait = WaitOnUnwind::new(WaitReason::Scope, || scope.data.running.load(Ordering::Acquire) == 0);
    let result = catch_unwind(AssertUnwindSafe(|| f(&scope)));
    // A stopped owner stops its fibers and waits for them *before* its unwind goes on, with
    // nothing unwinding (`catch_unwind` above ended it): a wait during an unwind could not let
    // them run on this carrier (ADR 0004). The wait itself is shielded; a stop request that
    // comes during it wakes it, stops the fibers, and acts after it.
    if matches!(&result, Err(p) if cancel::is_cancel_payload(&**p)) {
        scope.cancel();
    }
    cancel::wait_shielded(
        crate::fiber::wait::WaitReason::Scope,
        || scope.data.running.load(Ordering::Acquire) == 0,
        || scope.cancel(),
    );
    if result.is_ok() {
        stop::check_cancelled();
    }
    match result {
        Err(e) => resume_unwind(e),
        Ok(_) if scope.data.a_fiber_panicked.load(Ordering::Relaxed) => {
            scope.data.first_panic.resume("a scoped fiber panicked")
        }
        Ok(r) => r,
    }
}

impl<'scope, 'env> Scope<'scope, 'env> {
    /// Spawns a fiber that may borrow anything that outlives the scope.
    ///
    /// # Panics
    /// If no stack can be allocated.
    #[track_caller]
    pub fn spawn<F, T>(&'scope self, f: F) -> ScopedJoinHandle<'scope, T>
    where
        F: FnOnce() -> T + Send + 'scope,
        T: Send + 'scope,
    {
        let at = Location::caller();
        self.data.running.fetch_add(1, Ordering::Relaxed);
        let data = Some(Arc::clone(&self.data));
        // SAFETY: `scope` waits until this fiber's packet is dropped (after the fiber finished
        // and its result was taken or dropped) before the borrowed environment can end.
        let r = crate::runtime::with_current_runtime(|rt| unsafe {
            Builder::new().spawn_unchecked_at(rt, f, at, data)
        });
        match r {
            Ok(inner) => {
                self.fibers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(inner.fiber());
                // Read after the push: `cancel` either sees this fiber or was here first.
                if self.cancelled.load(Ordering::SeqCst) {
                    inner.cancel();
                }
                ScopedJoinHandle { inner, _scope: PhantomData }
            }
            Err(e) => {
                self.data.fiber_done(false);
                panic!("failed to spawn fiber: {e}")
            }
        }
    }
}

/// The handles of a scope's fibers, for `Scope::cancel`. Finished ones are dropped whenever the
/// list has doubled since the last look, so a long-lived scope that keeps spawning holds at most
/// about twice its live fibers' records, at an amortised constant cost per spawn.
#[derive(Default)]
struct Fibers {
    all: Vec<Fiber>,
    prune_at: usize,
}

impl Fibers {
    fn push(&mut self, f: &Fiber) {
        if self.all.len() >= self.prune_at {
            self.all.retain(|f| f.record().is_some_and(|r| !crate::fiber::join::has_finished(r)));
            self.prune_at = (2 * self.all.len()).max(64);
        }
        self.all.push(f.clone());
    }
}

impl Scope<'_, '_> {
    /// Stops every fiber of the scope, those spawned later included: each unwinds with
    /// [`Cancelled`](crate::Cancelled) at its current or next switch point (one that has not
    /// started never runs). Returns at once; `scope` still waits for them all. A fiber stopped
    /// this way does not make `scope` panic (a join of it returns the `Cancelled` payload).
    ///
    /// The scope does this by itself when its owner is cancelled. By default a panicking fiber
    /// does not stop the others (as in `std::thread::scope`, and so that a scope's meaning does
    /// not change under existing code): a program that wants that calls `cancel` from the
    /// failing fiber.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        let fibers =
            std::mem::take(&mut self.fibers.lock().unwrap_or_else(std::sync::PoisonError::into_inner).all);
        for f in &fibers {
            cancel::cancel(f);
        }
    }

    /// Whether [`cancel`](Self::cancel) was called (or the owner was cancelled).
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }
}

impl<T> ScopedJoinHandle<'_, T> {
    /// Waits for the fiber; `Err` holds its panic payload.
    pub fn join(self) -> std::thread::Result<T> {
        self.inner.join()
    }

    /// Whether the fiber has finished.
    pub fn is_finished(&self) -> bool {
        self.inner.is_finished()
    }

    /// The fiber's handle.
    pub fn fiber(&self) -> &Fiber {
        self.inner.fiber()
    }
}

impl fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope").field("running", &self.data.running.load(Ordering::Relaxed)).finish()
    }
}

impl<T> fmt::Debug for ScopedJoinHandle<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

/// `let (a, b) = vt::join(|| sum(&left), || sum(&right));`
///
/// Runs `a` and `b` potentially in parallel and returns both results, like `rayon::join`:
/// `b` becomes a fiber other carriers can steal while the caller runs `a` itself.
///
/// # Panics
/// If either closure panics, after both have finished (the first panic wins).
#[track_caller]
pub fn join<A, B, RA, RB>(a: A, b: B) -> (RA, RB)
where
    A: FnOnce() -> RA + Send,
    B: FnOnce() -> RB + Send,
    RA: Send,
    RB: Send,
{
    let at = Location::caller();
    // `b` may write into this fiber's stack while it parks (in `a`, or in the join).
    let _lent = Lent::new();
    // SAFETY: `hb` is joined below on every path before this function returns (`a`'s panic is
    // caught first), so what `b` borrows outlives it.
    let hb = crate::runtime::with_current_runtime(|rt| unsafe {
        Builder::new().spawn_unchecked_at(rt, b, at, None)
    })
    .unwrap_or_else(|e| panic!("failed to spawn fiber: {e}"));
    // Unwound from the join (the runtime's drop), the frame still outlives `b`.
    let watch = hb.fiber().clone();
    let mut wait = WaitOnUnwind::new(WaitReason::Join, move || finished(&watch));
    let ra = catch_unwind(AssertUnwindSafe(a));
    // As in `scope`: a stopped caller stops `b` and waits for it before unwinding on.
    if matches!(&ra, Err(p) if cancel::is_cancel_payload(&**p)) || cancel::whole_fiber_cancelled() {
        hb.cancel();
    }
    let rb = cancel::shielded(|| hb.join());
    wait.disarm();
    if ra.is_ok() {
        stop::check_cancelled();
    }
    match (ra, rb) {
        (Ok(ra), Ok(rb)) => (ra, rb),
        (Err(e), _) | (_, Err(e)) => resume_unwind(e),
    }
}

/// `let n = vt::pinned(|| LOCAL.with(|l| l.borrow().len()));`
///
/// Runs `f` with the calling fiber pinned to its current carrier: it may park and yield, but
/// resumes only there, so `!Send` values and thread-local references may be held across switch
/// points inside `f`. On a plain thread it just runs `f`.
///
/// By default every started fiber already stays on its home carrier, so this changes nothing;
/// it matters on a runtime built with the `unsafe` opt-in
/// [`runtime::Builder::migrate_started_fibers`](crate::runtime::Builder::migrate_started_fibers),
/// for a section that cannot keep that mode's contract.
pub fn pinned<F, T>(f: F) -> T
where
    F: FnOnce() -> T,
{
    let c = crate::scheduler::carrier::here();
    let rec = context::current_fiber();
    if c.is_null() || rec.is_null() {
        return f();
    }
    // SAFETY: the running fiber's record outlives its run, and its address is stable.
    let rec = unsafe { &*rec };
    // SAFETY: `c` is this thread's live carrier, read before any switch point.
    let index = unsafe { (*c).index() };
    struct Unpin<'a>(&'a crate::fiber::FiberRecord, bool);
    impl Drop for Unpin<'_> {
        fn drop(&mut self) {
            let depth = self.0.pin_depth.get() - 1;
            self.0.pin_depth.set(depth);
            if depth == 0 && self.1 {
                self.0.home.store(NO_HOME, Ordering::Relaxed);
            }
        }
    }
    let we_pin = rec.home.load(Ordering::Relaxed) == NO_HOME;
    if we_pin {
        rec.home.store(index, Ordering::Relaxed);
    }
    rec.pin_depth.set(rec.pin_depth.get() + 1);
    let _unpin = Unpin(rec, we_pin);
    f()
}

/// Runs `f` on this carrier, counted as blocked and compensated at once (a spare carrier is
/// woken or started, within `max_carriers`, for the fibers that can move). What `vt::blocking`
/// falls back to when no helper thread can be started. From a plain thread it just runs `f`.
pub(crate) fn blocking_here<F, T>(at: &'static Location<'static>, f: F) -> T
where
    F: FnOnce() -> T,
{
    let c = crate::scheduler::carrier::here();
    let rec = context::current_fiber();
    if c.is_null() || rec.is_null() || std::thread::panicking() {
        return f();
    }
    // SAFETY: the running fiber's record outlives its run, and its address is stable.
    let rec = unsafe { &*rec };
    let depth = rec.blocking_depth.get();
    rec.blocking_depth.set(depth + 1);
    if depth == 0 {
        rec.blocking_at.set(Some(at));
        // SAFETY: `c` is this thread's live carrier, used before any switch point.
        unsafe { (*c).enter_blocking(at) };
    }
    struct Exit<'a>(&'a crate::fiber::FiberRecord);
    impl Drop for Exit<'_> {
        fn drop(&mut self) {
            let depth = self.0.blocking_depth.get() - 1;
            self.0.blocking_depth.set(depth);
            if depth == 0 {
                self.0.blocking_at.set(None);
                // Re-read: `f` may have parked and resumed on another carrier.
                let c = crate::scheduler::carrier::here();
                if !c.is_null() {
                    // SAFETY: this thread's live carrier, used before any switch point.
                    unsafe {
                        (*c).exit_blocking();
                        (*c).set_location(self.0.spawned_at());
                    }
                }
            }
        }
    }
    let _exit = Exit(rec);
    f()
}
