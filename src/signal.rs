//! Waiting for a signal in a fiber: Ctrl-C, `kill`, a service manager's stop.
//!
//! [`wait_for`] (or [`Signals::wait`]) parks the calling fiber (on a plain thread, blocks the
//! thread) until one of the given signals arrives. The first use of a signal replaces its default action (for
//! SIGINT and SIGTERM: ending the process) with a handler, for the rest of the process's life:
//! from then on the program decides what the signal means. The handler only counts the signal
//! and writes a byte to a pipe (both async-signal-safe); a plain thread, `vt-signal`, reads the
//! pipe and unparks every waiting fiber, each of which checks its signals' counts. A waiter
//! registers before it reads the counts, so a signal between the two still unparks it (its
//! token is left for the park). The libc calls are in `platform/signal.rs`; the design is in
//! `arch/interop.md`.
//!
//! [`Signals`] counts from the moment it is made, so a signal that arrives between two waits
//! is not lost; [`wait_for`] counts only during the call. A fiber parked here counts, for the deadlock report, as waiting on something outside the
//! runtime (as a socket wait does).

use std::fmt;
use std::io;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use crate::loom::StdMutex as Mutex;

use crate::fiber::handle::Fiber;
use crate::fiber::park::park_for;
use crate::fiber::wait::WaitReason;
use crate::platform::signal as sys;

/// A signal [`wait_for`] can wait for.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Signal(libc::c_int);

impl Signal {
    /// SIGINT: Ctrl-C in a terminal.
    pub const INT: Signal = Signal(libc::SIGINT);
    /// SIGTERM: `kill`'s default, and how systemd, docker and Kubernetes ask a process to stop.
    pub const TERM: Signal = Signal(libc::SIGTERM);
    /// SIGHUP: the terminal went away; by convention, daemons reload their configuration.
    pub const HUP: Signal = Signal(libc::SIGHUP);
    /// SIGUSR1, for the program's own use.
    pub const USR1: Signal = Signal(libc::SIGUSR1);
    /// SIGUSR2, for the program's own use.
    pub const USR2: Signal = Signal(libc::SIGUSR2);

    /// The signal's number, e.g. for an exit status of 128 + n.
    pub fn as_raw(self) -> i32 {
        self.0
    }
}

impl fmt::Debug for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Signal::INT => f.write_str("SIGINT"),
            Signal::TERM => f.write_str("SIGTERM"),
            Signal::HUP => f.write_str("SIGHUP"),
            Signal::USR1 => f.write_str("SIGUSR1"),
            Signal::USR2 => f.write_str("SIGUSR2"),
            Signal(n) => write!(f, "signal {n}"),
        }
    }
}

/// Which signals have their handler, whether the forwarding thread runs (and the read end of
/// its pipe), who waits, and in which process of the fork line (`platform::forks()`) all that
/// is true.
struct State {
    started: Option<i32>,
    installed: u64,
    waiters: Vec<Fiber>,
    forks: u64,
}

static STATE: Mutex<State> = Mutex::new(State { started: None, installed: 0, waiters: Vec::new(), forks: 0 });

/// The forwarding thread may hold the state's lock when another thread forks (it unparks under
/// it). A leaf: it starts a thread under it, and a thread's start takes no lock.
fn hold_state_across_fork() {
    crate::platform::fork::hold_across_fork(|| {
        Box::new(STATE.lock().unwrap_or_else(PoisonError::into_inner))
    });
}
crate::platform::fork::at_load!(hold_state_across_fork);

fn state() -> std::sync::MutexGuard<'static, State> {
    // Never held across a park or a user callback: nothing can poison it but an allocation
    // failure, after which the list is still consistent.
    let mut st = STATE.lock().unwrap_or_else(PoisonError::into_inner);
    if st.forks != crate::platform::forks() {
        after_fork(&mut st);
    }
    st
}

/// The first use in a child forked since the state was last true: the handlers are still
/// installed (a fork copies them), but the forwarding thread and the waiters were the parent's,
/// and the pipe is shared with the parent, whose thread would read the child's signals. A
/// daemon that forks, then waits for SIGTERM in the child, waited for ever. Start a pipe and a
/// thread of the child's own.
fn after_fork(st: &mut State) {
    // The parent's fibers: dropping their handles would touch the parent's runtime, which has
    // no threads here.
    std::mem::forget(std::mem::take(&mut st.waiters));
    if let Some(read_fd) = st.started.take() {
        sys::close_read_end(read_fd);
    }
    st.forks = crate::platform::forks();
    if st.installed != 0 {
        // On failure (out of descriptors or threads), waits poll the counts instead.
        let _ = start_forwarding(st);
    }
}

/// Makes the pipe and starts the `vt-signal` thread, once per process.
fn start_forwarding(st: &mut State) -> io::Result<()> {
    if st.started.is_none() {
        let read_fd = sys::forward_pipe()?;
        // On failure the pipe stays (its read end unread, so the handler's writes never raise
        // SIGPIPE); the next call makes another.
        crate::platform::fork::spawn(std::thread::Builder::new().name("vt-signal".into()), move || {
            forward(read_fd)
        })?;
        st.started = Some(read_fd);
    }
    Ok(())
}

/// `let mut stop = Signals::new(&[Signal::INT, Signal::TERM])?; let sig = stop.wait();`
///
/// Signals to wait for, counted from the moment this value was made: a signal that arrives
/// before [`Signals::wait`] is called is not lost, and each `wait` returns one that arrived
/// since the previous one (deliveries of the same signal in between may merge, as the kernel
/// merges them). Making it installs the handlers, so a program can take over Ctrl-C before
/// it says it is ready.
#[derive(Debug)]
pub struct Signals {
    signals: Vec<Signal>,
    seen: Vec<u64>,
}

impl Signals {
    /// Installs the handlers of `signals` (see the module docs) and starts counting.
    ///
    /// Errors: `signals` is empty (`InvalidInput`), or the pipe, the thread or a handler
    /// cannot be set up.
    pub fn new(signals: &[Signal]) -> io::Result<Signals> {
        if signals.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "vt::signal: no signal to wait for"));
        }
        install(signals)?;
        Ok(Signals { signals: signals.to_vec(), seen: signals.iter().map(|s| sys::delivered(s.0)).collect() })
    }

    /// Waits until one of the signals arrives and returns it. Called from a fiber, this parks
    /// the fiber; from a plain thread, it blocks the thread.
    ///
    /// ```no_run
    /// use virtual_threads as vt;
    /// use vt::signal::{Signal, Signals};
    ///
    /// fn main() -> std::io::Result<()> {
    ///     let mut stop = Signals::new(&[Signal::INT, Signal::TERM])?; // before "ready"
    ///     let listener = vt::net::TcpListener::bind("127.0.0.1:7000")?;
    ///     vt::spawn(move || {
    ///         for conn in listener.incoming() {
    ///             // ... a fiber per connection
    ///             drop(conn);
    ///         }
    ///     });
    ///     println!("ready");
    ///     let sig = stop.wait();
    ///     eprintln!("{sig}: shutting down");
    ///     Ok(())
    /// }
    /// ```
    pub fn wait(&mut self) -> Signal {
        let me = crate::fiber::handle::current();
        let arrived = loop {
            let forwarded = {
                let mut st = state();
                st.waiters.push(me.clone());
                st.started.is_some()
            };
            let counts = self.signals.iter().map(|s| sys::delivered(s.0));
            if let Some(i) = counts.zip(&self.seen).position(|(now, seen)| now != *seen) {
                self.seen[i] = sys::delivered(self.signals[i].0);
                break self.signals[i];
            }
            // Without a forwarding thread (a forked child that could not start one), look again
            // every 10 ms rather than wait for ever.
            park_for(WaitReason::Signal, (!forwarded).then(|| Instant::now() + Duration::from_millis(10)));
        };
        state().waiters.retain(|f| f.id() != me.id());
        arrived
    }
}

/// Waits until one of `signals` arrives and returns it: [`Signals::new`] then
/// [`Signals::wait`], so only signals that arrive during the call count.
pub fn wait_for(signals: &[Signal]) -> io::Result<Signal> {
    Ok(Signals::new(signals)?.wait())
}

/// `vt::signal::ctrl_c()?; // parks until Ctrl-C`
///
/// Waits for Ctrl-C (SIGINT); see [`wait_for`].
pub fn ctrl_c() -> io::Result<()> {
    wait_for(&[Signal::INT]).map(drop)
}

/// Starts the forwarding thread once and installs the handler of each signal not yet handled.
fn install(signals: &[Signal]) -> io::Result<()> {
    let mut st = state();
    start_forwarding(&mut st)?;
    for s in signals {
        let bit = 1u64 << (s.0 as u64 - 1);
        if st.installed & bit == 0 {
            sys::forward(s.0)?;
            st.installed |= bit;
        }
    }
    Ok(())
}

/// The `vt-signal` thread: for every burst of signals, unpark everyone waiting; each checks
/// its own signals.
fn forward(read_fd: i32) {
    while sys::wait_forwarded(read_fd) {
        let waiters = std::mem::take(&mut state().waiters);
        waiters.iter().for_each(Fiber::unpark);
    }
}
