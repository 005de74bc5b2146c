//! The parts of the socket types that are the same for all of them, written once: the
//! conversions, the `Read`/`Write` impls of the streams, and the methods that only delegate to
//! std's type or to the `IoSource`. Each type still shows std's full surface in its docs.

/// Conversions to and from std types and raw descriptors, and `Debug`, for a type `$ty { io:
/// IoSource<$std> }`. Adopting a socket keeps the blocking mode the user set on it (std's
/// default is blocking, so operations wait); giving one back restores it.
macro_rules! conversions {
    ($ty:ident, $std:ty) => {
        impl From<$std> for $ty {
            /// Adopts a std socket.
            ///
            /// # Panics
            /// If the descriptor's flags cannot be read or set (only for an invalid descriptor,
            /// which a std socket never holds).
            fn from(s: $std) -> $ty {
                $ty { io: $crate::net::source::IoSource::adopt(s).expect("fcntl on a valid socket") }
            }
        }

        impl From<$ty> for $std {
            fn from(s: $ty) -> $std {
                s.io.into_inner()
            }
        }

        impl From<::std::os::fd::OwnedFd> for $ty {
            fn from(fd: ::std::os::fd::OwnedFd) -> $ty {
                $ty::from(<$std>::from(fd))
            }
        }

        impl From<$ty> for ::std::os::fd::OwnedFd {
            fn from(s: $ty) -> ::std::os::fd::OwnedFd {
                s.io.into_inner().into()
            }
        }

        impl ::std::os::fd::AsFd for $ty {
            fn as_fd(&self) -> ::std::os::fd::BorrowedFd<'_> {
                self.io.as_fd()
            }
        }

        impl ::std::os::fd::AsRawFd for $ty {
            fn as_raw_fd(&self) -> ::std::os::fd::RawFd {
                ::std::os::fd::AsRawFd::as_raw_fd(&self.io.as_fd())
            }
        }

        impl ::std::os::fd::FromRawFd for $ty {
            /// # Safety
            /// `fd` must be an open socket of the right kind that the caller owns and gives up.
            unsafe fn from_raw_fd(fd: ::std::os::fd::RawFd) -> $ty {
                // SAFETY: the caller's contract is exactly std's `FromRawFd` contract.
                $ty::from(unsafe { <$std as ::std::os::fd::FromRawFd>::from_raw_fd(fd) })
            }
        }

        impl ::std::os::fd::IntoRawFd for $ty {
            fn into_raw_fd(self) -> ::std::os::fd::RawFd {
                ::std::os::fd::IntoRawFd::into_raw_fd(self.io.into_inner())
            }
        }

        impl ::std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                ::std::fmt::Debug::fmt(&self.io, f)
            }
        }
    };
}

/// `Read` and `Write` for a stream type and its shared reference, as std has them: every call
/// goes through the `IoSource` loop, and a short transfer clears readiness (`stream_drained`).
macro_rules! stream_io {
    ($ty:ident) => {
        impl ::std::io::Read for &$ty {
            fn read(&mut self, buf: &mut [u8]) -> ::std::io::Result<usize> {
                let asked = buf.len();
                self.io.read(
                    |mut s| ::std::io::Read::read(&mut s, buf),
                    |&n| $crate::net::source::stream_drained(n, asked),
                )
            }

            fn read_vectored(&mut self, bufs: &mut [::std::io::IoSliceMut<'_>]) -> ::std::io::Result<usize> {
                let asked = bufs.iter().map(|b| b.len()).sum();
                self.io.read(
                    |mut s| ::std::io::Read::read_vectored(&mut s, bufs),
                    |&n| $crate::net::source::stream_drained(n, asked),
                )
            }
        }

        impl ::std::io::Write for &$ty {
            fn write(&mut self, buf: &[u8]) -> ::std::io::Result<usize> {
                let asked = buf.len();
                self.io.write(
                    |mut s| ::std::io::Write::write(&mut s, buf),
                    |&n| $crate::net::source::stream_drained(n, asked),
                )
            }

            fn write_vectored(&mut self, bufs: &[::std::io::IoSlice<'_>]) -> ::std::io::Result<usize> {
                let asked = bufs.iter().map(|b| b.len()).sum();
                self.io.write(
                    |mut s| ::std::io::Write::write_vectored(&mut s, bufs),
                    |&n| $crate::net::source::stream_drained(n, asked),
                )
            }

            fn flush(&mut self) -> ::std::io::Result<()> {
                Ok(())
            }
        }

        impl ::std::io::Read for $ty {
            fn read(&mut self, buf: &mut [u8]) -> ::std::io::Result<usize> {
                ::std::io::Read::read(&mut &*self, buf)
            }

            fn read_vectored(&mut self, bufs: &mut [::std::io::IoSliceMut<'_>]) -> ::std::io::Result<usize> {
                ::std::io::Read::read_vectored(&mut &*self, bufs)
            }
        }

        impl ::std::io::Write for $ty {
            fn write(&mut self, buf: &[u8]) -> ::std::io::Result<usize> {
                ::std::io::Write::write(&mut &*self, buf)
            }

            fn write_vectored(&mut self, bufs: &[::std::io::IoSlice<'_>]) -> ::std::io::Result<usize> {
                ::std::io::Write::write_vectored(&mut &*self, bufs)
            }

            fn flush(&mut self) -> ::std::io::Result<()> {
                Ok(())
            }
        }
    };
}

/// Methods of every socket type: `try_clone`, `take_error`, `set_nonblocking`, `into_std`.
/// Expands inside the type's `impl` block.
macro_rules! common_methods {
    ($std:ty) => {
        /// A new handle to the same socket (a duplicated descriptor) with its own registration.
        /// The timeouts and blocking mode are copied; std shares them through the kernel, so
        /// unlike std, a later change on one handle does not show on the other.
        pub fn try_clone(&self) -> ::std::io::Result<Self> {
            let clone = Self { io: $crate::net::source::IoSource::new(self.io.get().try_clone()?, false) };
            self.io.copy_settings_to(&clone.io);
            Ok(clone)
        }

        /// Takes the socket's pending error (`SO_ERROR`).
        pub fn take_error(&self) -> ::std::io::Result<Option<::std::io::Error>> {
            self.io.get().take_error()
        }

        /// With `true`, calls that would block return `WouldBlock` instead of waiting, as
        /// std's do. (The descriptor itself is always non-blocking; this is the behaviour the
        /// caller sees.)
        pub fn set_nonblocking(&self, nonblocking: bool) -> ::std::io::Result<()> {
            self.io.set_nonblocking(nonblocking);
            Ok(())
        }

        /// The std socket, out of the reactor and back in the blocking mode this one had.
        pub fn into_std(self) -> $std {
            self.io.into_inner()
        }
    };
}

/// `set_read_timeout`, `set_write_timeout` and their getters, for the types that have them.
macro_rules! timeout_methods {
    () => {
        /// Bounds each read (receive): past it the call fails with `WouldBlock`, as std's does
        /// on Linux.
        ///
        /// # Errors
        /// `InvalidInput` for `Some(Duration::ZERO)`, as std.
        pub fn set_read_timeout(&self, dur: Option<::std::time::Duration>) -> ::std::io::Result<()> {
            // std validates it and sets SO_RCVTIMEO, which then holds after `into_std`.
            self.io.get().set_read_timeout(dur)?;
            self.io.set_read_timeout(dur);
            Ok(())
        }

        /// Bounds each write (send): past it the call fails with `WouldBlock`.
        ///
        /// # Errors
        /// `InvalidInput` for `Some(Duration::ZERO)`, as std.
        pub fn set_write_timeout(&self, dur: Option<::std::time::Duration>) -> ::std::io::Result<()> {
            self.io.get().set_write_timeout(dur)?;
            self.io.set_write_timeout(dur);
            Ok(())
        }

        /// The read timeout.
        pub fn read_timeout(&self) -> ::std::io::Result<Option<::std::time::Duration>> {
            Ok(self.io.read_timeout())
        }

        /// The write timeout.
        pub fn write_timeout(&self) -> ::std::io::Result<Option<::std::time::Duration>> {
            Ok(self.io.write_timeout())
        }
    };
}

/// `set_ttl` and `ttl` (`IP_TTL`), for the IP socket types.
macro_rules! ttl_methods {
    () => {
        /// `IP_TTL`.
        pub fn set_ttl(&self, ttl: u32) -> ::std::io::Result<()> {
            self.io.get().set_ttl(ttl)
        }

        /// `IP_TTL`.
        pub fn ttl(&self) -> ::std::io::Result<u32> {
            self.io.get().ttl()
        }
    };
}
