//! Socket system calls under `vt::net`: thin `io::Result` wrappers, one `unsafe` block per call.
//!
//! Everything `vt::net` can do through std's socket types it does there; this file holds only
//! what std does not offer: sockets created non-blocking (`SOCK_NONBLOCK`, saving an `fcntl` per
//! socket), `connect` that returns `EINPROGRESS` instead of blocking, `accept4`, a listen
//! backlog of our choosing, `poll(2)` on one descriptor (the plain-thread wait), `O_NONBLOCK`
//! queries, `SO_LINGER`, and the `SocketAddr` ↔ `sockaddr` conversions those calls need.

use std::io;
use std::mem::{self, MaybeUninit};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// The readiness a caller waits for on one descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Readable (data, a pending connection, end of stream, an error).
    Read,
    /// Writable (buffer room, a finished connect, an error).
    Write,
}

/// How a non-blocking `connect` started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Connect {
    /// Connected already (happens for some local sockets).
    Done,
    /// `EINPROGRESS`: the socket becomes writable when the handshake ends, either way.
    InProgress,
}

/// A new socket of `family`'s domain and type `ty` (`libc::SOCK_STREAM`/`SOCK_DGRAM`),
/// created non-blocking and close-on-exec.
pub(crate) fn socket(addr: &SocketAddr, ty: libc::c_int) -> io::Result<OwnedFd> {
    let domain = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: no pointers; the result is checked.
    let fd = unsafe { libc::socket(domain, ty | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(super::explain_fd_error(io::Error::last_os_error()));
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `SO_REUSEADDR`, as std sets it on listeners (a restarted server can bind at once while old
/// connections sit in `TIME_WAIT`).
pub(crate) fn set_reuseaddr(fd: BorrowedFd<'_>) -> io::Result<()> {
    let on: libc::c_int = 1;
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, &on)
}

/// `SO_REUSEPORT`: several listening sockets of this user on one address and port, among
/// which the kernel spreads incoming connections by a hash of their addresses.
pub(crate) fn set_reuseport(fd: BorrowedFd<'_>) -> io::Result<()> {
    let on: libc::c_int = 1;
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, &on)
}

pub(crate) fn bind(fd: BorrowedFd<'_>, addr: &SocketAddr) -> io::Result<()> {
    let (raw, len) = SockAddr::from(addr);
    // SAFETY: `raw` is a valid sockaddr of `len` bytes for the duration of the call.
    if unsafe { libc::bind(fd.as_raw_fd(), raw.as_ptr(), len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `listen(2)`. The kernel caps `backlog` at `net.core.somaxconn`.
pub(crate) fn listen(fd: BorrowedFd<'_>, backlog: i32) -> io::Result<()> {
    // SAFETY: no pointers; the result is checked.
    if unsafe { libc::listen(fd.as_raw_fd(), backlog) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Starts connecting a non-blocking socket.
pub(crate) fn connect(fd: BorrowedFd<'_>, addr: &SocketAddr) -> io::Result<Connect> {
    let (raw, len) = SockAddr::from(addr);
    // SAFETY: `raw` is a valid sockaddr of `len` bytes for the duration of the call.
    if unsafe { libc::connect(fd.as_raw_fd(), raw.as_ptr(), len) } == 0 {
        return Ok(Connect::Done);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // EINTR: a signal interrupted it, and the handshake goes on in the background.
        Some(libc::EINPROGRESS | libc::EINTR) => Ok(Connect::InProgress),
        _ => Err(e),
    }
}

/// Whether a non-blocking connect has finished: `Ok(true)` connected, `Ok(false)` still in
/// progress, `Err` failed (the socket's pending error, e.g. `ECONNREFUSED`).
pub(crate) fn connect_finished(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut err: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `err` is a writable c_int and `len` holds its size.
    let rc = unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_ERROR, (&raw mut err).cast(), &mut len)
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    if err != 0 {
        return Err(io::Error::from_raw_os_error(err));
    }
    // No error yet: connected only if the kernel knows a peer (Go does the same check, since
    // a writable event can be spurious).
    let mut storage = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut len = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `storage` is a writable sockaddr_storage and `len` holds its size.
    let rc = unsafe { libc::getpeername(fd.as_raw_fd(), storage.as_mut_ptr().cast(), &mut len) };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENOTCONN) { Ok(false) } else { Err(e) }
}

/// Accepts one connection; the new socket is non-blocking and close-on-exec.
pub(crate) fn accept(fd: BorrowedFd<'_>) -> io::Result<(OwnedFd, SocketAddr)> {
    let mut storage = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut len = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let flags = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: `storage` is a writable sockaddr_storage and `len` holds its size.
    let new = unsafe { libc::accept4(fd.as_raw_fd(), storage.as_mut_ptr().cast(), &mut len, flags) };
    if new < 0 {
        return Err(super::explain_fd_error(io::Error::last_os_error()));
    }
    // SAFETY: `new` is a descriptor accept4 just created; nothing else owns it.
    let new = unsafe { OwnedFd::from_raw_fd(new) };
    // SAFETY: accept4 succeeded, so it wrote a valid address (zeroed bytes beyond it).
    let addr = to_socket_addr(unsafe { storage.assume_init_ref() })?;
    Ok((new, addr))
}

/// Waits with `poll(2)` until `fd` is ready for `dir`, or `timeout` passes (`None`: no limit).
/// Returns `Ok(false)` on timeout. An interrupted wait returns `Ok(true)`: callers retry the
/// operation, which is what a spurious readiness costs.
pub(crate) fn poll_one(fd: BorrowedFd<'_>, dir: Direction, timeout: Option<Duration>) -> io::Result<bool> {
    let events = match dir {
        Direction::Read => libc::POLLIN | libc::POLLPRI,
        Direction::Write => libc::POLLOUT,
    };
    let mut pfd = libc::pollfd { fd: fd.as_raw_fd(), events, revents: 0 };
    // Rounded up, so that a timeout never fires early.
    let ms = timeout.map_or(-1, |d| d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32);
    // SAFETY: `pfd` is one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(true) } else { Err(e) };
    }
    Ok(n > 0)
}

/// Sets or clears `O_NONBLOCK`; returns whether it was set before.
pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<bool> {
    // SAFETY: no pointers; the result is checked.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    let was = flags & libc::O_NONBLOCK != 0;
    let new = if on { flags | libc::O_NONBLOCK } else { flags & !libc::O_NONBLOCK };
    if new != flags {
        // SAFETY: no pointers; the result is checked.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, new) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(was)
}

/// `SO_LINGER`: `Some(0)` makes `close` reset the connection (RST) instead of a graceful FIN.
pub(crate) fn set_linger(fd: BorrowedFd<'_>, linger: Option<Duration>) -> io::Result<()> {
    let l = libc::linger {
        l_onoff: linger.is_some() as libc::c_int,
        l_linger: linger.map_or(0, |d| d.as_secs().min(libc::c_int::MAX as u64) as libc::c_int),
    };
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, &l)
}

pub(crate) fn linger(fd: BorrowedFd<'_>) -> io::Result<Option<Duration>> {
    let mut l = libc::linger { l_onoff: 0, l_linger: 0 };
    let mut len = mem::size_of::<libc::linger>() as libc::socklen_t;
    // SAFETY: `l` is a writable linger and `len` holds its size.
    let rc = unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_LINGER, (&raw mut l).cast(), &mut len)
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((l.l_onoff != 0).then(|| Duration::from_secs(l.l_linger as u64)))
}

fn setsockopt<T>(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    let len = mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `value` is a live T of `len` bytes for the duration of the call.
    if unsafe { libc::setsockopt(fd.as_raw_fd(), level, name, (value as *const T).cast(), len) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The error std reports when a blocking call's `SO_RCVTIMEO`/`SO_SNDTIMEO` expires on Linux
/// (`EAGAIN`, kind `WouldBlock`): what `vt::net` returns when a read or write timeout passes.
pub(crate) fn timed_out_error() -> io::Error {
    io::Error::from_raw_os_error(libc::EAGAIN)
}

/// `SOCK_STREAM` and `SOCK_DGRAM`, re-exported so `vt::net` names no libc constant itself.
pub(crate) const STREAM: libc::c_int = libc::SOCK_STREAM;
pub(crate) const DGRAM: libc::c_int = libc::SOCK_DGRAM;

/// A `sockaddr_in` or `sockaddr_in6`, built from a `SocketAddr` without `unsafe`.
#[repr(C)]
union SockAddr {
    v4: libc::sockaddr_in,
    v6: libc::sockaddr_in6,
}

impl SockAddr {
    fn from(addr: &SocketAddr) -> (SockAddr, libc::socklen_t) {
        match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                    sin_zero: [0; 8],
                };
                (SockAddr { v4: sin }, mem::size_of::<libc::sockaddr_in>() as libc::socklen_t)
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo(),
                    sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                    sin6_scope_id: a.scope_id(),
                };
                (SockAddr { v6: sin6 }, mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t)
            }
        }
    }

    fn as_ptr(&self) -> *const libc::sockaddr {
        (self as *const SockAddr).cast()
    }
}

/// Reads the address out of a `sockaddr_storage` the kernel filled in.
fn to_socket_addr(s: &libc::sockaddr_storage) -> io::Result<SocketAddr> {
    match s.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in; sockaddr_storage is
            // larger and at least as aligned.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes());
            Ok(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Ok(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "not an IP socket address")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddr_round_trips() {
        for a in ["127.0.0.1:80", "[::1]:443", "[fe80::1%2]:8080", "0.0.0.0:0"] {
            let a: SocketAddr = a.parse().unwrap();
            let (raw, _) = SockAddr::from(&a);
            let mut s = MaybeUninit::<libc::sockaddr_storage>::zeroed();
            // SAFETY: `raw` is at most as large as a sockaddr_storage, and both are plain data.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    raw.as_ptr().cast::<u8>(),
                    s.as_mut_ptr().cast(),
                    size_of_val(&raw),
                )
            };
            // SAFETY: zeroed, then partly overwritten with plain bytes: initialised.
            assert_eq!(to_socket_addr(unsafe { s.assume_init_ref() }).unwrap(), a);
        }
    }
}
