//! The tokio twin of `http_server.rs`, for `benches/wrk.sh`: the same HTTP code
//! (`common/http.rs`: httparse, keep-alive, pipelining, the same response bytes), a task per
//! connection on tokio's multi-thread runtime, so that a wrk run compares the runtimes alone.
//! It runs until killed (Ctrl-C, SIGTERM).
//!
//! Run: `cargo run --release --example http_server_tokio -- --port 8081` (`--help` lists the
//! flags; `--port 0` takes a free one and prints it); `benches/tests/examples.rs` tests it.

use std::io;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "../../examples/common/args.rs"]
mod args;
#[path = "common/http.rs"]
mod http;

fn main() {
    let a = args::parse(
        "http_server_tokio",
        "the tokio twin of http_server (keep-alive, httparse), a task per connection; runs until killed",
        &[
            args::flag("--port", "PORT", "8080", "TCP port to listen on"),
            args::flag("--addr", "IP", "127.0.0.1", "address to listen on (0.0.0.0: every interface)"),
            args::flag("--workers", "N", "", "worker threads (default: one per usable CPU)"),
        ],
    );
    let (ip, port): (String, u16) = (a.value("--addr"), a.value("--port"));
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_io();
    // Tokio's own default is the core count too; said here so that `--workers` and the
    // default read alike in both servers.
    if let Some(n) = a.positive("--workers") {
        builder.worker_threads(n);
    }
    let rt = builder.build().unwrap_or_else(|e| a.fail(&format!("cannot build the runtime: {e}")));
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind((ip.as_str(), port))
            .await
            .unwrap_or_else(|e| a.fail(&format!("bind {ip}:{port}: {e}")));
        println!(
            "http_server_tokio listening on http://{} (Ctrl-C stops it)",
            listener.local_addr().unwrap()
        );
        serve(listener).await
    });
}

/// Accepts connections for ever, a task each.
pub async fn serve(listener: tokio::net::TcpListener) {
    loop {
        match listener.accept().await {
            Ok((conn, _)) => {
                tokio::spawn(async move {
                    if let Err(e) = connection(conn).await {
                        if e.kind() == io::ErrorKind::InvalidData {
                            eprintln!("http_server_tokio: {e}");
                        }
                    }
                });
            }
            Err(e) => eprintln!("http_server_tokio: accept: {e}"),
        }
    }
}

/// Serves one connection's requests, in order, until the client closes it or asks to.
async fn connection(mut conn: tokio::net::TcpStream) -> io::Result<()> {
    conn.set_nodelay(true)?;
    let mut buf = Vec::with_capacity(4096);
    let mut out = Vec::with_capacity(4096);
    loop {
        let keep_alive = http::answer(&mut buf, &mut out)?;
        if !out.is_empty() {
            conn.write_all(&out).await?;
            out.clear();
        }
        if !keep_alive {
            return Ok(());
        }
        let mut chunk = [0u8; 4096];
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}
