//! An echo server, one fiber per connection, written as plain blocking code: `accept`, `read`
//! and `write` park the fiber, never the carrier, so a few carriers hold tens of thousands of
//! connections.
//!
//! Run: `cargo run --release --example echo_server -- --addr 127.0.0.1:7000`
//! Flags: `--addr HOST:PORT` (default 127.0.0.1:7000), `--carriers N` (default: one per CPU).
//! Drive it with `examples/echo_client.rs`.

use std::io::{Read, Write};
use std::time::Duration;
use virtual_threads as vt;

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
    let mut addr = String::from("127.0.0.1:7000");
    let mut carriers = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| fail(&format!("{flag} needs a value")));
        match flag.as_str() {
            "--addr" => addr = value,
            "--carriers" => carriers = Some(value.parse().unwrap_or_else(|_| fail("--carriers: a number"))),
            _ => fail(&format!("unknown flag {flag}")),
        }
    }
    let mut builder = vt::Runtime::builder();
    if let Some(n) = carriers {
        builder = builder.carriers(n);
    }
    let rt = builder.build().unwrap_or_else(|e| fail(&format!("cannot build the runtime: {e}")));
    rt.block_on(|| {
        let listener =
            vt::net::TcpListener::bind(&addr).unwrap_or_else(|e| fail(&format!("bind {addr}: {e}")));
        println!("echo server listening on {}", listener.local_addr().unwrap());
        for conn in listener.incoming() {
            match conn {
                Ok(conn) => {
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
}

fn fail(msg: &str) -> ! {
    eprintln!("echo_server: {msg}");
    std::process::exit(2)
}
