//! A channel gives back the memory its buffer grew to once it drains: a burst into an
//! unbounded channel must not stay allocated for the channel's life (crossbeam frees its
//! blocks as they are read). Its own test binary, because it counts every allocation of the
//! process with a global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use virtual_threads as vt;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to `System` unchanged; the counter is only arithmetic on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `System`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// 100,000 messages of 8 bytes sent before any is received, then received (by `recv`,
/// `try_recv` and `select!`, one round each): the channel holds at most a few KiB once empty,
/// and a second burst does not add to the first.
#[test]
fn a_drained_buffer_gives_its_memory_back() {
    const N: u64 = 100_000;
    for how in 0..3 {
        let (tx, rx) = vt::channel::unbounded::<u64>();
        let before = LIVE.load(Ordering::Relaxed);
        for round in 0..2 {
            for i in 0..N {
                tx.send(i).unwrap();
            }
            let peak = LIVE.load(Ordering::Relaxed) - before;
            assert!(peak >= (N * 8) as isize, "round {round}: {peak} bytes at the peak");
            for i in 0..N {
                let got = match how {
                    0 => rx.recv().unwrap(),
                    1 => rx.try_recv().unwrap(),
                    _ => vt::select! { recv(rx) -> v => v.unwrap() },
                };
                assert_eq!(got, i);
            }
            let left = LIVE.load(Ordering::Relaxed) - before;
            assert!(left < 16 * 1024, "way {how}, round {round}: {left} bytes still held after draining");
        }
    }
}
