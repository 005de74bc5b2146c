//! The stage: bytes inside the fiber record that hold its closure before it runs, then its
//! result until it is joined (or, while it is parked and compacted, its saved stack), so that a
//! typical spawn allocates nothing; larger values are boxed. What it holds is `stage_kind`; how
//! to run or drop what only the spawner's types know is the record's `StageVTable`.

use std::mem::MaybeUninit;

use super::FiberRecord;

/// Bytes kept inside the record for the fiber's closure (before it runs) and then its result,
/// so that a typical spawn allocates nothing. Larger closures or results are boxed.
pub(crate) const STAGE_BYTES: usize = 48;

/// The closure-then-result slot. 16-aligned so most types fit without a box.
#[repr(C, align(16))]
pub(crate) struct StageBuf(pub(crate) [MaybeUninit<u8>; STAGE_BYTES]);

/// How to handle a stage whose types only the spawner knew.
pub(crate) struct StageVTable {
    /// Moves the closure out of the stage, runs it (on the fiber's coroutine) and puts its
    /// result in the stage.
    pub(crate) run: unsafe fn(&FiberRecord),
    /// Drops the closure without running it and completes the join with `error`.
    pub(crate) fail: unsafe fn(&FiberRecord, std::io::Error),
    /// Drops a result nobody will take. Returns true if it was a panic.
    pub(crate) drop_result: unsafe fn(&FiberRecord) -> bool,
}

/// What the stage holds.
pub(crate) const STAGE_EMPTY: u8 = 0;
pub(crate) const STAGE_CLOSURE: u8 = 1;
pub(crate) const STAGE_RESULT: u8 = 2;
/// The live part of a compacted fiber's stack (`compact::SavedStack`): the stage is empty from
/// the first run to the last, so a parked fiber's stage is free for it (no record grows).
pub(crate) const STAGE_SAVED: u8 = 3;

const fn fits_inline<X>() -> bool {
    std::mem::size_of::<X>() <= STAGE_BYTES && std::mem::align_of::<X>() <= 16
}

impl FiberRecord {
    /// Puts `x` in the stage (inline if it fits, else boxed) and records what it is.
    ///
    /// # Safety
    /// The stage must be empty, and the caller must have exclusive access to it (by the
    /// protocol of whoever calls: spawn before queuing, the fiber itself before completing).
    pub(crate) unsafe fn put_stage<X>(&self, x: X, kind: u8) {
        debug_assert_eq!(self.stage_kind.get(), STAGE_EMPTY);
        let buf = self.stage.get().cast::<u8>();
        if fits_inline::<X>() {
            // SAFETY: the buffer is large and aligned enough for X (checked above) and empty.
            unsafe { buf.cast::<X>().write(x) };
        } else {
            // SAFETY: a pointer always fits; the buffer is empty.
            unsafe { buf.cast::<*mut X>().write(Box::into_raw(Box::new(x))) };
        }
        self.stage_kind.set(kind);
    }

    /// Takes back what `put_stage::<X>` stored.
    ///
    /// # Safety
    /// The stage must hold an `X` put there by `put_stage::<X>`, and the caller must have
    /// exclusive access to it.
    pub(crate) unsafe fn take_stage<X>(&self) -> X {
        debug_assert_ne!(self.stage_kind.get(), STAGE_EMPTY);
        self.stage_kind.set(STAGE_EMPTY);
        let buf = self.stage.get().cast::<u8>();
        if fits_inline::<X>() {
            // SAFETY: an X was written here by `put_stage` and is moved out exactly once.
            unsafe { buf.cast::<X>().read() }
        } else {
            // SAFETY: a `Box<X>` pointer was written here by `put_stage`.
            *unsafe { Box::from_raw(buf.cast::<*mut X>().read()) }
        }
    }
}
