//! Section `mariadb` of the benchmark (benches/backfill.rs) (`scripts/bench.sh --only mariadb`,
//! issue 44): `kafka-backfill capture` from MariaDB (`scripts/mariadb.sh`, started durable:
//! `sync_binlog = 1`, `innodb_flush_log_at_trx_commit = 1`) against MariaDB's own clients on the
//! same server, the same table and the same binlog, in the same run.
//!
//! - **snapshot**: the capture's copy of a pgbench_accounts-shaped table (its "snapshot read in one
//!   consistent snapshot" line: every row read in one `START TRANSACTION WITH CONSISTENT SNAPSHOT`,
//!   encoded, written into sorted per-vnode files and the pending manifest synced) against
//!   `mariadb-dump --single-transaction --master-data=2` of the same table into a file (the DBA's
//!   consistent dump with its binlog position);
//! - **stream**: a backlog of row changes (UPDATEs of 100 rows per transaction) in a binlog file of
//!   its own, the capture resumed over it, from its spawn until the state record Kafka holds
//!   (read_committed, polled every 50 ms) is at or past the backlog's end (every change in a
//!   committed Kafka transaction; process start and fencing included), against `mariadb-binlog
//!   --read-from-remote-server --base64-output=DECODE-ROWS -v` decoding the same binlog into
//!   /dev/null.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::capture::seconds_at;
use super::several_tables::{capture_config, job, spawn, wait_log};
use super::{dir, fmt_rate, rand_suffix, sh, Report};

/// Sizes: the table's rows (the snapshot) and the backlog's row changes (the stream).
pub struct Sizes {
    pub rows: u64,
    pub changes: u64,
}

/// `sql` run by the `mariadb` client as root in database `db`, its output trimmed.
fn sql(port: &str, db: &str, sql: &str) -> String {
    let out = Command::new("mariadb")
        .args(["--no-defaults", "-h", "127.0.0.1", "-P", port, "-u", "root"])
        .args(["-N", "-B", db, "-e", sql])
        .output()
        .expect("mariadb");
    assert!(
        out.status.success(),
        "mariadb {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The `seconds=` field of the first line of `log` holding `needle`.
fn stop(child: &mut std::process::Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    assert!(status.success(), "the capture stopped with {status}");
}

pub fn run(bin: &Path, bootstrap: &str, sizes: &Sizes, r: &mut Report) {
    let url = sh(
        "scripts/mariadb.sh",
        &["start"],
        &[("KB_MARIADB_DURABLE", "1")],
    );
    let port = url
        .rsplit_once(':')
        .unwrap()
        .1
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let durable = sql(
        &port,
        "kafka_backfill",
        "SELECT @@sync_binlog, @@innodb_flush_log_at_trx_commit",
    );
    let label = if durable.split_whitespace().eq(["1", "1"]) {
        "durable MariaDB (sync_binlog=1, innodb_flush_log_at_trx_commit=1, as the server reports)"
            .to_string()
    } else {
        format!("MariaDB NOT durable (sync_binlog, innodb_flush_log_at_trx_commit = {durable})")
    };
    let db = format!("mybench_{}", rand_suffix());
    sql(&port, "kafka_backfill", &format!("CREATE DATABASE {db}"));
    let db_url = format!("{}/{db}", url.rsplit_once('/').unwrap().0);
    eprintln!("mariadb: {} rows…", sizes.rows);
    sql(
        &port,
        &db,
        &format!(
            "CREATE TABLE pgbench_accounts (aid int PRIMARY KEY, bid int, abalance int NOT NULL, filler char(84)); \
             INSERT INTO pgbench_accounts SELECT seq, 1 + seq DIV 100000, 0, '' FROM seq_1_to_{}",
            sizes.rows
        ),
    );

    // The DBA's consistent dump, into a file.
    let d = dir("mariadb");
    let dump = d.join("dump.sql");
    let t = Instant::now();
    let ok = Command::new("mariadb-dump")
        .args([
            "--no-defaults",
            "-h",
            "127.0.0.1",
            "-P",
            &port,
            "-u",
            "root",
        ])
        .args([
            "--single-transaction",
            "--master-data=2",
            &db,
            "pgbench_accounts",
        ])
        .stdout(std::fs::File::create(&dump).unwrap())
        .status()
        .unwrap();
    assert!(ok.success(), "mariadb-dump failed");
    let dump_rate = sizes.rows as f64 / t.elapsed().as_secs_f64();

    // The capture's copy.
    let name = format!("my{}", rand_suffix());
    let topic = format!("bench-{name}");
    let store = format!(
        "kind = \"sqlite\"\npath = \"{}\"\ntable = \"accounts\"",
        d.join("replica.sqlite").display()
    );
    let cfg = d.join("job.toml");
    std::fs::write(
        &cfg,
        capture_config(
            "",
            &job(&name, &topic, bootstrap, &d.join("snapshot"), 1, "", &store),
            &db_url,
            &["pgbench_accounts".to_string()],
            "",
        ),
    )
    .unwrap();
    let log = d.join("capture.log");
    let mut c = spawn(bin, &["capture"], &cfg, &log);
    wait_log(&mut c, &log, "capture checkpoint committed", 1);
    stop(&mut c);
    let secs = seconds_at(&log, "snapshot read in one consistent snapshot");
    let rate = sizes.rows as f64 / secs;
    r.figure(
        "mariadb_snapshot",
        &format!("MariaDB capture snapshot of {} rows of a pgbench_accounts-shaped table ({label}): read in one consistent snapshot, encoded, written into sorted per-vnode files, the pending manifest synced; beside it mariadb-dump --single-transaction --master-data=2 of the same table into a file, {} rows/s", sizes.rows, fmt_rate(dump_rate)),
        format!("{} rows/s ({:.2}× mariadb-dump)", fmt_rate(rate), rate / dump_rate),
        json!({"rows": sizes.rows, "rows_per_s": rate, "mariadb_dump_rows_per_s": dump_rate, "ratio": rate / dump_rate}),
    );

    // The backlog, in a binlog file of its own.
    eprintln!("mariadb: a backlog of {} row changes…", sizes.changes);
    sql(&port, &db, "FLUSH BINARY LOGS");
    let first = sql(&port, &db, "SHOW MASTER STATUS");
    let first = first.split_whitespace().next().unwrap().to_string();
    let per = 100u64;
    let mut script = String::new();
    for i in 0..sizes.changes / per {
        let from = (i * per) % sizes.rows.max(per) + 1;
        script.push_str(&format!(
            "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid BETWEEN {from} AND {};\n",
            from + per - 1
        ));
    }
    let mut load = Command::new("mariadb")
        .args([
            "--no-defaults",
            "-h",
            "127.0.0.1",
            "-P",
            &port,
            "-u",
            "root",
            &db,
        ])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut load.stdin.take().unwrap(), script.as_bytes()).unwrap();
    assert!(load.wait().unwrap().success(), "the backlog's load failed");
    let changes = (sizes.changes / per * per) as f64;
    let end = sql(&port, &db, "SHOW MASTER STATUS");
    let mut end = end.split_whitespace();
    let (end_file, end_pos) = (
        end.next().unwrap().to_string(),
        end.next().unwrap().parse::<u64>().unwrap(),
    );
    let seq = |f: &str| f.rsplit_once('.').unwrap().1.parse::<u32>().unwrap();
    let end_lsn = ((seq(&end_file) as u64) << 32) | end_pos;

    // MariaDB's own reader of the same binlog.
    let t = Instant::now();
    let ok = Command::new("mariadb-binlog")
        .args([
            "--no-defaults",
            "--read-from-remote-server",
            "-h",
            "127.0.0.1",
            "-P",
            &port,
            "-u",
            "root",
        ])
        .args(["--base64-output=DECODE-ROWS", "-v", "--to-last-log", &first])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(ok.success(), "mariadb-binlog failed");
    let raw_rate = changes / t.elapsed().as_secs_f64();

    // The capture resumed over it, until Kafka holds a committed state at or past its end.
    let props: BTreeMap<String, String> =
        [("bootstrap.servers".to_string(), bootstrap.to_string())].into();
    let log = d.join("capture-stream.log");
    let t = Instant::now();
    let mut c = spawn(bin, &["capture"], &cfg, &log);
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let state = kafka_backfill::capture::log::read_state(&props, &topic, &name).unwrap();
        if state.is_some_and(|s| s.state.lsn >= end_lsn) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the capture did not reach {end_file}:{end_pos}"
        );
        if let Some(s) = c.try_wait().unwrap() {
            panic!(
                "the capture exited ({s}) before the backlog's end: {}",
                log.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let secs = t.elapsed().as_secs_f64();
    stop(&mut c);
    let rate = changes / secs;
    r.figure(
        "mariadb_stream",
        &format!("MariaDB capture resuming over a backlog of {changes} row changes (UPDATEs of {per} rows per transaction, {label}): spawn → Kafka holds a committed state record at or past the backlog's end position (process start and fencing included); beside it mariadb-binlog --read-from-remote-server -v decoding the same binlog into /dev/null, {} changes/s", fmt_rate(raw_rate)),
        format!("{} changes/s ({:.2}× mariadb-binlog)", fmt_rate(rate), rate / raw_rate),
        json!({"changes": changes, "changes_per_s": rate, "mariadb_binlog_changes_per_s": raw_rate, "ratio": rate / raw_rate}),
    );
    sql(&port, "kafka_backfill", &format!("DROP DATABASE {db}"));
}
