//! Helpers shared by the benches that compare two runtimes side by side (`supervisor`,
//! `diagnostics`). A directory module, so cargo does not take it for a bench of its own.

use std::time::{Duration, Instant};

use virtual_threads as vt;

pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// W1 fork_join, n = 10,000: spawn, then join in order and sum.
pub fn w1(rt: &vt::Runtime) -> Duration {
    let t = Instant::now();
    let sum: u64 = rt.block_on(|| {
        let hs: Vec<_> = (0..10_000u64).map(|i| vt::spawn(move || i)).collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(sum, 10_000 * 9_999 / 2);
    t.elapsed()
}
