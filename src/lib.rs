//! Loom-style virtual threads for Rust: write plain blocking code — spawn, join, sleep, locks,
//! channels — and run a million such "threads" on a few OS threads, without async/await.
//!
//! | I want to… | use |
//! |---|---|
//! | run a function as a virtual thread, get its result | [`spawn`] → [`JoinHandle::join`] (a panic comes back as `Err`) |
//! | name a fiber, or give it a bigger stack | [`Builder`] (*fibers*, like `std::thread::Builder`) |
//! | size a runtime (carriers, stack size, diagnostics) | [`Runtime::builder`] → [`runtime::Builder`] (*runtimes*), then [`Runtime::block_on`], [`Runtime::spawn`] |
//! | use the default runtime without building one | [`spawn`] starts it; `VT_CARRIERS`, `VT_MAX_CARRIERS`, `VT_STACK_SIZE`, `VT_DUMP_ON_SIGQUIT` set it up |
//! | reach the runtime I run on | [`Handle::current`] |
//! | fork-join over borrowed data | [`scope`], [`join`] |
//! | sleep, yield, park | [`sleep`], [`yield_now`], [`park`] / [`Fiber::unpark`], [`current`] |
//! | lock, signal, count down | [`sync`]: [`Mutex`](sync::Mutex), [`RwLock`](sync::RwLock), [`Condvar`](sync::Condvar), [`Semaphore`](sync::Semaphore), [`Barrier`](sync::Barrier), [`WaitGroup`](sync::WaitGroup), [`OnceLock`](sync::OnceLock) |
//! | send messages, wait on several | [`channel`]: [`bounded`](channel::bounded), [`unbounded`](channel::unbounded), [`oneshot`](channel::oneshot), [`select!`] |
//! | serve or call over the network | [`net`]: [`serve`](net::serve) (a listener and an acceptor per carrier), [`TcpListener`](net::TcpListener), [`TcpStream`](net::TcpStream), [`UdpSocket`](net::UdpSocket) |
//! | start a fiber on a chosen carrier | [`Builder::carrier`], [`Handle::spawn_on_carrier`], [`current_carrier`] |
//! | read and write files | [`fs`] |
//! | call a library that blocks its thread | [`blocking`] |
//! | stop a fiber, or code past a deadline | [`JoinHandle::cancel`], [`CancelHandle`], [`timeout`], [`uncancellable`] |
//! | run many fibers and stop the rest together | [`JoinSet`] (completion order), [`TaskScope`] (first error or success), [`Scope::cancel`] |
//! | replace a thread pool | [`ThreadPool`], [`ThreadPoolBuilder`] |
//! | keep per-fiber state | [`fiber_local!`] |
//! | wait for a future, or await a fiber | [`future::block_on`]; [`JoinHandle`] is `IntoFuture` |
//! | stop on Ctrl-C or SIGTERM | [`signal`] |
//! | see what every fiber is doing, and counters | [`dump()`], [`metrics()`] (the caller's runtime, or the default one); `VT_DUMP_ON_SIGQUIT=1` prints the dump on `kill -QUIT` |
//!
//! ```
//! use virtual_threads as vt;
//!
//! let handles: Vec<_> = (0..1000u64).map(|i| vt::spawn(move || i * 2)).collect();
//! let sum: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
//! assert_eq!(sum, 999 * 1000);
//! ```
//!
//! A server is a fiber per connection, each plain blocking code ([`net`]); the clients here
//! are fibers too:
//!
//! ```
//! use std::io::{BufRead, BufReader, Write};
//! use virtual_threads as vt;
//!
//! fn main() -> std::io::Result<()> {
//!     let listener = vt::net::TcpListener::bind("127.0.0.1:0")?;
//!     let addr = listener.local_addr()?;
//!     // Serves 100 connections, then returns (a real server loops until it is told to stop:
//!     // examples/echo_server.rs stops on Ctrl-C).
//!     let server = vt::spawn(move || -> std::io::Result<()> {
//!         for conn in listener.incoming().take(100) {
//!             let mut conn = conn?;
//!             vt::spawn(move || -> std::io::Result<()> {
//!                 let mut line = String::new();
//!                 BufReader::new(conn.try_clone()?).read_line(&mut line)?; // parks the fiber
//!                 conn.write_all(line.to_uppercase().as_bytes())
//!             });
//!         }
//!         Ok(())
//!     });
//!     let clients: Vec<_> = (0..100)
//!         .map(|i| {
//!             vt::spawn(move || -> std::io::Result<String> {
//!                 let mut conn = vt::net::TcpStream::connect(addr)?;
//!                 conn.write_all(format!("hello {i}\n").as_bytes())?;
//!                 let mut reply = String::new();
//!                 BufReader::new(conn).read_line(&mut reply)?;
//!                 Ok(reply)
//!             })
//!         })
//!         .collect();
//!     for (i, client) in clients.into_iter().enumerate() {
//!         assert_eq!(client.join().unwrap()?, format!("HELLO {i}\n"));
//!     }
//!     server.join().unwrap()
//! }
//! ```
//!
//! # Glossary
//! - **Fiber**: a virtual thread; a stackful coroutine with its own small stack (128 KiB of
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

#[cfg(all(feature = "hooks", not(target_os = "linux")))]
compile_error!(
    "the `hooks` feature interposes glibc's or musl's entry points and is built for Linux only \
     (arch/hooks.md)"
);

mod blocking;
pub mod channel;
mod fiber;
pub mod fs;
pub mod future;
#[cfg(feature = "hooks")]
mod hooks;
mod join_set;
mod loom;
pub mod net;
mod platform;
mod pool;
pub mod runtime;
mod scheduler;
mod scope;
pub mod signal;
pub mod sync;
mod task_scope;

pub use blocking::blocking;
pub use fiber::cancel::{CancelHandle, Elapsed, deadline, timeout, uncancellable};
pub use fiber::compact::no_compaction;
pub use fiber::handle::{Fiber, current};
pub use fiber::id::FiberId;
pub use fiber::join::JoinHandle;
pub use fiber::local::LocalKey;
pub use fiber::park::{park, park_timeout, yield_now};
pub use fiber::sleep::{sleep, sleep_until};
pub use fiber::stack::{DEFAULT_STACK_SIZE, MAX_STACK_SIZE, MIN_STACK_SIZE};
pub use fiber::stop::{Cancelled, check_cancelled, is_cancelled};
pub use fiber::wait::WaitReason;
pub use join_set::JoinSet;
pub use pool::{PoolScope, ThreadPool, ThreadPoolBuilder};
pub use runtime::inspect::{current_carrier, dump, metrics};
pub use runtime::metrics::{BlockingLocation, CarrierMetrics, Metrics};
pub use runtime::spawn::{Builder, spawn};
pub use runtime::{Handle, Runtime};
pub use scheduler::diagnostics::{FiberDump, FiberGroup, FiberInfo, FiberState};
pub use scheduler::trace::TraceSummary;
pub use scope::{Scope, ScopedJoinHandle, join, pinned, scope};
pub use task_scope::{TaskError, TaskScope, Tasks};
