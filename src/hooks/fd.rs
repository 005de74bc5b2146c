//! The descriptor table: what the hooks know about each file descriptor a fiber has used, and
//! the hooks that keep it true (`fcntl`, `ioctl(FIONBIO)`, `close`, `dup`, `dup2`, `dup3`).
//!
//! A socket or pipe that a fiber uses is put in non-blocking mode underneath, once, so that its
//! calls can say `EAGAIN` and the fiber park on the carrier's reactor (`io.rs`). The user's own
//! mode lives here: `fcntl(F_GETFL)` shows it, `F_SETFL` and `FIONBIO` change it (and keep the
//! kernel's non-blocking), and a call on a descriptor the user made non-blocking returns
//! `EAGAIN` as it would have. Descriptors are classified lazily, at their first call from a
//! fiber, so creating one costs nothing; `close` forgets the entry before the number can be
//! reused, and the `dup`s copy it (the duplicate shares the open file, and so its underlying
//! non-blocking mode). `arch/hooks.md` ("Sockets and pipes").
//!
//! One word per descriptor, in chunks of 4,096 mapped on first use (no allocator in a hook):
//! flag bits below, a spin-lock bit for classification and registration, and the address of
//! the descriptor's reactor registration (made at its first wait), shared with the fibers
//! waiting on it so that a `close` while they wait fails them rather than free it under them.
//!
//! In the child of a `fork`, every descriptor open at the fork is marked `INHERITED`
//! (`inherit_all_after_fork`): the open file, its non-blocking mode and the registration's
//! epoll set are shared with the parent, so the child's calls on it pass through (blocking as
//! the user asked) and never switch, register or deregister it. `arch/hooks.md` ("Fork").

use std::ffi::{c_int, c_long, c_ulong};
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use super::real;
use crate::scheduler::reactor::registration::Registration;

/// The descriptor was classified (its other bits say what it is).
pub(super) const KNOWN: usize = 1;
/// A socket or pipe the hooks keep non-blocking underneath.
pub(super) const POLLABLE: usize = 2;
/// The user set it non-blocking: calls return `EAGAIN` rather than park.
pub(super) const USER_NONBLOCK: usize = 4;
/// A socket (it has `SO_RCVTIMEO`/`SO_SNDTIMEO`).
pub(super) const SOCKET: usize = 8;
/// The entry's spin lock.
const LOCKED: usize = 16;
/// Open in the parent when this process was forked: its calls pass through, as a plain
/// thread's, whoever makes them (the module doc).
pub(super) const INHERITED: usize = 32;
const FLAGS: usize = KNOWN | POLLABLE | USER_NONBLOCK | SOCKET | INHERITED;
const BITS: usize = 64;

const CHUNK: usize = 4096;
const CHUNKS: usize = 256;

/// Descriptors at or above this number are not tracked: their calls pass straight through (the
/// supervisor covers a fiber that blocks on one).
pub(super) const LIMIT: usize = CHUNK * CHUNKS;

static TABLE: [AtomicPtr<AtomicUsize>; CHUNKS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS];

/// A descriptor's registration, shared by the table and the fibers waiting on it. Aligned so
/// that its address leaves the entry's flag bits free.
#[repr(align(64))]
pub(super) struct Hooked {
    pub(super) reg: Registration,
}

/// The entry of `fd`; `make`: map its chunk if it is not there yet.
fn entry(fd: c_int, make: bool) -> Option<&'static AtomicUsize> {
    let fd = usize::try_from(fd).ok().filter(|&f| f < LIMIT)?;
    let slot = &TABLE[fd / CHUNK];
    // Acquire pairs with the Release of the store that published the chunk.
    let mut p = slot.load(Ordering::Acquire);
    if p.is_null() {
        if !make {
            return None;
        }
        p = map_chunk(slot)?;
    }
    // SAFETY: a published chunk holds `CHUNK` zero-initialised words and is never unmapped.
    Some(unsafe { &*p.add(fd % CHUNK) })
}

#[cold]
fn map_chunk(slot: &AtomicPtr<AtomicUsize>) -> Option<*mut AtomicUsize> {
    let len = CHUNK * size_of::<AtomicUsize>();
    // SAFETY: a fresh anonymous private mapping; checked below.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if m == libc::MAP_FAILED {
        return None;
    }
    let m = m.cast::<AtomicUsize>();
    match slot.compare_exchange(std::ptr::null_mut(), m, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => Some(m),
        Err(won) => {
            // SAFETY: our mapping, never published.
            unsafe { libc::munmap(m.cast(), len) };
            Some(won)
        }
    }
}

/// The flags of `fd` now (0 if untracked), without classifying it.
#[inline]
pub(super) fn flags(fd: c_int) -> usize {
    // A caller whose call just failed with `EAGAIN` read the kernel's non-blocking mode in that
    // call; this fence orders that read before the entry's, and pairs with the fence
    // `classify_now` puts between publishing `POLLABLE` and switching the mode, so a caller
    // that saw the switched mode sees `POLLABLE` (`arch/hooks.md`, "The switch and a plain
    // thread"). No instruction on x86-64; the load's Acquire pairs with `unlock`'s Release.
    std::sync::atomic::fence(Ordering::Acquire);
    entry(fd, false).map_or(0, |e| e.load(Ordering::Acquire) & FLAGS)
}

/// Takes `e`'s spin lock; returns the word. Held only for a few system calls at most.
fn lock(e: &AtomicUsize) -> usize {
    loop {
        let w = e.load(Ordering::Relaxed);
        if w & LOCKED == 0
            && e.compare_exchange_weak(w, w | LOCKED, Ordering::Acquire, Ordering::Relaxed).is_ok()
        {
            return w;
        }
        std::hint::spin_loop();
    }
}

fn unlock(e: &AtomicUsize, w: usize) {
    e.store(w & !LOCKED, Ordering::Release);
}

/// The flags of `fd`, classifying it first if no fiber has used it yet: a socket or pipe is
/// made non-blocking underneath, with the user's mode recorded. The standard streams (0 to 2)
/// are left alone: they are often shared with other processes, which would see the change.
pub(super) fn classify(fd: c_int) -> usize {
    let Some(e) = entry(fd, true) else { return 0 };
    let w = e.load(Ordering::Acquire);
    if w & KNOWN != 0 {
        return w & FLAGS;
    }
    let w = lock(e);
    if w & KNOWN != 0 {
        unlock(e, w);
        return w & FLAGS;
    }
    let flags = classify_now(fd, e, w);
    unlock(e, w | flags);
    flags
}

/// Classifies `fd`, whose entry `e` the caller holds locked (`w`: the word it locked).
fn classify_now(fd: c_int, e: &AtomicUsize, w: usize) -> usize {
    if fd <= 2 {
        return KNOWN;
    }
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `st` is a writable `stat`; `fstat` is not hooked.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        // Not open: record nothing, and let the caller's call fail as the kernel says.
        return 0;
    }
    // SAFETY: `fstat` succeeded and filled it.
    let mode = unsafe { st.assume_init() }.st_mode & libc::S_IFMT;
    let kind = match mode {
        libc::S_IFSOCK => POLLABLE | SOCKET,
        libc::S_IFIFO => POLLABLE,
        _ => return KNOWN,
    };
    // SAFETY: plain descriptor calls, to libc's own `fcntl`.
    let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    if fl < 0 {
        return 0;
    }
    if fl & libc::O_NONBLOCK != 0 {
        return KNOWN | kind | USER_NONBLOCK;
    }
    // The table says `POLLABLE` before the kernel's mode changes: a plain thread whose call
    // says `EAGAIN` because of the switch must find it, or it would hand that `EAGAIN` to a user
    // who asked to block (`io.rs`, `passed_failed`). Without `KNOWN`, and under the lock, so no
    // fiber acts on the entry before the unlock. The Release fence orders the store before
    // every later store, the kernel's store of the mode among them (a store the memory model
    // does not see, so a fence rather than a Release store, which orders only what precedes
    // it); it pairs with the Acquire fence in `flags`.
    e.store(w | LOCKED | kind, Ordering::Relaxed);
    std::sync::atomic::fence(Ordering::Release);
    // SAFETY: as above.
    if unsafe { real::fcntl(fd, libc::F_SETFL, (fl | libc::O_NONBLOCK) as c_long) } < 0 {
        // Not switched: the unlock takes `POLLABLE` back.
        return KNOWN;
    }
    KNOWN | kind
}

/// `fd`'s registration, if a fiber has waited on it.
pub(super) fn registration(fd: c_int) -> Option<Arc<Hooked>> {
    let e = entry(fd, false)?;
    // Most calls find none (no fiber has waited on it, or it never blocked): no lock then. A
    // registration installed just after this load is found by the caller's next round.
    if e.load(Ordering::Relaxed) & !(BITS - 1) == 0 {
        return None;
    }
    let w = lock(e);
    let p = (w & !(BITS - 1)) as *const Hooked;
    let r = (!p.is_null()).then(|| {
        // SAFETY: `p` came from `Arc::into_raw` and the table's reference stays while the lock is
        // held (only a locked `forget` takes it).
        unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        }
    });
    unlock(e, w);
    r
}

/// Installs `make()`'s registration for `fd` in place of `old` (the one the caller found, or
/// `None`); returns the one in the table afterwards (another fiber's, if it won the race).
pub(super) fn install(
    fd: c_int,
    old: Option<&Arc<Hooked>>,
    make: impl FnOnce() -> std::io::Result<Registration>,
) -> std::io::Result<Arc<Hooked>> {
    let e = entry(fd, true).ok_or_else(|| std::io::Error::from_raw_os_error(libc::EBADF))?;
    let w = lock(e);
    let p = (w & !(BITS - 1)) as *const Hooked;
    let old_p = old.map_or(std::ptr::null(), Arc::as_ptr);
    if p != old_p {
        // SAFETY: as in `registration`.
        let r = unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        };
        unlock(e, w);
        return Ok(r);
    }
    let new = match make() {
        Ok(reg) => Arc::new(Hooked { reg }),
        Err(err) => {
            unlock(e, w);
            return Err(err);
        }
    };
    let raw = Arc::into_raw(Arc::clone(&new));
    unlock(e, (w & FLAGS) | raw as usize);
    if !p.is_null() {
        // SAFETY: the table's reference to the old one, taken out of the table above.
        let old = unsafe { Arc::from_raw(p) };
        old.reg.retire();
    }
    Ok(new)
}

/// Forgets `fd` (it is being closed, or replaced by `dup2`): fails the fibers waiting on it and
/// takes it out of the reactor while it is still open. Returns its flags.
fn forget(fd: c_int) -> usize {
    let Some(e) = entry(fd, false) else { return 0 };
    let w = lock(e);
    unlock(e, 0);
    let p = (w & !(BITS - 1)) as *const Hooked;
    if !p.is_null() {
        // SAFETY: the table's reference, taken out of the table above.
        let h = unsafe { Arc::from_raw(p) };
        h.reg.retire();
    }
    w & FLAGS
}

/// Marks every descriptor open at the fork `INHERITED`, in the child of a `fork` (a
/// `pthread_atfork` child handler, on the child's only thread, before any other code of the
/// child's). What the parent knew of a descriptor stays true of the open file the child
/// shares, so its flags are kept; its registration is the parent's (its epoll set is the
/// parent's kernel object), so the child forgets it without freeing or retiring it (a leak of
/// the child's copy); a lock bit was held by a thread the child does not have. A descriptor
/// the parent's hooks never saw (a pre-fork server's listener) is found in `/proc/self/fd`
/// and recorded as one never switched: a fiber of the child's must not switch an open file
/// the parent and the other children share, where their next classification would take the
/// switched mode for the user's. Without `/proc`, only the known ones are marked. An entry the
/// parent was classifying at the fork (locked, `KNOWN` not yet stored) keeps only what it had
/// recorded: if `POLLABLE` was not, the child takes the descriptor for one never switched.
///
/// System calls, atomics and a buffer on the stack only: async-signal-safe, as a child
/// handler must be.
pub(super) fn inherit_all_after_fork() {
    for slot in &TABLE {
        // Relaxed: the child's only thread, and chunks are never unmapped.
        let p = slot.load(Ordering::Relaxed);
        if p.is_null() {
            continue;
        }
        for i in 0..CHUNK {
            // SAFETY: a published chunk holds `CHUNK` words and is never unmapped.
            let e = unsafe { &*p.add(i) };
            let w = e.load(Ordering::Relaxed);
            if w != 0 {
                e.store(INHERITED | KNOWN | (w & (POLLABLE | USER_NONBLOCK | SOCKET)), Ordering::Relaxed);
            }
        }
    }
    for_each_open_descriptor(|fd| {
        if let Some(e) = entry(fd, true) {
            // Relaxed: as above. A known one was marked above.
            if e.load(Ordering::Relaxed) == 0 {
                e.store(INHERITED | KNOWN, Ordering::Relaxed);
            }
        }
    });
}

/// Calls `f` with every descriptor open in this process (`/proc/self/fd`, read with
/// `getdents64` into a buffer on the stack: no allocation), but the one it reads them through.
/// Nothing if `/proc` is not there.
fn for_each_open_descriptor(mut f: impl FnMut(c_int)) {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated path; `open` is not hooked.
    let dir = unsafe { libc::open(c"/proc/self/fd".as_ptr(), flags) };
    if dir < 0 {
        return;
    }
    // `linux_dirent64` records: 8-byte aligned, as the kernel writes them.
    let mut buf = [0u64; 512];
    loop {
        let a = [dir as c_long, buf.as_mut_ptr() as c_long, size_of_val(&buf) as c_long, 0, 0, 0];
        // SAFETY: `buf` is writable for the length given; `dir` is open.
        let n = unsafe { real::syscall(libc::SYS_getdents64, a) };
        if n <= 0 {
            break;
        }
        // SAFETY: the kernel wrote `n` bytes of records at `buf`.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n as usize) };
        let mut at = 0;
        while at + 19 < bytes.len() {
            // A record: inode (8 bytes), offset (8), its length (2), type (1), NUL-ended name.
            let len = u16::from_ne_bytes([bytes[at + 16], bytes[at + 17]]) as usize;
            if len < 20 {
                break; // not a record (no unwinding out of a fork handler)
            }
            let name = &bytes[at + 19..(at + len).min(bytes.len())];
            let name = name.split(|&b| b == 0).next().unwrap_or_default();
            match descriptor_number(name) {
                Some(fd) if fd != dir => f(fd),
                _ => {}
            }
            at += len;
        }
    }
    // SAFETY: our own descriptor, closed once; through libc's `close`, as the table never knew it.
    unsafe { real::close(dir) };
}

/// A descriptor's number from its name in `/proc/self/fd` (`None` for `.` and `..`).
fn descriptor_number(name: &[u8]) -> Option<c_int> {
    if name.is_empty() {
        return None;
    }
    name.iter().try_fold(0 as c_int, |n, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        n.checked_mul(10)?.checked_add(c_int::from(digit))
    })
}

/// Gives `new` (a duplicate of `old`) `old`'s flags: they share the open file, so its
/// underlying non-blocking mode too. Its registration is its own, made at its first wait.
///
/// `old` is classified first if no fiber has used it: otherwise the first fiber to use one of
/// the two would switch the shared open file to non-blocking, and the other, classified later,
/// would read that as the user's own mode (a server's `try_clone` pair, seen returning `EAGAIN`
/// to a blocking write). Classifying needs no fiber: a plain thread on a switched descriptor
/// still blocks (`io.rs`). A duplicate of an `INHERITED` descriptor is inherited too: it is the
/// parent's open file.
fn copy(old: c_int, new: c_int) {
    let f = classify(old);
    if let Some(e) = entry(new, f != 0) {
        let w = lock(e);
        debug_assert!(w & !(FLAGS | LOCKED) == 0, "a new descriptor with a registration");
        unlock(e, f);
    }
}

/// Interposes `close(2)`: the entry is forgotten before the number can be reused.
///
/// # Safety
/// As for `close(2)` (the caller owns the descriptor).
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn close(fd: c_int) -> c_int {
    forget(fd);
    // SAFETY: the caller's descriptor.
    unsafe { real::close(fd) }
}

/// Interposes `dup(2)`.
///
/// # Safety
/// As for the C library's function of this name.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: the caller's descriptor.
    let new = unsafe { real::dup(fd) };
    if new >= 0 {
        copy(fd, new);
    }
    new
}

/// Interposes `dup2(2)`, which closes `new` first if it is open.
///
/// # Safety
/// As for the C library's function of this name.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if old == new {
        // SAFETY: the caller's descriptors.
        return unsafe { real::dup2(old, new) };
    }
    forget(new);
    // SAFETY: the caller's descriptors.
    let r = unsafe { real::dup2(old, new) };
    if r >= 0 {
        copy(old, new);
    }
    r
}

/// Interposes `dup3(2)`.
///
/// # Safety
/// As for the C library's function of this name.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if old == new {
        // SAFETY: the caller's arguments.
        return unsafe { real::dup3(old, new, flags) };
    }
    forget(new);
    // SAFETY: the caller's arguments.
    let r = unsafe { real::dup3(old, new, flags) };
    if r >= 0 {
        copy(old, new);
    }
    r
}

/// Interposes `fcntl(2)`: `F_GETFL` shows the user's non-blocking mode, `F_SETFL` records it
/// (the kernel's stays on), `F_DUPFD`/`F_DUPFD_CLOEXEC` copy the entry. `fcntl` is variadic;
/// its one optional argument is an integer or a pointer, read as one `long` (`arch/hooks.md`).
///
/// # Safety
/// As for `fcntl(2)`.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
    let tracked = flags(fd) & POLLABLE != 0;
    match cmd {
        libc::F_GETFL if tracked => {
            // SAFETY: the caller's descriptor.
            let r = unsafe { real::fcntl(fd, cmd, arg) };
            if r < 0 {
                return r;
            }
            let user = if flags(fd) & USER_NONBLOCK != 0 { libc::O_NONBLOCK } else { 0 };
            (r & !libc::O_NONBLOCK) | user
        }
        libc::F_SETFL if tracked => {
            let Some(e) = entry(fd, false) else { return -1 };
            let w = lock(e);
            // SAFETY: the caller's descriptor, with the kernel's non-blocking mode kept.
            let r = unsafe { real::fcntl(fd, cmd, arg | libc::O_NONBLOCK as c_long) };
            let user = if arg & libc::O_NONBLOCK as c_long != 0 { USER_NONBLOCK } else { 0 };
            unlock(e, if r < 0 { w } else { (w & !USER_NONBLOCK) | user });
            r
        }
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            // SAFETY: the caller's arguments.
            let new = unsafe { real::fcntl(fd, cmd, arg) };
            if new >= 0 {
                copy(fd, new);
            }
            new
        }
        // SAFETY: the caller's arguments, as they came.
        _ => unsafe { real::fcntl(fd, cmd, arg) },
    }
}

/// Interposes `ioctl(2)`: `FIONBIO` (std's `set_nonblocking` on sockets) records the user's
/// mode on a tracked descriptor and keeps the kernel's on; every other request passes through.
///
/// # Safety
/// As for `ioctl(2)`.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: c_long) -> c_int {
    if req == libc::FIONBIO as c_ulong && flags(fd) & POLLABLE != 0 {
        if let Some(e) = entry(fd, false) {
            let on: c_int = 1;
            let w = lock(e);
            // SAFETY: `FIONBIO` reads one `int` through its argument; ours is valid.
            let r = unsafe { real::ioctl(fd, req, (&raw const on) as c_long) };
            // SAFETY: the caller's `int` pointer, as the kernel would read it.
            let user = if r >= 0 && unsafe { *(arg as *const c_int) } != 0 { USER_NONBLOCK } else { 0 };
            unlock(e, if r < 0 { w } else { (w & !USER_NONBLOCK) | user });
            return r;
        }
    }
    // SAFETY: the caller's arguments, as they came.
    unsafe { real::ioctl(fd, req, arg) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listing_of_open_descriptors_names_each_open_one() {
        let mut fds = [0; 2];
        // SAFETY: `fds` is a writable array of two; `pipe2` is not hooked.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        let mut open = Vec::new();
        for_each_open_descriptor(|fd| open.push(fd));
        for fd in fds {
            // SAFETY: our own descriptor, closed once.
            unsafe { real::close(fd) };
        }
        // Other tests open and close descriptors meanwhile: only these two are sure to be open.
        assert!(open.contains(&fds[0]) && open.contains(&fds[1]), "{fds:?} not in {open:?}");
    }

    #[test]
    fn a_descriptor_number_is_decimal_digits_only() {
        assert_eq!(descriptor_number(b"0"), Some(0));
        assert_eq!(descriptor_number(b"1048575"), Some(1_048_575));
        for name in [&b"."[..], b"..", b"", b"12a", b"99999999999"] {
            assert_eq!(descriptor_number(name), None, "{name:?}");
        }
    }
}
