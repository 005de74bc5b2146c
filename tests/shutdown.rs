//! Dropping a runtime, and the hangs around it (`arch/scheduler.md`, "Shutdown"):
//!
//! - a started fiber is unwound on its home carrier's thread, before that thread exits, so a
//!   thread-local it holds across a park is still its own (`arch/scheduler.md` "Shutdown");
//! - a fiber whose stack is lent (`block_on` on another runtime, `ThreadPool::scope` on a pool
//!   of another runtime) is never unwound while the work that borrows from it may still run;
//! - `Handle::spawn` after the drop, a drop from inside one of the runtime's own fibers, a
//!   `fork`, and a fiber woken by a fiber that never yields: none of them hangs.
//!
//! Cases that may crash run in a child copy of this test binary (`tests/faults.rs`'s pattern).

use std::cell::{Cell, Ref, RefCell};
use std::panic::{self, AssertUnwindSafe};
use std::process::Output;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use virtual_threads as vt;

mod common;
use common::{block_in_os, within};

const CHILD: &str = "VT_SHUTDOWN_CHILD";
/// Generous bound for anything that must not hang (a debug build on a loaded 2-core machine).
const LIMIT: Duration = Duration::from_secs(30);

fn child_case() -> Option<String> {
    std::env::var(CHILD).ok()
}

/// Runs `test` again in a child copy of this binary with `VT_SHUTDOWN_CHILD=case`.
fn run_child(test: &str, case: &str) -> Output {
    common::rerun_self(test, CHILD, case).output().expect("re-exec the test binary")
}

/// Asserts that a child copy of the test exited successfully after printing "child: ok".
fn child_ok(out: &Output) -> String {
    common::child_output(out, "child: ok").1
}

fn rt(carriers: usize) -> vt::Runtime {
    // No deadlock report: the fibers here park until the drop on purpose.
    vt::Runtime::builder().carriers(carriers).deadlock_report(None).build().unwrap()
}

// ---- A: unwound at home --------------------------------------------------------------------

thread_local! {
    static SLOTS: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    static DROPS: Cell<u64> = const { Cell::new(0) };
}

/// Holds a borrow of its carrier's thread-local across parks; its destructor gives it back,
/// writes into the thread-local and records the thread it ran on.
struct AtHome<'a> {
    held: Option<Ref<'a, Vec<u64>>>,
    home: ThreadId,
    log: Arc<Mutex<Vec<(ThreadId, ThreadId)>>>,
}

impl Drop for AtHome<'_> {
    fn drop(&mut self) {
        // Both write into the thread's thread-local storage: the home thread's, still alive.
        self.held.take();
        DROPS.with(|d| d.set(d.get() + 1));
        self.log.lock().unwrap().push((self.home, std::thread::current().id()));
    }
}

/// Fibers holding a `thread_local!` `RefCell` borrow across a park while their runtime is
/// dropped: each destructor runs once, on the fiber's home thread (before the fix the dropping
/// thread ran them, writing into the exited carrier threads' freed thread-local storage).
#[test]
fn started_fibers_are_unwound_on_their_home_carrier_thread() {
    if child_case().is_none() {
        child_ok(&run_child("started_fibers_are_unwound_on_their_home_carrier_thread", "home"));
        return;
    }
    const N: usize = 64;
    let rt = rt(2);
    let log = Arc::new(Mutex::new(Vec::new()));
    let parked = Arc::new(AtomicUsize::new(0));
    for _ in 0..N {
        let (log, parked) = (log.clone(), parked.clone());
        rt.spawn(move || {
            SLOTS.with(|cell| {
                let _held = AtHome { held: Some(cell.borrow()), home: std::thread::current().id(), log };
                parked.fetch_add(1, SeqCst);
                loop {
                    vt::park();
                }
            })
        });
    }
    let t = Instant::now();
    while parked.load(SeqCst) < N {
        assert!(t.elapsed() < LIMIT, "fibers never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(rt);
    let log = log.lock().unwrap();
    assert_eq!(log.len(), N, "each destructor ran once");
    for (home, ran) in log.iter() {
        assert_eq!(home, ran, "a destructor ran away from its fiber's home thread");
    }
    println!("child: ok");
}

// ---- B: lent stacks ------------------------------------------------------------------------

/// A fiber of `r1` lends its stack to work on `r2` (through `lend`), and main drops `r1` while
/// that work still reads the borrowed `Vec`: the drop waits for it, and it reads every element
/// (before the fix the waiting fiber was unwound, its `Vec` freed and its stack released under
/// the running closure: SIGSEGV or garbage).
fn lent_stack_survives_the_drop(lend: fn(&vt::Handle, &[u64], &mpsc::Sender<u64>, &mpsc::Sender<()>)) {
    let r1 = rt(1);
    let r2 = rt(1);
    let h2 = r2.handle();
    let (sum_tx, sum_rx) = mpsc::channel::<u64>();
    let (started_tx, started_rx) = mpsc::channel::<()>();
    r1.spawn(move || {
        let data: Vec<u64> = (1..=10_000).collect();
        lend(&h2, &data, &sum_tx, &started_tx);
    });
    started_rx.recv_timeout(LIMIT).expect("the lent work started");
    let t = Instant::now();
    drop(r1);
    assert_eq!(
        sum_rx.try_recv(),
        Ok((1..=10_000u64).sum::<u64>()),
        "the drop returned (after {:?}) before the work that borrows the fiber's stack finished, \
         or that work read freed memory",
        t.elapsed()
    );
    drop(r2);
}

/// The work: tell main it started, wait a while (main drops the lender's runtime meanwhile),
/// then read every element of the borrowed slice.
fn slow_sum(data: &[u64], sum: &mpsc::Sender<u64>, started: &mpsc::Sender<()>) {
    started.send(()).unwrap();
    vt::sleep(Duration::from_millis(300));
    sum.send(data.iter().sum()).unwrap();
}

#[test]
fn a_fiber_in_block_on_of_another_runtime_is_not_freed_under_the_closure() {
    if child_case().is_none() {
        child_ok(&run_child("a_fiber_in_block_on_of_another_runtime_is_not_freed_under_the_closure", "b"));
        return;
    }
    lent_stack_survives_the_drop(|h2, data, sum, started| h2.block_on(|| slow_sum(data, sum, started)));
    println!("child: ok");
}

#[test]
fn a_fiber_in_a_pool_scope_of_another_runtime_is_not_freed_under_its_jobs() {
    if child_case().is_none() {
        child_ok(&run_child("a_fiber_in_a_pool_scope_of_another_runtime_is_not_freed_under_its_jobs", "b"));
        return;
    }
    lent_stack_survives_the_drop(|h2, data, sum, started| {
        let pool = vt::ThreadPoolBuilder::new().num_threads(2).handle(h2.clone()).build();
        pool.scope(|s| s.execute(|| slow_sum(data, sum, started)));
    });
    println!("child: ok");
}

// ---- D: hangs ------------------------------------------------------------------------------

#[test]
fn spawn_through_a_handle_after_the_drop_fails_its_join_at_once() {
    let rt = rt(1);
    let h = rt.handle();
    drop(rt);
    let r = within(LIMIT, "join of a fiber spawned after the drop", move || h.spawn(|| 7).join());
    assert!(r.is_err(), "a fiber spawned after its runtime's drop never runs: its join is an error");
}

#[test]
fn a_runtime_dropped_from_its_own_fiber_still_ends_every_other_fiber() {
    let rt = rt(2);
    let h = rt.handle();
    let (parked_tx, parked_rx) = mpsc::channel::<()>();
    let sleeper = {
        let parked_tx = parked_tx.clone();
        h.spawn(move || {
            parked_tx.send(()).unwrap();
            vt::sleep(Duration::from_secs(3600));
        })
    };
    let parker = h.spawn(move || {
        parked_tx.send(()).unwrap();
        loop {
            vt::park();
        }
    });
    parked_rx.recv_timeout(LIMIT).unwrap();
    parked_rx.recv_timeout(LIMIT).unwrap();
    let dropper = h.spawn(move || drop(rt));
    within(LIMIT, "joins of the fibers of a runtime dropped from inside", move || {
        assert!(sleeper.join().is_err(), "the sleeper was unwound");
        assert!(parker.join().is_err(), "the parked fiber was unwound");
        assert!(dropper.join().is_ok(), "the fiber that dropped its runtime finished");
    });
}

/// A fiber of `h` that sleeps for an hour, once it has started.
fn parked_sleeper(h: &vt::Handle) -> vt::JoinHandle<()> {
    let (parked_tx, parked_rx) = mpsc::channel::<()>();
    let sleeper = h.spawn(move || {
        parked_tx.send(()).unwrap();
        vt::sleep(Duration::from_secs(3600));
    });
    parked_rx.recv_timeout(LIMIT).unwrap();
    sleeper
}

/// A runtime dropped from a `vt::blocking` closure of one of its own fibers: the closure runs
/// on a helper thread, and the drop, waiting for every fiber, waited for the one that waits for
/// the closure (4 of 4 runs hung before). It is a drop from inside the fiber, and ends as one.
#[test]
fn a_runtime_dropped_from_its_own_fibers_blocking_closure_ends() {
    let rt = rt(1);
    let h = rt.handle();
    let sleeper = parked_sleeper(&h);
    let dropper = h.spawn(move || vt::blocking(move || drop(rt)));
    within(LIMIT, "a drop from a blocking closure of the runtime's own fiber", move || {
        assert!(sleeper.join().is_err(), "the sleeper was unwound");
        // The drop returned to the closure; its fiber then ended, or was unwound by the drop.
        let _ = dropper.join();
    });
}

/// A runtime dropped by a std thread that one of its fibers joins: the fiber's carrier waits in
/// the OS for the thread, and the thread waited for the carrier (it hung with no message
/// before). The drop sees that a carrier of its own waits for the dropping thread and goes on
/// without it, as a drop from inside a fiber does; the join returns.
#[test]
fn a_runtime_dropped_by_a_thread_its_fiber_joins_ends() {
    for carriers in [1, 2] {
        let rt = rt(carriers);
        let h = rt.handle();
        let sleeper = parked_sleeper(&h);
        let joiner = h.spawn(move || std::thread::spawn(move || drop(rt)).join().is_ok());
        within(LIMIT, "a drop by a thread that a fiber of the runtime joins", move || {
            assert!(sleeper.join().is_err(), "the sleeper was unwound");
            assert_eq!(joiner.join().ok(), Some(true), "the join of the dropping thread returned");
        });
    }
}

/// A drop that waits for a fiber blocked in the OS says so, naming where the fiber came from:
/// if that call waits for the dropping thread in a way the runtime cannot see, it never ends,
/// and a drop that hangs without a word was all a user saw before.
#[test]
fn a_drop_that_waits_for_a_fiber_blocked_in_the_os_says_so() {
    if child_case().is_none() {
        let stderr =
            child_ok(&run_child("a_drop_that_waits_for_a_fiber_blocked_in_the_os_says_so", "drop-waits"));
        assert!(
            stderr.contains("dropping a Runtime has waited") && stderr.contains("tests/shutdown.rs"),
            "no report naming the blocked fiber's spawn site: {stderr}"
        );
        return;
    }
    let rt = rt(1);
    let (tx, rx) = mpsc::channel::<()>();
    rt.spawn(move || {
        tx.send(()).unwrap();
        // Blocks the carrier in the OS past the report's threshold (2 s); with the `hooks`
        // feature a sleep would park the fiber instead, and the drop would unwind it without
        // waiting.
        block_in_os(Duration::from_secs(3));
    });
    rx.recv_timeout(LIMIT).unwrap();
    drop(rt);
    println!("child: ok");
}

#[test]
fn after_fork_the_default_runtime_starts_afresh_and_an_old_runtime_panics_naming_fork() {
    if child_case().is_none() {
        child_ok(&run_child(
            "after_fork_the_default_runtime_starts_afresh_and_an_old_runtime_panics_naming_fork",
            "fork",
        ));
        return;
    }
    assert_eq!(vt::spawn(|| 1).join().unwrap(), 1, "the default runtime runs in the parent");
    let old = rt(1);
    assert_eq!(old.block_on(|| 2), 2);
    // SAFETY: the child only spawns, joins and exits (`_exit`, no atexit handlers).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = panic::catch_unwind(AssertUnwindSafe(|| {
            if vt::spawn(|| 3).join().ok() != Some(3) {
                return 10;
            }
            let p = match panic::catch_unwind(AssertUnwindSafe(|| old.spawn(|| 4))) {
                Ok(_) => return 11,
                Err(p) => p,
            };
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            if !msg.contains("fork") {
                return 12;
            }
            0
        }))
        .unwrap_or(13);
        // SAFETY: ends the child at once, without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let t = Instant::now();
    let status = loop {
        let mut status = 0;
        // SAFETY: `pid` is our child; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break status;
        }
        if t.elapsed() > LIMIT {
            // SAFETY: `pid` is our child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the forked child hung");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(libc::WIFEXITED(status), "the child died: status {status:#x}");
    let code = libc::WEXITSTATUS(status);
    assert_eq!(
        code, 0,
        "10: the default runtime did not run a fiber; 11: the old runtime did not panic; 12: its panic did not name fork"
    );
    println!("child: ok");
}

/// A fiber that busy-loops without yielding (`try_send` in a loop) keeps waking a receiver;
/// the receiver must get to run on another carrier each time, not only the first time the
/// supervisor flags the busy carrier (before the fix, later hand-offs into the busy carrier's
/// hand-off slot woke no idle carrier: the receiver stayed runnable for ever in 2 of 6 runs).
#[test]
fn a_fiber_woken_by_a_busy_loop_runs_elsewhere() {
    for _ in 0..3 {
        // SAFETY: neither fiber holds a thread-local reference or a `!Send` value across a
        // switch point.
        let rt = unsafe { vt::Runtime::builder().carriers(2).migrate_started_fibers(true) }
            .deadlock_report(None)
            .build()
            .unwrap();
        const K: usize = 50;
        let (tx, rx) = vt::channel::bounded::<usize>(1);
        let done = Arc::new(AtomicBool::new(false));
        let receiver = {
            let done = done.clone();
            rt.spawn(move || {
                for _ in 0..K {
                    rx.recv().unwrap();
                }
                done.store(true, SeqCst);
            })
        };
        let busy = {
            let done = done.clone();
            rt.spawn(move || {
                let t = Instant::now();
                let mut i = 0;
                while !done.load(SeqCst) && t.elapsed() < LIMIT {
                    if tx.try_send(i).is_ok() {
                        i += 1;
                    }
                }
            })
        };
        within(LIMIT + Duration::from_secs(5), "the busy loop", move || busy.join().unwrap());
        assert!(done.load(SeqCst), "the receiver woken by the busy loop never got {K} messages");
        receiver.join().unwrap();
    }
}

// ---- E: fibers spawned onto a named carrier ----------------------------------------------------

/// Counts its drops: each closure it is captured in is dropped exactly once.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// Fibers spawned onto carrier 1 (`Handle::spawn_on_carrier`) while it is blocked in the OS,
/// then the runtime dropped: whether each had started or still waited in the carrier's inbox,
/// each is unwound once (its closure dropped), and every join returns an error. A spawn onto a
/// carrier after the drop fails its join at once, as `Handle::spawn` does.
#[test]
fn fibers_queued_for_a_blocked_carrier_are_unwound_by_the_drop() {
    const N: usize = 100;
    let rt = rt(2);
    let h = rt.handle();
    let (blocked_tx, blocked_rx) = mpsc::channel();
    let blocker = h
        .spawn_on_carrier(1, move || {
            blocked_tx.send(()).unwrap();
            // Without the `hooks` feature this blocks the carrier's thread, so the fibers below
            // wait in its inbox; with them it parks the fiber, and they may start: either way
            // the drop must unwind each of them once.
            std::thread::sleep(Duration::from_millis(200));
        })
        .unwrap();
    blocked_rx.recv_timeout(LIMIT).expect("the blocker started");
    let drops = Arc::new(AtomicUsize::new(0));
    let queued: Vec<_> = (0..N)
        .map(|_| {
            let c = Counted(drops.clone());
            h.spawn_on_carrier(1, move || {
                let _c = c;
                loop {
                    vt::park();
                }
            })
            .unwrap()
        })
        .collect();
    within(LIMIT, "the runtime's drop", move || drop(rt));
    assert_eq!(drops.load(SeqCst), N, "each closure dropped once");
    assert!(queued.into_iter().all(|j| j.join().is_err()), "each parked or queued fiber was unwound");
    let _ = blocker.join();
    let r = within(LIMIT, "join of a fiber spawned onto a carrier after the drop", move || {
        h.spawn_on_carrier(0, || 7).unwrap().join()
    });
    assert!(r.is_err());
}
