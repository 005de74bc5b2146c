//! `vt::net` on loopback: fiber-per-connection echo at scale, idle connections, timeouts, UDP,
//! resets, descriptor exhaustion, plain-thread use, and waking a fiber parked on a socket.
//! No sleeps paper over races: every wait is on an event; time bounds are generous.
//! Two tests re-execute this binary in a child process (rayon's pattern): one lowers
//! `RLIMIT_NOFILE` there, the other holds the client side of 10,000 connections there, so
//! neither touches the descriptors of the rest of the suite.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use virtual_threads as vt;
use vt::net::{TcpListener, TcpStream, UdpSocket, UnixStream};

mod common;

fn rt() -> vt::Runtime {
    // `kill -QUIT` prints what every fiber waits on, should a test ever hang.
    vt::Runtime::builder().carriers(2).dump_on_sigquit(true).build().unwrap()
}

const LOCALHOST: &str = "127.0.0.1:0";

/// Echoes one connection until the peer closes it; returns how it ended.
fn echo(mut conn: TcpStream) -> io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match conn.read(&mut buf)? {
            0 => return Ok(()),
            n => conn.write_all(&buf[..n])?,
        }
    }
}

/// Binds a listener and runs a fiber-per-connection echo server on it in the calling runtime.
fn spawn_echo_server() -> SocketAddr {
    let listener = TcpListener::bind(LOCALHOST).unwrap();
    let addr = listener.local_addr().unwrap();
    vt::spawn(move || {
        for conn in listener.incoming() {
            let conn = conn.expect("accept");
            vt::spawn(move || echo(conn));
        }
    });
    addr
}

/// Pseudo-random bytes to send; messages are slices of it at varying offsets.
fn pattern() -> Arc<Vec<u8>> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    Arc::new(
        (0..96 * 1024)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect(),
    )
}

/// The soft descriptor limit (the runtime raises it to the hard limit when it starts).
fn nofile_limit() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid, writable rlimit.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    lim.rlim_cur
}

/// Runs this test again in a child process with `VT_NET_CHILD=role`, and returns its stdout.
fn run_child(test: &str, role: &str, env: &[(&str, String)]) -> String {
    let out = common::rerun_self(test, "VT_NET_CHILD", role)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child {role} failed: {}\n{stdout}\n{stderr}", out.status);
    stdout
}

fn child_role() -> Option<String> {
    std::env::var("VT_NET_CHILD").ok()
}

#[test]
fn echo_2000_client_fibers_20_messages_up_to_16k_every_byte_checked() {
    const CLIENTS: usize = 2_000;
    const MESSAGES: usize = 20;
    const MAX: usize = 16 * 1024;
    let pattern = pattern();
    let checked = Arc::new(AtomicUsize::new(0));
    rt().block_on(|| {
        let addr = spawn_echo_server();
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (pattern, checked) = (pattern.clone(), checked.clone());
                vt::spawn(move || {
                    let mut s = TcpStream::connect(addr).unwrap();
                    let mut back = vec![0u8; MAX];
                    for m in 0..MESSAGES {
                        let mix = (c * 7919 + m * 104_729) ^ (c << 7);
                        let len = 1 + mix % MAX;
                        let at = mix % (pattern.len() - MAX);
                        let msg = &pattern[at..at + len];
                        s.write_all(msg).unwrap();
                        s.read_exact(&mut back[..len]).unwrap();
                        assert!(back[..len] == *msg, "client {c} message {m}: echo differs");
                        checked.fetch_add(len, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for h in clients {
            h.join().unwrap();
        }
    });
    assert!(checked.load(Ordering::Relaxed) > CLIENTS * MESSAGES);
}

#[test]
fn ten_thousand_idle_connections_held_at_once() {
    const CONNS: usize = 10_000;
    if child_role().as_deref() == Some("idle-clients") {
        // The client side: open every connection, hold them all, then ping each once.
        let addr: SocketAddr = std::env::var("VT_NET_ADDR").unwrap().parse().unwrap();
        rt().block_on(|| {
            let fibers: Vec<_> = (0..8)
                .map(|_| {
                    vt::spawn(move || {
                        (0..CONNS / 8).map(|_| TcpStream::connect(addr).unwrap()).collect::<Vec<_>>()
                    })
                })
                .collect();
            let conns: Vec<TcpStream> = fibers.into_iter().flat_map(|h| h.join().unwrap()).collect();
            assert_eq!(conns.len(), CONNS);
            // Every connection still works: one byte out on each, then every echo back.
            for (i, mut c) in conns.iter().enumerate() {
                c.write_all(&[i as u8]).unwrap();
            }
            for (i, mut c) in conns.iter().enumerate() {
                let mut b = [0u8];
                c.read_exact(&mut b).unwrap();
                assert_eq!(b[0], i as u8);
            }
        });
        println!("idle clients: ok");
        return;
    }
    // Each side holds CONNS descriptors in its own process; leave room for the rest of the suite.
    let need = (CONNS + 6_000) as u64;
    if nofile_limit() < need {
        let _ = rt(); // raises the soft limit to the hard one
        if nofile_limit() < need {
            println!(
                "skipped: RLIMIT_NOFILE is {}, this test needs {need} (raise `ulimit -n`)",
                nofile_limit()
            );
            return;
        }
    }
    let live = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    rt().block_on(|| {
        let listener = TcpListener::bind(LOCALHOST).unwrap();
        let addr = listener.local_addr().unwrap();
        let (live2, peak2) = (live.clone(), peak.clone());
        let server = vt::spawn(move || {
            let conns: Vec<_> = (0..CONNS)
                .map(|_| {
                    let conn = listener.accept().unwrap().0;
                    peak2.fetch_max(live2.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    let live = live2.clone();
                    vt::spawn(move || {
                        let r = echo(conn);
                        live.fetch_sub(1, Ordering::SeqCst);
                        r
                    })
                })
                .collect();
            conns.into_iter().map(|h| h.join().unwrap()).collect::<io::Result<Vec<()>>>()
        });
        // The child blocks this fiber's carrier while it runs: run it as a blocking section.
        let out = vt::blocking(|| {
            run_child(
                "ten_thousand_idle_connections_held_at_once",
                "idle-clients",
                &[("VT_NET_ADDR", addr.to_string())],
            )
        });
        assert!(out.contains("idle clients: ok"), "{out}");
        server.join().unwrap().unwrap();
    });
    assert_eq!(peak.load(Ordering::SeqCst), CONNS, "every connection was held at the same time");
    assert_eq!(live.load(Ordering::SeqCst), 0);
}

#[test]
fn read_and_write_timeouts_fire_like_std() {
    let listener = TcpListener::bind(LOCALHOST).unwrap();
    let addr = listener.local_addr().unwrap();
    let check = move || {
        let s = TcpStream::connect(addr).unwrap();
        let (_peer, _) = listener.accept().unwrap(); // never writes, never reads
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        assert_eq!(s.read_timeout().unwrap(), Some(Duration::from_millis(50)));
        let start = Instant::now();
        let e = (&s).read(&mut [0u8; 16]).unwrap_err();
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert!(matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut), "{e:?}");
        assert!(s.set_read_timeout(Some(Duration::ZERO)).unwrap_err().kind() == io::ErrorKind::InvalidInput);
        // Fill the peer's receive buffer and our send buffer: the write times out.
        s.set_write_timeout(Some(Duration::from_millis(50))).unwrap();
        let chunk = vec![7u8; 64 * 1024];
        let e = loop {
            if let Err(e) = (&s).write(&chunk) {
                break e;
            }
        };
        assert!(matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut), "{e:?}");
        listener
    };
    // In a fiber, then on a plain thread: the same behaviour.
    let listener = rt().block_on(check);
    let addr = listener.local_addr().unwrap();
    let std_read = {
        let s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        (&s).read(&mut [0u8; 1]).unwrap_err().kind()
    };
    drop(listener.accept());
    std::thread::spawn(move || {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        assert_eq!((&s).read(&mut [0u8; 1]).unwrap_err().kind(), std_read, "same error kind as std");
    })
    .join()
    .unwrap();
}

#[test]
fn connect_timeout_to_a_full_backlog_times_out() {
    // A listener that never accepts, with a backlog of 0: once its queue holds one connection
    // the kernel drops further SYNs, so a connect gets no answer.
    let listener = std::net::TcpListener::bind(LOCALHOST).unwrap();
    // SAFETY: plain call on a descriptor the listener owns; listen may be called again to
    // change the backlog.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
    let addr = listener.local_addr().unwrap();
    let timeout = Duration::from_millis(200);
    let attempt = move || {
        let mut held = Vec::new();
        for _ in 0..8 {
            let start = Instant::now();
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(s) => held.push(s), // filled a queue slot
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e:?}");
                    assert!(start.elapsed() >= timeout);
                    assert!(start.elapsed() < timeout * 10);
                    return held.len();
                }
            }
        }
        panic!("every connect succeeded: the backlog never filled");
    };
    let filled = rt().block_on(attempt);
    assert!(filled <= 4, "{filled}");
    // On a plain thread too (the queue is still full).
    std::thread::spawn(attempt).join().unwrap();
    assert_eq!(
        TcpStream::connect_timeout(&addr, Duration::ZERO).unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    // A closed port refuses at once.
    let closed = std::net::TcpListener::bind(LOCALHOST).unwrap().local_addr().unwrap();
    let e = rt().block_on(|| TcpStream::connect(closed).unwrap_err());
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
}

#[test]
fn udp_round_trips() {
    const ROUNDS: usize = 2_000;
    rt().block_on(|| {
        let server = UdpSocket::bind(LOCALHOST).unwrap();
        let server_addr = server.local_addr().unwrap();
        let echo = vt::spawn(move || {
            let mut buf = [0u8; 2048];
            for _ in 0..ROUNDS {
                let (n, from) = server.recv_from(&mut buf).unwrap();
                server.send_to(&buf[..n], from).unwrap();
            }
        });
        let client = UdpSocket::bind(LOCALHOST).unwrap();
        client.connect(server_addr).unwrap();
        let mut buf = [0u8; 2048];
        for i in 0..ROUNDS {
            let msg = [(i % 251) as u8; 100];
            let len = 1 + i % 100;
            if i % 2 == 0 {
                client.send(&msg[..len]).unwrap();
                assert_eq!(client.recv(&mut buf).unwrap(), len);
            } else {
                client.send_to(&msg[..len], server_addr).unwrap();
                let (n, from) = client.recv_from(&mut buf).unwrap();
                assert_eq!((n, from), (len, server_addr));
            }
            assert_eq!(buf[..len], msg[..len]);
        }
        echo.join().unwrap();
        // A receive timeout fires.
        client.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        assert_eq!(client.recv(&mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock);
    });
}

#[test]
fn a_reset_mid_read_is_an_error_on_that_stream_only() {
    rt().block_on(|| {
        let listener = TcpListener::bind(LOCALHOST).unwrap();
        let addr = listener.local_addr().unwrap();
        let a = TcpStream::connect(addr).unwrap();
        let server_a = listener.accept().unwrap().0;
        let mut b = TcpStream::connect(addr).unwrap();
        let server_b = listener.accept().unwrap().0;
        let (ra, rb) = (vt::spawn(move || echo(server_a)), vt::spawn(move || echo(server_b)));
        // One round trip on `a`, so its server fiber is back in `read` (or about to be) when
        // the reset comes.
        (&a).write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        (&a).read_exact(&mut buf).unwrap();
        a.set_linger(Some(Duration::ZERO)).unwrap();
        drop(a); // RST
        let e = ra.join().unwrap().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e:?}");
        // `b` is unaffected.
        b.write_all(b"pong").unwrap();
        b.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"pong");
        b.shutdown(Shutdown::Write).unwrap();
        rb.join().unwrap().unwrap();
    });
}

#[test]
fn accept_under_an_exhausted_fd_limit_is_an_error_and_the_server_keeps_running() {
    if child_role().as_deref() != Some("emfile") {
        let out = run_child(
            "accept_under_an_exhausted_fd_limit_is_an_error_and_the_server_keeps_running",
            "emfile",
            &[],
        );
        assert!(out.contains("emfile child: ok"), "{out}");
        return;
    }
    let rt = rt(); // raises the soft limit first; we lower it below, in this process only
    rt.block_on(|| {
        let listener = TcpListener::bind(LOCALHOST).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: `lim` is a valid, writable rlimit.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        lim.rlim_cur = 64;
        // SAFETY: `lim` is a valid rlimit whose soft limit is below its hard limit.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
        let mut filler = Vec::new();
        let e = loop {
            match std::fs::File::open("/dev/null") {
                Ok(f) => filler.push(f),
                Err(e) => break e,
            }
        };
        assert_eq!(e.raw_os_error(), Some(libc::EMFILE));
        filler.pop(); // one descriptor free: the client takes it, none is left for accept
        let mut client = TcpStream::connect(addr).unwrap();
        let e = listener.accept().unwrap_err();
        // The OS error, explained: which limit, and how to raise it.
        let os = e.get_ref().and_then(|inner| inner.source()).and_then(|s| s.downcast_ref::<io::Error>());
        assert_eq!(os.and_then(io::Error::raw_os_error), Some(libc::EMFILE), "{e:?}");
        assert!(e.to_string().contains("RLIMIT_NOFILE") && e.to_string().contains("ulimit -n"), "{e}");
        // Free descriptors: the same listener takes the same queued connection.
        filler.truncate(filler.len() - 2);
        let (conn, _) = listener.accept().unwrap();
        let server = vt::spawn(move || echo(conn));
        client.write_all(b"still serving").unwrap();
        let mut buf = [0u8; 13];
        client.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"still serving");
        drop(client);
        server.join().unwrap().unwrap();
    });
    println!("emfile child: ok");
}

#[test]
fn plain_thread_use_behaves_as_std() {
    // No runtime anywhere: every call blocks its thread, as std's would.
    let listener = TcpListener::bind(LOCALHOST).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().unwrap();
        assert_eq!(s.peer_addr().unwrap(), peer);
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        s.write_all(&buf).unwrap();
        (listener, s)
    });
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    assert!(c.nodelay().unwrap());
    c.write_all(b"hello").unwrap();
    let mut buf = [0u8; 5];
    assert_eq!(c.peek(&mut buf).unwrap(), 5); // waits for the echo
    c.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    let (listener, _server_side) = server.join().unwrap();
    // Non-blocking mode: WouldBlock, as std.
    listener.set_nonblocking(true).unwrap();
    assert_eq!(listener.accept().unwrap_err().kind(), io::ErrorKind::WouldBlock);
    c.set_nonblocking(true).unwrap();
    assert_eq!(c.read(&mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock);
    // Conversions keep the mode: this one goes back to std non-blocking, the listener blocking.
    let c = c.into_std();
    assert_eq!((&c).read(&mut buf).unwrap_err().kind(), io::ErrorKind::WouldBlock);
    listener.set_nonblocking(false).unwrap();
    let listener: std::net::TcpListener = listener.into();
    let t = std::thread::spawn(move || listener.accept().map(|_| ()));
    let _second = std::net::TcpStream::connect(addr).unwrap();
    t.join().unwrap().unwrap(); // a blocking std accept worked: the mode was restored
    // Unix streams and UDP from a plain thread.
    let (a, b) = UnixStream::pair().unwrap();
    let t = std::thread::spawn(move || {
        let mut buf = [0u8; 3];
        (&b).read_exact(&mut buf).unwrap();
        (&b).write_all(&buf).unwrap();
    });
    (&a).write_all(b"abc").unwrap();
    let mut back = [0u8; 3];
    (&a).read_exact(&mut back).unwrap();
    assert_eq!(&back, b"abc");
    t.join().unwrap();
    let u = UdpSocket::bind(LOCALHOST).unwrap();
    u.send_to(b"self", u.local_addr().unwrap()).unwrap();
    let mut dgram = [0u8; 8];
    assert_eq!(u.recv_from(&mut dgram).unwrap().0, 4);
}

#[test]
fn closing_or_shutting_down_a_socket_wakes_the_fibers_parked_on_it() {
    rt().block_on(|| {
        // A reader parked on a shared stream wakes with end of stream when it is shut down.
        let listener = TcpListener::bind(LOCALHOST).unwrap();
        let s = Arc::new(TcpStream::connect(listener.local_addr().unwrap()).unwrap());
        let _peer = listener.accept().unwrap();
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let s = s.clone();
                vt::spawn(move || (&*s).read(&mut [0u8; 8]))
            })
            .collect();
        // Let the readers reach their park; the shutdown works whether or not they have.
        for _ in 0..10 {
            vt::yield_now();
        }
        s.shutdown(Shutdown::Both).unwrap();
        for r in readers {
            assert_eq!(r.join().unwrap().unwrap(), 0);
        }
        // A fiber parked in `accept` wakes with an error when the listener is shut down (the
        // way to stop an accept loop on Linux).
        let listener = Arc::new(listener);
        let l2 = listener.clone();
        let acceptor = vt::spawn(move || l2.accept().map(|_| ()));
        for _ in 0..10 {
            vt::yield_now();
        }
        // SAFETY: plain call on a descriptor the listener owns.
        assert_eq!(unsafe { libc::shutdown(listener.as_raw_fd(), libc::SHUT_RD) }, 0);
        assert!(acceptor.join().unwrap().is_err());
    });
}

#[test]
fn fibers_share_a_listener_and_clones_share_a_socket() {
    const CONNS: usize = 200;
    rt().block_on(|| {
        let listener = Arc::new(TcpListener::bind(LOCALHOST).unwrap());
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        // Four acceptors on one listener: every connection is taken by exactly one of them.
        let acceptors: Vec<_> = (0..4)
            .map(|_| {
                let (l, n) = (listener.clone(), accepted.clone());
                vt::spawn(move || {
                    while n.fetch_add(1, Ordering::SeqCst) < CONNS {
                        let (conn, _) = l.accept().unwrap();
                        vt::spawn(move || echo(conn));
                    }
                })
            })
            .collect();
        let clients: Vec<_> = (0..CONNS)
            .map(|i| {
                vt::spawn(move || {
                    let s = TcpStream::connect(addr).unwrap();
                    // Write through a clone, read through the original.
                    let mut w = s.try_clone().unwrap();
                    w.write_all(&i.to_le_bytes()).unwrap();
                    let mut back = [0u8; 8];
                    (&s).read_exact(&mut back).unwrap();
                    assert_eq!(usize::from_le_bytes(back), i);
                })
            })
            .collect();
        for c in clients {
            c.join().unwrap();
        }
        // Exactly CONNS accepts ran, so every acceptor has seen the count pass CONNS.
        for a in acceptors {
            a.join().unwrap();
        }
    });
}

#[test]
fn unix_streams_echo_between_fibers() {
    let dir = std::env::temp_dir().join(format!("vt-net-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("echo.sock");
    let _ = std::fs::remove_file(&path);
    rt().block_on(|| {
        let listener = vt::net::UnixListener::bind(&path).unwrap();
        let server = vt::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match s.read(&mut buf).unwrap() {
                    0 => return,
                    n => s.write_all(&buf[..n]).unwrap(),
                }
            }
        });
        let pattern = pattern();
        let mut c = UnixStream::connect(&path).unwrap();
        let mut back = vec![0u8; 64 * 1024];
        for len in [1, 100, 4096, 65_536] {
            c.write_all(&pattern[..len]).unwrap();
            c.read_exact(&mut back[..len]).unwrap();
            assert!(back[..len] == pattern[..len]);
        }
        c.shutdown(Shutdown::Write).unwrap();
        server.join().unwrap();
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn socket_types_are_send_and_sync_like_std() {
    fn check<T: Send + Sync + std::fmt::Debug>() {}
    check::<TcpStream>();
    check::<TcpListener>();
    check::<UdpSocket>();
    check::<UnixStream>();
    check::<vt::net::UnixListener>();
}

/// Fibers that wait on a socket nobody has registered yet race to register it; the losers must
/// wait on the winner's registration. (They once took it for an orphaned one, left by a dropped
/// runtime, and parked for ever: first seen under valgrind with four acceptors on a listener.)
#[test]
fn fibers_racing_to_register_one_socket_all_wait_on_it() {
    const ROUNDS: usize = 200;
    const FIBERS: usize = 4;
    let rt = rt();
    let waiting = |rt: &vt::Runtime| {
        let d = rt.dump();
        let on_socket = d
            .fibers()
            .iter()
            .filter(|f| matches!(f.state, vt::FiberState::Parked { reason: vt::WaitReason::NetRead, .. }))
            .count();
        (on_socket, d)
    };
    for round in 0..ROUNDS {
        let listener = Arc::new(TcpListener::bind(LOCALHOST).unwrap());
        let addr = listener.local_addr().unwrap();
        let acceptors: Vec<_> = (0..FIBERS)
            .map(|_| {
                let l = listener.clone();
                rt.spawn(move || drop(l.accept().unwrap()))
            })
            .collect();
        // Every acceptor must come to wait on the listener (nothing connects before), and a
        // loser of the race shows up parked on something else.
        let start = Instant::now();
        loop {
            let (n, d) = waiting(&rt);
            if n == FIBERS {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "round {round}: {n} of {FIBERS} wait on the listener\n{d}"
            );
            std::thread::yield_now();
        }
        let clients: Vec<_> = (0..FIBERS).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
        for a in acceptors {
            a.join().unwrap();
        }
        drop(clients);
    }
}

/// A socket lives in the epoll set of the carrier whose fiber first waited on it. When that
/// carrier is blocked in the OS, a fiber on another carrier waiting on the same socket must
/// still be woken (the supervisor polls the blocked carrier's set): without that, the reader
/// below waits until the blocked carrier comes back.
#[test]
fn a_waiter_on_another_carrier_is_woken_while_the_registering_carrier_is_blocked() {
    let rt = vt::Runtime::builder().carriers(1).max_carriers(4).dump_on_sigquit(true).build().unwrap();
    let listener = std::net::TcpListener::bind(LOCALHOST).unwrap();
    let addr = listener.local_addr().unwrap();
    // Registered with carrier 0's set: the first wait is a timed-out read there.
    let stream = rt
        .spawn(move || {
            let s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
            let err = (&s).read(&mut [0u8; 1]).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
            s.set_read_timeout(None).unwrap();
            Arc::new(s)
        })
        .join()
        .unwrap();
    let (mut peer, _) = listener.accept().unwrap();
    // Block carrier 0 in the OS (a std channel, not `vt::blocking`): the supervisor catches it
    // and starts a spare, which runs the reader.
    let (blocked_tx, blocked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let blocker = rt.spawn(move || {
        blocked_tx.send(()).unwrap();
        release_rx.recv().unwrap();
    });
    blocked_rx.recv().unwrap();
    let (got_tx, got_rx) = std::sync::mpsc::channel();
    let s = stream.clone();
    let reader = rt.spawn(move || {
        let mut buf = [0u8; 5];
        (&*s).read_exact(&mut buf).unwrap();
        got_tx.send(buf).unwrap();
    });
    // Write only once the reader is parked on the socket, so that its wake-up is what is tested.
    let start = Instant::now();
    loop {
        let d = rt.dump();
        let parked = d
            .fibers()
            .iter()
            .any(|f| matches!(f.state, vt::FiberState::Parked { reason: vt::WaitReason::NetRead, .. }));
        if parked {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the reader never parked on the socket\n{d}");
        std::thread::yield_now();
    }
    peer.write_all(b"hello").unwrap();
    let got = got_rx.recv_timeout(Duration::from_secs(20));
    release_tx.send(()).unwrap();
    assert_eq!(got.expect("the reader was not woken while carrier 0 was blocked"), *b"hello");
    reader.join().unwrap();
    blocker.join().unwrap();
    drop(stream);
}
