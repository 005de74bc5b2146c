//! The stack-overflow report: a fiber that runs off its stack hits its guard page, and instead
//! of a bare SIGSEGV (std's handler knows only the *thread's* guard page) the process stops with
//! a message that names the fiber, its stack size and the fix, as std does for threads.
//!
//! The handler runs on the carrier's alternate signal stack (`SA_ONSTACK`), decides in a table
//! lookup whether the faulting address is a fiber guard page, formats into a buffer on its own
//! stack (no allocation, no locks) and aborts. Any other fault goes to the previous handler.
//! Recovering instead is not offered: corosensei can resume the resumer, but the fiber's frames
//! would be discarded without running destructors (a held lock stays locked for ever).

use std::fmt::Write as _;
use std::sync::OnceLock;

use super::stack::ARENAS;
use crate::fiber::context;
use crate::platform::signal;

struct Previous {
    segv: signal::Action,
    bus: signal::Action,
}

static PREVIOUS: OnceLock<Previous> = OnceLock::new();

/// Installs the handler once per process (the first runtime does it).
pub(crate) fn install_handler() {
    crate::platform::fork::init_once(&PREVIOUS, || {
        // Failing to install only loses the nicer message; the guard page still stops the fault.
        let segv = signal::install(signal::SIGSEGV, on_fault).unwrap_or_else(|_| signal::default_action());
        let bus = signal::install(signal::SIGBUS, on_fault).unwrap_or_else(|_| signal::default_action());
        Previous { segv, bus }
    });
}

/// Gives a carrier an alternate signal stack if it has none (std gives one to its own threads
/// when its handler is installed; not every embedding does that).
pub(crate) fn ensure_altstack() -> Option<signal::AltStack> {
    if signal::has_altstack() { None } else { signal::AltStack::install().ok() }
}

/// A `fmt::Write` into a fixed buffer: formatting without allocating, as a handler must.
struct Buf {
    bytes: [u8; 1024],
    len: usize,
}

impl std::fmt::Write for Buf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.bytes.len() - self.len);
        self.bytes[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

extern "C" fn on_fault(sig: signal::Signo, info: *mut signal::SigInfo, ctx: *mut signal::Context) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { signal::fault_addr(info) };
    if let Some(usable) = ARENAS.guard_hit(addr) {
        let mut b = Buf { bytes: [0; 1024], len: 0 };
        let _ = write!(b, "\nfiber ");
        let rec = context::current_fiber();
        if rec.is_null() {
            let _ = write!(b, "<unknown>");
        } else {
            // SAFETY: the faulting fiber is the current one of this carrier and its record is
            // live while it runs; we only read immutable fields.
            let rec = unsafe { &*rec };
            let _ = write!(b, "{}", rec.id());
            if let Some(name) = rec.name() {
                let _ = write!(b, " '{name}'");
            }
            let _ = write!(b, " (spawned at {})", rec.spawned_at());
        }
        let _ = write!(
            b,
            " has overflowed its stack of {} KiB\nfatal runtime error: fiber stack overflow; give it a \
             larger stack with vt::Builder::new().stack_size(..) or runtime::Builder::stack_size(..), \
             aborting\n",
            usable / 1024
        );
        signal::write_stderr(&b.bytes[..b.len]);
        signal::abort();
    }
    // Not ours: hand the fault to whoever handled it before (std's handler reports the
    // thread's own guard page, and otherwise restores the default action).
    let Some(prev) = PREVIOUS.get() else { return };
    let action = if sig == signal::SIGBUS { &prev.bus } else { &prev.segv };
    // SAFETY: `action` is what `install` returned for `sig`, and we are in `sig`'s handler with
    // the kernel's `info` and `ctx`.
    unsafe { signal::chain(sig, action, info, ctx) };
}
