//! Signal plumbing for the stack-overflow report: a SIGSEGV/SIGBUS handler on an alternate
//! signal stack, chained to whatever handler was there before.

use std::io;
use std::mem::MaybeUninit;

/// The handler's signature (`SA_SIGINFO`).
pub(crate) type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

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
