//! Multi-producer multi-consumer channels whose blocked senders and receivers park their
//! *fiber* (or plain thread), in crossbeam-channel's shapes: [`bounded`] (with `bounded(0)` a
//! rendezvous), [`unbounded`], [`oneshot`], the timers [`after`], [`tick`] and [`never`](fn@never), and
//! waiting on several at once: [`select!`](crate::select), [`select_biased!`](crate::select_biased)
//! and the dynamic [`Select`].
//!
//! Design (Go's channel, with crossbeam's one-shot waiter state for `select!`): one
//! implementation serves every flavour, a buffer of the flavour's capacity plus FIFO queues of
//! blocked senders and receivers behind one short inner lock. A blocked operation is completed
//! directly by its counterpart (a send hands its message to a waiting receiver; a receive takes
//! a waiting sender's message), so the woken fiber needs no retry, and the runtime runs it next
//! on the waker's carrier (its LIFO slot), which is what makes ping-pong cheap. The first fiber
//! to block receiving on a channel owns a *fast slot* in it, through which senders hand it
//! messages without the inner lock (`chan.rs`; W4's round trip has no lock at all). A blocked
//! operation needs one heap slot, reused from the channel's few spare ones when possible, so a
//! steady blocking pattern does not allocate (`select!` allocates one per arm); operations
//! that do not block allocate nothing (beyond an unbounded buffer's growth). No message is
//! lost or delivered twice, even when a timeout races a hand-off: see `arch/sync.md` for the
//! proof sketch.
//!
//! Differences from crossbeam-channel that stay:
//! - Messages still buffered when the last `Receiver` goes are dropped in that `drop`, after the
//!   channel is disconnected (so it is never left half-disconnected). A message destructor
//!   that panics there propagates out of the receiver's `drop`; the remaining messages are
//!   still dropped, and a second destructor that panics meanwhile aborts the process, as with
//!   a `Vec`'s elements (checked with a scratch probe: one panicking message is caught by a
//!   `catch_unwind` around the drop, two abort).
//! - Scheduling is cooperative: a fiber that busy-waits on `try_recv`/`try_send` in a loop
//!   without a switch point (`vt::yield_now`, any blocking call) keeps its carrier from running
//!   anything else, including the fiber that would make it ready; the CPU-starvation warning
//!   names such a fiber. Use `recv`, `recv_timeout` or a `select!` instead (no preemption
//!   and no spare carrier: `arch/decisions/0006-spin-loops-need-a-switch-point.md`). A poll
//!   that meets a *waiting* counterpart completes, though: `try_recv` takes the message of a
//!   sender parked in `send`, `select!` or `Select::select`.
//! - A send chosen by the dynamic [`Select`] for room in a buffer may wait in
//!   [`SelectedOperation::send`] if another sender took that room meanwhile (crossbeam reserves
//!   the room; here only a waiting receiver is held for the chosen send; see [`Select`]).

mod arms;
mod chan;
mod dynamic;
mod error;
pub mod oneshot;
mod select;
mod select_macros;

/// The engine behind [`select!`](crate::select), for the macro's expansion only. Not named
/// `select`: `use vt::channel::select;` must bring the macro alone, as with crossbeam-channel,
/// so that a user's own `mod select` beside it does not clash.
#[doc(hidden)]
pub mod __select {
    pub use super::arms::{RecvArm, SendArm};
    pub use super::select::{Arm, Deadline, run};
}

pub use crate::{select, select_biased};

use std::fmt;
use std::panic::{RefUnwindSafe, UnwindSafe};
use std::time::{Duration, Instant};

use crate::sync::loom::{Arc, Ordering};
use chan::{Chan, Timer, UNBOUNDED};

pub use dynamic::{Select, SelectedOperation};
pub use error::{
    ReadyTimeoutError, RecvError, RecvTimeoutError, SelectTimeoutError, SendError, SendTimeoutError,
    TryReadyError, TryRecvError, TrySelectError, TrySendError,
};

/// `let (tx, rx) = vt::channel::bounded::<u64>(16);`
///
/// Creates a channel that holds at most `cap` messages; `bounded(0)` is a rendezvous, where a
/// send completes only when a receiver takes the message.
///
/// ```
/// use virtual_threads as vt;
///
/// let (tx, rx) = vt::channel::bounded(1);
/// let h = vt::spawn(move || tx.send(7).unwrap());
/// assert_eq!(rx.recv(), Ok(7));
/// h.join().unwrap();
/// ```
pub fn bounded<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
    assert!(cap < UNBOUNDED, "capacity too large");
    let chan = Arc::new(Chan::new(cap));
    (Sender { chan: chan.clone() }, Receiver { chan })
}

/// `let (tx, rx) = vt::channel::unbounded::<String>();`
///
/// Creates a channel of unlimited capacity: sends never block.
pub fn unbounded<T>() -> (Sender<T>, Receiver<T>) {
    let chan = Arc::new(Chan::new(UNBOUNDED));
    (Sender { chan: chan.clone() }, Receiver { chan })
}

/// `let timeout = if limited { vt::channel::after(limit) } else { vt::channel::never() };`
///
/// A receiver that never delivers a message and never disconnects: an arm of a select that is
/// never ready (crossbeam's `never`), handy for an optional channel.
///
/// ```
/// use virtual_threads as vt;
/// use std::time::Duration;
///
/// let timeout: Option<vt::channel::Receiver<std::time::Instant>> = None;
/// let r = timeout.unwrap_or_else(vt::channel::never);
/// assert!(r.recv_timeout(Duration::from_millis(1)).is_err());
/// ```
pub fn never<T>() -> Receiver<T> {
    // The channel's sender count starts at one and no `Sender` exists to bring it to zero,
    // so it never disconnects; nothing can send on it.
    Receiver { chan: Arc::new(Chan::new_never()) }
}

/// `vt::select! { recv(rx) -> msg => handle(msg), recv(vt::channel::after(Duration::from_secs(1))) -> _ => timed_out() }`
///
/// A receiver that gets one message, the instant it was due, after `duration`, and nothing
/// after (crossbeam's `after`). It never disconnects. Its receive parks the fiber until then.
///
/// ```
/// use virtual_threads as vt;
/// use std::time::{Duration, Instant};
///
/// let start = Instant::now();
/// let at = vt::channel::after(Duration::from_millis(10)).recv().unwrap();
/// assert!(at >= start + Duration::from_millis(10));
/// ```
pub fn after(duration: Duration) -> Receiver<Instant> {
    timer(Instant::now().checked_add(duration), None)
}

/// `for _ in vt::channel::tick(Duration::from_secs(1)).iter().take(3) { report(); }`
///
/// A receiver that gets a message every `duration`, the instant it was due (crossbeam's
/// `tick`): the first after `duration`, each next one `duration` after the previous one was
/// taken, so a slow reader gets no backlog. It never disconnects.
pub fn tick(duration: Duration) -> Receiver<Instant> {
    timer(Instant::now().checked_add(duration), Some(duration))
}

fn timer(first: Option<Instant>, period: Option<Duration>) -> Receiver<Instant> {
    let chan = Chan::new_timer(Timer::new(first, period, |at| at));
    Receiver { chan: Arc::new(chan) }
}

fn deadline_after(timeout: Duration) -> Option<Instant> {
    // An unrepresentable deadline is as good as none.
    Instant::now().checked_add(timeout)
}

/// `let (tx, rx) = vt::channel::bounded(1); vt::spawn(move || tx.send(42).unwrap());`
///
/// The sending half of a channel; clone it for more producers.
pub struct Sender<T> {
    chan: Arc<Chan<T>>,
}

/// `for msg in rx.iter() { handle(msg); } // until every Sender is dropped`
///
/// The receiving half of a channel; clone it for more consumers.
pub struct Receiver<T> {
    chan: Arc<Chan<T>>,
}

impl<T> Sender<T> {
    /// Sends `msg`, parking while the channel is full (for `bounded(0)`: until a receiver takes
    /// it). `Err` hands the message back if every receiver is gone.
    pub fn send(&self, msg: T) -> Result<(), SendError<T>> {
        self.chan.send(msg, None).map_err(|err| SendError(err.into_inner()))
    }

    /// Sends `msg` if that needs no wait.
    pub fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        self.chan.try_send(msg)
    }

    /// Sends `msg`, parking for at most `timeout`.
    pub fn send_timeout(&self, msg: T, timeout: Duration) -> Result<(), SendTimeoutError<T>> {
        self.chan.send(msg, deadline_after(timeout))
    }

    /// Sends `msg`, parking until `deadline` at most.
    pub fn send_deadline(&self, msg: T, deadline: Instant) -> Result<(), SendTimeoutError<T>> {
        self.chan.send(msg, Some(deadline))
    }

    /// Messages in the buffer now (racy by design).
    pub fn len(&self) -> usize {
        self.chan.len()
    }

    /// Whether the buffer is empty now (racy by design).
    pub fn is_empty(&self) -> bool {
        self.chan.len() == 0
    }

    /// Whether the buffer is full now (racy by design); always true for `bounded(0)`.
    pub fn is_full(&self) -> bool {
        self.chan.is_full()
    }

    /// The capacity; `None` if unbounded.
    pub fn capacity(&self) -> Option<usize> {
        self.chan.capacity()
    }

    /// Whether both handles belong to the same channel.
    pub fn same_channel(&self, other: &Sender<T>) -> bool {
        Arc::ptr_eq(&self.chan, &other.chan)
    }

    pub(crate) fn chan(&self) -> &Chan<T> {
        &self.chan
    }
}

impl<T> Receiver<T> {
    /// Receives a message, parking while the channel is empty. `Err` once the channel is empty
    /// and every sender is gone.
    pub fn recv(&self) -> Result<T, RecvError> {
        self.chan.recv(None).map_err(|_| RecvError)
    }

    /// Receives a message if one is ready.
    pub fn try_recv(&self) -> Result<T, TryRecvError> {
        self.chan.try_recv()
    }

    /// Receives a message, parking for at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        self.chan.recv(deadline_after(timeout))
    }

    /// Receives a message, parking until `deadline` at most.
    pub fn recv_deadline(&self, deadline: Instant) -> Result<T, RecvTimeoutError> {
        self.chan.recv(Some(deadline))
    }

    /// A blocking iterator; it ends when the channel is empty and disconnected.
    pub fn iter(&self) -> Iter<'_, T> {
        Iter { rx: self }
    }

    /// An iterator over the messages ready now; it never blocks.
    pub fn try_iter(&self) -> TryIter<'_, T> {
        TryIter { rx: self }
    }

    /// Messages in the buffer now (racy by design); for [`after`] and [`tick`], 1 while a
    /// firing is due and not yet received.
    pub fn len(&self) -> usize {
        self.chan.len()
    }

    /// Whether the buffer is empty now (racy by design).
    pub fn is_empty(&self) -> bool {
        self.chan.len() == 0
    }

    /// Whether the buffer is full now (racy by design); always true for `bounded(0)`, and for
    /// a timer channel whose firing is due.
    pub fn is_full(&self) -> bool {
        self.chan.is_full()
    }

    /// The capacity; `None` if unbounded, 1 for [`after`] and [`tick`], 0 for
    /// [`never`](fn@never).
    pub fn capacity(&self) -> Option<usize> {
        self.chan.capacity()
    }

    /// Whether both handles belong to the same channel; every [`never`](fn@never) receiver is
    /// the same channel, as in crossbeam-channel.
    pub fn same_channel(&self, other: &Receiver<T>) -> bool {
        Arc::ptr_eq(&self.chan, &other.chan) || (self.chan.is_never() && other.chan.is_never())
    }

    pub(crate) fn chan(&self) -> &Chan<T> {
        &self.chan
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Sender<T> {
        // Relaxed: a handle is made from a live one, so the count cannot reach zero meanwhile.
        self.chan.senders.fetch_add(1, Ordering::Relaxed);
        Sender { chan: self.chan.clone() }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        // AcqRel: the last handle's disconnect must follow every other handle's last use.
        if self.chan.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.chan.disconnect_senders();
        }
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Receiver<T> {
        // Relaxed: as for `Sender::clone`.
        self.chan.receivers.fetch_add(1, Ordering::Relaxed);
        Receiver { chan: self.chan.clone() }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        // AcqRel: as for `Sender::drop`.
        if self.chan.receivers.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.chan.disconnect_receivers();
        }
    }
}

// As crossbeam's and std's handles: a panic cannot leave a channel in a state that breaks
// its invariants (the inner lock is never held across user code), so observing one after a
// caught panic is sound.
impl<T> UnwindSafe for Sender<T> {}
impl<T> RefUnwindSafe for Sender<T> {}
impl<T> UnwindSafe for Receiver<T> {}
impl<T> RefUnwindSafe for Receiver<T> {}

impl<T> fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

impl<T> fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver").finish_non_exhaustive()
    }
}

/// Blocking iterator over a [`Receiver`]'s messages.
#[derive(Debug)]
pub struct Iter<'a, T> {
    rx: &'a Receiver<T>,
}

/// Non-blocking iterator over the messages ready in a [`Receiver`].
#[derive(Debug)]
pub struct TryIter<'a, T> {
    rx: &'a Receiver<T>,
}

/// Owning blocking iterator over a [`Receiver`]'s messages.
#[derive(Debug)]
pub struct IntoIter<T> {
    rx: Receiver<T>,
}

impl<T> Iterator for Iter<'_, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        self.rx.recv().ok()
    }
}

impl<T> Iterator for TryIter<'_, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        self.rx.try_recv().ok()
    }
}

impl<T> Iterator for IntoIter<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        self.rx.recv().ok()
    }
}

impl<'a, T> IntoIterator for &'a Receiver<T> {
    type Item = T;
    type IntoIter = Iter<'a, T>;

    fn into_iter(self) -> Iter<'a, T> {
        self.iter()
    }
}

impl<T> IntoIterator for Receiver<T> {
    type Item = T;
    type IntoIter = IntoIter<T>;

    fn into_iter(self) -> IntoIter<T> {
        IntoIter { rx: self }
    }
}
