//! Async interop: fibers call an async-only client that needs tokio's reactor, and a tokio
//! task awaits a fiber (`arch/guide.md`, "Using async crates").
//!
//! The client's future runs on a tokio runtime (`tokio.spawn`), where its socket is
//! registered with tokio's reactor; the fiber parks in `vt::future::block_on` until tokio's
//! `JoinHandle` is ready, and its carrier runs other fibers meanwhile. The other way round, a
//! fiber's `JoinHandle` is a `Send` future that any async code can await.
//!
//! Run: `cargo run --example tokio_interop` (from the repository's root; `benches/tests/
//! examples.rs` runs it as a test).

use std::io;
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use virtual_threads as vt;

/// An async-only client, as many crates offer: its socket needs tokio's reactor.
async fn fetch_greeting(addr: SocketAddr) -> io::Result<String> {
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    let mut greeting = String::new();
    conn.read_to_string(&mut greeting).await?;
    Ok(greeting)
}

fn main() -> io::Result<()> {
    demo(100)?;
    println!("tokio_interop: 100 fibers called an async client on tokio; a tokio task awaited a fiber");
    Ok(())
}

/// `clients` fibers each fetch a greeting through the async client from a vt server; then a
/// tokio task awaits a fiber.
pub fn demo(clients: usize) -> io::Result<()> {
    let tokio_rt = tokio::runtime::Runtime::new()?;
    let tokio = tokio_rt.handle().clone();

    // The server is plain blocking code on fibers.
    let listener = vt::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let server = vt::spawn(move || -> io::Result<()> {
        for conn in listener.incoming().take(clients) {
            let mut conn = conn?;
            vt::spawn(move || conn.write_all(b"hello from a fiber"));
        }
        Ok(())
    });

    // Fibers call the async client: the future runs on tokio, the fiber waits for its handle.
    let fibers: Vec<_> = (0..clients)
        .map(|_| {
            let tokio = tokio.clone();
            vt::spawn(move || vt::future::block_on(tokio.spawn(fetch_greeting(addr))))
        })
        .collect();
    for fiber in fibers {
        let greeting = fiber.join().expect("the fiber").expect("the tokio task")?;
        assert_eq!(greeting, "hello from a fiber");
    }
    server.join().expect("the server")?;

    // A tokio task awaits a fiber.
    let fiber = vt::spawn(|| {
        vt::sleep(Duration::from_millis(10)); // parks the fiber, not a tokio worker
        6 * 7
    });
    let task = tokio_rt.spawn(async move { fiber.await.unwrap() });
    let answer = tokio_rt.block_on(task).unwrap();
    assert_eq!(answer, 42);
    Ok(())
}
