//! What the `hooks` feature costs a call that does not wait: a 1-byte `read` from a pipe that
//! holds data, through the hook (`libc::read`, which the feature interposes) against the C
//! library's own `read` (found with `dlopen("libc.so.6")`/`dlsym`, so both run in one binary,
//! one process, one criterion run), on a plain thread (the pass-through path) and on a fiber
//! (the descriptor table's path: the pipe is classified once, then each call checks its entry).
//!
//! Run: `cargo bench -p vt-bench --features hooks --bench hooks` (without `--features hooks` the
//! two sides are the same function, which checks the harness). Instruction counts, which a
//! loaded machine does not move: `HOOKS_PROBE=plain-hooked` (or `plain-libc`, `fiber-hooked`,
//! `fiber-libc`) runs `PROBE_READS` reads of that side and exits, for
//! `valgrind --tool=cachegrind --cache-sim=no`; the difference of two probes over `PROBE_READS`
//! is the hook's instructions per call. `HOOKS_ALTERNATE=<rounds>` times the plain thread's two
//! sides, and a third (a bare wrapper that calls the C library's `read` and tests the result:
//! the least any interposer pays), in turns, 1,000,000 reads each, the order rotated every
//! round, and prints each side's median and the medians of the rounds' ratios: a loaded machine
//! moves the sides of a round alike, where criterion's groups run one after the other.
//! Figures: `arch/hooks.md` ("Costs").

use std::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use criterion::Criterion;
use virtual_threads as vt;

/// Bytes written into the pipe per batch of timed reads (the pipe is grown to hold them).
const BATCH: usize = 64 * 1024;
const PROBE_READS: usize = 100_000;

type ReadFn = unsafe extern "C" fn(c_int, *mut c_void, usize) -> isize;
type WriteFn = unsafe extern "C" fn(c_int, *const c_void, usize) -> isize;

/// The C library's own `read` and `write`, whatever this binary interposes.
fn libc_fns() -> (ReadFn, WriteFn) {
    // SAFETY: `dlopen` of the already loaded C library (RTLD_NOLOAD) and `dlsym` of two of its
    // functions, whose signatures these are.
    unsafe {
        let h = libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY);
        assert!(!h.is_null(), "libc.so.6 is not loaded");
        let r = libc::dlsym(h, c"read".as_ptr());
        let w = libc::dlsym(h, c"write".as_ptr());
        assert!(!r.is_null() && !w.is_null());
        (std::mem::transmute::<*mut c_void, ReadFn>(r), std::mem::transmute::<*mut c_void, WriteFn>(w))
    }
}

/// The hooked `read` (the crate's when the feature is on; the C library's otherwise).
unsafe extern "C" fn hooked_read(fd: c_int, buf: *mut c_void, n: usize) -> isize {
    // SAFETY: the caller's arguments.
    unsafe { libc::read(fd, buf, n) }
}

/// A pipe whose read end is read one byte at a time.
struct Pipe {
    r: c_int,
    w: c_int,
    write: WriteFn,
    fill: Vec<u8>,
}

impl Pipe {
    fn new() -> Pipe {
        let mut fds = [0; 2];
        // SAFETY: `fds` holds two ints; `pipe2` and `fcntl` are plain descriptor calls.
        unsafe {
            assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0);
            assert!(libc::fcntl(fds[1], libc::F_SETPIPE_SZ, BATCH as c_int) >= BATCH as c_int);
        }
        Pipe { r: fds[0], w: fds[1], write: libc_fns().1, fill: vec![7; BATCH] }
    }

    /// `n` (≤ `BATCH`) bytes in, then `n` one-byte reads with `read`, timed.
    fn time_reads(&self, n: usize, read: ReadFn) -> Duration {
        // SAFETY: `fill` holds `BATCH` ≥ `n` bytes; the pipe holds `BATCH` bytes, so the write
        // (the C library's, never a hook) does not block.
        assert_eq!(unsafe { (self.write)(self.w, self.fill.as_ptr().cast(), n) }, n as isize);
        let mut b = 0u8;
        let t = Instant::now();
        for _ in 0..n {
            // SAFETY: one writable byte; the pipe holds data, so the read does not block.
            let got = unsafe { read(self.r, (&raw mut b).cast(), 1) };
            debug_assert_eq!(got, 1);
        }
        t.elapsed()
    }

    /// `iters` reads, in batches.
    fn time(&self, iters: u64, read: ReadFn) -> Duration {
        let mut left = iters as usize;
        let mut total = Duration::ZERO;
        while left > 0 {
            let n = left.min(BATCH);
            total += self.time_reads(n, read);
            left -= n;
        }
        total
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        // SAFETY: our two descriptors.
        unsafe {
            libc::close(self.r);
            libc::close(self.w);
        }
    }
}

fn main() {
    let real_read = libc_fns().0;
    let sides: [(&str, ReadFn); 2] = [("hooked", hooked_read), ("libc", real_read)];
    if let Ok(probe) = std::env::var("HOOKS_PROBE") {
        let (on, side) = probe.split_once('-').expect("HOOKS_PROBE=plain-hooked and the like");
        let read = sides.iter().find(|s| s.0 == side).expect("hooked or libc").1;
        let pipe = Pipe::new();
        match on {
            "plain" => {
                pipe.time(PROBE_READS as u64, read);
            }
            _ => {
                let rt = vt::Runtime::builder().carriers(1).build().unwrap();
                rt.spawn(move || pipe.time(PROBE_READS as u64, read)).join().unwrap();
            }
        }
        return;
    }
    if let Ok(rounds) = std::env::var("HOOKS_ALTERNATE") {
        alternate(rounds.parse().expect("HOOKS_ALTERNATE=<rounds>"), sides);
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    let mut g = c.benchmark_group("pipe read 1 byte");
    let pipe = std::sync::Arc::new(Pipe::new());
    let rt = vt::Runtime::builder().carriers(1).build().unwrap();
    // Alternated side by side within each group, so both see the same machine.
    for (name, read) in sides {
        let p = pipe.clone();
        g.bench_function(format!("plain thread, {name}"), move |b| {
            b.iter_custom(|iters| p.time(iters, read))
        });
        let p = pipe.clone();
        let h = rt.handle();
        g.bench_function(format!("fiber, {name}"), move |b| {
            b.iter_custom(|iters| {
                let p = p.clone();
                h.spawn(move || p.time(iters, read)).join().unwrap()
            })
        });
    }
    g.finish();
    c.final_summary();
}

/// `HOOKS_ALTERNATE`: the plain thread's sides in turns (module doc), with a third: the least
/// any interposer that looks at the result pays, a function of its own that calls the C
/// library's `read` and tests the sign (`wrapped_read`).
fn alternate(rounds: usize, sides: [(&str, ReadFn); 2]) {
    const READS: u64 = 1_000_000;
    let _ = WRAPPED.set(sides[1].1);
    let all: [(&str, ReadFn); 3] = [sides[0], sides[1], ("wrapper", wrapped_read)];
    let pipe = Pipe::new();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut ns: [Vec<f64>; 3] = Default::default();
    let mut ratios: [Vec<f64>; 2] = Default::default();
    for round in 0..rounds.max(1) {
        let mut t = [0.0; 3];
        for k in 0..3 {
            let side = (k + round) % 3;
            t[side] = pipe.time(READS, all[side].1).as_nanos() as f64 / READS as f64;
        }
        for (v, x) in ns.iter_mut().zip(t) {
            v.push(x);
        }
        ratios[0].push(t[0] / t[1]);
        ratios[1].push(t[2] / t[1]);
        println!("round {round}: hooked {:.1} ns, libc {:.1} ns, wrapper {:.1} ns", t[0], t[1], t[2]);
    }
    let [h, l, w] = ns.map(|mut v| median(&mut v));
    let [rh, rw] = ratios.map(|mut v| median(&mut v));
    println!(
        "plain thread, 1-byte pipe read, {rounds} rounds x {READS} reads, medians: hooked {h:.1} ns, libc {l:.1} ns, wrapper {w:.1} ns; hooked/libc {rh:.4}, wrapper/libc {rw:.4}"
    );
}

/// The C library's `read`, for `wrapped_read`.
static WRAPPED: std::sync::OnceLock<ReadFn> = std::sync::OnceLock::new();

/// A function between the caller and the C library's `read` that looks at the result, as every
/// hook must (a retry needs it): one more call level and return after the system call, and a
/// frame that keeps nothing.
#[inline(never)]
unsafe extern "C" fn wrapped_read(fd: c_int, buf: *mut c_void, n: usize) -> isize {
    let read = WRAPPED.get().expect("set by `alternate`");
    // SAFETY: the caller's arguments.
    let r = unsafe { read(fd, buf, n) };
    // Not a tail call: the result is looked at after the call returns.
    if r < 0 { std::hint::black_box(r) } else { r }
}
