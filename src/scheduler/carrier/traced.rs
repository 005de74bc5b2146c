//! The carrier's trace hooks, out of line: each call site keeps one load and one branch
//! (`CarrierSlot::tracing`), and what a running trace records is built here (`trace/`).

use super::*;
use crate::scheduler::trace::{BY_THREAD, BY_TIMER, End};

impl Carrier {
    /// The id of the fiber running here, or 0 between fibers.
    fn current_id(&self) -> u64 {
        let me = self.current.get();
        // SAFETY: the fiber running on this carrier: live while it runs.
        if me.is_null() { 0 } else { unsafe { (*me).id().as_u64() } }
    }

    #[cold]
    #[inline(never)]
    pub(super) fn trace_spawn(&self, f: *const FiberRecord) {
        let Some(ring) = self.slot().tracing() else { return };
        // SAFETY: the caller holds a reference to the record.
        let f = unsafe { &*f };
        trace::spawned(&mut |e| ring.push(e), f, self.current_id());
    }

    #[cold]
    #[inline(never)]
    pub(super) fn trace_wake(&self, f: *const FiberRecord, wake: Wake) {
        let Some(ring) = self.slot().tracing() else { return };
        // SAFETY: the caller holds a reference to the record.
        let f = unsafe { &*f };
        let by = self.current_id();
        let how = match wake {
            Wake::Timer => BY_TIMER,
            _ if by == 0 => BY_THREAD,
            _ => 0,
        };
        ring.push(trace::woken(f, by, how));
    }

    /// A run slice starts: its time and the resumes before it, for `trace_slice`.
    #[cold]
    #[inline(never)]
    pub(super) fn trace_begin(&self) {
        self.slice_start.set(trace::now());
        self.slice_resumes.set(self.progress.get());
    }

    #[cold]
    #[inline(never)]
    pub(super) fn trace_slice(&self, f: *const FiberRecord, after: Suspend) {
        // SAFETY: the caller holds the fiber's run reference.
        let f = unsafe { &*f };
        let start = self.slice_start.replace(0);
        let resumes_before = self.slice_resumes.get();
        // A trace stopped while the fiber ran: its slice is not recorded.
        let Some(ring) = self.slot().tracing() else { return };
        let end = match after {
            Suspend::Yield => End::Yield,
            Suspend::Park => End::Park,
            Suspend::Finished => End::Finish,
        };
        trace::slice(ring, f, start, end, self.progress.get() - resumes_before);
    }
}

/// The panic hook saw fiber `id` panic on this thread: a carrier's, if a trace runs there.
pub(crate) fn trace_panic(id: u64) {
    let c = here();
    if c.is_null() {
        return;
    }
    // SAFETY: a non-null carrier pointer is this thread's live carrier; used before any switch.
    if let Some(ring) = unsafe { &*c }.slot().tracing() {
        ring.push(Event::new(Kind::Panic, id, 0, 0));
    }
}
