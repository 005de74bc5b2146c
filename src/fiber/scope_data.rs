//! What a scoped fiber's record tells its scope (`vt::scope`, `ThreadPool::scope`) when its
//! result is taken or dropped: a count, and the first unjoined panic. The record holds it
//! (`FiberRecord::scope`) and the join protocol tells it (`join.rs`), so it lives in fiber/;
//! the scope API on top is `scope.rs`.

use std::any::Any;
use std::panic::resume_unwind;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::loom::StdMutex as Mutex;

use super::handle::Fiber;

pub(crate) struct ScopeData {
    /// Fibers of the scope whose result is not yet taken or dropped.
    pub(crate) running: AtomicUsize,
    pub(crate) a_fiber_panicked: AtomicBool,
    /// The payload of the first unjoined fiber's panic, resumed by `scope` at its end.
    pub(crate) first_panic: FirstPanic,
    /// The fiber (or thread) waiting in `scope` for the count to reach zero.
    pub(crate) main: Fiber,
}

/// The first of several panics' payloads: a scope resumes it at its end, as rayon's does
/// (std's scope panics with a message of its own, and the payload is lost).
#[derive(Default)]
pub(crate) struct FirstPanic(Mutex<Option<Box<dyn Any + Send>>>);

impl FirstPanic {
    /// Keeps `payload` if it is the first; a later one is dropped.
    pub(crate) fn keep(&self, payload: Box<dyn Any + Send>) {
        let mut first = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if first.is_none() {
            *first = Some(payload);
        } else {
            drop(first);
            // Outside the lock: a payload's destructor is user code.
            drop(payload);
        }
    }

    /// Resumes the kept payload (or, if there is none, panics with `otherwise`).
    pub(crate) fn resume(&self, otherwise: &'static str) -> ! {
        let first = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        resume_unwind(first.unwrap_or_else(|| Box::new(otherwise)))
    }
}

impl ScopeData {
    /// A scoped fiber's panic that nobody joined: the scope resumes the first one.
    pub(crate) fn keep_panic(&self, payload: Box<dyn Any + Send>) {
        self.first_panic.keep(payload);
    }

    /// Called when a scoped fiber's packet is dropped.
    pub(crate) fn fiber_done(&self, unhandled_panic: bool) {
        if unhandled_panic {
            self.a_fiber_panicked.store(true, Ordering::Relaxed);
        }
        // Release pairs with the Acquire load in `scope`: the packet's drop happens before the
        // scope returns.
        if self.running.fetch_sub(1, Ordering::Release) == 1 {
            self.main.unpark();
        }
    }
}
