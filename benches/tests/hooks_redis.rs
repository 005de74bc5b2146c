//! A real blocking database client, unchanged, on fibers: `redis` (redis-rs's sync API, std's
//! `TcpStream` underneath) from 1,000 fibers, each with its own connection, on 2 carriers, with
//! the library's `hooks` feature: every reply is the one expected, the shared counter ends exact,
//! and no compensating carrier is started (`arch/hooks.md`).
//!
//! The server is a running redis-server named by `VT_REDIS_URL` (`redis://127.0.0.1:PORT/`);
//! `.ci/hooks-redis` starts a private one and sets it. Unset, the test says it was skipped and
//! passes, so a plain `cargo test` needs no server. Keys carry a prefix of their own per run and
//! are deleted at the end, so a shared server is left as it was. Run:
//! `VT_REDIS_URL=redis://127.0.0.1:6379/ cargo test -p vt-bench --features hooks --test hooks_redis`;
//! the same clients on OS threads, for comparison: `... --test hooks_redis -- --ignored`.
#![cfg(feature = "hooks")]

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::Commands;
use virtual_threads as vt;

const CLIENTS: usize = 1_000;
/// INCRs each client makes on the shared counter.
const INCRS: usize = 5;
const LIST_LEN: usize = 10;
/// SETs in each client's plain (non-atomic) pipeline.
const PIPELINED: usize = 20;

/// The server's client, or `None` (having said so on stderr, which the test harness does not
/// capture) when `VT_REDIS_URL` is unset or empty.
fn client(test: &str) -> Option<redis::Client> {
    let Some(url) = std::env::var("VT_REDIS_URL").ok().filter(|u| !u.is_empty()) else {
        let _ = writeln!(
            std::io::stderr(),
            "{test}: skipped: no server (set VT_REDIS_URL=redis://127.0.0.1:PORT/; .ci/hooks-redis starts one)"
        );
        return None;
    };
    Some(redis::Client::open(url).expect("VT_REDIS_URL is not a redis URL"))
}

/// A prefix no other run shares, so that the shared counter starts absent.
fn run_prefix() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos();
    format!("vt-hooks-redis:{}:{nanos}", std::process::id())
}

/// Counts the clients between their connect and their last reply, and the most at once.
#[derive(Debug, Default)]
struct Open {
    now: AtomicUsize,
    peak: AtomicUsize,
}

/// Client `c`'s session on its own connection; checks every reply and returns the values its
/// INCRs on the shared counter returned.
fn session(client: &redis::Client, prefix: &str, c: usize, open: &Open) -> Vec<i64> {
    let mut con = client.get_connection().unwrap();
    let n = open.now.fetch_add(1, Ordering::Relaxed) + 1;
    open.peak.fetch_max(n, Ordering::Relaxed);
    // A server that stops answering fails the test instead of hanging it (SO_RCVTIMEO, which a
    // hooked read honours).
    con.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let counter = format!("{prefix}:counter");
    let (key, list, own) = (format!("{prefix}:k:{c}"), format!("{prefix}:l:{c}"), format!("{prefix}:n:{c}"));

    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");

    // Values of 1 to 20,000 bytes: the longer ones take several reads and writes.
    let value: String = (0..1 + (c * 131) % 20_000).map(|i| (b'a' + ((c + i) % 26) as u8) as char).collect();
    let () = con.set(&key, &value).unwrap();
    let got: String = con.get(&key).unwrap();
    assert_eq!(got, value, "client {c}: GET");

    let incrs: Vec<i64> = (0..INCRS).map(|_| con.incr(&counter, 1).unwrap()).collect();
    assert!(incrs.windows(2).all(|w| w[0] < w[1]), "client {c}: INCRs {incrs:?}");

    let items: Vec<String> = (0..LIST_LEN).map(|i| format!("{c}-{i}")).collect();
    let len: usize = con.rpush(&list, &items).unwrap();
    assert_eq!(len, LIST_LEN, "client {c}: RPUSH");
    let all: Vec<String> = con.lrange(&list, 0, -1).unwrap();
    assert_eq!(all, items, "client {c}: LRANGE 0 -1");
    let some: Vec<String> = con.lrange(&list, 2, 4).unwrap();
    assert_eq!(some, items[2..5], "client {c}: LRANGE 2 4");

    // MULTI ... EXEC: the replies of the whole transaction.
    let (a, b, v, l): (i64, i64, String, usize) =
        redis::pipe().atomic().incr(&own, c).incr(&own, 1).get(&key).llen(&list).query(&mut con).unwrap();
    assert_eq!((a, b, v.len(), l), (c as i64, c as i64 + 1, value.len(), LIST_LEN), "client {c}: MULTI");
    assert_eq!(v, value, "client {c}: GET in MULTI");

    // A plain pipeline: PIPELINED SETs written at once, their replies ignored, then one MGET.
    let fields: Vec<String> = (0..PIPELINED).map(|i| format!("{prefix}:p:{c}:{i}")).collect();
    let mut pipe = redis::pipe();
    for (i, f) in fields.iter().enumerate() {
        pipe.set(f, c * 1_000 + i).ignore();
    }
    let (got,): (Vec<usize>,) = pipe.mget(&fields).query(&mut con).unwrap();
    assert_eq!(got, (0..PIPELINED).map(|i| c * 1_000 + i).collect::<Vec<_>>(), "client {c}: pipeline");

    let gone: usize = con.del(&[&key, &list, &own]).unwrap();
    let gone_fields: usize = con.del(&fields).unwrap();
    assert_eq!((gone, gone_fields), (3, PIPELINED), "client {c}: DEL");
    open.now.fetch_sub(1, Ordering::Relaxed);
    incrs
}

/// The counter's INCRs, gathered from every client, are exactly 1 to CLIENTS × INCRS, each once,
/// and the counter holds the last; then the counter is deleted.
fn check_counter(client: &redis::Client, prefix: &str, mut incrs: Vec<i64>) {
    incrs.sort_unstable();
    let total = (CLIENTS * INCRS) as i64;
    assert!(incrs.iter().copied().eq(1..=total), "the INCR replies are not 1..={total}, each once");
    let mut con = client.get_connection().unwrap();
    let counter = format!("{prefix}:counter");
    let last: i64 = con.get(&counter).unwrap();
    assert_eq!(last, total);
    let gone: usize = con.del(&counter).unwrap();
    assert_eq!(gone, 1);
}

#[test]
fn redis_from_a_thousand_fibers_on_two_carriers() {
    let Some(client) = client("redis_from_a_thousand_fibers_on_two_carriers") else { return };
    let rt = vt::Runtime::builder()
        .carriers(2)
        // As in the library's tests/hooks_io.rs: a carrier's few-millisecond kernel wait for a
        // lock whose holder the OS descheduled is not taken for a block on a loaded machine.
        .supervisor_interval(Duration::from_millis(50))
        .build()
        .unwrap();
    let (client, prefix, open) = (Arc::new(client), Arc::new(run_prefix()), Arc::new(Open::default()));
    let start = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (client, prefix, open) = (client.clone(), prefix.clone(), open.clone());
            rt.spawn(move || session(&client, &prefix, c, &open))
        })
        .collect();
    let incrs: Vec<i64> = clients.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let elapsed = start.elapsed();
    check_counter(&client, &prefix, incrs);
    let m = rt.metrics();
    assert_eq!((m.compensations, m.carriers_peak), (0, 2), "{m}");
    let peak = open.peak.load(Ordering::Relaxed);
    // More sessions under way at once than there are carriers: each fiber's wait on the server
    // parked it and let others run, where a blocked carrier would have held it to one each.
    assert!(peak > 2, "at most {peak} connections open at once");
    println!("{CLIENTS} fibers: {elapsed:.2?}, at most {peak} connections open at once; {m}");
}

/// The comparison: the same clients, one OS thread each (the hooks pass through on a plain
/// thread). Ignored by default: it measures, the fibers' test above is the check.
#[test]
#[ignore = "a comparison to time: run with -- --ignored"]
fn redis_from_a_thousand_os_threads() {
    let Some(client) = client("redis_from_a_thousand_os_threads") else { return };
    let (client, prefix, open) = (Arc::new(client), Arc::new(run_prefix()), Arc::new(Open::default()));
    let start = Instant::now();
    let threads: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (client, prefix, open) = (client.clone(), prefix.clone(), open.clone());
            std::thread::spawn(move || session(&client, &prefix, c, &open))
        })
        .collect();
    let incrs: Vec<i64> = threads.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let elapsed = start.elapsed();
    check_counter(&client, &prefix, incrs);
    let peak = open.peak.load(Ordering::Relaxed);
    println!("{CLIENTS} OS threads: {elapsed:.2?}, at most {peak} connections open at once");
}
