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
