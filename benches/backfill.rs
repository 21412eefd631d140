//! The benchmark harness (`scripts/bench.sh`): measures, in one run on the repo's real broker, the
//! ceiling (a bare rdkafka consumer and Kafka's ConsumerPerformance), the log-store phase into SQLite and
//! PostgreSQL, the snapshot phase beside a bare decode of the same files, checkpoint commit latency,
//! peak memory while catching up two backlog sizes, and recreation turnaround. Prints a table and writes
//! the same figures as JSON (with the ratios). Figures, not assertions: this is not a test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_backfill::core::{
    Checkpoint, CheckpointCause, Epoch, Phase, Row, RowMutation, VnodeProgress,
};
use kafka_backfill::kafka::worker::StatusBoard;
use kafka_backfill::ports::{SnapshotSource, StateStore};
use kafka_backfill::service::config::{
    Config, HttpConfig, JobConfig, LocalCheckpointConfig, LogConfig, RecreationConfig,
    SnapshotConfig, StoreConfig,
};
use kafka_backfill::service::job::{self, RunOptions};
use kafka_backfill::snapshot::files::SnapshotFiles;
use kafka_backfill::store::sqlite::SqliteStore;
use kafka_backfill::workload::{self, Workload};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::json;

struct Args {
    quick: bool,
    log_changes: u64,
    snapshot_rows: u64,
    memory_small: u64,
    memory_large: u64,
    partitions: u32,
    out: PathBuf,
}

fn args() -> Args {
    let a: Vec<String> = std::env::args().collect();
    let quick = a.iter().any(|x| x == "--quick");
    let get = |name: &str, default: u64| {
        a.iter()
            .position(|x| x == name)
            .and_then(|i| a.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let s = if quick { 10 } else { 1 };
    Args {
        quick,
        log_changes: get("--log-changes", 2_000_000 / s),
        snapshot_rows: get("--snapshot-rows", 1_000_000 / s),
        memory_small: get("--memory-small", 1_000_000 / s),
        memory_large: get("--memory-large", 10_000_000 / s),
        partitions: get("--partitions", 8) as u32,
        out: PathBuf::from(
            a.iter()
                .position(|x| x == "--json")
                .and_then(|i| a.get(i + 1))
                .cloned()
                .unwrap_or("target/bench/results.json".into()),
        ),
    }
}

fn sh(cmd: &str, args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(cmd)
        .args(args)
        .output()
        .expect(cmd);
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn dir(name: &str) -> PathBuf {
    let d = Path::new("target/bench").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn produce(
    bootstrap: &str,
    topic: &str,
    partitions: u32,
    rows: u64,
    changes: u64,
    out: &Path,
) -> workload::WorkloadReport {
    workload::produce(&Workload {
        bootstrap: bootstrap.into(),
        topic: topic.into(),
        partitions,
        vnode_count: 256,
        rows,
        key_space: (rows * 2).max(100_000),
        changes,
        changes_per_epoch: 2_000,
        checkpoint_every: 5,
        update_percent: 70,
        row_size: 100,
        rate: 0,
        out: out.to_path_buf(),
        seed: 42,
        progress: false,
        append: false,
        table: Default::default(),
        kafka_properties: Default::default(),
        transactional: false,
    })
    .unwrap()
}

fn high_watermarks(bootstrap: &str, topic: &str, partitions: u32) -> Vec<(u32, i64, i64)> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    (0..partitions)
        .map(|p| {
            let (lo, hi) = c
                .fetch_watermarks(topic, p as i32, Duration::from_secs(10))
                .unwrap();
            (p, lo, hi)
        })
        .collect()
}

/// (a) A bare rdkafka consumer reading the topic end to end, no decoding: records per second.
fn bare_consume(bootstrap: &str, topic: &str, partitions: u32) -> (u64, f64) {
    let marks = high_watermarks(bootstrap, topic, partitions);
    let total: i64 = marks.iter().map(|(_, lo, hi)| hi - lo).sum();
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("bench-bare-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "100")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for (p, lo, _) in &marks {
        tpl.add_partition_offset(topic, *p as i32, Offset::Offset(*lo))
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let t = Instant::now();
    let (mut n, mut bytes) = (0i64, 0usize);
    while n < total {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
            n += 1;
            bytes += m.payload().map_or(0, |p| p.len());
        }
    }
    std::hint::black_box(bytes);
    (n as u64, n as f64 / t.elapsed().as_secs_f64())
}

/// (a) Kafka's own ConsumerPerformance on the same topic: records per second.
fn consumer_performance(bootstrap: &str, topic: &str, records: u64) -> f64 {
    let out = sh(
        "scripts/kafka.sh",
        &[
            "tool",
            "org.apache.kafka.tools.ConsumerPerformance",
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--messages",
            &records.to_string(),
            "--timeout",
            "60000",
        ],
    );
    // The last line: start, end, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, ...
    let last = out.lines().last().unwrap_or_default();
    last.split(',')
        .nth(5)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

fn job_config(
    name: &str,
    topic: &str,
    bootstrap: &str,
    snapshot: &Path,
    store: StoreConfig,
) -> Config {
    let mut kafka = BTreeMap::new();
    kafka.insert("bootstrap.servers".to_string(), bootstrap.to_string());
    kafka.insert(
        "group.id".to_string(),
        format!("bench-{name}-{}", std::process::id()),
    );
    Config {
        http: HttpConfig {
            listen: String::new(),
            ..Default::default()
        },
        log: LogConfig::default(),
        shutdown_grace_secs: 30,
        jobs: vec![JobConfig {
            name: name.into(),
            topic: topic.into(),
            workers: 1,
            vnode_count: 256,
            kafka,
            snapshot: SnapshotConfig::Files {
                dir: snapshot.to_path_buf(),
            },
            store,
            local_checkpoint: LocalCheckpointConfig::default(),
            recreation: RecreationConfig::default(),
            max_rows_per_second: 0,
            max_epochs_ahead: 256,
        }],
    }
}

/// The phase a worker is in, as its `kafka_backfill_phase` gauge says (set at the moment it changes).
fn gauge_phase(job: &str) -> Option<Phase> {
    let m = kafka_backfill::service::metrics::metrics();
    Phase::ALL.into_iter().find(|p| {
        m.phase
            .with_label_values(&[job, "bench-0", p.as_str()])
            .get()
            == 1
    })
}

fn phase_of(board: &StatusBoard) -> Option<(Phase, u64, u64)> {
    let b = board.lock().unwrap();
    b.values().flat_map(|w| w.values()).next().and_then(|r| {
        r.status
            .as_ref()
            .map(|s| (s.phase, s.counters.snapshot_rows, s.generation))
    })
}

/// Runs a job in-process to catch-up; returns seconds spent in the snapshot and log-store phases.
fn timed_run(config: &Config) -> (f64, f64) {
    let board = job::new_board();
    let stop = Arc::new(AtomicBool::new(false));
    let (c, b, s) = (config.clone(), board.clone(), stop.clone());
    let h = std::thread::spawn(move || {
        job::run(
            &c,
            &RunOptions {
                exit_when_caught_up: true,
                worker_prefix: Some("bench".into()),
                ..Default::default()
            },
            s,
            b,
        )
    });
    // Start of the snapshot: the phase gauge. End of the snapshot and of the log store: when the
    // `snapshotdone` and `caughtup` checkpoints are *committed* (commits are pipelined, so the phase
    // gauge runs ahead of the store).
    let (mut t_snap, mut t_log, mut t_stream) = (None, None, None);
    let job = config.jobs[0].name.clone();
    let committed = |cause: &str| {
        kafka_backfill::service::metrics::metrics()
            .checkpoints
            .with_label_values(&[&job, cause])
            .get()
            > 0
    };
    while !h.is_finished() {
        let now = Instant::now();
        if t_snap.is_none() && gauge_phase(&job).is_some_and(|p| p != Phase::Unassigned) {
            t_snap = Some(now);
        }
        if t_log.is_none() && committed("snapshotdone") {
            t_log = Some(now);
        }
        if t_stream.is_none() && committed("caughtup") {
            t_stream = Some(now);
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    h.join().unwrap().unwrap();
    let end = Instant::now();
    let t_log = t_log.unwrap_or(end);
    let snap = t_snap.map_or(0.0, |t| (t_log - t).as_secs_f64());
    let log = (t_stream.unwrap_or(end) - t_log).as_secs_f64();
    (snap, log)
}

/// (e) Reading and checking every row of the snapshot files, with key extraction: rows per second.
fn bare_decode(snapshot: &Path) -> (u64, f64) {
    let s = SnapshotFiles::open(snapshot).unwrap();
    let t = Instant::now();
    let mut n = 0u64;
    for v in 0..s.info().vnode_count as u16 {
        for r in s.scan(v, None).unwrap() {
            std::hint::black_box(r.unwrap());
            n += 1;
        }
    }
    (n, n as f64 / t.elapsed().as_secs_f64())
}

/// (f) Commit latency of checkpoints with `n` changed rows on SQLite: (p50, p99) in ms.
fn commit_latency(n: usize, repeats: usize) -> (f64, f64) {
    let d = dir(&format!("commit-{n}"));
    let table =
        kafka_backfill::codec::TableSchema::parse(workload::EXAMPLE_ROW_SCHEMA, &["id".into()])
            .unwrap();
    let mut store = SqliteStore::open(&d.join("s.sqlite"), "accounts", table.clone()).unwrap();
    let info = kafka_backfill::ports::SnapshotInfo {
        snapshot_epoch: Epoch(1 << 16),
        vnode_count: 256,
        partition_count: 1,
        start: vec![kafka_backfill::core::PartitionProgress {
            partition: 0,
            next_offset: 0,
            epoch: Epoch(2 << 16),
            streaming: false,
        }],
    };
    store.ensure_job("b", &info).unwrap();
    let lease = store.claim("b", 0, "w", &[0], &info).unwrap()[0].lease;
    let mut rng = kafka_backfill::rng::SimRng::new(1);
    let mut times = Vec::new();
    for r in 0..repeats {
        let rows: Vec<RowMutation> = (0..n)
            .map(|i| {
                let id = (r * n + i) as i64 % (n as i64 * 3);
                let datum = table
                    .encode_row(&workload::example_row(id, r as i64, 100, &mut rng))
                    .unwrap();
                let key = table.key_of_datum(&datum).unwrap();
                let vnode = kafka_backfill::core::vnode_of(&key, 256);
                RowMutation::Upsert {
                    vnode,
                    row: Row { key, value: datum },
                    offset: None,
                }
            })
            .collect();
        let cp = Checkpoint {
            generation: 0,
            worker: "w".into(),
            cause: CheckpointCause::Barrier,
            epoch: Some(Epoch((3 + r as u64) << 16)),
            leases: vec![(0, lease)],
            rows,
            vnodes: (0..256u16)
                .map(|v| VnodeProgress {
                    epoch: Epoch((3 + r as u64) << 16),
                    finished: true,
                    ..VnodeProgress::fresh(v, Epoch(1 << 16))
                })
                .collect(),
            partitions: vec![],
        };
        let t = Instant::now();
        store.commit("b", &cp).unwrap();
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let pct = |p: f64| times[((times.len() as f64 - 1.0) * p).round() as usize];
    (pct(0.5), pct(0.99))
}

/// (g) Peak resident memory (VmHWM) of the real binary catching up a backlog, in MiB.
fn peak_memory(bootstrap: &str, records_target: u64, partitions: u32) -> (u64, f64, f64) {
    let name = format!("mem{records_target}");
    let d = dir(&name);
    let topic = format!("bench-{name}-{}", std::process::id());
    // ~1.35 records per change for this mix.
    let rep = produce(
        bootstrap,
        &topic,
        partitions,
        10_000,
        (records_target as f64 / 1.35) as u64,
        &d,
    );
    let records: i64 = high_watermarks(bootstrap, &topic, partitions)
        .iter()
        .map(|(_, lo, hi)| hi - lo)
        .sum();
    let cfg = d.join("job.toml");
    std::fs::write(
        &cfg,
        format!(
            "[http]\nlisten = \"\"\n[log]\nlevel = \"warn\"\n[[jobs]]\nname = \"{name}\"\ntopic = \"{topic}\"\n[jobs.kafka]\n\"bootstrap.servers\" = \"{bootstrap}\"\n[jobs.snapshot]\nkind = \"files\"\ndir = \"{}\"\n[jobs.store]\nkind = \"sqlite\"\npath = \"{}\"\ntable = \"accounts\"\n",
            d.join("snapshot").display(),
            d.join("state.sqlite").display()
        ),
    )
    .unwrap();
    let _ = rep;
    let t = Instant::now();
    let mut child = Command::new("target/release/kafka-backfill")
        .args(["run", "--exit-when-caught-up", "--config"])
        .arg(&cfg)
        .spawn()
        .unwrap();
    let mut peak_kb = 0u64;
    loop {
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{}/status", child.id())) {
            for l in s.lines().filter(|l| l.starts_with("VmHWM:")) {
                peak_kb = peak_kb.max(
                    l.split_whitespace()
                        .nth(1)
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0),
                );
            }
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (
        records as u64,
        peak_kb as f64 / 1024.0,
        t.elapsed().as_secs_f64(),
    )
}

/// (h) From the rebalance (a second worker joining in the log-store phase) to the first row of the
/// new generation's snapshot scan, in seconds.
fn recreation_turnaround(bootstrap: &str, partitions: u32) -> f64 {
    let d = dir("recreate");
    let topic = format!("bench-recreate-{}", std::process::id());
    produce(bootstrap, &topic, partitions, 20_000, 400_000, &d);
    let mut config = job_config(
        "recreate",
        &topic,
        bootstrap,
        &d.join("snapshot"),
        StoreConfig::Sqlite {
            path: d.join("s.sqlite"),
            table: "accounts".into(),
        },
    );
    config.jobs[0].max_rows_per_second = 40_000; // keep the log-store phase long enough to rescale in it
    config.jobs[0].recreation.backoff_initial_ms = 0;
    let (board_a, board_b) = (job::new_board(), job::new_board());
    let stop = Arc::new(AtomicBool::new(false));
    let spawn = |prefix: &str, board: StatusBoard| {
        let (c, s, p) = (config.clone(), stop.clone(), prefix.to_string());
        std::thread::spawn(move || {
            job::run(
                &c,
                &RunOptions {
                    exit_when_caught_up: false,
                    worker_prefix: Some(p),
                    ..Default::default()
                },
                s,
                board,
            )
        })
    };
    let a = spawn("a", board_a.clone());
    while phase_of(&board_a).map(|p| p.0) != Some(Phase::LogStore) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let b = spawn("b", board_b.clone());
    let errors = || {
        kafka_backfill::service::metrics::metrics()
            .invariant_errors
            .with_label_values(&["recreate"])
            .get()
    };
    let before = errors();
    let deadline = Instant::now() + Duration::from_secs(60);
    while errors() == before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(200));
    }
    let t0 = Instant::now();
    let mut t1 = None;
    while Instant::now() < deadline {
        let started = [&board_a, &board_b].iter().any(|b| {
            phase_of(b).is_some_and(|(ph, rows, g)| g >= 1 && ph == Phase::Snapshot && rows > 0)
        });
        if started {
            t1 = Some(Instant::now());
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = a.join();
    let _ = b.join();
    t1.map_or(f64::NAN, |t| (t - t0).as_secs_f64())
}

fn main() {
    // `cargo test --all-targets` runs this binary too, without `--bench`: nothing to do then.
    if !std::env::args().any(|a| a == "--bench") {
        println!(
            "benches/backfill.rs: run it with `scripts/bench.sh` (cargo bench), not as a test"
        );
        return;
    }
    let a = args();
    let bootstrap = sh("scripts/kafka.sh", &["start"]);
    let pg = sh("scripts/postgres.sh", &["start"]);
    let pid = std::process::id();
    let mut r = serde_json::Map::new();
    let machine = format!(
        "{} cores, {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(
                |c| c.lines().find(|l| l.starts_with("model name")).map(|l| l
                    .split(':')
                    .nth(1)
                    .unwrap_or("")
                    .trim()
                    .to_string())
            )
            .unwrap_or_default()
    );
    r.insert("machine".into(), json!(machine));
    r.insert("quick".into(), json!(a.quick));

    // Log-store workload: a small snapshot and a large log.
    eprintln!(
        "preparing the log topic ({} changes over {} partitions)…",
        a.log_changes, a.partitions
    );
    let d = dir("log");
    let topic = format!("bench-log-{pid}");
    produce(&bootstrap, &topic, a.partitions, 10_000, a.log_changes, &d);
    let (records, bare) = bare_consume(&bootstrap, &topic, a.partitions);
    let perf = consumer_performance(&bootstrap, &topic, records);
    let (_, log_sqlite_s) = timed_run(&job_config(
        &format!("logsqlite{pid}"),
        &topic,
        &bootstrap,
        &d.join("snapshot"),
        StoreConfig::Sqlite {
            path: d.join("s.sqlite"),
            table: "accounts".into(),
        },
    ));
    let table = format!("bench_log_{pid}");
    let (_, log_pg_s) = timed_run(&job_config(
        &format!("logpg{pid}"),
        &topic,
        &bootstrap,
        &d.join("snapshot"),
        StoreConfig::Postgres {
            url: kafka_backfill::service::config::Secret::new(pg.clone()),
            table,
        },
    ));
    let log_sqlite = records as f64 / log_sqlite_s;
    let log_pg = records as f64 / log_pg_s;
    r.insert("log_records".into(), json!(records));
    r.insert("a_bare_rdkafka_records_per_s".into(), json!(bare));
    r.insert("a_consumer_performance_records_per_s".into(), json!(perf));
    r.insert("b_log_store_sqlite_records_per_s".into(), json!(log_sqlite));
    r.insert("c_log_store_postgres_records_per_s".into(), json!(log_pg));
    r.insert("ratio_b_over_a".into(), json!(log_sqlite / bare));
    r.insert("ratio_c_over_a".into(), json!(log_pg / bare));

    // Snapshot workload: a large snapshot, a small log.
    eprintln!("preparing a {}-row snapshot…", a.snapshot_rows);
    let d = dir("snap");
    let topic = format!("bench-snap-{pid}");
    produce(&bootstrap, &topic, a.partitions, a.snapshot_rows, 1_000, &d);
    let (snap_rows, decode) = bare_decode(&d.join("snapshot"));
    let (snap_s, _) = timed_run(&job_config(
        &format!("snapsqlite{pid}"),
        &topic,
        &bootstrap,
        &d.join("snapshot"),
        StoreConfig::Sqlite {
            path: d.join("s.sqlite"),
            table: "accounts".into(),
        },
    ));
    let snap = snap_rows as f64 / snap_s;
    r.insert("snapshot_rows".into(), json!(snap_rows));
    r.insert("d_snapshot_sqlite_rows_per_s".into(), json!(snap));
    r.insert("e_bare_decode_rows_per_s".into(), json!(decode));
    r.insert("ratio_d_over_e".into(), json!(snap / decode));

    eprintln!("checkpoint commit latency…");
    for (n, reps) in [
        (1_000usize, 60usize),
        (10_000, 30),
        (100_000, if a.quick { 3 } else { 8 }),
    ] {
        let (p50, p99) = commit_latency(n, reps);
        r.insert(format!("f_commit_{n}_rows_p50_ms"), json!(p50));
        r.insert(format!("f_commit_{n}_rows_p99_ms"), json!(p99));
    }

    eprintln!("peak memory while catching up…");
    for size in [a.memory_small, a.memory_large] {
        let (recs, mib, secs) = peak_memory(&bootstrap, size, a.partitions);
        r.insert(format!("g_peak_rss_mib_backlog_{size}"), json!(mib));
        r.insert(format!("g_backlog_{size}_records"), json!(recs));
        r.insert(format!("g_backlog_{size}_seconds"), json!(secs));
    }

    eprintln!("recreation turnaround…");
    r.insert(
        "h_recreation_turnaround_s".into(),
        json!(recreation_turnaround(&bootstrap, a.partitions)),
    );

    let v = serde_json::Value::Object(r);
    std::fs::create_dir_all(a.out.parent().unwrap()).unwrap();
    std::fs::write(&a.out, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    println!("\n| measure | figure |\n|---|---|");
    for (k, val) in v.as_object().unwrap() {
        let s = match val.as_f64() {
            Some(f) if f.fract() != 0.0 => format!("{f:.3}"),
            _ => val.to_string(),
        };
        println!("| {k} | {s} |");
    }
    println!("\nJSON: {}", a.out.display());
}
