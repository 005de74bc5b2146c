//! A carrier's local run queue: a fixed ring of fiber pointers that its carrier pushes to and
//! pops from, and that other carriers steal from, half at a time.
//!
//! The shape is tokio's and Go's local queue, not a Chase-Lev deque: the carrier runs its
//! queue in FIFO order (a yield goes to the back), so owner and thieves all take from the
//! head, and the head is the only word they fight over. Only the owner writes the slots and
//! the tail. A pop or a batch taken by the owner is one CAS on the head, then reads of the
//! slots it now owns; a steal reads the slots first, then claims them with one CAS (which
//! fails, and discards what it read, if anyone moved the head meanwhile). The owner
//! overwrites a slot only while it is outside the `[head, tail)` it last saw, which a thief
//! that still reads it can no longer win. Indices are `usize` counters that never wrap on a
//! 64-bit target, so a CAS cannot mistake a new head for the old one (ABA).
//!
//! Against crossbeam's FIFO `Worker`: there a pop takes a locked `xadd` and a resize check, a
//! 128-fiber spill is 128 pops, and a steal into a growing deque can allocate. Here a pop is a load, a compare and one CAS; a spill and a
//! steal are one CAS each; the ring never allocates after it is built. It is bounded
//! ([`CAPACITY`]): a full queue spills half to the injector (`Carrier::spill`).
//!
//! The atomics are `crate::loom`'s, so its models (`tests/loom_run_queue.rs`, and the
//! idle protocol's, `tests/loom_idle.rs`) run this code. See `arch/scheduler.md`.

use std::marker::PhantomData;

use crate::loom::{Arc, AtomicUsize, Ordering, fence};

/// Slots per carrier (Go and tokio: 256). A power of two.
pub(crate) const CAPACITY: usize = 256;

/// What a queue holds: a value that travels as one non-zero word and is owned by whoever takes
/// it out.
pub(crate) trait Entry: Sized {
    fn into_word(self) -> usize;
    /// # Safety
    /// `word` came from `into_word` and is taken back once.
    unsafe fn from_word(word: usize) -> Self;
}

impl Entry for crate::fiber::FiberRef {
    fn into_word(self) -> usize {
        Self::into_raw(self) as usize
    }

    unsafe fn from_word(word: usize) -> Self {
        // SAFETY: `word` is a pointer from `into_raw`, taken back once (caller's contract);
        // queues hold no nulls.
        unsafe { Self::from_raw(word as *mut _) }.expect("a queued fiber reference is never null")
    }
}

struct Ring<T: Entry> {
    /// Next slot to take. Written by the owner's pops and by thieves (CAS).
    head: AtomicUsize,
    /// Next slot to fill. Written by the owner only.
    tail: AtomicUsize,
    mask: usize,
    slots: Box<[AtomicUsize]>,
    _owns: PhantomData<T>,
}

impl<T: Entry> Ring<T> {
    /// The slot for counter `i` (any value: it wraps).
    #[inline(always)]
    fn slot(&self, i: usize) -> &AtomicUsize {
        // SAFETY: `slots.len() == mask + 1` (set in `new`), so `i & mask` is in bounds. Not a
        // checked index: the check showed in the switch path, which peeks at two slots.
        unsafe { self.slots.get_unchecked(i & self.mask) }
    }
}

impl<T: Entry> Drop for Ring<T> {
    fn drop(&mut self) {
        let (h, t) = (self.head.load(Ordering::Relaxed), self.tail.load(Ordering::Relaxed));
        for i in h..t {
            // SAFETY: `[head, tail)` holds the words of entries nobody took; the ring owns them
            // and, being dropped, gives each back once.
            drop(unsafe { T::from_word(self.slot(i).load(Ordering::Relaxed)) });
        }
    }
}

/// The owner's end: push, pop and take batches. Not `Sync`: one carrier thread uses it.
pub(crate) struct Local<T: Entry> {
    ring: Arc<Ring<T>>,
    _one_thread: PhantomData<std::cell::Cell<()>>,
}

/// The thieves' end (and the supervisor's and dumps' view): length and steals.
pub(crate) struct Remote<T: Entry> {
    ring: Arc<Ring<T>>,
}

impl<T: Entry> Clone for Remote<T> {
    fn clone(&self) -> Self {
        Remote { ring: self.ring.clone() }
    }
}

/// A new empty queue of `capacity` slots (a power of two), as its two ends.
pub(crate) fn new<T: Entry>(capacity: usize) -> (Local<T>, Remote<T>) {
    assert!(capacity.is_power_of_two(), "run queue capacity must be a power of two");
    let ring = Arc::new(Ring {
        head: AtomicUsize::new(0),
        tail: AtomicUsize::new(0),
        mask: capacity - 1,
        slots: (0..capacity).map(|_| AtomicUsize::new(0)).collect(),
        _owns: PhantomData,
    });
    (Local { ring: ring.clone(), _one_thread: PhantomData }, Remote { ring })
}

impl<T: Entry> Local<T> {
    /// Appends `v`, or hands it back if the queue is full.
    #[inline]
    pub(crate) fn push(&self, v: T) -> Result<(), T> {
        let r = &*self.ring;
        let t = r.tail.load(Ordering::Relaxed);
        // Acquire: a thief's reads of a slot happen before its CAS moved the head past it, so
        // they happen before we overwrite that slot.
        let h = r.head.load(Ordering::Acquire);
        if t.wrapping_sub(h) > r.mask {
            return Err(v);
        }
        r.slot(t).store(v.into_word(), Ordering::Relaxed);
        // Release: whoever sees the new tail sees the slot.
        r.tail.store(t.wrapping_add(1), Ordering::Release);
        Ok(())
    }

    /// Takes the oldest entry.
    #[inline]
    pub(crate) fn pop(&self) -> Option<T> {
        let r = &*self.ring;
        let t = r.tail.load(Ordering::Relaxed);
        let mut h = r.head.load(Ordering::Acquire);
        loop {
            if h == t {
                return None;
            }
            // Claim first, read after: once the head is past `h`, no thief can take slot `h`
            // and only we write slots, so it holds what we stored.
            match r.head.compare_exchange_weak(h, h.wrapping_add(1), Ordering::AcqRel, Ordering::Acquire) {
                // SAFETY: the CAS gave us slot `h`, inside `[head, tail)`, exactly once.
                Ok(_) => return Some(unsafe { T::from_word(r.slot(h).load(Ordering::Relaxed)) }),
                Err(now) => h = now,
            }
        }
    }

    /// Moves up to `max` of the oldest entries to the back of `out`, in order, with one CAS.
    pub(crate) fn take_into(&self, out: &mut Vec<T>, max: usize) {
        let r = &*self.ring;
        let t = r.tail.load(Ordering::Relaxed);
        let mut h = r.head.load(Ordering::Acquire);
        loop {
            let n = t.wrapping_sub(h).min(max);
            if n == 0 {
                return;
            }
            match r.head.compare_exchange_weak(h, h.wrapping_add(n), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => h = now,
            }
        }
        let n = t.wrapping_sub(h).min(max);
        // In locals, as in `extend`.
        let (slots, mask) = (&*r.slots, r.mask);
        out.extend((0..n).map(|i| {
            // SAFETY: `i & mask` is in bounds, as in `Ring::slot`; as in `pop`, for each of the
            // `n` slots the CAS claimed.
            unsafe { T::from_word(slots.get_unchecked(h.wrapping_add(i) & mask).load(Ordering::Relaxed)) }
        }));
    }

    /// Appends every item of `items`, published with one store. The caller makes sure they fit
    /// (at most `free()` of them); extra ones are handed back in order.
    pub(crate) fn extend<I: Iterator<Item = T>>(&self, items: I) -> I {
        let r = &*self.ring;
        let t0 = r.tail.load(Ordering::Relaxed);
        let room = self.free();
        // In locals: the slots are atomics, so the compiler cannot tell a store to one from a
        // write to the ring's own fields, and reloaded both for every entry.
        let (slots, mask) = (&*r.slots, r.mask);
        let mut items = items;
        let mut t = t0;
        for v in items.by_ref().take(room) {
            // SAFETY: `slots.len() == mask + 1`, as in `Ring::slot`.
            unsafe { slots.get_unchecked(t & mask) }.store(v.into_word(), Ordering::Relaxed);
            t = t.wrapping_add(1);
        }
        if t != t0 {
            r.tail.store(t, Ordering::Release);
        }
        items
    }

    /// The words of the two entries a `pop` would take next (0 where there is none): only
    /// hints (a thief may take them meanwhile), for prefetching. Whatever they are, a slot only
    /// ever holds a word this owner pushed.
    #[inline]
    pub(crate) fn peek_words(&self) -> (usize, usize) {
        let r = &*self.ring;
        let h = r.head.load(Ordering::Relaxed);
        let len = r.tail.load(Ordering::Relaxed).wrapping_sub(h);
        let word = |i: usize| if len > i { r.slot(h.wrapping_add(i)).load(Ordering::Relaxed) } else { 0 };
        (word(0), word(1))
    }

    pub(crate) fn len(&self) -> usize {
        let r = &*self.ring;
        r.tail.load(Ordering::Relaxed).wrapping_sub(r.head.load(Ordering::Acquire))
    }

    /// Entries ever pushed (the tail counter, which never wraps on 64 bits).
    #[inline]
    pub(crate) fn pushed(&self) -> usize {
        self.ring.tail.load(Ordering::Relaxed)
    }

    /// Entries ever taken from the head, by the owner or by thieves: every entry pushed before
    /// the `pushed()` reading `mark` has left once `taken() >= mark`.
    #[inline]
    pub(crate) fn taken(&self) -> usize {
        self.ring.head.load(Ordering::Relaxed)
    }

    /// Slots a push can fill before the queue is full.
    pub(crate) fn free(&self) -> usize {
        self.ring.mask + 1 - self.len()
    }
}

impl<T: Entry> Remote<T> {
    /// How many entries have ever left the queue from its head (taken by the owner or stolen):
    /// the supervisor compares two readings to tell whether anyone takes from it.
    pub(crate) fn taken(&self) -> usize {
        self.ring.head.load(Ordering::Relaxed)
    }

    /// How many entries have ever been pushed: a searcher compares two readings to tell
    /// whether work still arrives here.
    pub(crate) fn pushed(&self) -> usize {
        self.ring.tail.load(Ordering::Relaxed)
    }

    /// How many entries the queue holds (a snapshot; it may have changed when this returns).
    pub(crate) fn len(&self) -> usize {
        let r = &*self.ring;
        let h = r.head.load(Ordering::Acquire);
        // Read after the head: the tail only grows, so this is never below the head.
        r.tail.load(Ordering::Acquire).wrapping_sub(h).min(r.mask + 1)
    }

    /// Whether the queue is empty, as the idle protocol's re-check needs it (`idle.rs`, steps
    /// 1–2): the owner pushes (a Release store of the tail), then `notify` fences (SeqCst) and
    /// reads the sleepers; a carrier going to sleep registers (a SeqCst RMW), then calls this,
    /// which fences before it reads the tail. With a SeqCst fence on both sides, either the
    /// pusher sees the sleeper or this sees the push.
    pub(crate) fn is_empty(&self) -> bool {
        let r = &*self.ring;
        let h = r.head.load(Ordering::Acquire);
        fence(Ordering::SeqCst);
        r.tail.load(Ordering::Acquire) == h
    }

    /// Takes about half of the queue, at most `limit` and at most what fits in `dst` plus one:
    /// the oldest is returned to run, the rest go to the back of `dst` (the thief's own queue),
    /// in order. `None` if the queue was empty.
    pub(crate) fn steal_into(&self, dst: &Local<T>, limit: usize) -> Option<T> {
        let r = &*self.ring;
        let d = &*dst.ring;
        let dt = d.tail.load(Ordering::Relaxed);
        let room = dst.free();
        loop {
            let h = r.head.load(Ordering::Acquire);
            let len = r.tail.load(Ordering::Acquire).wrapping_sub(h);
            if len == 0 {
                return None;
            }
            if len > r.mask + 1 {
                // The head we read is stale: the owner has since taken and refilled slots.
                std::hint::spin_loop();
                continue;
            }
            let n = len.div_ceil(2).min(limit.max(1)).min(room + 1);
            // Copy before claiming: until the CAS succeeds the owner may be overwriting these
            // slots, and the words are then garbage that the failed CAS makes us discard. The
            // copies land in `dst`'s slots past its tail, which nobody reads until we publish.
            let first = r.slot(h).load(Ordering::Relaxed);
            for i in 1..n {
                let w = r.slot(h.wrapping_add(i)).load(Ordering::Relaxed);
                d.slot(dt.wrapping_add(i - 1)).store(w, Ordering::Relaxed);
            }
            if r.head.compare_exchange(h, h.wrapping_add(n), Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                if n > 1 {
                    d.tail.store(dt.wrapping_add(n - 1), Ordering::Release);
                }
                // SAFETY: the CAS gave us slots `h..h + n` exactly once, and no slot in that
                // range was overwritten while we read it (module docs); the first is returned,
                // the others now belong to `dst`.
                return Some(unsafe { T::from_word(first) });
            }
            std::hint::spin_loop();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A test entry that counts its drops, so leaks and double takes show.
    struct Counted(Box<usize>);

    impl Entry for Counted {
        fn into_word(self) -> usize {
            Box::into_raw(self.0) as usize
        }
        unsafe fn from_word(word: usize) -> Self {
            // SAFETY: `word` came from `Box::into_raw` in `into_word`, taken back once.
            Counted(unsafe { Box::from_raw(word as *mut usize) })
        }
    }

    fn val(c: Option<Counted>) -> Option<usize> {
        c.map(|c| *c.0)
    }

    #[test]
    fn fifo_bounded_and_wraps() {
        let (local, remote) = new::<Counted>(4);
        for round in 0..3 {
            let base = round * 10;
            for i in 0..4 {
                assert!(local.push(Counted(Box::new(base + i))).is_ok());
            }
            let back = local.push(Counted(Box::new(99))).expect_err("a full queue hands the entry back");
            assert_eq!(*back.0, 99);
            assert_eq!((local.len(), remote.len(), local.free()), (4, 4, 0));
            for i in 0..4 {
                // SAFETY: the word is the next entry's box, still owned by the queue: read, not taken.
                assert_eq!(unsafe { *(local.peek_words().0 as *const usize) }, base + i);
                assert_eq!(val(local.pop()), Some(base + i), "FIFO across the wrap");
            }
            assert_eq!(local.peek_words(), (0, 0));
            assert!(local.pop().is_none() && remote.is_empty());
        }
    }

    #[test]
    fn batches_and_steals_keep_order() {
        let (a, a_remote) = new::<Counted>(8);
        let (b, _) = new::<Counted>(8);
        for i in 0..7 {
            a.push(Counted(Box::new(i))).ok().unwrap();
        }
        // Half of 7 is 4: one returned, three to `b`.
        assert_eq!(val(a_remote.steal_into(&b, 32)), Some(0));
        assert_eq!((a.len(), b.len()), (3, 3));
        let mut out = Vec::new();
        a.take_into(&mut out, 2);
        assert_eq!(out.iter().map(|c| *c.0).collect::<Vec<_>>(), [4, 5]);
        assert_eq!(val(b.pop()), Some(1));
        // `b` has 2 left; a steal from `a` (1 left) brings its last.
        assert_eq!(val(a_remote.steal_into(&b, 32)), Some(6));
        assert!(a_remote.steal_into(&b, 32).is_none());
        // `extend` fills what fits and hands back the rest, in order.
        let rest: Vec<usize> = b.extend((10..20).map(|i| Counted(Box::new(i)))).map(|c| *c.0).collect();
        assert_eq!(rest, [16, 17, 18, 19]);
        let all: Vec<usize> = std::iter::from_fn(|| val(b.pop())).collect();
        assert_eq!(all, [2, 3, 10, 11, 12, 13, 14, 15]);
    }

    #[test]
    fn a_steal_fills_only_the_room_the_thief_has() {
        let (a, a_remote) = new::<Counted>(16);
        let (b, _) = new::<Counted>(4);
        for i in 0..16 {
            a.push(Counted(Box::new(i))).ok().unwrap();
        }
        b.push(Counted(Box::new(100))).ok().unwrap();
        b.push(Counted(Box::new(101))).ok().unwrap();
        // Half of 16 is 8, but `b` has room for 2: 3 taken, one returned.
        assert_eq!(val(a_remote.steal_into(&b, 32)), Some(0));
        assert_eq!((a.len(), b.len()), (13, 4));
    }

    /// Dropping a queue with entries in it drops each entry once (valgrind / Miri would flag a
    /// leak or a double free of the boxes).
    #[test]
    fn dropping_a_queue_drops_what_it_holds() {
        let (a, remote) = new::<Counted>(4);
        for i in 0..3 {
            a.push(Counted(Box::new(i))).ok().unwrap();
        }
        drop(a.pop());
        drop(a);
        assert_eq!(remote.len(), 2);
        drop(remote);
    }

    /// Two thieves and the owner race over 100,000 entries: each is taken exactly once.
    #[test]
    fn owner_and_thieves_take_each_entry_once() {
        use std::sync::atomic::AtomicBool;
        const N: usize = 100_000;
        let (owner, remote) = new::<Counted>(CAPACITY);
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let thieves: Vec<_> = (0..2)
            .map(|_| {
                let remote = remote.clone();
                let done = done.clone();
                std::thread::spawn(move || {
                    let (mine, _) = new::<Counted>(CAPACITY);
                    let mut got = Vec::new();
                    while !done.load(std::sync::atomic::Ordering::Acquire) || !remote.is_empty() {
                        if let Some(c) = remote.steal_into(&mine, 32) {
                            got.push(*c.0);
                            got.extend(std::iter::from_fn(|| val(mine.pop())));
                        }
                    }
                    got
                })
            })
            .collect();
        let mut got = Vec::new();
        let mut spilled = Vec::new();
        for i in 0..N {
            if let Err(c) = owner.push(Counted(Box::new(i))) {
                owner.take_into(&mut spilled, CAPACITY / 2);
                owner.push(c).ok().unwrap();
            }
            if i % 3 == 0 {
                got.extend(val(owner.pop()));
            }
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        got.extend(std::iter::from_fn(|| val(owner.pop())));
        got.extend(spilled.iter().map(|c| *c.0));
        for t in thieves {
            got.extend(t.join().unwrap());
        }
        got.sort_unstable();
        assert_eq!(got.len(), N, "every entry taken once");
        assert!(got.iter().enumerate().all(|(i, &v)| i == v), "no entry taken twice or lost");
    }
}

#[cfg(all(test, loom))]
#[path = "tests/loom_run_queue.rs"]
mod loom_tests;
