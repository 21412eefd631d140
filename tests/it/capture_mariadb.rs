//! `kafka-backfill capture` from the real MariaDB (`scripts/mariadb.sh`, binlog on, ROW, FULL) and
//! the real broker, proven against MariaDB itself: every mapped type through the snapshot and the
//! binlog, key moves, a rolled-back transaction, a binlog rotation, and a `kill -9` of the capture
//! while a large transaction streams; at the end `verify --against-source` finds the store equal,
//! byte for byte, to what the capture's mapping makes of the table as MariaDB has it, and
//! `check-log` finds the topic a valid log store.

use crate::capture_e2e::{
    assert_exact, capture_fixture, capture_fixture_of, four_tables_config, job_of_table,
    pgbench_checker, resync_command, spawn_capture, stop_capture, verify_against_source,
    verify_job_eventually, wait_until_behind_none, Replica, MIN,
};
use crate::capture_snapshots::{published, snapshot_command, start_job_of, start_offsets};
use crate::support::*;

use std::process::{Child, Command};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// One MariaDB test at a time: one of them restarts the server the others use, another purges
/// its binlogs (docs/CAPTURE.md's quick start takes it too).
pub(crate) fn mariadb_lane() -> MutexGuard<'static, ()> {
    static LANE: Mutex<()> = Mutex::new(());
    LANE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The running MariaDB's admin URL (`scripts/mariadb.sh start`, idempotent).
fn mariadb_url() -> String {
    static U: OnceLock<String> = OnceLock::new();
    U.get_or_init(|| {
        let out = Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/mariadb.sh"))
            .arg("start")
            .output()
            .expect("scripts/mariadb.sh");
        assert!(
            out.status.success(),
            "scripts/mariadb.sh start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    })
    .clone()
}

/// The test server's port.
fn mariadb_port() -> String {
    let url = mariadb_url();
    url.rsplit_once(':')
        .unwrap()
        .1
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

/// The `mariadb` client, as root on the test server.
fn mariadb_client() -> Command {
    let mut c = Command::new("mariadb");
    c.args([
        "--no-defaults",
        "-h",
        "127.0.0.1",
        "-P",
        &mariadb_port(),
        "-u",
        "root",
    ]);
    c
}

/// A job `name` capturing table `t` of `url` into SQLite at full speed: its capture, started and
/// past its first checkpoint, and its `run`.
fn pipeline(name: &str, url: &str) -> (Fixture, Runner, Runner) {
    pipeline_of(capture_fixture(name, url, "t"))
}

/// [`pipeline`] of the fixture `f`.
fn pipeline_of(f: Fixture) -> (Fixture, Runner, Runner) {
    f.edit_config("max_rows_per_second = 2000", "max_rows_per_second = 0");
    let mut capture = spawn_capture(&f, "c1");
    capture.wait_for("capture checkpoint committed", MIN);
    let run = f.spawn_run("r1", &[]);
    (f, capture, run)
}

/// Runs `sql` in database `db` as root.
fn sql(db: &str, sql: &str) -> String {
    let out = mariadb_client()
        .args(["-N", "-B"])
        .arg(db)
        .args(["-e", sql])
        .output()
        .expect("mariadb");
    assert!(
        out.status.success(),
        "mariadb {sql:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A fresh database for one test, dropped when it ends.
struct Db {
    name: String,
    url: String,
}

impl Drop for Db {
    fn drop(&mut self) {
        // KB_KEEP_SOURCE=1 keeps it for a look after a failure.
        if std::env::var_os("KB_KEEP_SOURCE").is_some() {
            return;
        }
        let _ = Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/mariadb.sh"))
            .args(["sql", &format!("DROP DATABASE IF EXISTS {}", self.name)])
            .status();
    }
}

fn database(name: &str) -> Db {
    let admin = mariadb_url();
    let db = format!("cap_{}_{}", name.replace('-', "_"), stamp() % 1_000_000_000);
    sql("kafka_backfill", &format!("CREATE DATABASE {db}"));
    let url = admin
        .rsplit_once('/')
        .map(|(base, _)| format!("{base}/{db}"))
        .unwrap();
    Db { name: db, url }
}

#[test]
fn mariadb_types_key_moves_a_rotation_and_a_kill_9_stay_exact() {
    let _serial = serial();
    let _mariadb = mariadb_lane();
    let db = database("my-mix");
    sql(
        &db.name,
        "CREATE TABLE t (id bigint PRIMARY KEY, ti tinyint, tu tinyint unsigned, si smallint, mi mediumint, \
         i int, iu int unsigned, bu bigint unsigned, d decimal(12,3), f float, dbl double, \
         vc varchar(40), ch char(4), tx text, vb varbinary(16), bl blob, day date, dt datetime(6), \
         ts timestamp(3) NULL, tm time(6), yr year, e enum('sad','ok','happy'), st set('a','it''s','d'), \
         bt bit(12), j json, nn int NULL)",
    );
    let row = |id: i64| {
        format!(
            "({id}, -{t}, {t}, -{id}, {id}, -{id}, 4000000000, 18446744073709551615, -{id}.125, 1.5, -2.25, \
             'v{id} é', 'ab', 'tab\\there \"q\"', X'00ff{id:04x}', REPEAT('x', {id}), '2024-02-29', \
             '1969-12-31 23:59:59.999999', '2024-01-01 05:30:00.250', '-838:59:59.000000', 2024, 'happy', 'a,d', \
             b'101010101010', '{{\"k\": [1, 2]}}', NULL)",
            t = id % 100
        )
    };
    let values: Vec<String> = (1..=200).map(row).collect();
    sql(
        &db.name,
        &format!("INSERT INTO t VALUES {}", values.join(",")),
    );
    // Into the PostgreSQL store (the other MariaDB tests write SQLite): every mapped type through
    // both. The store outlives the run: a job and a table of its own each time.
    let f = capture_fixture(&format!("cap-my-mix-{}", stamp() % 1_000_000), &db.url, "t");
    f.edit_config("max_rows_per_second = 2000", "max_rows_per_second = 0");
    f.use_postgres(&pg_url());
    let mut capture = spawn_capture(&f, "c1");
    capture.wait_for("capture checkpoint committed", MIN);
    let values: Vec<String> = (201..=400).map(row).collect();
    sql(
        &db.name,
        &format!("INSERT INTO t VALUES {}", values.join(",")),
    );
    sql(
        &db.name,
        "UPDATE t SET i = i + 1, e = 'sad', st = 'it''s,d' WHERE id % 3 = 0",
    );
    sql(
        &db.name,
        "UPDATE t SET tx = NULL, ts = NULL, nn = 7 WHERE id % 7 = 0",
    );
    sql(&db.name, "UPDATE t SET id = id + 100000 WHERE id % 11 = 0");
    // A binlog rotation between two transactions.
    sql(&db.name, "FLUSH BINARY LOGS");
    sql(
        &db.name,
        "START TRANSACTION; DELETE FROM t WHERE id % 5 = 0; UPDATE t SET vc = 'in a txn' WHERE id % 13 = 0; COMMIT; \
         START TRANSACTION; DELETE FROM t; ROLLBACK",
    );
    let mut run = f.spawn_run("r1", &[]);
    // TRUNCATE (a statement in the binlog, not row events) carried, then rows put back.
    sql(
        &db.name,
        "CREATE TABLE keep AS SELECT * FROM t WHERE id % 2 = 0",
    );
    sql(&db.name, "TRUNCATE TABLE t");
    sql(&db.name, "INSERT INTO t SELECT * FROM keep");
    // A transaction of 50,000 rows, and the capture killed while it streams.
    sql(
        &db.name,
        "INSERT INTO t (id, i, vc) SELECT 1000000 + seq, seq, 'bulk' FROM seq_1_to_50000",
    );
    capture.signal("KILL");
    capture.wait_exit(MIN);
    sql(&db.name, "UPDATE t SET bl = 'short now' WHERE id % 17 = 0");
    sql(
        &db.name,
        "DELETE FROM t WHERE id BETWEEN 1000000 AND 1024999",
    );
    let mut capture = spawn_capture(&f, "c2");
    capture.wait_for("capture checkpoint committed", MIN);
    let rows: u64 = sql(&db.name, "SELECT count(*) FROM t").parse().unwrap();
    assert!(rows > 25_000, "{rows}");
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

/// Columns added at the end of the tables of a MariaDB capture of two tables, nullable without a
/// default, are new row-schema versions of each as in PostgreSQL's capture (a statement in the
/// binlog, followed by reading the catalog), and the job of one of them passes over the other's
/// changes and versions; a statement that leaves the columns as they were (an index) changes nothing; a
/// `kill -9` between two versions resumes with the one in force; the replica ends equal to the
/// source with the new columns; a nullable column added with a literal default is a version whose
/// union holds the default (across a kill -9), and one with an expression as its default stops the
/// capture naming it, and its restart stops for the same reason.
#[test]
fn mariadb_columns_added_are_schema_versions_and_a_default_stops_the_capture() {
    let _serial = serial();
    let _mariadb = mariadb_lane();
    let db = database("my-cols");
    sql(
        &db.name,
        "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL); INSERT INTO t SELECT seq, seq FROM seq_1_to_1000;          CREATE TABLE u (id int PRIMARY KEY, w int NOT NULL); INSERT INTO u SELECT seq, seq FROM seq_1_to_100",
    );
    // Two tables into one log; the job materialises t, and passes over u's changes and versions.
    let (f, mut capture, mut run) = pipeline_of(capture_fixture_of(
        "cap-my-cols",
        &db.url,
        "tables = [\"t\", \"u\"]",
        Some("t"),
    ));
    sql(
        &db.name,
        "ALTER TABLE t ADD COLUMN note varchar(20) NULL;          UPDATE t SET note = CONCAT('n', id) WHERE id % 7 = 0;          ALTER TABLE t ADD INDEX iv (v); INSERT INTO t (id, v) VALUES (5000, 1);          ALTER TABLE u ADD COLUMN extra int NULL; UPDATE u SET extra = id, w = w + 1",
    );
    capture.wait_for_count("schema version announced", 2, MIN);
    capture.signal("KILL");
    capture.wait_exit(MIN);
    let mut capture = spawn_capture(&f, "c2");
    capture.wait_for("capture checkpoint committed", MIN);
    sql(
        &db.name,
        "ALTER TABLE t ADD COLUMN tier bigint unsigned;          UPDATE t SET tier = id * 1099511627776 WHERE id % 5 = 0",
    );
    // The next statement once the capture has read the catalog after this one (a capture behind
    // both reads the second's columns at the first, and its rows then stop it: docs/CAPTURE.md).
    crate::schema_changes_e2e::wait_for_versions(&f, &capture, 3);
    sql(
        &db.name,
        "ALTER TABLE t ADD COLUMN active tinyint NOT NULL DEFAULT 1, ADD COLUMN label varchar(10) NOT NULL DEFAULT 'x y';          UPDATE t SET active = 0, label = 'z' WHERE id % 11 = 0",
    );
    crate::schema_changes_e2e::wait_for_versions(&f, &capture, 4);
    // Across a restart past both statements: the version in force declares the defaults the
    // catalog's mapping lacks. (A restart before them reads the catalog with both at the first:
    // its rows then have fewer columns, which stops the capture; docs/CAPTURE.md.)
    let capture = killed_after_commits(&f, capture, 3, "c2b");
    assert_exact(&f, 1001, MIN);
    let log = f.check_log();
    // t's three, u's two.
    assert!(log.contains("6 row-schema versions: 0 violations"), "{log}");
    let columns: Vec<Vec<String>> =
        f.sql("SELECT name FROM pragma_table_info('accounts') ORDER BY cid");
    let columns: Vec<&str> = columns
        .iter()
        .map(|c| c[0].as_str())
        .filter(|c| !c.starts_with("_kb_"))
        .collect();
    assert_eq!(columns, ["id", "v", "note", "tier", "active", "label"]);
    let older: Vec<Vec<i64>> =
        f.sql("SELECT count(*) FROM accounts WHERE active = 1 AND label = 'x y'");
    assert_eq!(
        older[0][0],
        1001 - 1000 / 11,
        "older rows hold the defaults"
    );
    // A nullable column with a literal default: its version's union is `[int, "null"]`, the
    // default in the first branch, so the older rows take it; NULLs and other values after it,
    // across a kill -9, follow.
    sql(
        &db.name,
        "ALTER TABLE t ADD COLUMN flag int DEFAULT 1; UPDATE t SET flag = NULL WHERE id % 5 = 0",
    );
    crate::schema_changes_e2e::wait_for_versions(&f, &capture, 5);
    let mut capture = killed_after_commits(&f, capture, 2, "c2c");
    sql(&db.name, "UPDATE t SET flag = 2 WHERE id % 3 = 0");
    assert_exact(&f, 1001, MIN);
    let flags: Vec<Vec<i64>> = f.sql(
        "SELECT count(*) FILTER (WHERE flag = 1), count(*) FILTER (WHERE flag IS NULL), count(*) FILTER (WHERE flag = 2) FROM accounts",
    );
    // Rows 1..=1000 and 5000 (a multiple of 5).
    let threes = 1000 / 3;
    let fives_not_threes = 1000 / 5 - 1000 / 15 + 1;
    assert_eq!(
        flags[0],
        [1001 - threes - fives_not_threes, fives_not_threes, threes],
        "older rows hold the default"
    );
    // A default that is an expression: the rows already there hold its value at the ALTER.
    sql(
        &db.name,
        "ALTER TABLE t ADD COLUMN seen datetime DEFAULT current_timestamp(); UPDATE t SET v = 2 WHERE id = 1",
    );
    assert!(!capture.wait_exit(MIN).success());
    let reason = "column seen was added with the default current_timestamp(), an expression";
    assert!(
        capture.log_text().contains(reason),
        "{}",
        tail(&capture.log_text())
    );
    let mut again = spawn_capture(&f, "c3");
    assert!(!again.wait_exit(MIN).success());
    assert!(
        again.log_text().contains(reason),
        "{}",
        tail(&again.log_text())
    );
    run.signal("TERM");
    run.wait_exit(MIN);
}

/// `capture` killed with `kill -9` once it has committed `commits` more checkpoints, and started
/// again as `prefix`; returned once the new one has committed.
fn killed_after_commits(f: &Fixture, mut capture: Runner, commits: usize, prefix: &str) -> Runner {
    let committed = capture
        .log_text()
        .matches("capture checkpoint committed")
        .count();
    capture.wait_for_count("capture checkpoint committed", committed + commits, MIN);
    capture.signal("KILL");
    capture.wait_exit(MIN);
    let mut capture = spawn_capture(f, prefix);
    capture.wait_for("capture checkpoint committed", MIN);
    capture
}

/// The server's `binlog_row_metadata` set for one test and put back when it ends.
struct RowMetadata(String);

impl RowMetadata {
    fn full() -> RowMetadata {
        let was = sql("kafka_backfill", "SELECT @@GLOBAL.binlog_row_metadata");
        sql("kafka_backfill", "SET GLOBAL binlog_row_metadata = 'FULL'");
        RowMetadata(was)
    }
}

impl Drop for RowMetadata {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/mariadb.sh"))
            .args([
                "sql",
                &format!("SET GLOBAL binlog_row_metadata = '{}'", self.0),
            ])
            .status();
    }
}

/// A second reader nobody here wrote checks the content: PyPI's mysql-replication decodes the same
/// binlog (`scripts/mariadb-second-reader.py`), replays its row events and TRUNCATE into a table
/// of its own and compares it value by value with the replica's typed columns, where
/// `verify --against-source` compares encodings the capture's own mapping made of both sides. The
/// server logs `binlog_row_metadata = FULL` here (the reader needs its column names and labels), so
/// the capture also reads row events that carry signedness and charset metadata, which the other
/// tests' default binlog does not.
#[test]
fn mariadb_a_second_reader_of_the_binlog_finds_the_replica_equal() {
    let _serial = serial();
    let _mariadb = mariadb_lane();
    let _metadata = RowMetadata::full();
    let db = database("my-second");
    // Where the reader starts: before the table exists (the server's binlog holds every other
    // test's and benchmark's changes before it).
    let from = sql("kafka_backfill", "SELECT @@gtid_binlog_pos");
    sql(
        &db.name,
        "CREATE TABLE t (id bigint PRIMARY KEY, ti tinyint, tu tinyint unsigned, iu int unsigned,          bu bigint unsigned, d decimal(12,3), f float, dbl double, vc varchar(40), l1 varchar(20) CHARACTER SET latin1,          tx text, vb varbinary(16), day date, dt datetime(6), ts timestamp(3) NULL, tm time(6), yr year,          e enum('sad','ok','happy'), st set('a','it''s','d'), bt bit(12), j json, nn int NULL);          INSERT INTO t SELECT seq, -(seq % 100), seq % 256, 4000000000 + seq, 18446744073709551615 - seq,          seq * 1.125 - 100, 1.5, -2.25 * seq, CONCAT('v', seq, ' é'), 'café', REPEAT('t', seq % 50),          UNHEX(LPAD(HEX(seq), 8, '0')), '2024-02-29' + INTERVAL seq DAY, '1969-12-31 23:59:59.999999' + INTERVAL seq SECOND,          '2024-01-01 05:30:00.250' + INTERVAL seq MINUTE, SEC_TO_TIME(seq * 37 - 5000), 1901 + seq % 200,          1 + seq % 3, seq % 8, seq % 4096, CONCAT('{\"k\": ', seq, '}'), IF(seq % 3 = 0, NULL, seq)          FROM (SELECT CAST(seq AS SIGNED) AS seq FROM seq_1_to_300) s",
    );
    let (f, mut capture, mut run) = pipeline("cap-my-second", &db.url);
    sql(
        &db.name,
        "UPDATE t SET tu = 255 - tu, iu = iu + 1, bu = bu - 7, e = 'sad', st = 'it''s,d', l1 = 'über' WHERE id % 3 = 0;          UPDATE t SET id = id + 10000, tm = '-838:59:59', ts = NULL WHERE id % 11 = 0;          DELETE FROM t WHERE id % 5 = 0;          CREATE TABLE keep AS SELECT * FROM t WHERE id % 2 = 0; TRUNCATE TABLE t; INSERT INTO t SELECT * FROM keep;          UPDATE t SET bt = b'111100001111', dbl = dbl / 3, f = 0.5 WHERE id % 7 = 0",
    );
    let rows: u64 = sql(&db.name, "SELECT count(*) FROM t").parse().unwrap();
    assert_exact(&f, rows, MIN);
    let port = mariadb_port();
    assert!(
        !from.is_empty(),
        "the server has a GTID position after CREATE DATABASE"
    );
    // Bounded: mysql-replication reconnects for ever when the server refuses its request.
    let out = Command::new("timeout")
        .args(["120", "python3"])
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/mariadb-second-reader.py"
        ))
        .args(["--port", &port, "--database", &db.name, "--table", "t"])
        .arg("--replica")
        .arg(f.db())
        .args(["--replica-table", "accounts", "--from-gtid", &from])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && text.contains(&format!("{rows} rows; replica {rows} rows; 0 differences")),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    run.signal("TERM");
    run.wait_exit(MIN);
    stop_capture(&mut capture);
}

/// What a MariaDB capture cannot carry stops it naming the table and the way out.
#[test]
fn mariadb_refusals_name_the_fix() {
    let _serial = serial();
    let _mariadb = mariadb_lane();
    let db = database("my-refuse");
    sql(&db.name, "CREATE TABLE nokey (a int)");
    let f = capture_fixture("cap-my-refuse", &db.url, "nokey");
    let out = Command::new(BIN)
        .args(["capture", "--config"])
        .arg(&f.config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(text.contains("has no primary key"), "{text}");
    // A user that may read the table but not the binlog is told the grant it needs.
    let user = db.name.replace("cap_", "kb_");
    sql(
        &db.name,
        &format!(
            "CREATE USER '{user}'@'%'; GRANT SELECT ON {}.* TO '{user}'@'%'; CREATE TABLE k (id int PRIMARY KEY)",
            db.name
        ),
    );
    let url = db.url.replacen("root@", &format!("{user}@"), 1);
    assert_ne!(url, db.url, "the URL names root: {}", db.url);
    let f = capture_fixture("cap-my-grants", &url, "k");
    let out = Command::new(BIN)
        .args(["capture", "--config"])
        .arg(&f.config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        text.contains("lacks REPLICATION SLAVE and BINLOG MONITOR")
            && text.contains("GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.*"),
        "{text}"
    );
    // Granted them, it captures; it may not list the server's replicas (REPLICATION MASTER
    // ADMIN), so its server_id goes unchecked against them, and it says so.
    sql(
        &db.name,
        &format!("GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{user}'@'%'"),
    );
    let mut capture = spawn_capture(&f, "c1");
    capture.wait_for("capture checkpoint committed", MIN);
    stop_capture(&mut capture);
    assert!(
        capture
            .log_text()
            .contains("the capture's server_id is not checked against the server's replicas"),
        "{}",
        tail(&capture.log_text())
    );
    sql(&db.name, &format!("DROP USER '{user}'@'%'"));
    // A server_id a replica of the server holds (registered, as SHOW SLAVE HOSTS lists it: here a
    // binlog reader of PyPI's mysql-replication reporting itself as a replica) is refused before
    // the capture asks for a stream, which would cut the replica off.
    let taken = 4_000_000 + std::process::id() % 100_000;
    let mut replica = Command::new("timeout")
        .args(["120", "python3", "-c"])
        .arg(format!(
            "from pymysqlreplication import BinLogStreamReader as B\n\
             s = B(connection_settings={{'host': '127.0.0.1', 'port': {}, 'user': 'root', 'passwd': ''}}, \
             server_id={taken}, blocking=True, is_mariadb=True, report_slave=('replica-7', 'root', '', 3307))\n\
             for e in s: pass",
            mariadb_port()
        ))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + MIN;
    while !sql(&db.name, "SHOW SLAVE HOSTS").contains(&format!("{taken}\treplica-7\t3307")) {
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never registered: {}",
            sql(&db.name, "SHOW SLAVE HOSTS")
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let f = capture_fixture("cap-my-taken", &db.url, "k");
    let text = std::fs::read_to_string(&f.config).unwrap();
    std::fs::write(&f.config, format!("{text}server_id = {taken}\n")).unwrap();
    let out = Command::new(BIN)
        .args(["capture", "--config"])
        .arg(&f.config)
        .output()
        .unwrap();
    let _ = replica.kill();
    let _ = replica.wait();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        text.contains(&format!(
            "capture.server_id {taken} is the server_id of the replica at replica-7:3307 (SHOW SLAVE HOSTS)"
        )),
        "{text}"
    );
    // A column added mid-stream stops the capture, naming the table.
    sql(&db.name, "CREATE TABLE t (id int PRIMARY KEY, v int)");
    sql(&db.name, "INSERT INTO t VALUES (1, 1)");
    let f = capture_fixture("cap-my-alter", &db.url, "t");
    let mut capture = spawn_capture(&f, "c1");
    capture.wait_for("capture checkpoint committed", MIN);
    sql(&db.name, "ALTER TABLE t MODIFY v bigint");
    sql(&db.name, "INSERT INTO t VALUES (2, 2)");
    assert!(!capture.wait_exit(MIN).success());
    let log = capture.log_text();
    assert!(
        log.contains("changed (\"ALTER TABLE t MODIFY v bigint\"")
            && log.contains("a column was retyped"),
        "{}",
        tail(&log)
    );
    // Restarted, it stops again before reading a row of the new shape.
    let mut again = spawn_capture(&f, "c2");
    assert!(!again.wait_exit(MIN).success());
    assert!(
        again
            .log_text()
            .contains("only columns added at the end are followed"),
        "{}",
        tail(&again.log_text())
    );
    // The binlog holding a stopped capture's resume position purged: the changes since are gone,
    // and the restart stops naming the file and the way out, as a permanent error (no retry).
    sql(&db.name, "CREATE TABLE p (id int PRIMARY KEY)");
    sql(&db.name, "INSERT INTO p VALUES (1)");
    let f = capture_fixture("cap-my-purged", &db.url, "p");
    let mut capture = spawn_capture(&f, "c1");
    capture.wait_for("capture checkpoint committed", MIN);
    stop_capture(&mut capture);
    sql(&db.name, "INSERT INTO p VALUES (2)");
    let files = || sql(&db.name, "SHOW BINARY LOGS");
    let last = || {
        let listed = files();
        let line = listed.lines().last().unwrap_or_default();
        line.split('\t').next().unwrap_or_default().to_string()
    };
    let resumed_in = last();
    sql(&db.name, "FLUSH BINARY LOGS");
    let newest = last();
    assert_ne!(resumed_in, newest);
    // A file another reader still reads is not purged: tried again until ours is gone.
    let deadline = std::time::Instant::now() + MIN;
    while files().contains(&resumed_in) {
        assert!(
            std::time::Instant::now() < deadline,
            "{resumed_in} was never purged"
        );
        let _ = mariadb_client()
            .arg(&db.name)
            .args(["-e", &format!("PURGE BINARY LOGS TO '{newest}'")])
            .output();
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let mut again = spawn_capture(&f, "c2");
    assert!(!again.wait_exit(MIN).success());
    let log = again.log_text();
    assert!(
        log.contains("which holds the capture's resume position")
            && log.contains("was purged from the server")
            && log.contains("capture into a new topic")
            && !log.contains("capture session failed"),
        "{}",
        tail(&log)
    );
}

/// A table appended to a MariaDB capture's list joins it at the restart (docs/CAPTURE.md "Adding a
/// table", as for PostgreSQL): its first version announced before any of its changes, a snapshot
/// of the running capture holding it, a job of it started before that snapshot waiting for it;
/// the job of the first table, now naming it, goes on from where it was; both equal the source
/// under writes to both tables. A list changed otherwise is refused at the restart.
#[test]
fn mariadb_a_table_added_to_a_running_capture_gets_a_snapshot_and_a_job_of_its_own() {
    let _serial = serial();
    let _mariadb = mariadb_lane();
    let db = database("my-join");
    sql(&db.name, "CREATE TABLE a (id int PRIMARY KEY, v int)");
    let rows = |table: &str, from: u32, to: u32| {
        let values: Vec<String> = (from..=to).map(|i| format!("({i}, {i})")).collect();
        sql(
            &db.name,
            &format!("INSERT INTO {table} VALUES {}", values.join(",")),
        );
    };
    rows("a", 1, 100);
    let f = capture_fixture("cap-my-join", &db.url, "a");
    let mut capture = spawn_capture(&f, "c1");
    let mut run = f.spawn_run("r1", &[]);
    run.wait_for("partitions assigned", MIN);
    rows("a", 101, 150);
    assert_exact(&f, 150, MIN);
    stop_capture(&mut capture);
    run.signal("TERM");
    assert!(run.wait_exit(MIN).success(), "{}", tail(&run.log_text()));
    // Table b, with rows, appended to the capture's list; a job of it beside the job of a.
    sql(
        &db.name,
        "CREATE TABLE b (id int PRIMARY KEY, w varchar(8))",
    );
    sql(
        &db.name,
        "INSERT INTO b VALUES (1, 'one'), (2, 'two'), (3, 'three')",
    );
    // And table c, which leaves the capture again below.
    sql(&db.name, "CREATE TABLE c (id int PRIMARY KEY, v int)");
    rows("c", 1, 5);
    let text = std::fs::read_to_string(&f.config).unwrap();
    let at = text.find("[[jobs]]").unwrap();
    let capture_at = text.find("[jobs.capture]").unwrap();
    let job = &text[at..capture_at];
    let section = text[capture_at..].replacen("table = \"a\"", "tables = [\"a\", \"b\", \"c\"]", 1);
    let named = job.replacen("[jobs.snapshot]\n", "[jobs.snapshot]\ntable = \"a\"\n", 1);
    std::fs::write(
        &f.config,
        format!(
            "{}{named}{section}{}{}",
            &text[..at],
            job_of_table(&f, job, "b", "b", 2),
            job_of_table(&f, job, "c", "c", 3)
        ),
    )
    .unwrap();
    // The job of b starts first: no snapshot holds b yet, so it waits for the capture's.
    let mut run = f.spawn_run("r2", &[]);
    run.wait_for("waiting for a snapshot of its capture holding table b", MIN);
    let mut capture = spawn_capture(&f, "c2");
    capture.wait_for("tables join the capture", MIN);
    run.wait_for("a snapshot holding the job's added table is published", MIN);
    rows("a", 151, 200);
    rows("b", 4, 40);
    sql(
        &db.name,
        "UPDATE b SET w = 'x' WHERE id % 2 = 0; DELETE FROM b WHERE id = 3",
    );
    for (job, count) in [
        (f.name.clone(), 200),
        (format!("{}-2", f.name), 39),
        (format!("{}-3", f.name), 5),
    ] {
        let report = verify_job_eventually(&f, Some(&job), MIN);
        assert!(
            report.contains(&format!("{count} rows compared")),
            "{job}: {report}"
        );
    }
    stop_capture(&mut capture);
    // The last table taken off the list leaves the log (docs/CAPTURE.md "Removing a table"): a
    // binlog transaction changing it and a kept table reaches only the kept table's job, once the
    // job of the removed one has committed every epoch the other has.
    let text = std::fs::read_to_string(&f.config).unwrap();
    std::fs::write(
        &f.config,
        text.replacen(
            "tables = [\"a\", \"b\", \"c\"]",
            "tables = [\"a\", \"b\"]",
            1,
        ),
    )
    .unwrap();
    let mut capture = spawn_capture(&f, "c4");
    capture.wait_for("tables removed from the capture", MIN);
    sql(
        &db.name,
        "BEGIN; UPDATE c SET v = v + 100; UPDATE a SET v = v + 1 WHERE id = 1; COMMIT",
    );
    let (kept, removed) = (f.name.clone(), format!("{}-3", f.name));
    let report = verify_job_eventually(&f, Some(&kept), MIN);
    assert!(report.contains("200 rows compared"), "{report}");
    wait_until_behind_none(&f, &removed, &kept, &run);
    let replica: Vec<Vec<i64>> = f.sql("SELECT sum(v) FROM c");
    assert_eq!(
        replica,
        vec![vec![15]],
        "the removed table's change reached its replica"
    );
    let log = f.check_log();
    assert!(log.contains(" 0 violations"), "{log}");
    stop_capture(&mut capture);
    // Any other change of the list is refused at the restart, naming the way.
    let text = std::fs::read_to_string(&f.config).unwrap();
    std::fs::write(
        &f.config,
        text.replacen("tables = [\"a\", \"b\"]", "tables = [\"b\", \"a\"]", 1),
    )
    .unwrap();
    let mut refused = spawn_capture(&f, "c3");
    assert!(!refused.wait_exit(MIN).success());
    assert!(
        refused
            .log_text()
            .contains("tables may only be added at the end of [jobs.capture] tables"),
        "{}",
        tail(&refused.log_text())
    );
    run.signal("TERM");
    assert!(run.wait_exit(MIN).success(), "{}", tail(&run.log_text()));
}

/// pgbench's four tables in MariaDB: 1 branch, 10 tellers, 200,000 accounts (enough that a
/// `kill -9` lands inside the copy), an empty history.
fn tpcb_init(db: &str) {
    sql(
        db,
        "CREATE TABLE pgbench_branches (bid int PRIMARY KEY, bbalance int NOT NULL, filler char(88)); \
         CREATE TABLE pgbench_tellers (tid int PRIMARY KEY, bid int, tbalance int NOT NULL, filler char(84)); \
         CREATE TABLE pgbench_accounts (aid int PRIMARY KEY, bid int, abalance int NOT NULL, filler char(84)); \
         CREATE TABLE pgbench_history (hid bigint AUTO_INCREMENT PRIMARY KEY, tid int, bid int, aid int, delta int NOT NULL, mtime datetime(6)); \
         INSERT INTO pgbench_branches VALUES (1, 0, NULL); \
         INSERT INTO pgbench_tellers SELECT seq, 1, 0, NULL FROM seq_1_to_10; \
         INSERT INTO pgbench_accounts SELECT seq, 1, 0, NULL FROM seq_1_to_200000",
    );
}

/// pgbench's TPC-B-like transaction `n` times against `db` from one client, about `rate` a second
/// (a `SLEEP` between transactions), deltas and rows from a fixed seed.
fn tpcb_load(db: &str, n: u32, rate: u32, seed: u64) -> Child {
    load(db, n, rate, seed, |next, _| {
        let (aid, tid, delta) = (next(10_000) + 1, next(10) + 1, next(10_001) as i64 - 5_000);
        format!(
            "UPDATE pgbench_accounts SET abalance = abalance + {delta} WHERE aid = {aid}; \
             UPDATE pgbench_tellers SET tbalance = tbalance + {delta} WHERE tid = {tid}; \
             UPDATE pgbench_branches SET bbalance = bbalance + {delta} WHERE bid = 1; \
             INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES ({tid}, 1, {aid}, {delta}, NOW(6));"
        )
    })
}

/// `n` transactions against table `t (id, v, s)` of `db`, about `rate` a second: each changes a
/// row of the first 5,000, inserts a row above them and deletes an earlier insert (rows from a
/// fixed seed).
fn t_load(db: &str, n: u32, rate: u32, seed: u64) -> Child {
    load(db, n, rate, seed, |next, i| {
        let (id, delta, gone) = (next(5_000) + 1, next(100), next(i as u64 + 1));
        format!(
            "UPDATE t SET v = v + {delta} WHERE id = {id}; \
             INSERT INTO t (id, v, s) VALUES ({}, {delta}, 'seed {seed}') ON DUPLICATE KEY UPDATE v = v + 1; \
             DELETE FROM t WHERE id = {};",
            1_000_000 * seed + i as u64,
            1_000_000 * seed + gone
        )
    })
}

/// `n` transactions (`body(random below, i)`'s statements each) against `db` from one client,
/// about `rate` a second (a `SLEEP` between transactions), randoms from a fixed seed.
fn load(
    db: &str,
    n: u32,
    rate: u32,
    seed: u64,
    mut body: impl FnMut(&mut dyn FnMut(u64) -> u64, u32) -> String,
) -> Child {
    let mut x = seed;
    let mut next = |m: u64| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) % m
    };
    let mut script = String::new();
    for i in 0..n {
        script.push_str(&format!(
            "START TRANSACTION; {} COMMIT; DO SLEEP({});\n",
            body(&mut next, i),
            1.0 / rate as f64
        ));
    }
    let mut client = mariadb_client();
    client.arg(db);
    fed(client, &script)
}

fn wait_load(child: &mut Child) {
    let deadline = std::time::Instant::now() + MIN;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "the TPC-B-like load failed: {status}");
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the load did not finish"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Issue 44's proof in small: pgbench's four tables in MariaDB under a TPC-B-like load, captured
/// into one log and materialised by one job of all four at whole epochs (`consistency = "epoch"`,
/// two `run` processes, the second joining under load); a reader of the replica finds Σ abalance = Σ tbalance = Σ bbalance = Σ delta at
/// every published sample while the capture is killed with `kill -9` during the copy and mid-stream,
/// MariaDB restarts
/// under it and the binlog rotates; at the end every table equals its source.
#[test]
fn mariadb_tpcb_four_tables_keep_the_sums_equal_across_kill_9_a_restart_and_a_rotation() {
    let _serial = serial();
    let _mariadb = mariadb_lane();
    let db = database("my-tpcb");
    tpcb_init(&db.name);
    let name = "cap-my-tpcb";
    let f = Fixture::new(
        name,
        2,
        "vnode_count = 64\nmax_rows_per_second = 0\nconsistency = \"epoch\"",
    );
    four_tables_config(&f, &db.url, "", "");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let checker = pgbench_checker(Replica::Sqlite(f.db()), f.name.clone(), stop.clone());
    // kill -9 during the copy: nothing was committed, so the next start copies again.
    let mut capture = spawn_capture(&f, "c0");
    capture.wait_for("reading the tables in one consistent snapshot", MIN);
    capture.signal("KILL");
    capture.wait_exit(MIN);
    assert!(
        !capture
            .log_text()
            .contains("snapshot read in one consistent snapshot"),
        "the kill came after the copy had finished: {}",
        tail(&capture.log_text())
    );
    let mut capture = spawn_capture(&f, "c1");
    capture.wait_for("capture checkpoint committed", MIN);
    let mut load = tpcb_load(&db.name, 600, 150, 1);
    capture.wait_for_count("capture checkpoint committed", 5, MIN);
    let mut run = f.spawn_run("a", &[]);
    run.wait_for("to=\"streaming\"", MIN);
    // A second `run` process of the job joins while the load writes.
    let mut second = f.spawn_run("b", &[]);
    second.wait_for("partitions assigned", MIN);
    // kill -9 of the capture mid-stream, and its restart.
    capture.signal("KILL");
    capture.wait_exit(MIN);
    let mut capture = spawn_capture(&f, "c2");
    capture.wait_for("capture checkpoint committed", MIN);
    wait_load(&mut load);
    // MariaDB restarted under the capture (its binlog stream drops; a new binlog file starts),
    // then a rotation while the load writes.
    let restart = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/mariadb.sh"))
        .arg("restart")
        .status()
        .unwrap();
    assert!(restart.success());
    let mut load = tpcb_load(&db.name, 600, 150, 2);
    sql(&db.name, "FLUSH BINARY LOGS");
    // A column added to pgbench_accounts under the load (nullable, a literal default): a schema
    // version of that table alone, which the job of the four tables follows.
    sql(
        &db.name,
        "ALTER TABLE pgbench_accounts ADD COLUMN note varchar(16) DEFAULT 'x'",
    );
    sql(
        &db.name,
        "UPDATE pgbench_accounts SET note = CONCAT('n', aid) WHERE aid % 997 = 0",
    );
    wait_load(&mut load);
    let report = verify_job_eventually(&f, None, MIN);
    let recorded: Vec<Vec<String>> = f.sql("SELECT job FROM kb_schema_history");
    assert_eq!(recorded, vec![vec![format!("{}/accounts", f.name)]]);
    for (table, rows) in [
        ("accounts", 200_000),
        ("tellers", 10),
        ("branches", 1),
        ("history", 1_200),
    ] {
        assert!(
            report.contains(&format!("table {table}: {rows} rows compared")),
            "{report}"
        );
    }
    assert!(
        capture
            .log_text()
            .contains("capture session failed; resuming"),
        "the capture rode out the restart: {}",
        tail(&capture.log_text())
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let sums = checker.join().unwrap();
    assert!(sums.published > 50, "{sums:?}");
    assert!(sums.epochs.len() > 5, "{sums:?}");
    assert_eq!(sums.torn, 0, "{sums:?}");
    assert_eq!(sums.went_back, 0, "{sums:?}");
    eprintln!(
        "{} published samples at {} epochs, 0 torn",
        sums.published,
        sums.epochs.len()
    );
    for r in [&mut run, &mut second] {
        r.signal("TERM");
        r.wait_exit(MIN);
    }
    // Stopped while the load writes: at a checkpoint, its open Kafka transaction aborted at once
    // (the abort once waited out the shutdown grace with records in flight).
    let mut load = tpcb_load(&db.name, 300, 150, 3);
    let committed = capture
        .log_text()
        .matches("capture checkpoint committed")
        .count();
    capture.wait_for_count("capture checkpoint committed", committed + 2, MIN);
    stop_capture(&mut capture);
    wait_load(&mut load);
}

/// Snapshots of a running MariaDB capture (docs/CAPTURE.md "Snapshots of a running capture"), stored
/// in Kafka too: under a load, `kafka-backfill snapshot` publishes one at a barrier of the live
/// binlog; a column is added after it; retention deletes the log before its start. A job created
/// then on another machine (its own empty snapshot folder) restores that snapshot from Kafka,
/// follows the column and equals the source. The first job's replica, damaged by hand, is found by
/// `verify` and rebuilt online by `kafka-backfill resync` under the load (a second snapshot),
/// and equals the source.
#[test]
fn mariadb_snapshots_of_the_running_capture_reach_a_new_job_and_resync_a_damaged_replica() {
    let _serial = serial();
    let _mariadb = mariadb_lane();
    let db = database("my-snap");
    sql(
        &db.name,
        "CREATE TABLE t (id bigint PRIMARY KEY, v int NOT NULL, s varchar(20)); \
         INSERT INTO t SELECT seq, 0, CONCAT('s', seq) FROM seq_1_to_5000",
    );
    let name = &format!("cap-my-snap-{}", stamp() % 1_000_000);
    let f = capture_fixture(name, &db.url, "t");
    let text = std::fs::read_to_string(&f.config).unwrap();
    std::fs::write(&f.config, format!("{text}snapshot_storage = \"kafka\"\n")).unwrap();
    let (f, mut capture, mut run) = pipeline_of(f);
    let mut writes = t_load(&db.name, 500, 100, 1);
    let said = snapshot_command(&f, 60);
    let snaps = published(&f);
    assert_eq!(snaps.len(), 1, "the one asked for: {snaps:?}");
    let epoch = snaps[0].0;
    assert!(
        said.contains(&format!("snapshot at epoch {epoch} published in")),
        "{said}"
    );
    // The first snapshot and this one.
    capture.wait_for_count("snapshot stored in Kafka", 2, MIN);
    sql(&db.name, "ALTER TABLE t ADD COLUMN note varchar(20) NULL");
    sql(
        &db.name,
        "UPDATE t SET note = CONCAT('n', id) WHERE id % 7 = 0",
    );
    capture.wait_for("schema version announced", MIN);
    // Retention deletes the log before that snapshot's start, once the first job read past it.
    let starts = start_offsets(&snaps[0].1);
    let deadline = std::time::Instant::now() + MIN;
    loop {
        let read: Vec<Vec<i64>> =
            f.sql("SELECT next_offset FROM kb_partition_progress ORDER BY partition");
        if read.len() == starts.len() && read.iter().zip(&starts).all(|(r, s)| r[0] as u64 >= *s) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{read:?} < {starts:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let below: Vec<(u32, u64)> = (0..).zip(starts).collect();
    f.delete_records(&below);
    let (late, mut late_run) = start_job_of(&f, name, false);
    late_run.wait_for("snapshot restored from Kafka", MIN);
    let log = late_run.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("restoring the snapshot from Kafka"))
        .unwrap();
    assert!(line.contains(&format!("epoch={epoch}")), "{line}");
    wait_load(&mut writes);
    let rows: u64 = sql(&db.name, "SELECT count(*) FROM t").parse().unwrap();
    let report = verify_job_eventually(&late, None, MIN);
    assert!(
        report.contains(&format!("{rows} rows compared")),
        "{report}"
    );
    // The first job's replica damaged by hand: a vnode's rows deleted, a key the source never had.
    let c = rusqlite::Connection::open(f.db()).unwrap();
    c.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    c.execute_batch(
        "BEGIN IMMEDIATE;
         DELETE FROM accounts WHERE _kb_vnode = 7;
         CREATE TEMP TABLE extra AS SELECT * FROM accounts WHERE _kb_vnode = 11 ORDER BY _kb_key LIMIT 3;
         UPDATE extra SET _kb_key = _kb_key || x'00';
         INSERT INTO accounts SELECT * FROM extra;
         COMMIT;",
    )
    .unwrap();
    drop(c);
    let (clean, damaged) = verify_against_source(&f, None);
    assert!(!clean, "verify did not see the damage: {damaged}");
    let mut writes = t_load(&db.name, 300, 100, 2);
    let (_, to) = resync_command(&f);
    assert!(
        to > epoch,
        "a snapshot after the first one asked for: {to} ≤ {epoch}"
    );
    run.wait_for("starting it again on that snapshot", MIN);
    wait_load(&mut writes);
    let rows: u64 = sql(&db.name, "SELECT count(*) FROM t").parse().unwrap();
    for job in [&f, &late] {
        let report = verify_job_eventually(job, None, MIN);
        assert!(
            report.contains(&format!("{rows} rows compared")),
            "{report}"
        );
    }
    // The log from the first snapshot on was deleted: check-log says so.
    let (code, out) = crate::contract_e2e::check_log(&f);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("but the log now starts at offset"), "{out}");
    for r in [&mut run, &mut late_run] {
        r.signal("TERM");
        assert!(r.wait_exit(MIN).success());
    }
    stop_capture(&mut capture);
}
