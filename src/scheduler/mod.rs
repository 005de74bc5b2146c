//! The scheduler: carriers, their queues, the injector, and who runs what next.
//!
//! Finding work goes: LIFO slot (at most 3 in a row) → the home queue and the local deque,
//! merged in arrival order (started fibers wait in the home queue, private to their carrier;
//! unstarted ones in the stealable deque) → injector shards (every 61 ticks first, for
//! fairness) → expired timers → stealing half of a random victim's deque → sleep. Wakes from
//! other threads reach a started fiber's home through its lock-free inbox. See
//! `arch/scheduler.md`; the layer it sits in, `arch/layers.md`.
//!
//! | file | what it owns |
//! |---|---|
//! | `shared.rs` | `Shared`, the state every carrier and waker sees; `CarrierSlot`, a carrier's part of it other threads touch; the few methods code outside `scheduler/` reads it through |
//! | `lifecycle.rs` | starting, waking, compensating, retiring, reviving and stopping carriers |
//! | `counters.rs` | one reading of the counters, for `Runtime::metrics` |
//! | `carrier/` | a carrier's own hot state and loop (`Carrier`, on its thread's stack) |
//! | `queue/` | the structures fibers pass through: the stealable run queue, the private home queue, the home inbox, and the sleep/wake protocol that loses no wake-up (`idle.rs`) |
//! | `injector.rs` | the global sharded queue work enters through from outside the carriers |
//! | `runtime_ref.rs` | the counted `RuntimeRef` and the `Schedule` impl fiber/ calls through |
//! | `supervisor/`, `compactor.rs`, `locations.rs` | blocked-carrier detection and compensation, the compaction policy, blocking locations |
//! | `affinity.rs` | the carriers' CPU affinity policy: pinned until their CPU is shared, then floating |
//! | `time.rs` | the carriers' timer heaps: arming, disarming and firing timed waits |
//! | `reactor/` | the carriers' epoll sets and each socket's registration (readiness word, waiters) |
//! | `diagnostics.rs` | dumps, the starvation, saturation and runaway reports, SIGQUIT, the panic hook |
//! | `deadlock.rs` | the deadlock report, and the process's live runtimes it must find all asleep |
//! | `roots.rs` | the record arena (the fiber roots dumps walk) |
//! | `shutdown.rs` | the runtime's drop: the hand-over of fibers to unwind on their home carriers |
//! | `config.rs` | the validated settings |
//! | `trace/` | the execution trace: per-carrier event rings, the writer thread, its Chrome JSON |

mod affinity;
pub(crate) mod carrier;
mod compactor;
pub(crate) mod config;
mod counters;
pub(crate) mod deadlock;
pub(crate) mod diagnostics;
mod injector;
pub(crate) mod lazy_table;
mod lifecycle;
pub(crate) mod locations;
pub(crate) mod queue;
pub(crate) mod reactor;
pub(crate) mod roots;
mod runtime_ref;
mod shared;
pub(crate) mod shutdown;
pub(crate) mod supervisor;
pub(crate) mod time;
pub(crate) mod trace;

pub(crate) use injector::Injector;
pub(crate) use roots::Roots;
pub(crate) use runtime_ref::{STOCK_BATCH, schedule};
pub(crate) use shared::{CachePadded, CarrierSlot, NOT_PINNED, RECORD_CACHE, RecordPtr, Shared, bump};

/// Test-only hooks into interleavings that are otherwise a few instructions wide.
#[cfg(test)]
pub(crate) mod test_hooks {
    use std::sync::{Arc, Mutex};

    use super::Shared;

    type Hook = Arc<dyn Fn(&Shared, usize) + Send + Sync>;

    /// Run by `start_carrier` once the thread of slot `index` is spawned, before it is
    /// registered for the runtime's drop to join (with the `threads` lock held).
    pub(crate) static CARRIER_SPAWNED: Mutex<Option<Hook>> = Mutex::new(None);

    /// Run by the supervisor at the start of every tick.
    pub(crate) static SUPERVISOR_TICK: Mutex<Option<Hook>> = Mutex::new(None);

    pub(super) fn supervisor_tick(rt: &Shared) {
        let hook = SUPERVISOR_TICK.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(hook) = hook {
            hook(rt, 0);
        }
    }

    pub(super) fn carrier_spawned(rt: &Shared, index: usize) {
        let hook = CARRIER_SPAWNED.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(hook) = hook {
            hook(rt, index);
        }
    }
}
