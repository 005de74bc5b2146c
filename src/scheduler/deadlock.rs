//! The deadlock report: once every carrier of a runtime has been idle for the quiet period, the
//! supervisor asks whether anything could still wake one of its fibers, and says so once if not.
//!
//! A fiber may wait on another runtime of the process (`block_on` on it, a join of one of its
//! fibers, a channel one of its fibers feeds), and nothing in the wait says which: a runtime
//! can be woken by every other one. So the report needs the whole process asleep: every live
//! runtime (they register here when they start, and leave when their drop begins) must have
//! nothing that can wake a fiber, not only the one whose supervisor checks. A runtime that
//! never goes quiet thus hides another's deadlock: a missed report, never a false one (which
//! `VT_DEADLOCK_ABORT` turns into an abort). See `arch/diagnostics.md`.

use crate::loom::StdMutex as Mutex;
use std::sync::atomic::Ordering;

use super::Shared;
use super::diagnostics::{FiberDump, FiberState, collect};
use crate::fiber::schedule::RuntimeRef;
use crate::fiber::wait::PLAIN_IN_VT;

/// Every runtime of the process whose drop has not begun, with the fork count it was built
/// under (one built before a `fork` has no threads in the child, and wakes nobody there).
static LIVE: Mutex<Vec<(RuntimeRef, u64)>> = Mutex::new(Vec::new());

/// A supervisor may hold the list's lock (`check_deadlock`) when another thread forks: the
/// child's first runtime would wait for ever to register. Only per-runtime locks are taken under
/// it, so it is a leaf among the locks held across a fork.
fn hold_live_across_fork() {
    crate::platform::fork::hold_across_fork(|| Box::new(LIVE.lock().unwrap_or_else(|e| e.into_inner())));
}
crate::platform::fork::at_load!(hold_live_across_fork);

/// A runtime has started: from now on it may wake the fibers of the others.
pub(crate) fn register(rt: &RuntimeRef) {
    LIVE.lock().unwrap_or_else(|e| e.into_inner()).push((rt.clone(), crate::platform::forks()));
}

/// A runtime's drop has begun: its supervisor is stopped, and what its unwinding fibers wake
/// is not a fiber that could have run on.
pub(crate) fn unregister(rt: &Shared) {
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    let gone = live.iter().position(|(r, _)| std::ptr::eq(r.ptr(), rt)).map(|i| live.swap_remove(i));
    drop(live);
    // Its reference may be the last: released outside the lock.
    drop(gone);
}

/// The supervisor found every carrier of `rt` idle for the quiet period: decide whether nothing
/// the process's runtimes know of can wake any fiber of `rt`, and report once if so. Returns
/// whether it reported.
///
/// What can wake a parked fiber, and how each is ruled out:
/// - a carrier running or a fiber runnable: every carrier idle, every queue empty, no
///   switch during the quiet period (the caller checked progress);
/// - a timer: every timer heap empty (sleeps and timed waits arm one);
/// - I/O: no fiber parked on a socket (a peer may still write to it);
/// - a carrier blocked in the OS: none counted as blocked;
/// - a plain thread inside a `vt` call: `PLAIN_IN_VT` is zero;
/// - another runtime: each of the above holds for every live runtime too.
///
/// What cannot be known: a plain thread outside any `vt` call that holds a `Sender`, a `Fiber`
/// handle or a lock guard and will use it later. Hence "possible" and the quiet period.
pub(crate) fn check_deadlock(rt: &Shared) -> bool {
    if !rt.config.fiber_roots || PLAIN_IN_VT.load(Ordering::SeqCst) > 0 {
        return false;
    }
    let Some(dump) = asleep(rt) else { return false };
    if dump.is_empty() {
        return false;
    }
    {
        // Held while the others are looked at: a runtime unregisters (its drop begins) only
        // after, so none is freed under the look.
        let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        let forks = crate::platform::forks();
        let awake = |(other, built): &(RuntimeRef, u64)| {
            *built == forks && !std::ptr::eq(other.ptr(), rt) && asleep(other).is_none()
        };
        if live.iter().any(awake) {
            return false;
        }
    }
    // The walks took time: make sure nothing moved meanwhile.
    if PLAIN_IN_VT.load(Ordering::SeqCst) > 0 || rt.earliest_deadline() != u64::MAX {
        return false;
    }
    eprintln!(
        "virtual-threads: possible deadlock: all fibers are asleep.\n\
         Every fiber of this runtime has been parked for at least {} ms, and nothing the runtime \
         knows of can wake one: no timer, no socket, no carrier or plain thread inside a vt call, \
         and no other runtime with work that could. (A plain thread that holds a Sender, a Fiber \
         handle or a lock guard and uses it later is invisible to the runtime: if that is the \
         case, this report is a false alarm; runtime::Builder::deadlock_report sets the quiet \
         period or turns the report off.)\n{dump}",
        rt.config.deadlock_report.unwrap_or_default().as_millis(),
    );
    #[cfg(feature = "tracing")]
    tracing::error!(target: "virtual_threads", fibers = dump.len(), "possible deadlock: all fibers are asleep");
    if std::env::var_os("VT_DEADLOCK_ABORT").is_some_and(|v| v != "0") {
        eprintln!("virtual-threads: VT_DEADLOCK_ABORT is set; aborting");
        std::process::abort();
    }
    true
}

/// The dump of `rt`'s fibers if none of them can be woken by anything `rt` knows of (see
/// `check_deadlock`); `None` if one can, or if it cannot tell (fiber roots off).
fn asleep(rt: &Shared) -> Option<FiberDump> {
    if !rt.config.fiber_roots || rt.blocked.load(Ordering::SeqCst) > 0 || rt.is_shut_down() {
        return None;
    }
    let started = rt.started();
    if rt.idle.sleeping_count() < rt.active.load(Ordering::SeqCst)
        || rt.slots.upto(started).any(|s| {
            !s.location.load(Ordering::SeqCst).is_null()
                || s.home_len.load(Ordering::Relaxed) > 0
                || !s.inbox.is_empty()
                || !s.stealer.is_empty()
        })
        || !rt.injector.is_empty()
        || rt.earliest_deadline() != u64::MAX
    {
        return None;
    }
    let dump = collect(rt);
    let wakeable = dump.fibers().iter().any(|f| match f.state {
        FiberState::Parked { reason, timed } => timed || reason.is_io(),
        _ => true,
    });
    (!wakeable).then_some(dump)
}
