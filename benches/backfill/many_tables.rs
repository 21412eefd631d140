//! Section `many-tables` of the benchmark (benches/backfill.rs) (`scripts/bench.sh --only
//! many-tables`, issue 43.5): N tables shaped like pgbench's accounts (`id` primary key, a
//! balance, an 84-byte filler; `rows` rows each) captured into one log and materialised by one job
//! of N tables (`run --capture`, SQLite store, `consistency = "epoch"`), at several N:
//!
//! - **to a published replica**: from the process's spawn until the store holds every row of the
//!   N tables at a published epoch (read from the store), against the DBA's copy of the same
//!   tables (`pg_dump -t … | psql` into a fresh database of the same server) in the same run;
//! - **memory**: the process's peak RSS (`VmHWM`; capture and runner are one process) after the
//!   copy and after the load;
//! - **commit latency under load**: pgbench at 200 transactions/s, each adding to one row of a
//!   random table, for `load_secs`; the p99 of `kafka_backfill_checkpoint_commit_seconds` over the
//!   commits of the load window (the histogram scraped from `/metrics` before and after it: its
//!   bucket bound).
//!
//! How each grows from the smallest N to the largest is the point: the targets are at most linear
//! growth of memory and commit p99 in N, and the time within 1.5× of the DBA's copy.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::json;

use super::capture::psql;
use super::several_tables::{capture_config, job, signal, spawn};
use super::{dir, free_port, rand_suffix, Report};

/// A database of `n` tables `t0001…` of `rows` rows each, REPLICA IDENTITY FULL, and the
/// function the load calls (`kb_touch(table, id, delta)`).
fn database(pg: &str, n: usize, rows: u32) -> String {
    let db = format!("many_{}", rand_suffix());
    psql(pg, &format!("CREATE DATABASE {db}"));
    let url = format!("{}/{db}", pg.rsplit_once('/').unwrap().0);
    let mut script = String::new();
    for i in 1..=n {
        script.push_str(&format!(
            "CREATE TABLE t{i:04} (id int PRIMARY KEY, bid int, bal int NOT NULL DEFAULT 0, filler char(84)); \
             INSERT INTO t{i:04} SELECT g, 1, 0, '' FROM generate_series(1, {rows}) g; \
             ALTER TABLE t{i:04} REPLICA IDENTITY FULL;\n"
        ));
    }
    script.push_str(
        "CREATE FUNCTION kb_touch(t int, k int, d int) RETURNS void LANGUAGE plpgsql AS $$ \
         BEGIN EXECUTE format('UPDATE t%s SET bal = bal + $1 WHERE id = $2', lpad(t::text, 4, '0')) USING d, k; END $$;\n",
    );
    let out = Command::new("psql")
        .args([&url, "-v", "ON_ERROR_STOP=1", "-q", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(script.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(
        out.status.success(),
        "creating the tables: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    url
}

fn names(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("t{i:04}")).collect()
}

/// The DBA's copy of the `n` tables of `url` into a fresh database of the same server: seconds.
fn dba_copy(pg: &str, url: &str, n: usize) -> f64 {
    super::dba_copy::pg_dump_copy(pg, url, &names(n), |target| {
        let copied: i64 = psql(
            target,
            "SELECT count(*) FROM pg_tables WHERE tablename LIKE 't%'",
        )
        .parse()
        .unwrap();
        assert_eq!(copied, n as i64, "the DBA's copy holds every table");
    })
}

/// The process's peak resident set (`VmHWM`), MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb / 1024.0
}

/// The cumulative buckets `(upper bound s, count)` of the checkpoint commit histogram.
fn commit_buckets(http: &str) -> Vec<(f64, u64)> {
    let out = Command::new("curl")
        .args(["-sf", &format!("http://{http}/metrics")])
        .output()
        .unwrap();
    assert!(out.status.success(), "scraping {http}/metrics");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("kafka_backfill_checkpoint_commit_seconds_bucket"))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

/// The p99 bucket bound of the commits between two scrapes, and how many there were.
fn p99_between(before: &[(f64, u64)], after: &[(f64, u64)]) -> (f64, u64) {
    let delta: Vec<(f64, u64)> = after
        .iter()
        .map(|(le, n)| {
            let was = before.iter().find(|(b, _)| b == le).map_or(0, |(_, m)| *m);
            (*le, n - was)
        })
        .collect();
    let total = delta.last().map_or(0, |(_, n)| *n);
    let want = (total as f64 * 0.99).ceil() as u64;
    let p99 = delta
        .iter()
        .find(|(_, n)| *n >= want)
        .map_or(f64::INFINITY, |(le, _)| *le);
    (p99, total)
}

/// One N: (seconds to the published replica, the DBA's copy's, RSS after the copy and after the
/// load, commit p99 in the load window and its commits).
struct Measured {
    secs: f64,
    dba: f64,
    rss_copy: f64,
    rss_load: f64,
    p99_ms: f64,
    commits: u64,
}

fn measure(bin: &Path, bootstrap: &str, pg: &str, n: usize, rows: u32, load_secs: u32) -> Measured {
    let url = database(pg, n, rows);
    let dba = dba_copy(pg, &url, n);
    let name = format!("many{n}x{}", rand_suffix() % 100_000);
    let d = dir(&name);
    let replica = d.join("replica.sqlite");
    let store_tables: Vec<String> = names(n).iter().map(|t| format!("{t} = \"{t}\"")).collect();
    let http = format!("127.0.0.1:{}", free_port());
    let store = format!(
        "kind = \"sqlite\"\npath = \"{}\"\ntables = {{ {} }}",
        replica.display(),
        store_tables.join(", ")
    );
    let cfg = d.join("job.toml");
    let job_toml = job(
        &name,
        &format!("bench-{name}"),
        bootstrap,
        &d.join("snapshot"),
        1,
        "consistency = \"epoch\"",
        &store,
    );
    let capture_tables: Vec<String> = names(n).iter().map(|t| format!("public.{t}")).collect();
    std::fs::write(
        &cfg,
        capture_config(&http, &job_toml, &url, &capture_tables, ""),
    )
    .unwrap();
    let want = n as i64 * rows as i64;
    let counts: Vec<String> = names(n)
        .iter()
        .map(|t| format!("(SELECT count(*) FROM {t})"))
        .collect();
    let sql = format!(
        "SELECT {} FROM kb_publication WHERE job = '{name}' AND visible_epoch IS NOT NULL",
        counts.join(" + ")
    );
    let log = d.join("run.log");
    let t = Instant::now();
    let mut run = spawn(bin, &["run", "--capture"], &cfg, &log);
    let mut conn: Option<rusqlite::Connection> = None;
    let secs = super::dba_copy::until_published(&mut run, &log, t, || {
        if conn.is_none() {
            conn = rusqlite::Connection::open_with_flags(
                &replica,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )
            .ok();
        }
        // The tables not created yet, or nothing published: not yet.
        let held: Option<i64> = conn
            .as_ref()
            .and_then(|c| c.query_row(&sql, [], |r| r.get(0)).ok());
        held == Some(want)
    });
    let rss_copy = peak_rss_mib(run.id());
    let script = d.join("touch.sql");
    std::fs::write(
        &script,
        format!("\\set t random(1, {n})\n\\set k random(1, {rows})\n\\set d random(-50, 50)\nSELECT kb_touch(:t, :k, :d);\n"),
    )
    .unwrap();
    let before = commit_buckets(&http);
    let bench = Command::new("pgbench")
        .args([
            "-n",
            "-c",
            "2",
            "-R",
            "200",
            "-T",
            &load_secs.to_string(),
            "-f",
        ])
        .arg(&script)
        .arg(&url)
        .output()
        .unwrap();
    assert!(
        bench.status.success(),
        "pgbench: {}",
        String::from_utf8_lossy(&bench.stderr)
    );
    let (p99, commits) = p99_between(&before, &commit_buckets(&http));
    let rss_load = peak_rss_mib(run.id());
    signal(&mut run, "TERM");
    psql(
        pg,
        &format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            url.rsplit('/').next().unwrap()
        ),
    );
    Measured {
        secs,
        dba,
        rss_copy,
        rss_load,
        p99_ms: p99 * 1000.0,
        commits,
    }
}

/// Sizes of the section: the table counts (ascending), rows per table, seconds of load at each.
pub struct Sizes {
    pub counts: &'static [usize],
    pub rows: u32,
    pub load_secs: u32,
}

/// Runs the section at each of `sizes.counts` tables.
pub fn run(bin: &Path, bootstrap: &str, pg: &str, pg_label: &str, sizes: &Sizes, r: &mut Report) {
    let Sizes {
        counts,
        rows,
        load_secs,
    } = *sizes;
    let mut all: Vec<(usize, Measured)> = Vec::new();
    for &n in counts {
        eprintln!("many-tables: {n} tables of {rows} rows…");
        let m = measure(bin, bootstrap, pg, n, rows, load_secs);
        let ratio = m.secs / m.dba;
        r.figure(
            &format!("many_tables_{n}_s"),
            &format!("run --capture of one job of {n} tables ({rows} rows each, {} rows) into SQLite: spawn → every row in the store at a published epoch; the DBA's copy of the same tables (pg_dump | psql, {pg_label}) took {:.2} s", n as u64 * rows as u64, m.dba),
            format!("{:.2} s ({ratio:.2}× the DBA's copy)", m.secs),
            json!({"tables": n, "rows_per_table": rows, "seconds": m.secs, "dba_seconds": m.dba, "ratio": ratio}),
        );
        r.figure(
            &format!("many_tables_{n}_memory"),
            &format!("peak RSS of the process (capture and runner) with {n} tables: after the copy, and after {load_secs} s of 200 tps over random tables"),
            format!("{:.0} MiB, {:.0} MiB", m.rss_copy, m.rss_load),
            json!({"rss_copy_mib": m.rss_copy, "rss_load_mib": m.rss_load}),
        );
        r.figure(
            &format!("many_tables_{n}_commit_p99"),
            &format!("checkpoint commit p99 (its histogram bucket's bound) of the {} commits during {load_secs} s of 200 tps over random tables of {n}", m.commits),
            format!("≤ {:.0} ms", m.p99_ms),
            json!({"commit_p99_ms": m.p99_ms, "commits": m.commits}),
        );
        r.target(
            &format!("{n} tables: to a published replica ≤ 1.5× the DBA's copy"),
            format!("{ratio:.2}×"),
            Some(ratio <= 1.5),
        );
        all.push((n, m));
    }
    if let (Some((n0, first)), Some((n1, last))) = (all.first(), all.last()) {
        if n1 > n0 {
            let tables = *n1 as f64 / *n0 as f64;
            let memory = last.rss_load / first.rss_load;
            let commit = last.p99_ms / first.p99_ms;
            r.target(
                &format!("memory grows at most linearly from {n0} to {n1} tables (≤ {tables:.0}×)"),
                format!("{memory:.2}×"),
                Some(memory <= tables),
            );
            r.target(
                &format!(
                    "commit p99 grows at most linearly from {n0} to {n1} tables (≤ {tables:.0}×)"
                ),
                format!("{commit:.2}×"),
                Some(commit <= tables),
            );
        }
    }
}
