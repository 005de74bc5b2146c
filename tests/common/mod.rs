//! Helpers shared by the integration tests that include this module (`mod common;`).

// Each test binary uses some of these.
#![allow(dead_code)]

use std::panic::{self, AssertUnwindSafe};
use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Runs `f` on a helper thread and fails the test if it has not returned within `limit` (a
/// hang becomes a failure that names `what`); a panic in `f` is the test's.
pub fn within<T: Send + 'static>(limit: Duration, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(panic::catch_unwind(AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(v)) => v,
        Ok(Err(p)) => panic::resume_unwind(p),
        Err(_) => panic!("{what} did not finish within {limit:?}"),
    }
}

/// This test binary, set to run `test` alone again in a child process (its output shown, one
/// test thread) with `var=value` in its environment, which tells the test to play the child's
/// part: for what needs a process of its own (a fork, an abort, a report on stderr, the default
/// runtime's settings). The caller adds its own flags and environment, then runs it.
pub fn rerun_self(test: &str, var: &str, value: &str) -> Command {
    let mut child = Command::new(std::env::current_exe().expect("the test binary's path"));
    child.args([test, "--exact", "--nocapture", "--test-threads=1"]).env(var, value);
    child
}

/// The stdout and stderr of a child from [`rerun_self`], once it exited successfully and
/// printed `marker` (so it ran the test's child part, not zero tests); fails the test otherwise.
pub fn child_output(out: &Output, marker: &str) -> (String, String) {
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && stdout.contains(marker),
        "child: {}\nstdout: {stdout}\nstderr: {stderr}",
        out.status
    );
    (stdout.into_owned(), stderr.into_owned())
}

/// The supervisor interval for tests that assert no carrier was added: `default_ms`, or
/// `VT_TEST_SUPERVISOR_MS` when set (`.ci/valgrind` sets it: under valgrind one thread runs at
/// a time, and a carrier waiting its turn for long looks blocked to the supervisor).
pub fn supervisor_interval(default_ms: u64) -> Duration {
    let ms = std::env::var("VT_TEST_SUPERVISOR_MS")
        .map_or(default_ms, |v| v.parse().expect("VT_TEST_SUPERVISOR_MS: a number of milliseconds"));
    Duration::from_millis(ms)
}

/// Blocks the calling thread in the kernel for `dur`, so that a fiber's carrier is stuck in the
/// OS (what the supervisor detects and compensates, what a runtime's drop waits for). The raw
/// `nanosleep` system call: with the `hooks` feature, `std::thread::sleep` from a fiber parks
/// the fiber and frees its carrier, while the hooked `syscall` passes all but futexes through.
pub fn block_in_os(dur: Duration) {
    let until = Instant::now() + dur;
    while let Some(left) = until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
        let ts = libc::timespec { tv_sec: left.as_secs() as _, tv_nsec: left.subsec_nanos() as _ };
        // SAFETY: a valid timespec, and no remainder wanted (a signal's early return loops).
        unsafe {
            libc::syscall(
                libc::SYS_nanosleep,
                &ts as *const libc::timespec,
                std::ptr::null_mut::<libc::timespec>(),
            )
        };
    }
}

/// Waits for the child `pid` up to `limit`; kills it and returns `None` if it is still running.
pub fn wait_child(pid: libc::pid_t, limit: Duration) -> Option<i32> {
    let t = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: `pid` is our child; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            assert!(libc::WIFEXITED(status), "the child died: status {status:#x}");
            return Some(libc::WEXITSTATUS(status));
        }
        if t.elapsed() > limit {
            print_stacks(pid);
            // SAFETY: `pid` is our child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Prints every thread's stack of the hung process `pid` where `gdb` is installed: a child that
/// hangs after a fork waits on a lock held by a thread it does not have, and the stack names it.
pub fn print_stacks(pid: libc::pid_t) {
    let gdb = std::process::Command::new("gdb")
        .args(["-p", &pid.to_string(), "-batch", "-ex", "thread apply all bt"])
        .output();
    if let Ok(out) = gdb {
        eprintln!("the hung child's threads:\n{}", String::from_utf8_lossy(&out.stdout));
    }
}

/// `SO_LINGER` 0 on a std socket, so that closing it sends a reset (std's `set_linger` is
/// unstable).
pub fn set_linger_zero(s: &std::net::TcpStream) {
    use std::os::fd::AsRawFd;
    let l = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: `l` is a valid `linger` for the length given; the descriptor is open.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "setsockopt(SO_LINGER)");
}
