//! A real blocking HTTP client, unchanged, on fibers: `ureq` (std's `TcpStream` underneath)
//! requests from 1,000 fibers against a local HTTP/1.1 server that is itself plain `std::net`
//! code in fibers, on 2 carriers, with the library's `hooks` feature: every request succeeds
//! and no compensating carrier is started (`arch/hooks.md`). Run:
//! `cargo test -p vt-bench --features hooks --test hooks_ureq`.
#![cfg(feature = "hooks")]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::time::Duration;

use virtual_threads as vt;

const CLIENTS: usize = 1_000;
const REQUESTS: usize = 5;

/// Serves `GET /n` with a body of `n` bytes (a repeating pattern), one fiber per connection,
/// each connection kept alive for as many requests as the client sends.
fn serve(listener: TcpListener, h: vt::Handle) {
    loop {
        let (s, _) = listener.accept().unwrap();
        h.spawn(move || {
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut w = s;
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 {
                    return; // the client closed its connection
                }
                let n: usize = line.split(' ').nth(1).and_then(|p| p[1..].parse().ok()).unwrap_or(0);
                loop {
                    let mut header = String::new();
                    r.read_line(&mut header).unwrap();
                    if header == "\r\n" {
                        break;
                    }
                }
                let body: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
                write!(w, "HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nContent-Type: text/plain\r\n\r\n")
                    .unwrap();
                w.write_all(&body).unwrap();
            }
        });
    }
}

#[test]
fn ureq_from_a_hundred_fibers_on_two_carriers() {
    let rt = vt::Runtime::builder()
        .carriers(2)
        // As in the library's tests/hooks_io.rs: a carrier's few-millisecond kernel wait for a
        // lock whose holder the OS descheduled is not taken for a block on a loaded machine.
        .supervisor_interval(Duration::from_millis(50))
        .build()
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    // std's backlog of 128 would overflow with 1,000 connects at once (SYN cookies, resets).
    // SAFETY: a plain call on the listener's open descriptor.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 4096) }, 0);
    let addr = listener.local_addr().unwrap();
    let h = rt.handle();
    let _server = rt.spawn(move || serve(listener, h));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            rt.spawn(move || {
                let agent = ureq::Agent::new_with_defaults();
                for r in 0..REQUESTS {
                    let n = 1 + (c * 131 + r * 977) % 50_000;
                    let mut resp = agent.get(format!("http://{addr}/{n}")).call().unwrap();
                    assert_eq!(resp.status(), 200);
                    let body = resp.body_mut().read_to_vec().unwrap();
                    assert_eq!(body.len(), n, "client {c} request {r}");
                    assert!(body.iter().enumerate().all(|(i, &b)| b == b'a' + (i % 26) as u8));
                }
                REQUESTS
            })
        })
        .collect();
    let done: usize = clients.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(done, CLIENTS * REQUESTS);
    let m = rt.metrics();
    assert_eq!((m.compensations, m.carriers_peak), (0, 2), "{m}");
    // The server's accept loop never ends: the runtime's drop unwinds it.
}
