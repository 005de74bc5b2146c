//! Unchanged std I/O on fibers with the `hooks` feature: `std::net`, `UnixStream` pairs and child
//! process pipes park the calling fiber on its carrier's reactor, so two carriers serve a
//! thousand such fibers with no compensating carrier. Peers that close, reset and
//! send-then-close, timeouts, the user's own non-blocking mode, plain threads on a descriptor a
//! fiber used, and a cancelled fiber inside a hooked call. `arch/hooks.md`.
#![cfg(feature = "hooks")]

use std::io::{self, BufRead, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use virtual_threads as vt;

mod common;

/// One test at a time: another test's `fork` (a child process) holds every stack pool's lock
/// for its duration (`pool` of stacks, `pthread_atfork`), which the supervisor may take for a blocked carrier of this one.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The supervisor looks every 50 ms instead of 10: on a loaded machine a carrier may sleep a
/// few milliseconds in the kernel on a lock whose holder the OS descheduled (the allocator's,
/// the memory map's, a reactor list's), which at 10 ms can look like a blocked carrier. A call
/// that blocked its carrier here would hold it until its peer, often a fiber queued behind
/// it, runs: far longer than two windows (`a_carrier_blocked_in_a_raw_read_is_caught` shows
/// the supervisor still sees it at this interval). `VT_TEST_SUPERVISOR_MS` overrides it
/// (`common::supervisor_interval`).
fn builder() -> vt::runtime::Builder {
    vt::Runtime::builder().supervisor_interval(common::supervisor_interval(50))
}

/// How many connections (or pairs) the echo and pair tests make: `VT_TEST_CONNECTIONS`, or
/// 500 (`.ci/valgrind` runs them with fewer).
fn connections() -> usize {
    std::env::var("VT_TEST_CONNECTIONS").map_or(500, |n| n.parse().expect("VT_TEST_CONNECTIONS: a number"))
}

fn two_carriers() -> vt::Runtime {
    builder().carriers(2).build().unwrap()
}

/// Asserts the runtime got through with its own two carriers: nothing blocked one.
fn assert_no_compensation(rt: &vt::Runtime) {
    let m = rt.metrics();
    assert_eq!((m.compensations, m.carriers_peak), (0, 2), "{m}");
}

fn join_all<T>(hs: Vec<vt::JoinHandle<T>>) -> Vec<T> {
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// 500 client fibers and 500 server fibers (one per connection, spawned by an accepting fiber)
/// echo 64 KiB each over `std::net` on loopback, more than a socket buffer holds at once. The
/// read side uses `read_to_end`'s sibling `io::copy` into a checking sink (no allocation, see
/// the pairs test below).
#[test]
fn std_net_echo_in_a_thousand_fibers_on_two_carriers() {
    let _one = serial();
    let rt = two_carriers();
    let n = connections();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    // std listens with a backlog of 128; 500 connects at once overflow it, the kernel answers
    // with SYN cookies, and a cookie it then fails to validate resets that connection (seen:
    // 1 run in ~10, `TcpExtSyncookiesFailed` counting). Room for all of them: `listen` again.
    // SAFETY: a plain call on the listener's open descriptor.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 1024) }, 0);
    let addr = listener.local_addr().unwrap();
    let h = rt.handle();
    let server = rt.spawn(move || {
        let mut conns = Vec::new();
        for _ in 0..n {
            let (mut s, _) = listener.accept().unwrap();
            conns.push(h.spawn(move || {
                // The client half-closes when done: `io::copy` ends at its end of stream.
                let copied = io::copy(&mut s.try_clone().unwrap(), &mut s).unwrap();
                s.shutdown(std::net::Shutdown::Write).unwrap();
                copied
            }));
        }
        join_all(conns).into_iter().sum::<u64>()
    });
    let msg: Arc<Vec<u8>> = Arc::new((0..64 * 1024).map(|k| (k % 251) as u8).collect());
    let clients: Vec<_> = (0..n)
        .map(|i| {
            let msg = msg.clone();
            rt.spawn(move || {
                let s = TcpStream::connect(addr).unwrap();
                let mut w = s.try_clone().unwrap();
                let m = msg.clone();
                // A writer fiber, so that neither side waits for the other's buffer to drain.
                let writer = vt::spawn(move || {
                    w.write_all(&m).unwrap();
                    w.shutdown(std::net::Shutdown::Write).unwrap();
                });
                let mut sink = Check { at: 0 };
                let got = io::copy(&mut &s, &mut sink).unwrap();
                writer.join().unwrap();
                assert_eq!(got, 64 * 1024, "client {i}");
            })
        })
        .collect();
    join_all(clients);
    assert_eq!(server.join().unwrap(), n as u64 * 64 * 1024);
    assert_no_compensation(&rt);
}

/// Peers that send then close, send then reset, and close at once: the reader gets the data,
/// then the end of stream, the reset, or nothing, never a hang.
#[test]
fn peers_that_close_reset_and_send_then_close() {
    let _one = serial();
    let rt = two_carriers();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let rounds = 100;
    let server = rt.spawn(move || {
        for i in 0..rounds * 3 {
            let (mut s, _) = listener.accept().unwrap();
            match i % 3 {
                0 => s.write_all(b"data then close").unwrap(),
                1 => {
                    s.write_all(b"data then reset").unwrap();
                    // Wait for the client to have read the data (it says so), then reset.
                    let mut b = [0u8; 1];
                    s.read_exact(&mut b).unwrap();
                    common::set_linger_zero(&s);
                }
                _ => {}
            }
        }
    });
    let clients: Vec<_> = (0..rounds * 3)
        .map(|i| {
            // One at a time per kind, in accept order: connect in sequence, read in parallel.
            let s = TcpStream::connect(addr).unwrap();
            rt.spawn(move || {
                let mut s = s;
                match i % 3 {
                    0 => {
                        let mut v = Vec::new();
                        s.read_to_end(&mut v).unwrap();
                        assert_eq!(v, b"data then close");
                    }
                    1 => {
                        let mut b = [0u8; 15];
                        s.read_exact(&mut b).unwrap();
                        assert_eq!(&b, b"data then reset");
                        s.write_all(b"k").unwrap();
                        let mut rest = [0u8; 16];
                        let e = s.read(&mut rest).unwrap_err();
                        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
                    }
                    _ => assert_eq!(s.read(&mut [0u8; 8]).unwrap(), 0),
                }
            })
        })
        .collect();
    join_all(clients);
    server.join().unwrap();
    assert_no_compensation(&rt);
}

/// `set_read_timeout` (`SO_RCVTIMEO`) ends a parked read with `WouldBlock` after at least its
/// time, and the carrier runs other fibers meanwhile.
#[test]
fn a_read_timeout_is_honoured_and_the_carrier_runs_others_meanwhile() {
    let _one = serial();
    let rt = builder().carriers(1).build().unwrap();
    let (a, _b) = UnixStream::pair().unwrap();
    let ticks = Arc::new(AtomicUsize::new(0));
    let t2 = ticks.clone();
    let reader = rt.spawn(move || {
        a.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let t = Instant::now();
        let e = (&a).read(&mut [0u8; 4]).unwrap_err();
        (e.kind(), t.elapsed())
    });
    let ticker = rt.spawn(move || {
        for _ in 0..10 {
            vt::sleep(Duration::from_millis(5));
            t2.fetch_add(1, Ordering::Relaxed);
        }
    });
    let (kind, took) = reader.join().unwrap();
    ticker.join().unwrap();
    assert_eq!(kind, io::ErrorKind::WouldBlock);
    assert!(took >= Duration::from_millis(200), "timed out early: {took:?}");
    assert_eq!(ticks.load(Ordering::Relaxed), 10);
    let m = rt.metrics();
    assert_eq!((m.compensations, m.carriers_peak), (0, 1), "{m}");
}

/// 500 `UnixStream` pairs: a fiber writes 256 KiB into each and closes; another copies it with
/// `io::copy` into a checking sink; the bytes arrive whole and in order. (The data is one shared
/// buffer and the sink keeps nothing: heavy allocation would make the carriers contend for the
/// C allocator's own locks, which no hook sees, and the test is about the pipes.)
#[test]
fn unix_stream_pairs_with_io_copy_in_a_thousand_fibers() {
    let rt = two_carriers();
    let n = connections();
    let data: Arc<Vec<u8>> = Arc::new((0..256 * 1024).map(|k| (k % 251) as u8).collect());
    let hs: Vec<_> = (0..n)
        .flat_map(|_| {
            let (mut a, mut b) = UnixStream::pair().unwrap();
            let d = data.clone();
            let w = rt.spawn(move || {
                a.write_all(&d).unwrap();
                0
            });
            let r = rt.spawn(move || {
                let mut sink = Check { at: 0 };
                io::copy(&mut b, &mut sink).unwrap() as usize
            });
            [w, r]
        })
        .collect();
    assert_eq!(join_all(hs).into_iter().sum::<usize>(), n * 256 * 1024);
    assert_no_compensation(&rt);
}

/// A sink that checks the bytes it gets against the pattern `k % 251`.
struct Check {
    at: usize,
}

impl Write for Check {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        for (i, &b) in buf.iter().enumerate() {
            assert_eq!(b, ((self.at + i) % 251) as u8, "byte {} garbled", self.at + i);
        }
        self.at += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A child process's stdout, read by `read_to_end` and by `output()` (whose two pipes std reads
/// with `poll`), from 20 fibers at once while each child takes its time.
#[test]
fn child_process_pipes_park_the_reading_fiber() {
    let _one = serial();
    let rt = two_carriers();
    let hs: Vec<_> = (0..20)
        .map(|i| {
            rt.spawn(move || {
                let script = format!("sleep 0.2; echo out{i}; echo err{i} >&2");
                if i % 2 == 0 {
                    let o = std::process::Command::new("sh").args(["-c", &script]).output().unwrap();
                    assert_eq!(String::from_utf8(o.stdout).unwrap(), format!("out{i}\n"));
                    assert_eq!(String::from_utf8(o.stderr).unwrap(), format!("err{i}\n"));
                } else {
                    let mut c = std::process::Command::new("sh")
                        .args(["-c", &script])
                        .stdout(std::process::Stdio::piped())
                        .stderr(std::process::Stdio::null())
                        .spawn()
                        .unwrap();
                    let mut s = String::new();
                    c.stdout.take().unwrap().read_to_string(&mut s).unwrap();
                    assert_eq!(s, format!("out{i}\n"));
                    // The child has closed its stdout: it has exited or is about to.
                    c.wait().unwrap();
                }
            })
        })
        .collect();
    join_all(hs);
    // `wait()` blocks in `waitpid`, which is not hooked; each child has closed its stdout
    // already, so that wait is short, but the supervisor may still see it: assert only that the
    // reads did not need it (a blocked read would hold a carrier for 200 ms).
    let m = rt.metrics();
    assert!(m.compensations <= 2, "{m}");
}

/// The user's non-blocking mode is kept: `fcntl` shows it, a non-blocking read says
/// `WouldBlock` at once, and switching back makes the read park again. A plain thread given a
/// descriptor that a fiber used still sees a blocking read.
#[test]
fn the_user_s_blocking_mode_is_kept_and_plain_threads_still_block() {
    let _one = serial();
    let rt = two_carriers();
    let (a, b) = UnixStream::pair().unwrap();
    let fd = a.as_raw_fd();
    let a = rt
        .spawn(move || {
            let mut b2 = b.try_clone().unwrap();
            let w = vt::spawn(move || {
                vt::sleep(Duration::from_millis(20));
                b2.write_all(b"x").unwrap();
                b2
            });
            let mut buf = [0u8; 1];
            (&a).read_exact(&mut buf).unwrap(); // parks until the writer writes
            // SAFETY: a plain query of an open descriptor.
            let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
            assert_eq!(fl & libc::O_NONBLOCK, 0, "the hooks' own non-blocking mode shows");
            a.set_nonblocking(true).unwrap();
            // SAFETY: as above.
            assert_ne!(unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK, 0);
            assert_eq!((&a).read(&mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock);
            a.set_nonblocking(false).unwrap();
            let b2 = w.join().unwrap();
            (a, b2, b)
        })
        .join()
        .unwrap();
    let (a, mut b2, _b) = a;
    // A plain thread reads the descriptor the hooks keep non-blocking underneath: it must block
    // until the data comes, not fail with `WouldBlock`.
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 2];
        (&a).read_exact(&mut buf).map(|_| buf)
    });
    std::thread::sleep(Duration::from_millis(50));
    b2.write_all(b"yz").unwrap();
    assert_eq!(&reader.join().unwrap().unwrap(), b"yz");
}

/// A descriptor number a fiber used, closed and reused for a socket the user made non-blocking,
/// does not inherit the old entry: the new socket says `WouldBlock` rather than park for ever.
#[test]
fn a_reused_descriptor_number_starts_afresh() {
    let _one = serial();
    let rt = two_carriers();
    rt.spawn(|| {
        let (a, mut b) = UnixStream::pair().unwrap();
        b.write_all(b"1").unwrap();
        (&a).read_exact(&mut [0u8; 1]).unwrap(); // a is now known as blocking
        let old = a.as_raw_fd();
        drop(a);
        // The kernel hands out the lowest free number; other tests may take it first, so make
        // pairs until one lands on it (kept open meanwhile).
        let mut kept = Vec::new();
        let (c, _d) = loop {
            let (c, d) = UnixStream::pair().unwrap();
            c.set_nonblocking(true).unwrap();
            if c.as_raw_fd() == old {
                break (c, d);
            }
            assert!(kept.len() < 1000, "descriptor {old} never came back");
            kept.push((c, d));
        };
        assert_eq!((&c).read(&mut [0u8; 1]).unwrap_err().kind(), io::ErrorKind::WouldBlock);
    })
    .join()
    .unwrap();
    assert_no_compensation(&rt);
}

/// A cancelled fiber inside a hooked call: the call returns (a read with `ECANCELED`, a sleep
/// early, a std lock wait once it has the lock), no unwind crosses the C frames, and the fiber
/// stops at its next wait in Rust code.
#[test]
fn a_cancelled_fiber_leaves_a_hooked_call_and_stops_at_its_next_wait() {
    let _one = serial();
    let rt = two_carriers();
    let t = Instant::now();
    // A read nobody will satisfy.
    let (a, _b) = UnixStream::pair().unwrap();
    let got = Arc::new(std::sync::Mutex::new(None));
    let g = got.clone();
    // Each fiber says it has started before its call, so that the cancellation finds it
    // running (one cancelled before it starts never runs); before or inside the call's park, the
    // outcome is the same, since a stop request stays until acted on.
    let (ready_tx, ready_rx) = vt::channel::bounded::<()>(3);
    let r1 = ready_tx.clone();
    let reader = rt.spawn(move || {
        r1.send(()).unwrap();
        let e = (&a).read(&mut [0u8; 1]).unwrap_err();
        *g.lock().unwrap() = e.raw_os_error();
        vt::yield_now();
        unreachable!("a cancelled fiber ran past its next wait");
    });
    // A sleep far longer than the test.
    let r2 = ready_tx.clone();
    let sleeper = rt.spawn(move || {
        r2.send(()).unwrap();
        std::thread::sleep(Duration::from_secs(60));
        vt::yield_now();
        unreachable!("a cancelled fiber ran past its next wait");
    });
    // A std lock wait: uncancellable (std's lock cannot fail), so the fiber gets the lock once
    // its holder lets go, then stops at its next wait.
    let m = Arc::new(std::sync::Mutex::new(0));
    let (tx, rx) = vt::channel::bounded::<()>(1);
    let (held_tx, held_rx) = vt::channel::bounded::<()>(1);
    let (m1, m2) = (m.clone(), m.clone());
    let holder = rt.spawn(move || {
        let _g = m1.lock().unwrap();
        held_tx.send(()).unwrap();
        rx.recv().unwrap();
    });
    held_rx.recv().unwrap();
    let locker = rt.spawn(move || {
        ready_tx.send(()).unwrap();
        *m2.lock().unwrap() += 1;
        vt::yield_now();
        unreachable!("a cancelled fiber ran past its next wait");
    });
    for _ in 0..3 {
        ready_rx.recv().unwrap();
    }
    reader.cancel();
    sleeper.cancel();
    locker.cancel();
    for h in [reader, sleeper] {
        assert!(h.join().unwrap_err().downcast_ref::<vt::Cancelled>().is_some());
    }
    tx.send(()).unwrap();
    holder.join().unwrap();
    assert!(locker.join().unwrap_err().downcast_ref::<vt::Cancelled>().is_some());
    assert_eq!(*m.lock().unwrap(), 1, "the lock wait ended without the lock");
    assert!(t.elapsed() < Duration::from_secs(30), "the sleep was not cut short");
    let e = *got.lock().unwrap();
    // The read either parked and was cancelled there, or (cancelled before it parked) saw the
    // request at its park: ECANCELED both ways.
    assert_eq!(e, Some(libc::ECANCELED));
    assert_no_compensation(&rt);
}

/// The control for `assert_no_compensation`: a read the hooks do not see (the raw system call)
/// blocks its carrier until a plain thread writes 500 ms later, and the supervisor, at this
/// file's interval, starts a carrier for the fibers queued behind it.
#[test]
fn a_carrier_blocked_in_a_raw_read_is_caught() {
    let _one = serial();
    let rt = two_carriers();
    let (a, mut b) = UnixStream::pair().unwrap();
    let fd = a.as_raw_fd();
    let hs: Vec<_> = (0..2)
        .map(|_| {
            rt.spawn(move || {
                let mut buf = [0u8; 1];
                // SAFETY: `buf` is valid for one byte; `a` outlives the fibers (joined below).
                unsafe { libc::syscall(libc::SYS_read, fd, buf.as_mut_ptr(), 1) }
            })
        })
        .collect();
    let others: Vec<_> = (0..100).map(|_| rt.spawn(|| vt::sleep(Duration::from_millis(1)))).collect();
    std::thread::sleep(Duration::from_millis(500));
    b.write_all(b"xy").unwrap();
    join_all(others);
    join_all(hs);
    drop(a);
    let m = rt.metrics();
    assert!(m.compensations >= 1, "{m}");
}

/// A dump names the hooked call a fiber is parked in.
#[test]
fn a_dump_names_a_fiber_parked_in_a_hooked_read() {
    let _one = serial();
    let rt = two_carriers();
    let (a, mut b) = UnixStream::pair().unwrap();
    let h = rt.spawn(move || (&a).read(&mut [0u8; 1]).unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !rt
        .dump()
        .fibers()
        .iter()
        .any(|f| matches!(f.state, vt::FiberState::Parked { reason: vt::WaitReason::HookedRead, .. }))
    {
        assert!(Instant::now() < deadline, "no fiber parked in a hooked read: {}", rt.dump());
        std::thread::yield_now();
    }
    assert!(rt.dump().to_string().contains("hooked socket or pipe read"), "{}", rt.dump());
    b.write_all(b"x").unwrap();
    assert_eq!(h.join().unwrap(), 1);
}

/// A duplicate (`try_clone`) shares the open file, and so the non-blocking mode the hooks set
/// underneath when a fiber first uses either: the other still behaves as the user left it
/// (blocking), whichever a fiber used first.
#[test]
fn a_clone_used_first_leaves_the_original_blocking() {
    let _one = serial();
    let rt = two_carriers();
    let (a, mut b) = UnixStream::pair().unwrap();
    // Cloned before any fiber touched either (as a server's `try_clone` of an accepted stream).
    let clone = a.try_clone().unwrap();
    b.write_all(b"12").unwrap();
    let h = rt.spawn(move || {
        (&clone).read_exact(&mut [0u8; 1]).unwrap(); // the clone first: the file goes non-blocking
        // SAFETY: a plain query of an open descriptor.
        let fl = unsafe { libc::fcntl(a.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(fl & libc::O_NONBLOCK, 0, "the original shows the hooks' mode as the user's");
        (&a).read_exact(&mut [0u8; 1]).unwrap();
        // Nothing left: a blocking read of the original parks until the writer writes.
        let w = vt::spawn(move || {
            vt::sleep(Duration::from_millis(20));
            b.write_all(b"3").unwrap();
            b
        });
        let mut c = [0u8; 1];
        (&a).read_exact(&mut c).unwrap();
        drop(w.join().unwrap());
        c[0]
    });
    assert_eq!(h.join().unwrap(), b'3');
    assert_no_compensation(&rt);
}

/// What std's own `net` tests check that the tests above do not (std's suites on fibers,
/// `arch/hooks.md`): `UdpSocket`'s `recv_from`/`send_to` park fibers, and a `shutdown(Read)`
/// from another fiber ends a read parked on the same socket (std's `close_read_wakes_up`).
#[test]
fn udp_echo_and_a_shutdown_read_wake_parked_fibers() {
    let _one = serial();
    let rt = two_carriers();
    rt.block_on(|| {
        let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let n = 100;
        let echo = vt::spawn(move || {
            let mut buf = [0u8; 64];
            for _ in 0..n {
                let (len, from) = server.recv_from(&mut buf).unwrap(); // parks until a client sends
                server.send_to(&buf[..len], from).unwrap();
            }
        });
        let clients: Vec<_> = (0..n)
            .map(|i: u32| {
                vt::spawn(move || {
                    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                    s.send_to(&i.to_le_bytes(), addr).unwrap();
                    let mut buf = [0u8; 64];
                    let (len, from) = s.recv_from(&mut buf).unwrap();
                    assert_eq!((&buf[..len], from), (&i.to_le_bytes()[..], addr));
                })
            })
            .collect();
        join_all(clients);
        echo.join().unwrap();

        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = vt::spawn(move || TcpStream::connect(addr).unwrap()); // stays silent
        let (conn, _) = listener.accept().unwrap();
        let closer = conn.try_clone().unwrap();
        let reader = vt::spawn(move || {
            let mut conn = conn;
            conn.read(&mut [0u8; 8])
        });
        // The shutdown must come while the read is parked, not before it.
        while !vt::dump().to_string().contains("parked on a hooked socket or pipe read") {
            vt::yield_now();
        }
        closer.shutdown(std::net::Shutdown::Read).unwrap();
        assert_eq!(reader.join().unwrap().unwrap(), 0);
        drop(peer.join().unwrap());
    });
    assert_no_compensation(&rt);
}

/// 10,000 `std::net` connections, all open at once: an echo server in fibers, in a child
/// process of its own (both ends in one process would need 20,000 descriptors, this machine's
/// whole limit), and 10,000 client fibers here. Each client connects, waits until every client
/// has its connection, then writes 2 to 4 KiB of its own pattern, half-closes, reads the echo
/// back with `read_exact` and sees the end of stream. Both processes run 2 carriers with hooks,
/// and each asserts that it needed at most one compensating carrier. Every fiber carves a stack
/// of its own (10,000 on each side: a system call for each guard page, then the first touch of
/// its pages), and a carrier that sleeps in the kernel through a whole supervisor sample
/// meanwhile is taken for blocked, as the supervisor's rule says it should be: the server
/// needed one in 4 of 77 runs on 2026-12-06 (`metrics` then read "1 detections, 1
/// compensations", no location caught). Calls that the hooks failed to park would block a
/// carrier at every one of the 10,000 connections.
///
/// Listen backlog: the server listens with 4,096 (somaxconn here), and a client holds one of
/// fewer permits from before its `connect` until the server's greeting byte says its connection
/// was accepted, so the accept queue never overflows (an overflow means SYN retries, a second
/// or more each, or a reset when a SYN cookie fails to validate). Ports: 10,000 ephemeral ports
/// of 28,232; the clients close first, so they hold the `TIME_WAIT`s, but Linux gives a
/// connecting socket a port in `TIME_WAIT` towards another destination, and every run listens
/// on a port of its own, so a second run within the minute finds the ports it needs.
#[test]
fn ten_thousand_std_net_connections_held_open_at_once_on_two_carriers_each_side() {
    const CHILD: &str = "VT_HOOKS_ECHO_SERVER";
    const NAME: &str = "ten_thousand_std_net_connections_held_open_at_once_on_two_carriers_each_side";
    let n = 10_000;
    if let Ok(n) = std::env::var(CHILD) {
        let n: usize = n.parse().unwrap();
        common::within(Duration::from_secs(300), "the echo server", move || echo_server(n));
        return;
    }
    let _one = serial();
    raise_open_files(n + 200);
    let mut server = KillOnDrop(
        common::rerun_self(NAME, CHILD, &n.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("starting the echo server's process"),
    );
    let out = server.0.stdout.take().unwrap();
    let t = Instant::now();
    let report = common::within(Duration::from_secs(240), "10,000 echo clients", move || {
        let mut lines = io::BufReader::new(out).lines();
        let addr: SocketAddr = loop {
            let l = lines.next().expect("the server exited before listening").unwrap();
            // libtest's "test <name> ... " has no line end: the line may start with it.
            if let Some((_, a)) = l.split_once("echo server listening on ") {
                break a.parse().unwrap();
            }
        };
        echo_clients(addr, n);
        // The server's report, once it has served every connection; then its end (its stdout
        // closes as it exits), before `wait` closes its stdin, which would end it early.
        let mut lines = lines.map(Result::unwrap);
        let report = lines.find_map(|l| l.split_once("echo server report: ").map(|(_, r)| r.to_owned()));
        let report = report.expect("no report from the server");
        lines.for_each(drop);
        report
    });
    let took = t.elapsed();
    let status = server.0.wait().unwrap();
    assert!(status.success(), "the echo server failed: {status}");
    eprintln!("{n} connections held open at once, echoed in {took:?}; the server: {report}");
    let (served, carriers) = report.split_once(", compensations ").expect("the report's format");
    assert_eq!(served, format!("{n} connections, {} bytes", total_len(n)));
    let (compensations, peak) = carriers.split_once(", carriers_peak ").expect("the report's format");
    let (compensations, peak): (u64, usize) = (compensations.parse().unwrap(), peak.parse().unwrap());
    assert!(compensations <= 1 && peak <= 3, "the server needed compensating carriers: {report}");
}

/// Bytes client `i` sends: 2 to 4 KiB, a few KiB each, so that the echo fits in the socket
/// buffers and the client needs no second fiber to write while it reads.
fn echo_len(i: usize) -> usize {
    2048 + (i * 509) % 2049
}

fn total_len(n: usize) -> usize {
    (0..n).map(echo_len).sum()
}

/// Client `i`'s byte `k`: the pattern depends on `i`, so that a connection mixed up with another
/// shows.
fn echo_byte(i: usize, k: usize) -> u8 {
    ((k + i) % 251) as u8
}

/// Kills the child when the test fails (the child also ends itself: `echo_server`'s limit, and
/// its stdin's end).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Raises this process's soft limit on open descriptors to its hard limit, which must allow
/// `need`.
fn raise_open_files(need: usize) {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `l` is a writable rlimit.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) }, 0);
    assert!(
        l.rlim_max as usize >= need,
        "this test needs {need} open descriptors per process; the hard limit is {} (ulimit -Hn)",
        l.rlim_max
    );
    if l.rlim_cur < l.rlim_max {
        l.rlim_cur = l.rlim_max;
        // SAFETY: a valid rlimit, no higher than the hard limit.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) }, 0);
    }
}

/// The child's part: accepts `n` connections, each served by a fiber that sends a greeting byte
/// then echoes with `io::copy` until the client's end of stream; prints what it served.
fn echo_server(n: usize) {
    raise_open_files(n + 200);
    // The parent's end: if it goes away (killed), so does this process.
    std::thread::spawn(|| {
        let _ = io::stdin().read(&mut [0u8; 1]);
        std::process::exit(3);
    });
    let rt = two_carriers();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    // std listens with a backlog of 128; the kernel caps this at somaxconn.
    // SAFETY: a plain call on the listener's open descriptor.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 4096) }, 0);
    println!("echo server listening on {}", listener.local_addr().unwrap());
    let h = rt.handle();
    let served = rt
        .spawn(move || {
            // The acceptor only accepts and spawns, to keep the accept queue short.
            let conns: Vec<_> = (0..n)
                .map(|_| {
                    let (s, _) = listener.accept().unwrap();
                    h.spawn(move || {
                        (&s).write_all(b"+").unwrap();
                        let echoed = io::copy(&mut &s, &mut &s).unwrap();
                        s.shutdown(std::net::Shutdown::Write).unwrap();
                        echoed
                    })
                })
                .collect();
            join_all(conns).into_iter().sum::<u64>()
        })
        .join()
        .unwrap();
    let m = rt.metrics();
    println!(
        "echo server report: {n} connections, {served} bytes, compensations {}, carriers_peak {}",
        m.compensations, m.carriers_peak
    );
}

/// Every client holds its connection until all `n` have theirs, or one failed.
struct AllConnected {
    state: vt::sync::Mutex<(usize, Option<String>)>,
    cv: vt::sync::Condvar,
}

impl AllConnected {
    /// Counts the caller in and waits for the rest; `Err` if a client failed.
    fn arrive(&self, n: usize) -> Result<(), String> {
        let mut g = self.state.lock().unwrap();
        g.0 += 1;
        if g.0 == n {
            self.cv.notify_all();
        }
        let g = self.cv.wait_while(g, |(c, failed)| *c < n && failed.is_none()).unwrap();
        g.1.as_ref().map_or(Ok(()), |_| Err("another client failed".into()))
    }

    /// Lets every waiting client go, to fail.
    fn fail(&self, why: &str) {
        self.state.lock().unwrap().1.get_or_insert_with(|| why.into());
        self.cv.notify_all();
    }
}

/// `n` client fibers on two carriers: the test's description. Fails with the first client's
/// error, if any.
fn echo_clients(addr: SocketAddr, n: usize) {
    let rt = two_carriers();
    // Connections the server may not have accepted yet: well under its backlog.
    let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .map_or(128, |s| s.trim().parse().unwrap_or(128));
    let in_flight = Arc::new(vt::sync::Semaphore::new((somaxconn / 4).clamp(32, 1024)));
    let all = Arc::new(AllConnected { state: vt::sync::Mutex::new((0, None)), cv: vt::sync::Condvar::new() });
    let clients: Vec<_> = (0..n)
        .map(|i| {
            let (in_flight, all) = (in_flight.clone(), all.clone());
            rt.spawn(move || {
                let r = echo_client(addr, i, n, &in_flight, &all);
                if let Err(e) = &r {
                    all.fail(e);
                }
                r
            })
        })
        .collect();
    let results = join_all(clients);
    if let Some(e) = results.iter().find_map(|r| r.as_ref().err().filter(|e| *e != "another client failed")) {
        panic!("{e}");
    }
    // At most one, as for the server (see the test's doc).
    let m = rt.metrics();
    assert!(m.compensations <= 1 && m.carriers_peak <= 3, "the clients needed compensating carriers: {m}");
}

fn echo_client(
    addr: SocketAddr,
    i: usize,
    n: usize,
    in_flight: &vt::sync::Semaphore,
    all: &AllConnected,
) -> Result<(), String> {
    let err = |what: &'static str| move |e: io::Error| format!("client {i}: {what}: {e}");
    let permit = in_flight.acquire();
    let mut s = TcpStream::connect(addr).map_err(err("connect"))?;
    let mut hello = [0u8; 1];
    s.read_exact(&mut hello).map_err(err("greeting"))?;
    if hello != *b"+" {
        return Err(format!("client {i}: greeting {hello:?}"));
    }
    drop(permit);
    all.arrive(n)?;
    let msg: Vec<u8> = (0..echo_len(i)).map(|k| echo_byte(i, k)).collect();
    s.write_all(&msg).map_err(err("write"))?;
    s.shutdown(std::net::Shutdown::Write).map_err(err("shutdown"))?;
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).map_err(err("reading the echo"))?;
    if let Some(k) = (0..msg.len()).find(|&k| back[k] != msg[k]) {
        return Err(format!("client {i}: echo byte {k} is {}, sent {}", back[k], msg[k]));
    }
    match s.read(&mut [0u8; 1]) {
        Ok(0) => Ok(()),
        Ok(_) => Err(format!("client {i}: more bytes after the echo")),
        Err(e) => Err(format!("client {i}: waiting for the end of stream: {e}")),
    }
}

/// A plain thread's blocking read that starts while a fiber's first hooked call on the same
/// descriptor classifies it (switching it to non-blocking underneath) blocks until data comes,
/// never returning `WouldBlock`. Each round: a fresh socket pair; a plain thread and a fiber
/// released together, the thread reading the empty end after a delay that sweeps the fiber's
/// classification (0 to 255 spins, by round), the fiber writing through that end (its write
/// classifies it); then the test sends the byte the thread waits for. The window the ordering
/// in `classify_now` closes lasts a fraction of a microsecond unless the carrier is preempted in
/// it, so this catches it only by chance, and a wider one reliably (`arch/hooks.md`, "The switch
/// and a plain thread"). `VT_CLASSIFY_ROUNDS` sets the rounds (500).
#[test]
fn a_plain_thread_reading_while_a_fiber_classifies_the_descriptor_still_blocks() {
    let _one = serial();
    let rt = two_carriers();
    let rounds: usize = std::env::var("VT_CLASSIFY_ROUNDS").map_or(500, |r| r.parse().unwrap());
    for round in 0..rounds {
        let (a, mut b) = UnixStream::pair().unwrap();
        let a = Arc::new(a);
        let go = Arc::new(AtomicUsize::new(0));
        // Released together: a spin, then yielding the CPU (on a loaded machine the other
        // party may not be running at all).
        let arrive = |go: &AtomicUsize| {
            go.fetch_add(1, Ordering::AcqRel);
            let mut spins = 0u32;
            while go.load(Ordering::Acquire) < 2 {
                spins += 1;
                if spins < 1000 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        };
        let (a2, go2) = (a.clone(), go.clone());
        let reader = std::thread::spawn(move || {
            arrive(&go2);
            for _ in 0..round % 256 {
                std::hint::spin_loop();
            }
            let mut buf = [0u8; 1];
            (&*a2).read(&mut buf).map(|k| (k, buf[0]))
        });
        let (a3, go3) = (a.clone(), go.clone());
        rt.spawn(move || {
            arrive(&go3);
            (&*a3).write_all(b"x").unwrap();
        })
        .join()
        .unwrap();
        b.write_all(b"y").unwrap();
        let got = reader.join().unwrap();
        assert!(matches!(got, Ok((1, b'y'))), "round {round}: the plain thread's blocking read gave {got:?}");
        let mut x = [0u8; 1];
        b.read_exact(&mut x).unwrap();
        assert_eq!(&x, b"x");
    }
}

/// A fiber whose hooked wait the runtime's drop cut short (`ECANCELED`) and that calls again,
/// as an accept loop that logs its errors and goes on does: each later call fails the same way
/// at once. Passed through instead, the call waited in the kernel for ever on the thread that
/// unwinds the fiber, and the drop never returned.
#[test]
fn a_fiber_that_calls_again_after_its_runtime_s_drop_cut_its_wait_lets_the_drop_finish() {
    let _one = serial();
    let rt = two_carriers();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let (a, _b) = UnixStream::pair().unwrap();
    let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (ready_tx, ready_rx) = vt::channel::bounded::<()>(2);
    let (e1, r1) = (errors.clone(), ready_tx.clone());
    rt.spawn(move || {
        r1.send(()).unwrap();
        for _ in 0..3 {
            if let Err(e) = listener.accept() {
                e1.lock().unwrap().push(("accept", e.raw_os_error()));
            }
        }
    });
    let e2 = errors.clone();
    rt.spawn(move || {
        ready_tx.send(()).unwrap();
        for _ in 0..3 {
            let mut p = libc::pollfd { fd: a.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut p, 1, -1) } < 0 {
                e2.lock().unwrap().push(("poll", io::Error::last_os_error().raw_os_error()));
            }
        }
    });
    for _ in 0..2 {
        ready_rx.recv().unwrap();
    }
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(rt);
        done_tx.send(()).unwrap();
    });
    done_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the runtime's drop did not finish: a hooked call after ECANCELED blocked it");
    let mut got = errors.lock().unwrap().clone();
    got.sort();
    let cancelled = Some(libc::ECANCELED);
    assert_eq!(got, [[("accept", cancelled); 3], [("poll", cancelled); 3]].concat());
}
