//! Running a fiber: claim, resume, and act on what its switch out asked (yield, park, finish),
//! plus the `blocking` section bookkeeping the supervisor reads.

use super::caches::take_finished;
use super::*;
use crate::scheduler::shared::{CAUGHT, IN_BLOCKING, TRACING};

impl Carrier {
    /// Runs `f`, and then, as long as each fiber yields straight to the next (`yield_at_home`),
    /// the fibers it hands over to, without going back through the loop.
    #[inline(always)]
    pub(super) fn run_fiber(&self, mut f: FiberRef) {
        // Only the first: a fiber a yield hands over was the queue's front at the switch
        // before, whose `prefetch_ahead` already fetched its stack lines.
        prefetch_stack(&f);
        loop {
            debug_assert!({
                let home = f.home.load(Ordering::Relaxed);
                home == NO_HOME || home == self.index
            });
            match f.try_claim() {
                Claim::Claimed => {}
                Claim::Compacted => self.restore(&f),
                Claim::Lost => return,
            }
            // One call site, so that it is inlined here as before compaction existed.
            match self.run_claimed(f) {
                Some(next) => f = next,
                None => return,
            }
        }
    }

    /// Starts the loads that the next two switches will wait on, so that they overlap the
    /// bookkeeping and the fibers' runs instead of forming a chain of misses (queue entry →
    /// record → saved stack pointer → the stack line a resume pops registers from): the next
    /// queued fiber's stack lines (its record was prefetched one switch ago) and the record of
    /// the one after it. This fiber's own stack lines were fetched as the next one's a switch
    /// ago, or by `run_fiber` when it came from elsewhere.
    #[inline]
    pub(super) fn prefetch_ahead(&self) {
        use crate::platform::prefetch;
        let (next, after) = self.peek_next_two();
        if next != 0 {
            // SAFETY: a run-queue slot only ever holds a record pointer this carrier pushed, and
            // records are freed only when the runtime is dropped, so even a stale one (taken by
            // a thief meanwhile) is live memory.
            prefetch_stack(unsafe { &*(next as *const FiberRecord) });
        }
        if after != 0 {
            prefetch(after);
            prefetch(after + 64);
            prefetch(after + 127);
        }
    }

    /// A fiber parked long ago: copy its stack back before it runs (see `fiber/compact.rs`).
    #[cold]
    #[inline(never)]
    pub(super) fn restore(&self, f: &FiberRecord) {
        // SAFETY: we claimed it (exclusive), and the claim cleared `COMPACTED`.
        let bytes = unsafe { f.restore_stack() };
        let stats = &self.slot().stats;
        bump(&stats.restores, 1);
        bump(&stats.restored_bytes, bytes as u64);
    }

    /// Runs a claimed fiber until it switches out; returns the fiber to run next when a yield
    /// chose it (`yield_at_home`).
    pub(super) fn run_claimed(&self, mut f: FiberRef) -> Option<FiberRef> {
        self.prefetch_ahead();
        let slot = self.slot();
        self.current.set(FiberRef::as_ptr(&f));
        if !f.started.get() {
            // One look-up of the spawn site serves the hand-off and the count of runs.
            let site = slot.locations.entry(f.spawned_at());
            let known = site.is_some_and(|e| e.known.load(Ordering::Relaxed));
            // Not one spawned onto this carrier by name (`Builder::carrier`, homed already):
            // the spawner chose where it runs.
            if known && !self.is_spare && f.home.load(Ordering::Relaxed) == NO_HOME {
                match self.give_known_blocker_away(f) {
                    Ok(()) => {
                        // Its run is counted where it starts.
                        self.current.set(std::ptr::null());
                        return None;
                    }
                    Err(back) => f = back,
                }
            }
            // The start count this start will store; placement by load looks at the loads when
            // its low bits are 0 (`place.rs`, step 1).
            let started = slot.stats.started.load(Ordering::Relaxed).wrapping_add(1);
            if started & self.place_mask.get() == 0 {
                match self.place(f, known) {
                    Ok(()) => {
                        self.current.set(std::ptr::null());
                        return None;
                    }
                    Err(back) => f = back,
                }
            }
            f.started.set(true);
            if !self.rt.config.migrate_started_fibers {
                f.home.store(self.index, Ordering::Relaxed);
            } else if f.home.load(Ordering::Relaxed) != NO_HOME {
                // Spawned onto this carrier by name: it started here, and now moves as any.
                f.home.store(NO_HOME, Ordering::Relaxed);
            }
            slot.stats.started.store(started, Ordering::Relaxed);
            // SAFETY: we popped `f`: exclusive access; it has not started, so holds none.
            if !unsafe { self.bind_cached(&f) || f.bind(self.take_coroutine(f.class())) } {
                // No stack: its join handle got the error; it is finished.
                bump(&slot.stats.finished, 1);
                FiberRecord::finish_now(&f);
                self.current.set(std::ptr::null());
                return None;
            }
            if let Some(e) = site {
                locations::count_run(e);
            }
            if known {
                // Known to block: the whole fiber is a blocking section, compensated at once.
                f.blocking_depth.set(1);
                f.blocking_at.set(Some(f.spawned_at()));
                self.enter_blocking(f.spawned_at());
            } else {
                // A fiber that has not run is in no blocking section: no need to look.
                slot.location.store(f.spawned_at() as *const _ as *mut _, Ordering::Release);
            }
        } else {
            match f.blocking_at.get() {
                Some(at) if f.blocking_depth.get() > 0 => self.enter_blocking(at),
                _ => slot.location.store(f.spawned_at() as *const _ as *mut _, Ordering::Release),
            }
        }
        f.carrier.store(self.index as u32, Ordering::Relaxed);
        f.since.store(self.rt.clock.stamp(), Ordering::Relaxed);
        // The fiber body catches every panic itself; one escaping a resume is a runtime bug,
        // and unwinding on could drop a half-switched fiber's record. A guard rather than
        // `catch_unwind`: that costs a call and register spills around every resume, the guard
        // nothing until it fires.
        let abort = AbortOnUnwind;
        let after = loop {
            // The slot's only writer, so a load and a store (`bump`): one instruction, where a
            // private copy stored to the slot was four (`arch/performance.md`).
            bump(&slot.progress, 1);
            // SAFETY: we popped `f` from a queue (or it was just handed to us), so this carrier
            // is the only one running it: exclusive access to its coroutine.
            let co = unsafe { f.co_mut() }.as_mut().expect("a runnable fiber has its coroutine");
            // The record: a coroutine between fibers takes it as its next fiber's.
            let why = match co.resume(FiberRef::as_ptr(&f)) {
                CoroutineResult::Yield(why) => why,
                // Only a cancelled fiber's coroutine returns; taken as finished.
                CoroutineResult::Return(()) => Suspend::Finished,
            };
            if why != Suspend::Park {
                break why;
            }
            bump(&slot.stats.parks, 1);
            if f.try_set_parked() {
                break Suspend::Park;
            }
            // An unpark came while it was switching out: run it again at once.
        };
        std::mem::forget(abort);
        self.switched_out(&f, after);
        match after {
            Suspend::Yield => {
                // No stamp: a yielded fiber's `since` stays when its run began, so a dump counts
                // its last run as time queued. The coarse clock moves once per supervisor
                // interval, so the two differ only for a run about that long; a stamp per switch
                // is what W5's floor asks to save (`arch/performance.md`, the floor's log).
                f.set_yielded();
                // What `schedule_local` decides for a yield, without its dispatch on the wake
                // kind: a fiber that ran here is at home here, or has none.
                debug_assert!(
                    matches!(f.home.load(Ordering::Relaxed), NO_HOME)
                        || f.home.load(Ordering::Relaxed) == self.index
                );
                if f.home.load(Ordering::Relaxed) != NO_HOME {
                    return self.yield_at_home(f);
                }
                self.current.set(std::ptr::null());
                if let Err(f) = self.worker.push(f) {
                    self.push_full(f);
                }
            }
            Suspend::Park => {
                self.current.set(std::ptr::null());
                // The run reference stays with the parked fiber: whoever unparks it takes it
                // over (`FiberRef::take_parked_ref`).
                std::mem::forget(f);
            }
            Suspend::Finished => {
                self.finish(&f);
                self.current.set(std::ptr::null());
                if let Some(record) = FiberRef::release_finished(f) {
                    self.give_record(record);
                }
            }
        }
        None
    }

    /// A fiber at home here yielded: queue it behind the others and, where `run_loop` would
    /// take the home queue's front next anyway, return that front to run at once. That is so
    /// when nothing else asks for a look first: not the 61st tick (timers, the injector, the
    /// reactor), an empty inbox and hand-off slot, and a front that is due (nothing queued in
    /// the deque before it). Then the yielder's push and the front's pop are one step that
    /// leaves the queue's length as it was, and the loop's checks between fibers (shutdown, a
    /// spare's retirement, the searching state) are skipped: this carrier was not searching,
    /// a spare does not retire with fibers at home, and the 61st tick goes back to the loop,
    /// which then sees a shutdown. Otherwise `None`: the fiber is queued as before.
    #[inline(always)]
    fn yield_at_home(&self, f: FiberRef) -> Option<FiberRef> {
        let slot = self.slot();
        let left = self.ticks_left.get();
        let mut home = self.home_queue();
        // At 1, the next tick is the 61st.
        if left > 1 && !slot.inbox.maybe_nonempty() && slot.lifo.load(Ordering::Relaxed).is_null() {
            if let Some(next) = home.push_pop_due(f, self.worker.pushed(), self.worker.taken()) {
                // What `next_local` records when it takes the home queue's front.
                self.ticks_left.set(left - 1);
                self.lifo_streak.set(0);
                return Some(next);
            }
        } else {
            home.push_back(f, self.worker.pushed());
        }
        slot.home_len.store(home.len(), Ordering::Relaxed);
        self.current.set(std::ptr::null());
        None
    }

    /// A fiber about to start here whose spawn site is known to block (`locations.rs`) starts
    /// on a carrier of its own instead (`Shared::carrier_for_blocking`), so that it does not
    /// hold up the fibers at home here. Only with fibers at home: where they migrate,
    /// compensation already frees them. `Err` gives the fiber back to run here; `Ok` means it
    /// went to the other carrier's inbox with its run reference, queued `RUNNING` as a yielded
    /// fiber is (we hold its claim).
    #[cold]
    #[inline(never)]
    pub(super) fn give_known_blocker_away(&self, f: FiberRef) -> Result<(), FiberRef> {
        if self.rt.config.migrate_started_fibers {
            return Err(f);
        }
        let Some(i) = self.rt.carrier_for_blocking() else { return Err(f) };
        f.home.store(i, Ordering::Relaxed);
        f.set_yielded();
        self.rt.push_inbox(i, f);
        Ok(())
    }

    /// Bookkeeping when fiber `f` leaves this carrier: the supervisor's view, blocking state and
    /// the trace. Caught, blocking and tracing are rare and share one word: one load tests all
    /// three, so the trace's only hook on the switch costs nothing while no trace runs.
    pub(super) fn switched_out(&self, f: &FiberRef, after: Suspend) {
        let slot = self.slot();
        if slot.flags.load(Ordering::Relaxed) != 0 {
            return self.switched_out_flagged(f, after);
        }
        slot.location.store(std::ptr::null_mut(), Ordering::Release);
    }

    /// `switched_out` when a trace runs, the carrier was caught blocked or is in a blocking
    /// section.
    #[cold]
    #[inline(never)]
    fn switched_out_flagged(&self, f: &FiberRef, after: Suspend) {
        let slot = self.slot();
        let flags = slot.flags.load(Ordering::Relaxed);
        if flags & TRACING != 0 {
            self.trace_slice(f, after);
        }
        if flags & (IN_BLOCKING | CAUGHT) == 0 {
            slot.location.store(std::ptr::null_mut(), Ordering::Release);
            return;
        }
        // This carrier is the only writer of `location`: a load and a store, not a swap.
        let loc = slot.location.load(Ordering::Relaxed);
        slot.location.store(std::ptr::null_mut(), Ordering::Release);
        if slot.flags.load(Ordering::Relaxed) & CAUGHT != 0
            && slot.flags.fetch_and(!CAUGHT, Ordering::Acquire) & CAUGHT != 0
            && !loc.is_null()
        {
            // SAFETY: `location` only ever holds `&'static Location` pointers.
            slot.locations.record_caught(unsafe { &*loc });
        }
        self.exit_blocking();
    }

    /// The running fiber is about to block this thread (a `blocking` section, or a fiber from a
    /// known-blocking location): count this carrier as blocked and compensate now.
    pub(crate) fn enter_blocking(&self, at: &'static std::panic::Location<'static>) {
        let slot = self.slot();
        if let Some(ring) = slot.tracing() {
            let me = self.current.get();
            // SAFETY: the fiber running on this carrier: live while it runs.
            let id = if me.is_null() { 0 } else { unsafe { (*me).id().as_u64() } };
            ring.push(Event::new(Kind::Blocking, id, 0, trace::site(at)));
        }
        slot.location.store(at as *const _ as *mut _, Ordering::Release);
        if slot.flags.fetch_or(IN_BLOCKING, Ordering::AcqRel) & IN_BLOCKING == 0 {
            self.rt.blocked.fetch_add(1, Ordering::AcqRel);
            self.rt.compensate();
        }
    }

    /// The blocking section ended (or its fiber switched out).
    pub(crate) fn exit_blocking(&self) {
        let slot = self.slot();
        if slot.in_blocking(Ordering::Relaxed)
            && slot.flags.fetch_and(!IN_BLOCKING, Ordering::AcqRel) & IN_BLOCKING != 0
        {
            self.rt.blocked.fetch_sub(1, Ordering::AcqRel);
            self.rt.shrink();
        }
    }

    /// Marks the current fiber's location again (after a blocking section inside it ended).
    pub(crate) fn set_location(&self, at: &'static std::panic::Location<'static>) {
        self.slot().location.store(at as *const _ as *mut _, Ordering::Release);
    }

    pub(super) fn finish(&self, f: &FiberRef) {
        // SAFETY: the fiber just returned on this carrier: nobody else can touch it.
        let slot = unsafe { f.co_mut() };
        // SAFETY: as above: exclusive access to the slot.
        if !unsafe { self.keep_finished(slot, f.class()) } {
            // SAFETY: as above.
            let co = unsafe { take_finished(slot) }.expect("a finished fiber had its coroutine");
            self.give_coroutine(co, f.class());
        }
        bump(&self.slot().stats.finished, 1);
        f.set_done();
    }
}

/// Starts loading the stack lines a resume of `f` will touch first. Two lines: the resume pops
/// the saved registers around `parked_sp`, then returns through the frames just above it, and
/// where the fiber's frames happen to straddle a line the second was a miss on every switch
/// (`arch/performance.md`, the finding on a fiber's frames against the resume's prefetch).
#[inline(always)]
fn prefetch_stack(f: &FiberRecord) {
    use crate::platform::prefetch;
    // Atomic, and only a hint here: a stale value costs a useless prefetch.
    let sp = f.parked_sp.load(Ordering::Relaxed);
    if sp != 0 {
        prefetch(sp);
        prefetch(sp + 64);
    }
}
