//! How deep a fiber can recurse: rayon's quicksort demo (`rayon::join` → `vt::join`) on sorted
//! input, whose recursion is as deep as the input is long, and a plain recursion with a typical
//! frame (a few locals and a call). Prints the stack each level takes, measured from the
//! addresses of a local at the top and at the deepest level, and the depth that fits in the
//! runtime's stack.
//!
//! `cargo run --release --example stack_depth` (add `-- --sort N` to sort N sorted elements on
//! the default stack, which overflows, with the fiber named in the report, past the depth printed).

use std::cell::Cell;

use virtual_threads as vt;

thread_local! {
    static TOP: Cell<usize> = const { Cell::new(0) };
    static LOW: Cell<usize> = const { Cell::new(usize::MAX) };
}

// A thread-local read across `vt::join` is fine here: the runtime has one carrier, and the
// sorted input keeps the recursion on the calling fiber.
fn mark() {
    let here = 0u8;
    let at = std::hint::black_box(&here) as *const u8 as usize;
    LOW.with(|l| l.set(l.get().min(at)));
}

/// rayon-demo's quick_sort: the last element is the pivot.
fn quick_sort<T: PartialOrd + Send>(v: &mut [T]) {
    mark();
    if v.len() <= 1 {
        return;
    }
    let mid = partition(v);
    let (lo, hi) = v.split_at_mut(mid);
    vt::join(|| quick_sort(lo), || quick_sort(hi));
}

fn partition<T: PartialOrd + Send>(v: &mut [T]) -> usize {
    let pivot = v.len() - 1;
    let mut i = 0;
    for j in 0..pivot {
        if v[j] <= v[pivot] {
            v.swap(i, j);
            i += 1;
        }
    }
    v.swap(i, pivot);
    i
}

/// A recursion with a typical frame: a few scalars, a small array, a call.
#[inline(never)]
fn walk(depth: u32, acc: u64) -> u64 {
    mark();
    let local = std::hint::black_box([acc, depth as u64, acc ^ 7, 3]);
    if depth == 0 {
        return local.iter().sum();
    }
    walk(depth - 1, local[0].wrapping_add(local[1])) + local[2]
}

/// Stack bytes per level of `f(levels)`, run on a fresh fiber.
fn per_level(rt: &vt::Runtime, levels: usize, f: fn(usize)) -> f64 {
    rt.block_on(|| {
        let top = 0u8;
        TOP.with(|t| t.set(std::hint::black_box(&top) as *const u8 as usize));
        LOW.with(|l| l.set(usize::MAX));
        f(levels);
        let used = TOP.with(Cell::get) - LOW.with(Cell::get);
        used as f64 / levels as f64
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = vt::Runtime::builder().carriers(1).build().unwrap();
    if let Some(i) = args.iter().position(|a| a == "--sort") {
        let n: u32 = args[i + 1].parse().unwrap();
        let mut v: Vec<u32> = (0..n).collect();
        rt.block_on(|| quick_sort(&mut v));
        println!("sorted {n} sorted elements on the default stack");
        return;
    }
    let kib = vt::DEFAULT_STACK_SIZE / 1024;
    let sort = per_level(&rt, 20, |n| {
        let mut v: Vec<u32> = (0..n as u32).collect();
        quick_sort(&mut v);
    });
    let plain = per_level(&rt, 20, |n| {
        std::hint::black_box(walk(n as u32, 1));
    });
    for (what, bytes) in
        [("rayon-style quick_sort on sorted input (vt::join)", sort), ("a plain recursion", plain)]
    {
        println!(
            "{what}: {bytes:.0} bytes per level, {:.1} levels per KiB, ~{:.0} levels in the default {kib} KiB",
            1024.0 / bytes,
            (kib * 1024) as f64 / bytes
        );
    }
}
