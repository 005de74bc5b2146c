//! The floor plan holds: no file of `src/` uses a layer above its own (`arch/layers.txt`, drawn in
//! `arch/layers.md`), and every file is in a layer. A new upward import fails here, in CI.
//!
//! The rules, in std-only Rust: a file's `crate::` paths
//! (in `use` trees and inline) are resolved to the file of their longest module prefix, through
//! `lib.rs`'s `pub use` re-exports for `crate::Item`; comments and `#[cfg(test)]` modules are
//! left out (unit tests may use any layer); the most specific entry of `layers.txt` wins.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

#[test]
fn no_file_uses_a_layer_above_its_own() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = BTreeMap::new();
    collect(&root.join("src"), &root.join("src"), &mut files);
    let layers = fs::read_to_string(root.join("arch/layers.txt")).expect("arch/layers.txt");
    let problems = check(&files, &layers);
    assert!(
        problems.is_empty(),
        "{} upward reference(s) or unlisted file(s) (arch/layers.txt):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The checker itself catches what it must: an upward `use`, an inline path, a path through a
/// root re-export, an unlisted file; and leaves alone comments, unit tests and downward uses.
#[test]
fn the_check_finds_upward_references() {
    let files: BTreeMap<String, String> = [
        ("lib.rs", "mod low;\nmod high;\npub use high::api::Thing;\n"),
        ("low/mod.rs", "use crate::high::api::{self, Thing};\n// crate::high::api in a comment\n"),
        ("low/inline.rs", "fn f() { crate::high::api::go(); }\n"),
        ("low/reexport.rs", "fn f() -> crate::Thing { todo!() }\n"),
        ("low/ok.rs", "#[cfg(test)]\nmod tests {\n    use crate::high::api;\n}\nuse crate::low::inline;\n"),
        ("high/api.rs", "use crate::low::ok;\n"),
        ("stray.rs", ""),
    ]
    .into_iter()
    .map(|(f, t)| (f.to_string(), t.to_string()))
    .collect();
    let problems = check(&files, "# bottom\nlow\nhigh  # top\nlib.rs\n");
    let upward: Vec<_> = problems.iter().filter(|p| p.contains(" uses ")).collect();
    assert_eq!(upward.len(), 3, "{problems:#?}");
    for f in ["low/mod.rs", "low/inline.rs", "low/reexport.rs"] {
        assert!(upward.iter().any(|p| p.starts_with(&format!("src/{f} "))), "{f} missed: {problems:#?}");
    }
    assert!(problems.iter().any(|p| p == "src/stray.rs: not in arch/layers.txt"), "{problems:#?}");
    assert_eq!(problems.len(), 4, "{problems:#?}");
}

/// Every `.rs` file under `dir`, by its path relative to `src`.
fn collect(src: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    for entry in fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            collect(src, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(src).unwrap().to_string_lossy().replace('\\', "/");
            out.insert(rel, fs::read_to_string(&path).expect("a source file"));
        }
    }
}

/// The problems found: one line per upward file-to-file reference, one per unlisted file.
fn check(files: &BTreeMap<String, String>, layers_txt: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let layers: Vec<Vec<&str>> = layers_txt
        .lines()
        .map(|l| l.split('#').next().unwrap().split_whitespace().collect::<Vec<_>>())
        .filter(|l| !l.is_empty())
        .collect();
    let mut layer_of: BTreeMap<&str, (usize, usize)> = BTreeMap::new(); // file -> (layer, depth)
    for (i, entries) in layers.iter().enumerate() {
        for e in entries {
            let e = e.trim_end_matches('/');
            let hits: Vec<&str> = files
                .keys()
                .map(String::as_str)
                .filter(|f| *f == e || f.starts_with(&format!("{e}/")))
                .collect();
            if hits.is_empty() {
                problems.push(format!("arch/layers.txt: {e} names no file under src/"));
            }
            for f in hits {
                // The most specific entry wins: `sync/loom.rs` over `sync`.
                let depth = e.matches('/').count() + usize::from(e == f);
                if layer_of.get(f).is_none_or(|&(_, d)| depth >= d) {
                    layer_of.insert(f, (i, depth));
                }
            }
        }
    }

    // Root re-exports: `pub use a::b::{X, Y}` in lib.rs, so `crate::X` resolves to a::b.
    let mut reexport: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let lib = strip(files.get("lib.rs").map_or("", String::as_str));
    for tree in statements(&lib, "pub use ") {
        for p in expand(&tree) {
            let segs = segments(&p);
            if let Some((last, prefix)) = segs.split_last() {
                reexport.insert(last.clone(), prefix.to_vec());
            }
        }
    }

    for (f, text) in files {
        let Some(&(own, _)) = layer_of.get(f.as_str()) else {
            problems.push(format!("src/{f}: not in arch/layers.txt"));
            continue;
        };
        let text = strip(text);
        let mut paths = Vec::new();
        for tree in statements(&text, "use crate::") {
            paths.extend(expand(&tree));
        }
        paths.extend(inline_paths(&without_crate_uses(&text)));
        let mut seen = BTreeSet::new();
        for p in paths {
            let segs = segments(&p);
            if segs.is_empty() {
                continue;
            }
            let mut target = module_file(files, &segs);
            if target.is_none() {
                if let Some(prefix) = reexport.get(&segs[0]) {
                    let mut full = prefix.clone();
                    full.extend_from_slice(&segs[1..]);
                    target = module_file(files, &full).or_else(|| module_file(files, prefix));
                }
            }
            let Some(target) = target else { continue };
            let Some(&(theirs, _)) = layer_of.get(target.as_str()) else { continue };
            if target != *f && theirs > own && seen.insert(target.clone()) {
                problems
                    .push(format!("src/{f} (layer {own}) uses crate::{p} in src/{target} (layer {theirs})"));
            }
        }
    }
    problems
}

/// The path's segments, without `self` and empty ones.
fn segments(path: &str) -> Vec<String> {
    path.split("::").map(str::trim).filter(|s| !s.is_empty() && *s != "self").map(String::from).collect()
}

/// The file that the longest module prefix of `segs` names.
fn module_file(files: &BTreeMap<String, String>, segs: &[String]) -> Option<String> {
    let mut best = None;
    for k in 1..=segs.len() {
        let p = segs[..k].join("/");
        for cand in [format!("{p}.rs"), format!("{p}/mod.rs")] {
            if files.contains_key(&cand) {
                best = Some(cand);
            }
        }
    }
    best
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether `text[i..]` starts a word (nothing word-like right before it).
fn at_word_start(text: &str, i: usize) -> bool {
    text[..i].chars().next_back().is_none_or(|c| !is_word(c))
}

/// The body of every `{lead}BODY;` (after `lead`, up to the `;`), where `lead` starts a word;
/// `lead` may end in spaces, which then match any whitespace.
fn statements(text: &str, lead: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        if let Some(end) = match_lead(text, i, lead) {
            if let Some(semi) = text[end..].find(';') {
                out.push(text[end..end + semi].to_string());
                i = end + semi + 1;
                continue;
            }
        }
        i += text[i..].chars().next().map_or(1, char::len_utf8);
    }
    out
}

/// Where `lead` ends if it matches at `i` (its spaces match one or more whitespace characters).
fn match_lead(text: &str, i: usize, lead: &str) -> Option<usize> {
    if !at_word_start(text, i) {
        return None;
    }
    let mut j = i;
    for (k, word) in lead.split(' ').enumerate() {
        if k > 0 {
            let ws = text[j..].len() - text[j..].trim_start().len();
            if ws == 0 {
                return None;
            }
            j += ws;
        }
        if !text[j..].starts_with(word) {
            return None;
        }
        j += word.len();
    }
    Some(j)
}

/// The text with its `use crate::...;` statements taken out.
fn without_crate_uses(text: &str) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < text.len() {
        if let Some(end) = match_lead(text, i, "use crate::") {
            if let Some(semi) = text[end..].find(';') {
                i = end + semi + 1;
                continue;
            }
        }
        let c = text[i..].chars().next().unwrap();
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// Every inline `crate::a::b` path (its words and `::`s after `crate::`).
fn inline_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("crate::") {
        if !at_word_start(text, i) {
            continue;
        }
        let rest = &text[i + "crate::".len()..];
        let mut end = 0;
        let mut chars = rest.char_indices().peekable();
        while let Some((k, c)) = chars.next() {
            if is_word(c) {
                end = k + c.len_utf8();
            } else if c == ':' && rest[k..].starts_with("::") && rest[k + 2..].starts_with(is_word) {
                chars.next();
            } else {
                break;
            }
        }
        if end > 0 {
            out.push(rest[..end].to_string());
        }
    }
    out
}

/// The paths of a use tree such as `a::{b, c::{d, e}}`.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let (Some(open), true) = (tree.find('{'), tree.ends_with('}')) else {
        return vec![tree.split(" as ").next().unwrap().trim().to_string()];
    };
    let prefix = tree[..open].trim_end_matches("::");
    let body = &tree[open + 1..tree.len() - 1];
    let (mut out, mut depth, mut cur) = (Vec::new(), 0, String::new());
    for c in body.chars().chain([',']) {
        if c == ',' && depth == 0 {
            if !cur.trim().is_empty() {
                for p in expand(&cur) {
                    out.push(if prefix.is_empty() { p } else { format!("{prefix}::{p}") });
                }
            }
            cur.clear();
            continue;
        }
        depth += i32::from(c == '{') - i32::from(c == '}');
        cur.push(c);
    }
    out
}

/// Drops comments and test-only modules (unit tests may use any layer).
fn strip(text: &str) -> String {
    // Block comments (not nested), then line comments.
    let mut s = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("/*") {
        s.push_str(&rest[..i]);
        match rest[i + 2..].find("*/") {
            Some(j) => rest = &rest[i + 2 + j + 2..],
            None => {
                rest = "";
                break;
            }
        }
    }
    s.push_str(rest);
    let mut text: String =
        s.lines().map(|l| l.find("//").map_or(l, |i| &l[..i])).collect::<Vec<_>>().join("\n");
    // `#[cfg(test)]`, `#[cfg(all(test ...)]` and `#[cfg(any(test ...)]` modules, whole.
    while let Some((start, open)) = test_module(&text) {
        let mut depth = 1;
        let mut end = open + 1;
        for (k, c) in text[open + 1..].char_indices() {
            depth += i32::from(c == '{') - i32::from(c == '}');
            end = open + 1 + k + c.len_utf8();
            if depth == 0 {
                break;
            }
        }
        text.replace_range(start..end, "");
    }
    text
}

/// The first test-only module: where its attribute starts and where its `{` is.
fn test_module(text: &str) -> Option<(usize, usize)> {
    for (start, _) in text.match_indices("#[cfg(") {
        let after = &text[start + "#[cfg(".len()..];
        let attr_len = if after.starts_with("test)]") {
            "test)]".len()
        } else if after.starts_with("all(test") || after.starts_with("any(test") {
            // `[^\]]*\)\]`: up to the first `]`, which must close `)]`.
            let close = after.find(']')?;
            if !after[..close].ends_with(')') {
                continue;
            }
            close + 1
        } else {
            continue;
        };
        let mut rest = after[attr_len..].trim_start();
        if let Some(r) = rest.strip_prefix("pub") {
            rest = r.trim_start();
            if let Some(r) = rest.strip_prefix('(') {
                rest = r[r.find(')')? + 1..].trim_start();
            }
        }
        let Some(r) = rest.strip_prefix("mod") else { continue };
        if !r.starts_with(char::is_whitespace) {
            continue;
        }
        let r = r.trim_start();
        let name_len = r.find(|c: char| !is_word(c)).unwrap_or(r.len());
        if name_len == 0 || !r[name_len..].trim_start().starts_with('{') {
            continue;
        }
        let open = text.len() - r[name_len..].trim_start().len();
        return Some((start, open));
    }
    None
}
