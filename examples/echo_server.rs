//! An echo server, one fiber per connection, written as plain blocking code: `accept`, `read`
//! and `write` park the fiber, never the carrier, so a few carriers hold tens of thousands of
//! connections.
//!
//! Run: `cargo run --release --example echo_server -- --addr 127.0.0.1:7000`
//! Flags: `--addr HOST:PORT` (default 127.0.0.1:7000), `--carriers N` (default: one per CPU);
//! `--help` lists them. Drive it with `examples/echo_client.rs`. Ctrl-C or SIGTERM stops it
//! (`vt::signal::Signals`), with exit status 0.

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use virtual_threads as vt;
use vt::signal::Signal;

#[path = "common/args.rs"]
mod args;

/// Echoes everything it reads until the peer closes the connection or an error occurs.
fn serve(mut conn: vt::net::TcpStream) {
    let _ = conn.set_nodelay(true);
    let mut buf = [0u8; 16 * 1024];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if conn.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) => {
                // A reset connection is an error on this connection only.
                eprintln!("connection error: {e}");
                return;
            }
        }
    }
}

fn main() {
    let a = args::parse(
        "echo_server",
        "an echo server, one fiber per connection; Ctrl-C or SIGTERM stops it",
        &[
            args::flag("--addr", "HOST:PORT", "127.0.0.1:7000", "address to listen on"),
            args::flag("--carriers", "N", "", "carriers (default: one per usable CPU)"),
        ],
    );
    let addr: String = a.value("--addr");
    let mut builder = vt::Runtime::builder();
    if let Some(n) = a.get("--carriers") {
        builder = builder.carriers(n);
    }
    let rt = builder.build().unwrap_or_else(|e| fail(&format!("cannot build the runtime: {e}")));
    let served = Arc::new(AtomicUsize::new(0));
    // Ctrl-C and SIGTERM are ours from here on, before the server says it listens.
    let mut stop = vt::signal::Signals::new(&[Signal::INT, Signal::TERM])
        .unwrap_or_else(|e| fail(&format!("cannot handle signals: {e}")));
    let sig = rt.block_on(|| {
        let listener =
            vt::net::TcpListener::bind(&addr).unwrap_or_else(|e| fail(&format!("bind {addr}: {e}")));
        println!("echo server listening on {} (Ctrl-C stops it)", listener.local_addr().unwrap());
        let served = served.clone();
        // Detached: it is parked in `accept` when the signal comes, and ends with the process.
        vt::spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(conn) => {
                        served.fetch_add(1, Ordering::Relaxed);
                        vt::spawn(move || serve(conn));
                    }
                    Err(e) => {
                        // EMFILE and friends: report, let some connections finish, accept again.
                        eprintln!("accept: {e} (raise `ulimit -n` for more connections)");
                        vt::sleep(Duration::from_millis(10));
                    }
                }
            }
        });
        stop.wait()
    });
    println!("echo server: {sig}, stopping after {} connections", served.load(Ordering::Relaxed));
}

fn fail(msg: &str) -> ! {
    eprintln!("echo_server: {msg}");
    std::process::exit(2)
}
