//! Why a fiber is parked (`WaitReason`, the byte a dump reads from its record) and the count of
//! plain threads inside a `vt` call (`PlainCall`), which the deadlock report reads. Both are
//! written where a fiber or thread parks, so they live with parking, below the scheduler; the
//! reports that read them are `scheduler/diagnostics.rs` (`arch/diagnostics.md`).

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What a parked fiber waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
#[repr(u8)]
pub enum WaitReason {
    /// [`park`](crate::park) or [`park_timeout`](crate::park_timeout), called directly.
    Park = 1,
    /// [`sleep`](crate::sleep) or [`sleep_until`](crate::sleep_until).
    Sleep,
    /// [`JoinHandle::join`](crate::JoinHandle::join) (also `block_on` from a fiber).
    Join,
    /// The end of a [`scope`](crate::scope), waiting for its fibers.
    Scope,
    /// [`sync::Mutex::lock`](crate::sync::Mutex::lock).
    Mutex,
    /// [`sync::RwLock::read`](crate::sync::RwLock::read).
    RwLockRead,
    /// [`sync::RwLock::write`](crate::sync::RwLock::write).
    RwLockWrite,
    /// [`sync::Condvar`](crate::sync::Condvar)'s waits.
    Condvar,
    /// [`sync::Semaphore`](crate::sync::Semaphore)'s acquires.
    Semaphore,
    /// [`sync::Barrier::wait`](crate::sync::Barrier::wait).
    Barrier,
    /// [`sync::WaitGroup::wait`](crate::sync::WaitGroup::wait).
    WaitGroup,
    /// [`sync::OnceLock`](crate::sync::OnceLock), waiting for another caller's initialiser.
    Once,
    /// A channel send waiting for room or for a receiver.
    ChannelSend,
    /// A channel receive waiting for a message.
    ChannelRecv,
    /// [`select!`](crate::select) waiting on several channel operations.
    Select,
    /// A socket read or accept (`vt::net`) waiting for readiness.
    NetRead,
    /// A socket write or connect (`vt::net`) waiting for readiness.
    NetWrite,
    /// A [`ThreadPool`](crate::ThreadPool) job waiting for a free slot.
    PoolSlot,
    /// [`ThreadPool::join`](crate::ThreadPool::join) or the end of a pool scope.
    PoolJoin,
    /// [`future::block_on`](crate::future::block_on), waiting for a future's waker.
    Future,
    /// [`signal::wait_for`](crate::signal::wait_for) or [`signal::ctrl_c`](crate::signal::ctrl_c).
    Signal,
    /// [`blocking`](crate::blocking), its closure running on a helper thread.
    Blocking,
    /// A libc sleep (`nanosleep`, so `std::thread::sleep`; `clock_nanosleep`, `usleep`,
    /// `sleep`) interposed by the `hooks` feature.
    HookedSleep,
    /// A futex wait (`syscall(SYS_futex)`, so std's `Mutex`, `RwLock`, `Condvar`, `Once`,
    /// `mpsc` and `thread::park`) interposed by the `hooks` feature.
    HookedFutex,
    /// A socket or pipe call (`read`, `recv`, `accept`, `poll`, `epoll_wait`, ...) interposed
    /// by the `hooks` feature, waiting for its descriptor to be readable.
    HookedRead,
    /// The same for writability (`write`, `send`, `connect`, ...).
    HookedWrite,
}

const REASONS: [WaitReason; 26] = [
    WaitReason::Park,
    WaitReason::Sleep,
    WaitReason::Join,
    WaitReason::Scope,
    WaitReason::Mutex,
    WaitReason::RwLockRead,
    WaitReason::RwLockWrite,
    WaitReason::Condvar,
    WaitReason::Semaphore,
    WaitReason::Barrier,
    WaitReason::WaitGroup,
    WaitReason::Once,
    WaitReason::ChannelSend,
    WaitReason::ChannelRecv,
    WaitReason::Select,
    WaitReason::NetRead,
    WaitReason::NetWrite,
    WaitReason::PoolSlot,
    WaitReason::PoolJoin,
    WaitReason::Future,
    WaitReason::Signal,
    WaitReason::Blocking,
    WaitReason::HookedSleep,
    WaitReason::HookedFutex,
    WaitReason::HookedRead,
    WaitReason::HookedWrite,
];

/// In a record's `wait` byte: the park has a deadline (a timer will wake it).
pub(crate) const WAIT_TIMED: u8 = 0x80;
/// In a record's `wait` byte: the fiber waits while it unwinds from a panic, on its carrier's
/// thread without switching out (`park::park_unwinding`): the carrier is held, and the fibers at
/// home there cannot run until the wait ends. For the "blocked" report's advice.
pub(crate) const WAIT_UNWINDING: u8 = 0x40;

impl WaitReason {
    pub(crate) fn code(self) -> u8 {
        self as u8
    }

    pub(crate) fn from_code(code: u8) -> WaitReason {
        let i = (code & !(WAIT_TIMED | WAIT_UNWINDING)) as usize;
        // 0 (never parked through a reason) reads as a plain park.
        REASONS.get(i.wrapping_sub(1)).copied().unwrap_or(WaitReason::Park)
    }

    /// Whether only a finishing fiber can end this wait (a plain thread waiting so is not a
    /// potential waker for the deadlock report).
    pub(crate) fn waits_for_fibers(self) -> bool {
        matches!(self, WaitReason::Join | WaitReason::PoolJoin | WaitReason::Scope)
    }

    /// Whether something outside the runtime's view (a peer on the network, another runtime
    /// holding a future's waker, a signal, a helper thread running a `blocking` closure) can
    /// end this wait.
    pub(crate) fn is_io(self) -> bool {
        matches!(
            self,
            WaitReason::NetRead
                | WaitReason::NetWrite
                | WaitReason::Future
                | WaitReason::Signal
                | WaitReason::Blocking
                | WaitReason::HookedRead
                | WaitReason::HookedWrite
        )
    }
}

impl fmt::Display for WaitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WaitReason::Park => "park()",
            WaitReason::Sleep => "sleep",
            WaitReason::Join => "join of a fiber",
            WaitReason::Scope => "the fibers of a scope",
            WaitReason::Mutex => "Mutex::lock",
            WaitReason::RwLockRead => "RwLock::read",
            WaitReason::RwLockWrite => "RwLock::write",
            WaitReason::Condvar => "Condvar::wait",
            WaitReason::Semaphore => "Semaphore::acquire",
            WaitReason::Barrier => "Barrier::wait",
            WaitReason::WaitGroup => "WaitGroup::wait",
            WaitReason::Once => "OnceLock initialisation",
            WaitReason::ChannelSend => "channel send",
            WaitReason::ChannelRecv => "channel receive",
            WaitReason::Select => "select!",
            WaitReason::NetRead => "socket read",
            WaitReason::NetWrite => "socket write",
            WaitReason::PoolSlot => "a ThreadPool slot",
            WaitReason::PoolJoin => "ThreadPool jobs to finish",
            WaitReason::Future => "a future (vt::future::block_on)",
            WaitReason::Signal => "a signal (vt::signal)",
            WaitReason::Blocking => "vt::blocking on a helper thread",
            WaitReason::HookedSleep => "a hooked libc sleep (nanosleep, clock_nanosleep, usleep, sleep)",
            WaitReason::HookedFutex => {
                "a hooked futex wait (a std lock, Condvar, Once, mpsc or park; std's mpsc and \
                 thread::park never wake a fiber from another fiber of its carrier: use vt::channel \
                 and vt::park there, arch/decisions/0011)"
            }
            WaitReason::HookedRead => "a hooked socket or pipe read (read, recv, accept, poll, epoll_wait)",
            WaitReason::HookedWrite => "a hooked socket or pipe write (write, send, connect)",
        })
    }
}

/// Plain (non-carrier) threads inside a `vt` call that may wake a fiber when it returns (a
/// `vt::sync` wait, `vt::sleep`, ...), process-wide. Waiting in `join`/`block_on` is not
/// counted: such a thread only wakes up when a fiber finishes. While it is non-zero no runtime
/// reports a deadlock.
pub(crate) static PLAIN_IN_VT: AtomicUsize = AtomicUsize::new(0);

/// Counts a plain thread inside a `vt` call for as long as it lives.
pub(crate) struct PlainCall(());

impl PlainCall {
    pub(crate) fn enter() -> PlainCall {
        PLAIN_IN_VT.fetch_add(1, Ordering::SeqCst);
        PlainCall(())
    }
}

impl Drop for PlainCall {
    fn drop(&mut self) {
        PLAIN_CALLS.fetch_add(1, Ordering::SeqCst);
        PLAIN_IN_VT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A plain thread made a `vt` call that does not wait (`yield_now`): it is alive and using the
/// runtime, so the deadlock check's quiet period starts again.
pub(crate) fn plain_activity() {
    PLAIN_CALLS.fetch_add(1, Ordering::Relaxed);
}

/// Plain-thread `vt` calls that ended, process-wide: the deadlock check runs again after one.
pub(crate) static PLAIN_CALLS: AtomicUsize = AtomicUsize::new(0);
