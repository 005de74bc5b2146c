//! `vt::signal`: a fiber waiting for a signal parks until that signal arrives. The signals are
//! sent to this test process itself, after the waiter is seen parked in a dump. Only SIGUSR1
//! and SIGUSR2 are used, so the default actions of the signals a person sends (Ctrl-C) stay.

use std::time::{Duration, Instant};

use virtual_threads as vt;
use vt::signal::Signal;

/// Waits (on a plain thread) until `n` fibers of `rt` are parked on a signal, for at most 20 s.
fn wait_parked_on_signal(rt: &vt::Runtime, n: usize) {
    let start = Instant::now();
    loop {
        let parked = rt
            .dump()
            .fibers()
            .iter()
            .filter(|f| matches!(f.state, vt::FiberState::Parked { reason: vt::WaitReason::Signal, .. }))
            .count();
        if parked == n {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{parked} fibers parked on a signal, not {n}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn raise(sig: Signal) {
    // SAFETY: kill(2) to this process, with a signal whose handler `vt::signal` installed.
    assert_eq!(unsafe { libc::kill(libc::getpid(), sig.as_raw()) }, 0);
}

// One test, so that no other test of this binary waits on the same signals meanwhile.
#[test]
fn fibers_wake_for_their_own_signals_only() {
    let rt = vt::Runtime::builder().carriers(1).max_carriers(1).build().unwrap();
    let usr1 = rt.spawn(|| vt::signal::wait_for(&[Signal::USR1]).unwrap());
    let either = rt.spawn(|| vt::signal::wait_for(&[Signal::USR2, Signal::USR1]).unwrap());
    wait_parked_on_signal(&rt, 2);
    raise(Signal::USR2);
    assert_eq!(either.join().unwrap(), Signal::USR2);
    // The other one woke up too (every waiter checks), saw no SIGUSR1, and parked again.
    wait_parked_on_signal(&rt, 1);
    assert!(!usr1.is_finished());
    raise(Signal::USR1);
    assert_eq!(usr1.join().unwrap(), Signal::USR1);

    // `Signals` counts from when it is made: a signal before the wait is not lost. On a
    // plain thread, the wait blocks the thread.
    let mut signals = vt::signal::Signals::new(&[Signal::USR2]).unwrap();
    raise(Signal::USR2);
    let thread = std::thread::spawn(move || signals.wait());
    assert_eq!(thread.join().unwrap(), Signal::USR2);

    let err = vt::signal::Signals::new(&[]).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert_eq!(Signal::TERM.to_string(), "SIGTERM");
}
