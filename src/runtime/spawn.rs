//! Spawning: the fiber `Builder`, `spawn`, and the one function that creates every fiber
//! (`spawn_unchecked_at`, with `spawn_local` its fast path on a carrier). It picks the runtime,
//! the record and the queue; what a fiber's coroutine then runs is `fiber/coroutine.rs`.

use std::io;
use std::panic::Location;
use std::sync::Arc;

use crate::fiber::Init;
use crate::fiber::context;
use crate::fiber::coroutine::{Erased, prepare};
use crate::fiber::id::next_id;
use crate::fiber::join::JoinHandle;
use crate::fiber::schedule::RuntimeRef;
use crate::fiber::scope_data::ScopeData;
use crate::fiber::stack::{SizeClass, usable_size};
use crate::scheduler::carrier::Carrier;

/// `let h = vt::Builder::new().name("worker".into()).stack_size(1 << 20).spawn(work)?;`
///
/// Fiber factory, like `std::thread::Builder`: a name and a stack size for the next fiber.
#[derive(Debug, Default, Clone)]
pub struct Builder {
    name: Option<String>,
    stack_size: Option<usize>,
    carrier: Option<usize>,
}

impl Builder {
    /// A builder with the runtime's defaults.
    pub fn new() -> Builder {
        Builder::default()
    }

    /// Names the fiber; the name shows in panics' messages, dumps and
    /// [`Fiber::name`](crate::Fiber::name).
    ///
    /// A panic in a fiber prints a line naming the fiber (id, name, spawn site) before the
    /// message of the panic hook that was set when the first runtime started (std's names the
    /// thread, which is the carrier: `std::thread::current()` inside a fiber is its carrier
    /// thread; [`vt::current`](crate::current) is the fiber). A hook set after that replaces
    /// the runtime's, which then prints nothing.
    pub fn name(mut self, name: String) -> Builder {
        self.name = Some(name);
        self
    }

    /// The fiber's usable stack in bytes (rounded up to whole pages), instead of the runtime's
    /// default (128 KiB unless `runtime::Builder::stack_size` says otherwise). It is reserved
    /// address space: only the pages the fiber touches cost memory.
    pub fn stack_size(mut self, bytes: usize) -> Builder {
        self.stack_size = Some(bytes);
        self
    }

    /// Starts the fiber on carrier `index` (0 to [`Handle::carriers`](crate::Handle::carriers)
    /// less one) instead of wherever the runtime finds room: it is queued where only that
    /// carrier looks (its inbox), starts there, and so has it as its home for its whole life
    /// (`arch/decisions/0003-home-carriers.md`). A server that keeps one acceptor per carrier
    /// spawns each acceptor this way ([`vt::net::serve`](crate::net::serve)); so does code that
    /// wants one fiber per carrier.
    ///
    /// What that gives up: the fiber waits for its carrier. While that carrier runs a long
    /// computation, or is blocked in the OS, the fiber is not started elsewhere: the spare
    /// carriers the supervisor adds take only fibers that may run anywhere, and a spawn site
    /// the supervisor learnt blocks does not move it either. When the runtime is dropped before
    /// it started, it is unwound like any queued fiber (its closure is dropped, its `join`
    /// returns an error). With `migrate_started_fibers`, it starts on the carrier and may then
    /// move like any started fiber.
    ///
    /// ```
    /// use virtual_threads as vt;
    ///
    /// let rt = vt::Runtime::builder().carriers(2).build()?;
    /// let h = vt::Builder::new().carrier(1).spawn_on(&rt.handle(), || vt::current_carrier())?;
    /// assert_eq!(h.join().unwrap(), Some(1));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn carrier(mut self, index: usize) -> Builder {
        self.carrier = Some(index);
        self
    }

    /// Spawns the fiber on the current runtime: the caller's if it is a fiber, otherwise the
    /// process-wide default runtime (started on first use).
    ///
    /// Errors: `InvalidInput` for a stack size out of range, or a [`carrier`](Builder::carrier)
    /// index the runtime does not have (the message names the setting and the count);
    /// `OutOfMemory` when no stack can be had (the message names the limit and how to raise
    /// it). A spawn that returned `Ok` runs (or, if the runtime is dropped first, is unwound).
    #[track_caller]
    pub fn spawn<F, T>(self, f: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let at = Location::caller();
        if self.name.is_none() && self.stack_size.is_none() && self.carrier.is_none() {
            return spawn_here(f, at);
        }
        // SAFETY: `F` and `T` are 'static: nothing borrowed can dangle.
        crate::runtime::with_current_runtime(|rt| unsafe { self.spawn_unchecked_at(rt, f, at, None) })
    }

    /// Spawns the fiber on the runtime `handle` refers to.
    #[track_caller]
    pub fn spawn_on<F, T>(self, handle: &crate::runtime::Handle, f: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let at = Location::caller();
        // SAFETY: `F` and `T` are 'static: nothing borrowed can dangle.
        unsafe { self.spawn_unchecked_at(handle.runtime(), f, at, None) }
    }

    /// # Safety
    /// If `F` or `T` borrow anything, the caller must wait for the fiber's result to be taken
    /// or dropped (its join to complete, or its scope to end) before the borrowed data goes
    /// away, on every path, panics included.
    pub(crate) unsafe fn spawn_unchecked_at<F, T>(
        self,
        rt: &RuntimeRef,
        f: F,
        at: &'static Location<'static>,
        scope: Option<Arc<ScopeData>>,
    ) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        if let Some(i) = self.carrier {
            check_carrier(rt, i)?;
        }
        let class = match self.stack_size {
            Some(bytes) => SizeClass::get(usable_size(bytes)?),
            None => rt.stacks(),
        };
        #[cfg(feature = "tracing")]
        let f = crate::fiber::spans::in_current_span(f);
        let c = crate::scheduler::carrier::here();
        // SAFETY: a non-null carrier pointer is this thread's live carrier; it is used only
        // until `schedule_local` below, before any switch point.
        let any_carrier = (!c.is_null()).then(|| unsafe { &*c });
        let local = any_carrier.filter(|c| std::ptr::eq(c.shared(), rt.ptr()));

        // The stack is bound at first run; make sure now that one can be had, so that running
        // out is this call's error rather than a surprise later.
        match local {
            Some(c) => c.ensure_stack(class)?,
            None => class.ensure_available()?,
        }
        let id = match any_carrier {
            Some(c) => c.next_id(),
            None => context::with_plain(|p| next_id(&mut p.ids)),
        };
        // A carrier's cached record holds its runtime reference already.
        let (slot, runtime) = match local {
            Some(c) => (c.alloc_record(), None),
            None => (rt.alloc_record(), Some(rt.clone())),
        };
        // The spawner's depth: the fiber running on this thread, whichever runtime it is of.
        let depth = match any_carrier.map(|c| c.current()).filter(|me| !me.is_null()) {
            // SAFETY: the fiber running on this carrier: live while it runs, and this is it.
            Some(me) => unsafe { (*me).depth.get() }.saturating_add(1),
            None => 0,
        };
        let init = Init {
            depth,
            id,
            name: self.name.map(String::into_boxed_str),
            spawned_at: at,
            runtime,
            class,
            vtable: vtable_of(&f),
            scope,
            since: rt.stamp(),
        };
        // SAFETY: `slot` came from a pool (or is new): unused and ours.
        let (rec, for_handle) = unsafe { prepare(slot, init, f) };
        let handle = JoinHandle::new(for_handle);
        match (self.carrier, local) {
            (Some(i), Some(c)) if i == c.index() => c.schedule_spawned_home(rec),
            (Some(i), _) => rt.schedule_spawned_on(i, rec),
            (None, Some(c)) => {
                c.schedule_spawned(rec);
                fork_yield(c);
            }
            (None, None) => rt.schedule_spawned_remote(rec),
        }
        Ok(handle)
    }
}

/// `Builder::carrier`'s check: one of the carriers the runtime was built with (a spare, which
/// comes and goes, is not a place to start a fiber on).
fn check_carrier(rt: &RuntimeRef, index: usize) -> io::Result<()> {
    let n = rt.config().carriers;
    if index < n {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "carrier index {index} is out of range (vt::Builder::carrier, Handle::spawn_on_carrier): \
             the runtime has {n} carriers, 0 to {}",
            n - 1
        ),
    ))
}

/// The stage's functions for a closure of `f`'s type (named by a value: with the `tracing`
/// feature the closure is wrapped, and its type has no name).
fn vtable_of<F: FnOnce() -> T + Send, T: Send>(_: &F) -> &'static crate::fiber::stage::StageVTable {
    &Erased::<F, T>::VTABLE
}

/// The fork-yield rule: a fiber that spawns many children in a row yields every `fork_yield`
/// spawns, so that the children start on other carriers instead of piling up behind it
/// (ZIO's `MaxForksBeforeYield`). Off when the setting is 0.
#[inline]
fn fork_yield(c: &Carrier) {
    let every = c.fork_yield();
    let me = c.current();
    if every == 0 || me.is_null() {
        return;
    }
    // SAFETY: `me` is the fiber running on this carrier: live while it runs.
    let me = unsafe { &*me };
    let n = me.spawns.get() + 1;
    me.spawns.set(n);
    if n >= every {
        crate::fiber::park::yield_now(); // resets the count
    }
}

/// `let answer = vt::spawn(|| 6 * 7).join().unwrap();`
///
/// Spawns a new fiber on the current runtime (the caller's, or the process-wide default one
/// when called from a plain thread) and returns a handle to join it.
///
/// # Panics
/// If no stack can be allocated, as `std::thread::spawn` panics when the OS cannot create a
/// thread; use [`Builder::spawn`] to get the `io::Error` instead.
#[track_caller]
// Inlined where it is called: generic, so one copy per closure type anyway, nearly always
// called from one place; its frame (six saved registers) and argument moves were ~20
// instructions per spawn (`arch/performance.md`).
#[inline]
pub fn spawn<F, T>(f: F) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let at = at_caller();
    let c = crate::scheduler::carrier::here();
    if c.is_null() {
        return spawn_here(f, at).unwrap_or_else(|e| spawn_failed(e));
    }
    // SAFETY: a non-null carrier pointer is this thread's live carrier; used only before the
    // fork-yield at the end of `spawn_local`, its one switch point.
    let c = unsafe { &*c };
    // Checked here rather than inside: the handle then travels in a register, not in an
    // `io::Result` in memory (moving that enum cost a store-forwarding stall per spawn).
    if let Err(e) = c.ensure_stack(c.shared().stacks()) {
        spawn_failed(e);
    }
    // SAFETY: `F` and `T` are 'static; `c` as above; a stack can be had.
    unsafe { spawn_local(c, f, at) }
}

#[cold]
#[inline(never)]
fn spawn_failed(e: io::Error) -> ! {
    panic!("failed to spawn fiber: {e}")
}

#[track_caller]
#[inline(always)]
fn at_caller() -> &'static Location<'static> {
    Location::caller()
}

/// A spawn with the default settings onto the current runtime: on a carrier, the runtime's
/// most common call, with one thread-local look (not the two of `with_current_runtime` and
/// `spawn_unchecked_at`) and none of the general path's branches on settings it lacks.
#[inline]
fn spawn_here<F, T>(f: F, at: &'static Location<'static>) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let c = crate::scheduler::carrier::here();
    if c.is_null() {
        // SAFETY: `F` and `T` are 'static: nothing borrowed can dangle.
        return crate::runtime::with_current_runtime(|rt| unsafe {
            Builder::new().spawn_unchecked_at(rt, f, at, None)
        });
    }
    // SAFETY: a non-null carrier pointer is this thread's live carrier; `spawn_local` uses it
    // only before its one switch point, the fork-yield at its very end.
    let c = unsafe { &*c };
    c.ensure_stack(c.shared().stacks())?;
    // SAFETY: `F` and `T` are 'static; `c` as above; a stack can be had.
    Ok(unsafe { spawn_local(c, f, at) })
}

/// `spawn_unchecked_at` for a fiber of the carrier's own runtime, with the runtime's default
/// stack, no name and no scope.
///
/// # Safety
/// As for `spawn_unchecked_at`; `c` is this thread's carrier, not used after this returns, and
/// its `ensure_stack` for the runtime's class just succeeded.
#[inline(always)]
unsafe fn spawn_local<F, T>(c: &Carrier, f: F, at: &'static Location<'static>) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    #[cfg(feature = "tracing")]
    let f = crate::fiber::spans::in_current_span(f);
    let rt = c.shared();
    let class = rt.stacks();
    let id = c.next_id();
    // With its runtime reference (`Init::runtime`).
    let slot = c.alloc_record();
    let me = c.current();
    // SAFETY: the fiber running on this carrier: live while it runs, and this is it.
    let depth = if me.is_null() { 0 } else { unsafe { (*me).depth.get() }.saturating_add(1) };
    let init = Init {
        depth,
        id,
        name: None,
        spawned_at: at,
        runtime: None,
        class,
        vtable: vtable_of(&f),
        scope: None,
        since: rt.stamp(),
    };
    // SAFETY: `slot` came from the carrier's pool: unused and ours; the caller's contract
    // covers what `f` borrows.
    let (rec, for_handle) = unsafe { prepare(slot, init, f) };
    c.schedule_spawned(rec);
    fork_yield(c);
    // The handle is built here, from the reference kept in a register: built before the calls
    // above, it sat in a stack slot written with 8-byte stores and read back with a 16-byte load.
    JoinHandle::new(for_handle)
}
