//! The carrier's trace hooks, out of line: each call site keeps one load and one branch
//! (`CarrierSlot::tracing`), and what a running trace records is built here (`trace/`).

use super::*;
use crate::scheduler::shared::TRACING;
use crate::scheduler::trace::{BY_THREAD, BY_TIMER, End};

impl Carrier {
    /// The id of the fiber running here, or 0 between fibers.
    fn current_id(&self) -> u64 {
        let me = self.current.get();
        // SAFETY: the fiber running on this carrier: live while it runs.
        if me.is_null() { 0 } else { unsafe { (*me).id().as_u64() } }
    }

    /// Resumes on this carrier so far: its slot's `progress`, which only it writes.
    fn resumes(&self) -> u64 {
        self.slot().progress.load(Ordering::Relaxed)
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
        if self.resumes() == self.trace_mark_progress.get() {
            // No resume since the last slice ended: a wake between slices (a joiner woken as
            // its child finishes, a timer): the next slice, perhaps the woken's, starts after it.
            self.trace_mark.set(trace::now());
        }
        let how = match wake {
            Wake::Timer => BY_TIMER,
            _ if by == 0 => BY_THREAD,
            _ => 0,
        };
        ring.push(trace::woken(f, by, how));
    }

    /// A run slice ended (`switched_out`, a trace running). Its start is not noted on the way
    /// in, which would cost every switch a test: it is the previous slice's end on this carrier
    /// (or the end of its idle wait, or the trace's start), so a slice includes the scheduler's
    /// few hundred instructions before it. `resumes()` then gives the resumes.
    pub(super) fn trace_slice(&self, f: &FiberRecord, after: Suspend) {
        let end = trace::now();
        let start = self.trace_mark.replace(end);
        let resumes_before = self.trace_mark_progress.replace(self.resumes());
        // Acquire: the ring's `zero` was written before it was published (`set_trace`).
        let p = self.slot().trace.load(Ordering::Acquire);
        // SAFETY: a non-null pointer is a ring the recorder keeps until the runtime's state
        // (which holds this slot) is dropped (`Recorder::start`, `attach`).
        let Some(ring) = (unsafe { p.as_ref() }) else { return };
        let zero = ring.zero.load(Ordering::Relaxed);
        // A mark older than the trace is an earlier trace's: the slice ran at the start, and
        // its resumes before that are unknown (at least one).
        let (start, resumes) =
            if start < zero { (zero, 1) } else { (start, self.resumes() - resumes_before) };
        let end_kind = match after {
            Suspend::Yield => End::Yield,
            Suspend::Park => End::Park,
            Suspend::Finished => End::Finish,
        };
        trace::slice(ring, f, start, end, end_kind, resumes);
    }

    /// `search` (its queues were empty); while a trace runs, the next slice starts when the
    /// search found work, not at the last slice's end.
    pub(super) fn search_noted(&self) -> Option<FiberRef> {
        let f = self.search();
        if f.is_some() && self.slot().flags.load(Ordering::Relaxed) & TRACING != 0 {
            self.trace_mark_now();
        }
        f
    }

    /// The carrier woke from an idle wait, or found work, while a trace runs: its next slice
    /// starts here.
    pub(super) fn trace_mark_now(&self) {
        self.trace_mark.set(trace::now());
        self.trace_mark_progress.set(self.resumes());
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
