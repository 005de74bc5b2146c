//! Stack compaction (`runtime::Builder::compact_parked_after`): a fiber parked for long gives
//! its stack pages back, and gets its stack back, byte for byte at the same addresses, when it
//! wakes. What must hold: every fiber finds its locals, deep frames and references to them as it
//! left them; an unpark that races the compactor is never lost; dumps and the runtime's drop
//! handle compacted fibers; fibers whose stack others may write into while they are parked
//! (`scope`, `join`, `block_on`, `ThreadPool::scope`, `no_compaction`) are left alone; guard
//! pages stay guards (both kinds); and the memory really goes back.
//!
//! Waiting for the compactor polls its counters (`Runtime::metrics`) until a deadline: it runs
//! on the supervisor's clock, and there is nothing else to wait on.

use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use virtual_threads as vt;

mod common;

const CHILD: &str = "VT_COMPACTION_TEST_CHILD";

/// A runtime that compacts fibers parked for 1 ms. Its fibers wait on gates that the test's
/// plain thread holds outside any `vt` call, which the deadlock report cannot see: off, so that
/// a slow machine (compaction taking over its 1 s quiet period) does not abort the suite under
/// `VT_DEADLOCK_ABORT=1`.
fn compacting(carriers: usize) -> vt::Runtime {
    // SAFETY: the tests' fibers lend their stacks only through `vt`'s own APIs and
    // `no_compaction`, as the contract asks.
    unsafe { vt::Runtime::builder().compact_parked_after(Some(Duration::from_millis(1))) }
        .carriers(carriers)
        .deadlock_report(None)
        .build()
        .unwrap()
}

/// Polls `cond` until it holds; fails the test after 30 s.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn parked(rt: &vt::Runtime) -> usize {
    rt.dump().fibers().iter().filter(|f| matches!(f.state, vt::FiberState::Parked { .. })).count()
}

/// A stack frame's worth of values that depend on `seed`, and their checksum.
fn pattern(seed: u64) -> [u64; 16] {
    std::array::from_fn(|i| seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(i as u32) ^ i as u64)
}

fn checksum(a: &[u64]) -> u64 {
    a.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| (h ^ x).wrapping_mul(0x100_0000_01b3))
}

/// Recurses `depth` frames, each holding a pattern, runs `at_bottom` (which parks), then checks
/// every frame on the way back up. Returns a hash of the frames' checksums.
#[inline(never)]
fn deep(seed: u64, depth: u32, at_bottom: &mut dyn FnMut()) -> u64 {
    let frame = std::hint::black_box(pattern(seed ^ u64::from(depth)));
    let sum = checksum(&frame);
    let below = if depth == 0 {
        at_bottom();
        0
    } else {
        deep(seed, depth - 1, at_bottom)
    };
    let frame = std::hint::black_box(&frame);
    assert_eq!(checksum(frame), sum, "frame {depth} of fiber {seed} changed across the park");
    sum.rotate_left(7) ^ below
}

/// `deep` below a frame with 32 KiB of locals. Not inlined: a frame reserves room for all the
/// locals of its function, taken branch or not.
#[inline(never)]
fn with_32_kib_live(i: u64, at_bottom: &mut dyn FnMut()) -> u64 {
    let big = std::hint::black_box([i; 4096]);
    let sum = deep(i, depth_of(i), at_bottom);
    assert!(std::hint::black_box(&big).iter().all(|&x| x == i));
    sum
}

/// The depth at which fiber `i` parks: up to 16 frames, so that the live stack stays within
/// what is compacted (16 KiB) even in a debug build.
fn depth_of(i: u64) -> u32 {
    (i % 17) as u32
}

/// Fibers parked on a gate at depths up to 16 frames, with a reference to a local held across
/// the park and a deep excursion before it, are compacted, then woken: each finds its stack as
/// it left it. Fibers with more than 16 KiB of live stack are not compacted, and still wake.
#[test]
fn compacted_fibers_find_their_stacks_intact() {
    const N: u64 = 600;
    const BIG_EVERY: u64 = 50; // every 50th fiber keeps 32 KiB live: not compacted
    let rt = compacting(2);
    let gate = Arc::new(vt::sync::RwLock::new(()));
    let closed = gate.write().unwrap();
    let handles: Vec<_> = (0..N)
        .map(|i| {
            let gate = gate.clone();
            vt::Builder::new()
                .stack_size(1 << 20)
                .spawn_on(&rt.handle(), move || {
                    // A deep excursion first: pages far below where the fiber parks.
                    std::hint::black_box(deep(!i, 500, &mut || ()));
                    let local = pattern(i);
                    let held: &[u64] = &local; // a reference into this stack, held across the park
                    let mut at_bottom = || {
                        let _open = gate.read().unwrap();
                    };
                    let sum = if i % BIG_EVERY == 0 {
                        with_32_kib_live(i, &mut at_bottom)
                    } else {
                        deep(i, depth_of(i), &mut at_bottom)
                    };
                    assert_eq!(held, &pattern(i)[..], "a local seen through a reference");
                    // The excursion's pages were released too: going deep again works.
                    std::hint::black_box(deep(!i, 500, &mut || ()));
                    sum
                })
                .unwrap()
        })
        .collect();
    wait_until("every fiber is parked", || parked(&rt) == N as usize);
    let small = N - N.div_ceil(BIG_EVERY);
    wait_until("the small ones are compacted", || rt.metrics().stack_compactions >= small);
    let m = rt.metrics();
    assert!(m.compacted_stack_bytes > 0 && m.compacted_stack_bytes <= small * 16384, "{m}");
    assert!(m.compaction_releases < small, "adjacent stacks share a madvise: {m}");
    drop(closed);
    for (i, h) in handles.into_iter().enumerate() {
        let i = i as u64;
        let expected = deep(i, depth_of(i), &mut || ());
        assert_eq!(h.join().unwrap(), expected);
    }
    let m = rt.metrics();
    assert_eq!(m.stack_compactions, small, "the big ones stayed, each small one once: {m}");
    assert_eq!(m.stack_restores, small, "every compacted stack was restored: {m}");
    assert_eq!(m.compacted_stack_bytes, 0, "{m}");
}

/// Unparks from plain threads race the compactor, round after round, until some of them
/// landed while the compactor held their fiber (`Metrics::unparks_during_compaction`): no
/// wake-up is lost (every round completes), no fiber runs on a half-saved or half-restored stack
/// (each checks its locals every round), and every compaction is undone by a restore.
#[test]
fn unparks_racing_compaction_are_never_lost() {
    const FIBERS: usize = 256;
    const RACES: u64 = 500;
    const MAX_ROUNDS: usize = 3000;
    const EXIT: u64 = u64::MAX;
    // Passes every millisecond, compacting anything parked at the time.
    // SAFETY: these fibers lend their stacks to nobody.
    let rt = unsafe { vt::Runtime::builder().compact_parked_after(Some(Duration::from_nanos(1))) }
        .carriers(2)
        .supervisor_interval(Duration::from_millis(1))
        .deadlock_report(None)
        .build()
        .unwrap();
    let tickets: Arc<Vec<AtomicU64>> = Arc::new((0..FIBERS).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicUsize::new(0));
    let fibers: Vec<_> = (0..FIBERS)
        .map(|i| {
            let (tickets, done) = (tickets.clone(), done.clone());
            rt.spawn(move || {
                let mut local = pattern(i as u64);
                for round in 1.. {
                    let sum = checksum(&local);
                    while tickets[i].load(Ordering::Acquire) < round {
                        vt::park();
                    }
                    assert_eq!(checksum(std::hint::black_box(&local)), sum, "fiber {i}, round {round}");
                    if tickets[i].load(Ordering::Acquire) == EXIT {
                        return round;
                    }
                    local = pattern(local[round as usize % 16] ^ round);
                    done.fetch_add(1, Ordering::Release);
                }
                unreachable!()
            })
        })
        .collect();
    let handles = Arc::new(fibers.iter().map(|f| f.fiber().clone()).collect::<Vec<_>>());
    let (start, stop) = (Arc::new(Barrier::new(2)), Arc::new(AtomicBool::new(false)));
    let unparkers: Vec<_> = (0..2u64)
        .map(|t| {
            let (tickets, done, handles) = (tickets.clone(), done.clone(), handles.clone());
            let (start, stop, rt) = (start.clone(), stop.clone(), rt.handle());
            std::thread::spawn(move || {
                let mut rng = 0x2545_F491_4F6C_DD1Du64 ^ t;
                let mine = (t as usize..FIBERS).step_by(2);
                for round in 1.. {
                    start.wait();
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    // Each thread wakes half the fibers, with a little jitter between unparks.
                    for i in mine.clone() {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        for _ in 0..rng % 256 {
                            std::hint::spin_loop();
                        }
                        tickets[i].store(round, Ordering::Release);
                        handles[i].unpark();
                    }
                    // The round ends when every fiber took its ticket.
                    wait_until("every fiber took its ticket (else a wake-up was lost)", || {
                        done.load(Ordering::Acquire) >= FIBERS * round as usize
                    });
                    let raced = rt.metrics().unparks_during_compaction;
                    if t == 0 && (raced >= RACES || round >= MAX_ROUNDS as u64) {
                        stop.store(true, Ordering::Relaxed); // the barrier publishes it
                    }
                }
                for i in mine {
                    tickets[i].store(EXIT, Ordering::Release);
                    handles[i].unpark();
                }
            })
        })
        .collect();
    for u in unparkers {
        u.join().unwrap();
    }
    let rounds: Vec<u64> = fibers.into_iter().map(|f| f.join().unwrap()).collect();
    assert!(rounds.iter().all(|&r| r == rounds[0]), "every fiber saw every round");
    let m = rt.metrics();
    assert!(m.unparks_during_compaction > 0, "no unpark met the compactor in {} rounds: {m}", rounds[0]);
    assert_eq!(m.stack_restores, m.stack_compactions, "{m}");
}

/// A dump shows compacted fibers as parked, on what they wait for.
#[test]
fn dumps_show_compacted_fibers_as_parked() {
    let rt = compacting(1);
    let (tx, rx) = vt::channel::bounded::<()>(0);
    let handles: Vec<_> = (0..20)
        .map(|_| {
            let rx = rx.clone();
            rt.spawn(move || rx.recv())
        })
        .collect();
    wait_until("all are compacted", || rt.metrics().stack_compactions >= 20);
    let dump = rt.dump();
    let on_channel = dump
        .fibers()
        .iter()
        .filter(|f| matches!(f.state, vt::FiberState::Parked { reason: vt::WaitReason::ChannelRecv, .. }))
        .count();
    assert_eq!(on_channel, 20, "{dump}");
    assert!(dump.to_string().contains("20 fibers parked on channel receive"), "{dump}");
    drop(tx);
    for h in handles {
        assert!(h.join().unwrap().is_err(), "the sender is gone");
    }
}

/// Dropping a runtime unwinds its parked fibers: compacted ones get their stacks back first, so
/// the destructors of their locals run and see what they left.
#[test]
fn runtime_drop_restores_then_unwinds_compacted_fibers() {
    struct Guard {
        seed: u64,
        frame: [u64; 16],
        dropped: Arc<AtomicUsize>,
        intact: Arc<AtomicBool>,
    }
    impl Drop for Guard {
        fn drop(&mut self) {
            if self.frame != pattern(self.seed) {
                self.intact.store(false, Ordering::Relaxed);
            }
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
    const N: usize = 64;
    let rt = compacting(2);
    let dropped = Arc::new(AtomicUsize::new(0));
    let intact = Arc::new(AtomicBool::new(true));
    let handles: Vec<_> = (0..N)
        .map(|i| {
            let guard = Guard {
                seed: i as u64,
                frame: pattern(i as u64),
                dropped: dropped.clone(),
                intact: intact.clone(),
            };
            rt.spawn(move || {
                let guard = std::hint::black_box(guard);
                loop {
                    vt::park(); // nobody unparks it: only the runtime's drop ends this
                    std::hint::black_box(&guard);
                }
            })
        })
        .collect();
    wait_until("all are compacted", || rt.metrics().stack_compactions >= N as u64);
    drop(rt);
    assert_eq!(dropped.load(Ordering::Relaxed), N, "every guard was dropped");
    assert!(intact.load(Ordering::Relaxed), "a guard saw its frame changed");
    for h in handles {
        assert!(h.join().is_err(), "cancelled");
    }
}

/// A parent whose stack others write into while it is parked (its helpers wait on a gate
/// until the compactor has passed, then fill the parent's array) is never compacted: it finds
/// every write. The cases are `vt`'s lending APIs, and `no_compaction` around
/// `std::thread::scope`. Were the parent compacted, its restore would copy the old bytes back
/// over the helpers' writes.
///
/// "The compactor has passed": every parked fiber but the parent is compacted, a sentinel that
/// parked after the parent included, so the pass that took the sentinel saw the parent parked
/// for longer.
#[test]
fn fibers_that_lend_their_stack_are_not_compacted() {
    type Case = fn(&vt::Handle, &vt::sync::RwLock<()>, &mut [u64; 64]);
    // (name, fibers parked once all wait: the parent and its helper fibers, the case)
    let cases: [(&str, usize, Case); 5] = [
        ("scope", 65, |_, gate, arr| {
            vt::scope(|s| {
                for (i, x) in arr.iter_mut().enumerate() {
                    s.spawn(move || {
                        let _open = gate.read().unwrap();
                        *x = i as u64 + 1;
                    });
                }
            })
        }),
        ("join", 2, |_, gate, arr| {
            let (a, b) = arr.split_at_mut(32);
            vt::join(
                || {
                    // The parent itself waits in `a`, while `b`'s fiber may write `b`.
                    let _open = gate.read().unwrap();
                    a.iter_mut().enumerate().for_each(|(i, x)| *x = i as u64 + 1);
                },
                || {
                    let _open = gate.read().unwrap();
                    b.iter_mut().enumerate().for_each(|(i, x)| *x = i as u64 + 33);
                },
            );
        }),
        ("block_on", 2, |rt, gate, arr| {
            rt.block_on(|| {
                let _open = gate.read().unwrap();
                arr.iter_mut().enumerate().for_each(|(i, x)| *x = i as u64 + 1);
            })
        }),
        ("ThreadPool::scope", 5, |_, gate, arr| {
            let pool = vt::ThreadPool::new(4); // 4 helper fibers; the other jobs queue
            pool.scope(|s| {
                for (i, x) in arr.iter_mut().enumerate() {
                    s.execute(move || {
                        let _open = gate.read().unwrap();
                        *x = i as u64 + 1;
                    });
                }
            });
        }),
        ("no_compaction + std::thread::scope", 1, |_, gate, arr| {
            let (tx, rx) = vt::channel::bounded::<()>(1);
            vt::no_compaction(|| {
                std::thread::scope(|s| {
                    s.spawn(|| {
                        let _open = gate.read().unwrap(); // a plain thread: blocks it
                        arr.iter_mut().enumerate().for_each(|(i, x)| *x = i as u64 + 1);
                        tx.send(()).unwrap();
                    });
                    rx.recv().unwrap(); // the fiber parks while the thread borrows its stack
                });
            });
        }),
    ];
    for (name, fibers, case) in cases {
        // One carrier: `std::thread::scope` must end on the carrier it began on.
        let rt = compacting(1);
        let gate = Arc::new(vt::sync::RwLock::new(()));
        let closed = gate.write().unwrap();
        let parent = {
            let (gate, handle) = (gate.clone(), rt.handle());
            rt.spawn(move || {
                let mut arr = [0u64; 64];
                case(&handle, &gate, &mut arr);
                arr
            })
        };
        wait_until("the parent and its helpers wait", || parked(&rt) == fibers);
        let (sentinel, rx) = vt::channel::bounded::<()>(0);
        rt.spawn(move || rx.recv());
        wait_until("the sentinel waits", || parked(&rt) == fibers + 1);
        let others = fibers as u64; // the helpers and the sentinel
        wait_until("all but the parent are compacted", || rt.metrics().stack_compactions >= others);
        drop(closed);
        let arr = parent.join().unwrap();
        let expected: [u64; 64] = std::array::from_fn(|i| i as u64 + 1);
        assert_eq!(arr, expected, "{name}: the helpers' writes into the parked parent's stack");
        assert_eq!(rt.metrics().stack_compactions, others, "{name}: the parent was never compacted");
        drop(sentinel);
    }
}

/// Sleeping fibers are compacted too, and their timers wake them: the timer's unpark takes the
/// same path as any other. With the deadlock report on (the default: pending timers keep it
/// quiet), so that the supervisor compacts from inside its quiet-period wait.
#[test]
fn sleeping_fibers_are_compacted_and_woken_by_their_timers() {
    const N: u64 = 50;
    // SAFETY: these fibers lend their stacks to nobody.
    let rt = unsafe { vt::Runtime::builder().compact_parked_after(Some(Duration::from_millis(1))) }
        .carriers(2)
        .build()
        .unwrap();
    let handles: Vec<_> = (0..N)
        .map(|i| {
            rt.spawn(move || {
                // Two seconds: the compactor takes it within a few supervisor ticks (10 ms).
                deep(i, depth_of(i), &mut || vt::sleep(Duration::from_secs(2)))
            })
        })
        .collect();
    wait_until("the sleepers are compacted", || rt.metrics().stack_compactions >= N);
    for (i, h) in handles.into_iter().enumerate() {
        let i = i as u64;
        assert_eq!(h.join().unwrap(), deep(i, depth_of(i), &mut || ()));
    }
    let m = rt.metrics();
    assert_eq!(m.stack_restores, m.stack_compactions, "{m}");
}

/// Runs `test` of this binary in a child process with `case` and `env`; returns its exit
/// status and stderr.
fn run_child(test: &str, case: &str, env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    let out = common::rerun_self(test, CHILD, case)
        .envs(env.iter().copied())
        .output()
        .expect("re-exec the test binary");
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The child of `guard_pages_survive_compaction`: fibers are compacted and woken, then one of
/// them, on a stack that was released, runs off its end: the guard page must still be there.
fn compact_then_overflow() {
    #[allow(unconditional_recursion)] // running off the stack is the point
    fn recurse(n: u64) -> u64 {
        let buf = std::hint::black_box([n; 64]);
        recurse(n + 1) + buf[3]
    }
    let rt = compacting(2);
    let gate = Arc::new(vt::sync::RwLock::new(()));
    let closed = gate.write().unwrap();
    let (go, overflow) = vt::channel::bounded::<()>(1);
    let handles: Vec<_> = (0..20u64)
        .map(|i| {
            let (gate, overflow) = (gate.clone(), overflow.clone());
            vt::Builder::new()
                .name(format!("compacted-{i}"))
                .spawn_on(&rt.handle(), move || {
                    let sum = deep(i, depth_of(i), &mut || drop(gate.read().unwrap()));
                    if i == 0 {
                        overflow.recv().unwrap();
                        recurse(0);
                    }
                    sum
                })
                .unwrap()
        })
        .collect();
    wait_until("all are compacted", || rt.metrics().stack_compactions >= 20);
    drop(closed);
    let mut handles = handles.into_iter();
    let first = handles.next().unwrap();
    for (i, h) in handles.enumerate() {
        let i = i as u64 + 1;
        assert_eq!(h.join().unwrap(), deep(i, depth_of(i), &mut || ()));
    }
    eprintln!("compacted and restored: ok");
    go.send(()).unwrap();
    let r = first.join();
    unreachable!("the overflow must abort the process, got {:?}", r.map(|_| ()));
}

/// Guard pages survive the release of compacted stacks, with either kind of guard: a fiber
/// whose stack was compacted and restored still gets the overflow report.
#[test]
fn guard_pages_survive_compaction() {
    const TEST: &str = "guard_pages_survive_compaction";
    if std::env::var(CHILD).as_deref() == Ok("overflow") {
        compact_then_overflow();
    }
    for guard in ["marker", "mprotect"] {
        let (status, stderr) = run_child(TEST, "overflow", &[("VT_STACK_GUARD", guard)]);
        assert!(stderr.contains("compacted and restored: ok"), "{guard}: {stderr}");
        assert_eq!(status.signal(), Some(libc::SIGABRT), "{guard}: {stderr}");
        assert!(
            stderr.contains("'compacted-0'") && stderr.contains("has overflowed its stack"),
            "{guard}: {stderr}"
        );
    }
}

/// Resident set size of this process, from `/proc/self/statm`.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Writes 48 KiB of stack, then returns: twelve pages resident below where the fiber parks.
#[inline(never)]
fn excursion() {
    let a = std::hint::black_box([1u8; 48 * 1024]);
    std::hint::black_box(&a);
}

/// The memory goes back to the OS: fibers that wrote 48 KiB of stack and then parked shallow
/// hold twelve pages each; compacted, they hold their live bytes on the heap (a few KiB in a
/// debug build). Measured in a child process, where no other test allocates meanwhile.
#[test]
fn compaction_gives_the_pages_back() {
    const TEST: &str = "compaction_gives_the_pages_back";
    const N: usize = 2000;
    if std::env::var(CHILD).as_deref() == Ok("rss") {
        let rt = compacting(2);
        let gate = Arc::new(vt::sync::RwLock::new(()));
        let closed = gate.write().unwrap();
        let before = rss();
        let handles: Vec<_> = (0..N)
            .map(|_| {
                let gate = gate.clone();
                vt::Builder::new()
                    .stack_size(128 * 1024)
                    .spawn_on(&rt.handle(), move || {
                        excursion();
                        drop(gate.read().unwrap());
                    })
                    .unwrap()
            })
            .collect();
        wait_until("all are compacted", || rt.metrics().stack_compactions >= N as u64);
        let per_fiber = rss().saturating_sub(before) / N as u64;
        eprintln!("{per_fiber} bytes per compacted fiber");
        assert!(per_fiber <= 12 * 1024, "{per_fiber} bytes per fiber; without compaction at least 48 KiB");
        drop(closed);
        handles.into_iter().for_each(|h| h.join().unwrap());
        return;
    }
    let (status, stderr) = run_child(TEST, "rss", &[]);
    assert!(status.success() && stderr.contains("bytes per compacted fiber"), "{stderr}");
}
