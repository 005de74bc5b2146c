//! The execution trace: what each carrier ran, why each fiber waited, and who woke it.
//!
//! Each carrier writes fixed-size events into a ring of its own (one producer: its thread; one
//! consumer: the `vt-trace` writer thread), so recording takes no lock, allocates nothing and
//! touches no line another carrier writes. The carrier finds its ring through one pointer in
//! its slot, null while no trace runs: off, every hook is one relaxed load of a line the
//! carrier owns and a branch that is never taken. A full ring drops the event and counts it;
//! the writer drains the rings every few milliseconds into Chrome trace-event JSON, which
//! Perfetto and `chrome://tracing` open, and the drops go into the trace and to
//! `Runtime::trace_stop`'s caller. Plain threads and the supervisor, which touch shared state
//! anyway, write into one locked buffer. See `arch/diagnostics.md`, "The execution trace", and
//! ADR 0013.

use std::cell::UnsafeCell;
use std::io;
use std::mem::MaybeUninit;
use std::panic::Location;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use super::{CachePadded, CarrierSlot};

mod writer;

/// Events one carrier's ring holds (40 bytes each: 2.5 MiB a carrier). The writer drains every
/// `DRAIN_EVERY`, so a carrier can record about 13 million events a second before it drops.
const RING: usize = 1 << 16;
/// Events the plain threads' and the supervisor's buffer holds between drains.
const PLAIN_CAP: usize = 1 << 14;

/// What an event records. The fields of [`Event`] mean, per kind:
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// A fiber ran: `ts` its start, `x` the fiber id, `y` its end, `z` its spawn site, `a` how
    /// it ended (`End`), `b` its wait byte when it parked, `c` the resumes it took.
    Slice = 1,
    /// `x` spawned `y` (0: a plain thread) at site `z`.
    Spawn,
    /// Eight bytes of fiber `x`'s name, at offset `c`, in `y`, `z` and `b`: names are cut at
    /// `NAME_MAX`.
    Name,
    /// `y` (a fiber id, or 0 for a plain thread or timer: `a` says which) made `x` runnable;
    /// `b` is 1 when the wake carries a stop request.
    Wake,
    /// The carrier slept: `x` nanoseconds up to `ts`.
    Idle,
    /// The carrier took `y` fibers from carrier `x`.
    Steal,
    /// The carrier started (`a` 1: a compensating one, beyond the target count).
    CarrierStart,
    /// A compensating carrier retired.
    CarrierRetire,
    /// The supervisor found carrier `x` blocked in the OS running code from site `z`.
    Blocked,
    /// A compensating carrier `x` was started or woken (`a` 1: woken).
    Compensate,
    /// Fiber `x` panicked.
    Panic,
    /// Fiber `x`'s blocking section (`vt::blocking`, or a site known to block) started at `z`.
    Blocking,
}

/// How a run slice ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum End {
    Yield = 0,
    Park = 1,
    Finish = 2,
}

/// The `a` of a `Wake` from no fiber.
pub(crate) const BY_THREAD: u8 = 1;
pub(crate) const BY_TIMER: u8 = 2;

/// Bytes of a fiber's name a trace keeps.
const NAME_MAX: usize = 48;

/// One recorded event (see [`Kind`] for what the fields hold).
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(crate) struct Event {
    pub(crate) ts: u64,
    pub(crate) x: u64,
    pub(crate) y: u64,
    pub(crate) z: u64,
    pub(crate) kind: u8,
    pub(crate) a: u8,
    pub(crate) b: u16,
    pub(crate) c: u32,
}

impl Event {
    pub(crate) fn new(kind: Kind, x: u64, y: u64, z: u64) -> Event {
        Event { ts: now(), x, y, z, kind: kind as u8, ..Event::default() }
    }
}

/// The site as the writer reads it back: a `&'static Location` lives for the whole process.
pub(crate) fn site(at: &'static Location<'static>) -> u64 {
    at as *const Location<'static> as u64
}

/// The trace's clock: the time-stamp counter where there is one (one instruction, and the
/// carriers' counters agree on the machines this runs on), else nanoseconds since the first
/// call. The writer maps it to microseconds against `Instant`.
#[inline(always)]
pub(crate) fn now() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` exists on every x86_64 CPU and only reads a counter.
        unsafe { std::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        crate::platform::fork::init_once(&EPOCH, std::time::Instant::now).elapsed().as_nanos() as u64
    }
}

/// One carrier's events: a single-producer, single-consumer ring. The producer (the carrier's
/// thread) owns `head` and its cached view of `tail`, the consumer (the writer) owns `tail`; each
/// pair on its own lines.
pub(crate) struct Ring {
    head: CachePadded<(AtomicUsize, AtomicUsize, AtomicU64)>,
    tail: CachePadded<AtomicUsize>,
    buf: Box<[UnsafeCell<MaybeUninit<Event>>]>,
    /// The running trace's zero (`now()` at its start), written before the ring is published
    /// to its carrier: a slice that began earlier is drawn from here (`Carrier::trace_slice`).
    pub(crate) zero: AtomicU64,
}

// SAFETY: a slot of `buf` is written only by the one producer while it is outside
// `tail..head`, and read only by the one consumer while inside (published by `head`'s Release,
// returned by `tail`'s Release); see `push` and `drain`.
unsafe impl Sync for Ring {}
// SAFETY: as above; the ring owns plain data.
unsafe impl Send for Ring {}

impl Ring {
    fn new() -> Ring {
        Ring {
            head: CachePadded((AtomicUsize::new(0), AtomicUsize::new(0), AtomicU64::new(0))),
            tail: CachePadded(AtomicUsize::new(0)),
            buf: (0..RING).map(|_| UnsafeCell::new(MaybeUninit::uninit())).collect(),
            zero: AtomicU64::new(0),
        }
    }

    /// Records `ev`, or counts it as dropped when the ring is full. Called only from the thread
    /// of the carrier that owns the ring. Out of line: the hooks keep only their branch.
    #[inline(never)]
    pub(crate) fn push(&self, ev: Event) {
        let (head, tail_seen, drops) = &self.head.0;
        let h = head.load(Ordering::Relaxed);
        if h.wrapping_sub(tail_seen.load(Ordering::Relaxed)) >= RING {
            let t = self.tail.load(Ordering::Acquire);
            tail_seen.store(t, Ordering::Relaxed);
            if h.wrapping_sub(t) >= RING {
                drops.store(drops.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                return;
            }
        }
        // SAFETY: slot `h` is outside `tail..head` (checked above against the consumer's
        // Acquire-read `tail`), so the consumer does not read it; we are the only producer.
        unsafe { (*self.buf[h % RING].get()).write(ev) };
        head.store(h.wrapping_add(1), Ordering::Release);
    }

    /// Moves every published event into `out`. Called only from the writer thread.
    fn drain(&self, out: &mut Vec<Event>) {
        let t = self.tail.load(Ordering::Relaxed);
        let h = self.head.0.0.load(Ordering::Acquire);
        for i in t..h {
            // SAFETY: slots in `tail..head` were written and published (Acquire on `head`),
            // and the producer does not touch them until `tail` moves past.
            out.push(unsafe { (*self.buf[i % RING].get()).assume_init() });
        }
        self.tail.store(h, Ordering::Release);
    }

    /// Forgets whatever a previous trace left (the writer, before it starts reading).
    fn skip_all(&self) {
        self.tail.store(self.head.0.0.load(Ordering::Acquire), Ordering::Release);
    }

    fn drops(&self) -> u64 {
        self.head.0.2.load(Ordering::Relaxed)
    }
}

/// What [`Runtime::trace_stop`](crate::Runtime::trace_stop) reports of the trace it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TraceSummary {
    /// Where the trace was written.
    pub path: PathBuf,
    /// Events written.
    pub events: u64,
    /// Events lost because a carrier's buffer was full when they happened (the writer thread
    /// fell behind); the trace says so too, per carrier.
    pub dropped: u64,
}

/// A runtime's recorder: the rings (made for a carrier the first time a trace runs while it
/// exists, and kept until the runtime goes), the plain threads' buffer and the writer.
#[derive(Default)]
pub(crate) struct Recorder {
    inner: Arc<Inner>,
    active: Mutex<Option<Active>>,
}

#[derive(Default)]
struct Inner {
    rings: Mutex<Vec<Option<Arc<Ring>>>>,
    /// Whether plain threads and the supervisor record (the carriers look at their slots).
    on: AtomicBool,
    plain: Mutex<Vec<Event>>,
    plain_drops: AtomicU64,
    stop: AtomicBool,
    /// The running trace's zero, for a carrier that attaches while it runs.
    zero: AtomicU64,
}

struct Active {
    path: PathBuf,
    writer: thread::JoinHandle<io::Result<TraceSummary>>,
}

impl Recorder {
    /// Starts a trace into `path`; `slots` are the carriers started so far, whose ring pointers
    /// it sets (a carrier started later asks `attach`).
    pub(crate) fn start(&self, path: &Path, slots: &mut dyn Iterator<Item = &CarrierSlot>) -> io::Result<()> {
        let mut active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = active.as_ref() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("a trace is already being recorded (to {}): trace_stop it first", a.path.display()),
            ));
        }
        let file = std::fs::File::create(path).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot create the trace file {}: {e}", path.display()))
        })?;
        self.inner.stop.store(false, Ordering::Relaxed);
        self.inner.plain.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.inner.plain_drops.store(0, Ordering::Relaxed);
        // The trace's zero, before any carrier can record: no event is stamped earlier.
        let started = (std::time::Instant::now(), now());
        self.inner.zero.store(started.1, Ordering::Relaxed);
        let mut rings = self.inner.rings.lock().unwrap_or_else(|e| e.into_inner());
        let mut first_drops = Vec::new();
        for (i, slot) in slots.enumerate() {
            let ring = ring_for(&mut rings, i);
            ring.skip_all();
            first_drops.push(ring.drops());
            ring.zero.store(started.1, Ordering::Relaxed);
            slot.set_trace(Arc::as_ptr(ring).cast_mut());
        }
        drop(rings);
        self.inner.on.store(true, Ordering::Release);
        let inner = self.inner.clone();
        let writer =
            crate::platform::fork::spawn(thread::Builder::new().name("vt-trace".into()), move || {
                writer::run(&inner, file, first_drops, started)
            });
        let writer = match writer {
            Ok(w) => w,
            Err(e) => {
                self.detach_all();
                return Err(io::Error::new(e.kind(), format!("cannot start the trace's writer thread: {e}")));
            }
        };
        *active = Some(Active { path: path.to_owned(), writer });
        Ok(())
    }

    /// A carrier that starts while a trace runs records into it too.
    pub(crate) fn attach(&self, i: usize, slot: &CarrierSlot) {
        let active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        if active.is_none() {
            return;
        }
        let mut rings = self.inner.rings.lock().unwrap_or_else(|e| e.into_inner());
        let ring = ring_for(&mut rings, i);
        ring.zero.store(self.inner.zero.load(Ordering::Relaxed), Ordering::Relaxed);
        slot.set_trace(Arc::as_ptr(ring).cast_mut());
    }

    fn detach_all(&self) {
        self.inner.on.store(false, Ordering::Release);
        self.inner.stop.store(true, Ordering::Release);
    }

    /// Ends the trace: the carriers stop recording, the writer drains what is left, closes the
    /// JSON and reports. `None` when no trace runs.
    pub(crate) fn stop(
        &self,
        slots: &mut dyn Iterator<Item = &CarrierSlot>,
    ) -> Option<io::Result<TraceSummary>> {
        let mut active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        let a = active.take()?;
        for slot in slots {
            slot.set_trace(std::ptr::null_mut());
        }
        self.detach_all();
        a.writer.thread().unpark();
        Some(match a.writer.join() {
            Ok(r) => r.map(|s| TraceSummary { path: a.path, ..s }),
            Err(_) => Err(io::Error::other("the trace's writer thread panicked")),
        })
    }

    /// Whether plain threads record now.
    #[inline]
    pub(crate) fn plain_on(&self) -> bool {
        self.inner.on.load(Ordering::Relaxed)
    }

    /// Records an event from a plain thread or the supervisor (`carrier`: the carrier it is
    /// about, for the writer's tracks, or `None`).
    #[cold]
    pub(crate) fn plain(&self, ev: Event) {
        if !self.plain_on() {
            return;
        }
        let mut buf = self.inner.plain.lock().unwrap_or_else(|e| e.into_inner());
        if buf.len() >= PLAIN_CAP {
            drop(buf);
            self.inner.plain_drops.fetch_add(1, Ordering::Relaxed);
            return;
        }
        buf.push(ev);
    }
}

fn ring_for(rings: &mut Vec<Option<Arc<Ring>>>, i: usize) -> &Arc<Ring> {
    if rings.len() <= i {
        rings.resize(i + 1, None);
    }
    rings[i].get_or_insert_with(|| Arc::new(Ring::new()))
}

/// The names of a fiber in `Name` events.
pub(crate) fn name_events(id: u64, name: &str, out: &mut dyn FnMut(Event)) {
    let mut cut = name.len().min(NAME_MAX);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let bytes = &name.as_bytes()[..cut];
    for (k, chunk) in bytes.chunks(18).enumerate() {
        let mut b = [0u8; 18];
        b[..chunk.len()].copy_from_slice(chunk);
        let word = |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().expect("8 bytes"));
        out(Event {
            ts: now(),
            x: id,
            y: word(0..8),
            z: word(8..16),
            kind: Kind::Name as u8,
            a: chunk.len() as u8,
            b: u16::from_le_bytes([b[16], b[17]]),
            c: (k * 18) as u32,
        });
    }
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder").field("on", &self.plain_on()).finish()
    }
}

/// The events of a spawn: the child, its parent (0: a plain thread), its site, and its name.
#[cold]
#[inline(never)]
pub(crate) fn spawned(emit: &mut dyn FnMut(Event), f: &crate::fiber::FiberRecord, parent: u64) {
    emit(Event::new(Kind::Spawn, f.id().as_u64(), parent, site(f.spawned_at())));
    if let Some(name) = f.name() {
        name_events(f.id().as_u64(), name, emit);
    }
}

/// A wake of `f` by `by` (a fiber id, or 0 with `how` saying what woke it).
#[cold]
#[inline(never)]
pub(crate) fn woken(f: &crate::fiber::FiberRecord, by: u64, how: u8) -> Event {
    let mut e = Event::new(Kind::Wake, f.id().as_u64(), by, 0);
    e.a = how;
    e.b = u16::from(f.stop.load(Ordering::Relaxed) & crate::fiber::stop_state::CANCEL != 0);
    e
}

/// A run slice of `f` from `start` to `stop`, ended by `end`, after `resumes` resumes.
pub(crate) fn slice(
    ring: &Ring,
    f: &crate::fiber::FiberRecord,
    start: u64,
    stop: u64,
    end: End,
    resumes: u64,
) {
    ring.push(Event {
        ts: start,
        x: f.id().as_u64(),
        y: stop,
        z: site(f.spawned_at()),
        kind: Kind::Slice as u8,
        a: end as u8,
        b: if end == End::Park { u16::from(f.wait.load(Ordering::Relaxed)) } else { 0 },
        c: resumes.min(u64::from(u32::MAX)) as u32,
    });
}

impl super::Shared {
    /// `Runtime::trace_start`.
    pub(crate) fn trace_start(&self, path: &Path) -> io::Result<()> {
        let n = self.started();
        self.trace.start(path, &mut (0..n).map(|i| &*self.slots[i]))
    }

    /// `Runtime::trace_stop`.
    pub(crate) fn trace_stop(&self) -> Option<io::Result<TraceSummary>> {
        let n = self.started();
        self.trace.stop(&mut (0..n).map(|i| &*self.slots[i]))
    }

    /// A carrier starting (`Carrier::run`): it records into a running trace too.
    pub(crate) fn trace_attach(&self, i: usize) {
        self.trace.attach(i, &self.slots[i]);
    }

    /// The supervisor found carrier `i` blocked in the OS.
    pub(super) fn trace_blocked(&self, i: usize, slot: &super::CarrierSlot) {
        #[cfg(feature = "tracing")]
        {
            let at = slot.location.load(Ordering::Relaxed);
            // SAFETY: `location` only ever holds `&'static Location` pointers, or null.
            let at = unsafe { at.as_ref() }.map(|l| l.to_string()).unwrap_or_default();
            tracing::warn!(target: "virtual_threads", carrier = i, at = %at, "a carrier is blocked in the OS");
        }
        if self.trace.plain_on() {
            let at = slot.location.load(Ordering::Relaxed) as u64;
            self.trace.plain(Event::new(Kind::Blocked, i as u64, 0, at));
        }
    }

    /// Carrier `i` was started (or a retired one woken) to make up for a blocked one.
    pub(super) fn trace_compensation(&self, i: usize, revived: bool) {
        #[cfg(feature = "tracing")]
        tracing::info!(target: "virtual_threads", carrier = i, revived, "compensating carrier");
        if self.trace.plain_on() {
            let mut e = Event::new(Kind::Compensate, i as u64, 0, 0);
            e.a = u8::from(revived);
            self.trace.plain(e);
        }
    }

    /// A fiber spawned from a plain thread (or another runtime's carrier).
    pub(super) fn trace_spawn_remote(&self, f: &crate::fiber::FiberRecord) {
        if self.trace.plain_on() {
            spawned(&mut |e| self.trace.plain(e), f, 0);
        }
    }

    /// A fiber woken from a plain thread (or another runtime's carrier).
    pub(super) fn trace_wake_remote(&self, f: &crate::fiber::FiberRecord) {
        if self.trace.plain_on() {
            self.trace.plain(woken(f, 0, BY_THREAD));
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_full_ring_drops_and_counts_and_a_drain_makes_room() {
        let ring = Ring::new();
        for i in 0..RING as u64 + 5 {
            ring.push(Event { ts: i, ..Event::default() });
        }
        assert_eq!(ring.drops(), 5);
        let mut out = Vec::new();
        ring.drain(&mut out);
        assert_eq!(out.len(), RING);
        assert!(out.iter().enumerate().all(|(i, e)| e.ts == i as u64), "in order, none overwritten");
        ring.push(Event { ts: 7, ..Event::default() });
        out.clear();
        ring.drain(&mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(ring.drops(), 5);
    }

    #[test]
    fn a_name_survives_the_events_it_is_cut_into() {
        let mut evs = Vec::new();
        let name = "a fiber with a rather long name, longer than one event holds: ünïcode";
        name_events(9, name, &mut |e| evs.push(e));
        assert_eq!(evs.len(), NAME_MAX.div_ceil(18));
        let mut bytes = Vec::new();
        for e in &evs {
            let mut b = [0u8; 18];
            b[..8].copy_from_slice(&e.y.to_le_bytes());
            b[8..16].copy_from_slice(&e.z.to_le_bytes());
            b[16..].copy_from_slice(&e.b.to_le_bytes());
            bytes.extend_from_slice(&b[..e.a as usize]);
        }
        assert_eq!(bytes, &name.as_bytes()[..NAME_MAX]);
    }
}
