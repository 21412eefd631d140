//! The docs name only files that exist: every repository path written in backticks in README.md and
//! docs/*.md (`src/…`, `tests/…`, `scripts/…`, …, with `{a,b}` alternatives expanded and a `:line`
//! suffix dropped) is a file or folder of the tree.

use std::path::Path;

const ROOTS: [&str; 12] = [
    "src/",
    "tests/",
    "crates/",
    "scripts/",
    "docs/",
    "schemas/",
    "config/",
    "deploy/",
    "docker/",
    "benches/",
    ".ci/",
    "README.md",
];

/// `a/{b,c}/d` → `a/b/d`, `a/c/d` (one level of braces is all the docs use).
fn expand(path: &str) -> Vec<String> {
    match (path.find('{'), path.find('}')) {
        (Some(open), Some(close)) if open < close => path[open + 1..close]
            .split(',')
            .flat_map(|alt| expand(&format!("{}{alt}{}", &path[..open], &path[close + 1..])))
            .collect(),
        _ => vec![path.to_string()],
    }
}

fn named_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, chunk) in text.split('`').enumerate() {
        // Odd chunks are inside backticks.
        if i % 2 == 0 || chunk.contains(' ') || !ROOTS.iter().any(|r| chunk.starts_with(r)) {
            continue;
        }
        let path = chunk.split(':').next().unwrap_or(chunk);
        let path = path.trim_end_matches("/**").trim_end_matches('/');
        if path.contains('*') || path.contains('<') {
            continue; // a pattern, not a path
        }
        out.extend(expand(path));
    }
    out
}

#[test]
fn every_path_the_docs_name_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(p);
        }
    }
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        for p in named_paths(&text) {
            checked += 1;
            if !root.join(&p).exists() {
                missing.push(format!(
                    "{}: {p}",
                    doc.strip_prefix(root).unwrap().display()
                ));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} paths found: the scan is broken"
    );
    assert!(
        missing.is_empty(),
        "paths the docs name that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_scan_reads_what_the_docs_write() {
    assert_eq!(
        named_paths("see `src/driver/{mod,events}.rs` and `tests/it/a.rs:12`, not `a b/c` or `x`"),
        ["src/driver/mod.rs", "src/driver/events.rs", "tests/it/a.rs"]
    );
}
