//! The contract as a producer in another language would meet it, end to end through the binary on
//! the real broker: every Avro type into SQLite and PostgreSQL, a value a store cannot hold, a bad
//! record deep in a backlog, job-level completion and `caught_up` under continuous writes.

use crate::support;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use apache_avro::types::Value;
use kafka_backfill::codec::LogCodec;
use kafka_backfill::core::{vnode_of, Barrier, BarrierKind, Epoch, Op, PartitionMap};
use kafka_backfill::workload::{typed_row, TableKind};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use support::{pg_url, serial, stamp, Fixture, BIN};

const MIN: Duration = Duration::from_secs(60);

fn verify_clean(f: &Fixture, expected: &str) -> String {
    let out = Command::new(BIN)
        .args(["verify", "--config"])
        .arg(&f.config)
        .arg("--expected")
        .arg(f.dir.join(expected))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success() && text.contains(" 0 missing, 0 extra, 0 different"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The epoch `verify` reports as committed.
fn committed_epoch(verify_text: &str) -> u64 {
    let at = verify_text
        .find("committed epoch ")
        .expect("committed epoch")
        + 16;
    verify_text[at..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The open epoch the writer left in `out/writer.json` (the `curr` of its last barrier).
fn writer_next_epoch(f: &Fixture) -> Epoch {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.dir.join("out/writer.json")).unwrap()).unwrap();
    Epoch(v["next_epoch"].as_u64().unwrap())
}

fn producer(f: &Fixture) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", &f.bootstrap)
        .create()
        .unwrap()
}

fn send(p: &BaseProducer, topic: &str, partition: u32, key: &[u8], value: &[u8]) {
    p.send(
        BaseRecord::to(topic)
            .partition(partition as i32)
            .key(key)
            .payload(value),
    )
    .map_err(|(e, _)| e)
    .unwrap();
    p.flush(Duration::from_secs(10)).unwrap();
}

/// Appends a record that is not a log record to `partition`; returns its offset.
fn send_bad_record(p: &BaseProducer, f: &Fixture, partition: u32, key: &[u8], value: &[u8]) -> i64 {
    let (_, at) = p
        .client()
        .fetch_watermarks(&f.topic, partition as i32, Duration::from_secs(10))
        .unwrap();
    send(p, &f.topic, partition, key, value);
    at
}

fn manifest_is_valid(f: &Fixture) {
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../../schemas/snapshot_manifest.schema.json")).unwrap();
    let mut schemas = boon::Schemas::new();
    let mut compiler = boon::Compiler::new();
    compiler.add_resource("m.json", schema).unwrap();
    let idx = compiler.compile("m.json", &mut schemas).unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.dir.join("out/snapshot/manifest.json")).unwrap())
            .unwrap();
    schemas
        .validate(&manifest, idx)
        .map_err(|e| e.to_string())
        .unwrap();
}

/// `store_datum = false`: the table is made without `_kb_row`, the job backfills exactly (verify
/// rebuilds each row from its typed columns), and the same table under the default layout is refused
/// with what to do.
#[test]
fn a_table_without_the_datum_backfills_exactly_and_keeps_its_layout() {
    let _g = serial();
    let f = Fixture::new(&format!("nodatum{}", stamp()), 1, "");
    let text = std::fs::read_to_string(&f.config).unwrap();
    let with = text.replace(
        "table = \"accounts\"\n[jobs.local_checkpoint]",
        "table = \"accounts\"\nstore_datum = false\n[jobs.local_checkpoint]",
    );
    assert_ne!(with, text);
    std::fs::write(&f.config, &with).unwrap();
    f.produce(&["--partitions", "2", "--rows", "500", "--changes", "3000"]);
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    let status = run.wait_exit(2 * MIN);
    assert!(status.success(), "{}", support::tail(&run.log_text()));
    verify_clean(&f, "out/expected");
    let cols: Vec<Vec<i64>> =
        f.sql("SELECT COUNT(*) FROM pragma_table_info('accounts') WHERE name = '_kb_row'");
    assert_eq!(cols[0][0], 0, "no _kb_row column");
    std::fs::write(&f.config, &text).unwrap();
    let mut run = f.spawn_run("b", &["--exit-when-caught-up"]);
    let status = run.wait_exit(MIN);
    let log = run.log_text();
    assert!(
        !status.success()
            && log.contains("created without _kb_row")
            && log.contains("set store_datum = false"),
        "{}",
        support::tail(&log)
    );
}

/// Every Avro type (NaN, ±Inf and −0.0 doubles, nullable unions in both orders, decimals, nested
/// records, …) with a composite key not in field order: exact into SQLite, then into PostgreSQL.
/// Before typed columns handled NaN, the SQLite job looped forever on a NOT NULL constraint.
#[test]
fn the_typed_table_backfills_exactly_into_sqlite_and_postgres() {
    let _g = serial();
    // A fresh job name: the PostgreSQL database outlives test runs.
    let f = Fixture::new(&format!("typed{}", stamp()), 1, "");
    f.produce(&[
        "--table",
        "typed",
        "--partitions",
        "2",
        "--rows",
        "600",
        "--changes",
        "3000",
        "--epoch-changes",
        "150",
    ]);
    manifest_is_valid(&f);
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    let status = run.wait_exit(2 * MIN);
    assert!(status.success(), "{}", support::tail(&run.log_text()));
    verify_clean(&f, "out/expected");
    let nan: Vec<Vec<String>> = f.sql("SELECT amount FROM accounts WHERE id % 5 = 0 LIMIT 1");
    assert_eq!(nan[0][0], "NaN");
    let phase: Vec<Vec<String>> = f.sql("SELECT phase FROM kb_jobs");
    assert_eq!(phase[0][0], "streaming");

    f.use_postgres(&pg_url());
    let mut run = f.spawn_run("b", &["--exit-when-caught-up"]);
    let status = run.wait_exit(2 * MIN);
    assert!(status.success(), "{}", support::tail(&run.log_text()));
    verify_clean(&f, "out/expected");
}

/// A change whose string PostgreSQL cannot hold (U+0000) stops the job at once with an error naming
/// topic, partition, offset and column — never a retry loop.
#[test]
fn a_value_the_store_cannot_hold_stops_the_job_naming_topic_partition_offset_and_column() {
    let _g = serial();
    let f = Fixture::new(&format!("nulvalue{}", stamp()), 1, "");
    f.produce(&[
        "--table",
        "typed",
        "--partitions",
        "2",
        "--rows",
        "100",
        "--changes",
        "300",
        "--epoch-changes",
        "50",
    ]);
    f.use_postgres(&pg_url());
    // One more epoch: an insert whose payload holds U+0000, then a checkpoint barrier.
    let table = TableKind::Typed.schema().unwrap();
    let codec = LogCodec::new(table.clone()).unwrap();
    let map = PartitionMap::new(256, 2).unwrap();
    let epoch = writer_next_epoch(&f);
    let mut row = typed_row(1_000_000, 0, 100, &mut kafka_backfill::rng::SimRng::new(1));
    if let Value::Record(fields) = &mut row {
        fields.last_mut().unwrap().1 = Value::String("nul\0here".into());
    }
    let datum = table.encode_row(&row).unwrap();
    let key = table.key_of_datum(&datum).unwrap();
    let vnode = vnode_of(&key, 256);
    let partition = map.partition_of(vnode);
    let p = producer(&f);
    let (_, high) = p
        .client()
        .fetch_watermarks(&f.topic, partition as i32, Duration::from_secs(10))
        .unwrap();
    send(
        &p,
        &f.topic,
        partition,
        &key,
        &codec.encode_change(epoch, Op::Insert, vnode, &datum),
    );
    let barrier = codec.encode_barrier(&Barrier {
        prev: epoch,
        curr: Epoch(epoch.0 + (1 << 16)),
        kind: BarrierKind::Checkpoint,
        schema_change: false,
    });
    for q in 0..2 {
        send(&p, &f.topic, q, &[], &barrier);
    }
    let started = Instant::now();
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    let status = run.wait_exit(2 * MIN);
    assert!(!status.success(), "the job must stop");
    let log = run.log_text();
    let expected = format!(
        "topic {}, partition {partition}, offset {high}: the store cannot hold column payload",
        f.topic
    );
    assert!(
        log.contains(&expected),
        "expected {expected:?} in:\n{}",
        support::tail(&log)
    );
    assert!(
        !log.contains("restarting the worker"),
        "a permanent error is not retried:\n{}",
        support::tail(&log)
    );
    assert!(started.elapsed() < MIN);
}

/// A bad record deep in a backlog (more checkpoints follow it): every checkpoint complete before it
/// is committed — the table equals the writer's table at its last checkpoint before the bad record —
/// and nothing at or after it.
#[test]
fn a_bad_record_deep_in_a_backlog_commits_every_checkpoint_before_it_then_stops() {
    let _g = serial();
    let f = Fixture::new("deeppoison", 1, "");
    f.produce(&[
        "--partitions",
        "4",
        "--rows",
        "300",
        "--changes",
        "8000",
        "--epoch-changes",
        "100",
        "--checkpoint-every",
        "2",
    ]);
    // The table at the last checkpoint before the bad record.
    let status = Command::new("cp")
        .arg("-r")
        .arg(f.dir.join("out/expected"))
        .arg(f.dir.join("expected-before"))
        .status()
        .unwrap();
    assert!(status.success());
    let p = producer(&f);
    let poison = send_bad_record(&p, &f, 1, b"k", b"this is not avro");
    let mut more = f.append(&["--changes", "4000", "--epoch-changes", "100"]);
    assert!(more.wait().unwrap().success());
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    let status = run.wait_exit(2 * MIN);
    assert!(!status.success(), "the job must stop on the bad record");
    let log = run.log_text();
    let expected = format!(
        "record at topic {} partition 1 offset {poison} does not decode",
        f.topic
    );
    assert!(
        log.contains(&expected),
        "expected {expected:?} in:\n{}",
        support::tail(&log)
    );
    let committed: Vec<Vec<i64>> =
        f.sql("SELECT next_offset FROM kb_partition_progress WHERE partition = 1");
    assert!(committed[0][0] <= poison, "committed past the bad record");
    verify_clean(&f, "expected-before");
}

/// A process that owns part of a job does not report the job done: with another group member
/// (a plain consumer) holding a partition, `--exit-when-caught-up` waits, then exits 3 naming the
/// partition; alone, it finishes the whole job and exits 0.
#[test]
fn exit_when_caught_up_means_the_whole_job() {
    let _g = serial();
    let f = Fixture::new("jobdone", 1, "");
    f.produce(&[
        "--partitions",
        "2",
        "--rows",
        "400",
        "--changes",
        "2000",
        "--epoch-changes",
        "100",
    ]);
    let squatter_log = f.dir.join("squatter.log");
    let mut squatter = Command::new("kcat")
        .args([
            "-b",
            &f.bootstrap,
            "-G",
            &f.group,
            "-X",
            "partition.assignment.strategy=cooperative-sticky",
            "-X",
            "session.timeout.ms=6000",
            &f.topic,
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&squatter_log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + MIN;
    while !std::fs::read_to_string(&squatter_log)
        .unwrap_or_default()
        .contains("assignment of")
    {
        assert!(Instant::now() < deadline, "kcat never joined the group");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut run = f.spawn_run("a", &["--exit-when-caught-up", "--job-wait-secs", "5"]);
    let status = run.wait_exit(2 * MIN);
    let log = run.log_text();
    assert_eq!(status.code(), Some(3), "{}", support::tail(&log));
    assert!(
        log.contains("this process has caught up, but the job has not: partitions ["),
        "{}",
        support::tail(&log)
    );
    let phase: Vec<Vec<String>> = f.sql("SELECT phase FROM kb_jobs");
    assert_ne!(
        phase[0][0], "streaming",
        "the job row speaks for the whole job"
    );
    let _ = squatter.kill();
    let _ = squatter.wait();
    let mut run = f.spawn_run("b", &["--exit-when-caught-up"]);
    let status = run.wait_exit(2 * MIN);
    assert!(status.success(), "{}", support::tail(&run.log_text()));
    verify_clean(&f, "out/expected");
    let phase: Vec<Vec<String>> = f.sql("SELECT phase FROM kb_jobs");
    assert_eq!(phase[0][0], "streaming");
}

/// `caught_up` in `/status` becomes true while upstream keeps writing, and `committed_epoch` is the
/// store's checkpoint epoch (the one `verify` reports).
#[test]
fn caught_up_holds_under_continuous_writes_and_committed_epoch_is_the_checkpoint_epoch() {
    let _g = serial();
    let f = Fixture::new("livecaught", 1, "");
    let addr = format!("127.0.0.1:{}", support::free_port());
    f.set_http(&addr);
    f.produce(&[
        "--partitions",
        "4",
        "--rows",
        "300",
        "--changes",
        "1000",
        "--epoch-changes",
        "50",
    ]);
    let mut run = f.spawn_run("a", &[]);
    run.wait_for("to=\"streaming\"", 2 * MIN);
    let mut writer = f.append(&[
        "--changes",
        "30000",
        "--epoch-changes",
        "50",
        "--rate",
        "2000",
    ]);
    let status_of = || -> serde_json::Value {
        let (code, body) = support::http_get(&format!("http://{addr}/status"));
        assert_eq!(code, 200);
        serde_json::from_str(&body).unwrap()
    };
    let deadline = Instant::now() + MIN;
    let mut seen_while_writing = false;
    while Instant::now() < deadline {
        let writing = writer.try_wait().unwrap().is_none();
        let s = status_of();
        let w = &s["jobs"][0]["workers"][0];
        if writing && w["caught_up"] == true && w["lag_records"].as_u64().unwrap() > 0 {
            seen_while_writing = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        seen_while_writing,
        "caught_up never held while upstream wrote: {}",
        status_of()
    );
    assert!(writer.wait().unwrap().success());
    // Once the writer is done and everything is committed, /status and verify agree on the epoch.
    let text = f.verify_eventually(MIN);
    let epoch = committed_epoch(&text);
    let deadline = Instant::now() + MIN;
    loop {
        let s = status_of();
        let w = &s["jobs"][0]["workers"][0];
        if w["committed_epoch"].as_u64() == Some(epoch) {
            assert_eq!(s["jobs"][0]["progress"]["caught_up"], true, "{s}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "status {s} never showed epoch {epoch}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    run.signal("TERM");
    assert!(run.wait_exit(MIN).success());
}

/// `check-log` of `f`'s job: its exit code and output.
pub(crate) fn check_log(f: &Fixture) -> (i32, String) {
    let out = Command::new(BIN)
        .args(["check-log", "--config"])
        .arg(&f.config)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// `check-log` passes on what `produce` writes and names each violation a producer can make: a
/// record that does not decode, a change in a partition that does not own its vnode, a message key
/// that is not the row's key, a broken barrier chain, a start offset that does not follow a barrier.
#[test]
fn check_log_passes_on_produce_and_names_each_violation() {
    let _g = serial();
    let f = Fixture::new("checklog", 1, "");
    f.produce(&[
        "--partitions",
        "2",
        "--rows",
        "300",
        "--changes",
        "1000",
        "--epoch-changes",
        "100",
    ]);
    let (code, out) = check_log(&f);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(": 0 violations"), "{out}");

    let table = TableKind::Accounts.schema().unwrap();
    let codec = LogCodec::new(table.clone()).unwrap();
    let map = PartitionMap::new(256, 2).unwrap();
    let epoch = writer_next_epoch(&f);
    let p = producer(&f);
    let offset_of = |partition: u32| {
        p.client()
            .fetch_watermarks(&f.topic, partition as i32, Duration::from_secs(10))
            .unwrap()
            .1
    };
    let mut rng = kafka_backfill::rng::SimRng::new(9);
    // A row whose vnode partition 1 owns, and one whose vnode partition 0 owns.
    let row_in = |partition: u32, rng: &mut kafka_backfill::rng::SimRng| {
        (10_000..)
            .map(|id| {
                let datum = table
                    .encode_row(&kafka_backfill::workload::example_row(id, 0, 50, rng))
                    .unwrap();
                let key = table.key_of_datum(&datum).unwrap();
                (vnode_of(&key, 256), key, datum)
            })
            .find(|(v, _, _)| map.partition_of(*v) == partition)
            .unwrap()
    };
    let garbage_at = offset_of(0);
    send(&p, &f.topic, 0, b"k", b"not avro at all");
    let (v1, k1, d1) = row_in(1, &mut rng);
    let misrouted_at = offset_of(0);
    send(
        &p,
        &f.topic,
        0,
        &k1,
        &codec.encode_change(epoch, Op::Insert, v1, &d1),
    );
    let (v0, _, d0) = row_in(0, &mut rng);
    let wrong_key_at = offset_of(0);
    send(
        &p,
        &f.topic,
        0,
        b"\x02",
        &codec.encode_change(epoch, Op::Insert, v0, &d0),
    );
    let broken_at = offset_of(1);
    let bad_barrier = codec.encode_barrier(&Barrier {
        prev: Epoch(1 << 16),
        curr: Epoch(2 << 16),
        kind: BarrierKind::Checkpoint,
        schema_change: false,
    });
    send(&p, &f.topic, 1, &[], &bad_barrier);

    let (code, out) = check_log(&f);
    assert_eq!(code, 1, "{out}");
    let t = &f.topic;
    for needle in [
        format!("record at topic {t} partition 0 offset {garbage_at} does not decode"),
        format!("change at topic {t} partition 0 offset {misrouted_at} is for vnode {v1}, which partition 0 does not own"),
        format!("record at topic {t} partition 0 offset {wrong_key_at} does not decode: truncated or malformed datum: the message key 02 is not the row's primary-key bytes"),
        format!("barrier chain broken at topic {t} partition 1 offset {broken_at}"),
    ] {
        assert!(out.contains(&needle), "no {needle:?} in:\n{out}");
    }
    assert!(out.contains(": 4 violations"), "{out}");

    // A manifest whose start offset does not follow the barrier with prev = Es.
    let mpath = f.dir.join("out/snapshot/manifest.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&mpath).unwrap()).unwrap();
    let next = m["start"][0]["next_offset"].as_u64().unwrap();
    m["start"][0]["next_offset"] = serde_json::json!(next + 1);
    std::fs::write(&mpath, serde_json::to_vec(&m).unwrap()).unwrap();
    let (code, out) = check_log(&f);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "topic {t} partition 0 offset {next}: the record before the manifest's start offset must be the barrier"
        )),
        "{out}"
    );
}

/// A permanent SQLite error (a table of the same name with other columns) stops the job at once
/// with the store's refusal — no restart loop; and the log a process writes to a file carries no
/// colour escape codes, even without NO_COLOR.
#[test]
fn a_permanent_sqlite_error_stops_at_once_and_logs_carry_no_escape_codes() {
    let _g = serial();
    let f = Fixture::new("sqliteperm", 1, "");
    f.produce(&[
        "--partitions",
        "2",
        "--rows",
        "200",
        "--changes",
        "500",
        "--epoch-changes",
        "100",
    ]);
    rusqlite::Connection::open(f.db())
        .unwrap()
        .execute_batch("CREATE TABLE accounts (_kb_key BLOB PRIMARY KEY, something_else TEXT)")
        .unwrap();
    let log = f.dir.join("perm.log");
    let started = Instant::now();
    let status = Command::new(BIN)
        .args(["run", "--exit-when-caught-up", "--config"])
        .arg(&f.config)
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "kafka_backfill=info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .status()
        .unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "{text}");
    assert!(started.elapsed() < MIN, "{text}");
    assert!(
        text.contains("state store refused the checkpoint") && text.contains("something_else")
            || text.contains("has no column named"),
        "{text}"
    );
    assert!(!text.contains("restarting the worker"), "{text}");
    assert!(text.contains("INFO"), "the log has lines: {text}");
    assert!(!text.contains('\u{1b}'), "escape codes in a file: {text}");
}

/// A log written with Kafka transactions — a commit marker after every checkpoint, and aborted
/// transactions of deletes — is read committed: nothing aborted is applied, the job catches up
/// past the final commit marker and exits, and `check-log` passes.
#[test]
fn a_transactional_log_with_aborted_transactions_catches_up_exactly() {
    let _g = serial();
    let f = Fixture::new("txnlog", 1, "");
    f.produce(&[
        "--transactional",
        "--partitions",
        "2",
        "--rows",
        "400",
        "--changes",
        "3000",
        "--epoch-changes",
        "100",
        "--checkpoint-every",
        "2",
    ]);
    let (code, out) = check_log(&f);
    assert_eq!(code, 0, "{out}");
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    let status = run.wait_exit(2 * MIN);
    assert!(status.success(), "{}", support::tail(&run.log_text()));
    // The aborted transactions deleted live rows: had they been applied, rows would be missing.
    verify_clean(&f, "out/expected");
}

/// A transactional writer killed with `kill -9` in the middle of a transaction leaves records that
/// are never committed. Its restart (same transactional id) fences the dead instance and aborts
/// that transaction; the backfill then catches up exactly, none of the dead writer's records applied
/// (it wrote with another seed, so applying them would change the table).
#[test]
fn a_transactional_writer_killed_mid_transaction_is_backfilled_exactly() {
    let _g = serial();
    let f = Fixture::new("txnkill", 1, "");
    f.produce(&[
        "--transactional",
        "--partitions",
        "4",
        "--rows",
        "400",
        "--changes",
        "1000",
        "--epoch-changes",
        "100",
        "--checkpoint-every",
        "2",
    ]);
    let before = support::high_watermarks(&f, 4);
    // One transaction that would only commit after 100,000 barriers: killed long before that.
    let mut doomed = f.append(&[
        "--transactional",
        "--seed",
        "99",
        "--rate",
        "2000",
        "--changes",
        "1000000",
        "--epoch-changes",
        "100",
        "--checkpoint-every",
        "100000",
    ]);
    let deadline = Instant::now() + MIN;
    while support::high_watermarks(&f, 4) < before + 300 {
        if let Some(status) = doomed.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(doomed.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!("the writer exited before it was killed: {status}: {err}");
        }
        assert!(Instant::now() < deadline, "the writer wrote nothing");
        std::thread::sleep(Duration::from_millis(50));
    }
    doomed.kill().unwrap(); // SIGKILL
    doomed.wait().unwrap();
    let written = support::high_watermarks(&f, 4) - before;
    assert!(written >= 300, "{written} records of the open transaction");

    // The restarted writer continues the chain from the last committed state.
    let restarted = f
        .append(&[
            "--transactional",
            "--changes",
            "1000",
            "--epoch-changes",
            "100",
            "--checkpoint-every",
            "2",
        ])
        .wait_with_output()
        .unwrap();
    assert!(
        restarted.status.success(),
        "{}",
        String::from_utf8_lossy(&restarted.stderr)
    );
    let (code, out) = check_log(&f);
    assert_eq!(code, 0, "{out}");
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    let status = run.wait_exit(2 * MIN);
    assert!(status.success(), "{}", support::tail(&run.log_text()));
    verify_clean(&f, "out/expected");
}

/// A record of the dead-letter topic: key, value, headers.
type DeadLetterMessage = (Option<Vec<u8>>, Vec<u8>, BTreeMap<String, String>);

/// The dead letters of a job (`topic.dead-letters`), each with its headers, read to the end.
fn dead_letter_topic(f: &Fixture) -> Vec<DeadLetterMessage> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Headers, Message};
    let topic = format!("{}.dead-letters", f.topic);
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &f.bootstrap)
        .set("group.id", format!("{}-dlq-reader", f.group))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let (_, high) = c
        .fetch_watermarks(&topic, 0, Duration::from_secs(10))
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, rdkafka::Offset::Beginning)
        .unwrap();
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + MIN;
    while (out.len() as i64) < high {
        assert!(Instant::now() < deadline, "read {} of {high}", out.len());
        let Some(m) = c.poll(Duration::from_millis(500)) else {
            continue;
        };
        let m = m.unwrap();
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|x| {
                        (
                            x.key.to_string(),
                            String::from_utf8_lossy(x.value.unwrap_or_default()).to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push((
            m.key().map(<[u8]>::to_vec),
            m.payload().unwrap_or_default().to_vec(),
            headers,
        ));
    }
    out
}

/// `on_bad_record = "dead-letter"`: a record that does not decode, deep in a backlog and again
/// while streaming, is written to the dead-letter topic with headers naming where it came from,
/// recorded once in the store with the checkpoint that passes it, counted; every other row is
/// exact (`verify` against the writer's table); a restart writes no dead letter twice; one more
/// than `max_dead_letters` stops the job, naming the cap, with nothing of that checkpoint applied.
#[test]
fn dead_letters_are_written_recorded_once_exact_for_every_other_row_and_capped() {
    let _g = serial();
    let f = Fixture::new(
        "deadletter",
        1,
        "on_bad_record = \"dead-letter\"\nmax_dead_letters = 3",
    );
    f.produce(&[
        "--partitions",
        "4",
        "--rows",
        "300",
        "--changes",
        "6000",
        "--epoch-changes",
        "100",
        "--checkpoint-every",
        "2",
    ]);
    let p = producer(&f);
    let first = send_bad_record(&p, &f, 1, b"k1", b"this is not avro");
    let mut more = f.append(&["--changes", "3000", "--epoch-changes", "100"]);
    assert!(more.wait().unwrap().success());
    // Deep in the backlog: skipped, the job catches up and exits 0.
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    let status = run.wait_exit(2 * MIN);
    assert!(status.success(), "{}", support::tail(&run.log_text()));
    assert!(
        run.log_text()
            .contains("dead letter written; the checkpoint records it"),
        "{}",
        support::tail(&run.log_text())
    );
    let report = verify_clean(&f, "out/expected");
    assert!(
        report.contains(&format!(
            "dead letters: 1 recorded (kb_dead_letters; the records are on the dead-letter topic):\n  partition 1 offset {first} (epoch "
        )),
        "{report}"
    );
    let recorded: Vec<Vec<i64>> =
        f.sql("SELECT partition, record_offset FROM kb_dead_letters ORDER BY 1, 2");
    assert_eq!(recorded, vec![vec![1, first]]);
    let letters = dead_letter_topic(&f);
    assert_eq!(letters.len(), 1, "{letters:?}");
    let (key, value, headers) = &letters[0];
    assert_eq!(
        (key.as_deref(), value.as_slice()),
        (Some(&b"k1"[..]), &b"this is not avro"[..])
    );
    assert_eq!(headers["kb.source.topic"], f.topic);
    assert_eq!(headers["kb.source.partition"], "1");
    assert_eq!(headers["kb.source.offset"], first.to_string());
    assert_eq!(headers["kb.job"], "deadletter");
    assert!(
        headers["kb.error"].contains(&format!(
            "record at topic {} partition 1 offset {first} does not decode",
            f.topic
        )),
        "{headers:?}"
    );

    // While streaming: another one, then the writer goes on.
    let addr = format!("127.0.0.1:{}", support::free_port());
    f.set_http(&addr);
    let mut run = f.spawn_run("b", &[]);
    run.wait_for("to=\"streaming\"", 2 * MIN);
    let second = send_bad_record(&p, &f, 2, b"k2", b"\x00\x01 neither");
    let mut more = f.append(&["--changes", "1000", "--epoch-changes", "100"]);
    assert!(more.wait().unwrap().success());
    f.verify_eventually(MIN);
    let deadline = Instant::now() + MIN;
    loop {
        let n: Vec<Vec<i64>> = f.sql("SELECT COUNT(*) FROM kb_dead_letters");
        if n[0][0] == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the second dead letter was not recorded"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let recorded: Vec<Vec<i64>> =
        f.sql("SELECT partition, record_offset FROM kb_dead_letters ORDER BY 1, 2");
    assert_eq!(recorded, vec![vec![1, first], vec![2, second]]);
    assert_eq!(
        dead_letter_topic(&f).len(),
        2,
        "the restart wrote none twice"
    );
    // Counted: /status has the store's two, the metric this process's one.
    let deadline = Instant::now() + MIN;
    while support::status(&addr)["jobs"][0]["dead_letters"] != 2 {
        assert!(Instant::now() < deadline, "{}", support::status(&addr));
        std::thread::sleep(Duration::from_millis(200));
    }
    let (code, metrics) = support::http_get(&format!("http://{addr}/metrics"));
    assert_eq!(code, 200);
    assert!(
        metrics.contains("kafka_backfill_dead_letters_total{job_name=\"deadletter\"} 1"),
        "{metrics}"
    );

    // Two more: the cap (3) is passed, the job stops, naming it; the store keeps two.
    send(&p, &f.topic, 0, b"k3", b"bad");
    send(&p, &f.topic, 3, b"k4", b"bad");
    let mut more = f.append(&["--changes", "500", "--epoch-changes", "100"]);
    assert!(more.wait().unwrap().success());
    let status = run.wait_exit(2 * MIN);
    assert!(!status.success(), "the job must stop past max_dead_letters");
    let log = run.log_text();
    assert!(
        log.contains("over max_dead_letters = 3"),
        "{}",
        support::tail(&log)
    );
    let n: Vec<Vec<i64>> = f.sql("SELECT COUNT(*) FROM kb_dead_letters");
    assert_eq!(n[0][0], 2, "nothing of the refused checkpoint recorded");
}

/// A log of several tables (docs/WIRE.md, "Several tables"): `produce --tables 2` writes two
/// tables into one topic, one barrier chain, one several-table manifest. `check-log` checks every
/// table's records and snapshot; one job per table (`snapshot.table`) materialises its table and
/// passes over the other's changes; each is exact. A job that names no table of a several-table
/// manifest is refused at `check-config`, naming the tables.
#[test]
fn a_log_of_two_tables_is_checked_whole_and_backfilled_one_job_per_table() {
    let _g = serial();
    let f = Fixture::new("twotables", 2, "");
    f.produce(&[
        "--tables",
        "2",
        "--partitions",
        "2",
        "--rows",
        "300",
        "--changes",
        "4000",
        "--epoch-changes",
        "100",
    ]);
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.dir.join("out/snapshot/manifest.json")).unwrap())
            .unwrap();
    let names: Vec<&str> = m["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["accounts_1", "accounts_2"]);
    // Without a table named, the job is refused before it runs.
    let out = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(&f.config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success()
            && text.contains(
                "holds 2 tables (accounts_1, accounts_2): name the job's with `snapshot.table`"
            ),
        "{text}"
    );
    // One job per table, each into its own store table of the one SQLite file.
    let text = std::fs::read_to_string(&f.config).unwrap();
    let job = &text[text.find("[[jobs]]").unwrap()..];
    let second = job
        .replacen("name = \"twotables\"", "name = \"twotables2\"", 1)
        .replacen(&f.group, &format!("{}-2", f.group), 1)
        .replacen("table = \"accounts\"", "table = \"accounts_2\"", 1)
        .replacen(
            "[jobs.snapshot]\n",
            "[jobs.snapshot]\ntable = \"accounts_2\"\n",
            1,
        );
    let first = job
        .replacen("table = \"accounts\"", "table = \"accounts_1\"", 1)
        .replacen(
            "[jobs.snapshot]\n",
            "[jobs.snapshot]\ntable = \"accounts_1\"\n",
            1,
        );
    let head = &text[..text.find("[[jobs]]").unwrap()];
    std::fs::write(&f.config, format!("{head}{first}{second}")).unwrap();
    let (code, out) = check_log(&f);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(": 0 violations"), "{out}");
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    assert!(
        run.wait_exit(2 * MIN).success(),
        "{}",
        support::tail(&run.log_text())
    );
    for (job, table) in [("twotables", "accounts_1"), ("twotables2", "accounts_2")] {
        let out = Command::new(BIN)
            .args(["verify", "--config"])
            .arg(&f.config)
            .args(["--job", job, "--expected"])
            .arg(f.dir.join("out/expected"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success() && text.contains(" 0 missing, 0 extra, 0 different"),
            "{job}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rows: Vec<Vec<i64>> = f.sql(&format!("SELECT COUNT(*) FROM {table}"));
        assert!(rows[0][0] > 100, "{table}: {rows:?}");
    }
}

/// Records deleted before a job read them (what retention or `DeleteRecords` does): `check-log`
/// and `run` both name the topic, the partition, the needed and the earliest offset and the way
/// out, and the job reads nothing of the partition — no reset to the earliest offset. The other
/// partition, untouched, is not blamed.
#[test]
fn a_job_whose_start_offsets_were_deleted_stops_before_reading_and_says_why() {
    let _g = serial();
    let f = Fixture::new("logstart", 1, "");
    f.produce(&[
        "--partitions",
        "2",
        "--rows",
        "200",
        "--changes",
        "600",
        "--epoch-changes",
        "50",
    ]);
    let mpath = f.dir.join("out/snapshot/manifest.json");
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&mpath).unwrap()).unwrap();
    let start = m["start"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["partition"] == 0)
        .unwrap()["next_offset"]
        .as_u64()
        .unwrap();
    let gone_to = start + 10;
    f.delete_records(&[(0, gone_to)]);
    let named = format!(
        "topic {} partition 0: the job needs offset {start} but the log now starts at offset {gone_to}",
        f.topic
    );

    let (code, out) = check_log(&f);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&named), "no {named:?} in:\n{out}");
    assert!(!out.contains("partition 1:"), "{out}");

    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    let status = run.wait_exit(2 * MIN);
    let log = run.log_text();
    assert!(!status.success(), "{}", support::tail(&log));
    assert!(log.contains(&named), "{}", support::tail(&log));
    assert!(
        log.contains(
            "with `capture`, the job moves at its start to the newest such snapshot of its capture"
        ),
        "{}",
        support::tail(&log)
    );
    // Nothing of partition 0 was read past the gap: its progress, if any, is the snapshot's start.
    let stored: Vec<Vec<i64>> =
        f.sql("SELECT next_offset FROM kb_partition_progress WHERE partition = 0");
    for row in stored {
        assert_eq!(row[0] as u64, start, "partition 0 moved past its gap");
    }
}
