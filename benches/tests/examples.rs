//! The member's examples, run as tests: each example's code is what the guide's (`arch/guide.md`) sections
//! "Using async crates" and "With rustls, tungstenite, httparse" quote.

// Both HTTP servers include `common/http.rs` and the flag parser, as each is an example binary
// of its own; this file includes both servers.
#![allow(clippy::duplicate_mod)]

use std::io::{Read, Write};

#[allow(dead_code)] // its `main`
#[path = "../examples/tokio_interop.rs"]
mod tokio_interop;

#[allow(dead_code)]
#[path = "../examples/tls_echo.rs"]
mod tls_echo;

#[allow(dead_code)]
#[path = "../examples/ws_echo.rs"]
mod ws_echo;

#[allow(dead_code)]
#[path = "../examples/http_server.rs"]
mod http_server;

#[allow(dead_code)]
#[path = "../examples/http_server_tokio.rs"]
mod http_server_tokio;

use virtual_threads as vt;

#[test]
fn tokio_interop_both_ways() {
    tokio_interop::demo(100).unwrap();
}

#[test]
fn tls_echo_with_rustls_and_rcgen() {
    tls_echo::demo(50).unwrap();
}

#[test]
fn websocket_echo_with_tungstenite() {
    ws_echo::demo(50, 10).unwrap();
}

const GET: &str = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
const HELLO: &str = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 14\r\nConnection: keep-alive\r\n\r\nHello, world!\n";

#[test]
fn http_server_keeps_connections_alive_and_answers_pipelined_requests() {
    let listener = vt::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    vt::spawn(move || http_server::serve(listener));
    check_http_server(addr);
}

/// `--accept per-carrier`: a listener and an acceptor per carrier answer alike.
#[test]
fn http_server_with_an_acceptor_per_carrier_answers_alike() {
    let server = http_server::serve_per_carrier("127.0.0.1:0").unwrap();
    check_http_server(server.local_addr());
    server.stop();
}

/// `--std`: the same server on std::net's own listener and streams, which the `hooks` feature
/// parks (`arch/hooks.md`), answers alike.
#[cfg(feature = "hooks")]
#[test]
fn http_server_on_std_net_answers_as_the_vt_one_does() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    vt::spawn(move || http_server::serve_std(listener));
    check_http_server(addr);
}

/// The tokio twin that `benches/wrk.sh` compares with answers byte for byte alike.
#[test]
fn http_server_tokio_answers_as_the_vt_one_does() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_io().build().unwrap();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(http_server_tokio::serve(listener));
    check_http_server(addr);
}

/// Twenty clients at once, each: two pipelined requests, one split across writes (a request
/// head and a body that arrive in pieces), then a 404 that closes the connection.
fn check_http_server(addr: std::net::SocketAddr) {
    let clients: Vec<_> = (0..20)
        .map(|_| {
            std::thread::spawn(move || {
                let mut conn = std::net::TcpStream::connect(addr).unwrap();
                conn.write_all(format!("{GET}{GET}").as_bytes()).unwrap();
                let mut two = vec![0; 2 * HELLO.len()];
                conn.read_exact(&mut two).unwrap();
                assert_eq!(String::from_utf8(two).unwrap(), HELLO.repeat(2));
                conn.write_all(b"GET / HTTP/1.1\r\nContent-Le").unwrap();
                conn.flush().unwrap();
                conn.write_all(b"ngth: 4\r\n\r\nab").unwrap();
                conn.write_all(b"cd").unwrap();
                let mut one = vec![0; HELLO.len()];
                conn.read_exact(&mut one).unwrap();
                assert_eq!(String::from_utf8(one).unwrap(), HELLO);
                conn.write_all(b"GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n").unwrap();
                let mut rest = String::new();
                conn.read_to_string(&mut rest).unwrap(); // ends: the server closed it
                assert!(rest.starts_with("HTTP/1.1 404 Not Found\r\n"), "{rest}");
                assert!(rest.contains("Connection: close\r\n"), "{rest}");
            })
        })
        .collect();
    clients.into_iter().for_each(|c| c.join().unwrap());
}
