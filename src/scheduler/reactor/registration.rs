//! One socket's registration with a runtime's reactor: its readiness word and the fibers waiting
//! on it, per direction. No system calls here (the reactor and `platform/` make them).
//!
//! # The readiness word
//! ```text
//!  63                                   16 15        3   2        1          0
//! ┌───────────────────────────────────────┬───────────┬────────┬──────────┬──────────┐
//! │ tick: events delivered so far (wraps) │  unused   │ CLOSED │ WRITABLE │ READABLE │
//! └───────────────────────────────────────┴───────────┴────────┴──────────┴──────────┘
//! ```
//! The reactor *sets* direction bits and bumps the tick for every event (`deliver`). An operation
//! *clears* its direction bit only when its system call said `EAGAIN` (or a stream read/write
//! moved less than asked, which means the buffer ran dry), and only if the tick is still the one
//! it saw *before* that system call (`clear`). So an event that arrives between the failed call
//! and the clear survives, and the wait that follows returns at once: no wake-up is lost (tokio's
//! `ScheduledIo` idea; the full argument is in `arch/io.md`).
//!
//! # Waiters
//! Fibers wait in two small lists (readers, writers) under a mutex, on the heap, never on their
//! own stacks. A waiter re-checks the word *under the list lock* before it parks, and the
//! reactor updates the word *before* it takes the lock to wake the list, so one of the two
//! always sees the other. Every waiter of the direction is woken (several fibers may wait on one
//! listener; the losers of the race find `EAGAIN` and wait again).

use std::sync::atomic::{AtomicU64, Ordering};
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
const TICK_SHIFT: u32 = 16;
const FLAGS: u64 = (1 << TICK_SHIFT) - 1;

fn bit(dir: Direction) -> u64 {
    match dir {
        Direction::Read => READABLE,
        Direction::Write => WRITABLE,
    }
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
        self.word & bit(self.dir) != 0
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

    /// The system call behind `seen` found nothing to do: clear the direction's bit, unless an
    /// event arrived since `seen` was taken (the tick moved), which the caller must not miss.
    pub(crate) fn clear(&self, seen: Snapshot) {
        let b = bit(seen.dir);
        let tick = seen.word >> TICK_SHIFT;
        // Relaxed is enough: the CAS compares the whole word, tick included, so it can only
        // succeed against the very value the caller saw.
        let _ = self.word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
            (w >> TICK_SHIFT == tick && w & b != 0).then_some(w & !b)
        });
    }

    /// An event arrived: set the ready bits and bump the tick, then move the woken waiters into
    /// `woken` (the caller unparks them after this returns, outside the lock).
    pub(crate) fn deliver(&self, read: bool, write: bool, woken: &mut Vec<Fiber>) {
        let bits = if read { READABLE } else { 0 } | if write { WRITABLE } else { 0 };
        // AcqRel: the waiter's re-check under the lock must see this update; the lock taken
        // below orders it (update, then lock/unlock here; lock, then load there).
        let _ = self.word.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |w| {
            let tick = (w >> TICK_SHIFT).wrapping_add(1);
            Some((tick << TICK_SHIFT) | (w & FLAGS) | bits)
        });
        let mut w = self.lock();
        if read {
            woken.append(&mut w.readers);
        }
        if write {
            woken.append(&mut w.writers);
        }
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
        let me = crate::fiber::handle::current();
        loop {
            {
                let mut w = self.lock();
                // Acquire: see `snapshot`; the lock already orders this after `deliver`'s update.
                let word = self.word.load(Ordering::Acquire);
                if word & CLOSED != 0 {
                    return Wait::Closed;
                }
                if word & bit(dir) != 0 {
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
            let reason = match dir {
                Direction::Read => WaitReason::NetRead,
                Direction::Write => WaitReason::NetWrite,
            };
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
    /// The carrier whose poll set holds the descriptor.
    set: usize,
    fd: i32,
}

impl Registration {
    /// Registers `fd` with the poll set of carrier `set` of `rt`.
    pub(crate) fn new(rt: &RuntimeRef, set: usize, fd: i32) -> std::io::Result<Registration> {
        let readiness = rt.reactor.register(set, fd)?;
        Ok(Registration { readiness, rt: rt.clone(), set, fd })
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

    /// Whether the registration's runtime has been shut down: no carrier polls its reactor any
    /// more, so waits must not rely on it.
    pub(crate) fn is_orphaned(&self) -> bool {
        // Relaxed: a stale `false` means one more wait on the reactor, which the runtime's
        // shutdown unwinds (same-runtime fiber) or which is the documented cross-runtime gap.
        self.rt.shutdown.load(Ordering::Relaxed)
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Before the descriptor closes (the socket drops its registration first): wake every
        // waiter with an error, then take the descriptor out of the epoll set.
        self.readiness.close();
        self.rt.reactor.deregister(self.set, self.fd, &self.readiness);
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

    #[test]
    fn clear_keeps_an_event_that_arrived_after_the_snapshot() {
        let r = Readiness::default();
        let mut woken = Vec::new();
        r.deliver(true, false, &mut woken);
        let seen = r.snapshot(Direction::Read);
        assert!(seen.is_ready());
        // The reactor delivers again between the failed syscall and the clear.
        r.deliver(true, false, &mut woken);
        r.clear(seen);
        assert!(r.snapshot(Direction::Read).is_ready(), "a newer event must survive the clear");
        // With no newer event, the clear sticks, and touches only its own direction.
        r.deliver(false, true, &mut woken);
        let seen = r.snapshot(Direction::Read);
        r.clear(seen);
        assert!(!r.snapshot(Direction::Read).is_ready());
        assert!(r.snapshot(Direction::Write).is_ready());
    }

    #[test]
    fn close_fails_waits() {
        let r = Readiness::default();
        r.close();
        assert!(r.snapshot(Direction::Write).is_closed());
        assert_eq!(r.wait(Direction::Write, None), Wait::Closed);
    }
}
