//! Stack compaction's mechanism: a fiber parked for long gives back the memory of its stack.
//! The policy (which fibers, when, in what batches) is the supervisor's:
//! `scheduler/compactor.rs`.
//!
//! A parked fiber costs at least one resident stack page (4 KiB) although its live frames are
//! usually a kilobyte or two. The supervisor (`scheduler/compactor.rs`, `Compactor::run_if_due`) finds fibers parked for
//! longer than `runtime::Builder::compact_parked_after`, claims each one on its state word
//! (`PARKED → COMPACTING`: nobody can resume it meanwhile), copies the live part of its
//! stack — from the stack pointer it parked at (`FiberRecord::parked_sp`) to the top — into a
//! heap buffer of that size, and releases the stack's pages with `MADV_DONTNEED`, one call per
//! run of adjacent stacks. The carrier that next claims the fiber sees `COMPACTED` in the word
//! its claim replaced and copies the bytes back to the same addresses before resuming it
//! (`restore_stack`); the pages fault back in as zero pages on that copy.
//!
//! ```text
//!        parked                    compacted                     resumed
//!  top ┌────────────┐            ┌────────────┐              ┌────────────┐
//!      │ live       │ ─ copy ─►  │ not        │  heap buffer │ live       │ ◄─ copy back
//!  sp ─┤  frames    │            │ resident   │  (live part) │  frames    │    (faults in
//!      │- - - - - - │ red_zone() │ (released, │              │            │     zero pages)
//!      │ dead       │            │  reads as  │              │            │
//!      │            │            │  zeros)    │              │            │
//!      ├────────────┤            ├────────────┤              ├────────────┤
//!      │ guard page │            │ guard page │              │ guard page │
//!      └────────────┘            └────────────┘              └────────────┘
//! ```
//!
//! It is sound only if nothing but the fiber itself reads or writes its stack while it is
//! parked: the runtime's own wait-list nodes, channel slots, timers and join hand-offs live on
//! the heap, and the runtime's APIs that lend a fiber's stack to others (`scope`, `join`,
//! `block_on`, `ThreadPool::scope`) mark the fiber (`FiberRecord::lent`) so that it is never
//! compacted while they run. Anything else that lends a stack (`std::thread::scope` with a `vt`
//! wait inside, raw pointers handed to another thread) is the user's to wrap in
//! [`no_compaction`]; that contract is why the setting is `unsafe`. See `arch/compaction.md`.

use std::sync::atomic::Ordering;

use super::FiberRecord;
use super::stack::ARENAS;
use super::stage::STAGE_SAVED;
use crate::fiber::context;

/// Bytes copied below the deepest byte the switch was measured to write (`red_zone`), in case.
const SLACK: usize = 64;

/// A switch that writes deeper than this below the recorded stack pointer is not one this
/// module understands: compaction stays off.
const MAX_RED_ZONE: usize = 2048;

/// The live part of a compacted fiber's stack: `bytes` belong at `at..top of the stack`. Kept
/// in the fiber's stage (`STAGE_SAVED`).
#[derive(Debug)]
pub(crate) struct SavedStack {
    pub(crate) at: usize,
    pub(crate) bytes: Box<[u8]>,
}

/// The current stack pointer (on architectures without an arm below, the address of a local,
/// which lies above it by part of the caller's frame: `red_zone` measures what lies below).
#[inline(always)]
pub(crate) fn stack_pointer() -> usize {
    let sp: usize;
    #[cfg(target_arch = "x86_64")]
    // SAFETY: reads a register; touches no memory, no flags.
    unsafe {
        std::arch::asm!("mov {}, rsp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above.
    unsafe {
        std::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    #[cfg(target_arch = "riscv64")]
    // SAFETY: as above.
    unsafe {
        std::arch::asm!("mv {}, sp", out(reg) sp, options(nomem, nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64", target_arch = "riscv64")))]
    {
        let probe = 0u8;
        sp = std::hint::black_box(&probe) as *const u8 as usize;
    }
    sp
}

/// How many bytes below the stack pointer recorded by `FiberRecord::suspend` the switch that
/// follows writes (plus `SLACK`), measured once per process; `None` if it could not be measured
/// or is implausible, and then nothing is compacted.
///
/// It depends on how `suspend`, `Yielder::suspend` and corosensei's switch were compiled
/// (on x86-64: the switch's saved stack pointer is 24 bytes below in a release build, 248 in a
/// debug build, where the calls before the switch also write 624 bytes deep), so it is measured
/// on this very code: a blank record parks on a stack painted with a pattern, and the deepest
/// byte that is no longer the pattern is the deepest the switch wrote (twice, with two
/// patterns, in case a byte was written with the pattern's value). Below the switch's saved
/// stack pointer nothing is live: the fiber resumes by popping from it.
pub(crate) fn red_zone() -> Option<usize> {
    static ZONE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *crate::platform::fork::init_once(&ZONE, || {
        let deepest = measure_switch(0xA5).zip(measure_switch(0x5A)).map(|(a, b)| a.max(b));
        let zone = deepest.map(|d| (d + SLACK).next_multiple_of(16));
        if zone.is_none_or(|z| z > MAX_RED_ZONE) {
            eprintln!(
                "virtual-threads: cannot measure how deep a fiber's switch writes below its stack \
                 pointer (got {zone:?}); stack compaction stays off"
            );
            return None;
        }
        zone
    })
}

/// Parks a blank record once on a stack painted with `paint`: how deep below its recorded
/// stack pointer the switch wrote.
fn measure_switch(paint: u8) -> Option<usize> {
    let class = super::stack::SizeClass::get(super::stack::MIN_STACK_SIZE);
    let stack = class.take().ok()?;
    let top = corosensei::stack::Stack::base(&stack).get();
    let (low, _) = ARENAS.usable_range(top - 1)?;
    // SAFETY: the usable part of a stack we own, mapped read-write, and unused.
    unsafe { std::ptr::write_bytes(low as *mut u8, paint, top - low) };
    let rec = std::ptr::NonNull::from(Box::leak(Box::new(FiberRecord::blank(class))));
    let body = move |y: &super::FiberYielder, _: *const FiberRecord| {
        // SAFETY: `rec` is freed only after this coroutine has finished (below).
        let rec = unsafe { rec.as_ref() };
        rec.set_yielder(y);
        rec.suspend(super::Suspend::Park);
    };
    let mut co: super::Co = corosensei::Coroutine::with_stack(stack, body);
    let parked =
        matches!(co.resume(std::ptr::null()), corosensei::CoroutineResult::Yield(super::Suspend::Park));
    // SAFETY: the record is ours alone: the coroutine that uses it is suspended on this thread.
    let sp = unsafe { rec.as_ref() }.parked_sp.load(Ordering::Relaxed);
    // SAFETY: as above for the stack; the coroutine is suspended, so nothing writes it.
    let painted = unsafe { std::slice::from_raw_parts(low as *const u8, top - low) };
    let deepest = painted.iter().position(|&b| b != paint).map(|i| low + i);
    if co.resume(std::ptr::null()).as_return().is_none() {
        // Cannot happen (the body returns after one park); if it did, its stack and the record
        // might still be in use: leak both rather than reuse them.
        std::mem::forget(co);
        return None;
    }
    // SAFETY: the coroutine has finished: nothing on the stack is live any more.
    let _ = unsafe { crate::platform::release(low, top - low) };
    drop(co.into_stack());
    // SAFETY: leaked from a `Box` above; the coroutine that used it has finished.
    drop(unsafe { Box::from_raw(rec.as_ptr()) });
    deepest.filter(|&d| parked && (low..=sp).contains(&d)).map(|d| sp - d)
}

/// `vt::no_compaction(|| std::thread::scope(|s| { s.spawn(|| read(&local)); }));`
///
/// Runs `f` with the calling fiber's stack exempt from compaction (see
/// [`Builder::compact_parked_after`](crate::runtime::Builder::compact_parked_after)).
///
/// Compaction assumes that nothing but a parked fiber itself touches its stack. Wrap in this
/// every section in which a fiber may park while something else can read or write its locals:
/// threads of `std::thread::scope` or `crossbeam::scope` that borrow them, a pointer to one
/// handed to another thread. `vt`'s own borrowing APIs (`scope`, `join`, `block_on`,
/// `ThreadPool::scope`) do this by themselves. Nests; on a plain thread it just runs `f`.
pub fn no_compaction<F, T>(f: F) -> T
where
    F: FnOnce() -> T,
{
    let _lent = Lent::new();
    f()
}

/// Marks the running fiber's stack as lent for as long as it lives (see `FiberRecord::lent`);
/// nothing on a plain thread.
pub(crate) struct Lent(*const FiberRecord);

impl Lent {
    pub(crate) fn new() -> Lent {
        let rec = context::current_fiber();
        if !rec.is_null() {
            // SAFETY: the running fiber's record outlives its run, and only the fiber itself
            // (or the compactor, while the fiber is parked) touches `lent`.
            let r = unsafe { &*rec };
            r.lent.set(r.lent.get() + 1);
        }
        Lent(rec)
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: dropped by the same fiber that created it (a `Lent` is a local that never
            // leaves its frame), whose record has the same address on any carrier.
            let r = unsafe { &*self.0 };
            r.lent.set(r.lent.get() - 1);
        }
    }
}

impl FiberRecord {
    /// Copies a compacted fiber's stack back to where it was. Returns the bytes copied (0 if
    /// the fiber was not compacted).
    ///
    /// # Safety
    /// The caller has exclusive access to the fiber (it claimed it, or the runtime's drop
    /// unwinds it), and saw `COMPACTED` cleared by its claim or by `take_compacted`.
    #[cold]
    #[inline(never)]
    pub(crate) unsafe fn restore_stack(&self) -> usize {
        if self.stage_kind.get() != STAGE_SAVED {
            return 0;
        }
        // SAFETY: exclusive access (the caller's precondition); the compactor's `put_stage`
        // happened before the state word handed the fiber over.
        let saved = unsafe { self.take_stage::<SavedStack>() };
        // SAFETY: `saved.at..` + len is the part of this fiber's own stack it was copied from:
        // mapped read-write (the release left the mapping), and nobody else uses it.
        unsafe {
            std::ptr::copy_nonoverlapping(saved.bytes.as_ptr(), saved.at as *mut u8, saved.bytes.len())
        };
        saved.bytes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fiber::PARKED;

    /// The real stack pointer corosensei saved when the fiber switched out: the lowest word of
    /// the suspended coroutine that points into the fiber's usable stack (its other such word,
    /// the initial stack pointer, lies near the top).
    fn saved_sp(rec: &FiberRecord, low: usize, top: usize) -> usize {
        // SAFETY: the fiber is parked and nobody unparks it until the caller is done; the
        // coroutine is a few pointer-sized fields, read here as words (test-only peeking at
        // corosensei's private layout: it changes nothing).
        let co = unsafe { rec.co_mut() }.as_ref().expect("a parked fiber has its coroutine");
        let words = std::mem::size_of_val(co) / 8;
        let base = co as *const _ as *const usize;
        (0..words)
            // SAFETY: within the coroutine's bytes, all of them initialised pointer-sized fields.
            .map(|i| unsafe { base.add(i).read_unaligned() })
            .filter(|&w| w > low && w < top)
            .min()
            .expect("the coroutine holds its saved stack pointer")
    }

    /// The calibration against the stack pointer corosensei really saved, in real fibers at
    /// several depths (it is the same code whatever the depth).
    #[test]
    fn red_zone_covers_the_switch() {
        let zone = red_zone().expect("measurable on this target");
        assert!(zone > SLACK && zone <= MAX_RED_ZONE, "zone {zone}");
        let rt = crate::Runtime::builder().carriers(1).build().unwrap();
        for depth in [0usize, 3, 40] {
            fn nest(n: usize) {
                if n == 0 {
                    crate::fiber::park::park();
                } else {
                    nest(std::hint::black_box(n - 1));
                    std::hint::black_box(n);
                }
            }
            let h = rt.spawn(move || nest(depth));
            let rec = h.fiber().record().unwrap().clone();
            while rec.state() != PARKED {
                std::thread::yield_now();
            }
            let sp = rec.parked_sp.load(Ordering::Relaxed);
            let (low, top) = ARENAS.usable_range(sp).expect("parked on a pooled stack");
            let real = saved_sp(&rec, low, top);
            // The measured zone covers at least the words the switch saved.
            assert!(
                sp - zone + SLACK <= real && real <= sp,
                "recorded {sp:#x}, saved {real:#x}, zone {zone}"
            );
            h.fiber().unpark();
            h.join().unwrap();
        }
    }
}
