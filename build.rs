//! Build-time target check.
//!
//! The runtime switches stacks with `corosensei` and waits for I/O with epoll, so it builds only
//! where both exist. Failing here, with a sentence that says why, beats a wall of errors from
//! deep inside a dependency.

use std::env;

/// Architectures corosensei 0.3 has context-switch code for.
const ARCHES: &[&str] = &["x86_64", "x86", "aarch64", "arm", "riscv64", "riscv32", "loongarch64"];

/// Operating systems with epoll (the I/O event loop) and the memory calls the stack pool uses.
const OSES: &[&str] = &["linux", "android"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let panic = env::var("CARGO_CFG_PANIC").unwrap_or_else(|_| "unwind".into());
    let mut problems = Vec::new();
    if !ARCHES.contains(&arch.as_str()) {
        problems.push(format!(
            "target architecture `{arch}` has no stack-switching support in corosensei \
             (supported: {})",
            ARCHES.join(", ")
        ));
    }
    if !OSES.contains(&os.as_str()) {
        problems.push(format!(
            "target OS `{os}` has no epoll (supported: {}); virtual-threads needs epoll for \
             blocking-style I/O and Linux memory calls for its stack pool",
            OSES.join(", ")
        ));
    }
    if panic != "unwind" {
        problems.push(format!(
            "panic strategy `{panic}`: fibers are unwound when a runtime is dropped and a fiber's \
             panic is returned by `join`, which needs `panic = \"unwind\"`"
        ));
    }
    if !problems.is_empty() {
        eprintln!("\nvirtual-threads cannot be built for this target:");
        for p in &problems {
            eprintln!("  - {p}");
        }
        eprintln!();
        panic!("unsupported target for virtual-threads: {}", problems.join("; "));
    }
}
