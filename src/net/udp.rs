//! `UdpSocket`: std's type and signatures; a receive (or a send into a full buffer) parks the
//! calling fiber on the reactor. Datagrams never clear readiness early: a short datagram says
//! nothing about the ones queued behind it.

use std::io;
use std::net::{self, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::os::fd::AsFd;

use super::addr::{each_addr, first_addr};
use super::source::{IoSource, never_drained};
use crate::platform::net as sys;

/// `let sock = vt::net::UdpSocket::bind("0.0.0.0:9000")?; let (n, from) = sock.recv_from(&mut buf)?;`
///
/// A UDP socket, like [`std::net::UdpSocket`]. Inside a fiber, receives park the fiber until a
/// datagram arrives; on a plain thread they block it.
pub struct UdpSocket {
    io: IoSource<net::UdpSocket>,
}

impl UdpSocket {
    /// Binds a socket to `addr`, trying each address it resolves to.
    pub fn bind<A: ToSocketAddrs>(addr: A) -> io::Result<UdpSocket> {
        each_addr(addr, |a| {
            let fd = sys::socket(a, sys::DGRAM)?;
            sys::bind(fd.as_fd(), a)?;
            Ok(UdpSocket { io: IoSource::new(net::UdpSocket::from(fd), false) })
        })
    }

    /// Receives one datagram and its sender's address.
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.io.read(|s| s.recv_from(buf), never_drained)
    }

    /// Like `recv_from`, leaving the datagram queued.
    pub fn peek_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.io.read(|s| s.peek_from(buf), never_drained)
    }

    /// Sends one datagram to the first address `addr` resolves to.
    pub fn send_to<A: ToSocketAddrs>(&self, buf: &[u8], addr: A) -> io::Result<usize> {
        let to = first_addr(addr)?;
        self.io.write(|s| s.send_to(buf, to), never_drained)
    }

    /// Sets the default peer (and filters what `recv` takes), trying each address `addr`
    /// resolves to.
    pub fn connect<A: ToSocketAddrs>(&self, addr: A) -> io::Result<()> {
        each_addr(addr, |a| self.io.get().connect(a))
    }

    /// Sends one datagram to the connected peer.
    pub fn send(&self, buf: &[u8]) -> io::Result<usize> {
        self.io.write(|s| s.send(buf), never_drained)
    }

    /// Receives one datagram from the connected peer.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.io.read(|s| s.recv(buf), never_drained)
    }

    /// Like `recv`, leaving the datagram queued.
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.io.read(|s| s.peek(buf), never_drained)
    }

    /// The connected peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.io.get().peer_addr()
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.get().local_addr()
    }

    timeout_methods!();
    ttl_methods!();
    common_methods!(net::UdpSocket);

    /// `SO_BROADCAST`.
    pub fn set_broadcast(&self, on: bool) -> io::Result<()> {
        self.io.get().set_broadcast(on)
    }

    /// `SO_BROADCAST`.
    pub fn broadcast(&self) -> io::Result<bool> {
        self.io.get().broadcast()
    }

    /// `IP_MULTICAST_LOOP`.
    pub fn set_multicast_loop_v4(&self, on: bool) -> io::Result<()> {
        self.io.get().set_multicast_loop_v4(on)
    }

    /// `IP_MULTICAST_LOOP`.
    pub fn multicast_loop_v4(&self) -> io::Result<bool> {
        self.io.get().multicast_loop_v4()
    }

    /// `IP_MULTICAST_TTL`.
    pub fn set_multicast_ttl_v4(&self, ttl: u32) -> io::Result<()> {
        self.io.get().set_multicast_ttl_v4(ttl)
    }

    /// `IP_MULTICAST_TTL`.
    pub fn multicast_ttl_v4(&self) -> io::Result<u32> {
        self.io.get().multicast_ttl_v4()
    }

    /// `IPV6_MULTICAST_LOOP`.
    pub fn set_multicast_loop_v6(&self, on: bool) -> io::Result<()> {
        self.io.get().set_multicast_loop_v6(on)
    }

    /// `IPV6_MULTICAST_LOOP`.
    pub fn multicast_loop_v6(&self) -> io::Result<bool> {
        self.io.get().multicast_loop_v6()
    }

    /// `IP_ADD_MEMBERSHIP`.
    pub fn join_multicast_v4(&self, multiaddr: &Ipv4Addr, interface: &Ipv4Addr) -> io::Result<()> {
        self.io.get().join_multicast_v4(multiaddr, interface)
    }

    /// `IPV6_ADD_MEMBERSHIP`.
    pub fn join_multicast_v6(&self, multiaddr: &Ipv6Addr, interface: u32) -> io::Result<()> {
        self.io.get().join_multicast_v6(multiaddr, interface)
    }

    /// `IP_DROP_MEMBERSHIP`.
    pub fn leave_multicast_v4(&self, multiaddr: &Ipv4Addr, interface: &Ipv4Addr) -> io::Result<()> {
        self.io.get().leave_multicast_v4(multiaddr, interface)
    }

    /// `IPV6_DROP_MEMBERSHIP`.
    pub fn leave_multicast_v6(&self, multiaddr: &Ipv6Addr, interface: u32) -> io::Result<()> {
        self.io.get().leave_multicast_v6(multiaddr, interface)
    }
}

conversions!(UdpSocket, net::UdpSocket);
