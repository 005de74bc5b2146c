//! The I/O reactor: one epoll set per carrier, each polled by its own carrier.
//!
//! There is no I/O thread, and no shared poller. A socket joins the set of the carrier whose
//! fiber first waits on it (with one fiber per connection, the carrier that runs it: fibers stay
//! on their home carrier), and moves to the set of a fiber of another carrier that waits on it
//! alone later (a connection handed over: `move_registration`), so readiness wakes the waiter's
//! carrier in its own `epoll_wait` and the fiber goes to its LIFO slot: no futex, no inbox
//! hand-off. An idle carrier blocks in `epoll_wait` on
//! its set (until the earliest timer), never in a thread park; `Shared::unpark_carrier` wakes it
//! through the set's eventfd. Busy carriers poll their set without blocking every millisecond or
//! so. A set is opened when its carrier starts (a runtime with 256 carrier slots opens none for
//! the slots it never starts).
//!
//! A set is read by its owner, except when the owner cannot: a carrier blocked in the OS (the
//! supervisor and idle carriers poll its set without blocking, as they fire its timers), a
//! carrier computing in one fiber with no switch point (the supervisor reads every set whose
//! owner has not polled it since its last tick), and a retired spare (it sleeps in `epoll_wait`
//! on its own set rather than in a thread park). A fiber
//! woken by a carrier other than its home goes to its home's inbox, as any cross-carrier wake,
//! so a socket shared between fibers of two homes, or a migrated fiber, is served correctly.
//!
//! Sockets are registered edge-triggered, for both directions, in one set at a time. The epoll token of a
//! registration is the address of its [`Readiness`], kept alive by the socket's `Arc` and, after
//! deregistration, by its set until no event carrying the token can be in flight:
//!
//! 1. `deregister` removes the descriptor from the set (`EPOLL_CTL_DEL`), then queues the `Arc`
//!    on the set's `released` list.
//! 2. At the start of each poll of that set, before its `epoll_wait`, the poller drops what is
//!    queued.
//!
//! An event carrying the token can only come from an `epoll_wait` on that set that started
//! before step 1's `DEL` finished. Polls of one set run one at a time (its `buffers` lock), so
//! that wait belongs to an earlier poll, whose dispatch finished before the poll that runs step
//! 2 for it began. See `arch/io.md`.

pub(crate) mod registration;

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use super::lazy_table::LazyTable;
use crate::fiber::handle::Fiber;
use crate::platform::epoll;
use registration::{Event, Readiness};

/// The eventfd's token; registrations use any other value (addresses are never `u64::MAX`).
const WAKE_TOKEN: u64 = u64::MAX;
/// Events taken per `epoll_wait`.
const EVENTS: usize = 256;

const EPOLLIN: u32 = libc::EPOLLIN as u32;
const EPOLLOUT: u32 = libc::EPOLLOUT as u32;
const EPOLLRDHUP: u32 = libc::EPOLLRDHUP as u32;
const EPOLLPRI: u32 = libc::EPOLLPRI as u32;
const EPOLLHUP: u32 = libc::EPOLLHUP as u32;
const EPOLLERR: u32 = libc::EPOLLERR as u32;
const EPOLLET: u32 = libc::EPOLLET as u32;
/// Events that let a read-side operation make progress (data, a connection, end of stream, an
/// error to report).
const READ_EVENTS: u32 = EPOLLIN | EPOLLRDHUP | EPOLLPRI | EPOLLHUP | EPOLLERR;
/// Events that let a write-side operation make progress (room, a finished connect, an error).
const WRITE_EVENTS: u32 = EPOLLOUT | EPOLLHUP | EPOLLERR;
/// Events after which a read-side call does not block until one says `EAGAIN` (end of stream,
/// hang-up, a pending error): a short read must not clear them (`registration.rs`).
const READ_HUP_EVENTS: u32 = EPOLLRDHUP | EPOLLHUP | EPOLLERR;
/// The same for a write-side call.
const WRITE_HUP_EVENTS: u32 = EPOLLHUP | EPOLLERR;

/// The carriers' poll sets, one slot per carrier slot (`None` until that carrier starts).
pub(crate) struct Reactor {
    /// Made in chunks as carriers start (`LazyTable`): `max_carriers` may be large.
    sets: LazyTable<OnceLock<PollSet>>,
    /// `platform::forks()` when the runtime was built. In a child forked since, the sets are the
    /// parent's kernel objects (an epoll set and an eventfd are shared across `fork`, unlike
    /// memory): the child must not change them or signal them (`forked`).
    forks: u64,
}

/// One carrier's epoll set.
struct PollSet {
    ep: OwnedFd,
    waker: OwnedFd,
    /// Held by the thread polling this set (its owner, or a helper polling for a blocked owner);
    /// serialises the polls of the set, which the deregistration protocol relies on.
    buffers: Mutex<PollBuffers>,
    /// Deregistered readiness states, freed by the next poll (see the module docs).
    released: Mutex<Vec<Arc<Readiness>>>,
    /// `released` is not empty (a hint, so that polls skip its lock).
    has_released: AtomicBool,
    /// Polls by the owner so far: the supervisor reads the sets whose owner has not polled
    /// since its last look (a carrier computing in one fiber, or blocked in the OS).
    owner_polls: AtomicU64,
}

/// A poller's reusable buffers.
struct PollBuffers {
    events: Vec<epoll::Event>,
    /// Fibers to unpark, collected under each registration's lock and woken outside it.
    woken: Vec<Fiber>,
}

impl Reactor {
    /// Room for `slots` sets; opens none.
    pub(crate) fn new(slots: usize) -> Reactor {
        Reactor { sets: LazyTable::new(slots), forks: crate::platform::forks() }
    }

    /// Whether this is a copy in a child forked after the runtime was built: its sets belong to
    /// the parent.
    pub(crate) fn forked(&self) -> bool {
        crate::platform::forks() != self.forks
    }

    /// Opens carrier `i`'s set, unless it is open. Called before the carrier's thread starts.
    pub(crate) fn open(&self, i: usize) -> io::Result<()> {
        let slot = self.sets.get_or_make(i, |_| OnceLock::new());
        if slot.get().is_some() {
            return Ok(());
        }
        let ep = epoll::epoll_create()?;
        let waker = epoll::eventfd()?;
        epoll::epoll_add(&ep, waker.as_raw_fd(), EPOLLIN | EPOLLET, WAKE_TOKEN)?;
        // Slots are started under the runtime's `threads` lock, so no one races this; a loser
        // would only close its spare descriptors.
        let _ = slot.set(PollSet {
            ep,
            waker,
            buffers: Mutex::new(PollBuffers {
                events: vec![epoll::Event { events: 0, u64: 0 }; EVENTS],
                woken: Vec::new(),
            }),
            released: Mutex::new(Vec::new()),
            has_released: AtomicBool::new(false),
            owner_polls: AtomicU64::new(0),
        });
        Ok(())
    }

    fn set(&self, i: usize) -> &PollSet {
        self.sets.get(i).and_then(OnceLock::get).expect("a started carrier's poll set is open")
    }

    /// The owner's poll: waits up to `timeout` (`None`: until woken) for readiness on carrier
    /// `i`'s set and wakes the fibers waiting on ready descriptors. Returns how many it woke.
    /// Only carrier `i` blocks here; a helper holding the set for a zero-timeout poll delays it
    /// for that poll.
    pub(crate) fn poll(&self, i: usize, timeout: Option<Duration>) -> usize {
        let set = self.set(i);
        set.poll(&mut lock(&set.buffers), timeout, true)
    }

    /// A poll without blocking, skipped while another thread polls the set (which reads it
    /// anyway): the owner's periodic poll, or a helper's for an owner blocked in the OS.
    /// `owner`: the caller is carrier `i` (a helper passes the eventfd's wake on to it).
    pub(crate) fn try_poll(&self, i: usize, owner: bool) -> usize {
        let Some(set) = self.sets.get(i).and_then(OnceLock::get) else { return 0 };
        match set.buffers.try_lock() {
            Ok(mut b) => set.poll(&mut b, Some(Duration::ZERO), owner),
            Err(_) => 0,
        }
    }

    /// How many times carrier `i` has polled its own set (0 for a set not open).
    pub(crate) fn owner_polls(&self, i: usize) -> u64 {
        // Relaxed: a hint; a stale count costs one needless (non-blocking) poll, or delays one
        // by a supervisor tick.
        self.sets.get(i).and_then(OnceLock::get).map_or(0, |s| s.owner_polls.load(Ordering::Relaxed))
    }

    /// Interrupts carrier `i` blocked in `epoll_wait` on its set.
    pub(crate) fn wake(&self, i: usize) {
        if self.forked() {
            // A stale unpark in a forked child: the eventfd is the parent's carrier's.
            return;
        }
        if let Some(set) = self.sets.get(i).and_then(OnceLock::get) {
            epoll::eventfd_signal(&set.waker);
        }
    }

    /// Adds `fd` to carrier `i`'s set, edge-triggered, for both directions.
    pub(crate) fn register(&self, i: usize, fd: i32) -> io::Result<Arc<Readiness>> {
        let readiness = Arc::new(Readiness::default());
        let token = Arc::as_ptr(&readiness) as u64;
        epoll::epoll_add(&self.set(i).ep, fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, token)?;
        Ok(readiness)
    }

    /// Moves `fd`, registered with carrier `from`'s set, to carrier `to`'s. Added to the new
    /// set first, so it is never in neither: the `ADD` reports its current readiness there, and
    /// an event taken from the old set meanwhile is delivered as any other. The state stays
    /// queued on the old set's `released` list as on a deregistration, since a poll of that set
    /// that began before the `DEL` may still carry the token (module docs, step 1).
    pub(crate) fn move_registration(
        &self,
        from: usize,
        to: usize,
        fd: i32,
        readiness: &Arc<Readiness>,
    ) -> io::Result<()> {
        if self.forked() {
            return Err(io::Error::other("a forked child's copy of a reactor"));
        }
        let token = Arc::as_ptr(readiness) as u64;
        epoll::epoll_add(&self.set(to).ep, fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, token)?;
        let old = self.set(from);
        if epoll::epoll_del(&old.ep, fd).is_err() {
            // Not in the old set after all (nothing else removes it): keep the state for ever
            // rather than reason about a token that set might still report.
            std::mem::forget(Arc::clone(readiness));
            return Ok(());
        }
        lock(&old.released).push(Arc::clone(readiness));
        // Release pairs with the Acquire load in `poll`.
        old.has_released.store(true, Ordering::Release);
        Ok(())
    }

    /// Removes `fd` from carrier `i`'s set; `fd` must still be open. Keeps `readiness` alive
    /// until no event carrying its token can be in flight (step 1 in the module docs).
    pub(crate) fn deregister(&self, i: usize, fd: i32, readiness: &Arc<Readiness>) {
        let set = self.set(i);
        if self.forked() {
            // A socket copied into a forked child: `DEL` would take the parent's descriptor out
            // of the parent's set (the set is keyed by the open file, which both share), and the
            // state must outlive any event the parent's poll may still carry for it in its copy of
            // memory — which is not ours. Leak ours.
            std::mem::forget(Arc::clone(readiness));
            return;
        }
        if epoll::epoll_del(&set.ep, fd).is_err() {
            // The descriptor was closed behind the socket's back (an I/O-safety violation by
            // someone): if a duplicate of it lives on, the kernel may keep reporting the token
            // for ever. Leak the state so that such a report never reads freed memory.
            std::mem::forget(Arc::clone(readiness));
            return;
        }
        let mut r = lock(&set.released);
        r.push(Arc::clone(readiness));
        // Release pairs with the Acquire load in `poll`.
        set.has_released.store(true, Ordering::Release);
    }
}

impl PollSet {
    /// One poll; the caller holds `buffers` (which serialises polls of this set).
    /// `owner`: whether the caller is the set's carrier. A wake read by a helper is meant for
    /// the owner, which may be about to sleep here (waiting for this poll's lock): the helper
    /// signals the eventfd again, or that wake would be lost (seen as a hang under valgrind,
    /// whose slowness makes the supervisor catch carriers often).
    fn poll(&self, buffers: &mut PollBuffers, timeout: Option<Duration>, owner: bool) -> usize {
        if owner {
            // Only the owner writes it (under `buffers`): a load and a store, no locked add.
            self.owner_polls
                .store(self.owner_polls.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        }
        // Step 2 of the deregistration protocol: no event for these can still be pending.
        // Acquire pairs with the Release store in `deregister`.
        if self.has_released.load(Ordering::Acquire) {
            let freed = {
                let mut r = lock(&self.released);
                self.has_released.store(false, Ordering::Relaxed);
                std::mem::take(&mut *r)
            };
            drop(freed);
        }
        let PollBuffers { events, woken } = buffers;
        let n = match epoll::epoll_wait(&self.ep, events, timeout) {
            Ok(n) => n,
            Err(e) => {
                // EBADF/EINVAL would be a bug of ours; do not spin on it.
                eprintln!("virtual-threads: epoll_wait failed: {e}");
                return 0;
            }
        };
        for ev in &events[..n] {
            let (token, bits) = (ev.u64, ev.events);
            if token == WAKE_TOKEN {
                if owner {
                    epoll::eventfd_drain(&self.waker);
                } else {
                    epoll::eventfd_signal(&self.waker);
                }
                continue;
            }
            // SAFETY: `token` is the address of a live `Readiness` registered with this set:
            // the socket's `Arc` keeps it alive until `deregister`, then `released` until the
            // start of a later poll of this set than this one (steps 1 and 2 in the module docs).
            let readiness = unsafe { &*(token as *const Readiness) };
            let read = Event { ready: bits & READ_EVENTS != 0, hup: bits & READ_HUP_EVENTS != 0 };
            let write = Event { ready: bits & WRITE_EVENTS != 0, hup: bits & WRITE_HUP_EVENTS != 0 };
            readiness.deliver(read, write, woken);
        }
        let count = woken.len();
        // Unpark outside every registration's lock: a fiber at home on the polling carrier goes
        // to its LIFO slot, one at home elsewhere to that carrier's inbox.
        for f in woken.drain(..) {
            f.unpark();
        }
        count
    }
}

/// Locks a mutex that no code panics under; recovers from a poison anyway.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    /// Two descriptors per started carrier, not per carrier slot: 256 slots opened 512
    /// descriptors up front otherwise.
    #[test]
    fn only_started_carriers_open_a_poll_set() {
        let rt = crate::Runtime::builder().carriers(2).max_carriers(256).build().unwrap();
        let h = rt.handle();
        let shared = h.runtime();
        let open = shared.reactor.sets.iter().filter(|s| s.get().is_some()).count();
        // No fiber ran, so no spare started: the two carriers asked for, and only they.
        assert_eq!(open, 2);
        assert_eq!(shared.started(), 2);
    }
}
