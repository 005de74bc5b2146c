//! The panic hook that names the fiber: a panic inside a fiber says which fiber (its id, name
//! and spawn site) before std's own message, which can name only the carrier thread. Installed by
//! the first runtime to start; `arch/diagnostics.md`, "Panics name the fiber".

use std::sync::atomic::Ordering;

/// Makes a panic inside a fiber name the fiber: installs, once per process, a panic hook that
/// prints `fiber 12 "name" (spawned at src/main.rs:4:5) panicked on carrier thread
/// 'vt-carrier-0':` and then calls the hook that was there before it (std's, which prints the
/// thread's name, the panic's location and message, or the user's). On a plain thread it only
/// calls the previous hook. A hook the user sets later replaces this one, as any hook does.
///
/// std's hook cannot name the fiber: `std::thread::current()` inside a fiber is its carrier
/// thread, and its name is the carrier's.
pub(crate) fn install_panic_hook() {
    // `take_hook` and `set_hook` panic on a panicking thread (a runtime started from a
    // destructor during unwinding): the next runtime to start installs it then.
    if std::thread::panicking() || INSTALLED.load(Ordering::Acquire) {
        return;
    }
    // std's hook lock, held at a fork, would stay held in the child, whose first panic would
    // wait for it for ever.
    crate::platform::fork::outside_fork(install);
}

static INSTALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn install() {
    if INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let mut rec = super::context::current_fiber();
        if rec.is_null() {
            // A serving carrier, or the dropping thread, unwinding a fiber of a runtime's drop.
            rec = super::context::cancelling();
        }
        let message = info.payload().downcast_ref::<&str>().copied();
        if !rec.is_null() && message == Some(PANIC_IN_CLEANUP) {
            // SAFETY: as below.
            let line = panic_during_unwind(unsafe { &*rec });
            if crate::platform::stderr_writable() {
                eprint!("{line}");
            }
        }
        if !rec.is_null() {
            // SAFETY: the running fiber's record is live while it runs, and its id, name and
            // spawn site are read-only then (see `FiberRecord`'s `Send` argument).
            let rec = unsafe { &*rec };
            <super::schedule::RuntimeRef as super::schedule::Schedule>::panicked(rec);
            let name = rec.name().map(|n| format!(" {n:?}")).unwrap_or_default();
            let carrier = std::thread::current();
            let carrier = carrier.name().unwrap_or("<unnamed>");
            // One write, so that the line stays whole among other threads' output. Through
            // `eprint!`, as std's own panic message goes, so that a test harness capturing the
            // thread's output (libtest) captures this line with it: a passing test that provokes
            // a panic prints neither. `eprint!` panics if stderr fails, and a panic in the hook
            // aborts: skip the line where stderr can no longer be written (a closed pipe).
            let line = format!(
                "fiber {}{name} (spawned at {}) panicked on carrier thread '{carrier}':\n",
                rec.id(),
                rec.spawned_at()
            );
            if crate::platform::stderr_writable() {
                eprint!("{line}");
            }
        }
        previous(info)
    }));
}

/// What Rust's panic machinery says, through the hook, just before it aborts the process for a
/// panic that escaped a destructor run by an unwind (`core::panicking::panic_in_cleanup`).
const PANIC_IN_CLEANUP: &str = "panic in a destructor during cleanup";

/// A destructor of fiber `rec` panicked while the fiber unwound: Rust aborts the process next,
/// on a fiber as on a thread, and no runtime can catch it. Say which fiber, which unwind (a
/// stop, its runtime's drop, a panic) and the fix, so that the abort is not a mystery.
fn panic_during_unwind(rec: &super::FiberRecord) -> String {
    let name = rec.name().map(|n| format!(" {n:?}")).unwrap_or_default();
    let why = if std::ptr::eq(super::context::cancelling(), rec) {
        "its runtime's drop was unwinding it"
    } else if rec.stop.load(Ordering::Relaxed) != 0 {
        "it was being stopped (JoinHandle::cancel, a CancelHandle, vt::timeout or vt::deadline)"
    } else {
        "it was unwinding from a panic"
    };
    format!(
        "virtual-threads: a destructor of fiber {}{name} (spawned at {}) panicked while {why}. A \
         panic that escapes a destructor during an unwind aborts the process (Rust's rule, on a \
         fiber as on a std thread): neither the runtime nor the fiber's join can catch it. A \
         destructor that may fail should check std::thread::panicking() and not panic then.\n",
        rec.id(),
        rec.spawned_at()
    )
}
