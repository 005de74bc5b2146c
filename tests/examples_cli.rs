//! The examples behave like tools: `--help` lists the flags with their defaults, an unknown
//! flag is a clear error with status 2, and Ctrl-C or SIGTERM stops `echo_server` with status
//! 0. Runs the example binaries that `cargo test` builds next to this test's.

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
