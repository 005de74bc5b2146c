//! The validated, plain-data settings of a runtime (built by `runtime::Builder`).

use std::time::Duration;

#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) carriers: usize,
    pub(crate) max_carriers: usize,
    pub(crate) affinity: Affinity,
    /// Started fibers may move between carriers (the `unsafe` opt-in); else they stay home.
    pub(crate) migrate_started_fibers: bool,
    /// A carrier well above another in started fibers at home places fibers about to start
    /// there (`Builder::place_by_load`, `scheduler/carrier/place.rs`).
    pub(crate) place_by_load: bool,
    /// Usable bytes per stack, rounded to whole pages.
    pub(crate) stack_size: usize,
    pub(crate) fiber_roots: bool,
    pub(crate) supervisor_interval: Duration,
    pub(crate) thread_name: String,
    pub(crate) fork_yield: u32,
    /// Quiet period before a "possible deadlock" report; `None`: never report.
    pub(crate) deadlock_report: Option<Duration>,
    pub(crate) dump_on_sigquit: bool,
    /// Compact the stacks of fibers parked this long (`fiber/compact.rs`); `None`: never.
    pub(crate) compact_parked_after: Option<Duration>,
    /// Record an execution trace into this file from the start (`scheduler/trace/`).
    pub(crate) trace: Option<std::path::PathBuf>,
}

/// Where carriers run (`Builder::pin_carriers`, `VT_PIN_CARRIERS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Affinity {
    /// Each carrier pinned to one CPU, until that CPU turns out to be shared with other work:
    /// then it floats (`scheduler/affinity.rs`). The default.
    Adaptive,
    /// Each carrier pinned to one CPU, whatever else runs there.
    Pinned,
    /// No carrier pinned: the OS places them.
    Floating,
}
