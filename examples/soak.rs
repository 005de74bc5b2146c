//! Soak: runs a mixed load — fork-join, a channel pipeline, a contended `vt::sync::Mutex`,
//! sleepers, short `vt::blocking` calls and (optionally) echo over loopback — in waves for a
//! fixed time, printing the resident set size and the carrier count every few seconds. Each
//! wave checks its own results. At the end it checks that nothing grew: the largest RSS of the
//! last third of the samples must stay within 10% + 8 MiB of the largest of the first third,
//! and once the load stops the runtime must fall back to its target carrier count. Exits
//! non-zero on any failure, so a long run is a leak and drift test. Ctrl-C or SIGTERM ends the
//! run early: the same checks and summary over the samples taken, then status 0 if they pass.
//!
//! Run: `cargo run --release --example soak` (10 s); the long form is `-- --secs 600`.
//! Flags: `--secs N` (default 10), `--every S` seconds between reports (default: secs / 10,
//! 1 to 10), `--carriers C` (default: one per CPU), `--no-net` (skip the echo load).

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use virtual_threads as vt;

#[path = "common/args.rs"]
mod args;
#[path = "common/bench.rs"]
mod bench;

struct Options {
    secs: u64,
    every: u64,
    carriers: Option<usize>,
    net: bool,
}

fn main() {
    let opts = parse_args().unwrap_or_else(|e| fail(&e));
    let mut builder = vt::Runtime::builder().max_carriers(64);
    if let Some(c) = opts.carriers {
        builder = builder.carriers(c);
    }
    let rt = builder.build().unwrap_or_else(|e| fail(&format!("cannot build the runtime: {e}")));
    bench::stop_on_signals("soak");
    let echo = opts.net.then(|| rt.block_on(start_echo_server));

    // One wave before the clock starts: pools and allocator caches reach their working size.
    rt.block_on(|| wave(0, echo)).unwrap_or_else(|e| fail(&e));

    let stop = Arc::new(AtomicBool::new(false));
    let waves = Arc::new(AtomicU64::new(0));
    let (s, w) = (stop.clone(), waves.clone());
    let load = rt.spawn(move || {
        let mut n = 1;
        while !s.load(Ordering::Relaxed) {
            wave(n, echo)?;
            n += 1;
            w.store(n, Ordering::Relaxed);
        }
        Ok::<u64, String>(n)
    });

    let start = Instant::now();
    let mut samples = Vec::new();
    println!("{:>7} {:>10} {:>9} {:>7}", "secs", "rss MiB", "carriers", "waves");
    while start.elapsed() < Duration::from_secs(opts.secs) {
        let stopped = bench::sleep(Duration::from_secs(opts.every).min(Duration::from_secs(opts.secs)));
        let (rss, carriers) = (rss_bytes(), rt.metrics().carriers_current);
        samples.push((rss, carriers));
        println!(
            "{:>7.1} {:>10.1} {:>9} {:>7}",
            start.elapsed().as_secs_f64(),
            rss as f64 / (1 << 20) as f64,
            carriers,
            waves.load(Ordering::Relaxed)
        );
        if stopped {
            println!("stopped by a signal after {:.1} s of {} s", start.elapsed().as_secs_f64(), opts.secs);
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let total = match load.join() {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => fail(&e),
        Err(p) => fail(&format!("the load panicked: {}", payload(&*p))),
    };

    let mut failures = Vec::new();
    let third = (samples.len() / 3).max(1);
    let max_rss = |s: &[(u64, usize)]| s.iter().map(|x| x.0).max().unwrap_or(0);
    let (first, last) = (max_rss(&samples[..third]), max_rss(&samples[samples.len() - third..]));
    let allowed = first + first / 10 + (8 << 20);
    if last > allowed {
        failures.push(format!(
            "RSS grew: the last third peaked at {:.1} MiB, the first at {:.1} MiB (allowed {:.1} MiB)",
            last as f64 / (1 << 20) as f64,
            first as f64 / (1 << 20) as f64,
            allowed as f64 / (1 << 20) as f64
        ));
    }
    // Compensating carriers retire once nothing blocks; give them a generous while to do so.
    let settle = Instant::now();
    let target = rt.metrics().carriers_target;
    while rt.metrics().carriers_current > target && settle.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let m = rt.metrics();
    if m.carriers_current > target {
        failures
            .push(format!("{} carriers still running after the load, target {target}", m.carriers_current));
    }
    println!("{total} waves in {:.1} s\n{m}", start.elapsed().as_secs_f64());
    if !failures.is_empty() {
        fail(&failures.join("\n"));
    }
    println!("soak: ok (RSS flat: first third {:.1} MiB, last third {:.1} MiB)", mb(first), mb(last));
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// One round of every kind of load; checks its own results.
fn wave(n: u64, echo: Option<std::net::SocketAddr>) -> Result<(), String> {
    // Fork-join.
    let sum: u64 = (0..2_000u64).map(|i| vt::spawn(move || i)).map(|h| h.join().unwrap()).sum();
    check(sum == 1_999 * 2_000 / 2, format!("wave {n}: fork-join sum {sum}"))?;

    // A three-stage pipeline over bounded channels, with a checksum at the end.
    let (tx, rx) = vt::channel::bounded::<u64>(16);
    let (tx2, rx2) = vt::channel::bounded::<u64>(0);
    let producer = vt::spawn(move || (1..=5_000u64).for_each(|i| tx.send(i).unwrap()));
    let doubler = vt::spawn(move || rx.iter().for_each(|v| tx2.send(v * 2).unwrap()));
    let got: u64 = rx2.iter().sum();
    producer.join().unwrap();
    doubler.join().unwrap();
    check(got == 5_000 * 5_001, format!("wave {n}: pipeline sum {got}"))?;

    // A contended lock, with yields while holding it.
    let count = Arc::new(vt::sync::Mutex::new(0u64));
    let hs: Vec<_> = (0..64)
        .map(|_| {
            let c = count.clone();
            vt::spawn(move || {
                for k in 0..100 {
                    let mut g = c.lock().unwrap();
                    if k % 10 == 0 {
                        vt::yield_now();
                    }
                    *g += 1;
                }
            })
        })
        .collect();
    hs.into_iter().for_each(|h| h.join().unwrap());
    let c = *count.lock().unwrap();
    check(c == 6_400, format!("wave {n}: mutex count {c}"))?;

    // Sleepers, and one short blocking call (a compensating carrier may start, then retire).
    let t = Instant::now();
    let hs: Vec<_> =
        (0..500u64).map(|i| vt::spawn(move || vt::sleep(Duration::from_millis(1 + i % 5)))).collect();
    vt::blocking(|| std::thread::sleep(Duration::from_millis(1)));
    hs.into_iter().for_each(|h| h.join().unwrap());
    check(t.elapsed() >= Duration::from_millis(5), format!("wave {n}: sleepers woke early"))?;

    // Echo over loopback.
    if let Some(addr) = echo {
        let clients: Vec<_> = (0..32u8)
            .map(|c| {
                vt::spawn(move || -> std::io::Result<()> {
                    let mut s = vt::net::TcpStream::connect(addr)?;
                    let mut buf = [0u8; 64];
                    for r in 0..16u8 {
                        let msg = [c ^ r; 64];
                        s.write_all(&msg)?;
                        s.read_exact(&mut buf)?;
                        if buf != msg {
                            return Err(std::io::Error::other("echo mismatch"));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in clients {
            h.join().unwrap().map_err(|e| format!("wave {n}: echo client: {e}"))?;
        }
    }
    Ok(())
}

fn check(ok: bool, what: String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(what) }
}

/// An echo server on loopback, one fiber per connection; returns its address.
fn start_echo_server() -> std::net::SocketAddr {
    let listener = vt::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| fail(&format!("bind: {e}")));
    let addr = listener.local_addr().unwrap();
    drop(vt::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            drop(vt::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = conn.read(&mut buf) {
                    if conn.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            }));
        }
    }));
    addr
}

/// Resident set size, from `/proc/self/statm` (second field, in pages).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

fn payload(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

fn parse_args() -> Result<Options, String> {
    let a = args::parse(
        "soak",
        "mixed load for a while; fails if memory or the carrier count drifts",
        &[
            args::flag("--secs", "N", "10", "seconds to run"),
            args::flag("--every", "S", "", "seconds between reports (default: secs / 10, from 1 to 10)"),
            args::flag("--carriers", "C", "", "carriers (default: one per usable CPU)"),
            args::flag("--no-net", "", "", "leave out the sockets"),
        ],
    );
    let secs = a.positive("--secs").unwrap() as u64;
    let every = a.positive("--every").map_or((secs / 10).clamp(1, 10), |n| n as u64);
    Ok(Options { secs, every, carriers: a.positive("--carriers"), net: !a.switch("--no-net") })
}

/// Reports an error on stderr and exits with status 1.
fn fail(message: &str) -> ! {
    eprintln!("soak: {message}");
    std::process::exit(1)
}
