//! A carrier's home queue: the started fibers at home on it that are runnable, oldest first,
//! each with a mark (the deque's push count when it was queued; see `Carrier::home_pop`).
//!
//! Private to its carrier (no atomics): a ring of a power-of-two size, with the front's
//! position (`head`, which never wraps on a 64-bit target) and the length, so a slot is
//! `i & mask` and neither a push nor a pop checks for a wrap. The length, not a tail counter:
//! a yield's round trip (`push_pop_due`) leaves it as it was and moves only the head, and the
//! prefetch's peek reads it as it is. Positions, lengths and the mask count bytes, not entries
//! (an entry's size is a power of two), so an index is a mask and an add, with no scaling
//! shift. It grows (doubles, out of line) when full and never shrinks, so a steady state
//! allocates nothing. Not a `VecDeque`: its index arithmetic for an arbitrary capacity (a
//! compare and a conditional move per access) and its growth check on every push would sit on
//! every yield (`arch/performance.md`).
//! See `arch/scheduler.md`.

use std::mem::{MaybeUninit, size_of};

pub(crate) struct HomeQueue<T> {
    /// `slots.len()` is a power of two; the live entries are the `len` bytes from `head` on.
    slots: Box<[MaybeUninit<(T, usize)>]>,
    /// The ring's size in bytes, less one.
    mask: usize,
    /// Bytes: the entries ever taken from the front, times the entry size.
    head: usize,
    /// Bytes: the entries queued, times the entry size.
    len: usize,
}

impl<T> HomeQueue<T> {
    /// An entry's size, a power of two (checked when a queue is made), so that a byte
    /// position masked with `mask` is a whole entry's offset inside the ring.
    const SIZE: usize = size_of::<(T, usize)>();

    /// An empty queue with room for `capacity` entries (rounded up to a power of two).
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        const { assert!(Self::SIZE.is_power_of_two()) };
        let n = capacity.max(2).next_power_of_two();
        HomeQueue {
            slots: (0..n).map(|_| MaybeUninit::uninit()).collect(),
            mask: n * Self::SIZE - 1,
            head: 0,
            len: 0,
        }
    }

    /// The slot at byte position `at` (any multiple of the entry size: it wraps).
    #[inline(always)]
    fn slot(&mut self, at: usize) -> *mut (T, usize) {
        // SAFETY: `at` is a multiple of `SIZE` (positions move by whole entries), so `at & mask`
        // is one too (`mask + 1` is a multiple of `SIZE`, both powers of two) and below the
        // ring's size in bytes: the start of a slot of `slots`.
        unsafe { self.slots.as_mut_ptr().cast::<u8>().add(at & self.mask).cast() }
    }

    #[inline(always)]
    fn slot_ref(&self, at: usize) -> *const (T, usize) {
        // SAFETY: as in `slot`.
        unsafe { self.slots.as_ptr().cast::<u8>().add(at & self.mask).cast() }
    }

    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.len / Self::SIZE
    }

    /// Queues `v` at the back with its `mark`.
    #[inline(always)]
    pub(crate) fn push_back(&mut self, v: T, mark: usize) {
        if self.len > self.mask {
            self.grow();
        }
        let (h, n) = (self.head, self.len);
        // SAFETY: the slot after the live entries holds nothing (the queue is not full).
        unsafe { self.slot(h + n).write((v, mark)) };
        self.len = n + Self::SIZE;
    }

    /// The oldest entry, if its mark is at most `taken` (`due`), or in any case.
    #[inline(always)]
    pub(crate) fn pop_front(&mut self, due: Option<usize>) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let h = self.head;
        // SAFETY: `h` is the front, a live entry.
        if due.is_some_and(|taken| unsafe { (*self.slot_ref(h)).1 } > taken) {
            return None;
        }
        self.head = h + Self::SIZE;
        self.len -= Self::SIZE;
        // SAFETY: as above; the entry leaves the queue (the head moved past it), read once.
        Some(unsafe { self.slot(h).read().0 })
    }

    /// `push_back(v, mark)`, then `pop_front(Some(taken))`, in one step: the queue's length
    /// does not change when the front is due, so neither a growth check nor a length update
    /// is needed (a yield's round trip when the yielder goes behind fibers already queued).
    #[inline(always)]
    pub(crate) fn push_pop_due(&mut self, v: T, mark: usize, taken: usize) -> Option<T> {
        let (h, n) = (self.head, self.len);
        if n == 0 {
            // `v` would be the front.
            if mark <= taken {
                return Some(v);
            }
        } else {
            let front = self.slot(h);
            // SAFETY: `h` is the front, a live entry.
            if unsafe { (*front).1 } <= taken {
                // SAFETY: a live entry, leaving the queue (the head moves past it below).
                let (next, _) = unsafe { front.read() };
                // SAFETY: the slot after the live entries holds nothing, or, when the queue is
                // full, it is the front's slot (`(h + n) & mask == h & mask`), read just
                // above: free either way.
                unsafe { self.slot(h + n).write((v, mark)) };
                self.head = h + Self::SIZE;
                return Some(next);
            }
        }
        self.push_back(v, mark);
        None
    }

    /// The oldest two entries, for a prefetch.
    #[inline(always)]
    pub(crate) fn peek_two(&self) -> (Option<&T>, Option<&T>) {
        let h = self.head;
        // SAFETY: the `len` bytes of entries from `head` on are live; the references borrow
        // `self`.
        let at = |i: usize| unsafe { &(*self.slot_ref(i)).0 };
        match self.len {
            0 => (None, None),
            n if n == Self::SIZE => (Some(at(h)), None),
            _ => (Some(at(h)), Some(at(h + Self::SIZE))),
        }
    }

    /// Twice the room, the live entries moved over in order.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let n = self.slots.len();
        let mut bigger: Box<[MaybeUninit<(T, usize)>]> = (0..2 * n).map(|_| MaybeUninit::uninit()).collect();
        for k in 0..self.len() {
            // SAFETY: a live entry, moved once into the new ring's slot `k` (in bounds: the old
            // ring held at most `n` of them).
            unsafe { bigger[k].write(self.slot(self.head + k * Self::SIZE).read()) };
        }
        self.head = 0;
        self.slots = bigger;
        self.mask = 2 * n * Self::SIZE - 1;
    }
}

impl<T> Drop for HomeQueue<T> {
    fn drop(&mut self) {
        while self.pop_front(None).is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::HomeQueue;
    use std::rc::Rc;

    #[test]
    fn fifo_across_growth_and_wraps() {
        let mut q = HomeQueue::with_capacity(4);
        let mut next_in = 0;
        let mut next_out = 0;
        // Interleave pushes and pops so that the counters wrap the ring many times, and let it
        // grow twice on the way.
        for round in 0..100 {
            for _ in 0..(round % 7) {
                q.push_back(next_in, next_in);
                next_in += 1;
            }
            for _ in 0..(round % 5) {
                if let Some(v) = q.pop_front(None) {
                    assert_eq!(v, next_out);
                    next_out += 1;
                }
            }
            assert_eq!(q.len(), next_in - next_out);
        }
        while let Some(v) = q.pop_front(None) {
            assert_eq!(v, next_out);
            next_out += 1;
        }
        assert_eq!(next_out, next_in);
        assert!(q.slots.len() > 4, "the test meant to make it grow");
    }

    #[test]
    fn pop_due_respects_the_mark() {
        let mut q = HomeQueue::with_capacity(4);
        assert_eq!(q.peek_two(), (None, None));
        q.push_back('a', 5);
        assert_eq!(q.peek_two(), (Some(&'a'), None));
        assert_eq!(q.pop_front(Some(4)), None);
        assert_eq!(q.len(), 1);
        q.push_back('b', 6);
        assert_eq!(q.peek_two(), (Some(&'a'), Some(&'b')));
        assert_eq!(q.pop_front(Some(5)), Some('a'));
        assert_eq!(q.pop_front(Some(5)), None);
        assert_eq!(q.pop_front(None), Some('b'));
        assert_eq!(q.pop_front(Some(9)), None);
    }

    #[test]
    fn push_pop_due_is_a_push_then_a_due_pop() {
        // Empty: the pushed entry is the front.
        let mut q = HomeQueue::with_capacity(2);
        assert_eq!(q.push_pop_due('a', 3, 3), Some('a'));
        assert_eq!(q.len(), 0);
        assert_eq!(q.push_pop_due('a', 4, 3), None);
        assert_eq!(q.len(), 1);
        // Front not due: queued behind it.
        assert_eq!(q.push_pop_due('b', 4, 3), None);
        assert_eq!(q.len(), 2);
        // Full (capacity 2), front due: the front leaves, the new one takes its slot.
        assert_eq!(q.push_pop_due('c', 9, 4), Some('a'));
        assert_eq!(q.len(), 2);
        assert_eq!(q.peek_two(), (Some(&'b'), Some(&'c')));
        assert_eq!(q.pop_front(None), Some('b'));
        assert_eq!(q.pop_front(None), Some('c'));
        assert_eq!(q.pop_front(None), None);
        assert_eq!(q.peek_two(), (None, None));
    }

    #[test]
    fn dropping_a_non_empty_queue_drops_its_entries() {
        let live = Rc::new(());
        let mut q = HomeQueue::with_capacity(2);
        for i in 0..5 {
            q.push_back(live.clone(), i);
        }
        drop(q.pop_front(None));
        assert_eq!(Rc::strong_count(&live), 5);
        drop(q);
        assert_eq!(Rc::strong_count(&live), 1);
    }
}
