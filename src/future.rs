//! Async interop: a fiber waits for a future ([`block_on`]), and async code awaits a fiber
//! (`JoinHandle<T>: IntoFuture`).
//!
//! [`block_on`] polls the future on the calling fiber and parks the fiber between polls. The
//! future's waker is the fiber's handle ([`Fiber`], a counted reference to its
//! record) and waking it is [`Fiber::unpark`]: a wake that comes before
//! the park leaves the fiber's token, so it is not lost, and a wake after the fiber finished
//! finds it done and does nothing. Making, cloning and waking the waker allocate nothing.
//!
//! This crate has no reactor for futures. A future that needs another runtime's reactor
//! (tokio's sockets and timers) runs on that runtime — `tokio_handle.spawn(fut)` — and the
//! fiber waits for tokio's `JoinHandle` with [`block_on`]; `arch/guide.md`'s "Using async crates"
//! shows it, and `benches/examples/tokio_interop.rs` runs it.
//!
//! Awaiting a fiber's `JoinHandle` that has not finished yet costs one more fiber, on the
//! awaited fiber's runtime, that joins it and wakes the awaiting task: the join hand-off in
//! `fiber/join.rs` has room for one parked joiner, not for a waker that changes from poll to
//! poll. The design, and why no wake-up is lost: `arch/interop.md`.

use std::future::{Future, IntoFuture};
use std::panic::Location;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};
use std::thread;

use crate::fiber::handle::Fiber;
use crate::fiber::join::JoinHandle;
use crate::fiber::park::park_for;
use crate::fiber::wait::WaitReason;

/// `let body = vt::future::block_on(tokio_handle.spawn(fetch(url))).unwrap();`
///
/// Runs `fut` to completion on the calling fiber and returns its output.
///
/// Called from a fiber, this parks the fiber until the future's waker is woken, so its
/// carrier runs other fibers meanwhile; from a plain OS thread, it blocks the thread. The
/// future is polled on the caller's stack and never moves. Nothing here drives I/O or
/// timers: the future must be woken by whatever it waits for (a tokio runtime, another
/// thread, a fiber).
///
/// ```
/// use virtual_threads as vt;
///
/// let (tx, rx) = std::sync::mpsc::channel::<std::task::Waker>();
/// let fiber = vt::spawn(move || {
///     let mut woken = false;
///     // A future that is ready on its second poll; its waker goes to a plain thread.
///     let fut = std::future::poll_fn(|cx| {
///         if woken {
///             return std::task::Poll::Ready(42);
///         }
///         woken = true;
///         tx.send(cx.waker().clone()).unwrap();
///         std::task::Poll::Pending
///     });
///     vt::future::block_on(fut) // parks this fiber, not its carrier
/// });
/// std::thread::spawn(move || rx.recv().unwrap().wake());
/// assert_eq!(fiber.join().unwrap(), 42);
/// ```
pub fn block_on<F: Future>(fut: F) -> F::Output {
    // The future lives on this fiber's stack, and whatever it registered with (a tokio
    // timer, an intrusive wait list) may write into it while the fiber is parked: the stack
    // must stay where it is (`arch/compaction.md`).
    crate::fiber::compact::no_compaction(|| {
        let mut fut = pin!(fut);
        let waker = fiber_waker(crate::fiber::handle::current());
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
                return out;
            }
            // Returns on the waker's unpark, at once if it came during the poll (the token),
            // or spuriously: polling again is always allowed.
            park_for(WaitReason::Future, None);
        }
    })
}

/// A waker whose data is a `Fiber` handle, its count included.
fn fiber_waker(fiber: Fiber) -> Waker {
    // SAFETY: the data pointer is a `Fiber`'s from `into_raw`, and the vtable's functions
    // keep its count balanced: `clone` makes a new count, `wake` and `drop` give theirs back,
    // `wake_by_ref` only borrows. `Fiber` is `Send + Sync`, as a waker must be.
    unsafe { Waker::from_raw(RawWaker::new(fiber.into_raw(), &FIBER_WAKER)) }
}

static FIBER_WAKER: RawWakerVTable =
    RawWakerVTable::new(waker_clone, waker_wake, waker_wake_by_ref, waker_drop);

/// Borrows the `Fiber` behind a waker's data without taking its count.
fn with_fiber<R>(data: *const (), f: impl FnOnce(&Fiber) -> R) -> R {
    // SAFETY: `data` is a live waker's, so it holds a count that outlives this call;
    // `ManuallyDrop` keeps this borrowed handle from giving it back.
    let fiber = std::mem::ManuallyDrop::new(unsafe { Fiber::from_raw(data) });
    f(&fiber)
}

fn waker_clone(data: *const ()) -> RawWaker {
    RawWaker::new(with_fiber(data, |f| f.clone().into_raw()), &FIBER_WAKER)
}

fn waker_wake(data: *const ()) {
    // SAFETY: `wake` consumes the waker: its count is ours to give back, once.
    unsafe { Fiber::from_raw(data) }.unpark();
}

fn waker_wake_by_ref(data: *const ()) {
    with_fiber(data, Fiber::unpark);
}

fn waker_drop(data: *const ()) {
    // SAFETY: the waker is dropped: its count is ours to give back, once.
    drop(unsafe { Fiber::from_raw(data) });
}

/// The future of a fiber's [`JoinHandle`]: resolves to what [`JoinHandle::join`] returns.
/// `Send`, so a tokio task can await it.
///
/// ```
/// use virtual_threads as vt;
///
/// let fiber = vt::spawn(|| 6 * 7);
/// let answer = vt::future::block_on(async move { fiber.await.unwrap() });
/// assert_eq!(answer, 42);
/// ```
#[must_use = "futures do nothing unless polled"]
pub struct JoinFuture<T> {
    state: JoinState<T>,
}

enum JoinState<T> {
    /// Not polled yet, or the fiber had not finished at the last poll and no joiner runs.
    Handle(JoinHandle<T>),
    /// A joiner fiber waits for the fiber and hands the result over here.
    Waiting(Arc<Mutex<Slot<T>>>),
    /// The output was returned.
    Done,
}

/// Where the joiner fiber leaves the result, and the waker of the task that waits for it.
struct Slot<T> {
    result: Option<thread::Result<T>>,
    waker: Option<Waker>,
}

/// Owned by the joiner fiber: delivers the result, or, if the fiber is dropped unrun (its
/// runtime went away), an error, and wakes the waiting task either way.
struct Deliver<T>(Option<Arc<Mutex<Slot<T>>>>);

impl<T> Deliver<T> {
    fn put(mut self, result: thread::Result<T>) {
        if let Some(slot) = self.0.take() {
            deliver(&slot, result);
        }
    }
}

impl<T> Drop for Deliver<T> {
    fn drop(&mut self) {
        if let Some(slot) = self.0.take() {
            deliver(&slot, Err(Box::new("the fiber's runtime was dropped before it could be joined")));
        }
    }
}

fn deliver<T>(slot: &Mutex<Slot<T>>, result: thread::Result<T>) {
    let waker = {
        let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
        slot.result = Some(result);
        slot.waker.take()
    };
    if let Some(w) = waker {
        w.wake();
    }
}

impl<T: Send + 'static> IntoFuture for JoinHandle<T> {
    type Output = thread::Result<T>;
    type IntoFuture = JoinFuture<T>;

    fn into_future(self) -> JoinFuture<T> {
        JoinFuture { state: JoinState::Handle(self) }
    }
}

impl<T: Send + 'static> Future for JoinFuture<T> {
    type Output = thread::Result<T>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<thread::Result<T>> {
        match std::mem::replace(&mut self.state, JoinState::Done) {
            JoinState::Handle(h) if h.is_finished() => Poll::Ready(h.join()), // does not wait
            JoinState::Handle(h) => {
                let slot = Arc::new(Mutex::new(Slot { result: None, waker: Some(cx.waker().clone()) }));
                let deliver = Deliver(Some(slot.clone()));
                let rt = h.fiber().record().expect("a join handle refers to a fiber").runtime().clone();
                let joiner = move || deliver.put(h.join());
                // SAFETY: the closure and its result are 'static: nothing borrowed can dangle.
                let spawned = unsafe {
                    crate::runtime::spawn::Builder::new().spawn_unchecked_at(
                        &rt,
                        joiner,
                        Location::caller(),
                        None,
                    )
                };
                match spawned {
                    // Detached: it hands its result over through the slot.
                    Ok(_) => {
                        self.state = JoinState::Waiting(slot);
                        Poll::Pending
                    }
                    Err(e) => panic!("failed to spawn the fiber that joins an awaited fiber: {e}"),
                }
            }
            JoinState::Waiting(slot) => {
                let mut s = slot.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(result) = s.result.take() {
                    return Poll::Ready(result);
                }
                if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    s.waker = Some(cx.waker().clone());
                }
                drop(s);
                self.state = JoinState::Waiting(slot);
                Poll::Pending
            }
            JoinState::Done => panic!("a JoinFuture polled after it returned its output"),
        }
    }
}

impl<T> std::fmt::Debug for JoinFuture<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            JoinState::Handle(_) => "not waiting",
            JoinState::Waiting(_) => "waiting",
            JoinState::Done => "done",
        };
        f.debug_struct("JoinFuture").field("state", &state).finish()
    }
}
