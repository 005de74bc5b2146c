//! The arms of a select (`select.rs` runs them): a receive, a send whose message is made once
//! the arm is chosen, a watch that only learns its channel may be ready, and the never-ready
//! arm of a removed `Select` operation. Each implements the engine's steps (`ArmOps`) on its
//! channel, under the channel's inner lock; `arch/sync.md` has the protocol.

use std::time::Instant;

use super::chan::{Chan, Got, Reserved, Slot, SlotWaiter};
use super::error::{RecvError, SendError, TryRecvError, TrySendError};
use super::select::{Arm, ArmOps, Poll};
use super::{Receiver, Sender};
use crate::sync::loom::Arc;
use crate::sync::wait_list::Waiter;

/// An arm that is never ready and registers nothing (a removed `Select` operation).
pub(crate) struct NeverArm;

impl ArmOps for NeverArm {
    fn try_now(&mut self) -> Poll {
        Poll::Pending
    }
    fn try_or_register(&mut self, _: &Arc<Waiter>, _: usize) -> Poll {
        Poll::Pending
    }
    fn unregister(&mut self, _: &Waiter, _: usize) {}
    fn complete_granted(&mut self) {
        unreachable!("a never-ready arm is never granted")
    }
    fn abandon_granted(&mut self) {}
}

/// A `recv(rx) -> res` arm.
pub struct RecvArm<'a, T> {
    chan: &'a Chan<T>,
    slot: Option<Arc<Slot<T>>>,
    registered: bool,
    wake_at: Option<Instant>,
    result: Option<Result<T, RecvError>>,
}

/// A `send(tx, msg) -> res` arm; `F` makes the message once the arm is chosen.
pub struct SendArm<'a, T, F> {
    chan: &'a Chan<T>,
    make: Option<F>,
    msg: Option<T>,
    slot: Option<Arc<Slot<T>>>,
    watching: bool,
    /// The receiver this arm was chosen for, held while the message is made.
    reserved: Option<Reserved<'a, T>>,
    result: Option<Result<(), SendError<T>>>,
}

/// An arm that waits until its channel is ready to send (or receive) and does nothing: the
/// dynamic `Select`'s send operations and its `ready()`.
pub(crate) struct WatchArm<'a, T> {
    chan: &'a Chan<T>,
    send: bool,
    /// A `Select::select` send: chosen, it holds a receiver for the caller's
    /// `SelectedOperation::send` (not a `ready()`, which only looks).
    sends: bool,
    registered: bool,
    wake_at: Option<Instant>,
    reserved: Option<Reserved<'a, T>>,
}

impl<'a, T> RecvArm<'a, T> {
    /// An arm receiving from `rx`.
    pub fn new(rx: &'a Receiver<T>) -> Self {
        Self::on(rx.chan())
    }

    pub(crate) fn on(chan: &'a Chan<T>) -> Self {
        RecvArm { chan, slot: None, registered: false, wake_at: None, result: None }
    }

    /// The arm, type-erased for [`run`](super::select::run).
    pub fn arm(&mut self) -> Arm<'_> {
        Arm { ops: self }
    }

    /// The result, if this arm was the one selected.
    pub fn into_result(self) -> Option<Result<T, RecvError>> {
        self.result
    }

    pub(crate) fn take_result(&mut self) -> Option<Result<T, RecvError>> {
        self.result.take()
    }

    pub(crate) fn chan(&self) -> &'a Chan<T> {
        self.chan
    }
}

impl<'a, T, F: FnOnce() -> T> SendArm<'a, T, F> {
    /// An arm sending on `tx` the message `make` returns; `make` runs only if the arm is
    /// chosen.
    pub fn new(tx: &'a Sender<T>, make: F) -> Self {
        SendArm {
            chan: tx.chan(),
            make: Some(make),
            msg: None,
            slot: None,
            watching: false,
            reserved: None,
            result: None,
        }
    }

    /// The arm, type-erased for [`run`](super::select::run).
    pub fn arm(&mut self) -> Arm<'_> {
        Arm { ops: self }
    }

    /// The result, if this arm was the one selected; an unsent message is dropped.
    pub fn into_result(self) -> Option<Result<(), SendError<T>>> {
        self.result
    }

    /// Sends the message without waiting; false (keeping it) if there is no room.
    fn send_now(&mut self) -> bool {
        let msg = self.msg.take().expect("a made message");
        match self.chan.try_send(msg) {
            Ok(()) => self.result = Some(Ok(())),
            Err(TrySendError::Disconnected(msg)) => self.result = Some(Err(SendError(msg))),
            Err(TrySendError::Full(msg)) => {
                self.msg = Some(msg);
                return false;
            }
        }
        true
    }
}

impl<'a, T> WatchArm<'a, T> {
    /// `sends`: a `Select::select` send (see the field); false for receives and `ready()`.
    pub(crate) fn new(chan: &'a Chan<T>, send: bool, sends: bool) -> Self {
        WatchArm { chan, send, sends, registered: false, wake_at: None, reserved: None }
    }

    /// The receiver held for the caller's send, if the arm was chosen with one.
    pub(crate) fn take_reserved(&mut self) -> Option<Reserved<'a, T>> {
        self.reserved.take()
    }

    pub(crate) fn chan(&self) -> &'a Chan<T> {
        self.chan
    }
}

impl<T> std::fmt::Debug for RecvArm<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvArm").finish_non_exhaustive()
    }
}

impl<T, F> std::fmt::Debug for SendArm<'_, T, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendArm").finish_non_exhaustive()
    }
}

impl<T> ArmOps for RecvArm<'_, T> {
    fn try_now(&mut self) -> Poll {
        match self.chan.try_recv() {
            Ok(msg) => self.result = Some(Ok(msg)),
            Err(TryRecvError::Disconnected) => self.result = Some(Err(RecvError)),
            Err(TryRecvError::Empty) => return Poll::Pending,
        }
        Poll::Done
    }

    fn try_or_register(&mut self, waiter: &Arc<Waiter>, op: usize) -> Poll {
        let (poll, got) = self.chan.with_lock(|locked| {
            if !locked.recv_ready(Some(waiter)) {
                let slot = Arc::new(Slot::new(SlotWaiter::Shared(waiter.clone()), op, None));
                locked.register_recv(slot.clone());
                self.slot = Some(slot);
                self.registered = true;
                self.wake_at = locked.next_firing();
                return (Poll::Pending, None);
            }
            if !waiter.cancel() {
                return (Poll::Preempted, None);
            }
            match locked.try_recv(Some(waiter)) {
                Ok(got) => (Poll::Done, Some(got)),
                Err(TryRecvError::Disconnected) => {
                    self.result = Some(Err(RecvError));
                    (Poll::Done, None)
                }
                Err(TryRecvError::Empty) => (Poll::Lost, None),
            }
        });
        match got {
            None => poll,
            Some(Got::Msg(msg, wake)) => {
                wake.unpark();
                self.result = Some(Ok(msg));
                Poll::Done
            }
            Some(Got::Picked(slot, sender)) => {
                sender.unpark();
                match self.chan.await_pick(&slot) {
                    Some(msg) => {
                        self.result = Some(Ok(msg));
                        Poll::Done
                    }
                    None => Poll::Lost,
                }
            }
        }
    }

    fn unregister(&mut self, waiter: &Waiter, _: usize) {
        if std::mem::take(&mut self.registered) {
            self.chan.with_lock(|locked| locked.unregister(waiter));
        }
    }

    fn complete_granted(&mut self) {
        let slot = self.slot.take().expect("a granted arm registered a slot");
        // The sender wrote the message before its Release `grant`, seen by the waiter's
        // Acquire; it no longer touches the slot.
        self.result = Some(Ok(slot.take().expect("granted receive slot")));
    }

    fn abandon_granted(&mut self) {
        if let Some(msg) = self.slot.take().and_then(|slot| slot.take()) {
            self.chan.hand_on(msg);
        }
    }

    fn ready_at(&self) -> Option<Instant> {
        self.wake_at
    }
}

impl<T, F: FnOnce() -> T> ArmOps for SendArm<'_, T, F> {
    fn try_now(&mut self) -> Poll {
        if self.msg.is_some() {
            return if self.send_now() { Poll::Done } else { Poll::Pending };
        }
        match self.chan.with_lock(|locked| locked.choose_send(None)) {
            None => Poll::Pending,
            Some(reserved) => {
                self.reserved = reserved;
                Poll::Chosen
            }
        }
    }

    fn try_or_register(&mut self, waiter: &Arc<Waiter>, op: usize) -> Poll {
        let chan = self.chan;
        let Some(msg) = self.msg.take() else {
            // Not made yet: watch the channel (a receiver may pick us meanwhile), or claim the
            // waiter, hold a receiver, and make the message outside the lock.
            return chan.with_lock(|locked| {
                if !locked.send_ready(Some(waiter)) {
                    locked.watch_send(waiter, op, true);
                    self.watching = true;
                    Poll::Pending
                } else if !waiter.cancel() {
                    Poll::Preempted
                } else {
                    match locked.choose_send(Some(waiter)) {
                        Some(reserved) => {
                            self.reserved = reserved;
                            Poll::Chosen
                        }
                        None => Poll::Lost,
                    }
                }
            });
        };
        let (poll, wake) = chan.with_lock(|locked| {
            if !locked.send_ready(Some(waiter)) {
                let slot = Arc::new(Slot::new(SlotWaiter::Shared(waiter.clone()), op, Some(msg)));
                locked.register_send(slot.clone());
                self.slot = Some(slot);
                return (Poll::Pending, None);
            }
            if !waiter.cancel() {
                self.msg = Some(msg);
                return (Poll::Preempted, None);
            }
            match locked.try_send(msg) {
                Ok(wake) => {
                    self.result = Some(Ok(()));
                    (Poll::Done, Some(wake))
                }
                Err(TrySendError::Disconnected(msg)) => {
                    self.result = Some(Err(SendError(msg)));
                    (Poll::Done, None)
                }
                Err(TrySendError::Full(msg)) => {
                    self.msg = Some(msg);
                    (Poll::Lost, None)
                }
            }
        });
        if let Some(wake) = wake {
            wake.unpark();
        }
        poll
    }

    fn unregister(&mut self, waiter: &Waiter, op: usize) {
        let slot = self.slot.take();
        let watching = std::mem::take(&mut self.watching);
        if slot.is_none() && !watching {
            return;
        }
        self.chan.with_lock(|locked| {
            locked.unregister(waiter);
            if watching {
                // Picked by a receiver (which woke us through this arm): it waits for us alone.
                if let Some(reserved) = locked.take_pick(waiter, op) {
                    self.reserved = Some(reserved);
                }
            }
            // Under the inner lock: if a receiver was granted this slot it already took the
            // message (None here); otherwise the message is still ours.
            if let Some(msg) = slot.and_then(|slot| slot.take()) {
                self.msg = Some(msg);
            }
        });
    }

    fn complete_granted(&mut self) {
        self.result = Some(Ok(()));
    }

    fn abandon_granted(&mut self) {
        // A receiver took the message: nothing of ours is left to hand on.
    }

    fn on_woken(&mut self) -> bool {
        // Woken as a watcher (no message yet): a receiver came, polling or waiting, room
        // appeared, or the receivers left. Make the message now and try it; if that fails it
        // waits in a send slot, where any receiver finds it.
        self.msg.is_none()
    }

    fn finish_chosen(&mut self) -> bool {
        if self.msg.is_none() {
            if self.reserved.is_none() {
                // Woken as a watcher, or chosen with room in the buffer: still ready? The
                // message is made only for an arm that can send.
                match self.chan.with_lock(|locked| locked.choose_send(None)) {
                    None => return false,
                    Some(reserved) => self.reserved = reserved,
                }
            }
            // A panic here drops the reservation, which gives the held receiver back.
            self.msg = Some((self.make.take().expect("a send arm's message is made once"))());
        }
        if let Some(reserved) = self.reserved.take() {
            match reserved.fill(self.msg.take().expect("a made message")) {
                Ok(()) => {
                    self.result = Some(Ok(()));
                    return true;
                }
                // The held receiver was unwound by its runtime's drop: send as usual.
                Err(msg) => self.msg = Some(msg),
            }
        }
        self.send_now()
    }
}

impl<T> ArmOps for WatchArm<'_, T> {
    fn try_now(&mut self) -> Poll {
        if self.sends {
            return match self.chan.with_lock(|locked| locked.choose_send(None)) {
                None => Poll::Pending,
                Some(reserved) => {
                    self.reserved = reserved;
                    Poll::Done
                }
            };
        }
        let send = self.send;
        let ready = self
            .chan
            .with_lock(|locked| if send { locked.send_ready(None) } else { locked.recv_ready(None) });
        if ready { Poll::Done } else { Poll::Pending }
    }

    fn try_or_register(&mut self, waiter: &Arc<Waiter>, op: usize) -> Poll {
        let (send, sends) = (self.send, self.sends);
        let reserved = &mut self.reserved;
        let wake_at = &mut self.wake_at;
        let registered = &mut self.registered;
        self.chan.with_lock(|locked| {
            let ready = if send { locked.send_ready(Some(waiter)) } else { locked.recv_ready(Some(waiter)) };
            if ready {
                if !waiter.cancel() {
                    return Poll::Preempted;
                }
                if !sends {
                    return Poll::Done;
                }
                return match locked.choose_send(Some(waiter)) {
                    Some(r) => {
                        *reserved = r;
                        Poll::Done
                    }
                    None => Poll::Lost,
                };
            }
            if send {
                locked.watch_send(waiter, op, sends);
            } else {
                locked.watch_recv(waiter, op);
                *wake_at = locked.next_firing();
            }
            *registered = true;
            Poll::Pending
        })
    }

    fn unregister(&mut self, waiter: &Waiter, op: usize) {
        if std::mem::take(&mut self.registered) {
            let sends = self.sends;
            let reserved = &mut self.reserved;
            self.chan.with_lock(|locked| {
                locked.unregister(waiter);
                if sends {
                    if let Some(r) = locked.take_pick(waiter, op) {
                        *reserved = Some(r);
                    }
                }
            });
        }
    }

    fn complete_granted(&mut self) {
        unreachable!("a watcher is woken, never granted")
    }

    fn abandon_granted(&mut self) {}

    fn on_woken(&mut self) -> bool {
        // Possibly ready (`ready()` may return spuriously, as crossbeam's does).
        true
    }

    fn finish_chosen(&mut self) -> bool {
        // A `Select::select` send is returned only with a receiver held for it (or with room,
        // or disconnected): picked by a receiver, or one is waiting now.
        if !self.sends || self.reserved.is_some() {
            return true;
        }
        match self.chan.with_lock(|locked| locked.choose_send(None)) {
            None => false,
            Some(reserved) => {
                self.reserved = reserved;
                true
            }
        }
    }

    fn ready_at(&self) -> Option<Instant> {
        self.wake_at
    }
}
