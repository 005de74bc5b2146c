//! Address resolution: `ToSocketAddrs` without blocking a carrier on DNS.
//!
//! Resolving a host name (`"example.com:80"`) calls `getaddrinfo`, which blocks its OS thread
//! for as long as DNS takes. Such a resolution runs as a [`blocking`](crate::blocking) section,
//! so the runtime compensates for the carrier it holds. A literal address (`SocketAddr`,
//! `(IpAddr, u16)`, `&[SocketAddr]`, ...) cannot block, and a blocking section is not free (it
//! may wake a spare carrier), so those resolve inline: they are recognised by their iterator
//! type, `option::IntoIter<SocketAddr>` or a cloned slice iterator, which only std's
//! literal-address impls use. Strings (even `"127.0.0.1:80"`) go through the blocking section,
//! since their iterator type is the one `getaddrinfo` results come in.

use std::any::type_name;
use std::io;
use std::iter::Cloned;
use std::net::{SocketAddr, ToSocketAddrs};

/// Whether `A` resolves without a system call. Both names come from the same compiler, so the
/// comparison is exact even though `type_name`'s format is not stable across versions; an
/// unrecognised type takes the safe path (a blocking section).
fn is_literal<A: ToSocketAddrs + ?Sized>() -> bool {
    let iter = type_name::<A::Iter>();
    iter == type_name::<std::option::IntoIter<SocketAddr>>()
        || iter == type_name::<Cloned<std::slice::Iter<'static, SocketAddr>>>()
}

/// `addr.to_socket_addrs()`, as a blocking section unless `addr` is a literal address. On this
/// carrier, compensated (`scope::blocking_here`), not on a helper thread: `A` and its iterator
/// need not be `Send`.
#[track_caller]
pub(crate) fn resolve<A: ToSocketAddrs + ?Sized>(addr: &A) -> io::Result<A::Iter> {
    if is_literal::<A>() {
        addr.to_socket_addrs()
    } else {
        crate::scope::blocking_here(std::panic::Location::caller(), || addr.to_socket_addrs())
    }
}

/// Tries `f` on each address `addr` resolves to, returning the first success or the last
/// error, as std's constructors do.
pub(crate) fn each_addr<A: ToSocketAddrs, T>(
    addr: A,
    mut f: impl FnMut(&SocketAddr) -> io::Result<T>,
) -> io::Result<T> {
    let mut last = None;
    for a in resolve(&addr)? {
        match f(&a) {
            Ok(v) => return Ok(v),
            Err(e) => last = Some(e),
        }
    }
    Err(last
        .unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "could not resolve to any addresses")))
}

/// The first address `addr` resolves to (std's `send_to` rule).
pub(crate) fn first_addr<A: ToSocketAddrs>(addr: A) -> io::Result<SocketAddr> {
    resolve(&addr)?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no addresses to send data to"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};

    #[test]
    fn literal_addresses_are_recognised() {
        assert!(is_literal::<SocketAddr>());
        assert!(is_literal::<&SocketAddr>());
        assert!(is_literal::<SocketAddrV4>());
        assert!(is_literal::<(IpAddr, u16)>());
        assert!(is_literal::<(Ipv4Addr, u16)>());
        assert!(is_literal::<&[SocketAddr]>());
        assert!(!is_literal::<&str>());
        assert!(!is_literal::<String>());
        assert!(!is_literal::<(&str, u16)>());
    }
}
