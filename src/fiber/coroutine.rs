//! The one function every fiber coroutine runs (`fiber_loop`: one fiber after another on the
//! same coroutine and stack), the type-erased operations on a fiber's stage, and the filling
//! of a fresh record at spawn (`prepare`). Spawning itself, which picks a runtime and a queue,
//! is the runtime's: `runtime/spawn.rs`.

use std::io;
use std::marker::PhantomData;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;

use corosensei::Coroutine;

use super::context;
use super::join;
use super::stack::FiberStack;
use super::stage::{STAGE_CLOSURE, STAGE_RESULT, StageVTable};
use super::{Co, FiberRecord, FiberRef, FiberYielder, Init, Suspend};

/// What `join` returns for a fiber that its runtime's drop unwound before it finished.
pub(crate) const CANCELLED: &str = "fiber cancelled: its runtime was dropped before it finished";

/// The type-erased operations on a fiber's stage, one table per closure and result type.
pub(crate) struct Erased<F, T>(PhantomData<(F, T)>);

impl<F: FnOnce() -> T + Send, T: Send> Erased<F, T> {
    pub(crate) const VTABLE: StageVTable =
        StageVTable { run: run_closure::<F, T>, fail: fail_start::<F, T>, drop_result: drop_result::<T> };
}

/// A coroutine for fibers, on `stack`: not started; its first resume names its first fiber.
pub(crate) fn new_coroutine(stack: FiberStack) -> Co {
    Coroutine::with_stack(stack, fiber_loop)
}

/// Every fiber coroutine's body: runs one fiber after another. After a fiber's result is
/// published it suspends with `Finished`, and its carrier keeps it in a cache, stack and all;
/// the next resume hands it a new fiber's record, and a null one ends it. Reusing it skips
/// building a coroutine and entering it through corosensei's trampoline on every first run
/// (`arch/performance.md`).
fn fiber_loop(y: &FiberYielder, mut me: *const FiberRecord) {
    while !me.is_null() {
        debug_assert!(std::ptr::eq(me, context::current_fiber()));
        // SAFETY: `me` is the record this coroutine was resumed for, and it outlives the
        // fiber's run: the carrier resuming it holds a reference. Its address is stable, so
        // `me` stays valid across switches even though the carrier may change.
        let rec: &FiberRecord = unsafe { &*me };
        rec.set_yielder(y);
        // SAFETY: the stage holds the closure of the fiber spawned with this vtable (a record
        // is resumed for a new fiber once, at its first run), consumed here.
        unsafe { (rec.vtable.get().run)(rec) };
        if crate::platform::forks() != 0 && context::is_forked_fiber(me) {
            end_forked_child(rec);
        }
        if catch_unwind(AssertUnwindSafe(|| rec.locals.clear())).is_err() {
            eprintln!(
                "virtual-threads: a fiber_local! destructor panicked; aborting (as std does for thread_local!)"
            );
            std::process::abort();
        }
        join::complete(rec);
        if rec.cancelled.load(Ordering::Acquire) {
            // The runtime's drop is unwinding its fibers: nothing will run another here.
            return;
        }
        me = y.suspend(Suspend::Finished);
    }
}

/// The fiber that called `fork` returned in the child, where it ran as the only thread
/// (`context::forget_carrier_after_fork`): nobody there can join it, and its carrier's loop must
/// not run (it would run the parent's fibers' copies). The child ends as a program whose `main`
/// returned: status 0, or 101 after a panic (already reported by the panic hook).
#[cold]
fn end_forked_child(rec: &FiberRecord) -> ! {
    // SAFETY: the stage holds this fiber's result (`run` just put it), and nobody else in this
    // process can take it: its joiner, if any, is a copy of a fiber that never runs here.
    let panicked = unsafe { (rec.vtable.get().drop_result)(rec) };
    std::process::exit(if panicked { 101 } else { 0 })
}

/// A fiber's closure, run on its coroutine: its panic caught, its result put in the stage.
///
/// # Safety
/// The stage holds an `F` (the closure of a fiber spawned with this vtable), consumed here;
/// the caller of spawn guaranteed that what it borrows outlives the fiber. The caller is the
/// fiber's coroutine, at the fiber's first run.
unsafe fn run_closure<F: FnOnce() -> T + Send, T: Send>(me: &FiberRecord) {
    // SAFETY: see the function's contract.
    let f = unsafe { me.take_stage::<F>() };
    let result = if me.cancelled.load(Ordering::Acquire) {
        // Cancelled before it ever ran: drop the closure (its captures' destructors run here).
        let _ = catch_unwind(AssertUnwindSafe(move || drop(f)));
        Err(Box::new(CANCELLED) as Box<dyn std::any::Any + Send>)
    } else if me.stop.load(Ordering::Acquire) & super::stop_state::CANCEL != 0 {
        // Stopped before its first run: it never starts.
        let _ = catch_unwind(AssertUnwindSafe(move || drop(f)));
        Err(Box::new(super::stop::Cancelled) as Box<dyn std::any::Any + Send>)
    } else {
        match catch_unwind(AssertUnwindSafe(f)) {
            // The runtime's drop unwound it (corosensei's private unwind payload).
            Err(_) if me.cancelled.load(Ordering::Acquire) => Err(Box::new(CANCELLED) as _),
            r => r,
        }
    };
    // SAFETY: the stage is empty (the closure was moved out above) and only this fiber writes
    // it until it publishes DONE.
    unsafe { me.put_stage(result, STAGE_RESULT) };
}

/// # Safety
/// As for [`run_closure`].
unsafe fn fail_start<F: FnOnce() -> T + Send, T: Send>(rec: &FiberRecord, e: io::Error) {
    // SAFETY: see the function's contract.
    let f = unsafe { rec.take_stage::<F>() };
    let _ = catch_unwind(AssertUnwindSafe(move || drop(f)));
    report_start_failure(rec, &e);
    let r: std::thread::Result<T> = Err(Box::new(format!("fiber could not start: {e}")));
    // SAFETY: the stage is empty now, and the fiber never runs: we are its only user.
    unsafe { rec.put_stage(r, STAGE_RESULT) };
    join::complete(rec);
}

/// A fiber whose spawn returned `Ok` found no stack at its first run (the address space or
/// `vm.max_map_count` ran out meanwhile: spawn makes sure of one stack, not of one per queued
/// fiber). Its join returns the error; a detached fiber's would be lost without a word, so say
/// it on stderr too, once per spawn site (29,309 fibers failed at one site in a probe).
#[cold]
fn report_start_failure(rec: &FiberRecord, e: &io::Error) {
    static SAID: crate::loom::StdMutex<Vec<usize>> = crate::loom::StdMutex::new(Vec::new());
    let at = rec.spawned_at();
    let site = std::ptr::from_ref(at).addr();
    {
        let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
        if said.contains(&site) {
            return;
        }
        said.push(site);
    }
    let name = rec.name().map(|n| format!(" {n:?}")).unwrap_or_default();
    eprintln!(
        "virtual-threads: fiber {}{name} (spawned at {at}) could not start: {e}. Its join returns \
         this error; a detached fiber's work is lost. (Reported once per spawn location.)",
        rec.id()
    );
}

/// Drops a result nobody will take; a panic's payload goes to the fiber's scope, if any, which
/// resumes the first one it gets (as rayon's scope does). Returns whether it was a panic.
///
/// # Safety
/// The stage holds this fiber's `thread::Result<T>`, and the caller is the only party that
/// may take it (see `join.rs`).
unsafe fn drop_result<T>(rec: &FiberRecord) -> bool {
    // SAFETY: see the function's contract.
    match unsafe { rec.take_stage::<std::thread::Result<T>>() } {
        Ok(_) => false,
        // A stopped fiber is no failure of its scope: whoever stopped it asked for that.
        Err(payload) if super::cancel::is_cancel_payload(&*payload) => false,
        Err(payload) => {
            // SAFETY: as the only party to the result, the caller is also the only one to touch
            // the scope cell until it tells the scope (`join::scope_done`), after this.
            if let Some(scope) = unsafe { &*rec.scope.get() } {
                scope.keep_panic(payload);
            }
            true
        }
    }
}

/// Fills a fresh record and its stage: the fiber's queue reference and its join handle's.
///
/// # Safety
/// `slot` is an unused record owned by the caller.
#[inline(always)]
pub(crate) unsafe fn prepare<F, T>(
    slot: std::ptr::NonNull<FiberRecord>,
    init: Init,
    f: F,
) -> (FiberRef, FiberRef)
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    // The closure first, before `init`'s stores: with those in between, the compiler may copy
    // the closure to the stack on the way (it did in `chained_fork`, twice, 7 instructions).
    // SAFETY: `slot` is unused and ours (the caller's contract): we are its only user.
    unsafe { slot.as_ref().put_stage(f, STAGE_CLOSURE) };
    // SAFETY: as above.
    unsafe { FiberRecord::init(slot, init) }
}
