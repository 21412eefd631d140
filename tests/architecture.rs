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
    for file in ["pg.rs", "log.rs", "types.rs"] {
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
