//! Schema changes aligned at a barrier (docs/WIRE.md "Schema changes"), end to end through the real
//! binary against the real broker: `produce --evolve` writes a log of four row-schema versions (add
//! two columns, widen one, drop one), and the job materialises it exactly into SQLite and
//! PostgreSQL with a rebalance between versions, while streaming, and refuses an incompatible
//! change before applying anything of it.

use crate::support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{pg_url, serial, tail, Fixture, Runner, BIN};

const MIN: Duration = Duration::from_secs(60);

const EVOLVING_LOG: [&str; 9] = [
    "--partitions",
    "4",
    "--rows",
    "500",
    "--changes",
    "20000",
    "--epoch-changes",
    "200",
    "--evolve",
];

/// The versions `produce --evolve` announced, as files.
/// Waits until `f`'s snapshot folder holds `n` schema versions; on a timeout, the tail of
/// `capture`'s log says why.
pub(crate) fn wait_for_versions(f: &Fixture, capture: &Runner, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while version_files(f) < n {
        assert!(
            std::time::Instant::now() < deadline,
            "fewer than {n} schema versions: {}",
            tail(&capture.log_text())
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

pub(crate) fn version_files(f: &Fixture) -> usize {
    std::fs::read_dir(f.dir.join("out/snapshot/schema_versions"))
        .map(|d| {
            d.filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".json"))
            })
            .count()
        })
        .unwrap_or(0)
}

/// `a` runs the job throttled; `b` joins once `a` has applied the first schema change in the log
/// store (a vnode-bitmap update there: the invariant error and a recreation), and both run until
/// caught up. The table is exact at the last version.
fn rebalance_between_versions(f: &Fixture) -> String {
    f.produce(&EVOLVING_LOG);
    assert_eq!(
        version_files(f),
        3,
        "produce --evolve announces three versions"
    );
    let log = f.check_log();
    assert!(log.contains("4 row-schema versions: 0 violations"), "{log}");
    let mut a = f.spawn_run("a", &["--exit-when-caught-up"]);
    a.wait_for("to=\"log_store\"", MIN);
    a.wait_for("schema change applied", MIN);
    let mut b = f.spawn_run("b", &["--exit-when-caught-up"]);
    a.wait_for(
        "should not update vnode bitmap during consuming log store",
        MIN,
    );
    for r in [&mut a, &mut b] {
        assert!(r.wait_exit(4 * MIN).success(), "{}", tail(&r.log_text()));
    }
    let text = f.verify_eventually(MIN);
    assert!(text.contains(" 0 missing, 0 extra, 0 different"), "{text}");
    a.log_text() + &b.log_text()
}

#[test]
fn four_schema_versions_backfill_exactly_into_sqlite_with_a_rebalance_between_versions() {
    let _g = serial();
    let f = Fixture::new("evolve-sqlite", 1, "max_rows_per_second = 2500");
    rebalance_between_versions(&f);
    // The history, one row per change, each applied at or after the epoch it starts at.
    let history: Vec<Vec<i64>> =
        f.sql("SELECT version, from_epoch, applied_epoch FROM kb_schema_history ORDER BY version");
    assert_eq!(history.len(), 3, "{history:?}");
    for (i, h) in history.iter().enumerate() {
        assert_eq!(h[0], i as i64 + 1);
        assert!(
            h[2] >= h[1],
            "version {} applied at {} before {}",
            h[0],
            h[2],
            h[1]
        );
    }
    // The table's columns are the last version's: tier and note added, payload dropped.
    let columns: Vec<Vec<String>> = f.sql("SELECT name FROM pragma_table_info('accounts')");
    let columns: Vec<&str> = columns.iter().map(|c| c[0].as_str()).collect();
    assert!(
        columns.contains(&"tier") && columns.contains(&"note"),
        "{columns:?}"
    );
    assert!(!columns.contains(&"payload"), "{columns:?}");
    // Widened: a long that an int could not hold.
    let wide: Vec<Vec<i64>> = f.sql("SELECT count(*) FROM accounts WHERE tier >= 1099511627776");
    assert!(wide[0][0] > 0, "no row written with the widened tier");
}

#[test]
fn four_schema_versions_backfill_exactly_into_postgres_with_a_rebalance_between_versions() {
    let _g = serial();
    let (f, url) = on_postgres("evolvepg", 1, "max_rows_per_second = 2500");
    rebalance_between_versions(&f);
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let history: Vec<(i32, i64, Option<i64>)> = client
        .query(
            "SELECT version, from_epoch, applied_epoch FROM kb_schema_history WHERE job = $1 ORDER BY version",
            &[&f.name],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(history.len(), 3, "{history:?}");
    let table = format!("accounts_{}", f.name.replace('-', "_"));
    let columns: Vec<String> = client
        .query(
            "SELECT column_name FROM information_schema.columns WHERE table_name = $1",
            &[&table],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(columns.iter().any(|c| c == "tier"), "{columns:?}");
    assert!(!columns.iter().any(|c| c == "payload"), "{columns:?}");
}

/// Under `consistency = "epoch"` the table readers see takes each version with its epoch's rows,
/// when that epoch is published; the rebalance's recreation builds the new generation beside the
/// visible table at the recorded version (its snapshot rows resolved to it, the later versions
/// applied to it) and replaces it whole: exact at the last version.
#[test]
fn four_schema_versions_under_consistency_epoch_with_a_rebalance_between_versions() {
    let _g = serial();
    let f = Fixture::new("evolve-epoch", 1, "max_rows_per_second = 2500");
    f.edit_config("workers = 1\n", "workers = 1\nconsistency = \"epoch\"\n");
    rebalance_between_versions(&f);
    let history: Vec<Vec<i64>> = f.sql("SELECT count(*) FROM kb_schema_history");
    assert_eq!(history[0][0], 3);
    let columns: Vec<Vec<String>> = f.sql("SELECT name FROM pragma_table_info('accounts')");
    let columns: Vec<&str> = columns.iter().map(|c| c[0].as_str()).collect();
    assert!(
        columns.contains(&"tier") && !columns.contains(&"payload"),
        "{columns:?}"
    );
    let building: Vec<Vec<i64>> =
        f.sql("SELECT count(*) FROM sqlite_master WHERE name = 'accounts__kb_next'");
    assert_eq!(
        building[0][0], 0,
        "the building table replaced the visible one"
    );
}

#[test]
fn four_schema_versions_under_consistency_epoch_on_postgres() {
    let _g = serial();
    let (f, url) = on_postgres("evolveepochpg", 1, "max_rows_per_second = 2500");
    f.edit_config("workers = 1\n", "workers = 1\nconsistency = \"epoch\"\n");
    rebalance_between_versions(&f);
    assert_eq!(history_count(&f, Some(&url)), 3);
}

/// The writer switches versions while the job is already streaming (it started on the snapshot
/// while the log was being written); a kill -9 after the first change and a restart read each
/// epoch with its own version again.
#[test]
fn schema_changes_while_streaming_and_across_a_kill_9_are_exact() {
    let _g = serial();
    streaming_and_kill_9(&Fixture::new("evolve-stream", 1, ""), None);
}

#[test]
fn schema_changes_while_streaming_and_across_a_kill_9_are_exact_on_postgres() {
    let _g = serial();
    let (f, url) = on_postgres("evolvestreampg", 1, "");
    streaming_and_kill_9(&f, Some(&url));
}

/// A small log: `partitions`, 300 rows, 2,000 changes, 100 changes an epoch, and `extra` flags.
fn produce_small(f: &Fixture, partitions: &str, extra: &[&str]) {
    let mut args = vec![
        "--partitions",
        partitions,
        "--rows",
        "300",
        "--changes",
        "2000",
        "--epoch-changes",
        "100",
    ];
    args.extend_from_slice(extra);
    f.produce(&args);
}

/// `check-config` of the fixture's config, which must fail: its standard error.
fn check_config_refuses(f: &Fixture) -> String {
    let out = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(&f.config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "check-config passed\n{err}");
    err
}

/// A fixture whose store is the test PostgreSQL (a fresh job name each run: its tables outlive the
/// test); returns the store's URL.
fn on_postgres(name: &str, workers: u32, job_extra: &str) -> (Fixture, String) {
    let f = Fixture::new(&format!("{name}{}", support::stamp()), workers, job_extra);
    let url = pg_url();
    f.use_postgres(&url);
    (f, url)
}

/// The versions the store recorded: SQLite's file, or the PostgreSQL store at `pg`.
fn history_count(f: &Fixture, pg: Option<&str>) -> i64 {
    match pg {
        None => f.sql::<i64>("SELECT count(*) FROM kb_schema_history")[0][0],
        Some(url) => postgres::Client::connect(url, postgres::NoTls)
            .unwrap()
            .query_one(
                "SELECT count(*) FROM kb_schema_history WHERE job = $1",
                &[&f.name],
            )
            .unwrap()
            .get(0),
    }
}

fn streaming_and_kill_9(f: &Fixture, pg: Option<&str>) {
    let writer = Command::new(BIN)
        .args(["produce", "--bootstrap", &f.bootstrap, "--topic", &f.topic])
        .args(EVOLVING_LOG)
        .args(["--rate", "2000", "--evolve-gate"])
        .arg(f.dir.join("streaming"))
        .arg("--out")
        .arg(f.dir.join("out"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let manifest = f.dir.join("out/snapshot/manifest.json");
    let deadline = Instant::now() + MIN;
    while !manifest.exists() {
        assert!(Instant::now() < deadline, "no manifest");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut run = f.spawn_run("s1", &[]);
    run.wait_for("to=\"streaming\"", MIN);
    // The writer holds its first version until the job streams (on a slow machine the job could
    // otherwise still be in the log store when the versions come).
    std::fs::write(f.dir.join("streaming"), b"").unwrap();
    run.wait_for("schema change applied", MIN);
    run.signal("KILL");
    run.wait_exit(MIN);
    let mut run = f.spawn_run("s2", &[]);
    let out = writer.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = f.verify_eventually(2 * MIN);
    assert!(text.contains(" 0 missing, 0 extra, 0 different"), "{text}");
    run.signal("TERM");
    run.wait_exit(MIN);
    assert_eq!(history_count(f, pg), 3);
    let log = std::fs::read_to_string(f.dir.join("s1.log")).unwrap();
    let streaming = log.find("to=\"streaming\"").unwrap();
    let applied = log.find("schema change applied").unwrap();
    assert!(
        streaming < applied,
        "the first change was applied before streaming"
    );
}

/// A version that changes a column's type incompatibly stops the job at start, naming the table,
/// the file and the field, before anything of it is applied: the table and its history are as
/// they were.
#[test]
fn an_incompatible_schema_change_stops_before_anything_is_applied() {
    let _g = serial();
    let f = Fixture::new("evolve-bad", 1, "");
    produce_small(&f, "2", &[]);
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    assert!(
        run.wait_exit(2 * MIN).success(),
        "{}",
        tail(&run.log_text())
    );
    let before: Vec<Vec<i64>> = f.sql("SELECT count(*), sum(balance) FROM accounts");
    // `payload` from string to long: not a compatible change.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.dir.join("out/snapshot/manifest.json")).unwrap())
            .unwrap();
    let mut schema = manifest["row_schema"].clone();
    for field in schema["fields"].as_array_mut().unwrap() {
        if field["name"] == "payload" {
            field["type"] = serde_json::json!("long");
        }
    }
    let folder = f.dir.join("out/snapshot/schema_versions");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("0000000000000000.json"),
        serde_json::json!({"from_epoch": u64::MAX / 2, "row_schema": schema}).to_string(),
    )
    .unwrap();
    // check-config refuses what run refuses.
    let err = check_config_refuses(&f);
    assert!(err.contains("field payload"), "check-config: {err}");
    let mut run = f.spawn_run("b", &["--exit-when-caught-up"]);
    assert!(!run.wait_exit(MIN).success());
    let log = run.log_text();
    assert!(
        log.contains("incompatible schema change of table")
            && log.contains("field payload")
            && log.contains("0000000000000000.json"),
        "{}",
        tail(&log)
    );
    let after: Vec<Vec<i64>> = f.sql("SELECT count(*), sum(balance) FROM accounts");
    assert_eq!(before, after);
    let history: Vec<Vec<i64>> = f.sql("SELECT count(*) FROM kb_schema_history");
    assert_eq!(history[0][0], 0);
}

/// A log that announces schema versions, materialised into a table that cannot take them yet
/// (`store_datum = false`): `check-config` and `run` refuse the job at start, naming the setting
/// — not at the version's checkpoint, after the snapshot — and `run` writes no row.
#[test]
fn a_store_layout_that_cannot_take_schema_versions_is_refused_at_start() {
    let _g = serial();
    let f = Fixture::new("evolve-layout", 1, "");
    produce_small(&f, "2", &["--evolve"]);
    let says = "jobs.store.store_datum = false";
    f.edit_config(
        "table = \"accounts\"\n",
        "table = \"accounts\"\nstore_datum = false\n",
    );
    {
        let err = check_config_refuses(&f);
        assert!(
            err.contains(says) && err.contains("schema version"),
            "check-config: {err}"
        );
        let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
        assert!(!run.wait_exit(MIN).success());
        let log = run.log_text();
        assert!(log.contains(says), "{}", tail(&log));
        assert!(
            !f.dir.join("state.sqlite").exists()
                || f.sql::<i64>("SELECT count(*) FROM sqlite_master WHERE name = 'accounts'")[0][0]
                    == 0,
            "the table was made before the refusal\n{}",
            tail(&log)
        );
    }
}

/// The same incompatible version announced while the job streams: the next checkpoint barrier reads
/// the versions again and the job stops there, naming the field; nothing after the last checkpoint
/// before it is committed, and the table keeps its columns.
#[test]
fn an_incompatible_schema_change_announced_while_streaming_stops_the_job() {
    let _g = serial();
    let f = Fixture::new("evolve-badlive", 1, "");
    produce_small(&f, "4", &[]);
    let mut run = f.spawn_run("a", &[]);
    run.wait_for("to=\"streaming\"", MIN);
    let committed = |f: &Fixture| -> Vec<Vec<i64>> {
        f.sql("SELECT partition, next_offset FROM kb_partition_progress ORDER BY partition")
    };
    // The log's last checkpoints commit after the streaming line: the store holds every end
    // offset before the version is announced.
    let ends = support::end_offsets(&f, 4);
    let deadline = Instant::now() + MIN;
    while committed(&f).len() < ends.len()
        || committed(&f)
            .iter()
            .zip(&ends)
            .any(|(c, end)| (c[1] as u64) < *end)
    {
        assert!(Instant::now() < deadline, "{:?} < {ends:?}", committed(&f));
        std::thread::sleep(Duration::from_millis(50));
    }
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.dir.join("out/snapshot/manifest.json")).unwrap())
            .unwrap();
    let mut schema = manifest["row_schema"].clone();
    schema["fields"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "region", "type": "string"}));
    let folder = f.dir.join("out/snapshot/schema_versions");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("0000000000000001.json"),
        serde_json::json!({"from_epoch": u64::MAX / 2, "row_schema": schema}).to_string(),
    )
    .unwrap();
    let before = committed(&f);
    let writer = f.append(&["--changes", "1000", "--seed", "5"]);
    assert!(writer.wait_with_output().unwrap().status.success());
    let status = run.wait_exit(MIN);
    assert!(!status.success());
    let log = run.log_text();
    assert!(
        log.contains("incompatible schema change of table")
            && log.contains("field region is added without a default"),
        "{}",
        tail(&log)
    );
    // Stopped at the first checkpoint barrier of the appended log: nothing of it committed.
    assert_eq!(committed(&f), before);
    let columns: Vec<Vec<String>> = f.sql("SELECT name FROM pragma_table_info('accounts')");
    assert!(!columns.iter().any(|c| c[0] == "region"));
}

/// A log of four versions with a kill -9 in the snapshot phase and another in the log store after
/// the first change was applied: each restart reads each epoch with its own version (the snapshot's
/// rows, of the manifest's version, resolved to the table's) and the table is exact.
#[test]
fn kill_9_in_the_snapshot_and_the_log_store_of_an_evolving_log_is_exact() {
    let _g = serial();
    let f = Fixture::new("evolve-kill", 2, "max_rows_per_second = 2500");
    kill_9_snapshot_and_log_store(&f, None);
}

#[test]
fn kill_9_in_the_snapshot_and_the_log_store_of_an_evolving_log_is_exact_on_postgres() {
    let _g = serial();
    let (f, url) = on_postgres("evolvekillpg", 2, "max_rows_per_second = 2500");
    kill_9_snapshot_and_log_store(&f, Some(&url));
}

fn kill_9_snapshot_and_log_store(f: &Fixture, pg: Option<&str>) {
    f.produce(&[
        "--partitions",
        "4",
        "--rows",
        "6000",
        "--changes",
        "20000",
        "--epoch-changes",
        "200",
        "--evolve",
    ]);
    let mut run = f.spawn_run("k1", &[]);
    run.wait_for("cause=Local", MIN);
    run.signal("KILL");
    run.wait_exit(MIN);
    assert_eq!(support::phase_at_death(&run.log_text()), "snapshot");
    let mut run = f.spawn_run("k2", &[]);
    run.wait_for("schema change applied", 2 * MIN);
    run.signal("KILL");
    run.wait_exit(MIN);
    assert_eq!(support::phase_at_death(&run.log_text()), "log_store");
    let mut run = f.spawn_run("final", &["--exit-when-caught-up"]);
    assert!(
        run.wait_exit(3 * MIN).success(),
        "{}",
        tail(&run.log_text())
    );
    let text = f.verify_eventually(MIN);
    assert!(text.contains(" 0 missing, 0 extra, 0 different"), "{text}");
    assert_eq!(history_count(f, pg), 3);
}
