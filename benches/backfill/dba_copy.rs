//! Section `dba-copy` of the benchmark (benches/backfill.rs) (`scripts/bench.sh --only dba-copy`,
//! issue 43): pgbench's four tables copied end to end by kafka-backfill against the copy a DBA
//! would make of the same tables, on the same servers, in the same run.
//!
//! - **the DBA's copy**: `pg_dump -t pgbench_accounts -t … source | psql target` into a fresh
//!   database of the same (durable) server — schema, rows, primary keys — timed from the start of
//!   `pg_dump` until `psql` exits (its last statement committed);
//! - **kafka-backfill**: `run --capture` of one job of the four tables (`consistency = "epoch"`), from
//!   the process's spawn until the store holds every row of the four tables at a published epoch (read
//!   from the store itself, not from a log line): the capture's slot and exported snapshot, its copy
//!   into per-vnode files, the Kafka transaction of its first checkpoint, the job's snapshot phase and
//!   its publication. Into PostgreSQL and into SQLite.
//!
//! Beside them, the capture's own copy rate of the four tables (its "snapshot copied" line), the
//! figure section `capture` measures for `pgbench_accounts` alone.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use super::capture::{psql, snapshot_seconds};
use super::several_tables::{
    capture_config, four_capture_tables, four_table_store, job, pgbench_db, spawn, TABLES,
};
use super::{dir, fmt_rate, rand_suffix, Report};

/// Row counts of the four tables in `TABLES`' order.
type Counts = [i64; 4];

fn source_counts(url: &str) -> Counts {
    TABLES.map(|(t, _)| {
        psql(url, &format!("SELECT count(*) FROM {t}"))
            .parse()
            .unwrap()
    })
}

/// The DBA's copy of the four tables of `url` into a fresh database: seconds.
fn dba_copy(pg: &str, url: &str) -> f64 {
    let tables: Vec<String> = TABLES.iter().map(|(t, _)| t.to_string()).collect();
    pg_dump_copy(pg, url, &tables, |target| {
        assert_eq!(source_counts(target), source_counts(url), "the DBA's copy")
    })
}

/// `pg_dump -t … | psql` of `tables` of `url` into a fresh database of the server `pg` (schema,
/// rows, primary keys), timed from the start of `pg_dump` until `psql` exits; `check` reads the
/// copy before it is dropped. Seconds.
pub(super) fn pg_dump_copy(
    pg: &str,
    url: &str,
    tables: &[String],
    check: impl FnOnce(&str),
) -> f64 {
    let db = format!("dbacopy_{}", rand_suffix());
    psql(pg, &format!("CREATE DATABASE {db}"));
    let target = format!("{}/{db}", pg.rsplit_once('/').unwrap().0);
    let tables: String = tables.iter().map(|t| format!(" -t public.{t}")).collect();
    let t = Instant::now();
    let out = Command::new("bash")
        .args([
            "-o",
            "pipefail",
            "-c",
            &format!("pg_dump --no-owner --no-acl{tables} '{url}' | psql -q -v ON_ERROR_STOP=1 '{target}' >/dev/null"),
        ])
        .output()
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "pg_dump | psql: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    check(&target);
    psql(pg, &format!("DROP DATABASE {db} WITH (FORCE)"));
    secs
}

/// Reads the store's row counts of job `job`'s four tables (`suffix`ed) once they are published,
/// through one connection kept for the whole wait (a new one per look would load the server the
/// window measures).
enum Published {
    Sqlite {
        sql: String,
        at: std::path::PathBuf,
        /// Opened once the file exists.
        conn: Option<rusqlite::Connection>,
    },
    Postgres {
        sql: String,
        client: postgres::Client,
    },
}

impl Published {
    fn new(store: &str, at: &Path, pg: &str, job: &str, suffix: &str) -> Self {
        let counts: Vec<String> = TABLES
            .iter()
            .map(|(_, t)| format!("(SELECT count(*) FROM {t}{suffix})"))
            .collect();
        let sql = format!(
            "SELECT {} FROM kb_publication WHERE job = '{job}' AND visible_epoch IS NOT NULL",
            counts.join(", ")
        );
        if store == "sqlite" {
            Published::Sqlite {
                sql,
                at: at.to_path_buf(),
                conn: None,
            }
        } else {
            let client = postgres::Client::connect(pg, postgres::NoTls).unwrap();
            Published::Postgres { sql, client }
        }
    }

    /// The counts at a published epoch, or `None` while nothing is published (or the tables are
    /// not there yet).
    fn counts(&mut self) -> Option<Counts> {
        match self {
            Published::Sqlite { sql, at, conn } => {
                if conn.is_none() {
                    *conn = rusqlite::Connection::open_with_flags(
                        &*at,
                        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
                    )
                    .ok();
                }
                conn.as_ref()?
                    .query_row(sql, [], |r| {
                        Ok([r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?])
                    })
                    .ok()
            }
            Published::Postgres { sql, client } => {
                let row = client.query_opt(sql.as_str(), &[]).ok()??;
                Some([row.get(0), row.get(1), row.get(2), row.get(3)])
            }
        }
    }
}

/// `run --capture` of the four tables into `store`, from spawn until the store holds `want` at a
/// published epoch: (seconds, the capture's copy in rows/s).
fn kafka_backfill(
    bin: &Path,
    bootstrap: &str,
    pg: &str,
    url: &str,
    store: &str,
    want: Counts,
) -> (f64, f64) {
    let name = format!("dba{store}{}", rand_suffix() % 100_000);
    let d = dir(&name);
    let replica = d.join("replica.sqlite");
    let (store_toml, suffix) = four_table_store(store, &replica, pg, &name);
    let cfg = d.join("job.toml");
    let job_toml = job(
        &name,
        &format!("bench-{name}"),
        bootstrap,
        &d.join("snapshot"),
        1,
        "consistency = \"epoch\"",
        &store_toml,
    );
    std::fs::write(
        &cfg,
        capture_config("", &job_toml, url, &four_capture_tables(), ""),
    )
    .unwrap();
    let log = d.join("run.log");
    let mut published = Published::new(store, &replica, pg, &name, &suffix);
    let t = Instant::now();
    let mut run = spawn(bin, &["run", "--capture"], &cfg, &log);
    let secs = until_published(&mut run, &log, t, || published.counts() == Some(want));
    super::several_tables::signal(&mut run, "TERM");
    let rows: i64 = want.iter().sum();
    (secs, rows as f64 / snapshot_seconds(&log))
}

/// Seconds from `started` until `published()` holds (looked at every 50 ms), `run` still up.
pub(super) fn until_published(
    run: &mut std::process::Child,
    log: &Path,
    started: Instant,
    mut published: impl FnMut() -> bool,
) -> f64 {
    let deadline = started + Duration::from_secs(1800);
    loop {
        if published() {
            return started.elapsed().as_secs_f64();
        }
        if let Some(s) = run.try_wait().unwrap() {
            panic!(
                "run --capture exited ({s}) before its replica was published: {}",
                log.display()
            );
        }
        assert!(
            Instant::now() < deadline,
            "no published replica: {}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs the section on a pgbench database of `scale`, into each of `stores`.
pub fn run(
    bin: &Path,
    bootstrap: &str,
    pg: &str,
    pg_label: &str,
    scale: u32,
    stores: &[&str],
    r: &mut Report,
) {
    eprintln!("dba-copy: pgbench scale {scale}, the DBA's copy against run --capture…");
    let url = pgbench_db(pg, scale);
    let want = source_counts(&url);
    let rows: i64 = want.iter().sum();
    let dba = dba_copy(pg, &url);
    r.figure(
        "dba_copy_s",
        &format!("the DBA's copy: pg_dump -t (pgbench's four tables, scale {scale}, {rows} rows) | psql into a fresh database of the same {pg_label}, schema and primary keys included"),
        format!("{dba:.2} s"),
        json!({"seconds": dba, "rows": rows, "scale": scale}),
    );
    for store in stores {
        let (secs, copy_rate) = kafka_backfill(bin, bootstrap, pg, &url, store, want);
        let ratio = secs / dba;
        r.figure(
            &format!("dba_copy_kafka_backfill_{store}_s"),
            &format!("run --capture of one job of the four tables into {store} (consistency = \"epoch\"): spawn → the store holds every row at a published epoch; the capture's copy of the four tables ran at {} rows/s", fmt_rate(copy_rate)),
            format!("{secs:.2} s ({ratio:.2}× the DBA's copy)"),
            json!({"seconds": secs, "ratio": ratio, "capture_copy_rows_per_s": copy_rate}),
        );
        let (bound, label) = if *store == "sqlite" {
            (1.5, "≤ 1.5×")
        } else {
            (2.0, "≤ 2×")
        };
        r.target(
            &format!("end to end into {store} {label} the DBA's copy (pg_dump | psql)"),
            format!("{ratio:.2}×"),
            Some(ratio <= bound),
        );
    }
    psql(
        pg,
        &format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            url.rsplit('/').next().unwrap()
        ),
    );
}
