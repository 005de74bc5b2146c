//! `vt::net::serve` and `TcpListener::bind_reuseport` on loopback: one listener and acceptor
//! per carrier, connections spread over the carriers and stay on the one that accepted them,
//! peers that close, reset or send and close at once, port 0, a port taken, and stopping.
//! Every wait is on an event; time bounds are generous.

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use virtual_threads as vt;

mod common;
use common::within;

const LIMIT: Duration = Duration::from_secs(60);
const LOCALHOST: &str = "127.0.0.1:0";

fn rt() -> vt::Runtime {
    vt::Runtime::builder().carriers(2).dump_on_sigquit(true).build().unwrap()
}

/// Replies with the carrier the connection's fiber started on and the one it is on after
/// reading the peer's byte (a wait), then closes.
fn report_carrier(mut conn: vt::net::TcpStream) {
    let first = vt::current_carrier().map_or(255, |c| c as u8);
    let mut b = [0u8];
    if conn.read_exact(&mut b).is_ok() {
        let now = vt::current_carrier().map_or(255, |c| c as u8);
        let _ = conn.write_all(&[first, now]);
    }
}

/// Connects, sends a byte, returns the two carriers the server reported.
fn ask(addr: std::net::SocketAddr) -> (u8, u8) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(b"?").unwrap();
    let mut r = [0u8; 2];
    c.read_exact(&mut r).unwrap();
    (r[0], r[1])
}

/// With both carriers free, 400 connections (from 4 client threads) land on both carriers: the
/// kernel spreads them over the two listeners by their addresses. Each connection's fiber stays
/// on the carrier where it started.
#[test]
fn connections_spread_over_the_carriers_and_stay_where_they_started() {
    let rt = rt();
    let server = rt.block_on(|| vt::net::serve(LOCALHOST, report_carrier)).unwrap();
    assert_eq!(server.listeners(), 2);
    let addr = server.local_addr();
    assert_ne!(addr.port(), 0, "port 0 was resolved to the port the listeners share");
    let seen = within(LIMIT, "400 connections", move || {
        let clients: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(move || (0..100).map(|_| ask(addr)).collect::<Vec<_>>()))
            .collect();
        clients.into_iter().flat_map(|c| c.join().unwrap()).collect::<Vec<_>>()
    });
    for &(first, now) in &seen {
        assert!(first < 2, "a connection's fiber runs on a carrier");
        assert_eq!(first, now, "a connection's fiber stays on its carrier");
    }
    let carriers: HashSet<u8> = seen.iter().map(|&(c, _)| c).collect();
    assert_eq!(carriers.len(), 2, "400 connections all landed on one carrier");
    let per = rt.metrics().per_carrier;
    assert!(per[0].fibers_started > 0 && per[1].fibers_started > 0, "{per:?}");
    server.stop();
}

/// Peers that close at once, reset (`SO_LINGER` 0), or send and close before the server reads:
/// each connection's fiber sees what its peer did, and the acceptors keep serving.
#[test]
fn peers_that_close_reset_or_send_then_close_are_served_by_the_acceptors() {
    let rt = rt();
    let (tx, rx) = mpsc::channel::<io::Result<Vec<u8>>>();
    let tx = Mutex::new(tx);
    let server = rt
        .block_on(|| {
            vt::net::serve(LOCALHOST, move |mut conn| {
                let mut got = Vec::new();
                let r = conn.read_to_end(&mut got).map(|_| got);
                if r.as_ref().is_ok_and(|v| v == b"?") {
                    // The check after the peers: which carrier serves it.
                    let _ = conn.write_all(&[vt::current_carrier().map_or(255, |c| c as u8)]);
                    return;
                }
                let _ = tx.lock().unwrap().send(r);
            })
        })
        .unwrap();
    let addr = server.local_addr();
    const EACH: usize = 50;
    within(LIMIT, "the peers", move || {
        for _ in 0..EACH {
            drop(TcpStream::connect(addr).unwrap());
        }
        for _ in 0..EACH {
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(b"hello").unwrap();
            c.shutdown(Shutdown::Write).unwrap();
            // Wait for the server's close, so that the data was read before we go.
            let mut rest = Vec::new();
            c.read_to_end(&mut rest).unwrap();
        }
        for _ in 0..EACH {
            let c = vt::net::TcpStream::connect(addr).unwrap();
            c.set_linger(Some(Duration::ZERO)).unwrap();
            drop(c); // RST
        }
    });
    let (mut empty, mut hello, mut reset) = (0, 0, 0);
    // A reset peer's connection may also have been reset before the acceptor took it: the
    // kernel then drops it from the queue, and no fiber hears of it. The others each report.
    while empty < EACH || hello < EACH {
        match rx.recv_timeout(LIMIT).expect("each closing peer's fiber reports") {
            Ok(v) if v.is_empty() => empty += 1,
            Ok(v) if v == b"hello" => hello += 1,
            Ok(v) => panic!("unexpected data {v:?}"),
            Err(e) => {
                assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
                reset += 1;
            }
        }
    }
    assert_eq!(hello, EACH, "every send-then-close peer's bytes arrived");
    assert!(reset <= EACH);
    // Both acceptors still serve: connections land on each carrier's listener and answer.
    let carriers = within(LIMIT, "connections after the peers", move || {
        (0..200)
            .map(|_| {
                let mut c = TcpStream::connect(addr).unwrap();
                c.write_all(b"?").unwrap();
                c.shutdown(Shutdown::Write).unwrap();
                let mut r = [0u8];
                c.read_exact(&mut r).unwrap();
                r[0]
            })
            .collect::<HashSet<_>>()
    });
    assert_eq!(carriers, HashSet::from([0, 1]));
    server.stop();
}

/// `stop` closes every listener: a new connection is refused. A port taken by a listener
/// without `SO_REUSEPORT` cannot be served, and `serve` says so. Two `bind_reuseport`
/// listeners share a port.
#[test]
fn stop_closes_the_listeners_and_a_taken_port_is_an_error() {
    let rt = rt();
    let server = rt.block_on(|| vt::net::serve(LOCALHOST, report_carrier)).unwrap();
    let addr = server.local_addr();
    assert!(within(LIMIT, "a connection", move || ask(addr)).0 < 2);
    within(LIMIT, "stop", move || server.stop());
    let e = TcpStream::connect(addr).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");

    let taken = std::net::TcpListener::bind(LOCALHOST).unwrap();
    let e = rt.block_on(|| vt::net::serve(taken.local_addr().unwrap(), report_carrier)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");

    let a = vt::net::TcpListener::bind_reuseport(LOCALHOST).unwrap();
    let b = vt::net::TcpListener::bind_reuseport(a.local_addr().unwrap()).unwrap();
    assert_eq!(a.local_addr().unwrap(), b.local_addr().unwrap());
    let e = vt::net::TcpListener::bind(a.local_addr().unwrap()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "a listener without SO_REUSEPORT may not join");
}

/// A handler shared by every connection (`Fn`, behind an `Arc`): its state is seen by all.
#[test]
fn the_handler_is_shared_by_every_connection() {
    let rt = rt();
    let count = Arc::new(Mutex::new(0usize));
    let c = count.clone();
    let server = rt
        .block_on(|| {
            vt::net::serve(LOCALHOST, move |mut conn| {
                *c.lock().unwrap() += 1;
                let _ = conn.write_all(b"x");
            })
        })
        .unwrap();
    let addr = server.local_addr();
    within(LIMIT, "connections", move || {
        for _ in 0..20 {
            let mut s = TcpStream::connect(addr).unwrap();
            let mut b = [0u8];
            s.read_exact(&mut b).unwrap();
        }
    });
    assert_eq!(*count.lock().unwrap(), 20);
    server.stop();
}
