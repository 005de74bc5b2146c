//! The stack pools' scavenge, on the supervisor's schedule: every `SCAVENGE_EVERY`, the pages
//! of stacks that sat unused in a pool since the last one go back to the kernel
//! (`SizeClass::scavenge`).

use std::time::{Duration, Instant};

use crate::fiber::stack::SizeClass;

/// How often the stack pools give back the pages of stacks that sat unused since the last
/// time (`SizeClass::scavenge`); idle, the supervisor wakes for it only while a pool holds
/// more than it keeps.
const SCAVENGE_EVERY: Duration = Duration::from_secs(2);
/// How soon the next scavenge comes when the last one left due stacks for later (it releases
/// at most `SCAVENGE_MAX` at a time, so as not to hold the supervisor long).
const SCAVENGE_AGAIN: Duration = Duration::from_millis(20);

/// Runs the stack pools' scavenge every `SCAVENGE_EVERY` (`SizeClass::scavenge`). The pools
/// are process-wide, and so is the schedule: with several runtimes, their supervisors take
/// turns rather than each starting a new interval every `SCAVENGE_EVERY`.
pub(super) struct Scavenger {
    /// This supervisor's idea of when the next scavenge is due (the shared one's, as last seen).
    next: Instant,
}

/// When the next scavenge is due, for every supervisor in the process.
static NEXT_SCAVENGE: crate::loom::StdMutex<Option<Instant>> = crate::loom::StdMutex::new(None);

/// A supervisor may be reading or writing it when another thread forks, and the child's
/// supervisor scavenges too.
fn hold_next_scavenge_across_fork() {
    crate::platform::fork::hold_across_fork(|| {
        Box::new(NEXT_SCAVENGE.lock().unwrap_or_else(|e| e.into_inner()))
    });
}
crate::platform::fork::at_load!(hold_next_scavenge_across_fork);

impl Scavenger {
    pub(super) fn new() -> Scavenger {
        Scavenger { next: Instant::now() + SCAVENGE_EVERY }
    }

    /// When the next scavenge is due, if a pool holds stacks it would give back; `None` lets
    /// an idle supervisor sleep through (idle means idle).
    pub(super) fn due(&self) -> Option<Instant> {
        SizeClass::any_excess().then_some(self.next)
    }

    pub(super) fn run_if_due(&mut self) {
        let now = Instant::now();
        if now < self.next {
            return;
        }
        {
            let mut shared = NEXT_SCAVENGE.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(next) = shared.filter(|&next| next > now) {
                self.next = next; // another supervisor scavenged meanwhile
                return;
            }
            // Claimed: the others skip while this one scavenges. Not locked across the
            // scavenge, which takes the pools' locks: a leaf, held across a fork.
            *shared = Some(now + SCAVENGE_EVERY);
        }
        let more = SizeClass::scavenge_all();
        self.next = now + if more { SCAVENGE_AGAIN } else { SCAVENGE_EVERY };
        *NEXT_SCAVENGE.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.next);
    }
}
