//! The real libc functions behind the hooks, and what every hook needs before it decides.
//!
//! Each real function is found once with `dlsym(RTLD_NEXT, name)`, in a constructor that runs
//! before `main` (`.init_array`), into an `AtomicPtr`: a hook then reads a pointer and never
//! resolves, allocates or locks on its own path. A hook called before the constructor (another
//! library's constructor) resolves on first use, as libco does. A static binary has no next
//! object: `dlsym` finds nothing, and the calls that are one system call each are made with the
//! system-call instruction itself (`raw_syscall`), which is what glibc's wrappers do less their
//! cancellation point. `arch/hooks.md` ("Symbol resolution").

use std::ffi::{CStr, c_int, c_long, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

/// One real libc function, resolved once.
pub(super) struct Real {
    ptr: AtomicPtr<c_void>,
    name: &'static CStr,
    /// What a descriptor hook calls: a trampoline that resolves and calls (`real_fns!`) until
    /// resolution finds the function, then the function itself. Never null where set, so the
    /// call needs no check.
    call: AtomicPtr<c_void>,
}

/// Stored when `dlsym` found nothing, so that the lookup is not repeated.
const MISSING: *mut c_void = usize::MAX as *mut c_void;

impl Real {
    const fn new(name: &'static CStr) -> Real {
        Real::with_trampoline(name, std::ptr::null_mut())
    }

    const fn with_trampoline(name: &'static CStr, first: *mut c_void) -> Real {
        Real { ptr: AtomicPtr::new(std::ptr::null_mut()), name, call: AtomicPtr::new(first) }
    }

    /// The address a descriptor hook calls (`call`): one load.
    #[inline(always)]
    fn call_ptr(&self) -> *mut c_void {
        // Relaxed: as in `get`; the trampoline and the function behave alike.
        self.call.load(Ordering::Relaxed)
    }

    /// The function's address, or `None` where the process has no such dynamic symbol.
    #[inline(always)]
    pub(super) fn get(&self) -> Option<*mut c_void> {
        // Relaxed: the pointer is to code mapped before any thread could read it, and two
        // resolutions race to store the same value.
        let p = self.ptr.load(Ordering::Relaxed);
        let p = if p.is_null() { self.resolve() } else { p };
        (p != MISSING).then_some(p)
    }

    #[cold]
    fn resolve(&self) -> *mut c_void {
        // SAFETY: `name` is a NUL-terminated string; RTLD_NEXT asks for the definition after
        // this object's, which is libc's.
        let p = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) };
        if !p.is_null() {
            self.call.store(p, Ordering::Relaxed);
        }
        let p = if p.is_null() { MISSING } else { p };
        self.ptr.store(p, Ordering::Relaxed);
        p
    }
}

pub(super) static NANOSLEEP: Real = Real::new(c"nanosleep");
pub(super) static CLOCK_NANOSLEEP: Real = Real::new(c"clock_nanosleep");
pub(super) static SYSCALL: Real = Real::new(c"syscall");

const ALL: [&Real; 3] = [&NANOSLEEP, &CLOCK_NANOSLEEP, &SYSCALL];

/// Declares the real functions behind the descriptor hooks: a `Real` each, and a caller that
/// makes the one system call itself in a static binary (`$fallback`, the raw result).
macro_rules! real_fns {
    ($($stat:ident $name:ident($($a:ident: $t:ty),*) -> $r:ty => $fallback:expr;)*) => {
        $(
            pub(super) static $stat: Real = Real::with_trampoline(match CStr::from_bytes_with_nul(
                concat!(stringify!($name), "\0").as_bytes(),
            ) {
                Ok(c) => c,
                Err(_) => panic!("a function name has no NUL inside"),
            }, {
                /// The call before resolution (a hook called before the constructor), and every
                /// call in a static binary: resolves, then calls what it found or makes the one
                /// system call itself.
                #[cold]
                unsafe extern "C" fn first($($a: $t),*) -> $r {
                    match $stat.get() {
                        Some(f) => {
                            // SAFETY: as in the caller below.
                            let f: unsafe extern "C" fn($($t),*) -> $r = unsafe { std::mem::transmute(f) };
                            // SAFETY: the caller vouches for the arguments.
                            unsafe { f($($a),*) }
                        }
                        // SAFETY: the caller vouches for the arguments of that one system call.
                        None => errno_result(unsafe { $fallback }) as $r,
                    }
                }
                first as *mut c_void
            });

            /// The real function of this name. Inlined into each hook: one relaxed load of
            /// the function's address and an indirect call (`Real::call_ptr`).
            ///
            /// # Safety
            /// As for the C library's function of this name.
            #[inline(always)]
            pub(super) unsafe fn $name($($a: $t),*) -> $r {
                let p = $stat.call_ptr();
                // SAFETY: `p` is this static's trampoline or the C library's function of this
                // name, both of this signature (variadic ones: as named ones, `arch/hooks.md`).
                let f: unsafe extern "C" fn($($t),*) -> $r = unsafe { std::mem::transmute(p) };
                // SAFETY: the caller vouches for the arguments.
                unsafe { f($($a),*) }
            }
        )*
        const DESCRIPTORS: &[&Real] = &[$(&$stat),*];
    };
}

use libc::{c_ulong, msghdr, pollfd, size_t, sockaddr, socklen_t, ssize_t};
type L = c_long;

real_fns! {
    READ read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t =>
        raw_syscall(libc::SYS_read, [fd as L, buf as L, n as L, 0, 0, 0]);
    WRITE write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t =>
        raw_syscall(libc::SYS_write, [fd as L, buf as L, n as L, 0, 0, 0]);
    READV readv(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t =>
        raw_syscall(libc::SYS_readv, [fd as L, iov as L, n as L, 0, 0, 0]);
    WRITEV writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t =>
        raw_syscall(libc::SYS_writev, [fd as L, iov as L, n as L, 0, 0, 0]);
    RECV recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t =>
        raw_syscall(libc::SYS_recvfrom, [fd as L, buf as L, n as L, flags as L, 0, 0]);
    RECVFROM recvfrom(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int, a: *mut sockaddr, l: *mut socklen_t) -> ssize_t =>
        raw_syscall(libc::SYS_recvfrom, [fd as L, buf as L, n as L, flags as L, a as L, l as L]);
    RECVMSG recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t =>
        raw_syscall(libc::SYS_recvmsg, [fd as L, msg as L, flags as L, 0, 0, 0]);
    SEND send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t =>
        raw_syscall(libc::SYS_sendto, [fd as L, buf as L, n as L, flags as L, 0, 0]);
    SENDTO sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, a: *const sockaddr, l: socklen_t) -> ssize_t =>
        raw_syscall(libc::SYS_sendto, [fd as L, buf as L, n as L, flags as L, a as L, l as L]);
    SENDMSG sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t =>
        raw_syscall(libc::SYS_sendmsg, [fd as L, msg as L, flags as L, 0, 0, 0]);
    ACCEPT accept(fd: c_int, a: *mut sockaddr, l: *mut socklen_t) -> c_int =>
        raw_syscall(libc::SYS_accept4, [fd as L, a as L, l as L, 0, 0, 0]);
    ACCEPT4 accept4(fd: c_int, a: *mut sockaddr, l: *mut socklen_t, flags: c_int) -> c_int =>
        raw_syscall(libc::SYS_accept4, [fd as L, a as L, l as L, flags as L, 0, 0]);
    CONNECT connect(fd: c_int, a: *const sockaddr, l: socklen_t) -> c_int =>
        raw_syscall(libc::SYS_connect, [fd as L, a as L, l as L, 0, 0, 0]);
    POLL poll(fds: *mut pollfd, n: libc::nfds_t, ms: c_int) -> c_int =>
        poll_fallback(fds, n, ms);
    PPOLL ppoll(fds: *mut pollfd, n: libc::nfds_t, ts: *const libc::timespec, mask: *const libc::sigset_t) -> c_int =>
        raw_syscall(libc::SYS_ppoll, [fds as L, n as L, ts as L, mask as L, 8, 0]);
    EPOLL_WAIT epoll_wait(ep: c_int, ev: *mut libc::epoll_event, n: c_int, ms: c_int) -> c_int =>
        raw_syscall(libc::SYS_epoll_pwait, [ep as L, ev as L, n as L, ms as L, 0, 8]);
    EPOLL_PWAIT epoll_pwait(ep: c_int, ev: *mut libc::epoll_event, n: c_int, ms: c_int, mask: *const libc::sigset_t) -> c_int =>
        raw_syscall(libc::SYS_epoll_pwait, [ep as L, ev as L, n as L, ms as L, mask as L, 8]);
    FCNTL fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int =>
        raw_syscall(libc::SYS_fcntl, [fd as L, cmd as L, arg, 0, 0, 0]);
    IOCTL ioctl(fd: c_int, req: c_ulong, arg: c_long) -> c_int =>
        raw_syscall(libc::SYS_ioctl, [fd as L, req as L, arg, 0, 0, 0]);
    CLOSE close(fd: c_int) -> c_int =>
        raw_syscall(libc::SYS_close, [fd as L, 0, 0, 0, 0, 0]);
    DUP dup(fd: c_int) -> c_int =>
        raw_syscall(libc::SYS_dup, [fd as L, 0, 0, 0, 0, 0]);
    DUP2 dup2(old: c_int, new: c_int) -> c_int =>
        dup2_fallback(old, new);
    DUP3 dup3(old: c_int, new: c_int, flags: c_int) -> c_int =>
        raw_syscall(libc::SYS_dup3, [old as L, new as L, flags as L, 0, 0, 0]);
}

/// `poll` as `ppoll` (AArch64 has no `poll` system call): the raw result.
unsafe fn poll_fallback(fds: *mut pollfd, n: libc::nfds_t, ms: c_int) -> c_long {
    let ts = libc::timespec { tv_sec: (ms / 1000) as libc::time_t, tv_nsec: ((ms % 1000) * 1_000_000) as _ };
    let tsp = if ms < 0 { std::ptr::null() } else { &raw const ts };
    // SAFETY: the caller's descriptors; `tsp` is null or a valid timespec for the call.
    unsafe { raw_syscall(libc::SYS_ppoll, [fds as L, n as L, tsp as L, 0, 8, 0]) }
}

/// `dup2` as `dup3` (AArch64 has no `dup2`), which refuses `old == new`: then `dup2` checks
/// `old` is open and returns it.
unsafe fn dup2_fallback(old: c_int, new: c_int) -> c_long {
    if old == new {
        // SAFETY: no pointers.
        let r = unsafe { raw_syscall(libc::SYS_fcntl, [old as L, libc::F_GETFD as L, 0, 0, 0, 0]) };
        return if r < 0 { r } else { old as c_long };
    }
    // SAFETY: no pointers.
    unsafe { raw_syscall(libc::SYS_dup3, [old as L, new as L, 0, 0, 0, 0]) }
}

extern "C" fn resolve_all() {
    for r in ALL.iter().chain(DESCRIPTORS) {
        r.get();
    }
}

/// Runs `resolve_all` before `main`, so that no hook resolves on its own path.
#[used]
#[unsafe(link_section = ".init_array")]
static RESOLVE_AT_START: extern "C" fn() = resolve_all;

/// A system call made with the instruction itself: the raw return value (`-errno` on failure).
///
/// # Safety
/// The arguments must be valid for system call `n`, as for `syscall(2)`.
#[inline]
pub(super) unsafe fn raw_syscall(n: c_long, a: [c_long; 6]) -> c_long {
    #[cfg(target_arch = "x86_64")]
    {
        let ret: c_long;
        // SAFETY: the Linux x86-64 system call convention: number in rax, arguments in rdi,
        // rsi, rdx, r10, r8, r9, rcx and r11 clobbered; the caller vouches for the arguments.
        unsafe {
            std::arch::asm!("syscall", inlateout("rax") n => ret, in("rdi") a[0], in("rsi") a[1],
                in("rdx") a[2], in("r10") a[3], in("r8") a[4], in("r9") a[5],
                lateout("rcx") _, lateout("r11") _, options(nostack));
        }
        ret
    }
    #[cfg(target_arch = "aarch64")]
    {
        let ret: c_long;
        // SAFETY: the Linux AArch64 convention: number in x8, arguments in x0-x5, result in
        // x0; the caller vouches for the arguments.
        unsafe {
            std::arch::asm!("svc 0", in("x8") n, inlateout("x0") a[0] => ret, in("x1") a[1],
                in("x2") a[2], in("x3") a[3], in("x4") a[4], in("x5") a[5], options(nostack));
        }
        ret
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (n, a);
        // Only a static binary gets here (a dynamic one has libc's `syscall`).
        let msg =
            b"virtual-threads: the hooks feature needs a dynamically linked libc on this architecture\n";
        // SAFETY: writes a static buffer to stderr and aborts; both are async-signal-safe.
        unsafe {
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::abort();
        }
    }
}

/// `syscall(2)`'s result from a raw one: -1 with `errno` set, or the value.
#[inline]
pub(super) fn errno_result(ret: c_long) -> c_long {
    if (-4095..0).contains(&ret) {
        set_errno(-ret as c_int);
        -1
    } else {
        ret
    }
}

/// The real `syscall(2)`: libc's, or the instruction in a static binary.
///
/// # Safety
/// As for `syscall(2)` with these arguments.
#[inline]
pub(super) unsafe fn syscall(n: c_long, a: [c_long; 6]) -> c_long {
    match SYSCALL.get() {
        Some(f) => {
            // SAFETY: `f` is libc's `syscall`; on the targets this crate builds for, variadic
            // integer arguments travel as named ones do (`arch/hooks.md`).
            let f: unsafe extern "C" fn(c_long, c_long, c_long, c_long, c_long, c_long, c_long) -> c_long =
                unsafe { std::mem::transmute(f) };
            // SAFETY: the caller vouches for the arguments.
            unsafe { f(n, a[0], a[1], a[2], a[3], a[4], a[5]) }
        }
        // SAFETY: the caller vouches for the arguments.
        None => errno_result(unsafe { raw_syscall(n, a) }),
    }
}

/// The real `nanosleep`.
///
/// # Safety
/// As for `nanosleep(2)`.
pub(super) unsafe fn nanosleep(req: *const libc::timespec, rem: *mut libc::timespec) -> c_int {
    match NANOSLEEP.get() {
        Some(f) => {
            // SAFETY: `f` is libc's `nanosleep`, of this signature.
            let f: unsafe extern "C" fn(*const libc::timespec, *mut libc::timespec) -> c_int =
                unsafe { std::mem::transmute(f) };
            // SAFETY: the caller vouches for the pointers.
            unsafe { f(req, rem) }
        }
        None => {
            // SAFETY: the caller vouches for the pointers.
            let r = unsafe { raw_syscall(libc::SYS_nanosleep, [req as c_long, rem as c_long, 0, 0, 0, 0]) };
            errno_result(r) as c_int
        }
    }
}

/// The real `clock_nanosleep` (which returns the error number rather than setting `errno`).
///
/// # Safety
/// As for `clock_nanosleep(2)`.
pub(super) unsafe fn clock_nanosleep(
    clock: libc::clockid_t,
    flags: c_int,
    req: *const libc::timespec,
    rem: *mut libc::timespec,
) -> c_int {
    match CLOCK_NANOSLEEP.get() {
        Some(f) => {
            type ClockNanosleep = unsafe extern "C" fn(
                libc::clockid_t,
                c_int,
                *const libc::timespec,
                *mut libc::timespec,
            ) -> c_int;
            // SAFETY: `f` is libc's `clock_nanosleep`, of this signature.
            let f: ClockNanosleep = unsafe { std::mem::transmute(f) };
            // SAFETY: the caller vouches for the arguments.
            unsafe { f(clock, flags, req, rem) }
        }
        None => {
            let a = [clock as c_long, flags as c_long, req as c_long, rem as c_long, 0, 0];
            // SAFETY: the caller vouches for the arguments.
            let r = unsafe { raw_syscall(libc::SYS_clock_nanosleep, a) };
            if r < 0 { -r as c_int } else { 0 }
        }
    }
}

/// This thread's `errno`.
#[inline]
pub(super) fn errno() -> c_int {
    // SAFETY: `__errno_location` returns this thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() }
}

#[inline]
pub(super) fn set_errno(e: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e }
}

/// Restores the caller's `errno` when dropped: a hook that parked ran other fibers on this
/// thread meanwhile, and the runtime's own calls, which set `errno` as they go.
pub(super) struct SavedErrno(c_int);

impl SavedErrno {
    #[inline]
    pub(super) fn save() -> SavedErrno {
        SavedErrno(errno())
    }
}

impl Drop for SavedErrno {
    #[inline]
    fn drop(&mut self) {
        set_errno(self.0);
    }
}
