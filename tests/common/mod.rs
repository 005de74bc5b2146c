//! Helpers shared by the integration tests that include this module (`mod common;`).

// Each test binary uses some of these.
#![allow(dead_code)]

use std::panic::{self, AssertUnwindSafe};
use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::Duration;

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
