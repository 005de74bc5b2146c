//! `vt::net` under real use: end of stream after data, peers that reset, proxies built from
//! `io::copy`, sockets handed between fibers of busy carriers. Each test is a program a user
//! would write; none may hang. Peers are plain std threads where the point is that the runtime
//! sees the peer's bytes and its close in one readiness event.
//! No sleeps paper over races: every wait is on an event; time bounds are generous.

mod common;

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::within;
use virtual_threads as vt;
use vt::net::{TcpListener, TcpStream};

const LOCALHOST: &str = "127.0.0.1:0";
const LIMIT: Duration = Duration::from_secs(60);

fn rt(carriers: usize) -> vt::Runtime {
    // `kill -QUIT` prints what every fiber waits on, should a test ever hang.
    vt::Runtime::builder().carriers(carriers).dump_on_sigquit(true).build().unwrap()
}

fn message(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + 7) as u8).collect()
}

/// An echo server fiber per connection, each `io::copy` back to the peer then `shutdown(Write)`:
/// the peer sees its bytes, then end of stream.
fn spawn_copy_echo_server() -> SocketAddr {
    let listener = TcpListener::bind(LOCALHOST).unwrap();
    let addr = listener.local_addr().unwrap();
    vt::spawn(move || {
        for conn in listener.incoming() {
            let conn = conn.expect("accept");
            vt::spawn(move || {
                io::copy(&mut &conn, &mut &conn)?;
                conn.shutdown(Shutdown::Write)
            });
        }
    });
    addr
}

/// Writes `msg`, shuts down the write half, reads until end of stream.
fn round_trip(mut s: TcpStream, msg: &[u8]) -> Vec<u8> {
    s.write_all(msg).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut back = Vec::new();
    s.read_to_end(&mut back).unwrap();
    back
}

/// The shape of every proxy and every HTTP/1.0 client: write, half-close, `read_to_end`. The
/// echo's data and its end of stream reach the client close together, often in one readiness
/// event; the short read that takes the data must not make the next read wait for an event that
/// already came.
#[test]
fn read_to_end_after_an_io_copy_echo_sees_the_end_of_stream() {
    for carriers in [1, 2] {
        within(LIMIT, &format!("read_to_end through an io::copy echo on {carriers} carrier(s)"), move || {
            rt(carriers).block_on(|| {
                let addr = spawn_copy_echo_server();
                for len in [1, 100, 4096, 100_000] {
                    let msg = message(len);
                    let back = round_trip(TcpStream::connect(addr).unwrap(), &msg);
                    assert!(back == msg, "{len} bytes: the echo differs");
                }
                // Many at once, and through clones (reader and writer on different fibers).
                let clients: Vec<_> = (0..50)
                    .map(|i| {
                        vt::spawn(move || {
                            let msg = message(100 + i);
                            let s = TcpStream::connect(addr).unwrap();
                            let w = s.try_clone().unwrap();
                            let writer = vt::spawn(move || {
                                (&w).write_all(&msg).unwrap();
                                w.shutdown(Shutdown::Write).unwrap();
                                msg
                            });
                            let mut back = Vec::new();
                            (&s).read_to_end(&mut back).unwrap();
                            assert!(back == writer.join().unwrap(), "client {i}: the echo differs");
                        })
                    })
                    .collect();
                for c in clients {
                    c.join().unwrap();
                }
            })
        });
    }
}

/// A plain-thread peer sends 100 bytes and closes (or resets) while the reader's only carrier
/// computes, so data and hang-up are one event when the carrier next polls. The reader waits
/// with a read timeout, as a careful client would: it must get the data and the end of stream
/// (`Ok(100)`, as std's `TcpStream` gives), or the reset, never `WouldBlock`.
#[test]
fn data_then_close_or_reset_seen_in_one_event_ends_the_stream() {
    for reset in [false, true] {
        within(
            LIMIT,
            &format!("read_to_end from a peer that sends, then {}", if reset { "resets" } else { "closes" }),
            move || {
                let rt = rt(1);
                let listener = std::net::TcpListener::bind(LOCALHOST).unwrap();
                let addr = listener.local_addr().unwrap();
                let sent = Arc::new(AtomicBool::new(false));
                let peer_sent = sent.clone();
                let peer = std::thread::spawn(move || {
                    let (mut conn, _) = listener.accept().unwrap();
                    // Wait for the reader to be registered with its carrier (it writes one byte then).
                    let mut one = [0u8; 1];
                    conn.read_exact(&mut one).unwrap();
                    conn.write_all(&message(100)).unwrap();
                    if reset {
                        common::set_linger_zero(&conn);
                    }
                    drop(conn);
                    peer_sent.store(true, Ordering::Release);
                });
                let reader = rt.spawn(move || {
                    let mut s = TcpStream::connect(addr).unwrap();
                    // One wait on the socket registers it with this carrier.
                    s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
                    assert_eq!(s.read(&mut [0u8; 1]).unwrap_err().kind(), io::ErrorKind::WouldBlock);
                    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                    s.write_all(b"!").unwrap();
                    // Compute (no switch point, so no poll) until the peer has sent and closed.
                    while !sent.load(Ordering::Acquire) {
                        std::hint::spin_loop();
                    }
                    let mut back = Vec::new();
                    let r = s.read_to_end(&mut back);
                    (r.map_err(|e| e.kind()), back.len())
                });
                let (r, len) = reader.join().unwrap();
                peer.join().unwrap();
                if reset {
                    assert!(
                        matches!(r, Err(io::ErrorKind::ConnectionReset) | Ok(100)),
                        "after a reset: {r:?} with {len} bytes"
                    );
                } else {
                    assert_eq!((r, len), (Ok(100), 100), "data, then end of stream");
                }
            },
        );
    }
}

/// A proxy as tokio's `examples/proxy.rs` writes one: per inbound connection, connect to the
/// server and copy both ways, each direction `io::copy` then `shutdown(Write)`. Clients write,
/// half-close and `read_to_end` through it to an `io::copy` echo.
#[test]
fn an_io_copy_proxy_in_front_of_an_echo_does_not_hang() {
    for carriers in [1, 2] {
        within(LIMIT, &format!("clients through an io::copy proxy on {carriers} carrier(s)"), move || {
            rt(carriers).block_on(|| {
                let server = spawn_copy_echo_server();
                let listener = TcpListener::bind(LOCALHOST).unwrap();
                let proxy = listener.local_addr().unwrap();
                vt::spawn(move || {
                    for inbound in listener.incoming() {
                        let inbound = Arc::new(inbound.expect("accept"));
                        let outbound = Arc::new(TcpStream::connect(server).expect("connect"));
                        let (ri, wo) = (inbound.clone(), outbound.clone());
                        let client_to_server = vt::spawn(move || {
                            io::copy(&mut &*ri, &mut &*wo)?;
                            wo.shutdown(Shutdown::Write)
                        });
                        vt::spawn(move || {
                            let r = io::copy(&mut &*outbound, &mut &*inbound)
                                .and_then(|_| inbound.shutdown(Shutdown::Write));
                            client_to_server.join().unwrap().and(r)
                        });
                    }
                });
                let clients: Vec<_> = (0..40)
                    .map(|i| {
                        vt::spawn(move || {
                            let msg = message(1 + i * 2_503);
                            let back = round_trip(TcpStream::connect(proxy).unwrap(), &msg);
                            assert!(back == msg, "client {i}: the reply through the proxy differs");
                        })
                    })
                    .collect();
                for c in clients {
                    c.join().unwrap();
                }
            })
        });
    }
}

/// Fiber H (on `h_rt`) waits once on a socket, which registers it with H's carrier's poll set,
/// hands it to fiber B (on `b_rt`, or on `h_rt` when that is `None`: it runs on the other
/// carrier) and computes without a switch point. The peer sends while B waits; returns whether
/// B had the data while H still computed (H gives up after 20 s).
fn handed_over_while_computing(h_rt: &vt::Runtime, b_rt: Option<vt::Handle>) -> bool {
    let listener = std::net::TcpListener::bind(LOCALHOST).unwrap();
    let addr = listener.local_addr().unwrap();
    let got = Arc::new(AtomicBool::new(false));
    let (h_got, b_got) = (got.clone(), got.clone());
    let (b_tx, b_rx) = std::sync::mpsc::channel();
    let b_on = b_rt.clone();
    let h = h_rt.spawn(move || {
        let s = TcpStream::connect(addr).unwrap();
        // One wait here registers the socket with this carrier's set.
        s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
        assert_eq!((&s).read(&mut [0u8; 1]).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        s.set_read_timeout(None).unwrap();
        let here = std::thread::current().id();
        let reader = move || {
            let mut buf = [0u8; 5];
            (&s).read_exact(&mut buf).unwrap();
            b_got.store(true, Ordering::Release);
            (buf, std::thread::current().id())
        };
        b_tx.send(match &b_on {
            Some(h2) => h2.spawn(reader),
            None => vt::spawn(reader),
        })
        .unwrap();
        // Compute until B has its data (or for long enough to tell).
        let start = std::time::Instant::now();
        while !h_got.load(Ordering::Acquire) && start.elapsed() < Duration::from_secs(20) {
            std::hint::spin_loop();
        }
        (here, h_got.load(Ordering::Acquire))
    });
    let (mut peer, _) = listener.accept().unwrap();
    // Send only once B is parked on the socket, so that its wake-up is what is tested (H
    // computes by then: the one fiber parked on a read is B).
    let b = b_rx.recv().unwrap();
    let b_handle = b_rt.clone().unwrap_or_else(|| h_rt.handle());
    let start = std::time::Instant::now();
    loop {
        let d = b_handle.dump();
        let parked = d
            .fibers()
            .iter()
            .any(|f| matches!(f.state, vt::FiberState::Parked { reason: vt::WaitReason::NetRead, .. }));
        if parked {
            break;
        }
        assert!(start.elapsed() < LIMIT / 2, "the reader never parked on the socket\n{d}");
        std::thread::yield_now();
    }
    peer.write_all(b"hello").unwrap();
    let (h_carrier, served_while_computing) = h.join().unwrap();
    let (buf, b_carrier) = b.join().unwrap();
    assert_eq!(&buf, b"hello");
    assert_ne!(h_carrier, b_carrier, "B was meant to run on another carrier");
    drop(got);
    served_while_computing
}

/// A socket joins the poll set of the carrier whose fiber first waits on it. Handed to a fiber
/// of another carrier while the first computes, its readiness must still reach the new owner
/// (before: only once H stopped computing, 1.9 s late after 2 s of computing).
#[test]
fn a_socket_handed_to_another_carrier_is_served_while_its_first_carrier_computes() {
    within(LIMIT, "a handed-over socket's reader", || {
        assert!(handed_over_while_computing(&rt(2), None), "B got its data only once H stopped computing");
    });
}

/// The registration follows the fiber that waits: B's wait moves the socket to B's carrier's
/// set, so B is woken in place even with no supervisor tick in the window (its interval is
/// longer than H computes).
#[test]
fn a_handed_over_socket_follows_its_waiter_to_its_carrier() {
    within(LIMIT, "a handed-over socket's reader, no supervisor", || {
        let rt =
            vt::Runtime::builder().carriers(2).supervisor_interval(Duration::from_secs(60)).build().unwrap();
        assert!(handed_over_while_computing(&rt, None), "B got its data only once H stopped computing");
    });
}

/// A waiter that cannot take the registration (B is a fiber of another runtime, whose carriers
/// poll their own reactor): the supervisor of the socket's runtime reads the set that H's
/// computing carrier leaves unread.
#[test]
fn a_socket_handed_to_another_runtime_is_served_while_its_first_carrier_computes() {
    within(LIMIT, "a socket's reader on another runtime", || {
        let (h_rt, b_rt) = (rt(1), rt(1));
        assert!(
            handed_over_while_computing(&h_rt, Some(b_rt.handle())),
            "B got its data only once H stopped computing"
        );
    });
}

/// A socket first waited on in a runtime that is then dropped, read next from a fiber of
/// another runtime of one carrier that may add none: that fiber must park, so that the
/// carrier runs the writer. (It waited like a thread, in `poll(2)`, blocking the only carrier
/// that would have written.)
#[test]
fn a_socket_outliving_its_runtime_parks_its_next_reader_in_another() {
    within(LIMIT, "a reader of a socket whose runtime was dropped", || {
        let listener = std::net::TcpListener::bind(LOCALHOST).unwrap();
        let s = Arc::new(TcpStream::connect(listener.local_addr().unwrap()).unwrap());
        let (mut peer, _) = listener.accept().unwrap();
        let first = vt::Runtime::builder().carriers(1).build().unwrap();
        let reader = s.clone();
        let read = first.spawn(move || {
            let mut b = [0u8; 1];
            (&*reader).read_exact(&mut b).map(|()| b[0])
        });
        // Once the reader is parked on the socket (registered with `first`), give it its byte.
        while !first.dump().fibers().iter().any(|f| matches!(f.state, vt::FiberState::Parked { .. })) {
            std::thread::yield_now();
        }
        peer.write_all(&[1]).unwrap();
        assert_eq!(read.join().unwrap().unwrap(), 1);
        drop(first);

        let second = vt::Runtime::builder().carriers(1).max_carriers(1).build().unwrap();
        let reader = s.clone();
        let read = second.spawn(move || {
            let mut b = [0u8; 1];
            (&*reader).read_exact(&mut b).map(|()| b[0])
        });
        // Runs only once the reader has parked (one carrier, none added).
        let writer = second.spawn(move || peer.write_all(&[2]));
        assert!(writer.join().unwrap().is_ok());
        assert_eq!(read.join().unwrap().unwrap(), 2);
    });
}
