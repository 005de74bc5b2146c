//! The real `Idle` against loom threads that follow the carrier's idle path step for step:
//! `run_loop` → `find_work` (injector and inbox first, then a search permit, then stealing)
//! → `found_work` or `park_idle` (stop searching, register, re-check, park, unregister).
//! A fiber taken from a queue keeps its carrier busy to the end of the model, so work left
//! queued while the other carriers sleep is a deadlock, which loom reports. What each model
//! covers, and what it cannot: `arch/loom.md`.
//!
//! A carrier's thread park is a loom `Notify` per carrier (a token, Acquire/Release, and a
//! possible spurious return, like `std::thread::park`), not loom's thread park: loom 0.7's
//! `unpark` makes a thread blocked on a loom `Mutex` runnable, which then fails loom's
//! "expected to be able to acquire lock" assertion (and loses the token).
use std::cell::Cell;

use loom::sync::Notify;
use loom::thread;

use super::{Idle, Unregister};
use crate::loom::{Arc, AtomicBool, AtomicUsize, Ordering};
use crate::scheduler::queue::run_queue::{self, Local, Remote};

/// Stand-ins for the queues a carrier looks at: its inbox, the injector, other carriers'
/// deques. Each returns whether it handed the caller one fiber.
pub(crate) trait Queues: Send + Sync + 'static {
    /// `find_work` before it asks for a search permit: the inbox, then the injector.
    fn take_unsearched(&self, me: usize) -> bool;
    /// `find_work` with a search permit: steal from another carrier.
    fn steal(&self, me: usize) -> bool;
    /// `work_visible` without its shutdown check; `can_search` is asked only where the
    /// real re-check asks it (before looking at other carriers' deques).
    fn visible(&self, me: usize, can_search: &dyn Fn() -> bool) -> bool;
}

/// What `Shared` holds for the idle protocol.
pub(crate) struct Model<Q> {
    pub(crate) idle: Idle,
    pub(crate) queues: Q,
    /// Each carrier's thread park.
    parkers: Vec<Notify>,
    shutdown: AtomicBool,
    taken: AtomicUsize,
    /// Where the model's main thread waits for the fibers to be taken.
    all_taken: Notify,
}

impl<Q: Queues> Model<Q> {
    /// `Shared::notify`.
    pub(crate) fn notify(&self) {
        if let Some(i) = self.idle.notify_one() {
            self.unpark_carrier(i);
        }
    }

    /// `Shared::unpark_carrier` (without the eventfd wake, which the models leave out).
    pub(crate) fn unpark_carrier(&self, i: usize) {
        self.parkers[i].notify();
    }

    fn park(&self, i: usize) {
        self.parkers[i].wait();
    }
}

/// A carrier's idle path, as in `carrier/search.rs` (one search round instead of `SPIN_ROUNDS`).
struct Carrier<Q> {
    index: usize,
    m: Arc<Model<Q>>,
    searching: Cell<bool>,
}

impl<Q: Queues> Carrier<Q> {
    fn run_loop(&self) {
        let m = &*self.m;
        while !m.shutdown.load(Ordering::Acquire) {
            if self.find_work() {
                self.found_work();
                self.run_fiber();
            } else {
                self.park_idle();
            }
        }
        if self.searching.replace(false) {
            m.idle.stop_search();
        }
    }

    fn find_work(&self) -> bool {
        let m = &*self.m;
        if m.queues.take_unsearched(self.index) {
            return true;
        }
        if !(self.searching.get() || m.idle.try_search()) {
            return false;
        }
        self.searching.set(true);
        m.queues.steal(self.index)
    }

    fn found_work(&self) {
        if self.searching.replace(false) && self.m.idle.stop_search() {
            self.m.notify();
        }
    }

    /// A fiber that keeps this carrier until shutdown: whatever else is queued must be
    /// taken by another carrier, so a sleeper that should have been woken is a deadlock.
    fn run_fiber(&self) {
        let m = &*self.m;
        m.taken.fetch_add(1, Ordering::Release);
        m.all_taken.notify();
        while !m.shutdown.load(Ordering::Acquire) {
            m.park(self.index);
        }
    }

    fn park_idle(&self) {
        let m = &*self.m;
        if self.searching.replace(false) {
            m.idle.stop_search();
        }
        m.idle.register(self.index);
        let visible =
            m.queues.visible(self.index, &|| m.idle.can_search()) || m.shutdown.load(Ordering::SeqCst);
        if !visible {
            m.park(self.index);
        }
        match m.idle.unregister(self.index) {
            Unregister::WasNotified => self.searching.set(true),
            // As in `carrier/search.rs` since `arch/loom.md`'s finding 3: work seen on the re-check is looked for as a searcher, so that taking it
            // from the injector wakes the next carrier (step 3) as stealing it would.
            Unregister::Removed if visible => self.searching.set(m.idle.try_search()),
            Unregister::Removed => {}
        }
    }
}

/// Runs `carriers` idle carriers against `submit` (on the model's main thread), which
/// queues `items` fibers; every one must be taken, each by a different carrier. Then shuts
/// down as `Runtime::drop` does: raise the flag, unpark every carrier, join them.
pub(crate) fn check<Q: Queues>(
    carriers: usize,
    search_cap: usize,
    items: usize,
    queues: impl Fn() -> Q + Sync + Send + 'static,
    submit: impl Fn(&Model<Q>) + Sync + Send + 'static,
) {
    assert!(items <= carriers, "each fiber holds its carrier to the end");
    loom::model(move || {
        let m = Arc::new(Model {
            idle: Idle::new(search_cap),
            queues: queues(),
            parkers: (0..carriers).map(|_| Notify::new()).collect(),
            shutdown: AtomicBool::new(false),
            taken: AtomicUsize::new(0),
            all_taken: Notify::new(),
        });
        let handles: Vec<_> = (0..carriers)
            .map(|index| {
                let m = m.clone();
                thread::spawn(move || Carrier { index, m, searching: Cell::new(false) }.run_loop())
            })
            .collect();
        submit(&m);
        while m.taken.load(Ordering::Acquire) < items {
            m.all_taken.wait();
        }
        m.shutdown.store(true, Ordering::Release);
        for i in 0..carriers {
            m.unpark_carrier(i);
        }
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(m.taken.load(Ordering::Relaxed), items);
    });
}

/// Work only in the submitting carrier's run queue (the real `run_queue`, holding plain
/// numbers): idle carriers get it by stealing.
struct Stealable {
    owner: Local<usize>,
    remote: Remote<usize>,
}

// SAFETY: `owner` is used by the submitting thread alone (the model's main thread, in
// `submit`); the carriers use only `remote`, which is `Sync`.
unsafe impl Sync for Stealable {}

impl Stealable {
    fn new() -> Stealable {
        let (owner, remote) = run_queue::new(4);
        Stealable { owner, remote }
    }

    /// `schedule_spawned`'s push; the model's caller notifies after it.
    fn push(&self) {
        self.owner.push(1).expect("the model queues fewer fibers than the ring holds");
    }
}

impl Queues for Stealable {
    fn take_unsearched(&self, _me: usize) -> bool {
        false
    }

    fn steal(&self, _me: usize) -> bool {
        // The thief's own queue: a limit of one leaves nothing to move into it.
        let (mine, _) = run_queue::new::<usize>(2);
        self.remote.steal_into(&mine, 1).is_some()
    }

    fn visible(&self, _me: usize, can_search: &dyn Fn() -> bool) -> bool {
        can_search() && !self.remote.is_empty()
    }
}

/// A busy carrier spawns (`schedule_spawned`: push, then `notify`); one of
/// two idle carriers must wake and steal it.
#[test]
fn loom_idle_spawn_wakes_a_sleeper() {
    check(
        2,
        3,
        1,
        || Stealable::new(),
        |m| {
            m.queues.push();
            m.notify();
        },
    );
}

/// Two spawns, two idle carriers, and room for only one searcher (a spare carrier beyond
/// the target count shares the target's cap): both fibers must be taken, which needs the
/// last searcher's wake in `found_work` and the re-check that skips other deques while
/// another carrier searches.
#[test]
fn loom_idle_last_searcher_wakes_the_next() {
    check(
        2,
        2,
        2,
        || Stealable::new(),
        |m| {
            for _ in 0..2 {
                m.queues.push();
                m.notify();
            }
        },
    );
}

/// Carrier 0's inbox: the real lock-free `Inbox` (`CarrierSlot::inbox`), holding stand-in
/// fibers.
struct Inbox {
    inbox: crate::scheduler::queue::inbox::Inbox<Box<InboxNode>>,
}

pub(crate) struct InboxNode {
    link: AtomicUsize,
}

impl run_queue::Entry for Box<InboxNode> {
    fn into_word(self) -> usize {
        Box::into_raw(self) as usize
    }

    unsafe fn from_word(word: usize) -> Self {
        // SAFETY: a word from `into_word`, taken back once (caller's contract).
        unsafe { Box::from_raw(word as *mut InboxNode) }
    }
}

impl crate::scheduler::queue::inbox::Linked for Box<InboxNode> {
    unsafe fn link<'a>(word: usize) -> &'a AtomicUsize {
        // SAFETY: a live node's address (caller's contract).
        unsafe { &(*(word as *const InboxNode)).link }
    }
}

impl Queues for Inbox {
    fn take_unsearched(&self, me: usize) -> bool {
        // `Carrier::drain_inbox` then a pop of the home queue: one fiber taken, the rest
        // (none in this model) would wait in the home queue.
        me == 0 && self.inbox.take_all().count() > 0
    }

    fn steal(&self, _me: usize) -> bool {
        false
    }

    fn visible(&self, me: usize, _can_search: &dyn Fn() -> bool) -> bool {
        me == 0 && !self.inbox.is_empty()
    }
}

/// A fiber at home on carrier 0 woken from elsewhere (`push_inbox`: a lock-free push, then
/// `notify_carrier`, which skips the sleepers' lock when nobody sleeps): carrier 0 must wake
/// for it, whatever carrier 1 does.
#[test]
fn loom_idle_inbox_wakes_its_carrier() {
    check(
        2,
        3,
        1,
        || Inbox { inbox: crate::scheduler::queue::inbox::Inbox::new() },
        |m| {
            m.queues.inbox.push(Box::new(InboxNode { link: AtomicUsize::new(0) }));
            if m.idle.notify_carrier(0) {
                m.unpark_carrier(0);
            }
        },
    );
}
