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

    /// Takes every entered fiber out (runtime drop).
    pub(crate) fn drain(&self) -> Vec<FiberRef> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let mut s = shard.lock().unwrap_or_else(|e| e.into_inner());
            out.extend(s.slots.drain(..).flatten());
            s.free.clear();
        }
        for f in &out {
            f.registry_slot.set(None);
        }
        out
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
