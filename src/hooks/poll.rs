//! Readiness waits: `poll`, `ppoll`, `epoll_wait` and `epoll_pwait` from a fiber with a
//! non-zero timeout park it. The call is first made with a zero timeout; if nothing is ready,
//! an epoll set stands for the wait (the caller's own for `epoll_wait`; for `poll`, a
//! temporary one holding the caller's descriptors, level-triggered), and that set, which is
//! itself pollable, is registered with the carrier's reactor for the time of the call. The
//! fiber parks on it and tries again with a zero timeout at each wake, until something is ready
//! or the timeout passes (then 0, as the kernel's). The signal mask of `ppoll`/`epoll_pwait` is
//! not applied to a fiber's wait (signals go to the carrier thread, not the fiber). A
//! cancelled fiber's call returns `ECANCELED`.

use std::ffi::c_int;
use std::time::{Duration, Instant};

use super::real::{self, errno, set_errno};
use super::{Gate, gate, parking};
use crate::fiber::wait::WaitReason;
use crate::platform::net::Direction;
use crate::scheduler::reactor::registration::{Learnt, Registration, Wait};

/// Whether a call with this timeout parks (a fiber, and not a zero timeout). A fiber that the
/// runtime's drop is unwinding takes the same path, which `wait_on` ends with `ECANCELED`
/// after the zero-timeout try: passed through, its wait would hold the drop for ever.
fn parks(zero: bool) -> bool {
    !zero && gate() != Gate::Pass
}

/// The deadline of a `poll`-style millisecond timeout (negative: none).
fn ms_deadline(ms: c_int) -> Option<Instant> {
    (ms >= 0).then(|| Instant::now() + Duration::from_millis(ms as u64))
}

/// Parks the calling fiber on `ep` (an epoll set) until `check` (a zero-timeout try of the
/// caller's call) returns something other than 0, or `deadline` passes (then 0). Falls back to
/// `block` (the caller's call made for real) if the set cannot be registered.
fn wait_on(
    ep: c_int,
    deadline: Option<Instant>,
    mut check: impl FnMut() -> c_int,
    block: impl FnOnce() -> c_int,
) -> c_int {
    if gate() == Gate::Cancelling {
        set_errno(libc::ECANCELED);
        return -1;
    }
    let c = crate::scheduler::carrier::here();
    if c.is_null() {
        return block();
    }
    // SAFETY: a fiber's thread is its carrier, and `c` that live carrier, used before any switch.
    let (rt, set) = unsafe { ((*c).runtime_ref(), (*c).index()) };
    let Ok(reg) = Registration::new(rt, set, ep) else { return block() };
    let saved = errno();
    let r = loop {
        let seen = reg.readiness().snapshot(Direction::Read);
        if seen.is_ready() {
            let r = check();
            if r != 0 {
                break r;
            }
            reg.readiness().clear(seen, Learnt::WouldBlock);
        }
        match parking(|| reg.readiness().wait_because(Direction::Read, deadline, WaitReason::HookedRead)) {
            None => {
                set_errno(libc::ECANCELED);
                break -1;
            }
            Some(Wait::Ready) => {}
            Some(Wait::TimedOut | Wait::Closed) => break 0,
        }
    };
    if r >= 0 {
        set_errno(saved);
    }
    // Dropping `reg` takes `ep` out of the carrier's set while it is open.
    r
}

/// Interposes `poll(2)`.
///
/// # Safety
/// As for `poll(2)`.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, ms: c_int) -> c_int {
    if !parks(ms == 0) {
        // SAFETY: the caller's arguments.
        return unsafe { real::poll(fds, n, ms) };
    }
    // SAFETY: the caller's arguments, on every try.
    unsafe { poll_parked(fds, n, ms_deadline(ms), || real::poll(fds, n, ms)) }
}

/// Interposes `ppoll(2)`.
///
/// # Safety
/// As for `ppoll(2)`.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn ppoll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the caller's timespec, if any; a bad one goes to the kernel below.
    let t = (!ts.is_null()).then(|| unsafe { ts.read() });
    let valid = t.is_none_or(|t| t.tv_sec >= 0 && (0..1_000_000_000).contains(&t.tv_nsec));
    let zero = t.is_some_and(|t| t.tv_sec == 0 && t.tv_nsec == 0);
    if !valid || !parks(zero) {
        // SAFETY: the caller's arguments.
        return unsafe { real::ppoll(fds, n, ts, mask) };
    }
    let deadline =
        t.and_then(|t| Instant::now().checked_add(Duration::new(t.tv_sec as u64, t.tv_nsec as u32)));
    // SAFETY: the caller's arguments, on every try.
    unsafe { poll_parked(fds, n, deadline, || real::ppoll(fds, n, ts, mask)) }
}

/// A fiber's `poll` that may have to wait: the module doc.
///
/// # Safety
/// `fds` points to `n` pollfds.
unsafe fn poll_parked(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    deadline: Option<Instant>,
    block: impl FnOnce() -> c_int,
) -> c_int {
    // SAFETY: the caller's pollfds, with a zero timeout.
    let r = unsafe { real::poll(fds, n, 0) };
    if r != 0 {
        return r;
    }
    // SAFETY: no pointers; `epoll_create1` is not hooked.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return block();
    }
    // SAFETY: the caller vouches for `n` pollfds at `fds`.
    let pfds = unsafe { std::slice::from_raw_parts(fds, n as usize) };
    for p in pfds.iter().filter(|p| p.fd >= 0) {
        let mut ev = libc::epoll_event { events: poll_to_epoll(p.events), u64: 0 };
        // SAFETY: `ev` is valid for the call; `epoll_ctl` is not hooked. A descriptor epoll
        // refuses (a regular file, always ready) was reported by the zero-timeout poll already.
        unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, p.fd, &mut ev) };
    }
    // SAFETY: the caller's pollfds, with a zero timeout, on every try.
    let r = wait_on(ep, deadline, || unsafe { real::poll(fds, n, 0) }, block);
    let e = errno();
    // SAFETY: our own set.
    unsafe { real::close(ep) };
    set_errno(e);
    r
}

/// `poll` events as epoll's (the low bits agree on Linux; `POLLRDHUP` included).
fn poll_to_epoll(events: i16) -> u32 {
    let e = events as u16 as u32;
    e & (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLPRI | libc::EPOLLRDHUP) as u32
}

/// Interposes `epoll_wait(2)`: the caller's set is what the fiber parks on.
///
/// # Safety
/// As for `epoll_wait(2)`.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn epoll_wait(
    ep: c_int,
    ev: *mut libc::epoll_event,
    n: c_int,
    ms: c_int,
) -> c_int {
    if !parks(ms == 0) {
        // SAFETY: the caller's arguments.
        return unsafe { real::epoll_wait(ep, ev, n, ms) };
    }
    // SAFETY: the caller's arguments, with a zero timeout.
    let r = unsafe { real::epoll_wait(ep, ev, n, 0) };
    if r != 0 {
        return r;
    }
    // SAFETY: the caller's arguments, on every try.
    wait_on(
        ep,
        ms_deadline(ms),
        || unsafe { real::epoll_wait(ep, ev, n, 0) },
        || unsafe { real::epoll_wait(ep, ev, n, ms) },
    )
}

/// Interposes `epoll_pwait(2)` (the mask is not applied to a fiber's wait: the module doc).
///
/// # Safety
/// As for `epoll_pwait(2)`.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn epoll_pwait(
    ep: c_int,
    ev: *mut libc::epoll_event,
    n: c_int,
    ms: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    if !parks(ms == 0) {
        // SAFETY: the caller's arguments.
        return unsafe { real::epoll_pwait(ep, ev, n, ms, mask) };
    }
    // SAFETY: the caller's arguments, with a zero timeout.
    let r = unsafe { real::epoll_pwait(ep, ev, n, 0, mask) };
    if r != 0 {
        return r;
    }
    // SAFETY: the caller's arguments, on every try.
    wait_on(
        ep,
        ms_deadline(ms),
        || unsafe { real::epoll_pwait(ep, ev, n, 0, mask) },
        || unsafe { real::epoll_pwait(ep, ev, n, ms, mask) },
    )
}
