//! Sleeps: `nanosleep` (std's `thread::sleep`), `clock_nanosleep` relative and absolute,
//! `usleep` and `sleep` park the calling fiber on its carrier's timers. A fiber is not
//! interrupted by signals, so a parked sleep never ends early with `EINTR` and leaves `rem`
//! alone. Invalid arguments (a null or out-of-range `timespec`, a clock that cannot sleep) go to
//! the real call, which fails as the kernel does.

use std::ffi::{c_int, c_uint};
use std::time::Duration;

use super::real::{self, SavedErrno};
use super::{Gate, gate, parking};
use crate::fiber::sleep::sleep_because;
use crate::fiber::wait::WaitReason;

/// A valid `timespec` as a duration, or `None` for one the kernel would refuse (`EINVAL`,
/// `EFAULT`): those go to the real call, which says so.
fn duration(ts: *const libc::timespec) -> Option<Duration> {
    if ts.is_null() {
        return None;
    }
    // SAFETY: the caller passed a pointer to a `timespec`; a non-null bad pointer faults here
    // as it would in the C library's own wrapper.
    let ts = unsafe { ts.read() };
    if ts.tv_sec < 0 || !(0..1_000_000_000).contains(&ts.tv_nsec) {
        return None;
    }
    Some(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// The time on `clock` now, or `None` for a clock that cannot be read.
fn now(clock: libc::clockid_t) -> Option<Duration> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable `timespec` (the vDSO's `clock_gettime`, not hooked).
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// Interposes `nanosleep(2)`: std's `thread::sleep` and C's sleeps.
///
/// # Safety
/// As for `nanosleep(2)`: `req` points to a `timespec`, `rem` is null or writable.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn nanosleep(req: *const libc::timespec, rem: *mut libc::timespec) -> c_int {
    match gate() {
        Gate::Pass => {}
        // The runtime's drop unwinds this fiber: the sleep ends at once, as `vt::sleep`'s.
        Gate::Cancelling => return 0,
        Gate::Park => {
            if let Some(d) = duration(req) {
                let _errno = SavedErrno::save();
                parking(|| sleep_because(d, WaitReason::HookedSleep));
                return 0;
            }
        }
    }
    // SAFETY: the caller's arguments, as they came.
    unsafe { real::nanosleep(req, rem) }
}

/// Interposes `clock_nanosleep(2)`: relative sleeps and `TIMER_ABSTIME` deadlines on the
/// realtime, monotonic and boot-time clocks park the fiber; other clocks (CPU-time clocks)
/// pass through.
///
/// # Safety
/// As for `clock_nanosleep(2)`.
#[unsafe(no_mangle)]
pub(super) unsafe extern "C" fn clock_nanosleep(
    clock: libc::clockid_t,
    flags: c_int,
    req: *const libc::timespec,
    rem: *mut libc::timespec,
) -> c_int {
    let sleepable = matches!(clock, libc::CLOCK_REALTIME | libc::CLOCK_MONOTONIC | libc::CLOCK_BOOTTIME);
    let gate = if sleepable && (flags & !libc::TIMER_ABSTIME) == 0 { gate() } else { Gate::Pass };
    if gate != Gate::Pass {
        if let Some(d) = duration(req) {
            if gate == Gate::Cancelling {
                return 0;
            }
            let _errno = SavedErrno::save();
            if flags & libc::TIMER_ABSTIME == 0 {
                parking(|| sleep_because(d, WaitReason::HookedSleep));
                return 0;
            }
            // An absolute deadline on that clock: sleep the distance, then look again (the
            // realtime clock may be set meanwhile; the others only move forward).
            while let Some(now) = now(clock) {
                if now >= d || parking(|| sleep_because(d - now, WaitReason::HookedSleep)).is_none() {
                    return 0;
                }
            }
        }
    }
    // SAFETY: the caller's arguments, as they came.
    unsafe { real::clock_nanosleep(clock, flags, req, rem) }
}

/// Interposes `usleep(3)`; passes through as glibc's own does, to `nanosleep`.
#[unsafe(no_mangle)]
pub(super) extern "C" fn usleep(usec: libc::useconds_t) -> c_int {
    let d = Duration::from_micros(usec.into());
    match gate() {
        Gate::Pass => {}
        Gate::Cancelling => return 0,
        Gate::Park => {
            let _errno = SavedErrno::save();
            parking(|| sleep_because(d, WaitReason::HookedSleep));
            return 0;
        }
    }
    let req = libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as _ };
    // SAFETY: `req` is a valid `timespec`; no remainder asked for.
    unsafe { real::nanosleep(&req, std::ptr::null_mut()) }
}

/// Interposes `sleep(3)`: the seconds left (0, or what a signal left of a plain thread's).
#[unsafe(no_mangle)]
pub(super) extern "C" fn sleep(secs: c_uint) -> c_uint {
    match gate() {
        Gate::Pass => {}
        Gate::Cancelling => return 0,
        Gate::Park => {
            let _errno = SavedErrno::save();
            parking(|| sleep_because(Duration::from_secs(secs.into()), WaitReason::HookedSleep));
            return 0;
        }
    }
    let req = libc::timespec { tv_sec: secs as libc::time_t, tv_nsec: 0 };
    let mut rem = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `req` and `rem` are valid `timespec`s.
    if unsafe { real::nanosleep(&req, &mut rem) } == 0 {
        return 0;
    }
    // Interrupted: the seconds left, rounded to the nearest, as glibc's.
    (rem.tv_sec as c_uint).saturating_add((rem.tv_nsec >= 500_000_000) as c_uint)
}
