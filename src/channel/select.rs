//! `select!`: wait on several channel operations at once (the engine behind the macro; not a
//! public API of its own).
//!
//! Semantics are Go's: every channel expression and every message to send is evaluated once,
//! in order, on entry; exactly one operation completes; the messages of the send arms that did
//! not complete are dropped. Arms are tried starting at a random one, so no ready arm starves.
//!
//! Steps, with one `Waiter` shared by every arm (`arch/sync.md` has the proof sketch):
//! 1. Try each arm without registering; the first that can complete does.
//! 2. Otherwise, for each arm under its channel's inner lock: if it can complete now, first
//!    `cancel` the shared waiter (claiming it for ourselves; if that fails, a counterpart already
//!    granted or woke an arm registered earlier, so stop), then complete it; else register a
//!    slot (a send slot carries its message) tagged with the arm's index.
//! 3. Park until a counterpart grants an arm (it completed it for us), wakes one (a
//!    disconnection: go round again), or the deadline cancels the waiter.
//! 4. Unregister every slot, taking unsent messages back, under each channel's lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::chan::{Slot, SlotWaiter};
use super::{Receiver, RecvError, SendError, Sender, TryRecvError, TrySendError};
use crate::sync::loom::{self, Arc};
use crate::sync::wait_list::{self, Outcome, WaitReason, Waiter};

/// How long `select!` may wait: no `default` arm, `default`, or `default(timeout)`.
#[derive(Clone, Copy, Debug)]
pub enum Deadline {
    /// Wait until an operation completes.
    Never,
    /// Do not wait.
    Now,
    /// Wait until this instant at most.
    At(Instant),
}

impl Deadline {
    /// A deadline `timeout` from now (`Never` if that is not representable).
    pub fn after(timeout: Duration) -> Deadline {
        match Instant::now().checked_add(timeout) {
            Some(at) => Deadline::At(at),
            None => Deadline::Never,
        }
    }
}

/// One arm, type-erased for [`run`].
pub struct Arm<'a> {
    ops: &'a mut dyn ArmOps,
}

impl std::fmt::Debug for Arm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arm").finish_non_exhaustive()
    }
}

/// What step 2 did with one arm.
enum Poll {
    /// Registered a slot; keep going.
    Pending,
    /// Claimed the waiter and completed the operation.
    Done,
    /// The waiter was already granted or woken through an earlier arm.
    Preempted,
    /// Claimed the waiter, but the counterpart that made the arm ready cancelled meanwhile:
    /// start again with a fresh waiter.
    Lost,
}

trait ArmOps {
    /// Step 1: completes the operation if it can without waiting.
    fn try_now(&mut self) -> bool;
    /// Step 2.
    fn try_or_register(&mut self, waiter: &Arc<Waiter>, op: usize) -> Poll;
    /// Step 4.
    fn unregister(&mut self, waiter: &Waiter);
    /// The waiter was granted this arm: collect the result the counterpart left.
    fn complete_granted(&mut self);
    /// The waiter was granted this arm, but the runtime's drop is unwinding the select: hand
    /// on what the counterpart left (a received message) so that nothing is lost. Runs during
    /// unwinding: must not park or panic.
    fn abandon_granted(&mut self);
}

/// A `recv(rx) -> res` arm.
pub struct RecvArm<'a, T> {
    rx: &'a Receiver<T>,
    slot: Option<Arc<Slot<T>>>,
    registered: bool,
    result: Option<Result<T, RecvError>>,
}

/// A `send(tx, msg) -> res` arm.
pub struct SendArm<'a, T> {
    tx: &'a Sender<T>,
    msg: Option<T>,
    slot: Option<Arc<Slot<T>>>,
    result: Option<Result<(), SendError<T>>>,
}

impl<'a, T> RecvArm<'a, T> {
    /// An arm receiving from `rx`.
    pub fn new(rx: &'a Receiver<T>) -> Self {
        RecvArm { rx, slot: None, registered: false, result: None }
    }

    /// The arm, type-erased for [`run`].
    pub fn arm(&mut self) -> Arm<'_> {
        Arm { ops: self }
    }

    /// The result, if this arm was the one selected.
    pub fn into_result(self) -> Option<Result<T, RecvError>> {
        self.result
    }
}

impl<'a, T> SendArm<'a, T> {
    /// An arm sending `msg` on `tx`.
    pub fn new(tx: &'a Sender<T>, msg: T) -> Self {
        SendArm { tx, msg: Some(msg), slot: None, result: None }
    }

    /// The arm, type-erased for [`run`].
    pub fn arm(&mut self) -> Arm<'_> {
        Arm { ops: self }
    }

    /// The result, if this arm was the one selected; an unsent message is dropped.
    pub fn into_result(self) -> Option<Result<(), SendError<T>>> {
        self.result
    }
}

impl<T> std::fmt::Debug for RecvArm<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvArm").finish_non_exhaustive()
    }
}

impl<T> std::fmt::Debug for SendArm<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendArm").finish_non_exhaustive()
    }
}

impl<T> ArmOps for RecvArm<'_, T> {
    fn try_now(&mut self) -> bool {
        match self.rx.chan().try_recv() {
            Ok(msg) => self.result = Some(Ok(msg)),
            Err(TryRecvError::Disconnected) => self.result = Some(Err(RecvError)),
            Err(TryRecvError::Empty) => return false,
        }
        true
    }

    fn try_or_register(&mut self, waiter: &Arc<Waiter>, op: usize) -> Poll {
        let rx = self.rx;
        let (poll, wake) = rx.chan().with_lock(|locked| {
            if !locked.recv_ready() {
                let slot = Arc::new(Slot::new(SlotWaiter::Shared(waiter.clone()), op, None));
                locked.register_recv(slot.clone());
                self.slot = Some(slot);
                self.registered = true;
                return (Poll::Pending, None);
            }
            if waiter.cancel().is_err() {
                return (Poll::Preempted, None);
            }
            match locked.try_recv() {
                Ok((msg, wake)) => {
                    self.result = Some(Ok(msg));
                    (Poll::Done, Some(wake))
                }
                Err(TryRecvError::Disconnected) => {
                    self.result = Some(Err(RecvError));
                    (Poll::Done, None)
                }
                Err(TryRecvError::Empty) => (Poll::Lost, None),
            }
        });
        if let Some(wake) = wake {
            wake.unpark();
        }
        poll
    }

    fn unregister(&mut self, waiter: &Waiter) {
        if std::mem::take(&mut self.registered) {
            let rx = self.rx;
            rx.chan().with_lock(|locked| locked.unregister(waiter));
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
            self.rx.chan().hand_on(msg);
        }
    }
}

impl<T> ArmOps for SendArm<'_, T> {
    fn try_now(&mut self) -> bool {
        let msg = self.msg.take().expect("a send arm holds its message until it completes");
        match self.tx.chan().try_send(msg) {
            Ok(()) => self.result = Some(Ok(())),
            Err(TrySendError::Disconnected(msg)) => self.result = Some(Err(SendError(msg))),
            Err(TrySendError::Full(msg)) => {
                self.msg = Some(msg);
                return false;
            }
        }
        true
    }

    fn try_or_register(&mut self, waiter: &Arc<Waiter>, op: usize) -> Poll {
        let msg = self.msg.take().expect("a send arm holds its message until it completes");
        let tx = self.tx;
        let (poll, wake) = tx.chan().with_lock(|locked| {
            if !locked.send_ready() {
                let slot = Arc::new(Slot::new(SlotWaiter::Shared(waiter.clone()), op, Some(msg)));
                locked.register_send(slot.clone());
                self.slot = Some(slot);
                return (Poll::Pending, None);
            }
            if waiter.cancel().is_err() {
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

    fn unregister(&mut self, waiter: &Waiter) {
        if let Some(slot) = self.slot.take() {
            let tx = self.tx;
            tx.chan().with_lock(|locked| {
                locked.unregister(waiter);
                // Under the inner lock: if a receiver was granted this slot it already took
                // the message (None here); otherwise the message is still ours.
                if let Some(msg) = slot.take() {
                    self.msg = Some(msg);
                }
            });
        }
    }

    fn complete_granted(&mut self) {
        self.result = Some(Ok(()));
    }

    fn abandon_granted(&mut self) {
        // A receiver took the message: nothing of ours is left to hand on.
    }
}

/// Runs a select over `arms` (steps 1-4 above): the index of the arm that completed, or
/// `None` if `deadline` came first.
pub fn run(arms: &mut [Arm<'_>], deadline: Deadline) -> Option<usize> {
    let n = arms.len();
    if n == 0 {
        return wait_without_arms(deadline);
    }
    let start = random_below(n);
    let order = (0..n).map(|k| (start + k) % n);
    for i in order.clone() {
        if arms[i].ops.try_now() {
            return Some(i);
        }
    }
    let deadline = match deadline {
        Deadline::Now => return None,
        Deadline::Never => None,
        Deadline::At(at) => Some(at),
    };
    loop {
        let waiter = Arc::new(Waiter::new());
        let mut polled = Poll::Pending;
        let mut done = None;
        for i in order.clone() {
            polled = arms[i].ops.try_or_register(&waiter, i);
            match polled {
                Poll::Pending => continue,
                Poll::Done => done = Some(i),
                Poll::Preempted | Poll::Lost => {}
            }
            break;
        }
        let outcome = match polled {
            Poll::Pending | Poll::Preempted => {
                // A runtime's drop may unwind this fiber from inside its park: take every
                // slot back, and hand on a message a sender already delivered to us.
                let abandon = |outcome: Option<Outcome>| {
                    for arm in arms.iter_mut() {
                        arm.ops.unregister(&waiter);
                    }
                    if let Some(Outcome::Granted(i)) = outcome {
                        arms[i].ops.abandon_granted();
                    }
                };
                Some(waiter.wait_or_abandon(WaitReason::Select, deadline, abandon))
            }
            Poll::Done | Poll::Lost => None,
        };
        for arm in arms.iter_mut() {
            arm.ops.unregister(&waiter);
        }
        if done.is_some() {
            return done;
        }
        match outcome {
            Some(Outcome::Granted(i)) => {
                arms[i].ops.complete_granted();
                return Some(i);
            }
            Some(Outcome::TimedOut) => return None,
            // Woken: a channel disconnected, so its arm is ready now. Lost: a race undid
            // the readiness we saw. Either way, go round again.
            Some(Outcome::Woken(_)) | None => {}
        }
    }
}

fn wait_without_arms(deadline: Deadline) -> Option<usize> {
    match deadline {
        Deadline::Now => None,
        Deadline::Never => loop {
            wait_list::park(WaitReason::Select, None);
        },
        Deadline::At(at) => {
            while !loom::expired(at) {
                wait_list::park(WaitReason::Select, Some(at));
            }
            None
        }
    }
}

/// A uniformly spread index below `n` (Lemire's multiply-shift over splitmix64): fairness
/// only needs a different starting arm each time, not cryptographic quality.
fn random_below(n: usize) -> usize {
    if cfg!(loom) {
        // Loom replays each interleaving and needs the model to be deterministic.
        return 0;
    }
    static STATE: AtomicU64 = AtomicU64::new(0);
    // Relaxed: any interleaving of increments gives distinct inputs, which is all we need.
    let mut z = STATE.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    ((u128::from(z) * n as u128) >> 64) as usize
}

/// Waits on several channel operations at once; exactly one completes.
///
/// Arms, in any order and separated by commas (optional after a block):
/// - `recv(rx) -> res => body`: `res: Result<T, RecvError>`;
/// - `send(tx, msg) -> res => body`: `res: Result<(), SendError<T>>`;
/// - at most one `default => body` (run if no operation is ready now) or
///   `default(timeout) => body` (run if none became ready within `timeout`).
///
/// Without `default` it parks until an operation completes. Like Go's `select`, every channel
/// and message expression is evaluated once on entry, a ready arm is chosen at random among
/// the ready ones (the search starts at a random arm), and messages of send arms that did not
/// complete are dropped. A disconnected channel's arm is ready (it completes with `Err`).
///
/// ```
/// use virtual_threads as vt;
/// use std::time::Duration;
///
/// let (tx1, rx1) = vt::channel::unbounded::<i32>();
/// let (tx2, rx2) = vt::channel::bounded::<&str>(1);
/// tx1.send(1).unwrap();
/// vt::select! {
///     recv(rx1) -> msg => assert_eq!(msg, Ok(1)),
///     send(tx2, "hi") -> res => res.unwrap(),
///     default(Duration::from_secs(1)) => panic!("both arms were ready"),
/// }
/// ```
#[macro_export]
macro_rules! select {
    ($($tokens:tt)*) => {
        $crate::__vt_select!(
            @parse [$($tokens)*] [] []
            [__vt_a0 __vt_a1 __vt_a2 __vt_a3 __vt_a4 __vt_a5 __vt_a6 __vt_a7 __vt_a8 __vt_a9
             __vt_a10 __vt_a11 __vt_a12 __vt_a13 __vt_a14 __vt_a15 __vt_a16 __vt_a17 __vt_a18
             __vt_a19 __vt_a20 __vt_a21 __vt_a22 __vt_a23 __vt_a24 __vt_a25 __vt_a26 __vt_a27
             __vt_a28 __vt_a29 __vt_a30 __vt_a31]
        )
    };
}

/// Implementation detail of [`select!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __vt_select {
    // ---- parsing: [tokens left] [arms so far] [default] [free identifiers] ----
    (@parse [recv($r:expr) -> $p:pat => $body:block, $($rest:tt)*] $arms:tt $def:tt $ids:tt) => {
        $crate::__vt_select!(@parse [recv($r) -> $p => $body $($rest)*] $arms $def $ids)
    };
    (@parse [recv($r:expr) -> $p:pat => $body:block $($rest:tt)*] [$($arms:tt)*] $def:tt
        [$id:ident $($ids:ident)*]) => {
        $crate::__vt_select!(@parse [$($rest)*]
            [$($arms)* ($id [$crate::channel::select::RecvArm::new(&$r)] $p => $body)] $def [$($ids)*])
    };
    (@parse [recv($r:expr) -> $p:pat => $body:expr $(, $($rest:tt)*)?] [$($arms:tt)*] $def:tt
        [$id:ident $($ids:ident)*]) => {
        $crate::__vt_select!(@parse [$($($rest)*)?]
            [$($arms)* ($id [$crate::channel::select::RecvArm::new(&$r)] $p => { $body })] $def [$($ids)*])
    };
    (@parse [send($s:expr, $m:expr) -> $p:pat => $body:block, $($rest:tt)*] $arms:tt $def:tt $ids:tt) => {
        $crate::__vt_select!(@parse [send($s, $m) -> $p => $body $($rest)*] $arms $def $ids)
    };
    (@parse [send($s:expr, $m:expr) -> $p:pat => $body:block $($rest:tt)*] [$($arms:tt)*] $def:tt
        [$id:ident $($ids:ident)*]) => {
        $crate::__vt_select!(@parse [$($rest)*]
            [$($arms)* ($id [$crate::channel::select::SendArm::new(&$s, $m)] $p => $body)] $def [$($ids)*])
    };
    (@parse [send($s:expr, $m:expr) -> $p:pat => $body:expr $(, $($rest:tt)*)?] [$($arms:tt)*] $def:tt
        [$id:ident $($ids:ident)*]) => {
        $crate::__vt_select!(@parse [$($($rest)*)?]
            [$($arms)* ($id [$crate::channel::select::SendArm::new(&$s, $m)] $p => { $body })] $def [$($ids)*])
    };
    (@parse [default => $body:block, $($rest:tt)*] $arms:tt [] $ids:tt) => {
        $crate::__vt_select!(@parse [default => $body $($rest)*] $arms [] $ids)
    };
    (@parse [default => $body:block $($rest:tt)*] $arms:tt [] $ids:tt) => {
        $crate::__vt_select!(@parse [$($rest)*] $arms
            [($crate::channel::select::Deadline::Now) $body] $ids)
    };
    (@parse [default => $body:expr $(, $($rest:tt)*)?] $arms:tt [] $ids:tt) => {
        $crate::__vt_select!(@parse [$($($rest)*)?] $arms
            [($crate::channel::select::Deadline::Now) { $body }] $ids)
    };
    (@parse [default($t:expr) => $body:block, $($rest:tt)*] $arms:tt [] $ids:tt) => {
        $crate::__vt_select!(@parse [default($t) => $body $($rest)*] $arms [] $ids)
    };
    (@parse [default($t:expr) => $body:block $($rest:tt)*] $arms:tt [] $ids:tt) => {
        $crate::__vt_select!(@parse [$($rest)*] $arms
            [($crate::channel::select::Deadline::after($t)) $body] $ids)
    };
    (@parse [default($t:expr) => $body:expr $(, $($rest:tt)*)?] $arms:tt [] $ids:tt) => {
        $crate::__vt_select!(@parse [$($($rest)*)?] $arms
            [($crate::channel::select::Deadline::after($t)) { $body }] $ids)
    };
    (@parse [default $($rest:tt)*] $arms:tt [$($def:tt)+] $ids:tt) => {
        ::core::compile_error!("select! takes at most one `default` arm")
    };
    (@parse [] $arms:tt $def:tt $ids:tt) => {
        $crate::__vt_select!(@emit $arms $def)
    };
    (@parse [$($rest:tt)+] $arms:tt $def:tt []) => {
        ::core::compile_error!("select! takes at most 32 operation arms")
    };
    (@parse [$($rest:tt)+] $arms:tt $def:tt $ids:tt) => {
        ::core::compile_error!(
            "expected `recv(rx) -> res => body`, `send(tx, msg) -> res => body`, \
             `default => body` or `default(timeout) => body`"
        )
    };

    // ---- code generation ----
    (@emit [$(($id:ident [$($new:tt)*] $p:pat => $body:block))*] $def:tt) => {{
        $( let mut $id = $($new)*; )*
        $crate::channel::select::run(
            &mut [$($id.arm()),*],
            $crate::__vt_select!(@deadline $def),
        );
        $( let $id = $id.into_result(); )*
        $crate::__vt_select!(@dispatch [$(($id $p => $body))*] $def)
    }};
    (@deadline []) => { $crate::channel::select::Deadline::Never };
    (@deadline [($deadline:expr) $body:block]) => { $deadline };
    (@dispatch [($id:ident $p:pat => $body:block) $($rest:tt)*] $def:tt) => {
        if let ::core::option::Option::Some(__vt_res) = $id {
            let $p = __vt_res;
            $body
        } else {
            $crate::__vt_select!(@dispatch [$($rest)*] $def)
        }
    };
    (@dispatch [] []) => {
        ::core::unreachable!("select! without `default` always completes an operation")
    };
    (@dispatch [] [($deadline:expr) $body:block]) => { $body };
}
