//! The structures the carriers hand fibers through, each a small data structure with its own
//! tests and loom models, and none aware of carriers or runtimes: the stealable run queue
//! (`run_queue.rs`), the private home queue (`home_queue.rs`), the home inbox other threads push
//! to (`inbox.rs`), and the idle protocol that loses no wake-up (`idle.rs`). The carrier code
//! that drives them is in `carrier/`; how they fit together, `arch/scheduler.md`.

pub(crate) mod home_queue;
pub(crate) mod idle;
pub(crate) mod inbox;
pub(crate) mod run_queue;
