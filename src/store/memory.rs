//! In-memory implementations of the ports, shared by the unit tests, the deterministic simulation and
//! the scenario tests. The state store checks every invariant a real store enforces (generation,
//! leases, monotonic progress) so that tests catch a core that would break them.

use crate::core::{Generation, Lease};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::core::{
    Checkpoint, ClaimedPartition, DeadLetter, Epoch, LogRecord, PartitionId, PartitionMap,
    PartitionProgress, RateLimits, Row, RowMutation, Vnode, VnodeProgress,
};
use crate::ports::{
    DeadLetterRow, JobRow, LogStore, RowIter, SnapshotInfo, SnapshotSource, SourceError,
    StateStore, StoreError,
};
use crate::store::protocol::{self, TxRead};

/// A partitioned log in memory.
#[derive(Clone, Debug, Default)]
pub struct MemoryLog {
    partitions: Vec<Vec<LogRecord>>,
}

impl MemoryLog {
    pub fn new(partition_count: u32) -> Self {
        MemoryLog {
            partitions: vec![Vec::new(); partition_count as usize],
        }
    }
}

impl LogStore for MemoryLog {
    fn partition_count(&self) -> u32 {
        self.partitions.len() as u32
    }

    fn append(&mut self, partition: PartitionId, record: LogRecord) -> u64 {
        let p = &mut self.partitions[partition as usize];
        p.push(record);
        p.len() as u64 - 1
    }

    fn read(&self, partition: PartitionId, from: u64, max: usize) -> Vec<(u64, LogRecord)> {
        let p = &self.partitions[partition as usize];
        (from as usize..p.len().min(from as usize + max))
            .map(|o| (o as u64, p[o].clone()))
            .collect()
    }

    fn high_watermark(&self, partition: PartitionId) -> u64 {
        self.partitions[partition as usize].len() as u64
    }
}

/// A snapshot in memory: rows per vnode in key order.
#[derive(Clone, Debug)]
pub struct MemorySnapshot {
    pub info: SnapshotInfo,
    pub rows: BTreeMap<Vnode, BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl SnapshotSource for MemorySnapshot {
    fn info(&self) -> &SnapshotInfo {
        &self.info
    }

    fn scan(&self, vnode: Vnode, after: Option<&[u8]>) -> Result<RowIter<'_>, SourceError> {
        let Some(rows) = self.rows.get(&vnode) else {
            return Ok(Box::new(std::iter::empty()));
        };
        let after = after.map(|a| a.to_vec());
        Ok(Box::new(
            rows.iter()
                .filter(move |(k, _)| after.as_ref().is_none_or(|a| *k > a))
                .map(|(k, v)| {
                    Ok(Row {
                        key: k.clone(),
                        value: v.clone(),
                    })
                }),
        ))
    }
}

#[derive(Debug, Clone)]
struct Owner {
    worker: String,
    lease: Lease,
}

#[derive(Debug, Clone)]
struct JobState {
    row: JobRow,
    rows: BTreeMap<Vec<u8>, Vec<u8>>,
    vnodes: BTreeMap<Vnode, VnodeProgress>,
    partitions: BTreeMap<PartitionId, PartitionProgress>,
    owners: BTreeMap<PartitionId, Owner>,
    next_lease: Lease,
    commits: u64,
    /// Dead letters by (partition, offset); kept across recreations.
    dead_letters: BTreeMap<(PartitionId, u64), DeadLetterRow>,
    /// Publication only (docs/design/several-tables.md §2; `rows` is then the generation's shadow
    /// table): the epoch `rows` stands at across every partition, `None` before the generation's
    /// first publication.
    applied: Option<Epoch>,
    /// Publication only: committed log-store checkpoints not yet applied to `rows`.
    pending: Vec<PendingUnit>,
    /// Publication only: the previous generation's replica, visible until this generation's
    /// `rows` stand at or beyond its epoch (so a recreation never shows a half-filled replica, nor
    /// an older one).
    previous: Option<(Epoch, Rows)>,
}

/// A job's materialised rows by key.
pub type Rows = BTreeMap<Vec<u8>, Vec<u8>>;

/// A committed checkpoint whose rows wait for every partition to reach its epoch.
#[derive(Debug, Clone)]
struct PendingUnit {
    epoch: Epoch,
    partitions: Vec<PartitionId>,
    rows: Vec<RowMutation>,
}

impl JobState {
    /// What the job's table holds for a reader: under publication, the previous generation's
    /// replica while the current one builds beside it; otherwise the current rows.
    fn table(&self) -> &Rows {
        match &self.previous {
            Some((at, rows)) if self.applied.is_none_or(|a| a < *at) => rows,
            _ => &self.rows,
        }
    }

    /// Publication: the replica readers see, and the epoch it stands at (`None`: nothing
    /// consistent yet).
    fn visible(&self) -> Option<(Epoch, &Rows)> {
        match (&self.previous, self.applied) {
            (Some((at, rows)), applied) if applied.is_none_or(|a| a < *at) => Some((*at, rows)),
            (_, Some(a)) => Some((a, &self.rows)),
            _ => None,
        }
    }
}

/// A state store in memory; clones share the same state (one handle per worker).
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    jobs: Arc<Mutex<BTreeMap<String, JobState>>>,
    /// Live rate limits per job (kept apart from the job's state, as they outlive recreations).
    limits: Arc<Mutex<BTreeMap<String, RateLimits>>>,
    paused: Arc<Mutex<BTreeMap<String, bool>>>,
    /// Publish each job's replica at one epoch across every partition (issue 23's proposed
    /// protocol; only the simulation uses it yet).
    publish: bool,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store that publishes each job's replica only at an epoch every partition stands at
    /// (docs/design/several-tables.md §2): a log-store checkpoint's rows wait as a pending unit
    /// until [`publication_epoch`](crate::core::publication::publication_epoch) reaches it.
    pub fn publishing() -> Self {
        MemoryStore {
            publish: true,
            ..Self::default()
        }
    }

    /// With [`publishing`](Self::publishing): the generation's rows with every pending unit
    /// applied — what each vnode's commits hold at its own epoch (the simulation's per-vnode
    /// oracle reads it).
    pub fn rows_with_pending(&self, job: &str) -> BTreeMap<Vec<u8>, Vec<u8>> {
        let jobs = self.jobs.lock().unwrap();
        let Some(j) = jobs.get(job) else {
            return BTreeMap::new();
        };
        let mut rows = j.rows.clone();
        let mut units: Vec<&PendingUnit> = j.pending.iter().collect();
        units.sort_by_key(|u| u.epoch);
        for u in units {
            apply_rows(&mut rows, &u.rows, j.row.vnode_count);
        }
        rows
    }

    /// With [`publishing`](Self::publishing): the replica a reader sees and the epoch it stands at
    /// across every partition; `None` before the first publication.
    pub fn published(&self, job: &str) -> Option<(Epoch, Rows)> {
        let jobs = self.jobs.lock().unwrap();
        jobs.get(job)?.visible().map(|(e, rows)| (e, rows.clone()))
    }

    /// Committed vnode progress of a job (for tests and the simulation oracle).
    pub fn vnode_progress(&self, job: &str) -> BTreeMap<Vnode, VnodeProgress> {
        let jobs = self.jobs.lock().unwrap();
        jobs.get(job).map(|j| j.vnodes.clone()).unwrap_or_default()
    }

    /// Committed partition progress of a job.
    pub fn partition_progress(&self, job: &str) -> BTreeMap<PartitionId, PartitionProgress> {
        let jobs = self.jobs.lock().unwrap();
        jobs.get(job)
            .map(|j| j.partitions.clone())
            .unwrap_or_default()
    }

    /// The job row, if the job exists.
    pub fn job_row(&self, job: &str) -> Option<JobRow> {
        self.jobs.lock().unwrap().get(job).map(|j| j.row.clone())
    }

    /// Number of materialised rows of a job.
    pub fn rows_len(&self, job: &str) -> usize {
        self.jobs
            .lock()
            .unwrap()
            .get(job)
            .map_or(0, |j| j.rows.len())
    }

    /// Successful commits so far.
    pub fn commits(&self, job: &str) -> u64 {
        let jobs = self.jobs.lock().unwrap();
        jobs.get(job).map_or(0, |j| j.commits)
    }
}

/// The protocol's reads over one job's state (the lock is the transaction).
struct Tx<'a>(Option<&'a JobState>);

impl TxRead for Tx<'_> {
    fn job_row(&mut self, _job: &str) -> Result<Option<JobRow>, StoreError> {
        Ok(self.0.map(|s| s.row.clone()))
    }

    fn leases(
        &mut self,
        _job: &str,
        partitions: &[PartitionId],
    ) -> Result<BTreeMap<PartitionId, (String, Lease)>, StoreError> {
        Ok(self.0.map_or_else(BTreeMap::new, |s| {
            partitions
                .iter()
                .filter_map(|p| s.owners.get(p).map(|o| (*p, (o.worker.clone(), o.lease))))
                .collect()
        }))
    }

    fn vnodes(
        &mut self,
        _job: &str,
        vnodes: &[Vnode],
    ) -> Result<BTreeMap<Vnode, VnodeProgress>, StoreError> {
        Ok(self.0.map_or_else(BTreeMap::new, |s| {
            vnodes
                .iter()
                .filter_map(|v| s.vnodes.get(v).map(|p| (*v, p.clone())))
                .collect()
        }))
    }
}

impl StateStore for MemoryStore {
    fn ensure_job(&mut self, job: &str, info: &SnapshotInfo) -> Result<JobRow, StoreError> {
        let mut jobs = self.jobs.lock().unwrap();
        let state = jobs.entry(job.to_string()).or_insert_with(|| JobState {
            row: JobRow {
                job: job.to_string(),
                snapshot_epoch: info.snapshot_epoch,
                vnode_count: info.vnode_count,
                partition_count: info.partition_count,
                generation: crate::core::Generation(0),
                phase: "snapshot".into(),
                recreations: 0,
            },
            rows: BTreeMap::new(),
            vnodes: BTreeMap::new(),
            partitions: BTreeMap::new(),
            dead_letters: BTreeMap::new(),
            owners: BTreeMap::new(),
            next_lease: crate::core::Lease(1),
            commits: 0,
            applied: None,
            pending: Vec::new(),
            previous: None,
        });
        protocol::check_job_matches(&state.row, info)?;
        Ok(state.row.clone())
    }

    fn job(&mut self, job: &str) -> Result<Option<JobRow>, StoreError> {
        Ok(self.jobs.lock().unwrap().get(job).map(|j| j.row.clone()))
    }

    fn claim(
        &mut self,
        job: &str,
        generation: Generation,
        worker: &str,
        partitions: &[PartitionId],
        info: &SnapshotInfo,
    ) -> Result<Vec<ClaimedPartition>, StoreError> {
        let mut jobs = self.jobs.lock().unwrap();
        protocol::check_claim(&mut Tx(jobs.get(job)), job, generation)?;
        let state = jobs.get_mut(job).expect("checked");
        let map = PartitionMap::new(info.vnode_count, info.partition_count)
            .map_err(|e| StoreError::rejected(e.to_string()))?;
        let mut out = Vec::new();
        for &p in partitions {
            let lease = state.next_lease;
            state.next_lease = Lease(state.next_lease.0 + 1);
            state.owners.insert(
                p,
                Owner {
                    worker: worker.into(),
                    lease,
                },
            );
            out.push(protocol::claimed_partition(
                p,
                lease,
                state.partitions.get(&p).cloned(),
                &state.vnodes,
                &map,
                info,
            )?);
        }
        Ok(out)
    }

    fn commit_group(&mut self, job: &str, cps: &[Checkpoint]) -> Result<(), StoreError> {
        let mut jobs = self.jobs.lock().unwrap();
        // All or nothing: the group is applied to a copy that replaces the state only if every
        // checkpoint passed.
        let Some(current) = jobs.get_mut(job) else {
            return protocol::check_commit(&mut Tx(None), job, cps.first().expect("a group"), &[])
                .map(|_| ());
        };
        let publish = self.publish;
        if let [cp] = cps {
            // Only the checks can fail, and they run before anything is applied.
            return apply_checkpoint(current, job, cp, publish);
        }
        let mut state = current.clone();
        for cp in cps {
            apply_checkpoint(&mut state, job, cp, publish)?;
        }
        jobs.insert(job.to_string(), state);
        Ok(())
    }

    fn recreate_onto(
        &mut self,
        job: &str,
        from_generation: Generation,
        onto: Option<Epoch>,
    ) -> Result<JobRow, StoreError> {
        let mut jobs = self.jobs.lock().unwrap();
        let state = jobs
            .get_mut(job)
            .ok_or_else(|| StoreError::NoJob { job: job.into() })?;
        if protocol::recreation_applies(&state.row, from_generation) {
            state.row.generation = state.row.generation.next();
            state.row.recreations += 1;
            state.row.phase = "snapshot".into();
            if let Some(e) = onto {
                state.row.snapshot_epoch = e;
            }
            if let Some((at, _)) = state.visible() {
                // The replica readers see stays until the new generation reaches it.
                let rows = if state.applied.is_some_and(|a| a >= at) {
                    std::mem::take(&mut state.rows)
                } else {
                    state.previous.take().expect("visible").1
                };
                state.previous = Some((at, rows));
            }
            state.applied = None;
            state.pending.clear();
            state.rows.clear();
            state.vnodes.clear();
            state.partitions.clear();
            if protocol::fences_by_generation() {
                state.owners.clear();
            }
        }
        Ok(state.row.clone())
    }

    fn committed_vnodes(
        &mut self,
        job: &str,
    ) -> Result<BTreeMap<Vnode, VnodeProgress>, StoreError> {
        Ok(self.vnode_progress(job))
    }

    fn committed_partitions(
        &mut self,
        job: &str,
    ) -> Result<BTreeMap<PartitionId, PartitionProgress>, StoreError> {
        Ok(self.partition_progress(job))
    }

    fn rate_limits(&mut self, job: &str) -> Result<Option<RateLimits>, StoreError> {
        Ok(self.limits.lock().unwrap().get(job).copied())
    }

    fn set_rate_limits(&mut self, job: &str, limits: RateLimits) -> Result<(), StoreError> {
        self.limits.lock().unwrap().insert(job.to_string(), limits);
        Ok(())
    }

    fn dead_letters(&mut self, job: &str) -> Result<Vec<DeadLetterRow>, StoreError> {
        let jobs = self.jobs.lock().unwrap();
        Ok(jobs
            .get(job)
            .map(|j| j.dead_letters.values().cloned().collect())
            .unwrap_or_default())
    }

    fn paused(&mut self, job: &str) -> Result<bool, StoreError> {
        Ok(self
            .paused
            .lock()
            .unwrap()
            .get(job)
            .copied()
            .unwrap_or(false))
    }

    fn set_paused(&mut self, job: &str, paused: bool) -> Result<(), StoreError> {
        self.paused.lock().unwrap().insert(job.to_string(), paused);
        Ok(())
    }

    fn owners(&mut self, job: &str) -> Result<BTreeMap<PartitionId, String>, StoreError> {
        Ok(self
            .jobs
            .lock()
            .unwrap()
            .get(job)
            .map_or_else(BTreeMap::new, |s| {
                s.owners
                    .iter()
                    .map(|(p, o)| (*p, o.worker.clone()))
                    .collect()
            }))
    }

    fn published_epoch(&mut self, job: &str) -> Result<Option<Epoch>, StoreError> {
        Ok(self.published(job).map(|(e, _)| e))
    }

    fn rows(&mut self, job: &str) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, StoreError> {
        Ok(self
            .jobs
            .lock()
            .unwrap()
            .get(job)
            .map(|j| j.table().clone())
            .unwrap_or_default())
    }
}

/// `vnode_count`: the job's, to tell a stored row's vnode (a truncation deletes by vnode).
fn apply_rows(rows: &mut BTreeMap<Vec<u8>, Vec<u8>>, mutations: &[RowMutation], vnode_count: u32) {
    for m in mutations {
        match m {
            RowMutation::Truncate { vnode, prefix } => {
                // The vnode is the bare key's: after the table prefix (none for one table).
                rows.retain(|key, _| {
                    !(key.starts_with(prefix)
                        && crate::core::vnode_of(&key[prefix.len()..], vnode_count) == *vnode)
                });
            }
            RowMutation::Upsert { row, .. } => {
                rows.insert(row.key.clone(), row.value.clone());
            }
            RowMutation::Delete { key, .. } => {
                rows.remove(key);
            }
        }
    }
}

/// One checkpoint on a job's state: the protocol's checks, then (only if they pass) its rows and
/// progress.
fn apply_checkpoint(
    state: &mut JobState,
    job: &str,
    cp: &Checkpoint,
    publish: bool,
) -> Result<(), StoreError> {
    {
        protocol::check_commit(&mut Tx(Some(state)), job, cp, &[])?;
        let fresh: Vec<&DeadLetter> = cp
            .dead_letters
            .iter()
            .filter(|d| !state.dead_letters.contains_key(&(d.partition, d.offset)))
            .collect();
        protocol::check_dead_letter_cap(job, cp, (state.dead_letters.len() + fresh.len()) as u64)?;
        for d in fresh {
            state.dead_letters.insert(
                (d.partition, d.offset),
                DeadLetterRow {
                    partition: d.partition,
                    offset: d.offset,
                    epoch: d.epoch.0,
                    generation: cp.generation,
                    reason: d.reason.clone(),
                },
            );
        }
        match (publish, cp.epoch) {
            // Log-store data under publication: a unit, applied once every partition stands at
            // its epoch (snapshot rows go straight into the generation's shadow table).
            // A replay of a checkpoint already published: its rows are applied.
            (true, Some(epoch)) if state.applied.is_some_and(|a| epoch <= a) => {}
            (true, Some(epoch)) => {
                let map = PartitionMap::new(state.row.vnode_count, state.row.partition_count)
                    .map_err(|e| StoreError::rejected(format!("job {job}: {e}")))?;
                state.pending.push(PendingUnit {
                    epoch,
                    partitions: crate::core::publication::partitions_at(map, epoch, cp),
                    rows: cp.rows.clone(),
                });
                let at = crate::core::publication::publication_epoch(
                    state.row.partition_count,
                    state.applied,
                    state
                        .pending
                        .iter()
                        .map(|u| (u.epoch, u.partitions.as_slice())),
                );
                let at = if crate::core::faults::active(
                    crate::core::faults::Fault::PublishAtMinimumCommitted,
                ) {
                    // The deliberate bug: the minimum epoch every vnode has committed.
                    let mut merged = state.vnodes.clone();
                    for v in &cp.vnodes {
                        merged.insert(v.vnode, v.clone());
                    }
                    let min = (merged.len() == state.row.vnode_count as usize
                        && merged.values().all(|v| v.finished))
                    .then(|| merged.values().map(|v| v.epoch).min())
                    .flatten();
                    min.filter(|m| state.applied.is_none_or(|a| *m > a))
                } else {
                    at
                };
                if let Some(at) = at {
                    let (now, later): (Vec<PendingUnit>, Vec<PendingUnit>) =
                        std::mem::take(&mut state.pending)
                            .into_iter()
                            .partition(|u| u.epoch <= at);
                    state.pending = later;
                    let mut now = now;
                    now.sort_by_key(|u| u.epoch);
                    for u in &now {
                        apply_rows(&mut state.rows, &u.rows, state.row.vnode_count);
                    }
                    state.applied = Some(at);
                    if state.previous.as_ref().is_some_and(|(p, _)| *p <= at) {
                        state.previous = None;
                    }
                }
            }
            _ => apply_rows(&mut state.rows, &cp.rows, state.row.vnode_count),
        }
        for v in &cp.vnodes {
            state.vnodes.insert(v.vnode, v.clone());
        }
        for p in &cp.partitions {
            state.partitions.insert(p.partition, p.clone());
        }
        if !cp.partitions.is_empty() {
            // The job streams once every partition has committed in streaming.
            let streaming = state.partitions.values().filter(|p| p.streaming).count();
            state.row.phase = if streaming == state.row.partition_count as usize {
                "streaming"
            } else {
                "log_store"
            }
            .into();
        }
        state.commits += 1;
        Ok(())
    }
}
