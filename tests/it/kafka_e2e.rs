//! End to end through the real binary against the real Apache Kafka broker (`scripts/kafka.sh`).

use crate::support;

use std::time::Duration;

use support::{high_watermarks, serial, Fixture};

const MIN: Duration = Duration::from_secs(60);

#[test]
fn snapshot_log_streaming_on_a_multi_partition_topic_then_verify_is_clean() {
    let _g = serial();
    let f = Fixture::new("basic", 2, "");
    f.produce(&[
        "--partitions",
        "4",
        "--rows",
        "3000",
        "--changes",
        "15000",
        "--epoch-changes",
        "300",
    ]);
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    let status = run.wait_exit(2 * MIN);
    assert!(status.success(), "{}", support::tail(&run.log_text()));
    let log = run.log_text();
    for phase in ["to=\"snapshot\"", "to=\"log_store\"", "to=\"streaming\""] {
        assert!(log.contains(phase), "no {phase} in the log");
    }
    let out = f.verify();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(" 0 missing, 0 extra, 0 different"), "{text}");

    // The group's committed offsets, read back with Kafka's own tool, match the store.
    let described = f.kafka_tool(&[
        "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
        "--bootstrap-server",
        &f.bootstrap,
        "--describe",
        "--group",
        &f.group,
        "--offsets",
    ]);
    let stored: Vec<Vec<i64>> =
        f.sql("SELECT partition, next_offset FROM kb_partition_progress ORDER BY partition");
    assert_eq!(stored.len(), 4);
    for row in stored {
        let (p, off) = (row[0], row[1]);
        let line = described
            .lines()
            .find(|l| {
                let c: Vec<&str> = l.split_whitespace().collect();
                c.len() > 3 && c[1] == f.topic && c[2] == p.to_string()
            })
            .unwrap_or_else(|| panic!("partition {p} missing from:\n{described}"));
        let current: i64 = line.split_whitespace().nth(3).unwrap().parse().unwrap();
        assert_eq!(
            current, off,
            "partition {p}: group offset {current} vs store {off}\n{described}"
        );
    }
    // The materialised table is a real SQL table.
    let n: Vec<Vec<i64>> = f.sql("SELECT count(*) FROM accounts WHERE balance >= 0 AND id >= 0");
    assert!(n[0][0] > 0);
}

#[test]
fn a_second_consumer_joining_during_the_snapshot_replans_without_loss() {
    let _g = serial();
    let f = Fixture::new("snapjoin", 1, "max_rows_per_second = 4000");
    f.produce(&["--partitions", "4", "--rows", "12000", "--changes", "2000"]);
    let mut a = f.spawn_run("a", &["--exit-when-caught-up"]);
    a.wait_for("cause=Local", MIN);
    let mut b = f.spawn_run("b", &["--exit-when-caught-up"]);
    b.wait_for("partitions assigned", MIN);
    assert!(
        a.wait_exit(3 * MIN).success(),
        "{}",
        support::tail(&a.log_text())
    );
    assert!(
        b.wait_exit(3 * MIN).success(),
        "{}",
        support::tail(&b.log_text())
    );
    let log = a.log_text();
    assert!(
        log.contains("partitions revoked"),
        "a never gave partitions away"
    );
    assert!(
        !log.contains("should not update vnode bitmap"),
        "the snapshot phase must allow rebalances"
    );
    let recreations: Vec<Vec<i64>> = f.sql("SELECT recreations FROM kb_jobs");
    assert_eq!(recreations[0][0], 0);
    f.verify_eventually(MIN);
}

/// The log `join_mid_log_store` produces unless told otherwise.
const LOG_STORE_JOIN: [&str; 8] = [
    "--partitions",
    "4",
    "--rows",
    "500",
    "--changes",
    "20000",
    "--epoch-changes",
    "200",
];

/// KIP-848: `"group.protocol" = "consumer"` (the broker assigns, incrementally) runs end to end: a
/// second process joining during the snapshot is a vnode-bitmap update the snapshot phase absorbs,
/// and the table is exact. Before, the client was refused at creation (the classic protocol's
/// `partition.assignment.strategy` was set regardless).
#[test]
fn the_consumer_group_protocol_of_kip_848_backfills_exactly_with_a_join() {
    let _g = serial();
    let f = Fixture::new("kip848", 1, "max_rows_per_second = 4000");
    f.use_consumer_protocol();
    f.produce(&["--partitions", "4", "--rows", "40000", "--changes", "2000"]);
    let mut a = f.spawn_run("a", &["--exit-when-caught-up"]);
    a.wait_for("cause=Local", MIN);
    let mut b = f.spawn_run("b", &["--exit-when-caught-up"]);
    b.wait_for("partitions assigned", MIN);
    for r in [&mut a, &mut b] {
        assert!(
            r.wait_exit(3 * MIN).success(),
            "{}",
            support::tail(&r.log_text())
        );
    }
    assert!(
        a.log_text().contains("partitions revoked"),
        "a never gave partitions away"
    );
    f.verify_eventually(MIN);
}

/// A job throttled into a long log store: `a` runs it, `b` joins once `a` has committed in the log
/// store, and both are waited for (`--exit-when-caught-up`) after `a` logs `a_logs`.
fn join_mid_log_store(f: &Fixture, a_logs: &[&str]) -> (String, String) {
    join_mid_log_store_of(f, &LOG_STORE_JOIN, a_logs)
}

/// [`join_mid_log_store`] on the log `produce` writes with `produce_args`.
fn join_mid_log_store_of(f: &Fixture, produce_args: &[&str], a_logs: &[&str]) -> (String, String) {
    f.produce(produce_args);
    let mut a = f.spawn_run("a", &["--exit-when-caught-up"]);
    a.wait_for("to=\"log_store\"", MIN);
    a.wait_for("cause=Barrier", MIN);
    let mut b = f.spawn_run("b", &["--exit-when-caught-up"]);
    for needle in a_logs {
        a.wait_for(needle, MIN);
    }
    for r in [&mut a, &mut b] {
        assert!(
            r.wait_exit(4 * MIN).success(),
            "{}",
            support::tail(&r.log_text())
        );
    }
    (a.log_text(), b.log_text())
}

#[test]
fn a_second_consumer_joining_during_the_log_store_recreates_the_job() {
    let _g = serial();
    let f = Fixture::new("logjoin", 1, "max_rows_per_second = 3000");
    join_is_recreated(&f);
}

/// `join_mid_log_store` under `recreate`: the invariant error, a recreation, and exact.
fn join_is_recreated(f: &Fixture) {
    join_mid_log_store(
        f,
        &[
            "should not update vnode bitmap during consuming log store",
            "recreating the job",
        ],
    );
    let jobs: Vec<Vec<i64>> = f.sql("SELECT generation, recreations FROM kb_jobs");
    assert!(
        jobs[0][0] >= 1 && jobs[0][1] >= 1,
        "generation/recreations {:?}",
        jobs[0]
    );
    f.verify_eventually(MIN);
}

/// One rebalance seen by the four workers of one process in the log store is one recreation: the
/// job ends at generation 1 with `max_recreations = 1` untouched (each worker's failure is judged by
/// its own executor's generation, so a failure handled after another worker's recreation only
/// restarts; a compare-and-set another process won is not counted).
#[test]
fn one_rebalance_seen_by_four_workers_of_one_process_is_one_recreation() {
    let _g = serial();
    let f = Fixture::new("fourone", 4, "max_rows_per_second = 1500");
    f.edit_config(
        "backoff_initial_ms = 100\nbackoff_max_ms = 1000\n",
        "max_recreations = 1\nbackoff_initial_ms = 3000\nbackoff_max_ms = 3000\n",
    );
    let (a_log, _) = join_mid_log_store_of(
        &f,
        &[
            "--partitions",
            "8",
            "--rows",
            "4000",
            "--changes",
            "40000",
            "--epoch-changes",
            "200",
        ],
        &["recreating the job"],
    );
    // Every worker of `a` that lost a partition saw the one rebalance and stopped its executor on
    // it: by raising the invariant error, or — when another worker's recreation came first — by
    // having the commit before it fenced, or by reading the job's new generation before either
    // (then the revocation meets no executor of generation 0, and raises nothing: CI saw this).
    let line_of = |what: &str, w: &str| {
        a_log
            .lines()
            .any(|l| l.contains(what) && l.contains(&format!("worker={w}")))
    };
    let workers = ["a-0", "a-1", "a-2", "a-3"];
    let revoked: Vec<&str> = workers
        .into_iter()
        .filter(|w| line_of("partitions revoked", w))
        .collect();
    let raised = workers
        .iter()
        .filter(|w| {
            line_of(
                "should not update vnode bitmap during consuming log store",
                w,
            )
        })
        .count();
    assert!(
        revoked.len() >= 2 && raised >= 1,
        "{} of a's workers saw the rebalance, {raised} raised the error\n{}",
        revoked.len(),
        support::tail(&a_log)
    );
    for w in &revoked {
        assert!(
            line_of(
                "should not update vnode bitmap during consuming log store",
                w
            ) || line_of("commit fenced", w)
                || line_of("job recreated: generation 0 -> 1", w),
            "worker {w} saw the rebalance but neither raised the error, nor was fenced, nor read \
             the new generation\n{}",
            support::tail(&a_log)
        );
    }
    let jobs: Vec<Vec<i64>> = f.sql("SELECT generation, recreations FROM kb_jobs");
    assert_eq!(
        jobs[0],
        vec![1, 1],
        "one recreation\n{}",
        support::tail(&a_log)
    );
    f.verify_eventually(MIN);
}

/// KIP-848: the same join in the log store under the consumer protocol (the broker's incremental
/// assignment) is the invariant error and one recreation, and the table is exact.
#[test]
fn under_the_consumer_protocol_a_join_during_the_log_store_recreates_the_job() {
    let _g = serial();
    let f = Fixture::new("kip848log", 1, "max_rows_per_second = 2000");
    f.use_consumer_protocol();
    join_is_recreated(&f);
}

/// `join_mid_log_store` under `reschedule`: absorbed — no invariant error, no recreation — and exact.
fn join_is_rescheduled(f: &Fixture) {
    let (a, b) = join_mid_log_store(f, &["vnode bitmap updated during log store: rescheduled"]);
    for log in [a, b] {
        assert!(
            !log.contains("should not update vnode bitmap during consuming log store"),
            "{}",
            support::tail(&log)
        );
    }
    let jobs: Vec<Vec<i64>> = f.sql("SELECT generation, recreations FROM kb_jobs");
    assert_eq!(jobs[0], vec![0, 0], "no recreation");
    f.verify_eventually(MIN);
}

/// KIP-848 under `recreation.policy = "reschedule"`: the join in the log store is absorbed — no
/// invariant error, no recreation — and the table is exact.
#[test]
fn under_the_consumer_protocol_and_reschedule_a_join_during_the_log_store_moves_partitions() {
    let _g = serial();
    let f = Fixture::new("kip848resched", 1, "max_rows_per_second = 2000");
    f.use_consumer_protocol();
    f.set_recreation_policy("reschedule");
    join_is_rescheduled(&f);
}

/// The same join under `recreation.policy = "reschedule"`: absorbed in the log store — no invariant
/// error, no recreation — and the table is exact.
#[test]
fn under_reschedule_a_consumer_joining_during_the_log_store_moves_partitions_without_recreation() {
    let _g = serial();
    let f = Fixture::new("logresched", 1, "max_rows_per_second = 3000");
    f.set_recreation_policy("reschedule");
    join_is_rescheduled(&f);
}

#[test]
fn a_consumer_joining_and_leaving_during_streaming_loses_nothing() {
    let _g = serial();
    let f = Fixture::new("streamjoin", 1, "");
    f.produce(&["--partitions", "4", "--rows", "1000", "--changes", "1000"]);
    // Only `a` serves HTTP (both read the same file at start-up).
    let addr = format!("127.0.0.1:{}", support::free_port());
    f.set_http(&addr);
    let mut a = f.spawn_run("a", &[]);
    a.wait_for("serving /metrics", MIN);
    let text = std::fs::read_to_string(&f.config).unwrap();
    std::fs::write(
        &f.config,
        text.replace(&format!("listen = \"{addr}\""), "listen = \"\""),
    )
    .unwrap();
    a.wait_for("to=\"streaming\"", MIN);
    // More changes arrive, continuing the same log, while a second consumer joins and then leaves.
    let writer = f.append(&[
        "--changes",
        "6000",
        "--rate",
        "1500",
        "--seed",
        "9",
        "--key-space",
        "2000",
    ]);
    std::thread::sleep(Duration::from_secs(1));
    let mut b = f.spawn_run("b", &[]);
    b.wait_for("partitions assigned", MIN);
    // The lag series `a` exports are those of the partitions it owns: a revoked partition's series
    // is removed (its new owner reports it).
    let deadline = std::time::Instant::now() + MIN;
    loop {
        let (_, status) = support::http_get(&format!("http://{addr}/status"));
        let (_, metrics) = support::http_get(&format!("http://{addr}/metrics"));
        let v: serde_json::Value = serde_json::from_str(&status).unwrap_or_default();
        let owned: std::collections::BTreeSet<String> = v["jobs"][0]["workers"][0]["partitions"]
            .as_array()
            .map(|ps| ps.iter().map(|p| p["partition"].to_string()).collect())
            .unwrap_or_default();
        let series: std::collections::BTreeSet<String> = metrics
            .lines()
            .filter(|l| l.starts_with("kafka_backfill_partition_lag{"))
            .filter_map(|l| {
                l.split("partition=\"")
                    .nth(1)?
                    .split('"')
                    .next()
                    .map(str::to_string)
            })
            .collect();
        if owned.len() < 4 && !owned.is_empty() && series == owned {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "lag series {series:?} for owned partitions {owned:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(2));
    b.signal("TERM");
    assert!(
        b.wait_exit(MIN).success(),
        "SIGTERM exits 0:\n{}",
        support::tail(&b.log_text())
    );
    let out = writer.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = f.verify_eventually(MIN);
    assert!(text.contains(" 0 missing, 0 extra, 0 different"), "{text}");
    a.signal("TERM");
    assert!(
        a.wait_exit(MIN).success(),
        "{}",
        support::tail(&a.log_text())
    );
    let log = a.log_text();
    assert!(log.contains("partitions revoked") && log.contains("partitions assigned"));
    assert!(
        !log.contains("should not update vnode bitmap"),
        "streaming allows rebalances"
    );
}

/// `kill -9` at moments spread over every phase (and so, sometimes, in the middle of a commit), restart,
/// and the result verifies: exactly once across crashes (SQLite; `tests/it/postgres_store.rs` does the same
/// on PostgreSQL).
#[test]
fn kill_9_in_every_phase_then_restart_verifies_clean() {
    let _g = serial();
    let f = Fixture::new("kill9", 2, "max_rows_per_second = 5000");
    support::kill_9_in_every_phase(&f);
}

/// librdkafka's resume does not wake the broker thread, which sleeps up to a second when it has no
/// fetch in flight (every partition paused, as through the snapshot phase): the first record after
/// a resume came 0–1 s late, 0.5 s on average, at the start of every log-store phase. The Kafka
/// port restarts the fetch at the loop's offset on resume, which wakes it. Six pause/resume rounds
/// on a real broker, each resume after the fetcher has gone idle: without the restart every round
/// here waited ≈ 0.7 s (each resume lands at the same point of the broker thread's one-second
/// sleep), with it ≈ 2 ms.
#[test]
fn a_resumed_partition_is_fetched_again_at_once() {
    use kafka_backfill::ports::ConsumerPort;
    use std::time::{Duration, Instant};
    let _g = serial();
    let f = Fixture::new("resume", 1, "");
    f.produce(&["--partitions", "1", "--rows", "10", "--changes", "2000"]);
    let mut consumer = bare_consumer(&f, "resume");
    let mut next = next_record(&mut consumer, Duration::from_secs(60))
        .expect("the first record within a minute")
        + 1;
    let mut waits = Vec::new();
    for _ in 0..6 {
        consumer.pause(0).unwrap();
        // Paused: nothing more is delivered once what was fetched is dropped, and the fetcher
        // idles. Records already polled are counted.
        while let Some(offset) = next_record(&mut consumer, Duration::from_millis(300)) {
            next = offset + 1;
        }
        let resumed = Instant::now();
        consumer.resume(0, Some(next)).unwrap();
        let offset = next_record(&mut consumer, Duration::from_secs(10))
            .expect("a record within 10 s of the resume");
        assert_eq!(offset, next, "the fetch restarts where the loop stopped");
        waits.push(resumed.elapsed());
        next = offset + 1;
    }
    assert!(
        waits.iter().all(|w| *w < Duration::from_millis(600)),
        "first record after each resume: {waits:?}"
    );
}

/// Records are read in batches (`src/kafka/fetch.rs`) and handed over one at a time: a pause drops
/// the partition's unreturned records as librdkafka drops its queued ones, a resume without an
/// offset goes back to the first of them, and the read position is never reported past a record
/// the loop has not had.
#[test]
fn a_batch_read_hands_over_every_record_once_across_pauses() {
    use kafka_backfill::ports::ConsumerPort;
    use std::time::Duration;
    let _g = serial();
    let f = Fixture::new("batch", 1, "");
    f.produce(&["--partitions", "1", "--rows", "10", "--changes", "3000"]);
    let mut consumer = bare_consumer(&f, "batch");
    let end = high_watermarks(&f, 1) as u64;
    assert!(end > 3000, "the log holds the changes and barriers: {end}");
    let mut next = 0;
    let mut pauses = 0;
    while next < end {
        // A few records, then a pause with the rest of the batch unreturned.
        for _ in 0..(37 + pauses * 101) {
            if next == end {
                break;
            }
            let offset = next_record(&mut consumer, Duration::from_secs(30))
                .unwrap_or_else(|| panic!("a record at offset {next} within 30 s"));
            assert_eq!(offset, next, "every record once, in order");
            next += 1;
            if let Some(read) = consumer.read_position(0) {
                assert!(
                    read <= next,
                    "read position {read} reported past record {next}, which the loop has not had"
                );
            }
        }
        if next == end {
            break;
        }
        consumer.pause(0).unwrap();
        assert_eq!(
            next_record(&mut consumer, Duration::from_millis(200)),
            None,
            "nothing of a paused partition is returned"
        );
        if let Some(read) = consumer.read_position(0) {
            assert!(
                read <= next,
                "read position {read} past {next} while paused"
            );
        }
        consumer.resume(0, None).unwrap();
        pauses += 1;
    }
    assert!(pauses >= 3, "paused {pauses} times");
}

/// A bare Kafka port on the fixture's one-partition topic, as a worker's loop holds it.
fn bare_consumer(f: &Fixture, job: &str) -> kafka_backfill::kafka::consumer::KafkaConsumer {
    use kafka_backfill::codec::{LogCodec, TableSchema};
    use kafka_backfill::kafka::consumer::{ConsumerSetup, KafkaConsumer};
    let table = TableSchema::parse(
        kafka_backfill::workload::EXAMPLE_ROW_SCHEMA,
        &["id".to_string()],
    )
    .unwrap();
    KafkaConsumer::subscribe(&ConsumerSetup {
        job: job.into(),
        topic: f.topic.clone(),
        kafka: [
            ("bootstrap.servers", f.bootstrap.as_str()),
            ("group.id", f.group.as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        codec: std::sync::Arc::new(LogCodec::new(table).unwrap()),
    })
    .unwrap()
}

/// The next record's offset from a bare port, polling up to `within` (an assignment is taken from
/// offset 0).
fn next_record(
    c: &mut kafka_backfill::kafka::consumer::KafkaConsumer,
    within: std::time::Duration,
) -> Option<u64> {
    use kafka_backfill::ports::{ConsumerPort, Polled};
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        match c.poll(20) {
            Some(Polled::Record { offset, .. }) => return Some(offset),
            Some(Polled::Assigned(parts)) => c
                .assign(&parts.iter().map(|p| (*p, Some(0))).collect::<Vec<_>>())
                .unwrap(),
            Some(Polled::ClientError {
                reason,
                fatal: true,
                ..
            }) => panic!("{reason}"),
            _ => {}
        }
    }
    None
}

/// A worker whose claim fails (its job was recreated meanwhile) still completes the assignment
/// without start offsets, and restarts before it reads. With `auto.offset.reset = error` a
/// partition assigned without an offset, on a group that never committed one, used to raise the
/// "records were deleted" error and stop the job (seen once in CI, in
/// `static_membership::without_static_membership_the_restart_is_a_rebalance_and_the_job_is_recreated`).
/// Such an assignment starts at the log's start and raises nothing.
#[test]
fn an_assignment_without_start_offsets_on_a_fresh_group_is_not_a_deleted_log() {
    use kafka_backfill::ports::{ConsumerPort, Polled};
    use std::time::{Duration, Instant};
    let _g = serial();
    let f = Fixture::new("nooffset", 1, "");
    f.produce(&["--partitions", "1", "--rows", "10", "--changes", "20"]);
    let mut consumer = bare_consumer(&f, "nooffset");
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = loop {
        assert!(Instant::now() < deadline, "no record within 30 s");
        match consumer.poll(20) {
            Some(Polled::Assigned(parts)) => consumer
                .assign(&parts.iter().map(|p| (*p, None)).collect::<Vec<_>>())
                .unwrap(),
            Some(Polled::Record { offset, .. }) => break offset,
            Some(Polled::ClientError { reason, fatal, .. }) => {
                assert!(
                    !fatal,
                    "an assignment without offsets stopped the job: {reason}"
                )
            }
            _ => {}
        }
    };
    assert_eq!(first, 0, "the fetch starts at the log's start");
}

/// The producer's flush (`kafka::flush`) waives librdkafka's linger and returns only once every
/// delivery report has reached the context: records held by a linger of a minute are delivered, and
/// counted, when a 20 s flush returns, and nothing is left outstanding. (Its speed against rdkafka's
/// own flush is the benchmark's: docs/BENCHMARKS.md "What the pipeline costs the cluster".)
#[test]
fn a_flush_waives_the_linger_and_returns_with_every_report_served() {
    use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    struct Count(AtomicUsize);
    impl rdkafka::ClientContext for Count {}
    impl ProducerContext for Count {
        type DeliveryOpaque = ();
        fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
            assert!(r.is_ok(), "a delivery failed: {:?}", r.as_ref().err());
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    let _g = serial();
    let bootstrap = support::bootstrap();
    let topic = format!("flush-{}", support::stamp());
    let props = std::collections::BTreeMap::from([("bootstrap.servers".to_string(), bootstrap)]);
    kafka_backfill::kafka::admin::ensure_topic(&props, &topic, 2).unwrap();
    let producer: BaseProducer<Count> = kafka_backfill::kafka::admin::client_config(&props)
        .set("linger.ms", "60000")
        .create_with_context(Count::default())
        .unwrap();
    for i in 0..1000u32 {
        let key = i.to_be_bytes();
        producer
            .send(
                BaseRecord::to(&topic)
                    .partition((i % 2) as i32)
                    .key(&key[..])
                    .payload("x"),
            )
            .unwrap();
    }
    kafka_backfill::kafka::flush::flush(&producer, Duration::from_secs(20))
        .expect("the flush waives the linger");
    assert_eq!(producer.context().0.load(Ordering::SeqCst), 1000);
    assert_eq!(producer.in_flight_count(), 0);
}
