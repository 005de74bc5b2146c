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
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

/// One real libc function, resolved once.
pub(super) struct Real {
    ptr: AtomicPtr<c_void>,
    name: &'static CStr,
}

/// Stored when `dlsym` found nothing, so that the lookup is not repeated.
const MISSING: *mut c_void = usize::MAX as *mut c_void;

impl Real {
    const fn new(name: &'static CStr) -> Real {
        Real { ptr: AtomicPtr::new(std::ptr::null_mut()), name }
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
        let p = if p.is_null() { MISSING } else { p };
        self.ptr.store(p, Ordering::Relaxed);
        p
    }
}

pub(super) static NANOSLEEP: Real = Real::new(c"nanosleep");
pub(super) static CLOCK_NANOSLEEP: Real = Real::new(c"clock_nanosleep");
pub(super) static SYSCALL: Real = Real::new(c"syscall");

const ALL: [&Real; 3] = [&NANOSLEEP, &CLOCK_NANOSLEEP, &SYSCALL];

/// Set in the child of a `fork` (a `pthread_atfork` handler): the child has one thread and no
/// carriers, though its copy of the forking thread's thread-locals may say otherwise, so every
/// hook passes straight through there.
static IN_FORK_CHILD: AtomicBool = AtomicBool::new(false);

extern "C" fn after_fork_in_child() {
    IN_FORK_CHILD.store(true, Ordering::Relaxed);
}

/// Whether this process is the child of a `fork` made after it started.
#[inline(always)]
pub(super) fn in_fork_child() -> bool {
    IN_FORK_CHILD.load(Ordering::Relaxed)
}

extern "C" fn resolve_all() {
    for r in ALL {
        r.get();
    }
    // SAFETY: registers a handler that stores to an atomic (async-signal-safe, as a fork child
    // handler must be); the other two are none.
    unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
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
