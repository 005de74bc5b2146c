//! The channel itself, one implementation for every flavour (Go's `hchan` design): a buffer of
//! capacity `cap` (0 for a rendezvous, `usize::MAX` for unbounded), a FIFO of blocked senders
//! and one of blocked receivers, all behind one short inner lock that is never held across a
//! park or while a message is dropped.
//!
//! A blocked operation is a heap [`Slot`] in the queue: the waiter plus, for a send, the
//! message. The counterpart completes it *directly* and `grant`s it (a send hands its message
//! into a waiting receiver's slot; a receive takes a waiting sender's message, or moves it into
//! the room it just made), so a woken waiter never retries and never loses a race to a barger.
//! The waiter's one-shot state decides every race: the message in a slot belongs to the waiter
//! unless a counterpart won `grant`, and a timed-out waiter that loses `cancel` has been served.
//! Served slots go to a short spare list and are overwritten in place once their last other
//! reference is gone (`Arc::get_mut`), so steady blocking does not allocate.
//!
//! Invariants, all under the inner lock:
//! 1. A `WAITING` receive slot exists only while the buffer is empty (receivers wait only on an
//!    empty buffer, and every send serves a waiting receiver before buffering).
//! 2. A `WAITING` send slot exists only while the buffer is full (for `bounded(0)`: always).
//!
//! Protocol, message-slot ownership rules and proof sketch: `arch/sync.md`.

use std::collections::VecDeque;
use std::fmt;
use std::sync::PoisonError;
use std::time::Instant;

use super::error::{RecvTimeoutError, SendTimeoutError, TryRecvError, TrySendError};
use crate::sync::loom::{self, Arc, AtomicUsize, UnsafeCell};
use crate::sync::wait_list::{Entry, Outcome, WaitQueue, WaitReason, Waiter};

/// The capacity of an unbounded channel.
pub(crate) const UNBOUNDED: usize = usize::MAX;

/// Served slots kept for reuse, so that a steady blocking pattern (ping-pong, a consumer that
/// keeps waiting) does not allocate: a slot is reused once its owner and server dropped it.
const SPARE_SLOTS: usize = 4;

pub(crate) struct Chan<T> {
    synced: loom::Mutex<Synced<T>>,
    cap: usize,
    /// Live `Sender` handles; the last one to go disconnects the receivers.
    pub(crate) senders: AtomicUsize,
    /// Live `Receiver` handles; the last one to go disconnects the senders.
    pub(crate) receivers: AtomicUsize,
}

/// State guarded by `Chan::synced`.
struct Synced<T> {
    buf: VecDeque<T>,
    senders: WaitQueue<Arc<Slot<T>>>,
    receivers: WaitQueue<Arc<Slot<T>>>,
    senders_gone: bool,
    receivers_gone: bool,
    /// Slots recently served or found stale; reusable once nobody else holds them.
    spare: Vec<Arc<Slot<T>>>,
}

impl<T> Synced<T> {
    /// A slot for a plain (not `select!`) blocking call of the calling fiber: a spare one that
    /// nobody else holds any more if there is one, else a new one.
    fn own_slot(&mut self, msg: Option<T>) -> Arc<Slot<T>> {
        while let Some(mut spare) = self.spare.pop() {
            // `get_mut` succeeds only if this is the last reference: the old owner and server
            // are done with it, so it can be overwritten in place.
            if let Some(slot) = Arc::get_mut(&mut spare) {
                debug_assert!(slot.take().is_none(), "a finished slot holds no message");
                match &slot.waiter {
                    // Ours from an earlier wait (a ping-pong blocks on the same channel each
                    // round): the same handle will do (an own slot's `op` is always 0). No other
                    // party holds the slot (we have `get_mut`), so none can still be waking the
                    // waiter: `reset`'s premise.
                    SlotWaiter::Own(w) if w.is_for_running_fiber() => {
                        w.reset();
                        slot.msg.with_mut(|m| {
                            // SAFETY: `get_mut` gave us the only reference to the slot.
                            unsafe { *m = msg };
                        });
                    }
                    _ => *slot = Slot::new(SlotWaiter::Own(Waiter::new()), 0, msg),
                }
                return spare;
            }
        }
        Arc::new(Slot::new(SlotWaiter::Own(Waiter::new()), 0, msg))
    }

    /// Offers a slot just popped from a queue for reuse.
    fn recycle(&mut self, slot: &Arc<Slot<T>>) {
        if self.spare.len() < SPARE_SLOTS && matches!(slot.waiter, SlotWaiter::Own(_)) {
            self.spare.push(slot.clone());
        }
    }
}

/// The waiter of a slot: its own for a plain blocking call, shared by the arms of a `select!`.
pub(crate) enum SlotWaiter {
    Own(Waiter),
    Shared(Arc<Waiter>),
}

/// One blocked operation of one waiter on one channel.
///
/// Ownership of `msg` (see `arch/sync.md`): a send slot's message belongs to its waiter unless
/// a receiver, holding the inner lock, won `grant` on it; a receive slot's message is written
/// by a sender holding the inner lock *before* it tries `grant`, taken back if `grant` fails,
/// and read by the waiter only after it has seen `Granted` for this slot's `op`.
pub(crate) struct Slot<T> {
    waiter: SlotWaiter,
    /// The `select!` arm this slot belongs to; 0 for plain calls.
    op: usize,
    msg: UnsafeCell<Option<T>>,
}

// SAFETY: `msg` is accessed only as the ownership rules above allow: by one party at a time,
// each hand-over ordered by the inner lock or by the waiter's Release/Acquire state. So a
// shared `Slot` only moves `T` between threads (`T: Send`); the waiter is `Send + Sync`.
unsafe impl<T: Send> Sync for Slot<T> {}
// SAFETY: as above; owning a slot owns at most one `T`.
unsafe impl<T: Send> Send for Slot<T> {}

impl<T> Slot<T> {
    pub(crate) fn new(waiter: SlotWaiter, op: usize, msg: Option<T>) -> Slot<T> {
        Slot { waiter, op, msg: UnsafeCell::new(msg) }
    }

    pub(crate) fn waiter(&self) -> &Waiter {
        match &self.waiter {
            SlotWaiter::Own(waiter) => waiter,
            SlotWaiter::Shared(waiter) => waiter,
        }
    }

    /// Takes the message.
    ///
    /// Precondition: the caller owns `msg` under the rules on [`Slot`].
    pub(crate) fn take(&self) -> Option<T> {
        // SAFETY: the caller owns `msg` (precondition), so no other access is concurrent.
        self.msg.with_mut(|msg| unsafe { (*msg).take() })
    }

    /// Stores a message into a receive slot. Precondition: as for [`Slot::take`].
    fn put(&self, value: T) {
        // SAFETY: the caller holds the inner lock and has not yet tried `grant`, so the waiter
        // does not read `msg` (it reads only after `Granted`), and no other sender is here.
        self.msg.with_mut(|msg| unsafe { *msg = Some(value) });
    }

    /// Tries to complete this slot's operation for its waiter.
    fn grant(&self) -> bool {
        self.waiter().grant(self.op)
    }
}

impl<T> fmt::Debug for Slot<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot").field("op", &self.op).finish_non_exhaustive()
    }
}

impl<T> Entry for Arc<Slot<T>> {
    fn waiter(&self) -> &Waiter {
        Slot::waiter(self)
    }
}

/// A slot that was just granted or woken: unpark its waiter once the inner lock is released.
#[must_use = "the waiter must be unparked after the inner lock is released"]
pub(crate) struct Wake<T>(Option<Arc<Slot<T>>>);

impl<T> Wake<T> {
    pub(crate) fn unpark(self) {
        if let Some(slot) = self.0 {
            slot.waiter().unpark();
        }
    }
}

impl<T> Chan<T> {
    pub(crate) fn new(cap: usize) -> Chan<T> {
        Chan {
            synced: loom::Mutex::new(Synced {
                buf: VecDeque::new(),
                senders: WaitQueue::new(),
                receivers: WaitQueue::new(),
                senders_gone: false,
                receivers_gone: false,
                spare: Vec::new(),
            }),
            cap,
            senders: AtomicUsize::new(1),
            receivers: AtomicUsize::new(1),
        }
    }

    fn lock(&self) -> loom::MutexGuard<'_, Synced<T>> {
        // Nothing panics with the inner lock held, so poisoning cannot carry information.
        self.synced.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn capacity(&self) -> Option<usize> {
        (self.cap != UNBOUNDED).then_some(self.cap)
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().buf.len()
    }

    /// Whether the buffer is full now; always true for a rendezvous channel.
    pub(crate) fn is_full(&self) -> bool {
        self.lock().buf.len() >= self.cap
    }

    // ---- sending -------------------------------------------------------------------------

    pub(crate) fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        let mut synced = self.lock();
        let result = Self::try_send_locked(&mut synced, self.cap, msg);
        drop(synced);
        result.map(Wake::unpark)
    }

    /// Sends without blocking, with the inner lock held.
    fn try_send_locked(synced: &mut Synced<T>, cap: usize, msg: T) -> Result<Wake<T>, TrySendError<T>> {
        if synced.receivers_gone {
            return Err(TrySendError::Disconnected(msg));
        }
        let mut msg = msg;
        // Invariant 1: a waiting receiver means an empty buffer, so serving it first keeps
        // FIFO order. Stale slots (cancelled, or another select arm won) are dropped.
        while let Some(slot) = synced.receivers.pop_front() {
            slot.put(msg);
            let granted = slot.grant();
            synced.recycle(&slot);
            if granted {
                return Ok(Wake(Some(slot)));
            }
            msg = slot.take().expect("message put just above");
        }
        if synced.buf.len() < cap {
            synced.buf.push_back(msg);
            Ok(Wake(None))
        } else {
            Err(TrySendError::Full(msg))
        }
    }

    /// Blocking send with an optional deadline.
    pub(crate) fn send(&self, msg: T, deadline: Option<Instant>) -> Result<(), SendTimeoutError<T>> {
        let mut msg = msg;
        loop {
            let mut synced = self.lock();
            match Self::try_send_locked(&mut synced, self.cap, msg) {
                Ok(wake) => {
                    drop(synced);
                    wake.unpark();
                    return Ok(());
                }
                Err(TrySendError::Disconnected(m)) => {
                    return Err(SendTimeoutError::Disconnected(m));
                }
                Err(TrySendError::Full(m)) => msg = m,
            }
            if !cfg!(loom) && deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(SendTimeoutError::Timeout(msg));
            }
            let slot = synced.own_slot(Some(msg));
            synced.senders.push_back(slot.clone());
            drop(synced);
            let abandon = |outcome: Option<Outcome>| {
                if outcome.is_none() {
                    // Never taken: withdraw it, and drop the message (outside the lock) with
                    // the rest of what the unwound fiber owned. It was never delivered.
                    let mut synced = self.lock();
                    synced.senders.remove(slot.waiter());
                    let msg = slot.take();
                    drop(synced);
                    drop(msg);
                }
            };
            let outcome = slot.waiter().wait_or_abandon(WaitReason::ChannelSend, deadline, abandon);
            if outcome == Outcome::Granted(0) {
                // A receiver took the message.
                return Ok(());
            }
            // Woken (the receivers disconnected) or timed out: the message is still ours.
            let mut synced = self.lock();
            synced.senders.remove(slot.waiter());
            msg = slot.take().expect("an ungranted send slot keeps its message");
            drop(synced);
            if outcome == Outcome::TimedOut {
                return Err(SendTimeoutError::Timeout(msg));
            }
        }
    }

    // ---- receiving -----------------------------------------------------------------------

    pub(crate) fn try_recv(&self) -> Result<T, TryRecvError> {
        let mut synced = self.lock();
        let result = Self::try_recv_locked(&mut synced);
        drop(synced);
        result.map(|(msg, wake)| {
            wake.unpark();
            msg
        })
    }

    /// Receives without blocking, with the inner lock held.
    fn try_recv_locked(synced: &mut Synced<T>) -> Result<(T, Wake<T>), TryRecvError> {
        // Stale send slots are dropped from the queue; their owners take their messages back
        // from their own `Arc` (the rules on `Slot`).
        let served = synced.senders.pop_accepted(|slot| slot.grant());
        if let Some(slot) = &served {
            synced.recycle(slot);
        }
        let msg = match synced.buf.pop_front() {
            Some(msg) => {
                if let Some(slot) = &served {
                    // Invariant 2: the buffer was full; the sender's message takes the room.
                    synced.buf.push_back(slot.take().expect("granted send slot"));
                }
                msg
            }
            // Empty buffer: a rendezvous, or a bounded channel whose room was all taken.
            None => match &served {
                Some(slot) => slot.take().expect("granted send slot"),
                None if synced.senders_gone => return Err(TryRecvError::Disconnected),
                None => return Err(TryRecvError::Empty),
            },
        };
        Ok((msg, Wake(served)))
    }

    /// Blocking receive with an optional deadline.
    pub(crate) fn recv(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        loop {
            let mut synced = self.lock();
            match Self::try_recv_locked(&mut synced) {
                Ok((msg, wake)) => {
                    drop(synced);
                    wake.unpark();
                    return Ok(msg);
                }
                Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
                Err(TryRecvError::Empty) => {}
            }
            if !cfg!(loom) && deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(RecvTimeoutError::Timeout);
            }
            let slot = synced.own_slot(None);
            synced.receivers.push_back(slot.clone());
            drop(synced);
            let abandon = |outcome: Option<Outcome>| {
                let mut synced = self.lock();
                match outcome {
                    None => synced.receivers.remove(slot.waiter()),
                    Some(Outcome::Granted(_)) => {
                        let msg = slot.take().expect("granted receive slot");
                        Self::redeliver(synced, msg);
                    }
                    Some(_) => {}
                }
            };
            match slot.waiter().wait_or_abandon(WaitReason::ChannelRecv, deadline, abandon) {
                // The sender wrote the message before its Release `grant`, which `wait` saw
                // with Acquire, and it no longer touches the slot.
                Outcome::Granted(_) => return Ok(slot.take().expect("granted receive slot")),
                // The senders disconnected (the waker already dropped our slot): drain first.
                Outcome::Woken(_) => continue,
                Outcome::TimedOut => {
                    self.lock().receivers.remove(slot.waiter());
                    return Err(RecvTimeoutError::Timeout);
                }
            }
        }
    }

    /// A message was delivered to a receiver that is gone (unwound by its runtime's drop):
    /// give it to the next receiver, or put it back at the head of the buffer (the room it
    /// came from may be taken again, so this may exceed `cap` by one). Never parks or panics.
    fn redeliver(mut synced: loom::MutexGuard<'_, Synced<T>>, mut msg: T) {
        while let Some(next) = synced.receivers.pop_front() {
            next.put(msg);
            let granted = next.grant();
            synced.recycle(&next);
            if granted {
                drop(synced);
                next.waiter().unpark();
                return;
            }
            msg = next.take().expect("message put just above");
        }
        synced.buf.push_front(msg);
    }

    // ---- select! support -----------------------------------------------------------------

    /// Hands on a message granted to a `select!` that its runtime's drop unwound.
    pub(crate) fn hand_on(&self, msg: T) {
        Self::redeliver(self.lock(), msg);
    }

    /// Runs `f` with the inner lock held, for `select!`'s arms.
    pub(crate) fn with_lock<R>(&self, f: impl FnOnce(&mut Locked<'_, T>) -> R) -> R {
        let mut locked = Locked { synced: self.lock(), cap: self.cap };
        f(&mut locked)
    }

    // ---- disconnection -------------------------------------------------------------------

    /// The last `Sender` is gone: wake every blocked receiver to drain and see it.
    pub(crate) fn disconnect_senders(&self) {
        let waiting = {
            let mut synced = self.lock();
            synced.senders_gone = true;
            synced.receivers.take_all()
        };
        for slot in waiting {
            if slot.waiter().wake(slot.op) {
                slot.waiter().unpark();
            }
        }
    }

    /// The last `Receiver` is gone: wake every blocked sender (it takes its message back) and
    /// drop the buffered messages, outside the lock since their destructors may do anything.
    pub(crate) fn disconnect_receivers(&self) {
        let (waiting, buffered) = {
            let mut synced = self.lock();
            synced.receivers_gone = true;
            (synced.senders.take_all(), std::mem::take(&mut synced.buf))
        };
        for slot in waiting {
            if slot.waiter().wake(slot.op) {
                slot.waiter().unpark();
            }
        }
        drop(buffered);
    }
}

/// The inner lock of one channel, held by a `select!` arm.
pub(crate) struct Locked<'a, T> {
    synced: loom::MutexGuard<'a, Synced<T>>,
    cap: usize,
}

impl<T> Locked<'_, T> {
    pub(crate) fn send_ready(&self) -> bool {
        self.synced.receivers_gone
            || self.synced.buf.len() < self.cap
            || self.synced.receivers.iter().any(|s| s.waiter().is_waiting())
    }

    pub(crate) fn recv_ready(&self) -> bool {
        !self.synced.buf.is_empty()
            || self.synced.senders_gone
            || self.synced.senders.iter().any(|s| s.waiter().is_waiting())
    }

    pub(crate) fn try_send(&mut self, msg: T) -> Result<Wake<T>, TrySendError<T>> {
        Chan::try_send_locked(&mut self.synced, self.cap, msg)
    }

    pub(crate) fn try_recv(&mut self) -> Result<(T, Wake<T>), TryRecvError> {
        Chan::try_recv_locked(&mut self.synced)
    }

    pub(crate) fn register_send(&mut self, slot: Arc<Slot<T>>) {
        self.synced.senders.push_back(slot);
    }

    pub(crate) fn register_recv(&mut self, slot: Arc<Slot<T>>) {
        self.synced.receivers.push_back(slot);
    }

    /// Removes every slot of `waiter` from both queues.
    pub(crate) fn unregister(&mut self, waiter: &Waiter) {
        self.synced.senders.remove(waiter);
        self.synced.receivers.remove(waiter);
    }
}

impl<T> fmt::Debug for Chan<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chan")
            .field("cap", &self.capacity())
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! A timed wait meets a hand-off (the timer is modelled as already fired): the message is
    //! delivered exactly once or stays with its sender, never lost, never both.
    use std::time::Duration;

    use crate::channel::{RecvTimeoutError, bounded};

    const LONG: Duration = Duration::from_secs(60);

    #[test]
    fn rendezvous_timed_recv_races_timed_send() {
        ::loom::model(|| {
            let (tx, rx) = bounded::<u32>(0);
            let sender = ::loom::thread::spawn(move || tx.send_timeout(7, LONG).is_ok());
            let got = rx.recv_timeout(LONG);
            let sent = sender.join().unwrap();
            assert_eq!(got.is_ok(), sent, "got {got:?}, sent {sent}");
            assert!(got.is_ok() || got == Err(RecvTimeoutError::Timeout) || !sent);
        });
    }

    #[test]
    fn buffered_timed_recv_races_send() {
        ::loom::model(|| {
            let (tx, rx) = bounded::<u32>(1);
            let sender = ::loom::thread::spawn(move || tx.send(7).unwrap());
            let got = rx.recv_timeout(LONG);
            sender.join().unwrap();
            // Either the timed receive got it, or it is still buffered; never both.
            let rest: Vec<u32> = rx.try_iter().collect();
            match got {
                Ok(v) => assert_eq!((v, rest.len()), (7, 0)),
                Err(_) => assert_eq!(rest, [7]),
            }
        });
    }

    /// Blocking ping-pong: the second round of each side reuses its first round's slot.
    #[test]
    fn ping_pong_reuses_slots() {
        ::loom::model(|| {
            let (ping_tx, ping_rx) = bounded::<u32>(1);
            let (pong_tx, pong_rx) = bounded::<u32>(0);
            let echo = ::loom::thread::spawn(move || {
                for _ in 0..2 {
                    let v = ping_rx.recv().unwrap();
                    pong_tx.send(v + 1).unwrap();
                }
            });
            for i in 0..2 {
                ping_tx.send(i).unwrap();
                assert_eq!(pong_rx.recv(), Ok(i + 1));
            }
            echo.join().unwrap();
        });
    }

    #[test]
    fn select_timeout_races_send() {
        ::loom::model(|| {
            let (tx1, rx1) = bounded::<u32>(0);
            let (_tx2, rx2) = bounded::<u32>(0);
            let sender = ::loom::thread::spawn(move || tx1.send_timeout(7, LONG).is_ok());
            let got = crate::select! {
                recv(rx1) -> m => m.ok(),
                recv(rx2) -> m => m.ok(),
                default(LONG) => None,
            };
            let sent = sender.join().unwrap();
            assert_eq!(got.is_some(), sent);
        });
    }
}
