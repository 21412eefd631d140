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
}

impl JobRuntime {
    pub fn new(
        name: &str,
        map: PartitionMap,
        supervisor: Arc<Mutex<Supervisor>>,
        open: StoreFactory,
        configured_limits: RateLimits,
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
        }
    }

    /// The job's progress over all its vnodes, read from its store now (and kept for `/status`).
    pub fn read_progress(&self) -> Result<JobProgress> {
        let name = &self.name;
        let (vnodes, partitions, letters, published) = self
            .stores
            .with(|s| {
                Ok((
                    s.committed_vnodes(name)?,
                    s.committed_partitions(name)?,
                    s.dead_letters(name)?.len() as u64,
                    s.published_epoch(name)?,
                ))
            })
            .with_context(|| format!("job {name}: reading progress"))?;
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
);

impl Runtimes {
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

    /// The dead letters of `name` in its store, as last read, for `/status`.
    pub fn dead_letters_of(&self, name: &str) -> Option<u64> {
        self.get(name).and_then(|j| j.dead_letters())
    }

    /// The epoch the whole table of `name` stood at, as last read, for `/status`.
    pub fn published_epoch_of(&self, name: &str) -> Option<crate::core::Epoch> {
        self.get(name).and_then(|j| j.published_epoch())
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
        let r: Result<(), StoreError> =
            pool.with(|_| Err(StoreError::Backend("connection reset".into())));
        assert!(r.is_err());
        assert_eq!(pool.idle(), 0);
        pool.with(|s| s.rate_limits("j")).unwrap();
        assert_eq!(opened.load(Ordering::SeqCst), 2);
    }
}
