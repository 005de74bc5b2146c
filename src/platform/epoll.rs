//! epoll and eventfd: the system calls under the I/O reactor.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub(crate) use libc::epoll_event as Event;

pub(crate) fn epoll_create() -> io::Result<OwnedFd> {
    // SAFETY: no pointers; the result is checked.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(super::explain_fd_error(io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds `fd` to the epoll set with `events`, tagged with `token`.
pub(crate) fn epoll_add(ep: &OwnedFd, fd: i32, events: u32, token: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: token };
    // SAFETY: `ev` is a valid event for the duration of the call.
    if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Removes `fd` from the epoll set.
pub(crate) fn epoll_del(ep: &OwnedFd, fd: i32) -> io::Result<()> {
    let mut ev = libc::epoll_event { events: 0, u64: 0 };
    // SAFETY: as above (the event is ignored for DEL, but old kernels want a valid pointer).
    if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Set once `epoll_pwait2` (Linux 5.11) answered ENOSYS; only ever written that once, so the
/// pollers of every runtime read it without sharing a written line.
static NO_PWAIT2: AtomicBool = AtomicBool::new(false);

/// Waits for events; `None` waits for ever. Returns the number of events written into `events`.
///
/// Timeouts are exact to the nanosecond with `epoll_pwait2`. `epoll_wait` takes whole
/// milliseconds, rounded *up* so that a timer never fires early, which made every sleep that
/// ended while the runtime was idle up to 1 ms late; it remains the
/// fallback for kernels older than 5.11.
pub(crate) fn epoll_wait(ep: &OwnedFd, events: &mut [Event], timeout: Option<Duration>) -> io::Result<usize> {
    let n = match timeout {
        Some(d) if !NO_PWAIT2.load(Ordering::Relaxed) => {
            let ts = libc::timespec {
                tv_sec: d.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
                tv_nsec: d.subsec_nanos() as _,
            };
            // SAFETY: `events` is a writable buffer of `events.len()` entries and `ts` a valid
            // timespec for the call; a null signal mask leaves the thread's mask alone (the
            // size is then ignored).
            let n = unsafe {
                libc::syscall(
                    libc::SYS_epoll_pwait2,
                    ep.as_raw_fd(),
                    events.as_mut_ptr(),
                    events.len() as libc::c_int,
                    &ts as *const libc::timespec,
                    std::ptr::null::<libc::sigset_t>(),
                    0usize,
                )
            };
            if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
                NO_PWAIT2.store(true, Ordering::Relaxed);
                return epoll_wait(ep, events, timeout);
            }
            n as libc::c_int
        }
        _ => {
            let ms = match timeout {
                None => -1,
                Some(d) => d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32,
            };
            // SAFETY: `events` is a writable buffer of `events.len()` entries.
            unsafe { libc::epoll_wait(ep.as_raw_fd(), events.as_mut_ptr(), events.len() as i32, ms) }
        }
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(0) } else { Err(e) };
    }
    Ok(n as usize)
}

pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: no pointers; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(super::explain_fd_error(io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds one to the eventfd's counter (making it readable). Never blocks: a full counter
/// (impossible in practice) only means it is already readable.
pub(crate) fn eventfd_signal(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64.
    let _ = unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Resets the eventfd's counter (non-blocking read).
pub(crate) fn eventfd_drain(fd: &OwnedFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64.
    let _ = unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
}
