//! The `hooks` feature: libc's blocking entry points, interposed at link time, so that std's
//! and C libraries' blocking calls made from a fiber park the fiber instead of its carrier.
//!
//! Each hook is an `extern "C"` function of libc's name defined in this crate: the static
//! linker binds the program's calls (std's included) to it before libc's. A hook passes
//! straight through to the real function (`real.rs`) unless the calling thread is a carrier
//! running a fiber (`gate`): plain threads, `vt::blocking` helpers, the supervisor, a
//! carrier between fibers and a `fork` child are never affected. Otherwise it does the same
//! work on the runtime (a sleep on the carrier's timers, a futex wait in `table.rs`, a socket or
//! pipe wait on the carrier's reactor through the descriptor table of `fd.rs`) and returns as
//! libc would, with the caller's `errno` kept. No hook allocates or takes a lock on its pass-through path. The
//! design, what is and is not interposed, and what it costs: `arch/hooks.md`.

// The interposed symbols stay out of loom builds, whose models run the table alone.
#[cfg(not(loom))]
mod fd;
#[cfg(not(loom))]
mod futex;
#[cfg(not(loom))]
mod io;
#[cfg(not(loom))]
mod poll;
#[cfg(not(loom))]
mod real;
#[cfg(not(loom))]
mod sleep;
mod table;

#[cfg(not(loom))]
use crate::fiber::context::{HookGate as Gate, hook_gate, hooks_armed};

/// What a hooked call on this thread does (see the module doc). A plain thread's answer is one
/// thread-local byte, inlined: the pass-through is the common case and its cost is the
/// feature's cost to code that never uses a fiber (`arch/hooks.md`).
#[cfg(not(loom))]
#[inline(always)]
fn gate() -> Gate {
    if !hooks_armed() || real::in_fork_child() { Gate::Pass } else { hook_gate() }
}

/// Runs the part of a hook that parks. An unwind out of it (the runtime's drop unwinding the
/// parked fiber) must not cross the C caller's frames, which cannot unwind (the process would
/// abort, or skip the caller's destructors): it stops here, and the hook returns as a wait cut
/// short does. The fiber's next wait in Rust code takes the unwind up again (corosensei
/// restarts a forced unwind at every later suspend), so the fiber is still unwound.
#[cfg(not(loom))]
#[inline]
fn parking<R>(f: impl FnOnce() -> R) -> Option<R> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok()
}
