//! `tracing` spans that follow their fiber (cargo feature `tracing`). A subscriber keeps the
//! spans entered on a thread in a per-thread stack (tracing-subscriber's `Registry`), and fibers
//! share their carrier's thread: a span entered in one fiber and held across a wait would be
//! the current span of whatever fiber runs next there. So a fiber leaves every span on the
//! thread's stack just before it switches out, keeping their ids in the switching frame, and
//! enters them again, outermost first, when it resumes: to the subscriber the fiber's spans
//! are entered exactly while it runs, as tokio's `Instrument` enters a future's span around each
//! poll. The carrier itself enters none, so whatever is on the stack at a switch is the fiber's.
//! `vt::spawn` runs the child inside the spawner's current span (`in_current_span`).
//! See `arch/diagnostics.md`, "`tracing` spans follow their fiber".

use tracing::dispatcher;
use tracing::span::Id;

/// Spans a fiber held at its switch, innermost first; held in place up to `INLINE`.
pub(crate) struct Held {
    inline: [u64; INLINE],
    len: usize,
    more: Vec<u64>,
}

const INLINE: usize = 8;
/// A subscriber whose current span does not change when it is exited would loop for ever.
const MAX_DEPTH: usize = 256;

impl Held {
    fn push(&mut self, id: u64) {
        if self.len < INLINE {
            self.inline[self.len] = id;
        } else {
            self.more.push(id);
        }
        self.len += 1;
    }

    fn get(&self, i: usize) -> u64 {
        if i < INLINE { self.inline[i] } else { self.more[i - INLINE] }
    }
}

/// Leaves every span entered on this thread (the running fiber's), innermost first.
#[inline]
pub(crate) fn leave() -> Held {
    let mut held = Held { inline: [0; INLINE], len: 0, more: Vec::new() };
    if !dispatcher::has_been_set() {
        return held;
    }
    dispatcher::get_default(|d| {
        while held.len < MAX_DEPTH {
            let current = d.current_span();
            let Some(id) = current.id() else { break };
            held.push(id.into_u64());
            d.exit(id);
        }
    });
    held
}

/// Enters again what `leave` left, outermost first.
#[inline]
pub(crate) fn enter_again(held: Held) {
    if held.len == 0 {
        return;
    }
    dispatcher::get_default(|d| {
        for i in (0..held.len).rev() {
            d.enter(&Id::from_u64(held.get(i)));
        }
    });
}

/// `f`, run inside the caller's current span (tokio's `in_current_span`).
pub(crate) fn in_current_span<F: FnOnce() -> T, T>(f: F) -> impl FnOnce() -> T {
    let span = tracing::Span::current();
    move || {
        let _in = span.enter();
        f()
    }
}
