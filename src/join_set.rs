//! `JoinSet`: fibers joined in the order they finish, stopped together (tokio's `JoinSet`).
//!
//! Each fiber's closure is wrapped so that its result, panic or stop goes into one channel the
//! set owns, tagged with the fiber's slot; `join_next` receives from it. A fiber stopped before
//! it ever ran never runs its wrapper, so the wrapper's guard reports it when the closure is
//! dropped. The set keeps a `CancelHandle` per live fiber for `cancel_all` and its drop.
//! Design: `arch/decisions/0004-cancellation.md`.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread;

use crate::channel::{self, Receiver, Sender};
use crate::fiber::cancel::CancelHandle;
use crate::fiber::stop::Cancelled;

type Done<T> = (usize, thread::Result<T>);

/// A set of fibers whose results are taken in the order they finish, like tokio's `JoinSet`.
/// Dropping the set stops the fibers still in it (it does not wait for them; see
/// [`shutdown`](JoinSet::shutdown) for that).
///
/// ```
/// use virtual_threads as vt;
/// use std::time::Duration;
/// let mut set = vt::JoinSet::new();
/// for ms in [30u64, 10, 20] {
///     set.spawn(move || {
///         vt::sleep(Duration::from_millis(ms));
///         ms
///     });
/// }
/// // Results come as the fibers finish (on a quiet machine: 10, 20, 30).
/// let mut all = Vec::new();
/// while let Some(r) = set.join_next() {
///     all.push(r.unwrap());
/// }
/// all.sort();
/// assert_eq!(all, [10, 20, 30]);
/// // Dropping a set stops what is still in it.
/// let mut set = vt::JoinSet::new();
/// let forever = set.spawn(|| vt::sleep(Duration::from_secs(3600)));
/// drop(set);
/// while !forever.is_finished() {
///     vt::yield_now();
/// }
/// ```
pub struct JoinSet<T> {
    tx: Sender<Done<T>>,
    rx: Receiver<Done<T>>,
    /// One slot per fiber not yet joined; freed slots are reused.
    fibers: Vec<Option<CancelHandle>>,
    free: Vec<usize>,
    live: usize,
}

/// Sends the fiber's outcome when dropped: `Cancelled` unless the wrapper set it.
struct Report<T> {
    tx: Sender<Done<T>>,
    slot: usize,
    outcome: Option<thread::Result<T>>,
}

impl<T> Drop for Report<T> {
    fn drop(&mut self) {
        let outcome = self.outcome.take().unwrap_or_else(|| Err(Box::new(Cancelled)));
        // The set may be gone: then nobody wants it.
        let _ = self.tx.send((self.slot, outcome));
    }
}

impl<T: Send + 'static> JoinSet<T> {
    /// An empty set.
    pub fn new() -> JoinSet<T> {
        let (tx, rx) = channel::unbounded();
        JoinSet { tx, rx, fibers: Vec::new(), free: Vec::new(), live: 0 }
    }

    /// Spawns `f` as a fiber of the set (on the current runtime, as [`spawn`](crate::spawn)).
    /// The handle stops that one fiber.
    #[track_caller]
    pub fn spawn<F>(&mut self, f: F) -> CancelHandle
    where
        F: FnOnce() -> T + Send + 'static,
    {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.fibers.push(None);
            self.fibers.len() - 1
        });
        let mut report = Report { tx: self.tx.clone(), slot, outcome: None };
        let h = crate::runtime::spawn::spawn(move || {
            report.outcome = Some(catch_unwind(AssertUnwindSafe(f)));
            drop(report);
        });
        let c = h.cancel_handle();
        self.fibers[slot] = Some(c.clone());
        self.live += 1;
        c
    }

    /// Waits for the next fiber of the set to finish and returns its result (`Err` holds its
    /// panic's payload, or [`Cancelled`] if it was stopped), in the order they finish; `None`
    /// once the set is empty.
    pub fn join_next(&mut self) -> Option<thread::Result<T>> {
        if self.live == 0 {
            return None;
        }
        let (slot, r) = self.rx.recv().expect("the set holds a sender");
        Some(self.joined(slot, r))
    }

    /// As [`join_next`](Self::join_next), without waiting: `None` if no fiber has finished yet.
    pub fn try_join_next(&mut self) -> Option<thread::Result<T>> {
        let (slot, r) = self.rx.try_recv().ok()?;
        Some(self.joined(slot, r))
    }

    fn joined(&mut self, slot: usize, r: thread::Result<T>) -> thread::Result<T> {
        self.fibers[slot] = None;
        self.free.push(slot);
        self.live -= 1;
        r
    }

    /// Stops every fiber of the set and waits until all have finished, dropping their results.
    pub fn shutdown(&mut self) {
        self.cancel_all();
        while self.join_next().is_some() {}
    }
}

impl<T> JoinSet<T> {
    /// How many fibers are in the set (spawned and not yet joined).
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether the set holds no fiber.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Stops every fiber in the set ([`CancelHandle::cancel`]); they stay in the set, and
    /// `join_next` returns their outcomes ([`Cancelled`] for those stopped before they finished).
    pub fn cancel_all(&self) {
        for c in self.fibers.iter().flatten() {
            c.cancel();
        }
    }
}

impl<T: Send + 'static> Default for JoinSet<T> {
    fn default() -> JoinSet<T> {
        JoinSet::new()
    }
}

impl<T> Drop for JoinSet<T> {
    fn drop(&mut self) {
        self.cancel_all();
    }
}

impl<T> fmt::Debug for JoinSet<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinSet").field("len", &self.live).finish()
    }
}
