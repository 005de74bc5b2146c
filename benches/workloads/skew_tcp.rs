//! TCP skew: where a server's connections start when one carrier is busy while they arrive,
//! and what that costs once the load comes. A started fiber never leaves its home carrier, so
//! with one acceptor every connection starts where the acceptor runs unless another carrier
//! steals it first; a busy carrier steals nothing, and the connections stay skewed for their
//! whole life. `vt::net::serve` binds a listener per carrier (`SO_REUSEPORT`) with an acceptor
//! on each, so the kernel spreads the connections whatever the carriers are doing
//! (`arch/decisions/0015-acceptor-per-carrier.md`); tokio moves started tasks and rebalances.
//!
//! One op, on a 2-carrier vt runtime or a 2-worker tokio runtime, with a fresh server on a
//! free loopback port: a hog spins on one carrier (vt: carrier 1; the single acceptor is on
//! carrier 0, the free one) while `CLIENTS` std threads open `CONNS` blocking connections, and
//! until every connection's task has started or `HOG_MAX` has passed since the last connect;
//! then the hog stops. Timed: from a barrier to the last client thread's end, `REQUESTS`
//! rounds in which each client thread writes a one-byte request on each of its connections,
//! then reads each one-byte answer; the server's task answers each request after ~1 µs of
//! arithmetic for the even-numbered connections (the heavy half) and at once for the others.
//! Rows: vt with one acceptor (`listener.incoming()` and `vt::spawn`, the shape of the guide's
//! servers), vt with `vt::net::serve`, tokio (`TcpListener::accept` and `tokio::spawn`). Each
//! row also says how many connections started on each carrier (tokio: on each worker, where
//! the task first ran; it may move later). Run: `WORKLOADS_PARTS=skew_tcp cargo bench --bench
//! workloads` (about 15 s); `SKEW_TCP_SPIN=20000` makes the heavy requests ~20 µs.

use super::skew::spin;
use super::*;
use std::io::Read;
use std::sync::Barrier;
use std::sync::atomic::AtomicBool;

/// Connections per op, from `CLIENTS` threads.
const CONNS: usize = 1_000;
const CLIENTS: usize = 4;
/// Request rounds per connection in the timed phase.
const REQUESTS: usize = 20;
/// Iterations of `spin` per heavy request (about 1 µs on the project's machine, as `skew.rs`),
/// unless `SKEW_TCP_SPIN` says otherwise: with 2 cores shared by the clients, the server's
/// share of the CPU, and so what its skew can cost, grows with the work per request.
const SPIN: u64 = 1_000;

fn spin_per_request() -> u64 {
    static N: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::env::var("SKEW_TCP_SPIN").ok().and_then(|v| v.parse().ok()).unwrap_or(SPIN))
}
/// How long the hog goes on after the last connect if not every connection has started: with
/// an acceptor per carrier, the hogged carrier's share waits in its listener's queue for it.
const HOG_MAX: Duration = Duration::from_millis(300);
/// Rounds per row unless `WORKLOADS_ROUNDS` says otherwise (one op is about 0.5 s).
const SKEW_ROUNDS: usize = 3;
/// Carriers or workers counted (a spare carrier's index is counted in the last).
const SLOTS: usize = 4;

/// What the server side shares with the op: per-carrier start counts, and tasks started and
/// ended.
#[derive(Default)]
struct Counts {
    per: [AtomicUsize; SLOTS],
    started: AtomicUsize,
    ended: AtomicUsize,
}

impl Counts {
    fn start(&self, slot: usize) {
        self.per[slot.min(SLOTS - 1)].fetch_add(1, Ordering::Relaxed);
        self.started.fetch_add(1, Ordering::Release);
    }
}

/// Answers each one-byte request: after ~1 µs of work if the byte is 1.
fn answer(buf: &[u8]) {
    for &b in buf {
        if b == 1 {
            std::hint::black_box(spin(spin_per_request()));
        }
    }
}

/// A vt connection's task, until the client closes.
fn vt_conn(mut c: vt::net::TcpStream, counts: &Counts) {
    counts.start(vt::current_carrier().unwrap_or(SLOTS - 1));
    let _ = c.set_nodelay(true);
    let mut buf = [0u8; 64];
    while let Ok(n @ 1..) = c.read(&mut buf) {
        answer(&buf[..n]);
        if c.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    counts.ended.fetch_add(1, Ordering::Release);
}

/// The hog's flags: it has started, and it may stop.
#[derive(Default)]
struct Hog {
    on: AtomicBool,
    stop: AtomicBool,
}

impl Hog {
    fn spin(&self) {
        self.on.store(true, Ordering::Release);
        while !self.stop.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
    }

    fn wait_on(&self) {
        while !self.on.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
    }
}

/// The client side of one op against `addr`, once the server and the hog run: connects, lets
/// the hog go (`release`), then times the request rounds.
fn drive(addr: std::net::SocketAddr, counts: &Counts, release: impl FnOnce()) -> Duration {
    let barrier = Arc::new(Barrier::new(CLIENTS + 1));
    let connected = Arc::new(Barrier::new(CLIENTS + 1));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|t| {
            let (barrier, connected) = (barrier.clone(), connected.clone());
            std::thread::spawn(move || {
                let mut conns: Vec<(std::net::TcpStream, u8)> = (t..CONNS)
                    .step_by(CLIENTS)
                    .map(|i| {
                        let c = std::net::TcpStream::connect(addr).expect("connect");
                        c.set_nodelay(true).unwrap();
                        (c, u8::from(i % 2 == 0))
                    })
                    .collect();
                connected.wait();
                barrier.wait();
                let mut b = [0u8];
                for _ in 0..REQUESTS {
                    for (c, heavy) in &mut conns {
                        c.write_all(&[*heavy]).expect("request");
                    }
                    for (c, _) in &mut conns {
                        c.read_exact(&mut b).expect("answer");
                    }
                }
            })
        })
        .collect();
    connected.wait();
    let last_connect = Instant::now();
    while counts.started.load(Ordering::Acquire) < CONNS && last_connect.elapsed() < HOG_MAX {
        std::thread::sleep(Duration::from_millis(1));
    }
    release();
    while counts.started.load(Ordering::Acquire) < CONNS {
        std::thread::sleep(Duration::from_millis(1));
    }
    barrier.wait();
    let start = Instant::now();
    clients.into_iter().for_each(|c| c.join().unwrap());
    start.elapsed()
}

/// Waits until every connection task of the op has ended (the clients closed), so that the
/// next op starts on an idle runtime.
fn wait_ended(counts: &Counts) {
    while counts.ended.load(Ordering::Acquire) < CONNS {
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn per_slot(counts: &Counts) -> [usize; SLOTS] {
    std::array::from_fn(|i| counts.per[i].load(Ordering::Relaxed))
}

/// One vt op: one acceptor on carrier 0, or `vt::net::serve`; the hog on carrier 1.
fn vt_op(rt: &vt::Runtime, per_carrier: bool) -> (Duration, [usize; SLOTS]) {
    let h = rt.handle();
    let counts = Arc::new(Counts::default());
    let (addr, stop): (_, Box<dyn FnOnce()>) = if per_carrier {
        let c = counts.clone();
        let server = vt::net::serve_on(&h, "127.0.0.1:0", move |s| vt_conn(s, &c)).expect("serve");
        (server.local_addr(), Box::new(move || server.stop()))
    } else {
        let listener = vt::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().unwrap();
        let c = counts.clone();
        let acceptor = h
            .spawn_on_carrier(0, move || {
                for s in listener.incoming().flatten() {
                    let c = c.clone();
                    vt::spawn(move || vt_conn(s, &c));
                }
            })
            .unwrap();
        (
            addr,
            Box::new(move || {
                acceptor.cancel();
                let _ = acceptor.join();
            }),
        )
    };
    let hog = Arc::new(Hog::default());
    let hog2 = hog.clone();
    let hogging = h.spawn_on_carrier(1, move || hog2.spin()).unwrap();
    hog.wait_on();
    let took = drive(addr, &counts, || {
        hog.stop.store(true, Ordering::Release);
        hogging.join().unwrap();
    });
    wait_ended(&counts);
    stop();
    (took, per_slot(&counts))
}

thread_local! {
    /// This tokio worker's index (`on_thread_start`), `usize::MAX` elsewhere.
    static WORKER: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

/// The tokio runtime of this part: 2 workers, each numbered as it starts.
fn tokio_runtime() -> tokio::runtime::Runtime {
    let next = Arc::new(AtomicUsize::new(0));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(move || WORKER.with(|w| w.set(next.fetch_add(1, Ordering::Relaxed))))
        .build()
        .unwrap()
}

async fn tokio_conn(mut c: tokio::net::TcpStream, counts: Arc<Counts>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    counts.start(WORKER.with(|w| w.get()));
    let _ = c.set_nodelay(true);
    let mut buf = [0u8; 64];
    while let Ok(n @ 1..) = c.read(&mut buf).await {
        answer(&buf[..n]);
        if c.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    counts.ended.fetch_add(1, Ordering::Release);
}

fn tokio_op(rt: &tokio::runtime::Runtime) -> (Duration, [usize; SLOTS]) {
    let counts = Arc::new(Counts::default());
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
    let addr = listener.local_addr().unwrap();
    let c = counts.clone();
    let acceptor = rt.spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(tokio_conn(s, c.clone()));
        }
    });
    let hog = Arc::new(Hog::default());
    let hog2 = hog.clone();
    let hogging = rt.spawn(async move { hog2.spin() });
    hog.wait_on();
    let took = drive(addr, &counts, || {
        hog.stop.store(true, Ordering::Release);
        rt.block_on(hogging).unwrap();
    });
    wait_ended(&counts);
    acceptor.abort();
    let _ = rt.block_on(acceptor);
    (took, per_slot(&counts))
}

/// The rows in rotated order, after one warm-up op each; medians of the timed phase, and the
/// per-carrier start counts of each row's last op.
pub fn report() {
    let vt = vt::Runtime::builder().carriers(2).build().expect("vt runtime");
    let tokio = tokio_runtime();
    let rounds = std::env::var("WORKLOADS_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(SKEW_ROUNDS);
    type Row<'a> = (&'static str, Box<dyn Fn() -> (Duration, [usize; SLOTS]) + 'a>);
    let rows: Vec<Row> = vec![
        ("vt one acceptor", Box::new(|| vt_op(&vt, false))),
        ("vt per carrier", Box::new(|| vt_op(&vt, true))),
        ("tokio", Box::new(|| tokio_op(&tokio))),
    ];
    println!(
        "\nTCP skew: {CONNS} connections accepted while one of 2 carriers (workers) spins, then {REQUESTS} \
         rounds of 1-byte requests on each from {CLIENTS} client threads, the even half with {} spin \
         iterations of work per request (1,000: ~1 µs); timed phase, median of {rounds} rounds\n{}",
        spin_per_request(),
        host_mode()
    );
    for (_, op) in &rows {
        op(); // warm-up
    }
    let mut ms = vec![Vec::new(); rows.len()];
    let mut spread = vec![[0; SLOTS]; rows.len()];
    for round in 0..rounds.max(1) {
        for i in (0..rows.len()).map(|i| (i + round) % rows.len()) {
            let (took, per) = rows[i].1();
            ms[i].push(took.as_secs_f64() * 1e3);
            spread[i] = per;
        }
    }
    let med: Vec<Stats> = ms.into_iter().map(Stats::of).collect();
    for (((name, _), s), per) in rows.iter().zip(&med).zip(&spread) {
        // Both carriers (workers), and a spare's count if any started there.
        let per: Vec<usize> =
            per.iter().enumerate().filter(|&(i, &n)| i < 2 || n > 0).map(|(_, &n)| n).collect();
        println!(
            "  {name:<16} {:>8.2} ms ({:.2} – {:.2}); {:.0} requests/s; connections started per carrier {per:?}",
            s.median,
            s.min,
            s.max,
            (CONNS * REQUESTS) as f64 / (s.median / 1e3)
        );
    }
    println!(
        "  throughput over vt one acceptor: vt per carrier {}, tokio {}",
        times(med[0].median / med[1].median),
        times(med[0].median / med[2].median)
    );
}
