//! Unchanged std I/O on fibers with the `hooks` feature: `std::net`, `UnixStream` pairs and child
//! process pipes park the calling fiber on its carrier's reactor, so two carriers serve a
//! thousand such fibers with no compensating carrier. Peers that close, reset and
//! send-then-close, timeouts, the user's own non-blocking mode, plain threads on a descriptor a
//! fiber used, and a cancelled fiber inside a hooked call. `arch/hooks.md`.
#![cfg(feature = "hooks")]

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use virtual_threads as vt;

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
/// the supervisor still sees it at this interval).
fn builder() -> vt::runtime::Builder {
    vt::Runtime::builder().supervisor_interval(Duration::from_millis(50))
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
    let n = 500;
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
                    let l = libc::linger { l_onoff: 1, l_linger: 0 };
                    // SAFETY: `l` is a valid linger for the call.
                    let r = unsafe {
                        libc::setsockopt(
                            s.as_raw_fd(),
                            libc::SOL_SOCKET,
                            libc::SO_LINGER,
                            (&raw const l).cast(),
                            size_of::<libc::linger>() as u32,
                        )
                    };
                    assert_eq!(r, 0);
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
    let n = 500;
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
