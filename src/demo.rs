//! `kafka-backfill demo`: the whole job on embedded defaults, with nothing to install. It starts
//! librdkafka's in-process mock cluster, writes a generated snapshot and change log, runs a job into a
//! SQLite file while printing live progress, optionally adds a second worker during the log-store
//! phase (`--rescale`) so the invariant error and the recreation can be seen, and ends with `verify`.

use crate::shutdown::CancellationToken;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

use crate::config::{
    Config, HttpConfig, JobConfig, LocalCheckpointConfig, LogConfig, RecreationConfig,
    SnapshotConfig, StoreConfig,
};
use crate::core::Phase;
use crate::service::job::{self, RunOptions};
use crate::service::status::StatusBoard;
use crate::workload::{self, Workload};

#[derive(Clone, Debug)]
pub struct DemoOptions {
    pub dir: PathBuf,
    pub partitions: u32,
    pub rows: u64,
    pub changes: u64,
    /// Rows plus records per second per worker, so the phases are visible.
    pub throttle: u64,
    pub rescale: bool,
}

fn job_config(o: &DemoOptions, bootstrap: &str) -> JobConfig {
    let mut kafka = BTreeMap::new();
    kafka.insert("bootstrap.servers".to_string(), bootstrap.to_string());
    kafka.insert("group.id".to_string(), "kafka-backfill-demo".to_string());
    kafka.insert("session.timeout.ms".to_string(), "6000".to_string());
    kafka.insert("heartbeat.interval.ms".to_string(), "500".to_string());
    JobConfig {
        name: "demo".into(),
        topic: "accounts-log".into(),
        workers: 1,
        vnode_count: 256,
        kafka,
        snapshot: SnapshotConfig::Files {
            dir: o.dir.join("snapshot"),
            table: None,
        },
        store: StoreConfig::Sqlite {
            path: o.dir.join("state.sqlite"),
            table: "accounts".into(),
            tables: Default::default(),
            store_datum: true,
        },
        local_checkpoint: LocalCheckpointConfig {
            max_rows: 2_000,
            interval_ms: 500,
        },
        recreation: RecreationConfig {
            backoff_initial_ms: 200,
            ..RecreationConfig::default()
        },
        max_rows_per_second: o.throttle,
        max_epochs_ahead: 256,
        max_mib_ahead: 32,
        consistency: Default::default(),
        rate_limit: Default::default(),
        capture: None,
        on_bad_record: Default::default(),
        dead_letter_topic: None,
        max_dead_letters: 100,
    }
}

fn print_progress(started: Instant, boards: &[&StatusBoard]) {
    for board in boards {
        for (_, workers) in board.lock().unwrap().iter() {
            for (name, r) in workers {
                let Some(s) = &r.status else {
                    println!(
                        "[{:5.1}s] {name:<4} restarting{}",
                        started.elapsed().as_secs_f64(),
                        r.last_error
                            .as_ref()
                            .map(|e| format!(" ({e})"))
                            .unwrap_or_default()
                    );
                    continue;
                };
                let lag: u64 = s
                    .partitions
                    .iter()
                    .filter_map(|p| {
                        p.high_watermark
                            .map(|h| h.saturating_sub(p.committed_offset))
                    })
                    .sum();
                println!(
                    "[{:5.1}s] {name:<4} {:<10} generation {} partitions {:?} snapshot rows {:>7} log changes {:>7} epoch lag {:>5.1}s lag {lag} records",
                    started.elapsed().as_secs_f64(),
                    s.phase.as_str(),
                    s.generation,
                    s.partitions.iter().map(|p| p.partition).collect::<Vec<_>>(),
                    s.counters.snapshot_rows,
                    s.counters.changes.iter().sum::<u64>(),
                    s.epoch_lag_seconds,
                );
            }
        }
    }
}

fn in_phase(board: &StatusBoard, phase: Phase) -> bool {
    board
        .lock()
        .unwrap()
        .values()
        .flat_map(|w| w.values())
        .any(|r| r.status.as_ref().is_some_and(|s| s.phase == phase))
}

/// Runs the demo; returns whether `verify` was clean.
pub fn run(o: &DemoOptions) -> Result<bool> {
    let started = Instant::now();
    let cluster = MockCluster::<DefaultProducerContext>::new(1)
        .context("starting librdkafka's mock cluster")?;
    let bootstrap = cluster.bootstrap_servers();
    cluster
        .create_topic("accounts-log", o.partitions as i32, 1)
        .context("creating the demo topic")?;
    if o.dir.exists() {
        std::fs::remove_dir_all(&o.dir).with_context(|| format!("clearing {}", o.dir.display()))?;
    }
    println!(
        "mock cluster at {bootstrap}; writing a {}-row snapshot and {} changes over {} partitions…",
        o.rows, o.changes, o.partitions
    );
    let report = workload::produce(&Workload {
        bootstrap: bootstrap.clone(),
        topic: "accounts-log".into(),
        partitions: o.partitions,
        vnode_count: 256,
        rows: o.rows,
        key_space: o.rows * 2,
        changes: o.changes,
        changes_per_epoch: 250,
        checkpoint_every: 4,
        update_percent: 70,
        row_size: 100,
        rate: 0,
        out: o.dir.clone(),
        seed: 7,
        progress: false,
        append: false,
        table: Default::default(),
        tables: 1,
        kafka_properties: Default::default(),
        transactional: false,
        evolve: false,
        evolve_gate: None,
        snapshot_layout: Default::default(),
    })?;
    println!(
        "snapshot at epoch {} ({} rows) and log written; the table at the last checkpoint has {} rows",
        report.snapshot_epoch, report.snapshot_rows, report.final_rows
    );
    // With --rescale the log-store phase must outlast the second consumer's group join (seconds).
    let mut o = o.clone();
    if o.rescale {
        o.throttle = match o.throttle {
            0 => (o.changes / 6).max(500),
            t => t.min((o.changes / 6).max(500)),
        };
    }
    let o = &o;
    println!(
        "throttle: {} rows and records per second per worker",
        o.throttle
    );
    let config = Config {
        http: HttpConfig {
            listen: String::new(),
            ..Default::default()
        },
        log: LogConfig::default(),
        shutdown_grace_secs: 30,
        jobs: vec![job_config(o, &bootstrap)],
    };
    let board_a = job::new_board();
    let board_b = job::new_board();
    // Both runners stop together.
    let stop = CancellationToken::new();
    let runner = |prefix: &str, board: StatusBoard, stop: CancellationToken| {
        let config = config.clone();
        // Workers stop together once all have caught up: one leaving early would be a rebalance.
        let opts = RunOptions {
            exit_when_caught_up: false,
            worker_prefix: Some(prefix.to_string()),
            ..Default::default()
        };
        std::thread::spawn(move || job::run(&config, &opts, stop, board, Default::default()))
    };
    let a = runner("a", board_a.clone(), stop.clone());
    let mut b = None;
    let deadline = Instant::now() + Duration::from_secs(110);
    let mut last_print = Instant::now();
    while !a.is_finished()
        || b.as_ref()
            .is_some_and(|b: &std::thread::JoinHandle<Result<()>>| !b.is_finished())
    {
        std::thread::sleep(Duration::from_millis(100));
        if o.rescale && b.is_none() && in_phase(&board_a, Phase::LogStore) {
            println!("--rescale: a second worker joins the group while worker a is in the log-store phase");
            b = Some(runner("b", board_b.clone(), stop.clone()));
        }
        let all_caught_up = [&board_a, &board_b].iter().all(|b| {
            b.lock()
                .unwrap()
                .values()
                .flat_map(|w| w.values())
                .all(|r| r.caught_up)
        }) && (!o.rescale || b.is_some());
        if all_caught_up && !stop.is_cancelled() {
            println!("every worker has caught up: stopping");
            stop.cancel();
        }
        if last_print.elapsed() >= Duration::from_secs(1) {
            print_progress(started, &[&board_a, &board_b]);
            last_print = Instant::now();
        }
        if Instant::now() > deadline {
            stop.cancel();
            bail!("the demo did not catch up within its time limit");
        }
    }
    print_progress(started, &[&board_a, &board_b]);
    a.join()
        .map_err(|_| anyhow::anyhow!("worker a panicked"))??;
    if let Some(b) = b {
        b.join()
            .map_err(|_| anyhow::anyhow!("worker b panicked"))??;
    }
    let (path, table) = (o.dir.join("state.sqlite"), "accounts");
    let prepared = job::prepare(&config.jobs[0], false)?;
    let mut store = (prepared.open_store)()?;
    let verdict = crate::verify::verify(store.as_mut(), "demo", &o.dir.join("expected"))?;
    let job = store.job("demo")?.context("job row")?;
    println!("verify: {verdict}");
    println!(
        "recreations: {} (generation {})",
        job.recreations, job.generation
    );
    println!("done in {:.1}s; the table is in {} — try: sqlite3 {} 'SELECT id, owner, balance FROM {table} LIMIT 5'", started.elapsed().as_secs_f64(), path.display(), path.display());
    drop(cluster);
    Ok(verdict.clean())
}
