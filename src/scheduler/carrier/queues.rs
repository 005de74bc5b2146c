//! Where the carrier puts a fiber made runnable: the LIFO slot, its private home queue, the
//! stealable deque, or (when that is full) the injector.

use super::*;

impl Carrier {
    /// Makes a fiber of this runtime runnable from this carrier.
    pub(crate) fn schedule_local(&self, f: FiberRef, wake: Wake) {
        if !self.slot().trace.load(Ordering::Relaxed).is_null() {
            // A tail call: the untraced path keeps its registers (a call here made every wake
            // save two more).
            return self.schedule_traced(f, wake);
        }
        self.schedule_untraced(f, wake);
    }

    /// `schedule_local` while a trace runs: the wake is recorded first.
    #[cold]
    #[inline(never)]
    fn schedule_traced(&self, f: FiberRef, wake: Wake) {
        self.trace_wake(FiberRef::as_ptr(&f), wake);
        self.schedule_untraced(f, wake);
    }

    #[inline(always)]
    fn schedule_untraced(&self, f: FiberRef, wake: Wake) {
        let stats = &self.slot().stats;
        if wake != Wake::Timer {
            bump(&stats.unparks, 1);
        }
        f.since.store(self.rt.clock.stamp(), Ordering::Relaxed);
        let home = f.home.load(Ordering::Relaxed);
        if home != NO_HOME && home != self.index {
            self.rt.push_inbox(home, f);
            return;
        }
        match wake {
            Wake::Unpark => {
                // Direct hand-off (Go's runnext): the woken fiber runs next here.
                if let Some(prev) = self.lifo_put(f) {
                    if self.push_back(prev) {
                        self.rt.notify();
                    }
                }
            }
            // A timer wake is one of a batch: `time::fire` notifies once for all of them.
            Wake::Timer => {
                self.push_back(f);
            }
            Wake::Joiner => {
                if self.push_back(f) {
                    self.rt.notify();
                }
            }
        }
    }

    /// A fiber just spawned here: to the back of the local deque (stealable), then wake an idle
    /// carrier. Its own entry point, not a `Wake` kind: a new fiber has no home, and spawns are
    /// the hottest call of all.
    #[inline]
    pub(crate) fn schedule_spawned(&self, f: FiberRef) {
        debug_assert_eq!(f.home.load(Ordering::Relaxed), NO_HOME);
        self.count_spawn(&f);
        if let Err(f) = self.worker.push(f) {
            self.push_full(f);
        }
        self.rt.notify();
    }

    /// A fiber just spawned here onto this very carrier by name (`vt::Builder::carrier`, as
    /// `vt::net::serve`'s acceptors spawn each connection): homed here and queued at home,
    /// where no one else takes it. What `Shared::schedule_spawned_on` does from elsewhere,
    /// without the inbox's atomics, the runtime-wide spawn count and a wake-up: only this
    /// carrier, which is running, may start it.
    pub(crate) fn schedule_spawned_home(&self, f: FiberRef) {
        self.count_spawn(&f);
        f.home.store(self.index, Ordering::Relaxed);
        self.home_push(f);
    }

    #[inline]
    fn count_spawn(&self, f: &FiberRef) {
        // Once: read again after the count's store, it was loaded twice.
        let slot = self.slot();
        bump(&slot.stats.spawned, 1);
        if !slot.trace.load(Ordering::Relaxed).is_null() {
            self.trace_spawn(FiberRef::as_ptr(f));
        }
    }

    /// Back of the local deque (spilling half to the injector when full); fibers at home here
    /// go to the home queue instead, where no one can steal them. Returns whether it went
    /// where another carrier may take it (worth a `notify`).
    pub(super) fn push_back(&self, f: FiberRef) -> bool {
        if f.home.load(Ordering::Relaxed) == self.index {
            self.home_push(f);
            return false;
        }
        if let Err(f) = self.worker.push(f) {
            self.push_full(f);
        }
        true
    }

    /// The records of the two fibers that will most likely run next, for `prefetch_ahead`
    /// (0 where there is none): the home queue's front while it holds fibers (a loop of
    /// started fibers, such as yielders, lives there), else the deque's.
    #[inline]
    pub(super) fn peek_next_two(&self) -> (usize, usize) {
        let home = self.home_queue();
        match home.peek_two() {
            (Some(a), b) => (FiberRef::as_ptr(a) as usize, b.map_or(0, |b| FiberRef::as_ptr(b) as usize)),
            (None, _) => self.worker.peek_words(),
        }
    }

    /// Queues a fiber at home here behind everything queued so far (see `home`).
    #[inline]
    pub(super) fn home_push(&self, f: FiberRef) {
        let mut home = self.home_queue();
        home.push_back(f, self.worker.pushed());
        self.slot().home_len.store(home.len(), Ordering::Relaxed);
    }

    /// The oldest fiber of the home queue, if everything queued in the deque before it has left
    /// (`due_only`), or in any case.
    #[inline]
    pub(super) fn home_pop(&self, due_only: bool) -> Option<FiberRef> {
        let mut home = self.home_queue();
        if home.len() == 0 {
            return None;
        }
        let f = home.pop_front(due_only.then(|| self.worker.taken()))?;
        self.slot().home_len.store(home.len(), Ordering::Relaxed);
        Some(f)
    }

    /// Moves what other threads woke for this carrier into the home queue, in arrival order.
    #[cold]
    #[inline(never)]
    pub(super) fn drain_inbox(&self) {
        for f in self.slot().inbox.take_all() {
            self.home_push(f);
        }
    }

    /// A push onto a full deque: spill half of it, then push.
    #[cold]
    #[inline(never)]
    pub(super) fn push_full(&self, f: FiberRef) {
        self.spill();
        // Half the slots are free now (only this carrier fills them). Were they not, the fiber
        // goes to the injector: a run-queue entry is never dropped.
        if let Err(f) = self.worker.push(f) {
            self.rt.injector.push(self.index, f);
        }
    }

    /// The older half of a full deque to the injector: gathered privately, then appended
    /// under one lock, with no allocation (the buffer is kept) and no record touched.
    #[cold]
    #[inline(never)]
    pub(super) fn spill(&self) {
        let mut spill = self.spill_buffer();
        self.worker.take_into(&mut spill, LOCAL_CAP / 2);
        bump(&self.slot().stats.injector_pushes, spill.len() as u64);
        self.rt.injector.push_batch(self.index, &mut spill);
    }

    pub(super) fn lifo_take(&self) -> Option<FiberRef> {
        let slot = &self.slot().lifo;
        if slot.load(Ordering::Relaxed).is_null() {
            return None;
        }
        // SAFETY: the slot holds null or a pointer from `FiberRef::into_raw`; the swap takes it
        // out exactly once.
        unsafe { FiberRef::from_raw(slot.swap(std::ptr::null_mut(), Ordering::Acquire)) }
    }

    pub(super) fn lifo_put(&self, f: FiberRef) -> Option<FiberRef> {
        let p = self.slot().lifo.swap(FiberRef::into_raw(f), Ordering::AcqRel);
        // SAFETY: as in `lifo_take`.
        unsafe { FiberRef::from_raw(p) }
    }

    pub(super) fn flush_to_injector(&self) {
        let mut rest = self.spill_buffer();
        if let Some(f) = self.lifo_take() {
            if f.home.load(Ordering::Relaxed) == self.index {
                // At home here (woken into the LIFO slot): it may run nowhere else, so it goes
                // to this carrier's inbox, which brings a retiring spare back (`Shared::revive`).
                self.rt.push_inbox(self.index, f);
            } else {
                rest.push(f);
            }
        }
        // The same for the home queue (empty when a spare retires: see `run_loop`; at
        // shutdown, the runtime's drop finds these in the inbox).
        while let Some(f) = self.home_pop(false) {
            self.rt.push_inbox(self.index, f);
        }
        self.worker.take_into(&mut rest, usize::MAX);
        self.rt.injector.push_batch(self.index, &mut rest);
    }
}
