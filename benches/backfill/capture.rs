//! Section `capture` of the benchmark (benches/backfill.rs) (`scripts/bench.sh --only capture`): `kafka-backfill capture`
//! on pgbench's accounts in the durable PostgreSQL, each figure beside its ceiling measured in the
//! same run — the snapshot against `COPY (SELECT …) TO STDOUT` of the same table, the stream against
//! a raw pgoutput reader (`pg_recvlogical`) on the same WAL, source-commit → sink-commit latency
//! under pgbench at a fixed rate, and the capture's peak RSS at two table sizes.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{dir, fmt_rate, rand_suffix, vm_hwm_kib, Report};

/// Sizes: pgbench scale factors of the small and large table (100,000 accounts per unit), the
/// streamed backlog in transactions, the latency samples, and pgbench's rate (transactions/s) while
/// they are taken (on the small table).
pub struct Sizes {
    pub small_scale: u32,
    pub large_scale: u32,
    pub backlog_txns: u32,
    pub latency_samples: usize,
    pub stream_tps: u32,
}

/// `sql` run by psql on `url` (stopping at the first error), its output trimmed.
pub(super) fn psql(url: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-qtAc", sql])
        .output()
        .expect("psql");
    assert!(
        out.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn db_url(pg: &str, db: &str) -> String {
    format!("{}/{db}", pg.rsplit_once('/').unwrap().0)
}

/// A database with pgbench's tables at `scale`, accounts with REPLICA IDENTITY FULL.
fn pgbench_db(pg: &str, scale: u32) -> String {
    let db = format!("capbench_{scale}_{}", rand_suffix());
    psql(pg, &format!("CREATE DATABASE {db}"));
    let url = db_url(pg, &db);
    let out = Command::new("pgbench")
        .args(["-i", "-q", "-s", &scale.to_string(), &url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pgbench -i: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    psql(&url, "ALTER TABLE pgbench_accounts REPLICA IDENTITY FULL");
    url
}

fn write_config(d: &Path, name: &str, bootstrap: &str, source: &str) -> std::path::PathBuf {
    let cfg = d.join("job.toml");
    std::fs::write(
        &cfg,
        format!(
            "[http]\nlisten = \"\"\n[[jobs]]\nname = \"{name}\"\ntopic = \"bench-{name}\"\nvnode_count = 256\n\
             snapshot = {{ kind = \"files\", dir = \"{snap}\" }}\n\
             store = {{ kind = \"sqlite\", path = \"{db}\", table = \"accounts\" }}\n\
             [jobs.kafka]\n\"bootstrap.servers\" = \"{bootstrap}\"\n\
             [jobs.capture]\nsource_url = \"{source}\"\ntable = \"public.pgbench_accounts\"\npartitions = 4\n",
            snap = d.join("snapshot").display(),
            db = d.join("replica.sqlite").display(),
        ),
    )
    .unwrap();
    cfg
}

fn spawn(bin: &Path, what: &str, cfg: &Path, log: &Path) -> Child {
    Command::new(bin)
        .args([what, "--config"])
        .arg(cfg)
        .env(
            "RUST_LOG",
            "info,kafka_backfill=debug,librdkafka=warn,pg_walstream=warn",
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

/// Waits until `log` holds `needle`, keeping the peak RSS of `child`; returns it (KiB).
fn wait_log(child: &mut Child, log: &Path, needle: &str, within: Duration) -> u64 {
    let deadline = Instant::now() + within;
    let mut peak = 0;
    loop {
        peak = peak.max(vm_hwm_kib(child.id()));
        if std::fs::read_to_string(log)
            .unwrap_or_default()
            .contains(needle)
        {
            return peak;
        }
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

fn stop(mut child: Child) {
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    child.wait().unwrap();
}

/// The seconds field of the capture's "snapshot copied" line.
pub(super) fn snapshot_seconds(log: &Path) -> f64 {
    seconds_at(log, "snapshot copied")
}

/// The `seconds=` field of the capture log's first line containing `needle`.
pub(super) fn seconds_at(log: &Path, needle: &str) -> f64 {
    let text = std::fs::read_to_string(log).unwrap();
    let line = text.lines().find(|l| l.contains(needle)).unwrap();
    line.split("seconds=")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn slot_confirmed(url: &str, slot: &str) -> u64 {
    let s = psql(
        url,
        &format!("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{slot}'"),
    );
    kafka_backfill::capture::pg::parse_lsn(&s).unwrap_or(0)
}

/// One table size: the snapshot against COPY, and the capture's peak RSS. Returns (rows, capture
/// rows/s, COPY rows/s, peak MiB, the database, the job folder, config).
fn snapshot_run(
    bin: &Path,
    bootstrap: &str,
    pg: &str,
    scale: u32,
) -> (u64, f64, f64, f64, String, std::path::PathBuf) {
    let url = pgbench_db(pg, scale);
    let rows: u64 = psql(&url, "SELECT count(*) FROM pgbench_accounts")
        .parse()
        .unwrap();
    // The ceiling: the same table copied out by PostgreSQL's own client, discarded.
    let t = Instant::now();
    let out = Command::new("psql")
        .args([
            &url,
            "-qc",
            "COPY (SELECT aid, bid, abalance, filler FROM pgbench_accounts) TO STDOUT",
        ])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(out.success());
    let copy_rate = rows as f64 / t.elapsed().as_secs_f64();
    let name = format!("capsnap{scale}x{}", rand_suffix());
    let d = dir(&name);
    let cfg = write_config(&d, &name, bootstrap, &url);
    let log = d.join("capture.log");
    let mut c = spawn(bin, "capture", &cfg, &log);
    let peak = wait_log(
        &mut c,
        &log,
        "capture checkpoint committed",
        Duration::from_secs(1800),
    );
    let secs = snapshot_seconds(&log);
    stop(c);
    (
        rows,
        rows as f64 / secs,
        copy_rate,
        peak as f64 / 1024.0,
        url,
        cfg,
    )
}

/// Runs the section; `pg` is the durable server's URL.
pub fn run(bin: &Path, bootstrap: &str, pg: &str, sizes: &Sizes, r: &mut Report) {
    eprintln!(
        "capture: snapshot at scale {} and {}…",
        sizes.small_scale, sizes.large_scale
    );
    let (rows, rate, copy, small_mib, url, cfg) =
        snapshot_run(bin, bootstrap, pg, sizes.small_scale);
    r.figure(
        "capture_snapshot",
        &format!("capture's snapshot of pgbench_accounts ({rows} rows, durable PostgreSQL): slot with exported snapshot, COPY in it (copy_connections 2: two ctid ranges in parallel), encode, sort by vnode, write and sync the files (the \"snapshot copied\" line's seconds); the ceiling, COPY (SELECT …) TO STDOUT of the same table by psql into /dev/null, {} rows/s", fmt_rate(copy)),
        format!("{} rows/s ({:.2}× COPY)", fmt_rate(rate), rate / copy),
        json!({"rows": rows, "rows_per_s": rate, "copy_rows_per_s": copy, "ratio": rate / copy}),
    );
    r.target(
        "capture snapshot ≥ 0.5× COPY TO STDOUT",
        format!("{:.2}×", rate / copy),
        Some(rate / copy >= 0.5),
    );
    let (large_rows, _, _, large_mib, large_url, _) =
        snapshot_run(bin, bootstrap, pg, sizes.large_scale);
    r.figure(
        "capture_rss",
        &format!("peak RSS (VmHWM) of the capture through its snapshot and first checkpoint: {rows} rows vs {large_rows} rows"),
        format!("{small_mib:.0} MiB vs {large_mib:.0} MiB ({:.2}×)", large_mib / small_mib),
        json!({"small_rows": rows, "small_mib": small_mib, "large_rows": large_rows, "large_mib": large_mib}),
    );
    r.target(
        "capture RSS flat from the small to the large table (≤ 1.25×)",
        format!("{:.2}×", large_mib / small_mib),
        Some(large_mib / small_mib <= 1.25),
    );
    psql(
        pg,
        &format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            large_url.rsplit('/').next().unwrap()
        ),
    );

    // The stream: a backlog written while the capture is stopped, read by pg_recvlogical (a second
    // slot created before the load) and by the capture resuming its own slot.
    eprintln!(
        "capture: streaming a backlog of {} pgbench transactions…",
        sizes.backlog_txns
    );
    let name = cfg
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let publication = format!("kb_{name}");
    let raw_slot = format!("raw_{}", rand_suffix());
    psql(
        &url,
        &format!("SELECT pg_create_logical_replication_slot('{raw_slot}', 'pgoutput')"),
    );
    let out = Command::new("pgbench")
        .args([
            "-n",
            "-c",
            "4",
            "-t",
            &(sizes.backlog_txns / 4).to_string(),
            &url,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pgbench: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let end = psql(&url, "SELECT pg_current_wal_lsn()");
    let end_lsn = kafka_backfill::capture::pg::parse_lsn(&end).unwrap();
    let txns = (sizes.backlog_txns / 4 * 4) as f64;
    let changes = 2.0 * txns; // each updates one account: UPDATE_DELETE + UPDATE_INSERT
    let t = Instant::now();
    let raw = Command::new("pg_recvlogical")
        .args([
            "-d",
            &url,
            "-S",
            &raw_slot,
            "--start",
            "-o",
            "proto_version=1",
            "-o",
        ])
        .arg(format!("publication_names={publication}"))
        .args(["-E", &end, "-f", "/dev/null"])
        .status()
        .unwrap();
    assert!(raw.success(), "pg_recvlogical failed");
    let raw_rate = changes / t.elapsed().as_secs_f64();
    psql(
        &url,
        &format!("SELECT pg_drop_replication_slot('{raw_slot}')"),
    );
    let d = cfg.parent().unwrap().to_path_buf();
    let log = d.join("capture-stream.log");
    let t = Instant::now();
    let c = spawn(bin, "capture", &cfg, &log);
    let deadline = Instant::now() + Duration::from_secs(1800);
    while slot_confirmed(&url, &format!("kb_{name}")) < end_lsn {
        assert!(Instant::now() < deadline, "the capture did not reach {end}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let secs = t.elapsed().as_secs_f64();
    let rate = changes / secs;
    r.figure(
        "capture_stream",
        &format!("capture resuming over a backlog of {txns} pgbench transactions ({changes} changes to pgbench_accounts): start → the slot acknowledged past the backlog's end (so every change is in a committed Kafka transaction; process start and fencing included); the ceiling, pg_recvlogical reading the same WAL through pgoutput into /dev/null, {} changes/s", fmt_rate(raw_rate)),
        format!("{} changes/s ({:.2}× pg_recvlogical)", fmt_rate(rate), rate / raw_rate),
        json!({"changes": changes, "changes_per_s": rate, "raw_changes_per_s": raw_rate, "ratio": rate / raw_rate}),
    );
    r.target(
        "capture stream ≥ 0.5× pg_recvlogical",
        format!("{:.2}×", rate / raw_rate),
        Some(rate / raw_rate >= 0.5),
    );

    // Latency: pgbench at `stream_tps` transactions/s, a probe writing the time into account 1's filler
    // every 100 ms, the replica (SQLite, `run`) polled until it shows it.
    eprintln!("capture: latency, {} samples…", sizes.latency_samples);
    let run_log = d.join("run.log");
    let mut run = spawn(bin, "run", &cfg, &run_log);
    wait_log(
        &mut run,
        &run_log,
        "to=\"streaming\"",
        Duration::from_secs(1800),
    );
    let mut bench = Command::new("pgbench")
        .args([
            "-n",
            "-c",
            "2",
            "-R",
            &sizes.stream_tps.to_string(),
            "-T",
            "3600",
            &url,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut client = kafka_backfill::capture::pg::connect(&url).unwrap();
    let sink = rusqlite::Connection::open(d.join("replica.sqlite")).unwrap();
    let lat = probe(&mut client, &sink, sizes.latency_samples);
    // The same probes while the capture takes snapshots of itself, one after another on request
    // (`kafka-backfill snapshot`, each timed from the request to its publication).
    eprintln!("capture: latency during snapshots of the running capture…");
    let stop_snapshots = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let snapshots = {
        let (bin, cfg, stop) = (bin.to_path_buf(), cfg.clone(), stop_snapshots.clone());
        std::thread::spawn(move || {
            let mut took = Vec::new();
            while took.is_empty() || !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                let out = Command::new(&bin)
                    .args(["snapshot", "--within-secs", "600", "--config"])
                    .arg(&cfg)
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "snapshot: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                took.push(t.elapsed().as_secs_f64());
            }
            took
        })
    };
    let mut during = probe(&mut client, &sink, sizes.latency_samples);
    stop_snapshots.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut took = snapshots.join().unwrap();
    took.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let snap_secs = took[took.len() / 2];
    let copy_secs = rows as f64 / copy;
    let quantile = |v: &[f64], q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
    let mut before = lat.clone();
    before.sort_by(|a, b| a.partial_cmp(b).unwrap());
    during.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let (before_p99, during_p99) = (quantile(&before, 0.99), quantile(&during, 0.99));
    r.figure(
        "capture_snapshot_while_streaming",
        &format!("a snapshot of the running capture on request ({rows} rows, pgbench at {} transactions/s alongside; `kafka-backfill snapshot` from the request to the published manifest, median of {}), against COPY (SELECT …) TO STDOUT of the same table by psql ({copy_secs:.2} s, the same run); and source commit → replica p99 while snapshots were taken against before ({} samples each)", sizes.stream_tps, took.len(), during.len()),
        format!("{snap_secs:.2} s ({:.2}× COPY); lag p99 {during_p99:.0} ms vs {before_p99:.0} ms before ({:.2}×)", snap_secs / copy_secs, during_p99 / before_p99),
        json!({"rows": rows, "snapshot_s": snap_secs, "copy_s": copy_secs, "snapshots": took.len(), "lag_p99_before_ms": before_p99, "lag_p99_during_ms": during_p99}),
    );
    r.target(
        "lag p99 while snapshots are taken ≤ 2× before",
        format!("{:.2}×", during_p99 / before_p99),
        Some(during_p99 <= 2.0 * before_p99),
    );
    bench.kill().unwrap();
    bench.wait().unwrap();
    stop(run);
    stop(c);
    snapshot_storage(bootstrap, &url, &d.join("snapshot/snapshots"), r);
    let mut lat = lat;
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let p = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    let (p50, p99) = (p(0.5), p(0.99));
    r.figure(
        "capture_latency",
        &format!("source commit → visible in the SQLite replica ({} samples: an UPDATE of account 1 committed at a random moment, then the replica polled every 2 ms), pgbench at {} transactions/s alongside, the capture's checkpoint_interval_ms at its default ({} ms), the runner's default checkpointing", lat.len(), sizes.stream_tps, kafka_backfill::core::capture::CaptureConfig::default().checkpoint_interval_ms),
        format!("p50 {p50:.0} ms, p99 {p99:.0} ms"),
        json!({"samples": lat.len(), "p50_ms": p50, "p99_ms": p99}),
    );
    r.target(
        "capture latency p99 ≤ 2 × checkpoint interval + 1 s (3,000 ms)",
        format!("{p99:.0} ms"),
        Some(p99 <= 3000.0),
    );
    psql(
        pg,
        &format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            url.rsplit('/').next().unwrap()
        ),
    );
}

/// `n` probes: an UPDATE of account 1 committed at a random moment, then the SQLite replica polled
/// every 2 ms until it shows it; the milliseconds each took.
/// Where snapshots are kept for runners on other machines (docs/CAPTURE.md "Where snapshots are
/// stored"): the newest snapshot under `root`, stored in Kafka (`snapshot_storage = "kafka"`) against
/// written into PostgreSQL as a snapshot source (`export-snapshot`, durable), and a runner's read of
/// it — restored from Kafka, then every vnode scanned from the files — against every vnode scanned
/// from PostgreSQL.
fn snapshot_storage(bootstrap: &str, url: &str, root: &Path, r: &mut Report) {
    use kafka_backfill::ports::SnapshotSource;
    let newest = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("manifest.json").exists())
        .map(|e| e.path())
        .max()
        .expect("a published snapshot");
    let files = kafka_backfill::snapshot::files::SnapshotFiles::open(&newest).unwrap();
    let scan_all = |s: &dyn SnapshotSource| -> u64 {
        let mut n = 0;
        for v in 0..s.info().vnode_count {
            for row in s.scan(v as _, None).unwrap() {
                row.unwrap();
                n += 1;
            }
        }
        n
    };
    let props = std::collections::BTreeMap::from([(
        "bootstrap.servers".to_string(),
        bootstrap.to_string(),
    )]);
    let topic = format!("capbench-snapshot-{}", rand_suffix());
    let t = Instant::now();
    let stored = kafka_backfill::snapshot::kafka::store(&props, &newest, &topic).unwrap();
    let kafka_store = t.elapsed().as_secs_f64();
    let into = root.parent().unwrap().join("restored");
    let t = Instant::now();
    kafka_backfill::snapshot::kafka::restore(&props, &topic, &into, &|_| true).unwrap();
    let restored = kafka_backfill::snapshot::files::SnapshotFiles::open(&into).unwrap();
    let rows = scan_all(&restored);
    let kafka_read = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let exported = kafka_backfill::snapshot::postgres::PostgresSnapshot::export(
        &files,
        url,
        "capbench",
        "kb_capbench_snapshot",
    )
    .unwrap();
    let pg_store = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let pg = kafka_backfill::snapshot::postgres::PostgresSnapshot::open(url, "capbench").unwrap();
    let pg_rows = scan_all(&pg);
    let pg_read = t.elapsed().as_secs_f64();
    assert_eq!((rows, pg_rows), (exported, exported), "every row read back");
    kafka_backfill::kafka::admin::delete_topic(&props, &topic).unwrap();
    r.figure(
        "capture_snapshot_storage",
        &format!("a snapshot of the running capture ({rows} rows, {} MiB of files) kept for runners on other machines: stored in a Kafka topic (snapshot_storage = \"kafka\", until acknowledged) against written into durable PostgreSQL as a snapshot source (export-snapshot, committed); a runner's read of it: restored from Kafka and every vnode scanned from the files, against every vnode scanned from PostgreSQL", stored.bytes >> 20),
        format!("store: Kafka {kafka_store:.2} s vs PostgreSQL {pg_store:.2} s ({:.1}×); read: Kafka {kafka_read:.2} s vs PostgreSQL {pg_read:.2} s ({:.1}×)", pg_store / kafka_store, pg_read / kafka_read),
        json!({"rows": rows, "bytes": stored.bytes, "kafka_store_s": kafka_store, "pg_store_s": pg_store, "kafka_read_s": kafka_read, "pg_read_s": pg_read}),
    );
}

fn probe(client: &mut postgres::Client, sink: &rusqlite::Connection, n: usize) -> Vec<f64> {
    let mut lat = Vec::new();
    for i in 0..n {
        let mark = format!("probe-{i}-{}", rand_suffix());
        let t = Instant::now();
        client
            .execute(
                "UPDATE pgbench_accounts SET filler = $1 WHERE aid = 1",
                &[&mark],
            )
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v: Option<String> = sink
                .query_row("SELECT filler FROM accounts WHERE aid = 1", [], |r| {
                    r.get(0)
                })
                .ok();
            if v.as_deref().map(str::trim_end) == Some(mark.as_str()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the probe never reached the replica"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        // A random gap, so the probes do not lock onto the checkpoint cadence.
        std::thread::sleep(Duration::from_millis(50 + rand_suffix() % 700));
    }
    lat
}
