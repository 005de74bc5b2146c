//! A runtime's drop: stop the carriers, then unwind every fiber that has not finished, each
//! started fiber on its home carrier's thread, before that thread exits.
//!
//! A started fiber may hold a reference into its home thread's thread-locals across a park
//! (that is what the default, non-migrating runtime allows); unwinding it on another thread
//! would run its destructors against the wrong thread's slots, or against the freed slots of a
//! carrier thread that has exited. So the carriers do not exit at shutdown: each leaves its
//! loop, hands its queues to the injector and then *serves*: it unwinds the fibers the dropping
//! thread (the coordinator) hands it, until told to exit.
//!
//! ```text
//!  coordinator                                   carrier i (serving)
//!  live fibers, deepest first, by depth:
//!    home i  ──► requests[i] ─────────────────►  pop, cancel(f) on this thread, outstanding -= 1
//!    no home ──► cancel(f) here (unstarted, or a migrating runtime's)
//!    wait until outstanding == 0, next depth
//!  repeat until no live fiber is left; exit = true; join the carriers
//! ```
//! The deepest fibers go first, so a fiber whose frame others borrow (`scope`, `join`,
//! `block_on`) is unwound after them (bug 11 in `arch/reliability.md`). A fiber that waits
//! while it unwinds (a destructor that joins, a `scope` whose fibers are not done) unwinds
//! others from its wait (`cancel_one`): a carrier those handed to it, the coordinator unhomed
//! ones. If that wait needs a fiber not yet handed out (a later depth), the stuck side
//! *escalates*: every live fiber is handed out at once. See `arch/scheduler.md` "Shutdown".

use std::cell::Cell;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, MutexGuard};

use crate::loom::StdMutex as Mutex;
use std::time::{Duration, Instant};

use crate::fiber::context;
use crate::fiber::{DONE, FiberRecord, FiberRef, NO_HOME};
use crate::scheduler::Shared;

/// How long the coordinator lets a depth's unwinds make no progress while some carrier is
/// stuck in a wait before it hands out every live fiber (`escalate`).
const STUCK: Duration = Duration::from_millis(50);

/// How long the drop waits for carriers still in a fiber's OS call before it says so.
const DROP_WAITS: Duration = Duration::from_secs(2);

/// The hand-over between the dropping thread and the serving carriers.
#[derive(Default)]
pub(crate) struct Drain {
    state: Mutex<DrainState>,
    cv: Condvar,
    /// The carriers have exited and the drop empties the queues: whatever is queued after this
    /// is set, no carrier will ever take (`Shared::schedule_spawned_remote`).
    queues_orphaned: AtomicBool,
}

impl Drain {
    /// Whether a fiber queued just now might never be taken by anyone (see `queues_orphaned`).
    /// No fence needed: the drop sets the flag, then takes every injector shard's lock to empty
    /// it (`drain_queues`, `Injector::pop_any`). Either it locked the spawner's shard after the
    /// push (and unwinds the fiber), or before it, and then its unlock, and so its store of the
    /// flag, happened before the spawner's lock, and this load sees the flag. (A new fiber has
    /// no home yet, so a spawn from outside the carriers always queues it in the injector.)
    pub(crate) fn queues_orphaned(&self) -> bool {
        self.queues_orphaned.load(Ordering::Acquire)
    }
}

#[derive(Default)]
struct DrainState {
    /// Per carrier slot: fibers to unwind there, in order.
    requests: Vec<VecDeque<FiberRef>>,
    /// Requests handed out and not yet done.
    outstanding: usize,
    /// Carrier threads that have left their loop and serve.
    serving: usize,
    /// Per carrier slot: it waits, inside an unwind, for something it was not handed.
    stuck: Vec<bool>,
    last_escalation: Option<Instant>,
    exit: bool,
}

impl Drain {
    fn lock(&self, slots: usize) -> MutexGuard<'_, DrainState> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.requests.len() < slots {
            s.requests.resize_with(slots, VecDeque::new);
            s.stuck.resize(slots, false);
        }
        s
    }

    fn wait<'a>(&self, s: MutexGuard<'a, DrainState>, t: Duration) -> MutexGuard<'a, DrainState> {
        // The drop's own wait, even from inside another runtime's fiber: never a hooked park.
        #[cfg(all(feature = "hooks", not(loom)))]
        let _off = crate::loom::HooksOff::enter();
        self.cv.wait_timeout(s, t).unwrap_or_else(|e| e.into_inner()).0
    }
}

thread_local! {
    /// On a `vt::blocking` helper, the runtime whose fiber waits for the call it runs now.
    static CALL_OF: Cell<*const ()> = const { Cell::new(std::ptr::null()) };
}

/// Runs `f`, a `vt::blocking` call of a fiber of the runtime at `rt` (its `Shared`), on a
/// helper thread: that runtime's drop from inside `f` is a drop from inside its fiber, and must
/// not wait for that fiber, which waits for `f` to return (`called_from_a_fiber_of`).
pub(crate) fn running_call_of<R>(rt: *const (), f: impl FnOnce() -> R) -> R {
    let outer = CALL_OF.replace(rt);
    let r = f();
    CALL_OF.set(outer);
    r
}

/// Whether this thread runs a fiber of `rt` (it is one of its carriers) or a `vt::blocking`
/// call of one: its drop cannot wait here for its fibers to end.
pub(crate) fn called_from_a_fiber_of(rt: &Shared) -> bool {
    let me = crate::scheduler::carrier::here();
    // SAFETY: a non-null carrier pointer is this thread's live carrier.
    let on_carrier = !me.is_null() && std::ptr::eq(unsafe { (*me).shared() }, rt);
    on_carrier || std::ptr::eq(CALL_OF.get(), std::ptr::from_ref(rt).cast())
}

/// Carrier `index`'s thread after its loop: unwinds what the coordinator hands it until told to
/// exit. Called with no carrier set on the thread (`carrier::here()` is null), so that what
/// an unwinding fiber wakes or spawns goes to the shared queues, which the coordinator drains.
pub(crate) fn serve(rt: &Shared, index: usize) {
    let d = &rt.drain;
    let mut s = d.lock(rt.started());
    s.serving += 1;
    d.cv.notify_all();
    loop {
        if let Some(f) = s.requests[index].pop_front() {
            s.stuck[index] = false;
            drop(s);
            cancel(f);
            s = d.lock(rt.started());
            s.outstanding -= 1;
            d.cv.notify_all();
            continue;
        }
        if s.exit {
            return;
        }
        s = d.wait(s, Duration::from_secs(1));
    }
}

/// The dropping thread's part: every carrier thread in `threads` has been told to stop (and
/// `shutdown` is set). Waits for them to serve, unwinds every unfinished fiber, lets them exit
/// and joins them, then drops what the queues still hold.
pub(crate) fn run(rt: &Shared, threads: Vec<std::thread::JoinHandle<()>>) {
    await_serving(rt, threads.len(), false);
    cancel_all(rt);
    let d = &rt.drain;
    d.lock(rt.started()).exit = true;
    d.cv.notify_all();
    for t in threads {
        let _ = t.join();
    }
    d.queues_orphaned.store(true, Ordering::Release);
    drain_queues(rt);
    for slot in rt.slots.iter() {
        // Timer entries hold records, which hold the runtime: break the cycle.
        slot.timers.lock().unwrap_or_else(|e| e.into_inner()).clear();
        slot.next_deadline.store(u64::MAX, Ordering::Relaxed);
    }
}

/// Waits until `carriers` carrier threads serve: each does once the fiber it runs (if any) has
/// switched out. With `self_wait`, returns false instead if one of them is blocked in the OS
/// joining the calling thread (a fiber called `join` on the std thread that drops the
/// runtime): that carrier serves only after this thread has exited.
pub(crate) fn await_serving(rt: &Shared, carriers: usize, self_wait: bool) -> bool {
    let d = &rt.drain;
    let mut s = d.lock(rt.started());
    let (start, mut said) = (Instant::now(), false);
    while s.serving < carriers {
        s = d.wait(s, Duration::from_millis(if self_wait { 20 } else { 100 }));
        if !said && s.serving < carriers && start.elapsed() >= DROP_WAITS {
            // A wait this thread cannot see (a std channel or lock the fiber waits on, fed or
            // held by this thread) never ends: say so, rather than hang without a word.
            said = true;
            crate::scheduler::diagnostics::report_drop_waits(rt, start.elapsed());
        }
        if self_wait && s.serving < carriers {
            drop(s);
            let joined = (0..rt.started()).any(|i| {
                let tid = rt.slots[i].tid.load(Ordering::Relaxed);
                tid != 0 && crate::platform::thread::joins_me(tid)
            });
            if joined {
                return false;
            }
            s = d.lock(rt.started());
        }
    }
    true
}

/// The carrier a started fiber must be unwound on, if any.
fn home_of(f: &FiberRecord) -> Option<usize> {
    let home = f.home.load(Ordering::Relaxed);
    (f.started.get() && home != NO_HOME).then_some(home)
}

/// Unwinds every live fiber, the deepest first, one depth at a time: the started ones on their
/// home carriers, the others here. Cancelling one may wake or spawn others (its destructors
/// run), so repeat until nothing is left.
fn cancel_all(rt: &Shared) {
    let d = &rt.drain;
    let mut live = Vec::new();
    loop {
        rt.roots.for_each_live(|f| live.push(f));
        if live.is_empty() {
            break;
        }
        live.sort_by_key(|f| std::cmp::Reverse(f.depth.get()));
        let progress = live.iter().any(|f| f.state() != DONE && !f.cancelled.load(Ordering::Acquire));
        if !progress {
            break; // only fibers being unwound further up some stack: none at the top
        }
        let mut rest = &live[..];
        while let Some(first) = rest.first() {
            let depth = first.depth.get();
            let n = rest.iter().take_while(|f| f.depth.get() == depth).count();
            let (level, tail) = rest.split_at(n);
            rest = tail;
            let mut here = Vec::new();
            {
                let mut s = d.lock(rt.started());
                for f in level {
                    match home_of(f) {
                        Some(i) => {
                            s.requests[i].push_back(f.clone());
                            s.outstanding += 1;
                        }
                        None => here.push(f.clone()),
                    }
                }
            }
            d.cv.notify_all();
            for f in here {
                cancel(f);
            }
            wait_for_carriers(rt);
        }
        live.clear();
    }
}

/// Waits until the carriers have unwound everything handed to them; escalates when they are
/// stuck.
fn wait_for_carriers(rt: &Shared) {
    let d = &rt.drain;
    let mut s = d.lock(rt.started());
    let mut last = (s.outstanding, Instant::now());
    while s.outstanding > 0 {
        s = d.wait(s, Duration::from_millis(10));
        if s.outstanding != last.0 {
            last = (s.outstanding, Instant::now());
        } else if last.1.elapsed() >= STUCK && s.stuck.iter().any(|&b| b) {
            drop(s);
            escalate(rt);
            s = d.lock(rt.started());
            last = (s.outstanding, Instant::now());
        }
    }
}

/// Hands every live fiber not yet being unwound to its home carrier (at most once per `STUCK`):
/// some unwind waits for one that its depth had not reached. A fiber handed out twice is
/// unwound once (`cancel` skips it the second time).
fn escalate(rt: &Shared) {
    let d = &rt.drain;
    let mut s = d.lock(rt.started());
    if s.last_escalation.is_some_and(|t| t.elapsed() < STUCK) {
        return;
    }
    s.last_escalation = Some(Instant::now());
    drop(s);
    let mut homed = Vec::new();
    rt.roots.for_each_live(|f| {
        if !f.cancelled.load(Ordering::Acquire) {
            if let Some(i) = home_of(&f) {
                homed.push((i, f));
            }
        }
    });
    homed.sort_by_key(|(_, f)| std::cmp::Reverse(f.depth.get()));
    let mut s = d.lock(rt.started());
    for (i, f) in homed {
        s.requests[i].push_back(f);
        s.outstanding += 1;
    }
    drop(s);
    d.cv.notify_all();
}

/// Unwinds one more fiber of a runtime being dropped, from inside a fiber being unwound that
/// waits for another (a `scope` waiting for its fibers, a `join`): waiting cannot work there,
/// since nothing runs fibers any more. On a carrier's thread, one handed to it; on the
/// dropping thread, an unhomed one. False when there is none (the caller sleeps a little and
/// looks again); the side that waits then lets the other hand out everything (`escalate`).
pub(crate) fn cancel_one(rt: &Shared) -> bool {
    let me = context::cancelling();
    // SAFETY: the fiber this thread is unwinding: live while it unwinds.
    let here = (!me.is_null()).then(|| home_of(unsafe { &*me })).flatten();
    let d = &rt.drain;
    match here {
        Some(i) => {
            let mut s = d.lock(rt.started());
            let Some(f) = s.requests[i].pop_front() else {
                s.stuck[i] = true;
                d.cv.notify_all();
                return false;
            };
            drop(s);
            cancel(f);
            let mut s = d.lock(rt.started());
            s.outstanding -= 1;
            d.cv.notify_all();
            true
        }
        None => {
            let mut next: Option<FiberRef> = None;
            rt.roots.for_each_live(|f| {
                let deeper = next.as_ref().is_none_or(|n| f.depth.get() > n.depth.get());
                if deeper && !f.cancelled.load(Ordering::Acquire) && home_of(&f).is_none() {
                    next = Some(f);
                }
            });
            match next {
                Some(f) => {
                    cancel(f);
                    true
                }
                None => {
                    escalate(rt);
                    false
                }
            }
        }
    }
}

/// After the carriers exited: drop the queues' references (to finished fibers, or to ones
/// spawned through a handle during the drop, unwound here: never started, so anywhere will do).
fn drain_queues(rt: &Shared) {
    loop {
        let next = rt.injector.pop_any().or_else(|| {
            rt.slots.iter().find_map(|slot| {
                // One for this round; the rest back, in order (unwinding it may queue more).
                let mut all = slot.inbox.take_all();
                let f = all.next();
                all.for_each(|g| slot.inbox.push(g));
                f
            })
        });
        match next {
            Some(f) => cancel(f),
            None => return,
        }
    }
}

/// Unwinds one unfinished fiber: a started one by forcing an unwind from where it stopped, an
/// unstarted one by running its body in "cancelled" mode. Called on the fiber's home carrier's
/// thread for a started fiber with a home, anywhere for the others.
pub(crate) fn cancel(f: FiberRef) {
    if f.state() == DONE || f.cancelled.swap(true, Ordering::AcqRel) {
        return; // finished, or being unwound further up some stack
    }
    f.runtime().remote.finished.fetch_add(1, Ordering::Relaxed);
    // A parked fiber holds its run reference (`FiberRef::take_parked_ref`). Moving it to
    // runnable here takes that reference over, and leaves any unpark that comes during the
    // unwind (another fiber's destructor) a token rather than a fiber to queue.
    // SAFETY: `notify` returned true: we moved it from parked to runnable.
    let run = f.notify().then(|| unsafe { FiberRef::take_parked_ref(&f) });
    if f.take_compacted() {
        // Its stack must be back in place before the unwind runs on it.
        // SAFETY: no carrier runs fibers any more and the supervisor (the compactor) has
        // stopped; the swap of `cancelled` above lets one caller through per fiber.
        let bytes = unsafe { f.restore_stack() };
        let remote = &f.runtime().remote;
        remote.restores.fetch_add(1, Ordering::Relaxed);
        remote.restored_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }
    let outer = context::cancelling();
    context::set_cancelling(FiberRef::as_ptr(&f));
    // SAFETY: no carrier runs fibers any more (they serve, or have exited), and the swap of
    // `cancelled` above lets one caller through per fiber, on whichever thread: this thread has
    // exclusive access.
    let slot = unsafe { f.co_mut() };
    if !f.started.replace(true) {
        // Never ran: bind a stack so its body can drop the closure (destructors run in fiber
        // context) and complete its packet; without a stack, `bind` completes it with the error.
        // SAFETY: exclusive access, as above.
        unsafe { f.bind(f.class().take().map(crate::fiber::coroutine::new_coroutine)) };
    } else if let Some(co) = slot.as_mut() {
        // Resumes the fiber with corosensei's unwind payload; the fiber's body catches it
        // (after every destructor on the way ran), completes its packet and returns.
        if catch_unwind(AssertUnwindSafe(|| co.force_unwind())).is_err() {
            panicked_while_cancelled(&f);
        }
    }
    if let Some(co) = slot.as_mut().filter(|co| !co.done()) {
        // Bound but not started: its body sees `cancelled` and only drops the closure.
        if catch_unwind(AssertUnwindSafe(|| co.resume(FiberRef::as_ptr(&f)))).is_err() {
            panicked_while_cancelled(&f);
        }
    }
    context::set_cancelling(outer);
    if let Some(co) = slot.take() {
        if co.done() {
            drop(co.into_stack());
        } else {
            // It could not be unwound (it caught the unwind and kept parking): leaking its
            // stack is the only sound choice left.
            eprintln!(
                "virtual-threads: fiber {:?} could not be unwound by its runtime's drop; its stack is left allocated",
                f.id()
            );
            std::mem::forget(co);
        }
    }
    FiberRecord::finish_now(&f);
    drop(run);
}

/// A panic escaped fiber `f`'s body while its runtime's drop unwound it, outside any unwind (a
/// destructor that panics during the unwind aborts the process before this: the panic hook
/// names the fiber then). Caught: the drop goes on with the other fibers.
#[cold]
fn panicked_while_cancelled(f: &FiberRecord) {
    let name = f.name().map(|n| format!(" {n:?}")).unwrap_or_default();
    eprintln!(
        "virtual-threads: fiber {}{name} (spawned at {}) panicked while its runtime's drop unwound \
         it; the panic is dropped and the drop goes on",
        f.id(),
        f.spawned_at()
    );
}
