//! What must hold for a child of `fork` to run a runtime: a `fork` copies only the forking
//! thread, so any lock another thread held at that instant stays held in the child for ever.
//!
//! - Process-wide locks the child's runtime takes are held by the forking thread across every
//!   fork ([`hold_across_fork`]), and let go on both sides.
//! - Every handler is registered while the process loads ([`at_load!`]), before any thread
//!   exists: a lazy registration in flight on another thread at a fork left its `Once` running
//!   in the child, and the child's first `vt::blocking` waited for it for ever. Other one-time
//!   setup of process-wide state runs [`outside_fork`] ([`init_once`] for a `OnceLock`).
//! - std takes a process-wide lock while a thread it started begins and ends (its stack-overflow
//!   handler's map of guard pages), so the child could not start a thread if one of ours was
//!   starting or ending at the fork. The runtime starts its threads with [`spawn`], and a fork
//!   waits until none of them is between `pthread_create` and its first line, or between its
//!   last line and its end. Threads the program starts itself are out of our reach.
//!
//! See `arch/scheduler.md` ("Fork").

use std::cell::{Cell, RefCell};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Runs `$f` (a plain `fn()`) while the process loads, before `main` and before any thread
/// exists (an `.init_array` entry; in a shared library, when it is loaded).
macro_rules! at_load {
    ($f:path) => {
        const _: () = {
            extern "C" fn at_load() {
                $f()
            }
            #[used]
            #[unsafe(link_section = ".init_array")]
            static AT_LOAD: extern "C" fn() = at_load;
        };
    };
}
pub(crate) use at_load;

/// Processes forked so far in this process's line (bumped in the child by [`count_fork`]):
/// whatever was built before a fork — a runtime, its epoll sets — remembers the count it was
/// built at, and has no threads in the child.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// Called by a child handler only (async-signal-safe: one atomic add).
pub(crate) fn count_fork() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// See `FORKS`. Relaxed: the count changes only in a child's single thread, before anything
/// else runs there.
#[inline]
pub(crate) fn forks() -> u64 {
    FORKS.load(Ordering::Relaxed)
}

/// Runs `handler` in the child after every `fork`. Called from [`at_load!`] functions only.
///
/// # Safety
/// `handler` is async-signal-safe (the child of a multithreaded process may call only such).
pub(crate) unsafe fn after_fork_in_child(handler: extern "C" fn()) {
    // SAFETY: the caller's contract.
    unsafe { libc::pthread_atfork(None, None, Some(handler)) };
}

/// A guard of a process-wide lock, type-erased: dropping it unlocks.
pub(crate) type ForkGuard = Box<dyn std::any::Any>;

static TAKERS: Mutex<Vec<fn() -> ForkGuard>> = Mutex::new(Vec::new());

thread_local! {
    static HELD: RefCell<Vec<ForkGuard>> = const { RefCell::new(Vec::new()) };
}

/// Makes the forking thread take a process-wide lock before every `fork` (`take` locks it and
/// returns the guard) and let go of it on both sides just after. Called from [`at_load!`]
/// functions only, once per lock. Each lock must be a leaf among those held (nothing registered
/// is locked while holding it), since the order they are taken in is the load order.
pub(crate) fn hold_across_fork(take: fn() -> ForkGuard) {
    TAKERS.lock().unwrap_or_else(|e| e.into_inner()).push(take);
}

extern "C" fn prepare() {
    // The list's own lock is held across the fork too (it is a leaf).
    let takers = TAKERS.lock().unwrap_or_else(|e| e.into_inner());
    let mut guards: Vec<ForkGuard> = takers.iter().map(|take| take()).collect();
    guards.push(Box::new(takers));
    // Threads last: a thread may be started while one of the locks above is held (the signal
    // and SIGQUIT threads are), and a thread starting or ending takes none of them.
    guards.push(Box::new(no_thread_in_transition()));
    HELD.with(|h| *h.borrow_mut() = guards);
}

extern "C" fn after() {
    let guards = HELD.with(|h| std::mem::take(&mut *h.borrow_mut()));
    guards.into_iter().rev().for_each(drop);
}

fn register_handlers() {
    // SAFETY: in the child, `after` only drops guards this same thread took in `prepare`: plain
    // unlocks, of no lock held by a vanished thread, and the transition gate's flag.
    unsafe { libc::pthread_atfork(Some(prepare), Some(after), Some(after)) };
}
at_load!(register_handlers);

/// The runtime's threads between `pthread_create` and their first line, or between their last
/// line and their end (see the module's docs), and whether a fork is waiting for them.
struct Transitions {
    now: usize,
    forking: bool,
}

static TRANSITIONS: Mutex<Transitions> = Mutex::new(Transitions { now: 0, forking: false });
static TRANSITIONS_CHANGED: Condvar = Condvar::new();

fn transitions() -> MutexGuard<'static, Transitions> {
    TRANSITIONS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Held by the forking thread across the fork: no thread of ours is starting or ending.
struct NoTransition(#[allow(dead_code)] MutexGuard<'static, Transitions>);

impl Drop for NoTransition {
    fn drop(&mut self) {
        self.0.forking = false;
        TRANSITIONS_CHANGED.notify_all();
    }
}

fn no_thread_in_transition() -> NoTransition {
    let mut t = transitions();
    // A second fork from another thread waits for the first to be over.
    while t.forking {
        t = TRANSITIONS_CHANGED.wait(t).unwrap_or_else(|e| e.into_inner());
    }
    t.forking = true;
    while t.now > 0 {
        t = TRANSITIONS_CHANGED.wait(t).unwrap_or_else(|e| e.into_inner());
    }
    NoTransition(t)
}

fn begin_transition() {
    let mut t = transitions();
    while t.forking {
        t = TRANSITIONS_CHANGED.wait(t).unwrap_or_else(|e| e.into_inner());
    }
    t.now += 1;
}

thread_local! {
    /// Transitions this thread began and will end itself (`outside_fork`, its own end), open now.
    static OWN: Cell<u32> = const { Cell::new(0) };
}

/// Begins a transition this thread will end itself. One nested in another of this thread's
/// (a setup inside a setup, a thread-local destructor of an ending thread that sets something up)
/// does not wait for a fork: the fork already waits for the outer one, which would never end.
fn begin_own_transition() {
    let nested = OWN.with(|o| {
        let n = o.get();
        o.set(n + 1);
        n > 0
    });
    let mut t = transitions();
    while t.forking && !nested {
        t = TRANSITIONS_CHANGED.wait(t).unwrap_or_else(|e| e.into_inner());
    }
    t.now += 1;
}

fn end_own_transition() {
    OWN.with(|o| o.set(o.get() - 1));
    end_transition();
}

fn end_transition() {
    let mut t = transitions();
    t.now -= 1;
    if t.now == 0 && t.forking {
        TRANSITIONS_CHANGED.notify_all();
    }
}

/// Runs `f`, a one-time setup of process-wide state (a `OnceLock`'s initialiser, a signal
/// handler's or panic hook's installation), so that no fork happens while it runs: a `Once` in
/// flight at a fork stays in flight in the child, and the child's first runtime waited for it
/// for ever (seen with the SIGSEGV handler's). `f` must take none of the locks held across a
/// fork ([`hold_across_fork`]).
pub(crate) fn outside_fork<R>(f: impl FnOnce() -> R) -> R {
    struct End;
    impl Drop for End {
        fn drop(&mut self) {
            end_own_transition();
        }
    }
    begin_own_transition();
    let _end = End;
    f()
}

/// `cell.get_or_init(f)`, with the initialisation [`outside_fork`]; no cost once initialised.
pub(crate) fn init_once<T>(cell: &std::sync::OnceLock<T>, f: impl FnOnce() -> T) -> &T {
    match cell.get() {
        Some(v) => v,
        None => outside_fork(|| cell.get_or_init(f)),
    }
}

/// Set on a thread of ours once its body has returned or unwound: its end is a transition,
/// which this thread-local's destructor closes. Thread-local destructors run after std has
/// taken down the thread's stack-overflow handler, the last use of std's lock.
struct Ending(Cell<bool>);

impl Drop for Ending {
    fn drop(&mut self) {
        if self.0.get() {
            end_own_transition();
        }
    }
}

thread_local! {
    static ENDING: Ending = const { Ending(Cell::new(false)) };
}

/// Begins the end's transition when the body returns or unwinds.
struct BodyDone;

impl Drop for BodyDone {
    fn drop(&mut self) {
        begin_own_transition();
        // Registered at the body's start (`spawn`), so the destructor is armed.
        let armed = ENDING.try_with(|e| e.0.set(true));
        if armed.is_err() {
            end_own_transition();
        }
    }
}

/// Starts a thread of the runtime's with `builder`: as `std::thread::Builder::spawn`, except
/// that a fork never copies the process while the thread is starting or ending (see the
/// module's docs).
pub(crate) fn spawn<F, T>(builder: std::thread::Builder, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    begin_transition();
    let spawned = builder.spawn(move || {
        // Arms the destructor before the start's transition ends, so that a thread with no
        // room left for thread-locals still counts its end.
        let armed = ENDING.try_with(|_| ()).is_ok();
        end_transition();
        let _done = armed.then_some(BodyDone);
        f()
    });
    if spawned.is_err() {
        end_transition();
    }
    spawned
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// A setup nested in another of the same thread's, while a fork waits for the outer one:
    /// the inner one must not wait for the fork (which waits for the outer), or both wait for
    /// ever. (The same holds for a setup in a destructor of an ending thread of ours.)
    #[test]
    fn a_setup_nested_in_another_does_not_wait_for_a_pending_fork() {
        let (done_tx, done_rx) = mpsc::channel();
        let setup = std::thread::spawn(move || {
            outside_fork(|| {
                let forker = std::thread::spawn(|| drop(no_thread_in_transition()));
                // The "fork" now waits for this setup to end.
                while !transitions().forking {
                    std::thread::yield_now();
                }
                outside_fork(|| ());
                forker
            })
            .join()
            .unwrap();
            done_tx.send(()).unwrap();
        });
        let done = done_rx.recv_timeout(Duration::from_secs(20));
        assert!(done.is_ok(), "the nested setup waited for the fork, which waited for it");
        setup.join().unwrap();
    }
}
