//! Section `several-tables` of the benchmark (benches/backfill.rs) (`scripts/bench.sh --only
//! several-tables`, issue 23): pgbench's four tables captured into one log, materialised two ways
//! from the same log at the same time —
//!
//! - **one job of four tables** (`[jobs.store] tables`, `consistency = "epoch"`): two processes, the
//!   second joining in the log store (a rebalance there: a recreation under the default policy),
//!   then killed with SIGKILL mid-load and started again;
//! - **one job per table** (four jobs, the default `consistency`), the shape of Debezium + a JDBC sink
//!   per topic —
//!
//! while a checker reads each replica continuously, Σ abalance, Σ tbalance, Σ bbalance, Σ delta in
//! one read transaction per sample (pgbench keeps the four equal in every committed source state).
//! It prints the samples and the torn ones of each; the replica's staleness (a probe's source
//! commit → visible in the replica) under pgbench at a fixed rate, once the churn is over; each
//! pipeline's checkpoint commit p99 under the load (the "committed" lines' `transaction_ms`); and
//! the throughput of catching up the whole log, one job of four tables against four jobs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::capture::psql;
use super::{dir, fmt_rate, rand_suffix, topic_records, Report};

/// Sizes of the section.
pub struct Sizes {
    /// pgbench's transactions per second (a fixed rate, `pgbench -R`).
    pub rate: u32,
    /// Seconds of load with the join and the kill -9.
    pub churn_secs: u64,
    /// Staleness probes after the churn.
    pub probes: usize,
    /// The stores the four-table job is measured on (the per-table pipeline runs with the first).
    pub stores: Vec<&'static str>,
    /// Catch-ups of the whole log each way (alternating).
    pub replays: usize,
}

pub(super) const TABLES: [(&str, &str); 4] = [
    ("pgbench_accounts", "accounts"),
    ("pgbench_tellers", "tellers"),
    ("pgbench_branches", "branches"),
    ("pgbench_history", "history"),
];

/// A database with pgbench's four tables at `scale` (100,000 accounts each), `pgbench_history`
/// given a primary key, every table REPLICA IDENTITY FULL.
pub(super) fn pgbench_db(pg: &str, scale: u32) -> String {
    let db = format!("several_{}", rand_suffix());
    psql(pg, &format!("CREATE DATABASE {db}"));
    let url = format!("{}/{db}", pg.rsplit_once('/').unwrap().0);
    let out = Command::new("pgbench")
        .args(["-i", "-q", "-s", &scale.to_string(), &url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pgbench -i: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    psql(
        &url,
        "ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY",
    );
    for (t, _) in TABLES {
        psql(&url, &format!("ALTER TABLE {t} REPLICA IDENTITY FULL"));
    }
    url
}

/// `[jobs.store]` of the four-table job on `store` (`sqlite` into `db`, or the PostgreSQL store
/// `pg` with the tables suffixed `_<name>`), and the suffix.
pub(super) fn four_table_store(store: &str, db: &Path, pg: &str, name: &str) -> (String, String) {
    let suffix = if store == "sqlite" {
        String::new()
    } else {
        format!("_{name}")
    };
    let tables: Vec<String> = TABLES
        .iter()
        .map(|(s, t)| format!("{s} = \"{t}{suffix}\""))
        .collect();
    let at = if store == "sqlite" {
        format!("kind = \"sqlite\"\npath = \"{}\"", db.display())
    } else {
        format!("kind = \"postgres\"\nurl = \"{pg}\"")
    };
    (
        format!("{at}\ntables = {{ {} }}", tables.join(", ")),
        suffix,
    )
}

pub(super) fn job(
    name: &str,
    topic: &str,
    bootstrap: &str,
    snapshot: &Path,
    workers: u32,
    extra: &str,
    store: &str,
) -> String {
    format!(
        "[[jobs]]\nname = \"{name}\"\ntopic = \"{topic}\"\nworkers = {workers}\nvnode_count = 64\nmax_rows_per_second = 0\n{extra}\n\
         [jobs.kafka]\n\"bootstrap.servers\" = \"{bootstrap}\"\n\"group.id\" = \"bench-{name}-{}\"\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n\
         [jobs.snapshot]\nkind = \"files\"\ndir = \"{}\"\n[jobs.store]\n{store}\n",
        rand_suffix(),
        snapshot.display()
    )
}

/// A configuration of one capturing job: `[http]` listening on `listen` ("" = nowhere), the
/// `[[jobs]]` section `job` (from [`job`]), and its `[jobs.capture]` of `tables` (`schema.table`)
/// from `url` into 4 partitions, with `extra` keys.
pub(super) fn capture_config(
    listen: &str,
    job: &str,
    url: &str,
    tables: &[String],
    extra: &str,
) -> String {
    let tables: Vec<String> = tables.iter().map(|t| format!("\"{t}\"")).collect();
    format!(
        "[http]\nlisten = \"{listen}\"\n{job}[jobs.capture]\nsource_url = \"{url}\"\ntables = [{}]\npartitions = 4\n{extra}",
        tables.join(", ")
    )
}

/// The four pgbench tables as `capture_config` names them.
pub(super) fn four_capture_tables() -> Vec<String> {
    TABLES.iter().map(|(s, _)| format!("public.{s}")).collect()
}

pub(super) fn spawn(bin: &Path, args: &[&str], cfg: &Path, log: &Path) -> Child {
    Command::new(bin)
        .args(args)
        .arg("--config")
        .arg(cfg)
        .env(
            "RUST_LOG",
            "info,kafka_backfill=debug,librdkafka=warn,pg_walstream=warn",
        )
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

fn log_count(log: &Path, needle: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches(needle)
        .count()
}

/// Waits until `log` holds `needle` `n` times (the process must stay up).
pub(super) fn wait_log(child: &mut Child, log: &Path, needle: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(1800);
    while log_count(log, needle) < n {
        if let Some(s) = child.try_wait().unwrap() {
            panic!("{} exited ({s}) before {needle:?}", log.display());
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in {}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(super) fn signal(child: &mut Child, sig: &str) {
    Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap();
    child.wait().unwrap();
}

/// Where a replica is: a SQLite file, or the PostgreSQL store (its URL and the tables' suffix).
#[derive(Clone)]
pub(super) enum Replica {
    Sqlite(PathBuf),
    Postgres(String, String),
}

/// One read of the replica in one read transaction: the published epoch (`Some(None)` for a job
/// without publication) and the four sums; `None` while the tables are not there.
type Sample = Option<(Option<i64>, [i64; 4])>;

impl Replica {
    /// The sample's query; `cast` follows each sum (PostgreSQL's `SUM` of integers is `numeric`).
    fn sql(suffix: &str, job: Option<&str>, cast: &str) -> String {
        let published = job.map_or("NULL".to_string(), |j| {
            format!("(SELECT visible_epoch FROM kb_publication WHERE job = '{j}')")
        });
        let sum = |column: &str, table: &str| {
            format!("(SELECT COALESCE(SUM({column}), 0){cast} FROM {table}{suffix})")
        };
        format!(
            "SELECT {published}, {}, {}, {}, {}",
            sum("abalance", "accounts"),
            sum("tbalance", "tellers"),
            sum("bbalance", "branches"),
            sum("delta", "history")
        )
    }

    /// A sampler of the replica; `job`: the publishing job whose `kb_publication` to read.
    pub(super) fn sampler(&self, job: Option<&str>) -> Box<dyn FnMut() -> Sample + Send> {
        match self.clone() {
            Replica::Sqlite(db) => {
                let sql = Self::sql("", job, "");
                let conn = rusqlite::Connection::open(&db).unwrap();
                conn.busy_timeout(Duration::from_secs(10)).unwrap();
                let mut conn = conn;
                Box::new(move || {
                    let tx = conn.transaction().ok()?;
                    let s = tx
                        .query_row(&sql, [], |r| {
                            Ok((
                                r.get::<_, Option<i64>>(0)?,
                                [r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?],
                            ))
                        })
                        .ok();
                    tx.commit().ok()?;
                    s
                })
            }
            Replica::Postgres(url, suffix) => {
                let sql = Self::sql(&suffix, job, "::BIGINT");
                let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
                Box::new(move || {
                    let mut tx = client
                        .build_transaction()
                        .isolation_level(postgres::IsolationLevel::RepeatableRead)
                        .read_only(true)
                        .start()
                        .ok()?;
                    let s = tx
                        .query_one(&sql, &[])
                        .ok()
                        .map(|r| (r.get(0), [r.get(1), r.get(2), r.get(3), r.get(4)]));
                    tx.commit().ok()?;
                    s
                })
            }
        }
    }

    /// The `filler` of teller 1 (the staleness probe's row), as the replica shows it.
    pub(super) fn probe_reader(&self) -> Box<dyn FnMut() -> Option<String> + Send> {
        match self.clone() {
            Replica::Sqlite(db) => {
                let conn = rusqlite::Connection::open(&db).unwrap();
                conn.busy_timeout(Duration::from_secs(10)).unwrap();
                Box::new(move || {
                    conn.query_row("SELECT filler FROM tellers WHERE tid = 1", [], |r| {
                        r.get::<_, Option<String>>(0)
                    })
                    .ok()
                    .flatten()
                })
            }
            Replica::Postgres(url, suffix) => {
                let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
                let sql = format!("SELECT filler::TEXT FROM tellers{suffix} WHERE tid = 1");
                Box::new(move || {
                    client
                        .query_opt(&sql, &[])
                        .ok()
                        .flatten()
                        .and_then(|r| r.get::<_, Option<String>>(0))
                })
            }
        }
    }
}

/// What a checker saw.
#[derive(Default, Debug)]
pub(super) struct Seen {
    pub samples: u64,
    pub torn: u64,
    first_torn: Option<[i64; 4]>,
    largest_spread: i64,
    pub went_back: u64,
}

/// Samples `replica` continuously until `stop`: a sample counts once the replica is published (a
/// publishing job) or readable (one job per table).
pub(super) fn checker(
    replica: Replica,
    job: Option<String>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Seen> {
    std::thread::spawn(move || {
        let mut sample = replica.sampler(job.as_deref());
        let mut seen = Seen::default();
        let mut last = None;
        while !stop.load(Ordering::SeqCst) {
            let Some((epoch, s)) = sample() else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            if job.is_some() && epoch.is_none() {
                continue;
            }
            seen.samples += 1;
            let spread = s.iter().max().unwrap() - s.iter().min().unwrap();
            if spread != 0 {
                seen.torn += 1;
                seen.first_torn.get_or_insert(s);
                seen.largest_spread = seen.largest_spread.max(spread);
            }
            if epoch < last {
                seen.went_back += 1;
            }
            last = last.max(epoch);
        }
        seen
    })
}

/// pgbench's built-in TPC-B-like transaction at `rate` per second for `secs`.
pub(super) fn pgbench(url: &str, rate: u32, secs: u64) -> Child {
    Command::new("pgbench")
        .args([
            "-n",
            "-c",
            "2",
            "-R",
            &rate.to_string(),
            "-T",
            &secs.to_string(),
            url,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The p99 of the `transaction_ms` of the log-store and streaming commits ("committed" with
/// `cause=Barrier`) in `logs`, and how many there were.
fn commit_p99(logs: &[PathBuf]) -> (f64, usize) {
    let mut ms: Vec<f64> = logs
        .iter()
        .flat_map(|l| {
            std::fs::read_to_string(l)
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("committed") && l.contains("cause=Barrier"))
                .filter_map(|l| {
                    l.split("transaction_ms=")
                        .nth(1)?
                        .split_whitespace()
                        .next()?
                        .parse::<f64>()
                        .ok()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    if ms.is_empty() {
        return (0.0, 0);
    }
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (
        ms[((ms.len() as f64 * 0.99) as usize).min(ms.len() - 1)],
        ms.len(),
    )
}

fn p(lat: &mut [f64], q: f64) -> f64 {
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)]
}

/// Runs the section; `pg` is the durable server's URL.
pub fn run(bin: &Path, bootstrap: &str, pg: &str, pg_label: &str, sizes: &Sizes, r: &mut Report) {
    for (round, store) in sizes.stores.iter().enumerate() {
        let per_table = round == 0;
        one_round(bin, bootstrap, pg, pg_label, sizes, store, per_table, r);
    }
}

#[allow(clippy::too_many_arguments)]
fn one_round(
    bin: &Path,
    bootstrap: &str,
    pg: &str,
    pg_label: &str,
    sizes: &Sizes,
    store: &str,
    per_table: bool,
    r: &mut Report,
) {
    let url = pgbench_db(pg, 1);
    let name = format!("several{store}{}", rand_suffix() % 100_000);
    let d = dir(&name);
    let topic = format!("bench-{name}");
    let snapshot = d.join("snapshot");
    let (store_toml, suffix) = four_table_store(store, &d.join("one-job.sqlite"), pg, &name);
    // The capturing job: one job of the four tables.
    let cfg = d.join("one-job.toml");
    std::fs::write(
        &cfg,
        capture_config(
            "",
            &job(
                &name,
                &topic,
                bootstrap,
                &snapshot,
                2,
                "consistency = \"epoch\"",
                &store_toml,
            ),
            &url,
            &four_capture_tables(),
            "checkpoint_interval_ms = 1000\n",
        ),
    )
    .unwrap();
    // One job per table, on the same log and snapshot, into a SQLite file of their own.
    let per_table_db = d.join("per-table.sqlite");
    let per_table_cfg = d.join("per-table.toml");
    let jobs: String = TABLES
        .iter()
        .map(|(s, t)| {
            job(
                &format!("{name}-{t}"),
                &topic,
                bootstrap,
                &snapshot,
                1,
                "",
                &format!(
                    "kind = \"sqlite\"\npath = \"{}\"\ntable = \"{t}\"",
                    per_table_db.display()
                ),
            )
            .replace(
                &format!("dir = \"{}\"\n", snapshot.display()),
                &format!("dir = \"{}\"\ntable = \"{s}\"\n", snapshot.display()),
            )
        })
        .collect();
    std::fs::write(&per_table_cfg, format!("[http]\nlisten = \"\"\n{jobs}")).unwrap();

    eprintln!("several-tables ({store}): capture, snapshot…");
    let capture_log = d.join("capture.log");
    let mut capture = spawn(bin, &["capture"], &cfg, &capture_log);
    wait_log(
        &mut capture,
        &capture_log,
        "capture checkpoint committed",
        1,
    );
    let per_table_log = d.join("per-table.log");
    let mut per_table_run = per_table.then(|| {
        let mut c = spawn(bin, &["run"], &per_table_cfg, &per_table_log);
        wait_log(&mut c, &per_table_log, "to=\"streaming\"", 4);
        c
    });

    // The churn: load, the checkers, the four-table job starting behind, a second process joining in
    // the log store, then killed with SIGKILL and started again.
    let stop = Arc::new(AtomicBool::new(false));
    let one_replica = if store == "sqlite" {
        Replica::Sqlite(d.join("one-job.sqlite"))
    } else {
        Replica::Postgres(pg.to_string(), suffix.clone())
    };
    let per_table_replica = Replica::Sqlite(per_table_db.clone());
    let per_table_checker =
        per_table.then(|| checker(per_table_replica.clone(), None, stop.clone()));
    eprintln!(
        "several-tables ({store}): {} s of pgbench at {}/s with a join and a kill -9…",
        sizes.churn_secs, sizes.rate
    );
    let t = Instant::now();
    let mut load = pgbench(&url, sizes.rate, sizes.churn_secs);
    // A backlog for the log store first.
    while t.elapsed() < Duration::from_secs(sizes.churn_secs / 6) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let a_log = d.join("a.log");
    let mut a = spawn(bin, &["run", "--worker-prefix", "a"], &cfg, &a_log);
    let one_checker = checker(one_replica.clone(), Some(name.clone()), stop.clone());
    wait_log(&mut a, &a_log, "to=\"log_store\"", 1);
    let b_log = d.join("b.log");
    let mut b = spawn(bin, &["run", "--worker-prefix", "b"], &cfg, &b_log);
    wait_log(&mut b, &b_log, "partitions assigned", 1);
    while t.elapsed() < Duration::from_secs(sizes.churn_secs / 2) {
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(&mut b, "KILL");
    let b2_log = d.join("b2.log");
    let mut b2 = spawn(bin, &["run", "--worker-prefix", "b"], &cfg, &b2_log);
    load.wait().unwrap();
    // Both replicas catch up with the source: the four-table job verified against it, table by table.
    let deadline = Instant::now() + Duration::from_secs(600);
    let verified = loop {
        let out = Command::new(bin)
            .args(["verify", "--against-source", "--job", &name, "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if out.status.success() {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the four-table job never verified clean: {text}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    stop.store(true, Ordering::SeqCst);
    let one = one_checker.join().unwrap();
    let logs = [a_log.clone(), b_log.clone(), b2_log.clone()];
    let text: String = logs
        .iter()
        .map(|l| std::fs::read_to_string(l).unwrap_or_default())
        .collect();
    let recreations = text
        .matches("should not update vnode bitmap during consuming log store")
        .count();
    let label = if store == "sqlite" {
        "SQLite".to_string()
    } else {
        pg_label.to_string()
    };
    let tables_clean = verified.matches("— clean").count();
    r.figure(
        &format!("several_tables_{store}_torn"),
        &format!("one job of pgbench's four tables ({label}, consistency = \"epoch\", 2 + 1 workers in two processes) under pgbench's TPC-B-like load at {}/s for {} s (scale 1): the second process joins in the log store ({recreations} invariant errors → recreations), is killed with SIGKILL mid-load and started again; a checker reads Σ abalance, Σ tbalance, Σ bbalance, Σ delta with kb_publication.visible_epoch in one read transaction per sample, continuously; {} of 4 tables then verified equal to the source", sizes.rate, sizes.churn_secs, tables_clean),
        format!("{} torn of {} samples (published epoch went back {} times)", one.torn, one.samples, one.went_back),
        json!({"samples": one.samples, "torn": one.torn, "went_back": one.went_back, "recreations": recreations, "tables_verified": tables_clean}),
    );
    r.target(
        &format!("one job of several tables, {label}: 0 torn states in ≥ 1,000 samples"),
        format!("{} torn of {}", one.torn, one.samples),
        Some(one.torn == 0 && one.went_back == 0 && one.samples >= 1_000),
    );
    if let Some(h) = per_table_checker {
        let seen = h.join().unwrap();
        r.figure(
            "several_tables_per_table_torn",
            &format!("the same checker on one job per table (four jobs, consistency = \"vnode\", SQLite) reading the same log at the same time: why a replica of several tables needs one epoch across them (largest spread of the four sums {}; first torn sample {:?})", seen.largest_spread, seen.first_torn),
            format!("{} torn of {} samples ({:.0} %)", seen.torn, seen.samples, 100.0 * seen.torn as f64 / seen.samples.max(1) as f64),
            json!({"samples": seen.samples, "torn": seen.torn, "largest_spread": seen.largest_spread}),
        );
    }
    let (one_p99, one_n) = commit_p99(&logs);
    let (per_p99, per_n) = if per_table {
        commit_p99(std::slice::from_ref(&per_table_log))
    } else {
        (0.0, 0)
    };
    r.figure(
        &format!("several_tables_{store}_commit_p99"),
        &format!("checkpoint commit p99 under the load (the \"committed\" lines' transaction_ms of log-store and streaming checkpoints): one job of four tables ({label}, {one_n} commits){}", if per_table { format!(" vs one job per table (SQLite, {per_n} commits)") } else { String::new() }),
        if per_table { format!("{one_p99:.0} ms vs {per_p99:.0} ms") } else { format!("{one_p99:.0} ms") },
        json!({"one_job_p99_ms": one_p99, "one_job_commits": one_n, "per_table_p99_ms": per_p99, "per_table_commits": per_n}),
    );

    // Staleness once the churn is over: a probe updates teller 1's filler at a random moment, the
    // replica polled until it shows it, pgbench at the same rate alongside.
    eprintln!(
        "several-tables ({store}): staleness, {} probes…",
        sizes.probes
    );
    let mut load = pgbench(&url, sizes.rate, 3600);
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let mut read_one = one_replica.probe_reader();
    let mut read_per = per_table.then(|| per_table_replica.probe_reader());
    let (mut one_lat, mut per_lat) = (Vec::new(), Vec::new());
    for i in 0..sizes.probes {
        let mark = format!("probe-{i}-{}", rand_suffix());
        client
            .execute(
                "UPDATE pgbench_tellers SET filler = $1 WHERE tid = 1",
                &[&mark],
            )
            .unwrap();
        let t = Instant::now();
        let (mut one_at, mut per_at) = (None, read_per.is_none().then_some(0.0));
        let deadline = Instant::now() + Duration::from_secs(120);
        while one_at.is_none() || per_at.is_none() {
            let shows = |v: Option<String>| v.as_deref().map(str::trim_end) == Some(mark.as_str());
            if one_at.is_none() && shows(read_one()) {
                one_at = Some(t.elapsed().as_secs_f64() * 1000.0);
            }
            if let Some(read) = read_per.as_mut() {
                if per_at.is_none() && shows(read()) {
                    per_at = Some(t.elapsed().as_secs_f64() * 1000.0);
                }
            }
            assert!(
                Instant::now() < deadline,
                "probe {i} never reached a replica"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        one_lat.push(one_at.unwrap());
        per_lat.push(per_at.unwrap());
        std::thread::sleep(Duration::from_millis(50 + rand_suffix() % 700));
    }
    load.kill().unwrap();
    load.wait().unwrap();
    let (p50, p99) = (p(&mut one_lat, 0.5), p(&mut one_lat, 0.99));
    r.figure(
        &format!("several_tables_{store}_staleness"),
        &format!("staleness of the four-table replica ({label}): a probe's source commit → visible in the published replica, {} probes at random moments, pgbench at {}/s alongside, the capture's checkpoint_interval_ms 1000{}", sizes.probes, sizes.rate, if per_table { format!("; one job per table (SQLite): p50 {:.0} ms, p99 {:.0} ms", p(&mut per_lat, 0.5), p(&mut per_lat, 0.99)) } else { String::new() }),
        format!("p50 {p50:.0} ms, p99 {p99:.0} ms"),
        json!({"probes": sizes.probes, "p50_ms": p50, "p99_ms": p99}),
    );
    r.target(
        &format!(
            "four-table replica staleness p99 ≤ 2 × checkpoint interval + 1 s (3,000 ms), {label}"
        ),
        format!("{p99:.0} ms"),
        Some(p99 <= 3000.0),
    );
    signal(&mut a, "TERM");
    signal(&mut b2, "TERM");
    if let Some(c) = per_table_run.as_mut() {
        signal(c, "TERM");
    }
    signal(&mut capture, "TERM");

    // The cost of committing the four tables together: the whole log caught up from the snapshot by
    // one job of four tables and by four jobs of one table, one process each, new stores and
    // groups every time, the two alternating (the first run after the churn meets a machine still
    // busy with it).
    if per_table {
        let records = topic_records(bootstrap, &topic, 4);
        eprintln!(
            "several-tables: catching up {records} records both ways, {} times…",
            sizes.replays
        );
        // (wall seconds, CPU seconds of the process)
        let time = |cfg: &Path| {
            let before = super::cpu::children_secs();
            let t = Instant::now();
            let status = Command::new(bin)
                .args(["run", "--exit-when-caught-up", "--config"])
                .arg(cfg)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .unwrap();
            assert!(status.success(), "{} failed", cfg.display());
            (
                t.elapsed().as_secs_f64(),
                super::cpu::children_secs() - before,
            )
        };
        let one_text = std::fs::read_to_string(&cfg).unwrap();
        let one_job = one_text[..one_text.find("[jobs.capture]").unwrap()].to_string();
        let per_text = std::fs::read_to_string(&per_table_cfg).unwrap();
        let (mut one, mut per) = (Vec::new(), Vec::new());
        for i in 0..sizes.replays {
            let one_cfg = d.join(format!("replay-one-{i}.toml"));
            std::fs::write(
                &one_cfg,
                one_job
                    .replace(
                        &format!("name = \"{name}\""),
                        &format!("name = \"{name}-r{i}\""),
                    )
                    .replace(
                        "\"group.id\" = \"bench-",
                        &format!("\"group.id\" = \"bench-r{i}-"),
                    )
                    .replace("one-job.sqlite", &format!("replay-one-{i}.sqlite")),
            )
            .unwrap();
            let per_cfg = d.join(format!("replay-per-table-{i}.toml"));
            std::fs::write(
                &per_cfg,
                per_text
                    .replace(
                        &format!("name = \"{name}-"),
                        &format!("name = \"{name}-r{i}-"),
                    )
                    .replace(
                        "\"group.id\" = \"bench-",
                        &format!("\"group.id\" = \"bench-r{i}-"),
                    )
                    .replace("per-table.sqlite", &format!("replay-per-table-{i}.sqlite")),
            )
            .unwrap();
            one.push(time(&one_cfg));
            per.push(time(&per_cfg));
        }
        let med =
            |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| super::median(v.iter().map(f).collect());
        let (one_secs, per_secs) = (med(&one, |x| x.0), med(&per, |x| x.0));
        let (one_cpu, per_cpu) = (med(&one, |x| x.1), med(&per, |x| x.1));
        let (one_rate, per_rate) = (records as f64 / one_secs, records as f64 / per_secs);
        let all = |v: &[(f64, f64)]| {
            v.iter()
                .map(|(w, c)| format!("{w:.1} s/{c:.1} CPU-s"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        r.figure(
            "several_tables_replay",
            &format!("catching up the whole log ({records} records, 4 partitions, SQLite) from the snapshot, end to end (spawn → exit when caught up, the group join included): one job of four tables (consistency = \"epoch\", 2 workers) vs four jobs of one table (1 worker each), one process each, alternating, median of {}: one job [{}], four jobs [{}]; CPU-s per million records {:.2} vs {:.2} (the process's user + system)", sizes.replays, all(&one), all(&per), one_cpu * 1e6 / records as f64, per_cpu * 1e6 / records as f64),
            format!("{} vs {} records/s ({:.2}×)", fmt_rate(one_rate), fmt_rate(per_rate), one_rate / per_rate),
            json!({"records": records, "one_job_records_per_s": one_rate, "per_table_records_per_s": per_rate, "ratio": one_rate / per_rate, "one_job_cpu_s": one_cpu, "per_table_cpu_s": per_cpu}),
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
