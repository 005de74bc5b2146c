//! Sockets and pipes: `read`, `write`, `readv`, `writev`, `recv`, `recvfrom`, `recvmsg`,
//! `send`, `sendto`, `sendmsg`, `accept`, `accept4` and `connect`.
//!
//! On a socket or pipe that the user left blocking (`fd.rs` keeps it non-blocking underneath),
//! a fiber's call runs `vt::net`'s loop (`net/source.rs`, `arch/io.md`): snapshot the
//! descriptor's readiness word, make the call, and on `EAGAIN` register with the carrier's
//! reactor (first wait only), clear the word unless an event came since the snapshot, and park
//! until it is set again, so no wake-up is lost. `SO_RCVTIMEO`/`SO_SNDTIMEO` bound the whole
//! call and end it as the kernel would (`EAGAIN`; `EINPROGRESS` for `connect`). A plain thread
//! on such a descriptor waits in `poll(2)`, so it still sees a blocking call. Regular files,
//! descriptors the user made non-blocking, and calls asking `MSG_DONTWAIT` pass straight
//! through. A descriptor inherited from the parent of a `fork` is the parent's (`fd.rs`): a
//! fiber's call on it takes the plain thread's path, `poll(2)` included, and blocks its carrier.
//! A cancelled fiber's call returns `ECANCELED` (`arch/decisions/0011-*.md`).

use std::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use libc::{msghdr, size_t, sockaddr, socklen_t, ssize_t};

use super::fd::{self, Hooked, INHERITED, POLLABLE, SOCKET, USER_NONBLOCK};
use super::real::{self, errno, set_errno};
use super::{Gate, gate, parking};
use crate::fiber::wait::WaitReason;
use crate::platform::net::Direction;
use crate::scheduler::reactor::registration::{Learnt, Registration, Wait};

/// How a hooked call that timed out fails.
#[derive(Clone, Copy)]
pub(super) struct TimeoutErr(pub(super) c_int);

const AGAIN: TimeoutErr = TimeoutErr(libc::EAGAIN);

/// Runs `call` (one system call on `fd`, returning -1 with `errno` on failure) as a blocking call
/// of the user's: the module doc's loop. `dontwait`: the caller asked for a non-blocking call.
/// Inlined into each hook: a thread that is not a fiber (`Gate::Pass`) pays the gate's byte and
/// the call through the resolved pointer, and reads the descriptor table only if the call
/// failed (`arch/hooks.md`, "Cost on a plain thread").
#[inline(always)]
fn blocking(
    fd: c_int,
    dir: Direction,
    dontwait: bool,
    t: TimeoutErr,
    mut call: impl FnMut() -> isize,
) -> isize {
    if dontwait {
        return call();
    }
    if gate() == Gate::Park {
        let f = fd::classify(fd);
        if f & (POLLABLE | USER_NONBLOCK | INHERITED) == POLLABLE {
            return fiber_wait(fd, f, dir, t, call);
        }
        // Not a wait of the hooks' (a regular file, the user's non-blocking mode, a parent's
        // descriptor): the call as it was, and on an inherited descriptor the parent switched,
        // the plain thread's `poll(2)`.
    }
    let r = call();
    if r >= 0 { r } else { passed_failed(fd, dir, t, call) }
}

/// A passed-through call failed: if with `EAGAIN` on a descriptor the hooks made non-blocking
/// under a user who left it blocking, the caller must still block (`thread_wait`); otherwise the
/// failure is the caller's, `errno` untouched (a fiber that the runtime's drop is unwinding gets
/// `ECANCELED`, as its parked call did). Only here does a plain thread read the table: a
/// descriptor of the user's blocking mode says `EAGAIN` only if the hooks switched it, or its
/// socket timeout ran out (then the table says it was not switched).
#[cold]
#[inline(never)]
fn passed_failed(fd: c_int, dir: Direction, t: TimeoutErr, call: impl FnMut() -> isize) -> isize {
    if errno() != libc::EAGAIN {
        return -1;
    }
    let f = fd::flags(fd);
    if f & POLLABLE == 0 || f & USER_NONBLOCK != 0 {
        return -1;
    }
    if gate() == Gate::Cancelling {
        // A fiber that the runtime's drop is unwinding, called again after the `ECANCELED`
        // that ended its wait (an accept loop that goes on after an error): nothing will run
        // it again, and a wait in `poll(2)` here would hold the drop for ever.
        return fail(libc::ECANCELED);
    }
    thread_wait(fd, f, dir, t, call)
}

/// The call's deadline from the socket's `SO_RCVTIMEO`/`SO_SNDTIMEO` (none for a pipe, or 0).
fn deadline(fd: c_int, flags: usize, dir: Direction) -> Option<Instant> {
    if flags & SOCKET == 0 {
        return None;
    }
    let opt = match dir {
        Direction::Read => libc::SO_RCVTIMEO,
        Direction::Write => libc::SO_SNDTIMEO,
    };
    let mut tv = libc::timeval { tv_sec: 0, tv_usec: 0 };
    let mut len = size_of::<libc::timeval>() as socklen_t;
    // SAFETY: `tv` is a writable timeval and `len` its size; `getsockopt` is not hooked.
    let r = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, opt, (&raw mut tv).cast(), &mut len) };
    if r != 0 || (tv.tv_sec == 0 && tv.tv_usec == 0) {
        return None;
    }
    Instant::now().checked_add(Duration::new(tv.tv_sec as u64, tv.tv_usec as u32 * 1000))
}

/// Ends a hooked call: `r`, with `errno` set to `err` when it failed.
fn fail(err: c_int) -> isize {
    set_errno(err);
    -1
}

/// A plain thread's blocking call on a descriptor the hooks made non-blocking: `poll(2)` on it
/// between tries, within the socket's timeout. Out of line, as `fiber_wait`: the hooks' common
/// path (a call that passes through) then saves no registers for them.
#[inline(never)]
fn thread_wait(
    fd: c_int,
    flags: usize,
    dir: Direction,
    t: TimeoutErr,
    mut call: impl FnMut() -> isize,
) -> isize {
    let mut until = None;
    loop {
        let r = call();
        if r >= 0 || errno() != libc::EAGAIN {
            return r;
        }
        let until = *until.get_or_insert_with(|| deadline(fd, flags, dir));
        let ms = match until {
            None => -1,
            Some(u) => {
                let left = u.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return fail(t.0);
                }
                left.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as c_int
            }
        };
        let events = match dir {
            Direction::Read => libc::POLLIN | libc::POLLPRI,
            Direction::Write => libc::POLLOUT,
        };
        let mut p = libc::pollfd { fd, events, revents: 0 };
        // SAFETY: one valid pollfd for the call.
        if unsafe { real::poll(&mut p, 1, ms) } < 0 && errno() != libc::EINTR {
            return -1;
        }
    }
}

/// A fiber's blocking call: parks on the reactor between tries.
#[inline(never)]
fn fiber_wait(
    fd: c_int,
    flags: usize,
    dir: Direction,
    t: TimeoutErr,
    mut call: impl FnMut() -> isize,
) -> isize {
    let mut until: Option<Option<Instant>> = None;
    // A success leaves `errno` as the caller had it, whatever the park did meanwhile.
    let saved = errno();
    loop {
        let held = fd::registration(fd);
        let reg = held.as_ref().filter(|h| h.reg.runtime_is_current() && !h.reg.is_orphaned());
        let seen = reg.map(|h| h.reg.readiness().snapshot(dir));
        if seen.is_some_and(|s| s.is_closed()) {
            // Closed by someone else while this call ran.
            return fail(libc::EBADF);
        }
        if seen.is_none_or(|s| s.is_ready()) {
            let r = call();
            if r >= 0 {
                set_errno(saved);
                return r;
            }
            if errno() != libc::EAGAIN {
                return r;
            }
            if let (Some(h), Some(s)) = (reg, seen) {
                h.reg.readiness().clear(s, Learnt::WouldBlock);
            }
        }
        let until = *until.get_or_insert_with(|| deadline(fd, flags, dir));
        let Some(h) = reg else {
            // First wait (or the registration belongs to a runtime that is gone, or another
            // runtime's carrier): register with this carrier's set, then go round for a
            // snapshot (the registration reports the current readiness).
            if held.as_ref().is_some_and(|h| h.reg.runtime_is_current()) {
                // Orphaned by this very runtime's drop: nothing polls its reactor. Park, to be
                // unwound by the drop (`parking` stops the unwind here).
                if parking(crate::fiber::park::park).is_none() {
                    return fail(libc::ECANCELED);
                }
                continue;
            }
            if register(fd, held.as_ref()).is_err() {
                return thread_wait(fd, flags, dir, t, call);
            }
            continue;
        };
        if h.reg.follow_caller() {
            continue;
        }
        match parking(|| h.reg.readiness().wait_because(dir, until, hooked(dir))) {
            // Cancelled (or its runtime's drop unwinds it): the unwind stops here, and the
            // fiber is stopped at its next wait in Rust code.
            None => return fail(libc::ECANCELED),
            Some(Wait::Ready) => {}
            Some(Wait::TimedOut) => return fail(t.0),
            Some(Wait::Closed) => return fail(libc::EBADF),
        }
    }
}

/// What a dump says a fiber parked in a hooked call waits for.
fn hooked(dir: Direction) -> WaitReason {
    match dir {
        Direction::Read => WaitReason::HookedRead,
        Direction::Write => WaitReason::HookedWrite,
    }
}

/// Registers `fd` with the calling fiber's carrier's set, in place of `old`.
fn register(fd: c_int, old: Option<&std::sync::Arc<Hooked>>) -> std::io::Result<()> {
    fd::install(fd, old, || {
        let c = crate::scheduler::carrier::here();
        if c.is_null() {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: the caller is a fiber (`Gate::Park`), so this thread is a carrier and `c` its
        // live `Carrier`; used before any switch point.
        let (rt, set) = unsafe { ((*c).runtime_ref(), (*c).index()) };
        Registration::new(rt, set, fd)
    })
    .map(drop)
}

/// Defines the interposer of a transfer call: the caller's call, made as `blocking` says.
macro_rules! transfer {
    ($($name:ident($fd:ident: c_int $(, $a:ident: $t:ty)*) $dir:ident $(, dontwait: $flags:ident)?;)*) => {
        $(
            #[doc = concat!("Interposes `", stringify!($name), "(2)`.")]
            ///
            /// # Safety
            /// As for the C library's function of this name.
            #[unsafe(no_mangle)]
            pub(super) unsafe extern "C" fn $name($fd: c_int $(, $a: $t)*) -> ssize_t {
                let dontwait = false $(|| dontwait($flags))?;
                // SAFETY: the caller's arguments, on every try.
                blocking($fd, Direction::$dir, dontwait, AGAIN, move || unsafe { real::$name($fd $(, $a)*) })
            }
        )*
    };
}

transfer! {
    read(fd: c_int, buf: *mut c_void, n: size_t) Read;
    write(fd: c_int, buf: *const c_void, n: size_t) Write;
    readv(fd: c_int, iov: *const libc::iovec, n: c_int) Read;
    writev(fd: c_int, iov: *const libc::iovec, n: c_int) Write;
    recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) Read, dontwait: flags;
    recvfrom(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) Read, dontwait: flags;
    recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) Read, dontwait: flags;
    send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) Write, dontwait: flags;
    sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) Write, dontwait: flags;
    sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) Write, dontwait: flags;
}

/// `MSG_DONTWAIT`: the caller asked this one call not to block.
fn dontwait(flags: c_int) -> bool {
    flags & libc::MSG_DONTWAIT != 0
}

/// Interposes `accept(2)`.
///
/// # Safety
/// As for `accept(2)`.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's arguments, on every try.
    blocking(fd, Direction::Read, false, AGAIN, move || unsafe { real::accept(fd, addr, len) as isize })
        as c_int
}

/// Interposes `accept4(2)` (std's `TcpListener::accept`).
///
/// # Safety
/// As for `accept4(2)`.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's arguments, on every try.
    blocking(fd, Direction::Read, false, AGAIN, move || unsafe {
        real::accept4(fd, addr, len, flags) as isize
    }) as c_int
}

/// Interposes `connect(2)`: on a blocking socket the hooks made non-blocking, the kernel's
/// `EINPROGRESS` becomes a wait for the handshake (writable), then its outcome (`SO_ERROR`);
/// `SO_SNDTIMEO` ends it with `EINPROGRESS`, as Linux's own blocking connect does.
///
/// # Safety
/// As for `connect(2)`.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let fiber = gate() == Gate::Park;
    let f = if fiber { fd::classify(fd) } else { 0 };
    // SAFETY: the caller's arguments.
    let r = unsafe { real::connect(fd, addr, len) };
    if r == 0 || errno() != libc::EINPROGRESS {
        return r;
    }
    // A passed-through call reads the table only now, as `passed_failed` does.
    let f = if fiber { f } else { fd::flags(fd) };
    if f & POLLABLE == 0 || f & USER_NONBLOCK != 0 {
        return r;
    }
    blocking(fd, Direction::Write, false, TimeoutErr(libc::EINPROGRESS), || connected(fd)) as c_int
}

/// Whether a connect in progress on `fd` has finished: 0 connected, -1 with its error (`EAGAIN`
/// while the handshake goes on).
fn connected(fd: c_int) -> isize {
    let mut err: c_int = 0;
    let mut len = size_of::<c_int>() as socklen_t;
    // SAFETY: `err` is a writable int and `len` its size.
    if unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR, (&raw mut err).cast(), &mut len) } < 0
    {
        return -1;
    }
    if err != 0 {
        return fail(err);
    }
    let mut storage = std::mem::MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut len = size_of::<libc::sockaddr_storage>() as socklen_t;
    // SAFETY: `storage` is a writable sockaddr_storage and `len` its size.
    if unsafe { libc::getpeername(fd, storage.as_mut_ptr().cast(), &mut len) } == 0 {
        return 0;
    }
    if errno() == libc::ENOTCONN { fail(libc::EAGAIN) } else { -1 }
}
