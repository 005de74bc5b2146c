//! The carrier's caches of stacks, coroutines and fiber records: taken and given back on
//! every spawn, first run and finish, so they are per carrier and need no lock.

use super::*;

impl Carrier {
    /// A stack of `class`: from the local cache for the runtime's default class.
    #[inline(always)]
    pub(crate) fn take_stack(&self, class: &'static SizeClass) -> io::Result<FiberStack> {
        // SAFETY: the cache is touched only by this thread, in short sections that do not
        // re-enter (no switch point, no user code).
        let cache = unsafe { &mut *self.stacks.get() };
        if !std::ptr::eq(class, self.rt.stacks) || cache.is_empty() {
            return self.take_stack_slow(class);
        }
        bump(&self.slot().stats.stack_hits, 1);
        // Only in a run of takes (a burst of first runs, as in W6 and W7) is the next stack
        // about to be used; when takes and gives alternate (short fibers back to back: W1,
        // W3) the next take gets back the stack just given, already hot.
        if self.taking.replace(true) && cache.len() > 1 {
            cache[cache.len() - 2].prefetch_top();
        }
        Ok(cache.pop().expect("checked non-empty"))
    }

    /// `take_stack` for another size class, or with an empty cache (refilled in a batch).
    #[cold]
    #[inline(never)]
    pub(super) fn take_stack_slow(&self, class: &'static SizeClass) -> io::Result<FiberStack> {
        if !std::ptr::eq(class, self.rt.stacks) {
            return class.take();
        }
        // SAFETY: as in `take_stack`.
        let cache = unsafe { &mut *self.stacks.get() };
        bump(&self.slot().stats.stack_misses, 1);
        class.take_batch(cache, STACK_CACHE / 2);
        match cache.pop() {
            Some(s) => Ok(s),
            None => class.take(),
        }
    }

    /// An unused fiber record: from the local cache, else a batch from the shared pool, else new.
    #[inline]
    pub(crate) fn alloc_record(&self) -> NonNull<FiberRecord> {
        // SAFETY: the cache is touched only by this thread, in short non-reentrant sections.
        let cache = unsafe { &mut *self.records.get() };
        if let Some(r) = cache.pop() {
            // The next spawn's record: `init` writes all of it, and after a burst of spawns
            // the pool's records have gone cold (W1 cycles through 10,000 of them per op).
            if let Some(next) = cache.last() {
                let p = next.as_ptr() as usize;
                for line in 0..std::mem::size_of::<FiberRecord>().div_ceil(64) {
                    crate::platform::prefetch(p + line * 64);
                }
            }
            return r;
        }
        self.rt.take_records(cache, RECORD_CACHE / 2);
        cache.pop().unwrap_or_else(|| self.rt.roots.alloc(self.index, self.rt.stacks, cache))
    }

    /// Takes an unused record into the local cache (half the cache goes to the shared pool
    /// when it is full).
    pub(crate) fn give_record(&self, r: NonNull<FiberRecord>) {
        // SAFETY: as in `alloc_record`.
        let cache = unsafe { &mut *self.records.get() };
        if cache.len() >= RECORD_CACHE {
            self.rt.give_records(cache.drain(..RECORD_CACHE / 2));
        }
        cache.push(r);
    }

    /// Makes sure a stack of `class` can be had for a fiber about to be spawned here.
    #[inline]
    pub(crate) fn ensure_stack(&self, class: &'static SizeClass) -> io::Result<()> {
        if !std::ptr::eq(class, self.rt.stacks) {
            return class.ensure_available();
        }
        // SAFETY: as in `take_stack`.
        if unsafe { !(*self.stacks.get()).is_empty() } {
            return Ok(());
        }
        self.refill_stacks(class)
    }

    /// `ensure_stack` with an empty cache: one stack through it, which refills it in a batch.
    #[cold]
    #[inline(never)]
    pub(super) fn refill_stacks(&self, class: &'static SizeClass) -> io::Result<()> {
        let s = self.take_stack(class)?;
        self.give_stack(s);
        Ok(())
    }

    #[inline(always)]
    pub(super) fn give_stack(&self, s: FiberStack) {
        // SAFETY: as in `take_stack`.
        let cache = unsafe { &mut *self.stacks.get() };
        if !std::ptr::eq(s.class(), self.rt.stacks) || cache.len() >= STACK_CACHE {
            return self.give_stack_slow(s);
        }
        self.taking.set(false);
        cache.push(s);
    }

    /// `give_stack` for another size class (dropping it returns it to its own pool), or with
    /// a full cache (half of it goes back to the shared pool).
    #[cold]
    #[inline(never)]
    pub(super) fn give_stack_slow(&self, s: FiberStack) {
        if !std::ptr::eq(s.class(), self.rt.stacks) {
            return;
        }
        self.taking.set(false);
        // SAFETY: as in `take_stack`.
        let cache = unsafe { &mut *self.stacks.get() };
        self.rt.stacks.give_batch(cache.drain(..STACK_CACHE / 2));
        cache.push(s);
    }

    /// A coroutine for a fiber of `class` at its first run: a finished fiber's, suspended
    /// between fibers, else a new one on a stack from the cache.
    #[inline(always)]
    pub(super) fn take_coroutine(&self, class: &'static SizeClass) -> io::Result<Co> {
        // SAFETY: as in `take_stack`.
        let cache = unsafe { &mut *self.coroutines.get() };
        if std::ptr::eq(class, self.rt.stacks) {
            if let Some(co) = cache.pop() {
                bump(&self.slot().stats.stack_hits, 1);
                return Ok(co);
            }
        }
        self.take_stack(class).map(new_coroutine)
    }

    /// A finished fiber's coroutine: kept for the next fiber if it can run one (the runtime's
    /// stack class, room in the cache), else its stack goes back.
    #[inline(always)]
    pub(super) fn give_coroutine(&self, co: Co, class: &'static SizeClass) {
        // SAFETY: as in `take_stack`.
        let cache = unsafe { &mut *self.coroutines.get() };
        if !co.done() && std::ptr::eq(class, self.rt.stacks) && cache.len() < COROUTINE_CACHE {
            cache.push(co);
        } else {
            self.give_stack(retire_coroutine(co));
        }
    }

    /// Shutdown: hand every queued fiber to the injector (the runtime's drop unwinds them) and
    /// the stack cache back to the pool.
    pub(super) fn exit(&self) {
        if self.searching.replace(false) {
            self.rt.idle.stop_search();
        }
        self.flush_to_injector();
        // SAFETY: as in `take_stack`; no fiber runs any more.
        let cache = unsafe { &mut *self.stacks.get() };
        // SAFETY: as in `take_stack`.
        let coroutines = unsafe { &mut *self.coroutines.get() };
        cache.extend(coroutines.drain(..).map(retire_coroutine));
        self.rt.stacks.give_batch(cache.drain(..));
        // SAFETY: as in `alloc_record`.
        let records = unsafe { &mut *self.records.get() };
        self.rt.give_records(records.drain(..));
    }
}

/// The stack of a coroutine that has finished its last fiber (suspended with `Finished`, or
/// returned), without resuming it to return: its stack holds only `fiber_loop`'s frame and
/// corosensei's entry frames, with nothing to drop, so it can be abandoned where it stands.
#[inline]
pub(super) fn retire_coroutine(mut co: Co) -> FiberStack {
    // SAFETY: the coroutine is suspended at `fiber_loop`'s `Finished` (or done): the frames on
    // its stack own nothing with a destructor (a record pointer and references), which is
    // `force_reset`'s condition.
    unsafe { co.force_reset() };
    co.into_stack()
}

/// `co.take()` for a coroutine that has just returned, read a word at a time. The switch back
/// from the fiber has just written its saved stack pointer with an 8-byte store, and `take`
/// copies the coroutine with 16-byte loads: a load that spans that store cannot be forwarded
/// from it and waits for it to reach the cache (W1's profile had 15% of the carrier loop's
/// samples there). Word loads are each forwarded from the store that wrote them.
///
/// # Safety
/// The caller has exclusive access to the coroutine.
#[inline(always)]
pub(super) unsafe fn take_finished(co: &mut Option<crate::fiber::Co>) -> Option<crate::fiber::Co> {
    use std::mem::{MaybeUninit, align_of, size_of};
    type Slot = Option<crate::fiber::Co>;
    const WORDS: usize = size_of::<Slot>() / size_of::<usize>();
    const _: () =
        assert!(size_of::<Slot>() % size_of::<usize>() == 0 && align_of::<Slot>() >= align_of::<usize>());
    // Words as `MaybeUninit`: a padding byte (corosensei's layout is its own) is copied as
    // it is, never read as an integer.
    let src = (co as *mut Slot).cast::<MaybeUninit<usize>>();
    let mut out = MaybeUninit::<Slot>::uninit();
    let dst = out.as_mut_ptr().cast::<MaybeUninit<usize>>();
    for i in 0..WORDS {
        // SAFETY: `i < WORDS` words lie within both, which are word-aligned (the asserts
        // above); volatile keeps LLVM from merging them into wider loads.
        unsafe { dst.add(i).write(src.add(i).read_volatile()) };
    }
    // SAFETY: the slot's value now lives in `out`: overwrite it without dropping it. `out`
    // holds a bitwise copy of a valid value.
    unsafe {
        (co as *mut Slot).write(None);
        out.assume_init()
    }
}
