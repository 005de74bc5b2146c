//! The I/O reactor: one epoll instance per runtime, polled by carriers.
//!
//! There is no I/O thread. An idle carrier that finds no work becomes the *poller*: it blocks in
//! `epoll_wait` (until the earliest timer) instead of parking its thread, so an idle runtime
//! sleeps in one system call. Busy carriers poll without blocking every millisecond or so, so
//! readiness is never starved by CPU-bound fibers. Only one thread polls at a time (`poller`).
//! A carrier blocked in `epoll_wait` is woken through an eventfd (`wake`).
//!
//! Sockets are registered once, edge-triggered, for both directions. The epoll token of a
//! registration is the address of its [`Readiness`], kept alive by the socket's `Arc` and, after
//! deregistration, by the reactor until no event carrying the token can be in flight:
//!
//! 1. `deregister` removes the descriptor from the epoll set (`EPOLL_CTL_DEL`), then queues the
//!    `Arc` on `released`.
//! 2. At the start of each `poll`, before its `epoll_wait`, the poller drops what is queued.
//!
//! An event carrying the token can only come from an `epoll_wait` that started before step 1's
//! `DEL` finished. Polls run one at a time (the poller lock), so that wait belongs to an earlier
//! poll, whose dispatch finished before the poll that runs step 2 for it began.
//!
//! # Hand-off: the poller role is never left vacant while a carrier sleeps
//! An idle carrier that cannot become the poller (another thread holds the role) parks its
//! thread. If the holder then stops polling and does not come back — it runs the fibers it
//! woke, or it is a spare carrier that retires — nobody would read the epoll set. So:
//!
//! 3. A thread that fails to become the poller puts itself on `standby` (under its lock), then
//!    tries the poller lock once more before giving up.
//! 4. A poller that stops (its `Poller` drops) first releases the poller lock, then empties
//!    `standby` (under its lock) and unparks every thread that was on it; each looks for work
//!    again, and one that finds none becomes the poller (the others go back on standby).
//!    Skipped when the poller slept in `epoll_wait` and woke fibers: it runs them and comes
//!    back to poll (at its next idle moment, or at its next periodic poll, which hands off),
//!    and skipping saves a ping-pong workload a futex wake and a search per message.
//!
//! The `standby` lock orders 3 and 4: if 4's section comes first, 3's retry finds the poller
//! lock free; otherwise 4 finds the thread on `standby`. Every entry is woken, not one, because
//! an entry can be stale (a busy carrier whose periodic poll found the role taken, or a carrier
//! that left its idle path for other work): waking only a stale one would lose the hand-off. A
//! stray unpark costs a running thread one atomic swap, an idle carrier one extra search. See
//! `arch/io.md`.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::Thread;
use std::time::Duration;

use super::registration::Readiness;
use crate::Fiber;
use crate::platform::epoll;

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

pub(crate) struct Reactor {
    ep: OwnedFd,
    waker: OwnedFd,
    /// Held by the one thread that polls; buffers live inside.
    poller: Mutex<PollBuffers>,
    /// Deregistered readiness states, freed by the next poll (see the module docs).
    released: Mutex<Vec<Arc<Readiness>>>,
    /// `released` is not empty (a hint, so that polls skip its lock).
    has_released: AtomicBool,
    /// Threads that wanted the poller role while another thread held it (steps 3 and 4).
    standby: Mutex<Vec<Thread>>,
}

/// The poller's reusable buffers.
struct PollBuffers {
    events: Vec<epoll::Event>,
    /// Fibers to unpark, collected under each registration's lock and woken outside it.
    woken: Vec<Fiber>,
}

/// Proof that the holder is the runtime's only poller. Dropping it hands the role over to the
/// threads on standby (step 4).
pub(crate) struct Poller<'a> {
    /// Always `Some` until `drop`, which must release it before waking a standby thread.
    buffers: Option<MutexGuard<'a, PollBuffers>>,
    reactor: &'a Reactor,
    /// Whether dropping this poller wakes the standby threads (step 4).
    hand_off: bool,
}

impl Reactor {
    pub(crate) fn new() -> io::Result<Reactor> {
        let ep = epoll::epoll_create()?;
        let waker = epoll::eventfd()?;
        epoll::epoll_add(&ep, waker.as_raw_fd(), EPOLLIN | EPOLLET, WAKE_TOKEN)?;
        Ok(Reactor {
            ep,
            waker,
            poller: Mutex::new(PollBuffers {
                events: vec![epoll::Event { events: 0, u64: 0 }; EVENTS],
                woken: Vec::new(),
            }),
            released: Mutex::new(Vec::new()),
            has_released: AtomicBool::new(false),
            standby: Mutex::new(Vec::new()),
        })
    }

    /// Becomes the poller, unless another thread is; then the caller is on standby, and the
    /// poller's hand-off will unpark its thread (steps 3 and 4 in the module docs).
    pub(crate) fn try_poller(&self) -> Option<Poller<'_>> {
        let me = std::thread::current();
        if let Ok(g) = self.poller.try_lock() {
            self.leave_standby(&me);
            return Some(Poller { buffers: Some(g), reactor: self, hand_off: true });
        }
        {
            let mut s = lock(&self.standby);
            if !s.iter().any(|t| t.id() == me.id()) {
                s.push(me.clone());
            }
        }
        // Step 3's retry: the holder may have let go before we were on standby.
        let g = self.poller.try_lock().ok()?;
        self.leave_standby(&me);
        Some(Poller { buffers: Some(g), reactor: self, hand_off: true })
    }

    /// The caller became the poller: an entry of its own left on `standby` (from an earlier
    /// failed attempt) would make a hand-off wake the wrong thread.
    fn leave_standby(&self, me: &Thread) {
        let mut s = lock(&self.standby);
        if !s.is_empty() {
            s.retain(|t| t.id() != me.id());
        }
    }

    /// Waits up to `timeout` (`None`: until woken) for readiness and wakes the fibers waiting on
    /// ready descriptors. Returns how many fibers it woke.
    pub(crate) fn poll(&self, poller: &mut Poller<'_>, timeout: Option<Duration>) -> usize {
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
        let PollBuffers { events, woken } =
            &mut **poller.buffers.as_mut().expect("a live poller holds its buffers");
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
                epoll::eventfd_drain(&self.waker);
                continue;
            }
            // SAFETY: `token` is the address of a live `Readiness` from `register`: the socket's
            // `Arc` keeps it alive until `deregister`, then `released` until the start of a
            // later poll than this one (steps 1 and 2 in the module docs).
            let readiness = unsafe { &*(token as *const Readiness) };
            readiness.deliver(bits & READ_EVENTS != 0, bits & WRITE_EVENTS != 0, woken);
        }
        let count = woken.len();
        // Step 4's exception: a poller that slept and woke fibers will be back.
        poller.hand_off = timeout == Some(Duration::ZERO) || count == 0;
        // Unpark outside every registration's lock; a woken fiber goes to this carrier's queues.
        for f in woken.drain(..) {
            f.unpark();
        }
        count
    }

    /// Interrupts a poller blocked in `epoll_wait`.
    pub(crate) fn wake(&self) {
        epoll::eventfd_signal(&self.waker);
    }

    /// Adds `fd` to the epoll set, edge-triggered, for both directions.
    pub(crate) fn register(&self, fd: i32) -> io::Result<Arc<Readiness>> {
        let readiness = Arc::new(Readiness::default());
        let token = Arc::as_ptr(&readiness) as u64;
        epoll::epoll_add(&self.ep, fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, token)?;
        Ok(readiness)
    }

    /// Removes `fd` from the epoll set; `fd` must still be open. Keeps `readiness` alive until
    /// no event carrying its token can be in flight (step 1 of the protocol in the module docs).
    pub(crate) fn deregister(&self, fd: i32, readiness: &Arc<Readiness>) {
        if epoll::epoll_del(&self.ep, fd).is_err() {
            // The descriptor was closed behind the socket's back (an I/O-safety violation by
            // someone): if a duplicate of it lives on, the kernel may keep reporting the token
            // for ever. Leak the state so that such a report never reads freed memory.
            std::mem::forget(Arc::clone(readiness));
            return;
        }
        let mut r = lock(&self.released);
        r.push(Arc::clone(readiness));
        // Release pairs with the Acquire load in `poll`.
        self.has_released.store(true, Ordering::Release);
    }
}

impl Drop for Poller<'_> {
    fn drop(&mut self) {
        // Step 4: release the role first, then hand it to a standby thread, if any.
        drop(self.buffers.take());
        if !self.hand_off {
            return;
        }
        let mut standby = lock(&self.reactor.standby);
        if standby.is_empty() {
            return;
        }
        let woken = std::mem::take(&mut *standby);
        drop(standby);
        for t in woken {
            t.unpark();
        }
    }
}

/// Locks a mutex that no code panics under; recovers from a poison anyway.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
