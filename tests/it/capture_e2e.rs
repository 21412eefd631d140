//! `kafka-backfill capture` against the real PostgreSQL (`scripts/postgres.sh`, wal_level=logical)
//! and the real broker, proven against PostgreSQL itself: pgbench writes, capture turns the table
//! into a snapshot and a log, two `kafka-backfill run` processes materialise it (the second joining
//! when the first enters the log store), and at the end `verify --against-source` finds the store
//! equal, byte for byte, to what the capture's mapping makes of the table as PostgreSQL has it;
//! `check-log` finds the topic a valid log store.

use crate::support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

pub(crate) const MIN: Duration = Duration::from_secs(120);

/// A fresh database for one test; dropped with its replication slots when the test ends (the
/// server keeps at most 32 slots, and an idle slot holds WAL).
pub(crate) struct SourceDb {
    pub(crate) admin: String,
    pub(crate) name: String,
    pub(crate) url: String,
}

impl Drop for SourceDb {
    fn drop(&mut self) {
        // Cleanup after the test's processes are gone (declared first, dropped last).
        let out = Command::new("psql")
            .args([&self.admin, "-qtAc"])
            .arg(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "dropping {}: {}",
                self.name,
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("dropping {}: {e}", self.name),
        }
    }
}

pub(crate) fn database(name: &str) -> SourceDb {
    let admin = pg_url();
    let db = format!("cap_{}_{}", name.replace('-', "_"), stamp());
    psql(&admin, &format!("CREATE DATABASE {db}"));
    let url = admin
        .rsplit_once('/')
        .map(|(base, _)| format!("{base}/{db}"))
        .unwrap();
    SourceDb {
        admin,
        name: db,
        url,
    }
}

pub(crate) fn psql(url: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-qtAc", sql])
        .output()
        .expect("psql");
    assert!(
        out.status.success(),
        "psql {sql:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// pgbench's tables at scale 1, the accounts cut to 10,000 rows, with REPLICA IDENTITY FULL.
pub(crate) fn pgbench_init(url: &str) {
    let out = Command::new("pgbench")
        .args(["-i", "-s", "1", "-q", url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pgbench -i: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    psql(url, "DELETE FROM pgbench_accounts WHERE aid > 10000");
    psql(url, "VACUUM pgbench_accounts");
    psql(url, "ALTER TABLE pgbench_accounts REPLICA IDENTITY FULL");
}

/// [`pgbench_init`], and the other three tables made capturable: a full replica identity, and a
/// primary key for `pgbench_history` (it has none).
fn pgbench_init_four(url: &str) {
    pgbench_init(url);
    for t in ["pgbench_tellers", "pgbench_branches", "pgbench_history"] {
        psql(url, &format!("ALTER TABLE {t} REPLICA IDENTITY FULL"));
    }
    psql(
        url,
        "ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY",
    );
}

/// pgbench's TPC-B-like transaction over the 10,000 accounts, at `rate` per second for `secs`,
/// after pgbench's own start (`TRUNCATE pgbench_history`).
pub(crate) fn pgbench_run(f: &Fixture, url: &str, rate: u32, secs: u32) -> Child {
    pgbench_run_with(f, url, rate, secs, &[])
}

/// [`pgbench_run`] with `extra` flags (`-n`: no vacuum and no `TRUNCATE pgbench_history`, which
/// breaks pgbench's own invariant in the source when the history is not empty).
fn pgbench_run_with(f: &Fixture, url: &str, rate: u32, secs: u32, extra: &[&str]) -> Child {
    let script = f.dir.join("tpcb.sql");
    std::fs::write(
        &script,
        "\\set aid random(1, 10000)\n\\set bid random(1, 1)\n\\set tid random(1, 10)\n\\set delta random(-5000, 5000)\n\
         BEGIN;\nUPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;\n\
         SELECT abalance FROM pgbench_accounts WHERE aid = :aid;\n\
         UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;\n\
         UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;\n\
         INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP);\nEND;\n",
    )
    .unwrap();
    // Without `-n`: pgbench starts by vacuuming and `TRUNCATE pgbench_history`, which a capture
    // of that table carries (docs/WIRE.md "Truncate").
    Command::new("pgbench")
        .args(["-c", "2", "-R", &rate.to_string(), "-T", &secs.to_string()])
        .args(extra)
        .arg("-f")
        .arg(&script)
        .arg(url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

pub(crate) fn capture_fixture(name: &str, source: &str, table: &str) -> Fixture {
    capture_fixture_of(name, source, &format!("table = \"{table}\""), None)
}

/// [`capture_fixture`] of the capture's `table = …` or `tables = […]` line `tables`; with
/// `snapshot_table`, the job materialises that one of the log's tables.
pub(crate) fn capture_fixture_of(
    name: &str,
    source: &str,
    tables: &str,
    snapshot_table: Option<&str>,
) -> Fixture {
    let f = Fixture::new(name, 1, "vnode_count = 64\nmax_rows_per_second = 2000");
    let mut text = std::fs::read_to_string(&f.config).unwrap();
    if let Some(t) = snapshot_table {
        text = text.replacen(
            "[jobs.snapshot]\n",
            &format!("[jobs.snapshot]\ntable = \"{t}\"\n"),
            1,
        );
    }
    std::fs::write(
        &f.config,
        format!("{text}{}", capture_section(&f, source, tables)),
    )
    .unwrap();
    f
}

/// The `[jobs.capture]` section of `f`'s job: `tables` is its `table = …` or `tables = […]` line.
/// `run` of the jobs `config` (a whole configuration) in a process of its own, logging to
/// `<prefix>.log` in `f`'s folder: `run` runs every job of its configuration.
fn spawn_run_of(f: &Fixture, config: &str, prefix: &str) -> Runner {
    let path = f.dir.join(format!("{prefix}.toml"));
    std::fs::write(&path, config).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--worker-prefix", prefix, "--config"])
        .arg(&path)
        .env("RUST_LOG", "info,kafka_backfill=debug,librdkafka=warn");
    spawn_logged(cmd, f.dir.join(format!("{prefix}.log")))
}

/// `cmd` started without colours, its log (stderr) in `log`.
fn spawn_logged(mut cmd: Command, log: std::path::PathBuf) -> Runner {
    let child = cmd
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    Runner { child, log }
}

/// A capture held (SIGSTOP) before it published the snapshot holding an added table (`early`):
/// the runner `run` of a job of `table` says it waits for that snapshot; then the capture goes on.
pub(crate) fn released_after_the_wait(
    capture: &mut Runner,
    run: &mut Runner,
    early: bool,
    table: &str,
) {
    if early {
        run.wait_for(
            &format!("waiting for a snapshot of its capture holding table {table}"),
            MIN,
        );
    }
    capture.signal("CONT");
}

/// The fixture's `[[jobs]]` text `job` as job `<name>-<i>` in group `<group>-<i>`, materialising
/// the log's table `source_table` into the store table `store_table`.
pub(crate) fn job_of_table(
    f: &Fixture,
    job: &str,
    source_table: &str,
    store_table: &str,
    i: usize,
) -> String {
    job.replacen(
        &format!("name = \"{}\"", f.name),
        &format!("name = \"{}-{i}\"", f.name),
        1,
    )
    .replacen(&f.group, &format!("{}-{i}", f.group), 1)
    .replacen(
        "table = \"accounts\"",
        &format!("table = \"{store_table}\""),
        1,
    )
    .replacen(
        "[jobs.snapshot]\n",
        &format!("[jobs.snapshot]\ntable = \"{source_table}\"\n"),
        1,
    )
}

pub(crate) fn capture_section(f: &Fixture, source: &str, tables: &str) -> String {
    let id = f.name.replace('-', "_");
    format!("[jobs.capture]\nsource_url = \"{source}\"\n{tables}\nslot = \"kb_{id}\"\npublication = \"kb_{id}\"\nbarrier_interval_ms = 100\ncheckpoint_interval_ms = 300\n")
}

pub(crate) fn spawn_capture(f: &Fixture, prefix: &str) -> Runner {
    spawn_capture_serving(f, prefix, "")
}

/// A capture serving `/metrics` on `http` (an override of `http.listen`; "" = none).
pub(crate) fn spawn_capture_serving(f: &Fixture, prefix: &str, http: &str) -> Runner {
    let mut cmd = Command::new(BIN);
    cmd.args(["capture", "--config"])
        .arg(&f.config)
        .env("KAFKA_BACKFILL__HTTP__LISTEN", http)
        .env(
            "RUST_LOG",
            "info,kafka_backfill=debug,librdkafka=warn,pg_walstream=warn",
        );
    spawn_logged(cmd, f.dir.join(format!("{prefix}.log")))
}

/// `verify --against-source` of `job` (the config's first when `None`).
pub(crate) fn verify_against_source(f: &Fixture, job: Option<&str>) -> (bool, String) {
    let out = Command::new(BIN)
        .args(["verify", "--against-source", "--config"])
        .arg(&f.config)
        .args(job.map(|j| ["--job", j]).into_iter().flatten())
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Verifies against the source until clean (the runners catching up) or the deadline.
fn verify_source_eventually(f: &Fixture, within: Duration) -> String {
    verify_job_eventually(f, None, within)
}

/// [`verify_source_eventually`] of `job`.
/// Waits until job `slow` (in `f`'s SQLite store) has committed, in every partition, the furthest
/// epoch job `ahead` has committed in any: every change the log carried up to there is applied to
/// both. On a timeout, `runner`'s log tail says why.
pub(crate) fn wait_until_behind_none(f: &Fixture, slow: &str, ahead: &str, runner: &Runner) {
    let epoch_of = |job: &str, which: &str| -> i64 {
        f.sql::<i64>(&format!(
            "SELECT {which}(epoch) FROM kb_partition_progress WHERE job = '{job}'"
        ))[0][0]
    };
    let reached = epoch_of(ahead, "max");
    let deadline = Instant::now() + MIN;
    while epoch_of(slow, "min") < reached {
        assert!(Instant::now() < deadline, "{}", tail(&runner.log_text()));
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub(crate) fn verify_job_eventually(f: &Fixture, job: Option<&str>, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let (ok, text) = verify_against_source(f, job);
        if ok {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "verify --against-source never became clean: {text}\n{}",
            support::log_tails(&f.dir)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn check_log(f: &Fixture) -> String {
    f.check_log()
}

/// The end every capture scenario asserts: the store equals the source (`rows` rows compared,
/// within `within` of the runners catching up) and the log keeps the wire contract; the report.
pub(crate) fn assert_exact(f: &Fixture, rows: u64, within: Duration) -> String {
    let report = verify_source_eventually(f, within);
    assert!(
        report.contains(&format!("{rows} rows compared")),
        "{report}"
    );
    let log = check_log(f);
    assert!(log.contains(" 0 violations"), "{log}");
    report
}

/// SIGTERM to a capture, which stops at a checkpoint and exits 0: the capture itself said so,
/// not the process's shutdown grace running out (a stop under load once hung in the Kafka abort
/// until the grace, and the process exited 0 all the same).
pub(crate) fn stop_capture(capture: &mut Runner) {
    capture.signal("TERM");
    assert!(
        capture.wait_exit(MIN).success(),
        "{}",
        tail(&capture.log_text())
    );
    let log = capture.log_text();
    assert!(
        log.contains("capture stopped at a checkpoint") && !log.contains("grace period over"),
        "{}",
        tail(&log)
    );
}

pub(crate) fn wait_child(child: &mut Child, within: Duration) {
    let deadline = Instant::now() + within;
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "pgbench did not finish");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// pgbench → capture → two runners (the second joins when the first enters the log store) → the
/// store equals the source table.
/// The capture of `f` started, pgbench at `rate` for `secs` over it, a first `run` process (`a`)
/// once the capture committed `backlog` checkpoints, a second (`b`) joining when `a` enters the log
/// store; returns once pgbench is done, with the capture and both runs still running.
/// `http`: where process `a` serves `/status` and `/metrics` ("" = nowhere); `during` runs once
/// `b` joined, while pgbench writes.
fn capture_pgbench_with_a_join(
    f: &Fixture,
    url: &str,
    (rate, secs): (u32, u32),
    backlog: usize,
    http: &str,
    during: &dyn Fn(),
) -> [Runner; 3] {
    let mut capture = spawn_capture(f, "capture");
    capture.wait_for("snapshot copied", MIN);
    capture.wait_for("capture checkpoint committed", MIN);
    // A backlog for the log store, then writes throughout.
    let mut bench = pgbench_run(f, url, rate, secs);
    capture.wait_for_count("capture checkpoint committed", backlog, MIN);
    let mut a = f.spawn_run_serving("a", &[], http);
    a.wait_for("to=\"log_store\"", MIN);
    let mut b = f.spawn_run("b", &[]);
    b.wait_for("partitions assigned", MIN);
    during();
    wait_child(&mut bench, MIN);
    [capture, a, b]
}

fn pgbench_pipeline(name: &str, policy: &str, postgres_store: bool) {
    let _serial = serial();
    // The PostgreSQL store outlives the run: a job name of its own each time.
    let name = &format!("{name}-{}", stamp() % 1_000_000);
    let source = database(name);
    let url = source.url.clone();
    pgbench_init(&url);
    let f = capture_fixture(name, &url, "public.pgbench_accounts");
    f.set_recreation_policy(policy);
    if postgres_store {
        f.use_postgres(&pg_url());
    }
    let [mut capture, a, b] = capture_pgbench_with_a_join(&f, &url, (150, 25), 15, "", &|| {});
    let report = assert_exact(&f, 10_000, MIN);
    stop_capture(&mut capture);
    let both = format!("{}{}", a.log_text(), b.log_text());
    println!(
        "{name}: {report}; invariant errors {}, rescheduled {}",
        both.matches("should not update vnode bitmap during consuming log store")
            .count(),
        both.matches("rescheduled").count()
    );
}

#[test]
fn pgbench_into_sqlite_with_a_join_under_recreate_equals_the_source() {
    pgbench_pipeline("cap-sqlite", "recreate", false);
}

#[test]
fn pgbench_into_postgres_with_a_join_under_reschedule_equals_the_source() {
    pgbench_pipeline("cap-pg", "reschedule", true);
}

/// Every mapped type, TOASTed values left unchanged by updates, key-changing updates, savepoint
/// rollbacks, a transaction of 100,000 rows (spilled by the walsender: `logical_decoding_work_mem` = 64kB), with `kill -9` of the capture in the middle: the store
/// equals the source (the rows written after the snapshot went through pgoutput, the source side
/// of `verify` through COPY, so equal bytes mean both paths encode alike), and the log is valid.
#[test]
fn types_toast_key_moves_savepoints_and_a_kill_9_stay_exact_into_sqlite() {
    types_mix(false);
}

#[test]
fn types_toast_key_moves_savepoints_and_a_kill_9_stay_exact_into_postgres() {
    types_mix(true);
}

fn types_mix(postgres_store: bool) {
    let _serial = serial();
    let source = database("cap-mix");
    let url = source.url.clone();
    psql(&url, "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')");
    psql(
        &url,
        "CREATE TABLE t (id bigint PRIMARY KEY, s smallint, i integer, r real, d double precision, \
         n numeric(12,3), nt numeric, b boolean, tx text, vc varchar(20), ch char(4), by bytea, u uuid, \
         day date, tod time, ts timestamp, tz timestamptz, iv interval, j jsonb, m mood, arr integer[], big text)",
    );
    psql(&url, "ALTER TABLE t REPLICA IDENTITY FULL");
    let row = |id: i64| {
        format!(
            "({id}, {s}, {id}, 1.5, 'NaN', -{id}.125, 3.14159265358979323846264, {b}, 'tab\there \"q\" \\\\ é', 'v{id}', 'ab', '\\x00ff{id:04x}', \
             'a0eebc99-9c0b-4ef8-bb6d-6bb9bd38{id:04}', '2024-02-29', '13:14:15.5', '1969-12-31 23:59:59.999999', \
             '2024-01-01 05:30:00+05:30', '1 year 2 mons 3 days 04:05:06', '{{\"k\": [1, 2]}}', 'happy', '{{1,NULL,-3}}', \
             (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 100)))",
            s = id % 30000,
            b = id % 2 == 0
        )
    };
    let values: Vec<String> = (1..=200).map(row).collect();
    psql(&url, &format!("INSERT INTO t VALUES {}", values.join(",")));
    // Transactions larger than this spill to disk in the walsender (pgoutput v1 still sends each
    // whole, after its commit).
    let db = url.rsplit('/').next().unwrap();
    psql(
        &url,
        &format!("ALTER DATABASE {db} SET logical_decoding_work_mem = '64kB'"),
    );
    let name = if postgres_store {
        format!("cap-mix-pg-{}", stamp() % 1_000_000)
    } else {
        "cap-mix".to_string()
    };
    let f = capture_fixture(&name, &url, "public.t");
    f.edit_config("max_rows_per_second = 2000", "max_rows_per_second = 0");
    if postgres_store {
        f.use_postgres(&pg_url());
    }
    let mut capture = spawn_capture(&f, "c1");
    capture.wait_for("capture checkpoint committed", MIN);
    let values: Vec<String> = (201..=400).map(row).collect();
    psql(&url, &format!("INSERT INTO t VALUES {}", values.join(",")));
    // TOASTed `big` left unchanged; NULLs; a key move; savepoints rolled back.
    psql(&url, "UPDATE t SET i = i + 1 WHERE id % 3 = 0");
    psql(
        &url,
        "UPDATE t SET tx = NULL, arr = NULL, n = NULL WHERE id % 7 = 0",
    );
    psql(&url, "UPDATE t SET id = id + 100000 WHERE id % 11 = 0");
    psql(
        &url,
        "BEGIN; DELETE FROM t WHERE id % 5 = 0; SAVEPOINT a; DELETE FROM t; ROLLBACK TO SAVEPOINT a; \
         UPDATE t SET m = 'sad' WHERE id % 13 = 0; COMMIT",
    );
    let mut run = f.spawn_run("r1", &[]);
    // TRUNCATE inside a transaction (docs/WIRE.md "Truncate"): the update before it is
    // superseded, the even rows put back after it are the table.
    psql(
        &url,
        "BEGIN; UPDATE t SET i = i + 7 WHERE id % 4 = 0;          CREATE TEMP TABLE keep AS SELECT * FROM t WHERE id % 2 = 0; TRUNCATE t;          INSERT INTO t SELECT * FROM keep; COMMIT",
    );
    // A transaction of 100,000 rows, and the capture killed while it streams.
    psql(
        &url,
        "INSERT INTO t (id, s, i, b, tx) SELECT g, 1, g, true, 'bulk' FROM generate_series(1000000, 1099999) g",
    );
    capture.signal("KILL");
    capture.wait_exit(MIN);
    psql(&url, "UPDATE t SET big = 'short now' WHERE id % 17 = 0");
    psql(&url, "DELETE FROM t WHERE id BETWEEN 1000000 AND 1049999");
    let mut capture = spawn_capture(&f, "c2");
    capture.wait_for("capture checkpoint committed", MIN);
    let rows: u64 = psql(&url, "SELECT count(*) FROM t").parse().unwrap();
    assert_exact(&f, rows, MIN);
    assert!(
        run.log_text().contains("truncation read"),
        "the run read the TRUNCATE: {}",
        tail(&run.log_text())
    );
    run.signal("TERM");
    run.wait_exit(MIN);
    stop_capture(&mut capture);
}

/// What the capture cannot carry stops it with an error that says what to do, and nothing past the
/// last checkpoint is committed.
#[test]
fn refusals_name_the_fix() {
    let _serial = serial();
    let source = database("cap-refuse");
    let url = source.url.clone();
    psql(
        &url,
        "CREATE TABLE nokey (a int); CREATE TABLE plain (id int PRIMARY KEY, v text)",
    );
    let f = capture_fixture("cap-refuse-plain", &url, "public.plain");
    let mut c = spawn_capture(&f, "identity");
    assert!(!c.wait_exit(MIN).success());
    assert!(
        c.log_text().contains("REPLICA IDENTITY FULL"),
        "{}",
        tail(&c.log_text())
    );
    let g = capture_fixture("cap-refuse-nokey", &url, "public.nokey");
    let mut c = spawn_capture(&g, "nokey");
    assert!(!c.wait_exit(MIN).success());
    assert!(
        c.log_text().contains("has no primary key"),
        "{}",
        tail(&c.log_text())
    );
    // A capture that ran, stopped.
    psql(
        &url,
        "ALTER TABLE plain REPLICA IDENTITY FULL; INSERT INTO plain VALUES (1, 'a')",
    );
    let mut c = spawn_capture(&f, "ran");
    c.wait_for("capture checkpoint committed", MIN);
    stop_capture(&mut c);
    // A dropped slot: the log cannot be continued.
    psql(
        &url,
        "SELECT pg_drop_replication_slot('kb_cap_refuse_plain')",
    );
    let mut c = spawn_capture(&f, "slot-gone");
    assert!(!c.wait_exit(MIN).success());
    assert!(
        c.log_text()
            .contains("replication slot kb_cap_refuse_plain is gone"),
        "{}",
        tail(&c.log_text())
    );
}

/// A second capture of the same job fences the first (its next Kafka commit fails for good and it
/// exits naming why), waits for the slot the first held, and carries on exactly.
#[test]
fn a_second_capture_of_a_job_fences_the_first() {
    let _serial = serial();
    let source = database("cap-fence");
    let url = source.url.clone();
    pgbench_init(&url);
    let f = capture_fixture("cap-fence", &url, "public.pgbench_accounts");
    let mut first = spawn_capture(&f, "first");
    first.wait_for_count("capture checkpoint committed", 3, MIN);
    let mut bench = pgbench_run(&f, &url, 100, 8);
    let addr = format!("127.0.0.1:{}", free_port());
    let mut second = spawn_capture_serving(&f, "second", &addr);
    assert!(
        !first.wait_exit(MIN).success(),
        "the fenced capture exits with an error"
    );
    assert!(
        first.log_text().contains("fenced this one"),
        "{}",
        tail(&first.log_text())
    );
    second.wait_for_count("capture checkpoint committed", 3, MIN);
    // The capture's metrics on a scrape: its committed position and the source's, the commit
    // histogram, the checkpoints; and its entry on /status.
    let (code, metrics) = http_get(&format!("http://{addr}/metrics"));
    assert_eq!(code, 200);
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && l.contains("cap-fence"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{metrics}"))
    };
    assert!(value("kafka_backfill_capture_committed_lsn") > 0.0);
    assert!(
        value("kafka_backfill_capture_source_lsn") >= value("kafka_backfill_capture_committed_lsn")
    );
    assert!(value("kafka_backfill_capture_kafka_commit_seconds_count") >= 3.0);
    assert!(value("kafka_backfill_capture_checkpoints_total") >= 3.0);
    let s = status(&addr);
    let c = &s["captures"]["cap-fence"];
    assert_eq!(c["state"], "streaming", "{s}");
    assert!(
        c["committed_lsn"].as_str().is_some_and(|l| l.contains('/')),
        "{s}"
    );
    assert!(c["checkpoints"].as_u64().is_some_and(|n| n >= 3), "{s}");
    let mut run = f.spawn_run("r", &[]);
    wait_child(&mut bench, MIN);
    assert_exact(&f, 10_000, MIN);
    run.signal("TERM");
    run.wait_exit(MIN);
    stop_capture(&mut second);
}

/// `run --capture`: the capture and the job in one process (the embedded case); SIGTERM stops
/// both, the capture at a checkpoint.
#[test]
fn run_with_capture_in_one_process_equals_the_source_and_takes_a_table_added_later() {
    let _serial = serial();
    let source = database("cap-inproc");
    let url = source.url.clone();
    pgbench_init(&url);
    let f = capture_fixture("cap-inproc", &url, "public.pgbench_accounts");
    let mut run = f.spawn_run("a", &["--capture"]);
    run.wait_for("the capture published the snapshot", MIN);
    run.wait_for("partitions assigned", MIN);
    let mut bench = pgbench_run(&f, &url, 100, 5);
    wait_child(&mut bench, MIN);
    let report = verify_source_eventually(&f, MIN);
    assert!(report.contains("10000 rows compared"), "{report}");
    run.signal("TERM");
    assert!(run.wait_exit(MIN).success(), "{}", tail(&run.log_text()));
    assert!(
        run.log_text().contains("capture stopped at a checkpoint"),
        "{}",
        tail(&run.log_text())
    );
    // A table added, and a job of it, in the same process (docs/CAPTURE.md "Adding a table"):
    // the new job is prepared while the capture starts, before it announces the table, and
    // waits for the snapshot holding it. The publication is named in the configuration, so the
    // user adds the table to it.
    psql(&url, "ALTER TABLE pgbench_branches REPLICA IDENTITY FULL");
    let text = std::fs::read_to_string(&f.config).unwrap();
    let at = text.find("[[jobs]]").unwrap();
    let capture_at = text.find("[jobs.capture]").unwrap();
    let job = &text[at..capture_at];
    let capture = text[capture_at..].replacen(
        "table = \"public.pgbench_accounts\"",
        "tables = [\"public.pgbench_accounts\", \"public.pgbench_branches\"]",
        1,
    );
    let named = job.replacen(
        "[jobs.snapshot]\n",
        "[jobs.snapshot]\ntable = \"pgbench_accounts\"\n",
        1,
    );
    std::fs::write(
        &f.config,
        format!(
            "{}{named}{capture}{}",
            &text[..at],
            job_of_table(&f, job, "pgbench_branches", "branches", 2)
        ),
    )
    .unwrap();
    // `doctor` names what the capture would refuse: the named publication lacks the table.
    let id = f.name.replace('-', "_");
    let (code, out, _) = doctor(&f);
    assert_ne!(code, 0, "{out}");
    assert!(
        doctor_line(&out, "FAIL", "capture source").contains(&format!(
            "publication kb_{id} exists but does not publish public.pgbench_branches (ALTER PUBLICATION"
        )),
        "{out}"
    );
    psql(
        &url,
        &format!("ALTER PUBLICATION kb_{id} ADD TABLE pgbench_branches"),
    );
    let (code, out, _) = doctor(&f);
    assert_eq!(code, 0, "{out}");
    assert!(
        doctor_line(&out, "ok", &format!("{}-2: snapshot", f.name)).contains(
            "table pgbench_branches is in no published snapshot yet: its capture lists it"
        ),
        "{out}"
    );
    let mut run = f.spawn_run("b", &["--capture"]);
    run.wait_for("a snapshot holding the job's added table is published", MIN);
    let mut bench = pgbench_run(&f, &url, 100, 3);
    wait_child(&mut bench, MIN);
    for (job, rows) in [(f.name.clone(), 10_000), (format!("{}-2", f.name), 1)] {
        let report = verify_job_eventually(&f, Some(&job), MIN);
        assert!(
            report.contains(&format!("{rows} rows compared")),
            "{job}: {report}"
        );
    }
    run.signal("TERM");
    assert!(run.wait_exit(MIN).success(), "{}", tail(&run.log_text()));
}

/// docs/CAPTURE.md's order: `run` started before its `capture` has published the snapshot waits
/// for it (a log line, `/readyz` 503 naming what it waits for) instead of exiting, then starts by
/// itself and equals the source.
#[test]
fn run_started_before_its_capture_waits_for_the_snapshot_then_equals_the_source() {
    let _serial = serial();
    let source = database("cap-wait");
    let url = source.url.clone();
    pgbench_init(&url);
    let f = capture_fixture("cap-wait", &url, "public.pgbench_accounts");
    let http = format!("127.0.0.1:{}", free_port());
    let (code, out, _) = doctor(&f);
    assert_eq!(code, 0, "{out}");
    assert!(
        doctor_line(&out, "ok", "snapshot").contains("not published yet"),
        "{out}"
    );
    assert!(
        doctor_line(&out, "ok", "capture source").contains("slot kb_cap_wait not created yet"),
        "{out}"
    );
    let mut run = f.spawn_run_serving("a", &[], &http);
    run.wait_for("waiting for its snapshot", MIN);
    let (code, body) = http_get(&format!("http://{http}/readyz"));
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("job cap-wait waits for its snapshot")
            && body.contains("kafka-backfill capture --job cap-wait"),
        "{body}"
    );
    let mut capture = spawn_capture(&f, "capture");
    run.wait_for("the snapshot is published; starting the job", MIN);
    run.wait_for("partitions assigned", MIN);
    let mut bench = pgbench_run(&f, &url, 100, 3);
    wait_child(&mut bench, MIN);
    assert_exact(&f, 10_000, MIN);
    stop_capture(&mut capture);
    run.signal("TERM");
    assert!(run.wait_exit(MIN).success(), "{}", tail(&run.log_text()));
}

/// A `run` waiting for a snapshot that never comes stops at SIGTERM, exit 0, without starting.
#[test]
fn a_run_waiting_for_its_snapshot_stops_at_sigterm() {
    let _serial = serial();
    let f = capture_fixture(
        "cap-wait-term",
        "postgresql://postgres@127.0.0.1:1/never",
        "public.t",
    );
    let (code, out, _) = doctor(&f);
    assert_eq!(code, 4, "{out}"); // unreachable
    assert!(
        doctor_line(&out, "FAIL", "capture source").contains("127.0.0.1:1"),
        "{out}"
    );
    let mut run = f.spawn_run("a", &[]);
    run.wait_for("waiting for its snapshot", MIN);
    run.signal("TERM");
    let status = run.wait_exit(MIN);
    assert!(status.success(), "{}", tail(&run.log_text()));
    assert!(
        run.log_text()
            .contains("stopped while waiting for the snapshot"),
        "{}",
        tail(&run.log_text())
    );
}

/// A database `name` holding `big` (260,000 rows, ≈ 40 MiB: more than 2 × 16 MiB, the pages one copy
/// connection must have to pay) and a job capturing it with two copy connections; `top` is put
/// before the job's configuration (top-level keys). Returns the database, the fixture and the row
/// count.
pub(crate) fn big_table_capture(name: &str, top: &str) -> (SourceDb, Fixture, u64) {
    let source = database(name);
    let url = source.url.clone();
    psql(
        &url,
        "CREATE TABLE big (id int PRIMARY KEY, g int NOT NULL, pad text NOT NULL); \
         ALTER TABLE big REPLICA IDENTITY FULL; \
         INSERT INTO big SELECT i, i % 97, repeat(md5(i::text), 3) FROM generate_series(1, 260000) i;",
    );
    let rows: u64 = psql(&url, "SELECT count(*) FROM big").parse().unwrap();
    let f = Fixture::new(name, 1, "vnode_count = 64");
    let text = std::fs::read_to_string(&f.config).unwrap();
    let slot = format!("kb_{}", name.replace('-', "_"));
    std::fs::write(
        &f.config,
        format!("{top}{text}[jobs.capture]\nsource_url = \"{url}\"\ntable = \"public.big\"\nslot = \"{slot}\"\npublication = \"{slot}\"\nbarrier_interval_ms = 100\ncheckpoint_interval_ms = 300\ncopy_connections = 2\n"),
    )
    .unwrap();
    (source, f, rows)
}

/// A table of more than two copy connections' worth of pages is copied in two ctid ranges, each
/// connection importing the slot's exported snapshot, while a writer updates, deletes and inserts
/// across the whole table: the ranges together are exactly the snapshot (no row lost, none twice —
/// `check-log` refuses a key twice in a vnode's file), and snapshot + log equal the table after.
#[test]
fn a_large_table_is_copied_in_parallel_ctid_ranges_of_one_snapshot() {
    let _serial = serial();
    let (source, f, rows) = big_table_capture("cap-ctid", "");
    let url = source.url.clone();
    // The writer runs from before the slot exists until after the copy: every range sees the
    // snapshot, not the writer's later states.
    let script = f.dir.join("big.sql");
    std::fs::write(
        &script,
        "\\set id random(1, 300000)\n\\set g random(1, 1000)\nBEGIN;\n\
         UPDATE big SET g = :g WHERE id = :id;\n\
         DELETE FROM big WHERE id = :id + 1;\n\
         INSERT INTO big VALUES (:id + 2, :g, 'new') ON CONFLICT (id) DO UPDATE SET pad = 'moved';\nEND;\n",
    )
    .unwrap();
    let mut writer = Command::new("pgbench")
        .args(["-n", "-c", "2", "-R", "200", "-T", "12", "-f"])
        .arg(&script)
        .arg(&url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut capture = spawn_capture(&f, "capture");
    capture.wait_for("snapshot copied", MIN);
    let log = capture.log_text();
    assert!(
        log.contains("copying in ctid ranges") && log.contains("connections=2"),
        "the copy was not parallel: {}",
        tail(&log)
    );
    let copied: u64 = log
        .split("snapshot copied")
        .nth(1)
        .and_then(|l| l.split("rows=").nth(1))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("the snapshot copied line's rows");
    // The writer inserts and deletes: the snapshot's count is near the starting one.
    assert!(copied.abs_diff(rows) < 10_000, "{copied} vs {rows}");
    capture.wait_for("capture checkpoint committed", MIN);
    let mut run = f.spawn_run("a", &[]);
    run.wait_for("partitions assigned", MIN);
    wait_child(&mut writer, MIN);
    let now: u64 = psql(&url, "SELECT count(*) FROM big").parse().unwrap();
    assert_exact(&f, now, MIN);
    stop_capture(&mut capture);
}

/// SIGTERM while the capture copies its snapshot: the process exits 0 within its grace period
/// (`shutdown_grace_secs`), and a capture started again over the same folder, slot and topic ends
/// exact — whether the first one got as far as its first checkpoint (a resume) or not (its slot is
/// dropped and the snapshot taken again).
#[test]
fn sigterm_during_the_capture_snapshot_exits_0_within_the_grace_and_a_restart_is_exact() {
    let _serial = serial();
    let grace = 5;
    let (_source, f, rows) =
        big_table_capture("cap-term", &format!("shutdown_grace_secs = {grace}\n"));
    let mut capture = spawn_capture(&f, "capture");
    capture.wait_for("copying in ctid ranges", MIN);
    let signalled = Instant::now();
    capture.signal("TERM");
    let status = capture.wait_exit(Duration::from_secs(grace + 10));
    let log = capture.log_text();
    assert!(status.success(), "exit {status}:\n{}", tail(&log));
    assert!(
        signalled.elapsed() < Duration::from_secs(grace + 5),
        "exited {:?} after the signal",
        signalled.elapsed()
    );
    assert!(log.contains("signal received: stopping"), "{}", tail(&log));
    let mut capture = spawn_capture(&f, "capture-again");
    capture.wait_for("capture checkpoint committed", MIN);
    let mut run = f.spawn_run("a", &[]);
    run.wait_for("partitions assigned", MIN);
    assert_exact(&f, rows, MIN);
    run.signal("TERM");
    run.wait_exit(MIN);
    stop_capture(&mut capture);
}

/// `ALTER TABLE … ADD COLUMN` while pgbench writes: each added column (nullable, no default) is a
/// new row-schema version the capture announces beside the manifest and switches to at a
/// checkpoint barrier; the job alters its table there. A kill -9 of the capture between the two
/// changes resumes with the version in force. The store equals the source with the new columns,
/// the log is valid; a nullable column added with a default is a version whose union holds the
/// default (older rows take it), and one with a volatile default stops the capture, naming it.
#[test]
fn columns_added_upstream_are_schema_versions_the_replica_follows() {
    let _serial = serial();
    let name = &format!("cap-alter-{}", stamp() % 1_000_000);
    let source = database(name);
    let url = source.url.clone();
    pgbench_init(&url);
    let f = capture_fixture(name, &url, "public.pgbench_accounts");
    let mut capture = spawn_capture(&f, "capture");
    capture.wait_for("snapshot copied", MIN);
    capture.wait_for("capture checkpoint committed", MIN);
    let mut run = f.spawn_run("a", &[]);
    run.wait_for("partitions assigned", MIN);
    let mut bench = pgbench_run(&f, &url, 100, 12);
    psql(&url, "ALTER TABLE pgbench_accounts ADD COLUMN note text");
    psql(
        &url,
        "UPDATE pgbench_accounts SET note = 'note ' || aid WHERE aid % 7 = 0",
    );
    capture.wait_for("schema version announced", MIN);
    // NOT NULL columns added with a default: the version declares the value the rows already
    // there hold (PostgreSQL's missing value, now() evaluated once at the ALTER), and the replica's
    // older rows resolve to it. Added after `tier` while the capture is paused, so it reads a
    // catalog that has them when it meets `tier` (it stopped there: "the table changed again
    // since").
    let mut capture = tier_added_after_a_kill_9(
        &f,
        &url,
        capture,
        "capture2",
        &[
            "ALTER TABLE pgbench_accounts ADD COLUMN active boolean NOT NULL DEFAULT true, ADD COLUMN since timestamptz NOT NULL DEFAULT now()",
            "UPDATE pgbench_accounts SET active = false, since = now() WHERE aid % 11 = 0",
        ],
        3,
    );
    wait_child(&mut bench, MIN);
    let report = verify_source_eventually(&f, MIN);
    assert!(report.contains("10000 rows compared"), "{report}");
    let log = check_log(&f);
    assert!(log.contains("4 row-schema versions: 0 violations"), "{log}");
    let history: Vec<Vec<i64>> = f.sql("SELECT count(*) FROM kb_schema_history");
    assert_eq!(history[0][0], 3);
    let columns: Vec<Vec<String>> =
        f.sql("SELECT name FROM pragma_table_info('accounts') ORDER BY cid");
    let columns: Vec<&str> = columns.iter().map(|c| c[0].as_str()).collect();
    for c in ["note", "tier", "active", "since"] {
        assert!(columns.contains(&c), "{c}: {columns:?}");
    }
    let active: Vec<Vec<i64>> =
        f.sql("SELECT count(*) FROM accounts WHERE active = 1 AND aid % 11 <> 0");
    assert_eq!(
        active[0][0],
        10_000 - 10_000 / 11,
        "older rows hold the default"
    );
    // A nullable column with a default (issue 41's `ADD COLUMN … DEFAULT`): its version's union
    // is `[int, "null"]` with the default in its first branch, so the replica's older rows take
    // PostgreSQL's missing value; rows set to NULL afterwards, and to another value, follow.
    psql(
        &url,
        "ALTER TABLE pgbench_accounts ADD COLUMN flag int DEFAULT 1",
    );
    psql(
        &url,
        "UPDATE pgbench_accounts SET flag = NULL WHERE aid % 5 = 0",
    );
    psql(
        &url,
        "UPDATE pgbench_accounts SET flag = 2 WHERE aid % 3 = 0",
    );
    let report = verify_source_eventually(&f, MIN);
    assert!(report.contains("10000 rows compared"), "{report}");
    let flags: Vec<Vec<i64>> = f.sql(
        "SELECT count(*) FILTER (WHERE flag = 1), count(*) FILTER (WHERE flag IS NULL), count(*) FILTER (WHERE flag = 2) FROM accounts",
    );
    let (threes, fives_not_threes) = (10_000 / 3, 10_000 / 5 - 10_000 / 15);
    assert_eq!(
        flags[0],
        [10_000 - threes - fives_not_threes, fives_not_threes, threes],
        "older rows hold the default"
    );
    let log = check_log(&f);
    assert!(log.contains("5 row-schema versions: 0 violations"), "{log}");
    // A restart writes the column's union as its version declares it.
    capture.signal("KILL");
    assert!(!capture.wait_exit(MIN).success());
    let mut capture = spawn_capture(&f, "capture3");
    capture.wait_for("capture checkpoint committed", MIN);
    psql(
        &url,
        "UPDATE pgbench_accounts SET flag = CASE WHEN aid % 2 = 0 THEN NULL ELSE 7 END WHERE aid % 17 = 0",
    );
    let report = verify_source_eventually(&f, MIN);
    assert!(report.contains("10000 rows compared"), "{report}");
    // A volatile default: PostgreSQL rewrote the table with a value per row the log never saw.
    psql(
        &url,
        "ALTER TABLE pgbench_accounts ADD COLUMN salt float8 DEFAULT random()",
    );
    psql(
        &url,
        "UPDATE pgbench_accounts SET abalance = 1 WHERE aid = 1",
    );
    assert!(!capture.wait_exit(MIN).success());
    let text = capture.log_text();
    assert!(
        text.contains("column salt was added with a volatile default"),
        "{}",
        tail(&text)
    );
    run.signal("TERM");
    run.wait_exit(MIN);
}

/// `capture` killed with `kill -9` and started again as `prefix`; then a column `tier` added to
/// pgbench_accounts and written, and each statement of `then` run after it, each in a transaction
/// of its own, while the capture is paused (SIGSTOP): it meets `tier` with the catalog already
/// past it. Returns once the snapshot folder holds `versions` schema versions.
fn tier_added_after_a_kill_9(
    f: &Fixture,
    url: &str,
    mut capture: Runner,
    prefix: &str,
    then: &[&str],
    versions: usize,
) -> Runner {
    capture.signal("KILL");
    assert!(!capture.wait_exit(MIN).success());
    let mut capture = spawn_capture(f, prefix);
    capture.wait_for("capture checkpoint committed", MIN);
    capture.signal("STOP");
    psql(url, "ALTER TABLE pgbench_accounts ADD COLUMN tier bigint");
    psql(
        url,
        "UPDATE pgbench_accounts SET tier = aid * 1099511627776 WHERE aid % 5 = 0",
    );
    for statement in then {
        psql(url, statement);
    }
    capture.signal("CONT");
    crate::schema_changes_e2e::wait_for_versions(f, &capture, versions);
    capture
}

/// pgbench's four tables captured into one log (issue 23): one slot, one exported snapshot, one
/// epoch chain, a Kafka transaction per checkpoint across all of them; one job per table reads it,
/// all four in one process. A fifth table the publication also publishes is written throughout and
/// passed over (before, a change of another published table was encoded as the captured table's:
/// a capture over a shared publication stopped or wrote garbage rows). The capture is killed with
/// `kill -9` mid-stream and resumes; columns are added to two of the tables mid-stream, with a
/// `kill -9` between them (issue 41: a capture of several tables stopped at any column change).
/// At the end every job's store equals its source table and the topic is a valid log of four
/// tables; a column added with a default stops the capture, and its restart, for the same reason.
#[test]
fn a_publication_of_four_pgbench_tables_is_one_log_backfilled_one_job_per_table() {
    let _serial = serial();
    let source = database("cap-four");
    let url = source.url.clone();
    pgbench_init_four(&url);
    psql(
        &url,
        "CREATE TABLE other (id int PRIMARY KEY, v text); ALTER TABLE other REPLICA IDENTITY FULL",
    );
    let tables = [
        ("pgbench_accounts", "accounts"),
        ("pgbench_tellers", "tellers"),
        ("pgbench_branches", "branches"),
        ("pgbench_history", "history"),
    ];
    let f = Fixture::new("cap-four", 1, "vnode_count = 64\nmax_rows_per_second = 0");
    psql(
        &url,
        &format!(
            "CREATE PUBLICATION kb_{} FOR TABLE pgbench_accounts, pgbench_tellers, pgbench_branches, pgbench_history, other",
            f.name.replace('-', "_")
        ),
    );
    // Job i reads table i into its own store table; the first job also captures.
    let text = std::fs::read_to_string(&f.config).unwrap();
    let at = text.find("[[jobs]]").unwrap();
    let (head, job) = text.split_at(at);
    let job_of = |(source_table, store_table): (&str, &str), i: usize| {
        job_of_table(&f, job, source_table, store_table, i)
    };
    let mut config = format!("{head}{}", job_of(tables[0], 0));
    let list: Vec<String> = tables
        .iter()
        .map(|(t, _)| format!("\"public.{t}\""))
        .collect();
    config += &capture_section(&f, &url, &format!("tables = [{}]", list.join(", ")));
    for (i, t) in tables.iter().enumerate().skip(1) {
        config += &job_of(*t, i);
    }
    std::fs::write(&f.config, config).unwrap();
    let mut capture = spawn_capture(&f, "c1");
    capture.wait_for("snapshot copied", MIN);
    capture.wait_for("capture checkpoint committed", MIN);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.dir.join("out/snapshot/manifest.json")).unwrap())
            .unwrap();
    let names: Vec<&str> = manifest["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, tables.map(|t| t.0));
    let mut bench = pgbench_run(&f, &url, 100, 25);
    for i in 0..20 {
        psql(
            &url,
            &format!(
                "INSERT INTO other VALUES ({i}, 'x'); UPDATE other SET v = 'y' WHERE id = {i}"
            ),
        );
    }
    capture.wait_for_count("capture checkpoint committed", 8, MIN);
    capture.signal("KILL");
    assert!(!capture.wait_exit(MIN).success());
    let mut capture = spawn_capture(&f, "c2");
    let mut run = f.spawn_run("r", &[]);
    // Columns added to two of the four tables while pgbench writes (issue 41): a new version of
    // each, which its job follows. pgbench_history is the last table a pgbench transaction
    // writes, so its new column arrives inside a transaction that already changed three other
    // captured tables: the capture resumes from its last checkpoint and announces the version as
    // that transaction begins. A kill -9 between the two: the restart resumes each table with the
    // version in force.
    psql(&url, "ALTER TABLE pgbench_history ADD COLUMN note text");
    capture.wait_for("schema version announced", MIN);
    let text = capture.log_text();
    assert!(
        text.contains("columns of public.pgbench_history changed inside the transaction")
            && text.contains("to announce the new version as that transaction begins"),
        "{}",
        tail(&text)
    );
    psql(
        &url,
        "UPDATE pgbench_history SET note = 'note ' || aid WHERE aid % 3 = 0",
    );
    let committed = capture
        .log_text()
        .matches("capture checkpoint committed")
        .count();
    capture.wait_for_count("capture checkpoint committed", committed + 2, MIN);
    let mut capture = tier_added_after_a_kill_9(&f, &url, capture, "c2b", &[], 2);
    wait_child(&mut bench, MIN);
    psql(&url, "DELETE FROM other");
    let expected_rows = [10_000, 10, 1];
    for (i, (table, _)) in tables.iter().enumerate() {
        let job = format!("{}-{i}", f.name);
        let report = verify_job_eventually(&f, Some(&job), MIN);
        let want = match expected_rows.get(i) {
            Some(n) => *n,
            None => psql(&url, &format!("SELECT count(*) FROM {table}"))
                .parse()
                .unwrap(),
        };
        assert!(
            report.contains(&format!("{want} rows compared")),
            "{table}: {report}"
        );
    }
    let history: u64 = psql(&url, "SELECT count(*) FROM pgbench_history")
        .parse()
        .unwrap();
    assert!(history > 100, "pgbench wrote {history} history rows");
    let log = check_log(&f);
    assert!(log.contains(" 0 violations"), "{log}");
    assert!(
        capture.log_text().contains("capture checkpoint committed"),
        "the resumed capture committed nothing: {}",
        tail(&capture.log_text())
    );
    let versions: Vec<serde_json::Value> =
        std::fs::read_dir(f.dir.join("out/snapshot/schema_versions"))
            .unwrap()
            .map(|e| serde_json::from_slice(&std::fs::read(e.unwrap().path()).unwrap()).unwrap())
            .collect();
    let mut named: Vec<&str> = versions
        .iter()
        .map(|v| v["table"].as_str().unwrap())
        .collect();
    named.sort();
    assert_eq!(
        named,
        ["pgbench_accounts", "pgbench_history"],
        "{versions:?}"
    );
    for (table, column) in [("accounts", "tier"), ("history", "note")] {
        let columns: Vec<Vec<String>> = f.sql(&format!(
            "SELECT name FROM pragma_table_info('{table}') ORDER BY cid"
        ));
        assert!(
            columns.iter().any(|c| c[0] == column),
            "{table}: {columns:?}"
        );
    }
    // A column change the log cannot carry stops the capture, and a restart stops with the same
    // reason.
    const WHY: &str = "column note was added with a volatile default";
    psql(
        &url,
        "ALTER TABLE pgbench_branches ADD COLUMN note text DEFAULT md5(random()::text)",
    );
    psql(
        &url,
        "UPDATE pgbench_branches SET bbalance = bbalance WHERE bid = 1",
    );
    assert!(!capture.wait_exit(MIN).success());
    assert!(
        capture.log_text().contains(WHY),
        "{}",
        tail(&capture.log_text())
    );
    let mut again = spawn_capture(&f, "c3");
    assert!(!again.wait_exit(MIN).success());
    assert!(
        again.log_text().contains(WHY),
        "{}",
        tail(&again.log_text())
    );
    run.signal("TERM");
    assert!(run.wait_exit(MIN).success(), "{}", tail(&run.log_text()));
}

/// What the pgbench checker saw: samples of the published replica, each read in one read
/// transaction of the store (see [`Replica::sampler`]).
#[derive(Default, Debug)]
pub(crate) struct Sums {
    /// Samples taken while a replica was published (`kb_publication.visible_epoch` set).
    pub(crate) published: u64,
    /// Of them, the samples whose four sums disagreed, with the first few.
    pub(crate) torn: u64,
    pub(crate) first_torn: Vec<(i64, [i64; 4])>,
    /// The distinct published epochs seen, in the order seen; one going back is a failure too.
    pub(crate) epochs: Vec<i64>,
    pub(crate) went_back: u64,
}

/// One sample of the replica: the published epoch (`None` before the first publication) and
/// Σ abalance, Σ tbalance, Σ bbalance, Σ delta; `Err` while the tables are not there.
type Sampler = Box<dyn FnMut() -> Result<(Option<i64>, [i64; 4]), String>>;

/// Where the pgbench replica is, for the checker.
#[derive(Clone)]
pub(crate) enum Replica {
    /// The SQLite file; tables `accounts`, `tellers`, `branches`, `history`.
    Sqlite(std::path::PathBuf),
    /// The PostgreSQL store's URL and the suffix of its four tables' names.
    Postgres(String, String),
}

impl Replica {
    /// The published epoch and the four sums, in one read transaction (SQLite: one `BEGIN …
    /// COMMIT` of a WAL reader; PostgreSQL: `REPEATABLE READ`); `Err` while the tables are not there.
    /// SQLite without a `history` table (a job that has not gained it): the branches' sum in its
    /// place.
    fn sampler(&self, job: &str) -> Sampler {
        let sql = |suffix: &str, p: &str| {
            format!(
                "SELECT (SELECT visible_epoch FROM kb_publication WHERE job = {p}), \
                 (SELECT COALESCE(SUM(abalance), 0)::BIGINT FROM accounts{suffix}), \
                 (SELECT COALESCE(SUM(tbalance), 0)::BIGINT FROM tellers{suffix}), \
                 (SELECT COALESCE(SUM(bbalance), 0)::BIGINT FROM branches{suffix}), \
                 (SELECT COALESCE(SUM(delta), 0)::BIGINT FROM history{suffix})"
            )
        };
        let job = job.to_string();
        match self.clone() {
            Replica::Sqlite(db) => {
                // SQLite reads `::BIGINT` as a column named BIGINT: leave the casts out.
                let sql = sql("", "?1").replace("::BIGINT", "");
                let mut conn: Option<rusqlite::Connection> = None;
                Box::new(move || {
                    if conn.is_none() {
                        let c = rusqlite::Connection::open(&db).map_err(|e| e.to_string())?;
                        c.busy_timeout(Duration::from_secs(10)).unwrap();
                        conn = Some(c);
                    }
                    let tx = conn.as_mut().unwrap().transaction().unwrap();
                    // A job that has not gained pgbench_history yet (or not published it): the
                    // three other sums, the branches' twice, read in the same transaction.
                    let history: i64 = tx
                        .query_row(
                            "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'history'",
                            [],
                            |r| r.get(0),
                        )
                        .map_err(|e| e.to_string())?;
                    let sql = if history > 0 {
                        sql.clone()
                    } else {
                        sql.replace("delta), 0) FROM history", "bbalance), 0) FROM branches")
                    };
                    let sample = tx
                        .query_row(&sql, [&job], |r| {
                            Ok((
                                r.get::<_, Option<i64>>(0)?,
                                [r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?],
                            ))
                        })
                        .map_err(|e| e.to_string());
                    tx.commit().unwrap();
                    sample
                })
            }
            Replica::Postgres(url, suffix) => {
                let sql = sql(&suffix, "$1");
                let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
                Box::new(move || {
                    let mut tx = client
                        .build_transaction()
                        .isolation_level(postgres::IsolationLevel::RepeatableRead)
                        .read_only(true)
                        .start()
                        .unwrap();
                    let sample = tx
                        .query_one(&sql, &[&job])
                        .map(|r| (r.get(0), [r.get(1), r.get(2), r.get(3), r.get(4)]))
                        .map_err(|e| e.to_string());
                    tx.commit().unwrap();
                    sample
                })
            }
        }
    }
}

/// Samples Σ abalance, Σ tbalance, Σ bbalance, Σ delta of the replica (job `job`) continuously,
/// each in one read transaction with the published epoch, until `stop`.
pub(crate) fn pgbench_checker(
    replica: Replica,
    job: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Sums> {
    std::thread::spawn(move || {
        let mut sums = Sums::default();
        let mut sample = replica.sampler(&job);
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            // The tables not created yet, or being replaced: nothing to read this time.
            let Ok((epoch, s)) = sample() else { continue };
            let Some(epoch) = epoch else { continue };
            sums.published += 1;
            if s.iter().any(|x| *x != s[0]) {
                sums.torn += 1;
                if sums.first_torn.len() < 5 {
                    sums.first_torn.push((epoch, s));
                }
            }
            match sums.epochs.last() {
                Some(last) if epoch < *last => sums.went_back += 1,
                Some(last) if epoch == *last => {}
                _ => sums.epochs.push(epoch),
            }
        }
        sums
    })
}

/// One job materialises all four pgbench tables of a capture (issue 23): every checkpoint commits
/// the four tables' rows in one SQLite transaction, published at an epoch every partition stands
/// at, so a reader of the replica finds pgbench's invariant — Σ abalance = Σ tbalance = Σ bbalance =
/// Σ delta — at every committed state, across two workers and a second `run` process joining in
/// the log store (a recreation under `recreate`: the old replica stays visible until the new
/// generation reaches it). At the end every table equals its source.
#[test]
fn four_pgbench_tables_in_one_sqlite_job_keep_the_sums_equal_at_every_commit() {
    four_pgbench_tables_in_one_job(false, "recreate");
}

/// [`four_pgbench_tables_in_one_sqlite_job_keep_the_sums_equal_at_every_commit`] into the
/// PostgreSQL store, where the two processes' commits run concurrently, and the join absorbed
/// under `reschedule` (the partitions move mid log store, no recreation).
#[test]
fn four_pgbench_tables_in_one_postgres_job_under_reschedule_keep_the_sums_equal_at_every_commit() {
    four_pgbench_tables_in_one_job(true, "reschedule");
}

/// A source database `name` with pgbench's four tables, and a fixture of `workers` workers
/// publishing at whole epochs.
fn four_tables_source(name: &str, workers: u32) -> (SourceDb, Fixture) {
    let source = database(name);
    pgbench_init_four(&source.url);
    let f = Fixture::new(
        name,
        workers,
        "vnode_count = 64\nmax_rows_per_second = 0\nconsistency = \"epoch\"",
    );
    (source, f)
}

/// Writes `f`'s configuration as one job of pgbench's four tables (store tables named with
/// `suffix`) and their capture from `url`, with `capture_extra` keys in `[jobs.capture]`.
pub(crate) fn four_tables_config(f: &Fixture, url: &str, suffix: &str, capture_extra: &str) {
    tables_config(
        f,
        url,
        &format!("pgbench_accounts = \"accounts{suffix}\", pgbench_tellers = \"tellers{suffix}\", pgbench_branches = \"branches{suffix}\", pgbench_history = \"history{suffix}\""),
        "tables = [\"public.pgbench_accounts\", \"public.pgbench_tellers\", \"public.pgbench_branches\", \"public.pgbench_history\"]",
        capture_extra,
    );
}

/// `f`'s job made one of several tables: `store_tables` (`log table = "SQL table", …`) in its
/// store, a capture of `url`'s `capture_tables` line (`tables = […]`) and `capture_extra`.
pub(crate) fn tables_config(
    f: &Fixture,
    url: &str,
    store_tables: &str,
    capture_tables: &str,
    capture_extra: &str,
) {
    let text = std::fs::read_to_string(&f.config).unwrap();
    let table_line = text
        .lines()
        .find(|l| l.starts_with("table = "))
        .unwrap()
        .to_string();
    let text = text.replacen(&table_line, &format!("tables = {{ {store_tables} }}"), 1);
    let capture = capture_section(f, url, capture_tables);
    std::fs::write(&f.config, format!("{text}{capture}{capture_extra}")).unwrap();
}

/// Several tables from a later snapshot (issue 40): the four pgbench tables captured with a
/// snapshot every 2 s while pgbench writes; retention deletes the log up to the newest snapshot's
/// start; a job of the four tables created then reads that snapshot, a reader of its replica finds
/// pgbench's invariant at every published sample, and at the end every table equals its source.
#[test]
fn four_pgbench_tables_from_a_later_snapshot_keep_the_sums_equal_at_every_commit() {
    let _serial = serial();
    let (source, f) = four_tables_source(&format!("cap-later4-{}", stamp() % 1_000_000), 1);
    let url = source.url.clone();
    four_tables_config(
        &f,
        &url,
        "",
        "snapshot_interval_ms = 2000\nsnapshot_keep = 2\n",
    );
    let mut capture = spawn_capture(&f, "capture");
    capture.wait_for("snapshot copied", MIN);
    let mut bench = pgbench_run(&f, &url, 100, 14);
    capture.wait_for_count("snapshot of the running capture published", 2, MIN);
    let first = f.dir.join("out/snapshot");
    let (newest, folder) = kafka_backfill::snapshot::published::later_snapshots(&first)
        .pop()
        .expect("a later snapshot");
    let (_, starts) = kafka_backfill::snapshot::files::manifest_starts(&folder).unwrap();
    f.delete_records(&(0..).zip(starts).collect::<Vec<(u32, u64)>>());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let checker = pgbench_checker(Replica::Sqlite(f.db()), f.name.clone(), stop.clone());
    let mut run = f.spawn_run("a", &[]);
    run.wait_for("reading a later snapshot of the capture", MIN);
    let said = run.log_text();
    let line = said
        .lines()
        .find(|l| l.contains("reading a later snapshot of the capture"))
        .unwrap();
    let epoch = epoch_in(line);
    assert!(epoch >= newest.0, "the newest: {line}");
    wait_child(&mut bench, MIN);
    let exact = || {
        let report = verify_source_eventually(&f, MIN);
        for (table, rows) in [("accounts", 10_000), ("tellers", 10), ("branches", 1)] {
            assert!(
                report.contains(&format!("table {table}: {rows} rows compared")),
                "{report}"
            );
        }
    };
    exact();
    // Online resync (issue 41.2): the replica damaged by hand, found by verify, then rebuilt from
    // a new snapshot of the running capture under pgbench, with a kill -9 of the runner as it
    // reloads; readers keep seeing pgbench's invariant throughout (the damage keeps it too).
    damage_pgbench_replica(&f.db());
    let (clean, damaged) = verify_against_source(&f, None);
    assert!(!clean, "verify did not see the damage: {damaged}");
    let mut bench = pgbench_run_with(&f, &url, 100, 14, &["-n"]);
    let (said, to) = resync_command(&f);
    assert!(to > epoch, "{said}");
    assert!(said.contains("readers see the old replica"), "{said}");
    run.wait_for("starting it again on that snapshot", MIN);
    run.wait_for_count("job started", 2, MIN);
    run.signal("KILL");
    run.wait_exit(MIN);
    let mut run = f.spawn_run("a", &[]);
    run.wait_for("job started", MIN);
    wait_child(&mut bench, MIN);
    exact();
    assert!(
        run.log_text().contains(&format!("snapshot_epoch={to}")),
        "the restarted runner did not read the resync's snapshot at {to}: {}",
        tail(&run.log_text())
    );
    untorn_then_stopped(
        &stop,
        checker,
        &format!("four tables from the later snapshot at {epoch}, resynced at {to}"),
        [&mut run, &mut capture],
    );
}

/// A job of several tables gains a table of its capture (issue 41.1): pgbench's accounts, tellers
/// and branches captured into one job under `consistency = "epoch"`; then, while pgbench writes,
/// pgbench_history is appended to the capture's tables and to the job's and both are restarted.
/// The capture adds it to its publication and takes a snapshot holding it; the job waits for that
/// snapshot, moves to it and loads all four tables again in a new generation. A reader of the
/// replica finds the three sums equal at every published sample (no history table) until that
/// generation is published, then the four; every table equals its source.
#[test]
fn a_job_of_several_tables_gains_a_table_of_its_capture_and_keeps_the_sums_equal() {
    let _serial = serial();
    let (source, f) = four_tables_source(&format!("cap-grow-{}", stamp() % 1_000_000), 1);
    let url = source.url.clone();
    let three = "pgbench_accounts = \"accounts\", pgbench_tellers = \"tellers\", pgbench_branches = \"branches\"";
    let captured =
        "\"public.pgbench_accounts\", \"public.pgbench_tellers\", \"public.pgbench_branches\"";
    tables_config(&f, &url, three, &format!("tables = [{captured}]"), "");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let checker = pgbench_checker(Replica::Sqlite(f.db()), f.name.clone(), stop.clone());
    let mut capture = spawn_capture(&f, "c1");
    let mut run = f.spawn_run("a", &[]);
    run.wait_for("partitions assigned", MIN);
    let mut bench = pgbench_run_with(&f, &url, 100, 5, &["-n"]);
    wait_child(&mut bench, MIN);
    let report = verify_source_eventually(&f, MIN);
    assert!(
        report.contains("table accounts: 10000 rows compared"),
        "{report}"
    );
    // The table appended to both lists, under load.
    let mut bench = pgbench_run_with(&f, &url, 100, 20, &["-n"]);
    for r in [&mut run, &mut capture] {
        r.signal("TERM");
        assert!(r.wait_exit(MIN).success(), "{}", tail(&r.log_text()));
    }
    let text = std::fs::read_to_string(&f.config).unwrap();
    let grown = text
        .replacen(three, &format!("{three}, pgbench_history = \"history\""), 1)
        .replacen(
            captured,
            &format!("{captured}, \"public.pgbench_history\""),
            1,
        );
    assert_ne!(grown, text);
    std::fs::write(&f.config, grown).unwrap();
    // The publication is named in the configuration: the user adds the table to it.
    let id = f.name.replace('-', "_");
    psql(
        &url,
        &format!("ALTER PUBLICATION kb_{id} ADD TABLE pgbench_history"),
    );
    let mut capture = spawn_capture(&f, "c2");
    let mut run = f.spawn_run("b", &[]);
    run.wait_for("a snapshot holding the job's added table is published", MIN);
    run.wait_for("the job's tables grew", MIN);
    run.wait_for("partitions assigned", MIN);
    wait_child(&mut bench, MIN);
    let report = verify_source_eventually(&f, MIN);
    for table in ["accounts", "tellers", "branches", "history"] {
        assert!(
            report.contains(&format!("table {table}: ")),
            "{table}: {report}"
        );
    }
    let history: i64 = rusqlite::Connection::open(f.db())
        .unwrap()
        .query_row("SELECT COUNT(*) FROM history", [], |r| r.get(0))
        .unwrap();
    assert!(history >= 100, "pgbench wrote history rows: {history}");
    untorn_then_stopped(
        &stop,
        checker,
        "three tables, then four",
        [&mut run, &mut capture],
    );
}

/// Stops a [`pgbench_checker`] and asserts what it saw: no torn sample, no published epoch going
/// back, enough samples to prove it; then stops `runners` (SIGTERM, exit 0).
fn untorn_then_stopped(
    stop: &std::sync::atomic::AtomicBool,
    checker: std::thread::JoinHandle<Sums>,
    what: &str,
    runners: [&mut Runner; 2],
) {
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let sums = checker.join().unwrap();
    println!(
        "{what}: {} published samples at {} epochs, {} torn, {} back",
        sums.published,
        sums.epochs.len(),
        sums.torn,
        sums.went_back
    );
    assert_eq!(sums.torn, 0, "torn samples: {:?}", sums.first_torn);
    assert_eq!(sums.went_back, 0, "the published epoch went back");
    assert!(
        sums.published >= 200 && sums.epochs.len() >= 5,
        "too few observations to prove anything: {sums:?}"
    );
    for r in runners {
        r.signal("TERM");
        assert!(r.wait_exit(MIN).success(), "{}", tail(&r.log_text()));
    }
}

/// Damages the SQLite replica of the four pgbench tables by hand, in one transaction that keeps
/// pgbench's invariant (so a reader's samples stay untorn), also under the changes the runner
/// goes on applying (each an upsert of the whole new row): the rows of vnode 7 of `accounts` with
/// a zero balance deleted (most of the vnode; a later change to one puts it back with a balance of
/// exactly its delta); the rows of vnode 9 given another row's content (their balances kept);
/// three rows the source never had (keys of vnode 11 with a trailing zero byte, balance 0). An
/// earlier version emptied vnode 7 and moved its balance onto a row of vnode 8: a later change to
/// either put a balance back twice or lost it, and the samples tore (found by CI).
/// `kafka-backfill resync --within-secs 60` of `f`'s job, which must succeed: what it said, and
/// the epoch of the snapshot it moved the job to.
pub(crate) fn resync_command(f: &Fixture) -> (String, u64) {
    let resync = Command::new(BIN)
        .args(["resync", "--within-secs", "60", "--config"])
        .arg(&f.config)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&resync.stdout).to_string();
    assert!(
        resync.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&resync.stderr)
    );
    let to: u64 = said
        .split("to the one at epoch ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no new epoch in {said}"));
    (said, to)
}

fn damage_pgbench_replica(db: &std::path::Path) {
    let c = rusqlite::Connection::open(db).unwrap();
    c.busy_timeout(Duration::from_secs(10)).unwrap();
    c.execute_batch(
        "BEGIN IMMEDIATE;
         DELETE FROM accounts WHERE _kb_vnode = 7 AND abalance = 0;
         UPDATE accounts SET _kb_row = (SELECT _kb_row FROM accounts WHERE _kb_vnode = 10 ORDER BY _kb_key LIMIT 1) WHERE _kb_vnode = 9;
         CREATE TEMP TABLE extra AS SELECT * FROM accounts WHERE _kb_vnode = 11 ORDER BY _kb_key LIMIT 3;
         UPDATE extra SET _kb_key = _kb_key || x'00', abalance = 0;
         INSERT INTO accounts SELECT * FROM extra;
         COMMIT;",
    )
    .unwrap();
}

fn four_pgbench_tables_in_one_job(postgres_store: bool, policy: &str) {
    let _serial = serial();
    // The PostgreSQL store outlives the run: a job and tables of their own each time.
    // Named by store too: the two variants may start in the same millisecond on two lanes.
    let store = if postgres_store { "pg" } else { "sqlite" };
    let name = &format!("cap-one-job-{store}-{}", stamp() % 1_000_000);
    let (source, f) = four_tables_source(name, 2);
    let url = source.url.clone();
    f.set_recreation_policy(policy);
    let suffix = if postgres_store {
        f.use_postgres(&pg_url());
        format!("_{}", name.replace('-', "_"))
    } else {
        String::new()
    };
    four_tables_config(&f, &url, &suffix, "");
    let check = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(&f.config)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let replica = if postgres_store {
        Replica::Postgres(pg_url(), suffix.clone())
    } else {
        Replica::Sqlite(f.db())
    };
    let checker = pgbench_checker(replica, f.name.clone(), stop.clone());
    let http = format!("127.0.0.1:{}", free_port());
    // Mid-load, pgbench_history truncated and its sum put back as one row, in one transaction
    // holding the table's lock: the source keeps pgbench's invariant, so the replica must too at
    // every published sample, the truncation published with the rest of its epoch. Then a
    // column added to pgbench_accounts (a nullable one with a constant default: a schema version
    // of that table alone), which the job of the four tables follows at the version's epoch.
    let during = || {
        psql(
            &url,
            "BEGIN; LOCK TABLE pgbench_history IN ACCESS EXCLUSIVE MODE;              CREATE TEMP TABLE s AS SELECT coalesce(sum(delta), 0) AS d FROM pgbench_history;              TRUNCATE pgbench_history;              INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) SELECT 1, 1, 1, d, now() FROM s;              COMMIT",
        );
        psql(
            &url,
            "ALTER TABLE pgbench_accounts ADD COLUMN note text DEFAULT 'x'",
        );
        psql(
            &url,
            "UPDATE pgbench_accounts SET note = 'n' || aid WHERE aid % 97 = 0",
        );
    };
    let [mut capture, mut a, mut b] =
        capture_pgbench_with_a_join(&f, &url, (100, 20), 10, &http, &during);
    let report = verify_source_eventually(&f, MIN);
    for (table, rows) in [("accounts", 10_000), ("tellers", 10), ("branches", 1)] {
        assert!(
            report.contains(&format!("table {table}{suffix}: {rows} rows compared")),
            "{report}"
        );
    }
    // The version is the accounts table's alone, recorded under `<job>/<table>`.
    if !postgres_store {
        let recorded: Vec<Vec<String>> = f.sql("SELECT job FROM kb_schema_history");
        assert_eq!(recorded, vec![vec![format!("{}/accounts", f.name)]]);
        let note: Vec<Vec<i64>> =
            f.sql("SELECT count(*) FROM accounts WHERE note = 'x' OR note LIKE 'n%'");
        assert_eq!(note[0][0], 10_000);
    }
    // Per table in /status (each table's snapshot done on every vnode, read from the store) and
    // in /metrics.
    let names: Vec<String> = ["accounts", "tellers", "branches", "history"]
        .iter()
        .map(|t| format!("{t}{suffix}"))
        .collect();
    let deadline = std::time::Instant::now() + MIN;
    let tables = loop {
        let s = status(&http);
        let tables = s["jobs"][0]["tables"].clone();
        let done = tables
            .as_array()
            .is_some_and(|ts| ts.len() == 4 && ts.iter().all(|t| t["snapshot_vnodes_done"] == 64));
        if done {
            break tables;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "/status never showed the four tables done: {s}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut listed: Vec<String> = tables
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["table"].as_str().unwrap().to_string())
        .collect();
    listed.sort();
    let mut expected = names.clone();
    expected.sort();
    assert_eq!(listed, expected, "{tables}");
    let (_, metrics) = http_get(&format!("http://{http}/metrics"));
    for name in &names {
        assert!(
            metrics.contains(&format!(
                "kafka_backfill_table_snapshot_vnodes_done{{job_name=\"{}\",table=\"{name}\"}} 64",
                f.name
            )),
            "no per-table gauge of {name} in /metrics"
        );
    }
    let changes: u64 = tables
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["log_store_changes"].as_u64().unwrap())
        .sum();
    assert!(
        changes > 0,
        "process a applied no change of any table: {tables}"
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let sums = checker.join().unwrap();
    let history: u64 = psql(&url, "SELECT count(*) FROM pgbench_history")
        .parse()
        .unwrap();
    let both = format!("{}{}", a.log_text(), b.log_text());
    let (invariant_errors, rescheduled) = (
        both.matches("should not update vnode bitmap during consuming log store")
            .count(),
        both.matches("during log store: rescheduled").count(),
    );
    println!(
        "one job of four tables ({}, {policy}): {} published samples at {} epochs, {} torn, {} back; {history} history rows; invariant errors (recreations) {invariant_errors}, rescheduled {rescheduled}; {report}",
        if postgres_store { "postgres" } else { "sqlite" },
        sums.published,
        sums.epochs.len(),
        sums.torn,
        sums.went_back,
    );
    assert_eq!(sums.torn, 0, "torn samples: {:?}", sums.first_torn);
    assert_eq!(sums.went_back, 0, "the published epoch went back");
    if policy == "reschedule" {
        assert_eq!(invariant_errors, 0, "reschedule absorbs the join");
    }
    assert!(
        sums.published >= 1_000 && sums.epochs.len() >= 20,
        "too few observations to prove anything: {sums:?}"
    );
    assert!(history > 500, "pgbench wrote {history} history rows");
    for r in [&mut capture, &mut a, &mut b] {
        r.signal("TERM");
        assert!(r.wait_exit(MIN).success(), "{}", tail(&r.log_text()));
    }
}

/// Tables added to a running capture (docs/CAPTURE.md "Adding a table"): pgbench writes
/// throughout; the capture of `pgbench_accounts` alone is stopped, `tables` gains
/// `pgbench_branches` and `pgbench_tellers`, and the restarted capture adds them to its own
/// publication, announces both at one checkpoint barrier before any of their changes and takes a
/// snapshot holding them. The running job of accounts passes over their changes, untouched, and
/// follows a column added to its table afterwards (a version the log, now of several tables,
/// names); jobs of the new tables start from that snapshot. All three equal the source, the log
/// keeps its contract, a kill -9 of the capture afterwards resumes with the tables recorded, and a
/// list changed other than at its end is refused.
#[test]
fn tables_added_to_a_running_capture_get_a_snapshot_and_jobs_of_their_own() {
    let _serial = serial();
    let source = database("cap-add");
    let url = source.url.clone();
    pgbench_init_four(&url);
    let f = Fixture::new("cap-add", 1, "vnode_count = 64\nmax_rows_per_second = 0");
    let text = std::fs::read_to_string(&f.config).unwrap();
    let at = text.find("[[jobs]]").unwrap();
    let (head, job) = text.split_at(at);
    let job_of = |source_table: &str, store_table: &str, i: usize| {
        job_of_table(&f, job, source_table, store_table, i)
    };
    // No `publication`: the capture's own, which follows `tables`.
    let capture_of = |tables: &str| {
        format!(
            "[jobs.capture]\nsource_url = \"{url}\"\ntables = [{tables}]\nbarrier_interval_ms = 100\ncheckpoint_interval_ms = 300\n"
        )
    };
    // A one-table capture: its first manifest names no table, its job names none either.
    let one = "\"public.pgbench_accounts\"";
    let named = job_of("pgbench_accounts", "accounts", 0);
    let accounts = named.replacen("table = \"pgbench_accounts\"\n", "", 1);
    std::fs::write(&f.config, format!("{head}{accounts}{}", capture_of(one))).unwrap();
    let mut capture = spawn_capture(&f, "c1");
    capture.wait_for("snapshot copied", MIN);
    let mut bench = pgbench_run(&f, &url, 100, 20);
    let mut run = f.spawn_run("r", &[]);
    capture.wait_for_count("capture checkpoint committed", 6, MIN);
    stop_capture(&mut capture);
    let three = format!("{one}, \"public.pgbench_branches\", \"public.pgbench_tellers\"");
    // Once the capture has several tables, its job names the one it materialises.
    let after = format!(
        "{head}{named}{}{}{}",
        capture_of(&three),
        job_of("pgbench_branches", "branches", 1),
        job_of("pgbench_tellers", "tellers", 2)
    );
    std::fs::write(&f.config, &after).unwrap();
    let mut capture = spawn_capture(&f, "c2");
    capture.wait_for("tables join the capture", MIN);
    capture.wait_for_count("schema version announced", 2, MIN);
    // The capture held (SIGSTOP) once both tables are announced, before the snapshot holding them
    // is published (unless its copy was quicker): jobs of the new tables started now wait for it.
    capture.signal("STOP");
    let early = !capture
        .log_text()
        .contains("snapshot of the running capture published");
    let added_jobs = format!(
        "{head}{}{}",
        job_of("pgbench_branches", "branches", 1),
        job_of("pgbench_tellers", "tellers", 2)
    );
    let mut added = spawn_run_of(&f, &added_jobs, "t");
    released_after_the_wait(&mut capture, &mut added, early, "pgbench_branches");
    capture.wait_for("snapshot of the running capture published", MIN);
    let publication = format!("kb_{}_0", f.name.replace('-', "_"));
    assert_eq!(
        psql(
            &url,
            &format!("SELECT count(*) FROM pg_publication_tables WHERE pubname = '{publication}'")
        ),
        "3"
    );
    added.wait_for("reading a later snapshot of the capture", MIN);
    // A column of the first table, once the log has several: its version names the table, and
    // the job of the one-table manifest follows it.
    psql(&url, "ALTER TABLE pgbench_accounts ADD COLUMN note text");
    psql(
        &url,
        "UPDATE pgbench_accounts SET note = 'n' || aid WHERE aid % 13 = 0",
    );
    capture.wait_for("schema version announced", MIN);
    wait_child(&mut bench, MIN);
    for (i, rows) in [(0, 10_000), (1, 1), (2, 10)] {
        let job = format!("{}-{i}", f.name);
        let report = verify_job_eventually(&f, Some(&job), MIN);
        assert!(
            report.contains(&format!("{rows} rows compared")),
            "{job}: {report}"
        );
    }
    let text = run.log_text();
    assert!(
        !text.contains("job stopped") && !text.contains("recreat"),
        "the running job was untouched: {}",
        tail(&text)
    );
    capture.signal("KILL");
    assert!(!capture.wait_exit(MIN).success());
    let mut capture = spawn_capture(&f, "c3");
    capture.wait_for("capture checkpoint committed", MIN);
    assert!(!capture.log_text().contains("tables join the capture"));
    psql(
        &url,
        "UPDATE pgbench_tellers SET tbalance = tbalance + 7 WHERE tid % 2 = 0",
    );
    let report = verify_job_eventually(&f, Some(&format!("{}-2", f.name)), MIN);
    assert!(report.contains("10 rows compared"), "{report}");
    let log = check_log(&f);
    assert!(log.contains(" 0 violations"), "{log}");
    for r in [&mut run, &mut added] {
        r.signal("TERM");
        assert!(r.wait_exit(MIN).success());
    }
    stop_capture(&mut capture);
    // The last table left out of the list leaves the log (docs/CAPTURE.md "Removing a table"):
    // the state record names it and the epoch from which the log has none of its changes, the
    // capture's own publication drops it once that record is committed, and the other tables go
    // on exactly.
    let two = "\"public.pgbench_accounts\", \"public.pgbench_branches\"";
    let dropped = after.replace(&three, two);
    assert_ne!(dropped, after);
    std::fs::write(&f.config, &dropped).unwrap();
    let mut capture = spawn_capture(&f, "c4");
    capture.wait_for("tables removed from the capture", MIN);
    capture.wait_for("table removed from the capture's publication", MIN);
    assert_eq!(
        psql(
            &url,
            &format!("SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_publication_tables WHERE pubname = '{publication}'")
        ),
        "pgbench_accounts,pgbench_branches"
    );
    let http = format!("127.0.0.1:{}", free_port());
    let mut both = spawn_run_of(
        &f,
        &added_jobs.replacen("listen = \"\"", &format!("listen = \"{http}\""), 1),
        "t2",
    );
    let balance: i64 = psql(&url, "SELECT tbalance FROM pgbench_tellers WHERE tid = 1")
        .parse()
        .unwrap();
    // One source transaction changes the removed table and a captured one.
    psql(
        &url,
        "BEGIN; UPDATE pgbench_tellers SET tbalance = tbalance + 11 WHERE tid = 1; UPDATE pgbench_branches SET bbalance = bbalance + 5; COMMIT",
    );
    let (branches, tellers) = (format!("{}-1", f.name), format!("{}-2", f.name));
    let report = verify_job_eventually(&f, Some(&branches), MIN);
    assert!(report.contains("1 rows compared"), "{report}");
    // Once the job of the removed table has committed every epoch the tellers' job has (the
    // transaction's included), its replica still has the branch as it was: the log has no change
    // of it after the removal.
    wait_until_behind_none(&f, &tellers, &branches, &both);
    let replica: Vec<Vec<i64>> = f.sql("SELECT tbalance FROM tellers WHERE tid = 1");
    assert_eq!(
        replica,
        vec![vec![balance]],
        "the removed table's change reached its replica"
    );
    // The removal is committed: a restart after a kill -9 resumes without it, removing nothing.
    capture.signal("KILL");
    assert!(!capture.wait_exit(MIN).success());
    let mut capture = spawn_capture(&f, "c5");
    capture.wait_for("capture checkpoint committed", MIN);
    assert!(!capture
        .log_text()
        .contains("tables removed from the capture"));
    psql(&url, "UPDATE pgbench_branches SET bbalance = bbalance - 5");
    let report = verify_job_eventually(&f, Some(&branches), MIN);
    assert!(report.contains("1 rows compared"), "{report}");
    let log = check_log(&f);
    assert!(log.contains(" 0 violations"), "{log}");
    // A job of the removed table is told so. `resync` refuses before asking for a snapshot or
    // moving the job (which could not open a snapshot without its table); the job keeps its
    // snapshot. A job of it created once a later snapshot is published fails at its start naming
    // the removal, instead of waiting ten minutes for a snapshot holding the table.
    let snapshot_epoch = |job: &str| -> i64 {
        f.sql::<i64>(&format!(
            "SELECT snapshot_epoch FROM kb_jobs WHERE job = '{job}'"
        ))[0][0]
    };
    let before = snapshot_epoch(&tellers);
    let resync = Command::new(BIN)
        .args([
            "resync",
            "--within-secs",
            "5",
            "--job",
            &tellers,
            "--config",
        ])
        .arg(&f.config)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&resync.stderr);
    assert!(!resync.status.success(), "{said}");
    assert!(
        said.contains("its table pgbench_tellers was removed from its capture at epoch")
            && said.contains("nothing was asked or moved"),
        "{said}"
    );
    assert_eq!(snapshot_epoch(&tellers), before);
    // A job of another table of the capture's log (no [jobs.capture] section of its own) is
    // resynced through the capture its topic's state record names: its replica, damaged by hand,
    // comes back equal to the source.
    let c = rusqlite::Connection::open(f.db()).unwrap();
    c.busy_timeout(Duration::from_secs(10)).unwrap();
    c.execute_batch("UPDATE branches SET bbalance = bbalance + 1000")
        .unwrap();
    drop(c);
    let resync = Command::new(BIN)
        .args([
            "resync",
            "--within-secs",
            "60",
            "--job",
            &branches,
            "--config",
        ])
        .arg(&f.config)
        .output()
        .unwrap();
    assert!(
        resync.status.success(),
        "{}",
        String::from_utf8_lossy(&resync.stderr)
    );
    both.wait_for("the job was moved to a newer snapshot of its capture", MIN);
    let report = verify_job_eventually(&f, Some(&branches), MIN);
    assert!(report.contains("1 rows compared"), "{report}");
    // Counted apart from recreations (whose alert reads a loop).
    let (_, metrics) = http_get(&format!("http://{http}/metrics"));
    for (job, moves) in [(&branches, 1), (&tellers, 0)] {
        let series = format!("kafka_backfill_snapshot_moves_total{{job_name=\"{job}\"}} {moves}");
        assert!(metrics.contains(&series), "no {series} in:\n{metrics}");
    }
    let late = format!("{head}{}", job_of("pgbench_tellers", "tellers_late", 3));
    let mut refused = spawn_run_of(&f, &late, "t3");
    refused.wait_for(
        "table pgbench_tellers was removed from its capture at epoch",
        MIN,
    );
    assert!(
        !refused.log_text().contains("waiting for a snapshot"),
        "{}",
        tail(&refused.log_text())
    );
    refused.signal("TERM");
    refused.wait_exit(MIN);
    both.signal("TERM");
    assert!(both.wait_exit(MIN).success());
    stop_capture(&mut capture);
    // Refused, each naming why: the removed table listed again, another added after the
    // removal (it would take the removed table's place in the log), the first table removed, the
    // list reordered.
    psql(
        &url,
        "CREATE TABLE kb_extra (id int PRIMARY KEY); ALTER TABLE kb_extra REPLICA IDENTITY FULL",
    );
    for (i, (tables, why)) in [
        (
            format!("{two}, \"public.pgbench_tellers\""),
            "cannot join: the capture removed public.pgbench_tellers",
        ),
        (
            format!("{two}, \"public.kb_extra\""),
            "cannot join: the capture removed public.pgbench_tellers",
        ),
        (
            "\"public.pgbench_branches\", \"public.kb_extra\"".to_string(),
            "is the log's first table, which cannot be removed",
        ),
        (
            "\"public.pgbench_branches\", \"public.pgbench_accounts\"".to_string(),
            "tables may only be added at the end of [jobs.capture] tables",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        // The capture's own job materialises a table it captures.
        let config = dropped.replace(two, &tables);
        let config = match tables.contains("pgbench_accounts") {
            true => config,
            false => config.replacen(
                "table = \"pgbench_accounts\"\n",
                "table = \"pgbench_branches\"\n",
                1,
            ),
        };
        std::fs::write(&f.config, config).unwrap();
        let mut refused = spawn_capture(&f, &format!("c6-{i}"));
        assert!(!refused.wait_exit(MIN).success());
        let text = refused.log_text();
        assert!(text.contains(why), "{tables}: {}", tail(&text));
    }
}
