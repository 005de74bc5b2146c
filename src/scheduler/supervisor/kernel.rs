//! What the kernel says of a carrier thread, for the supervisor's rules: its state, CPU time
//! and CPU (`/proc/self/task/<tid>/stat`), its time on and waiting for a CPU (`schedstat`,
//! read by the off-CPU rule), and the steal time of its CPU (`/proc/stat`). Each reader returns
//! `None` where procfs says nothing, and the rules then decide without it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::scheduler::CarrierSlot;

/// One reading of a carrier thread's scheduler counters.
#[derive(Clone, Copy)]
pub(super) struct Reading {
    pub(super) at: Instant,
    /// Nanoseconds on a CPU, and runnable but waiting for one (`schedstat`'s first two fields).
    pub(super) exec: u64,
    pub(super) delay: u64,
    /// The carrier's `idle_ns` counter: if it moved, the carrier idled during the window.
    pub(super) idle: u64,
}

/// The off-CPU rule: a carrier that runs fibers while work waits, and spent more than half of
/// the last interval neither on a CPU nor waiting for one (asleep in the kernel), is blocked,
/// even though it switched meanwhile. Ten thousand fibers each calling `std::thread::sleep(10
/// ms)` switch at every sample and were never compensated (51 s on 2 carriers). Time waiting
/// for a CPU (`run_delay`) counts as on-CPU: adding threads to a saturated machine only helps
/// fairness.
#[derive(Default)]
pub(super) struct OffCpu {
    /// The thread id, `/proc/self/task/<tid>/schedstat` and `.../stat`, kept open: a `pread`
    /// costs ~0.4 µs where an open-read-close costs several.
    files: Option<(i32, File, File)>,
    pub(super) last: Option<Reading>,
    /// Counted blocked by this rule (or by a surge), not by a stall.
    pub(super) counted: bool,
    /// Started by a surge: samples left during which it stays counted without a judgement.
    pub(super) presumed: u8,
    /// Windows in a row judged off-CPU.
    pub(super) streak: u8,
    /// The last window judged was more than 7/8 asleep: the evidence a surge needs.
    pub(super) deep: bool,
}

impl OffCpu {
    fn files(&mut self, tid: i32) -> Option<&(i32, File, File)> {
        if tid <= 0 {
            return None;
        }
        if self.files.as_ref().is_none_or(|f| f.0 != tid) {
            let open = |name: &str| File::open(format!("/proc/self/task/{tid}/{name}")).ok();
            self.files = Some((tid, open("schedstat")?, open("stat")?));
        }
        self.files.as_ref()
    }

    pub(super) fn read(&mut self, slot: &CarrierSlot) -> Option<Reading> {
        let (_, sched, _) = self.files(slot.tid.load(Ordering::Relaxed))?;
        let mut buf = [0u8; 96];
        let n = sched.read_at(&mut buf, 0).ok()?;
        let (exec, delay) = parse_schedstat(buf.get(..n)?)?;
        Some(Reading { at: Instant::now(), exec, delay, idle: slot.stats.idle_ns.load(Ordering::Relaxed) })
    }

    /// Whether the carrier spent more than half of the window since the last reading asleep in
    /// the kernel, without idling; `None` when unknown (no earlier reading, it idled, a window
    /// shorter than half an interval).
    pub(super) fn judge(&mut self, slot: &CarrierSlot, every: Duration) -> Option<bool> {
        let now = self.read(slot);
        let last = std::mem::replace(&mut self.last, now);
        let (last, now) = (last?, now?);
        let wall = u64::try_from(now.at.duration_since(last.at).as_nanos()).unwrap_or(u64::MAX);
        if now.idle != last.idle || u128::from(wall) < every.as_nanos() / 2 {
            return None;
        }
        let on = now.exec.saturating_sub(last.exec) + now.delay.saturating_sub(last.delay);
        self.deep = on.saturating_mul(8) < wall;
        Some(on.saturating_mul(2) < wall)
    }

    /// Whether the thread sleeps in the kernel now (`S` or `D`).
    pub(super) fn in_kernel(&self) -> bool {
        let Some((_, _, stat)) = &self.files else { return false };
        let mut buf = [0u8; 512];
        let Ok(n) = stat.read_at(&mut buf, 0) else { return false };
        let stat = &buf[..n];
        // "tid (comm) S ...": the state follows the last ')'.
        stat.iter()
            .rposition(|&c| c == b')')
            .and_then(|c| stat.get(c + 2))
            .is_some_and(|s| matches!(s, b'S' | b'D'))
    }
}

/// `schedstat`'s first two fields: nanoseconds on a CPU, and runnable waiting for one.
pub(super) fn parse_schedstat(text: &[u8]) -> Option<(u64, u64)> {
    let mut fields = std::str::from_utf8(text).ok()?.split_ascii_whitespace().map(|f| f.parse::<u64>().ok());
    Some((fields.next()??, fields.next()??))
}

/// What procfs says of a carrier thread (`thread_stat`).
#[derive(Clone, Copy, Debug)]
pub(super) struct ThreadStat {
    /// The scheduling state letter: `R`, `S`, `D`, ...
    pub(super) state: u8,
    /// CPU time used, user + system, in clock ticks.
    pub(super) cpu_ticks: u64,
    /// The CPU it last ran on.
    pub(super) processor: Option<usize>,
}

/// Thread `tid`'s state, CPU time and CPU, from one read of `/proc/self/task/<tid>/stat`.
pub(super) fn thread_stat(tid: i32) -> Option<ThreadStat> {
    if tid <= 0 {
        return None;
    }
    let stat = std::fs::read(format!("/proc/self/task/{tid}/stat")).ok()?;
    // "tid (comm) S ...": the state follows the last ')', since comm may contain spaces.
    let close = stat.iter().rposition(|&c| c == b')')?;
    let state = *stat.get(close + 2)?;
    // Counting from the state (field 3 of stat(5)): utime and stime (fields 14 and 15) are the
    // 11th and 12th after it, the processor (field 39) the 36th.
    let rest = std::str::from_utf8(stat.get(close + 2..)?).ok()?;
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    let processor = fields.get(36).and_then(|f| f.parse().ok());
    Some(ThreadStat { state, cpu_ticks: ticks(11)? + ticks(12)?, processor })
}

/// The steal time of `cpu` so far (clock ticks the hypervisor ran something else while this
/// virtual CPU had work), from `/proc/stat`; 0 outside a VM.
pub(super) fn steal_ticks(cpu: usize) -> Option<u64> {
    parse_steal(&std::fs::read_to_string("/proc/stat").ok()?, cpu)
}

/// The `steal` column (the 8th number) of the `cpu<N>` line of a `/proc/stat` text.
pub(super) fn parse_steal(stat: &str, cpu: usize) -> Option<u64> {
    let name = format!("cpu{cpu}");
    let line = stat.lines().find(|l| l.split_ascii_whitespace().next() == Some(name.as_str()))?;
    line.split_ascii_whitespace().nth(8)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_stat_reads_this_threads_state_and_cpu_time() {
        let tid = crate::platform::gettid();
        let stat = thread_stat(tid).expect("procfs describes a live thread");
        assert_eq!(stat.state, b'R', "the thread reading its own stat is running");
        let before = stat.cpu_ticks;
        // Spin until the CPU time moves: a loaded machine may give this thread only a sliver of
        // each wall-clock second, so the bound is generous and the usual wait one clock tick.
        let t = Instant::now();
        while thread_stat(tid).unwrap().cpu_ticks == before {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "30 s of spinning never showed in the thread's CPU time"
            );
            for _ in 0..10_000 {
                std::hint::spin_loop();
            }
        }
        assert!(thread_stat(0).is_none());
    }

    #[test]
    fn steal_time_is_read_per_cpu_and_this_threads_cpu_is_known() {
        let stat = "cpu  10 0 5 900 1 0 2 40 0 0\ncpu0 5 0 2 450 1 0 1 25 0 0\ncpu1 5 0 3 450 0 0 1 15 0 0\n";
        assert_eq!(parse_steal(stat, 0), Some(25));
        assert_eq!(parse_steal(stat, 1), Some(15));
        assert_eq!(parse_steal(stat, 2), None);
        let tid = crate::platform::gettid();
        let cpu = thread_stat(tid).and_then(|s| s.processor).expect("procfs says where this thread runs");
        assert!(steal_ticks(cpu).is_some(), "/proc/stat has a line for cpu{cpu}");
    }
}
