//! The architecture's rules, checked on the source: the core (its own crate, `crates/core`, whose
//! dependencies are serde, thiserror and crc32fast only) does no I/O and reads no clock; the worker
//! loop talks to the world only through its ports (its observer included: no metrics, no status
//! board, no clock of its own); and the layers import downwards only — the service composes the
//! loop, Kafka and the stores, none of which reaches back up into it.

use std::path::Path;

fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    if dir.is_file() {
        out.push((
            dir.display().to_string(),
            std::fs::read_to_string(dir).unwrap(),
        ));
        return;
    }
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push((
                path.display().to_string(),
                std::fs::read_to_string(&path).unwrap(),
            ));
        }
    }
}

/// Code lines (comments dropped) of every file under `dir` that use one of `forbidden`.
fn uses(dir: &str, forbidden: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join(dir), &mut files);
    assert!(!files.is_empty(), "no sources under {dir}");
    let mut found = Vec::new();
    for (file, text) in files {
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for f in forbidden {
                if code.contains(f) {
                    found.push(format!("{file}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    found
}

#[test]
fn the_core_does_no_io_and_reads_no_clock() {
    let found = uses(
        "crates/core/src",
        &[
            "tokio",
            "rdkafka",
            "rusqlite",
            "postgres",
            "std::fs",
            "std::net",
            "std::thread",
            "Instant",
            "SystemTime",
            "std::process",
            "std::env",
        ],
    );
    assert!(found.is_empty(), "I/O in the core:\n{}", found.join("\n"));
}

#[test]
fn the_worker_loop_talks_to_the_world_through_its_ports() {
    let found = uses(
        "src/driver",
        &[
            "rdkafka",
            "tokio",
            "rusqlite",
            "std::fs",
            "std::net",
            "std::thread",
            "SystemTime",
            "Instant",
            "crate::service",
            "crate::kafka",
            "crate::store::sqlite",
            "crate::store::postgres",
            "prometheus",
            "BaseConsumer",
            "Connection",
        ],
    );
    assert!(found.is_empty(), "I/O in the loop:\n{}", found.join("\n"));
}

/// No circle between the loop, Kafka and the service: Kafka, the stores and the snapshot sources
/// know neither the loop nor the service; the loop knows neither Kafka nor the service (above).
#[test]
fn the_layers_import_downwards_only() {
    for dir in ["src/kafka", "src/store", "src/snapshot", "src/codec"] {
        let found = uses(dir, &["crate::service", "crate::driver", "crate::sim"]);
        assert!(
            found.is_empty(),
            "{dir} reaches up into the loop or the service:\n{}",
            found.join("\n")
        );
    }
}

/// The capture loop (`src/capture/mod.rs`, run by production and the simulation alike) reaches
/// PostgreSQL and Kafka only through its two ports; the ports' implementations know neither the
/// service nor the simulation.
#[test]
fn the_capture_loop_talks_to_the_world_through_its_ports() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/capture/mod.rs");
    let text = std::fs::read_to_string(&path).unwrap();
    let forbidden = [
        "rdkafka",
        "pg_walstream",
        "postgres::",
        "tokio",
        "std::fs",
        "std::thread",
        "SystemTime",
        "Instant",
        "crate::service",
        "crate::sim",
        "prometheus",
    ];
    let found: Vec<String> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| {
            let code = l.split("//").next().unwrap_or("");
            forbidden.iter().any(|f| code.contains(f))
        })
        .map(|(n, l)| format!("src/capture/mod.rs:{}: {}", n + 1, l.trim()))
        .collect();
    assert!(
        found.is_empty(),
        "I/O in the capture loop:\n{}",
        found.join("\n")
    );
    for file in [
        "pg.rs",
        "log.rs",
        "types.rs",
        "job.rs",
        "report.rs",
        "session.rs",
        "snapshots.rs",
        "mariadb/mod.rs",
        "mariadb/binlog.rs",
        "mariadb/types.rs",
        "mariadb/job.rs",
    ] {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("src/capture")
                .join(file),
        )
        .unwrap();
        for bad in ["crate::service", "crate::sim", "crate::driver"] {
            assert!(
                !text.contains(bad),
                "src/capture/{file} reaches up into {bad}"
            );
        }
    }
}

/// What both sources' sessions share (`src/capture/session.rs`) imports neither source nor the
/// PostgreSQL job, so the sources import it and not each other (no import circle between them).
#[test]
fn the_shared_session_imports_no_source() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src/capture/session.rs"),
    )
    .unwrap();
    for bad in [
        "super::pg",
        "super::mariadb",
        "super::job",
        "capture::pg",
        "capture::mariadb",
        "capture::job",
    ] {
        let found: Vec<&str> = text
            .lines()
            .filter(|l| l.split("//").next().unwrap_or("").contains(bad))
            .collect();
        assert!(
            found.is_empty(),
            "src/capture/session.rs names {bad}: {found:?}"
        );
    }
}

/// The library's top-level modules (`pub mod` in `src/lib.rs`), each with the other top-level
/// modules its code names as `crate::<module>` (unit-test modules left out), and where.
fn module_graph() -> std::collections::BTreeMap<String, Vec<(String, String)>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(root.join("lib.rs")).unwrap();
    let modules: Vec<String> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect();
    assert!(modules.len() > 10, "modules of src/lib.rs: {modules:?}");
    let mut graph = std::collections::BTreeMap::new();
    for m in &modules {
        let mut files = Vec::new();
        let dir = root.join(m);
        sources(
            &if dir.is_dir() {
                dir
            } else {
                root.join(format!("{m}.rs"))
            },
            &mut files,
        );
        let mut uses: Vec<(String, String)> = Vec::new();
        for (file, text) in files {
            // Unit tests at the end of a file, or in a module's own `tests.rs` / `*_tests.rs`,
            // may use test helpers from anywhere.
            if file.ends_with("/tests.rs") || file.ends_with("_tests.rs") {
                continue;
            }
            let code = text
                .split("\n#[cfg(test)]\nmod ")
                .next()
                .unwrap_or_default();
            for (n, line) in code.lines().enumerate() {
                let line = line.split("//").next().unwrap_or("");
                for (at, _) in line.match_indices("crate::") {
                    let name: String = line[at + 7..]
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if name != *m && modules.contains(&name) {
                        uses.push((name, format!("{file}:{}", n + 1)));
                    }
                }
            }
        }
        graph.insert(m.clone(), uses);
    }
    graph
}

/// The service composes every edge (capture, Kafka, stores, snapshots, `check-log`, `verify`,
/// the configuration, the PostgreSQL helpers); no edge reaches back into it. Only the compositions
/// above it (`demo`) may name it.
#[test]
fn no_edge_module_imports_the_service() {
    let mut found = Vec::new();
    for (m, uses) in module_graph() {
        if m == "service" || m == "demo" {
            continue;
        }
        for (to, at) in uses {
            if to == "service" || to == "demo" {
                found.push(format!("{m} -> {to} at {at}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "edges importing the service:\n{}",
        found.join("\n")
    );
}

/// The top-level modules import each other in no circle: each can be read knowing only those
/// below it.
#[test]
fn the_top_level_modules_import_in_no_circle() {
    let graph = module_graph();
    // Depth-first search; a module met again on the current path closes a circle.
    fn visit(
        m: &str,
        graph: &std::collections::BTreeMap<String, Vec<(String, String)>>,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut circle = path[i..].to_vec();
            circle.push(m.to_string());
            return Some(circle);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for (to, _) in &graph[m] {
            if let Some(c) = visit(to, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = std::collections::BTreeSet::new();
    for m in graph.keys() {
        if let Some(circle) = visit(m, &graph, &mut Vec::new(), &mut done) {
            let ties: Vec<String> = circle
                .windows(2)
                .map(|w| {
                    let at = graph[&w[0]]
                        .iter()
                        .find(|(to, _)| *to == w[1])
                        .map(|(_, at)| at.as_str())
                        .unwrap_or("?");
                    format!("{} -> {} at {at}", w[0], w[1])
                })
                .collect();
            panic!(
                "an import circle: {}\n{}",
                circle.join(" -> "),
                ties.join("\n")
            );
        }
    }
}
