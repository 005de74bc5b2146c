//! Finding the next fiber: the local queues in order, then the inbox, the injector, timers and
//! the reactor, then stealing; and going to sleep when there is nothing (`arch/scheduler.md`).

use super::*;

impl Carrier {
    /// Nothing local: search the other queues for a few rounds, backing off between them.
    #[inline(never)]
    pub(super) fn search(&self) -> Option<FiberRef> {
        let score = self.spin_score.get();
        if score == 0 {
            let unspun = self.unspun.get() + 1;
            if unspun < SPIN_PROBE {
                // Spinning has not paid lately: look once, then park (or poll for I/O).
                self.unspun.set(unspun);
                return self.find_work(false);
            }
        }
        self.unspun.set(0);
        let mut pushed = self.deques_pushed();
        for round in 0..SPIN_ROUNDS {
            let found = self.find_work(round >= PATIENT_ROUNDS);
            if found.is_some() || self.rt.shutdown.load(Ordering::Relaxed) {
                if found.is_some() && round > 0 {
                    self.spin_score.set((score + SPIN_PAID).min(SPIN_SCORE_MAX));
                }
                return found;
            }
            // What a spinner can take is unstarted fibers (started ones stay at home), which
            // arrive at the tails of the carriers' deques. Past the grace rounds, when no tail
            // moved over a round, only wakes and I/O remain, which reach a parked carrier as
            // well: sleep in this carrier's epoll_wait rather than spin on (Go's spinning
            // Ms stop likewise): spinning on was an HTTP server's hot spot (`arch/performance.md`).
            let now = self.deques_pushed();
            if round >= PATIENT_ROUNDS && now == pushed {
                self.spin_score.set(score.saturating_sub(1));
                return None;
            }
            pushed = now;
            for _ in 0..(16 << round.min(4)) {
                std::hint::spin_loop();
            }
        }
        self.spin_score.set(score.saturating_sub(1));
        None
    }

    /// Fibers ever pushed onto every started carrier's deque: moves while carriers spawn.
    pub(super) fn deques_pushed(&self) -> usize {
        self.rt.slots.upto(self.rt.started()).fold(0, |sum, s| sum.wrapping_add(s.stealer.pushed()))
    }

    /// The fast path: this carrier's own queues.
    pub(super) fn next_local(&self) -> Option<FiberRef> {
        let left = self.ticks_left.get() - 1;
        self.ticks_left.set(if left == 0 { GLOBAL_CHECK_INTERVAL } else { left });
        if left == 0 {
            self.poll_reactor_if_due();
            self.fire_timers();
            // A retired spare, or a carrier blocked in the OS, cannot fire its own timers, and
            // the idle path that fires them for it may never run while every carrier is busy.
            self.fire_foreign_timers();
            // The injector first: the local queues may never be empty (fibers that keep
            // yielding), and they are checked right after. Not while clearly heavier than
            // another carrier: its fibers would stay here once started; the lighter one takes
            // them (it looks at the injector on its own ticks). Nor while it places fibers by
            // load: it would take back what it placed (`place.rs`, step 4).
            if !self.weigh() && (self.place_to.get() == NO_PLACE || !self.still_placing()) {
                if let Some(f) = self.steal_injector() {
                    return Some(f);
                }
            }
            if let Some(f) = self.steal_if_lighter() {
                return Some(f);
            }
        }
        // One load of a line that only other threads' wakes write: usually empty.
        if self.slot().inbox.maybe_nonempty() {
            self.drain_inbox();
        }
        if let Some(f) = self.lifo_take() {
            let streak = self.lifo_streak.get();
            if streak < MAX_LIFO_STREAK {
                self.lifo_streak.set(streak + 1);
                return Some(f);
            }
            // Too many hand-offs in a row: queue it behind the others.
            self.push_back(f);
        }
        self.lifo_streak.set(0);
        if let Some(f) = self.home_pop(true) {
            return Some(f);
        }
        // The home queue's own length, which `home_len` publishes (this carrier writes both),
        // tested first: empty, as it is between short fibers, the test `home_pop` just made
        // decides it, with no look at the idle counts.
        if self.home_queue().len() > 0 && (self.heavier.get() || self.rt.idle.any_idle()) {
            // Unstarted fibers wait in the deque ahead of the home queue's oldest, and another
            // carrier is idle: leave them to it. Once started here they could never move, so
            // a carrier that started every fiber it spawned before the others woke would run
            // them all for their whole lives. It runs a fiber at home meanwhile
            // and makes sure an idle carrier looks (a searcher already does: then this is a
            // fence and a load). The same while this carrier is clearly heavier than another
            // (`weigh`), which takes them with `steal_if_lighter`. Otherwise arrival order holds.
            self.rt.notify();
            if let Some(f) = self.home_pop(false) {
                return Some(f);
            }
        }
        if let Some(f) = self.worker.pop() {
            return Some(f);
        }
        self.home_pop(false)
    }

    /// Fibers at home stay where they started, so a carrier that is never idle (its own
    /// fibers keep yielding) would never steal, and a busier one would start every fiber it
    /// spawns: balance is set at start (`arch/decisions/0003-home-carriers.md`). So every
    /// `GLOBAL_CHECK_INTERVAL` ticks a carrier with no unstarted fibers of its own takes half of
    /// the unstarted ones of a carrier with more fibers waiting at home than it has. A few
    /// relaxed loads of other carriers' lines per 61 switches; nothing when migration is on.
    /// Sets and returns `heavier`: whether another running carrier (not retired, not blocked)
    /// has `HEAVIER_BY` fewer fibers at home than this one. Every `GLOBAL_CHECK_INTERVAL` ticks:
    /// a few relaxed loads of other carriers' lines. Never with migration on.
    #[cold]
    #[inline(never)]
    pub(super) fn weigh(&self) -> bool {
        let rt = &self.rt;
        let n = rt.started();
        let mine = self.slot().home_len.load(Ordering::Relaxed);
        let heavier = !rt.config.migrate_started_fibers
            && n > 1
            && mine > HEAVIER_BY
            && rt.slots.upto(n).enumerate().any(|(i, s)| {
                i != self.index
                    && !s.retired.load(Ordering::Relaxed)
                    && !s.held()
                    && s.home_len.load(Ordering::Relaxed) + HEAVIER_BY < mine
            });
        self.heavier.set(heavier);
        heavier
    }

    #[cold]
    #[inline(never)]
    pub(super) fn steal_if_lighter(&self) -> Option<FiberRef> {
        let rt = &self.rt;
        let n = rt.started();
        if n == 1 || rt.config.migrate_started_fibers || self.worker.len() > 0 {
            return None;
        }
        let mine = self.slot().home_len.load(Ordering::Relaxed);
        let start = self.next_rand() as usize % n;
        for k in 0..n.min(4) {
            let victim = (start + k) % n;
            let vslot = &rt.slots[victim];
            if victim == self.index
                || vslot.home_len.load(Ordering::Relaxed) <= mine + 1
                || vslot.stealer.is_empty()
            {
                continue;
            }
            let before = self.worker.len();
            if let Some(f) = vslot.stealer.steal_into(&self.worker, LOCAL_CAP / 2) {
                let got = 1 + self.worker.len().saturating_sub(before) as u64;
                bump(&self.slot().stats.steals, got);
                return Some(f);
            }
        }
        None
    }

    /// A batch from the injector into the local deque, counted.
    pub(super) fn steal_injector(&self) -> Option<FiberRef> {
        let before = self.worker.len();
        let f = self.rt.injector.steal_into(self.index, &self.worker)?;
        let got = 1 + self.worker.len().saturating_sub(before) as u64;
        bump(&self.slot().stats.injector_pops, got);
        Some(f)
    }

    /// The slow path: timers, the injector, then other carriers. Until `take_last`, a
    /// victim's only queued fiber is left to it (see `PATIENT_ROUNDS`).
    pub(super) fn find_work(&self, take_last: bool) -> Option<FiberRef> {
        if self.slot().inbox.maybe_nonempty() {
            self.drain_inbox();
            if let Some(f) = self.home_pop(false) {
                return Some(f);
            }
        }
        if self.fire_timers() > 0 {
            if let Some(f) = self.lifo_take().or_else(|| self.worker.pop()).or_else(|| self.home_pop(false)) {
                return Some(f);
            }
        }
        if let Some(f) = self.steal_injector() {
            return Some(f);
        }
        // A carrier busy in a long fiber cannot fire its own timers, nor one blocked in the OS
        // poll its set; an idle one does it.
        if self.fire_foreign_timers() + self.poll_foreign_sets() > 0 {
            if let Some(f) = self.lifo_take().or_else(|| self.worker.pop()).or_else(|| self.home_pop(false)) {
                return Some(f);
            }
        }
        let n = self.rt.started();
        // A runtime of one carrier has no one to steal from. One of several whose others have
        // not started yet still counts itself as searching: a carrier that is neither searching
        // nor asleep looks busy, and a busy carrier with fibers queued starts them all itself
        // (`next_local`), where they would stay (found when a second carrier started late).
        if (n == 1 && self.rt.target == 1) || !(self.searching.get() || self.rt.idle.try_search()) {
            return None;
        }
        if n == 1 {
            self.searching.set(true);
            return None;
        }
        self.searching.set(true);
        let start = self.next_rand() as usize % n;
        for k in 0..n {
            let victim = (start + k) % n;
            if victim == self.index {
                continue;
            }
            let vslot = &self.rt.slots[victim];
            // A carrier running a fiber that just spawned or woke one runs it itself in a
            // moment, with warm caches; taking it moves a sequential chain of spawns to this carrier
            // and back, fiber by fiber. Go gives `runnext` the same grace (3 µs).
            let patient = !take_last && !vslot.location.load(Ordering::Relaxed).is_null();
            // Take about half of the victim's queue.
            if !patient || vslot.stealer.len() >= 2 {
                let before = self.worker.len();
                if let Some(f) = vslot.stealer.steal_into(&self.worker, LOCAL_CAP / 2) {
                    let got = 1 + self.worker.len().saturating_sub(before) as u64;
                    bump(&self.slot().stats.steals, got);
                    if let Some(ring) = self.slot().tracing() {
                        ring.push(Event::new(Kind::Steal, victim as u64, got, 0));
                    }
                    return Some(f);
                }
            }
            // A blocked carrier cannot run the fiber it was about to run next: take it.
            if vslot.held() {
                let p = vslot.lifo.swap(std::ptr::null_mut(), Ordering::Acquire);
                // SAFETY: as in `lifo_take`.
                if let Some(f) = unsafe { FiberRef::from_raw(p) } {
                    if f.home.load(Ordering::Relaxed) == NO_HOME {
                        return Some(f);
                    }
                    // At home on the blocked carrier: it may run nowhere else.
                    self.rt.push_inbox(victim, f);
                }
            }
        }
        None
    }

    /// Leaving the searching state with work in hand: if we were the last searcher, wake
    /// another carrier, since there may be more work than one carrier can take.
    pub(super) fn found_work(&self) {
        // Tested before it is cleared: a carrier that finds work in its own queues was not
        // searching, and the store would be one more per fiber for nothing.
        if self.searching.get() {
            self.searching.set(false);
            if self.rt.idle.stop_search() {
                self.rt.notify();
            }
        }
    }

    pub(super) fn next_rand(&self) -> u64 {
        // xorshift64*: a private generator, no shared state.
        let mut x = self.rng.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A spare that is no longer needed: hand its queued fibers to the others and sleep until
    /// compensation needs it again (spare threads are reused, not churned).
    pub(super) fn retire(&self) {
        // A carrier woken as a searcher is counted as one: give that up first, or `notify`
        // would wait for a search that never happens.
        if self.searching.replace(false) {
            self.rt.idle.stop_search();
        }
        self.flush_to_injector();
        self.rt.notify();
        let slot = self.slot();
        if let Some(ring) = slot.tracing() {
            ring.push(Event::new(Kind::CarrierRetire, 0, 0, 0));
        }
        // Asleep in `epoll_wait` on its own set, not in a thread park: sockets registered here
        // while the spare ran fibers stay served (a waiter at home elsewhere would otherwise
        // wait for ever). `on_reactor` before the re-check of `retired`: see `unpark_carrier`.
        while slot.retired.load(Ordering::Acquire) && !self.rt.shutdown.load(Ordering::Acquire) {
            slot.on_reactor.store(true, Ordering::SeqCst);
            let woken = if slot.retired.load(Ordering::SeqCst) && !self.rt.shutdown.load(Ordering::SeqCst) {
                self.rt.reactor.poll(self.index, None)
            } else {
                0
            };
            slot.on_reactor.store(false, Ordering::Relaxed);
            if woken > 0 {
                bump(&slot.stats.io_wakeups, woken as u64);
                // A fiber woken here may be at home here, or unstarted in this carrier's LIFO
                // slot: only a live carrier runs it.
                self.rt.revive(self.index);
            }
        }
    }

    /// Polls, without blocking, the sets of carriers blocked in the OS: their own fibers cannot
    /// run, but a fiber at home elsewhere may wait on a socket registered there (a socket
    /// shared between fibers of two carriers). As `fire_foreign_timers` does for timers.
    pub(super) fn poll_foreign_sets(&self) -> usize {
        let mut woken = 0;
        for (i, slot) in self.rt.slots.upto(self.rt.started()).enumerate() {
            if i != self.index && slot.held() {
                woken += self.rt.reactor.try_poll(i, false);
            }
        }
        bump(&self.slot().stats.io_wakeups, woken as u64);
        woken
    }

    /// Fires this carrier's expired timers. Returns how many fibers it woke.
    pub(super) fn fire_timers(&self) -> usize {
        let slot = self.slot();
        let next = slot.next_deadline.load(Ordering::Relaxed);
        if next == u64::MAX {
            return 0;
        }
        let now = self.rt.ns_since_epoch(Instant::now());
        if now < next {
            return 0;
        }
        let n = crate::scheduler::time::fire(&self.rt, self.index, now, false);
        bump(&slot.stats.timer_wakeups, n as u64);
        n
    }

    pub(super) fn fire_foreign_timers(&self) -> usize {
        let now = self.rt.ns_since_epoch(Instant::now());
        let mut woken = 0;
        for (i, slot) in self.rt.slots.upto(self.rt.started()).enumerate() {
            if i != self.index && slot.next_deadline.load(Ordering::Relaxed) <= now {
                woken += crate::scheduler::time::fire(&self.rt, i, now, true);
            }
        }
        bump(&self.slot().stats.timer_wakeups, woken as u64);
        woken
    }

    /// Work that another thread could have made visible since we last looked.
    pub(super) fn work_visible(&self) -> bool {
        let rt = &self.rt;
        !self.slot().inbox.is_empty()
            || !rt.injector.is_empty()
            || (rt.idle.can_search()
                && rt
                    .slots
                    .upto(rt.started())
                    .enumerate()
                    .any(|(i, s)| i != self.index && !s.stealer.is_empty()))
            || rt.earliest_deadline() <= rt.ns_since_epoch(Instant::now())
            || rt.shutdown.load(Ordering::SeqCst)
    }

    /// Nothing to do: register as a sleeper, look once more, then sleep in `epoll_wait` on this
    /// carrier's set until woken (its eventfd), a socket there is ready, or the earliest timer
    /// is due (see `idle.rs` for why no wake-up is lost).
    pub(super) fn park_idle(&self) {
        let idle = &self.rt.idle;
        if self.searching.replace(false) {
            idle.stop_search();
        }
        let slot = self.slot();
        // The carrier sleeps in epoll_wait on its own poll set (readiness of its sockets and
        // its timers share one wait). The flag must be up before the carrier registers as a
        // sleeper: whoever pops it from the sleepers list then sees the flag (SeqCst, paired
        // with `unpark_carrier`) and wakes it through the eventfd. Raised after registering, a
        // wake could go to the thread's park token while the carrier then blocks in epoll_wait
        // for ever.
        slot.on_reactor.store(true, Ordering::SeqCst);
        idle.register(self.index);
        let visible = self.work_visible();
        if !visible {
            let slept = Instant::now();
            let timeout = match self.rt.earliest_deadline() {
                u64::MAX => None,
                at => Some(Duration::from_nanos(at.saturating_sub(self.rt.ns_since_epoch(Instant::now())))),
            };
            let n = self.rt.reactor.poll(self.index, timeout);
            bump(&slot.stats.io_wakeups, n as u64);
            let woke = Instant::now();
            // The set was just read: the busy carrier's periodic poll counts from here. A
            // server's carrier sleeps and wakes thousands of times a second, and its periodic
            // polls, each a millisecond after the last one, mostly came microseconds after
            // such a wait (an `epoll_pwait2` that found nothing new).
            self.last_poll.set(woke);
            let idle_ns = woke.saturating_duration_since(slept).as_nanos() as u64;
            bump(&slot.stats.idle_ns, idle_ns);
            if let Some(ring) = slot.tracing() {
                ring.push(Event::new(Kind::Idle, idle_ns, 0, 0));
                self.trace_mark_now();
            }
            self.rt.refresh_clock_after_idle(woke);
        }
        slot.on_reactor.store(false, Ordering::Relaxed);
        match idle.unregister(self.index) {
            crate::scheduler::queue::idle::Unregister::WasNotified => self.searching.set(true),
            // Work seen on the re-check is looked for as a searcher, so that taking it from the
            // injector wakes the next carrier (step 3) as stealing it would: otherwise a second
            // fiber pushed while we counted as searching waits behind the first (found by the
            // loom model of the idle protocol, `arch/loom.md`, finding 3).
            crate::scheduler::queue::idle::Unregister::Removed if visible => {
                self.searching.set(idle.try_search())
            }
            crate::scheduler::queue::idle::Unregister::Removed => {}
        }
        self.rt.supervisor_wake();
    }

    /// A busy carrier does not sleep in `epoll_wait`, so it polls its set without blocking, at
    /// most once per `REACTOR_POLL_INTERVAL` (Go's scheduler and sysmon do the same).
    pub(super) fn poll_reactor_if_due(&self) {
        let now = Instant::now();
        if now.duration_since(self.last_poll.get()) < REACTOR_POLL_INTERVAL {
            return;
        }
        self.last_poll.set(now);
        let n = self.rt.reactor.try_poll(self.index, true);
        bump(&self.slot().stats.io_wakeups, n as u64);
    }
}
