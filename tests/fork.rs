//! `fork()` called from inside a fiber. The child's only thread is a copy of the forking
//! carrier, and it shares the parent's epoll sets and eventfds (kernel objects, not memory): it
//! must never read them, or it takes the parent's wake-ups, nor change them. The parent's
//! runtime must go on as if nothing happened; the child gets a fresh default runtime, as after a
//! fork from a plain thread.
//!
//! The test re-executes this binary (rayon's pattern) so that it forks a process running only
//! this test.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use virtual_threads as vt;
use vt::net::TcpStream;

mod common;

const CHILD: &str = "VT_FORK_CHILD";
/// How long any one step may take before it counts as lost (generous: CI is a loaded machine).
const STEP: Duration = Duration::from_secs(20);

/// What the forked child reports through its exit status.
const CHILD_SAME_THREAD: i32 = 11;
const CHILD_PANICKED: i32 = 101;

/// Runs `test` as `case` in a copy of this binary, which forks, and checks that it (the fork's
/// parent) finished its part ("parent: ok").
fn in_child_process(test: &str, case: &str) {
    let out = common::rerun_self(test, CHILD, case).output().expect("re-exec the test binary");
    common::child_output(&out, "parent: ok");
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two descriptors to fill.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) }, 0);
    // SAFETY: both descriptors were just opened and are owned by nobody else.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Whether the write end of the pipe `r` has been closed (read returns end of file).
fn closed(r: &OwnedFd) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: `b` is a valid buffer of one byte; the descriptor is open.
    unsafe { libc::read(r.as_raw_fd(), b.as_mut_ptr().cast(), 1) == 0 }
}

/// A fiber of a one-carrier runtime forks while that carrier's epoll set holds a socket. In the
/// child, the forking fiber drops its copy of the socket, spawns a fiber, then sleeps in short
/// steps until the parent is done, and returns. Meanwhile the parent spawns from a plain
/// thread, unparks a parked fiber from it and wakes a fiber through the socket, 100 times each.
/// Before: the child's copy of the carrier slept in the shared epoll set and took the parent's
/// wake-ups (a step hung), its socket drop took the parent's socket out of the set, its spawn ran
/// on the stale runtime (on the forking thread), and once its fiber returned, the stale carrier
/// loop ran on in the child.
#[test]
fn fork_from_a_fiber_leaves_the_parent_running_and_the_child_on_a_fresh_runtime() {
    if std::env::var(CHILD).is_err() {
        in_child_process("fork_from_a_fiber_leaves_the_parent_running_and_the_child_on_a_fresh_runtime", "1");
        return;
    }
    let rt = vt::Runtime::builder().carriers(1).dump_on_sigquit(true).build().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (done_r, done_w) = pipe();
    let done_w_fd = done_w.as_raw_fd();
    let forked = rt.spawn(move || {
        let s = TcpStream::connect(addr).unwrap();
        // One wait registers the socket with this carrier's epoll set.
        s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
        assert!((&s).read(&mut [0u8; 1]).is_err());
        s.set_read_timeout(None).unwrap();
        // SAFETY: the child only drops, spawns, joins, sleeps and returns (see the test's doc);
        // the parent goes on.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid > 0 {
            return (pid, Some(s));
        }
        // The child's copy of the write end, so that the parent's close is an end of file here.
        // SAFETY: the descriptor is open in this process and nothing here uses it.
        unsafe { libc::close(done_w_fd) };
        drop(s);
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        // SAFETY: as above.
        let other = vt::spawn(|| unsafe { libc::gettid() }).join().unwrap();
        while !closed(&done_r) {
            vt::sleep(Duration::from_millis(20));
        }
        if other == me {
            std::process::exit(CHILD_SAME_THREAD);
        }
        (0, None)
    });
    let (pid, stream) = forked.join().unwrap();
    let stream = Arc::new(stream.unwrap());
    let (mut peer, _) = listener.accept().unwrap();
    let (tx, rx) = mpsc::channel::<u32>();
    let mut lost = None;
    for round in 0..100u32 {
        // A fiber spawned from a plain thread runs.
        let t = tx.clone();
        rt.spawn(move || t.send(round).unwrap());
        if rx.recv_timeout(STEP).ok() != Some(round) {
            lost = Some(format!("round {round}: a spawned fiber did not run"));
            break;
        }
        // A parked fiber unparked from a plain thread runs.
        let go = Arc::new(AtomicBool::new(false));
        let (t, g) = (tx.clone(), go.clone());
        let parked = rt.spawn(move || {
            while !g.load(Ordering::Acquire) {
                vt::park();
            }
            t.send(round).unwrap();
        });
        go.store(true, Ordering::Release);
        parked.fiber().unpark();
        if rx.recv_timeout(STEP).ok() != Some(round) {
            lost = Some(format!("round {round}: an unparked fiber did not run"));
            break;
        }
        // A fiber parked on the socket is woken by the peer's byte.
        let (t, s) = (tx.clone(), stream.clone());
        rt.spawn(move || {
            let mut b = [0u8; 1];
            (&*s).read_exact(&mut b).unwrap();
            t.send(u32::from(b[0])).unwrap();
        });
        peer.write_all(&[round as u8]).unwrap();
        if rx.recv_timeout(STEP).ok() != Some(round % 256) {
            lost = Some(format!("round {round}: a fiber reading the socket was not woken"));
            break;
        }
    }
    drop(done_w);
    let code = common::wait_child(pid, STEP);
    if let Some(lost) = lost {
        panic!("{lost} (the child: {code:?})");
    }
    match code {
        Some(0) => {}
        Some(CHILD_SAME_THREAD) => panic!("the child's spawn ran on the forking thread: the stale runtime"),
        Some(CHILD_PANICKED) => panic!("the child's forking fiber panicked"),
        Some(c) => panic!("the child exited with {c}"),
        None => panic!("the child did not exit once its forking fiber returned"),
    }
    println!("parent: ok");
}

/// Forks `n` times; each child runs `child` (its spawns go to its fresh default runtime) and
/// ends with `_exit`, with status 0 if it returned true. Fails on a child that says false or
/// hangs (a lock held at the fork stayed held).
fn fork_children(n: usize, child: fn() -> bool) {
    for i in 0..n {
        // SAFETY: the child only runs `child`, then ends with `_exit` (no destructors or atexit
        // handlers of the parent's state).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let ok = child();
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(if ok { 0 } else { 10 }) };
        }
        match common::wait_child(pid, STEP) {
            Some(0) => {}
            Some(code) => panic!("fork {i}: the child's fiber did not finish its work (exit {code})"),
            None => panic!("fork {i}: the child hung (a lock held at the fork stayed held)"),
        }
    }
}

/// Runs `work(i)` in a loop on two threads (`i` = 0, 1) while forking 40 times (see
/// [`fork_children`]), then stops them.
fn fork_while(work: fn(usize), child: fn() -> bool) {
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    work(i);
                }
            })
        })
        .collect();
    fork_children(40, child);
    stop.store(true, Ordering::Relaxed);
    workers.into_iter().for_each(|t| t.join().unwrap());
    println!("parent: ok");
}

/// The runtime the workers of the two tests below use.
fn shared_runtime() -> &'static vt::Runtime {
    static RT: std::sync::OnceLock<vt::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| vt::Runtime::builder().carriers(2).build().unwrap())
}

/// A `fork` copies only the forking thread, so a lock another thread held at that moment stays
/// held in the child. The stack pools are process-wide and the child's fresh runtime takes its
/// stacks from them: with carriers and the scavenger busy in the pools at every fork, each child
/// must still spawn and join a fiber.
#[test]
fn a_fork_while_other_threads_churn_the_stack_pools_leaves_the_child_able_to_spawn() {
    const NAME: &str = "a_fork_while_other_threads_churn_the_stack_pools_leaves_the_child_able_to_spawn";
    if std::env::var(CHILD).is_err() {
        in_child_process(NAME, "churn");
        return;
    }
    let churn = |i: usize| {
        shared_runtime().block_on(|| {
            let hs: Vec<_> = (0..2_000)
                .map(|n| {
                    let b = vt::Builder::new();
                    // One class of stacks per thread.
                    let b = if i == 0 { b } else { b.stack_size(64 * 1024) };
                    b.spawn(move || n).unwrap()
                })
                .collect();
            hs.into_iter().for_each(|h| assert!(h.join().is_ok()));
        })
    };
    fork_while(churn, || vt::spawn(|| 7).join().ok() == Some(7));
}

/// As above for the `vt::blocking` helpers' pool, whose lock helpers and callers take at every
/// call: with two threads' fibers making blocking calls at every fork, each child's fiber must
/// still get its own blocking call run. The first calls race the first fork: a lazily
/// registered fork handler, still being registered at the fork, hung the child.
#[test]
fn a_fork_while_fibers_make_blocking_calls_leaves_the_child_able_to_make_them() {
    const NAME: &str = "a_fork_while_fibers_make_blocking_calls_leaves_the_child_able_to_make_them";
    if std::env::var(CHILD).is_err() {
        in_child_process(NAME, "blocking");
        return;
    }
    let call = |_| {
        shared_runtime().block_on(|| {
            let hs: Vec<_> = (0..16u32)
                .map(|i| vt::spawn(move || (0..50).map(|j| vt::blocking(move || i + j)).sum::<u32>()))
                .collect();
            hs.into_iter().for_each(|h| assert!(h.join().is_ok()));
        })
    };
    fork_while(call, || vt::spawn(|| vt::blocking(|| 7)).join().ok() == Some(7));
}

/// std takes a process-wide lock while a thread it started begins and ends (its stack-overflow
/// handler's map), so a fork in that instant leaves the child unable to start any thread: its
/// fresh runtime's carriers waited for ever at their start. With runtimes built and dropped at
/// every fork (their carriers and supervisor starting and ending), each child must still start
/// its own runtime and run a fiber on it.
#[test]
fn a_fork_while_runtimes_start_and_end_their_threads_leaves_the_child_able_to_start_one() {
    const NAME: &str = "a_fork_while_runtimes_start_and_end_their_threads_leaves_the_child_able_to_start_one";
    if std::env::var(CHILD).is_err() {
        in_child_process(NAME, "threads");
        return;
    }
    let build_and_drop = |_| {
        let rt = vt::Runtime::builder().carriers(2).build().unwrap();
        assert_eq!(rt.block_on(|| vt::spawn(|| 7).join().ok()), Some(7));
    };
    fork_while(build_and_drop, || vt::spawn(|| 7).join().ok() == Some(7));
}

/// A daemon's pattern: handlers installed, then a fork, and the child waits for its own
/// signals. The forwarding thread and the pipe it reads were the parent's (the pipe is shared
/// with the child), so the child's wait never woke. The child must get its own; the parent's
/// waits must still work after.
#[test]
fn a_child_forked_after_signals_were_installed_waits_for_its_own() {
    const NAME: &str = "a_child_forked_after_signals_were_installed_waits_for_its_own";
    if std::env::var(CHILD).is_err() {
        in_child_process(NAME, "signal");
        return;
    }
    use vt::signal::{Signal, Signals};
    // Until `done` says the wait returned, for at most half a STEP (a child that gives up says
    // so before it counts as hung): a signal sent before the waiter parked only counts, one
    // sent after must wake it.
    fn raise_until(done: impl Fn() -> bool) -> bool {
        let t = Instant::now();
        while !done() {
            if t.elapsed() > STEP / 2 {
                return false;
            }
            // SAFETY: kill(2) to this process, with a signal whose handler `vt::signal` installed.
            assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGUSR1) }, 0);
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }
    let mut before_fork = Signals::new(&[Signal::USR1]).unwrap();
    fork_children(1, || {
        let waiter = vt::spawn(|| vt::signal::wait_for(&[Signal::USR1]).unwrap());
        raise_until(|| waiter.is_finished()) && waiter.join().ok() == Some(Signal::USR1)
    });
    let waiter = std::thread::spawn(move || before_fork.wait());
    assert!(raise_until(|| waiter.is_finished()), "the parent's wait did not return after the child's");
    assert_eq!(waiter.join().unwrap(), Signal::USR1);
    println!("parent: ok");
}

/// As above for the dump on SIGQUIT: a child's runtime that asks for it must print its own
/// dump, not have the parent's SIGQUIT thread (which reads the pipe the child shared) print
/// the parent's.
#[test]
fn a_child_forked_after_the_sigquit_dump_was_installed_prints_its_own() {
    const NAME: &str = "a_child_forked_after_the_sigquit_dump_was_installed_prints_its_own";
    if std::env::var(CHILD).is_err() {
        in_child_process(NAME, "sigquit");
        return;
    }
    let parents =
        vt::Runtime::builder().carriers(1).dump_on_sigquit(true).deadlock_report(None).build().unwrap();
    let (_tx, rx) = vt::channel::bounded::<()>(1);
    let _parked = parents.spawn(move || rx.recv());
    fork_children(1, || {
        // The child's stderr goes to a pipe that it reads itself.
        let (r, w) = pipe();
        // SAFETY: both descriptors are open; fd 2 becomes the pipe's write end.
        assert!(unsafe { libc::dup2(w.as_raw_fd(), 2) } == 2);
        let rt =
            vt::Runtime::builder().carriers(1).dump_on_sigquit(true).deadlock_report(None).build().unwrap();
        let (tx, rx) = vt::channel::bounded::<()>(1);
        let _receiver = rt.spawn(move || rx.recv());
        // The dump must find it parked, so the line looked for is there at the first signal.
        let t = Instant::now();
        while !rt.dump().fibers().iter().any(|f| matches!(f.state, vt::FiberState::Parked { .. })) {
            if t.elapsed() > STEP / 2 {
                return false;
            }
            std::thread::yield_now();
        }
        // SAFETY: kill(2) to this process; the runtime installed SIGQUIT's handler.
        assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGQUIT) }, 0);
        let mut text = Vec::new();
        let t = Instant::now();
        let dumped =
            |text: &[u8]| String::from_utf8_lossy(text).contains("1 fiber parked on channel receive");
        while !dumped(&text) && t.elapsed() < STEP / 2 {
            let mut fd = libc::pollfd { fd: r.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut fd, 1, 100) };
            let mut buf = [0u8; 4096];
            // SAFETY: a valid buffer of its length; the descriptor is open and non-blocking.
            let n = unsafe { libc::read(r.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n > 0 {
                text.extend_from_slice(&buf[..n as usize]);
            }
        }
        drop(tx);
        dumped(&text)
    });
    println!("parent: ok");
}

/// A pre-fork server's shape: a connection the parent's fibers used (registered with the
/// parent's runtime, whose epoll set the child shares and must not touch), read in the child
/// by a fiber of a runtime of one carrier that may add none. The reader must park, so that the
/// carrier runs the writer: it waited like a thread, in `poll(2)`, blocking that carrier.
#[test]
fn a_child_reads_a_socket_the_parent_used_without_blocking_its_carrier() {
    const NAME: &str = "a_child_reads_a_socket_the_parent_used_without_blocking_its_carrier";
    if std::env::var(CHILD).is_err() {
        in_child_process(NAME, "inherited");
        return;
    }
    static SOCKETS: std::sync::OnceLock<(Arc<TcpStream>, std::sync::Mutex<Option<std::net::TcpStream>>)> =
        std::sync::OnceLock::new();
    // Spawns a fiber of `rt` reading one byte of `s`.
    fn read_one(rt: &vt::Runtime, s: &Arc<TcpStream>) -> vt::JoinHandle<std::io::Result<u8>> {
        let s = s.clone();
        rt.spawn(move || {
            let mut b = [0u8; 1];
            (&*s).read_exact(&mut b).map(|()| b[0])
        })
    }
    // A byte from the peer for a reader of the parent's runtime, once it is parked on the socket.
    fn read_in_parent(rt: &vt::Runtime, s: &Arc<TcpStream>, peer: &mut std::net::TcpStream, byte: u8) {
        let read = read_one(rt, s);
        while !rt.dump().fibers().iter().any(|f| matches!(f.state, vt::FiberState::Parked { .. })) {
            std::thread::yield_now();
        }
        peer.write_all(&[byte]).unwrap();
        assert_eq!(read.join().unwrap().unwrap(), byte);
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let s = Arc::new(TcpStream::connect(listener.local_addr().unwrap()).unwrap());
    let (mut peer, _) = listener.accept().unwrap();
    let parents = vt::Runtime::builder().carriers(1).build().unwrap();
    read_in_parent(&parents, &s, &mut peer, 1);
    assert!(SOCKETS.set((s, std::sync::Mutex::new(Some(peer)))).is_ok());
    fork_children(1, || {
        let (s, peer) = SOCKETS.get().unwrap();
        let mut peer = peer.lock().unwrap().take().unwrap();
        let rt = vt::Runtime::builder().carriers(1).max_carriers(1).build().unwrap();
        let read = read_one(&rt, s);
        // Runs only once the reader has parked (one carrier, none added).
        let writer = rt.spawn(move || peer.write_all(&[2]));
        writer.join().is_ok_and(|w| w.is_ok()) && read.join().ok().and_then(Result::ok) == Some(2)
    });
    // The parent's registration still serves the parent's fibers.
    let (s, peer) = SOCKETS.get().unwrap();
    read_in_parent(&parents, s, peer.lock().unwrap().as_mut().unwrap(), 3);
    println!("parent: ok");
}
