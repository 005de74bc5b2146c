//! A carrier's life, as the runtime's shared state sees it: started (`start_carrier`), woken
//! (`notify`, `unpark_carrier`), added while others are blocked in the OS (`compensate`,
//! `carrier_for_blocking`), retired as a spare when the block ends (`try_retire`, `shrink`),
//! brought back for work only it may run (`revive`), and stopped with the runtime (`stop`). Each
//! changes `Shared`'s carrier counts under its locks; the lock order is on `Shared`. See
//! `arch/supervisor.md` for compensation and `arch/scheduler.md` for the wake-up protocol.

use std::sync::atomic::Ordering;

use super::queue::run_queue;
use super::{CachePadded, CarrierSlot, Shared, carrier};
use crate::fiber::schedule::RuntimeRef;

impl Shared {
    /// Starts the carrier thread of slot `i` (its deque waits in `unstarted`), unless the
    /// runtime is shutting down.
    ///
    /// The spawn and the registration of the thread for the drop to join happen under the
    /// `threads` lock, after a look at `shutdown` under it too. The drop sets `shutdown`, then
    /// takes the threads to join under that lock, so a carrier either is in what it takes or
    /// is never started. Registered outside the lock, a carrier that a fiber's `vt::blocking`
    /// started could come just after the drop took the list: never joined, it kept running
    /// fibers while the drop unwound the others, and whatever it held when it stopped was
    /// never unwound (found by `tests/stress.rs`; `arch/reliability.md`, bug 10).
    pub(crate) fn start_carrier(
        &self,
        i: usize,
        core: Option<crate::platform::CoreId>,
    ) -> std::io::Result<()> {
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        if self.shutdown.load(Ordering::Acquire) {
            // The drop has taken (or will take) the threads to join: start nothing more. The
            // fibers this would have run are unwound by the drop.
            return Ok(());
        }
        self.make_slot(i);
        let Some(worker) = self.unstarted.lock().unwrap_or_else(|e| e.into_inner())[i].take() else {
            // Another thread compensating at the same time started this slot first: the
            // caller's loop sees the new carrier in `active` and stops.
            return Ok(());
        };
        // Before the thread exists: a fiber on it may register a socket with its set at once.
        if let Err(e) = self.reactor.open(i) {
            // Put the deque back, so that a later attempt can start the slot.
            self.unstarted.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(worker);
            return Err(e);
        }
        // SAFETY: the caller holds a reference to this runtime (we are inside it), so the count
        // is positive and the new reference is sound.
        let rt = unsafe { RuntimeRef::from_shared(self) };
        let name = format!("{}-{i}", self.config.thread_name);
        self.active.fetch_add(1, Ordering::AcqRel);
        self.started.fetch_max(i + 1, Ordering::AcqRel);
        // Counted as a searcher until its loop runs (`Idle::start_searching`); `Carrier::run`
        // starts with `searching` set, so its first search or sleep ends it.
        self.idle.start_searching();
        let spawned = crate::platform::fork::spawn(std::thread::Builder::new().name(name), move || {
            match core {
                // Not fatal: a carrier that cannot be pinned still runs fibers.
                Some(c) if crate::platform::pin_to(c) => rt.slots[i].cpu.store(c.id, Ordering::Relaxed),
                Some(_) => {}
                // A spare started by a pinned carrier would inherit its one CPU.
                None => crate::platform::thread::unpin_current(),
            }
            rt.slots[i].thread.get_or_init(std::thread::current);
            rt.slots[i].tid.store(crate::platform::gettid(), Ordering::Relaxed);
            let serve = rt.clone();
            carrier::Carrier::run(i, rt, worker);
            // The runtime's drop unwinds the fibers homed here on this thread, before it exits
            // (their thread-locals live here): `scheduler/shutdown.rs`.
            super::shutdown::serve(&serve, i);
        });
        #[cfg(test)]
        super::test_hooks::carrier_spawned(self, i);
        match spawned {
            Ok(t) => {
                threads.push(t);
                drop(threads);
                self.peak.fetch_max(self.active.load(Ordering::Relaxed), Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.active.fetch_sub(1, Ordering::AcqRel);
                self.idle.stop_search();
                Err(e)
            }
        }
    }

    /// Makes sure `target` carriers can run fibers while some are blocked: wakes a retired
    /// spare, or starts a new carrier, within `max_carriers`.
    pub(crate) fn compensate(&self) {
        loop {
            let active = self.active.load(Ordering::Acquire);
            let blocked = self.blocked.load(Ordering::Acquire);
            if active.saturating_sub(blocked) >= self.target
                || active >= self.config.max_carriers
                || self.shutdown.load(Ordering::Acquire)
            {
                return;
            }
            let spare = self.spares.lock().unwrap_or_else(|e| e.into_inner()).pop();
            let (i, revived) = if let Some(i) = spare {
                self.active.fetch_add(1, Ordering::AcqRel);
                self.slots[i].retired.store(false, Ordering::Release);
                self.unpark_carrier(i);
                (i, true)
            } else {
                let next = self.next_unstarted();
                match next {
                    Some(i) if self.start_carrier(i, None).is_ok() => (i, false),
                    // Out of slots or threads: nothing more to do.
                    _ => return,
                }
            };
            self.trace_compensation(i, revived);
            self.compensations.fetch_add(1, Ordering::Relaxed);
            self.peak.fetch_max(self.active.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Makes slot `i` (and the rest of its chunk) if it is not made yet, with its deque's
    /// owner end waiting in `unstarted`. Under the `threads` lock (`start_carrier`).
    fn make_slot(&self, i: usize) {
        let mut workers = Vec::new();
        self.slots.get_or_make(i, |j| {
            let (worker, stealer) = run_queue::new(run_queue::CAPACITY);
            workers.push((j, worker));
            CachePadded(CarrierSlot::new(stealer))
        });
        if workers.is_empty() {
            return;
        }
        let mut u = self.unstarted.lock().unwrap_or_else(|e| e.into_inner());
        for (j, worker) in workers {
            if u.len() <= j {
                u.resize_with(j + 1, || None);
            }
            u[j] = Some(worker);
        }
    }

    /// The lowest slot without a thread: a made one, else the first not made (chunks are made
    /// in order, since this is how the next slot is chosen), within `max_carriers`.
    fn next_unstarted(&self) -> Option<usize> {
        let u = self.unstarted.lock().unwrap_or_else(|e| e.into_inner());
        u.iter().position(Option::is_some).or((u.len() < self.slots.capacity()).then_some(u.len()))
    }

    /// A carrier of its own for a fiber from a known-blocking spawn site, which is about to
    /// start on a regular carrier: a retired spare woken, or a new carrier started, within
    /// `max_carriers`. `None` when the bound is reached (or the runtime stops): the fiber then
    /// runs where it is and is compensated for, as before.
    ///
    /// Why: a started fiber stays on its home carrier, so a fiber that blocks its carrier holds
    /// up every fiber at home there for as long as it blocks; compensation can move only
    /// unstarted fibers. Starting the blocker elsewhere (placing an unstarted fiber is free)
    /// leaves its spawner's carrier, and the fibers at home on it, running.
    pub(crate) fn carrier_for_blocking(&self) -> Option<usize> {
        if self.shutdown.load(Ordering::Acquire)
            || self.active.load(Ordering::Acquire) >= self.config.max_carriers
        {
            return None;
        }
        let spare = self.spares.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let (i, revived) = match spare {
            Some(i) => {
                self.active.fetch_add(1, Ordering::AcqRel);
                self.slots[i].retired.store(false, Ordering::Release);
                self.unpark_carrier(i);
                (i, true)
            }
            None => {
                let next = self.next_unstarted()?;
                self.start_carrier(next, None).ok()?;
                // Another thread may have taken that slot first; then it is started all the same.
                if next >= self.started() {
                    return None;
                }
                (next, false)
            }
        };
        self.trace_compensation(i, revived);
        self.compensations.fetch_add(1, Ordering::Relaxed);
        self.peak.fetch_max(self.active.load(Ordering::Relaxed), Ordering::Relaxed);
        Some(i)
    }

    /// A spare carrier with nothing to do while enough others run: retire it (park it as a
    /// spare) unless that would leave fewer than `target` unblocked carriers.
    pub(crate) fn try_retire(&self, i: usize) -> bool {
        let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        // Fibers in its inbox are at home on it: they may run nowhere else (see `revive`).
        if !self.slots[i].inbox.is_empty() {
            return false;
        }
        let mut active = self.active.load(Ordering::Acquire);
        loop {
            let blocked = self.blocked.load(Ordering::Acquire);
            if active.saturating_sub(blocked) <= self.target {
                return false;
            }
            match self.active.compare_exchange(active, active - 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(a) => active = a,
            }
        }
        self.slots[i].retired.store(true, Ordering::Release);
        spares.push(i);
        true
    }

    /// More carriers run than the target now that a block ended: wake one sleeping spare so it
    /// retires (a busy spare retires by itself between fibers).
    pub(crate) fn shrink(&self) {
        let surplus =
            self.active.load(Ordering::Acquire).saturating_sub(self.blocked.load(Ordering::Acquire));
        if surplus <= self.target {
            return;
        }
        for i in self.target..self.started() {
            if !self.slots[i].retired.load(Ordering::Acquire) && self.idle.notify_carrier(i) {
                self.unpark_carrier(i);
                return;
            }
        }
    }

    /// A carrier became busy: if the supervisor sleeps (every carrier was idle), wake it.
    pub(crate) fn supervisor_wake(&self) {
        // SeqCst pairs with `supervisor::sleep_until_work`.
        if self.supervisor_sleeping.load(Ordering::SeqCst) {
            if let Some(t) = self.supervisor_thread.get() {
                t.unpark();
            }
        }
    }

    /// Brings back a retired spare carrier that has work only it may run (a fiber pinned to it
    /// woke). Under the `spares` lock, which orders it with `try_retire`'s inbox check: either
    /// this finds the spare retired, or the spare sees the work and does not retire.
    pub(crate) fn revive(&self, i: usize) -> bool {
        let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        let Some(pos) = spares.iter().position(|&s| s == i) else { return false };
        spares.swap_remove(pos);
        self.active.fetch_add(1, Ordering::AcqRel);
        self.slots[i].retired.store(false, Ordering::Release);
        drop(spares);
        self.unpark_carrier(i);
        true
    }

    /// Wakes one sleeping carrier if work was made visible and nobody is looking for it.
    /// Inline: every spawn calls it, and most calls end at the fence and one load (someone
    /// searches, or nobody sleeps); as a call it cost a frame with register saves.
    #[inline]
    pub(crate) fn notify(&self) {
        if self.idle.notify_needed() {
            self.notify_slow();
        }
    }

    /// `notify` once a sleeper must be woken.
    #[inline(never)]
    fn notify_slow(&self) {
        if let Some(i) = self.idle.pop_sleeper() {
            self.unpark_carrier(i);
        }
    }

    /// Wakes carrier `i`: through its poll set's eventfd when it sleeps in `epoll_wait` (every
    /// idle carrier and retired spare does), otherwise through its thread's park token.
    pub(crate) fn unpark_carrier(&self, i: usize) {
        // Pairs with the SeqCst store of `on_reactor` before the carrier's re-check (in
        // `Carrier::park_idle` and `Carrier::retire`): either we see the carrier polling, or its
        // re-check sees the work (or the revival) we made visible. The fence covers callers
        // whose own store was weaker than SeqCst (`retired` is stored Release).
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.slots[i].on_reactor.load(Ordering::SeqCst) {
            self.reactor.wake(i);
        } else if let Some(t) = self.slots[i].thread.get() {
            t.unpark();
        }
    }

    /// The runtime's drop has begun: nothing new starts, and whatever looks at `shutdown`
    /// unwinds rather than runs.
    pub(crate) fn begin_shutdown(&self) {
        // SeqCst: a carrier about to sleep in the reactor raises `on_reactor`, then reads
        // `shutdown` (both SeqCst); `unpark_carrier` in `stop` reads `on_reactor` after this
        // store. Either the carrier sees the shutdown, or `stop` sees it polling and wakes it.
        self.shutdown.store(true, Ordering::SeqCst);
    }

    /// Stops the runtime's threads and unwinds its unfinished fibers (after `begin_shutdown`),
    /// joining the supervisor first.
    pub(crate) fn stop(&self, supervisor: Option<std::thread::JoinHandle<()>>) {
        let rt = self;
        crate::scheduler::diagnostics::forget_sigquit(rt);
        crate::scheduler::deadlock::unregister(rt);
        if let Some(t) = supervisor {
            t.thread().unpark();
            let _ = t.join();
        }
        // Every carrier there will ever be: `start_carrier` looks at `shutdown` and registers
        // the thread it spawns under this lock, so from here on none starts. (The supervisor
        // is not the only one to start carriers: a carrier whose fiber enters `vt::blocking`
        // compensates too, and one started that way just after this took the list was never
        // joined and kept running fibers while `cancel_all` ran: bug 10 in
        // `arch/reliability.md`.)
        let threads = std::mem::take(&mut *rt.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for i in 0..rt.started() {
            rt.unpark_carrier(i);
        }
        for t in &threads {
            // A carrier that has only just started may not have published its `Thread` in its
            // slot yet (what `unpark_carrier` uses): its handle reaches it all the same.
            t.thread().unpark();
        }
        if !super::shutdown::await_serving(rt, threads.len(), true) {
            // A fiber of this runtime waits in the OS for this thread to exit (it joins the std
            // thread that drops the runtime): waiting for its carrier here would never end. The
            // rest of the drop runs on a thread of its own, as a drop from inside a fiber does.
            // SAFETY: the caller (the runtime's drop) holds a reference to this runtime.
            let rt = unsafe { RuntimeRef::from_shared(self) };
            let spawned = crate::platform::fork::spawn(
                std::thread::Builder::new().name(format!("{}-drop", rt.config().thread_name)),
                move || super::shutdown::run(&rt, threads),
            );
            if spawned.is_err() {
                eprintln!(
                    "virtual-threads: a Runtime was dropped by a thread that one of its fibers joins, and no thread could be started to finish the drop; leaking it"
                );
            }
            return;
        }
        super::shutdown::run(rt, threads);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, mpsc};
    use std::time::{Duration, Instant};

    use crate::scheduler::test_hooks::CARRIER_SPAWNED;

    /// A carrier that compensation starts while the runtime is being dropped is joined by the
    /// drop, like every other (bug 10 in `arch/reliability.md`). Before the fix, the drop could
    /// take the list of carrier threads to join between the spawn of such a carrier and its
    /// registration: never joined, the carrier went on running fibers while the drop unwound
    /// the others, and the ones it held then (running, or in its local deque) were never
    /// unwound, which hung `tests/stress.rs`. That window is a few instructions wide; the hook
    /// holds the compensating carrier in it until the drop has begun and has either taken the
    /// list or is kept from it by the lock this thread holds. Before the fix this failed every
    /// time ("1 carrier thread(s) ... never joined").
    #[test]
    fn a_carrier_started_while_the_runtime_drops_is_joined() {
        let rt = crate::runtime::Runtime::builder().carriers(1).max_carriers(2).build().unwrap();
        let handle = rt.handle();
        let me = handle.runtime().ptr() as usize;
        let (spawned_tx, spawned_rx) = mpsc::sync_channel::<()>(1);
        *CARRIER_SPAWNED.lock().unwrap() = Some(Arc::new(move |rt, index| {
            if std::ptr::from_ref(rt) as usize != me || index != 1 {
                return; // another test's runtime, or a carrier the runtime starts with
            }
            let _ = spawned_tx.try_send(());
            // A generous bound, so that a broken test fails instead of hanging.
            let limit = Instant::now() + Duration::from_secs(30);
            while Instant::now() < limit {
                if rt.shutdown.load(Ordering::Acquire) {
                    match rt.threads.try_lock() {
                        Ok(threads) if threads.is_empty() => return, // the drop took them
                        Ok(_) => {}
                        Err(_) => return, // held: by this thread (the fix), or the drop taking them
                    }
                }
                std::thread::yield_now();
            }
        }));
        // Its blocking section (in place: `vt::blocking` runs on a helper thread) makes the only
        // carrier count as blocked: compensation starts
        // carrier 1, and the hook stops it there.
        let blocker = rt.spawn(|| crate::scope::blocking_here(std::panic::Location::caller(), || ()));
        let started = spawned_rx.recv_timeout(Duration::from_secs(30));
        drop(rt);
        *CARRIER_SPAWNED.lock().unwrap() = None;
        started.expect("compensation started a second carrier");
        assert!(blocker.join().is_ok(), "the fiber that compensated was running: it finishes");
        let left = handle.runtime().threads.lock().unwrap().len();
        assert_eq!(left, 0, "{left} carrier thread(s) started during the drop were never joined");
    }
}
