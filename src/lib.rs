//! Loom-style virtual threads for Rust: write plain blocking code — spawn, join, sleep, locks,
//! channels — and run a million such "threads" on a few OS threads, without async/await.
//!
//! ```
//! use virtual_threads as vt;
//!
//! let handles: Vec<_> = (0..1000u64).map(|i| vt::spawn(move || i * 2)).collect();
//! let sum: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
//! assert_eq!(sum, 999 * 1000);
//! ```
//!
//! # Glossary
//! - **Fiber**: a virtual thread; a stackful coroutine with its own small stack (64 KiB of
//!   reserved address space by default, of which it uses only the pages it touches).
//! - **Carrier**: an OS thread that runs fibers, one per usable CPU, pinned to it.
//! - **Injector**: the sharded queue through which work enters from outside the carriers.
//! - **Supervisor**: the thread that notices carriers stuck in the OS and compensates.
//!
//! Every blocking call of this crate parks the *fiber*, never the carrier; called from a plain
//! OS thread it blocks that thread, so the same code works in both.
//!
//! # Soundness: a started fiber stays on its home carrier
//! A fiber that has started runs only on the OS thread where it first ran (its *home* carrier);
//! only fibers that have not started yet move between carriers (work stealing). So a
//! `thread_local!`, an `Rc`, a `std::sync::MutexGuard` or `std::io::stdout().lock()` held across a
//! switch point (`park`, `yield_now`, `sleep`, `join`, a lock or channel wait) behaves as it would
//! in one OS thread shared by several tasks: never a data race. Loom-style migration of started
//! fibers, which balances long-lived fibers better, is the `unsafe` opt-in
//! [`runtime::Builder::migrate_started_fibers`], whose `# Safety` section states the contract.
//! A fiber blocked in the OS (a `std` call that blocks) holds up the fibers at home on its
//! carrier: wrap such calls in [`blocking`]. See the README's "Soundness" section and
//! `arch/decisions/0003-home-carriers.md`.
//!
//! The design is documented in `arch/` (start with `arch/overview.md`).

#![warn(missing_docs, unreachable_pub)]

mod blocking;
pub mod channel;
mod diagnostics;
mod fiber;
pub mod fs;
mod metrics;
pub mod net;
mod platform;
mod pool;
pub mod runtime;
mod scheduler;
mod scope;
pub mod sync;
mod time;

pub use blocking::blocking;
pub use diagnostics::{FiberDump, FiberGroup, FiberInfo, FiberState, WaitReason};
pub use fiber::builder::{Builder, spawn};
pub use fiber::compact::no_compaction;
pub use fiber::join::JoinHandle;
pub use fiber::local::LocalKey;
pub use fiber::park::{Fiber, FiberId, current, park, park_timeout, sleep, sleep_until, yield_now};
pub use fiber::stack::{DEFAULT_STACK_SIZE, MAX_STACK_SIZE, MIN_STACK_SIZE};
pub use metrics::{BlockingLocation, Metrics};
pub use pool::{PoolScope, ThreadPool, ThreadPoolBuilder};
pub use runtime::{Handle, Runtime};
pub use scope::{Scope, ScopedJoinHandle, join, pinned, scope};
