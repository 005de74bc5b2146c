//! Sound by default: the hazards that migration of started fibers made reachable from safe code
//! (`arch/decisions/0003-home-carriers.md` has the measurements), each on the default runtime, where a started fiber stays on its
//! home carrier (`arch/decisions/0003-home-carriers.md`).
//!
//! - the OS thread and a thread-local's address stay the same across thousands of switches, on
//!   two carriers kept busy by other fibers (with migration they changed on most runs);
//! - a `RefCell<Vec<u64>>` thread-local borrowed across yields: exact totals, no crash (with
//!   migration: 14 of 14 runs crashed); in a child process, so a crash fails one test;
//! - an `Rc` from a thread-local, held across yields and cloned after them: exact counts;
//! - `std::io::stdout().lock()` held across yields: no panic inside std, every byte written.
//!
//! Each fiber yields while others wait behind it, so a runtime that moved started fibers would
//! move them here: the tests fail on the old default (`migrate_started_fibers(true)` now).

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use virtual_threads as vt;

mod common;

const CHILD: &str = "VT_SOUNDNESS_CHILD";

fn rt() -> vt::Runtime {
    vt::Runtime::builder().carriers(2).build().unwrap()
}

/// What every carrier's `TALLY` held when its thread exited.
static TALLIED: AtomicU64 = AtomicU64::new(0);

/// A per-thread count that adds itself to `TALLIED` when its thread exits: with the runtime
/// dropped, `TALLIED` is every increment made, counted once.
struct Tally(Cell<u64>);

impl Drop for Tally {
    fn drop(&mut self) {
        TALLIED.fetch_add(self.0.get(), Ordering::SeqCst);
    }
}

thread_local! {
    static COUNTER: Cell<u64> = const { Cell::new(0) };
    static TALLY: Tally = const { Tally(Cell::new(0)) };
    static LOG: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    static SHARED: Rc<u64> = Rc::new(7);
}

/// The address of this thread's `COUNTER`, through a call LLVM cannot hoist across a yield.
#[inline(never)]
fn counter_addr() -> usize {
    COUNTER.with(|c| c as *const Cell<u64> as usize)
}

#[test]
fn thread_and_thread_local_stay_the_same_across_switches() {
    let rt = rt();
    let moved = rt.block_on(|| {
        let hs: Vec<_> = (0..64)
            .map(|_| {
                vt::spawn(|| {
                    let (thread, addr) = (std::thread::current().id(), counter_addr());
                    let mut moved = 0;
                    for _ in 0..2_000 {
                        vt::yield_now();
                        moved += usize::from(std::thread::current().id() != thread || counter_addr() != addr);
                    }
                    moved
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum::<usize>()
    });
    assert_eq!(moved, 0, "started fibers resumed on another OS thread {moved} times");
}

/// The crash case: a thread-local `RefCell<Vec<_>>` and a `Cell` counter used before and after
/// each yield in one function, where LLVM keeps the thread-local's address in a register.
#[test]
fn thread_local_borrows_across_yields_are_exact_and_do_not_crash() {
    if std::env::var(CHILD).is_ok() {
        let rt = rt();
        let (fibers, yields) = (200u64, 2_000u64);
        let totals = rt.block_on(|| {
            let hs: Vec<_> = (0..fibers)
                .map(|_| {
                    vt::spawn(move || {
                        let before = COUNTER.with(Cell::get);
                        for i in 0..yields {
                            COUNTER.with(|c| c.set(c.get() + 1));
                            TALLY.with(|t| t.0.set(t.0.get() + 1));
                            LOG.with(|l| l.borrow_mut().push(i));
                            vt::yield_now();
                            LOG.with(|l| {
                                let l = l.borrow();
                                assert!(!l.is_empty());
                            });
                        }
                        // Others ran on this thread meanwhile: only a lower bound is ours.
                        COUNTER.with(Cell::get) - before >= yields
                    })
                })
                .collect();
            hs.into_iter().all(|h| h.join().unwrap())
        });
        assert!(totals);
        // The carriers exit: each one's tally lands once. A write through another thread's
        // stale slot, or a destructor run twice, shows as a wrong total.
        drop(rt);
        assert_eq!(TALLIED.load(Ordering::SeqCst), fibers * yields);
        println!("child: ok");
        return;
    }
    in_child("thread_local_borrows_across_yields_are_exact_and_do_not_crash");
}

/// Runs `test` again in a child copy of this binary (a crash fails the test, not the run) and
/// returns its stdout once it printed "child: ok" and exited successfully.
fn in_child(test: &str) -> String {
    let out = common::rerun_self(test, CHILD, "1").output().expect("re-exec the test binary");
    common::child_output(&out, "child: ok").0
}

#[test]
fn rc_from_a_thread_local_keeps_exact_counts_across_yields() {
    let rt = rt();
    let exact = rt.block_on(|| {
        let hs: Vec<_> = (0..100)
            .map(|_| {
                vt::spawn(|| {
                    let mine = SHARED.with(Rc::clone);
                    let base = Rc::strong_count(&mine);
                    let mut ok = true;
                    for _ in 0..500 {
                        vt::yield_now();
                        // Still this thread's Rc: a clone and a drop move the count by one and
                        // back, and nobody else touches it concurrently.
                        let extra = mine.clone();
                        ok &= Rc::strong_count(&extra) >= 2 && *extra == 7;
                        drop(extra);
                    }
                    ok && Rc::strong_count(&mine) >= base.min(2)
                })
            })
            .collect();
        hs.into_iter().all(|h| h.join().unwrap())
    });
    assert!(exact);
    // Every clone was dropped on the thread that made it: each carrier's count is back to one.
    let counts: Vec<usize> = rt.block_on(|| {
        (0..32).map(|_| vt::spawn(|| SHARED.with(Rc::strong_count))).map(|h| h.join().unwrap()).collect()
    });
    assert!(counts.iter().all(|&c| c == 1), "strong counts after the run: {counts:?}");
}

#[test]
fn stdout_lock_held_across_yields_neither_panics_nor_loses_output() {
    if std::env::var(CHILD).is_ok() {
        let rt = rt();
        rt.block_on(|| {
            let hs: Vec<_> = (0..20u32)
                .map(|f| {
                    vt::spawn(move || {
                        let mut out = std::io::stdout().lock();
                        for i in 0..50u32 {
                            writeln!(out, "line {f} {i}").unwrap();
                            vt::yield_now(); // std's reentrant lock is keyed on the OS thread
                        }
                    })
                })
                .collect();
            hs.into_iter().for_each(|h| h.join().unwrap());
        });
        println!("child: ok");
        return;
    }
    let stdout = in_child("stdout_lock_held_across_yields_neither_panics_nor_loses_output");
    for f in 0..20 {
        for i in 0..50 {
            assert!(stdout.contains(&format!("line {f} {i}\n")), "lost \"line {f} {i}\"");
        }
    }
}
