//! `serve`: one listening socket per carrier on one port (`SO_REUSEPORT`), each drained by its
//! own acceptor fiber started on that carrier, each connection handled by a new fiber started
//! on the acceptor's carrier.
//!
//! Why: a started fiber never leaves its home carrier (`arch/decisions/0003-home-carriers.md`),
//! and a connection's fiber is homed where it starts. With one acceptor, every connection
//! fiber is spawned on the acceptor's carrier; the others get only what they steal before it
//! starts, so while they are busy (a burst of work, a blocked call) the connections pile up on
//! the acceptor's carrier and stay there. With a listener per carrier, the kernel spreads
//! connections over the listeners by a hash of their addresses, whatever the carriers are doing,
//! and each connection stays with the carrier whose listener took it
//! (`arch/decisions/0015-acceptor-per-carrier.md`).

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use super::addr::each_addr;
use super::tcp::{TcpListener, TcpStream};
use crate::fiber::join::JoinHandle;
use crate::runtime::Handle;
use crate::runtime::spawn::Builder;

/// How long an acceptor waits after a shortage (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`)
/// before it tries again: long enough not to spin while descriptors stay short, short against
/// a client's one-second SYN retransmission.
const SHORTAGE_PAUSE: Duration = Duration::from_millis(10);

/// `let server = vt::net::serve("0.0.0.0:8080", |conn| handle(conn))?;`
///
/// Serves TCP connections on `addr` with one listening socket per carrier of the caller's
/// runtime (the process-wide default one on a plain thread), all bound to the same port with
/// `SO_REUSEPORT`, each drained by an acceptor fiber started on its carrier
/// ([`Builder::carrier`](crate::Builder::carrier)). Each accepted connection runs
/// `handler(stream)` in a new fiber started on the acceptor's carrier, where it stays.
///
/// So the kernel, not the carriers' load when the connection arrived, decides where each
/// connection runs: connections spread evenly over the carriers even while some are busy,
/// and a connection never waits for another carrier to steal it. The price: a connection
/// hashed to a carrier that is busy for long (a long computation, a call blocked in the OS)
/// waits for that carrier, as every fiber at home there does; a spare carrier does not take
/// its acceptor. Port 0 binds the first listener to a free port and the others to that one
/// ([`Server::local_addr`] says which).
///
/// # Errors
/// The first listener's error when none of `addr`'s addresses can be bound; a later
/// listener's or acceptor's error (the listeners bound so far are closed again).
///
/// ```
/// use std::io::{Read, Write};
/// use virtual_threads as vt;
///
/// let server = vt::net::serve("127.0.0.1:0", |mut conn| {
///     let mut buf = [0; 5];
///     if conn.read_exact(&mut buf).is_ok() {
///         let _ = conn.write_all(&buf);
///     }
/// })?;
/// let mut c = std::net::TcpStream::connect(server.local_addr())?;
/// c.write_all(b"hello")?;
/// let mut echo = [0; 5];
/// c.read_exact(&mut echo)?;
/// assert_eq!(&echo, b"hello");
/// server.stop();
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn serve<A, H>(addr: A, handler: H) -> io::Result<Server>
where
    A: ToSocketAddrs,
    H: Fn(TcpStream) + Send + Sync + 'static,
{
    serve_on(&Handle::current(), addr, handler)
}

/// [`serve`] on the runtime `handle` refers to.
pub fn serve_on<A, H>(handle: &Handle, addr: A, handler: H) -> io::Result<Server>
where
    A: ToSocketAddrs,
    H: Fn(TcpStream) + Send + Sync + 'static,
{
    let first = each_addr(addr, |a| TcpListener::bind_reuseport(a))?;
    // Port 0 chose a port for the first listener only: the others join it there.
    let local = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..handle.carriers() {
        listeners.push(TcpListener::bind_reuseport(local)?);
    }
    let handler = Arc::new(handler);
    let mut server = Server { local, acceptors: Vec::with_capacity(listeners.len()) };
    for (index, listener) in listeners.into_iter().enumerate() {
        let handler = handler.clone();
        let spawned = Builder::new()
            .name(format!("acceptor {index} of {local}"))
            .carrier(index)
            .spawn_on(handle, move || accept_loop(index, &listener, &handler));
        match spawned {
            Ok(h) => server.acceptors.push(Some(h)),
            Err(e) => {
                server.stop_all();
                return Err(e);
            }
        }
    }
    Ok(server)
}

/// An acceptor: accepts on its listener until an error that waiting will not cure, and starts
/// each connection's fiber on its own carrier.
fn accept_loop<H>(index: usize, listener: &TcpListener, handler: &Arc<H>) -> io::Result<()>
where
    H: Fn(TcpStream) + Send + Sync + 'static,
{
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                let handler = handler.clone();
                match Builder::new().carrier(index).spawn(move || handler(stream)) {
                    Ok(_) => {}
                    // No stack for it (the connection is closed): as for a shortage of
                    // descriptors, wait for fibers to finish rather than end the server.
                    Err(e) if e.kind() == io::ErrorKind::OutOfMemory => {
                        crate::fiber::sleep::sleep(SHORTAGE_PAUSE)
                    }
                    Err(e) => return Err(e),
                }
            }
            // The peer gave up before we took it, or a signal: the next one.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::Interrupted
                ) => {}
            // The connection stays queued; take it when descriptors (or memory) are back.
            Err(e) if crate::platform::is_shortage(&e) => crate::fiber::sleep::sleep(SHORTAGE_PAUSE),
            Err(e) => return Err(e),
        }
    }
}

/// The acceptors [`serve`] started. Dropping it leaves them running (as dropping a
/// `JoinHandle` detaches its fiber); [`stop`](Server::stop) ends them.
#[derive(Debug)]
#[must_use = "dropping a Server leaves its acceptors running; call `join` or `stop`"]
pub struct Server {
    local: SocketAddr,
    /// One per carrier, in carrier order; `None` once taken by `join` or `stop`.
    acceptors: Vec<Option<JoinHandle<io::Result<()>>>>,
}

impl Server {
    /// The address the listeners share (with the port chosen when `serve` was given port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// How many listeners (and acceptors) there are: one per carrier.
    pub fn listeners(&self) -> usize {
        self.acceptors.len()
    }

    /// Waits for every acceptor to end, which happens only on an accept error that waiting
    /// will not cure (a shortage of descriptors or memory is waited out), and returns the
    /// first such error. The other acceptors keep serving until then. Connections already
    /// handed to their fibers are not waited for.
    pub fn join(mut self) -> io::Result<()> {
        let mut first = Ok(());
        for h in self.acceptors.iter_mut().filter_map(Option::take) {
            let r = h.join().unwrap_or_else(|_| Err(io::Error::other("an acceptor fiber panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Stops the acceptors and closes the listeners, and waits for that; the connections
    /// already accepted go on in their own fibers. Connections the kernel queued on a listener
    /// and no acceptor took are reset.
    pub fn stop(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        let all: Vec<_> = self.acceptors.iter_mut().filter_map(Option::take).collect();
        all.iter().for_each(JoinHandle::cancel);
        for h in all {
            let _ = h.join();
        }
    }
}
