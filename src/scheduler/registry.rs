//! Fibers that are parked, so that dropping a runtime can find and unwind them.
//!
//! A runnable fiber is reachable from a queue; a parked one only from whoever will wake it
//! (a wait list, a timer, a user's `Fiber` handle), which the runtime cannot enumerate. So a
//! fiber is entered here the first time it parks (by the carrier that parks it, into that
//! carrier's shard: no global lock) and leaves when it finishes. Fibers that never park (most
//! fork-join children) never touch it.

use std::sync::Mutex;

use crate::fiber::FiberRef;

#[derive(Default)]
struct Slab {
    slots: Vec<Option<FiberRef>>,
    free: Vec<usize>,
}

pub(crate) struct Registry {
    shards: Box<[Mutex<Slab>]>,
}

impl Registry {
    pub(crate) fn new(shards: usize) -> Registry {
        Registry { shards: (0..shards).map(|_| Mutex::new(Slab::default())).collect() }
    }

    /// Enters a fiber (carrier side, while the fiber is switching out to park).
    pub(crate) fn insert(&self, shard: usize, f: &FiberRef) {
        if f.registry_slot.get().is_some() {
            return;
        }
        let mut s = self.shards[shard].lock().unwrap_or_else(|e| e.into_inner());
        let idx = match s.free.pop() {
            Some(i) => {
                s.slots[i] = Some(f.clone());
                i
            }
            None => {
                s.slots.push(Some(f.clone()));
                s.slots.len() - 1
            }
        };
        f.registry_slot.set(Some((shard, idx)));
    }

    /// Removes a finished fiber.
    pub(crate) fn remove(&self, f: &FiberRef) {
        if let Some((shard, idx)) = f.registry_slot.take() {
            let mut s = self.shards[shard].lock().unwrap_or_else(|e| e.into_inner());
            s.slots[idx] = None;
            s.free.push(idx);
        }
    }

    /// Takes one entered fiber out (runtime drop, after the carriers stopped: nothing is
    /// inserted any more, so the free list can be dropped as the slab shrinks).
    pub(crate) fn pop_one(&self) -> Option<FiberRef> {
        for shard in self.shards.iter() {
            let mut s = shard.lock().unwrap_or_else(|e| e.into_inner());
            s.free.clear();
            while let Some(slot) = s.slots.pop() {
                if let Some(f) = slot {
                    f.registry_slot.set(None);
                    return Some(f);
                }
            }
        }
        None
    }

    /// Parked fibers entered now (a snapshot).
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(|e| e.into_inner());
                s.slots.len() - s.free.len()
            })
            .sum()
    }
}
