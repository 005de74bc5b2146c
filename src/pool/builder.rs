//! `ThreadPoolBuilder`: threadpool's `Builder`, plus the runtime to run on; validated at
//! `build`, which starts nothing.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use crossbeam_deque::Injector;

use super::{Shared, Synced, ThreadPool};
use crate::fiber::schedule::RuntimeRef;
use crate::runtime::Handle;

/// `let pool = vt::ThreadPoolBuilder::new().num_threads(8).thread_name("job".into()).build();`
///
/// Settings for a [`ThreadPool`], like `threadpool::Builder`.
#[derive(Debug, Clone, Default)]
pub struct ThreadPoolBuilder {
    num_threads: Option<usize>,
    fiber_name: Option<String>,
    stack_size: Option<usize>,
    handle: Option<Handle>,
}

impl ThreadPoolBuilder {
    /// Default settings: unbounded (unlike threadpool's default of one thread per CPU: a
    /// blocked fiber costs a few KiB, so there is rarely a reason to bound it), fibers unnamed
    /// with the runtime's stack size, on the current runtime.
    pub fn new() -> ThreadPoolBuilder {
        ThreadPoolBuilder::default()
    }

    /// At most `n` jobs run at once.
    ///
    /// # Panics
    /// If `n` is 0, as threadpool's does.
    #[track_caller]
    pub fn num_threads(mut self, n: usize) -> ThreadPoolBuilder {
        assert!(n > 0, "a ThreadPool needs at least one thread (got 0)");
        self.num_threads = Some(n);
        self
    }

    /// Names the pool's fibers (shown in panics' messages and dumps). Costs an allocation
    /// per fiber. A `String`, as threadpool's, so that `"w".into()` compiles.
    pub fn thread_name(mut self, name: String) -> ThreadPoolBuilder {
        self.fiber_name = Some(name);
        self
    }

    /// The stack size of the pool's fibers, instead of the runtime's (128 KiB by default, where
    /// a thread pool's threads had 2 MiB: raise it for jobs that recurse deeply).
    pub fn thread_stack_size(mut self, bytes: usize) -> ThreadPoolBuilder {
        self.stack_size = Some(bytes);
        self
    }

    /// Runs the pool's jobs on the runtime `handle` refers to, instead of the current one.
    pub fn handle(mut self, handle: Handle) -> ThreadPoolBuilder {
        self.handle = Some(handle);
        self
    }

    /// Builds the pool; nothing starts until the first job.
    ///
    /// # Panics
    /// If the stack size is out of range (see [`crate::MIN_STACK_SIZE`]).
    #[track_caller]
    pub fn build(self) -> ThreadPool {
        if let Some(bytes) = self.stack_size {
            if let Err(e) = crate::fiber::stack::usable_size(bytes) {
                panic!("invalid ThreadPool stack size: {e}");
            }
        }
        let rt = match &self.handle {
            Some(h) => h.runtime().clone(),
            None => crate::runtime::with_current_runtime(RuntimeRef::clone),
        };
        ThreadPool {
            shared: Arc::new(Shared {
                queue: Injector::new(),
                queued: AtomicUsize::new(0),
                active: AtomicUsize::new(0),
                max: AtomicUsize::new(self.num_threads.unwrap_or(usize::MAX)),
                pending: AtomicUsize::new(0),
                panics: AtomicUsize::new(0),
                rt,
                fiber_name: self.fiber_name,
                stack_size: self.stack_size,
                synced: Mutex::new(Synced { generation: 0, joiners: Vec::new() }),
            }),
        }
    }
}
