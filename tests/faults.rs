//! Fault injection: every way a user can make a fiber fail, every resource that can run out,
//! and dropping a runtime while its fibers wait on everything they can wait on.
//!
//! - panics: in a fiber's body (at its first run, after a park, inside `vt::blocking`,
//!   `vt::pinned`, nested spawns, `vt::join` and scopes), in a destructor (on a normal return,
//!   during unwinding: aborts like std, and reported naming the fiber when a stop unwinds it; a
//!   destructor that *waits* during unwinding), in a
//!   `fiber_local!` initialiser and destructor, and while holding a `vt::sync` lock (poisoning,
//!   with waiters parked on it);
//! - resources: fiber stacks (address space capped with `RLIMIT_AS`, also under fibers already
//!   queued: their joins fail and stderr says so) and file descriptors
//!   (`RLIMIT_NOFILE`): an `io::Error`, never a crash or a hang;
//! - runtime drop: fibers blocked in `vt::net` reads and accepts, channel and lock waits,
//!   `park`, `sleep`, a condvar, a semaphore, a join and `vt::blocking`: the drop returns, every
//!   destructor runs once, and the runtime's descriptors and threads are gone afterwards.
//!
//! Cases that abort or change process-wide limits run in a child copy of this test binary
//! (`tests/overflow.rs`'s pattern). Tests marked `#[ignore]` reproduce known bugs and pass
//! once the fix lands; `arch/reliability.md` lists them.

use std::io::{self, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::panic::{self, AssertUnwindSafe};
use std::process::Output;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, PoisonError, mpsc};
use std::time::{Duration, Instant};

use virtual_threads as vt;
use vt::channel::{self, TryRecvError};
use vt::sync::{Condvar, Mutex, RwLock, Semaphore, TryLockError};

mod common;
use common::within;

const CHILD: &str = "VT_FAULTS_CHILD";
/// Generous bound for anything that must not hang (a debug build on a loaded 2-core machine).
const LIMIT: Duration = Duration::from_secs(30);

fn rt(carriers: usize) -> vt::Runtime {
    vt::Runtime::builder().carriers(carriers).build().unwrap()
}

fn child_case() -> Option<String> {
    std::env::var(CHILD).ok()
}

/// Runs `test` again in a child copy of this binary with `VT_FAULTS_CHILD=case`.
fn run_child(test: &str, case: &str) -> Output {
    common::rerun_self(test, CHILD, case).arg("--include-ignored").output().expect("re-exec the test binary")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts that a child copy of the test exited successfully after printing "child: ok", and
/// returns its stdout.
fn child_ok(out: &Output) -> String {
    common::child_output(out, "child: ok").0
}

/// Polls `cond` (with a generous bound) for a state that has no event to wait on.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < LIMIT, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "<not a string>".into())
}

struct OnDrop(Arc<AtomicUsize>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

// ---- panics ------------------------------------------------------------------------------

#[derive(Debug, PartialEq)]
struct Payload(u32);

fn boom() -> u32 {
    panic!("boom")
}

#[test]
fn a_panic_anywhere_in_a_fiber_is_its_join_error_and_its_destructors_run() {
    type Body = Box<dyn FnOnce() + Send>;
    let cases: Vec<(&str, Body)> = vec![
        ("at its first run", Box::new(|| panic!("boom"))),
        ("with a formatted message", Box::new(|| panic!("boom {}", 7))),
        ("with a custom payload", Box::new(|| panic::panic_any(Payload(7)))),
        (
            "after a park",
            Box::new(|| {
                vt::park_timeout(Duration::from_millis(1));
                panic!("boom");
            }),
        ),
        (
            "after yields (it may have migrated)",
            Box::new(|| {
                for _ in 0..20 {
                    vt::yield_now();
                }
                panic!("boom");
            }),
        ),
        ("inside vt::blocking", Box::new(|| vt::blocking(|| panic!("boom")))),
        (
            "inside vt::pinned",
            Box::new(|| {
                vt::pinned(|| {
                    vt::yield_now();
                    panic!("boom")
                })
            }),
        ),
        (
            "re-raised from a child it joined",
            Box::new(|| match vt::spawn(boom).join() {
                Err(p) => panic::resume_unwind(p),
                Ok(v) => unreachable!("{v}"),
            }),
        ),
        (
            "in one half of vt::join",
            Box::new(|| {
                let _ = vt::join(boom, || 1);
            }),
        ),
        (
            "in a scope's fiber",
            Box::new(|| {
                vt::scope(|s| {
                    s.spawn(boom);
                })
            }),
        ),
    ];
    let n = cases.len();
    let drops = Arc::new(AtomicUsize::new(0));
    let rt = rt(2);
    let handles: Vec<_> = cases
        .into_iter()
        .map(|(what, body)| {
            let guard = OnDrop(drops.clone());
            (
                what,
                rt.spawn(move || {
                    let _guard = guard;
                    body();
                }),
            )
        })
        .collect();
    // A detached one too: nobody joins it, and it takes nothing down with it.
    let detached = OnDrop(drops.clone());
    drop(rt.spawn(move || {
        let _guard = detached;
        panic!("boom");
    }));
    for (what, h) in handles {
        let p = h.join().expect_err(what);
        match what {
            "with a formatted message" => assert_eq!(message(&*p), "boom 7"),
            "with a custom payload" => assert_eq!(p.downcast_ref::<Payload>(), Some(&Payload(7))),
            _ => assert_eq!(message(&*p), "boom", "{what}"),
        }
    }
    eventually("the detached fiber's destructors ran", || drops.load(SeqCst) == n + 1);
    // The blocking section that panicked gave its carrier back.
    eventually("no carrier counted as blocked", || rt.metrics().carriers_blocked == 0);
    let after: Vec<_> = (0..100u32).map(|i| rt.spawn(move || i)).collect();
    assert_eq!(after.into_iter().map(|h| h.join().unwrap()).sum::<u32>(), 4950, "the carriers survived");
    assert_eq!(
        panic::catch_unwind(AssertUnwindSafe(|| rt.block_on(|| panic!("boom")))).map_err(|p| message(&*p)),
        Err("boom".into())
    );
}

struct PanicOnDrop(&'static str);

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("{}", self.0);
    }
}

#[test]
fn a_destructor_that_panics_on_a_normal_return_is_the_join_error() {
    let drops = Arc::new(AtomicUsize::new(0));
    let d = drops.clone();
    let r = rt(1).block_on(move || {
        vt::spawn(move || {
            let _after = OnDrop(d); // declared first, dropped last: still runs
            let _bomb = PanicOnDrop("destructor boom");
            5
        })
        .join()
    });
    assert_eq!(message(&*r.unwrap_err()), "destructor boom");
    assert_eq!(drops.load(SeqCst), 1);
}

#[test]
fn a_destructor_that_panics_while_unwinding_aborts_the_process_like_std() {
    const TEST: &str = "a_destructor_that_panics_while_unwinding_aborts_the_process_like_std";
    if child_case().as_deref() == Some("double-panic") {
        let _ = rt(1).block_on(|| {
            vt::spawn(|| {
                let _bomb = PanicOnDrop("second panic, in a destructor");
                panic!("first panic, in the fiber");
            })
            .join()
        });
        println!("child: not aborted");
        return;
    }
    let out = run_child(TEST, "double-panic");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "stdout: {stdout}\nstderr: {stderr}");
    assert!(!stdout.contains("not aborted"), "{stdout}");
    assert!(stderr.contains("first panic, in the fiber"), "{stderr}");
    assert!(stderr.contains("second panic, in a destructor"), "{stderr}");
    assert!(stderr.contains("panic in a destructor during cleanup"), "std's abort message: {stderr}");
}

/// A destructor that panics while a stop unwinds its fiber (`JoinHandle::cancel`, or the
/// runtime's drop) aborts the process: Rust's rule for a panic during an unwind, which no
/// runtime can catch. What the runtime owes is a report that names the fiber, its spawn site and
/// the unwind (before, only the runtime's unrelated "panicked while being cancelled" line, as if
/// it were survivable). A destructor that panics where no unwind runs (a never-started fiber's
/// closure, dropped by the drop) is caught: the process goes on.
#[test]
fn a_destructor_that_panics_while_a_stop_unwinds_its_fiber_is_reported() {
    const TEST: &str = "a_destructor_that_panics_while_a_stop_unwinds_its_fiber_is_reported";
    if let Some(case) = child_case() {
        let rt = vt::Runtime::builder().carriers(1).deadlock_report(None).build().unwrap();
        if case == "unstarted" {
            // Never started: the runtime's drop drops its closure, outside any unwind.
            let bomb = PanicOnDrop("an unstarted fiber's capture's panic");
            let _busy = rt.spawn(|| std::thread::sleep(Duration::from_millis(100)));
            let unstarted = rt.spawn(move || drop(bomb));
            drop(rt);
            assert!(unstarted.join().is_err());
            println!("child: ok");
            return;
        }
        let (parked_tx, parked_rx) = mpsc::channel::<()>();
        let h = vt::Builder::new()
            .name("bomber".into())
            .spawn_on(&rt.handle(), move || {
                let _bomb = PanicOnDrop("a destructor's panic");
                parked_tx.send(()).unwrap();
                vt::sleep(Duration::from_secs(3600));
            })
            .unwrap();
        parked_rx.recv().unwrap();
        if case == "cancel" {
            h.cancel();
            let _ = h.join();
        } else {
            drop(rt);
        }
        println!("child: not aborted");
        return;
    }
    for (case, why) in [
        ("cancel", "while it was being stopped (JoinHandle::cancel"),
        ("drop", "while its runtime's drop was unwinding it"),
    ] {
        let out = run_child(TEST, case);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.signal(), Some(libc::SIGABRT), "stdout: {stdout}\nstderr: {stderr}");
        assert!(!stdout.contains("not aborted"), "{stdout}");
        let line = stderr
            .lines()
            .find(|l| l.contains("a destructor of fiber"))
            .unwrap_or_else(|| panic!("{stderr}"));
        assert!(line.contains("\"bomber\"") && line.contains("tests/faults.rs"), "names the fiber: {line}");
        assert!(line.contains(why) && line.contains("std::thread::panicking()"), "{line}");
        assert!(!stderr.contains("panicked while being cancelled"), "no survivable-sounding line: {stderr}");
    }
    let out = run_child(TEST, "unstarted");
    child_ok(&out);
    assert!(text(&out.stderr).contains("an unstarted fiber's capture's panic"), "reported");
}

#[test]
fn a_destructor_that_waits_while_unwinding_blocks_only_its_carrier() {
    // A fiber never switches out while unwinding, so the destructor's lock wait holds its
    // carrier; the supervisor must lend a spare so that other work runs meanwhile. The holder is
    // a plain thread: a fiber holding the lock at home on the blocked carrier could not run
    // until the wait ends (started fibers stay home, `arch/decisions/0003-home-carriers.md`).
    struct LockOnDrop(Arc<Mutex<u32>>, Arc<AtomicBool>);
    impl Drop for LockOnDrop {
        fn drop(&mut self) {
            self.1.store(true, SeqCst);
            *self.0.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        }
    }
    let rt = vt::Runtime::builder().carriers(1).max_carriers(2).build().unwrap();
    let m = Arc::new(Mutex::new(0));
    let in_drop = Arc::new(AtomicBool::new(false));
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (locked_tx, locked_rx) = mpsc::channel::<()>();
    let m1 = m.clone();
    let holder = std::thread::spawn(move || {
        let mut g = m1.lock().unwrap();
        locked_tx.send(()).unwrap();
        go_rx.recv().unwrap(); // holds the lock until told
        *g += 10;
    });
    locked_rx.recv().unwrap();
    let (m2, flag) = (m.clone(), in_drop.clone());
    let unwinder = rt.spawn(move || {
        let _d = LockOnDrop(m2, flag);
        panic!("unwinding into a destructor that waits");
    });
    eventually("the unwinding fiber reached its destructor", || in_drop.load(SeqCst));
    // Its carrier is held; a new fiber still runs (on the spare).
    within(LIMIT, "a fiber spawned while the carrier is held", {
        let h = rt.handle();
        move || assert_eq!(h.spawn(|| 42).join().unwrap(), 42)
    });
    go_tx.send(()).unwrap();
    within(LIMIT, "the holder and the unwinding fiber", move || {
        holder.join().unwrap();
        let p = unwinder.join().unwrap_err();
        assert_eq!(message(&*p), "unwinding into a destructor that waits");
    });
    assert_eq!(*m.lock().unwrap(), 11, "the destructor got the lock after the holder");
    assert!(!m.is_poisoned(), "a panic that began before the lock was taken does not poison it");
}

static INIT_PANICS: AtomicBool = AtomicBool::new(false);
static LOCAL_DROPS: AtomicUsize = AtomicUsize::new(0);

struct Counted(u32);

impl Drop for Counted {
    fn drop(&mut self) {
        LOCAL_DROPS.fetch_add(1, SeqCst);
    }
}

fn fallible_init() -> u32 {
    if INIT_PANICS.load(SeqCst) {
        panic!("fiber_local! initialiser failed");
    }
    42
}

vt::fiber_local! {
    static FALLIBLE: u32 = fallible_init();
    static COUNTED: Counted = Counted(1);
}

#[test]
fn a_panicking_fiber_local_initialiser_fails_that_access_only() {
    let rt = rt(2);
    INIT_PANICS.store(true, SeqCst);
    let failed = rt.spawn(|| {
        COUNTED.with(|c| assert_eq!(c.0, 1)); // initialised before the failure: dropped once
        FALLIBLE.with(|v| *v)
    });
    assert_eq!(message(&*failed.join().unwrap_err()), "fiber_local! initialiser failed");
    assert_eq!(LOCAL_DROPS.load(SeqCst), 1, "the fiber's other locals were dropped");
    let retried = rt.spawn(|| {
        let first = panic::catch_unwind(|| FALLIBLE.with(|v| *v)).map_err(|p| message(&*p));
        INIT_PANICS.store(false, SeqCst);
        // The failed initialisation left nothing behind: the next access initialises.
        (first, FALLIBLE.with(|v| *v), FALLIBLE.with(|v| *v))
    });
    assert_eq!(retried.join().unwrap(), (Err("fiber_local! initialiser failed".into()), 42, 42));
    assert_eq!(rt.spawn(|| FALLIBLE.with(|v| *v)).join().unwrap(), 42);
}

#[test]
fn a_panicking_fiber_local_destructor_aborts_the_process() {
    const TEST: &str = "a_panicking_fiber_local_destructor_aborts_the_process";
    vt::fiber_local! {
        static BOMB: PanicOnDrop = PanicOnDrop("fiber-local destructor boom");
    }
    if child_case().as_deref() == Some("local-dtor") {
        let _ = rt(1).block_on(|| vt::spawn(|| BOMB.with(|_| ())).join());
        println!("child: not aborted");
        return;
    }
    let out = run_child(TEST, "local-dtor");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stderr.contains("fiber-local destructor boom"), "{stderr}");
    assert!(stderr.contains("fiber_local! destructor panicked"), "names what happened: {stderr}");
}

#[test]
fn a_panic_while_holding_a_vt_lock_poisons_it_and_wakes_every_waiter() {
    const FIBERS: usize = 4;
    const THREADS: usize = 2;
    let rt = rt(2);
    let m = Arc::new(Mutex::new(0u32));
    let (announce_tx, announce_rx) = channel::unbounded::<()>();
    let (locked_tx, locked_rx) = channel::bounded::<()>(1);
    let m1 = m.clone();
    let holder = rt.spawn(move || {
        let mut g = m1.lock().unwrap();
        *g = 1;
        locked_tx.send(()).unwrap();
        for _ in 0..FIBERS + THREADS {
            announce_rx.recv().unwrap();
        }
        // Workload, not synchronisation: gives the waiters time to park on the lock, so the
        // panic usually finds them queued (the assertions hold either way).
        vt::sleep(Duration::from_millis(20));
        panic!("holder dies with the lock");
    });
    locked_rx.recv().unwrap();
    let wait = |m: Arc<Mutex<u32>>, tx: channel::Sender<()>| {
        move || {
            tx.send(()).unwrap();
            match m.lock() {
                Err(poisoned) => *poisoned.into_inner(),
                Ok(_) => panic!("the lock was not poisoned"),
            }
        }
    };
    let fibers: Vec<_> = (0..FIBERS).map(|_| rt.spawn(wait(m.clone(), announce_tx.clone()))).collect();
    let threads: Vec<_> =
        (0..THREADS).map(|_| std::thread::spawn(wait(m.clone(), announce_tx.clone()))).collect();
    within(LIMIT, "every waiter of the poisoned mutex", move || {
        assert_eq!(message(&*holder.join().unwrap_err()), "holder dies with the lock");
        for h in fibers {
            assert_eq!(h.join().unwrap(), 1, "waiters see the holder's write");
        }
        for t in threads {
            assert_eq!(t.join().unwrap(), 1);
        }
    });
    assert!(m.is_poisoned());
    m.clear_poison();
    assert_eq!(*m.lock().unwrap(), 1);

    // RwLock: a writer's panic poisons it for readers and writers alike; a reader's does not.
    let rw = Arc::new(RwLock::new(0u32));
    let rw1 = rw.clone();
    let (locked_tx, locked_rx) = channel::bounded::<()>(1);
    let (go_tx, go_rx) = channel::bounded::<()>(0);
    let writer = rt.spawn::<_, ()>(move || {
        let _g = rw1.write().unwrap();
        locked_tx.send(()).unwrap();
        go_rx.recv().unwrap();
        panic!("writer dies");
    });
    locked_rx.recv().unwrap();
    let (r1, r2) = (rw.clone(), rw.clone());
    let reader = rt.spawn(move || r1.read().is_err());
    let writer2 = rt.spawn(move || r2.write().is_err());
    go_tx.send(()).unwrap();
    within(LIMIT, "the RwLock's waiters", move || {
        assert!(writer.join().is_err());
        assert!(reader.join().unwrap(), "a reader saw the poison");
        assert!(writer2.join().unwrap(), "a writer saw the poison");
    });
    let clean = Arc::new(RwLock::new(0u32));
    let c1 = clean.clone();
    assert!(
        rt.spawn::<_, ()>(move || {
            let _r = c1.read().unwrap();
            panic!("reader dies");
        })
        .join()
        .is_err()
    );
    assert!(!clean.is_poisoned(), "as std: a read guard does not poison");

    // Condvar: a waiter woken by a notifier that then panics holding the mutex gets the guard
    // back inside a PoisonError, with the notifier's write.
    let pair = Arc::new((Mutex::new(false), Condvar::new()));
    let p1 = pair.clone();
    let (waiting_tx, waiting_rx) = channel::bounded::<()>(1);
    let waiter = rt.spawn(move || {
        let (m, cv) = &*p1;
        let g = m.lock().unwrap();
        waiting_tx.send(()).unwrap(); // sent holding the mutex: the notifier locks after our wait
        match cv.wait_while(g, |ready| !*ready) {
            Err(poisoned) => *poisoned.into_inner(),
            Ok(_) => panic!("the mutex was not poisoned"),
        }
    });
    waiting_rx.recv().unwrap();
    let p2 = pair.clone();
    let notifier = rt.spawn::<_, ()>(move || {
        let (m, cv) = &*p2;
        let mut g = m.lock().unwrap();
        *g = true;
        cv.notify_all();
        panic!("notifier dies holding the mutex");
    });
    within(LIMIT, "the condvar waiter", move || {
        assert!(notifier.join().is_err());
        assert!(waiter.join().unwrap(), "the waiter saw the notifier's write");
    });
}

// ---- resources ---------------------------------------------------------------------------

/// The address space this process has mapped now, in bytes.
fn address_space() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().next().unwrap().parse().unwrap();
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

fn set_limit(resource: libc::__rlimit_resource_t, soft: u64) {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid, writable rlimit.
    assert_eq!(unsafe { libc::getrlimit(resource, &mut lim) }, 0);
    lim.rlim_cur = soft.min(lim.rlim_max);
    // SAFETY: `lim` is a valid rlimit whose soft limit does not exceed its hard limit.
    assert_eq!(unsafe { libc::setrlimit(resource, &lim) }, 0, "{}", io::Error::last_os_error());
}

#[test]
fn running_out_of_stack_memory_is_an_io_error_from_builder_and_a_clear_panic_from_spawn() {
    const TEST: &str = "running_out_of_stack_memory_is_an_io_error_from_builder_and_a_clear_panic_from_spawn";
    if child_case().as_deref() == Some("rlimit-as") {
        // Built before the cap: carriers and the supervisor need address space of their own.
        let small = rt(1);
        let huge = vt::Runtime::builder().carriers(1).stack_size(vt::MAX_STACK_SIZE).build().unwrap();
        assert_eq!(small.block_on(|| 1), 1, "warm: the default stack class has stacks pooled");
        // Room for the allocator, not for a single arena of 1 GiB stacks.
        set_limit(libc::RLIMIT_AS, address_space() + (256 << 20));

        let e = small
            .block_on(|| vt::Builder::new().stack_size(vt::MAX_STACK_SIZE).spawn(|| ()).map(|_| ()))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::OutOfMemory, "{e}");
        println!("builder error: {e}");

        let p = panic::catch_unwind(AssertUnwindSafe(|| huge.spawn(|| ()))).map(|_| ()).unwrap_err();
        println!("spawn panic: {}", message(&*p));
        let p = panic::catch_unwind(AssertUnwindSafe(|| huge.block_on(|| ()))).unwrap_err();
        println!("block_on panic: {}", message(&*p));

        // Nothing broke on the way: stacks that fit are still handed out.
        let sum: u32 =
            small.block_on(|| (0..100).map(|i| vt::spawn(move || i)).map(|h| h.join().unwrap()).sum());
        assert_eq!(sum, 4950);
        println!("child: ok");
        return;
    }
    let out = run_child(TEST, "rlimit-as");
    let stdout = child_ok(&out);
    for line in
        ["builder error: ", "spawn panic: failed to spawn fiber: ", "block_on panic: failed to spawn fiber: "]
    {
        // libtest's own "test ... " may start the first line.
        let at = stdout.find(line).unwrap_or_else(|| panic!("no {line:?}: {stdout}"));
        let msg = stdout[at..].lines().next().unwrap();
        // It names the limit and how to raise it.
        assert!(msg.contains("address space") && msg.contains("ulimit -v"), "{msg}");
        assert!(msg.contains("stack_size"), "names the setting to lower: {msg}");
    }
}

/// Fibers queued while the address space runs out: spawn made sure of one stack, not of one
/// per queued fiber, so those past the pooled stacks cannot start. Their joins say why, and so
/// does stderr, once, for the detached ones (19,132 detached spawns under `ulimit -v` returned
/// `Ok`, none ran, and nothing was printed). The runtime goes on.
#[test]
fn queued_fibers_that_cannot_get_a_stack_fail_their_join_and_say_so() {
    const TEST: &str = "queued_fibers_that_cannot_get_a_stack_fail_their_join_and_say_so";
    const STACK: usize = 4 << 20;
    if child_case().as_deref() == Some("queued-stacks") {
        // One carrier and no spare: the queued fibers run only when the spinner lets go.
        let rt = vt::Runtime::builder().carriers(1).max_carriers(1).deadlock_report(None).build().unwrap();
        let h = rt.handle();
        // Carves the class's first arena (64 stacks of 4 MiB); room for no second one.
        vt::Builder::new().stack_size(STACK).spawn_on(&h, || ()).unwrap().join().unwrap();
        set_limit(libc::RLIMIT_AS, address_space() + (128 << 20));
        let go = Arc::new(AtomicBool::new(false));
        let (spinning_tx, spinning_rx) = mpsc::channel::<()>();
        let spinner = {
            let go = go.clone();
            rt.spawn(move || {
                spinning_tx.send(()).unwrap();
                while !go.load(SeqCst) {
                    std::hint::spin_loop();
                }
            })
        };
        spinning_rx.recv().unwrap();
        let (never_tx, never) = channel::bounded::<()>(0);
        let (started, finished) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut joined = Vec::new();
        for i in 0..200 {
            let (never, started, finished) = (never.clone(), started.clone(), finished.clone());
            let h = vt::Builder::new()
                .stack_size(STACK)
                .spawn_on(&h, move || {
                    started.fetch_add(1, SeqCst);
                    let _ = never.recv();
                    finished.fetch_add(1, SeqCst);
                })
                .expect("a stack is pooled: the spawn is Ok");
            if i >= 190 {
                joined.push(h); // the others are detached
            }
        }
        go.store(true, SeqCst);
        spinner.join().unwrap();
        for h in joined {
            println!("join: {}", message(&*h.join().unwrap_err()));
        }
        // The class is exhausted and no stack has come back: a spawn, from a thread or from a
        // fiber on the carrier, says so instead of queueing a fiber that cannot start.
        for _ in 0..2 {
            match vt::Builder::new().stack_size(STACK).spawn_on(&h, || ()) {
                Ok(_) => panic!("a spawn on an exhausted class returned Ok"),
                Err(e) => println!("spawn: {e}"),
            }
        }
        let inside = rt.block_on(|| vt::Builder::new().stack_size(STACK).spawn(|| ()).map(drop));
        println!("spawn: {}", inside.expect_err("a spawn on an exhausted class returned Ok"));
        assert_eq!(rt.block_on(|| vt::spawn(|| 7).join().unwrap()), 7, "the runtime goes on");
        // The fibers that got stacks finish and give them back: spawns succeed and run again.
        let got = started.load(SeqCst);
        assert!(got > 0 && got < 200, "{got} of 200 fibers started");
        drop((never_tx, never));
        eventually("the fibers that started finish", || finished.load(SeqCst) == got);
        // One carrier: once it runs this fiber, the finished ones have given their stacks back.
        rt.block_on(|| ());
        let ran = vt::Builder::new().stack_size(STACK).spawn_on(&h, || 8).expect("stacks came back");
        assert_eq!(ran.join().unwrap(), 8);
        // A class that never got a stack (its first arena does not fit) is refused until the
        // limit is raised, and then runs at once: nothing remembers the failure.
        let big = || vt::Builder::new().stack_size(2 * STACK).spawn_on(&h, || 9);
        assert!(big().unwrap_err().to_string().contains("ulimit -v"));
        set_limit(libc::RLIMIT_AS, u64::MAX);
        assert_eq!(big().expect("the limit was raised").join().unwrap(), 9);
        println!("child: ok");
        return;
    }
    let out = run_child(TEST, "queued-stacks");
    let stdout = child_ok(&out);
    let stderr = text(&out.stderr);
    assert_eq!(stdout.matches("join: fiber could not start: ").count(), 10, "{stdout}");
    assert!(stdout.contains("ulimit -v"), "the join names the limit: {stdout}");
    let said: Vec<&str> = stderr.lines().filter(|l| l.contains("could not start")).collect();
    assert_eq!(said.len(), 1, "said once for the spawn site: {stderr}");
    assert!(said[0].contains("tests/faults.rs") && said[0].contains("ulimit -v"), "{}", said[0]);
    let spawns: Vec<&str> = stdout.lines().filter(|l| l.starts_with("spawn: ")).collect();
    assert_eq!(spawns.len(), 3, "{stdout}");
    assert!(spawns.iter().all(|l| l.contains("ulimit -v")), "a spawn's error names the limit: {stdout}");
}

#[test]
fn running_out_of_memory_mappings_is_an_io_error_naming_vm_max_map_count() {
    const TEST: &str = "running_out_of_memory_mappings_is_an_io_error_naming_vm_max_map_count";
    if child_case().as_deref() == Some("map-count") {
        // `VT_STACK_GUARD=mprotect` (set by the parent) makes every guard page a separate
        // mapping, as on kernels before 6.13, so `vm.max_map_count` is what runs out.
        let rt = rt(2);
        let (tx, rx) = vt::channel::bounded::<()>(0);
        let started = Arc::new(AtomicUsize::new(0));
        let mut parked = Vec::new();
        let err = 'outer: loop {
            assert!(parked.len() < 1_000_000, "no limit hit after {} fibers", parked.len());
            let mut batch = Vec::new();
            for _ in 0..1000 {
                let (rx, started) = (rx.clone(), started.clone());
                match vt::Builder::new().spawn_on(&rt.handle(), move || {
                    started.fetch_add(1, SeqCst);
                    let _ = rx.recv();
                }) {
                    Ok(h) => batch.push(h),
                    Err(e) => break 'outer e.to_string(),
                }
            }
            // Every fiber of the batch took its stack (it runs), or one could not start.
            let want = parked.len() + batch.len();
            loop {
                if started.load(SeqCst) == want {
                    break;
                }
                if let Some(i) = batch.iter().position(|h| h.is_finished()) {
                    let p = batch.swap_remove(i).join().unwrap_err();
                    break 'outer message(&*p);
                }
                std::thread::yield_now();
            }
            parked.extend(batch);
        };
        println!("fibers parked: {}", started.load(SeqCst));
        println!("error: {err}");
        // The limit was hit before the kernel's: threads and fibers still start.
        std::thread::spawn(|| ()).join().unwrap();
        drop((tx, rx));
        parked.into_iter().for_each(|h| h.join().unwrap());
        assert_eq!(rt.block_on(|| vt::spawn(|| 7).join().unwrap()), 7);
        println!("child: ok");
        return;
    }
    let out = common::rerun_self(TEST, CHILD, "map-count")
        .env("VT_STACK_GUARD", "mprotect")
        .output()
        .expect("re-exec the test binary");
    let stdout = child_ok(&out);
    let at = stdout.find("error: ").unwrap();
    let msg = stdout[at..].lines().next().unwrap();
    assert!(msg.contains("vm.max_map_count") && msg.contains("sysctl -w vm.max_map_count="), "{msg}");
    let n: usize = stdout.split("fibers parked: ").nth(1).unwrap().lines().next().unwrap().parse().unwrap();
    // The default limit (65,530) leaves room for ~30,000 guarded stacks; a raised one, more.
    assert!(n > 10_000, "only {n} fibers before the limit: {stdout}");
}

/// The descriptors this process has open now.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Opens `/dev/null` until the descriptor limit says no; returns the files and the error.
fn exhaust_fds() -> (Vec<std::fs::File>, io::Error) {
    let mut filler = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => filler.push(f),
            Err(e) => return (filler, e),
        }
    }
}

/// `EMFILE`, bare or inside an explanation (whose `source()` is then the OS error).
fn is_emfile(e: &io::Error) -> bool {
    let wrapped = e.get_ref().and_then(|inner| inner.source()).and_then(|s| s.downcast_ref::<io::Error>());
    e.raw_os_error().or_else(|| wrapped.and_then(io::Error::raw_os_error)) == Some(libc::EMFILE)
}

/// Each `vt::net` call (and `Runtime` build) that needs a descriptor, run once the process has
/// none left: `(call, result)`.
fn calls_needing_a_descriptor(
    listener: &vt::net::TcpListener,
    stream: &vt::net::TcpStream,
) -> Vec<(&'static str, io::Result<()>)> {
    let addr = listener.local_addr().unwrap();
    let path = std::env::temp_dir().join(format!("vt-faults-{}.sock", std::process::id()));
    vec![
        ("TcpListener::bind", vt::net::TcpListener::bind("127.0.0.1:0").map(drop)),
        ("TcpStream::connect", vt::net::TcpStream::connect(addr).map(drop)),
        ("TcpListener::accept", listener.accept().map(drop)),
        ("UdpSocket::bind", vt::net::UdpSocket::bind("127.0.0.1:0").map(drop)),
        ("UnixStream::pair", vt::net::UnixStream::pair().map(drop)),
        ("UnixListener::bind", vt::net::UnixListener::bind(&path).map(drop)),
        ("TcpStream::try_clone", stream.try_clone().map(drop)),
        ("vt::fs::File::open", vt::fs::File::open("/dev/null").map(drop)),
        ("Runtime::build", vt::Runtime::builder().carriers(1).build().map(drop)),
    ]
}

#[test]
fn running_out_of_descriptors_makes_net_calls_fail_and_nothing_hangs() {
    const TEST: &str = "running_out_of_descriptors_makes_net_calls_fail_and_nothing_hangs";
    if child_case().as_deref() == Some("emfile") {
        let rt = rt(2); // raises the soft limit to the hard one: lowered again below
        rt.block_on(|| {
            let listener = vt::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let mut client = vt::net::TcpStream::connect(addr).unwrap(); // queued, not accepted
            set_limit(libc::RLIMIT_NOFILE, open_fds() as u64 + 16);
            let (filler, e) = exhaust_fds();
            assert_eq!(e.raw_os_error(), Some(libc::EMFILE));
            for (call, r) in calls_needing_a_descriptor(&listener, &client) {
                let e = r.expect_err(call);
                assert!(is_emfile(&e), "{call}: {e:?}");
                println!("{call}: {e}");
            }
            // From a plain thread too, and from a fiber that is not the first one.
            let t = std::thread::spawn(move || vt::net::TcpStream::connect(addr).map(drop));
            assert!(is_emfile(&t.join().unwrap().unwrap_err()));
            let f = vt::spawn(move || vt::net::TcpStream::connect(addr).map(drop));
            assert!(is_emfile(&f.join().unwrap().unwrap_err()));
            // Descriptors back: the same listener serves the queued connection.
            drop(filler);
            let (mut conn, _) = listener.accept().unwrap();
            let echo = vt::spawn(move || {
                let mut b = [0u8; 5];
                conn.read_exact(&mut b).unwrap();
                conn.write_all(&b).unwrap();
            });
            client.write_all(b"again").unwrap();
            let mut b = [0u8; 5];
            client.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"again");
            echo.join().unwrap();
        });
        drop(rt);
        println!("child: ok");
        return;
    }
    let out = run_child(TEST, "emfile");
    child_ok(&out);
}

#[test]
fn running_out_of_descriptors_is_an_error_naming_the_limit_and_how_to_raise_it() {
    const TEST: &str = "running_out_of_descriptors_is_an_error_naming_the_limit_and_how_to_raise_it";
    if child_case().as_deref() == Some("emfile-message") {
        let rt = rt(1);
        rt.block_on(|| {
            let listener = vt::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let client = vt::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            set_limit(libc::RLIMIT_NOFILE, open_fds() as u64 + 16);
            let (_filler, _) = exhaust_fds();
            for (call, r) in calls_needing_a_descriptor(&listener, &client) {
                if call == "vt::fs::File::open" || call == "TcpStream::try_clone" {
                    continue; // std's own calls, passed through unchanged
                }
                let e = r.expect_err(call).to_string();
                assert!(
                    e.contains("RLIMIT_NOFILE") || e.contains("ulimit -n"),
                    "{call} names the limit: {e}"
                );
            }
        });
        println!("child: ok");
        return;
    }
    let out = run_child(TEST, "emfile-message");
    child_ok(&out);
}

// ---- runtime drop ------------------------------------------------------------------------

/// Spawns `n` fibers that each wait where `body` does, each holding a drop counter.
fn spawn_waiting(
    rt: &vt::Runtime,
    drops: &Arc<AtomicUsize>,
    started: &Arc<AtomicUsize>,
    body: impl FnOnce() + Send + 'static,
) -> vt::JoinHandle<()> {
    let (guard, started) = (OnDrop(drops.clone()), started.clone());
    rt.spawn(move || {
        let _guard = guard;
        started.fetch_add(1, SeqCst);
        body();
    })
}

#[test]
fn dropping_a_runtime_unwinds_fibers_blocked_in_io_waits_sleeps_and_blocking_calls() {
    let rt = rt(2);
    let drops = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::new();
    let spawn = |body: Box<dyn FnOnce() + Send>| spawn_waiting(&rt, &drops, &started, body);

    // I/O with no peer data: a TCP read (its peer is a std socket here), an accept, a UDP and
    // a Unix read.
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = std_listener.local_addr().unwrap();
    handles.push(spawn(Box::new(move || {
        let mut s = vt::net::TcpStream::connect(addr).unwrap();
        let mut b = [0u8; 1];
        let r = s.read(&mut b);
        unreachable!("a read with no data returned {r:?}");
    })));
    let (mut peer, _) = std_listener.accept().unwrap();
    let vt_listener = vt::net::TcpListener::bind("127.0.0.1:0").unwrap();
    handles.push(spawn(Box::new(move || drop(vt_listener.accept()))));
    let udp = vt::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    handles.push(spawn(Box::new(move || drop(udp.recv(&mut [0u8; 8])))));
    let (unix, _unix_peer) = vt::net::UnixStream::pair().unwrap();
    handles.push(spawn(Box::new(move || {
        let mut unix = unix;
        drop(unix.read(&mut [0u8; 8]));
    })));

    // Channel, lock, condvar, semaphore waits; park; sleep; a join.
    let (tx, rx) = channel::unbounded::<u32>();
    handles.push(spawn(Box::new(move || {
        let _ = rx.recv();
    })));
    let lock = Arc::new(Mutex::new(()));
    for _ in 0..2 {
        let l = lock.clone(); // the first holds it while parked, the second waits for it
        handles.push(spawn(Box::new(move || {
            let _g = l.lock();
            loop {
                vt::park();
            }
        })));
    }
    let pair = Arc::new((Mutex::new(()), Condvar::new()));
    handles.push(spawn(Box::new(move || {
        let (m, cv) = &*pair;
        let _g = cv.wait_while(m.lock().unwrap(), |_| true);
    })));
    let sem = Arc::new(Semaphore::new(0));
    let s1 = sem.clone();
    handles.push(spawn(Box::new(move || drop(s1.acquire()))));
    handles.push(spawn(Box::new(|| {
        loop {
            vt::park();
        }
    })));
    handles.push(spawn(Box::new(|| vt::sleep(Duration::from_secs(3600)))));
    handles.push(spawn(Box::new(|| drop(vt::spawn(|| vt::sleep(Duration::from_secs(3600))).join()))));

    // Inside vt::blocking: the call runs on a helper thread and the fiber parks; the drop
    // unwinds the fiber from that park, but its frame (which the call may borrow) goes only
    // once the call has returned (an OS call cannot be interrupted).
    let (release_tx, release_rx) = mpsc::channel::<u32>();
    let released = Arc::new(AtomicUsize::new(0));
    let r1 = released.clone();
    handles.push(spawn(Box::new(move || {
        vt::blocking(move || r1.store(release_rx.recv().unwrap() as usize, SeqCst));
        loop {
            vt::park();
        }
    })));
    let n = handles.len();
    eventually("every fiber reached its wait", || started.load(SeqCst) == n);

    let dropping = Arc::new(AtomicBool::new(false));
    let d = dropping.clone();
    let releaser = std::thread::spawn(move || {
        while !d.load(SeqCst) {
            std::thread::park_timeout(Duration::from_millis(1));
        }
        // Workload: lets the drop reach the blocked carrier first, the interesting order.
        std::thread::sleep(Duration::from_millis(50));
        release_tx.send(7).unwrap();
    });
    dropping.store(true, SeqCst);
    releaser.thread().unpark();
    let t = Instant::now();
    within(LIMIT, "dropping the runtime", move || drop(rt));
    eprintln!("runtime drop took {:?}", t.elapsed());
    releaser.join().unwrap();

    assert_eq!(drops.load(SeqCst), n, "every waiting fiber's destructors ran");
    assert_eq!(released.load(SeqCst), 7, "the blocking call finished before its fiber's frame went");
    for h in handles {
        let p = h.join().unwrap_err();
        assert!(message(&*p).contains("cancelled"), "{}", message(&*p));
    }
    // The unwound reader's socket was closed: its peer reads end-of-stream.
    peer.set_read_timeout(Some(LIMIT)).unwrap();
    assert_eq!(peer.read(&mut [0u8; 1]).unwrap(), 0);
    assert!(lock.try_lock().is_ok() || lock.is_poisoned(), "the unwound holder let the lock go");
    drop(tx);
}

#[test]
fn dropping_a_runtime_closes_its_descriptors_and_joins_its_threads() {
    const TEST: &str = "dropping_a_runtime_closes_its_descriptors_and_joins_its_threads";
    if child_case().as_deref() == Some("no-leaks") {
        let threads = || std::fs::read_dir("/proc/self/task").unwrap().count();
        let (fds, tasks) = (open_fds(), threads());
        for round in 0..3 {
            let rt = vt::Runtime::builder().carriers(2).max_carriers(4).build().unwrap();
            let (ready_tx, ready_rx) = channel::bounded(2);
            let (addr_tx, addr_rx) = channel::bounded(1);
            let r1 = ready_tx.clone();
            let server = rt.spawn(move || {
                let l = vt::net::TcpListener::bind("127.0.0.1:0").unwrap();
                addr_tx.send(l.local_addr().unwrap()).unwrap();
                let (mut c, _) = l.accept().unwrap();
                r1.send(()).unwrap();
                let _ = c.read(&mut [0u8; 1]); // parked here at the drop
            });
            let addr = addr_rx.recv().unwrap();
            let client = rt.spawn(move || {
                let mut c = vt::net::TcpStream::connect(addr).unwrap();
                ready_tx.send(()).unwrap();
                let _ = c.read(&mut [0u8; 1]);
            });
            // A spare carrier starts (and retires): its thread must be joined too. (A carrier
            // blocked in the OS, found by the supervisor: `vt::blocking` blocks no carrier.)
            rt.spawn(|| std::thread::sleep(Duration::from_millis(100))).join().unwrap();
            assert!(rt.metrics().carriers_peak > 2, "a spare carrier ran");
            // More fibers than a carrier caches records for, spawned and joined on a carrier:
            // its cache fills and gives records back to the runtime's pool, and the records
            // it keeps hold runtime references until the carrier exits. A reference left
            // behind on either path would keep the runtime's state, and its descriptors, alive.
            let sum = rt.block_on(|| {
                let hs: Vec<_> = (0..1_000u64).map(|i| vt::spawn(move || i)).collect();
                hs.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
            });
            assert_eq!(sum, 999 * 1_000 / 2);
            ready_rx.recv().unwrap();
            ready_rx.recv().unwrap();
            drop(rt);
            // Join handles keep the runtime's bookkeeping (its reactor included) alive.
            assert!(server.join().is_err() && client.join().is_err());
            assert_eq!(open_fds(), fds, "round {round}: descriptors left open by a dropped runtime");
            // The drop joined every thread it started; the kernel may still list a joined
            // thread for a moment (its tid is cleared, which ends the join, before the task is
            // reaped), and nothing signals the end of that: under load it showed 3 tasks for 2.
            eventually(&format!("round {round}: no thread left running by a dropped runtime"), || {
                threads() == tasks
            });
        }
        println!("child: ok");
        return;
    }
    let out = run_child(TEST, "no-leaks");
    child_ok(&out);
}

/// A fiber that is running when the drop begins (here: inside `vt::blocking`) and then waits on
/// a socket must park, to be unwound like the others: its registration is orphaned by then.
#[test]
fn dropping_a_runtime_while_a_fiber_is_about_to_wait_on_a_socket_returns() {
    let rt = rt(1);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (connected_tx, connected_rx) = mpsc::channel::<()>();
    let drops = Arc::new(AtomicUsize::new(0));
    let guard = OnDrop(drops.clone());
    let h = rt.spawn(move || {
        let _guard = guard;
        let mut s = vt::net::TcpStream::connect(addr).unwrap();
        vt::blocking(move || {
            connected_tx.send(()).unwrap();
            release_rx.recv().unwrap(); // returns once the drop has begun
        });
        let _ = s.read(&mut [0u8; 1]);
    });
    connected_rx.recv().unwrap();
    let _peer = listener.accept().unwrap();
    let releaser = std::thread::spawn(move || {
        // Workload: the drop is under way (waiting for this carrier) when the call returns.
        std::thread::sleep(Duration::from_millis(50));
        release_tx.send(()).unwrap();
    });
    within(LIMIT, "dropping the runtime", move || drop(rt));
    releaser.join().unwrap();
    assert_eq!(drops.load(SeqCst), 1);
    assert!(h.join().is_err());
}

/// Waits whose fiber the runtime's drop unwound must not keep their place in the wait queues:
/// the primitives stay usable by whoever survives (plain threads, other runtimes).
#[test]
fn waits_abandoned_by_a_runtime_drop_lose_no_message_permit_or_wake_up() {
    let rt = rt(1);
    let started = Arc::new(AtomicUsize::new(0));
    let spawn = |f: Box<dyn FnOnce() + Send>| {
        let s = started.clone();
        drop(rt.spawn(move || {
            s.fetch_add(1, SeqCst);
            f();
        }))
    };
    let (tx, rx) = channel::unbounded::<u32>();
    let rx1 = rx.clone();
    spawn(Box::new(move || {
        let _ = rx1.recv();
    }));
    let (full_tx, full_rx) = channel::bounded::<u32>(1);
    full_tx.send(0).unwrap();
    let f1 = full_tx.clone();
    spawn(Box::new(move || {
        let _ = f1.send(1);
    }));
    let sem = Arc::new(Semaphore::new(0));
    let s1 = sem.clone();
    spawn(Box::new(move || drop(s1.acquire())));
    let lock = Arc::new(Mutex::new(0));
    let (l1, l2) = (lock.clone(), lock.clone());
    spawn(Box::new(move || {
        let _g = l1.lock();
        loop {
            vt::park();
        }
    }));
    spawn(Box::new(move || drop(l2.lock())));
    let rw = Arc::new(RwLock::new(0));
    let (rw1, rw2) = (rw.clone(), rw.clone());
    spawn(Box::new(move || {
        let _g = rw1.write();
        loop {
            vt::park();
        }
    }));
    spawn(Box::new(move || drop(rw2.read())));
    let (sel_tx, sel_rx) = channel::unbounded::<u32>();
    let (_other_tx, other_rx) = channel::bounded::<u32>(0);
    let sel_rx1 = sel_rx.clone();
    spawn(Box::new(move || {
        vt::select! {
            recv(sel_rx1) -> _m => {},
            recv(other_rx) -> _m => {},
        }
    }));
    // A fiber, once started, runs until it parks: the drop cannot stop it half-way there.
    eventually("every fiber started", || started.load(SeqCst) == 8);
    // A plain thread queues behind the fiber waiting for the lock.
    let l3 = lock.clone();
    let (queued_tx, queued_rx) = mpsc::channel();
    let thread_waiter = std::thread::spawn(move || {
        queued_tx.send(()).unwrap();
        drop(l3.lock());
    });
    queued_rx.recv().unwrap();
    // And one behind the fiber waiting to read.
    let rw3 = rw.clone();
    let (queued_tx, queued_rx) = mpsc::channel();
    let thread_writer = std::thread::spawn(move || {
        queued_tx.send(()).unwrap();
        *rw3.write().unwrap_or_else(PoisonError::into_inner) += 1;
    });
    queued_rx.recv().unwrap();
    drop(rt);

    sel_tx.send(9).unwrap();
    assert_eq!(sel_rx.try_recv(), Ok(9), "an unwound select! kept no receive slot");

    tx.send(7).unwrap();
    assert_eq!(rx.try_recv(), Ok(7), "a send after the drop reached a live receiver");
    drop(full_tx);
    assert_eq!(full_rx.try_iter().collect::<Vec<_>>(), [0], "an unwound send delivered nothing");
    assert_eq!(full_rx.try_recv(), Err(TryRecvError::Disconnected));
    sem.release();
    assert!(sem.try_acquire().is_some(), "a permit released after the drop is available");
    within(LIMIT, "the plain thread queued behind unwound lock waiters", move || {
        thread_waiter.join().unwrap()
    });
    assert!(!matches!(lock.try_lock(), Err(TryLockError::WouldBlock)), "the lock is free");
    within(LIMIT, "the plain thread queued behind unwound rwlock waiters", move || {
        thread_writer.join().unwrap()
    });
    assert_eq!(*rw.read().unwrap_or_else(PoisonError::into_inner), 1, "the plain writer got the lock once");
}

/// Bug 11 (`arch/reliability.md`): the runtime's drop unwinds a fiber parked in a wait
/// for a fiber that borrows from its frame (`scope`'s end, `vt::join`, a fiber's `block_on`).
/// The unwind leaves that wait at once, dropping the frame while the borrowing fiber is still
/// parked; unwound later, its destructors read freed stack memory. Failed in every case until
/// the drop unwound the deepest fibers first (`FiberRecord::depth`).
#[test]
fn a_waiter_unwound_by_the_runtime_drop_outlives_the_fibers_that_borrow_from_it() {
    /// Lives in the waiter's frame; says when it is gone through a flag it shares, so that
    /// the check below never reads freed memory itself.
    struct Alive(Arc<AtomicBool>);
    impl Drop for Alive {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
        }
    }
    /// Borrows the `Alive` and checks, as the unwind of its fiber drops it, that the frame it
    /// borrows from is still there.
    struct Reader<'a>(#[allow(dead_code)] &'a Alive, Arc<AtomicBool>, Arc<AtomicUsize>, Arc<AtomicUsize>);
    impl<'a> Reader<'a> {
        fn new(alive: &'a Alive, bad: Arc<AtomicUsize>, seen: Arc<AtomicUsize>) -> Self {
            Reader(alive, alive.0.clone(), bad, seen)
        }
    }
    impl Drop for Reader<'_> {
        fn drop(&mut self) {
            self.3.fetch_add(1, SeqCst);
            if self.1.load(SeqCst) {
                self.2.fetch_add(1, SeqCst);
            }
        }
    }
    type Wait = fn(&Alive, Arc<AtomicUsize>, Arc<AtomicUsize>);
    fn park_for_ever() {
        loop {
            vt::park();
        }
    }
    let cases: [(&str, vt::WaitReason, Wait); 3] = [
        ("scope", vt::WaitReason::Scope, |alive, bad, seen| {
            vt::scope(|s| {
                s.spawn(move || {
                    let _r = Reader::new(alive, bad, seen);
                    park_for_ever();
                });
            })
        }),
        // Two waiters, one inside the other's scope: the inner one must go before the outer.
        ("nested scopes", vt::WaitReason::Scope, |alive, bad, seen| {
            vt::scope(|s| {
                s.spawn(move || {
                    vt::scope(|s| {
                        s.spawn(move || {
                            let _r = Reader::new(alive, bad, seen);
                            park_for_ever();
                        });
                    })
                });
            })
        }),
        ("join", vt::WaitReason::Join, |alive, bad, seen| {
            vt::join(
                || (),
                move || {
                    let _r = Reader::new(alive, bad, seen);
                    park_for_ever();
                },
            );
        }),
    ];
    for (what, reason, wait) in cases {
        let (bad, seen) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let rt = rt(1);
        let (b, s) = (bad.clone(), seen.clone());
        // Spawned from a fiber, the waiter's record comes before its child's in the walk the
        // drop makes, so the drop unwinds the waiter first: the order that showed the bug.
        let waiter = rt.block_on(move || {
            vt::spawn(move || {
                let alive = Alive(Arc::new(AtomicBool::new(false)));
                wait(&alive, b, s);
            })
        });
        eventually(&format!("{what}: the waiter parks and its child parks"), || {
            let dump = rt.dump();
            let parked = |r| {
                dump.fibers()
                    .iter()
                    .any(|f| matches!(f.state, vt::FiberState::Parked { reason, .. } if reason == r))
            };
            parked(reason) && parked(vt::WaitReason::Park)
        });
        within(LIMIT, "the runtime's drop", move || drop(rt));
        let _ = waiter.join();
        assert_eq!(seen.load(SeqCst), 1, "{what}: the child was unwound");
        assert_eq!(
            bad.load(SeqCst),
            0,
            "{what}: the child's destructor ran after its waiter's frame was gone"
        );
    }
}
