//! `TaskScope`: a `vt::scope` whose fibers return `Result`s and that stops the rest when the
//! outcome is known (Java's `StructuredTaskScope` with its `allSuccessfulOrThrow` and
//! `anySuccessfulResultOrThrow` joiners), with an optional deadline for the whole scope.
//!
//! It is `vt::scope` underneath (borrowing, and waiting for every fiber on every path), with
//! each fiber wrapped: its outcome goes into a shared state, and the outcome that decides the
//! scope calls `Scope::cancel`. The deadline is a `vt::deadline` around the scope: when it
//! passes, the scope's wait stops its fibers, waits for them, and returns `Elapsed`.
//! Design: `arch/decisions/0004-cancellation.md`.

use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, PoisonError};

use crate::loom::StdMutex as Mutex;
use std::time::{Duration, Instant};

use crate::fiber::cancel::is_cancel_payload;
use crate::scope::Scope;

/// Why a [`TaskScope`] failed.
#[non_exhaustive]
pub enum TaskError<E> {
    /// A fiber returned this error (`all_ok`: the first one; `any_ok`: the first one, when
    /// none succeeded).
    Failed(E),
    /// A fiber panicked, with this payload.
    Panicked(Box<dyn Any + Send>),
    /// The scope's deadline passed first.
    Elapsed,
    /// `any_ok` with no fiber spawned.
    Empty,
}

impl<E: fmt::Debug> fmt::Debug for TaskError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskError::Failed(e) => f.debug_tuple("Failed").field(e).finish(),
            TaskError::Panicked(_) => f.write_str("Panicked(..)"),
            TaskError::Elapsed => f.write_str("Elapsed"),
            TaskError::Empty => f.write_str("Empty"),
        }
    }
}

impl<E: fmt::Display> fmt::Display for TaskError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskError::Failed(e) => write!(f, "a task failed: {e}"),
            TaskError::Panicked(_) => f.write_str("a task panicked"),
            TaskError::Elapsed => f.write_str("the task scope's deadline passed"),
            TaskError::Empty => f.write_str("no task was spawned"),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for TaskError<E> {}

/// A structured task scope: fibers that may borrow from the caller, return `Result`s, and are
/// stopped together once the scope's outcome is known or its deadline passes. Every fiber has
/// finished when the call returns (as with [`scope`](crate::scope)); a stop of the calling
/// fiber passes through (its fibers are stopped first).
///
/// - [`all_ok`](TaskScope::all_ok): every fiber's value, in spawn order; the first error or
///   panic stops the others (Java's default joiner).
/// - [`any_ok`](TaskScope::any_ok): the first value; it stops the others.
///
/// ```
/// use virtual_threads as vt;
/// use std::time::Duration;
/// let words = ["a", "bb", "ccc"];
/// let lens = vt::TaskScope::new().all_ok(|s| {
///     for w in &words {
///         s.spawn(move || Ok::<_, std::io::Error>(w.len()));
///     }
/// });
/// assert_eq!(lens.unwrap(), [1, 2, 3]);
///
/// let first = vt::TaskScope::new().timeout(Duration::from_secs(5)).any_ok(|s| {
///     s.spawn(|| { vt::sleep(Duration::from_secs(60)); Ok::<_, ()>("slow") });
///     s.spawn(|| Ok("fast"));
/// });
/// assert_eq!(first.unwrap(), "fast");
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct TaskScope {
    deadline: Option<Instant>,
}

/// What a [`TaskScope`]'s closure spawns with.
pub struct Tasks<'scope, 'env, T, E> {
    scope: &'scope Scope<'scope, 'env>,
    state: Arc<State<T, E>>,
    _types: PhantomData<fn() -> (T, E)>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Policy {
    AllOk,
    AnyOk,
}

struct State<T, E> {
    policy: Policy,
    inner: Mutex<Inner<T, E>>,
}

struct Inner<T, E> {
    /// `all_ok`: each fiber's value, by spawn order.
    values: Vec<Option<T>>,
    /// `any_ok`: the first value.
    first_ok: Option<T>,
    /// The first failure (or, for `any_ok`, the first error while no value came).
    failure: Option<TaskError<E>>,
    decided: bool,
}

impl TaskScope {
    /// A task scope with no deadline.
    pub fn new() -> TaskScope {
        TaskScope { deadline: None }
    }

    /// Stops the whole scope at `at`: its fibers are stopped, and the call returns
    /// [`TaskError::Elapsed`] once they have finished.
    pub fn deadline(self, at: Instant) -> TaskScope {
        TaskScope { deadline: Some(at) }
    }

    /// [`deadline`](Self::deadline) `dur` from now.
    pub fn timeout(self, dur: Duration) -> TaskScope {
        TaskScope { deadline: Instant::now().checked_add(dur) }
    }

    /// Runs `f`, which spawns fibers; returns every fiber's value in spawn order, or the first
    /// error or panic, which stops the others.
    pub fn all_ok<'env, T, E, F>(self, f: F) -> Result<Vec<T>, TaskError<E>>
    where
        T: Send + 'env,
        E: Send + 'env,
        F: for<'a, 'scope> FnOnce(&'a Tasks<'scope, 'env, T, E>),
    {
        let inner = self.run(Policy::AllOk, f)?;
        match inner.failure {
            Some(e) => Err(e),
            None => Ok(inner.values.into_iter().map(|v| v.expect("every task succeeded")).collect()),
        }
    }

    /// Runs `f`, which spawns fibers; returns the first value a fiber returns, which stops the
    /// others. If none succeeds, the first error (or panic).
    pub fn any_ok<'env, T, E, F>(self, f: F) -> Result<T, TaskError<E>>
    where
        T: Send + 'env,
        E: Send + 'env,
        F: for<'a, 'scope> FnOnce(&'a Tasks<'scope, 'env, T, E>),
    {
        let inner = self.run(Policy::AnyOk, f)?;
        match (inner.first_ok, inner.failure) {
            (Some(v), _) => Ok(v),
            (None, Some(e)) => Err(e),
            (None, None) => Err(TaskError::Empty),
        }
    }

    fn run<'env, T, E, F>(self, policy: Policy, f: F) -> Result<Inner<T, E>, TaskError<E>>
    where
        T: Send + 'env,
        E: Send + 'env,
        F: for<'a, 'scope> FnOnce(&'a Tasks<'scope, 'env, T, E>),
    {
        let state = Arc::new(State {
            policy,
            inner: Mutex::new(Inner { values: Vec::new(), first_ok: None, failure: None, decided: false }),
        });
        let body = || {
            crate::scope::scope(|s| {
                let tasks = Tasks { scope: s, state: state.clone(), _types: PhantomData };
                f(&tasks);
            })
        };
        let r = match self.deadline {
            Some(at) => crate::fiber::cancel::deadline(at, body),
            None => {
                body();
                Ok(())
            }
        };
        // Every fiber has finished and dropped its clone (`scope` waited for them).
        let state = Arc::try_unwrap(state).ok().expect("the scope's fibers have finished");
        let inner = state.inner.into_inner().unwrap_or_else(PoisonError::into_inner);
        match r {
            // A fiber that failed before the deadline decided the scope; else it elapsed.
            Err(crate::fiber::cancel::Elapsed) if inner.failure.is_none() && inner.first_ok.is_none() => {
                Err(TaskError::Elapsed)
            }
            _ => Ok(inner),
        }
    }
}

impl<'scope, 'env, T: Send + 'env, E: Send + 'env> Tasks<'scope, 'env, T, E> {
    /// Spawns a fiber of the scope; it may borrow anything that outlives the scope.
    #[track_caller]
    pub fn spawn<G>(&self, g: G)
    where
        G: FnOnce() -> Result<T, E> + Send + 'scope,
    {
        let state = self.state.clone();
        let scope = self.scope;
        let index = {
            let mut inner = state.lock();
            inner.values.push(None);
            inner.values.len() - 1
        };
        scope.spawn(move || {
            let outcome = catch_unwind(AssertUnwindSafe(g));
            let mut inner = state.lock();
            let decides = match outcome {
                Ok(Ok(v)) => match state.policy {
                    Policy::AllOk => {
                        inner.values[index] = Some(v);
                        false
                    }
                    Policy::AnyOk if !inner.decided => {
                        inner.first_ok = Some(v);
                        true
                    }
                    Policy::AnyOk => false,
                },
                Ok(Err(e)) => {
                    inner.failure.get_or_insert(TaskError::Failed(e));
                    state.policy == Policy::AllOk
                }
                // Stopped: the scope already knows why.
                Err(p) if is_cancel_payload(&*p) => false,
                Err(p) => {
                    inner.failure.get_or_insert(TaskError::Panicked(p));
                    state.policy == Policy::AllOk
                }
            };
            if decides && !inner.decided {
                inner.decided = true;
                drop(inner);
                scope.cancel();
            }
        });
    }
}

impl<T, E> fmt::Debug for Tasks<'_, '_, T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tasks").field("scope", self.scope).finish()
    }
}

impl<T, E> State<T, E> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<T, E>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
