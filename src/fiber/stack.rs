//! Fiber stacks: carved from large lazily-committed arenas, pooled, each with a guard page.
//!
//! One `mmap` per stack would cost two VMAs (mapping + guard) and cap a process near 32,700
//! fibers under the default `vm.max_map_count`; a fresh mapping also costs ~9 µs against
//! ~25 ns for a reused stack. So stacks are slots in arenas (`MAP_NORESERVE`, no THP) that grow
//! geometrically, and a slot's guard page is a `MADV_GUARD_INSTALL` marker (no VMA) or, on
//! kernels before 6.13, an `mprotect` page counted against a checked limit. Slots are recycled
//! through a per-carrier cache in front of one pool per size class; they are never unmapped.
//! See `arch/fiber.md`.
//!
//! ```text
//!  arena:  | guard | stack 0 (grows down) ... | guard | stack 1 ... | guard | ...
//!          ^ limit                           ^ base
//! ```

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::platform::{self, GuardKind};

/// The smallest stack a fiber may have: enough for the runtime's own frames plus unwinding.
pub const MIN_STACK_SIZE: usize = 16 * 1024;
/// The largest stack a fiber may ask for.
pub const MAX_STACK_SIZE: usize = 1 << 30;
/// The default usable stack: covers formatting, `println!`, collections and a panic with a
/// printed backtrace (~22 KiB measured). It is a reservation; only touched pages cost memory.
pub const DEFAULT_STACK_SIZE: usize = 64 * 1024;

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
    free: Mutex<Vec<usize>>,
    carver: Mutex<Carver>,
    /// Stacks ever carved, for metrics.
    carved: AtomicUsize,
}

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

impl SizeClass {
    /// The class for `usable` bytes (already rounded by [`usable_size`]).
    pub(crate) fn get(usable: usize) -> &'static SizeClass {
        let mut classes = CLASSES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = classes.iter().find(|c| c.usable == usable) {
            return c;
        }
        let class: &'static SizeClass = Box::leak(Box::new(SizeClass {
            usable,
            stride: usable + platform::page_size(),
            free: Mutex::new(Vec::new()),
            carver: Mutex::new(Carver::default()),
            carved: AtomicUsize::new(0),
        }));
        classes.push(class);
        class
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
        if !self.free.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
            return Ok(());
        }
        let s = self.take()?;
        drop(s); // back into the pool
        Ok(())
    }

    /// Moves up to `n` pooled stacks into `into` (a carrier's cache) under one lock.
    pub(crate) fn take_batch(&'static self, into: &mut Vec<FiberStack>, n: usize) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let k = free.len().min(n);
        let start = free.len() - k;
        into.extend(free.drain(start..).map(|bottom| FiberStack { bottom, class: self }));
    }

    /// Returns stacks to the shared pool under one lock.
    pub(crate) fn give_batch(&self, stacks: impl Iterator<Item = FiberStack>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        for s in stacks {
            debug_assert!(std::ptr::eq(s.class, self));
            free.push(s.into_raw());
        }
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

    let kind = *KIND.get_or_init(|| {
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
        let limit = *PROTECT_LIMIT.get_or_init(|| {
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
    /// live at once (W6, W7) every one of those lines, and the page's translation, misses.
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
        self.class.free.lock().unwrap_or_else(|e| e.into_inner()).push(self.bottom);
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
