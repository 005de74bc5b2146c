//! The table of fibers waiting in a hooked futex call, keyed by address: the part of the futex
//! hook (`futex.rs`) whose correctness is a race, so that loom can model it (`table/loom.rs`).
//!
//! Buckets by address, each a spin lock and a FIFO list of waiters. A waiter is a node in the
//! waiting fiber's own frame (its stack is marked lent meanwhile, so compaction leaves it
//! alone): no allocation. The rule that loses no wake (`arch/hooks.md`, "No lost wake"): the
//! waiter checks the futex word and enqueues itself under the bucket's lock; a waker changes the
//! word *before* it calls the wake, and the wake takes the same lock. So either the waiter's
//! check comes after the waker's unlock (it sees the new word and does not wait) or the waker's
//! scan comes after the waiter's enqueue (it finds the waiter). A woken waiter is marked under
//! the lock and unparked after it, through a counted handle the waker copied, so the waiter's
//! frame may end as soon as the lock is free.

use std::cell::Cell;
use std::ptr;

use crate::loom::{AtomicBool, AtomicUsize, Ordering};

#[cfg(not(loom))]
pub(super) type Handle = crate::fiber::handle::Fiber;
#[cfg(loom)]
pub(super) type Handle = loom::thread::Thread;

/// Buckets in the table (a power of two): 64-byte buckets, 16 KiB. Two in a loom model, where
/// every atomic is a tracked object.
#[cfg(not(loom))]
const BUCKETS: usize = 256;
#[cfg(loom)]
const BUCKETS: usize = 2;

/// Wakes a fiber (or, in a loom model, a thread) whose wait was ended under the lock.
fn unpark(h: &Handle) {
    h.unpark();
}

/// One fiber waiting on one futex word: a node in that fiber's own frame.
pub(super) struct Waiter {
    addr: usize,
    bitset: u32,
    who: Handle,
    next: Cell<*const Waiter>,
    prev: Cell<*const Waiter>,
    /// Set under the bucket's lock by the wake that took the waiter off its list.
    woken: AtomicBool,
}

impl Waiter {
    pub(super) fn new(addr: usize, bitset: u32, who: Handle) -> Waiter {
        Waiter {
            addr,
            bitset,
            who,
            next: Cell::new(ptr::null()),
            prev: Cell::new(ptr::null()),
            woken: AtomicBool::new(false),
        }
    }
}

#[repr(align(64))]
struct Bucket {
    /// 0: free; else the token of the thread that holds it (`thread_token`).
    lock: AtomicUsize,
    head: Cell<*const Waiter>,
    tail: Cell<*const Waiter>,
}

// SAFETY: `head`, `tail` and the nodes they reach are read and written only by the thread
// holding `lock` (Acquire on taking it, Release on freeing it).
unsafe impl Sync for Bucket {}

/// The waiters of every hooked futex wait of the process.
pub(super) struct Table {
    buckets: [Bucket; BUCKETS],
}

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Waited {
    /// The word did not hold the expected value (`EAGAIN`): never queued.
    Changed,
    /// A wake took the waiter off the list.
    Woken,
    /// `park` said to stop (a deadline passed, the wait is cancelled): off the list, not woken.
    Stopped,
}

/// What the caller's `park` says after each park.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Parked {
    /// Look again (an unpark, perhaps a spurious one).
    Again,
    /// Give up the wait.
    Stop,
}

/// A token for the calling thread, never 0: the address of its `errno` slot (no thread-local
/// of ours, so a signal handler may ask for it too).
#[cfg(not(loom))]
fn thread_token() -> usize {
    // SAFETY: `__errno_location` has no preconditions and returns this thread's slot.
    unsafe { libc::__errno_location() as usize }
}

#[cfg(loom)]
fn thread_token() -> usize {
    // Loom runs its threads on one OS thread: a number per loom thread, from loom's own
    // thread-locals.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    loom::thread_local!(static T: usize = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    T.with(|t| *t)
}

struct Locked<'a>(&'a Bucket);

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.0.lock.store(0, Ordering::Release);
    }
}

impl Bucket {
    /// Takes the lock, or `None` where this thread holds it already: a signal handler that
    /// interrupted this thread inside the bucket's critical section (std never makes futex calls
    /// from one; C code could). Waiting would deadlock; the caller passes the call through.
    fn lock(&self) -> Option<Locked<'_>> {
        let me = thread_token();
        let mut spins = 0u32;
        loop {
            match self.lock.compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Some(Locked(self)),
                Err(owner) if owner == me => return None,
                Err(_) => {
                    // The critical sections are a few loads and stores, never a switch or a
                    // system call: the holder is about to free it unless it was preempted.
                    spins += 1;
                    // Loom: yield at once, so that the model lets the holder run.
                    if spins < if cfg!(loom) { 0 } else { 64 } {
                        std::hint::spin_loop();
                    } else {
                        #[cfg(not(loom))]
                        std::thread::yield_now();
                        #[cfg(loom)]
                        loom::thread::yield_now();
                    }
                }
            }
        }
    }
}

impl Locked<'_> {
    fn push(&self, w: &Waiter) {
        let b = self.0;
        w.prev.set(b.tail.get());
        w.next.set(ptr::null());
        match b.tail.get().is_null() {
            true => b.head.set(w),
            // SAFETY: a node on the list lives until it is unlinked, under this lock.
            false => unsafe { (*b.tail.get()).next.set(w) },
        }
        b.tail.set(w);
    }

    fn unlink(&self, w: &Waiter) {
        let b = self.0;
        let (prev, next) = (w.prev.get(), w.next.get());
        match prev.is_null() {
            true => b.head.set(next),
            // SAFETY: as in `push`: its neighbours are on the list, so alive.
            false => unsafe { (*prev).next.set(next) },
        }
        match next.is_null() {
            true => b.tail.set(prev),
            // SAFETY: as above.
            false => unsafe { (*next).prev.set(prev) },
        }
    }
}

/// The most waiters one pass of `wake` unparks: their handles are copied to the waker's stack
/// under the lock and unparked after it.
const WAKE_BATCH: usize = 16;

impl Table {
    #[cfg(not(loom))]
    pub(super) const fn new() -> Table {
        // A fresh bucket's value, copied into every slot (never used as a shared constant).
        #[allow(clippy::declare_interior_mutable_const)]
        const B: Bucket =
            Bucket { lock: AtomicUsize::new(0), head: Cell::new(ptr::null()), tail: Cell::new(ptr::null()) };
        Table { buckets: [B; BUCKETS] }
    }

    #[cfg(loom)]
    pub(super) fn new() -> Table {
        Table {
            buckets: std::array::from_fn(|_| Bucket {
                lock: AtomicUsize::new(0),
                head: Cell::new(ptr::null()),
                tail: Cell::new(ptr::null()),
            }),
        }
    }

    /// Forgets every waiter and frees every bucket's lock, in the child of a `fork`: each
    /// waiter is a fiber of the parent's, which the child never runs, so a wake that counted one
    /// would be a wake lost for the child's own waiter; and a lock held at the fork is held by
    /// a thread the child does not have. The nodes (in those fibers' stacks) and their handles
    /// are left as they are: a leak of the child's copy, never touched again.
    ///
    /// # Safety
    /// Only on the only thread of a forked child, before any other code there uses the table
    /// (a `pthread_atfork` child handler): nothing else may hold a bucket or a node then.
    #[cfg(not(loom))]
    pub(super) unsafe fn forget_all_after_fork(&self) {
        for b in &self.buckets {
            // Relaxed: the only thread.
            b.lock.store(0, Ordering::Relaxed);
            b.head.set(ptr::null());
            b.tail.set(ptr::null());
        }
    }

    fn bucket(&self, addr: usize) -> &Bucket {
        // Futex words are 4-aligned; a multiplicative hash spreads neighbouring words.
        let h = (addr >> 2).wrapping_mul(0x9E37_79B9_7F4A_7C15_u64 as usize);
        &self.buckets[h >> (usize::BITS - BUCKETS.trailing_zeros())]
    }

    /// Waits on `w.addr`: `holds()` reads the futex word and says whether it still has the
    /// expected value (it runs under the bucket's lock); `park` parks until an unpark and says
    /// whether to keep waiting. `None`: this thread holds the bucket already (a signal
    /// handler's call), so the caller passes through.
    pub(super) fn wait(
        &self,
        w: &Waiter,
        holds: impl FnOnce() -> bool,
        mut park: impl FnMut() -> Parked,
    ) -> Option<Waited> {
        let b = self.bucket(w.addr);
        {
            let l = b.lock()?;
            if !holds() {
                return Some(Waited::Changed);
            }
            l.push(w);
        }
        loop {
            let again = park();
            let l = b.lock().expect("a fiber's wait is never a signal handler's");
            if w.woken.load(Ordering::Relaxed) {
                return Some(Waited::Woken);
            }
            if again == Parked::Stop {
                l.unlink(w);
                return Some(Waited::Stopped);
            }
        }
    }

    /// Wakes up to `n` waiters on `addr` whose bitset meets `bitset`, oldest first; returns how
    /// many. `None`: this thread holds the bucket already (a signal handler's call).
    pub(super) fn wake(&self, addr: usize, bitset: u32, n: usize) -> Option<usize> {
        let b = self.bucket(addr);
        let mut woken = 0;
        loop {
            let mut batch: [Option<Handle>; WAKE_BATCH] = Default::default();
            let mut k = 0;
            let more = {
                let l = b.lock()?;
                let mut p = b.head.get();
                while !p.is_null() && woken + k < n && k < WAKE_BATCH {
                    // SAFETY: nodes on the list are alive while the lock is held.
                    let w = unsafe { &*p };
                    p = w.next.get();
                    if w.addr == addr && w.bitset & bitset != 0 {
                        l.unlink(w);
                        batch[k] = Some(w.who.clone());
                        k += 1;
                        // Last: once the lock is free the waiter may see this and return.
                        w.woken.store(true, Ordering::Relaxed);
                    }
                }
                !p.is_null() && woken + k < n
            };
            for h in batch.iter().flatten() {
                unpark(h);
            }
            woken += k;
            if !more {
                return Some(woken);
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
impl Table {
    /// Runs `f` holding the bucket of `addr`, as a wake or a wait does for a few instructions.
    pub(super) fn with_bucket_held<R>(&self, addr: usize, f: impl FnOnce() -> R) -> R {
        let _held = self.bucket(addr).lock().expect("this thread holds no bucket");
        f()
    }
}

#[cfg(all(test, loom))]
#[path = "tests/loom_table.rs"]
mod loom_tests;
