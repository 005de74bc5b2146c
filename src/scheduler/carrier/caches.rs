//! The carrier's caches of stacks, coroutines and fiber records: taken and given back on
//! every spawn, first run and finish, so they are per carrier and need no lock. Its home queue
//! and spill buffer live beside them, behind the same `UnsafeCell` (`Caches`).

use super::*;

/// What only the carrier's own thread touches, in short sections: the home queue and the
/// caches. One `UnsafeCell` holds them all; each field is borrowed through its accessor
/// (`home_queue()`, `stack_cache()`, ...), which is the one place that reaches inside.
///
/// Why that is sound: a `Carrier` lives on its thread's stack and is reached only from that
/// thread (the carrier's loop, and fibers running on it through `here()`), so no two threads
/// touch a field. On the one thread, a field is borrowed only inside a method that neither
/// switches (no switch point: no fiber runs while it is borrowed) nor runs user code, and
/// that does not call another method borrowing the same field; so no two borrows of one field
/// overlap. Distinct fields are disjoint places, borrowed through raw-pointer projections that
/// never make a reference to the whole. Debug builds check the last condition at run time
/// (`Borrowed`): a second borrow of a field panics. The accessors are private to `carrier/`
/// (`pub(super)`), which is the boundary of this argument: no code outside it borrows a field.
pub(super) struct Caches {
    /// Started fibers at home here, runnable, each with the deque's `pushed()` count when it
    /// was queued: it runs once everything queued in the deque before it has left (`home_due`),
    /// so the two queues together run in arrival order, as one deque did when fibers migrated.
    /// Private: only this carrier ever runs them. It keeps its capacity, so a steady state
    /// allocates nothing.
    pub(super) home: HomeQueue<FiberRef>,
    pub(super) stacks: Vec<FiberStack>,
    /// Coroutines of the runtime's default stack class, each suspended between two fibers.
    pub(super) coroutines: Vec<Co>,
    /// Unused records, each holding a reference to this carrier's runtime (`FiberRecord`'s
    /// `runtime`): a spawn takes one with its fiber's runtime reference, and a fiber that ends
    /// here leaves its reference in the record, so neither counts references (before, a
    /// spawn took one from `stock` and the record's recycling put it back, ~15 instructions per
    /// fiber: `arch/performance.md`). Records going to or coming from the runtime's pool, which
    /// hold none, give up or get theirs in a batch, one atomic operation each way.
    pub(super) records: Vec<NonNull<FiberRecord>>,
    /// A spill's fibers on their way to the injector: one buffer, reused, so a spill never
    /// allocates. Empty between spills.
    pub(super) spill: Batch,
}

/// Per field of `Caches`, whether it is borrowed now: the re-entrancy check of debug builds.
/// Empty in release builds.
#[derive(Default)]
pub(super) struct Borrowed {
    home: Flag,
    stacks: Flag,
    coroutines: Flag,
    records: Flag,
    spill: Flag,
}

#[derive(Default)]
struct Flag(#[cfg(debug_assertions)] Cell<bool>);

/// A borrow of one field of `Caches`, for as long as it lives.
pub(super) struct CacheMut<'a, T> {
    value: &'a mut T,
    #[cfg(debug_assertions)]
    flag: &'a Flag,
}

impl<'a, T> CacheMut<'a, T> {
    #[inline(always)]
    fn new(value: &'a mut T, flag: &'a Flag, field: &str) -> CacheMut<'a, T> {
        #[cfg(debug_assertions)]
        {
            assert!(!flag.0.replace(true), "the carrier's `{field}` cache borrowed twice at once");
            CacheMut { value, flag }
        }
        #[cfg(not(debug_assertions))]
        {
            let _ = (flag, field);
            CacheMut { value }
        }
    }
}

impl<T> std::ops::Deref for CacheMut<'_, T> {
    type Target = T;
    #[inline(always)]
    fn deref(&self) -> &T {
        self.value
    }
}

impl<T> std::ops::DerefMut for CacheMut<'_, T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut T {
        self.value
    }
}

#[cfg(debug_assertions)]
impl<T> Drop for CacheMut<'_, T> {
    fn drop(&mut self) {
        self.flag.0.set(false);
    }
}

/// One accessor per field of `Caches`: the only code that reaches inside the cell.
macro_rules! cache_accessors {
    ($($accessor:ident => $field:ident: $t:ty),* $(,)?) => {
        impl Carrier {
            $(
                #[inline(always)]
                pub(super) fn $accessor(&self) -> CacheMut<'_, $t> {
                    // SAFETY: see `Caches`: this thread alone, no overlapping borrow of the
                    // field; the projection makes no reference to the rest of the cell.
                    let value = unsafe { &mut *(&raw mut (*self.caches.get()).$field) };
                    CacheMut::new(value, &self.borrowed.$field, stringify!($field))
                }
            )*
        }
    };
}

cache_accessors! {
    home_queue => home: HomeQueue<FiberRef>,
    stack_cache => stacks: Vec<FiberStack>,
    coroutine_cache => coroutines: Vec<Co>,
    record_cache => records: Vec<NonNull<FiberRecord>>,
    spill_buffer => spill: Batch,
}

impl Carrier {
    /// A stack of `class`: from the local cache for the runtime's default class.
    #[inline(always)]
    pub(crate) fn take_stack(&self, class: &'static SizeClass) -> io::Result<FiberStack> {
        let mut cache = self.stack_cache();
        if !std::ptr::eq(class, self.rt.stacks) || cache.is_empty() {
            drop(cache);
            return self.take_stack_slow(class);
        }
        bump(&self.slot().stats.stack_hits, 1);
        // Only in a run of takes (a burst of first runs) is the next stack about to be used;
        // when takes and gives alternate (short fibers back to back) the next take gets back
        // the stack just given, already hot.
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
        let mut cache = self.stack_cache();
        bump(&self.slot().stats.stack_misses, 1);
        class.take_batch(&mut cache, STACK_CACHE / 2);
        match cache.pop() {
            Some(s) => Ok(s),
            None => class.take(),
        }
    }

    /// An unused fiber record, holding a reference to this carrier's runtime for the fiber
    /// (`Init::runtime` is then `None`): from the local cache, else a batch from the shared
    /// pool, else new.
    #[inline]
    pub(crate) fn alloc_record(&self) -> NonNull<FiberRecord> {
        let mut cache = self.record_cache();
        if let Some(r) = cache.pop() {
            // The next spawn's record: `init` writes all of it, and after a burst of spawns
            // the pool's records have gone cold (a fork-join cycles through thousands).
            if let Some(next) = cache.last() {
                let p = next.as_ptr() as usize;
                for line in 0..std::mem::size_of::<FiberRecord>().div_ceil(64) {
                    crate::platform::prefetch(p + line * 64);
                }
            }
            return r;
        }
        drop(cache);
        self.refill_records()
    }

    /// `alloc_record` with an empty cache: a batch from the shared pool (or a new slab), each
    /// record given a runtime reference, counted with one atomic addition for the batch.
    #[cold]
    #[inline(never)]
    fn refill_records(&self) -> NonNull<FiberRecord> {
        let mut cache = self.record_cache();
        self.rt.take_records(&mut cache, RECORD_CACHE / 2);
        if cache.is_empty() {
            let first =
                self.rt.roots.alloc(self.rt.roots.carrier_shard(self.index), self.rt.stacks, &mut cache);
            cache.push(first);
        }
        self.rt.acquire_stock(cache.len());
        for r in cache.iter() {
            // SAFETY: from the pool or new: unused, ours, and holding no reference; one unit
            // of the stock just acquired is its.
            unsafe { r.as_ref().set_runtime(self.rt.take_from_stock()) };
        }
        cache.pop().expect("refilled")
    }

    /// Takes an unused record of this carrier's runtime, holding its runtime reference, into
    /// the local cache (half the cache goes to the shared pool when it is full).
    #[inline]
    pub(crate) fn give_record(&self, r: NonNull<FiberRecord>) {
        let mut cache = self.record_cache();
        // Full at its capacity (`RECORD_CACHE`, never grown): tested so, the push's own
        // test of the capacity is known to pass and goes.
        if cache.len() == cache.capacity() {
            // The slow half borrows the cache itself.
            drop(cache);
            self.give_records_back();
            cache = self.record_cache();
        }
        cache.push(r);
    }

    /// A full record cache gives half of itself to the shared pool.
    #[cold]
    #[inline(never)]
    pub(super) fn give_records_back(&self) {
        let mut cache = self.record_cache();
        self.give_records_to_pool(&mut cache, RECORD_CACHE / 2);
    }

    /// The first `n` records of the local cache go to the shared pool, whose records hold no
    /// runtime reference: theirs are given back with one atomic subtraction for the batch. (A
    /// loop of its own: taken inside the pool's `extend`, the copy became a push per record.)
    fn give_records_to_pool(&self, cache: &mut Vec<NonNull<FiberRecord>>, n: usize) {
        for r in &cache[..n] {
            // SAFETY: in the local cache: unused, ours, holding a reference to our runtime.
            std::mem::forget(unsafe { r.as_ref().take_runtime() });
        }
        self.rt.give_records(cache.drain(..n));
        // The carrier's own reference keeps the count above zero.
        self.rt.release_stock(n);
    }

    /// Makes sure a stack of `class` can be had for a fiber about to be spawned here.
    #[inline]
    pub(crate) fn ensure_stack(&self, class: &'static SizeClass) -> io::Result<()> {
        if !std::ptr::eq(class, self.rt.stacks) {
            return class.ensure_available();
        }
        if !self.stack_cache().is_empty() {
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
        let mut cache = self.stack_cache();
        if !std::ptr::eq(s.class(), self.rt.stacks) || cache.len() >= STACK_CACHE {
            drop(cache);
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
        let mut cache = self.stack_cache();
        self.rt.stacks.give_batch(cache.drain(..STACK_CACHE / 2));
        cache.push(s);
    }

    /// A coroutine for a fiber of `class` at its first run: a finished fiber's, suspended
    /// between fibers, else a new one on a stack from the cache.
    #[inline(always)]
    pub(super) fn take_coroutine(&self, class: &'static SizeClass) -> io::Result<Co> {
        let mut cache = self.coroutine_cache();
        if std::ptr::eq(class, self.rt.stacks) {
            if let Some(co) = cache.pop() {
                bump(&self.slot().stats.stack_hits, 1);
                return Ok(co);
            }
        }
        self.take_stack(class).map(new_coroutine)
    }

    /// `take_coroutine` and `bind` for the common case: a cached coroutine of the runtime's
    /// stack class goes from the cache straight into the fiber's slot (through `Co` values and
    /// an `io::Result`, three of its five words were spilled to the stack and loaded back).
    /// Returns false, with nothing taken, when the fiber needs another class or the cache is
    /// empty.
    ///
    /// # Safety
    /// The caller has exclusive access to `f`, which has not run yet (its slot is `None`).
    #[inline(always)]
    pub(super) unsafe fn bind_cached(&self, f: &FiberRecord) -> bool {
        let mut cache = self.coroutine_cache();
        let Some(last) = cache.len().checked_sub(1) else { return false };
        if !std::ptr::eq(f.class(), self.rt.stacks) {
            return false;
        }
        // Read a word at a time: the finish that put it there, maybe a few dozen instructions
        // ago, wrote it with word stores, which a wider load spanning two could not be
        // forwarded from.
        // SAFETY: `last < len`: the last coroutine, read out and forgotten by the new length;
        // the slot is `None` and ours (the contract), so writing over it drops nothing.
        unsafe {
            cache.set_len(last);
            let mut co = std::mem::MaybeUninit::<Co>::uninit();
            copy_words(cache.as_ptr().add(last).cast(), co.as_mut_ptr().cast(), CO_WORDS);
            let slot = std::ptr::from_mut(f.co_mut());
            debug_assert!((*slot).is_none());
            slot.write(Some(co.assume_init()));
        }
        bump(&self.slot().stats.stack_hits, 1);
        true
    }

    /// `give_coroutine` for the common case, straight from a finished fiber's slot: a coroutine
    /// of the runtime's stack class that can run another fiber goes into the cache's free room,
    /// a word at a time (`take_finished`), and the slot is left `None`. Moved out and pushed
    /// instead, it went through a stack temporary on the way (10 instructions more per W1 fiber).
    /// Returns false, with the slot as it was, when it does not go there (no room, another
    /// class, a coroutine that returned, or none).
    ///
    /// # Safety
    /// The caller has exclusive access to the slot.
    #[inline(always)]
    pub(super) unsafe fn keep_finished(&self, slot: &mut Option<Co>, class: &'static SizeClass) -> bool {
        let mut cache = self.coroutine_cache();
        // Full at its capacity (`COROUTINE_CACHE`, never grown).
        let keep = slot.as_ref().is_some_and(|co| !co.done())
            && std::ptr::eq(class, self.rt.stacks)
            && cache.len() < cache.capacity();
        if keep {
            let len = cache.len();
            // SAFETY: `len < capacity`: the element past the last is free room for one `Co`;
            // the slot holds one (tested), and exclusive access is the caller's.
            unsafe {
                move_finished(slot, cache.as_mut_ptr().add(len));
                cache.set_len(len + 1);
            }
        }
        keep
    }

    /// A finished fiber's coroutine: kept for the next fiber if it can run one (the runtime's
    /// stack class, room in the cache), else its stack goes back.
    #[inline(always)]
    pub(super) fn give_coroutine(&self, co: Co, class: &'static SizeClass) {
        let mut cache = self.coroutine_cache();
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
        let mut cache = self.stack_cache();
        let mut coroutines = self.coroutine_cache();
        cache.extend(coroutines.drain(..).map(retire_coroutine));
        self.rt.stacks.give_batch(cache.drain(..));
        let mut records = self.record_cache();
        let n = records.len();
        self.give_records_to_pool(&mut records, n);
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
/// from it and waits for it to reach the cache (`arch/performance.md`). Word loads are each
/// forwarded from the store that wrote them.
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
    let mut out = MaybeUninit::<Slot>::uninit();
    // SAFETY: both hold a `Slot`, word-aligned and a whole number of words (the asserts above).
    unsafe { copy_words((co as *mut Slot).cast(), out.as_mut_ptr().cast(), WORDS) };
    // SAFETY: the slot's value now lives in `out`: overwrite it without dropping it. `out`
    // holds a bitwise copy of a valid value.
    unsafe {
        (co as *mut Slot).write(None);
        out.assume_init()
    }
}

/// A coroutine's size in words: a whole number, and word-aligned, for `copy_words`.
const CO_WORDS: usize = {
    use std::mem::{align_of, size_of};
    assert!(size_of::<Co>() % size_of::<usize>() == 0 && align_of::<Co>() >= align_of::<usize>());
    size_of::<Co>() / size_of::<usize>()
};

/// Copies `words` words from `src` to `dst`, one load each (`take_finished` says why).
///
/// # Safety
/// Both are word-aligned and valid for `words` words, and do not overlap.
#[inline(always)]
unsafe fn copy_words(
    src: *const std::mem::MaybeUninit<usize>,
    dst: *mut std::mem::MaybeUninit<usize>,
    words: usize,
) {
    for i in 0..words {
        // SAFETY: `i < words` words lie within both (the contract); volatile keeps LLVM
        // from merging them into wider loads. Words as `MaybeUninit`: a padding byte
        // (corosensei's layout is its own) is copied as it is, never read as an integer.
        unsafe { dst.add(i).write(src.add(i).read_volatile()) };
    }
}

/// `take_finished` into `dst` instead of a return value, for a slot known to hold a coroutine:
/// the words go from the slot to `dst` with no copy between.
///
/// # Safety
/// The caller has exclusive access to the slot, which is `Some`; `dst` is valid for writing
/// one `Co` and holds none to drop.
#[inline(always)]
unsafe fn move_finished(slot: &mut Option<crate::fiber::Co>, dst: *mut crate::fiber::Co) {
    // SAFETY: the slot is `Some` (the caller's contract), so `as_mut` gives the coroutine in
    // place, word-aligned and whole words (`CO_WORDS`) as `dst` is; its words go to `dst`,
    // then the slot is overwritten without dropping, its value now living at `dst`.
    unsafe {
        let src = std::ptr::from_mut(slot.as_mut().unwrap_unchecked());
        copy_words(src.cast(), dst.cast(), CO_WORDS);
        std::ptr::from_mut(slot).write(None);
    }
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::{CacheMut, Flag};

    #[test]
    fn a_field_borrowed_again_after_its_guard_dropped_is_fine() {
        let flag = Flag::default();
        let (mut a, mut b) = (1, 2);
        drop(CacheMut::new(&mut a, &flag, "x"));
        *CacheMut::new(&mut b, &flag, "x") += 1;
        assert_eq!(b, 3);
    }

    #[test]
    #[should_panic(expected = "the carrier's `x` cache borrowed twice at once")]
    fn a_field_borrowed_twice_at_once_panics_in_debug_builds() {
        let flag = Flag::default();
        let (mut a, mut b) = (1, 2);
        let _first = CacheMut::new(&mut a, &flag, "x");
        let _second = CacheMut::new(&mut b, &flag, "x");
    }
}
