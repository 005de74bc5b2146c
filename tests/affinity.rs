//! CPU affinity: by default a carrier is pinned to one CPU and floats off it once another thread
//! keeps that CPU busy; `pin_carriers(true)` keeps it pinned, `pin_carriers(false)` never pins.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use virtual_threads as vt;

/// The CPU the runtime pins its first carrier to, or `None` where this test cannot run (one
/// CPU, or `VT_PIN_CARRIERS` forcing a policy on every runtime).
fn first_cpu() -> Option<usize> {
    if std::env::var_os("VT_PIN_CARRIERS").is_some_and(|v| !v.is_empty()) {
        eprintln!("skipped: VT_PIN_CARRIERS is set");
        return None;
    }
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    if cores.len() < 2 {
        eprintln!("skipped: needs 2 CPUs, this process may use {}", cores.len());
        return None;
    }
    Some(cores[0].id)
}

/// Runs, on a 1-carrier runtime built by `builder`, a fiber that keeps its carrier busy while
/// an OS thread pinned to `cpu` spins there too, until `done` says so (it gets the runtime's
/// per-carrier metrics of carrier 0) or 10 s pass. Returns what `done` last saw.
fn contend(
    builder: vt::runtime::Builder,
    cpu: usize,
    mut done: impl FnMut(&vt::CarrierMetrics) -> bool,
) -> vt::CarrierMetrics {
    let rt = builder.carriers(1).build().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let spinner = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            assert!(core_affinity::set_for_current(core_affinity::CoreId { id: cpu }));
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    };
    let busy = {
        let stop = stop.clone();
        rt.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                vt::yield_now();
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let seen = loop {
        let c = rt.metrics().per_carrier[0].clone();
        if done(&c) || Instant::now() >= deadline {
            break c;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    stop.store(true, Ordering::Relaxed);
    spinner.join().unwrap();
    busy.join().unwrap();
    seen
}

#[test]
fn a_carrier_floats_off_a_cpu_another_thread_keeps_busy() {
    let Some(cpu) = first_cpu() else { return };
    let rt = vt::Runtime::builder().carriers(1).build().unwrap();
    // A fiber ran on the carrier, so its thread has pinned itself (before its first fiber).
    rt.block_on(|| ());
    assert_eq!(rt.metrics().per_carrier[0].cpu, Some(cpu), "pinned while its CPU is its own");
    drop(rt);
    let seen = contend(vt::Runtime::builder(), cpu, |c| c.floats > 0);
    assert_eq!(seen.floats, 1, "floated within 10 s of sharing its CPU with a spinning thread: {seen:?}");
    assert_eq!(seen.cpu, None, "floating, it may run on any CPU: {seen:?}");
}

#[test]
fn pinned_always_stays_on_its_cpu() {
    let Some(cpu) = first_cpu() else { return };
    let start = Instant::now();
    // A second of contention: the adaptive policy floats within ~0.3 s of it.
    let seen =
        contend(vt::Runtime::builder().pin_carriers(true), cpu, |_| start.elapsed() > Duration::from_secs(1));
    assert_eq!((seen.cpu, seen.floats), (Some(cpu), 0), "pin_carriers(true) never floats: {seen:?}");
}

#[test]
fn never_pinned_has_no_cpu() {
    let rt = vt::Runtime::builder().carriers(2).pin_carriers(false).build().unwrap();
    let m = rt.metrics();
    assert!(m.per_carrier.iter().all(|c| c.cpu.is_none() && c.floats == 0), "{m}");
}

/// `Cpus_allowed_list` of `/proc/<path>/status`.
fn cpus_allowed(path: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{path}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string()
}

#[test]
fn a_blocking_call_does_not_share_its_carriers_cpu() {
    let Some(cpu) = first_cpu() else { return };
    let rt = vt::Runtime::builder().carriers(1).build().unwrap();
    // A thread inherits its creator's CPU mask: the helper that runs the call is started by the
    // pinned carrier.
    let (carrier, helper) =
        rt.block_on(|| (cpus_allowed("thread-self"), vt::blocking(|| cpus_allowed("thread-self"))));
    assert_eq!(carrier, cpu.to_string(), "the carrier is pinned");
    assert_eq!(helper, cpus_allowed("self"), "the helper may run wherever the main thread may");
}
