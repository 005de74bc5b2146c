//! `TcpStream` and `TcpListener`: std's types and signatures; a call that would block parks the
//! calling fiber on the reactor (see `source.rs` for the loop every operation runs through).
//!
//! Each type wraps the std type in non-blocking mode and calls its methods, so the semantics of
//! every call that cannot block (addresses, options, `shutdown`) are std's own. What std cannot
//! do without blocking — `connect`, `accept` — is made here from non-blocking system calls.

use std::io;
use std::net::{self, Shutdown, SocketAddr, ToSocketAddrs};
use std::os::fd::AsFd;
use std::time::Duration;

use super::addr::each_addr;
use super::source::{IoSource, never_drained};
use crate::platform::net::{self as sys, Connect, Direction};

/// Listen backlog: as many pending connections as the kernel allows (`net.core.somaxconn`
/// caps it). A fiber-per-connection server accepts in bursts, and a dropped SYN costs the
/// client a one-second retransmission.
const BACKLOG: i32 = 4096;

/// `let mut s = vt::net::TcpStream::connect("example.com:80")?; s.write_all(b"GET / HTTP/1.0\r\n\r\n")?;`
///
/// A TCP connection, like [`std::net::TcpStream`]. Inside a fiber, reads, writes, `connect` and
/// `peek` park the fiber until the socket is ready; on a plain thread they block it.
///
/// ```no_run
/// use std::io::{Read, Write};
/// use virtual_threads as vt;
///
/// let h = vt::spawn(|| -> std::io::Result<Vec<u8>> {
///     let mut s = vt::net::TcpStream::connect("127.0.0.1:7000")?;
///     s.write_all(b"hello")?;
///     let mut buf = vec![0; 5];
///     s.read_exact(&mut buf)?; // parks this fiber, not the carrier
///     Ok(buf)
/// });
/// let _ = h.join().unwrap();
/// ```
pub struct TcpStream {
    io: IoSource<net::TcpStream>,
}

/// `for conn in vt::net::TcpListener::bind("0.0.0.0:8080")?.incoming() { let c = conn?; vt::spawn(move || serve(c)); }`
///
/// A TCP listening socket, like [`std::net::TcpListener`]. Inside a fiber, `accept` parks the
/// fiber until a connection arrives.
///
/// Running out of file descriptors is an error of `accept` (`EMFILE`/`ENFILE`), never a panic:
/// the listener stays usable, and a server usually logs it, waits a little and accepts again.
pub struct TcpListener {
    io: IoSource<net::TcpListener>,
}

/// An iterator over the connections of a [`TcpListener`]; see [`TcpListener::incoming`].
#[derive(Debug)]
pub struct Incoming<'a> {
    listener: &'a TcpListener,
}

fn would_block() -> io::Error {
    io::Error::from(io::ErrorKind::WouldBlock)
}

fn check_timeout(d: Duration) -> io::Result<()> {
    if d.is_zero() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "cannot set a 0 duration timeout"));
    }
    Ok(())
}

impl TcpStream {
    /// Opens a connection to `addr`, trying each address it resolves to. Name resolution runs
    /// as a [`blocking`](crate::blocking) section (unless `addr` is a literal address); the
    /// connect itself parks the fiber.
    pub fn connect<A: ToSocketAddrs>(addr: A) -> io::Result<TcpStream> {
        each_addr(addr, |a| TcpStream::connect_addr(a, None))
    }

    /// Opens a connection to `addr`, failing with `TimedOut` after `timeout`.
    ///
    /// # Errors
    /// `InvalidInput` for a zero timeout, as std.
    pub fn connect_timeout(addr: &SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        check_timeout(timeout)?;
        TcpStream::connect_addr(addr, Some(timeout))
    }

    fn connect_addr(addr: &SocketAddr, timeout: Option<Duration>) -> io::Result<TcpStream> {
        let fd = sys::socket(addr, sys::STREAM)?;
        let stream = TcpStream { io: IoSource::new(net::TcpStream::from(fd), false) };
        if sys::connect(stream.as_fd(), addr)? == Connect::InProgress {
            let finished = |s: &net::TcpStream| {
                if sys::connect_finished(s.as_fd())? { Ok(()) } else { Err(would_block()) }
            };
            stream.io.op(Direction::Write, timeout, finished, never_drained).map_err(|e| {
                if timeout.is_some() && e.kind() == io::ErrorKind::WouldBlock {
                    io::Error::new(io::ErrorKind::TimedOut, "connection timed out")
                } else {
                    e
                }
            })?;
        }
        Ok(stream)
    }

    /// The remote address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.io.get().peer_addr()
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.get().local_addr()
    }

    /// Shuts down the read half, the write half or both. A fiber parked reading this socket
    /// (through a clone or a shared reference) wakes up and reads end of stream.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.io.get().shutdown(how)
    }

    /// Reads without removing the data from the queue; waits like `read`.
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.io.read(|s| s.peek(buf), never_drained)
    }

    /// `SO_LINGER`. `Some(Duration::ZERO)` makes dropping the stream reset the connection
    /// (RST) instead of closing it gracefully. (std's twin is unstable.)
    pub fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        sys::set_linger(self.as_fd(), linger)
    }

    /// `SO_LINGER`.
    pub fn linger(&self) -> io::Result<Option<Duration>> {
        sys::linger(self.as_fd())
    }

    /// `TCP_NODELAY`.
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.io.get().set_nodelay(nodelay)
    }

    /// `TCP_NODELAY`.
    pub fn nodelay(&self) -> io::Result<bool> {
        self.io.get().nodelay()
    }

    timeout_methods!();
    ttl_methods!();
    common_methods!(net::TcpStream);
}

impl TcpListener {
    /// Binds a listener to `addr`, trying each address it resolves to (`SO_REUSEADDR` set, as
    /// std does; the backlog is as large as the kernel allows).
    pub fn bind<A: ToSocketAddrs>(addr: A) -> io::Result<TcpListener> {
        each_addr(addr, |a| TcpListener::bind_addr(a, false))
    }

    /// `bind` with `SO_REUSEPORT` set as well: other listeners bound the same way, by this
    /// user, may share the address and port, and the kernel spreads new connections among
    /// them (by a hash of each connection's addresses, so one client's connections from
    /// different ports spread too). A listener per carrier, each with its own acceptor fiber
    /// started on that carrier, is what [`serve`](crate::net::serve) builds from this.
    ///
    /// Port 0 picks a free port for this listener only: bind the others to its
    /// [`local_addr`](TcpListener::local_addr) to share it.
    ///
    /// ```
    /// use virtual_threads as vt;
    ///
    /// let a = vt::net::TcpListener::bind_reuseport("127.0.0.1:0")?;
    /// let b = vt::net::TcpListener::bind_reuseport(a.local_addr()?)?;
    /// assert_eq!(a.local_addr()?, b.local_addr()?);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn bind_reuseport<A: ToSocketAddrs>(addr: A) -> io::Result<TcpListener> {
        each_addr(addr, |a| TcpListener::bind_addr(a, true))
    }

    fn bind_addr(a: &SocketAddr, reuseport: bool) -> io::Result<TcpListener> {
        let fd = sys::socket(a, sys::STREAM)?;
        sys::set_reuseaddr(fd.as_fd())?;
        if reuseport {
            sys::set_reuseport(fd.as_fd())?;
        }
        sys::bind(fd.as_fd(), a)?;
        sys::listen(fd.as_fd(), BACKLOG)?;
        Ok(TcpListener { io: IoSource::new(net::TcpListener::from(fd), false) })
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.get().local_addr()
    }

    /// Accepts a connection, parking the fiber until one arrives.
    ///
    /// # Errors
    /// Among others `EMFILE`/`ENFILE` when the process or system is out of descriptors: the
    /// connection stays queued, and a later `accept` takes it once descriptors are free.
    pub fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let (fd, addr) = self.io.read(|l| sys::accept(l.as_fd()), never_drained)?;
        Ok((TcpStream { io: IoSource::new(net::TcpStream::from(fd), false) }, addr))
    }

    /// An endless iterator of `accept` results.
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming { listener: self }
    }

    ttl_methods!();
    common_methods!(net::TcpListener);
}

impl Iterator for Incoming<'_> {
    type Item = io::Result<TcpStream>;

    fn next(&mut self) -> Option<io::Result<TcpStream>> {
        Some(self.listener.accept().map(|(s, _)| s))
    }
}

stream_io!(TcpStream);
conversions!(TcpStream, net::TcpStream);
conversions!(TcpListener, net::TcpListener);
