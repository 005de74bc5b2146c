//! Signal plumbing: for the stack-overflow report, a SIGSEGV/SIGBUS handler on an alternate
//! signal stack, chained to whatever handler was there before; for `vt::signal`, a handler that
//! counts a signal and wakes a forwarding thread through a pipe; for the SIGQUIT dump, the
//! same with a pipe of its own.

use std::io;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

/// A signal number.
pub(crate) type Signo = libc::c_int;
/// What the kernel tells an `SA_SIGINFO` handler about the signal.
pub(crate) type SigInfo = libc::siginfo_t;
/// The interrupted context an `SA_SIGINFO` handler receives (opaque).
pub(crate) type Context = libc::c_void;
/// A signal's action, as `install` returns the previous one.
pub(crate) type Action = libc::sigaction;
pub(crate) const SIGSEGV: Signo = libc::SIGSEGV;
pub(crate) const SIGBUS: Signo = libc::SIGBUS;

/// The handler's signature (`SA_SIGINFO`).
pub(crate) type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// The default action (`SIG_DFL`, no flags), for a signal whose previous action is unknown.
pub(crate) fn default_action() -> Action {
    // SAFETY: an all-zero sigaction is SIG_DFL with no flags.
    unsafe { MaybeUninit::zeroed().assume_init() }
}

/// The faulting address of a SIGSEGV or SIGBUS.
///
/// # Safety
/// `info` is the siginfo the kernel passed to an `SA_SIGINFO` handler of that signal.
pub(crate) unsafe fn fault_addr(info: *mut SigInfo) -> usize {
    // SAFETY: the caller's contract.
    unsafe { (*info).si_addr() as usize }
}

/// Hands a signal on to the action that handled it before `install` (std's handler reports the
/// thread's own guard page, and otherwise restores the default action).
///
/// # Safety
/// Called from `sig`'s handler, with the `info` and `ctx` the kernel passed to it; `action` is
/// what `install` returned for `sig`.
pub(crate) unsafe fn chain(sig: Signo, action: &Action, info: *mut SigInfo, ctx: *mut Context) {
    let h = action.sa_sigaction;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        // Re-install it; returning re-executes the faulting instruction, which now faults
        // with the default action (the process dies with SIGSEGV, as it would have).
        restore(sig, action);
    } else if action.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed as an SA_SIGINFO handler with this type.
        let f: Handler = unsafe { std::mem::transmute::<usize, Handler>(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a plain (non-SA_SIGINFO) handler takes the signal number.
        let f: extern "C" fn(libc::c_int) =
            unsafe { std::mem::transmute::<usize, extern "C" fn(libc::c_int)>(h) };
        f(sig);
    }
}

/// Installs `handler` for `sig` with `SA_SIGINFO | SA_ONSTACK`, returning the previous action.
pub(crate) fn install(sig: libc::c_int, handler: Handler) -> io::Result<libc::sigaction> {
    // SAFETY: an all-zero sigaction is a valid value to fill in.
    let mut new: libc::sigaction = unsafe { MaybeUninit::zeroed().assume_init() };
    new.sa_sigaction = handler as usize;
    new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: `sa_mask` is a valid sigset to empty.
    unsafe { libc::sigemptyset(&mut new.sa_mask) };
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { MaybeUninit::zeroed().assume_init() };
    // SAFETY: both pointers are valid sigactions for the call.
    if unsafe { libc::sigaction(sig, &new, &mut old) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(old)
}

/// Re-installs `action` for `sig` (used to fall back to the previous handler).
pub(crate) fn restore(sig: libc::c_int, action: &libc::sigaction) {
    // SAFETY: `action` is a valid sigaction obtained from `install`.
    unsafe { libc::sigaction(sig, action, std::ptr::null_mut()) };
}

/// Whether this thread has an alternate signal stack.
pub(crate) fn has_altstack() -> bool {
    // SAFETY: an all-zero stack_t is a valid value to overwrite.
    let mut cur: libc::stack_t = unsafe { MaybeUninit::zeroed().assume_init() };
    // SAFETY: querying only (null new stack); `cur` is writable.
    let rc = unsafe { libc::sigaltstack(std::ptr::null(), &mut cur) };
    rc == 0 && cur.ss_flags & libc::SS_DISABLE == 0
}

/// An alternate signal stack owned by this thread (a carrier started by a foreign thread
/// library may lack the one std gives its threads). Disabled and unmapped on drop.
pub(crate) struct AltStack {
    base: *mut libc::c_void,
    len: usize,
}

impl AltStack {
    pub(crate) fn install() -> io::Result<AltStack> {
        let len = (libc::SIGSTKSZ).max(64 * 1024);
        let base = super::reserve(len)?.cast::<libc::c_void>();
        let st = libc::stack_t { ss_sp: base, ss_flags: 0, ss_size: len };
        // SAFETY: `st` describes the mapping just made, which lives until `drop`.
        if unsafe { libc::sigaltstack(&st, std::ptr::null_mut()) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: unmapping the mapping made above, which nothing uses.
            unsafe { libc::munmap(base, len) };
            return Err(e);
        }
        Ok(AltStack { base, len })
    }
}

impl Drop for AltStack {
    fn drop(&mut self) {
        let off = libc::stack_t { ss_sp: std::ptr::null_mut(), ss_flags: libc::SS_DISABLE, ss_size: 0 };
        // SAFETY: disabling this thread's alternate stack before unmapping it.
        unsafe {
            libc::sigaltstack(&off, std::ptr::null_mut());
            libc::munmap(self.base, self.len);
        }
    }
}

/// Writes `bytes` to stderr with `write(2)` (async-signal-safe).
pub(crate) fn write_stderr(bytes: &[u8]) {
    // SAFETY: writes from a live buffer.
    let _ = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
}

/// Ends the process like std does on a stack overflow.
pub(crate) fn abort() -> ! {
    // SAFETY: no preconditions; async-signal-safe.
    unsafe { libc::abort() }
}

// --- Forwarding signals to `vt::signal`'s waiters (`crate::signal`). ---

/// Signal numbers the forwarder takes: 1 to 64 (Linux's `_NSIG` is 65).
pub(crate) const FORWARD_MAX: usize = 64;

/// Per signal, how many times it was delivered since its handler was installed.
static DELIVERED: [AtomicU64; FORWARD_MAX + 1] = [const { AtomicU64::new(0) }; FORWARD_MAX + 1];
/// The write end of the pipe that wakes the forwarding thread; -1 until `forward_pipe`.
static FORWARD_FD: AtomicI32 = AtomicI32::new(-1);

/// Makes the pipe the handler writes to and returns its read end (see `renew_pipe`). A burst
/// of signals that fills it loses bytes, not counts (and the reader wakes all waiters for any
/// byte). Called under `crate::signal`'s state lock only.
pub(crate) fn forward_pipe() -> io::Result<i32> {
    renew_pipe(&FORWARD_FD)
}

/// Makes a self-pipe for a signal handler that writes to the descriptor in `slot`, and returns
/// its read end. The write end is non-blocking, so a handler never blocks on a full pipe. Made
/// again (in a forked child, whose old pipe is shared with the parent, whose reader would take
/// the child's bytes), the new write end takes the old one's descriptor number (`dup3`), so a
/// handler that has just loaded the number writes to the new pipe, never to a closed or reused
/// descriptor. Callers serialise calls for one slot.
fn renew_pipe(slot: &AtomicI32) -> io::Result<i32> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fds[1]` is the write end just made; setting O_NONBLOCK has no other effect.
    unsafe { libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK) };
    let old = slot.load(Ordering::Acquire);
    if old < 0 {
        slot.store(fds[1], Ordering::Release);
        return Ok(fds[0]);
    }
    // SAFETY: `old` is the previous pipe's write end, ours; `dup3` replaces it atomically with
    // the new write end (sharing its open file, O_NONBLOCK included).
    let r = unsafe { libc::dup3(fds[1], old, libc::O_CLOEXEC) };
    let e = io::Error::last_os_error();
    // SAFETY: the new write end, ours; `old` now names the same pipe (or the call failed and
    // the new pipe goes).
    unsafe { libc::close(fds[1]) };
    if r < 0 {
        // SAFETY: the new read end, ours and unused.
        unsafe { libc::close(fds[0]) };
        return Err(e);
    }
    Ok(fds[0])
}

/// Closes a read end `forward_pipe` or `sigquit_pipe` returned, in a forked child, whose copy
/// is shared with the parent (the parent's reading thread keeps its own open). The handlers
/// never touch a read end.
pub(crate) fn close_read_end(read_fd: i32) {
    // SAFETY: `read_fd` is ours (made by `renew_pipe`), and its reader, in a child, is not there.
    unsafe { libc::close(read_fd) };
}

/// Installs the forwarding handler for `sig` (after `forward_pipe`). It replaces the
/// signal's previous action for the rest of the process's life.
pub(crate) fn forward(sig: libc::c_int) -> io::Result<()> {
    if !(1..=FORWARD_MAX as libc::c_int).contains(&sig) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("signal {sig} out of range")));
    }
    // SAFETY: a zeroed sigaction is a valid starting value; we fill the handler and flags.
    let mut sa: libc::sigaction = unsafe { MaybeUninit::zeroed().assume_init() };
    sa.sa_sigaction = on_forwarded as extern "C" fn(libc::c_int) as usize;
    sa.sa_flags = libc::SA_RESTART;
    // SAFETY: `sa` is initialised; the handler is async-signal-safe (see it).
    if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// How many times `sig` was delivered since `forward(sig)`.
pub(crate) fn delivered(sig: libc::c_int) -> u64 {
    DELIVERED.get(sig as usize).map_or(0, |c| c.load(Ordering::Acquire))
}

extern "C" fn on_forwarded(sig: libc::c_int) {
    // Async-signal-safe: an atomic add, an atomic load and write(2); errno is saved around
    // it because the interrupted code may be about to read it.
    if let Some(c) = DELIVERED.get(sig as usize) {
        c.fetch_add(1, Ordering::Release);
    }
    let fd = FORWARD_FD.load(Ordering::Acquire);
    if fd < 0 {
        return;
    }
    // SAFETY: errno's location is thread-local and valid for the thread the signal runs on.
    let saved = unsafe { *libc::__errno_location() };
    let byte = sig as u8;
    // SAFETY: `fd` is the pipe's write end, open for the process's life; one byte from a local.
    unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
}

/// Blocks the calling (plain) thread until the pipe's read end `fd` has bytes; returns
/// false if it is closed or broken.
pub(crate) fn wait_forwarded(fd: i32) -> bool {
    let mut buf = [0u8; 64];
    loop {
        // SAFETY: `buf` is a valid writable buffer of its length; `fd` is the pipe's read end.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            return true;
        }
        if n == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return false;
        }
    }
}

/// Write end of SIGQUIT's self-pipe (`sigquit_pipe`); -1 until made.
static SIGQUIT_FD: AtomicI32 = AtomicI32::new(-1);
/// Whether `install_sigquit` ran.
static SIGQUIT_INSTALLED: AtomicBool = AtomicBool::new(false);

/// Whether `install_sigquit` ran (in this process or the parent it was forked from).
pub(crate) fn sigquit_installed() -> bool {
    SIGQUIT_INSTALLED.load(Ordering::Relaxed)
}

/// Makes SIGQUIT's self-pipe (see `renew_pipe`) and returns its read end. The caller starts
/// its reader (`wait_forwarded`), then calls `install_sigquit` once.
pub(crate) fn sigquit_pipe() -> io::Result<i32> {
    renew_pipe(&SIGQUIT_FD)
}

/// Installs the SIGQUIT handler, which writes a byte to the pipe per signal.
pub(crate) fn install_sigquit() -> io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid starting value; we fill the handler and flags.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_sigquit as extern "C" fn(libc::c_int) as usize;
    sa.sa_flags = libc::SA_RESTART;
    // SAFETY: `sa` is initialised; the handler only calls write(2), which is async-signal-safe.
    if unsafe { libc::sigaction(libc::SIGQUIT, &sa, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    SIGQUIT_INSTALLED.store(true, Ordering::Relaxed);
    Ok(())
}

extern "C" fn on_sigquit(_: libc::c_int) {
    // Async-signal-safe: one atomic load and write(2); errno is saved around it because the
    // interrupted code may be about to read it.
    let fd = SIGQUIT_FD.load(Ordering::Relaxed);
    if fd == -1 {
        return;
    }
    // SAFETY: errno's location is thread-local and valid for the thread the signal runs on.
    let saved = unsafe { *libc::__errno_location() };
    let byte = 1u8;
    // SAFETY: `fd` is the pipe's write end, open for the process's life; one byte from a local.
    unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = saved };
}
