//! The ports the rest of the system plugs into: snapshot sources, log stores and state stores.
//!
//! They are synchronous traits: drivers call them from threads that may block (never from a tokio
//! worker). `memory` implements each for tests and the simulation; `sqlite`, `snapshot_files` and the
//! Kafka modules implement them for real.

use crate::core::{Generation, Lease};
use std::collections::BTreeMap;

use crate::core::{
    Checkpoint, ClaimedPartition, Epoch, LogRecord, PartitionId, PartitionProgress, RateLimits,
    Row, Vnode, VnodeProgress,
};

/// What a snapshot says about itself (docs/DESIGN.md §3).
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

/// The job row (docs/DESIGN.md §4).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct JobRow {
    pub job: String,
    pub snapshot_epoch: Epoch,
    pub vnode_count: u32,
    pub partition_count: u32,
    pub generation: Generation,
    pub phase: String,
    pub recreations: u64,
}

/// A cause kept beneath an error of this crate (a store's, a capture's): any error, reachable by its
/// type through `source`.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Display is the one line an operator reads and names the cause; the cause itself, where there
/// is one, stays beneath as `source` ([`crate::error`] prints a chain without saying it twice).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("job {job}: commit from generation {attempted} rejected, the job is at generation {current}")]
    StaleGeneration {
        job: String,
        attempted: Generation,
        current: Generation,
    },
    #[error("job {job}: partition {partition} is owned by {owner} (lease {current}); commit with lease {attempted} rejected")]
    NotOwner {
        job: String,
        partition: PartitionId,
        attempted: Lease,
        current: Lease,
        owner: String,
    },
    #[error("job {job}: {what} is {found} in the store but {expected} in the configuration; a job's {what} is fixed")]
    JobMismatch {
        job: String,
        what: &'static str,
        expected: String,
        found: String,
    },
    /// A table belongs to the one job recorded with it in the store's `kb_jobs`.
    #[error("table {table} belongs to job {owner} in this store; job {job} refused before writing anything (give job {job} its own `[jobs.store] table`, or delete job {owner}'s rows from kb_jobs and kb_job_tables if that job is gone for good)")]
    TableOwned {
        table: String,
        owner: String,
        job: String,
    },
    #[error("job {job}: commit would break an invariant: {detail}")]
    Invariant { job: String, detail: String },
    #[error("job {job} does not exist in the store")]
    NoJob { job: String },
    /// Transient: the store is unreachable or busy (connection lost, locked, serialization
    /// failure). Retrying the same transaction can succeed.
    #[error("state store unavailable: {what}")]
    Backend {
        what: String,
        #[source]
        cause: Option<Cause>,
    },
    /// Permanent: the store refused the data or the statement (a constraint, a type, a value it
    /// cannot hold). Retrying cannot succeed; the job stops.
    #[error("state store refused the checkpoint: {what}")]
    Rejected {
        what: String,
        #[source]
        cause: Option<Cause>,
    },
    /// `max_dead_letters` reached: the checkpoint would record more; nothing of it is applied.
    #[error("job {job}: the checkpoint would record {would_be} dead letters, over max_dead_letters = {max}; the job stops (the dead letters so far: `kafka-backfill verify` lists them, kb_dead_letters holds them); raise the cap or fix the producer, then run again")]
    DeadLetterCap {
        job: String,
        max: u64,
        would_be: u64,
    },
    /// A row value that the store cannot hold, named by column and key.
    #[error("state store cannot hold column {column} of the row with key {key}: {reason}")]
    Value {
        column: String,
        /// Key bytes, hex.
        key: String,
        reason: String,
    },
}

/// A copy for each checkpoint of a group that failed as a whole ([`crate::store::commit_in_order`]):
/// the cause beneath `Backend` and `Rejected` is copied as its text (its type stays with the
/// original).
impl Clone for StoreError {
    fn clone(&self) -> Self {
        let kept = |c: &Option<Cause>| c.as_ref().map(|c| Cause::from(c.to_string()));
        match self {
            StoreError::StaleGeneration {
                job,
                attempted,
                current,
            } => StoreError::StaleGeneration {
                job: job.clone(),
                attempted: *attempted,
                current: *current,
            },
            StoreError::NotOwner {
                job,
                partition,
                attempted,
                current,
                owner,
            } => StoreError::NotOwner {
                job: job.clone(),
                partition: *partition,
                attempted: *attempted,
                current: *current,
                owner: owner.clone(),
            },
            StoreError::JobMismatch {
                job,
                what,
                expected,
                found,
            } => StoreError::JobMismatch {
                job: job.clone(),
                what,
                expected: expected.clone(),
                found: found.clone(),
            },
            StoreError::TableOwned { table, owner, job } => StoreError::TableOwned {
                table: table.clone(),
                owner: owner.clone(),
                job: job.clone(),
            },
            StoreError::Invariant { job, detail } => StoreError::Invariant {
                job: job.clone(),
                detail: detail.clone(),
            },
            StoreError::NoJob { job } => StoreError::NoJob { job: job.clone() },
            StoreError::Backend { what, cause } => StoreError::Backend {
                what: what.clone(),
                cause: kept(cause),
            },
            StoreError::Rejected { what, cause } => StoreError::Rejected {
                what: what.clone(),
                cause: kept(cause),
            },
            StoreError::DeadLetterCap { job, max, would_be } => StoreError::DeadLetterCap {
                job: job.clone(),
                max: *max,
                would_be: *would_be,
            },
            StoreError::Value {
                column,
                key,
                reason,
            } => StoreError::Value {
                column: column.clone(),
                key: key.clone(),
                reason: reason.clone(),
            },
        }
    }
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
        matches!(self, StoreError::Backend { .. })
    }

    /// Transient: `what` (which names the cause) failed; nothing beneath it.
    pub fn backend(what: impl Into<String>) -> Self {
        StoreError::Backend {
            what: what.into(),
            cause: None,
        }
    }

    /// Transient: `what` (which names the cause) failed because of `cause`, kept beneath.
    pub fn backend_from(what: impl Into<String>, cause: impl Into<Cause>) -> Self {
        StoreError::Backend {
            what: what.into(),
            cause: Some(cause.into()),
        }
    }

    /// Permanent: the store refused `what`; nothing beneath it.
    pub fn rejected(what: impl Into<String>) -> Self {
        StoreError::Rejected {
            what: what.into(),
            cause: None,
        }
    }

    /// Permanent: the store refused `what` because of `cause`, kept beneath.
    pub fn rejected_from(what: impl Into<String>, cause: impl Into<Cause>) -> Self {
        StoreError::Rejected {
            what: what.into(),
            cause: Some(cause.into()),
        }
    }
}

/// The column values of one checkpoint's rows, decoded ahead of its commit (by the committer's
/// `submit`, on the worker thread, so the store's thread only binds them): one entry per row in
/// order, `None` for a delete, `Err` (the decode error) for a datum that does not decode.
pub type DecodedRows = Vec<Option<Result<Vec<crate::codec::ColumnValue>, String>>>;

/// The row schemas a worker decodes a checkpoint's column values with, ahead of its commit: one
/// table's, or each of a several-table job's by its log table index (the prefix of its rows'
/// keys, [`crate::core::table_key`]).
pub enum RowSchemas {
    One(Box<crate::codec::TableSchema>),
    Several(Vec<(u16, crate::codec::TableSchema)>),
    /// Nothing decoded ahead: the store reads every row's values in place.
    None,
}

impl RowSchemas {
    /// Leaves out the tables whose values the store reads in place from the datum
    /// ([`StateStore::reads_values_in_place`]): for them, decoding ahead only allocated what the
    /// store's thread then freed (docs/BENCHMARKS.md "Column values read in place").
    pub fn for_store(self, in_place: bool) -> RowSchemas {
        if !in_place {
            return self;
        }
        match self {
            RowSchemas::One(t) if t.is_direct() => RowSchemas::None,
            RowSchemas::Several(ts) => {
                RowSchemas::Several(ts.into_iter().filter(|(_, t)| !t.is_direct()).collect())
            }
            other => other,
        }
    }

    /// The column values of every upserted row of `cp`. A several-table row of no table here is
    /// left to the store, which refuses it naming the table (`None`, as if not decoded ahead).
    pub fn decode(&self, cp: &Checkpoint) -> DecodedRows {
        if let RowSchemas::None = self {
            return Vec::new();
        }
        cp.rows
            .iter()
            .map(|m| match m {
                crate::core::RowMutation::Upsert { row, .. } => {
                    let table = match self {
                        RowSchemas::One(t) => t,
                        RowSchemas::Several(ts) => {
                            let index = crate::core::split_table_key(&row.key)?.0;
                            &ts.iter().find(|(i, _)| *i == index)?.1
                        }
                        RowSchemas::None => return None,
                    };
                    Some(table.column_values(&row.value).map_err(|e| e.to_string()))
                }
                crate::core::RowMutation::Delete { .. }
                | crate::core::RowMutation::Truncate { .. } => None,
            })
            .collect()
    }
}

/// The column values of an upserted row (`key`: as its table keeps it, named in the error;
/// `value`: its datum): decoded ahead (`pre`) or now; a datum that does not decode is refused,
/// naming its key.
pub fn row_columns(
    table: &crate::codec::TableSchema,
    key: &[u8],
    value: &[u8],
    pre: Option<Result<Vec<crate::codec::ColumnValue>, String>>,
) -> Result<Vec<crate::codec::ColumnValue>, StoreError> {
    pre.unwrap_or_else(|| table.column_values(value).map_err(|e| e.to_string()))
        .map_err(|e| undecodable_row(key, &e))
}

/// The refusal of an upserted row whose datum does not decode (`key`: as its table keeps it).
pub fn undecodable_row(key: &[u8], error: &str) -> StoreError {
    StoreError::rejected(format!(
        "row with key {} does not decode: {error}",
        key_hex(key)
    ))
}

pub use crate::core::error::key_hex;

/// Durable state of jobs.
pub trait StateStore: Send {
    /// Creates the job row at generation 0 if absent; checks a present one against `info`. A table
    /// belongs to one job: if another job of this store is recorded with the store's table the call
    /// is refused ([`StoreError::TableOwned`]) before anything is written, and so is a job recorded
    /// with another table (`StoreError::JobMismatch`, what = "table").
    fn ensure_job(&mut self, job: &str, info: &SnapshotInfo) -> Result<JobRow, StoreError>;
    fn job(&mut self, job: &str) -> Result<Option<JobRow>, StoreError>;
    /// Takes ownership of partitions for `worker` under `generation`: new leases, and the committed
    /// progress (else the snapshot's start offsets and fresh vnodes).
    fn claim(
        &mut self,
        job: &str,
        generation: Generation,
        worker: &str,
        partitions: &[PartitionId],
        info: &SnapshotInfo,
    ) -> Result<Vec<ClaimedPartition>, StoreError>;
    /// Applies one checkpoint atomically, or nothing.
    fn commit(&mut self, job: &str, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        self.commit_group(job, std::slice::from_ref(checkpoint))
    }
    /// Applies consecutive checkpoints of one worker in order, in one transaction: each is checked
    /// by the store protocol against the state the earlier ones left, and either all are applied or
    /// none is. (A group commit: the committer hands over every checkpoint that queued up while the
    /// previous transaction ran, so a busy store writes its WAL and syncs once for several.)
    fn commit_group(&mut self, job: &str, checkpoints: &[Checkpoint]) -> Result<(), StoreError>;
    /// [`commit_group`](Self::commit_group) with the rows' column values decoded ahead, one
    /// [`DecodedRows`] per checkpoint (missing ones are decoded here). Stores that keep only the
    /// datum ignore them.
    fn commit_group_decoded(
        &mut self,
        job: &str,
        checkpoints: &[Checkpoint],
        decoded: Vec<DecodedRows>,
    ) -> Result<(), StoreError> {
        let _ = decoded;
        self.commit_group(job, checkpoints)
    }
    /// Compare-and-set `generation` from `from_generation` to the next, discarding rows and progress,
    /// in one transaction. Returns the job row after (also when another worker already recreated).
    fn recreate(&mut self, job: &str, from_generation: Generation) -> Result<JobRow, StoreError> {
        self.recreate_onto(job, from_generation, None)
    }
    /// [`recreate`](Self::recreate), the next generation starting from the snapshot at `onto`
    /// when given (the job row records that snapshot epoch): the move of a job whose log was
    /// deleted to a newer snapshot of its capture (`crate::core::retention`).
    fn recreate_onto(
        &mut self,
        job: &str,
        from_generation: Generation,
        onto: Option<Epoch>,
    ) -> Result<JobRow, StoreError>;
    /// The materialised rows: key bytes → row datum bytes (rebuilt from the typed columns when the
    /// table keeps no datum: [`datumless_table`](Self::datumless_table)).
    fn rows(&mut self, job: &str) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, StoreError>;
    /// Under publication (`consistency = "epoch"`, docs/design/several-tables.md §2): the upstream
    /// epoch the whole table stands at, `None` before the first publication (or for a store that
    /// does not publish: each vnode is then at its own epoch).
    fn published_epoch(&mut self, _job: &str) -> Result<Option<crate::core::Epoch>, StoreError> {
        Ok(None)
    }
    /// Whether the store reads the column values of a table whose fields are all primitives in
    /// place from each row's datum, when they were not decoded ahead ([`RowSchemas::for_store`]).
    fn reads_values_in_place(&self) -> bool {
        false
    }
    /// The row schema when the table keeps no datum (`store_datum = false`): its rows are rebuilt
    /// from typed columns, which hold a double by value (SQLite reads −0.0 back as 0.0), so
    /// `verify` compares such rows by their column values.
    fn datumless_table(&self) -> Option<crate::codec::TableSchema> {
        None
    }
    /// Committed progress of every vnode that has some.
    fn committed_vnodes(&mut self, job: &str)
        -> Result<BTreeMap<Vnode, VnodeProgress>, StoreError>;
    /// The job's live rate limits, if they were ever set (`kafka-backfill rate-limit`).
    fn rate_limits(&mut self, job: &str) -> Result<Option<RateLimits>, StoreError>;
    /// Sets the job's live rate limits; they outlive restarts and recreations.
    fn set_rate_limits(&mut self, job: &str, limits: RateLimits) -> Result<(), StoreError>;
    /// The dead letters recorded for the job (`on_bad_record = "dead-letter"`), by partition and
    /// offset.
    fn dead_letters(&mut self, job: &str) -> Result<Vec<DeadLetterRow>, StoreError>;
    /// Whether the job is paused (`kafka-backfill pause`); never set = not paused.
    fn paused(&mut self, job: &str) -> Result<bool, StoreError>;
    /// Pauses or resumes the job; kept across restarts and recreations, like the live limits.
    fn set_paused(&mut self, job: &str, paused: bool) -> Result<(), StoreError>;
    /// The worker holding each leased partition (its last claim).
    fn owners(&mut self, job: &str) -> Result<BTreeMap<PartitionId, String>, StoreError>;
    /// Committed progress of every partition that has some.
    fn committed_partitions(
        &mut self,
        job: &str,
    ) -> Result<BTreeMap<PartitionId, PartitionProgress>, StoreError>;
}

/// Opens a state store handle (one per worker thread and committer; a job's runtime keeps a few for
/// its own reads).
pub type StoreFactory =
    std::sync::Arc<dyn Fn() -> Result<Box<dyn StateStore>, StoreError> + Send + Sync>;

/// A SQL table name the stores accept (it is quoted into statements): letters, digits and `_`.
pub fn check_table_name(name: &str) -> Result<(), StoreError> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(StoreError::rejected(format!(
            "table name {name:?}: use letters, digits and _"
        )));
    }
    if name.ends_with("__kb_next") {
        return Err(StoreError::rejected(format!(
            "table name {name:?}: names ending in __kb_next are the service's own (where a new generation builds under consistency = \"epoch\")"
        )));
    }
    Ok(())
}

/// The job-row phase after a checkpoint that carries partition progress: `streaming` once every
/// partition of the job has committed in the streaming phase, else `log_store` (docs/OPERATIONS.md "Where state
/// lives"). `{streaming}` is the SQL test of a streaming partition-progress row.
pub fn job_phase_sql(streaming: &str, placeholder: &str) -> String {
    format!(
        "UPDATE kb_jobs SET phase = CASE WHEN (SELECT COUNT(*) FROM kb_partition_progress \
         WHERE job = {placeholder} AND {streaming}) = partition_count THEN 'streaming' \
         ELSE 'log_store' END WHERE job = {placeholder}"
    )
}

// ----- the worker loop's ports (`crate::driver`) ------------------------------------------------

/// One recorded dead letter (`kb_dead_letters`): a record skipped because it did not decode.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeadLetterRow {
    pub partition: PartitionId,
    pub offset: u64,
    /// The partition's open epoch where it stood.
    pub epoch: u64,
    /// The generation that first recorded it (a recreation reads it again and keeps this row).
    pub generation: Generation,
    pub reason: String,
}

/// What one poll of a consumer returns: a record (decoded, or why not), or a group event. Rebalance
/// callbacks arrive as events in poll order; the loop completes them (`assign` / `unassign`) after
/// the core has handled them, so a revocation is acknowledged only once its commits are durable.
#[derive(Debug)]
pub enum Polled {
    Record {
        partition: PartitionId,
        offset: u64,
        /// The decoded record, or why it does not decode with its bytes (the poison path).
        record: Result<LogRecord, Undecoded>,
    },
    /// The group gives these partitions; complete with [`ConsumerPort::assign`].
    Assigned(Vec<PartitionId>),
    /// The group takes these partitions (`lost`: taken without a handover, e.g. after a session
    /// timeout); complete with [`ConsumerPort::unassign`].
    Revoked {
        partitions: Vec<PartitionId>,
        lost: bool,
    },
    /// The client reported an error; a fatal one stops the worker. `repeat`: the same cause was
    /// reported within the last minute (`kafka::client_log`): counted, not logged again.
    ClientError {
        reason: String,
        fatal: bool,
        repeat: bool,
    },
}

/// A record that did not decode: why, and its bytes (kept for a dead letter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Undecoded {
    pub reason: String,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
}

/// A dead letter with the record's own bytes, as it goes to the dead-letter topic.
#[derive(Debug, Clone, Copy)]
pub struct DeadLetterRecord<'a> {
    pub letter: &'a crate::core::DeadLetter,
    pub key: Option<&'a [u8]>,
    pub value: &'a [u8],
}

/// Where dead letters go (`on_bad_record = "dead-letter"`): the loop writes a checkpoint's dead
/// letters here, and waits until they are written, before it hands the checkpoint to the store —
/// so a dead letter recorded in the store is always in the topic too (a crash between the two
/// writes it again when the partition is read again: at least once in the topic, exactly once in
/// the store).
pub trait DeadLetterSink {
    /// Writes these records and waits until the broker has them all; an error is transient (the
    /// worker restarts from the store, nothing of the checkpoint recorded).
    fn send(&mut self, letters: &[DeadLetterRecord<'_>]) -> Result<(), String>;
}

/// Why a worker cannot start the partitions the group gave it; either way the worker fails (it must
/// never believe it owns partitions it does not fetch).
#[derive(Debug, thiserror::Error)]
pub enum AssignError {
    /// A partition's needed offset is below the log's start: checked before anything is read.
    #[error(transparent)]
    LogStartGone(#[from] crate::core::LogStartGone),
    /// The client refused the assignment.
    #[error("{0}; the worker cannot fetch partitions the group assigned it")]
    Client(String),
}

/// A consumer-group member as the loop sees it: librdkafka in production (`kafka::worker`), a
/// simulated member in `sim`.
pub trait ConsumerPort {
    /// The next record or group event, waiting at most `timeout_ms`.
    fn poll(&mut self, timeout_ms: u64) -> Option<Polled>;
    /// Completes an assignment: each partition starts at the given offset (`None`: the claim
    /// failed and the loop restarts before it reads; production starts at the log's start). An error is the worker's failure (a
    /// worker must never believe it owns partitions it does not fetch).
    fn assign(&mut self, starts: &[(PartitionId, Option<u64>)]) -> Result<(), AssignError>;
    /// Completes a revocation. An error is the worker's failure.
    fn unassign(&mut self, partitions: &[PartitionId]) -> Result<(), String>;
    /// Moves the fetch position (retried within a bound by the implementation).
    fn seek(&mut self, partition: PartitionId, offset: u64) -> Result<(), String>;
    /// Stops fetching the partition (alignment back-pressure). An error is the worker's failure.
    fn pause(&mut self, partition: PartitionId) -> Result<(), String>;
    /// Fetches the partition again, from `at` when the loop knows the next offset it reads (the
    /// consumer restarts the partition's fetch there; `None`: where the consumer stopped). An error
    /// is the worker's failure.
    fn resume(&mut self, partition: PartitionId, at: Option<u64>) -> Result<(), String>;
    /// Group offsets (informational: the store holds the truth); `sync` waits.
    fn commit_offsets(&mut self, progress: &[PartitionProgress], sync: bool);
    /// The partition's high watermark, if known.
    fn high_watermark(&mut self, partition: PartitionId) -> Option<u64>;
    /// The partition's high watermark asked of the broker now, for a partition the consumer does
    /// not fetch (a paused job's), whose cached watermark goes stale.
    fn broker_high_watermark(&mut self, partition: PartitionId) -> Option<u64> {
        self.high_watermark(partition)
    }
    /// How far the consumer has read the partition, past records it never returns (transaction
    /// markers, aborted records), if known.
    fn read_position(&mut self, partition: PartitionId) -> Option<u64>;
    /// The partitions currently assigned.
    fn assignment(&mut self) -> Vec<PartitionId>;
    /// Shutdown: leave the group (`leave`), or close keeping the membership (a static member).
    fn close(&mut self, leave: bool);
}

/// The outcome of one checkpoint commit.
pub struct CommitDone {
    pub checkpoint: Checkpoint,
    pub result: Result<(), StoreError>,
    /// The latency of the store transaction that carried this checkpoint, on the *first* checkpoint
    /// of that transaction only (`None` on the others of its group): a transaction is one sample of
    /// commit latency (the histogram, the adaptive rate limit), however many checkpoints it held.
    pub transaction_ms: Option<f64>,
    /// How many checkpoints that transaction carried.
    pub group_size: usize,
}

/// How many checkpoints may wait for the store before the worker blocks; also the largest group one
/// transaction commits. The production committer and the simulation use this one bound.
pub const MAX_PENDING_COMMITS: usize = 4;

/// Checkpoint commits, applied in submission order while the loop goes on; after one fails none
/// later is applied. Production: `kafka::committer` (a thread); simulation: completions whenever the
/// simulator decides.
pub trait CommitPort {
    /// Hands a checkpoint over (may block while too many are pending).
    fn submit(&mut self, checkpoint: Checkpoint);
    /// Commits finished so far, without waiting.
    fn finished(&mut self) -> Vec<CommitDone>;
    /// Waits for every pending commit.
    fn drain(&mut self) -> Vec<CommitDone>;
    /// After a failure: waits for what is pending and starts afresh. Returns the outcomes the
    /// failed executor never took (its commits that applied are still commits, and are reported).
    fn restart(&mut self) -> Result<Vec<CommitDone>, StoreError>;
}

/// Time as the loop sees it.
pub trait Clock {
    /// Milliseconds since the Unix epoch (or the simulation's start).
    fn now_ms(&self) -> u64;
    /// Throttling waits.
    fn sleep_ms(&mut self, ms: u64);
}

/// What a worker reports of itself at every housekeeping round (and on failures): what `/status`,
/// `/readyz`, `/livez` and the job runner see of it.
#[derive(Clone, Debug, Default)]
pub struct WorkerReport {
    pub status: Option<crate::core::WorkerStatus>,
    /// Snapshot rows plus log records handled per second (smoothed, `core::Rate`).
    pub records_per_second: f64,
    /// Partition lag divided by the rate, while the log is being replayed
    /// (`WorkerStatus::catch_up_eta_seconds`).
    pub estimated_catch_up_seconds: Option<f64>,
    pub caught_up: bool,
    pub last_error: Option<String>,
    /// Recreations this process's supervisor applied for the job.
    pub recreations: u64,
    /// The state store answered the last look; `/readyz` is false while it does not.
    pub store_reachable: bool,
    /// The rate limits in force (0 = none): the store's live limits, or `max_rows_per_second`.
    pub rate_limits: RateLimits,
    /// The job is paused: nothing is fetched or scanned, the worker stays in its group.
    pub paused: bool,
}

/// How a vnode-bitmap update (a rebalance seen by a worker) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum BitmapOutcome {
    /// Allowed in its phase (snapshot: re-planned; streaming: absorbed).
    Applied,
    /// In the log store under `recreation.policy = "reschedule"`: absorbed.
    Rescheduled,
    /// In the log store: the invariant error.
    InvariantError,
}

impl BitmapOutcome {
    /// Every outcome (each one's series is declared at 0 when a worker starts).
    pub const ALL: [BitmapOutcome; 3] = [
        BitmapOutcome::Applied,
        BitmapOutcome::Rescheduled,
        BitmapOutcome::InvariantError,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            BitmapOutcome::Applied => "applied",
            BitmapOutcome::Rescheduled => "rescheduled",
            BitmapOutcome::InvariantError => "invariant_error",
        }
    }
}

/// How a worker's failure was classified (`core::WorkerFailure`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    Core,
    Fenced,
    Unavailable,
    Fatal,
}

impl FailureKind {
    pub fn of(f: &crate::core::WorkerFailure) -> Self {
        match f {
            crate::core::WorkerFailure::Core(_) => FailureKind::Core,
            crate::core::WorkerFailure::Fenced(_)
            | crate::core::WorkerFailure::Recreated { .. } => FailureKind::Fenced,
            crate::core::WorkerFailure::Unavailable(_) => FailureKind::Unavailable,
            crate::core::WorkerFailure::Fatal(_) => FailureKind::Fatal,
        }
    }
}

/// What a worker's loop tells the rest of the process about what it did: typed events, one per
/// thing that happened. The loop's only way to be seen — it imports neither metrics nor the status
/// board. The service implements it with Prometheus and the status board
/// (`service::observe::ServiceObserver`); the simulation with counters it checks against its
/// oracle (`sim::observe`).
#[derive(Clone, Debug)]
pub enum WorkerEvent {
    /// One log change record of a table the job materialises (`table`: its index in the log) fed
    /// to the executor.
    Change { op: crate::core::Op, table: u16 },
    /// A truncation of log table `table` (one partition's record) fed to the executor.
    Truncate { table: u16 },
    /// One snapshot row of log table `table` fed to the executor.
    SnapshotRow { table: u16 },
    /// A record that did not decode.
    DecodeError,
    /// Records written to the dead-letter topic, just before the checkpoint that records them.
    DeadLettered { count: usize },
    /// librdkafka reported an error (a broker away, authentication); it reconnects by itself
    /// unless the error is fatal.
    KafkaError { fatal: bool },
    /// A checkpoint committed. `transaction_ms` is set on the first checkpoint of each store
    /// transaction only: one latency sample per transaction.
    CommitApplied {
        cause: crate::core::CheckpointCause,
        transaction_ms: Option<f64>,
        group_size: usize,
    },
    /// A vnode-bitmap update (assignment or revocation) in `phase`.
    BitmapUpdate {
        phase: crate::core::Phase,
        outcome: BitmapOutcome,
    },
    /// The invariant error was raised (after the checkpoint before it was durable).
    InvariantError { phase: crate::core::Phase },
    PhaseChanged {
        from: crate::core::Phase,
        to: crate::core::Phase,
    },
    /// This worker's compare-and-set recreated the job (it applied).
    Recreated,
    /// The worker failed, in the executor of `generation`; the supervisor decides next.
    Failed {
        kind: FailureKind,
        generation: Generation,
    },
    /// An executor started at this generation.
    Generation(Generation),
    /// A partition was paused for alignment this long before it resumed.
    AlignmentWait { seconds: f64 },
    /// The worker no longer owns this partition (its lag is its new owner's to report).
    PartitionReleased(PartitionId),
    /// Whether the state store answered the worker's last look.
    StoreReachable(bool),
    /// The job was paused (`true`) or resumed, as the worker found in the store.
    Paused(bool),
    /// The worker's periodic report.
    Report(Box<WorkerReport>),
}

/// Where a worker's [`WorkerEvent`]s go.
pub trait Observer: Send {
    fn observe(&mut self, event: WorkerEvent);
}
