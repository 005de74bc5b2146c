//! Threads' CPU affinity and run-queue delay: what the carriers' affinity policy
//! (`scheduler/affinity.rs`) reads and sets from the supervisor's thread.

use std::io;
use std::time::Duration;

use super::gettid;

/// The CPUs thread `tid` may run on (`sched_getaffinity`; 0: the calling thread), in
/// increasing order; empty if the call fails.
pub(crate) fn allowed_cpus(tid: i32) -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    if unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    // SAFETY: CPU_ISSET reads the set within its bounds (the index is below CPU_SETSIZE).
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// The CPUs the process's main thread may use (its id is the process id): where threads that
/// are not pinned belong. A thread inherits its creator's CPU mask, so one started from a pinned
/// carrier would otherwise share that carrier's single CPU.
pub(crate) fn process_cpus() -> Vec<usize> {
    // SAFETY: getpid has no preconditions.
    allowed_cpus(unsafe { libc::getpid() })
}

/// Lets the calling thread run on every CPU of `process_cpus`: called first thing by the
/// threads the runtime starts that are not carriers pinned to a CPU (spare carriers, `blocking`
/// helpers, the supervisor), which may have been started from a pinned carrier. Best effort.
pub(crate) fn unpin_current() {
    let all = process_cpus();
    if !all.is_empty() && allowed_cpus(0) != all {
        let _ = set_affinity(gettid(), &all);
    }
}

/// Lets thread `tid`, a live thread of this process, run on `cpus` only (`sched_setaffinity`).
/// CPUs at or beyond `CPU_SETSIZE` are ignored; an empty or unusable set is the OS's `EINVAL`.
pub(crate) fn set_affinity(tid: i32, cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `c` is below CPU_SETSIZE, so CPU_SET writes inside `set`.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed. Thread ids are system-wide, so the
    // caller passes only live threads of this process: its own id, or a carrier's from the
    // supervisor, which the drop joins before any carrier thread ends.
    if unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// How long thread `tid` of this process has waited, runnable, for a CPU since it started:
/// the second field of `/proc/self/task/<tid>/schedstat` (the scheduler's `run_delay`). `None`
/// if procfs does not say (no such thread, or a kernel without `CONFIG_SCHED_INFO`).
pub(crate) fn run_delay(tid: i32) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    parse_run_delay(&text)
}

fn parse_run_delay(schedstat: &str) -> Option<Duration> {
    let ns = schedstat.split_ascii_whitespace().nth(1)?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// Whether thread `tid` of this process is waiting now for the calling thread to exit: in a
/// `futex` wait on the calling thread's exit word (`pthread_join`, `std::thread::JoinHandle::join`
/// wait there: the kernel clears it and wakes them when the thread exits). Read from
/// `/proc/self/task/<tid>/syscall` (the system call a sleeping thread is in, and its arguments)
/// and `PR_GET_TID_ADDRESS`; false whenever either is missing, so a `true` is never a guess.
pub(crate) fn joins_me(tid: i32) -> bool {
    let mut mine: *mut libc::c_int = std::ptr::null_mut();
    // SAFETY: PR_GET_TID_ADDRESS stores one pointer at the address passed, a valid local.
    if unsafe { libc::prctl(libc::PR_GET_TID_ADDRESS, &raw mut mine) } != 0 || mine.is_null() {
        return false; // a kernel without CONFIG_CHECKPOINT_RESTORE
    }
    std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall"))
        .is_ok_and(|text| futex_word(&text) == Some(mine.addr()))
}

/// The word a thread sleeps on, from `/proc/.../syscall`: "<nr> <arg0> <arg1> ...", with `nr`
/// `SYS_futex` and the word's address as `arg0`.
fn futex_word(syscall: &str) -> Option<usize> {
    let mut fields = syscall.split_ascii_whitespace();
    if fields.next()?.parse::<libc::c_long>().ok()? != libc::SYS_futex {
        return None;
    }
    usize::from_str_radix(fields.next()?.strip_prefix("0x")?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_run_delay_field() {
        assert_eq!(parse_run_delay("478479006 528693352 139\n"), Some(Duration::from_nanos(528_693_352)));
        assert_eq!(parse_run_delay("478479006\n"), None);
        assert_eq!(parse_run_delay(""), None);
    }

    #[test]
    fn a_thread_moves_between_cpu_sets_and_back() {
        let all = allowed_cpus(0);
        assert!(!all.is_empty(), "this thread may run somewhere");
        let tid = gettid();
        set_affinity(tid, &all[..1]).unwrap();
        assert_eq!(allowed_cpus(0), &all[..1]);
        set_affinity(tid, &all).unwrap();
        assert_eq!(allowed_cpus(0), all);
        assert!(set_affinity(tid, &[]).is_err(), "an empty set is refused");
        assert!(run_delay(tid).is_some(), "procfs has this thread's schedstat");
    }

    #[test]
    fn a_thread_started_from_a_pinned_one_unpins_itself() {
        let all = process_cpus();
        if all.len() < 2 {
            return;
        }
        std::thread::spawn(move || {
            set_affinity(gettid(), &all[..1]).unwrap();
            let child = std::thread::spawn(|| {
                let inherited = allowed_cpus(0);
                unpin_current();
                (inherited, allowed_cpus(0))
            });
            let (inherited, after) = child.join().unwrap();
            assert_eq!(inherited, &all[..1], "a new thread inherits its creator's CPU mask");
            assert_eq!(after, all);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn reads_the_futex_word_a_thread_sleeps_on() {
        let line =
            format!("{} 0x7fb837897990 0x109 0x3571 0x0 0x0 0xffffffff 0x7ffd 0x7fb8\n", libc::SYS_futex);
        assert_eq!(futex_word(&line), Some(0x7fb8_3789_7990));
        assert_eq!(futex_word("0 0x3 0x7ffd 0x10 0x0 0x0 0x0 0x7ffd 0x7fb8\n"), None);
        assert_eq!(futex_word("running\n"), None);
        assert_eq!(futex_word("-1 0x7ffd 0x7fb8\n"), None);
    }

    #[test]
    fn a_thread_that_joins_this_one_is_seen_waiting_for_it() {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let joined = std::thread::spawn(move || {
            go_rx.recv().unwrap();
            // Until the joiner sleeps in its join (generous: a loaded machine).
            let joiner: i32 = tid_rx.recv().unwrap();
            let t = std::time::Instant::now();
            while !joins_me(joiner) {
                assert!(t.elapsed() < Duration::from_secs(30), "the joiner was never seen joining");
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let joiner = std::thread::spawn(move || {
            tid_tx.send(gettid()).unwrap();
            go_tx.send(()).unwrap();
            joined.join().unwrap();
        });
        joiner.join().unwrap();
        assert!(!joins_me(gettid()), "a thread does not join itself");
    }
}
