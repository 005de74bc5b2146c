//! Fiber roots: every fiber record a runtime ever allocated, so that dumps, the deadlock check
//! and the runtime's drop can find every live fiber.
//!
//! Records are pooled and reused, never freed while the runtime's state lives, so the set of
//! all records is a superset of the live fibers that costs nothing per spawn: a record enters
//! its carrier's shard once, when the pool grows, and a fiber is live exactly while its record
//! is counted and not `DONE` (`FiberRef::upgrade`). A finished fiber is out of every walk the
//! moment it finishes; nothing waits for a sweep. See `arch/diagnostics.md`.
//!
//! ```text
//!  shard 0 (carrier 0) | rec rec rec ...      shard k: records allocated by carrier k
//!  shard n (outside)   | rec ...              (plain threads that spawned)
//! ```

use std::ptr::NonNull;
use std::sync::Mutex;

use super::{CachePadded, RecordPtr};
use crate::fiber::stack::SizeClass;
use crate::fiber::{FiberRecord, FiberRef};

/// Records copied out of a shard per lock, so a walk never holds a carrier's shard for long.
const WALK_CHUNK: usize = 1024;

/// Shards for carriers at most; carriers past it share (a shard is locked only when a pool
/// grows and by walks, so sharing costs little).
const MAX_CARRIER_SHARDS: usize = 256;
/// Records allocated together: one allocation per 16 records rather than one each (fewer
/// malloc calls on a pool's growth, no per-record chunk header, neighbours adjacent).
const SLAB: usize = 16;

/// One slab: a leaked `Box<[FiberRecord]>` of `SLAB` records.
struct Slab(NonNull<[FiberRecord]>);

// SAFETY: a slab is only a way to free its records at the end (`free_all`), and
// `FiberRecord` is `Send`.
unsafe impl Send for Slab {}

pub(crate) struct Roots {
    shards: Box<[CachePadded<Mutex<Vec<RecordPtr>>>]>,
    /// Every slab, freed with the runtime's state.
    slabs: Mutex<Vec<Slab>>,
}

impl Roots {
    /// A shard per carrier (carriers past `MAX_CARRIER_SHARDS` share them, round robin) plus
    /// one for plain threads: `max_carriers` may be a million, and a shard is two cache lines.
    pub(crate) fn new(carriers: usize) -> Roots {
        Roots {
            shards: (0..=carriers.min(MAX_CARRIER_SHARDS))
                .map(|_| CachePadded(Mutex::new(Vec::new())))
                .collect(),
            slabs: Mutex::new(Vec::new()),
        }
    }

    /// How many shards there are (a walk's cursor is past the end at this shard index).
    pub(crate) fn shards(&self) -> usize {
        self.shards.len()
    }

    /// Index of the shard for records allocated by carrier `i`.
    pub(crate) fn carrier_shard(&self, i: usize) -> usize {
        i % (self.shards.len() - 1)
    }

    /// Index of the shard for records allocated outside the carriers.
    pub(crate) fn outside(&self) -> usize {
        self.shards.len() - 1
    }

    /// A new blank record, entered in `shard` with a slab of others, which go to `spares`
    /// (the pool ran dry: not on the steady-state path).
    pub(crate) fn alloc(
        &self,
        shard: usize,
        class: &'static SizeClass,
        spares: &mut Vec<NonNull<FiberRecord>>,
    ) -> NonNull<FiberRecord> {
        let slab: Box<[FiberRecord]> = (0..SLAB).map(|_| FiberRecord::blank(class)).collect();
        let slab = NonNull::from(Box::leak(slab));
        // SAFETY: just leaked: valid, and ours alone until the pointers below are handed out.
        let records = unsafe { &*slab.as_ptr() }.iter().map(NonNull::from);
        self.shards[shard].lock().unwrap_or_else(|e| e.into_inner()).extend(records.clone().map(RecordPtr));
        self.slabs.lock().unwrap_or_else(|e| e.into_inner()).push(Slab(slab));
        let mut records = records;
        let first = records.next().expect("a slab holds records");
        spares.extend(records);
        first
    }

    /// Calls `f` with a reference to every live fiber (counted, not finished).
    pub(crate) fn for_each_live(&self, mut f: impl FnMut(FiberRef)) {
        let mut chunk: Vec<NonNull<FiberRecord>> = Vec::with_capacity(WALK_CHUNK);
        for shard in self.shards.iter() {
            let mut start = 0;
            loop {
                chunk.clear();
                {
                    let s = shard.lock().unwrap_or_else(|e| e.into_inner());
                    chunk.extend(s.iter().skip(start).take(WALK_CHUNK).map(|r| r.0));
                }
                if chunk.is_empty() {
                    break;
                }
                start += chunk.len();
                for &p in &chunk {
                    // SAFETY: records are freed only with the runtime's state (`free_all`),
                    // which outlives this walk (the caller holds a reference to it).
                    if let Some(r) = unsafe { FiberRef::upgrade(p) } {
                        if r.state() != crate::fiber::DONE {
                            f(r);
                        }
                    }
                }
            }
        }
    }

    /// Copies the next records of a walk into `out`, from `cursor` (shard, index), which it
    /// advances; false when the walk is over. For walks that must not take a reference to
    /// every record (the compactor reads two atomics of each, then claims a few).
    pub(crate) fn chunk(&self, cursor: &mut (usize, usize), out: &mut Vec<NonNull<FiberRecord>>) -> bool {
        out.clear();
        while cursor.0 < self.shards.len() {
            {
                let s = self.shards[cursor.0].lock().unwrap_or_else(|e| e.into_inner());
                out.extend(s.get(cursor.1..).unwrap_or(&[]).iter().take(WALK_CHUNK).map(|r| r.0));
            }
            if out.is_empty() {
                *cursor = (cursor.0 + 1, 0);
                continue;
            }
            cursor.1 += out.len();
            return true;
        }
        false
    }

    /// Frees every record (the runtime's state is being dropped: no reference to any is left,
    /// since each live record holds a reference to that state).
    pub(crate) fn free_all(&mut self) {
        for shard in self.shards.iter_mut() {
            shard.0.get_mut().unwrap_or_else(|e| e.into_inner()).clear();
        }
        for slab in self.slabs.get_mut().unwrap_or_else(|e| e.into_inner()).drain(..) {
            // SAFETY: every slab was leaked by `alloc` and is listed here once; nothing refers
            // to its records any more (see above).
            drop(unsafe { Box::from_raw(slab.0.as_ptr()) });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    /// Every way a parked fiber is woken hands its run reference on (`FiberRef::take_parked_ref`)
    /// and the carrier that parks it keeps it there: if one path took a reference too many or
    /// too few, records would either be reused while live (valgrind and the state checks catch
    /// that) or never come back to the pool, and the arena would grow by the round's fibers
    /// every round. Waking paths exercised: unpark, timer, a channel hand-off, join.
    #[test]
    fn records_come_back_after_parks_of_every_kind() {
        let rt = crate::Runtime::builder().carriers(2).build().unwrap();
        let round = || {
            rt.block_on(|| {
                let (tx, rx) = crate::channel::bounded::<u32>(1);
                let sleepers: Vec<_> =
                    (0..50).map(|_| crate::spawn(|| crate::sleep(Duration::from_micros(200)))).collect();
                let parkers: Vec<_> = (0..50).map(|_| crate::spawn(crate::park)).collect();
                let receiver = crate::spawn(move || (0..50).map(|_| rx.recv().unwrap()).sum::<u32>());
                for i in 0..50 {
                    tx.send(i).unwrap();
                }
                for p in &parkers {
                    p.fiber().unpark();
                }
                parkers.into_iter().chain(sleepers).for_each(|h| h.join().unwrap());
                assert_eq!(receiver.join().unwrap(), (0..50).sum::<u32>());
            })
        };
        let handle = rt.handle();
        let records = || handle.runtime().roots.shards.iter().map(|s| s.lock().unwrap().len()).sum::<usize>();
        for _ in 0..5 {
            round();
        }
        let settled = records();
        for _ in 0..40 {
            round();
        }
        // 40 rounds of 102 fibers would add 4,080 records if none came back; the caches and
        // pools may still move a few batches around.
        assert!(
            records() <= settled + 2 * super::super::RECORD_CACHE,
            "{settled} records grew to {}",
            records()
        );
    }
}
