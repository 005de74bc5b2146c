//! The free functions that inspect the caller's runtime, for programs on the default runtime,
//! which have no `Runtime` value to ask: [`metrics`] and [`dump`] are
//! [`Handle::current`]`().metrics()` and `.dump()`.

use crate::runtime::Handle;
use crate::runtime::metrics::Metrics;
use crate::scheduler::diagnostics::FiberDump;

/// `println!("{}", vt::metrics())`: the counters of the runtime the calling fiber runs on, or
/// of the process-wide default runtime on a plain thread (started if it has not been). See
/// [`Runtime::metrics`](crate::Runtime::metrics).
pub fn metrics() -> Metrics {
    Handle::current().metrics()
}

/// `eprintln!("{}", vt::dump())`: every live fiber of the runtime the calling fiber runs on, or
/// of the process-wide default runtime on a plain thread (started if it has not been). See
/// [`Runtime::dump`](crate::Runtime::dump); `VT_DUMP_ON_SIGQUIT=1` prints it on `kill -QUIT`.
pub fn dump() -> FiberDump {
    Handle::current().dump()
}

/// `let i = vt::current_carrier();`: the index of the carrier the calling fiber runs on (0 to
/// its runtime's [`carriers`](Handle::carriers) less one, or above for a spare the supervisor
/// added), or `None` on a plain thread. A started fiber stays on its home carrier, so for it
/// the answer does not change (unless the runtime was built with `migrate_started_fibers`).
/// [`Builder::carrier`](crate::Builder::carrier) spawns onto a carrier by this index.
pub fn current_carrier() -> Option<usize> {
    let c = crate::scheduler::carrier::here();
    // SAFETY: a non-null carrier pointer is this thread's live carrier, read before any switch
    // point.
    (!c.is_null()).then(|| unsafe { (*c).index() })
}
