//! epoll and eventfd: the system calls under the I/O reactor.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
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

/// Waits for events; `None` waits for ever. Timeouts are rounded *up* to whole milliseconds so
/// a timer is never fired early. Returns the number of events written into `events`.
pub(crate) fn epoll_wait(ep: &OwnedFd, events: &mut [Event], timeout: Option<Duration>) -> io::Result<usize> {
    let ms = match timeout {
        None => -1,
        Some(d) => d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32,
    };
    // SAFETY: `events` is a writable buffer of `events.len()` entries.
    let n = unsafe { libc::epoll_wait(ep.as_raw_fd(), events.as_mut_ptr(), events.len() as i32, ms) };
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
