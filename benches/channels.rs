//! Guards `vt::channel`'s hot paths against regressions, against the two obvious alternatives.
//!
//! - `ping_pong` (workload W4): two fibers bounce a value over two capacity-1 channels, 10,000
//!   round trips, next to tokio (two tasks, `tokio::sync::mpsc::channel(1)`) and std threads
//!   (`std::sync::mpsc::sync_channel(1)`). Every round trip is two park/unpark hand-offs, so it
//!   measures the wake path (direct hand-off into the waker's LIFO slot).
//! - `throughput/PxC`: 1,000,000 messages through `bounded(1024)` with P producers and C
//!   consumers, vt fibers vs crossbeam-channel on threads vs tokio mpsc (C > 1 shares tokio's
//!   single-consumer receiver behind a `tokio::sync::Mutex`: tokio has no MPMC channel).
//!
//! After criterion's report it prints each benchmark's median time per iteration, then runs a
//! comparison pass in which the contenders alternate round by round (so that a busy machine
//! slows them alike) and prints the medians and vt's ratios, e.g. `vt is 2.3x tokio`.
//! Run: `cargo bench --bench channels`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use virtual_threads as vt;

const ROUND_TRIPS: u64 = 10_000;
const MESSAGES: u64 = 1_000_000;
const CAP: usize = 1024;

/// Per-iteration times of every batch criterion timed, by benchmark id, for the summary.
static SAMPLES: Mutex<BTreeMap<String, Vec<f64>>> = Mutex::new(BTreeMap::new());

fn carriers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// Times `iters` runs of `f` and records the time per run under `id`.
fn timed(id: &str, iters: u64, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    let elapsed = start.elapsed();
    SAMPLES.lock().unwrap().entry(id.to_owned()).or_default().push(elapsed.as_secs_f64() / iters as f64);
    elapsed
}

fn vt_ping_pong(rt: &vt::Runtime) {
    rt.block_on(|| {
        let (ping_tx, ping_rx) = vt::channel::bounded::<u64>(1);
        let (pong_tx, pong_rx) = vt::channel::bounded::<u64>(1);
        let echo = vt::spawn(move || {
            for v in ping_rx.iter() {
                pong_tx.send(v).unwrap();
            }
        });
        for i in 0..ROUND_TRIPS {
            ping_tx.send(i).unwrap();
            assert_eq!(pong_rx.recv().unwrap(), i);
        }
        drop(ping_tx);
        echo.join().unwrap();
    });
}

fn tokio_ping_pong(rt: &tokio::runtime::Runtime) {
    rt.block_on(async {
        let (ping_tx, mut ping_rx) = tokio::sync::mpsc::channel::<u64>(1);
        let (pong_tx, mut pong_rx) = tokio::sync::mpsc::channel::<u64>(1);
        let echo = tokio::spawn(async move {
            while let Some(v) = ping_rx.recv().await {
                pong_tx.send(v).await.unwrap();
            }
        });
        // The driving side is a task too, so both ends run on the workers like vt's fibers.
        tokio::spawn(async move {
            for i in 0..ROUND_TRIPS {
                ping_tx.send(i).await.unwrap();
                assert_eq!(pong_rx.recv().await.unwrap(), i);
            }
        })
        .await
        .unwrap();
        echo.await.unwrap();
    });
}

fn std_ping_pong() {
    let (ping_tx, ping_rx) = std::sync::mpsc::sync_channel::<u64>(1);
    let (pong_tx, pong_rx) = std::sync::mpsc::sync_channel::<u64>(1);
    let echo = std::thread::spawn(move || {
        for v in ping_rx.iter() {
            pong_tx.send(v).unwrap();
        }
    });
    for i in 0..ROUND_TRIPS {
        ping_tx.send(i).unwrap();
        assert_eq!(pong_rx.recv().unwrap(), i);
    }
    drop(ping_tx);
    echo.join().unwrap();
}

fn ping_pong(c: &mut Criterion) {
    let vt_rt = vt::Runtime::builder().carriers(carriers()).build().unwrap();
    let tokio_rt = tokio::runtime::Builder::new_multi_thread().worker_threads(carriers()).build().unwrap();
    let mut g = c.benchmark_group("ping_pong");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    g.bench_function("vt", |b| b.iter_custom(|n| timed("ping_pong/vt", n, || vt_ping_pong(&vt_rt))));
    g.bench_function("tokio", |b| {
        b.iter_custom(|n| timed("ping_pong/tokio", n, || tokio_ping_pong(&tokio_rt)))
    });
    g.bench_function("std", |b| b.iter_custom(|n| timed("ping_pong/std", n, std_ping_pong)));
    g.finish();
}

/// Splits `MESSAGES` into `parts` ranges.
fn share(part: u64, parts: u64) -> std::ops::Range<u64> {
    let per = MESSAGES / parts;
    part * per..if part + 1 == parts { MESSAGES } else { (part + 1) * per }
}

fn vt_throughput(rt: &vt::Runtime, p: u64, c: u64) {
    rt.block_on(|| {
        let (tx, rx) = vt::channel::bounded::<u64>(CAP);
        let producers: Vec<_> = (0..p)
            .map(|i| {
                let tx = tx.clone();
                vt::spawn(move || share(i, p).for_each(|v| tx.send(v).unwrap()))
            })
            .collect();
        drop(tx);
        let consumers: Vec<_> = (0..c)
            .map(|_| {
                let rx = rx.clone();
                vt::spawn(move || rx.iter().fold(0u64, |s, v| s.wrapping_add(v)))
            })
            .collect();
        producers.into_iter().for_each(|h| h.join().unwrap());
        let sum: u64 = consumers.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(sum, MESSAGES * (MESSAGES - 1) / 2);
    });
}

fn crossbeam_throughput(p: u64, c: u64) {
    let (tx, rx) = crossbeam_channel::bounded::<u64>(CAP);
    let producers: Vec<_> = (0..p)
        .map(|i| {
            let tx = tx.clone();
            std::thread::spawn(move || share(i, p).for_each(|v| tx.send(v).unwrap()))
        })
        .collect();
    drop(tx);
    let consumers: Vec<_> = (0..c)
        .map(|_| {
            let rx = rx.clone();
            std::thread::spawn(move || rx.iter().fold(0u64, |s, v| s.wrapping_add(v)))
        })
        .collect();
    producers.into_iter().for_each(|h| h.join().unwrap());
    let sum: u64 = consumers.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(sum, MESSAGES * (MESSAGES - 1) / 2);
}

fn tokio_throughput(rt: &tokio::runtime::Runtime, p: u64, c: u64) {
    rt.block_on(async {
        let (tx, rx) = tokio::sync::mpsc::channel::<u64>(CAP);
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        let producers: Vec<_> = (0..p)
            .map(|i| {
                let tx = tx.clone();
                tokio::spawn(async move {
                    for v in share(i, p) {
                        tx.send(v).await.unwrap();
                    }
                })
            })
            .collect();
        drop(tx);
        let consumers: Vec<_> = (0..c)
            .map(|_| {
                let rx = rx.clone();
                tokio::spawn(async move {
                    let mut sum = 0u64;
                    if c == 1 {
                        let mut rx = rx.lock().await;
                        while let Some(v) = rx.recv().await {
                            sum = sum.wrapping_add(v);
                        }
                    } else {
                        while let Some(v) = rx.lock().await.recv().await {
                            sum = sum.wrapping_add(v);
                        }
                    }
                    sum
                })
            })
            .collect();
        for h in producers {
            h.await.unwrap();
        }
        let mut sum = 0u64;
        for h in consumers {
            sum += h.await.unwrap();
        }
        assert_eq!(sum, MESSAGES * (MESSAGES - 1) / 2);
    });
}

fn throughput(c: &mut Criterion) {
    let vt_rt = vt::Runtime::builder().carriers(carriers()).build().unwrap();
    let tokio_rt = tokio::runtime::Builder::new_multi_thread().worker_threads(carriers()).build().unwrap();
    let mut g = c.benchmark_group("throughput");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    for (p, n) in [(1, 1), (1, 4), (4, 1), (4, 4)] {
        let id = format!("{p}x{n}");
        g.bench_function(format!("{id}/vt"), |b| {
            b.iter_custom(|k| timed(&format!("throughput/{id}/vt"), k, || vt_throughput(&vt_rt, p, n)))
        });
        g.bench_function(format!("{id}/crossbeam"), |b| {
            b.iter_custom(|k| timed(&format!("throughput/{id}/crossbeam"), k, || crossbeam_throughput(p, n)))
        });
        g.bench_function(format!("{id}/tokio"), |b| {
            b.iter_custom(|k| {
                timed(&format!("throughput/{id}/tokio"), k, || tokio_throughput(&tokio_rt, p, n))
            })
        });
    }
    g.finish();
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 0 { (v[m - 1] + v[m]) / 2.0 } else { v[m] }
}

/// Seconds one run of `f` takes.
fn once(f: impl FnOnce()) -> f64 {
    let start = Instant::now();
    f();
    start.elapsed().as_secs_f64()
}

/// The comparison pass: the contenders run *interleaved*, round after round, so that a busy
/// machine slows them alike; medians per contender, then vt's ratio to each.
fn comparison() {
    let vt_rt = vt::Runtime::builder().carriers(carriers()).build().unwrap();
    let tokio_rt = tokio::runtime::Builder::new_multi_thread().worker_threads(carriers()).build().unwrap();
    let mut rows: Vec<(String, BTreeMap<&str, Vec<f64>>)> = Vec::new();
    let mut pp: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for round in 0..21 {
        pp.entry("vt").or_default().push(once(|| vt_ping_pong(&vt_rt)));
        pp.entry("tokio").or_default().push(once(|| tokio_ping_pong(&tokio_rt)));
        if round % 4 == 0 {
            pp.entry("std").or_default().push(once(std_ping_pong));
        }
    }
    rows.push(("ping_pong (10k round trips)".into(), pp));
    for (p, c) in [(1, 1), (1, 4), (4, 1), (4, 4)] {
        let mut row: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for _ in 0..7 {
            row.entry("vt").or_default().push(once(|| vt_throughput(&vt_rt, p, c)));
            row.entry("crossbeam").or_default().push(once(|| crossbeam_throughput(p, c)));
            row.entry("tokio").or_default().push(once(|| tokio_throughput(&tokio_rt, p, c)));
        }
        rows.push((format!("throughput {p}x{c} (1M msgs)"), row));
    }
    println!("\ninterleaved comparison, median of rounds ({} carriers/workers):", carriers());
    for (name, mut row) in rows {
        let medians: BTreeMap<&str, f64> = row.iter_mut().map(|(k, v)| (*k, median(v))).collect();
        let vt = medians["vt"];
        let line: Vec<String> = medians.iter().map(|(k, m)| format!("{k} {:.2} ms", m * 1e3)).collect();
        let ratios: Vec<String> = medians
            .iter()
            .filter(|(k, _)| **k != "vt")
            .map(|(k, m)| format!("vt is {:.2}x {k}", m / vt))
            .collect();
        println!("  {name:<28} {} | {}", line.join(", "), ratios.join(", "));
    }
}

/// Prints criterion's per-iteration medians (all timed batches) for the record.
fn summary() {
    let mut samples = SAMPLES.lock().unwrap();
    println!("\ncriterion batches, median time per iteration:");
    for (id, v) in samples.iter_mut() {
        println!("  {id:<28} {:>10.3} ms", median(v) * 1e3);
    }
}

criterion_group!(benches, ping_pong, throughput);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    summary();
    comparison();
}
