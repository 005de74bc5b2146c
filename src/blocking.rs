//! `vt::blocking`: a call that blocks the OS thread runs on a helper thread while the calling
//! fiber parks, so its carrier goes on running the fibers homed on it.
//!
//! Started fibers never leave their home carrier (by default), so a carrier
//! blocked in the OS strands them: compensation can add carriers, but only unstarted fibers
//! can move to them. Running the blocking closure elsewhere keeps the carrier free instead.
//!
//! ```text
//!  fiber (on its carrier)                    helper thread (process-wide pool)
//!  Call { f, out, done, waiter } on its stack
//!  submit(&call) ───────────────────────────► pop, run f (panics caught), store out,
//!  park until done ◄──────── unpark ────────  done = true (Release), wake the waiter
//!  take out (a panic resumes here)
//! ```
//! The closure may borrow from the fiber's stack: the fiber returns only after `done`, and if
//! its runtime's drop unwinds it from the park, `WaitOnUnwind` waits for `done` before its frame
//! goes. The task handed over is two words (a function and the `Call`'s address), queued in a
//! ring that keeps its capacity, so a call allocates nothing in steady state. Helpers are
//! started on demand up to `MAX_HELPERS` and exit after `IDLE_EXIT` without work.
//! See `arch/supervisor.md` ("Blocking calls").

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, Location, catch_unwind, resume_unwind};
use std::sync::Condvar;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::loom::StdMutex as Mutex;
use std::time::Duration;

use crate::fiber::context;
use crate::fiber::handle::Fiber;
use crate::fiber::park::{WaitOnUnwind, park_for};
use crate::fiber::wait::WaitReason;

/// Most helper threads at once; beyond, a call blocks its own carrier (compensated), since
/// calls queued for a free helper may be what the busy ones wait for. Java bounds its carrier
/// compensation at 256 for the same reason: blocking pools that grew without bound.
const MAX_HELPERS: usize = 256;
/// A helper with nothing to do for this long exits.
const IDLE_EXIT: Duration = Duration::from_secs(10);

/// A call handed to a helper: `run(data)`.
struct Task {
    run: unsafe fn(*const ()),
    data: *const (),
}

// SAFETY: `data` points to a `Call` whose closure and result are `Send`; the fiber that owns it
// waits until the helper is done with it.
unsafe impl Send for Task {}

struct Pool {
    queue: VecDeque<Task>,
    threads: usize,
    idle: usize,
    /// `platform::forks()` when these counts were true: a forked child has none of the threads.
    forks: u64,
}

static POOL: Mutex<Pool> = Mutex::new(Pool { queue: VecDeque::new(), threads: 0, idle: 0, forks: 0 });
static WORK: Condvar = Condvar::new();

/// A helper or a caller may hold the pool's lock when another thread forks: the child's first
/// `vt::blocking` waited for ever (hung at fork 1 or 3 of 40 under call churn).
fn hold_pool_across_fork() {
    crate::platform::fork::hold_across_fork(|| Box::new(POOL.lock().unwrap_or_else(|e| e.into_inner())));
}
crate::platform::fork::at_load!(hold_pool_across_fork);

/// The calling fiber's call on the helper: lives in its frame until `done`.
struct Call<F, T> {
    f: UnsafeCell<Option<F>>,
    out: UnsafeCell<Option<std::thread::Result<T>>>,
    done: AtomicBool,
    waiter: Fiber,
    /// The waiter's runtime (its `Shared`), for `shutdown::running_call_of`.
    rt: *const (),
}

/// Runs the call at `data` on the helper thread.
///
/// # Safety
/// `data` is a `Call<F, T>` whose owner waits until `done` before touching it again or freeing
/// it; called once.
unsafe fn run_call<F: FnOnce() -> T, T>(data: *const ()) {
    // SAFETY: see the function's contract.
    let call = unsafe { &*data.cast::<Call<F, T>>() };
    // SAFETY: the owner does not touch `f` or `out` until `done`, and this runs once.
    let f = unsafe { (*call.f.get()).take() }.expect("a blocking call runs once");
    let r = crate::scheduler::shutdown::running_call_of(call.rt, || catch_unwind(AssertUnwindSafe(f)));
    // SAFETY: as above.
    unsafe { *call.out.get() = Some(r) };
    // After the store of `done` the owner may free `call`: take what the wake-up needs first.
    let waiter = call.waiter.clone();
    call.done.store(true, Ordering::Release);
    waiter.unpark();
}

/// Queues `task` for a helper, starting one if none is idle. Errs (with the task taken back)
/// when every helper up to `MAX_HELPERS` is busy, or none exists and none can be started: the
/// caller then runs it on its own carrier, compensated. Queued behind busy helpers, calls that
/// wait for one another never ran: 300 fibers in `vt::blocking(|| barrier.wait())` on a
/// barrier of 300 waited for ever, silently, with 256 helpers in the barrier.
fn submit(task: Task) -> Result<(), ()> {
    let mut p = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let forks = crate::platform::forks();
    if p.forks != forks {
        // A child process after `fork`: the helpers (and the calls they ran) were the parent's.
        *p = Pool { queue: VecDeque::new(), threads: 0, idle: 0, forks };
    }
    let data = task.data;
    p.queue.push_back(task);
    if p.idle >= p.queue.len() {
        WORK.notify_one();
        return Ok(());
    }
    if p.threads >= MAX_HELPERS {
        p.queue.retain(|t| t.data != data);
        return Err(());
    }
    p.threads += 1;
    drop(p);
    let started =
        crate::platform::fork::spawn(std::thread::Builder::new().name("vt-blocking".into()), helper);
    if started.is_err() {
        let mut p = POOL.lock().unwrap_or_else(|e| e.into_inner());
        p.threads -= 1;
        if p.threads == 0 {
            // Nobody would run it.
            p.queue.retain(|t| t.data != data);
            return Err(());
        }
    }
    Ok(())
}

/// A helper thread's body: run queued calls; exit after `IDLE_EXIT` without any.
fn helper() {
    // Started from a carrier, which may be pinned: the call must not share its CPU.
    crate::platform::thread::unpin_current();
    let mut p = POOL.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if let Some(t) = p.queue.pop_front() {
            drop(p);
            // SAFETY: `Task`s are built by `blocking` from a `Call` that waits for this run.
            unsafe { (t.run)(t.data) };
            p = POOL.lock().unwrap_or_else(|e| e.into_inner());
            continue;
        }
        p.idle += 1;
        let (q, timeout) = WORK.wait_timeout(p, IDLE_EXIT).unwrap_or_else(|e| e.into_inner());
        p = q;
        p.idle -= 1;
        if timeout.timed_out() && p.queue.is_empty() {
            p.threads -= 1;
            return;
        }
    }
}

/// `let text = vt::blocking(|| legacy_client.fetch(&key))?;`
///
/// Runs `f`, a call that blocks its OS thread (a blocking syscall, a foreign library, a
/// `std::sync::Mutex` held elsewhere, `std::thread::sleep`), without blocking the caller's
/// carrier: called from a fiber, `f` runs on a helper thread while the fiber parks, so the other
/// fibers of its carrier keep running. `f` may borrow from the caller. A panic in `f` resumes
/// in the caller. From a plain thread it just runs `f`.
///
/// Helper threads come from a process-wide pool: started on demand and ended after 10 s without
/// work. At most 256 run at once; a call beyond that blocks its own carrier, for which the
/// runtime compensates with another (within `max_carriers`).
#[track_caller]
pub fn blocking<F, T>(f: F) -> T
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    let c = crate::scheduler::carrier::here();
    let rec = context::current_fiber();
    if c.is_null() || rec.is_null() || std::thread::panicking() {
        return f();
    }
    let call = Call {
        f: UnsafeCell::new(Some(f)),
        out: UnsafeCell::new(None),
        done: AtomicBool::new(false),
        waiter: crate::fiber::handle::current(),
        // SAFETY: `c` is non-null: this thread's live carrier.
        rt: std::ptr::from_ref(unsafe { (*c).shared() }).cast(),
    };
    if submit(Task { run: run_call::<F, T>, data: (&raw const call).cast() }).is_err() {
        // Every helper is busy, or none could be started (out of threads): block this carrier
        // instead, as a known-blocking fiber does, compensated at once (within `max_carriers`;
        // past it the supervisor says so: `arch/supervisor.md`, "The bound full").
        // SAFETY: the task was taken back: nobody else touches `call`.
        let f = unsafe { (*call.f.get()).take() }.expect("not run");
        return crate::scope::blocking_here(Location::caller(), f);
    }
    // The helper writes into this frame (the closure's borrows, `out`) while the fiber parks.
    let _lent = crate::fiber::compact::Lent::new();
    // Unwound from the park (the runtime's drop), the frame still outlives the helper's run.
    let _wait = WaitOnUnwind::new(WaitReason::Blocking, || call.done.load(Ordering::Acquire));
    // A stop request waits for the closure, which cannot be stopped (ADR 0004): the wait is
    // shielded, and the fiber stops after it, its result dropped.
    crate::fiber::cancel::shielded(|| {
        while !call.done.load(Ordering::Acquire) {
            park_for(WaitReason::Blocking, None);
        }
    });
    // SAFETY: `done` was seen with Acquire: the helper stored the result and is done with it.
    let out = unsafe { (*call.out.get()).take() }.expect("a finished blocking call has a result");
    crate::fiber::stop::check_cancelled();
    match out {
        Ok(v) => v,
        Err(p) => resume_unwind(p),
    }
}
