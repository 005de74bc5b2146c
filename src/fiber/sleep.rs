//! `sleep` and `sleep_until`: timed parks of the calling fiber (or `std::thread::sleep` on a
//! plain thread). The timer is armed by the park (`park.rs`, through `Schedule::arm_timer`).

use std::time::{Duration, Instant};

use super::context;
use super::park::{park_fiber, park_for, running};
use super::wait::{PlainCall, WaitReason};

/// `vt::sleep(Duration::from_millis(10));`
///
/// Puts the calling fiber to sleep for at least `dur`; its carrier runs other fibers meanwhile.
/// On a plain thread this is `std::thread::sleep`.
pub fn sleep(dur: Duration) {
    let Some(me) = running() else {
        let _call = PlainCall::enter();
        std::thread::sleep(dur);
        return;
    };
    let now = Instant::now();
    let Some(deadline) = now.checked_add(dur) else {
        // "For ever": park until the runtime's drop unwinds this fiber.
        while context::cancelling().is_null() {
            park_for(WaitReason::Sleep, None);
        }
        return;
    };
    if now < deadline {
        // The first park without a second clock read (a read per sleep shows in profiles);
        // if its own timer ended it, the deadline has passed and there is nothing to re-check.
        if park_fiber(me.record(), me.cancelling, WaitReason::Sleep, Some(deadline))
            || !context::cancelling().is_null()
        {
            return;
        }
    }
    sleep_until(deadline);
}

/// `vt::sleep_until(Instant::now() + Duration::from_secs(1));`
///
/// Puts the calling fiber to sleep until `deadline`.
pub fn sleep_until(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        match running() {
            Some(me) => {
                if park_fiber(me.record(), me.cancelling, WaitReason::Sleep, Some(deadline)) {
                    return;
                }
            }
            None => {
                let _call = PlainCall::enter();
                std::thread::sleep(deadline - now);
            }
        }
        if !context::cancelling().is_null() {
            return;
        }
    }
}
