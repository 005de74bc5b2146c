//! `Runtime` and `Handle`: start carriers, run fibers to completion, stop and clean up.
//!
//! A runtime is its `Shared` scheduler state plus the carrier threads. Dropping it stops the
//! carriers' loops, then unwinds every fiber that has not finished (parked, queued, or never
//! started), each started one on its home carrier's thread (`shutdown.rs`), so their
//! destructors run and joiners get an error instead of waiting for ever. See
//! `arch/overview.md` and `arch/scheduler.md` "Shutdown".

pub mod builder;
pub(crate) mod inspect;
pub(crate) mod metrics;
pub(crate) mod spawn;

use std::fmt;
use std::io;
use std::panic::{Location, resume_unwind};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::thread;

pub use builder::Builder;

use crate::fiber::join::JoinHandle;
use crate::fiber::park::{WaitOnUnwind, finished};
use crate::fiber::schedule::RuntimeRef;
use crate::fiber::wait::WaitReason;
use crate::runtime::spawn::Builder as FiberBuilder;
use crate::scheduler::Shared;
use crate::scheduler::config::{Affinity, Config};

/// `let rt = vt::Runtime::builder().carriers(2).build()?; let n = rt.block_on(|| count_lines());`
///
/// A set of carrier threads running fibers. See the crate docs for an overview.
pub struct Runtime {
    handle: Handle,
    supervisor: Option<thread::JoinHandle<()>>,
}

/// `let h = rt.handle(); std::thread::spawn(move || h.spawn(work));`
///
/// A cheap, cloneable, `Send + Sync` reference to a runtime, for spawning onto it from
/// anywhere. It keeps the runtime's bookkeeping alive, not its carriers: once the `Runtime`
/// is dropped, fibers spawned through a handle never run (joining them returns an error).
#[derive(Clone)]
pub struct Handle {
    rt: RuntimeRef,
    /// `platform::forks()` when the runtime was built (see `check_not_forked`).
    forks: u64,
}

impl Runtime {
    /// A runtime with the default settings (see [`Builder::new`]).
    pub fn new() -> io::Result<Runtime> {
        Builder::new().build()
    }

    /// Settings for a new runtime.
    pub fn builder() -> Builder {
        Builder::new()
    }

    fn start(config: Config) -> io::Result<Runtime> {
        // Not a `Once`: one in flight on another thread at a `fork` would stay in flight in the
        // child, and the child's first runtime would wait for it for ever. Raising twice is
        // harmless.
        static RAISED: AtomicBool = AtomicBool::new(false);
        if !RAISED.swap(true, Ordering::Relaxed) {
            crate::platform::raise_nofile_limit();
        }
        crate::fiber::overflow::install_handler();
        crate::fiber::panic_hook::install_panic_hook();

        let n = config.carriers;
        let cores = match config.affinity {
            Affinity::Floating => Vec::new(),
            Affinity::Adaptive | Affinity::Pinned => crate::platform::core_ids(),
        };
        let name = config.thread_name.clone();
        let rt = RuntimeRef::new(Shared::new(config));
        // From here on, dropping `runtime` stops whatever was started.
        let mut runtime = Runtime { handle: Handle { rt: rt.clone(), forks: forks() }, supervisor: None };
        for i in 0..n {
            rt.start_carrier(i, (!cores.is_empty()).then(|| cores[i % cores.len()]))?;
        }
        let sup = rt.clone();
        let t = crate::platform::fork::spawn(
            thread::Builder::new().name(format!("{name}-supervisor")),
            move || {
                // The runtime may be built on a pinned carrier of another.
                crate::platform::thread::unpin_current();
                crate::scheduler::supervisor::serve(sup);
            },
        )?;
        runtime.supervisor = Some(t);
        crate::scheduler::deadlock::register(&rt);
        if rt.config().dump_on_sigquit {
            crate::scheduler::diagnostics::dump_on_sigquit(&rt)?;
        }
        if let Some(path) = &rt.config().trace {
            rt.trace_start(path)?;
        }
        Ok(runtime)
    }

    /// Runs `f` as a fiber on this runtime and waits for it, blocking the calling thread (or
    /// parking the calling fiber). `f` may borrow from the caller. A panic in `f` is resumed
    /// in the caller.
    #[track_caller]
    pub fn block_on<F, T>(&self, f: F) -> T
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        self.handle.block_on(f)
    }

    /// Spawns a fiber on this runtime.
    #[track_caller]
    pub fn spawn<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.handle.spawn(f)
    }

    /// A handle to this runtime.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// A snapshot of the runtime's counters, summed over the carriers (reading costs them
    /// nothing).
    pub fn metrics(&self) -> crate::runtime::metrics::Metrics {
        self.handle.metrics()
    }

    /// Every live fiber: id, name, state (running on which carrier, runnable, parked on what,
    /// inside `blocking`), spawn location and for how long. `Display` groups them by state
    /// and spawn location. Empty when the runtime was built with `fiber_roots(false)`.
    ///
    /// ```
    /// let rt = virtual_threads::Runtime::builder().carriers(1).build().unwrap();
    /// let (tx, rx) = virtual_threads::channel::bounded::<()>(0);
    /// let h = rt.spawn(move || rx.recv());
    /// while rt.dump().fibers().iter().all(|f| !matches!(f.state, virtual_threads::FiberState::Parked { .. })) {
    ///     std::thread::yield_now();
    /// }
    /// println!("{}", rt.dump()); // "1 fiber parked on channel receive, spawned at ..."
    /// drop(tx);
    /// assert!(h.join().unwrap().is_err());
    /// ```
    pub fn dump(&self) -> crate::scheduler::diagnostics::FiberDump {
        self.handle.dump()
    }

    /// The number of carriers this runtime was built with.
    pub fn carriers(&self) -> usize {
        self.handle.carriers()
    }

    /// Starts recording an execution trace into `path` (see [`Builder::trace`] for what it
    /// holds and how to look at it), so that a long-running program can be traced for a while:
    /// `rt.trace_start("trace.json")?; sleep(10 s); rt.trace_stop()?`.
    ///
    /// Errors: `AlreadyExists` while a trace runs; the file's error (naming it) when it cannot
    /// be created.
    pub fn trace_start(&self, path: impl AsRef<std::path::Path>) -> io::Result<()> {
        self.handle.trace_start(path)
    }

    /// Stops the trace and finishes its file; says how many events it holds and how many were
    /// dropped because a carrier's buffer was full. Errors: `InvalidInput` when no trace runs;
    /// the file's write error.
    pub fn trace_stop(&self) -> io::Result<crate::scheduler::trace::TraceSummary> {
        self.handle.trace_stop()
    }
}

impl Handle {
    /// `let h = vt::Handle::current();`: the runtime the calling fiber runs on, or the
    /// process-wide default runtime on a plain thread (started if it has not been). A program on
    /// the default runtime reaches its [`metrics`](Handle::metrics) and [`dump`](Handle::dump)
    /// this way (or through [`vt::metrics`](crate::metrics) and [`vt::dump`](crate::dump)).
    ///
    /// ```
    /// use virtual_threads as vt;
    ///
    /// let rt = vt::Runtime::builder().carriers(1).build()?;
    /// // From a fiber: its own runtime.
    /// let carriers = rt.block_on(|| vt::Handle::current().metrics().carriers_target);
    /// assert_eq!(carriers, 1);
    /// // From a plain thread: the default runtime.
    /// let spawned = vt::Handle::current().metrics().fibers_spawned;
    /// vt::spawn(|| ()).join().unwrap();
    /// assert!(vt::Handle::current().metrics().fibers_spawned > spawned);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn current() -> Handle {
        with_current_runtime(|rt| Handle { rt: rt.clone(), forks: forks() })
    }

    /// Spawns a fiber on the runtime.
    ///
    /// # Panics
    /// If no stack can be allocated (see [`crate::Builder::spawn_on`] for the `io::Error`).
    #[track_caller]
    pub fn spawn<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        check_not_forked(self);
        let at = Location::caller();
        // SAFETY: `F` and `T` are 'static.
        match unsafe { FiberBuilder::new().spawn_unchecked_at(&self.rt, f, at, None) } {
            Ok(h) => h,
            Err(e) => panic!("failed to spawn fiber: {e}"),
        }
    }

    /// Spawns a fiber that starts on carrier `index` of the runtime and stays there (its home):
    /// [`vt::Builder::carrier`](crate::Builder::carrier), which says what that gives up.
    ///
    /// # Errors
    /// `InvalidInput` when `index` is not below [`carriers`](Handle::carriers); as
    /// [`crate::Builder::spawn_on`] when no stack can be had.
    #[track_caller]
    pub fn spawn_on_carrier<F, T>(&self, index: usize, f: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        check_not_forked(self);
        FiberBuilder::new().carrier(index).spawn_on(self, f)
    }

    /// The number of carriers the runtime was built with (spares the supervisor adds for
    /// carriers blocked in the OS not counted): the indices `spawn_on_carrier` takes.
    pub fn carriers(&self) -> usize {
        self.rt.config().carriers
    }

    /// See [`Runtime::block_on`].
    #[track_caller]
    pub fn block_on<F, T>(&self, f: F) -> T
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        check_not_forked(self);
        let at = Location::caller();
        // Called from a fiber, `f` may write into that fiber's stack while it waits below.
        let _lent = crate::fiber::compact::Lent::new();
        // SAFETY: we join the fiber before returning, on every path (`join` reports a panic
        // as `Err` rather than unwinding), so what `f` borrows outlives it.
        let h = match unsafe { FiberBuilder::new().spawn_unchecked_at(&self.rt, f, at, None) } {
            Ok(h) => h,
            Err(e) => panic!("failed to spawn fiber: {e}"),
        };
        // Unwound from the wait below (this runtime's drop, or another's that runs this fiber),
        // the frame `f` borrows from must outlive `f` all the same.
        let watch = h.fiber().clone();
        let mut wait = WaitOnUnwind::new(WaitReason::Join, move || finished(&watch));
        let r = h.join();
        wait.disarm();
        match r {
            Ok(v) => v,
            Err(p) => resume_unwind(p),
        }
    }

    /// See [`Runtime::metrics`].
    pub fn metrics(&self) -> crate::runtime::metrics::Metrics {
        crate::runtime::metrics::Metrics::read(&self.rt)
    }

    /// See [`Runtime::dump`].
    pub fn dump(&self) -> crate::scheduler::diagnostics::FiberDump {
        crate::scheduler::diagnostics::collect(&self.rt)
    }

    /// See [`Runtime::trace_start`]; on the default runtime too
    /// (`vt::Handle::current().trace_start(path)`).
    pub fn trace_start(&self, path: impl AsRef<std::path::Path>) -> io::Result<()> {
        self.rt.trace_start(path.as_ref())
    }

    /// See [`Runtime::trace_stop`].
    pub fn trace_stop(&self) -> io::Result<crate::scheduler::trace::TraceSummary> {
        self.rt.trace_stop().unwrap_or_else(|| {
            Err(io::Error::new(io::ErrorKind::InvalidInput, "trace_stop: no trace is being recorded"))
        })
    }

    pub(crate) fn runtime(&self) -> &RuntimeRef {
        &self.rt
    }
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime").field("carriers", &self.carriers()).finish_non_exhaustive()
    }
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handle").field("carriers", &self.rt.config().carriers).finish_non_exhaustive()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let rt = &self.handle.rt;
        if self.handle.forks != forks() {
            // Built before a `fork`: its threads do not exist in this process. Nothing can be
            // stopped or unwound; leak it.
            return;
        }
        // A trace ends with the fibers' work, before their unwinding.
        if let Some(Err(e)) = rt.trace_stop() {
            eprintln!("virtual-threads: the execution trace could not be written: {e}");
        }
        rt.begin_shutdown();
        let supervisor = self.supervisor.take();
        if crate::scheduler::shutdown::called_from_a_fiber_of(rt) {
            // Dropped from one of its own fibers: this thread is one of the carriers to stop,
            // and it can serve only once this fiber switches out. Or from a `vt::blocking`
            // call of one of its fibers: that fiber waits for this thread, and its unwind would
            // wait for the call to return. The rest of the drop runs on a thread of its own, so
            // the other fibers still end and their joins return.
            let rt = rt.clone();
            let spawned = crate::platform::fork::spawn(
                thread::Builder::new().name(format!("{}-drop", rt.config().thread_name)),
                move || rt.stop(supervisor),
            );
            if spawned.is_err() {
                eprintln!(
                    "virtual-threads: a Runtime was dropped from one of its own fibers and no thread could be started to stop it; leaking it"
                );
            }
            return;
        }
        rt.stop(supervisor);
    }
}

/// The `pthread_atfork` child handler, run on the child's only thread, the one that called
/// `fork`. It counts the fork (a runtime built before it has no threads here), and if that
/// thread is a carrier, makes it a plain thread: the fiber that forked goes on as the child's
/// program, and neither it nor its carrier's loop may touch the parent's runtime again (its
/// epoll sets and eventfds are shared with the parent: `fiber::context::forget_carrier_after_fork`).
extern "C" fn after_fork_in_child() {
    crate::platform::fork::count_fork();
    crate::fiber::context::forget_carrier_after_fork();
}

fn register_fork_handler() {
    // SAFETY: the handler bumps an atomic and clears two thread-local cells of its own thread
    // (async-signal-safe).
    unsafe { crate::platform::fork::after_fork_in_child(after_fork_in_child) };
}
crate::platform::fork::at_load!(register_fork_handler);

pub(crate) fn forks() -> u64 {
    crate::platform::forks()
}

/// Panics if `h`'s runtime was built before a `fork` (in the parent: its carriers do not exist
/// here).
#[track_caller]
fn check_not_forked(h: &Handle) {
    if h.forks != forks() {
        panic!(
            "virtual-threads: this Runtime was built before a fork(); its carrier threads do not exist in the child process. Build a new Runtime in the child (the default runtime restarts by itself)"
        );
    }
}

/// The process-wide default runtime, started on first use (by `vt::spawn` and friends called
/// from a plain thread), and started afresh on first use in a child process after `fork` (the
/// parent's has no threads there; it is leaked). `VT_CARRIERS`, `VT_MAX_CARRIERS` and
/// `VT_STACK_SIZE` in the environment set its bounds (`Builder::with_env`): its users, from
/// `main`, have no builder.
pub(crate) fn default_runtime() -> &'static Runtime {
    static DEFAULT: AtomicPtr<Runtime> = AtomicPtr::new(std::ptr::null_mut());
    let current = |p: *mut Runtime| {
        // SAFETY: a non-null pointer came from `Box::leak` below and is never freed.
        (!p.is_null()).then(|| unsafe { &*p }).filter(|r| r.handle.forks == forks())
    };
    if let Some(r) = current(DEFAULT.load(Ordering::Acquire)) {
        return r;
    }
    {
        let mut starting = DEFAULT_STARTING.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = current(DEFAULT.load(Ordering::Acquire)) {
                return r;
            }
            match *starting {
                Some(line) if line == forks() => {
                    starting = DEFAULT_STARTED.wait(starting).unwrap_or_else(|e| e.into_inner());
                }
                // None, or a start in flight in the parent at the fork: not this process's.
                _ => break,
            }
        }
        *starting = Some(forks());
    }
    // Also when the build panics: the next caller tries again.
    struct Started;
    impl Drop for Started {
        fn drop(&mut self) {
            *DEFAULT_STARTING.lock().unwrap_or_else(|e| e.into_inner()) = None;
            DEFAULT_STARTED.notify_all();
        }
    }
    let _started = Started;
    let var = |name: &str| std::env::var_os(name);
    let fail = |e: io::Error, note: String| -> ! {
        panic!("cannot start the default virtual-threads runtime: {e}{note}")
    };
    let b = Builder::new().thread_name("vt-default").with_env(var).unwrap_or_else(|e| fail(e, String::new()));
    // A bound out of range (`VT_CARRIERS=0`): say which variables were set.
    let r = b.build().unwrap_or_else(|e| fail(e, builder::env_note(var)));
    let r: &'static Runtime = Box::leak(Box::new(r));
    if r.handle.rt.config().trace.is_some() && TRACED_DEFAULT.set(r.handle()).is_ok() {
        // The default runtime is never dropped: finish its trace when the process exits.
        crate::platform::at_exit(stop_default_trace);
    }
    DEFAULT.store(std::ptr::from_ref(r).cast_mut(), Ordering::Release);
    r
}

/// Whether a thread is starting the default runtime, and in which process of the fork line
/// (`forks()`). Locked only to read or write that, never across the start: a `fork` in the
/// middle of a start (whose lock would stay held in the child for ever) leaves the child free
/// to start its own.
static DEFAULT_STARTING: std::sync::Mutex<Option<u64>> = std::sync::Mutex::new(None);
static DEFAULT_STARTED: std::sync::Condvar = std::sync::Condvar::new();

fn hold_default_starting_across_fork() {
    crate::platform::fork::hold_across_fork(|| {
        Box::new(DEFAULT_STARTING.lock().unwrap_or_else(|e| e.into_inner()))
    });
}
crate::platform::fork::at_load!(hold_default_starting_across_fork);

/// The default runtime, when `VT_TRACE` made it record a trace.
static TRACED_DEFAULT: OnceLock<Handle> = OnceLock::new();

/// `exit`'s handler for `VT_TRACE`: the default runtime's trace file is finished (closed JSON).
extern "C" fn stop_default_trace() {
    // Not in a child after `fork`: the parent's runtime has no carriers there.
    let Some(h) = TRACED_DEFAULT.get().filter(|h| h.forks == forks()) else { return };
    if let Some(Err(e)) = h.rt.trace_stop() {
        eprintln!("virtual-threads: the execution trace could not be written: {e}");
    }
}

/// Runs `f` with the runtime of the calling fiber, or the default runtime on a plain thread.
/// The reference is valid only until `f`'s first switch point that follows its last use.
pub(crate) fn with_current_runtime<R>(f: impl FnOnce(&RuntimeRef) -> R) -> R {
    let c = crate::scheduler::carrier::here();
    if !c.is_null() {
        // SAFETY: a non-null carrier pointer is this thread's live carrier, which lives until
        // its runtime shuts down, after every fiber on it has stopped running.
        return f(unsafe { (*c).runtime_ref() });
    }
    f(default_runtime().handle.runtime())
}
