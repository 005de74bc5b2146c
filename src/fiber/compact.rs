//! Stack compaction: a fiber parked for long gives back the memory of its stack.
//!
//! A parked fiber costs at least one resident stack page (4 KiB) although its live frames are
//! usually a kilobyte or two. The supervisor (`Compactor::run_if_due`) finds fibers parked for
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

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::stack::ARENAS;
use super::{FiberRecord, FiberRef, PARKED, STAGE_SAVED};
use crate::runtime::context;
use crate::scheduler::{Shared, Wake, bump};

/// Bytes copied below the deepest byte the switch was measured to write (`red_zone`), in case.
const SLACK: usize = 64;

/// A switch that writes deeper than this below the recorded stack pointer is not one this
/// module understands: compaction stays off.
const MAX_RED_ZONE: usize = 2048;

/// The largest live part compacted. Compaction gives back every page of the stack and keeps
/// the live bytes, so it saves the unused part of the live part's lowest page plus any page
/// below (on average a few KiB), whatever the live part's size, while the copies grow with it:
/// up to 4 pages they stay cheap next to a park that lasted `after` (debug builds need that
/// much: their frames are several times larger).
pub(crate) const MAX_SAVED: usize = 16 * 1024;

/// Fibers held claimed at once: an unpark of one of them waits for the whole batch (copies and
/// one `madvise` per run), so a batch stays well under a millisecond.
const BATCH: usize = 64;

/// Candidates (fibers parked for long enough) per supervisor tick at most: a pass over a
/// million parked fibers would otherwise hold the supervisor (and its blocked-carrier
/// detection) for a second or more. The walk goes on from where it stopped at the next tick.
const BUDGET: usize = 4096;

/// The live part of a compacted fiber's stack: `bytes` belong at `at..top of the stack`. Kept
/// in the fiber's stage (`STAGE_SAVED`).
#[derive(Debug)]
pub(crate) struct SavedStack {
    at: usize,
    bytes: Box<[u8]>,
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
    *ZONE.get_or_init(|| {
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

/// Counters the compactor writes (single writer: the supervisor), summed into `Metrics`.
#[derive(Debug, Default)]
pub(crate) struct CompactionStats {
    pub(crate) compactions: AtomicU64,
    pub(crate) saved_bytes: AtomicU64,
    pub(crate) releases: AtomicU64,
    /// Unparks that found the fiber held by the compactor (it scheduled them when it let go).
    pub(crate) unparks_met: AtomicU64,
}

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

/// One claimed fiber of a batch.
struct Claimed {
    fiber: FiberRef,
    /// Its stack's usable part.
    low: usize,
    top: usize,
}

/// The supervisor's compaction state.
pub(crate) struct Compactor {
    after: Duration,
    /// Bytes below a parked fiber's recorded stack pointer that are copied too (`red_zone`).
    red_zone: usize,
    /// Earliest next pass.
    next: Instant,
    /// Parks counted over all carriers when the last pass started: a pass finds nothing new
    /// unless some fiber parked since, or the last pass left fibers too young to compact.
    parks_seen: u64,
    young: bool,
    /// Where a pass that ran out of budget stopped in the roots: (shard, index).
    cursor: Option<(usize, usize)>,
    batch: Vec<Claimed>,
    chunk: Vec<std::ptr::NonNull<FiberRecord>>,
    /// Fibers parked for long enough, with the stack pointer they parked at (read unclaimed,
    /// so only a hint for the order: the claim reads it again).
    candidates: Vec<(usize, std::ptr::NonNull<FiberRecord>)>,
}

impl Compactor {
    /// `None` when the runtime does not compact.
    pub(crate) fn new(rt: &Shared) -> Option<Compactor> {
        let after = rt.config.compact_parked_after?;
        Some(Compactor {
            after,
            red_zone: red_zone()?,
            next: later(after),
            parks_seen: 0,
            young: false,
            cursor: None,
            batch: Vec::with_capacity(BATCH),
            chunk: Vec::new(),
            candidates: Vec::new(),
        })
    }

    /// When the next pass is due, or `None` if it would find nothing (nothing parked since the
    /// last one, and nothing left over).
    pub(crate) fn due(&self, rt: &Shared) -> Option<Instant> {
        (self.young || self.cursor.is_some() || parks(rt) != self.parks_seen).then_some(self.next)
    }

    /// Runs a pass if one is due.
    pub(crate) fn run_if_due(&mut self, rt: &Shared) {
        if self.due(rt).is_some_and(|at| at <= Instant::now()) {
            self.pass(rt);
        }
    }

    /// One walk over every fiber record (or over the next `BUDGET` candidates of one):
    /// compacts the fibers parked for longer than `after`, in the order of their stacks'
    /// addresses, so that a batch holds neighbours and their release takes few calls.
    fn pass(&mut self, rt: &Shared) {
        let mut cursor = match self.cursor.take() {
            Some(c) => c,
            None => {
                self.parks_seen = parks(rt);
                self.young = false;
                (0, 0)
            }
        };
        let now = rt.ns_since_epoch(Instant::now());
        let after = self.after.as_nanos().min(u64::MAX as u128) as u64;
        // `since` is the coarse clock at the park (late by up to two supervisor ticks, so a
        // fiber may be compacted that much early).
        let old = |r: &FiberRecord| now.saturating_sub(r.since.load(Ordering::Relaxed)) >= after;
        let mut chunk = std::mem::take(&mut self.chunk);
        let mut candidates = std::mem::take(&mut self.candidates);
        while candidates.len() < BUDGET && rt.roots.chunk(&mut cursor, &mut chunk) {
            for &p in &chunk {
                // SAFETY: records are freed only with the runtime's state, which the
                // supervisor's reference keeps alive; only atomics are read before the claim.
                let r = unsafe { p.as_ref() };
                if r.state_word() != PARKED {
                    continue; // running, runnable, done, unused, or compacted already
                }
                if !old(r) {
                    self.young = true;
                    continue;
                }
                candidates.push((r.parked_sp.load(Ordering::Relaxed), p));
            }
        }
        candidates.sort_unstable_by_key(|&(sp, _)| sp);
        for (_, p) in candidates.drain(..) {
            // SAFETY: as above.
            let r = unsafe { p.as_ref() };
            if !r.try_begin_compaction() {
                continue; // woken meanwhile
            }
            // SAFETY: the claim succeeded on a parked fiber, which holds a reference to itself
            // until it finishes, and it cannot run until we let go.
            let fiber = unsafe { FiberRef::clone_from_ptr(p.as_ptr()) };
            if old(&fiber) {
                self.save(rt, fiber);
            } else {
                // It woke and parked again since the walk saw it.
                self.young = true;
                let_go(rt, fiber);
            }
        }
        self.chunk = chunk;
        self.candidates = candidates;
        self.flush(rt);
        if cursor.0 < rt.roots.shards() {
            // The budget ran out: more next tick, from here.
            self.cursor = Some(cursor);
            self.next = later(rt.config.supervisor_interval);
        } else {
            self.next = later(self.after.max(rt.config.supervisor_interval));
        }
    }

    /// Copies out the live part of a claimed fiber's stack, or lets it go if it must not (or
    /// need not) be compacted.
    fn save(&mut self, rt: &Shared, fiber: FiberRef) {
        // Read again under the claim (the claim's Acquire orders it after the park).
        let sp = fiber.parked_sp.load(Ordering::Relaxed);
        let range = ARENAS.usable_range(sp);
        let eligible = match range {
            Some((low, top)) if fiber.lent.get() == 0 => {
                let at = sp.saturating_sub(self.red_zone).max(low) & !15;
                (top - at <= MAX_SAVED).then_some((low, top, at))
            }
            _ => None,
        };
        let Some((low, top, at)) = eligible else {
            let_go(rt, fiber);
            return;
        };
        // SAFETY: `at..top` lies in the usable part of this fiber's stack (checked above), which
        // is mapped read-write; the fiber is parked and claimed, so nobody writes it meanwhile
        // (the contract of `compact_parked_after`; see the module doc).
        let live = unsafe { std::slice::from_raw_parts(at as *const u8, top - at) };
        let saved = SavedStack { at, bytes: live.into() };
        bump(&rt.compaction.saved_bytes, saved.bytes.len() as u64);
        // A parked fiber's stage is empty: its closure was taken at its first run, and its result
        // is put there only after its last park (`fiber_loop` publishes it and suspends without
        // parking; a result dropped by the fiber is taken out before its destructor, which may
        // park). SAFETY: so, and the claim gives us the record as a carrier has it.
        unsafe { fiber.put_stage(saved, STAGE_SAVED) };
        self.batch.push(Claimed { fiber, low, top });
        if self.batch.len() == BATCH {
            self.flush(rt);
        }
    }

    /// Releases the stacks of the batch, one `madvise` per run of adjacent slots (stacks carved
    /// one after another from an arena are neighbours, guard pages between them), and lets the
    /// fibers go.
    fn flush(&mut self, rt: &Shared) {
        self.batch.sort_unstable_by_key(|c| c.low);
        let page = crate::platform::page_size();
        let mut i = 0;
        while i < self.batch.len() {
            let start = self.batch[i].low;
            let mut end = self.batch[i].top;
            i += 1;
            // The next slot's guard page starts where this one's stack ends.
            while i < self.batch.len() && self.batch[i].low == end + page {
                end = self.batch[i].top;
                i += 1;
            }
            // A failed call leaves the memory as it was: restoring then rewrites the same bytes.
            // SAFETY: `start..end` covers the usable parts of claimed, parked fibers' stacks
            // (live parts saved above, the rest dead) and the guard pages between them, which
            // stay guards; the fibers cannot run until `end_compaction` below.
            let _ = unsafe { crate::platform::release(start, end - start) };
            bump(&rt.compaction.releases, 1);
        }
        for c in self.batch.drain(..) {
            bump(&rt.compaction.compactions, 1);
            if c.fiber.end_compaction(true) {
                // An unpark came while we held it; it left the scheduling to us.
                bump(&rt.compaction.unparks_met, 1);
                // SAFETY: `end_compaction` returned true: we made the fiber runnable. Our own
                // reference (`c.fiber`) drops with `c`.
                let run = unsafe { FiberRef::take_parked_ref(&c.fiber) };
                crate::scheduler::schedule(run, Wake::Unpark);
            }
        }
    }
}

/// `d` from now, or a year from now if that overflows (an `after` of `Duration::MAX` means
/// "never", in practice).
fn later(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d).unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

/// Lets go of a claimed fiber left as it was, scheduling it if an unpark came meanwhile.
fn let_go(rt: &Shared, fiber: FiberRef) {
    if fiber.end_compaction(false) {
        bump(&rt.compaction.unparks_met, 1);
        // SAFETY: `end_compaction` returned true: we made the fiber runnable; `fiber`, our own
        // reference, drops on return.
        let run = unsafe { FiberRef::take_parked_ref(&fiber) };
        crate::scheduler::schedule(run, Wake::Unpark);
    }
}

/// Parks so far, summed over the carriers.
fn parks(rt: &Shared) -> u64 {
    rt.slots[..rt.started()].iter().map(|s| s.stats.parks.load(Ordering::Relaxed)).sum()
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
                    crate::park();
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
