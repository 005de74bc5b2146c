//! The stop state that a fiber record (`FiberRecord::stop`, `shield`, `deadlines`) and a plain
//! thread (`context.rs`) keep: the request bits, the chain of open `timeout` scopes, and a plain
//! thread's copy of both. Data only, below `context.rs`, which keeps a plain thread's copy in a
//! thread-local; `stop.rs` acts on it, `cancel.rs` asks for it.

use std::ptr;
use std::time::Instant;

/// `FiberRecord::stop`: the whole fiber was asked to stop.
pub(crate) const CANCEL: u8 = 1;
/// `FiberRecord::stop`: at least one `timeout` scope is open on the fiber's stack.
pub(crate) const DEADLINE: u8 = 2;

/// One open `timeout`, in its caller's frame, linked to the next one out.
pub(crate) struct DeadlineScope {
    pub(super) at: Instant,
    /// Depth of `uncancellable` sections when it opened: a section opened inside it defers it.
    pub(super) shield: u32,
    pub(super) outer: *const DeadlineScope,
}

/// A plain thread's stop state: deadlines and sections only (a plain thread is never cancelled
/// as a whole).
#[derive(Clone, Copy)]
pub(crate) struct PlainStop {
    pub(crate) deadlines: *const DeadlineScope,
    pub(crate) shield: u32,
}

impl PlainStop {
    pub(crate) const NONE: PlainStop = PlainStop { deadlines: ptr::null(), shield: 0 };
}
