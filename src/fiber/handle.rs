//! The `Fiber` handle (`vt::current`, `JoinHandle::fiber`): a fiber's id, its name and
//! `unpark`, or a plain OS thread's. Unparking a fiber makes it runnable through the scheduler
//! (`schedule.rs`).

use std::fmt;
use std::num::NonZeroU64;
use std::ptr::NonNull;
use std::sync::Arc;

use super::context;
use super::id::{FiberId, next_id};
use super::schedule::{RuntimeRef, Schedule, Wake};
use super::{FiberRecord, FiberRef};

/// `let me: vt::Fiber = vt::current(); tx.send(me.clone())?; vt::park(); // woken by me.unpark()`
///
/// A handle to a fiber (or to a plain OS thread that asked for [`current`]): its id, its name,
/// and [`unpark`](Fiber::unpark). Cheap to clone; `Send + Sync`.
///
/// One word: a fiber's counted record pointer, or (low bit set) an `Arc` of a plain thread's
/// handle and id. A [`JoinHandle`](crate::JoinHandle) holds one, so a spawn returns its handle
/// in a register; as an enum of two words it went through memory, and the caller's 16-byte
/// load of it missed store forwarding on every spawn.
pub struct Fiber {
    tagged: NonNull<()>,
}

/// The low bit of `Fiber::tagged` for a plain thread (records and `Arc`s are 8-aligned).
const THREAD_TAG: usize = 1;

/// What a `Fiber` of a plain thread points to.
struct PlainThread {
    thread: std::thread::Thread,
    id: FiberId,
}

/// A `Fiber` taken apart, borrowed from it.
enum View<'a> {
    Fiber(&'a FiberRef),
    Thread(&'a PlainThread),
}

// SAFETY: both things a `Fiber` can own, a `FiberRef` and an `Arc<PlainThread>`, are `Send`
// and `Sync`; the tag only says which one it is.
unsafe impl Send for Fiber {}
// SAFETY: as above.
unsafe impl Sync for Fiber {}

const _: () = assert!(std::mem::align_of::<FiberRecord>() > THREAD_TAG);
const _: () = assert!(std::mem::align_of::<PlainThread>() > THREAD_TAG);
const _: () = assert!(std::mem::size_of::<Option<Fiber>>() == std::mem::size_of::<usize>());

impl Fiber {
    pub(crate) fn from_record(rec: FiberRef) -> Fiber {
        let p = FiberRef::into_raw(rec);
        // SAFETY: `into_raw` gives the record's pointer, never null.
        Fiber { tagged: unsafe { NonNull::new_unchecked(p.cast()) } }
    }

    /// Gives up the handle as one pointer, its count included (a waker's data: `future.rs`).
    pub(crate) fn into_raw(self) -> *const () {
        std::mem::ManuallyDrop::new(self).tagged.as_ptr()
    }

    /// Takes back a handle given up by [`Fiber::into_raw`].
    ///
    /// # Safety
    /// `p` comes from `into_raw`, and each such pointer is taken back once.
    pub(crate) unsafe fn from_raw(p: *const ()) -> Fiber {
        // SAFETY: `into_raw` gave the non-null `tagged` pointer, with the count it owns.
        Fiber { tagged: unsafe { NonNull::new_unchecked(p.cast_mut()) } }
    }

    fn from_thread(thread: std::thread::Thread, id: FiberId) -> Fiber {
        let p = Arc::into_raw(Arc::new(PlainThread { thread, id })).cast_mut();
        // SAFETY: an `Arc`'s pointer is non-null and 8-aligned, so the tagged one is non-null.
        Fiber { tagged: unsafe { NonNull::new_unchecked(p.map_addr(|a| a | THREAD_TAG).cast()) } }
    }

    fn view(&self) -> View<'_> {
        let p = self.tagged.as_ptr();
        if p.addr() & THREAD_TAG == 0 {
            // SAFETY: untagged: a fiber's handle.
            View::Fiber(unsafe { self.record_unchecked() })
        } else {
            // SAFETY: tagged, it is `Arc::into_raw` of a `PlainThread` this handle owns.
            View::Thread(unsafe { &*p.map_addr(|a| a & !THREAD_TAG).cast::<PlainThread>() })
        }
    }

    /// This fiber's id.
    pub fn id(&self) -> FiberId {
        match self.view() {
            View::Fiber(r) => r.id(),
            View::Thread(t) => t.id,
        }
    }

    /// The name given by [`Builder::name`](crate::Builder::name), or the thread's name.
    pub fn name(&self) -> Option<&str> {
        match self.view() {
            View::Fiber(r) => r.name(),
            View::Thread(t) => t.thread.name(),
        }
    }

    /// Makes the fiber's token available: if it is parked it becomes runnable, otherwise its
    /// next `park` returns at once. Called from a fiber, the woken fiber runs next on the
    /// caller's carrier (a direct hand-off that keeps caches warm).
    pub fn unpark(&self) {
        match self.view() {
            View::Fiber(r) => unpark_record(r),
            View::Thread(t) => t.thread.unpark(),
        }
    }

    /// Wakes a fiber waiting in `join` for a fiber that just finished: it goes to the back of
    /// the run queue, not into the LIFO slot (see `Wake::Joiner`).
    pub(crate) fn unpark_joiner(&self) {
        match self.view() {
            View::Fiber(r) => wake_record(r, Wake::Joiner),
            View::Thread(t) => t.thread.unpark(),
        }
    }

    /// Whether this handle is for the fiber running this code. The handle counts its record,
    /// so an equal pointer cannot be another fiber that reuses the record. (Not under loom,
    /// whose waiters are loom threads: `sync/wait_list.rs`.)
    #[cfg(not(loom))]
    pub(crate) fn is_running_fiber(&self) -> bool {
        match self.view() {
            View::Fiber(r) => std::ptr::eq(FiberRef::as_ptr(r), context::current_fiber()),
            View::Thread(_) => false,
        }
    }

    pub(crate) fn record(&self) -> Option<&FiberRef> {
        match self.view() {
            View::Fiber(r) => Some(r),
            View::Thread(_) => None,
        }
    }

    /// The record of a handle known to be a fiber's (a join handle's), without the tag's test.
    ///
    /// # Safety
    /// The handle was made by `from_record`, or is a clone of one.
    #[inline(always)]
    pub(crate) unsafe fn record_unchecked(&self) -> &FiberRef {
        debug_assert_eq!(self.tagged.as_ptr().addr() & THREAD_TAG, 0);
        // SAFETY: untagged (the caller's contract), `tagged` is the pointer of a `FiberRef`
        // this handle owns, and `FiberRef` is a transparent wrapper of that pointer.
        unsafe { &*(&self.tagged as *const NonNull<()>).cast::<FiberRef>() }
    }

    /// The counted reference of a handle known to be a fiber's, given up to the caller, who
    /// then drops it without the tag's test and the call of this type's `drop`.
    ///
    /// # Safety
    /// As for `record_unchecked`.
    #[inline(always)]
    pub(crate) unsafe fn into_record_unchecked(self) -> FiberRef {
        debug_assert_eq!(self.tagged.as_ptr().addr() & THREAD_TAG, 0);
        let p = std::mem::ManuallyDrop::new(self).tagged.cast::<FiberRecord>();
        FiberRef(p)
    }
}

impl Clone for Fiber {
    fn clone(&self) -> Fiber {
        match self.view() {
            View::Fiber(r) => Fiber::from_record(r.clone()),
            View::Thread(_) => {
                let p = self.tagged.as_ptr().map_addr(|a| a & !THREAD_TAG).cast::<PlainThread>();
                // SAFETY: `p` is a live `Arc<PlainThread>`'s pointer (this handle owns a count).
                unsafe { Arc::increment_strong_count(p) };
                Fiber { tagged: self.tagged }
            }
        }
    }
}

impl Drop for Fiber {
    fn drop(&mut self) {
        let p = self.tagged.as_ptr();
        if p.addr() & THREAD_TAG == 0 {
            // SAFETY: the `FiberRef` this handle owns, given up by `from_record`; taken back once.
            drop(unsafe { FiberRef::from_raw(p.cast()) });
        } else {
            // SAFETY: the `Arc` count this handle owns (`from_thread`, `clone`); given up once.
            drop(unsafe { Arc::from_raw(p.map_addr(|a| a & !THREAD_TAG).cast::<PlainThread>()) });
        }
    }
}

impl fmt::Debug for Fiber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fiber").field("id", &self.id()).field("name", &self.name()).finish()
    }
}

pub(crate) fn unpark_record(r: &FiberRef) {
    wake_record(r, Wake::Unpark);
}

fn wake_record(r: &FiberRef, wake: Wake) {
    if r.notify() {
        // SAFETY: `notify` returned true: we moved the fiber from parked to runnable.
        let run = unsafe { FiberRef::take_parked_ref(r) };
        RuntimeRef::schedule(run, wake);
    }
}

/// `let name = vt::current().name().map(str::to_owned);`
///
/// The calling fiber, or the calling thread when it is not a fiber. Inside a fiber,
/// `std::thread::current()` is the carrier thread that runs it (its name is the carrier's, such
/// as `vt-carrier-0`); this is the fiber, with the name given to `vt::Builder::name` or
/// `ThreadPool::with_name`.
pub fn current() -> Fiber {
    let rec = context::current_fiber();
    if rec.is_null() {
        let id = context::with_plain(|p| {
            if p.id == 0 {
                p.id = next_id(&mut p.ids).as_u64();
            }
            p.id
        });
        let id = FiberId(NonZeroU64::new(id).expect("ids start at 1"));
        return Fiber::from_thread(std::thread::current(), id);
    }
    // SAFETY: `current_fiber` returned the record of the fiber running on this thread; the
    // carrier holds a reference to it while the fiber runs, so it is live.
    let rec = unsafe { FiberRef::clone_from_ptr(rec) };
    Fiber::from_record(rec)
}
