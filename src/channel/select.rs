//! The engine behind `select!`, `select_biased!` and the dynamic [`Select`](super::Select):
//! wait on several channel operations at once, exactly one of which completes.
//!
//! Arms are tried in a fresh random order each time (a Fisher-Yates shuffle, as Go does), so
//! the first ready arm in that order is uniformly distributed among the ready ones, whatever
//! the arms that are not ready; `select_biased!` tries them in order. Three kinds of arm:
//! - a **receive** registers a receive slot, completed by a sender's `grant`;
//! - a **send** whose message is known registers a send slot carrying it;
//! - a **watch** (a send arm before its message is evaluated, the dynamic `Select`'s send
//!   operations, `ready()`) registers a watcher that is only ever *woken*: the channel may have
//!   become ready, look again. A send arm chosen before its message exists makes it (a
//!   closure the macro wrote around the message expression, run outside every lock) and sends
//!   it without waiting; if the room went meanwhile the arm keeps the message and the select
//!   goes round again, the arm now a send arm of the second kind.
//!   A send chosen for a waiting receiver holds that receiver while the message is made, and a
//!   receiver that finds a watching send arm picks it and waits for the message (`Reserved`
//!   in `chan.rs`; `arch/sync.md`, "holds and picks"). (Making the message in the
//!   macro's own code instead would put the expression inside that retry loop, and a message
//!   that moves a value would not compile.)
//!
//! Steps, with one `Waiter` shared by every arm (`arch/sync.md` has the proof sketch):
//! 1. Try each arm without registering; the first that can complete does.
//! 2. Otherwise, for each arm under its channel's inner lock: if it can complete now (slots of
//!    this very select do not count as counterparts), first `cancel` the shared waiter
//!    (claiming it for ourselves; if that fails, a counterpart already granted or woke an arm
//!    registered earlier, so stop), then complete it; else register a slot or a watcher
//!    tagged with the arm's index.
//! 3. Park until a counterpart grants an arm (it completed it for us), wakes one (a
//!    disconnection or a watched change: go round again), or the deadline (or the next firing
//!    of a timer channel) cancels the waiter.
//! 4. Unregister every slot and watcher, taking unsent messages back, under each channel's
//!    lock. A select that goes round again for a lost race checks its deadline first.
//!
//! The arms' side of each step is `arms.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::fiber::wait::WaitReason;
use crate::sync::loom::{self, Arc};
use crate::sync::wait_list::{self, Outcome, Waiter};

/// How long a select may wait: no `default` arm, `default`, or `default(timeout)`.
#[derive(Clone, Copy, Debug)]
pub enum Deadline {
    /// Wait until an operation completes.
    Never,
    /// Do not wait.
    Now,
    /// Wait until this instant at most.
    At(Instant),
}

impl Deadline {
    /// A deadline `timeout` from now (`Never` if that is not representable).
    pub fn after(timeout: Duration) -> Deadline {
        match Instant::now().checked_add(timeout) {
            Some(at) => Deadline::At(at),
            None => Deadline::Never,
        }
    }
}

/// One arm, type-erased for [`run`].
pub struct Arm<'a> {
    pub(super) ops: &'a mut dyn ArmOps,
}

impl std::fmt::Debug for Arm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arm").finish_non_exhaustive()
    }
}

/// What step 2 did with one arm.
pub(crate) enum Poll {
    /// Registered a slot or a watcher; keep going.
    Pending,
    /// Claimed the waiter and completed the operation.
    Done,
    /// Claimed the waiter (step 2) or found the channel ready (step 1); `finish_chosen`
    /// completes the operation with no lock held.
    Chosen,
    /// The waiter was already granted or woken through an earlier arm.
    Preempted,
    /// Claimed the waiter, but the counterpart that made the arm ready cancelled meanwhile:
    /// start again with a fresh waiter.
    Lost,
}

pub(crate) trait ArmOps {
    /// Step 1: completes (`Done`) or chooses (`Chosen`) the operation if it can without
    /// waiting; `Pending` if it cannot.
    fn try_now(&mut self) -> Poll;
    /// Step 2.
    fn try_or_register(&mut self, waiter: &Arc<Waiter>, op: usize) -> Poll;
    /// Step 4; `op` is this arm's index.
    fn unregister(&mut self, waiter: &Waiter, op: usize);
    /// The waiter was granted this arm: collect the result the counterpart left.
    fn complete_granted(&mut self);
    /// The waiter was granted this arm, but the runtime's drop is unwinding the select: hand
    /// on what the counterpart left (a received message) so that nothing is lost. Runs during
    /// unwinding: must not park or panic.
    fn abandon_granted(&mut self);
    /// The waiter was woken through this arm. True: the arm is chosen (a watcher: its channel
    /// may be ready, or a receiver showed up); false: go round again.
    fn on_woken(&mut self) -> bool {
        false
    }
    /// After `Poll::Chosen` or a wake-up through a watcher, with no lock held: completes the
    /// operation; false if it cannot complete after all (go round again).
    fn finish_chosen(&mut self) -> bool {
        true
    }
    /// After `Poll::Pending`: when the arm becomes ready by itself (a timer channel).
    fn ready_at(&self) -> Option<Instant> {
        None
    }
}

/// The arms of one select, indexable.
pub(crate) trait ArmList {
    fn len(&self) -> usize;
    fn get(&mut self, i: usize) -> &mut dyn ArmOps;
}

impl ArmList for [Arm<'_>] {
    fn len(&self) -> usize {
        <[Arm<'_>]>::len(self)
    }

    fn get(&mut self, i: usize) -> &mut dyn ArmOps {
        self[i].ops
    }
}

/// Runs a select over `arms` (steps 1-4 above): the index of the arm that completed, or
/// `None` if `deadline` came first. `biased`: try the arms in order instead of at random.
pub fn run(arms: &mut [Arm<'_>], deadline: Deadline, biased: bool) -> Option<usize> {
    run_list(arms, deadline, biased)
}

pub(crate) fn run_list<L: ArmList + ?Sized>(arms: &mut L, deadline: Deadline, biased: bool) -> Option<usize> {
    let n = arms.len();
    if n == 0 {
        return wait_without_arms(deadline);
    }
    let order = Order::new(n, biased);
    for i in order.iter() {
        match arms.get(i).try_now() {
            Poll::Done => return Some(i),
            Poll::Chosen if arms.get(i).finish_chosen() => return Some(i),
            _ => {}
        }
    }
    let deadline = match deadline {
        Deadline::Now => return None,
        Deadline::Never => None,
        Deadline::At(at) => Some(at),
    };
    loop {
        let waiter = Arc::new(Waiter::new());
        let mut polled = Poll::Pending;
        let mut chosen = None;
        // The earliest of the deadline and the next firing of a timer channel in the arms.
        let mut until = deadline;
        for i in order.iter() {
            polled = arms.get(i).try_or_register(&waiter, i);
            match polled {
                Poll::Pending => {
                    if let Some(at) = arms.get(i).ready_at() {
                        until = Some(until.map_or(at, |u| u.min(at)));
                    }
                    continue;
                }
                Poll::Done | Poll::Chosen => chosen = Some(i),
                Poll::Preempted | Poll::Lost => {}
            }
            break;
        }
        let outcome = match polled {
            Poll::Pending | Poll::Preempted => {
                // A runtime's drop may unwind this fiber from inside its park: take every
                // slot back, and hand on a message a sender already delivered to us.
                let abandon = |outcome: Option<Outcome>| {
                    for i in 0..n {
                        arms.get(i).unregister(&waiter, i);
                    }
                    if let Some(Outcome::Granted(i)) = outcome {
                        arms.get(i).abandon_granted();
                    }
                };
                Some(waiter.wait_or_abandon_timing_out(
                    WaitReason::Select,
                    until,
                    deadline.is_some(),
                    abandon,
                ))
            }
            Poll::Done | Poll::Chosen | Poll::Lost => None,
        };
        for i in 0..n {
            arms.get(i).unregister(&waiter, i);
        }
        if let Some(i) = chosen {
            if matches!(polled, Poll::Done) || arms.get(i).finish_chosen() {
                return Some(i);
            }
        }
        match outcome {
            Some(Outcome::Granted(i)) => {
                arms.get(i).complete_granted();
                return Some(i);
            }
            // Woken through a watcher: that arm is chosen. Otherwise a channel disconnected,
            // so go round again (an arm that is ready now completes before the deadline is
            // looked at).
            Some(Outcome::Woken(i)) => {
                if !arms.get(i).on_woken() {
                    continue;
                }
                if arms.get(i).finish_chosen() {
                    return Some(i);
                }
            }
            // The deadline, or a timer channel's firing (then go round again).
            Some(Outcome::TimedOut) => {}
            // A race undid the readiness we saw.
            None => {}
        }
        // A stop that could not unwind ended the wait early (`wait_or_abandon_timing_out`):
        // the call times out.
        if deadline.is_some_and(|d| loom::expired(d) || loom::stop_due(true)) {
            return None;
        }
    }
}

fn wait_without_arms(deadline: Deadline) -> Option<usize> {
    match deadline {
        Deadline::Now => None,
        Deadline::Never => loop {
            wait_list::park(WaitReason::Select, None);
        },
        Deadline::At(at) => {
            while !loom::expired(at) {
                wait_list::park(WaitReason::Select, Some(at));
            }
            None
        }
    }
}

/// The order in which a select tries its arms: a uniformly random permutation (Fisher-Yates),
/// or `0..n` for a biased select. On the stack up to 32 arms (every `select!`).
struct Order {
    small: [u8; 32],
    big: Vec<usize>,
    n: usize,
}

impl Order {
    fn new(n: usize, biased: bool) -> Order {
        let mut order = Order { small: [0; 32], big: Vec::new(), n };
        if n <= order.small.len() {
            for (i, slot) in order.small.iter_mut().enumerate().take(n) {
                *slot = i as u8;
            }
            if !biased {
                let mut rng = Rng::new();
                for i in (1..n).rev() {
                    order.small.swap(i, rng.below(i + 1));
                }
            }
        } else {
            order.big = (0..n).collect();
            if !biased {
                let mut rng = Rng::new();
                for i in (1..n).rev() {
                    order.big.swap(i, rng.below(i + 1));
                }
            }
        }
        order
    }

    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.n).map(|k| if self.big.is_empty() { usize::from(self.small[k]) } else { self.big[k] })
    }
}

/// splitmix64, seeded once per select from a process-wide counter (one relaxed RMW): the
/// shuffle needs spread, not cryptographic quality.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        if cfg!(loom) {
            // Loom replays each interleaving and needs the model to be deterministic.
            return Rng(0);
        }
        static SEED: AtomicU64 = AtomicU64::new(0);
        // Relaxed: any interleaving of increments gives distinct seeds, which is all we need.
        // Hashed, so that one select's stream does not continue the previous one's.
        let mut counter = Rng(SEED.fetch_add(1, Ordering::Relaxed));
        Rng(counter.next())
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform below `n` (Lemire's multiply-shift; the bias is below 2^-58 for 32 arms).
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }
}
