//! `IoSource`: a std socket kept in non-blocking mode, its lazy reactor registration, and the one
//! loop every blocking operation of `vt::net` runs through.
//!
//! may gives each blocking operation its own small struct (try the system call; on `EAGAIN`,
//! park on readiness). Here the shape is one generic loop, [`IoSource::op`], and each operation
//! is the closure that makes its system call, so every operation has the same shape by
//! construction:
//!
//! 1. Inside a fiber, if the socket is registered and its readiness word says the direction is
//!    not ready, skip straight to 3 (the last call already said `EAGAIN` and nothing has
//!    arrived since).
//! 2. Make the call. Anything but `EAGAIN` is the result; a stream read or write that moved
//!    less than asked also clears the readiness bit (the buffer ran dry), but not an end of
//!    stream, hang-up or error that came with the data: the next call still runs and sees it.
//! 3. `EAGAIN`: register the socket if this is its first wait (edge-triggered; the kernel
//!    reports its current readiness on registration), clear the bit (only if no event arrived
//!    since the snapshot taken before 2), and park until the reactor sets it again, the deadline
//!    passes, or the socket closes. Then go to 1.
//!
//! On a plain thread step 3 is `poll(2)` on this one descriptor, honouring the same timeouts, so
//! the types behave as std's blocking ones. A socket set non-blocking by the user
//! (`set_nonblocking(true)`) returns `WouldBlock` from 2, as std's do.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::loom::StdMutex as Mutex;
use std::time::{Duration, Instant};

use crate::fiber::context;
use crate::platform::net::{self as sys, Direction};
use crate::scheduler::reactor::registration::{Learnt, Registration, Wait};

/// How the calling code waits for readiness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Waiter {
    /// A fiber: park on the reactor.
    Fiber,
    /// A plain thread, or a fiber that cannot switch out now (it is unwinding a panic, or its
    /// runtime's drop is unwinding it on a plain thread): block in `poll(2)`.
    Thread,
}

impl Waiter {
    fn of_caller() -> Waiter {
        // `current_fiber` also answers for a fiber being unwound by a runtime's drop; such a
        // fiber runs on a plain thread and cannot park, so `cancelling` is checked first.
        if !context::cancelling().is_null() || context::current_fiber().is_null() || std::thread::panicking()
        {
            Waiter::Thread
        } else {
            Waiter::Fiber
        }
    }
}

/// Whether a successful operation drained the buffer it worked on (then the readiness bit is
/// cleared at once, saving the `EAGAIN` round trip the next call would make; an end of stream or
/// error delivered with the data stays, see `scheduler/reactor/registration.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Drained {
    Yes,
    No,
}

/// A timeout stored as nanoseconds (0: none; std rejects a zero timeout, so 0 is free).
#[derive(Debug, Default)]
struct Timeout(AtomicU64);

impl Timeout {
    fn get(&self) -> Option<Duration> {
        // Relaxed: a plain setting, read at the start of each operation.
        match self.0.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    fn set(&self, d: Option<Duration>) {
        let ns = d.map_or(0, |d| d.as_nanos().clamp(1, u64::MAX as u128) as u64);
        self.0.store(ns, Ordering::Relaxed);
    }
}

/// A std socket `S` in non-blocking mode, plus what makes its operations park a fiber.
///
/// `reg` is declared before `sock` on purpose: fields drop in declaration order, so the
/// descriptor leaves the epoll set (and waiters are failed) before `sock` closes it.
pub(crate) struct IoSource<S: AsFd> {
    /// Set on the first wait inside a fiber; never replaced.
    reg: OnceLock<Registration>,
    /// Once `reg` is orphaned (its runtime dropped, or this a child forked since), the
    /// registration with the runtime of the fiber that waited next, so that its fibers park
    /// rather than block their carrier in `poll(2)`; replaced when it is orphaned in turn. Cold:
    /// read only when `reg` is orphaned.
    adopted: Mutex<Option<Arc<Registration>>>,
    /// Serialises first registrations (two fibers may block on a new socket at once).
    reg_init: Mutex<()>,
    /// The user asked for std's non-blocking behaviour (`WouldBlock` instead of waiting).
    user_nonblocking: AtomicBool,
    read_timeout: Timeout,
    write_timeout: Timeout,
    sock: S,
}

impl<S: AsFd> IoSource<S> {
    /// Wraps a socket that is already non-blocking at the OS level. `user_nonblocking`: whether
    /// operations should return `WouldBlock` instead of waiting.
    pub(crate) fn new(sock: S, user_nonblocking: bool) -> IoSource<S> {
        IoSource {
            sock,
            reg: OnceLock::new(),
            adopted: Mutex::new(None),
            reg_init: Mutex::new(()),
            user_nonblocking: AtomicBool::new(user_nonblocking),
            read_timeout: Timeout::default(),
            write_timeout: Timeout::default(),
        }
    }

    /// Wraps a socket handed over by the user (a std type or a raw descriptor), keeping the
    /// blocking mode the user had set on it.
    pub(crate) fn adopt(sock: S) -> io::Result<IoSource<S>> {
        let was_nonblocking = sys::set_nonblocking(sock.as_fd(), true)?;
        Ok(IoSource::new(sock, was_nonblocking))
    }

    pub(crate) fn get(&self) -> &S {
        &self.sock
    }

    /// Gives the socket back in the blocking mode the user expects, out of the reactor.
    pub(crate) fn into_inner(self) -> S {
        let IoSource { reg, adopted, user_nonblocking, sock, .. } = self;
        // Deregister while the descriptor is still open.
        drop(reg);
        drop(adopted);
        // Best effort: `IntoRawFd` cannot report an error, and `fcntl` on a valid descriptor
        // does not fail.
        let _ = sys::set_nonblocking(sock.as_fd(), user_nonblocking.into_inner());
        sock
    }

    pub(crate) fn set_nonblocking(&self, on: bool) {
        self.user_nonblocking.store(on, Ordering::Relaxed);
    }

    pub(crate) fn is_nonblocking(&self) -> bool {
        self.user_nonblocking.load(Ordering::Relaxed)
    }

    pub(crate) fn set_read_timeout(&self, d: Option<Duration>) {
        self.read_timeout.set(d);
    }

    pub(crate) fn set_write_timeout(&self, d: Option<Duration>) {
        self.write_timeout.set(d);
    }

    pub(crate) fn read_timeout(&self) -> Option<Duration> {
        self.read_timeout.get()
    }

    pub(crate) fn write_timeout(&self) -> Option<Duration> {
        self.write_timeout.get()
    }

    /// Copies the user-visible settings onto a clone (std's `try_clone` shares them through the
    /// kernel; ours live here, so they are copied once).
    pub(crate) fn copy_settings_to<T: AsFd>(&self, other: &IoSource<T>) {
        other.set_nonblocking(self.is_nonblocking());
        other.set_read_timeout(self.read_timeout());
        other.set_write_timeout(self.write_timeout());
    }

    /// A read-side operation under the read timeout.
    pub(crate) fn read<R>(
        &self,
        f: impl FnMut(&S) -> io::Result<R>,
        drained: impl Fn(&R) -> Drained,
    ) -> io::Result<R> {
        self.op(Direction::Read, self.read_timeout.get(), f, drained)
    }

    /// A write-side operation under the write timeout.
    pub(crate) fn write<R>(
        &self,
        f: impl FnMut(&S) -> io::Result<R>,
        drained: impl Fn(&R) -> Drained,
    ) -> io::Result<R> {
        self.op(Direction::Write, self.write_timeout.get(), f, drained)
    }

    /// Runs one blocking operation: the loop in the module docs. `timeout` bounds the whole
    /// call; when it passes the result is `timed_out_error()` (`WouldBlock`, as std's).
    pub(crate) fn op<R>(
        &self,
        dir: Direction,
        timeout: Option<Duration>,
        mut f: impl FnMut(&S) -> io::Result<R>,
        drained: impl Fn(&R) -> Drained,
    ) -> io::Result<R> {
        if self.is_nonblocking() {
            return f(&self.sock);
        }
        // Set at the first wait, so that retries never extend it (`None`: no limit; a timeout too
        // large for an `Instant` is none too).
        let mut deadline: Option<Instant> = None;
        let waiter = Waiter::of_caller();
        loop {
            // Read once per round: another fiber may register the socket at any moment, and
            // the arms below must judge the registration this round's snapshot came from.
            // (Reading it again there let a fiber that saw none, then lost the race to
            // register, take the new registration for an orphaned one and park for ever:
            // four acceptors on one listener, seen under valgrind.)
            let registered = self.reg.get();
            // The registration may be orphaned (its runtime gone): then the one adopted since
            // by the waiting fiber's runtime, if any (held for this round).
            let adopted;
            let reg = match registered {
                Some(r) if !r.is_orphaned() => Some(r),
                Some(_) if waiter == Waiter::Fiber => {
                    adopted = self.adopted();
                    adopted.as_deref()
                }
                _ => None,
            }
            .filter(|_| waiter == Waiter::Fiber);
            let seen = reg.map(|r| r.readiness().snapshot(dir));
            if let Some(s) = seen {
                if s.is_closed() {
                    return Err(closed_error());
                }
            }
            if seen.is_none_or(|s| s.is_ready()) {
                match f(&self.sock) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if let (Some(r), Some(s)) = (reg, seen) {
                            r.readiness().clear(s, Learnt::WouldBlock);
                        }
                    }
                    Ok(v) => {
                        if let (Some(r), Some(s), Drained::Yes) = (reg, seen, drained(&v)) {
                            r.readiness().clear(s, Learnt::Drained);
                        }
                        return Ok(v);
                    }
                    Err(e) => return Err(e),
                }
            }
            if deadline.is_none() {
                deadline = timeout.and_then(|t| Instant::now().checked_add(t));
            }
            let waited = match (waiter, reg) {
                (Waiter::Fiber, Some(r)) => {
                    // A socket handed over from a fiber of another carrier: have its readiness
                    // read where this fiber runs, then take a new snapshot.
                    if r.follow_caller() {
                        continue;
                    }
                    r.readiness().wait(dir, deadline)
                }
                (Waiter::Fiber, None) if registered.is_some_and(|r| r.runtime_is_current()) => {
                    // Orphaned: this fiber's own runtime is being dropped, and nothing polls its
                    // reactor. Park, to be unwound by the drop like every other waiting fiber
                    // (re-registering and retrying here would spin, and the drop would wait
                    // for this carrier for ever).
                    crate::fiber::park::park();
                    continue;
                }
                // Orphaned by another runtime's drop, or by a fork: register with this fiber's
                // runtime (the first registration stays, and leaves its set when the socket
                // drops, or leaks in a forked child, whose copy of that set is the parent's),
                // then go round again. Waiting like a thread here blocked the carrier in
                // `poll(2)`: in a pre-fork server's worker, every read of a connection the
                // parent had used.
                (Waiter::Fiber, None) if registered.is_some() => {
                    if !self.adopt_registration()? {
                        // This fiber's own runtime is being dropped: as above.
                        crate::fiber::park::park();
                    }
                    continue;
                }
                (Waiter::Fiber, None) => {
                    // First wait: register (unless another fiber just did: `register` checks
                    // under its lock), then go round again to take a snapshot (the
                    // registration reports the current readiness, so nothing is missed). A
                    // fiber must never fall through to the thread wait: `poll(2)` would block
                    // its carrier, and a close would never wake it.
                    self.register()?;
                    continue;
                }
                (Waiter::Thread, _) => self.wait_thread(dir, deadline)?,
            };
            match waited {
                Wait::Ready => {}
                // Or stopped where nothing can unwind (`Readiness::wait_because`).
                Wait::TimedOut if crate::fiber::stop::due_without_unwinding() => {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, crate::fiber::stop::Cancelled));
                }
                Wait::TimedOut => return Err(sys::timed_out_error()),
                Wait::Closed => return Err(closed_error()),
            }
        }
    }

    /// Closes the registration as a socket's drop does, if there is one (tests only: in safe
    /// code no fiber can be waiting on a socket that is being dropped).
    #[cfg(test)]
    pub(crate) fn close_registration(&self) -> bool {
        self.reg.get().map(|r| r.readiness().close()).is_some()
    }

    /// The plain-thread wait: `poll(2)` on this descriptor.
    fn wait_thread(&self, dir: Direction, deadline: Option<Instant>) -> io::Result<Wait> {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if left.is_some_and(|l| l.is_zero()) {
            return Ok(Wait::TimedOut);
        }
        Ok(if sys::poll_one(self.sock.as_fd(), dir, left)? { Wait::Ready } else { Wait::TimedOut })
    }

    /// Registers the socket with the calling fiber's carrier's poll set, unless someone already
    /// did.
    fn register(&self) -> io::Result<()> {
        let _g = self.reg_init.lock().unwrap_or_else(|e| e.into_inner());
        if self.reg.get().is_some() {
            return Ok(());
        }
        let reg = self.new_registration()?;
        let _ = self.reg.set(reg);
        Ok(())
    }

    /// A registration with the poll set of the calling fiber's carrier.
    fn new_registration(&self) -> io::Result<Registration> {
        let c = crate::scheduler::carrier::here();
        debug_assert!(!c.is_null(), "registration outside a carrier");
        // SAFETY: the caller is a fiber (`Waiter::Fiber`), so this thread is a carrier and `c`
        // its live `Carrier`; it is used before any switch point (nothing here parks).
        let (rt, set) = unsafe { ((*c).runtime_ref(), (*c).index()) };
        // The set of the carrier running the waiter: with one fiber per connection, the fiber's
        // home, so readiness wakes that carrier directly (`scheduler/reactor/`); a later waiter
        // on another carrier takes it along (`follow_caller`).
        Registration::new(rt, set, self.sock.as_fd().as_raw_fd())
    }
}

impl<S: AsFd> IoSource<S> {
    /// The adopted registration, unless it is orphaned too (cold: see `adopted`).
    #[cold]
    fn adopted(&self) -> Option<Arc<Registration>> {
        self.adopted.lock().unwrap_or_else(|e| e.into_inner()).clone().filter(|r| !r.is_orphaned())
    }

    /// Registers the socket with the calling fiber's carrier's poll set in place of an orphaned
    /// registration (`adopted`), unless another fiber of a live runtime just did. False when the
    /// calling fiber's own runtime is being dropped (its registration would be orphaned at once).
    #[cold]
    #[inline(never)]
    fn adopt_registration(&self) -> io::Result<bool> {
        let mut adopted = self.adopted.lock().unwrap_or_else(|e| e.into_inner());
        if adopted.as_ref().is_some_and(|r| !r.is_orphaned()) {
            return Ok(true);
        }
        let reg = self.new_registration()?;
        if reg.is_orphaned() {
            return Ok(false);
        }
        // The one replaced (orphaned in turn) leaves its set when its last waiter lets go.
        *adopted = Some(Arc::new(reg));
        Ok(true)
    }
}

impl<S: AsFd> AsFd for IoSource<S> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl<S: AsFd + fmt::Debug> fmt::Debug for IoSource<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.sock.fmt(f)
    }
}

/// What a fiber waiting on a socket gets when the socket is closed under it.
fn closed_error() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "socket closed while waiting on it")
}

/// `Drained` for a stream transfer of `n` bytes out of `asked`.
pub(crate) fn stream_drained(n: usize, asked: usize) -> Drained {
    if n > 0 && n < asked { Drained::Yes } else { Drained::No }
}

/// For operations whose short result says nothing about the buffer (datagrams, peeks, accepts).
pub(crate) fn never_drained<R>(_: &R) -> Drained {
    Drained::No
}
