//! The `hooks` feature: libc's blocking entry points, interposed at link time, so that std's
//! and C libraries' blocking calls made from a fiber park the fiber instead of its carrier.
//!
//! Each hook is an `extern "C"` function of libc's name defined in this crate: the static
//! linker binds the program's calls (std's included) to it before libc's. A hook passes
//! straight through to the real function (`real.rs`) unless the calling thread is a carrier
//! running a fiber (`gate`): plain threads, `vt::blocking` helpers, the supervisor and a
//! carrier between fibers are never affected. Otherwise it does the same
//! work on the runtime (a sleep on the carrier's timers, a futex wait in `table.rs`, a socket or
//! pipe wait on the carrier's reactor through the descriptor table of `fd.rs`) and returns as
//! libc would, with the caller's `errno` kept. No hook allocates or takes a lock on its pass-through path. The
//! design, what is and is not interposed, and what it costs: `arch/hooks.md`.
//!
//! In the child of a `fork`, the forking thread is a plain thread (the runtime's child handler
//! makes it one) and the carriers of the child's own runtimes are carriers like any: the hooks
//! work there for what the child makes. What the child inherits is the parent's: the
//! descriptors the parent's hooks knew (`fd.rs`, `INHERITED`), and the fiber waiters in the
//! futex table, which are fibers the child does not run (`after_fork_in_child`).

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
    if !hooks_armed() { Gate::Pass } else { hook_gate() }
}

/// The `pthread_atfork` child handler, run on the child's only thread before any other code of
/// the child's: the descriptors the parent's hooks knew become `INHERITED` (their calls pass
/// through, and nothing of the parent's registrations or modes is touched), and the futex table
/// forgets its waiters (the parent's fibers, none of which runs here: a wake would count one of
/// them and never reach the child's own waiter) and the bucket locks vanished threads held.
#[cfg(not(loom))]
extern "C" fn after_fork_in_child() {
    // `fork`'s caller in the child may look at `errno`; the listing of descriptors sets it.
    let _errno = real::SavedErrno::save();
    fd::inherit_all_after_fork();
    // SAFETY: a child handler, on the child's only thread, before the child's code runs.
    unsafe { futex::forget_waiters_after_fork() };
}

#[cfg(not(loom))]
extern "C" fn register_fork_handler() {
    // SAFETY: the handler reads and writes atomics and plain words of static tables and makes
    // async-signal-safe system calls (`open`, `getdents64`, `close`, `mmap`), with no lock or
    // allocation: async-signal-safe, as a child handler must be.
    unsafe { crate::platform::fork::after_fork_in_child(after_fork_in_child) };
}

/// Registers the handler while the process loads, as `platform::fork::at_load!` does, but
/// ahead of every plain `.init_array` entry (the linker places entries with a priority first):
/// child handlers run in the order they were registered, and the later ones' first futex wakes
/// (`platform::fork` unlocks the locks it held across the fork) must find the table emptied,
/// not a bucket locked by a thread the child does not have.
#[cfg(not(loom))]
#[used]
#[unsafe(link_section = ".init_array.00200")]
static REGISTER_FORK_HANDLER: extern "C" fn() = register_fork_handler;

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
