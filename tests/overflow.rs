//! A fiber that overflows its stack stops the process with a message naming the fiber, its
//! stack size and the fix — never a bare SIGSEGV. Each case runs in a child process (this test
//! binary re-executed), as rayon's stack-overflow tests do.

use std::os::unix::process::ExitStatusExt;

use virtual_threads as vt;

mod common;

const CHILD: &str = "VT_OVERFLOW_TEST_CHILD";

#[allow(unconditional_recursion)] // running off the stack is the point
fn recurse(n: u64) -> u64 {
    let buf = std::hint::black_box([n; 64]);
    recurse(n + 1) + buf[3]
}

/// Runs `case` in a child copy of this test binary; returns (signal, stderr).
fn run_child(test: &str, case: &str) -> (Option<i32>, String) {
    let out = common::rerun_self(test, CHILD, case).output().expect("re-exec the test binary");
    (out.status.signal(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn stack_overflow_in_a_fiber_reports_the_fiber_and_aborts() {
    if std::env::var(CHILD).as_deref() == Ok("overflow") {
        let rt = vt::Runtime::builder().carriers(1).build().unwrap();
        let h =
            rt.block_on(|| vt::Builder::new().name("deep-diver".into()).spawn(|| recurse(0)).unwrap().join());
        unreachable!("the overflow must abort the process, got {:?}", h.map(|_| ()));
    }
    let (signal, stderr) = run_child("stack_overflow_in_a_fiber_reports_the_fiber_and_aborts", "overflow");
    assert_eq!(signal, Some(libc::SIGABRT), "stderr: {stderr}");
    assert!(stderr.contains("'deep-diver'"), "stderr: {stderr}");
    assert!(stderr.contains("tests/overflow.rs"), "names the spawn site: {stderr}");
    assert!(stderr.contains("has overflowed its stack of 128 KiB"), "stderr: {stderr}");
    assert!(stderr.contains("stack_size"), "names the fix: {stderr}");
}

#[test]
fn other_faults_in_a_fiber_keep_their_normal_behaviour() {
    if std::env::var(CHILD).as_deref() == Ok("segv") {
        let rt = vt::Runtime::builder().carriers(1).build().unwrap();
        rt.block_on(|| {
            let p = std::hint::black_box(16usize) as *mut u64;
            // SAFETY: not safe at all: this child process exists to fault on purpose.
            unsafe { p.write_volatile(1) };
        });
        unreachable!();
    }
    let (signal, stderr) = run_child("other_faults_in_a_fiber_keep_their_normal_behaviour", "segv");
    assert_eq!(signal, Some(libc::SIGSEGV), "stderr: {stderr}");
    assert!(!stderr.contains("overflowed"), "stderr: {stderr}");
}
