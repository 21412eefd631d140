//! Snapshots of a running capture (docs/CAPTURE.md "Snapshots of a running capture"), against the
//! real PostgreSQL and broker: pgbench writes throughout, the capture takes a snapshot every two
//! seconds at a checkpoint barrier of the live log, retention deletes the log before the newest
//! one's start, and a job created afterwards starts from the newest — not from the log's start,
//! which is gone — and equals the source.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use crate::capture_e2e::{
    big_table_capture, capture_fixture, database, pgbench_init, pgbench_run, psql,
    released_after_the_wait, spawn_capture, spawn_capture_serving, stop_capture,
    verify_job_eventually, wait_child, SourceDb, MIN,
};
use crate::contract_e2e::check_log;
use crate::support::*;

/// The published snapshots under `<snapshot.dir>/snapshots` (each folder with its manifest), by
/// epoch.
pub(crate) fn published(f: &Fixture) -> Vec<(u64, PathBuf)> {
    let root = f.dir.join("out/snapshot/snapshots");
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("manifest.json").exists())
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path())))
        .collect();
    found.sort();
    found
}

pub(crate) fn start_offsets(manifest_dir: &std::path::Path) -> Vec<u64> {
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(manifest_dir.join("manifest.json")).unwrap())
            .unwrap();
    m["start"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["next_offset"].as_u64().unwrap())
        .collect()
}

/// A source database with pgbench's accounts, its capture (`capture_extra`: more keys of its
/// `[jobs.capture]`) past its first snapshot, and pgbench writing for `secs` seconds.
fn streaming_capture(
    name: &str,
    capture_extra: &str,
    secs: u32,
) -> (SourceDb, Fixture, Runner, std::process::Child) {
    streaming_capture_serving(name, capture_extra, secs, "")
}

/// [`streaming_capture`] whose capture serves HTTP (`/metrics`) on `http` (none when empty).
fn streaming_capture_serving(
    name: &str,
    capture_extra: &str,
    secs: u32,
    http: &str,
) -> (SourceDb, Fixture, Runner, std::process::Child) {
    let source = database(name);
    pgbench_init(&source.url);
    let f = capture_fixture(name, &source.url, "public.pgbench_accounts");
    let text = std::fs::read_to_string(&f.config).unwrap();
    std::fs::write(&f.config, format!("{text}{capture_extra}")).unwrap();
    let mut capture = spawn_capture_serving(&f, "capture", http);
    capture.wait_for("snapshot copied", MIN);
    let bench = pgbench_run(&f, &source.url, 100, secs);
    (source, f, capture, bench)
}

/// A second job of `f`'s table, topic, snapshot folder and capture section, with a store of its
/// own, created now and started.
fn start_late_job(f: &Fixture, name: &str) -> (Fixture, Runner) {
    start_job_of(f, name, true)
}

/// [`start_late_job`]; with `share_folder` false, the job's `snapshot.dir` is its own (empty): a
/// runner on another machine.
pub(crate) fn start_job_of(f: &Fixture, name: &str, share_folder: bool) -> (Fixture, Runner) {
    let late = Fixture::new(&format!("{name}-late"), 1, "vnode_count = 64");
    let mut own = std::fs::read_to_string(&late.config).unwrap().replace(
        &format!("topic = \"{}\"", late.topic),
        &format!("topic = \"{}\"", f.topic),
    );
    if share_folder {
        own = own.replace(
            &late.dir.join("out/snapshot").display().to_string(),
            &f.dir.join("out/snapshot").display().to_string(),
        );
    }
    let text = std::fs::read_to_string(&f.config).unwrap();
    let capture_section = &text[text.find("[jobs.capture]").unwrap()..];
    std::fs::write(&late.config, format!("{own}{capture_section}")).unwrap();
    let run = late.spawn_run("late", &[]);
    (late, run)
}

/// `ALTER TABLE pgbench_accounts ADD COLUMN note text`, some rows given a note, and the capture's
/// announcement of that version.
fn add_a_note_column(source: &SourceDb, capture: &mut Runner) {
    psql(
        &source.url,
        "ALTER TABLE pgbench_accounts ADD COLUMN note text",
    );
    psql(
        &source.url,
        "UPDATE pgbench_accounts SET note = 'note ' || aid WHERE aid % 7 = 0",
    );
    capture.wait_for("schema version announced", MIN);
}

/// `kafka-backfill snapshot --within-secs <within>` of `f`'s job, which must succeed; its output.
pub(crate) fn snapshot_command(f: &Fixture, within: u32) -> String {
    let out = std::process::Command::new(BIN)
        .args(["snapshot", "--within-secs", &within.to_string(), "--config"])
        .arg(&f.config)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    said
}

/// The line in which `run` says which later snapshot it reads.
pub(crate) fn chosen_line(run: &mut Runner) -> String {
    const SAID: &str = "reading a later snapshot of the capture";
    run.wait_for(SAID, MIN);
    let log = run.log_text();
    log.lines().find(|l| l.contains(SAID)).unwrap().to_string()
}

#[test]
fn a_job_created_later_starts_from_a_snapshot_of_the_running_capture_and_equals_the_source() {
    let _serial = serial();
    let name = &format!("snaps-{}", stamp() % 1_000_000);
    let (source, f, mut capture, mut bench) =
        streaming_capture(name, "snapshot_interval_ms = 2000\nsnapshot_keep = 2\n", 12);
    // Two snapshots taken while pgbench writes.
    capture.wait_for_count("snapshot of the running capture published", 2, MIN);
    let snaps = published(&f);
    assert!(snaps.len() >= 2, "{snaps:?}");
    // Retention meanwhile deleted the log up to the newest snapshot's start (DeleteRecords): the
    // first snapshot cannot be continued any more, and check-log says so.
    let newest = start_offsets(&snaps[snaps.len() - 1].1);
    let below: Vec<(u32, u64)> = (0..).zip(newest.iter().copied()).collect();
    f.delete_records(&below);
    let (code, out) = check_log(&f);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("but the log now starts at offset"), "{out}");
    // A second job of the same table, topic and snapshot folder, created now, reads the newest
    // published snapshot, whose log starts after the first snapshot's.
    let (late, mut run) = start_late_job(&f, name);
    run.wait_for("to=\"log_store\"", MIN);
    let line = chosen_line(&mut run);
    let (epoch, dir) = published(&f)
        .into_iter()
        .find(|(e, _)| line.contains(&format!("epoch={e}")))
        .unwrap_or_else(|| panic!("{line}"));
    assert!(epoch >= snaps[snaps.len() - 1].0, "the newest: {line}");
    assert!(line.contains("the newest published"), "{line}");
    let first = start_offsets(&f.dir.join("out/snapshot"));
    let later = start_offsets(&dir);
    assert!(
        later.iter().zip(&first).all(|(l, f)| l > f),
        "the snapshot's log starts after the first snapshot's: {later:?} vs {first:?}"
    );
    // A second job, created once a newer snapshot is published, reads that one: two jobs stream
    // from two different snapshots while pgbench writes and the capture takes more; both exact.
    let deadline = Instant::now() + MIN;
    while published(&f).last().unwrap().0 <= epoch {
        assert!(Instant::now() < deadline, "no newer snapshot");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (second, mut run2) = start_late_job(&f, &format!("{name}b"));
    let line2 = chosen_line(&mut run2);
    let epoch2 = epoch_in(&line2);
    assert!(
        epoch2 > epoch,
        "the second job reads a newer snapshot: {line2}"
    );
    wait_child(&mut bench, MIN);
    for job in [&late, &second] {
        let report = verify_job_eventually(job, None, MIN);
        assert!(report.contains("10000 rows compared"), "{report}");
    }
    for r in [&mut run, &mut run2] {
        r.signal("TERM");
        assert!(r.wait_exit(MIN).success(), "{}", tail(&r.log_text()));
    }
    // Restarted after a newer snapshot was published, the job goes on with the one it started
    // from (its store recorded that epoch).
    let deadline = Instant::now() + MIN;
    while published(&f).last().unwrap().0 <= epoch {
        assert!(Instant::now() < deadline, "no newer snapshot");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let mut again = late.spawn_run("again", &[]);
    let line = chosen_line(&mut again);
    assert!(
        line.contains(&format!("epoch={epoch}")) && line.contains("the one the job started from"),
        "{line}"
    );
    again.wait_for("to=\"streaming\"", MIN);
    capture.wait_for("snapshot retired (no job reads it)", MIN);
    again.signal("TERM");
    assert!(again.wait_exit(MIN).success());
    // The job stopped; the source changes, the capture publishes newer snapshots, and retention
    // deletes the log up to the newest one's start: past what the job committed. Restarted, the
    // job moves to that snapshot (a new generation, its rows loaded again) and equals the source.
    psql(
        &source.url,
        "UPDATE pgbench_accounts SET abalance = abalance + 11 WHERE aid % 7 = 2",
    );
    let stopped_at = published(&f).last().unwrap().0;
    capture.wait_for_count("snapshot of the running capture published", 2, MIN);
    let deadline = Instant::now() + MIN;
    let (moved_to, moved_dir) = loop {
        let newer: Vec<_> = published(&f)
            .into_iter()
            .filter(|(e, _)| *e > stopped_at)
            .collect();
        if newer.len() >= 2 {
            break newer.last().cloned().unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "no two newer snapshots: {newer:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let below: Vec<(u32, u64)> = (0..).zip(start_offsets(&moved_dir)).collect();
    f.delete_records(&below);
    let mut moved = late.spawn_run("moved", &[]);
    moved.wait_for("it moves to a newer snapshot", MIN);
    let line = moved
        .log_text()
        .lines()
        .find(|l| l.contains("it moves to a newer snapshot"))
        .unwrap()
        .to_string();
    // The newest snapshot whose start is still in the log: the one retention cut at, or one the
    // capture published after it while the job started.
    let moved_to_seen = moved_to;
    let moved_to = number_after(&line, " to=");
    assert!(
        line.contains(&format!("from={epoch}"))
            && moved_to >= moved_to_seen
            && published(&f).iter().any(|(e, _)| *e == moved_to)
            && line.contains("generation=1")
            && line.contains("the job needs offset"),
        "{line} (retention cut at the snapshot of {moved_to_seen})"
    );
    let report = verify_job_eventually(&late, None, MIN);
    assert!(report.contains("10000 rows compared"), "{report}");
    moved.signal("TERM");
    assert!(moved.wait_exit(MIN).success());
    stop_capture(&mut capture);
    // Older snapshots were retired (each publication is followed by the retirement), keeping two
    // and the ones the jobs read (their marks).
    let left = published(&f);
    assert!(
        left.iter().any(|(e, _)| *e == epoch) && left.iter().any(|(e, _)| *e == moved_to),
        "the read ones are kept: {left:?}"
    );
    assert!(
        left.iter().any(|(e, _)| *e == epoch2),
        "the second job's is kept: {left:?}"
    );
    assert!(left.len() <= 5, "two kept and the three read: {left:?}");
    // The capture's state record lists every published snapshot with its offsets.
    let props = BTreeMap::from([("bootstrap.servers".to_string(), f.bootstrap.clone())]);
    let record = kafka_backfill::capture::log::read_state(&props, &f.topic, &f.name)
        .unwrap()
        .expect("a state record");
    let listed: Vec<u64> = record
        .snapshots
        .iter()
        .map(|s| s.snapshot_epoch.0)
        .collect();
    assert!(listed.contains(&epoch), "{listed:?} lacks {epoch}");
    let entry = record
        .snapshots
        .iter()
        .find(|s| s.snapshot_epoch.0 == epoch)
        .unwrap();
    assert_eq!(entry.start_offsets, later);
    assert_eq!(PathBuf::from(&entry.dir), dir);
    // No copy left half-written and visible: every folder has its manifest or is hidden.
    for e in std::fs::read_dir(f.dir.join("out/snapshot/snapshots")).unwrap() {
        let e = e.unwrap();
        let hidden = e.file_name().to_string_lossy().starts_with('.');
        assert!(hidden || e.path().join("manifest.json").exists(), "{e:?}");
    }
}

/// `kafka-backfill snapshot` asks a running capture (with no interval of its own) for a snapshot
/// and returns once it is published; a job created then reads it and equals the source. A job
/// without a capture is refused as a configuration error.
#[test]
fn a_snapshot_on_request_is_published_and_a_new_job_reads_it() {
    let _serial = serial();
    let name = &format!("snapreq-{}", stamp() % 1_000_000);
    let http = format!("127.0.0.1:{}", free_port());
    let (source, f, mut capture, mut bench) = streaming_capture_serving(name, "", 6, &http);
    let said = snapshot_command(&f, 60);
    // One snapshot published, counted by outcome and timed; the other outcomes there at 0.
    let (_, metrics) = http_get(&format!("http://{http}/metrics"));
    let series = |needle: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(needle))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {needle} in /metrics:\n{metrics}"))
    };
    let counted = |outcome: &str| {
        series(&format!(
            "kafka_backfill_capture_snapshots_total{{job_name=\"{}\",outcome=\"{outcome}\"}}",
            f.name
        ))
    };
    assert_eq!(counted("published"), 1.0);
    assert_eq!(counted("failed"), 0.0);
    assert_eq!(counted("retired"), 0.0);
    assert_eq!(series("kafka_backfill_capture_snapshot_seconds_count"), 1.0);
    // Every capture family docs/OPERATIONS.md documents is there.
    let missing: Vec<String> = documented_metric_families()
        .into_iter()
        .filter(|m| {
            m.starts_with("kafka_backfill_capture_") && !metrics.contains(&format!("# TYPE {m} "))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "documented in docs/OPERATIONS.md, absent from a capture's /metrics: {missing:?}"
    );
    let snaps = published(&f);
    assert_eq!(snaps.len(), 1, "one snapshot, the one asked for: {snaps:?}");
    assert!(
        said.contains(&format!("snapshot at epoch {} published in", snaps[0].0)),
        "{said}"
    );
    capture.wait_for("a snapshot was requested", MIN);
    // A job created now reads it.
    let (late, mut run) = start_late_job(&f, name);
    let line = chosen_line(&mut run);
    assert!(line.contains(&format!("epoch={}", snaps[0].0)), "{line}");
    wait_child(&mut bench, MIN);
    let out = std::process::Command::new(BIN)
        .args([
            "verify",
            "--against-source",
            "--within-secs",
            "120",
            "--config",
        ])
        .arg(&late.config)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{report}");
    assert!(report.contains("10000 rows compared"), "{report}");
    run.signal("TERM");
    run.wait_exit(MIN);
    // The job stopped; the source changes and retention deletes the whole log, so no snapshot
    // starts within it. Restarted, the job asks the capture for one, waits for it, moves to it
    // and equals the source.
    psql(
        &source.url,
        "UPDATE pgbench_accounts SET abalance = abalance - 5 WHERE aid % 9 = 4",
    );
    let partitions = start_offsets(&f.dir.join("out/snapshot")).len() as u32;
    let ends: Vec<(u32, u64)> = (0..).zip(end_offsets(&f, partitions)).collect();
    f.delete_records(&ends);
    let mut asked = late.spawn_run("asked", &[]);
    asked.wait_for("the job asks its capture for a snapshot", MIN);
    asked.wait_for("it moves to a newer snapshot", MIN);
    let report = verify_job_eventually(&late, None, MIN);
    assert!(report.contains("10000 rows compared"), "{report}");
    asked.signal("TERM");
    assert!(asked.wait_exit(MIN).success());
    stop_capture(&mut capture);
    // With the capture stopped, nothing answers: exit 3, saying so.
    let out = std::process::Command::new(BIN)
        .args(["snapshot", "--within-secs", "1", "--config"])
        .arg(&f.config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("no snapshot answered the request within 1 s"),
        "{err}"
    );
    // Only a capture takes snapshots.
    let plain = Fixture::new(&format!("{name}-plain"), 1, "");
    let out = std::process::Command::new(BIN)
        .args(["snapshot", "--config"])
        .arg(&plain.config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no [jobs.capture] section"), "{err}");
}

/// A kill -9 of the capture while it copies a requested snapshot: nothing of that copy is visible
/// (no published folder; its hidden one is removed at the restart), the request outlives the
/// process (the restarted capture answers it), and a job created then reads that snapshot and
/// equals the source, written before, during and after.
#[test]
fn a_kill_9_during_a_snapshot_copy_leaves_nothing_visible_and_the_request_is_answered() {
    let _serial = serial();
    let (source, f, rows) = big_table_capture("snapkill", "");
    let mut capture = spawn_capture(&f, "capture");
    capture.wait_for("capture checkpoint committed", MIN);
    psql(&source.url, "UPDATE big SET g = g + 1 WHERE id % 100 = 0");
    snapshot_command(&f, 0);
    capture.wait_for("snapshot of the running capture started", MIN);
    // The first copy logged it once; the second is under way.
    capture.wait_for_count("copying in ctid ranges", 2, MIN);
    capture.signal("KILL");
    capture.wait_exit(MIN);
    assert!(published(&f).is_empty(), "{:?}", published(&f));
    psql(&source.url, "UPDATE big SET g = g + 1 WHERE id % 100 = 1");
    let mut capture = spawn_capture(&f, "capture-again");
    capture.wait_for("a snapshot was requested", MIN);
    capture.wait_for("snapshot of the running capture published", MIN);
    let snaps = published(&f);
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    let hidden: Vec<String> = std::fs::read_dir(f.dir.join("out/snapshot/snapshots"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(
        hidden.is_empty(),
        "the killed copy's folder is gone: {hidden:?}"
    );
    psql(&source.url, "UPDATE big SET g = g + 1 WHERE id % 100 = 2");
    let (late, mut run) = start_late_job(&f, "snapkill");
    let line = chosen_line(&mut run);
    assert!(line.contains(&format!("epoch={}", snaps[0].0)), "{line}");
    let report = verify_job_eventually(&late, None, MIN);
    assert!(
        report.contains(&format!("{rows} rows compared")),
        "{report}"
    );
    run.signal("TERM");
    run.wait_exit(MIN);
    stop_capture(&mut capture);
}

/// Snapshots stored in Kafka (`snapshot_storage = "kafka"`): the capture stores each snapshot in a
/// topic of its own; a job on "another machine" (its own, empty `snapshot.dir`) created after
/// retention deleted the log up to the newest one's start restores that one from Kafka and equals
/// the source; snapshots no job reads are retired with their topics, the one it reads kept; and a
/// capture whose disk was replaced (its folder removed) restores its first snapshot and goes on.
#[test]
fn snapshots_stored_in_kafka_reach_a_runner_without_a_shared_folder() {
    let _serial = serial();
    let name = &format!("snapkafka-{}", stamp() % 1_000_000);
    let (source, f, mut capture, mut bench) = streaming_capture(
        name,
        "snapshot_interval_ms = 2000\nsnapshot_keep = 2\nsnapshot_storage = \"kafka\"\n",
        14,
    );
    // The first snapshot and two later ones stored.
    capture.wait_for_count("snapshot stored in Kafka", 3, MIN);
    let props = BTreeMap::from([("bootstrap.servers".to_string(), f.bootstrap.clone())]);
    let exists = |topic: &str| {
        kafka_backfill::kafka::admin::partition_count(&props, topic)
            .unwrap()
            .is_some()
    };
    let record = || {
        kafka_backfill::capture::log::read_state(&props, &f.topic, &f.name)
            .unwrap()
            .expect("a state record")
    };
    let deadline = Instant::now() + MIN;
    let (first_topic, newest) = loop {
        let r = record();
        if let (Some(t), Some(s)) = (
            r.snapshot_topic.clone(),
            r.snapshots
                .iter()
                .rev()
                .find(|s| s.topic.is_some())
                .cloned(),
        ) {
            break (t, s);
        }
        assert!(Instant::now() < deadline, "nothing stored: {r:?}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert!(exists(&first_topic), "{first_topic}");
    // Retention deletes the log up to the newest stored snapshot's start.
    let below: Vec<(u32, u64)> = (0..).zip(newest.start_offsets.iter().copied()).collect();
    f.delete_records(&below);
    // A job whose snapshot.dir is its own and empty.
    let (late, mut run) = start_job_of(&f, name, false);
    run.wait_for("snapshot restored from Kafka", MIN);
    run.wait_for("to=\"streaming\"", MIN);
    let log = run.log_text();
    let line = log
        .lines()
        .rfind(|l| l.contains("restoring the snapshot from Kafka"))
        .unwrap()
        .to_string();
    let epoch = epoch_in(&line);
    assert!(epoch >= newest.snapshot_epoch.0, "the newest: {line}");
    let restored = late
        .dir
        .join("out/snapshot/snapshots")
        .join(epoch.to_string());
    assert!(
        restored.join("manifest.json").exists(),
        "{} after {line}",
        restored.display()
    );
    assert!(
        !late.dir.join("out/snapshot/manifest.json").exists(),
        "the first snapshot is not restored for a job that does not read it"
    );
    wait_child(&mut bench, MIN);
    let report = verify_job_eventually(&late, None, MIN);
    assert!(report.contains("10000 rows compared"), "{report}");
    // Newer snapshots retire the older ones no job reads, topic and all; the job's is kept.
    capture.wait_for("snapshot retired (no job reads it)", MIN);
    let deadline = Instant::now() + MIN;
    loop {
        let r = record();
        let listed: Vec<u64> = r.snapshots.iter().map(|s| s.snapshot_epoch.0).collect();
        if r.snapshots.len() >= 2 {
            assert!(listed.contains(&epoch), "the read one is kept: {listed:?}");
            for s in &r.snapshots {
                assert!(s.topic.as_deref().is_none_or(exists), "{s:?}");
            }
            break;
        }
        assert!(Instant::now() < deadline, "no newer snapshot: {listed:?}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let retired = kafka_backfill::snapshot::kafka::topic_of(&f.topic, newest.snapshot_epoch);
    if newest.snapshot_epoch.0 != epoch {
        let deadline = Instant::now() + MIN;
        while exists(&retired) {
            assert!(Instant::now() < deadline, "{retired} was not retired");
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
    run.signal("TERM");
    assert!(run.wait_exit(MIN).success());
    // The capture's disk replaced: its folder gone, the restarted capture restores its first
    // snapshot from Kafka and streams on; the job, restarted, goes on with its own snapshot.
    stop_capture(&mut capture);
    std::fs::remove_dir_all(f.dir.join("out/snapshot")).unwrap();
    let mut capture = spawn_capture(&f, "capture-again");
    capture.wait_for("the first snapshot restored from Kafka", MIN);
    psql(
        &source.url,
        "UPDATE pgbench_accounts SET abalance = abalance + 7 WHERE aid % 10 = 3",
    );
    // Once a newer snapshot is stored, the restarted job still reads its own.
    let deadline = Instant::now() + MIN;
    while !record()
        .snapshots
        .iter()
        .any(|s| s.snapshot_epoch.0 > epoch && s.topic.is_some())
    {
        assert!(Instant::now() < deadline, "no newer stored snapshot");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let mut again = late.spawn_run("again", &[]);
    let line = chosen_line(&mut again);
    assert!(
        line.contains(&format!("epoch={epoch}")) && line.contains("the one the job started from"),
        "{line}"
    );
    let report = verify_job_eventually(&late, None, MIN);
    assert!(report.contains("10000 rows compared"), "{report}");
    again.signal("TERM");
    assert!(again.wait_exit(MIN).success());
    stop_capture(&mut capture);
}

/// Schema versions with snapshots stored in Kafka: a column added upstream is announced on the
/// state topic too, so a runner without the capture's folder follows it; the capture, killed and
/// restarted on an empty disk, gets its first snapshot and the versions back from Kafka and
/// follows a second column. The replica equals the source with both columns.
#[test]
fn schema_versions_reach_a_runner_without_the_capture_folder() {
    let _serial = serial();
    let name = &format!("snapver-{}", stamp() % 1_000_000);
    let (source, f, mut capture, mut bench) =
        streaming_capture(name, "snapshot_storage = \"kafka\"\n", 12);
    capture.wait_for("snapshot stored in Kafka", MIN);
    let (late, mut run) = start_job_of(&f, name, false);
    run.wait_for("snapshot restored from Kafka", MIN);
    run.wait_for("partitions assigned", MIN);
    add_a_note_column(&source, &mut capture);
    capture.signal("KILL");
    capture.wait_exit(MIN);
    std::fs::remove_dir_all(f.dir.join("out/snapshot")).unwrap();
    let mut capture = spawn_capture(&f, "capture-again");
    capture.wait_for("the first snapshot restored from Kafka", MIN);
    capture.wait_for("capture checkpoint committed", MIN);
    assert!(
        f.dir.join("out/snapshot/schema_versions").is_dir(),
        "the version announced before the kill is back"
    );
    psql(
        &source.url,
        "ALTER TABLE pgbench_accounts ADD COLUMN tier bigint",
    );
    psql(
        &source.url,
        "UPDATE pgbench_accounts SET tier = aid * 3 WHERE aid % 5 = 0",
    );
    capture.wait_for("schema version announced", MIN);
    wait_child(&mut bench, MIN);
    let report = verify_job_eventually(&late, None, MIN);
    assert!(report.contains("10000 rows compared"), "{report}");
    let columns: Vec<Vec<String>> =
        late.sql("SELECT name FROM pragma_table_info('accounts') ORDER BY cid");
    let columns: Vec<&str> = columns.iter().map(|c| c[0].as_str()).collect();
    assert!(
        columns.contains(&"note") && columns.contains(&"tier"),
        "{columns:?}"
    );
    let versions = std::fs::read_dir(late.dir.join("out/snapshot/schema_versions"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| !e.file_name().to_string_lossy().starts_with('.'))
        })
        .count();
    assert_eq!(versions, 2, "both versions reached the runner's folder");
    // A table added (docs/CAPTURE.md "Adding a table"): a runner of it on another machine, started
    // while the capture is held before it stores the snapshot holding the table, waits for that
    // snapshot in Kafka, restores it and equals the source.
    stop_capture(&mut capture);
    psql(
        &source.url,
        "ALTER TABLE pgbench_branches REPLICA IDENTITY FULL",
    );
    psql(
        &source.url,
        &format!(
            "ALTER PUBLICATION kb_{} ADD TABLE pgbench_branches",
            f.name.replace('-', "_")
        ),
    );
    let text = std::fs::read_to_string(&f.config).unwrap().replacen(
        "table = \"public.pgbench_accounts\"",
        "tables = [\"public.pgbench_accounts\", \"public.pgbench_branches\"]",
        1,
    );
    let text = text.replacen(
        "[jobs.snapshot]\n",
        "[jobs.snapshot]\ntable = \"pgbench_accounts\"\n",
        1,
    );
    std::fs::write(&f.config, text).unwrap();
    let mut capture = spawn_capture(&f, "capture-added");
    capture.wait_for("schema version announced", MIN);
    capture.signal("STOP");
    let early = !capture.log_text().contains("snapshot stored in Kafka");
    let branches = Fixture::new(&format!("{name}-br"), 1, "vnode_count = 64");
    let own = std::fs::read_to_string(&branches.config)
        .unwrap()
        .replace(
            &format!("topic = \"{}\"", branches.topic),
            &format!("topic = \"{}\"", f.topic),
        )
        .replacen(
            "[jobs.snapshot]\n",
            "[jobs.snapshot]\ntable = \"pgbench_branches\"\n",
            1,
        )
        .replacen("table = \"accounts\"", "table = \"branches\"", 1);
    let config = std::fs::read_to_string(&f.config).unwrap();
    let capture_section = &config[config.find("[jobs.capture]").unwrap()..];
    std::fs::write(&branches.config, format!("{own}{capture_section}")).unwrap();
    let mut br = branches.spawn_run("br", &[]);
    released_after_the_wait(&mut capture, &mut br, early, "pgbench_branches");
    br.wait_for("snapshot restored from Kafka", MIN);
    let report = verify_job_eventually(&branches, None, MIN);
    assert!(report.contains("1 rows compared"), "{report}");
    // The runner of accounts, restarted with the capture's new section (a log of several tables:
    // it names its table), starts at once: accounts is a table of the first snapshot, not one to
    // wait for.
    run.signal("TERM");
    assert!(run.wait_exit(MIN).success());
    let mine = std::fs::read_to_string(&late.config).unwrap();
    let mine = mine[..mine.find("[jobs.capture]").unwrap()].replacen(
        "[jobs.snapshot]\n",
        "[jobs.snapshot]\ntable = \"pgbench_accounts\"\n",
        1,
    );
    std::fs::write(&late.config, format!("{mine}{capture_section}")).unwrap();
    let mut run = late.spawn_run("late-again", &[]);
    run.wait_for("partitions assigned", MIN);
    assert!(!run
        .log_text()
        .contains("waiting for a snapshot of its capture holding table"));
    let report = verify_job_eventually(&late, None, MIN);
    assert!(report.contains("10000 rows compared"), "{report}");
    for r in [&mut run, &mut br] {
        r.signal("TERM");
        assert!(r.wait_exit(MIN).success());
    }
    stop_capture(&mut capture);
}

/// `kill -9` of a runner while it restores a snapshot from Kafka (a 260,000-row table, some 30 MB):
/// nothing half-restored is visible (the snapshot folder has no manifest; the pieces are in a hidden
/// folder), and the restarted runner removes the abandoned restore, restores again and is exact.
#[test]
fn a_kill_9_of_a_runner_restoring_from_kafka_leaves_nothing_visible_and_the_restart_is_exact() {
    let _serial = serial();
    let name = &format!("restkill-{}", stamp() % 1_000_000);
    let (_source, f, rows) = big_table_capture(name, "");
    // The capture section is the configuration's last.
    let text = std::fs::read_to_string(&f.config).unwrap();
    std::fs::write(&f.config, format!("{text}snapshot_storage = \"kafka\"\n")).unwrap();
    let mut capture = spawn_capture(&f, "capture");
    capture.wait_for("snapshot stored in Kafka", 2 * MIN);
    let (late, mut run) = start_job_of(&f, name, false);
    run.wait_for("restoring the snapshot from Kafka", MIN);
    let out = late.dir.join("out");
    // `out` does not exist yet when the kill lands before the restore wrote anything.
    let hidden = || -> Vec<String> {
        std::fs::read_dir(&out)
            .into_iter()
            .flatten()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with(".restoring-"))
            .collect()
    };
    // Killed once the restore's hidden folder exists (or it is over): mid-copy, as a rule.
    let deadline = Instant::now() + MIN;
    while hidden().is_empty() && !run.log_text().contains("snapshot restored from Kafka") {
        assert!(Instant::now() < deadline, "the restore never began");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    run.signal("KILL");
    run.wait_exit(MIN);
    let interrupted = !run.log_text().contains("snapshot restored from Kafka");
    let cut = hidden();
    if interrupted {
        assert!(
            !out.join("snapshot/manifest.json").exists(),
            "a restore cut short is not visible"
        );
        assert_eq!(cut.len(), 1, "the cut restore's pieces: {cut:?}");
    }
    let mut run = late.spawn_run("late-again", &[]);
    run.wait_for("snapshot restored from Kafka", MIN);
    run.wait_for("to=\"streaming\"", MIN);
    assert!(hidden().is_empty(), "left behind: {:?}", hidden());
    let report = verify_job_eventually(&late, None, MIN);
    assert!(
        report.contains(&format!("{rows} rows compared")),
        "{report}"
    );
    eprintln!("restore interrupted by the kill: {interrupted}; its pieces left: {cut:?}");
    run.signal("TERM");
    assert!(run.wait_exit(MIN).success());
    stop_capture(&mut capture);
}

/// A column added while a job reads a later snapshot (file storage, one shared folder): the job
/// follows the new version, which the capture announces beside its first snapshot; the capture's
/// next snapshot, taken without a restart, copies the new column, and a job created then reads
/// it; both equal the source. A nullable column added with a default too: the copy writes its
/// union as its version declares it (`[int, "null"]`).
#[test]
fn a_column_added_after_a_later_snapshot_reaches_its_job_and_the_next_snapshot_copies_it() {
    let _serial = serial();
    let name = &format!("snapcol-{}", stamp() % 1_000_000);
    let (source, f, mut capture, mut bench) = streaming_capture(name, "", 4);
    let said = snapshot_command(&f, 60);
    let first = published(&f);
    assert_eq!(first.len(), 1, "{said}");
    let (late, mut run) = start_late_job(&f, name);
    let line = chosen_line(&mut run);
    assert!(line.contains(&format!("epoch={}", first[0].0)), "{line}");
    run.wait_for("partitions assigned", MIN);
    wait_child(&mut bench, MIN);
    add_a_note_column(&source, &mut capture);
    // And a nullable column with a default: its version's union is `[int, "null"]`, the default
    // in the first branch, which the next snapshot's copy writes too.
    psql(
        &source.url,
        "ALTER TABLE pgbench_accounts ADD COLUMN flag int DEFAULT 3",
    );
    psql(
        &source.url,
        "UPDATE pgbench_accounts SET flag = NULL WHERE aid % 13 = 0",
    );
    capture.wait_for_count("schema version announced", 2, MIN);
    let report = verify_job_eventually(&late, None, MIN);
    assert!(report.contains("10000 rows compared"), "{report}");
    let said = snapshot_command(&f, 60);
    let after = published(&f);
    assert_eq!(after.len(), 2, "{said}");
    let newest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(after[1].1.join("manifest.json")).unwrap()).unwrap();
    assert!(
        newest["row_schema"].to_string().contains("\"note\""),
        "the snapshot after the column was added copies it: {newest}"
    );
    let flag = newest["row_schema"]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "flag")
        .cloned();
    assert_eq!(
        flag,
        Some(serde_json::json!({"name": "flag", "type": ["int", "null"], "default": 3})),
        "{newest}"
    );
    psql(
        &source.url,
        "UPDATE pgbench_accounts SET note = 'later ' || aid WHERE aid % 11 = 0",
    );
    let (newer, mut run2) = start_late_job(&f, &format!("{name}-2"));
    let line = chosen_line(&mut run2);
    assert!(line.contains(&format!("epoch={}", after[1].0)), "{line}");
    for job in [&late, &newer] {
        let report = verify_job_eventually(job, None, MIN);
        assert!(report.contains("10000 rows compared"), "{report}");
    }
    for r in [&mut run, &mut run2] {
        r.signal("TERM");
        assert!(r.wait_exit(MIN).success());
    }
    stop_capture(&mut capture);
}
