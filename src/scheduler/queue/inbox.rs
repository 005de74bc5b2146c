//! A carrier's inbox: fibers at home on this carrier, made runnable by another thread (a wake
//! from another carrier, a plain thread, a timer or the reactor fired elsewhere).
//!
//! Started fibers run only on their home carrier (`arch/decisions/0003-home-carriers.md`), so
//! a wake from elsewhere cannot put the fiber in the waker's own queues: it goes here. The
//! inbox is an intrusive stack (Treiber's) linked through the entries themselves (a word in the
//! fiber's record), so a push allocates nothing and takes no lock: it writes the entry's link
//! and swings the head with one CAS. The owner takes the whole stack with one swap and reverses
//! it into arrival order, straight into its private home queue (`Carrier::drain_inbox`); a
//! taker that swapped the chain out owns all of it, so there is no ABA (nobody pops one entry
//! while others push). Not a `Mutex<VecDeque>`: every cross-carrier wake and every pinned
//! yield would take its lock (`arch/performance.md`).
//!
//! The idle protocol (`idle.rs`) sees the inbox through [`Inbox::is_empty`], fenced like the
//! run queue's: a pusher pushes, then fences and reads the sleepers; a carrier going to sleep
//! registers, then fences and reads the head. The atomics are `crate::loom`'s, so its
//! model (`tests/loom_inbox.rs`) runs this code.

use std::marker::PhantomData;

use super::run_queue::Entry;
use crate::loom::{AtomicUsize, Ordering, fence};

/// An entry that carries its own link: the inbox threads entries through it.
pub(crate) trait Linked: Entry {
    /// The link word of the entry whose word is `word`.
    ///
    /// # Safety
    /// `word` came from `into_word` of an entry that is still live (not taken back yet).
    unsafe fn link<'a>(word: usize) -> &'a AtomicUsize;
}

impl Linked for crate::fiber::FiberRef {
    unsafe fn link<'a>(word: usize) -> &'a AtomicUsize {
        // SAFETY: the word is a live record's pointer (caller's contract); records are freed
        // only with their runtime, which outlives its carriers' inboxes.
        unsafe { &(*(word as *const crate::fiber::FiberRecord)).inbox_next }
    }
}

/// A multi-producer stack that is taken whole.
pub(crate) struct Inbox<T: Linked> {
    /// The newest entry's word, 0 when empty.
    head: AtomicUsize,
    _owns: PhantomData<T>,
}

// SAFETY: entries move between threads only through the head's Release/Acquire (a push
// publishes the entry and its link; a take acquires them), and `Entry` values are owned by
// whoever holds them; the queue holds `Send` entries only.
unsafe impl<T: Linked + Send> Send for Inbox<T> {}
// SAFETY: as above: every shared access goes through the atomic head.
unsafe impl<T: Linked + Send> Sync for Inbox<T> {}

impl<T: Linked> Inbox<T> {
    pub(crate) fn new() -> Inbox<T> {
        Inbox { head: AtomicUsize::new(0), _owns: PhantomData }
    }

    /// Pushes `v`. Lock-free; the caller then wakes the owner if it sleeps (see the module doc).
    pub(crate) fn push(&self, v: T) {
        let w = v.into_word();
        // SAFETY: `w` is the live entry we just gave up; until the CAS below publishes it,
        // nobody else sees it, so we may write its link.
        let link = unsafe { T::link(w) };
        let mut h = self.head.load(Ordering::Relaxed);
        loop {
            link.store(h, Ordering::Relaxed);
            // Release: whoever swaps the chain out sees the link and the entry's contents.
            match self.head.compare_exchange_weak(h, w, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => h = now,
            }
        }
    }

    /// A cheap look (no fence): whether anything may be waiting. For the owner's fast path.
    #[inline]
    pub(crate) fn maybe_nonempty(&self) -> bool {
        self.head.load(Ordering::Relaxed) != 0
    }

    /// Whether the inbox is empty, as the idle protocol's re-check needs it: fenced (SeqCst)
    /// before the load, pairing with the fence a pusher makes before it reads the sleepers.
    pub(crate) fn is_empty(&self) -> bool {
        fence(Ordering::SeqCst);
        self.head.load(Ordering::Acquire) == 0
    }

    /// Takes every entry, oldest first. Any thread may call it: the swap gives the whole chain
    /// to one caller.
    pub(crate) fn take_all(&self) -> Drain<T> {
        if self.head.load(Ordering::Relaxed) == 0 {
            return Drain { next: 0, _owns: PhantomData };
        }
        let mut w = self.head.swap(0, Ordering::Acquire);
        // The chain runs newest to oldest: reverse it in place so it drains in arrival order.
        let mut prev = 0;
        while w != 0 {
            // SAFETY: every word in the chain is a live entry that the swap made ours.
            let link = unsafe { T::link(w) };
            let next = link.load(Ordering::Relaxed);
            link.store(prev, Ordering::Relaxed);
            prev = w;
            w = next;
        }
        Drain { next: prev, _owns: PhantomData }
    }
}

impl<T: Linked> Drop for Inbox<T> {
    fn drop(&mut self) {
        drop(self.take_all());
    }
}

/// The entries taken from an inbox, oldest first; those not iterated are dropped with it.
pub(crate) struct Drain<T: Linked> {
    next: usize,
    _owns: PhantomData<T>,
}

impl<T: Linked> Iterator for Drain<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        let w = self.next;
        if w == 0 {
            return None;
        }
        // SAFETY: `w` is a live entry of the chain we own; read its link before giving it back.
        self.next = unsafe { T::link(w) }.load(Ordering::Relaxed);
        // SAFETY: each word of the chain is taken back exactly once, here.
        Some(unsafe { T::from_word(w) })
    }
}

impl<T: Linked> Drop for Drain<T> {
    fn drop(&mut self) {
        self.for_each(drop);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(not(loom))]
    use crate::loom::Arc;

    /// A boxed node: its word is the box's address, its link a field.
    pub(super) struct Node {
        pub(super) value: usize,
        link: AtomicUsize,
    }

    impl Entry for Box<Node> {
        fn into_word(self) -> usize {
            Box::into_raw(self) as usize
        }

        unsafe fn from_word(word: usize) -> Self {
            // SAFETY: `word` came from `into_word` (caller's contract), taken back once.
            unsafe { Box::from_raw(word as *mut Node) }
        }
    }

    impl Linked for Box<Node> {
        unsafe fn link<'a>(word: usize) -> &'a AtomicUsize {
            // SAFETY: a live node's address (caller's contract).
            unsafe { &(*(word as *const Node)).link }
        }
    }

    pub(super) fn node(value: usize) -> Box<Node> {
        Box::new(Node { value, link: AtomicUsize::new(0) })
    }

    #[cfg(not(loom))]
    #[test]
    fn drains_in_arrival_order_and_drops_what_is_left() {
        let inbox = Inbox::new();
        assert!(inbox.is_empty());
        for v in 1..=5 {
            inbox.push(node(v));
        }
        assert!(!inbox.is_empty() && inbox.maybe_nonempty());
        let mut d = inbox.take_all();
        assert_eq!(d.next().map(|n| n.value), Some(1));
        assert_eq!(d.next().map(|n| n.value), Some(2));
        drop(d); // 3, 4, 5 freed (miri/valgrind would see a leak otherwise)
        assert!(inbox.is_empty());
        inbox.push(node(6));
        assert_eq!(inbox.take_all().map(|n| n.value).collect::<Vec<_>>(), [6]);
    }

    #[cfg(not(loom))]
    #[test]
    fn many_pushers_one_taker_get_each_entry_once_in_per_pusher_order() {
        let inbox = Arc::new(Inbox::new());
        let per = 20_000;
        let pushers: Vec<_> = (0..3)
            .map(|t| {
                let inbox = inbox.clone();
                std::thread::spawn(move || (0..per).for_each(|i| inbox.push(node(t * per + i))))
            })
            .collect();
        let mut seen = Vec::new();
        while seen.len() < 3 * per {
            seen.extend(inbox.take_all().map(|n| n.value));
        }
        pushers.into_iter().for_each(|h| h.join().unwrap());
        // Each pusher's entries arrive in the order it pushed them.
        for t in 0..3 {
            let mine: Vec<_> = seen.iter().copied().filter(|v| v / per == t).collect();
            assert!(mine.windows(2).all(|w| w[0] < w[1]), "pusher {t} out of order");
            assert_eq!(mine.len(), per);
        }
    }
}

#[cfg(all(test, loom))]
#[path = "tests/loom_inbox.rs"]
mod loom_tests;
