//! A small HTTP/1.1 server on `vt::net`, parsing with httparse: a fiber per connection,
//! keep-alive and pipelining, plain blocking code (README, "With rustls, tungstenite,
//! httparse"). `GET /` answers "Hello, world!"; anything else is a 404. Ctrl-C or SIGTERM
//! stops it. Meant as a benchmark target too: `wrk -c 1000 http://127.0.0.1:8080/`.
//!
//! Run: `cargo run --release --example http_server -- --port 8080` (`--help` lists the
//! flags); `benches/tests/examples.rs` tests it.

use std::io::{self, Read, Write};

use virtual_threads as vt;
use vt::signal::{Signal, Signals};

#[path = "../../examples/common/args.rs"]
mod args;

/// The most headers a request may have, and the largest request head, in bytes.
const MAX_HEADERS: usize = 32;
const MAX_HEAD: usize = 16 * 1024;

fn main() {
    let a = args::parse(
        "http_server",
        "an HTTP/1.1 server (keep-alive, httparse), a fiber per connection; Ctrl-C or SIGTERM stops it",
        &[
            args::flag("--port", "PORT", "8080", "TCP port to listen on"),
            args::flag("--addr", "IP", "127.0.0.1", "address to listen on (0.0.0.0: every interface)"),
            args::flag("--carriers", "N", "", "carriers (default: one per usable CPU)"),
        ],
    );
    let (ip, port): (String, u16) = (a.value("--addr"), a.value("--port"));
    let mut builder = vt::Runtime::builder();
    if let Some(n) = a.get("--carriers") {
        builder = builder.carriers(n);
    }
    let rt = builder.build().unwrap_or_else(|e| a.fail(&format!("cannot build the runtime: {e}")));
    let mut stop = Signals::new(&[Signal::INT, Signal::TERM]).unwrap_or_else(|e| a.fail(&e.to_string()));
    let sig = rt.block_on(|| {
        let listener = vt::net::TcpListener::bind((ip.as_str(), port))
            .unwrap_or_else(|e| a.fail(&format!("bind {ip}:{port}: {e}")));
        println!("http_server listening on http://{} (Ctrl-C stops it)", listener.local_addr().unwrap());
        vt::spawn(move || serve(listener));
        stop.wait()
    });
    println!("http_server: {sig}, stopping");
}

/// Accepts connections for ever, a fiber each.
pub fn serve(listener: vt::net::TcpListener) {
    for conn in listener.incoming() {
        match conn {
            Ok(conn) => {
                vt::spawn(move || {
                    if let Err(e) = connection(conn) {
                        if e.kind() == io::ErrorKind::InvalidData {
                            eprintln!("http_server: {e}");
                        }
                    }
                });
            }
            // EMFILE: this connection waits in the queue; the others go on.
            Err(e) => eprintln!("http_server: accept: {e}"),
        }
    }
}

/// Serves one connection's requests, in order, until the client closes it or asks to.
fn connection(mut conn: vt::net::TcpStream) -> io::Result<()> {
    conn.set_nodelay(true)?;
    let mut buf = Vec::with_capacity(4096);
    let mut out = Vec::with_capacity(4096);
    loop {
        // Answer every complete request already read (pipelining), then write once.
        let mut keep_alive = true;
        while keep_alive {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut req = httparse::Request::new(&mut headers);
            let head = match req.parse(&buf) {
                Ok(httparse::Status::Complete(n)) => n,
                Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => break,
                Ok(httparse::Status::Partial) => return Err(bad("request head too large")),
                Err(e) => return Err(bad(&format!("bad request: {e}"))),
            };
            let body = content_length(req.headers)?;
            if buf.len() < head + body {
                break; // the body is still on its way
            }
            keep_alive = match req.version {
                Some(1) => !has_token(req.headers, "connection", "close"),
                _ => has_token(req.headers, "connection", "keep-alive"), // HTTP/1.0
            };
            respond(&mut out, req.method == Some("GET") && req.path == Some("/"), keep_alive);
            buf.drain(..head + body);
        }
        if !out.is_empty() {
            conn.write_all(&out)?; // parks the fiber while the socket is full
            out.clear();
        }
        if !keep_alive {
            return Ok(());
        }
        let mut chunk = [0u8; 4096];
        let n = conn.read(&mut chunk)?; // parks the fiber until the client sends
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Appends the response: "Hello, world!" or a 404.
fn respond(out: &mut Vec<u8>, found: bool, keep_alive: bool) {
    let (status, body) = if found { ("200 OK", "Hello, world!\n") } else { ("404 Not Found", "not found\n") };
    let connection = if keep_alive { "keep-alive" } else { "close" };
    let _ = write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: {connection}\r\n\r\n{body}",
        body.len()
    );
}

/// The request body's length (`Content-Length`, 0 without one); chunked bodies are refused.
fn content_length(headers: &[httparse::Header]) -> io::Result<usize> {
    if headers.iter().any(|h| h.name.eq_ignore_ascii_case("transfer-encoding")) {
        return Err(bad("chunked request bodies are not supported"));
    }
    match headers.iter().find(|h| h.name.eq_ignore_ascii_case("content-length")) {
        None => Ok(0),
        Some(h) => std::str::from_utf8(h.value)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| bad("bad Content-Length")),
    }
}

/// Whether header `name` lists `token` (case-insensitive), as `Connection: close` does.
fn has_token(headers: &[httparse::Header], name: &str, token: &str) -> bool {
    headers.iter().filter(|h| h.name.eq_ignore_ascii_case(name)).any(|h| {
        std::str::from_utf8(h.value).is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}
