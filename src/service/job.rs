//! Runs the configured jobs: checks each job's snapshot, topic and store against its configuration,
//! then runs its workers on dedicated threads under one supervisor per job.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tracing::{error, info};

use crate::codec::LogCodec;
use crate::codec::TableSchema;
use crate::core::{LocalCheckpointPolicy, PartitionMap, Supervisor, SupervisorConfig};
use crate::ports::StoreFactory;
use crate::ports::{SnapshotSource, StateStore};
use crate::service::config::{Config, JobConfig, SnapshotConfig, StoreConfig};
use crate::service::status::StatusBoard;
use crate::service::worker::{run_worker, WorkerSetup};
use crate::snapshot::files::SnapshotFiles;
use crate::snapshot::postgres::PostgresSnapshot;
use crate::store::sqlite::SqliteStore;

/// `run --exit-when-caught-up` gave up: this process's workers caught up, but the rest of the job
/// made no progress for [`RunOptions::job_wait`] (its vnodes are unowned or their owners stalled).
/// `main` exits with code 3 on it.
#[derive(Debug, thiserror::Error)]
#[error("job {job}: this process has caught up, but the job has not: partitions {partitions:?} have not reached the streaming phase ({vnodes_snapshot} vnodes in the snapshot, {vnodes_log_store} in the log store) and made no progress for {waited_secs} s; start workers for them or check their owners")]
pub struct JobIncomplete {
    pub job: String,
    pub partitions: Vec<crate::core::PartitionId>,
    pub vnodes_snapshot: u32,
    pub vnodes_log_store: u32,
    pub waited_secs: u64,
}

/// How `run` behaves.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Stop (exit 0) once every worker of every job is streaming with no lag.
    pub exit_when_caught_up: bool,
    /// Prefix of worker names (default: `<pid>`), so that processes do not collide.
    pub worker_prefix: Option<String>,
    /// With `exit_when_caught_up`: how long to wait without any progress of the job's other vnodes
    /// once this process's workers have caught up, before giving up with [`JobIncomplete`].
    pub job_wait: Duration,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            exit_when_caught_up: false,
            worker_prefix: None,
            job_wait: Duration::from_secs(60),
        }
    }
}

/// A job's checked inputs.
pub struct PreparedJob {
    pub config: JobConfig,
    pub snapshot: Arc<dyn SnapshotSource>,
    pub table: TableSchema,
    pub codec: Arc<LogCodec>,
    pub open_store: StoreFactory,
}

/// Opens the snapshot, checks it against the configuration and the topic, and prepares the store.
pub fn prepare(job: &JobConfig, check_topic: bool) -> Result<PreparedJob> {
    let (snapshot, table, manifest): (Arc<dyn SnapshotSource>, TableSchema, String) =
        match &job.snapshot {
            SnapshotConfig::Files { dir } => {
                let s = SnapshotFiles::open(dir)
                    .with_context(|| format!("job {}: opening the snapshot", job.name))?;
                let table = s.table.clone();
                (
                    Arc::new(s),
                    table,
                    dir.join("manifest.json").display().to_string(),
                )
            }
            SnapshotConfig::Postgres { url, name } => {
                let s = PostgresSnapshot::open(url.expose(), name)
                    .with_context(|| format!("job {}: opening the snapshot", job.name))?;
                let table = s.table().clone();
                (
                    Arc::new(s),
                    table,
                    format!(
                        "snapshot {name} in {}",
                        crate::store::postgres::redact_url(url.expose())
                    ),
                )
            }
        };
    let info = snapshot.info().clone();
    if info.vnode_count != job.vnode_count {
        bail!(
            "job {}: vnode_count is {} in the configuration but {} in {}",
            job.name,
            job.vnode_count,
            info.vnode_count,
            manifest
        );
    }
    let map = PartitionMap::new(info.vnode_count, info.partition_count)
        .with_context(|| manifest.clone())?;
    if check_topic {
        let bootstrap = &job.kafka["bootstrap.servers"];
        match crate::kafka::admin::partition_count(&job.kafka, &job.topic)
            .with_context(|| format!("job {}", job.name))?
        {
            None => bail!(
                "job {}: topic {} does not exist at {bootstrap}",
                job.name,
                job.topic
            ),
            Some(n) => map
                .check_partition_count(n, &format!("topic {}", job.topic))
                .with_context(|| format!("job {} (snapshot {manifest})", job.name))?,
        }
    }
    let codec = Arc::new(LogCodec::new(table.clone())?);
    let open_store = store_factory(&job.store, table.clone())?;
    // Fail fast on a store that disagrees with the snapshot (e.g. a changed partition count).
    let mut store = open_store().with_context(|| format!("job {}: opening the store", job.name))?;
    store
        .ensure_job(&job.name, &info)
        .with_context(|| format!("job {}", job.name))?;
    Ok(PreparedJob {
        config: job.clone(),
        snapshot,
        table,
        codec,
        open_store,
    })
}

/// Opens state stores of the configured kind (one handle per worker).
pub fn store_factory(
    store: &StoreConfig,
    schema: crate::codec::TableSchema,
) -> Result<StoreFactory> {
    Ok(match store.clone() {
        StoreConfig::Sqlite { path, table } => {
            if let Some(parent) = path.parent() {
                if !parent.as_os_str().is_empty() {
                    std::fs::create_dir_all(parent)
                        .with_context(|| format!("creating {}", parent.display()))?;
                }
            }
            Arc::new(move || {
                SqliteStore::open(&path, &table, schema.clone())
                    .map(|s| Box::new(s) as Box<dyn StateStore>)
            })
        }
        StoreConfig::Postgres { url, table } => Arc::new(move || {
            crate::store::postgres::PostgresStore::open(url.expose(), &table, schema.clone())
                .map(|s| Box::new(s) as Box<dyn StateStore>)
        }),
    })
}

/// Runs every job until `shutdown` is set, a job stops, or (with `exit_when_caught_up`) all caught up.
pub fn run(
    config: &Config,
    opts: &RunOptions,
    shutdown: Arc<AtomicBool>,
    board: StatusBoard,
) -> Result<()> {
    let prefix = opts.worker_prefix.clone().unwrap_or_else(default_prefix);
    let mut handles: Vec<(String, JoinHandle<Result<()>>)> = Vec::new();
    let mut expected = 0usize;
    let mut stores = Vec::new();
    for job in &config.jobs {
        let prepared = prepare(job, true)?;
        let info = prepared.snapshot.info();
        let map = PartitionMap::new(info.vnode_count, info.partition_count)?;
        job_stores()
            .lock()
            .unwrap()
            .insert(job.name.clone(), (map, prepared.open_store.clone()));
        configured_limits().lock().unwrap().insert(
            job.name.clone(),
            crate::core::RateLimits::both(job.max_rows_per_second),
        );
        stores.push((job.name.clone(), map, prepared.open_store.clone()));
        let r = &job.recreation;
        let supervisor = Arc::new(Mutex::new(Supervisor::new(SupervisorConfig {
            policy: r.policy,
            max_recreations: r.max_recreations,
            window_ms: r.window_secs * 1000,
            backoff_initial_ms: r.backoff_initial_ms,
            backoff_max_ms: r.backoff_max_ms,
        })));
        let mut kafka = job.kafka.clone();
        kafka
            .entry("group.id".into())
            .or_insert_with(|| job.group_id());
        for i in 0..job.workers {
            let mut kafka = kafka.clone();
            // Static membership: one stable, distinct instance id per worker (`<id>-<index>`), so
            // the workers of one process do not fence each other.
            if let Some(id) = job.kafka.get("group.instance.id") {
                kafka.insert("group.instance.id".into(), format!("{id}-{i}"));
            }
            let setup = WorkerSetup {
                job: job.name.clone(),
                topic: job.topic.clone(),
                worker: format!("{prefix}-{i}"),
                kafka: kafka.clone(),
                snapshot: prepared.snapshot.clone(),
                codec: prepared.codec.clone(),
                open_store: prepared.open_store.clone(),
                local_checkpoint: LocalCheckpointPolicy {
                    max_rows: job.local_checkpoint.max_rows,
                    max_interval_ms: job.local_checkpoint.interval_ms,
                },
                supervisor: supervisor.clone(),
                shutdown: shutdown.clone(),
                board: board.clone(),
                max_rows_per_second: job.max_rows_per_second,
                adaptive: job.rate_limit.core(),
                max_epochs_ahead: job.max_epochs_ahead,
                reschedule: job.recreation.policy == crate::core::RecreationPolicy::Reschedule,
            };
            let name = format!("{}/{}", job.name, setup.worker);
            let h = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || run_worker(setup))?;
            handles.push((name, h));
            expected += 1;
        }
        info!(job = %job.name, topic = %job.topic, workers = job.workers, "job started");
    }
    let mut result = Ok(());
    let mut waiting = JobWait::default();
    let mut last_progress = std::time::Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        if last_progress.elapsed() >= Duration::from_secs(2) {
            last_progress = std::time::Instant::now();
            if let Err(e) = read_progress(&stores) {
                // Shown in /status by the workers' own errors; the next read retries.
                tracing::debug!(error = %format!("{e:#}"), "reading job progress");
            }
        }
        if let Some(i) = handles.iter().position(|(_, h)| h.is_finished()) {
            let (name, h) = handles.remove(i);
            let r = h
                .join()
                .map_err(|_| anyhow::anyhow!("worker {name} panicked"))
                .and_then(|r| r);
            if let Err(e) = r {
                error!(worker = %name, error = %format!("{e:#}"), "worker failed; stopping");
                result = Err(e);
                shutdown.store(true, Ordering::SeqCst);
            }
        }
        if opts.exit_when_caught_up {
            let b = board.lock().unwrap();
            let reports: Vec<bool> = b
                .values()
                .flat_map(|w| w.values().map(|r| r.caught_up))
                .collect();
            if reports.len() == expected && reports.iter().all(|c| *c) {
                drop(b);
                match waiting.check(&stores, opts.job_wait) {
                    Ok(true) => {
                        info!("every vnode of every job has caught up; stopping");
                        shutdown.store(true, Ordering::SeqCst);
                    }
                    Ok(false) => {}
                    Err(e) => {
                        error!(error = %format!("{e:#}"), "stopping");
                        result = Err(e);
                        shutdown.store(true, Ordering::SeqCst);
                    }
                }
            }
        }
        if shutdown.load(Ordering::SeqCst) {
            for (name, h) in handles.drain(..) {
                match h.join() {
                    Ok(Err(e)) if result.is_ok() => result = Err(e),
                    Err(_) => error!(worker = %name, "worker panicked"),
                    _ => {}
                }
            }
            return result;
        }
    }
}

/// Every job's progress over all its vnodes, as committed in its store.
fn read_progress(
    stores: &[(String, PartitionMap, StoreFactory)],
) -> Result<Vec<crate::core::JobProgress>> {
    let mut all = Vec::new();
    for (job, map, open) in stores {
        let mut store = open().with_context(|| format!("job {job}: opening the store"))?;
        let vnodes = store
            .committed_vnodes(job)
            .with_context(|| format!("job {job}: reading progress"))?;
        let partitions = store
            .committed_partitions(job)
            .with_context(|| format!("job {job}: reading progress"))?;
        let progress = crate::core::JobProgress::of(*map, &vnodes, &partitions);
        job_progress()
            .lock()
            .unwrap()
            .insert(job.clone(), progress.clone());
        all.push(progress);
    }
    Ok(all)
}

/// Each job this process runs: its partition map and store, for `/status/jobs/{name}/vnodes`.
pub fn job_stores() -> &'static Mutex<BTreeMap<String, (PartitionMap, StoreFactory)>> {
    static S: std::sync::OnceLock<Mutex<BTreeMap<String, (PartitionMap, StoreFactory)>>> =
        std::sync::OnceLock::new();
    S.get_or_init(Default::default)
}

/// `/status/jobs/{name}/vnodes` read from the job's store (`None`: no such job in this process).
/// Blocking: the HTTP server calls it off its runtime.
pub fn job_vnodes(name: &str) -> Result<Option<serde_json::Value>> {
    let Some((map, open)) = job_stores().lock().unwrap().get(name).cloned() else {
        return Ok(None);
    };
    let mut store = open().with_context(|| format!("job {name}: opening the store"))?;
    let vnodes = store
        .committed_vnodes(name)
        .with_context(|| format!("job {name}: reading vnode progress"))?;
    let partitions = store
        .committed_partitions(name)
        .with_context(|| format!("job {name}: reading partition progress"))?;
    let owners = store
        .owners(name)
        .with_context(|| format!("job {name}: reading leases"))?;
    Ok(Some(crate::service::status::vnodes_json(
        name,
        &map,
        &vnodes,
        &partitions,
        &owners,
    )))
}

/// A change of a job's live rate limits: each one given is set, a missing one keeps its value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateLimitChange {
    pub snapshot: Option<u64>,
    pub log: Option<u64>,
}

impl RateLimitChange {
    /// From a query string: `snapshot=N&log=N` (per worker per second; 0 = none).
    pub fn parse(query: &str) -> Result<Self> {
        let mut c = RateLimitChange::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .with_context(|| format!("query {pair:?}: expected key=value"))?;
            let n: u64 = v
                .parse()
                .with_context(|| format!("query {k}={v:?}: not a whole number"))?;
            match k {
                "snapshot" => c.snapshot = Some(n),
                "log" => c.log = Some(n),
                _ => bail!("query {k}: unknown; use snapshot=N and/or log=N"),
            }
        }
        if c == RateLimitChange::default() {
            bail!("nothing to set: give snapshot=N and/or log=N");
        }
        Ok(c)
    }
}

/// Reads (`change` None) or changes a job's live rate limits in its store; `None` for a job this
/// process does not run. The answer says what is in force from now on: the store's limits, or the
/// configured `max_rows_per_second` for both while none were set. Blocking.
pub fn rate_limits_json(
    name: &str,
    change: Option<RateLimitChange>,
) -> Result<Option<serde_json::Value>> {
    let Some((_, open)) = job_stores().lock().unwrap().get(name).cloned() else {
        return Ok(None);
    };
    let configured = configured_limits().lock().unwrap().get(name).copied();
    let mut store = open().with_context(|| format!("job {name}: opening the store"))?;
    let current = store
        .rate_limits(name)
        .with_context(|| format!("job {name}: reading the rate limits"))?;
    let (limits, source) = match (change, current) {
        (Some(c), cur) => {
            let base = cur.or(configured).unwrap_or_default();
            let next = crate::core::RateLimits {
                snapshot_rows_per_second: c.snapshot.unwrap_or(base.snapshot_rows_per_second),
                log_records_per_second: c.log.unwrap_or(base.log_records_per_second),
            };
            store
                .set_rate_limits(name, next)
                .with_context(|| format!("job {name}: setting the rate limits"))?;
            info!(job = %name, snapshot_rows_per_second = next.snapshot_rows_per_second, log_records_per_second = next.log_records_per_second, "rate limits set");
            (next, "store")
        }
        (None, Some(cur)) => (cur, "store"),
        (None, None) => (configured.unwrap_or_default(), "max_rows_per_second"),
    };
    Ok(Some(serde_json::json!({
        "job": name,
        "snapshot_rows_per_second": limits.snapshot_rows_per_second,
        "log_records_per_second": limits.log_records_per_second,
        "source": source,
    })))
}

/// Each job's configured `max_rows_per_second`, as both limits (what holds until live ones are set).
fn configured_limits() -> &'static Mutex<BTreeMap<String, crate::core::RateLimits>> {
    static S: std::sync::OnceLock<Mutex<BTreeMap<String, crate::core::RateLimits>>> =
        std::sync::OnceLock::new();
    S.get_or_init(Default::default)
}

/// The last job-level progress read by this process's runner, per job, for `/status`.
pub fn job_progress() -> &'static Mutex<BTreeMap<String, crate::core::JobProgress>> {
    static P: std::sync::OnceLock<Mutex<BTreeMap<String, crate::core::JobProgress>>> =
        std::sync::OnceLock::new();
    P.get_or_init(Default::default)
}

/// The job-level completion check of `--exit-when-caught-up`, once a second.
#[derive(Default)]
struct JobWait {
    last_check: Option<std::time::Instant>,
    last_log: Option<std::time::Instant>,
    /// The progress last seen and since when it has not changed.
    seen: Option<(Vec<crate::core::JobProgress>, std::time::Instant)>,
}

impl JobWait {
    /// Whether every job has caught up (from the store); an error once the rest of a job made no
    /// progress for `wait`.
    fn check(
        &mut self,
        stores: &[(String, PartitionMap, StoreFactory)],
        wait: Duration,
    ) -> Result<bool> {
        let now = std::time::Instant::now();
        if self
            .last_check
            .is_some_and(|t| now - t < Duration::from_secs(1))
        {
            return Ok(false);
        }
        self.last_check = Some(now);
        let all = read_progress(stores)?;
        if all.iter().all(|p| p.caught_up) {
            return Ok(true);
        }
        let since = match &self.seen {
            Some((p, t)) if *p == all => *t,
            _ => now,
        };
        self.seen = Some((all.clone(), since));
        if self
            .last_log
            .is_none_or(|t| now - t >= Duration::from_secs(10))
        {
            self.last_log = Some(now);
            for ((job, _, _), p) in stores.iter().zip(&all).filter(|(_, p)| !p.caught_up) {
                info!(job = %job, partitions_behind = ?p.partitions_behind, vnodes_snapshot = p.vnodes_snapshot, vnodes_log_store = p.vnodes_log_store, "this process has caught up; waiting for the rest of the job");
            }
        }
        if now - since >= wait {
            let (job, p) = stores
                .iter()
                .zip(&all)
                .find(|(_, p)| !p.caught_up)
                .map(|((j, _, _), p)| (j.clone(), p.clone()))
                .expect("one job behind");
            return Err(JobIncomplete {
                job,
                partitions: p.partitions_behind,
                vnodes_snapshot: p.vnodes_snapshot,
                vnodes_log_store: p.vnodes_log_store,
                waited_secs: wait.as_secs(),
            }
            .into());
        }
        Ok(false)
    }
}

/// Worker names: `<host>-p<pid>` (the host name tells containers apart, where every pid is 1).
fn default_prefix() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty());
    match host {
        Some(h) => format!("{h}-p{}", std::process::id()),
        None => format!("p{}", std::process::id()),
    }
}

/// A fresh, empty status board.
pub fn new_board() -> StatusBoard {
    Arc::new(Mutex::new(BTreeMap::new()))
}
