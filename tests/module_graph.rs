//! The crate's top-level modules form no cycle: no two of them import each
//! other, directly or through others. Counted from the `crate::` paths in
//! code (comments and doc lines excluded), grouped imports included.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`None` for `lib.rs`).
fn top_module(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    match first.strip_suffix(".rs") {
        Some("lib") => None,
        Some(name) => Some(name.to_owned()),
        None => Some(first.to_owned()),
    }
}

/// The first path segment of every `crate::` path on a line of code,
/// including each top-level entry of a grouped `crate::{a::X, b}`.
fn crate_paths(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut segment = String::new();
            let mut at_start = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        if at_start && !segment.is_empty() {
                            found.push(std::mem::take(&mut segment));
                        }
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        if at_start && !segment.is_empty() {
                            found.push(std::mem::take(&mut segment));
                        }
                        at_start = true;
                        segment.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 && at_start {
                    if c.is_alphanumeric() || c == '_' {
                        segment.push(c);
                    } else if !segment.is_empty() {
                        found.push(std::mem::take(&mut segment));
                        at_start = false;
                    }
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.push(name);
            }
        }
    }
    found
}

fn module_edges() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| top_module(&src, f)).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for file in &files {
        let Some(from) = top_module(&src, file) else {
            continue;
        };
        let text = fs::read_to_string(file).expect("source file is readable");
        for line in text.lines() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            let code = line.split("//").next().unwrap_or("");
            for to in crate_paths(code) {
                if to != from && modules.contains(&to) {
                    edges.entry(from.clone()).or_default().insert(to);
                }
            }
        }
    }
    edges
}

/// A cycle through `start`, if there is one.
fn cycle_from(
    edges: &BTreeMap<String, BTreeSet<String>>,
    start: &str,
    path: &mut Vec<String>,
) -> Option<Vec<String>> {
    let last = path.last().cloned().unwrap_or_else(|| start.to_owned());
    for next in edges.get(&last).into_iter().flatten() {
        if next == start {
            let mut cycle = path.clone();
            cycle.push(start.to_owned());
            return Some(cycle);
        }
        if !path.contains(next) && next.as_str() > start {
            path.push(next.clone());
            if let Some(cycle) = cycle_from(edges, start, path) {
                return Some(cycle);
            }
            path.pop();
        }
    }
    None
}

#[test]
fn no_two_top_level_modules_import_each_other() {
    let edges = module_edges();
    assert!(
        edges.len() > 10,
        "the modules of src/ were found: {edges:?}"
    );
    for start in edges.keys() {
        let mut path = vec![start.clone()];
        if let Some(cycle) = cycle_from(&edges, start, &mut path) {
            panic!("module cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn grouped_imports_are_counted() {
    assert_eq!(
        crate_paths("use crate::{budget::TurnBudget, FailureClass, observe};"),
        ["budget", "FailureClass", "observe"]
    );
    assert_eq!(crate_paths("let x = crate::util::log_safe(y);"), ["util"]);
    assert_eq!(
        crate_paths("use crate::{dialect::{Chunk, Dialect}, sse};"),
        ["dialect", "sse"]
    );
    assert!(crate_paths("use tower_llm_failover::budget;").is_empty());
}

#[test]
fn a_cycle_is_found() {
    let edge = |a: &str, b: &[&str]| {
        (
            a.to_owned(),
            b.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>(),
        )
    };
    let edges: BTreeMap<_, _> = [
        edge("a", &["b"]),
        edge("b", &["c"]),
        edge("c", &["a"]),
        edge("d", &["a"]),
    ]
    .into_iter()
    .collect();
    let mut path = vec!["a".to_owned()];
    assert_eq!(
        cycle_from(&edges, "a", &mut path),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let mut path = vec!["d".to_owned()];
    assert_eq!(cycle_from(&edges, "d", &mut path), None);
}
