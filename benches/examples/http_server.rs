//! A small HTTP/1.1 server on `vt::net`, parsing with httparse: a fiber per connection,
//! keep-alive and pipelining, plain blocking code (`arch/guide.md`, "With rustls, tungstenite,
//! httparse"). `GET /` answers "Hello, world!"; anything else is a 404. Ctrl-C or SIGTERM
//! stops it. Meant as a benchmark target too: `wrk -c 1000 http://127.0.0.1:8080/`.
//!
//! Run: `cargo run --release --example http_server -- --port 8080` (`--help` lists the
//! flags; `--port 0` takes a free one and prints it); `benches/tests/examples.rs` tests it,
//! and `benches/wrk.sh` runs wrk against it and its tokio twin, `http_server_tokio.rs`, which
//! shares its HTTP code (`common/http.rs`).
//!
//! `--std` serves the same code with `std::net`'s listener and streams, unchanged, which park
//! their fiber only when the library's `hooks` feature interposes libc (`arch/hooks.md`):
//! `cargo run --release -p vt-bench --features hooks --example http_server -- --std`.
//! `benches/wrk.sh` with `VT_STD=1` compares it with the `vt::net` server in one run.
//!
//! `--accept per-carrier` serves with `vt::net::serve`: a listener per carrier on the port
//! (`SO_REUSEPORT`), each with an acceptor fiber on its carrier, so the kernel spreads the
//! connections over the carriers and each stays where it was accepted
//! (`arch/decisions/0015-acceptor-per-carrier.md`); the default, `one`, is one listener and
//! one acceptor, whose connections start wherever a carrier takes them first.
//! `VT_ACCEPT=per-carrier benches/wrk.sh` picks it there.

use std::io::{self, Read, Write};

use virtual_threads as vt;
use vt::signal::{Signal, Signals};

#[path = "../../examples/common/args.rs"]
mod args;
#[path = "common/http.rs"]
mod http;

fn main() {
    let a = args::parse(
        "http_server",
        "an HTTP/1.1 server (keep-alive, httparse), a fiber per connection; Ctrl-C or SIGTERM stops it",
        &[
            args::flag("--port", "PORT", "8080", "TCP port to listen on"),
            args::flag("--addr", "IP", "127.0.0.1", "address to listen on (0.0.0.0: every interface)"),
            args::flag("--carriers", "N", "", "carriers (default: one per usable CPU)"),
            args::flag("--no-pin", "", "", "leave carriers unpinned (`pin_carriers(false)`)"),
            args::flag("--std", "", "", "std::net in place of vt::net (needs the `hooks` feature)"),
            args::flag(
                "--accept",
                "MODE",
                "one",
                "one: one listener and acceptor; per-carrier: one of each per carrier",
            ),
        ],
    );
    let per_carrier = match a.value::<String>("--accept").as_str() {
        "one" => false,
        "per-carrier" => true,
        other => a.fail(&format!("--accept {other}: expected `one` or `per-carrier`")),
    };
    let (ip, port): (String, u16) = (a.value("--addr"), a.value("--port"));
    let std_net = a.switch("--std");
    if std_net && per_carrier {
        a.fail("--std serves std::net's one listener: --accept per-carrier is for vt::net");
    }
    if std_net && !cfg!(feature = "hooks") {
        // Without the hooks every std::net call would hold its carrier: a server that would
        // look like it works until its carriers run out.
        a.fail("--std needs the `hooks` feature: cargo run -p vt-bench --features hooks --example http_server -- --std");
    }
    // Left alone, carriers are pinned until the supervisor sees their CPU shared (wrk runs on
    // the same machine): `pin_carriers` only to force never.
    let mut builder = vt::Runtime::builder();
    if a.switch("--no-pin") {
        builder = builder.pin_carriers(false);
    }
    // `VT_TRACE=trace.json` records an execution trace, finished when Ctrl-C or SIGTERM stops
    // the server (`vt-trace-report` turns it into an HTML report).
    if let Some(path) = std::env::var_os("VT_TRACE").filter(|p| !p.is_empty()) {
        builder = builder.trace(path);
    }
    if let Some(n) = a.get("--carriers") {
        builder = builder.carriers(n);
    }
    let rt = builder.build().unwrap_or_else(|e| a.fail(&format!("cannot build the runtime: {e}")));
    let mut stop = Signals::new(&[Signal::INT, Signal::TERM]).unwrap_or_else(|e| a.fail(&e.to_string()));
    let sig = rt.block_on(|| {
        let bind_failed = |e: io::Error| -> ! { a.fail(&format!("bind {ip}:{port}: {e}")) };
        // The acceptors serve until the runtime is dropped, when Ctrl-C or SIGTERM ends `main`.
        let (addr, net) = if std_net {
            let listener =
                std::net::TcpListener::bind((ip.as_str(), port)).unwrap_or_else(|e| bind_failed(e));
            let addr = listener.local_addr();
            vt::spawn(move || serve_std(listener));
            (addr, "std::net")
        } else if per_carrier {
            let server = serve_per_carrier((ip.as_str(), port)).unwrap_or_else(|e| bind_failed(e));
            (Ok(server.local_addr()), "vt::net, an acceptor per carrier")
        } else {
            let listener = vt::net::TcpListener::bind((ip.as_str(), port)).unwrap_or_else(|e| bind_failed(e));
            let addr = listener.local_addr();
            vt::spawn(move || serve(listener));
            (addr, "vt::net")
        };
        println!("http_server listening on http://{} ({net}; Ctrl-C stops it)", addr.unwrap());
        stop.wait()
    });
    println!("http_server: {sig}, stopping");
}

/// Accepts connections for ever, a fiber each.
pub fn serve(listener: vt::net::TcpListener) {
    for conn in listener.incoming() {
        match conn {
            Ok(conn) => {
                vt::spawn(move || report(conn.set_nodelay(true).and_then(|()| connection(conn))));
            }
            // EMFILE: this connection waits in the queue; the others go on.
            Err(e) => eprintln!("http_server: accept: {e}"),
        }
    }
}

/// `--accept per-carrier`: a listener and an acceptor per carrier (`vt::net::serve`), the same
/// connection code.
pub fn serve_per_carrier(addr: impl std::net::ToSocketAddrs) -> io::Result<vt::net::Server> {
    vt::net::serve(addr, |conn| report(conn.set_nodelay(true).and_then(|()| connection(conn))))
}

/// `serve` with std's own types: the same code a thread-per-connection server would have.
pub fn serve_std(listener: std::net::TcpListener) {
    for conn in listener.incoming() {
        match conn {
            Ok(conn) => {
                vt::spawn(move || report(conn.set_nodelay(true).and_then(|()| connection(conn))));
            }
            // A hooked call's answer when its fiber is stopped (the runtime is shutting down).
            Err(e) if e.raw_os_error() == Some(libc::ECANCELED) => return,
            Err(e) => eprintln!("http_server: accept: {e}"),
        }
    }
}

/// A connection's end: a client's malformed request is worth a line; its going away is not.
fn report(end: io::Result<()>) {
    if let Err(e) = end {
        if e.kind() == io::ErrorKind::InvalidData {
            eprintln!("http_server: {e}");
        }
    }
}

/// Serves one connection's requests, in order, until the client closes it or asks to.
fn connection(mut conn: impl Read + Write) -> io::Result<()> {
    let mut buf = Vec::with_capacity(4096);
    let mut out = Vec::with_capacity(4096);
    loop {
        // Answer every complete request already read (pipelining), then write once.
        let keep_alive = http::answer(&mut buf, &mut out)?;
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
