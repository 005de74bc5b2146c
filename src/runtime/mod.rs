//! `Runtime` and `Handle`: start carriers, run fibers to completion, stop and clean up.
//!
//! A runtime is its `Shared` scheduler state plus the carrier threads. Dropping it stops the
//! carriers, then unwinds every fiber that has not finished (parked, queued, or never started)
//! on the dropping thread, so their destructors run and joiners get an error instead of
//! waiting for ever. See `arch/overview.md`.

pub mod builder;
pub(crate) mod config;
pub(crate) mod context;

use std::fmt;
use std::io;
use std::panic::{AssertUnwindSafe, Location, catch_unwind, resume_unwind};
use std::sync::OnceLock;
use std::sync::atomic::Ordering;
use std::thread;

pub use builder::Builder;
use config::Config;

use crate::fiber::builder::Builder as FiberBuilder;
use crate::fiber::{DONE, FiberRecord, FiberRef, JoinHandle};
use crate::scheduler::{RuntimeRef, Shared};

/// A set of carrier threads running fibers. See the crate docs for an overview.
pub struct Runtime {
    handle: Handle,
    supervisor: Option<thread::JoinHandle<()>>,
}

/// A cheap, cloneable, `Send + Sync` reference to a runtime, for spawning onto it from
/// anywhere. It keeps the runtime's bookkeeping alive, not its carriers: once the `Runtime`
/// is dropped, fibers spawned through a handle never run (joining them returns an error).
#[derive(Clone)]
pub struct Handle {
    rt: RuntimeRef,
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
        static RLIMIT: OnceLock<()> = OnceLock::new();
        RLIMIT.get_or_init(crate::platform::raise_nofile_limit);
        crate::fiber::overflow::install_handler();
        crate::diagnostics::install_panic_hook();

        let n = config.carriers;
        let cores =
            if config.pin_carriers { core_affinity::get_core_ids().unwrap_or_default() } else { Vec::new() };
        let name = config.thread_name.clone();
        let reactor = crate::net::reactor::Reactor::new()?;
        let rt = RuntimeRef::new(Shared::new(config, reactor));
        // From here on, dropping `runtime` stops whatever was started.
        let mut runtime = Runtime { handle: Handle { rt: rt.clone() }, supervisor: None };
        for i in 0..n {
            rt.start_carrier(i, (!cores.is_empty()).then(|| cores[i % cores.len()]))?;
        }
        let sup = rt.clone();
        let t = thread::Builder::new().name(format!("{name}-supervisor")).spawn(move || {
            sup.supervisor_thread.get_or_init(thread::current);
            crate::scheduler::supervisor::run(sup);
        })?;
        runtime.supervisor = Some(t);
        if rt.config.dump_on_sigquit {
            crate::diagnostics::dump_on_sigquit(&rt)?;
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
    pub fn metrics(&self) -> crate::Metrics {
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
    pub fn dump(&self) -> crate::FiberDump {
        self.handle.dump()
    }

    /// The number of carriers this runtime was built with.
    pub fn carriers(&self) -> usize {
        self.handle.rt.config.carriers
    }
}

impl Handle {
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
        let at = Location::caller();
        // SAFETY: `F` and `T` are 'static.
        match unsafe { FiberBuilder::new().spawn_unchecked_at(&self.rt, f, at, None) } {
            Ok(h) => h,
            Err(e) => panic!("failed to spawn fiber: {e}"),
        }
    }

    /// See [`Runtime::block_on`].
    #[track_caller]
    pub fn block_on<F, T>(&self, f: F) -> T
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        let at = Location::caller();
        // Called from a fiber, `f` may write into that fiber's stack while it waits below.
        let _lent = crate::fiber::compact::Lent::new();
        // SAFETY: we join the fiber before returning, on every path (`join` reports a panic
        // as `Err` rather than unwinding), so what `f` borrows outlives it.
        let h = match unsafe { FiberBuilder::new().spawn_unchecked_at(&self.rt, f, at, None) } {
            Ok(h) => h,
            Err(e) => panic!("failed to spawn fiber: {e}"),
        };
        match h.join() {
            Ok(v) => v,
            Err(p) => resume_unwind(p),
        }
    }

    /// See [`Runtime::metrics`].
    pub fn metrics(&self) -> crate::Metrics {
        crate::Metrics::read(&self.rt)
    }

    /// See [`Runtime::dump`].
    pub fn dump(&self) -> crate::FiberDump {
        crate::diagnostics::collect(&self.rt)
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
        f.debug_struct("Handle").field("carriers", &self.rt.config.carriers).finish_non_exhaustive()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        let rt = &self.handle.rt;
        let me = context::carrier();
        // SAFETY: a non-null carrier pointer is this thread's live carrier.
        if !me.is_null() && std::ptr::eq(unsafe { (*me).shared() }, rt.ptr()) {
            // Joining our own carrier thread would never return, and unwinding the fiber that
            // is running this drop would pull the stack from under it.
            eprintln!("virtual-threads: a Runtime was dropped from one of its own fibers; leaking it");
            rt.shutdown.store(true, Ordering::Release);
            return;
        }
        // SeqCst: a carrier about to sleep in the reactor raises `on_reactor`, then reads
        // `shutdown` (both SeqCst); `unpark_carrier` below reads `on_reactor` after this store.
        // Either the carrier sees the shutdown, or we see it polling and wake the reactor.
        rt.shutdown.store(true, Ordering::SeqCst);
        crate::diagnostics::forget_sigquit(rt);
        if let Some(t) = self.supervisor.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        // Every carrier there will ever be: `start_carrier` looks at `shutdown` and registers
        // the thread it spawns under this lock, so from here on none starts. (The supervisor
        // is not the only one to start carriers: a carrier whose fiber enters `vt::blocking`
        // compensates too, and one started that way just after this took the list was never
        // joined and kept running fibers while `cancel_all` ran: bug 10 in
        // `arch/reliability.md`.)
        let threads = std::mem::take(&mut *rt.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for i in 0..rt.started() {
            rt.unpark_carrier(i);
        }
        for t in &threads {
            // A carrier that has only just started may not have published its `Thread` in its
            // slot yet (what `unpark_carrier` uses): its handle reaches it all the same.
            t.thread().unpark();
        }
        for t in threads {
            let _ = t.join();
        }
        cancel_all(rt);
    }
}

/// Unwinds every fiber that has not finished, the deepest first (`FiberRecord::depth`), so
/// that a fiber whose frame others borrow (a `scope`, `join` or `block_on` waiting for them) is
/// unwound only after they are: unwound first, it would leave its wait at once and free the
/// frame under them (bug 11 in `arch/reliability.md`). Every unwind runs on this thread, one
/// after another: none nests inside another's (valgrind's view of stack switches could not
/// follow that). Cancelling one may wake or spawn others (its destructors run), so repeat
/// until nothing is left; then drain the queues of the references to finished fibers.
fn cancel_all(rt: &Shared) {
    let mut live = Vec::new();
    loop {
        rt.roots.for_each_live(|f| live.push(f));
        if live.is_empty() {
            break;
        }
        // Stable: among equals the walk's order, as before.
        live.sort_by_key(|f| std::cmp::Reverse(f.depth.get()));
        let mut progress = false;
        for f in live.drain(..) {
            progress |= f.state() != DONE && !f.cancelled.load(Ordering::Acquire);
            cancel(f);
        }
        if !progress {
            break; // only fibers being unwound further up this thread's stack: none at the top
        }
    }
    while cancel_one(rt) {}
    for slot in rt.slots.iter() {
        // Timer entries hold records, which hold the runtime: break the cycle.
        slot.timers.lock().unwrap_or_else(|e| e.into_inner()).clear();
        slot.next_deadline.store(u64::MAX, Ordering::Relaxed);
    }
}

/// Unwinds one unfinished fiber of a runtime being dropped; false when none is left. Also
/// called from inside a fiber being unwound that waits for another (a `scope` waiting for its
/// fibers, a `join`): waiting cannot work there, since nothing runs fibers any more, so the
/// waiter unwinds the others itself until what it waits for is done.
pub(crate) fn cancel_one(rt: &Shared) -> bool {
    let next = rt.roots.next_parked().or_else(|| rt.injector.pop_any()).or_else(|| {
        rt.slots.iter().find_map(|slot| {
            // One for this call; the rest back, in order, for the next (a fiber being unwound
            // may call here again and must find them).
            let mut all = slot.inbox.take_all();
            let f = all.next();
            all.for_each(|g| slot.inbox.push(g));
            f
        })
    });
    match next {
        Some(f) => {
            cancel(f);
            true
        }
        None => false,
    }
}

fn cancel(f: FiberRef) {
    if f.state() == DONE || f.cancelled.swap(true, Ordering::AcqRel) {
        return; // finished, or being unwound further up this thread's stack
    }
    f.runtime().remote.finished.fetch_add(1, Ordering::Relaxed);
    // A parked fiber holds its run reference (`FiberRef::take_parked_ref`). Moving it to
    // runnable here takes that reference over, and leaves any unpark that comes during the
    // unwind (another fiber's destructor) a token rather than a fiber to queue.
    // SAFETY: `notify` returned true: we moved it from parked to runnable.
    let run = f.notify().then(|| unsafe { FiberRef::take_parked_ref(&f) });
    if f.take_compacted() {
        // Its stack must be back in place before the unwind runs on it.
        // SAFETY: every carrier and the supervisor (the compactor) have stopped, and this
        // thread alone unwinds the fiber (see below).
        let bytes = unsafe { f.restore_stack() };
        let remote = &f.runtime().remote;
        remote.restores.fetch_add(1, Ordering::Relaxed);
        remote.restored_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }
    let outer = context::cancelling();
    context::set_cancelling(FiberRef::as_ptr(&f));
    // SAFETY: every carrier has stopped, and the swap of `cancelled` above lets one caller on
    // this thread through per fiber (the walk in `cancel_all`, or a queue's or the roots'
    // entry in `cancel_one`), so this thread has exclusive access.
    let slot = unsafe { f.co_mut() };
    if !f.started.replace(true) {
        // Never ran: bind a stack so its body can drop the closure (destructors run in fiber
        // context) and complete its packet; without a stack, `bind` completes it with the error.
        // SAFETY: exclusive access, as above.
        unsafe { f.bind(f.class().take().map(crate::fiber::builder::new_coroutine)) };
    } else if let Some(co) = slot.as_mut() {
        // Resumes the fiber with corosensei's unwind payload; the fiber's body catches it
        // (after every destructor on the way ran), completes its packet and returns.
        if catch_unwind(AssertUnwindSafe(|| co.force_unwind())).is_err() {
            eprintln!("virtual-threads: a fiber panicked while being cancelled by its runtime's drop");
        }
    }
    if let Some(co) = slot.as_mut().filter(|co| !co.done()) {
        // Bound but not started: its body sees `cancelled` and only drops the closure.
        if catch_unwind(AssertUnwindSafe(|| co.resume(FiberRef::as_ptr(&f)))).is_err() {
            eprintln!("virtual-threads: a fiber panicked while being cancelled by its runtime's drop");
        }
    }
    context::set_cancelling(outer);
    if let Some(co) = slot.take() {
        if co.done() {
            drop(co.into_stack());
        } else {
            // It could not be unwound (it caught the unwind and kept parking): leaking its
            // stack is the only sound choice left.
            std::mem::forget(co);
        }
    }
    FiberRecord::finish_now(&f);
    drop(run);
}

/// The process-wide default runtime, started on first use (by `vt::spawn` and friends called
/// from a plain thread). `VT_CARRIERS`, `VT_MAX_CARRIERS` and `VT_STACK_SIZE` in the
/// environment set its bounds (`Builder::with_env`): its users, from `main`, have no builder.
pub(crate) fn default_runtime() -> &'static Runtime {
    static DEFAULT: OnceLock<Runtime> = OnceLock::new();
    DEFAULT.get_or_init(|| {
        let var = |name: &str| std::env::var_os(name);
        let fail = |e: io::Error, note: String| -> ! {
            panic!("cannot start the default virtual-threads runtime: {e}{note}")
        };
        let b =
            Builder::new().thread_name("vt-default").with_env(var).unwrap_or_else(|e| fail(e, String::new()));
        // A bound out of range (`VT_CARRIERS=0`): say which variables were set.
        b.build().unwrap_or_else(|e| fail(e, builder::env_note(var)))
    })
}

/// Runs `f` with the runtime of the calling fiber, or the default runtime on a plain thread.
/// The reference is valid only until `f`'s first switch point that follows its last use.
pub(crate) fn with_current_runtime<R>(f: impl FnOnce(&RuntimeRef) -> R) -> R {
    let c = context::carrier();
    if !c.is_null() {
        // SAFETY: a non-null carrier pointer is this thread's live carrier, which lives until
        // its runtime shuts down, after every fiber on it has stopped running.
        return f(unsafe { (*c).runtime_ref() });
    }
    f(default_runtime().handle.runtime())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, mpsc};
    use std::time::{Duration, Instant};

    use crate::scheduler::test_hooks::CARRIER_SPAWNED;

    /// A carrier that compensation starts while the runtime is being dropped is joined by the
    /// drop, like every other (bug 10 in `arch/reliability.md`). Before the fix, the drop could
    /// take the list of carrier threads to join between the spawn of such a carrier and its
    /// registration: never joined, the carrier went on running fibers while the drop unwound
    /// the others, and the ones it held then (running, or in its local deque) were never
    /// unwound, which hung `tests/stress.rs`. That window is a few instructions wide; the hook
    /// holds the compensating carrier in it until the drop has begun and has either taken the
    /// list or is kept from it by the lock this thread holds. Before the fix this failed every
    /// time ("1 carrier thread(s) ... never joined").
    #[test]
    fn a_carrier_started_while_the_runtime_drops_is_joined() {
        let rt = crate::Runtime::builder().carriers(1).max_carriers(2).build().unwrap();
        let handle = rt.handle();
        let me = handle.runtime().ptr() as usize;
        let (spawned_tx, spawned_rx) = mpsc::sync_channel::<()>(1);
        *CARRIER_SPAWNED.lock().unwrap() = Some(Arc::new(move |rt, index| {
            if std::ptr::from_ref(rt) as usize != me || index != 1 {
                return; // another test's runtime, or a carrier the runtime starts with
            }
            let _ = spawned_tx.try_send(());
            // A generous bound, so that a broken test fails instead of hanging.
            let limit = Instant::now() + Duration::from_secs(30);
            while Instant::now() < limit {
                if rt.shutdown.load(Ordering::Acquire) {
                    match rt.threads.try_lock() {
                        Ok(threads) if threads.is_empty() => return, // the drop took them
                        Ok(_) => {}
                        Err(_) => return, // held: by this thread (the fix), or the drop taking them
                    }
                }
                std::thread::yield_now();
            }
        }));
        // Its `blocking` call makes the only carrier count as blocked: compensation starts
        // carrier 1, and the hook stops it there.
        let blocker = rt.spawn(|| crate::blocking(|| ()));
        let started = spawned_rx.recv_timeout(Duration::from_secs(30));
        drop(rt);
        *CARRIER_SPAWNED.lock().unwrap() = None;
        started.expect("compensation started a second carrier");
        assert!(blocker.join().is_ok(), "the fiber that compensated was running: it finishes");
        let left = handle.runtime().threads.lock().unwrap().len();
        assert_eq!(left, 0, "{left} carrier thread(s) started during the drop were never joined");
    }
}
