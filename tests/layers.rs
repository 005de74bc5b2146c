//! The floor plan holds: no file of `src/` uses a layer above its own (`arch/layers.txt`, drawn in
//! `arch/layers.md`), and every file is in a layer. A new upward import fails here, in CI.
//!
//! The rules, in std-only Rust: a file's `crate::`, `super::` and `self::` paths (in `use` trees
//! and inline) are resolved to the file of their longest module prefix; comments and
//! `#[cfg(test)]` modules are left out (unit tests may use any layer); the most specific entry
//! of `layers.txt` wins. Two more rules keep the plan readable: the crate's own code names an
//! item by the module it lives in, never through `lib.rs`'s re-exports (those are the public
//! API), no two top-level modules of `src/` reach each other through their imports, which a
//! layer shared by several modules would hide, and no item is reached both through a module's
//! `use` of it and by its own path (`double_paths`).

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
        "{} upward reference(s), unlisted file(s), cycle(s) or item(s) named two ways (arch/layers.md):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The checker itself catches what it must: an upward `use`, an inline path, a `super::` path, a
/// path through a root re-export, an unlisted file, a cycle between two modules of one layer;
/// and leaves alone comments, unit tests, downward uses, `self::` and a macro's `$crate::`.
#[test]
fn the_check_finds_upward_references() {
    let files: BTreeMap<String, String> = [
        ("lib.rs", "mod low;\nmod high;\npub use high::api::Thing;\npub use low::ok::Ok;\n"),
        ("low/mod.rs", "use crate::high::api::{self, Thing};\n// crate::high::api in a comment\n"),
        ("low/inline.rs", "fn f() { crate::high::api::go(); }\n"),
        ("low/reexport.rs", "fn f() -> crate::Thing { todo!() }\n"),
        ("low/ok.rs", "#[cfg(test)]\nmod tests {\n    use crate::high::api;\n}\nuse crate::low::inline;\n"),
        ("low/own.rs", "use self::inner::X;\nuse super::ok;\nmacro_rules! m { () => { $crate::Ok } }\n"),
        ("high/api.rs", "use crate::low::ok::Ok;\nuse super::super::low::inline;\nuse super::up;\n"),
        ("high/up.rs", "use super::api;\n"),
        ("high/back.rs", "use super::super::Ok;\n"),
        ("side/a.rs", "use crate::side2::b;\n"),
        ("side2/b.rs", "use crate::side::a;\n"),
        ("stray.rs", ""),
    ]
    .into_iter()
    .map(|(f, t)| (f.to_string(), t.to_string()))
    .collect();
    let layers = "# bottom\nlow\nhigh/api.rs side side2\nhigh  # top\nlib.rs\n";
    let problems = check(&files, layers);
    let upward: Vec<_> = problems.iter().filter(|p| p.contains(" (layer ")).collect();
    assert_eq!(upward.len(), 4, "{problems:#?}");
    for f in ["low/mod.rs", "low/inline.rs", "low/reexport.rs", "high/api.rs"] {
        assert!(upward.iter().any(|p| p.starts_with(&format!("src/{f} "))), "{f} missed: {problems:#?}");
    }
    let reexports: Vec<_> = problems.iter().filter(|p| p.contains("a re-export of lib.rs")).collect();
    assert_eq!(reexports.len(), 2, "{problems:#?}");
    assert!(reexports.iter().any(|p| p.contains("write crate::high::api::Thing")), "{problems:#?}");
    assert!(reexports.iter().any(|p| p.starts_with("src/high/back.rs ")), "{problems:#?}");
    // side and side2 share a layer, so only the cycle check sees them; an upward reference
    // between two modules is a cycle too.
    for ring in ["high <-> low", "side <-> side2"] {
        let line = format!("cycle among top-level modules: {ring}\n");
        assert!(problems.iter().any(|p| p.starts_with(&line)), "{ring} missed: {problems:#?}");
    }
    assert!(problems.iter().any(|p| p == "src/stray.rs: not in arch/layers.txt"), "{problems:#?}");
    assert_eq!(problems.len(), 9, "{problems:#?}");
}

/// The double-path check reports an item that one file takes through a module's `use` of it
/// (public, or private to that module's children) and another by the path the `use` names; it
/// leaves alone an item named one way only, a `use` nobody else goes through, and `loom.rs`.
#[test]
fn the_check_finds_items_reached_two_ways() {
    let files: BTreeMap<String, String> = [
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a/mod.rs", "mod inner;\npub(crate) use inner::{Thing, Lone};\nuse inner::Other;\n"),
        ("a/inner.rs", "pub struct Thing;\npub struct Other;\npub struct Lone;\n"),
        ("a/child.rs", "use super::Other;\nuse super::Lone;\n"),
        ("b/one.rs", "use crate::a::Thing;\n"),
        ("b/two.rs", "use crate::a::inner::Thing;\nfn f() { crate::a::inner::Other; }\n"),
        ("b/other.rs", "use crate::a::Other;\n"),
        ("b/loom.rs", "pub(crate) use crate::a::inner::Thing as Fiber;\n"),
        ("b/three.rs", "use super::loom::Fiber;\n"),
    ]
    .into_iter()
    .map(|(f, t)| (f.to_string(), t.to_string()))
    .collect();
    let problems = double_paths(&files);
    assert_eq!(problems.len(), 2, "{problems:#?}");
    assert!(
        problems.iter().any(|p| p.starts_with(
            "crate::a::inner::Thing is also crate::a::Thing (a use in src/a/mod.rs): \
             src/b/two.rs name it the one way, src/b/one.rs the other"
        )),
        "{problems:#?}"
    );
    // A private `use`: only the module's own children go through it (`b/other.rs` cannot).
    assert!(
        problems.iter().any(|p| p.starts_with(
            "crate::a::inner::Other is also crate::a::Other (a use in src/a/mod.rs): \
             src/b/two.rs name it the one way, src/a/child.rs the other"
        )),
        "{problems:#?}"
    );
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

    // Top-level module -> top-level module -> the first reference seen, for the cycle check.
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (f, text) in files {
        let Some(&(own, _)) = layer_of.get(f.as_str()) else {
            problems.push(format!("src/{f}: not in arch/layers.txt"));
            continue;
        };
        let here = module_of(f);
        let mut seen = BTreeSet::new();
        for p in paths_in(&strip(text)) {
            let segs = absolute(&here, &p);
            if segs.is_empty() {
                continue;
            }
            let mut target = module_file(files, &segs);
            if let Some(prefix) = reexport.get(&segs[0]) {
                // `crate::X` where X is no module (or the bare name of one that is also an
                // item, as `crate::blocking`): the item's own path says where it lives.
                if f != "lib.rs" && (segs.len() == 1 || module_file(files, &segs[..1]).is_none()) {
                    let item = [prefix.as_slice(), &segs[..1]].concat().join("::");
                    let line = format!(
                        "src/{f} uses crate::{}, a re-export of lib.rs: write crate::{item}",
                        segs.join("::")
                    );
                    if !problems.contains(&line) {
                        problems.push(line);
                    }
                }
                if target.is_none() {
                    let mut full = prefix.clone();
                    full.extend_from_slice(&segs[1..]);
                    target = module_file(files, &full).or_else(|| module_file(files, prefix));
                }
            }
            let Some(target) = target else { continue };
            let Some(&(theirs, _)) = layer_of.get(target.as_str()) else { continue };
            let (from, to) = (top(f), top(&target));
            if from != to && from != "lib" && to != "lib" {
                edges.entry(from).or_default().entry(to).or_insert_with(|| format!("src/{f} uses {p}"));
            }
            if target != *f && theirs > own && seen.insert(target.clone()) {
                problems.push(format!(
                    "src/{f} (layer {own}) uses crate::{} in src/{target} (layer {theirs})",
                    segs.join("::")
                ));
            }
        }
    }
    problems.extend(cycles(&edges));
    problems.extend(double_paths(files));
    problems
}

/// Items named two ways. A `use` in module `m` makes `m::name` a second path to the item it
/// imports: for `m` and the modules inside it, or for the whole crate if the `use` is `pub`.
/// When one file takes an item through such a second path while another names it by the path
/// the `use` itself names, the crate's code reaches one item two ways: one line per such item.
/// lib.rs's re-exports have their own rule (in `check`); the loom facades (`loom.rs`) name
/// std's or loom's items by `cfg`, so their second paths are the point.
fn double_paths(files: &BTreeMap<String, String>) -> Vec<String> {
    let stripped: BTreeMap<&str, String> = files.iter().map(|(f, t)| (f.as_str(), strip(t))).collect();
    let named: BTreeMap<&str, Vec<Vec<String>>> = stripped
        .iter()
        .map(|(f, t)| (*f, paths_in(t).iter().map(|p| absolute(&module_of(f), p)).collect()))
        .collect();
    let mut out = Vec::new();
    for (&f, text) in &stripped {
        if f == "lib.rs" || f.ends_with("loom.rs") {
            continue;
        }
        let here = module_of(f);
        let public: BTreeSet<String> = ["pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .flat_map(|l| statements(text, l))
            .collect();
        for tree in statements(text, "use ") {
            for (path, name) in expand_named(&tree) {
                let Some(item) = crate_path(files, &here, &path) else { continue };
                let alias: Vec<String> = here.iter().cloned().chain([name]).collect();
                if alias == item || alias.last().is_some_and(|n| n == "*") || is_module(files, &alias) {
                    continue;
                }
                // Who may name the alias: the module and those inside it, or everyone.
                let scope: &[String] = if public.contains(&tree) { &[] } else { &here };
                let home = module_file(files, &item);
                let (mut by_alias, mut by_item) = (BTreeSet::new(), BTreeSet::new());
                for (&g, paths) in &named {
                    if g == f || home.as_deref() == Some(g) || g.ends_with("loom.rs") {
                        continue;
                    }
                    for p in paths {
                        if p.starts_with(&alias) && module_of(g).starts_with(scope) {
                            by_alias.insert(format!("src/{g}"));
                        }
                        if p.starts_with(&item) {
                            by_item.insert(format!("src/{g}"));
                        }
                    }
                }
                if !by_alias.is_empty() && !by_item.is_empty() {
                    let list = |s: BTreeSet<String>| s.into_iter().collect::<Vec<_>>().join(", ");
                    out.push(format!(
                        "crate::{} is also crate::{} (a use in src/{f}): {} name it the one way, {} the \
                         other; name it one way",
                        item.join("::"),
                        alias.join("::"),
                        list(by_item),
                        list(by_alias)
                    ));
                }
            }
        }
    }
    out
}

/// The crate path a `use` path in module `here` names: `crate::`, `super::` and `self::` paths,
/// and a path through a child module (`use state::Word;` in `fiber/mod.rs`); `None` for another
/// crate's (`std::`, a dependency's).
fn crate_path(files: &BTreeMap<String, String>, here: &[String], path: &str) -> Option<Vec<String>> {
    let first = path.split("::").next().unwrap_or("").trim();
    if ["crate", "super", "self"].contains(&first) {
        return Some(absolute(here, path));
    }
    let child: Vec<String> = here.iter().cloned().chain([first.to_string()]).collect();
    is_module(files, &child).then(|| absolute(here, &format!("self::{path}")))
}

/// Whether `segs` names a module (a file of its own).
fn is_module(files: &BTreeMap<String, String>, segs: &[String]) -> bool {
    module_file(files, segs).is_some_and(|f| module_of(&f) == segs)
}

/// Import cycles among the top-level modules (which a layer order hides when several modules
/// share a layer): one line per strongly connected set of two or more, with the arrows inside it.
fn cycles(edges: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<String> {
    let nodes: BTreeSet<&String> = edges.keys().chain(edges.values().flat_map(|d| d.keys())).collect();
    let reach = |from: &String| {
        let (mut seen, mut stack) = (BTreeSet::new(), vec![from]);
        while let Some(n) = stack.pop() {
            for m in edges.get(n).into_iter().flat_map(|d| d.keys()) {
                if seen.insert(m) {
                    stack.push(m);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<&String>> = nodes.iter().map(|&n| (n, reach(n))).collect();
    let mut out = Vec::new();
    let mut done = BTreeSet::new();
    for &a in &nodes {
        if done.contains(a) {
            continue;
        }
        let ring: Vec<&String> =
            nodes.iter().copied().filter(|&b| reaches[a].contains(b) && reaches[b].contains(a)).collect();
        done.extend(ring.iter().copied());
        if ring.len() < 2 {
            continue;
        }
        let names: Vec<&str> = ring.iter().map(|s| s.as_str()).collect();
        let mut line = format!("cycle among top-level modules: {}", names.join(" <-> "));
        for &x in &ring {
            for (y, why) in edges.get(x).into_iter().flatten() {
                if ring.contains(&y) {
                    line.push_str(&format!("\n  {x} -> {y}: {why}"));
                }
            }
        }
        out.push(line);
    }
    out
}

/// The module path of a file: `net/tcp.rs` -> [net, tcp], `net/mod.rs` -> [net], `lib.rs` -> [].
fn module_of(file: &str) -> Vec<String> {
    let mut segs: Vec<String> = file.trim_end_matches(".rs").split('/').map(String::from).collect();
    if segs.last().is_some_and(|l| l == "mod" || l == "lib") {
        segs.pop();
    }
    segs
}

/// The top-level module a file belongs to: `net/tcp.rs` -> net, `time.rs` -> time.
fn top(file: &str) -> String {
    file.split('/').next().unwrap().trim_end_matches(".rs").to_string()
}

/// Every `crate::`, `super::` and `self::` path of a (stripped) file: in `use` trees and inline.
fn paths_in(text: &str) -> Vec<String> {
    let mut paths = Vec::new();
    for lead in ["crate", "super", "self"] {
        for tree in statements(text, &format!("use {lead}::")) {
            paths.extend(expand(&tree).into_iter().map(|p| format!("{lead}::{p}")));
        }
    }
    let rest = without_uses(text);
    for lead in ["crate", "super", "self"] {
        paths.extend(inline_paths(&rest, lead).into_iter().map(|p| format!("{lead}::{p}")));
    }
    paths
}

/// A path's segments from the crate root: `super::x` in `net/tcp.rs` is [net, x].
fn absolute(here: &[String], path: &str) -> Vec<String> {
    let mut segs: Vec<&str> = path.split("::").map(str::trim).filter(|s| !s.is_empty()).collect();
    let mut base: Vec<String> = Vec::new();
    if segs.first() == Some(&"crate") {
        segs.remove(0);
    } else {
        base = here.to_vec();
        while let Some(&s) = segs.first() {
            match s {
                "super" => {
                    base.pop();
                }
                "self" => {}
                _ => break,
            }
            segs.remove(0);
        }
    }
    base.extend(segs.into_iter().filter(|s| *s != "self").map(String::from));
    base
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

/// The text with its `use crate::...;`, `use super::...;` and `use self::...;` statements taken
/// out.
fn without_uses(text: &str) -> String {
    let mut out = String::new();
    let mut i = 0;
    'scan: while i < text.len() {
        for lead in ["use crate::", "use super::", "use self::"] {
            if let Some(end) = match_lead(text, i, lead) {
                if let Some(semi) = text[end..].find(';') {
                    i = end + semi + 1;
                    continue 'scan;
                }
            }
        }
        let c = text[i..].chars().next().unwrap();
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// Every inline `LEAD::a::b` path (its words and `::`s after `LEAD::`); a macro's `$crate::`
/// is the public path, which lib.rs's re-exports exist for, so it is left out.
fn inline_paths(text: &str, lead: &str) -> Vec<String> {
    let lead = format!("{lead}::");
    let mut out = Vec::new();
    for (i, _) in text.match_indices(&lead) {
        if !at_word_start(text, i) || text[..i].ends_with('$') {
            continue;
        }
        let rest = &text[i + lead.len()..];
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
    expand_named(tree).into_iter().map(|(path, _)| path).collect()
}

/// The paths of a use tree, each with the name it brings into scope: its last segment, the
/// module's for `self`, or what `as` renames it to.
fn expand_named(tree: &str) -> Vec<(String, String)> {
    let tree = tree.trim();
    let (Some(open), true) = (tree.find('{'), tree.ends_with('}')) else {
        let (path, name) = match tree.split_once(" as ") {
            Some((path, name)) => (path.trim(), name.trim()),
            None => (tree, tree.rsplit("::").next().unwrap_or(tree).trim()),
        };
        return vec![(path.to_string(), name.to_string())];
    };
    let prefix = tree[..open].trim_end_matches("::");
    let body = &tree[open + 1..tree.len() - 1];
    let (mut out, mut depth, mut cur) = (Vec::new(), 0, String::new());
    for c in body.chars().chain([',']) {
        if c == ',' && depth == 0 {
            if !cur.trim().is_empty() {
                for (p, name) in expand_named(&cur) {
                    let name = if name == "self" {
                        prefix.rsplit("::").next().unwrap_or("").to_string()
                    } else {
                        name
                    };
                    out.push((if prefix.is_empty() { p } else { format!("{prefix}::{p}") }, name));
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
