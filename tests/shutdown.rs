//! Dropping a runtime, and the hangs around it (issue 19, points 4 and 5):
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
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use virtual_threads as vt;

const CHILD: &str = "VT_SHUTDOWN_CHILD";
/// Generous bound for anything that must not hang (a debug build on a loaded 2-core machine).
const LIMIT: Duration = Duration::from_secs(30);

fn child_case() -> Option<String> {
    std::env::var(CHILD).ok()
}

/// Runs `test` again in a child copy of this binary with `VT_SHUTDOWN_CHILD=case`.
fn run_child(test: &str, case: &str) -> Output {
    Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, case)
        .output()
        .expect("re-exec the test binary")
}

/// Asserts that a child copy of the test exited successfully after printing "child: ok".
fn child_ok(out: &Output) -> String {
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && stdout.contains("child: ok"),
        "{}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    stderr.into_owned()
}

/// Runs `f` on a helper thread and fails the test if it has not returned within `limit`.
fn within<T: Send + 'static>(limit: Duration, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(panic::catch_unwind(AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => v,
        Ok(Err(p)) => panic::resume_unwind(p),
        Err(_) => panic!("{what} did not finish within {limit:?}"),
    }
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
