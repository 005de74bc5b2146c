//! The only module that calls `libc` or `core_affinity`: thin `io::Result` wrappers, one `unsafe` block per call.
//!
//! `build.rs` already rejects targets without epoll, so there is a single implementation here
//! (Linux and Android share it).

pub(crate) mod epoll;
pub(crate) mod fork;
pub(crate) mod net;
pub(crate) mod signal;
pub(crate) mod thread;

pub(crate) use fork::forks;

use std::io;
use std::sync::OnceLock;

/// `MADV_GUARD_INSTALL` (Linux 6.13, uapi `asm-generic/mman-common.h`); libc 0.2 does not export it.
const MADV_GUARD_INSTALL: libc::c_int = 102;

/// Asks the CPU to start loading the cache line at `addr` (and its address translation): a
/// hint that never faults, whatever the address. A no-op where we have no stable intrinsic.
#[inline(always)]
pub(crate) fn prefetch(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` only hints the cache; it does not access memory architecturally and
    // cannot fault, even for an unmapped address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// The system page size, read once.
pub(crate) fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *fork::init_once(&PAGE, || {
        // SAFETY: sysconf has no preconditions; it returns -1 on error, handled below.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if n > 0 { n as usize } else { 4096 }
    })
}

/// Reserves `len` bytes of read-write address space that the kernel commits lazily, page by
/// page, as it is touched (`MAP_NORESERVE`), with transparent huge pages turned off: a parked
/// fiber that touched one page must cost one page, not a share of a 2 MiB huge page.
pub(crate) fn reserve(len: usize) -> io::Result<*mut u8> {
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing aliases no
    // existing memory; the result is checked against MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // Best effort: without the advice the stacks still work, they may just cost more memory.
    // SAFETY: `p..p+len` is the mapping created above.
    let _ = unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
    Ok(p.cast())
}

/// How a guard page is put below each stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GuardKind {
    /// `MADV_GUARD_INSTALL`: a marker in the page tables, no extra VMA (Linux ≥ 6.13).
    Marker,
    /// `mprotect(PROT_NONE)`: splits the mapping, two VMAs per stack, counted against
    /// `vm.max_map_count`.
    Protect,
}

/// Makes the page at `addr` fault on any access.
///
/// # Safety
/// `addr` must be page-aligned and lie inside a mapping owned by the caller, with nothing live
/// stored in that page.
pub(crate) unsafe fn install_guard(addr: *mut u8, kind: GuardKind) -> io::Result<()> {
    let page = page_size();
    let rc = match kind {
        // SAFETY: the caller guarantees the page is ours and holds nothing live.
        GuardKind::Marker => unsafe { libc::madvise(addr.cast(), page, MADV_GUARD_INSTALL) },
        // SAFETY: as above.
        GuardKind::Protect => unsafe { libc::mprotect(addr.cast(), page, libc::PROT_NONE) },
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Gives the pages of `addr..addr + len` back to the kernel (`MADV_DONTNEED`): the next touch
/// of one maps a zero page. Guard pages inside the range stay guards (markers survive
/// `MADV_DONTNEED`, and an `mprotect` page is left as it is).
///
/// # Safety
/// The range must be page-aligned, inside mappings owned by the caller, and hold nothing that
/// anyone will read again before writing it.
pub(crate) unsafe fn release(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: the caller guarantees the range is ours and dead.
    let rc = unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// `vm.max_map_count`, or the kernel default when it cannot be read.
pub(crate) fn max_map_count() -> usize {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65_530)
}

/// The number of memory mappings (VMAs) this process has now.
pub(crate) fn map_count() -> usize {
    std::fs::read("/proc/self/maps").map(|b| b.iter().filter(|&&c| c == b'\n').count()).unwrap_or(0)
}

/// The number of CPUs this process may use: the affinity mask and the cgroup CPU quota, not
/// the raw core count (std's `available_parallelism` reads both on Linux; Go's GOMAXPROCS lesson).
pub(crate) fn usable_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The calling thread's kernel id (for `/proc/self/task/<tid>/stat`).
pub(crate) fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Runs `f` when the process exits through `exit` (a return from `main` included), before
/// the threads are torn down; its failure to register (only when memory is exhausted) is
/// ignored: the caller then loses what `f` would have finished.
pub(crate) fn at_exit(f: extern "C" fn()) {
    // SAFETY: `atexit` only records the function pointer.
    unsafe { libc::atexit(f) };
}

/// Whether a write to stderr can still succeed: false once fd 2 is a pipe or socket whose reader
/// has gone (a write would fail with `EPIPE`); a file or a terminal is always writable here.
pub(crate) fn stderr_writable() -> bool {
    let mut fd = libc::pollfd { fd: 2, events: libc::POLLOUT, revents: 0 };
    // SAFETY: one valid pollfd for the call; a timeout of 0 returns at once.
    let n = unsafe { libc::poll(&mut fd, 1, 0) };
    n < 0 || fd.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) == 0
}

/// Clock ticks per second of procfs' CPU times (`sysconf(_SC_CLK_TCK)`; -1 if unknown).
pub(crate) fn clock_ticks_per_sec() -> libc::c_long {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) }
}

/// A CPU a carrier can be pinned to.
pub(crate) type CoreId = core_affinity::CoreId;

/// The CPUs this process may run on, for pinning (empty if unknown).
pub(crate) fn core_ids() -> Vec<CoreId> {
    core_affinity::get_core_ids().unwrap_or_default()
}

/// Pins the calling thread to `core`; false if the OS refused.
pub(crate) fn pin_to(core: CoreId) -> bool {
    core_affinity::set_for_current(core)
}

/// Explains running out of descriptors, which the bare OS error ("Too many open files") does
/// not: which limit was hit, and how to raise it. Other errors pass through unchanged. The OS
/// error stays reachable as the explanation's `source()`.
pub(crate) fn explain_fd_error(e: io::Error) -> io::Error {
    let why = match e.raw_os_error() {
        Some(libc::EMFILE) => {
            let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            // SAFETY: `lim` is a valid, writable rlimit.
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
            format!(
                "this process has open as many descriptors as its RLIMIT_NOFILE allows ({}, hard \
                 limit {}); raise it with `ulimit -n N` (up to the hard limit), `LimitNOFILE=` in a \
                 systemd unit, or `--ulimit nofile=N:N` for docker",
                lim.rlim_cur, lim.rlim_max
            )
        }
        Some(libc::ENFILE) => "the system-wide table of open files is full; raise fs.file-max \
                               (`sysctl -w fs.file-max=N`)"
            .to_string(),
        _ => return e,
    };
    io::Error::new(e.kind(), OutOfDescriptors { os: e, why })
}

/// Whether `e`, from `accept`, is a shortage (descriptors, buffers, memory) that may be over
/// after a pause: the connection stays queued. Sees through `explain_fd_error`'s wrapper.
pub(crate) fn is_shortage(e: &io::Error) -> bool {
    let os = e.raw_os_error().or_else(|| {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<OutOfDescriptors>())
            .and_then(|o| o.os.raw_os_error())
    });
    matches!(os, Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

/// See [`explain_fd_error`].
#[derive(Debug)]
struct OutOfDescriptors {
    os: io::Error,
    why: String,
}

impl std::fmt::Display for OutOfDescriptors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.os, self.why)
    }
}

impl std::error::Error for OutOfDescriptors {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.os)
    }
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, as Go does at start-up: a runtime meant
/// to hold tens of thousands of sockets should not stop at the historical 1,024.
pub(crate) fn raise_nofile_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 || lim.rlim_cur >= lim.rlim_max {
        return;
    }
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: `lim` is a valid rlimit whose soft limit does not exceed its hard limit.
    let _ = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
}
