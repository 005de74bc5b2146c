//! The `hooks` feature in the child of a `fork`: the fibers of the child's own runtimes park in
//! std's blocking calls as anywhere (a pre-fork server's workers, a daemon that forks at start),
//! while what the child inherited stays the parent's: a socket the parent's fibers used still
//! blocks as its user asked, and the child's use or close of its copy leaves the parent's
//! registration working; a futex wake in the child never goes to a parent's fiber. Each runtime
//! the child builds has one carrier and may add none, so a call that blocked its carrier would
//! stop the fiber that the test waits for. `arch/hooks.md` ("Fork").
//!
//! Each test re-executes this binary (as `tests/fork.rs` does), so that it forks a process
//! running only that test.
#![cfg(feature = "hooks")]

use std::io::{self, Read, Write};
use std::mem::ManuallyDrop;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use virtual_threads as vt;
use vt::{FiberState, WaitReason};

mod common;

const CHILD: &str = "VT_HOOKS_FORK_CHILD";
/// How long any one step may take before it counts as lost (generous: CI is a loaded machine).
const STEP: Duration = Duration::from_secs(20);

/// Runs `test` in a copy of this binary, which forks, and checks that it finished its part.
/// Returns true in that copy, where the caller plays the test.
fn in_own_process(test: &str) -> bool {
    if std::env::var(CHILD).is_ok() {
        return true;
    }
    let out = common::rerun_self(test, CHILD, "1").output().expect("re-exec the test binary");
    common::child_output(&out, "parent: ok");
    false
}

/// Forks; the child runs `child` and ends with `_exit`: 0 if it returned, 101 if it panicked
/// (the message is on stderr). Returns the child's pid.
fn fork_running(child: impl FnOnce()) -> libc::pid_t {
    // SAFETY: the child runs `child`, then `_exit`s: none of the parent's destructors or
    // `atexit` handlers run there.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = catch_unwind(AssertUnwindSafe(child)).is_ok();
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(if ok { 0 } else { 101 }) };
    }
    pid
}

/// Waits for the child `pid` and fails unless it returned.
fn assert_child_ok(pid: libc::pid_t) {
    assert_returned(common::wait_child(pid, 3 * STEP));
}

/// Fails unless a child's exit code (`None`: it hung) says it returned.
fn assert_returned(code: Option<i32>) {
    match code {
        Some(0) => {}
        Some(code) => panic!("the child failed (exit {code}; its message is above)"),
        None => panic!("the child hung"),
    }
}

/// A runtime of one carrier that may add none: a fiber that blocks its carrier stops every
/// other fiber of it.
fn one_carrier() -> vt::Runtime {
    vt::Runtime::builder().carriers(1).max_carriers(1).build().unwrap()
}

/// Waits until a fiber of `rt` is parked for `reason`; false if none is within a step. A call
/// that blocked its carrier never shows as parked.
fn parked(rt: &vt::Runtime, reason: WaitReason) -> bool {
    let t = Instant::now();
    while t.elapsed() < STEP {
        if rt
            .dump()
            .fibers()
            .iter()
            .any(|f| matches!(f.state, FiberState::Parked { reason: r, .. } if r == reason))
        {
            return true;
        }
        std::thread::yield_now();
    }
    false
}

/// A connected loopback pair, made by the calling process: (client, server).
fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    (client, listener.accept().unwrap().0)
}

/// The user's non-blocking mode of `s` as `fcntl` shows it.
fn nonblocking(s: &TcpStream) -> bool {
    // SAFETY: a plain call on an open descriptor.
    let fl = unsafe { libc::fcntl(s.as_raw_fd(), libc::F_GETFL) };
    assert!(fl >= 0);
    fl & libc::O_NONBLOCK != 0
}

/// A fiber of the parent's runtime registers both ends of a pair with its carrier's set (a
/// read that times out parks once), so the pair is switched to non-blocking underneath.
fn used_by_a_parent_fiber(rt: &vt::Runtime, pair: (TcpStream, TcpStream)) -> (TcpStream, TcpStream) {
    rt.spawn(move || {
        for mut s in [&pair.0, &pair.1] {
            s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
            assert_eq!(s.read(&mut [0u8; 1]).unwrap_err().kind(), io::ErrorKind::WouldBlock);
            s.set_read_timeout(None).unwrap();
        }
        pair
    })
    .join()
    .unwrap()
}

/// A fork from a fiber (the forking thread was a carrier): in the child, a fiber blocked in
/// `TcpStream::read` on a socket the child made is parked, and the only carrier runs the fiber
/// that writes what it waits for. Without the hooks in the child, the read held the carrier
/// and the writer never ran.
#[test]
fn in_a_forked_child_a_fiber_s_std_net_read_leaves_its_carrier_free() {
    if !in_own_process("in_a_forked_child_a_fiber_s_std_net_read_leaves_its_carrier_free") {
        return;
    }
    let parents = vt::Runtime::builder().carriers(1).build().unwrap();
    let inherited = used_by_a_parent_fiber(&parents, tcp_pair());
    let pid = parents
        .spawn(|| {
            fork_running(|| {
                let rt = one_carrier();
                let (client, mut server) = tcp_pair();
                let reader = rt.spawn(move || {
                    let mut b = [0u8; 5];
                    (&client).read_exact(&mut b).map(|()| b)
                });
                assert!(parked(&rt, WaitReason::HookedRead), "the child's read did not park its fiber");
                rt.spawn(move || server.write_all(b"hello").unwrap()).join().unwrap();
                assert_eq!(&reader.join().unwrap().unwrap(), b"hello");
            })
        })
        .join()
        .unwrap();
    assert_child_ok(pid);
    drop(inherited);
    println!("parent: ok");
}

/// In a forked child, `std::thread::sleep` and a contended `std::sync::Mutex` park the fiber:
/// the one carrier runs another fiber meanwhile (the mutex's holder, who waits for a fiber's
/// message before it lets go).
#[test]
fn in_a_forked_child_std_sleep_and_a_contended_std_mutex_park_the_fiber() {
    if !in_own_process("in_a_forked_child_std_sleep_and_a_contended_std_mutex_park_the_fiber") {
        return;
    }
    let pid = fork_running(|| {
        let rt = one_carrier();
        // A sleeper that looks at a flag between sleeps: blocking sleeps keep the carrier, so
        // the flag's setter would never run.
        let woken = Arc::new(AtomicBool::new(false));
        let w = woken.clone();
        let sleeper = rt.spawn(move || {
            let t = Instant::now();
            while !w.load(Ordering::Acquire) && t.elapsed() < STEP {
                std::thread::sleep(Duration::from_millis(20));
            }
            w.load(Ordering::Acquire)
        });
        assert!(parked(&rt, WaitReason::HookedSleep), "the child's std sleep did not park its fiber");
        rt.spawn(move || woken.store(true, Ordering::Release)).join().unwrap();
        assert!(sleeper.join().unwrap(), "the flag's setter did not run while the sleeper slept");

        let lock = Arc::new(Mutex::new(0u32));
        let (go, wait) = vt::channel::bounded::<()>(1);
        let locked = Arc::new(AtomicBool::new(false));
        let (l, k) = (lock.clone(), locked.clone());
        let holder = rt.spawn(move || {
            let mut g = l.lock().unwrap();
            k.store(true, Ordering::Release);
            wait.recv().unwrap();
            *g += 1;
        });
        let t = Instant::now();
        while !locked.load(Ordering::Acquire) {
            assert!(t.elapsed() < STEP, "the holder did not run");
            std::thread::yield_now();
        }
        let l = lock.clone();
        let waiter = rt.spawn(move || {
            let mut g = l.lock().unwrap();
            *g += 10;
            *g
        });
        assert!(parked(&rt, WaitReason::HookedFutex), "the child's std mutex wait did not park its fiber");
        rt.spawn(move || go.send(()).unwrap()).join().unwrap();
        holder.join().unwrap();
        assert_eq!(waiter.join().unwrap(), 11);
    });
    assert_child_ok(pid);
    println!("parent: ok");
}

/// The child's own sockets, read by fibers of its one carrier: peers that send then close,
/// send then reset, and close at once give the reader the data, then the end of stream, the
/// reset, or nothing.
#[test]
fn in_a_forked_child_peers_that_close_reset_and_send_then_close() {
    if !in_own_process("in_a_forked_child_peers_that_close_reset_and_send_then_close") {
        return;
    }
    let pid = fork_running(|| {
        let rt = one_carrier();
        for round in 0..9 {
            let (client, server) = tcp_pair();
            let (sent, resets): (&[u8], bool) = match round % 3 {
                0 => (b"data then close", false),
                1 => (b"data then reset", true),
                _ => (b"", false),
            };
            let reader = rt.spawn(move || {
                let mut client = client;
                let mut got = vec![0u8; sent.len()];
                client.read_exact(&mut got).unwrap();
                if resets {
                    // The reset comes once the data is read (it would discard it otherwise).
                    client.write_all(b"k").unwrap();
                }
                (got, client.read(&mut [0u8; 8]).map_err(|e| e.kind()))
            });
            assert!(parked(&rt, WaitReason::HookedRead), "round {round}: the read did not park");
            rt.spawn(move || {
                let mut server = server;
                server.write_all(sent).unwrap();
                if resets {
                    server.read_exact(&mut [0u8; 1]).unwrap();
                    common::set_linger_zero(&server);
                }
            })
            .join()
            .unwrap();
            let end = if resets { Err(io::ErrorKind::ConnectionReset) } else { Ok(0) };
            assert_eq!(reader.join().unwrap(), (sent.to_vec(), end), "round {round}");
        }
    });
    assert_child_ok(pid);
    println!("parent: ok");
}

/// A pair the parent's fibers used (registered with the parent's set, non-blocking underneath),
/// inherited by the child, which closes its copy of the parent's end and reads the other end
/// from a fiber of its default runtime: the read blocks until the parent's fiber writes (the
/// descriptor is the parent's, so the call passes through and waits in `poll(2)`: before, it
/// said `WouldBlock`), `fcntl` shows the user's blocking mode, and the parent's fiber is woken
/// by the child's writes on its own registration after the child closed its copy.
#[test]
fn a_socket_inherited_from_the_parent_blocks_in_the_child_and_stays_the_parent_s() {
    if !in_own_process("a_socket_inherited_from_the_parent_blocks_in_the_child_and_stays_the_parent_s") {
        return;
    }
    let rt = vt::Runtime::builder().carriers(1).build().unwrap();
    let (a, b) = used_by_a_parent_fiber(&rt, tcp_pair());
    let (a_fd, b_fd) = (a.as_raw_fd(), b.as_raw_fd());
    let pid = fork_running(move || {
        // SAFETY: the child's copy of the parent's end, closed once (the hooked `close`); the
        // stream `b` is never dropped here (the child ends with `_exit`).
        assert_eq!(unsafe { libc::close(b_fd) }, 0);
        let got = vt::spawn(move || {
            // SAFETY: the child's copy of `a`, open; never closed through this value.
            let a = ManuallyDrop::new(unsafe { TcpStream::from_raw_fd(a_fd) });
            assert!(!nonblocking(&a), "the child sees the hooks' mode, not the user's");
            let mut got = Vec::new();
            for ask in [&b"one"[..], b"two"] {
                // The parent answers only once it has read this, so the read below finds the
                // socket empty.
                (&*a).write_all(ask).unwrap();
                let mut b = [0u8; 5];
                (&*a).read_exact(&mut b).unwrap();
                got.push(b);
            }
            got
        })
        .join()
        .unwrap();
        assert_eq!(got, [*b"hello", *b"again"]);
    });
    let parent_end = rt.spawn(move || {
        let mut b_end = b;
        for answer in [b"hello", b"again"] {
            let mut ask = [0u8; 3];
            b_end.read_exact(&mut ask).unwrap();
            b_end.write_all(answer).unwrap();
        }
        b_end
    });
    assert_child_ok(pid);
    let b = parent_end.join().unwrap();
    assert!(!nonblocking(&b) && !nonblocking(&a), "the parent's user mode changed");
    println!("parent: ok");
}

/// A pre-fork server's listener, which no fiber of the parent's used: a child's fiber that
/// clones it and accepts on it must leave the open file blocking, as the parent and every other
/// child see it (a child that switched it underneath would make their next classification take
/// the switched mode for the user's, and their blocking accepts say `WouldBlock`). The
/// connection the child accepted is the child's own, and its read parks as usual.
#[test]
fn a_listener_the_parent_never_used_stays_blocking_after_a_child_s_fiber_accepts_on_it() {
    if !in_own_process("a_listener_the_parent_never_used_stays_blocking_after_a_child_s_fiber_accepts_on_it")
    {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let kernel_nonblocking = |l: &TcpListener| {
        // SAFETY: a plain call on an open descriptor (no entry in the table, so the kernel's
        // mode).
        let fl = unsafe { libc::fcntl(l.as_raw_fd(), libc::F_GETFL) };
        assert!(fl >= 0);
        fl & libc::O_NONBLOCK != 0
    };
    let pid = fork_running(|| {
        let mine = listener.try_clone().unwrap();
        let got = vt::spawn(move || {
            let (mut s, _) = mine.accept().unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).unwrap();
            got
        })
        .join()
        .unwrap();
        assert_eq!(got, b"from the parent");
        assert!(!kernel_nonblocking(&listener), "the child switched the shared listener");
    });
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(b"from the parent").unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    assert_child_ok(pid);
    assert!(!kernel_nonblocking(&listener), "the parent's listener is non-blocking");
    println!("parent: ok");
}

/// Waits on `cv` until `ready` says so.
fn wait_until_ready(ready: &Mutex<bool>, cv: &Condvar) {
    let mut g = ready.lock().unwrap();
    while !*g {
        g = cv.wait(g).unwrap();
    }
}

/// Sets `ready` and wakes one waiter of `cv`; whether `waiter` (the fiber that waits there)
/// then finishes within a step.
fn notify_one_reaches(ready: &Mutex<bool>, cv: &Condvar, waiter: &vt::JoinHandle<()>) -> bool {
    *ready.lock().unwrap() = true;
    cv.notify_one();
    let t = Instant::now();
    while !waiter.is_finished() {
        if t.elapsed() > STEP {
            return false;
        }
        std::thread::yield_now();
    }
    true
}

/// A parent's fiber waits on a std `Condvar` (a waiter in the hooks' futex table) when the
/// process forks. In the child, a fiber waits on its copy of the `Condvar` and the child's plain
/// thread notifies one: the wake must reach the child's fiber. Before, the table still held the
/// parent's waiter, first in line: the wake counted it (a fiber the child never runs) and the
/// child's fiber waited for ever.
#[test]
fn a_futex_wake_in_a_forked_child_reaches_the_child_s_waiter_not_a_parent_s_fiber() {
    if !in_own_process("a_futex_wake_in_a_forked_child_reaches_the_child_s_waiter_not_a_parent_s_fiber") {
        return;
    }
    let rt = vt::Runtime::builder().carriers(1).build().unwrap();
    let pair = Arc::new((Mutex::new(false), Condvar::new()));
    let p = pair.clone();
    let parents = rt.spawn(move || wait_until_ready(&p.0, &p.1));
    assert!(parked(&rt, WaitReason::HookedFutex), "the parent's condvar wait did not park");
    let p = pair.clone();
    let pid = fork_running(move || {
        let rt = one_carrier();
        let q = p.clone();
        let childs = rt.spawn(move || wait_until_ready(&q.0, &q.1));
        assert!(parked(&rt, WaitReason::HookedFutex), "the child's condvar wait did not park");
        assert!(notify_one_reaches(&p.0, &p.1, &childs), "the child's waiter was not woken");
    });
    let code = common::wait_child(pid, 3 * STEP);
    // Before the verdict: the runtime's drop would wait for this fiber for ever.
    *pair.0.lock().unwrap() = true;
    pair.1.notify_one();
    parents.join().unwrap();
    assert_returned(code);
    println!("parent: ok");
}

/// 40 forks while the parent's fibers wait on and wake a std `Condvar` without pause (waiters
/// in the futex table and its bucket's lock held at many a fork, by carriers the child does not
/// have): each child's fiber waits on its copy of that `Condvar` and must be woken by the
/// child's `notify_one`, which goes through the same bucket.
#[test]
fn forks_while_the_parent_s_fibers_churn_a_std_condvar_leave_each_child_s_wakes_working() {
    if !in_own_process("forks_while_the_parent_s_fibers_churn_a_std_condvar_leave_each_child_s_wakes_working")
    {
        return;
    }
    let rt = vt::Runtime::builder().carriers(2).build().unwrap();
    let shared = Arc::new((Mutex::new(()), Condvar::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let churn: Vec<_> = (0..8)
        .map(|_| {
            let (shared, stop) = (shared.clone(), stop.clone());
            rt.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let g = shared.0.lock().unwrap();
                    shared.1.notify_one();
                    drop(shared.1.wait_timeout(g, Duration::from_millis(1)).unwrap());
                }
            })
        })
        .collect();
    // Stops the churn however this ends: the runtime's drop waits for its fibers, and a churning
    // one never ends by itself.
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let stopping = StopOnDrop(stop);
    let mut failed = None;
    for i in 0..40 {
        let cv = shared.clone();
        let pid = fork_running(move || {
            // Never dropped: a failing child ends at once rather than wait for a stuck fiber.
            let rt = ManuallyDrop::new(one_carrier());
            // The child's own lock: the parent's may have been held at the fork.
            let ready = Arc::new(Mutex::new(false));
            let (r, c) = (ready.clone(), cv.clone());
            let waiter = rt.spawn(move || wait_until_ready(&r, &c.1));
            assert!(parked(&rt, WaitReason::HookedFutex), "fork {i}: the child's wait did not park");
            assert!(notify_one_reaches(&ready, &cv.1, &waiter), "fork {i}: the child's waiter was not woken");
        });
        let code = common::wait_child(pid, 3 * STEP);
        if code != Some(0) {
            failed = Some((i, code));
            break;
        }
    }
    // Before the verdict: the runtime's drop may wait for ever for a fiber in a std wait.
    drop(stopping);
    churn.into_iter().for_each(|h| h.join().unwrap());
    if let Some((i, code)) = failed {
        print!("fork {i}: ");
        assert_returned(code);
    }
    println!("parent: ok");
}
