//! Blocking-style network I/O for fibers: std's socket types and signatures, on an epoll reactor
//! polled by the carriers.
//!
//! Inside a fiber, a call that would block (`read`, `write`, `accept`, `connect`, `recv_from`,
//! ...) parks the *fiber* until the socket is ready; the carrier runs other fibers meanwhile.
//! From a plain OS thread the same types block the thread, as std's do, so code moves between
//! the two unchanged. Read and write timeouts, `set_nonblocking` and the conversions to and from
//! std types and raw descriptors behave as std documents them.
//!
//! ```no_run
//! use std::io::{Read, Write};
//! use virtual_threads as vt;
//!
//! fn main() -> std::io::Result<()> {
//!     let listener = vt::net::TcpListener::bind("127.0.0.1:7000")?;
//!     let server = vt::spawn(move || {
//!         for conn in listener.incoming() {
//!             let Ok(mut conn) = conn else { continue }; // e.g. EMFILE: the listener stays usable
//!             vt::spawn(move || {
//!                 let mut buf = [0; 4096];
//!                 while let Ok(n @ 1..) = conn.read(&mut buf) {
//!                     if conn.write_all(&buf[..n]).is_err() {
//!                         break;
//!                     }
//!                 }
//!             });
//!         }
//!     });
//!     server.join().unwrap(); // serves until the process is stopped
//!     Ok(())
//! }
//! ```
//!
//! Layout: `tcp`, `udp` and `unix` hold the public types; every blocking operation runs through
//! the one loop in `source` (try the call; on `EAGAIN`, park on readiness); `addr` resolves names
//! without blocking a carrier on DNS. Below them, in the scheduler the carriers drive,
//! `scheduler/reactor/` holds one epoll set per carrier and each socket's registration (its
//! readiness word and wait lists). How readiness reaches a parked fiber, and
//! why no wake-up is lost: `arch/io.md`.
//!
//! Caveats: sockets are registered with the runtime of the first fiber that waits on them; a
//! fiber of another runtime may use them too, but if that first runtime is dropped while such a
//! fiber waits, nothing wakes it. The descriptors are in non-blocking mode at the OS level
//! (`as_raw_fd` users see `O_NONBLOCK`); `into_std` and `into_raw_fd` restore the mode the user
//! expects.

#[macro_use]
mod macros;

mod addr;
mod serve;
mod source;
mod tcp;
mod udp;
pub mod unix;

pub use serve::{Server, serve, serve_on};
pub use std::net::{
    AddrParseError, IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, SocketAddrV4, SocketAddrV6,
    ToSocketAddrs,
};
pub use tcp::{Incoming, TcpListener, TcpStream};
pub use udp::UdpSocket;
pub use unix::{UnixListener, UnixStream};
