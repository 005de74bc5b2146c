//! Unix-domain `UnixStream` and `UnixListener`: std's types and signatures; reads, writes and
//! `accept` park the calling fiber on the reactor.
//!
//! `connect` is std's blocking call inside a [`blocking`](crate::blocking) section: a Unix
//! connect finishes at once unless the listener's backlog is full, and a non-blocking one then
//! fails with `EAGAIN` with no readiness event to wait for (unlike TCP's `EINPROGRESS`).

use std::io;
use std::net::Shutdown;
use std::os::fd::AsFd;
use std::os::unix::net::{self as unet, SocketAddr};
use std::path::Path;

use super::source::{IoSource, never_drained};
use crate::platform::explain_fd_error;
use crate::platform::net as sys;

/// `let mut s = vt::net::UnixStream::connect("/tmp/app.sock")?; s.write_all(b"ping")?;`
///
/// A Unix-domain stream socket, like [`std::os::unix::net::UnixStream`].
pub struct UnixStream {
    io: IoSource<unet::UnixStream>,
}

/// `for conn in vt::net::UnixListener::bind("/tmp/app.sock")?.incoming() { let c = conn?; vt::spawn(move || serve(c)); }`
///
/// A Unix-domain listening socket, like [`std::os::unix::net::UnixListener`].
pub struct UnixListener {
    io: IoSource<unet::UnixListener>,
}

/// An iterator over the connections of a [`UnixListener`]; see [`UnixListener::incoming`].
#[derive(Debug)]
pub struct Incoming<'a> {
    listener: &'a UnixListener,
}

/// Puts a socket std just created into non-blocking mode, with blocking semantics for the user.
fn fresh<S: AsFd>(s: S) -> io::Result<IoSource<S>> {
    sys::set_nonblocking(s.as_fd(), true)?;
    Ok(IoSource::new(s, false))
}

impl UnixStream {
    /// Connects to the socket at `path`.
    pub fn connect<P: AsRef<Path>>(path: P) -> io::Result<UnixStream> {
        let path = path.as_ref();
        let s = crate::blocking::blocking(|| unet::UnixStream::connect(path)).map_err(explain_fd_error)?;
        Ok(UnixStream { io: fresh(s)? })
    }

    /// Connects to the socket at `addr`.
    pub fn connect_addr(addr: &SocketAddr) -> io::Result<UnixStream> {
        let s =
            crate::blocking::blocking(|| unet::UnixStream::connect_addr(addr)).map_err(explain_fd_error)?;
        Ok(UnixStream { io: fresh(s)? })
    }

    /// A connected pair of unnamed sockets.
    pub fn pair() -> io::Result<(UnixStream, UnixStream)> {
        let (a, b) = unet::UnixStream::pair().map_err(explain_fd_error)?;
        Ok((UnixStream { io: fresh(a)? }, UnixStream { io: fresh(b)? }))
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.get().local_addr()
    }

    /// The remote address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.io.get().peer_addr()
    }

    /// Shuts down the read half, the write half or both; a fiber parked reading wakes up.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.io.get().shutdown(how)
    }

    timeout_methods!();
    common_methods!(unet::UnixStream);
}

impl UnixListener {
    /// Binds a listener to the path `path` (which must not exist yet).
    pub fn bind<P: AsRef<Path>>(path: P) -> io::Result<UnixListener> {
        Ok(UnixListener { io: fresh(unet::UnixListener::bind(path).map_err(explain_fd_error)?)? })
    }

    /// Binds a listener to `addr`.
    pub fn bind_addr(addr: &SocketAddr) -> io::Result<UnixListener> {
        Ok(UnixListener { io: fresh(unet::UnixListener::bind_addr(addr).map_err(explain_fd_error)?)? })
    }

    /// Accepts a connection, parking the fiber until one arrives.
    ///
    /// # Errors
    /// Among others `EMFILE`/`ENFILE` when out of descriptors; the listener stays usable.
    pub fn accept(&self) -> io::Result<(UnixStream, SocketAddr)> {
        let (s, addr) = self.io.read(|l| l.accept(), never_drained).map_err(explain_fd_error)?;
        Ok((UnixStream { io: fresh(s)? }, addr))
    }

    /// An endless iterator of `accept` results.
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming { listener: self }
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.get().local_addr()
    }
}

impl Iterator for Incoming<'_> {
    type Item = io::Result<UnixStream>;

    fn next(&mut self) -> Option<io::Result<UnixStream>> {
        Some(self.listener.accept().map(|(s, _)| s))
    }
}

stream_io!(UnixStream);
conversions!(UnixStream, unet::UnixStream);
conversions!(UnixListener, unet::UnixListener);

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::sync::Arc;

    #[test]
    fn closing_a_registration_wakes_its_waiters_with_an_error() {
        let rt = crate::Runtime::builder().carriers(2).build().unwrap();
        rt.block_on(|| {
            let (a, _b) = UnixStream::pair().unwrap();
            let a = Arc::new(a);
            let readers: Vec<_> = (0..3)
                .map(|_| {
                    let a = a.clone();
                    crate::spawn(move || (&*a).read(&mut [0u8; 4]))
                })
                .collect();
            // The first reader to wait registers the socket; close it as a drop would. A reader
            // that has not parked yet sees CLOSED before parking; the others are woken.
            while !a.io.close_registration() {
                crate::fiber::park::yield_now();
            }
            for r in readers {
                let e = r.join().unwrap().unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::NotConnected, "{e:?}");
            }
        });
    }
}
