//! One socket's registration with a runtime's reactor: its readiness word and the fibers waiting
//! on it, per direction. No system calls here (the reactor and `platform/` make them).
//!
//! # The readiness word
//! ```text
//!  63                                   16 15      5    4          3          2        1          0
//! ┌───────────────────────────────────────┬─────────┬──────────┬──────────┬────────┬──────────┬──────────┐
//! │ tick: events delivered so far (wraps) │ unused  │ WRITE_HUP│ READ_HUP │ CLOSED │ WRITABLE │ READABLE │
//! └───────────────────────────────────────┴─────────┴──────────┴──────────┴────────┴──────────┴──────────┘
//! ```
//! The reactor *sets* bits and bumps the tick for every event (`deliver`): `READABLE` and
//! `WRITABLE` for any event that may let that direction progress, and `READ_HUP`/`WRITE_HUP`
//! for the states that no later call can undo — the peer's end of stream (`EPOLLRDHUP`), a
//! hang-up or a pending error — which mean "the call will not block". An operation *clears*
//! bits only if the tick is still the one it saw *before* its system call (`clear`), so an event
//! that arrives between the call and the clear survives, and the wait that follows returns at
//! once. What it clears depends on what it learnt: `EAGAIN` proves the direction blocks now, so
//! both of its bits go; a stream read or write that moved less than asked proves only that the
//! *buffer* ran dry, so only `READABLE`/`WRITABLE` go, and an end of stream or an error that came
//! in the same event as the data is still seen by the next call. No wake-up is lost (tokio's
//! `ScheduledIo` idea, whose `READ_CLOSED` survives the same way; the full argument is in
//! `arch/io.md`).
//!
//! # Waiters
//! Fibers wait in two small lists (readers, writers) under a mutex, on the heap, never on their
//! own stacks. A waiter re-checks the word *under the list lock* before it parks, and the
//! reactor updates the word *before* it takes the lock to wake the list, so one of the two
//! always sees the other. Every waiter of the direction is woken (several fibers may wait on one
//! listener; the losers of the race find `EAGAIN` and wait again).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, MutexGuard};

use crate::loom::StdMutex as Mutex;
use std::time::Instant;

use crate::fiber::handle::Fiber;
use crate::fiber::schedule::RuntimeRef;
use crate::fiber::wait::WaitReason;
use crate::platform::net::Direction;

const READABLE: u64 = 1 << 0;
const WRITABLE: u64 = 1 << 1;
/// The socket was closed (or the registration dropped): every wait fails from now on.
const CLOSED: u64 = 1 << 2;
/// The peer ended its stream, the connection hung up, or an error is pending: a read returns at
/// once (data, end of stream or the error). Cleared only by `EAGAIN`.
const READ_HUP: u64 = 1 << 3;
/// The connection hung up or an error is pending: a write returns at once. Cleared only by
/// `EAGAIN`.
const WRITE_HUP: u64 = 1 << 4;
const TICK_SHIFT: u32 = 16;
const FLAGS: u64 = (1 << TICK_SHIFT) - 1;

fn bit(dir: Direction) -> u64 {
    match dir {
        Direction::Read => READABLE,
        Direction::Write => WRITABLE,
    }
}

/// The direction's final-state bit (see the module docs).
fn hup(dir: Direction) -> u64 {
    match dir {
        Direction::Read => READ_HUP,
        Direction::Write => WRITE_HUP,
    }
}

/// The bits that say a call in `dir` may make progress.
fn ready_mask(dir: Direction) -> u64 {
    bit(dir) | hup(dir)
}

/// What a direction's event carries, for [`Readiness::deliver`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Event {
    /// The direction may make progress.
    pub(crate) ready: bool,
    /// ... and will never block again until a call says `EAGAIN` (end of stream, hang-up,
    /// pending error).
    pub(crate) hup: bool,
}

/// What an operation learnt about its direction, for [`Readiness::clear`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Learnt {
    /// The call said `EAGAIN`: the direction blocks now.
    WouldBlock,
    /// A stream transfer moved less than asked: the buffer ran dry, which says nothing about an
    /// end of stream or an error queued behind the data.
    Drained,
}

/// The readiness word as one operation saw it before its system call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Snapshot {
    word: u64,
    dir: Direction,
}

impl Snapshot {
    /// The last event said `dir` may make progress (or nothing has cleared it since).
    pub(crate) fn is_ready(self) -> bool {
        self.word & ready_mask(self.dir) != 0
    }

    pub(crate) fn is_closed(self) -> bool {
        self.word & CLOSED != 0
    }
}

/// How a wait for readiness ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// The direction is (or may be) ready: retry the operation.
    Ready,
    /// The deadline passed first.
    TimedOut,
    /// The socket was closed while (or before) the caller waited.
    Closed,
}

#[derive(Default)]
struct Waiters {
    readers: Vec<Fiber>,
    writers: Vec<Fiber>,
}

impl Waiters {
    fn list(&mut self, dir: Direction) -> &mut Vec<Fiber> {
        match dir {
            Direction::Read => &mut self.readers,
            Direction::Write => &mut self.writers,
        }
    }
}

/// The part of a registration the reactor reaches through its epoll token. Lives in an `Arc`:
/// the socket holds one reference, and the reactor takes one at deregistration and drops it only
/// once no event carrying the token can still be in flight (see `Reactor::deregister`).
#[derive(Default)]
pub(crate) struct Readiness {
    /// See the module docs for the layout.
    word: AtomicU64,
    waiters: Mutex<Waiters>,
}

impl Readiness {
    fn lock(&self) -> MutexGuard<'_, Waiters> {
        // No code panics while holding the lock; recover rather than propagate a poison anyway.
        self.waiters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the word before an operation's system call.
    pub(crate) fn snapshot(&self, dir: Direction) -> Snapshot {
        // Acquire pairs with `deliver`'s AcqRel: an operation that sees the bit also sees
        // whatever the reactor did before setting it (nothing the operation reads today, but the
        // ordering costs nothing on a load).
        Snapshot { word: self.word.load(Ordering::Acquire), dir }
    }

    /// The system call behind `seen` found nothing to do (`WouldBlock`), or a stream transfer
    /// drained its buffer (`Drained`): clear what that proves, unless an event arrived since
    /// `seen` was taken (the tick moved), which the caller must not miss.
    pub(crate) fn clear(&self, seen: Snapshot, learnt: Learnt) {
        let b = match learnt {
            Learnt::WouldBlock => ready_mask(seen.dir),
            Learnt::Drained => bit(seen.dir),
        };
        let tick = seen.word >> TICK_SHIFT;
        // Relaxed is enough: the CAS compares the whole word, tick included, so it can only
        // succeed against the very value the caller saw.
        let _ = self.word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
            (w >> TICK_SHIFT == tick && w & b != 0).then_some(w & !b)
        });
    }

    /// An event arrived: set the ready bits and bump the tick, then move the woken waiters into
    /// `woken` (the caller unparks them after this returns, outside the lock).
    pub(crate) fn deliver(&self, read: Event, write: Event, woken: &mut Vec<Fiber>) {
        let set = |e: Event, dir| match (e.ready, e.hup) {
            (_, true) => ready_mask(dir),
            (true, false) => bit(dir),
            (false, false) => 0,
        };
        let bits = set(read, Direction::Read) | set(write, Direction::Write);
        // AcqRel: the waiter's re-check under the lock must see this update; the lock taken
        // below orders it (update, then lock/unlock here; lock, then load there).
        let _ = self.word.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |w| {
            let tick = (w >> TICK_SHIFT).wrapping_add(1);
            Some((tick << TICK_SHIFT) | (w & FLAGS) | bits)
        });
        let mut w = self.lock();
        if bits & ready_mask(Direction::Read) != 0 {
            woken.append(&mut w.readers);
        }
        if bits & ready_mask(Direction::Write) != 0 {
            woken.append(&mut w.writers);
        }
    }

    /// Whether a fiber waits on either direction.
    fn has_waiters(&self) -> bool {
        let w = self.lock();
        !w.readers.is_empty() || !w.writers.is_empty()
    }

    /// The socket is going away: fail every present and future wait.
    pub(crate) fn close(&self) {
        self.word.fetch_or(CLOSED, Ordering::AcqRel);
        let woken = {
            let mut w = self.lock();
            let mut all = std::mem::take(&mut w.readers);
            all.append(&mut w.writers);
            all
        };
        for f in woken {
            f.unpark();
        }
    }

    /// Parks the calling fiber until `dir` is ready, the socket closes, or `deadline` passes.
    /// Never returns spuriously.
    pub(crate) fn wait(&self, dir: Direction, deadline: Option<Instant>) -> Wait {
        let reason = match dir {
            Direction::Read => WaitReason::NetRead,
            Direction::Write => WaitReason::NetWrite,
        };
        self.wait_because(dir, deadline, reason)
    }

    /// `wait`, with the reason a dump shows (the `hooks` feature names its own).
    pub(crate) fn wait_because(&self, dir: Direction, deadline: Option<Instant>, reason: WaitReason) -> Wait {
        let me = crate::fiber::handle::current();
        // `vt::net`'s own waits return `io::Error`s, so a stop that cannot unwind (a build
        // without unwinding) ends them as timed out; the hooks' waits stand for a C call whose
        // caller may not expect an error, and wait on.
        let stoppable = matches!(reason, WaitReason::NetRead | WaitReason::NetWrite);
        loop {
            if stoppable && crate::fiber::stop::due_without_unwinding() {
                return Wait::TimedOut;
            }
            {
                let mut w = self.lock();
                // Acquire: see `snapshot`; the lock already orders this after `deliver`'s update.
                let word = self.word.load(Ordering::Acquire);
                if word & CLOSED != 0 {
                    return Wait::Closed;
                }
                if word & ready_mask(dir) != 0 {
                    return Wait::Ready;
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Wait::TimedOut;
                }
                w.list(dir).push(me.clone());
            }
            // Takes us off the list again after the park, whether the reactor woke us (then we
            // are already off), a timeout or a stray token did, or the fiber is being unwound by
            // its runtime's drop (then the park never returns and only this guard runs).
            let _listed = Listed { readiness: self, dir, fiber: &me };
            // The lock is released before parking: the reactor may now take it and wake us, and
            // an unpark that lands before the park leaves a token, so the park returns at once.
            crate::fiber::park::park_for(reason, deadline);
        }
    }
}

/// A fiber's entry in a wait list, removed on drop.
struct Listed<'a> {
    readiness: &'a Readiness,
    dir: Direction,
    fiber: &'a Fiber,
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        let id = self.fiber.id();
        self.readiness.lock().list(self.dir).retain(|f| f.id() != id);
    }
}

/// A socket's registration: held by the socket (`IoSource`), it deregisters on drop.
pub(crate) struct Registration {
    readiness: Arc<Readiness>,
    /// Keeps the runtime's `Shared`, and so its reactor, alive as long as the registration.
    rt: RuntimeRef,
    /// The carrier whose poll set holds the descriptor now (`follow_caller` moves it).
    set: AtomicUsize,
    /// Serialises moves, and moves with `retire`.
    moving: Mutex<()>,
    /// `retire` has taken the descriptor out of its set already (the drop then does nothing).
    retired: std::sync::atomic::AtomicBool,
    fd: i32,
}

impl Registration {
    /// Registers `fd` with the poll set of carrier `set` of `rt`.
    pub(crate) fn new(rt: &RuntimeRef, set: usize, fd: i32) -> std::io::Result<Registration> {
        let readiness = rt.reactor.register(set, fd)?;
        Ok(Registration {
            readiness,
            rt: rt.clone(),
            set: AtomicUsize::new(set),
            moving: Mutex::new(()),
            retired: Default::default(),
            fd,
        })
    }

    /// Moves the registration to the poll set of the calling fiber's carrier, if that is a
    /// carrier of its runtime other than the one holding it, and no other fiber waits on it (two
    /// waiters on two carriers would move it back and forth). Returns whether it moved; the
    /// caller then takes a new snapshot (the move reports the current readiness, as a first
    /// registration does). A socket handed to a fiber on another carrier so has its readiness
    /// read by the carrier that runs the waiter, which wakes it in place, whatever the first
    /// carrier does (`arch/io.md`, "Every set has a reader").
    pub(crate) fn follow_caller(&self) -> bool {
        let c = crate::scheduler::carrier::here();
        if c.is_null() {
            return false;
        }
        // SAFETY: a non-null carrier pointer is this thread's live carrier; used before any
        // switch point.
        let c = unsafe { &*c };
        let here = c.index();
        // Relaxed: only `follow_caller` writes it, under `moving`; a stale value is re-read
        // there.
        if self.set.load(Ordering::Relaxed) == here || !std::ptr::eq(c.shared(), self.rt.ptr()) {
            return false;
        }
        // Another fiber moving it: leave it to that one.
        let Ok(_moving) = self.moving.try_lock() else { return false };
        let from = self.set.load(Ordering::Relaxed);
        if from == here || self.readiness.has_waiters() || self.retired.load(Ordering::Relaxed) {
            return false;
        }
        // On failure it stays where it is, served as before.
        let moved = self.rt.reactor.move_registration(from, here, self.fd, &self.readiness).is_ok();
        if moved {
            self.set.store(here, Ordering::Relaxed);
        }
        moved
    }

    pub(crate) fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    /// Whether the calling thread is a carrier of this registration's runtime.
    pub(crate) fn runtime_is_current(&self) -> bool {
        let c = crate::scheduler::carrier::here();
        // SAFETY: a non-null carrier pointer is this thread's live carrier.
        !c.is_null() && std::ptr::eq(unsafe { (*c).shared() }, self.rt.ptr())
    }

    /// Whether the registration's runtime has been shut down, or this is a child forked since
    /// it was built: no carrier polls its reactor (here), so waits must not rely on it.
    pub(crate) fn is_orphaned(&self) -> bool {
        // Relaxed: a stale `false` means one more wait on the reactor, which the runtime's
        // shutdown unwinds (same-runtime fiber) or which is the documented cross-runtime gap.
        self.rt.shutdown.load(Ordering::Relaxed) || self.rt.reactor.forked()
    }
}

impl Registration {
    /// Fails every waiter and takes the descriptor out of its set now, while it is still open,
    /// for a holder that shares the registration with fibers still using it and cannot wait for
    /// the last of them to drop it (the `hooks` feature's descriptor table, at `close(2)`: the
    /// number may be reused at once). The drop then does nothing more.
    #[cfg_attr(any(not(feature = "hooks"), loom), allow(dead_code))]
    pub(crate) fn retire(&self) {
        let _moving = self.moving.lock().unwrap_or_else(|e| e.into_inner());
        // Relaxed: written and read under `moving`, or in the drop (which owns `self`).
        if self.retired.swap(true, Ordering::Relaxed) {
            return;
        }
        self.readiness.close();
        self.rt.reactor.deregister(self.set.load(Ordering::Relaxed), self.fd, &self.readiness);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Before the descriptor closes (the socket drops its registration first): wake every
        // waiter with an error, then take the descriptor out of the epoll set.
        if !*self.retired.get_mut() {
            self.readiness.close();
            self.rt.reactor.deregister(*self.set.get_mut(), self.fd, &self.readiness);
        }
    }
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let word = self.readiness.word.load(Ordering::Relaxed);
        f.debug_struct("Registration").field("fd", &self.fd).field("flags", &(word & FLAGS)).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const READ: Event = Event { ready: true, hup: false };
    const NONE: Event = Event { ready: false, hup: false };

    #[test]
    fn clear_keeps_an_event_that_arrived_after_the_snapshot() {
        let r = Readiness::default();
        let mut woken = Vec::new();
        r.deliver(READ, NONE, &mut woken);
        let seen = r.snapshot(Direction::Read);
        assert!(seen.is_ready());
        // The reactor delivers again between the failed syscall and the clear.
        r.deliver(READ, NONE, &mut woken);
        r.clear(seen, Learnt::WouldBlock);
        assert!(r.snapshot(Direction::Read).is_ready(), "a newer event must survive the clear");
        // With no newer event, the clear sticks, and touches only its own direction.
        r.deliver(NONE, Event { ready: true, hup: false }, &mut woken);
        let seen = r.snapshot(Direction::Read);
        r.clear(seen, Learnt::WouldBlock);
        assert!(!r.snapshot(Direction::Read).is_ready());
        assert!(r.snapshot(Direction::Write).is_ready());
    }

    /// Data and the peer's end of stream in one event: the short read that takes the data clears
    /// only "data may be there"; the next read must still be tried (it returns `Ok(0)`), or it
    /// would wait for an event that already came. Only `EAGAIN` takes the end of stream back.
    #[test]
    fn a_short_read_keeps_an_end_of_stream_that_came_with_the_data() {
        let r = Readiness::default();
        let mut woken = Vec::new();
        r.deliver(Event { ready: true, hup: true }, NONE, &mut woken);
        let seen = r.snapshot(Direction::Read);
        r.clear(seen, Learnt::Drained);
        assert!(r.snapshot(Direction::Read).is_ready(), "the end of stream was lost");
        assert_eq!(r.wait(Direction::Read, None), Wait::Ready);
        let seen = r.snapshot(Direction::Read);
        r.clear(seen, Learnt::WouldBlock);
        assert!(!r.snapshot(Direction::Read).is_ready());
        // A drained write keeps a hang-up the same way.
        r.deliver(NONE, Event { ready: true, hup: true }, &mut woken);
        let seen = r.snapshot(Direction::Write);
        r.clear(seen, Learnt::Drained);
        assert!(r.snapshot(Direction::Write).is_ready(), "the hang-up was lost");
    }

    #[test]
    fn close_fails_waits() {
        let r = Readiness::default();
        r.close();
        assert!(r.snapshot(Direction::Write).is_closed());
        assert_eq!(r.wait(Direction::Write, None), Wait::Closed);
    }
}
