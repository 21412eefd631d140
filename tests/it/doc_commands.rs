//! The docs' command blocks run as written: every ```` ```sh ```` block of README.md and docs/*.md,
//! in order, one `bash -euo pipefail` per file (so a variable set in one block is there in the next),
//! against the test broker and PostgreSQL, failing on the first non-zero exit. A block right after a
//! line `<!-- not run by tests/it/doc_commands.rs: <why> -->` is left out (a Kubernetes cluster, the
//! whole test suite, the full benchmarks), and the check holds each such line to a reason.
//!
//! What stands for the fresh machine: each file runs in a scratch folder whose `config/`,
//! `scripts/` and `schemas/` are the repository's and whose `target/release/kafka-backfill` is the
//! binary under test (so `cargo` is a no-op there, saying so; the build itself is what CI does
//! first), and whose `.run/` is its own. The PostgreSQL database and the topic a file's commands
//! create are dropped before it runs. Background processes a block starts (`capture &`, `run &`) are
//! stopped with SIGTERM when the file ends.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::{serial, BIN};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const NOT_RUN: &str = "<!-- not run by tests/it/doc_commands.rs: ";

/// The `sh` blocks of a Markdown text that are run, in order.
fn blocks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    let mut previous = "";
    while let Some(line) = lines.next() {
        if line.trim_end() == "```sh" {
            let skip = previous.starts_with(NOT_RUN);
            let mut block = String::new();
            for l in lines.by_ref() {
                if l.starts_with("```") {
                    break;
                }
                block.push_str(l);
                block.push('\n');
            }
            if !skip {
                out.push(block);
            }
        }
        previous = line;
    }
    out
}

/// A scratch folder standing for a fresh clone with the binary built.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "doc-{name}-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    ));
    std::fs::create_dir_all(dir.join("target/release")).unwrap();
    for d in ["config", "scripts", "schemas"] {
        std::os::unix::fs::symlink(Path::new(ROOT).join(d), dir.join(d)).unwrap();
    }
    std::os::unix::fs::symlink(BIN, dir.join("target/release/kafka-backfill")).unwrap();
    dir
}

/// Runs the blocks of `file` in a scratch folder; the output, or a panic naming the failing line.
fn run_file(file: &str, before: &str) -> String {
    let text = std::fs::read_to_string(Path::new(ROOT).join(file)).unwrap();
    let blocks = blocks(&text);
    assert!(!blocks.is_empty(), "{file} has no block to run");
    let dir = scratch(&file.replace('/', "-"));
    let script = format!(
        "set -euo pipefail\n\
         cargo() {{ echo \"(cargo $*: the binary under test stands for the build)\"; }}\n\
         trap 'for p in $(jobs -p); do kill -TERM $p 2>/dev/null || true; done; wait' EXIT\n\
         {before}\n{}",
        blocks.join("\n")
    );
    std::fs::write(dir.join("doc.sh"), &script).unwrap();
    let out = Command::new("bash")
        .arg("-x")
        .arg("doc.sh")
        .current_dir(&dir)
        // The broker's state stays the repository's: the scratch folder's scripts/ is a link.
        .env("KB_RUN_DIR", Path::new(ROOT).join(".run/kafka"))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "a command of {file} failed as written (the last `+` line), in {}:\n{}",
        dir.display(),
        support::tail(&text)
    );
    text
}

#[test]
fn every_block_not_run_says_why() {
    for file in docs() {
        let text = std::fs::read_to_string(Path::new(ROOT).join(&file)).unwrap();
        for line in text.lines().filter(|l| l.starts_with(NOT_RUN)) {
            let why = line[NOT_RUN.len()..].trim_end_matches("-->").trim();
            assert!(why.len() > 10, "{file}: {line}");
        }
    }
}

fn docs() -> Vec<String> {
    let mut files = vec!["README.md".to_string()];
    for e in std::fs::read_dir(Path::new(ROOT).join("docs")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().to_string();
        if name.ends_with(".md") {
            files.push(format!("docs/{name}"));
        }
    }
    files.sort();
    files
}

/// Only these files have blocks that run; a new block elsewhere is either run here (add its file)
/// or marked as not run.
#[test]
fn every_runnable_block_is_run_by_a_test() {
    for file in docs() {
        let text = std::fs::read_to_string(Path::new(ROOT).join(&file)).unwrap();
        let n = blocks(&text).len();
        let runs = ["README.md", "docs/CAPTURE.md"].contains(&file.as_str());
        assert!(runs || n == 0, "{file} has {n} sh block(s) no test runs");
    }
}

/// README's walk-through against the real broker: produce, check-config, doctor, check-log, run,
/// verify, sqlite3, and the group's lag through Kafka's own tool.
#[test]
fn the_readme_walk_through_runs_as_written() {
    let _g = serial();
    let out = run_file("README.md", "");
    assert!(out.contains(" 0 missing, 0 extra, 0 different"), "{out}");
}

/// docs/CAPTURE.md's quick starts: pgbench's accounts captured, replayed and compared with the
/// source, then a MariaDB table the same way. The databases, the slot and the topics they create
/// (the logs and the captures' state topics) are dropped first, as on a fresh machine.
#[test]
fn the_capture_quick_start_runs_as_written() {
    let _g = serial();
    let _mariadb = crate::capture_mariadb::mariadb_lane();
    let before = "\
        psql -q -h 127.0.0.1 -p 15432 -U postgres -d postgres -c \
          \"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = 'bench'\" >/dev/null\n\
        dropdb --if-exists -h 127.0.0.1 -p 15432 -U postgres bench\n\
        topics() { scripts/kafka.sh tool org.apache.kafka.tools.TopicCommand --bootstrap-server 127.0.0.1:19092 \"$@\"; }\n\
        for t in pgbench-accounts pgbench-accounts.capture shop-orders shop-orders.capture; do topics --delete --if-exists --topic $t; done\n\
        while topics --list | grep -qE '^(pgbench-accounts|shop-orders)(\\.capture)?$'; do sleep 0.5; done\n\
        scripts/mariadb.sh start >/dev/null\n\
        mariadb --no-defaults -h 127.0.0.1 -P 13306 -u root -e 'DROP DATABASE IF EXISTS shop'\n";
    let out = run_file("docs/CAPTURE.md", before);
    assert_eq!(
        out.matches(" 0 missing, 0 extra, 0 different").count(),
        2,
        "both quick starts end exact: {out}"
    );
}
