//! Fiber stacks: carved from large lazily-committed arenas, pooled, each with a guard page.
//!
//! One `mmap` per stack would cost two VMAs (mapping + guard) and cap a process near 32,700
//! fibers under the default `vm.max_map_count`; a fresh mapping also costs hundreds of times
//! what a reused stack does. So stacks are slots in arenas (`MAP_NORESERVE`, no THP) that grow
//! geometrically, and a slot's guard page is a `MADV_GUARD_INSTALL` marker (no VMA) or, on
//! kernels before 6.13, an `mprotect` page counted against a checked limit. Slots are recycled
//! through a per-carrier cache in front of one pool per size class; they are never unmapped,
//! but the pages of slots that sat unused in the pool through a whole scavenge interval go
//! back to the kernel (`SizeClass::scavenge`, run by the supervisor), so a burst of fibers
//! does not hold its memory for the life of the process. See `arch/fiber.md`.
//!
//! ```text
//!  arena:  | guard | stack 0 (grows down) ... | guard | stack 1 ... | guard | ...
//!          ^ limit                           ^ base
//! ```

use std::collections::VecDeque;
use std::io;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::loom::StdMutex as Mutex;

use crate::platform::{self, GuardKind};

/// The smallest stack a fiber may have: enough for the runtime's own frames plus unwinding.
pub const MIN_STACK_SIZE: usize = 16 * 1024;
/// The largest stack a fiber may ask for.
pub const MAX_STACK_SIZE: usize = 1 << 30;
/// The default usable stack: covers formatting, `println!`, collections and a panic with a
/// printed backtrace (~22 KiB measured). It is a reservation; only touched pages cost memory, but a wider reservation spreads the stacks'
/// touched pages over more page tables: per parked fiber 137 B of page tables at 64 KiB, 265 B
/// at 128 KiB, 522 B at 256 KiB, 2,061 B at 1 MiB, against ~4,470 B of RSS. 128 KiB is the
/// largest measured size that costs under 5% (`arch/guide.md`, "Limits and how to raise them").
pub const DEFAULT_STACK_SIZE: usize = 128 * 1024;

/// Slots in the first arena of a class; each further arena doubles, up to `MAX_ARENA_SLOTS`.
const FIRST_ARENA_SLOTS: usize = 64;
const MAX_ARENA_SLOTS: usize = 16 * 1024;
/// VMAs kept free for the rest of the process when guards are `mprotect` pages.
const MAP_HEADROOM: usize = 4096;

/// The pool of one stack size. Process-wide and never freed: stacks outlive runtimes.
#[derive(Debug)]
pub(crate) struct SizeClass {
    /// Usable bytes per stack (a multiple of the page size).
    usable: usize,
    /// Bytes per slot: guard page + usable.
    stride: usize,
    /// Free slots (their lowest address).
    free: Mutex<Pool>,
    carver: Mutex<Carver>,
    /// Stacks ever carved, for metrics.
    carved: AtomicUsize,
}

/// A class's free slots: the warm ones (their pages may be resident) handed out newest first,
/// then the cold ones (pages given back).
#[derive(Debug, Default)]
struct Pool {
    /// Oldest first: a take pops from the back, the scavenger releases from the front.
    warm: VecDeque<usize>,
    cold: Vec<usize>,
    /// The fewest warm slots the pool held since the last scavenge: that many sat unused for
    /// the whole interval (Go's scavenger and jemalloc's decay work from the same observation).
    low: usize,
}

impl Pool {
    fn len(&self) -> usize {
        self.warm.len() + self.cold.len()
    }

    fn pop(&mut self) -> Option<usize> {
        let s = self.warm.pop_back().or_else(|| self.cold.pop());
        self.low = self.low.min(self.warm.len());
        s
    }
}

/// Warm slots a scavenge leaves in each class's pool whatever the interval saw: the next
/// burst's first stacks need no page faults.
const SCAVENGE_KEEP: usize = 256;
/// Most slots one scavenge releases (some milliseconds of `madvise`); more wait for the next
/// call, which the supervisor makes soon (`SCAVENGE_AGAIN`).
const SCAVENGE_MAX: usize = 16 * 1024;

/// Stacks whose pages the scavenger gave back, over all classes (for metrics).
static SCAVENGED: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, Default)]
struct Carver {
    next: usize,
    end: usize,
    arena_slots: usize,
}

/// Every size class there is; few in practice (one per distinct `stack_size`).
static CLASSES: Mutex<Vec<&'static SizeClass>> = Mutex::new(Vec::new());

/// Rounds a requested stack size to what a class gives, or says why it cannot.
pub(crate) fn usable_size(requested: usize) -> io::Result<usize> {
    if !(MIN_STACK_SIZE..=MAX_STACK_SIZE).contains(&requested) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "stack size {requested} bytes is out of range: a fiber stack must be between \
                 {MIN_STACK_SIZE} bytes (16 KiB) and {MAX_STACK_SIZE} bytes (1 GiB)"
            ),
        ));
    }
    let page = platform::page_size();
    Ok(requested.div_ceil(page) * page)
}

/// The stack-pool locks the forking thread holds across a `fork`. A `fork` copies only the
/// forking thread, so a pool lock that another thread (a carrier, the scavenger) held at that
/// moment would stay locked for ever in the child, whose fresh default runtime takes its stacks
/// from these same classes. Holding every one of them across the fork (in the lock order
/// `CLASSES`, then each class's `free`, then its `carver`, which no other path reverses) means
/// the child starts with all of them free.
#[cfg(not(loom))]
struct ForkHold {
    _classes: std::sync::MutexGuard<'static, Vec<&'static SizeClass>>,
    _pools: Vec<(std::sync::MutexGuard<'static, Pool>, std::sync::MutexGuard<'static, Carver>)>,
}

#[cfg(not(loom))]
fn hold_pools_across_fork() {
    platform::fork::hold_across_fork(|| {
        let classes = CLASSES.lock().unwrap_or_else(|e| e.into_inner());
        let pools = classes
            .iter()
            .map(|&c| {
                let free = c.free.lock().unwrap_or_else(|e| e.into_inner());
                (free, c.carver.lock().unwrap_or_else(|e| e.into_inner()))
            })
            .collect();
        Box::new(ForkHold { _classes: classes, _pools: pools })
    });
}
#[cfg(not(loom))]
platform::fork::at_load!(hold_pools_across_fork);

impl SizeClass {
    /// The class for `usable` bytes (already rounded by [`usable_size`]).
    pub(crate) fn get(usable: usize) -> &'static SizeClass {
        let mut classes = CLASSES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = classes.iter().find(|c| c.usable == usable) {
            return c;
        }
        let class = SizeClass::leaked(usable);
        classes.push(class);
        class
    }

    /// A new class, not listed (so `get` and `scavenge_all` do not see it).
    fn leaked(usable: usize) -> &'static SizeClass {
        Box::leak(Box::new(SizeClass {
            usable,
            stride: usable + platform::page_size(),
            free: Mutex::new(Pool::default()),
            carver: Mutex::new(Carver::default()),
            carved: AtomicUsize::new(0),
        }))
    }

    /// Stacks ever carved in this class and their reserved bytes (guard pages included), and
    /// how many sit in the shared pool now.
    pub(crate) fn usage(&self) -> (usize, usize, usize) {
        let carved = self.carved.load(Ordering::Relaxed);
        let pooled = self.free.lock().unwrap_or_else(|e| e.into_inner()).len();
        (carved, carved * self.stride, pooled)
    }

    /// Takes a stack from the shared pool, carving a new slot when the pool is empty.
    pub(crate) fn take(&'static self) -> io::Result<FiberStack> {
        let slot = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let bottom = match slot {
            Some(s) => s,
            None => self.carve()?,
        };
        Ok(FiberStack { bottom, class: self })
    }

    /// Makes sure the pool holds at least one stack, carving one if needed.
    pub(crate) fn ensure_available(&'static self) -> io::Result<()> {
        if self.free.lock().unwrap_or_else(|e| e.into_inner()).len() != 0 {
            return Ok(());
        }
        let s = self.take()?;
        drop(s); // back into the pool
        Ok(())
    }

    /// Moves up to `n` pooled stacks into `into` (a carrier's cache) under one lock.
    pub(crate) fn take_batch(&'static self, into: &mut Vec<FiberStack>, n: usize) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..n {
            let Some(bottom) = free.pop() else { break };
            into.push(FiberStack { bottom, class: self });
        }
    }

    /// Returns stacks to the shared pool under one lock.
    pub(crate) fn give_batch(&self, stacks: impl Iterator<Item = FiberStack>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        for s in stacks {
            debug_assert!(std::ptr::eq(s.class, self));
            free.warm.push_back(s.into_raw());
        }
    }

    /// Gives back the pages of the slots that stayed warm in the pool, unused, since the last
    /// call, beyond `SCAVENGE_KEEP`: the oldest first, one `madvise` per run of neighbours, with
    /// the pool's lock released meanwhile (the slots are out of the pool, ours alone), at most
    /// `SCAVENGE_MAX` per call. Returns how many it released, and whether more of them wait
    /// (then the next call goes on with them rather than starting a new interval). The
    /// supervisor calls it every `SCAVENGE_EVERY`, and again soon while more wait.
    pub(crate) fn scavenge(&self) -> (usize, bool) {
        let (mut idle, more): (Vec<usize>, bool) = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            let due = free.low.saturating_sub(SCAVENGE_KEEP);
            let n = due.min(SCAVENGE_MAX);
            let idle = free.warm.drain(..n).collect();
            // The rest of the due slots still lead the queue, unused since the interval began;
            // otherwise a new interval begins with every slot now in the pool.
            free.low = if n < due { free.low - n } else { free.warm.len() };
            (idle, n < due)
        };
        if idle.is_empty() {
            return (0, more);
        }
        idle.sort_unstable();
        let page = platform::page_size();
        let mut i = 0;
        while i < idle.len() {
            // A slot is its guard page, then its stack; neighbours in an arena are one stride
            // apart, so a run of them is one range (the guards inside it stay guards).
            let start = idle[i] + page;
            let mut last = idle[i];
            i += 1;
            while i < idle.len() && idle[i] == last + self.stride {
                last = idle[i];
                i += 1;
            }
            // A failed call leaves the pages as they were: the slots are still good stacks.
            // SAFETY: `start..last + stride` covers the stacks of free slots taken out of the
            // pool above (nobody else holds them; their contents are dead) and the guard pages
            // between them, which `release` leaves guards.
            let _ = unsafe { platform::release(start, last + self.stride - start) };
        }
        let n = idle.len();
        self.free.lock().unwrap_or_else(|e| e.into_inner()).cold.extend(idle);
        SCAVENGED.fetch_add(n, Ordering::Relaxed);
        (n, more)
    }

    /// Whether some class's pool holds more warm slots than a scavenge keeps: the next
    /// scavenge may have something to give back.
    pub(crate) fn any_excess() -> bool {
        let classes: Vec<&'static SizeClass> = CLASSES.lock().unwrap_or_else(|e| e.into_inner()).clone();
        classes.iter().any(|c| c.free.lock().unwrap_or_else(|e| e.into_inner()).warm.len() > SCAVENGE_KEEP)
    }

    /// `scavenge` over every class. Returns whether some class has more due.
    pub(crate) fn scavenge_all() -> bool {
        let classes: Vec<&'static SizeClass> = CLASSES.lock().unwrap_or_else(|e| e.into_inner()).clone();
        classes.iter().fold(false, |more, c| c.scavenge().1 | more)
    }

    /// Stacks the scavenger has released since the process started.
    pub(crate) fn scavenged() -> usize {
        SCAVENGED.load(Ordering::Relaxed)
    }

    #[cold]
    fn carve(&self) -> io::Result<usize> {
        let mut c = self.carver.lock().unwrap_or_else(|e| e.into_inner());
        if c.next == c.end {
            let slots = (c.arena_slots * 2).clamp(FIRST_ARENA_SLOTS, MAX_ARENA_SLOTS);
            let len = slots * self.stride;
            let base = platform::reserve(len).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::OutOfMemory,
                    format!(
                        "cannot reserve {} MiB of address space for {slots} fiber stacks of \
                         {} KiB: {e}. Lower `stack_size` (runtime::Builder or fiber Builder), \
                         or raise the address-space limit (`ulimit -v`); under \
                         vm.overcommit_memory=2 reserved stacks count against the commit limit",
                        len >> 20,
                        self.usable >> 10
                    ),
                )
            })?;
            c.next = base as usize;
            c.end = c.next + len;
            c.arena_slots = slots;
            ARENAS.register(c.next, c.end, self.stride, self.usable);
        }
        let bottom = c.next;
        guard(bottom)?;
        c.next += self.stride;
        self.carved.fetch_add(1, Ordering::Relaxed);
        Ok(bottom)
    }
}

/// Every arena ever reserved, for the stack-overflow handler: a fixed table of atomics that a
/// signal handler can read without locks or allocation. Arenas are never unmapped, so an entry
/// stays valid for the life of the process.
pub(crate) struct ArenaTable {
    entries: [ArenaEntry; MAX_ARENAS],
    len: AtomicUsize,
}

const MAX_ARENAS: usize = 4096;

#[derive(Default)]
struct ArenaEntry {
    base: AtomicUsize,
    end: AtomicUsize,
    stride: AtomicUsize,
    usable: AtomicUsize,
}

pub(crate) static ARENAS: ArenaTable = ArenaTable {
    entries: [const {
        ArenaEntry {
            base: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
            stride: AtomicUsize::new(0),
            usable: AtomicUsize::new(0),
        }
    }; MAX_ARENAS],
    len: AtomicUsize::new(0),
};

impl ArenaTable {
    fn register(&self, base: usize, end: usize, stride: usize, usable: usize) {
        // Called under a class's carver lock; classes carve concurrently, so claim an index.
        let i = self.len.fetch_add(1, Ordering::AcqRel);
        if i >= MAX_ARENAS {
            return; // overflows in arenas past this many are reported as plain faults
        }
        let e = &self.entries[i];
        e.stride.store(stride, Ordering::Relaxed);
        e.usable.store(usable, Ordering::Relaxed);
        e.end.store(end, Ordering::Relaxed);
        // Release last: a reader that sees `base` sees the rest.
        e.base.store(base, Ordering::Release);
    }

    /// The stack slot `addr` falls in, if any: `(slot's lowest address, stride, usable size)`;
    /// a slot is its guard page(s) followed by the usable stack. Atomics only (async-signal-safe).
    fn slot_of(&self, addr: usize) -> Option<(usize, usize, usize)> {
        let n = self.len.load(Ordering::Acquire).min(MAX_ARENAS);
        for e in &self.entries[..n] {
            let base = e.base.load(Ordering::Acquire);
            if base == 0 || addr < base || addr >= e.end.load(Ordering::Relaxed) {
                continue;
            }
            let stride = e.stride.load(Ordering::Relaxed);
            let usable = e.usable.load(Ordering::Relaxed);
            return Some((addr - (addr - base) % stride, stride, usable));
        }
        None
    }

    /// If `addr` lies in the usable part of some stack, that part: `(lowest address, top)`.
    pub(crate) fn usable_range(&self, addr: usize) -> Option<(usize, usize)> {
        let (bottom, stride, usable) = self.slot_of(addr)?;
        let low = bottom + stride - usable;
        (addr >= low).then_some((low, bottom + stride))
    }

    /// If `addr` lies in a guard page of some stack, the usable size of that stack.
    /// Async-signal-safe: atomics only.
    pub(crate) fn guard_hit(&self, addr: usize) -> Option<usize> {
        let (bottom, stride, usable) = self.slot_of(addr)?;
        (addr - bottom < stride - usable).then_some(usable)
    }
}

/// Installs the guard page at the bottom of a freshly carved slot.
fn guard(bottom: usize) -> io::Result<()> {
    static KIND: OnceLock<GuardKind> = OnceLock::new();
    static PROTECTED: AtomicUsize = AtomicUsize::new(0);
    static PROTECT_LIMIT: OnceLock<usize> = OnceLock::new();

    let kind = *platform::fork::init_once(&KIND, || {
        // `VT_STACK_GUARD=mprotect` takes the pre-6.13 path on purpose: for tools that cannot
        // see guard markers (valgrind), and to test the `vm.max_map_count` limit on any kernel.
        if std::env::var_os("VT_STACK_GUARD").is_some_and(|v| v == "mprotect") {
            return GuardKind::Protect;
        }
        // SAFETY: `bottom` is the page-aligned first page of a slot in an arena we mapped, and
        // nothing has been stored in it yet.
        match unsafe { platform::install_guard(bottom as *mut u8, GuardKind::Marker) } {
            Ok(()) => GuardKind::Marker,
            Err(_) => GuardKind::Protect,
        }
    });
    if kind == GuardKind::Protect {
        // Each guard splits the arena's mapping: two more VMAs. Stop well before the kernel's
        // limit: a process at it fails in unrelated places (thread creation, the allocator).
        let limit = *platform::fork::init_once(&PROTECT_LIMIT, || {
            platform::max_map_count().saturating_sub(platform::map_count() + MAP_HEADROOM) / 2
        });
        if PROTECTED.fetch_add(1, Ordering::Relaxed) >= limit {
            PROTECTED.fetch_sub(1, Ordering::Relaxed);
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!(
                    "fiber stacks would exhaust vm.max_map_count ({}): this kernel lacks \
                     MADV_GUARD_INSTALL (Linux 6.13+), so every guarded stack costs 2 memory \
                     mappings and at most {limit} stacks fit. Raise the limit with \
                     `sysctl -w vm.max_map_count=N` (N ≥ 2 × fibers + 65536) or run on Linux 6.13+",
                    platform::max_map_count()
                ),
            ));
        }
    }
    // SAFETY: as above; for the marker kind the probe may already have installed it, and
    // installing a marker twice is harmless.
    unsafe { platform::install_guard(bottom as *mut u8, kind) }
}

/// One fiber's stack: a slot of a [`SizeClass`]. Dropping it returns the slot to its pool,
/// which is the only way back: a forgotten coroutine leaks its slot instead of aliasing it.
#[derive(Debug)]
pub(crate) struct FiberStack {
    /// Lowest address of the slot: the guard page, then the usable stack.
    bottom: usize,
    class: &'static SizeClass,
}

impl FiberStack {
    fn into_raw(self) -> usize {
        let b = self.bottom;
        std::mem::forget(self);
        b
    }

    pub(crate) fn class(&self) -> &'static SizeClass {
        self.class
    }

    /// Starts loading the top of this stack into the cache: the carrier calls it for the stack
    /// it will hand out next. A first run writes about 500 bytes down from the top (the
    /// coroutine's initial frame, the fiber's entry, a park), and when thousands of fibers are
    /// live at once (many parked or sleeping fibers) every one of those lines, and the page's translation, misses.
    #[inline]
    pub(crate) fn prefetch_top(&self) {
        let top = self.bottom + self.class.stride;
        for line in 1..=PREFETCH_LINES {
            crate::platform::prefetch(top - line * 64);
        }
    }
}

/// Cache lines `FiberStack::prefetch_top` asks for.
const PREFETCH_LINES: usize = 8;

impl Drop for FiberStack {
    fn drop(&mut self) {
        self.class.free.lock().unwrap_or_else(|e| e.into_inner()).warm.push_back(self.bottom);
    }
}

// The `Stack` contract holds: [1] `base` (top of the slot) and `limit` (bottom, including the
// guard page) are page-aligned, hence 16-byte aligned; [2] `(limit + page, base]` is mapped
// read-write and holds `usable ≥ MIN_STACK_SIZE ≥ 4 KiB`; [3] the guard page at `limit` was
// installed when the slot was carved and is never removed; [4] a slot is owned by exactly one
// `FiberStack` at a time (the pool hands each out once and takes it back only from `Drop` or
// `into_raw`).
// SAFETY: by [1]–[4] above.
unsafe impl corosensei::stack::Stack for FiberStack {
    #[inline]
    fn base(&self) -> corosensei::stack::StackPointer {
        corosensei::stack::StackPointer::new(self.bottom + self.class.stride).expect("non-null")
    }

    #[inline]
    fn limit(&self) -> corosensei::stack::StackPointer {
        corosensei::stack::StackPointer::new(self.bottom).expect("non-null")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scavenger gives back only what sat in the pool through a whole interval, beyond
    /// `SCAVENGE_KEEP`, oldest first; released stacks read as zero and are handed out after
    /// the warm ones; the kept ones keep their bytes.
    #[test]
    fn scavenge_releases_what_stayed_unused_for_an_interval() {
        // An unlisted class: no supervisor's scavenge of all classes touches its pool.
        let class = SizeClass::leaked(usable_size(37 * 4096).unwrap());
        let n = SCAVENGE_KEEP + 100;
        let stacks: Vec<FiberStack> = (0..n).map(|_| class.take().unwrap()).collect();
        let top = |s: &FiberStack| s.bottom + class.stride - 8;
        for (i, s) in stacks.iter().enumerate() {
            // SAFETY: the word just below the top of a stack we hold: mapped and ours.
            unsafe { (top(s) as *mut usize).write(i + 1) };
        }
        let order: Vec<usize> = stacks.iter().map(|s| s.bottom).collect();
        class.give_batch(stacks.into_iter());
        // The first call only starts the interval.
        assert_eq!(class.scavenge(), (0, false));
        // Ten slots are used (taken and given back) within the interval: the low mark is
        // n - 10, so n - 10 - KEEP were unused throughout.
        let mut used = Vec::new();
        class.take_batch(&mut used, 10);
        class.give_batch(used.into_iter());
        assert_eq!(class.scavenge(), (100 - 10, false));
        // The released ones are the oldest returned: the first 90 given back. They read as
        // zero; the rest still hold what was written.
        // SAFETY: reading words inside slots of this class's arena, which stay mapped.
        let word = |bottom: usize| unsafe { ((bottom + class.stride - 8) as *const usize).read() };
        for (i, &b) in order.iter().enumerate() {
            let expect = if i < 90 { 0 } else { i + 1 };
            assert_eq!(word(b), expect, "slot {i}");
        }
        // Warm slots are handed out before cold ones.
        let mut all = Vec::new();
        class.take_batch(&mut all, n);
        assert_eq!(all.len(), n);
        assert!(all[..n - 90].iter().all(|s| word(s.bottom) != 0));
        assert!(all[n - 90..].iter().all(|s| word(s.bottom) == 0));
        class.give_batch(all.into_iter());
        assert!(SizeClass::scavenged() >= 90);
    }

    /// A scavenge releases at most `SCAVENGE_MAX`; the next call goes on with the rest of the
    /// due slots without waiting for a new interval, then a new interval begins.
    #[test]
    fn a_capped_scavenge_leaves_the_rest_for_the_next_call() {
        let class = SizeClass::leaked(MIN_STACK_SIZE);
        let n = SCAVENGE_MAX + SCAVENGE_KEEP + 10;
        let stacks: Vec<FiberStack> = (0..n).map(|_| class.take().unwrap()).collect();
        class.give_batch(stacks.into_iter());
        assert_eq!(class.scavenge(), (0, false));
        assert_eq!(class.scavenge(), (SCAVENGE_MAX, true));
        // One of the 10 left over is used meanwhile: the other 9 go now.
        let mut one = Vec::new();
        class.take_batch(&mut one, 1);
        class.give_batch(one.into_iter());
        assert_eq!(class.scavenge(), (9, false));
        // That one goes after an interval of its own; then only the kept ones are left.
        assert_eq!(class.scavenge(), (1, false));
        assert_eq!(class.scavenge(), (0, false));
        assert_eq!(class.free.lock().unwrap().warm.len(), SCAVENGE_KEEP);
        assert_eq!(class.free.lock().unwrap().cold.len(), n - SCAVENGE_KEEP);
    }

    #[test]
    fn sizes_are_validated_and_rounded() {
        assert_eq!(usable_size(4096).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(usable_size(MAX_STACK_SIZE + 1).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        let page = platform::page_size();
        assert_eq!(usable_size(MIN_STACK_SIZE + 1).unwrap() % page, 0);
    }

    #[test]
    fn stacks_are_reused_and_writable() {
        let class = SizeClass::get(usable_size(80 * 1024).unwrap());
        let a = class.take().unwrap();
        let top = corosensei::stack::Stack::base(&a).get();
        // SAFETY: the byte just below the top of a taken stack is mapped read-write and ours.
        unsafe { ((top - 1) as *mut u8).write(7) };
        let bottom = a.bottom;
        drop(a);
        let b = class.take().unwrap();
        assert_eq!(b.bottom, bottom, "a freed slot is handed out again (LIFO)");
    }
}
