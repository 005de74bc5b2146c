//! The examples behave like tools: `--help` lists the flags with their defaults, an unknown
//! flag is a clear error with status 2, and Ctrl-C or SIGTERM stops `echo_server`, and the
//! long-running examples with their summary, with status 0. Runs the example binaries that
//! `cargo test` builds next to this test's.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn example(name: &str) -> Command {
    let exe = std::env::current_exe().unwrap();
    let path: PathBuf = exe.parent().unwrap().parent().unwrap().join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds the examples before the tests",
        path.display()
    );
    Command::new(path)
}

#[test]
fn help_lists_the_flags_and_unknown_flags_are_errors() {
    for (name, flag) in [("fork_join", "--n N"), ("echo_server", "--addr HOST:PORT"), ("soak", "--no-net")] {
        let out = example(name).arg("--help").output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(out.status.success(), "{name} --help: {:?}", out.status);
        assert!(text.contains(flag) && text.contains("--help"), "{name} --help:\n{text}");
        let out = example(name).arg("--bogus").output().unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(2), "{name} --bogus");
        assert!(err.contains("unknown flag \"--bogus\""), "{name} --bogus: {err}");
    }
    let help = String::from_utf8(example("fork_join").arg("-h").output().unwrap().stdout).unwrap();
    assert!(help.contains("fibers per op (default 10000)"), "{help}");
}

#[test]
fn chained_fork_runs_its_chain_and_reports_per_link() {
    let out =
        example("chained_fork").args(["--n", "500", "--iters", "3", "--carriers", "1"]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "chained_fork: {:?} {}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("500 links per op, 1 carriers, 3 ops") && text.contains("per link"), "{text}");
    let help = String::from_utf8(example("chained_fork").arg("--help").output().unwrap().stdout).unwrap();
    assert!(help.contains("--n N") && help.contains("links per op (default 10000)"), "{help}");
}

#[test]
fn echo_server_stops_cleanly_on_sigint_and_sigterm() {
    for (sig, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        let mut server = example("echo_server")
            .args(["--addr", "127.0.0.1:0", "--carriers", "1"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(server.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let addr = line.split_whitespace().nth(4).unwrap_or_else(|| panic!("no address in {line:?}"));
        let mut conn = std::net::TcpStream::connect(addr).unwrap();
        conn.write_all(b"ping").unwrap();
        let mut back = [0; 4];
        conn.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"ping");
        // The server has served a connection, so it waits for signals by now.
        // SAFETY: kill(2) to the child we started.
        assert_eq!(unsafe { libc::kill(server.id() as i32, sig) }, 0);
        let status = server.wait().unwrap();
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        assert!(status.success(), "echo_server after {name}: {status:?}");
        assert!(rest.contains(&format!("{name}, stopping after 1 connections")), "{rest}");
    }
}

#[test]
fn fork_join_times_os_threads_too_and_prints_the_ratio() {
    let out = example("fork_join").args(["--n", "200", "--iters", "6", "--carriers", "1"]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "fork_join: {:?} {}", out.status, String::from_utf8_lossy(&out.stderr));
    for line in [
        "200 fibers per op, 1 carriers, 6 ops (3 warm-up), 3 on OS threads between them",
        "per fiber",
        "OS threads",
        "per thread",
        "fibers / OS threads: ",
    ] {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    assert!(text.trim_end().ends_with("x the throughput"), "{text}");

    let out = example("fork_join").args(["--n", "200", "--iters", "6", "--no-threads"]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success() && text.contains("per fiber"), "{text}");
    assert!(!text.contains("OS threads"), "--no-threads ran threads:\n{text}");
}

/// Starts `name` with `args`, waits for its first line (printed once it handles signals), sends
/// `sig` and returns its exit status and everything it printed.
fn stopped_by(name: &str, args: &[&str], sig: i32) -> (std::process::ExitStatus, String) {
    let mut child = example(name).args(args).stdout(Stdio::piped()).spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut text = String::new();
    out.read_line(&mut text).unwrap();
    // SAFETY: kill(2) to the child we started.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
    // A child that ignores the signal would hang the suite: after a generous while, end it.
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let pid = child.id() as i32;
    let watchdog = std::thread::spawn(move || {
        let ended = wait.recv_timeout(std::time::Duration::from_secs(120)).is_ok();
        // SAFETY: kill(2) to the child we started, which has not been waited for yet.
        ended || unsafe { libc::kill(pid, libc::SIGKILL) } != 0
    });
    out.read_to_string(&mut text).unwrap();
    let _ = done.send(()); // the watchdog may have given up already
    assert!(watchdog.join().unwrap(), "{name} {args:?} did not stop within 120 s of signal {sig}:\n{text}");
    (child.wait().unwrap(), text)
}

#[test]
fn long_runs_stop_on_sigint_and_sigterm_with_their_summary() {
    for (sig, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        // Warm-up alone would take hours: the signal comes before any timed op.
        let (status, text) =
            stopped_by("fork_join", &["--n", "100", "--iters", "100000000", "--carriers", "1"], sig);
        assert!(status.success(), "fork_join after {name}: {status:?}\n{text}");
        assert!(text.contains("stopped by a signal"), "fork_join after {name}:\n{text}");

        let (status, text) = stopped_by("soak", &["--secs", "3600", "--no-net", "--carriers", "1"], sig);
        assert!(status.success(), "soak after {name}: {status:?}\n{text}");
        assert!(
            text.contains("stopped by a signal after") && text.contains("soak: ok"),
            "soak after {name}:\n{text}"
        );
    }
}

#[test]
fn deadline_keeps_what_arrives_in_time_and_stops_the_rest() {
    let help = String::from_utf8(example("deadline").arg("--help").output().unwrap().stdout).unwrap();
    assert!(help.contains("--deadline-ms D") && help.contains("--parked"), "{help}");
    let out = example("deadline").args(["--fibers", "2000", "--carriers", "2"]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "deadline: {:?} {}", out.status, String::from_utf8_lossy(&out.stderr));
    let count = |label: &str| -> u64 {
        let line = text.lines().find(|l| l.trim_start().starts_with(label)).unwrap_or("");
        line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0)
    };
    let (finished, stopped, late) = (count("finished"), count("stopped"), count("late"));
    // Every fiber is accounted for once; with sleeps of 1-50 ms and a 30 ms deadline, some
    // finish and some are stopped (the split depends on the machine's load).
    assert_eq!(finished + stopped + late, 2000, "{text}");
    assert!(stopped > 0, "{text}");
    let out = example("deadline").args(["--parked", "--fibers", "1000", "--iters", "2"]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success() && text.contains("after its deadline"), "{text}");
}
