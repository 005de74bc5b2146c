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
//! The fast slot: one receiver fiber per channel (the first to block on it; the slot is bound
//! to it for the channel's life) parks in a slot of the channel itself, announced by the
//! `fast` word, and senders hand it a message without the inner lock: one CAS claims the
//! slot, a Release `fetch_add` publishes the message, and the unpark follows. The receiver
//! re-arms it with one CAS. Everyone who takes the inner lock first sets `SLOW` in the word,
//! which stops receivers arming, and clears it when leaving the locked state empty, so a
//! parked fast receiver always means an empty buffer (invariant 1) and is the oldest receiver.
//!
//! Protocol, message-slot ownership rules and proof sketch: `arch/sync.md`.
//!
//! One protocol, kept in one file (~1,000 lines; its loom models are `tests/loom_chan.rs`) on
//! purpose: the locked paths, the fast slot and select's registrations share the invariants
//! above, and each is checked against the others; split, they would be read apart.

use std::collections::VecDeque;
use std::fmt;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use super::error::{RecvTimeoutError, SendTimeoutError, TryRecvError, TrySendError};
use crate::fiber::wait::WaitReason;
use crate::sync::loom::{self, Arc, AtomicUsize, Fiber, Ordering, UnsafeCell};
use crate::sync::wait_list::{self, Entry, Outcome, WaitQueue, Waiter};

/// The capacity of an unbounded channel.
pub(crate) const UNBOUNDED: usize = usize::MAX;

/// Served slots kept for reuse, so that a steady blocking pattern (ping-pong, a consumer that
/// keeps waiting) does not allocate: a slot is reused once its owner and server dropped it.
const SPARE_SLOTS: usize = 4;

/// The `fast` word: a tag in bits 0-1, `SLOW` in bit 2.
const TAG: usize = 3;
/// Nobody parked in the fast slot; its owner (or, while unbound, anyone) may arm it.
const IDLE: usize = 0;
/// The owner is parked (or about to park) in the fast slot.
const ARMED: usize = 1;
/// One party holds the slot: a sender filling it, or a receiver binding it.
const CLAIMED: usize = 2;
/// A delivery for the owner: `fast_msg` holds a message, or `None` for "the senders are gone".
/// Only the owner moves the slot on from here (it re-arms it at its next wait).
const READY: usize = 3;
/// The locked state is not empty (buffer, queued slots, disconnection): the owner may not arm.
/// Set by everyone who takes the inner lock, cleared under it.
const SLOW: usize = 4;
/// The owner was unwound (its runtime dropped) while a sender held the slot `CLAIMED`: the
/// sender takes its message back when it publishes, and the slot is dead for good.
const GONE: usize = 8;

pub(crate) struct Chan<T> {
    synced: loom::Mutex<Synced<T>>,
    cap: usize,
    /// The fast slot's state: `IDLE`, `ARMED`, `CLAIMED` or `READY`, plus `SLOW`.
    fast: AtomicUsize,
    /// The receiver the fast slot is bound to (`loom::current_id`), 0 while unbound. Written
    /// once, by the binder, while it holds the slot `CLAIMED`.
    fast_owner: AtomicUsize,
    /// The owner's handle, written once with `fast_owner`, then only read (by the senders that
    /// unpark it), until the channel is dropped.
    fast_fiber: UnsafeCell<Option<Fiber>>,
    /// The delivery: written by the sender holding the slot `CLAIMED`, taken by the owner once
    /// it saw `READY`.
    fast_msg: UnsafeCell<Option<T>>,
    /// Live `Sender` handles; the last one to go disconnects the receivers.
    pub(crate) senders: AtomicUsize,
    /// Live `Receiver` handles; the last one to go disconnects the senders.
    pub(crate) receivers: AtomicUsize,
    /// Made by `never()`: every such channel counts as the same one (`same_channel`).
    never: bool,
}

// SAFETY: the fast slot's cells are used one party at a time as the `fast` word allows (each
// hand-over a Release/Acquire pair on it; `fast_fiber` written once before any reader), so a
// shared `Chan` only moves `T` between threads (`T: Send`); the rest is `Sync` for `T: Send`.
unsafe impl<T: Send> Sync for Chan<T> {}
// SAFETY: as above; a `Chan` owns its buffered and fast-slot messages.
unsafe impl<T: Send> Send for Chan<T> {}

/// State guarded by `Chan::synced`.
struct Synced<T> {
    buf: VecDeque<T>,
    senders: WaitQueue<Arc<Slot<T>>>,
    receivers: WaitQueue<Arc<Slot<T>>>,
    senders_gone: bool,
    receivers_gone: bool,
    /// Slots recently served or found stale; reusable once nobody else holds them.
    spare: Vec<Arc<Slot<T>>>,
    /// Selects waiting for the channel to become ready to send (the dynamic `Select`'s send
    /// operations and `ready()`, `select!` send arms whose message is not evaluated yet) or to
    /// receive (`ready()`). Unlike slots they are never served: whatever may have made the
    /// channel ready wakes them all, and they look again.
    send_watchers: Vec<Watcher>,
    recv_watchers: Vec<Watcher>,
    /// Lazy senders (watchers that `sends`) that a receiver picked: the sender's waiter and
    /// operation, and the receive slot it must fill once its message is made. Taken by the
    /// sender's select when it unregisters.
    picked: Vec<(Arc<Waiter>, usize, Arc<Slot<T>>)>,
    /// `after` and `tick` channels: when the next message is due. Nobody sends on them.
    timer: Option<Timer<T>>,
}

/// A buffer never shrinks below this many messages' room.
const MIN_ROOM: usize = 64;

/// Gives a draining buffer's memory back, as crossbeam's list of blocks does: once a quarter
/// of the room is in use, half goes. The gap between growing (at full) and shrinking keeps
/// the cost amortised O(1) per message, and a channel that hovers at one length reallocates
/// nothing; a burst into an unbounded channel does not pin its peak for the channel's life.
#[inline]
fn give_back_room<T>(buf: &mut VecDeque<T>) {
    let room = buf.capacity();
    if room > MIN_ROOM && buf.len() <= room / 4 {
        buf.shrink_to((buf.len() * 2).max(MIN_ROOM));
    }
}

/// A select's waiter and the index of its operation on this channel.
pub(crate) struct Watcher {
    waiter: Arc<Waiter>,
    op: usize,
    /// A send that will happen once chosen (a `select!` send arm whose message is not made
    /// yet, a `Select::select` send), not a mere `ready()`: a receiver that finds no message
    /// may pick it, and it then sends to that receiver alone (crossbeam's semantics: a waiting
    /// select is a counterpart, `try_recv` included).
    sends: bool,
}

/// Wakes every watcher in `watchers` but the waiter `except` (a select registering its own
/// slots must not wake itself).
///
/// Under the inner lock, unlike the other wake-ups: watchers exist only while a dynamic
/// `Select` or a lazy send arm waits, and `unpark` takes no channel's lock, so nothing can
/// wait on us in between; collecting them to unpark later would cost an allocation.
#[inline]
fn notify(watchers: &mut Vec<Watcher>, except: Option<&Waiter>) {
    // The common case, on the locked paths of every send and receive: nobody watches.
    if watchers.is_empty() {
        return;
    }
    notify_all(watchers, except);
}

#[inline(never)]
fn notify_all(watchers: &mut Vec<Watcher>, except: Option<&Waiter>) {
    watchers.retain(|w| {
        if except.is_some_and(|e| std::ptr::eq(&*w.waiter, e)) {
            return true;
        }
        if w.waiter.wake(w.op) {
            w.waiter.unpark();
        }
        false
    });
}

/// The clock of an `after` or `tick` channel, kept under the inner lock.
pub(crate) struct Timer<T> {
    /// The next firing; `None` once an `after` channel delivered its one message.
    next: Option<Instant>,
    /// `tick`'s period; `None` for `after`.
    period: Option<Duration>,
    /// Turns the instant of a firing into the message (the identity, for `Receiver<Instant>`).
    make: fn(Instant) -> T,
}

impl<T> Timer<T> {
    pub(crate) fn new(first: Option<Instant>, period: Option<Duration>, make: fn(Instant) -> T) -> Self {
        Timer { next: first, period, make }
    }

    fn is_due(&self) -> bool {
        self.next.is_some_and(|at| Instant::now() >= at)
    }

    /// The message, if one is due: the instant it fell due, as crossbeam's timers give it.
    /// A tick's next firing is a period after now, so a slow reader gets no backlog.
    fn fire(&mut self) -> Option<T> {
        let due = self.next?;
        let now = Instant::now();
        if now < due {
            return None;
        }
        self.next = self.period.and_then(|p| now.checked_add(p));
        Some((self.make)(due))
    }
}

impl<T> Synced<T> {
    /// Nothing buffered, queued or disconnected: the owner of the fast slot may arm it.
    fn is_quiet(&self) -> bool {
        self.buf.is_empty()
            && self.senders.is_empty()
            && self.receivers.is_empty()
            && !self.senders_gone
            && !self.receivers_gone
            && self.send_watchers.is_empty()
            && self.recv_watchers.is_empty()
            && self.picked.is_empty()
            && self.timer.is_none()
    }

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
        // SAFETY: the caller holds the inner lock, or holds the slot out of every queue (a
        // `Reserved`), and has not yet tried `grant`: the waiter does not read `msg` (it reads
        // only after `Granted`), and no other sender can reach the slot.
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

/// The inner lock, held: the fast slot is closed to arming (`SLOW`) from the moment it is
/// taken, and reopened on release if the locked state was left empty.
struct Guard<'a, T> {
    chan: &'a Chan<T>,
    synced: loom::MutexGuard<'a, Synced<T>>,
}

impl<T> std::ops::Deref for Guard<'_, T> {
    type Target = Synced<T>;
    fn deref(&self) -> &Synced<T> {
        &self.synced
    }
}

impl<T> std::ops::DerefMut for Guard<'_, T> {
    fn deref_mut(&mut self) -> &mut Synced<T> {
        &mut self.synced
    }
}

impl<T> Drop for Guard<'_, T> {
    fn drop(&mut self) {
        if self.synced.is_quiet() {
            // Under the lock, before it is released: the state cannot change in between.
            // Relaxed: the owner's arm reads nothing the locked state guards; it only needs
            // the bit, and the lock orders every setter and clearer of it.
            self.chan.fast.fetch_and(!SLOW, Ordering::Relaxed);
        }
    }
}

/// What a receive that did not block got: a message (and a counterpart to unpark), or a lazy
/// sender it picked (to unpark; then await the message in the slot).
pub(crate) enum Got<'a, T> {
    Msg(T, Wake<'a, T>),
    Picked(Arc<Slot<T>>, Arc<Waiter>),
}

/// A receiver held for one sender whose message is being made (a `select!` send arm, a
/// `Select` send): `fill` completes it; dropped unfilled (the message expression panicked,
/// a `SelectedOperation` dropped), it gives the receiver back, which retries.
pub(crate) struct Reserved<'a, T>(Option<Held<'a, T>>);

enum Held<'a, T> {
    /// A receive slot taken out of the queue, its waiter `HELD`.
    Slot(Arc<Slot<T>>),
    /// The fresh slot of a receiver that picked this sender, waiting in it.
    Picked(Arc<Slot<T>>),
    /// The fast slot, `CLAIMED`.
    Fast(&'a Chan<T>),
}

impl<T> Reserved<'_, T> {
    /// Delivers `msg` to the held receiver; `Err` gives it back if that receiver is gone (its
    /// runtime's drop unwound it).
    pub(crate) fn fill(mut self, msg: T) -> Result<(), T> {
        match self.0.take().expect("a reservation is filled once") {
            Held::Slot(slot) => {
                slot.put(msg);
                if slot.waiter().grant_held(slot.op) {
                    slot.waiter().unpark();
                    return Ok(());
                }
                Err(slot.take().expect("message put just above"))
            }
            Held::Picked(slot) => {
                slot.put(msg);
                if slot.grant() {
                    slot.waiter().unpark();
                    return Ok(());
                }
                Err(slot.take().expect("message put just above"))
            }
            Held::Fast(chan) => match chan.fill_fast(Some(msg)) {
                Ok(()) => {
                    chan.unpark_fast();
                    Ok(())
                }
                Err(back) => Err(back.expect("a message handed back")),
            },
        }
    }
}

impl<T> Drop for Reserved<'_, T> {
    fn drop(&mut self) {
        // Never parks or panics: this runs when a message expression unwinds.
        match self.0.take() {
            Some(Held::Slot(slot)) if slot.waiter().release_held(slot.op) => slot.waiter().unpark(),
            Some(Held::Picked(slot)) if slot.waiter().wake(slot.op) => slot.waiter().unpark(),
            // "Retry on the locked path", as after a disconnection.
            Some(Held::Fast(chan)) if chan.fill_fast(None).is_ok() => chan.unpark_fast(),
            // Filled, or the receiver is gone (unwound by its runtime's drop).
            _ => {}
        }
    }
}

/// A slot that was just granted or woken: unpark its waiter once the inner lock is released.
#[must_use = "the waiter must be unparked after the inner lock is released"]
pub(crate) struct Wake<'a, T>(WakeKind<'a, T>);

enum WakeKind<'a, T> {
    None,
    Slot(Arc<Slot<T>>),
    /// The fast slot was filled: unpark its owner.
    Fast(&'a Chan<T>),
}

impl<T> Wake<'_, T> {
    pub(crate) fn unpark(self) {
        match self.0 {
            WakeKind::None => {}
            WakeKind::Slot(slot) => slot.waiter().unpark(),
            WakeKind::Fast(chan) => chan.unpark_fast(),
        }
    }
}

impl<T> Chan<T> {
    pub(crate) fn new(cap: usize) -> Chan<T> {
        Self::with_timer(cap, None)
    }

    /// The channel behind `never()`: a rendezvous nobody can send on.
    pub(crate) fn new_never() -> Chan<T> {
        Chan { never: true, ..Self::new(0) }
    }

    /// A channel that nobody sends on, whose receivers get `timer`'s firings (`after`, `tick`).
    pub(crate) fn new_timer(timer: Timer<T>) -> Chan<T> {
        Self::with_timer(1, Some(timer))
    }

    fn with_timer(cap: usize, timer: Option<Timer<T>>) -> Chan<T> {
        // A timer channel is never quiet, so its fast slot never opens: its receivers take the
        // locked path, which knows the clock.
        let fast = if timer.is_some() { SLOW } else { IDLE };
        Chan {
            synced: loom::Mutex::new(Synced {
                buf: VecDeque::new(),
                senders: WaitQueue::new(),
                receivers: WaitQueue::new(),
                senders_gone: false,
                receivers_gone: false,
                spare: Vec::new(),
                send_watchers: Vec::new(),
                recv_watchers: Vec::new(),
                picked: Vec::new(),
                timer,
            }),
            cap,
            fast: AtomicUsize::new(fast),
            fast_owner: AtomicUsize::new(0),
            fast_fiber: UnsafeCell::new(None),
            fast_msg: UnsafeCell::new(None),
            senders: AtomicUsize::new(1),
            receivers: AtomicUsize::new(1),
            never: false,
        }
    }

    fn lock(&self) -> Guard<'_, T> {
        // Nothing panics with the inner lock held, so poisoning cannot carry information.
        let synced = self.synced.lock().unwrap_or_else(PoisonError::into_inner);
        // Under the lock, before looking at anything: from here on no receiver arms the fast
        // slot, so one parked there now (`ARMED`) is the only one and is served first, and
        // none appears while this holder fills the buffer. Relaxed: the lock orders the bit
        // among holders; a sender that then claims the slot reads it with its own Acquire.
        self.fast.fetch_or(SLOW, Ordering::Relaxed);
        Guard { chan: self, synced }
    }

    // ---- the fast slot -------------------------------------------------------------------

    /// Claims the fast slot if its owner is parked there (`ARMED → CLAIMED`, keeping `SLOW`).
    fn claim_armed(&self) -> bool {
        let mut w = self.fast.load(Ordering::Relaxed);
        while w & TAG == ARMED {
            // Acquire pairs with the owner's arming Release: it took its last message out
            // of `fast_msg` before, and `fast_fiber` is bound.
            match self.fast.compare_exchange_weak(
                w,
                w - ARMED + CLAIMED,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => w = actual,
            }
        }
        false
    }

    /// Fills the claimed fast slot (`None`: the senders are gone, or "retry on the locked
    /// path") and publishes it (`CLAIMED → READY`). The caller unparks the owner next
    /// (`unpark_fast`), outside the inner lock if it holds it. If the owner is `GONE`, the
    /// message comes back instead (and there is nobody to unpark).
    #[must_use = "a message handed back must be delivered elsewhere"]
    fn fill_fast(&self, msg: Option<T>) -> Result<(), Option<T>> {
        self.fast_msg.with_mut(|m| {
            // SAFETY: we hold the slot `CLAIMED`: the owner reads the cell only after `READY`
            // and emptied it before arming (ordered by our claim's Acquire), and no other
            // sender can claim it. So this overwrites `None` and drops nothing.
            unsafe { *m = msg };
        });
        // An RMW, not a store: a lock holder may set or clear `SLOW` meanwhile, the unwinding
        // owner `GONE`. Release pairs with the owner's Acquire load of `READY`: the message is
        // visible to it.
        let before = self.fast.fetch_add(READY - CLAIMED, Ordering::AcqRel);
        if before & GONE == 0 {
            return Ok(());
        }
        Err(self.fast_msg.with_mut(|m| {
            // SAFETY: the owner left for good without reading the cell; we wrote it above.
            unsafe { (*m).take() }
        }))
    }

    /// Unparks the fast slot's owner after `fill_fast`.
    fn unpark_fast(&self) {
        self.fast_fiber.with(|fiber| {
            // SAFETY: `fast_fiber` was written once, before the owner first armed the slot
            // (our claim's Acquire saw that), and is never written again while `self` lives.
            if let Some(fiber) = unsafe { &*fiber } {
                fiber.unpark();
            }
        });
    }

    /// Hands `msg` to the fast slot's owner if it is parked there, without the inner lock.
    fn try_send_fast(&self, msg: T) -> Result<(), T> {
        if !self.claim_armed() {
            return Err(msg);
        }
        match self.fill_fast(Some(msg)) {
            Ok(()) => {
                self.unpark_fast();
                Ok(())
            }
            Err(msg) => Err(msg.expect("a message handed back")),
        }
    }

    /// Arms the fast slot for the calling receiver: if it is (or becomes) the slot's owner and
    /// the locked state is empty. Returns false if the receiver must take the locked path.
    #[inline]
    fn arm_fast(&self, me: usize) -> bool {
        // The owner's steady state (ping-pong, a consumer): its last delivery taken, the slot
        // still `READY`. Release: the next sender sees that we took the message out. (Our id in
        // `fast_owner` was stored by ourselves, so Relaxed reads it.)
        if self.fast.load(Ordering::Relaxed) == READY
            && self.fast_owner.load(Ordering::Relaxed) == me
            && self.fast.compare_exchange(READY, ARMED, Ordering::Release, Ordering::Relaxed).is_ok()
        {
            return true;
        }
        self.arm_fast_slow(me)
    }

    /// `arm_fast` in every other state: binding, re-arming after a timeout, or refusing.
    #[inline(never)]
    fn arm_fast_slow(&self, me: usize) -> bool {
        let mut w = self.fast.load(Ordering::Acquire);
        loop {
            if w & SLOW != 0 {
                return false;
            }
            let owner = self.fast_owner.load(Ordering::Acquire);
            if owner == 0 && w == IDLE {
                // Unbound: bind it to us, then arm like its owner (binding happens once).
                if self.fast.compare_exchange(IDLE, CLAIMED, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                    if self.fast_owner.load(Ordering::Relaxed) == 0 {
                        self.fast_fiber.with_mut(|fiber| {
                            // SAFETY: we hold the slot `CLAIMED` and it is unbound, so nobody
                            // reads the cell (senders reach it only through an armed slot).
                            unsafe { *fiber = Some(loom::current()) };
                        });
                        // Release: whoever reads our id (Acquire) reads the handle too.
                        self.fast_owner.store(me, Ordering::Release);
                    }
                    // Back to `IDLE`, keeping a `SLOW` set meanwhile.
                    w = self.fast.fetch_sub(CLAIMED, Ordering::AcqRel) - CLAIMED;
                } else {
                    w = self.fast.load(Ordering::Acquire);
                }
                continue;
            }
            // `READY` is left only by its owner, and only the owner arms a bound slot, so a
            // CAS from a word we saw cannot arm somebody else's slot.
            if owner != me || !(w == IDLE || w == READY) {
                return false;
            }
            // Release: the next sender (its claim's Acquire) sees that we took the last
            // message out of `fast_msg`.
            match self.fast.compare_exchange(w, ARMED, Ordering::Release, Ordering::Acquire) {
                Ok(_) => return true,
                Err(actual) => w = actual,
            }
        }
    }

    /// The owner leaves an armed fast slot at its deadline; false if a sender claimed it
    /// first (the delivery then follows at once).
    fn cancel_fast(&self) -> bool {
        let mut w = self.fast.load(Ordering::Relaxed);
        while w & TAG == ARMED {
            // Relaxed: nothing was handed over, and we touch no cell.
            match self.fast.compare_exchange_weak(w, w - ARMED + IDLE, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(actual) => w = actual,
            }
        }
        false
    }

    /// Takes the delivery the owner saw `READY` for; `None` means the senders are gone.
    fn take_fast(&self) -> Option<T> {
        self.fast_msg.with_mut(|m| {
            // SAFETY: we are the owner and saw `READY` with Acquire (pairing with the filler's
            // Release), and nobody writes the cell until we arm the slot again.
            unsafe { (*m).take() }
        })
    }

    /// The owner waits in its armed fast slot. `None`: the senders disconnected (retry on the
    /// locked path); `Some(Err(()))`: timed out.
    fn wait_fast(&self, deadline: Option<Instant>) -> Option<Result<T, ()>> {
        // The runtime's drop may unwind this fiber from inside its park: leave the slot, or
        // hand on a message already delivered. Must not park or panic.
        struct OnUnwind<'a, T>(&'a Chan<T>);
        impl<T> Drop for OnUnwind<'_, T> {
            fn drop(&mut self) {
                let chan = self.0;
                let mut w = chan.fast.load(Ordering::Acquire);
                loop {
                    match w & TAG {
                        ARMED if chan.cancel_fast() => return,
                        READY => {
                            if let Some(msg) = chan.take_fast() {
                                chan.hand_on(msg);
                            }
                            return;
                        }
                        // A sender holds the slot, perhaps while it makes its message (a
                        // `select!` reservation), which may take any time: leave it `GONE`,
                        // and the sender keeps its message.
                        CLAIMED => {
                            match chan.fast.compare_exchange(w, w | GONE, Ordering::AcqRel, Ordering::Acquire)
                            {
                                Ok(_) => return,
                                Err(actual) => w = actual,
                            }
                            continue;
                        }
                        IDLE => return,
                        _ => {}
                    }
                    w = chan.fast.load(Ordering::Acquire);
                }
            }
        }
        let guard = OnUnwind(self);
        let mut deadline = deadline;
        let mut stopped = false;
        let result = loop {
            // Acquire pairs with `fill_fast`'s Release.
            if self.fast.load(Ordering::Acquire) & TAG == READY {
                break self.take_fast().map(Ok);
            }
            if let Some(d) = deadline {
                if loom::expired(d) {
                    if self.cancel_fast() {
                        break Some(Err(()));
                    }
                    // A sender claimed the slot first: its delivery and unpark follow.
                    deadline = None;
                    continue;
                }
            }
            // A stop that cannot unwind at the park (`Waiter::wait_or_abandon`): what the
            // unwind runs, then a wait nobody served.
            if loom::stop_due(deadline.is_some()) {
                stopped = true;
                break Some(Err(()));
            }
            wait_list::park(WaitReason::ChannelRecv, deadline);
        };
        if stopped {
            drop(guard);
        } else {
            std::mem::forget(guard);
        }
        result
    }

    pub(crate) fn capacity(&self) -> Option<usize> {
        (self.cap != UNBOUNDED).then_some(self.cap)
    }

    /// Buffered messages; a timer channel counts its due firing as one, as crossbeam's do.
    pub(crate) fn len(&self) -> usize {
        let synced = self.lock();
        synced.buf.len() + usize::from(synced.timer.as_ref().is_some_and(Timer::is_due))
    }

    /// Whether the buffer is full now; always true for a rendezvous channel.
    pub(crate) fn is_full(&self) -> bool {
        self.len() >= self.cap
    }

    /// Whether this is a [`never`](super::never) channel.
    pub(crate) fn is_never(&self) -> bool {
        self.never
    }

    // ---- sending -------------------------------------------------------------------------

    pub(crate) fn try_send(&self, msg: T) -> Result<(), TrySendError<T>> {
        let msg = match self.try_send_fast(msg) {
            Ok(()) => return Ok(()),
            Err(msg) => msg,
        };
        let mut synced = self.lock();
        let result = self.try_send_locked(&mut synced, msg);
        drop(synced);
        result.map(Wake::unpark)
    }

    /// Sends without blocking, with the inner lock held.
    fn try_send_locked(&self, synced: &mut Synced<T>, msg: T) -> Result<Wake<'_, T>, TrySendError<T>> {
        if synced.receivers_gone {
            return Err(TrySendError::Disconnected(msg));
        }
        // The fast slot's owner is the oldest receiver (nobody queues while it is armed
        // without `SLOW` set, and `SLOW` stops it arming behind queued ones).
        let mut msg = msg;
        if self.claim_armed() {
            match self.fill_fast(Some(msg)) {
                Ok(()) => return Ok(Wake(WakeKind::Fast(self))),
                Err(back) => msg = back.expect("a message handed back"),
            }
        }
        // Invariant 1: a waiting receiver means an empty buffer, so serving it first keeps
        // FIFO order. Stale slots (cancelled, or another select arm won) are dropped.
        while let Some(slot) = synced.receivers.pop_front() {
            slot.put(msg);
            let granted = slot.grant();
            synced.recycle(&slot);
            if granted {
                return Ok(Wake(WakeKind::Slot(slot)));
            }
            msg = slot.take().expect("message put just above");
        }
        if synced.buf.len() < self.cap {
            synced.buf.push_back(msg);
            notify(&mut synced.recv_watchers, None);
            Ok(Wake(WakeKind::None))
        } else {
            Err(TrySendError::Full(msg))
        }
    }

    /// Blocking send with an optional deadline.
    #[inline]
    pub(crate) fn send(&self, msg: T, deadline: Option<Instant>) -> Result<(), SendTimeoutError<T>> {
        // The hand-off is inlined into the caller; the locked path, with its many live values,
        // is a call of its own, so that the hand-off does not pay for its register saves.
        match self.try_send_fast(msg) {
            Ok(()) => Ok(()),
            Err(msg) => self.send_locked(msg, deadline),
        }
    }

    /// `send` on the locked path.
    #[inline(never)]
    fn send_locked(&self, msg: T, deadline: Option<Instant>) -> Result<(), SendTimeoutError<T>> {
        let mut msg = msg;
        loop {
            let mut synced = self.lock();
            match self.try_send_locked(&mut synced, msg) {
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
            notify(&mut synced.recv_watchers, None);
            drop(synced);
            let abandon = |outcome: Option<Outcome>| {
                if outcome.is_none() {
                    // Never taken: withdraw it, and drop the message (outside the lock) with
                    // the rest of what the unwound fiber owned. It was never delivered. A stop
                    // that could not unwind (`Waiter::wait_or_abandon`) leaves it in the slot:
                    // the timeout below hands it back to the caller.
                    let mut synced = self.lock();
                    synced.senders.remove(slot.waiter());
                    let msg = if std::thread::panicking() { slot.take() } else { None };
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
        let result = Self::try_recv_locked(&mut synced, None);
        drop(synced);
        match result? {
            Got::Msg(msg, wake) => {
                wake.unpark();
                Ok(msg)
            }
            // Not quite non-blocking, as in crossbeam: the picked sender makes its message now.
            Got::Picked(slot, sender) => {
                sender.unpark();
                self.await_pick(&slot).ok_or(TryRecvError::Empty)
            }
        }
    }

    /// Waits in `slot` for the message of the lazy sender that this receiver picked; `None`
    /// if the sender gave the pick back (its message expression panicked): retry.
    pub(crate) fn await_pick(&self, slot: &Arc<Slot<T>>) -> Option<T> {
        let abandon = |outcome: Option<Outcome>| {
            // Unwound by the runtime's drop after the message came: hand it on. Before it
            // came, the waiter is cancelled and the sender keeps its message.
            if let Some(Outcome::Granted(_)) = outcome {
                if let Some(msg) = slot.take() {
                    self.hand_on(msg);
                }
            }
        };
        match slot.waiter().wait_or_abandon(WaitReason::ChannelRecv, None, abandon) {
            // The sender wrote the message before its Release `grant`.
            Outcome::Granted(_) => Some(slot.take().expect("granted receive slot")),
            Outcome::Woken(_) | Outcome::TimedOut => None,
        }
    }

    /// Picks a lazy sender (a watcher that `sends`, not `me`'s) for a receiver that found no
    /// message: wakes it through that operation and gives it a fresh receive slot to fill.
    fn pick_lazy_sender(synced: &mut Synced<T>, me: Option<&Waiter>) -> Option<(Arc<Slot<T>>, Arc<Waiter>)> {
        let mut picked = None;
        synced.send_watchers.retain(|w| {
            if picked.is_some() || !w.sends || me.is_some_and(|me| std::ptr::eq(&*w.waiter, me)) {
                return true;
            }
            if w.waiter.wake(w.op) {
                picked = Some((w.waiter.clone(), w.op));
            }
            // Picked, or stale (its select already chose something else).
            false
        });
        let (sender, op) = picked?;
        let slot = synced.own_slot(None);
        synced.picked.push((sender.clone(), op, slot.clone()));
        Some((slot, sender))
    }

    /// Receives without blocking, with the inner lock held; `me` as for
    /// [`Locked::recv_ready`].
    fn try_recv_locked<'a>(synced: &mut Synced<T>, me: Option<&Waiter>) -> Result<Got<'a, T>, TryRecvError> {
        // Stale send slots are dropped from the queue; their owners take their messages back
        // from their own `Arc` (the rules on `Slot`).
        let served = synced.senders.pop_accepted(|slot| slot.grant());
        if let Some(slot) = &served {
            synced.recycle(slot);
        }
        let msg = match synced.buf.pop_front() {
            Some(msg) => {
                match &served {
                    // Invariant 2: the buffer was full; the sender's message takes the room.
                    Some(slot) => synced.buf.push_back(slot.take().expect("granted send slot")),
                    None => {
                        notify(&mut synced.send_watchers, None);
                        give_back_room(&mut synced.buf);
                    }
                }
                msg
            }
            // Empty buffer: a rendezvous, or a bounded channel whose room was all taken.
            None => match &served {
                Some(slot) => slot.take().expect("granted send slot"),
                None => {
                    if let Some(msg) = synced.timer.as_mut().and_then(Timer::fire) {
                        return Ok(Got::Msg(msg, Wake(WakeKind::None)));
                    }
                    if synced.senders_gone {
                        return Err(TryRecvError::Disconnected);
                    }
                    // A select waiting to send here is a counterpart, as a sender parked in
                    // `send` is: pick it, and it sends its message to us alone.
                    if let Some((slot, sender)) = Self::pick_lazy_sender(synced, me) {
                        return Ok(Got::Picked(slot, sender));
                    }
                    // A receiver is here, even if only polling: a `ready()` waiting to send
                    // here looks again.
                    notify(&mut synced.send_watchers, None);
                    return Err(TryRecvError::Empty);
                }
            },
        };
        Ok(Got::Msg(msg, Wake(served.map_or(WakeKind::None, WakeKind::Slot))))
    }

    /// Blocking receive with an optional deadline.
    #[inline]
    pub(crate) fn recv(&self, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        // As in `send`: the fast slot's wait inline, the locked path a call of its own.
        let me = loom::current_id();
        if me != 0 && deadline.is_none() && self.arm_fast(me) {
            match self.wait_fast(None) {
                Some(Ok(msg)) => return Ok(msg),
                Some(Err(())) => unreachable!("an untimed wait does not time out"),
                None => {}
            }
        }
        self.recv_locked(me, deadline)
    }

    /// `recv` on the locked path, and its timed waits in the fast slot.
    #[inline(never)]
    fn recv_locked(&self, me: usize, deadline: Option<Instant>) -> Result<T, RecvTimeoutError> {
        loop {
            // Plain threads (id 0) keep to the locked path. Under loom every deadline has
            // passed, and the model wants the fast slot's timeout race, so it arms anyway.
            let early = !cfg!(loom) && deadline.is_some_and(|d| Instant::now() >= d);
            if me != 0 && !early && self.arm_fast(me) {
                match self.wait_fast(deadline) {
                    Some(Ok(msg)) => return Ok(msg),
                    Some(Err(())) => return Err(RecvTimeoutError::Timeout),
                    // The senders are gone: drain on the locked path.
                    None => {}
                }
            }
            let mut synced = self.lock();
            match Self::try_recv_locked(&mut synced, None) {
                Ok(Got::Msg(msg, wake)) => {
                    drop(synced);
                    wake.unpark();
                    return Ok(msg);
                }
                Ok(Got::Picked(slot, sender)) => {
                    drop(synced);
                    sender.unpark();
                    match self.await_pick(&slot) {
                        Some(msg) => return Ok(msg),
                        None => continue,
                    }
                }
                Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
                Err(TryRecvError::Empty) => {}
            }
            if !cfg!(loom) && deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(RecvTimeoutError::Timeout);
            }
            if let Some(timer) = &synced.timer {
                // Nobody sends on a timer channel: sleep until it fires (for ever, once an
                // `after` fired) or the deadline comes, whichever is first, and look again.
                let until = match (timer.next, deadline) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                drop(synced);
                wait_list::park(WaitReason::ChannelRecv, until);
                continue;
            }
            let slot = synced.own_slot(None);
            synced.receivers.push_back(slot.clone());
            notify(&mut synced.send_watchers, None);
            drop(synced);
            let abandon = |outcome: Option<Outcome>| {
                let mut synced = self.lock();
                match outcome {
                    None => synced.receivers.remove(slot.waiter()),
                    Some(Outcome::Granted(_)) => {
                        let msg = slot.take().expect("granted receive slot");
                        self.redeliver(synced, msg);
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
    fn redeliver(&self, mut synced: Guard<'_, T>, mut msg: T) {
        if self.claim_armed() {
            match self.fill_fast(Some(msg)) {
                Ok(()) => {
                    drop(synced);
                    self.unpark_fast();
                    return;
                }
                Err(back) => msg = back.expect("a message handed back"),
            }
        }
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
        notify(&mut synced.recv_watchers, None);
    }

    // ---- select! support -----------------------------------------------------------------

    /// Hands on a message granted to a `select!` that its runtime's drop unwound.
    pub(crate) fn hand_on(&self, msg: T) {
        self.redeliver(self.lock(), msg);
    }

    /// Runs `f` with the inner lock held, for `select!`'s arms.
    pub(crate) fn with_lock<'a, R>(&'a self, f: impl FnOnce(&mut Locked<'a, T>) -> R) -> R {
        let mut locked = Locked { synced: self.lock(), chan: self };
        f(&mut locked)
    }

    // ---- disconnection -------------------------------------------------------------------

    /// The last `Sender` is gone: wake every blocked receiver to drain and see it.
    pub(crate) fn disconnect_senders(&self) {
        let (fast, waiting) = {
            let mut synced = self.lock();
            synced.senders_gone = true;
            // `senders_gone` keeps `SLOW` set for good: the slot is never armed again.
            let fast = self.claim_armed() && self.fill_fast(None).is_ok();
            notify(&mut synced.recv_watchers, None);
            (fast, synced.receivers.take_all())
        };
        if fast {
            self.unpark_fast();
        }
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
            notify(&mut synced.send_watchers, None);
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
    synced: Guard<'a, T>,
    chan: &'a Chan<T>,
}

impl<'a, T> Locked<'a, T> {
    /// Whether a send would complete now. A receive slot of the asking select's own waiter
    /// (`me`) does not count: a select cannot meet itself on a rendezvous channel.
    pub(crate) fn send_ready(&self, me: Option<&Waiter>) -> bool {
        self.synced.receivers_gone
            || self.synced.buf.len() < self.chan.cap
            || self.chan.fast.load(Ordering::Relaxed) & TAG == ARMED
            || self.synced.receivers.iter().any(|s| counterpart(s, me))
    }

    /// Whether a receive would complete now (a waiting lazy sender counts: it would be
    /// picked); `me` as for [`Locked::send_ready`].
    pub(crate) fn recv_ready(&self, me: Option<&Waiter>) -> bool {
        !self.synced.buf.is_empty()
            || self.synced.senders_gone
            || self.synced.senders.iter().any(|s| counterpart(s, me))
            || self.synced.timer.as_ref().is_some_and(Timer::is_due)
            || self.synced.send_watchers.iter().any(|w| {
                w.sends && w.waiter.is_waiting() && !me.is_some_and(|me| std::ptr::eq(&*w.waiter, me))
            })
    }

    /// When a timer channel fires next (a select waiting on it parks until then at most).
    pub(crate) fn next_firing(&self) -> Option<Instant> {
        self.synced.timer.as_ref().and_then(|t| t.next)
    }

    /// Registers `waiter` to be woken when the channel may have become ready to send;
    /// `sends`: it will send once chosen, so a receiver may pick it (see [`Watcher`]).
    pub(crate) fn watch_send(&mut self, waiter: &Arc<Waiter>, op: usize, sends: bool) {
        if sends {
            // A counterpart for receivers, as a send slot is: a `ready()` waiting to receive
            // here looks again (it would sleep through the pairing otherwise).
            notify(&mut self.synced.recv_watchers, Some(waiter));
        }
        self.synced.send_watchers.push(Watcher { waiter: waiter.clone(), op, sends });
    }

    /// Registers `waiter` to be woken when the channel may have become ready to receive.
    pub(crate) fn watch_recv(&mut self, waiter: &Arc<Waiter>, op: usize) {
        self.synced.recv_watchers.push(Watcher { waiter: waiter.clone(), op, sends: false });
    }

    /// The receive slot a receiver picked operation `op` of `waiter` for, if one did.
    pub(crate) fn take_pick(&mut self, waiter: &Waiter, op: usize) -> Option<Reserved<'a, T>> {
        let picked = &mut self.synced.picked;
        let i = picked.iter().position(|(w, o, _)| std::ptr::eq(&**w, waiter) && *o == op)?;
        let (_, _, slot) = picked.swap_remove(i);
        Some(Reserved(Some(Held::Picked(slot))))
    }

    /// Chooses a send for a sender whose message is not made yet (`me`: its select's waiter,
    /// whose own receive slots do not count). `None`: not ready. `Some(None)`: ready without
    /// a counterpart to hold (room in the buffer, or the receivers are gone: the send then
    /// completes or fails at once). `Some(Some(_))`: a waiting receiver, now held for this
    /// sender alone until it fills or drops the reservation.
    pub(crate) fn choose_send(&mut self, me: Option<&Waiter>) -> Option<Option<Reserved<'a, T>>> {
        let synced = &mut *self.synced;
        if synced.receivers_gone || synced.buf.len() < self.chan.cap {
            return Some(None);
        }
        // The fast slot's owner is the oldest receiver. Held `CLAIMED`, it waits past its
        // deadline, as a held waiter does.
        if self.chan.claim_armed() {
            return Some(Some(Reserved(Some(Held::Fast(self.chan)))));
        }
        let mut i = 0;
        while let Some(slot) = synced.receivers.get(i) {
            if me.is_some_and(|me| std::ptr::eq(slot.waiter(), me)) {
                i += 1;
                continue;
            }
            let slot = synced.receivers.remove_at(i).expect("an index just read");
            // A stale slot (its waiter cancelled or served elsewhere) is dropped on the way.
            if slot.waiter().hold(slot.op) {
                return Some(Some(Reserved(Some(Held::Slot(slot)))));
            }
        }
        None
    }

    pub(crate) fn try_send(&mut self, msg: T) -> Result<Wake<'a, T>, TrySendError<T>> {
        self.chan.try_send_locked(&mut self.synced, msg)
    }

    /// Receives without blocking; `me` as for [`Locked::recv_ready`]. A picked sender is
    /// to be unparked, and its message awaited (`Chan::await_pick`), once the lock is released.
    pub(crate) fn try_recv(&mut self, me: Option<&Waiter>) -> Result<Got<'a, T>, TryRecvError> {
        Chan::try_recv_locked(&mut self.synced, me)
    }

    pub(crate) fn register_send(&mut self, slot: Arc<Slot<T>>) {
        let synced = &mut *self.synced;
        notify(&mut synced.recv_watchers, Some(slot.waiter()));
        synced.senders.push_back(slot);
    }

    pub(crate) fn register_recv(&mut self, slot: Arc<Slot<T>>) {
        let synced = &mut *self.synced;
        notify(&mut synced.send_watchers, Some(slot.waiter()));
        synced.receivers.push_back(slot);
    }

    /// Removes every slot and watcher of `waiter`.
    pub(crate) fn unregister(&mut self, waiter: &Waiter) {
        let synced = &mut *self.synced;
        synced.senders.remove_all(waiter);
        synced.receivers.remove_all(waiter);
        for watchers in [&mut synced.send_watchers, &mut synced.recv_watchers] {
            watchers.retain(|w| !std::ptr::eq(&*w.waiter, waiter));
        }
    }
}

/// Whether a queued slot is a counterpart that can complete an operation now: still waiting,
/// and not the asking select's own.
fn counterpart<T>(slot: &Arc<Slot<T>>, me: Option<&Waiter>) -> bool {
    slot.waiter().is_waiting() && !me.is_some_and(|me| std::ptr::eq(slot.waiter(), me))
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
#[path = "tests/loom_chan.rs"]
mod loom_tests;
