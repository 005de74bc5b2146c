//! The guide's snippets (`arch/guide.md`) in "Using async crates" and "With rustls, tungstenite,
//! httparse" are excerpts of this package's examples, which `tests/examples.rs` runs: every line of each
//! snippet (but `// ...`, which marks a gap) must appear in one example, in order.

use std::path::Path;

const SECTIONS: [&str; 2] = ["## Using async crates", "## With rustls, tungstenite, httparse"];

/// The ```rust blocks of the guide's section that starts with `heading`.
fn snippets(readme: &str, heading: &str) -> Vec<Vec<String>> {
    let start = readme.find(heading).unwrap_or_else(|| panic!("arch/guide.md has no section {heading:?}"));
    let body = &readme[start + heading.len()..];
    let body = &body[..body.find("\n## ").unwrap_or(body.len())];
    let mut blocks = Vec::new();
    let mut lines = body.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "```rust" {
            let block = lines
                .by_ref()
                .take_while(|l| l.trim() != "```")
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty() && l != "// ...")
                .collect();
            blocks.push(block);
        }
    }
    blocks
}

/// Whether `lines` appear in `file`'s lines (trimmed), in order.
fn appears_in(lines: &[String], file: &str) -> bool {
    let mut file = file.lines().map(str::trim);
    lines.iter().all(|l| file.any(|f| f == l))
}

#[test]
fn guide_snippets_are_the_examples_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("../arch/guide.md")).unwrap();
    // The examples' files, and those of their shared modules (`examples/common/`).
    let mut dirs = vec![root.join("examples")];
    let mut examples: Vec<(String, String)> = Vec::new();
    while let Some(dir) = dirs.pop() {
        for p in std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()) {
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                examples.push((p.display().to_string(), std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    let mut checked = 0;
    for heading in SECTIONS {
        for block in snippets(&readme, heading) {
            assert!(
                examples.iter().any(|(_, code)| appears_in(&block, code)),
                "a snippet of arch/guide.md section {heading:?} is not, line for line, in any of \
                 benches/examples/*.rs:\n{}",
                block.join("\n")
            );
            checked += 1;
        }
    }
    assert!(checked >= 4, "only {checked} snippets found");
}
