//! One job as this process runs it: what its workers, the job runner and the HTTP endpoints share —
//! the job's supervisor (the one place recreation is decided for the process), a small pool of
//! long-lived store handles for the process's own reads (job progress, `--exit-when-caught-up`,
//! `/status/jobs/{name}/vnodes`, live rate limits), the last job-level progress read, and the
//! configured rate limits. [`Runtimes`] holds every job of the process; `main` creates it, the job
//! runner fills it, the endpoints read it — no process-wide statics.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use anyhow::{Context, Result};
use tracing::info;

use crate::core::{JobProgress, PartitionMap, RateLimits, Supervisor};
use crate::ports::{StateStore, StoreError, StoreFactory};

/// Store handles a job's runtime keeps open for its own reads (workers and committers have their
/// own): reads from the runner and from HTTP requests share them instead of opening one each.
pub const STORE_POOL: usize = 2;

/// A few long-lived handles on one job's store, opened on first use.
pub struct StorePool {
    open: StoreFactory,
    idle: Mutex<Vec<Box<dyn StateStore>>>,
}

impl StorePool {
    pub fn new(open: StoreFactory) -> Self {
        StorePool {
            open,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Runs `f` on an idle handle (or a new one when all are busy). The handle goes back to the pool
    /// unless the store was away (a transient error: the next use opens a fresh one).
    pub fn with<T>(
        &self,
        f: impl FnOnce(&mut dyn StateStore) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let taken = self.idle.lock().unwrap().pop();
        let mut store = match taken {
            Some(s) => s,
            None => (self.open)()?,
        };
        let r = f(store.as_mut());
        if !r.as_ref().is_err_and(|e| e.is_transient()) {
            let mut idle = self.idle.lock().unwrap();
            if idle.len() < STORE_POOL {
                idle.push(store);
            }
        }
        r
    }

    /// Handles open and idle now.
    pub fn idle(&self) -> usize {
        self.idle.lock().unwrap().len()
    }
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
                _ => anyhow::bail!("query {k}: unknown; use snapshot=N and/or log=N"),
            }
        }
        if c == RateLimitChange::default() {
            anyhow::bail!("nothing to set: give snapshot=N and/or log=N");
        }
        Ok(c)
    }
}

/// One job of this process.
pub struct JobRuntime {
    pub name: String,
    pub map: PartitionMap,
    /// The job's supervisor, shared by every worker of the job in this process.
    pub supervisor: Arc<Mutex<Supervisor>>,
    pub stores: StorePool,
    /// `max_rows_per_second`, as both limits: what holds until live limits are set.
    pub configured_limits: RateLimits,
    progress: Mutex<Option<JobProgress>>,
    /// Dead letters the store holds for the job, as last read with the progress.
    dead_letters: Mutex<Option<u64>>,
    /// Under `consistency = "epoch"`: the epoch the whole table stands at, as last read.
    published_epoch: Mutex<Option<crate::core::Epoch>>,
    /// The job publishes its table at one epoch (`consistency = "epoch"`).
    publication: bool,
    /// Under publication: the partition holding the table back and its owner, as last read.
    held_back: Mutex<Option<(crate::core::publication::HeldBack, Option<String>)>>,
    /// A job of several tables: which (`JobTables::Several`), each one's store table, and the
    /// vnodes whose snapshot of each is done, as last read (in the tables' order).
    tables: Option<(crate::core::JobTables, Vec<crate::store::StoreTable>)>,
    table_vnodes_done: Mutex<Vec<u32>>,
    /// A job of several tables: what its workers applied to each table, in the tables' order
    /// (empty for one table).
    table_counts: Arc<[TableCounts]>,
    /// The process's metrics.
    metrics: Arc<crate::service::metrics::Metrics>,
}

/// One table of a job of several tables: the snapshot rows and log-store changes this process's
/// workers applied to it, counted by each worker's observer (`service::observe`) beside its
/// Prometheus series, and read by `/status`.
#[derive(Debug)]
pub struct TableCounts {
    /// The table's index in the log.
    pub index: u16,
    /// The store table.
    pub name: String,
    pub snapshot_rows: std::sync::atomic::AtomicU64,
    pub changes: std::sync::atomic::AtomicU64,
}

/// One table of a job of several tables, for `/status`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TableStatus {
    /// The store table.
    pub table: String,
    /// The log's (manifest's) name of the table.
    pub source: String,
    pub log_table: u16,
    /// Vnodes whose snapshot of this table is done, from the store (a vnode's scan goes table by
    /// table, so one still scanning has done the tables before the one its cursor is in).
    pub snapshot_vnodes_done: u32,
    pub vnodes: u32,
    /// Snapshot rows and log-store changes of the table applied by this process's workers.
    pub snapshot_rows: u64,
    pub log_store_changes: u64,
}

impl JobRuntime {
    pub fn new(
        name: &str,
        map: PartitionMap,
        supervisor: Arc<Mutex<Supervisor>>,
        open: StoreFactory,
        configured_limits: RateLimits,
        publication: bool,
        metrics: Arc<crate::service::metrics::Metrics>,
    ) -> Self {
        JobRuntime {
            name: name.to_string(),
            map,
            supervisor,
            stores: StorePool::new(open),
            configured_limits,
            progress: Mutex::new(None),
            dead_letters: Mutex::new(None),
            published_epoch: Mutex::new(None),
            publication,
            held_back: Mutex::new(None),
            tables: None,
            table_vnodes_done: Mutex::new(Vec::new()),
            table_counts: Arc::new([]),
            metrics,
        }
    }

    /// The job materialises several tables (`store.tables`): `/status`, the vnodes view and the
    /// metrics then show each one. A job of one table is left as it is.
    pub fn with_tables(
        mut self,
        tables: crate::core::JobTables,
        store_tables: &[crate::store::StoreTable],
    ) -> Self {
        if tables.several() {
            self.tables = Some((tables, store_tables.to_vec()));
            self.table_counts = store_tables
                .iter()
                .map(|t| TableCounts {
                    index: t.index,
                    name: t.name.clone(),
                    snapshot_rows: Default::default(),
                    changes: Default::default(),
                })
                .collect();
        }
        self
    }

    /// What the job's workers count per table (empty for a job of one table).
    pub fn table_counts(&self) -> Arc<[TableCounts]> {
        Arc::clone(&self.table_counts)
    }

    /// A job of several tables: each table's figures, as last read (`None` for one table).
    pub fn tables_status(&self) -> Option<Vec<TableStatus>> {
        let (_, tables) = self.tables.as_ref()?;
        let done = self.table_vnodes_done.lock().unwrap().clone();
        let read = std::sync::atomic::Ordering::Relaxed;
        Some(
            tables
                .iter()
                .zip(self.table_counts.iter())
                .enumerate()
                .map(|(i, (t, counts))| TableStatus {
                    table: t.name.clone(),
                    source: t.source.clone(),
                    log_table: t.index,
                    snapshot_vnodes_done: done.get(i).copied().unwrap_or(0),
                    vnodes: self.map.vnode_count(),
                    snapshot_rows: counts.snapshot_rows.load(read),
                    log_store_changes: counts.changes.load(read),
                })
                .collect(),
        )
    }

    /// The job's progress over all its vnodes, read from its store now (and kept for `/status`).
    pub fn read_progress(&self) -> Result<JobProgress> {
        let name = &self.name;
        let publication = self.publication;
        let (vnodes, partitions, letters, published, owners) = self
            .stores
            .with(|s| {
                Ok((
                    s.committed_vnodes(name)?,
                    s.committed_partitions(name)?,
                    s.dead_letters(name)?.len() as u64,
                    s.published_epoch(name)?,
                    if publication {
                        s.owners(name)?
                    } else {
                        Default::default()
                    },
                ))
            })
            .with_context(|| format!("job {name}: reading progress"))?;
        if publication {
            let held = crate::core::publication::held_back(partitions.values());
            self.metrics
                .publication_lag_seconds
                .with_label_values(&[name])
                .set(held.map_or(0.0, |h| h.seconds()));
            *self.held_back.lock().unwrap() = held.map(|h| (h, owners.get(&h.partition).cloned()));
        }
        if let Some((tables, stores)) = &self.tables {
            let done: Vec<u32> = tables
                .snapshot_vnodes_done(vnodes.values())
                .into_iter()
                .map(|(_, n)| n)
                .collect();
            let m = &self.metrics;
            for (t, n) in stores.iter().zip(&done) {
                m.table_snapshot_vnodes_done
                    .with_label_values(&[name, &t.name])
                    .set(*n as i64);
            }
            *self.table_vnodes_done.lock().unwrap() = done;
        }
        let p = JobProgress::of(self.map, &vnodes, &partitions);
        *self.progress.lock().unwrap() = Some(p.clone());
        *self.dead_letters.lock().unwrap() = Some(letters);
        *self.published_epoch.lock().unwrap() = published;
        Ok(p)
    }

    /// Under `consistency = "epoch"`: the epoch the whole table stood at, at the last progress read.
    pub fn published_epoch(&self) -> Option<crate::core::Epoch> {
        *self.published_epoch.lock().unwrap()
    }

    /// Under `consistency = "epoch"`: the partition holding the table back and its owner (the
    /// worker of its last claim), at the last progress read.
    pub fn held_back(&self) -> Option<(crate::core::publication::HeldBack, Option<String>)> {
        self.held_back.lock().unwrap().clone()
    }

    /// The dead letters the store held at the last progress read.
    pub fn dead_letters(&self) -> Option<u64> {
        *self.dead_letters.lock().unwrap()
    }

    /// The progress last read.
    pub fn progress(&self) -> Option<JobProgress> {
        self.progress.lock().unwrap().clone()
    }

    /// `/status/jobs/{name}/vnodes`, read from the store. Blocking.
    pub fn vnodes_json(&self) -> Result<serde_json::Value> {
        let name = &self.name;
        let (vnodes, partitions, owners) = self
            .stores
            .with(|s| {
                Ok((
                    s.committed_vnodes(name)?,
                    s.committed_partitions(name)?,
                    s.owners(name)?,
                ))
            })
            .with_context(|| format!("job {name}: reading vnode progress"))?;
        Ok(crate::service::status::vnodes_json(
            name,
            &self.map,
            &vnodes,
            &partitions,
            &owners,
            self.tables.as_ref(),
        ))
    }

    /// Reads (`change` None) or changes the job's live rate limits in its store. The answer says
    /// what is in force from now on: the store's limits, or the configured `max_rows_per_second`
    /// for both while none were set. Blocking.
    pub fn rate_limits_json(&self, change: Option<RateLimitChange>) -> Result<serde_json::Value> {
        let name = &self.name;
        let configured = self.configured_limits;
        let (limits, source) = self
            .stores
            .with(|s| {
                let current = s.rate_limits(name)?;
                Ok(match (change, current) {
                    (Some(c), cur) => {
                        let base = cur.unwrap_or(configured);
                        let next = RateLimits {
                            snapshot_rows_per_second: c
                                .snapshot
                                .unwrap_or(base.snapshot_rows_per_second),
                            log_records_per_second: c.log.unwrap_or(base.log_records_per_second),
                        };
                        s.set_rate_limits(name, next)?;
                        info!(job = %name, snapshot_rows_per_second = next.snapshot_rows_per_second, log_records_per_second = next.log_records_per_second, "rate limits set");
                        (next, "store")
                    }
                    (None, Some(cur)) => (cur, "store"),
                    (None, None) => (configured, "max_rows_per_second"),
                })
            })
            .with_context(|| format!("job {name}: the rate limits"))?;
        Ok(serde_json::json!({
            "job": name,
            "snapshot_rows_per_second": limits.snapshot_rows_per_second,
            "log_records_per_second": limits.log_records_per_second,
            "source": source,
        }))
    }

    /// Reads (`set` None) or sets whether the job is paused, in its store; every worker of every
    /// process applies it within its housekeeping interval. Blocking.
    pub fn pause_json(&self, set: Option<bool>) -> Result<serde_json::Value> {
        let name = &self.name;
        let paused = self
            .stores
            .with(|s| {
                if let Some(p) = set {
                    s.set_paused(name, p)?;
                    info!(job = %name, paused = p, "job pause set");
                }
                s.paused(name)
            })
            .with_context(|| format!("job {name}: the pause"))?;
        Ok(serde_json::json!({ "job": name, "paused": paused }))
    }
}

/// Every job this process runs, by name, and the reports of the captures it runs.
#[derive(Clone, Default)]
pub struct Runtimes(
    Arc<RwLock<BTreeMap<String, Arc<JobRuntime>>>>,
    crate::service::status::CaptureBoard,
    /// Jobs not started yet because what they need does not exist yet: job → what it waits for.
    Arc<Mutex<BTreeMap<String, String>>>,
    /// The process's metrics (its own registry), which `/metrics` renders.
    Arc<crate::service::metrics::Metrics>,
);

impl Runtimes {
    /// `job` waits for `what` before it starts (`/readyz` says so).
    pub fn set_waiting(&self, job: &str, what: String) {
        self.2.lock().unwrap().insert(job.to_string(), what);
    }

    /// `job` no longer waits.
    pub fn clear_waiting(&self, job: &str) {
        self.2.lock().unwrap().remove(job);
    }

    /// What each waiting job waits for.
    pub fn waiting(&self) -> BTreeMap<String, String> {
        self.2.lock().unwrap().clone()
    }

    /// The process's metrics: the registry `/metrics` renders, which every job, capture and
    /// endpoint of the process counts into.
    pub fn metrics(&self) -> &Arc<crate::service::metrics::Metrics> {
        &self.3
    }

    /// The captures' reports (`/status` `captures`).
    pub fn captures(&self) -> &crate::service::status::CaptureBoard {
        &self.1
    }

    pub fn insert(&self, job: Arc<JobRuntime>) {
        self.0.write().unwrap().insert(job.name.clone(), job);
    }

    pub fn get(&self, name: &str) -> Option<Arc<JobRuntime>> {
        self.0.read().unwrap().get(name).cloned()
    }

    /// The last job-level progress read of `name`, for `/status`.
    pub fn progress_of(&self, name: &str) -> Option<JobProgress> {
        self.get(name).and_then(|j| j.progress())
    }

    /// A job of several tables: each table's figures, for `/status` (`None` for one table).
    pub fn tables_of(&self, name: &str) -> Option<Vec<TableStatus>> {
        self.get(name).and_then(|j| j.tables_status())
    }

    /// The dead letters of `name` in its store, as last read, for `/status`.
    pub fn dead_letters_of(&self, name: &str) -> Option<u64> {
        self.get(name).and_then(|j| j.dead_letters())
    }

    /// The epoch the whole table of `name` stood at, as last read, for `/status`.
    pub fn published_epoch_of(&self, name: &str) -> Option<crate::core::Epoch> {
        self.get(name).and_then(|j| j.published_epoch())
    }

    /// The partition holding the published table of `name` back, as last read, for `/status`.
    pub fn held_back_of(
        &self,
        name: &str,
    ) -> Option<(crate::core::publication::HeldBack, Option<String>)> {
        self.get(name).and_then(|j| j.held_back())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn counting_factory(path: std::path::PathBuf, opened: Arc<AtomicUsize>) -> StoreFactory {
        let table = crate::codec::TableSchema::parse(
            crate::workload::EXAMPLE_ROW_SCHEMA,
            &["id".to_string()],
        )
        .unwrap();
        Arc::new(move || {
            opened.fetch_add(1, Ordering::SeqCst);
            crate::store::sqlite::SqliteStore::open(&path, "accounts", table.clone())
                .map(|s| Box::new(s) as Box<dyn StateStore>)
        })
    }

    /// A job of several tables: the runtime reads, per table, the vnodes whose snapshot of it is
    /// done (what `/status` `tables` and `kafka_backfill_table_snapshot_vnodes_done` show) — one
    /// vnode finished, one scanning the second table, one the first.
    #[test]
    fn a_job_of_several_tables_reports_each_table_s_snapshot_progress() {
        use crate::core::{Checkpoint, CheckpointCause, Epoch, PartitionProgress, VnodeProgress};
        use crate::ports::SnapshotInfo;
        let dir = std::env::temp_dir().join(format!("kb-tables-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.sqlite");
        let _ = std::fs::remove_file(&path);
        let schema = crate::codec::TableSchema::parse(
            crate::workload::EXAMPLE_ROW_SCHEMA,
            &["id".to_string()],
        )
        .unwrap();
        let stores: Vec<crate::store::StoreTable> = [(0, "accounts"), (1, "tellers")]
            .into_iter()
            .map(|(index, name)| crate::store::StoreTable {
                index,
                source: format!("pgbench_{name}"),
                name: name.into(),
                schema: schema.clone(),
            })
            .collect();
        let opening = stores.clone();
        let open: StoreFactory = Arc::new(move || {
            let options = crate::store::sqlite::SqliteOptions {
                publication: true,
                ..Default::default()
            };
            crate::store::sqlite::SqliteStore::open_tables(&path, opening.clone(), options)
                .map(|s| Box::new(s) as Box<dyn StateStore>)
        });
        let map = PartitionMap::new(4, 1).unwrap();
        let es = Epoch(1 << 16);
        let info = SnapshotInfo {
            snapshot_epoch: es,
            vnode_count: 4,
            partition_count: 1,
            start: vec![PartitionProgress {
                partition: 0,
                next_offset: 1,
                epoch: Epoch(2 << 16),
                streaming: false,
            }],
        };
        let mut store = open().unwrap();
        store.ensure_job("several-j", &info).unwrap();
        let lease = store
            .claim("several-j", crate::core::Generation(0), "a-0", &[0], &info)
            .unwrap()[0]
            .lease;
        let at = |v: u16, cursor: Option<Vec<u8>>, finished: bool| VnodeProgress {
            cursor,
            finished,
            ..VnodeProgress::fresh(v, es)
        };
        store
            .commit(
                "several-j",
                &Checkpoint {
                    generation: crate::core::Generation(0),
                    worker: "a-0".into(),
                    cause: CheckpointCause::Local,
                    epoch: None,
                    leases: vec![(0, lease)],
                    rows: vec![],
                    vnodes: vec![
                        at(0, None, true),
                        at(1, Some(crate::core::table_key(1, b"k")), false),
                        at(2, Some(crate::core::table_key(0, b"k")), false),
                    ],
                    partitions: vec![],
                    dead_letters: vec![],
                    max_dead_letters: 0,
                },
            )
            .unwrap();
        let metrics = Arc::new(crate::service::metrics::Metrics::new());
        let runtime = JobRuntime::new(
            "several-j",
            map,
            Arc::new(Mutex::new(crate::core::Supervisor::new(Default::default()))),
            open,
            RateLimits::both(0),
            true,
            metrics.clone(),
        )
        .with_tables(crate::core::JobTables::Several(vec![0, 1]), &stores);
        runtime.read_progress().unwrap();
        let tables = runtime.tables_status().unwrap();
        let done: Vec<(&str, u32, u32)> = tables
            .iter()
            .map(|t| (t.table.as_str(), t.snapshot_vnodes_done, t.vnodes))
            .collect();
        assert_eq!(done, [("accounts", 2, 4), ("tellers", 1, 4)]);
        // Rows and changes per table are what the job's workers counted, kept by the runtime
        // (not read back from Prometheus): log table 1 is `tellers`, log table 0 `accounts`.
        {
            use crate::ports::{Observer, WorkerEvent};
            let mut observer = crate::service::observe::ServiceObserver::new(
                metrics.clone(),
                "several-j",
                "w",
                Default::default(),
                runtime.table_counts(),
            );
            for event in [
                WorkerEvent::SnapshotRow { table: 1 },
                WorkerEvent::SnapshotRow { table: 1 },
                WorkerEvent::SnapshotRow { table: 0 },
                WorkerEvent::Change {
                    op: crate::core::Op::Delete,
                    table: 1,
                },
            ] {
                observer.observe(event);
            }
        }
        let counted: Vec<(String, u64, u64)> = runtime
            .tables_status()
            .unwrap()
            .into_iter()
            .map(|t| (t.table, t.snapshot_rows, t.log_store_changes))
            .collect();
        assert_eq!(
            counted,
            [("accounts".into(), 1, 0), ("tellers".into(), 2, 1)]
        );
        let gauge = metrics
            .table_snapshot_vnodes_done
            .with_label_values(&["several-j", "accounts"])
            .get();
        assert_eq!(gauge, 2);
    }

    /// Under publication the runtime names the partition holding the table back, its owner and how
    /// far it trails (what `/status` and `kafka_backfill_publication_lag_seconds` show): worker b's
    /// partition 1 committed through an older epoch than worker a's partition 0.
    #[test]
    fn under_publication_the_partition_holding_the_table_back_is_named_with_its_owner() {
        use crate::core::{
            Checkpoint, CheckpointCause, Epoch, PartitionProgress, SupervisorConfig, VnodeProgress,
        };
        use crate::ports::SnapshotInfo;
        let dir = std::env::temp_dir().join(format!("kb-held-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.sqlite");
        let _ = std::fs::remove_file(&path);
        let table = crate::codec::TableSchema::parse(
            crate::workload::EXAMPLE_ROW_SCHEMA,
            &["id".to_string()],
        )
        .unwrap();
        let open: StoreFactory = Arc::new(move || {
            let options = crate::store::sqlite::SqliteOptions {
                publication: true,
                ..Default::default()
            };
            crate::store::sqlite::SqliteStore::open_with(&path, "accounts", table.clone(), options)
                .map(|s| Box::new(s) as Box<dyn StateStore>)
        });
        let map = PartitionMap::new(4, 2).unwrap();
        let ms = |n: u64| Epoch::from_unix_millis(1_767_225_600_000 + n);
        let info = SnapshotInfo {
            snapshot_epoch: ms(0),
            vnode_count: 4,
            partition_count: 2,
            start: (0..2)
                .map(|p| PartitionProgress {
                    partition: p,
                    next_offset: 1,
                    epoch: ms(1_000),
                    streaming: false,
                })
                .collect(),
        };
        let mut store = open().unwrap();
        store.ensure_job("j", &info).unwrap();
        // Each worker finishes its snapshot, then commits its partition's log through an epoch.
        for (worker, partition, through, next) in [
            ("a-0", 0, ms(3_000), ms(4_000)),
            ("b-0", 1, ms(1_000), ms(1_500)),
        ] {
            let claims = store
                .claim("j", crate::core::Generation(0), worker, &[partition], &info)
                .unwrap();
            let lease = claims[0].lease;
            let vnodes = |epoch: Epoch| {
                map.vnodes_of(partition)
                    .map(|v| VnodeProgress {
                        finished: true,
                        epoch,
                        ..VnodeProgress::fresh(v, ms(0))
                    })
                    .collect::<Vec<_>>()
            };
            let cp =
                |cause, epoch: Option<Epoch>, v: Vec<VnodeProgress>, next_offset, at| Checkpoint {
                    generation: crate::core::Generation(0),
                    worker: worker.to_string(),
                    cause,
                    epoch,
                    leases: vec![(partition, lease)],
                    rows: Vec::new(),
                    vnodes: v,
                    partitions: vec![PartitionProgress {
                        partition,
                        next_offset,
                        epoch: at,
                        streaming: false,
                    }],
                    dead_letters: Vec::new(),
                    max_dead_letters: 0,
                };
            store
                .commit(
                    "j",
                    &cp(
                        CheckpointCause::SnapshotDone,
                        None,
                        vnodes(ms(0)),
                        1,
                        ms(1_000),
                    ),
                )
                .unwrap();
            store
                .commit(
                    "j",
                    &cp(
                        CheckpointCause::Barrier,
                        Some(through),
                        vnodes(through),
                        9,
                        next,
                    ),
                )
                .unwrap();
        }
        let metrics = Arc::new(crate::service::metrics::Metrics::new());
        let runtime = JobRuntime::new(
            "j",
            map,
            Arc::new(Mutex::new(crate::core::Supervisor::new(
                SupervisorConfig::default(),
            ))),
            open,
            RateLimits::both(0),
            true,
            metrics.clone(),
        );
        runtime.read_progress().unwrap();
        let (h, owner) = runtime.held_back().unwrap();
        assert_eq!(
            (h.partition, h.epoch, h.freshest),
            (1, ms(1_500), ms(4_000))
        );
        assert_eq!(owner.as_deref(), Some("b-0"));
        assert_eq!(h.seconds(), 2.5);
        let lag = metrics
            .publication_lag_seconds
            .with_label_values(&["j"])
            .get();
        assert_eq!(lag, 2.5);
    }

    /// Reads reuse the pool's handles: a hundred reads open one store, not a hundred.
    #[test]
    fn reads_share_long_lived_handles() {
        let dir = std::env::temp_dir().join(format!("kb-pool-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.sqlite");
        let _ = std::fs::remove_file(&path);
        let opened = Arc::new(AtomicUsize::new(0));
        let pool = StorePool::new(counting_factory(path, opened.clone()));
        for _ in 0..100 {
            pool.with(|s| s.rate_limits("j")).unwrap();
        }
        assert_eq!(opened.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle(), 1);
        // A transient failure drops the handle; the next use opens a fresh one.
        let r: Result<(), StoreError> = pool.with(|_| Err(StoreError::backend("connection reset")));
        assert!(r.is_err());
        assert_eq!(pool.idle(), 0);
        pool.with(|s| s.rate_limits("j")).unwrap();
        assert_eq!(opened.load(Ordering::SeqCst), 2);
    }
}
