//! `ThreadPool::scope`: jobs that borrow from the caller, queued like any other job.
//!
//! A borrowing job's closure is boxed and its lifetime erased, which is sound because the scope
//! does not return until every such closure is gone (run or dropped): each job's drop lowers
//! `ScopeState::remaining` as its very last act, and the scope waits for zero on every path,
//! its own panic included, as `std::thread::scope` does.

use std::fmt;
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::{Job, Shared, ThreadPool, cancelling};
use crate::fiber::handle::Fiber;
use crate::fiber::scope_data::FirstPanic;

impl ThreadPool {
    /// Runs `f` with a scope whose jobs may borrow from the caller; returns once every job
    /// executed in it has finished, like `std::thread::scope` (the jobs still count against
    /// the pool's bound).
    ///
    /// # Panics
    /// If `f` panics (its panic is resumed), or if a job executed in the scope panicked: then,
    /// after all have finished, the first job's panic is resumed with its own payload, as
    /// rayon's scope does.
    ///
    /// ```
    /// use virtual_threads as vt;
    /// let pool = vt::ThreadPool::new(2);
    /// let mut squares = vec![0u64; 8];
    /// pool.scope(|s| {
    ///     for (i, sq) in squares.iter_mut().enumerate() {
    ///         s.execute(move || *sq = (i * i) as u64);
    ///     }
    /// });
    /// assert_eq!(squares[7], 49);
    /// ```
    pub fn scope<'env, F, R>(&self, f: F) -> R
    where
        F: for<'scope> FnOnce(&'scope PoolScope<'scope, 'env>) -> R,
    {
        // The jobs may write into this fiber's stack while it parks (in `f`, or below).
        let _lent = crate::fiber::compact::Lent::new();
        let scope = PoolScope {
            pool: self.clone(),
            state: Arc::new(ScopeState {
                remaining: AtomicUsize::new(0),
                panicked: AtomicBool::new(false),
                first_panic: FirstPanic::default(),
                waiter: crate::fiber::handle::current(),
            }),
            scope: PhantomData,
            env: PhantomData,
        };
        // Unwound (the runtime's drop unwinding this fiber, from `f` or the wait below), the
        // frame still outlives every job that borrows from it, on whichever runtime they run.
        let _wait = crate::fiber::park::WaitOnUnwind::new(crate::fiber::wait::WaitReason::PoolJoin, || {
            scope.pool.shared.drop_queued_if_stopped();
            scope.state.remaining.load(Ordering::Acquire) == 0
        });
        let r = match catch_unwind(AssertUnwindSafe(|| f(&scope))) {
            // The runtime's drop is unwinding this fiber: on with the unwind (`_wait` waits for
            // the jobs; see the note on cancellation at `ScopedJob`).
            Err(p) if cancelling() => resume_unwind(p),
            r => r,
        };
        // Acquire pairs with the Release decrement in `ScopeState::finish`: every job's
        // effects, and the drop of its closure, happen before the scope returns.
        while scope.state.remaining.load(Ordering::Acquire) != 0 {
            crate::fiber::park::park_for(crate::fiber::wait::WaitReason::PoolJoin, None);
        }
        match r {
            Err(p) => resume_unwind(p),
            Ok(_) if scope.state.panicked.load(Ordering::Relaxed) => {
                scope.state.first_panic.resume("a scoped pool job panicked")
            }
            Ok(r) => r,
        }
    }
}

/// A scope of a [`ThreadPool`] whose jobs may borrow from outside it; see [`ThreadPool::scope`].
pub struct PoolScope<'scope, 'env: 'scope> {
    pool: ThreadPool,
    state: Arc<ScopeState>,
    scope: PhantomData<&'scope mut &'scope ()>,
    env: PhantomData<&'env mut &'env ()>,
}

struct ScopeState {
    /// Jobs executed in the scope whose closure is not yet gone.
    remaining: AtomicUsize,
    panicked: AtomicBool,
    first_panic: FirstPanic,
    waiter: Fiber,
}

impl ScopeState {
    fn finish(&self) {
        // Release pairs with the Acquire load in `ThreadPool::scope`.
        if self.remaining.fetch_sub(1, Ordering::Release) == 1 {
            self.waiter.unpark();
        }
    }
}

impl<'scope> PoolScope<'scope, '_> {
    /// Runs `f` on the pool as soon as a slot is free; `f` may borrow anything that outlives
    /// the scope. A panic in `f` is counted by the pool; the scope resumes the first at its end.
    pub fn execute<F>(&'scope self, f: F)
    where
        F: FnOnce() + Send + 'scope,
    {
        self.state.remaining.fetch_add(1, Ordering::Relaxed);
        let job =
            ScopedJob { f: Some(f), state: Arc::clone(&self.state), pool: Arc::clone(&self.pool.shared) };
        // Only the lifetime changes below. The one path on which a closure can outlive the scope
        // is the runtime's drop unwinding the scope's fiber (noted at `ScopedJob`).
        let job: Box<dyn FnOnce() + Send + 'scope> = Box::new(move || job.run());
        // SAFETY: `ThreadPool::scope` returns (and the borrowed data may go) only once
        // `remaining` is zero, which `ScopedJob`'s drop lowers after the closure is gone.
        let job: Job = unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + 'scope>, Job>(job) };
        self.pool.execute(job);
    }

    /// The pool this scope runs its jobs on.
    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }
}

/// A borrowing job; it tells the scope when its closure is gone.
///
/// Cancellation: when a runtime is dropped it unwinds its fibers, so a scope's fiber may be
/// unwound while its jobs still sit in the queue or in other fibers. Its frame is freed only
/// once every job's closure is gone all the same (`WaitOnUnwind` in `ThreadPool::scope`): jobs
/// running on another runtime finish, fibers of the dropped one are unwound, and the queue of
/// a pool whose runtime was dropped is dropped.
struct ScopedJob<F> {
    f: Option<F>,
    state: Arc<ScopeState>,
    pool: Arc<Shared>,
}

impl<F: FnOnce()> ScopedJob<F> {
    fn run(mut self) {
        let f = self.f.take().expect("a scoped job runs once");
        if let Err(p) = catch_unwind(AssertUnwindSafe(f)) {
            // Counted here, before the scope can end, rather than by the worker.
            self.state.first_panic.keep(self.pool.count_panic(p));
            self.state.panicked.store(true, Ordering::Relaxed);
        }
    }
}

impl<F> Drop for ScopedJob<F> {
    fn drop(&mut self) {
        struct Finish<'a>(&'a ScopeState);
        impl Drop for Finish<'_> {
            fn drop(&mut self) {
                self.0.finish();
            }
        }
        // Last, even if the closure's destructor panics: the scope may end right after.
        let _finish = Finish(&self.state);
        drop(self.f.take());
    }
}

impl fmt::Debug for PoolScope<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolScope")
            .field("pool", &self.pool)
            .field("remaining", &self.state.remaining.load(Ordering::Relaxed))
            .finish()
    }
}
