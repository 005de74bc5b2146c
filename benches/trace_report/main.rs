//! `vt-trace-report TRACE.json [REPORT.html]`: turns an execution trace of `virtual-threads`
//! (`runtime::Builder::trace`, `VT_TRACE`) into a self-contained HTML report: the carriers'
//! timeline, zoomable, the wait profile (count, total, p50, p99 and max time parked per wait
//! reason and per spawn site, as Go's blocking profile gives) and the fibers with the longest
//! waits. `--summary` prints the totals instead, one `name=value` a line (fibers_spawned,
//! switches, compensations, ... as `Runtime::metrics` names them), for scripts and tests.
//!
//! Run: `cargo run --release -p vt-bench --bin vt-trace-report -- trace.json report.html`.

mod analyze;
mod html;

use std::process::ExitCode;

/// Fibers listed in the report's last table.
const FIBERS_LISTED: usize = 50;
/// Longest waits named per fiber.
const LONGEST: usize = 3;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let summary = args.iter().any(|a| a == "--summary");
    let files: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") || files.is_empty() || files.len() > 2 {
        eprintln!(
            "usage: vt-trace-report TRACE.json [REPORT.html]   (default: TRACE.html)\n       vt-trace-report --summary TRACE.json"
        );
        return ExitCode::from(2);
    }
    let input = files[0];
    let text = match std::fs::read_to_string(input) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("vt-trace-report: cannot read {input}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = match analyze::analyze(&text, LONGEST) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("vt-trace-report: {input}: {e}");
            return ExitCode::FAILURE;
        }
    };
    if summary {
        let t = &report.totals;
        println!("fibers_spawned={}", t.fibers_spawned);
        println!("switches={}", t.switches);
        println!("compensations={}", t.compensations);
        println!("run_slices={}", t.run_slices);
        println!("blocked={}", t.blocked);
        println!("panics={}", t.panics);
        println!("events={}", t.events);
        println!("dropped={}", t.dropped);
        println!("carriers={}", report.tracks.iter().filter(|t| t.name.starts_with("carrier")).count());
        for (reason, s) in &report.by_reason {
            println!("wait[{reason}]={} total_us={:.1} p99_us={:.1}", s.count, s.total, s.p99);
        }
        return ExitCode::SUCCESS;
    }
    let out = files.get(1).map(|s| s.to_string()).unwrap_or_else(|| {
        let stem = input.strip_suffix(".json").unwrap_or(input);
        format!("{stem}.html")
    });
    let title = format!("virtual-threads trace: {input}");
    if let Err(e) = std::fs::write(&out, html::render(&report, &title, FIBERS_LISTED)) {
        eprintln!("vt-trace-report: cannot write {out}: {e}");
        return ExitCode::FAILURE;
    }
    eprintln!("vt-trace-report: wrote {out}");
    ExitCode::SUCCESS
}
