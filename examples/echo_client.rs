//! A load generator for `echo_server`: many client fibers, each on its own connection, send
//! messages one at a time and check every echoed byte. Reports throughput and the p50/p99
//! round-trip latency; Ctrl-C or SIGTERM stops it with those of the round trips made so far.
//!
//! Run: `cargo run --release --example echo_client -- --conns 1000 --msgs 1000 --size 64`
//! Flags: `--addr HOST:PORT` (default 127.0.0.1:7000), `--conns N` (default 100), `--msgs N`
//! per connection (default 1000), `--size BYTES` (default 64), `--carriers N`.

use std::io::{Read, Write};
use std::time::{Duration, Instant};
use virtual_threads as vt;

#[path = "common/args.rs"]
mod args;
#[path = "common/bench.rs"]
mod bench;

/// One connection's run: its round-trip times.
fn client(addr: &str, msgs: usize, size: usize, seed: usize) -> std::io::Result<Vec<Duration>> {
    let mut conn = vt::net::TcpStream::connect(addr)?;
    conn.set_nodelay(true)?;
    let mut out = vec![0u8; size];
    let mut back = vec![0u8; size];
    let mut rtts = Vec::with_capacity(msgs);
    for m in (0..msgs).take_while(|_| !bench::stopped()) {
        out.iter_mut().enumerate().for_each(|(i, b)| *b = (i ^ m ^ seed) as u8);
        let start = Instant::now();
        conn.write_all(&out)?;
        conn.read_exact(&mut back)?;
        rtts.push(start.elapsed());
        if back != out {
            return Err(std::io::Error::other(format!("connection {seed}: message {m} came back corrupted")));
        }
    }
    Ok(rtts)
}

fn main() {
    let a = args::parse(
        "echo_client",
        "load for echo_server: client fibers, one connection each, send messages and check the echo",
        &[
            args::flag("--addr", "HOST:PORT", "127.0.0.1:7000", "the server"),
            args::flag("--conns", "N", "100", "connections, a fiber each"),
            args::flag("--msgs", "N", "1000", "messages per connection"),
            args::flag("--size", "BYTES", "64", "bytes per message"),
            args::flag("--carriers", "N", "", "carriers (default: one per usable CPU)"),
        ],
    );
    let addr: String = a.value("--addr");
    let (conns, msgs) = (a.positive("--conns").unwrap(), a.positive("--msgs").unwrap());
    let size = a.positive("--size").unwrap();
    let rt = bench::runtime("echo_client", a.get("--carriers"));
    let start = Instant::now();
    let mut rtts: Vec<Duration> = rt.block_on(|| {
        let fibers: Vec<_> = (0..conns)
            .map(|c| {
                let addr = addr.clone();
                vt::spawn(move || client(&addr, msgs, size, c))
            })
            .collect();
        let results = fibers.into_iter().map(|f| f.join().unwrap());
        results.flat_map(|r| r.unwrap_or_else(|e| fail(&e.to_string()))).collect()
    });
    let secs = start.elapsed().as_secs_f64();
    if bench::stopped() {
        println!("stopped by a signal after {} of {} round trips", rtts.len(), conns * msgs);
    }
    if rtts.is_empty() {
        return;
    }
    rtts.sort_unstable();
    let pct = |p: f64| rtts[((rtts.len() as f64 * p) as usize).min(rtts.len() - 1)];
    let n = rtts.len() as f64;
    println!(
        "{conns} connections x {msgs} messages of {size} B: {:.0} round trips/s, {:.1} MB/s each way; \
         latency p50 {:?}, p99 {:?}",
        n / secs,
        n * size as f64 / secs / 1e6,
        pct(0.50),
        pct(0.99)
    );
}

fn fail(msg: &str) -> ! {
    eprintln!("echo_client: {msg}");
    std::process::exit(2)
}
