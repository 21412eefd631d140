//! The ports the rest of the system plugs into: snapshot sources, log stores and state stores.
//!
//! They are synchronous traits: drivers call them from threads that may block (never from a tokio
//! worker). `memory` implements each for tests and the simulation; `sqlite`, `snapshot_files` and the
//! Kafka modules implement them for real.

use std::collections::BTreeMap;

use crate::core::{
    Checkpoint, ClaimedPartition, Epoch, LogRecord, PartitionId, PartitionProgress, Row, Vnode,
    VnodeProgress,
};

/// What a snapshot says about itself (DESIGN.md §3).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SnapshotInfo {
    pub snapshot_epoch: Epoch,
    pub vnode_count: u32,
    pub partition_count: u32,
    /// Per partition: the offset just after the barrier with `prev = Es`, and that barrier's `curr`.
    pub start: Vec<PartitionProgress>,
}

impl SnapshotInfo {
    pub fn start_of(&self, p: PartitionId) -> Option<&PartitionProgress> {
        self.start.iter().find(|s| s.partition == p)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("snapshot file {file}: {reason}")]
    File { file: String, reason: String },
    #[error("snapshot source: {0}")]
    Other(String),
}

/// Rows of one vnode in primary-key (byte) order.
pub type RowIter<'a> = Box<dyn Iterator<Item = Result<Row, SourceError>> + Send + 'a>;

/// A table snapshot at `Es`, scannable per vnode from a cursor.
pub trait SnapshotSource: Send + Sync {
    fn info(&self) -> &SnapshotInfo;
    /// Rows of `vnode` whose key is strictly greater than `after`, in key order.
    fn scan(&self, vnode: Vnode, after: Option<&[u8]>) -> Result<RowIter<'_>, SourceError>;
}

/// A partitioned log with high watermarks (the in-memory stand-in for the Kafka topic).
pub trait LogStore {
    fn partition_count(&self) -> u32;
    /// Appends and returns the record's offset.
    fn append(&mut self, partition: PartitionId, record: LogRecord) -> u64;
    /// Up to `max` records from `from`, with their offsets.
    fn read(&self, partition: PartitionId, from: u64, max: usize) -> Vec<(u64, LogRecord)>;
    /// The offset after the last record.
    fn high_watermark(&self, partition: PartitionId) -> u64;
}

/// The job row (DESIGN.md §4).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct JobRow {
    pub job: String,
    pub snapshot_epoch: Epoch,
    pub vnode_count: u32,
    pub partition_count: u32,
    pub generation: u64,
    pub phase: String,
    pub recreations: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("job {job}: commit from generation {attempted} rejected, the job is at generation {current}")]
    StaleGeneration {
        job: String,
        attempted: u64,
        current: u64,
    },
    #[error("job {job}: partition {partition} is owned by {owner} (lease {current}); commit with lease {attempted} rejected")]
    NotOwner {
        job: String,
        partition: PartitionId,
        attempted: u64,
        current: u64,
        owner: String,
    },
    #[error("job {job}: {what} is {found} in the store but {expected} in the configuration; a job's {what} is fixed")]
    JobMismatch {
        job: String,
        what: &'static str,
        expected: String,
        found: String,
    },
    #[error("job {job}: commit would break an invariant: {detail}")]
    Invariant { job: String, detail: String },
    #[error("job {job} does not exist in the store")]
    NoJob { job: String },
    /// Transient: the store is unreachable or busy (connection lost, locked, serialization
    /// failure). Retrying the same transaction can succeed.
    #[error("state store unavailable: {0}")]
    Backend(String),
    /// Permanent: the store refused the data or the statement (a constraint, a type, a value it
    /// cannot hold). Retrying cannot succeed; the job stops.
    #[error("state store refused the checkpoint: {0}")]
    Rejected(String),
    /// A row value that the store cannot hold, named by column and key.
    #[error("state store cannot hold column {column} of the row with key {key}: {reason}")]
    Value {
        column: String,
        /// Key bytes, hex.
        key: String,
        reason: String,
    },
}

impl StoreError {
    /// A fencing rejection: the worker is stale and must restart from the store.
    pub fn is_fenced(&self) -> bool {
        matches!(
            self,
            StoreError::StaleGeneration { .. } | StoreError::NotOwner { .. }
        )
    }

    /// Whether retrying the same operation can succeed (the store was unavailable or busy).
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Backend(_))
    }
}

/// Key bytes as hex for errors, cut after 32 bytes.
pub fn key_hex(key: &[u8]) -> String {
    let mut s: String = key.iter().take(32).map(|b| format!("{b:02x}")).collect();
    if key.len() > 32 {
        s.push_str(&format!("… ({} bytes)", key.len()));
    }
    s
}

/// Durable state of jobs.
pub trait StateStore: Send {
    /// Creates the job row at generation 0 if absent; checks a present one against `info`.
    fn ensure_job(&mut self, job: &str, info: &SnapshotInfo) -> Result<JobRow, StoreError>;
    fn job(&mut self, job: &str) -> Result<Option<JobRow>, StoreError>;
    /// Takes ownership of partitions for `worker` under `generation`: new leases, and the committed
    /// progress (else the snapshot's start offsets and fresh vnodes).
    fn claim(
        &mut self,
        job: &str,
        generation: u64,
        worker: &str,
        partitions: &[PartitionId],
        info: &SnapshotInfo,
    ) -> Result<Vec<ClaimedPartition>, StoreError>;
    /// Applies one checkpoint atomically, or nothing.
    fn commit(&mut self, job: &str, checkpoint: &Checkpoint) -> Result<(), StoreError>;
    /// Compare-and-set `generation` from `from_generation` to the next, discarding rows and progress,
    /// in one transaction. Returns the job row after (also when another worker already recreated).
    fn recreate(&mut self, job: &str, from_generation: u64) -> Result<JobRow, StoreError>;
    /// The materialised rows: key bytes → row datum bytes.
    fn rows(&mut self, job: &str) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, StoreError>;
    /// Committed progress of every vnode that has some.
    fn committed_vnodes(&mut self, job: &str)
        -> Result<BTreeMap<Vnode, VnodeProgress>, StoreError>;
    /// Committed progress of every partition that has some.
    fn committed_partitions(
        &mut self,
        job: &str,
    ) -> Result<BTreeMap<PartitionId, PartitionProgress>, StoreError>;
}

/// A SQL table name the stores accept (it is quoted into statements): letters, digits and `_`.
pub fn check_table_name(name: &str) -> Result<(), StoreError> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(StoreError::Rejected(format!(
            "table name {name:?}: use letters, digits and _"
        )));
    }
    Ok(())
}

/// The job-row phase after a checkpoint that carries partition progress: `streaming` once every
/// partition of the job has committed in the streaming phase, else `log_store` (README "Where state
/// lives"). `{streaming}` is the SQL test of a streaming partition-progress row.
pub fn job_phase_sql(streaming: &str, placeholder: &str) -> String {
    format!(
        "UPDATE kb_jobs SET phase = CASE WHEN (SELECT COUNT(*) FROM kb_partition_progress \
         WHERE job = {placeholder} AND {streaming}) = partition_count THEN 'streaming' \
         ELSE 'log_store' END WHERE job = {placeholder}"
    )
}
