//! In-memory implementations of the ports, shared by the unit tests, the deterministic simulation and
//! the scenario tests. The state store checks every invariant a real store enforces (generation,
//! leases, monotonic progress) so that tests catch a core that would break them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::core::{
    Checkpoint, ClaimedPartition, LogRecord, PartitionId, PartitionMap, PartitionProgress, Row,
    RowMutation, Vnode, VnodeProgress,
};
use crate::ports::{
    JobRow, LogStore, RowIter, SnapshotInfo, SnapshotSource, SourceError, StateStore, StoreError,
};

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
    lease: u64,
}

#[derive(Debug, Clone)]
struct JobState {
    row: JobRow,
    rows: BTreeMap<Vec<u8>, Vec<u8>>,
    vnodes: BTreeMap<Vnode, VnodeProgress>,
    partitions: BTreeMap<PartitionId, PartitionProgress>,
    owners: BTreeMap<PartitionId, Owner>,
    next_lease: u64,
    commits: u64,
}

/// A state store in memory; clones share the same state (one handle per worker).
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    jobs: Arc<Mutex<BTreeMap<String, JobState>>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
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

fn invariant(job: &str, detail: String) -> StoreError {
    StoreError::Invariant {
        job: job.to_string(),
        detail,
    }
}

/// Checks a checkpoint against committed state: the invariants every store enforces.
pub fn check_checkpoint(
    job: &str,
    map: &PartitionMap,
    committed_vnodes: &BTreeMap<Vnode, VnodeProgress>,
    cp: &Checkpoint,
) -> Result<(), StoreError> {
    let leased = |v: Vnode| cp.leases.iter().any(|(p, _)| *p == map.partition_of(v));
    for m in &cp.rows {
        if !leased(m.vnode()) {
            return Err(invariant(
                job,
                format!("row of vnode {} outside the leased partitions", m.vnode()),
            ));
        }
    }
    for v in &cp.vnodes {
        if !leased(v.vnode) {
            return Err(invariant(
                job,
                format!(
                    "progress of vnode {} outside the leased partitions",
                    v.vnode
                ),
            ));
        }
        if let Some(old) = committed_vnodes.get(&v.vnode) {
            if v.epoch < old.epoch {
                return Err(invariant(
                    job,
                    format!(
                        "vnode {} epoch would go back from {} to {}",
                        v.vnode, old.epoch, v.epoch
                    ),
                ));
            }
            if v.epoch == old.epoch && !old.finished {
                if let (Some(o), Some(n)) = (&old.cursor, &v.cursor) {
                    if n <= o {
                        return Err(invariant(
                            job,
                            format!("vnode {} snapshot cursor would not increase", v.vnode),
                        ));
                    }
                }
            }
            if old.finished && !v.finished {
                return Err(invariant(
                    job,
                    format!("vnode {} would be unfinished again", v.vnode),
                ));
            }
        }
    }
    for p in &cp.partitions {
        if !cp.leases.iter().any(|(q, _)| *q == p.partition) {
            return Err(invariant(
                job,
                format!("progress of partition {} without its lease", p.partition),
            ));
        }
    }
    Ok(())
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
                generation: 0,
                phase: "snapshot".into(),
                recreations: 0,
            },
            rows: BTreeMap::new(),
            vnodes: BTreeMap::new(),
            partitions: BTreeMap::new(),
            owners: BTreeMap::new(),
            next_lease: 1,
            commits: 0,
        });
        check_job_matches(&state.row, info)?;
        Ok(state.row.clone())
    }

    fn job(&mut self, job: &str) -> Result<Option<JobRow>, StoreError> {
        Ok(self.jobs.lock().unwrap().get(job).map(|j| j.row.clone()))
    }

    fn claim(
        &mut self,
        job: &str,
        generation: u64,
        worker: &str,
        partitions: &[PartitionId],
        info: &SnapshotInfo,
    ) -> Result<Vec<ClaimedPartition>, StoreError> {
        let mut jobs = self.jobs.lock().unwrap();
        let state = jobs
            .get_mut(job)
            .ok_or_else(|| StoreError::NoJob { job: job.into() })?;
        if state.row.generation != generation {
            return Err(StoreError::StaleGeneration {
                job: job.into(),
                attempted: generation,
                current: state.row.generation,
            });
        }
        let map = PartitionMap::new(info.vnode_count, info.partition_count)
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let mut out = Vec::new();
        for &p in partitions {
            let lease = state.next_lease;
            state.next_lease += 1;
            state.owners.insert(
                p,
                Owner {
                    worker: worker.into(),
                    lease,
                },
            );
            let progress = match state.partitions.get(&p) {
                Some(pp) => pp.clone(),
                None => info.start_of(p).cloned().ok_or_else(|| {
                    StoreError::Backend(format!("snapshot has no start offset for partition {p}"))
                })?,
            };
            let vnodes = map
                .vnodes_of(p)
                .map(|v| {
                    state
                        .vnodes
                        .get(&v)
                        .cloned()
                        .unwrap_or_else(|| VnodeProgress::fresh(v, info.snapshot_epoch))
                })
                .collect();
            out.push(ClaimedPartition {
                partition: p,
                lease,
                progress,
                vnodes,
            });
        }
        Ok(out)
    }

    fn commit(&mut self, job: &str, cp: &Checkpoint) -> Result<(), StoreError> {
        let mut jobs = self.jobs.lock().unwrap();
        let state = jobs
            .get_mut(job)
            .ok_or_else(|| StoreError::NoJob { job: job.into() })?;
        if state.row.generation != cp.generation {
            return Err(StoreError::StaleGeneration {
                job: job.into(),
                attempted: cp.generation,
                current: state.row.generation,
            });
        }
        for (p, lease) in &cp.leases {
            match state.owners.get(p) {
                Some(o) if o.lease == *lease => {}
                other => {
                    return Err(StoreError::NotOwner {
                        job: job.into(),
                        partition: *p,
                        attempted: *lease,
                        current: other.map_or(0, |o| o.lease),
                        owner: other.map_or("nobody".into(), |o| o.worker.clone()),
                    })
                }
            }
        }
        let map = PartitionMap::new(state.row.vnode_count, state.row.partition_count)
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        check_checkpoint(job, &map, &state.vnodes, cp)?;
        for m in &cp.rows {
            match m {
                RowMutation::Upsert { row, .. } => {
                    state.rows.insert(row.key.clone(), row.value.clone());
                }
                RowMutation::Delete { key, .. } => {
                    state.rows.remove(key);
                }
            }
        }
        for v in &cp.vnodes {
            state.vnodes.insert(v.vnode, v.clone());
        }
        for p in &cp.partitions {
            state.partitions.insert(p.partition, p.clone());
        }
        state.commits += 1;
        Ok(())
    }

    fn recreate(&mut self, job: &str, from_generation: u64) -> Result<JobRow, StoreError> {
        let mut jobs = self.jobs.lock().unwrap();
        let state = jobs
            .get_mut(job)
            .ok_or_else(|| StoreError::NoJob { job: job.into() })?;
        if state.row.generation == from_generation {
            state.row.generation += 1;
            state.row.recreations += 1;
            state.row.phase = "snapshot".into();
            state.rows.clear();
            state.vnodes.clear();
            state.partitions.clear();
            state.owners.clear();
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

    fn rows(&mut self, job: &str) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, StoreError> {
        Ok(self
            .jobs
            .lock()
            .unwrap()
            .get(job)
            .map(|j| j.rows.clone())
            .unwrap_or_default())
    }
}

/// A stored job row must agree with the snapshot and configuration it is run with.
pub fn check_job_matches(row: &JobRow, info: &SnapshotInfo) -> Result<(), StoreError> {
    let mismatch = |what: &'static str, expected: String, found: String| StoreError::JobMismatch {
        job: row.job.clone(),
        what,
        expected,
        found,
    };
    if row.partition_count != info.partition_count {
        return Err(mismatch(
            "partition count",
            info.partition_count.to_string(),
            row.partition_count.to_string(),
        ));
    }
    if row.vnode_count != info.vnode_count {
        return Err(mismatch(
            "vnode count",
            info.vnode_count.to_string(),
            row.vnode_count.to_string(),
        ));
    }
    if row.snapshot_epoch != info.snapshot_epoch {
        return Err(mismatch(
            "snapshot epoch",
            info.snapshot_epoch.to_string(),
            row.snapshot_epoch.to_string(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Epoch;

    fn info(partitions: u32) -> SnapshotInfo {
        SnapshotInfo {
            snapshot_epoch: Epoch(1 << 16),
            vnode_count: 16,
            partition_count: partitions,
            start: (0..partitions)
                .map(|p| PartitionProgress {
                    partition: p,
                    next_offset: 0,
                    epoch: Epoch(2 << 16),
                    streaming: false,
                })
                .collect(),
        }
    }

    #[test]
    fn a_partition_count_change_is_an_error_not_a_remap() {
        let mut store = MemoryStore::new();
        store.ensure_job("j", &info(4)).unwrap();
        let err = store.ensure_job("j", &info(6)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "job j: partition count is 4 in the store but 6 in the configuration; a job's partition count is fixed"
        );
    }

    #[test]
    fn commits_are_fenced_by_generation_and_lease() {
        let mut store = MemoryStore::new();
        let info = info(2);
        store.ensure_job("j", &info).unwrap();
        let a = store.claim("j", 0, "a", &[0], &info).unwrap();
        let b = store.claim("j", 0, "b", &[0], &info).unwrap(); // the group moved partition 0 to b
        let cp = |lease, generation| Checkpoint {
            generation,
            worker: "x".into(),
            cause: crate::core::CheckpointCause::Local,
            epoch: None,
            leases: vec![(0, lease)],
            rows: vec![],
            vnodes: vec![],
            partitions: vec![],
        };
        let err = store.commit("j", &cp(a[0].lease, 0)).unwrap_err();
        assert!(
            matches!(err, StoreError::NotOwner { partition: 0, .. }),
            "{err}"
        );
        store.commit("j", &cp(b[0].lease, 0)).unwrap();
        let row = store.recreate("j", 0).unwrap();
        assert_eq!((row.generation, row.recreations), (1, 1));
        assert_eq!(
            store.recreate("j", 0).unwrap().generation,
            1,
            "compare-and-set: once"
        );
        let err = store.commit("j", &cp(b[0].lease, 0)).unwrap_err();
        assert!(matches!(
            err,
            StoreError::StaleGeneration {
                attempted: 0,
                current: 1,
                ..
            }
        ));
    }
}
