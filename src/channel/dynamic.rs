//! The dynamic [`Select`], crossbeam-channel's shape: operations added at run time, each given
//! an index; `select` completes a receive at once (its message waits in the
//! [`SelectedOperation`]) and chooses a send whose channel is ready, which the caller then
//! completes with [`SelectedOperation::send`]; `ready` only waits for readiness. The engine is
//! `select!`'s (`select.rs`): receives register receive slots, sends and `ready` register
//! watchers that are woken when their channel may have become ready.

use std::fmt;
use std::time::{Duration, Instant};

use super::arms::{NeverArm, RecvArm, WatchArm};
use super::chan::{Chan, Reserved};
use super::error::{
    ReadyTimeoutError, RecvError, SelectTimeoutError, SendError, TryReadyError, TrySelectError,
};
use super::select::{self, ArmList, ArmOps, Deadline};
use super::{Receiver, Sender};

/// `let mut sel = vt::channel::Select::new(); let i = sel.recv(&rx1); let op = sel.select();`
///
/// Waits on a set of channel operations chosen at run time; a random one among the ready ones
/// is selected (in order with [`Select::new_biased`]).
///
/// As in crossbeam-channel, there are two ways to use it: [`select`](Select::select),
/// [`try_select`](Select::try_select) and [`select_timeout`](Select::select_timeout) return a
/// [`SelectedOperation`] that must be completed with its `recv` or `send`; the
/// [`ready`](Select::ready) family only says which operation is ready, and the caller then
/// tries it (in a loop: another party may take the readiness first).
///
/// A selected receive has already taken its message. A selected send was chosen for a
/// waiting receiver, which is then held for it alone until [`SelectedOperation::send`] (or the
/// operation's drop, which gives it back), as in crossbeam; or for room in the buffer, and if
/// a competing sender takes that room first, that send waits as [`Sender::send`] does
/// (crossbeam reserves the room too).
///
/// ```
/// use virtual_threads as vt;
/// use vt::channel::{unbounded, Select};
///
/// let chans: Vec<_> = (0..4).map(|_| unbounded::<usize>()).collect();
/// chans[2].0.send(42).unwrap();
/// let mut sel = Select::new();
/// for (_, rx) in &chans {
///     sel.recv(rx);
/// }
/// let op = sel.select();
/// let i = op.index();
/// assert_eq!((i, op.recv(&chans[i].1)), (2, Ok(42)));
/// ```
pub struct Select<'a> {
    ops: Vec<Option<Op<'a>>>,
    biased: bool,
}

struct Op<'a> {
    /// The channel's address: which handle `SelectedOperation::{send, recv}` must be given.
    chan: usize,
    send: bool,
    arms: Box<dyn OpArms<'a> + 'a>,
}

/// One operation's two arms: the one `select` uses and the one `ready` uses.
trait OpArms<'a> {
    fn select_arm(&mut self) -> &mut dyn ArmOps;
    fn ready_arm(&mut self) -> &mut dyn ArmOps;
    /// The received result, after `select_arm` completed (receives only).
    fn take_result(&mut self) -> Option<Erased<'a>>;
    /// The same operation with fresh arms, for `Select::clone`.
    fn fresh(&self) -> Box<dyn OpArms<'a> + 'a>;
    /// The receiver held for a selected send (sends only).
    fn take_reserved(&mut self) -> Option<ErasedReserved<'a>> {
        None
    }
}

struct RecvOp<'a, T> {
    take: RecvArm<'a, T>,
    watch: WatchArm<'a, T>,
}

struct SendOp<'a, T> {
    /// For `select`: chosen, it holds a receiver (`sends`).
    pick: WatchArm<'a, T>,
    /// For `ready`: only looks.
    watch: WatchArm<'a, T>,
}

impl<'a, T: 'a> OpArms<'a> for RecvOp<'a, T> {
    fn select_arm(&mut self) -> &mut dyn ArmOps {
        &mut self.take
    }

    fn ready_arm(&mut self) -> &mut dyn ArmOps {
        &mut self.watch
    }

    fn take_result(&mut self) -> Option<Erased<'a>> {
        let result: Box<dyn Any + 'a> = Box::new(self.take.take_result()?);
        Some(Erased(result))
    }

    fn fresh(&self) -> Box<dyn OpArms<'a> + 'a> {
        let chan = self.take.chan();
        Box::new(RecvOp { take: RecvArm::on(chan), watch: WatchArm::new(chan, false, false) })
    }
}

impl<'a, T: 'a> OpArms<'a> for SendOp<'a, T> {
    fn select_arm(&mut self) -> &mut dyn ArmOps {
        &mut self.pick
    }

    fn ready_arm(&mut self) -> &mut dyn ArmOps {
        &mut self.watch
    }

    fn take_result(&mut self) -> Option<Erased<'a>> {
        None
    }

    fn fresh(&self) -> Box<dyn OpArms<'a> + 'a> {
        Box::new(SendOp::new(self.watch.chan()))
    }

    fn take_reserved(&mut self) -> Option<ErasedReserved<'a>> {
        let reserved: Box<dyn Any + 'a> = Box::new(self.pick.take_reserved()?);
        Some(ErasedReserved(reserved))
    }
}

impl<'a, T> SendOp<'a, T> {
    fn new(chan: &'a Chan<T>) -> Self {
        SendOp { pick: WatchArm::new(chan, true, true), watch: WatchArm::new(chan, true, false) }
    }
}

/// Any type, for a boxed `Result<T, RecvError>` whose `T` is known again only from the
/// channel it came from (`std::any::Any` would need `T: 'static`).
trait Any {}
impl<T: ?Sized> Any for T {}

/// A received `Result<T, RecvError>`, its type erased.
struct Erased<'a>(Box<dyn Any + 'a>);

/// The `Reserved<'a, T>` receiver held for a selected send, its type erased. Dropped unused
/// (the `SelectedOperation` dropped, or panicking), it gives the receiver back.
struct ErasedReserved<'a>(Box<dyn Any + 'a>);

/// The operations as `select.rs`'s engine sees them: removed ones are never ready.
struct Arms<'s, 'a> {
    ops: &'s mut [Option<Op<'a>>],
    ready: bool,
    never: NeverArm,
}

impl ArmList for Arms<'_, '_> {
    fn len(&self) -> usize {
        self.ops.len()
    }

    fn get(&mut self, i: usize) -> &mut dyn ArmOps {
        let ready = self.ready;
        match &mut self.ops[i] {
            Some(op) => {
                if ready {
                    op.arms.ready_arm()
                } else {
                    op.arms.select_arm()
                }
            }
            None => &mut self.never,
        }
    }
}

impl<'a> Select<'a> {
    /// An empty set of operations.
    pub fn new() -> Select<'a> {
        Select { ops: Vec::new(), biased: false }
    }

    /// An empty set whose ready operations are chosen in the order they were added.
    pub fn new_biased() -> Select<'a> {
        Select { ops: Vec::new(), biased: true }
    }

    /// Adds a send on `s`; returns its index.
    ///
    /// `T: Send` (crossbeam asks nothing of `T`): a `Select` is `Send` and `Sync`, as
    /// crossbeam's, and the one here moves received messages itself.
    pub fn send<T: Send>(&mut self, s: &'a Sender<T>) -> usize {
        let chan = s.chan();
        self.push(chan, true, Box::new(SendOp::new(chan)))
    }

    /// Adds a receive on `r`; returns its index. `T: Send`, as for [`Select::send`].
    pub fn recv<T: Send>(&mut self, r: &'a Receiver<T>) -> usize {
        let chan = r.chan();
        let op = RecvOp { take: RecvArm::on(chan), watch: WatchArm::new(chan, false, false) };
        self.push(chan, false, Box::new(op))
    }

    fn push<T>(&mut self, chan: &'a Chan<T>, send: bool, arms: Box<dyn OpArms<'a> + 'a>) -> usize {
        self.ops.push(Some(Op { chan: address(chan), send, arms }));
        self.ops.len() - 1
    }

    /// Removes the operation `index` (indices of the others do not change).
    ///
    /// # Panics
    /// If there is no operation `index` (never added, or already removed).
    pub fn remove(&mut self, index: usize) {
        let op = self.ops.get_mut(index).and_then(Option::take);
        assert!(op.is_some(), "no operation with this index");
    }

    /// Selects an operation that is ready now.
    pub fn try_select(&mut self) -> Result<SelectedOperation<'a>, TrySelectError> {
        self.run_select(Deadline::Now).ok_or(TrySelectError)
    }

    /// Parks until an operation is selected. With no operations, parks for ever.
    pub fn select(&mut self) -> SelectedOperation<'a> {
        self.run_select(Deadline::Never).expect("a select without a deadline selects")
    }

    /// Parks until an operation is selected, for at most `timeout`.
    pub fn select_timeout(&mut self, timeout: Duration) -> Result<SelectedOperation<'a>, SelectTimeoutError> {
        self.run_select(Deadline::after(timeout)).ok_or(SelectTimeoutError)
    }

    /// Parks until an operation is selected, until `deadline` at most.
    pub fn select_deadline(
        &mut self,
        deadline: Instant,
    ) -> Result<SelectedOperation<'a>, SelectTimeoutError> {
        self.run_select(Deadline::At(deadline)).ok_or(SelectTimeoutError)
    }

    /// The index of an operation that is ready now.
    pub fn try_ready(&mut self) -> Result<usize, TryReadyError> {
        self.run_ready(Deadline::Now).ok_or(TryReadyError)
    }

    /// Parks until an operation is ready and returns its index. The operation is not
    /// performed, and another party may take the readiness first.
    pub fn ready(&mut self) -> usize {
        self.run_ready(Deadline::Never).expect("a wait without a deadline ends ready")
    }

    /// Parks until an operation is ready, for at most `timeout`.
    pub fn ready_timeout(&mut self, timeout: Duration) -> Result<usize, ReadyTimeoutError> {
        self.run_ready(Deadline::after(timeout)).ok_or(ReadyTimeoutError)
    }

    /// Parks until an operation is ready, until `deadline` at most.
    pub fn ready_deadline(&mut self, deadline: Instant) -> Result<usize, ReadyTimeoutError> {
        self.run_ready(Deadline::At(deadline)).ok_or(ReadyTimeoutError)
    }

    fn run_select(&mut self, deadline: Deadline) -> Option<SelectedOperation<'a>> {
        let mut arms = Arms { ops: &mut self.ops, ready: false, never: NeverArm };
        let index = select::run_list(&mut arms, deadline, self.biased)?;
        let op = self.ops[index].as_mut().expect("a removed operation is never selected");
        Some(SelectedOperation {
            index,
            chan: op.chan,
            send: op.send,
            result: op.arms.take_result(),
            reserved: op.arms.take_reserved(),
            done: false,
        })
    }

    fn run_ready(&mut self, deadline: Deadline) -> Option<usize> {
        let mut arms = Arms { ops: &mut self.ops, ready: true, never: NeverArm };
        select::run_list(&mut arms, deadline, self.biased)
    }
}

fn address<T>(chan: &Chan<T>) -> usize {
    std::ptr::from_ref(chan) as usize
}

// Between calls (all that another thread can reach) a `Select`'s arms hold only `&Chan<T>`s,
// with no message and no registration (`run_select` takes the result out and every run
// unregisters before returning), and `Select::send`/`recv` admit only `T: Send`, for which
// `Chan<T>` is `Sync`. `&Select` reaches only `clone` (fresh arms from the same `&Chan<T>`s)
// and `Debug`.
// SAFETY: so sharing or moving the `Select` shares or moves `&Chan<T>`s, which is sound.
unsafe impl Send for Select<'_> {}
// SAFETY: as above.
unsafe impl Sync for Select<'_> {}

/// A copy of the set of operations (same indices, biased or not), as crossbeam's: each copy
/// selects on its own.
impl Clone for Select<'_> {
    fn clone(&self) -> Self {
        let ops = self
            .ops
            .iter()
            .map(|op| op.as_ref().map(|op| Op { chan: op.chan, send: op.send, arms: op.arms.fresh() }))
            .collect();
        Select { ops, biased: self.biased }
    }
}

impl Default for Select<'_> {
    fn default() -> Self {
        Select::new()
    }
}

impl fmt::Debug for Select<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Select")
            .field("operations", &self.ops.iter().flatten().count())
            .finish_non_exhaustive()
    }
}

/// An operation chosen by [`Select::select`] and its variants; complete it with
/// [`send`](SelectedOperation::send) or [`recv`](SelectedOperation::recv), passing the same
/// handle that was added to the `Select`.
///
/// # Panics
/// Dropping it without completing it panics, as in crossbeam-channel (a selected receive holds
/// a message that would be lost).
#[must_use = "a selected operation must be completed with `send` or `recv`"]
pub struct SelectedOperation<'a> {
    index: usize,
    chan: usize,
    send: bool,
    result: Option<Erased<'a>>,
    reserved: Option<ErasedReserved<'a>>,
    done: bool,
}

impl SelectedOperation<'_> {
    /// The index [`Select::send`] or [`Select::recv`] returned for this operation.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Completes the selected send with `msg`.
    ///
    /// # Panics
    /// If `s` is not the handle's channel, or the operation is a receive.
    pub fn send<T>(mut self, s: &Sender<T>, msg: T) -> Result<(), SendError<T>> {
        assert!(self.send && self.chan == address(s.chan()), "passed a sender that wasn't selected");
        self.done = true;
        let Some(ErasedReserved(reserved)) = self.reserved.take() else {
            // Chosen for room in the buffer (or the receivers are gone).
            return s.send(msg);
        };
        let raw = Box::into_raw(reserved).cast::<Reserved<'_, T>>();
        // SAFETY: as in `recv`: the box was made by `SendOp::<T'>::take_reserved` as a
        // `Reserved<'a, T'>` for the channel at `self.chan`, which is `s`'s (alive, borrowed
        // for `'a`), and a channel is seen through one message type only, so `T' == T`. The
        // lifetime is `'a` shortened, as `Reserved` is covariant in it.
        let reserved = *unsafe { Box::from_raw(raw) };
        // Its receiver was unwound meanwhile (a runtime's drop): send as usual.
        reserved.fill(msg).or_else(|msg| s.send(msg))
    }

    /// Completes the selected receive: the message it took, or `Err` if the channel was empty
    /// and disconnected.
    ///
    /// # Panics
    /// If `r` is not the handle's channel, or the operation is a send.
    pub fn recv<T>(mut self, r: &Receiver<T>) -> Result<T, RecvError> {
        assert!(!self.send && self.chan == address(r.chan()), "passed a receiver that wasn't selected");
        self.done = true;
        let Erased(result) = self.result.take().expect("a selected receive holds its result");
        let raw = Box::into_raw(result).cast::<Result<T, RecvError>>();
        // SAFETY: the box was made by `RecvOp::<T'>::take_result` as a `Result<T', RecvError>`
        // received from the channel at address `self.chan`, which is `r`'s channel, alive
        // (borrowed by the `Select` for `'a`) so not another channel at a reused address.
        // `Receiver<T>` is invariant in `T` (its `Chan<T>` holds `UnsafeCell`s of `T`), so a
        // channel is seen through one type only: `T' == T`, and the cast gives back the type the
        // box was allocated with.
        *unsafe { Box::from_raw(raw) }
    }
}

impl Drop for SelectedOperation<'_> {
    fn drop(&mut self) {
        if !self.done && !std::thread::panicking() {
            panic!("dropped `SelectedOperation` without completing the operation");
        }
    }
}

impl fmt::Debug for SelectedOperation<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SelectedOperation").field("index", &self.index).finish_non_exhaustive()
    }
}
