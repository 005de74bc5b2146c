//! Futexes: `syscall(SYS_futex, ...)`, which std's `Mutex`, `RwLock`, `Condvar`, `Once`,
//! `OnceLock`, `Barrier`, `mpsc` and `thread::park` all wait in. `FUTEX_WAIT` and
//! `FUTEX_WAIT_BITSET` from a fiber park it in the table of fiber waiters (`table.rs`);
//! `FUTEX_WAKE` and `FUTEX_WAKE_BITSET` from anyone wake fiber waiters first, then pass the
//! rest of the count to the kernel for threads. Every other system call, and every other futex
//! operation (requeue, wake-op, PI, `futex_waitv`), passes straight through.
//!
//! Private and shared futexes are both waited on in the table. A shared one may be woken from
//! another process, whose wake only the kernel sees: a fiber's wait on one ends every
//! `SHARED_RECHECK` as a spurious wake-up (which futex callers handle by looking at the word
//! again), so such a wake is late, never lost.

use std::ffi::{c_int, c_long};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::real::{self, set_errno};
use super::table::{Parked, Table, Waited, Waiter};
use super::{Gate, gate, parking};
use crate::fiber::cancel::uncancellable;
use crate::fiber::compact::Lent;
use crate::fiber::context;
use crate::fiber::handle::current;
use crate::fiber::park::park_for;
use crate::fiber::wait::WaitReason;

const FUTEX_WAIT: c_int = 0;
const FUTEX_WAKE: c_int = 1;
const FUTEX_WAIT_BITSET: c_int = 9;
const FUTEX_WAKE_BITSET: c_int = 10;
const FUTEX_PRIVATE_FLAG: c_int = 128;
const FUTEX_CLOCK_REALTIME: c_int = 256;

/// How often a fiber waiting on a shared futex looks again, for wakes from other processes.
const SHARED_RECHECK: Duration = Duration::from_millis(10);

static TABLE: Table = Table::new();

/// Empties the table in the child of a `fork`: its waiters are fibers of the parent's runtimes,
/// which never run in the child (`Table::forget_all_after_fork`).
///
/// # Safety
/// Only from a `pthread_atfork` child handler (the child's only thread, before its code runs).
pub(super) unsafe fn forget_waiters_after_fork() {
    // SAFETY: the caller's contract is the table's.
    unsafe { TABLE.forget_all_after_fork() }
}

/// Interposes `syscall(2)`: futex waits and wakes as the module doc says; the rest passes
/// through with its six arguments.
///
/// `syscall` is variadic; on the Linux targets this crate builds for (x86-64 SysV, AAPCS64 and
/// the other LP64 ABIs corosensei supports) integer variadic arguments travel as named ones do,
/// so reading seven `long`s gets the caller's arguments, and garbage in those it did not pass,
/// which only a system call that does not read them receives (`arch/hooks.md`).
///
/// # Safety
/// As for `syscall(2)` with the caller's arguments.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn syscall(
    n: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    if n == libc::SYS_futex {
        // SAFETY: the caller's futex arguments, as `syscall(2)` would pass them.
        if let Some(r) = unsafe { futex(a1 as usize, a2 as c_int, a3 as u32, a4, a5, a6 as u32) } {
            return r;
        }
    }
    // SAFETY: the caller's arguments, as they came.
    unsafe { real::syscall(n, [a1, a2, a3, a4, a5, a6]) }
}

/// A futex call handled here, or `None` to pass it through unchanged.
///
/// # Safety
/// `uaddr` and `timeout` are what the caller gave `futex(2)`.
unsafe fn futex(
    uaddr: usize,
    op: c_int,
    val: u32,
    timeout: c_long,
    uaddr2: c_long,
    val3: u32,
) -> Option<c_long> {
    let cmd = op & !(FUTEX_PRIVATE_FLAG | FUTEX_CLOCK_REALTIME);
    match cmd {
        FUTEX_WAKE | FUTEX_WAKE_BITSET => {
            let bitset = if cmd == FUTEX_WAKE { u32::MAX } else { val3 };
            let n = val as c_int;
            if bitset == 0 || n <= 0 {
                return None; // the kernel's answer: EINVAL, or nobody to wake
            }
            let fibers = TABLE.wake(uaddr, bitset, n as usize)?;
            if fibers == n as usize {
                return Some(fibers as c_long);
            }
            let rest = [
                uaddr as c_long,
                op as c_long,
                (n as usize - fibers) as c_long,
                timeout,
                uaddr2,
                val3 as c_long,
            ];
            // SAFETY: the caller's wake, for the count the fibers left.
            let threads = unsafe { real::syscall(libc::SYS_futex, rest) };
            Some(if threads < 0 {
                if fibers > 0 { fibers as c_long } else { threads }
            } else {
                fibers as c_long + threads
            })
        }
        FUTEX_WAIT | FUTEX_WAIT_BITSET => {
            let bitset = if cmd == FUTEX_WAIT { u32::MAX } else { val3 };
            if bitset == 0 || uaddr == 0 || uaddr % 4 != 0 {
                return None; // EINVAL or EFAULT, as the kernel says
            }
            let cancelling = match gate() {
                Gate::Pass => return None,
                Gate::Park => false,
                Gate::Cancelling => true,
            };
            // SAFETY: the caller's timeout pointer.
            let deadline = match unsafe { deadline(cmd, op, timeout) } {
                Ok(d) => d,
                Err(()) => return None, // an invalid timeout: EINVAL from the kernel
            };
            // Uncancellable: a cancelled fiber is stopped by an unwind, which must not cross
            // the C caller's frames, and std's lock waits cannot fail; the fiber is stopped at
            // its next wait in Rust code once this one returns (`arch/hooks.md`).
            // SAFETY: the caller gave a 4-aligned, non-null futex word.
            Some(uncancellable(|| unsafe { wait(uaddr, op, val, bitset, deadline, cancelling) }))
        }
        _ => None,
    }
}

/// The absolute deadline of a wait: `FUTEX_WAIT`'s timeout is relative, `FUTEX_WAIT_BITSET`'s
/// absolute on the monotonic clock (the realtime one with `FUTEX_CLOCK_REALTIME`, converted at
/// the start of the wait). `Err` for a timeout the kernel refuses.
///
/// # Safety
/// `timeout` is null or points to a `timespec`.
unsafe fn deadline(cmd: c_int, op: c_int, timeout: c_long) -> Result<Option<Instant>, ()> {
    let ts = timeout as *const libc::timespec;
    if ts.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's timespec; a bad non-null pointer faults as in libc's own use.
    let ts = unsafe { ts.read() };
    if ts.tv_sec < 0 || !(0..1_000_000_000).contains(&ts.tv_nsec) {
        return Err(());
    }
    let d = Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
    let now = Instant::now();
    if cmd == FUTEX_WAIT {
        return Ok(now.checked_add(d));
    }
    let clock = if op & FUTEX_CLOCK_REALTIME != 0 { libc::CLOCK_REALTIME } else { libc::CLOCK_MONOTONIC };
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid, writable timespec.
    unsafe { libc::clock_gettime(clock, &mut t) };
    let clock_now = Duration::new(t.tv_sec as u64, t.tv_nsec as u32);
    Ok(now.checked_add(d.saturating_sub(clock_now)))
}

/// A fiber's futex wait: 0 when woken (or spuriously), -1 with `errno` `EAGAIN` (the word had
/// changed), `ETIMEDOUT` or `EINTR` (the runtime's drop is unwinding the fiber).
///
/// # Safety
/// `uaddr` is a 4-aligned futex word the caller may read.
unsafe fn wait(
    uaddr: usize,
    op: c_int,
    val: u32,
    bitset: u32,
    deadline: Option<Instant>,
    cancelling: bool,
) -> c_long {
    let saved = real::errno();
    if cancelling {
        // The runtime's drop unwinds this fiber: nothing will wake it through the table. The
        // park unwinds another fiber (perhaps the one whose release this waits for) and
        // returns; the caller looks at its word again.
        let _ = parking(|| park_for(WaitReason::HookedFutex, deadline));
        set_errno(libc::EINTR);
        return -1;
    }
    let recheck = (op & FUTEX_PRIVATE_FLAG == 0).then(|| Instant::now() + SHARED_RECHECK);
    let until = match (deadline, recheck) {
        (Some(d), Some(r)) => Some(d.min(r)),
        (d, r) => d.or(r),
    };
    // SAFETY: the caller's word, 4-aligned and readable; the kernel reads it as a u32 too.
    let word = unsafe { &*(uaddr as *const AtomicU32) };
    // The waiter lives in this frame while it is queued: the stack is lent meanwhile, so
    // compaction does not move it out from under a waker.
    let _lent = Lent::new();
    let waiter = Waiter::new(uaddr, bitset, current());
    let mut stray = false;
    let mut unwound = false;
    let waited = TABLE.wait(
        &waiter,
        || word.load(Ordering::SeqCst) == val,
        || {
            if parking(|| park_for(WaitReason::HookedFutex, until)).is_none() {
                unwound = true;
                return Parked::Stop;
            }
            if until.is_some_and(|u| Instant::now() >= u) || !context::cancelling().is_null() {
                return Parked::Stop;
            }
            // Perhaps someone's unpark of the fiber, which its next `vt::park` must still see,
            // not this futex's wake (the table decides under the lock next). The token holds
            // one unpark, so one that came with the wake cannot be told from the wake's own:
            // the token goes back even after a wake, and the next park may return spuriously.
            stray = true;
            Parked::Again
        },
    );
    if stray {
        current().unpark();
    }
    let (ret, errno) = match waited {
        None => {
            // This thread holds the bucket: a signal handler's wait. Block it for real.
            let a = [uaddr as c_long, op as c_long, val as c_long, 0, 0, bitset as c_long];
            // SAFETY: the caller's wait, untimed.
            return unsafe { real::syscall(libc::SYS_futex, a) };
        }
        Some(Waited::Woken) => (0, saved),
        Some(Waited::Changed) => (-1, libc::EAGAIN),
        Some(Waited::Stopped) if unwound || !context::cancelling().is_null() => (-1, libc::EINTR),
        Some(Waited::Stopped) if deadline.is_some_and(|d| Instant::now() >= d) => (-1, libc::ETIMEDOUT),
        // The shared futex's look again: a spurious wake-up.
        Some(Waited::Stopped) => (0, saved),
    };
    set_errno(errno);
    ret
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fork while another thread holds a bucket of the table (inside a wake's or a wait's
    /// few instructions under the lock): the child has no such thread, and its first wake on
    /// that bucket would spin for ever had the child handler not freed the locks.
    #[test]
    fn a_bucket_held_at_a_fork_is_free_in_the_child() {
        static WORD: AtomicU32 = AtomicU32::new(0);
        let addr = WORD.as_ptr() as usize;
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            TABLE.with_bucket_held(addr, || {
                held_tx.send(()).unwrap();
                // Bounded: a fork handler of the parent's side that wakes through this bucket
                // (a contended unlock of a lock whose address shares it) waits for this hold,
                // and `fork` returns only after it.
                go_rx.recv_timeout(Duration::from_secs(10)).is_ok()
            })
        });
        held_rx.recv().unwrap();
        // SAFETY: the child makes one wake through the table (no allocation, no lock but the
        // bucket's) and ends with `_exit`.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let woken = TABLE.wake(addr, u32::MAX, 1);
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(if woken == Some(0) { 0 } else { 1 }) };
        }
        assert!(pid > 0, "fork failed");
        // The holder may have given up (and dropped its receiver) if the fork outlasted it.
        let _ = go_tx.send(());
        assert!(holder.join().unwrap(), "the fork outlasted the bucket's hold: nothing was tested");
        let t = Instant::now();
        let mut status = 0;
        // SAFETY: `pid` is this test's child; `status` a valid out-pointer.
        while unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } != pid {
            if t.elapsed() > Duration::from_secs(20) {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                // SAFETY: as above; reaps the killed child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                panic!("the child's wake on a bucket held at the fork did not return");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
    }
}
