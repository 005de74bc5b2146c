//! Echo on loopback: this runtime's fiber-per-connection server against tokio's task-per-
//! connection server, driven by the same client (tokio tasks on their own runtime), in one run.
//! Guards the I/O path end to end: registration, readiness delivery, park/unpark, the poller.
//!
//! Reports, for 1,000 connections each sending 64-byte messages in a closed loop:
//! - criterion: time per 1,000 round trips (one per connection), hence requests/s;
//! - a fixed-duration run per server (3 rounds, medians): requests/s, p50 and p99 latency;
//! - memory per idle connection: RSS delta / connections, with every handler parked in `read`;
//! - server CPU per request: user + system time of the server's threads (`vt-carrier*`,
//!   `tokio-server*`, read from `/proc/self/task`) over the round's requests. On a machine that
//!   also runs other work this is steadier than requests/s, which depends on who got the CPUs.
//!
//! Run: `cargo bench --bench net`. Environment: `NET_BENCH_THREADS` (server carriers/workers
//! and client workers each, default 2), `NET_BENCH_IDLE` (idle connections, default 5,000),
//! `NET_BENCH_PIN=1` or `0` (carriers always or never pinned; by default pinned until their CPU is
//! shared; tokio's workers are never pinned).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use virtual_threads as vt;

const CONNS: usize = 1_000;
const MSG: usize = 64;
const BUF: usize = 4096;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Handlers that reached their first `read` (so the idle-memory measurement knows they parked).
static READY: AtomicUsize = AtomicUsize::new(0);

fn vt_server(rt: &vt::Runtime) -> SocketAddr {
    let listener = vt::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(move || {
        for conn in listener.incoming() {
            let mut conn = conn.unwrap();
            vt::spawn(move || {
                conn.set_nodelay(true).unwrap();
                let mut buf = [0u8; BUF];
                READY.fetch_add(1, Ordering::Relaxed);
                while let Ok(n @ 1..) = conn.read(&mut buf) {
                    if conn.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

fn tokio_server(rt: &tokio::runtime::Runtime) -> SocketAddr {
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(async move {
        loop {
            let (mut conn, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                conn.set_nodelay(true).unwrap();
                let mut buf = [0u8; BUF];
                READY.fetch_add(1, Ordering::Relaxed);
                while let Ok(n @ 1..) = conn.read(&mut buf).await {
                    if conn.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// The shared client: `CONNS` tasks, each doing round trips until `budget` runs out or
/// `until` passes; returns its connections, the round trips done and their latencies (ns).
struct Client {
    rt: tokio::runtime::Runtime,
    conns: Vec<tokio::net::TcpStream>,
}

struct Run {
    ops: u64,
    elapsed: Duration,
    latencies: Vec<u32>,
}

impl Client {
    fn connect(rt: tokio::runtime::Runtime, addr: SocketAddr) -> Client {
        let conns = rt.block_on(async {
            let mut v = Vec::with_capacity(CONNS);
            for _ in 0..CONNS {
                let s = tokio::net::TcpStream::connect(addr).await.unwrap();
                s.set_nodelay(true).unwrap();
                v.push(s);
            }
            v
        });
        Client { rt, conns }
    }

    fn run(&mut self, budget: u64, until: Option<Duration>, record: bool) -> Run {
        let left = Arc::new(AtomicI64::new(budget.min(i64::MAX as u64) as i64));
        let start = Instant::now();
        let deadline = until.map(|d| start + d);
        let tasks: Vec<_> = self
            .conns
            .drain(..)
            .map(|mut s| {
                let left = left.clone();
                self.rt.spawn(async move {
                    let (out, mut back) = ([7u8; MSG], [0u8; MSG]);
                    let mut lat = Vec::new();
                    let mut ops = 0u64;
                    while left.fetch_sub(1, Ordering::Relaxed) > 0 {
                        let t = Instant::now();
                        s.write_all(&out).await.unwrap();
                        s.read_exact(&mut back).await.unwrap();
                        ops += 1;
                        if record {
                            lat.push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
                        }
                        if deadline.is_some_and(|d| Instant::now() >= d) {
                            break;
                        }
                    }
                    (s, ops, lat)
                })
            })
            .collect();
        let mut run = Run { ops: 0, elapsed: Duration::ZERO, latencies: Vec::new() };
        for t in tasks {
            let (s, ops, lat) = self.rt.block_on(t).unwrap();
            self.conns.push(s);
            run.ops += ops;
            run.latencies.extend(lat);
        }
        run.elapsed = start.elapsed();
        run
    }
}

fn client_rt(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build().unwrap()
}

/// CPU time (user + system) used so far by this process's threads whose name starts with
/// `prefix` (threads that exited are not counted: the servers' threads live for the whole run).
fn threads_cpu(prefix: &str) -> Duration {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let mut ticks = 0u64;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        // "tid (comm) state ...": comm may hold spaces, so split at the last ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        if !stat[open + 1..close].starts_with(prefix) {
            continue;
        }
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        // utime and stime are fields 14 and 15 of stat(5), 12 and 13 after "state".
        ticks += fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
    }
    Duration::from_nanos(ticks * 1_000_000_000 / hz)
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Opens `n` idle connections to `addr`, waits until every handler reached its `read`, and
/// returns the RSS growth per connection.
fn idle_cost(addr: SocketAddr, n: usize) -> f64 {
    READY.store(0, Ordering::SeqCst);
    let before = rss_bytes();
    let conns: Vec<_> = (0..n).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
    while READY.load(Ordering::SeqCst) < n {
        std::thread::yield_now();
    }
    // The handlers park right after counting themselves; let the carriers settle.
    std::thread::sleep(Duration::from_millis(200));
    let per = (rss_bytes() as f64 - before as f64) / n as f64;
    drop(conns);
    per
}

fn percentile(sorted: &[u32], p: f64) -> Duration {
    Duration::from_nanos(sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)] as u64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let threads = env("NET_BENCH_THREADS", 2);
    let idle = env("NET_BENCH_IDLE", 5_000);
    // The runtime's default pins each carrier until its CPU is shared (the client runs here
    // too); NET_BENCH_PIN=1 or 0 forces pinned or unpinned (tokio's workers are not pinned).
    let mut builder = vt::Runtime::builder().carriers(threads);
    let pin = match env("NET_BENCH_PIN", 2) {
        2 => "until their CPU is shared",
        pin => {
            builder = builder.pin_carriers(pin != 0);
            if pin != 0 { "always" } else { "never" }
        }
    };
    let vt_rt = builder.build().unwrap();
    let tokio_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("tokio-server")
        .enable_all()
        .build()
        .unwrap();
    let servers = [("vt", vt_server(&vt_rt)), ("tokio", tokio_server(&tokio_rt))];
    let server_threads = ["vt-carrier", "tokio-server"];

    // Memory first, on quiet servers.
    let idle_per: Vec<f64> = servers.iter().map(|&(_, addr)| idle_cost(addr, idle)).collect();

    let mut clients: Vec<Client> =
        servers.iter().map(|&(_, a)| Client::connect(client_rt(threads), a)).collect();
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    let mut group = c.benchmark_group("echo_1000_conns_64B");
    group.throughput(Throughput::Elements(CONNS as u64));
    for ((name, _), client) in servers.iter().zip(clients.iter_mut()) {
        group.bench_function(*name, |b| {
            b.iter_custom(|iters| client.run(iters * CONNS as u64, None, false).elapsed)
        });
    }
    group.finish();

    // Fixed-duration rounds, alternating servers, for requests/s and latency percentiles.
    let mut rates = vec![Vec::new(); servers.len()];
    let mut p50 = vec![Vec::new(); servers.len()];
    let mut p99 = vec![Vec::new(); servers.len()];
    let mut cpu = vec![Vec::new(); servers.len()];
    for _round in 0..3 {
        for (i, client) in clients.iter_mut().enumerate() {
            client.run(u64::MAX, Some(Duration::from_millis(500)), false); // warm-up
            let before = threads_cpu(server_threads[i]);
            let mut run = client.run(u64::MAX, Some(Duration::from_secs(3)), true);
            let used = threads_cpu(server_threads[i]).saturating_sub(before);
            cpu[i].push(used.as_secs_f64() * 1e9 / run.ops.max(1) as f64);
            run.latencies.sort_unstable();
            rates[i].push(run.ops as f64 / run.elapsed.as_secs_f64());
            p50[i].push(percentile(&run.latencies, 0.50).as_secs_f64() * 1e6);
            p99[i].push(percentile(&run.latencies, 0.99).as_secs_f64() * 1e6);
        }
    }
    println!(
        "\necho, {CONNS} connections x {MSG} B, closed loop, {threads} server threads (vt carriers \
         pinned: {pin}), {threads} client threads"
    );
    println!(
        "{:<6} {:>12} {:>10} {:>10} {:>14} {:>16}",
        "server", "requests/s", "p50 us", "p99 us", "CPU ns/req", "idle conn bytes"
    );
    for (i, (name, _)) in servers.iter().enumerate() {
        println!(
            "{name:<6} {:>12.0} {:>10.0} {:>10.0} {:>14.0} {:>16.0}   (medians of 3; idle: RSS delta / {idle})",
            median(rates[i].clone()),
            median(p50[i].clone()),
            median(p99[i].clone()),
            median(cpu[i].clone()),
            idle_per[i]
        );
    }
}
