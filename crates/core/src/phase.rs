//! The phases of a worker and the events and decisions that drive it.
//!
//! Events are what the driver observed (an assignment, a record, a snapshot row, a tick); decisions are
//! what the driver must carry out, in order. Both are plain values so that tests assert on them.

use super::barrier::{LogRecord, Row};
use super::error::CoreError;
use super::progress::{Checkpoint, Lease, PartitionProgress, VnodeProgress};
use super::vnode::{PartitionId, Vnode};
use crate::Generation;

/// Where a worker is in the life of a job. A worker's phase is that of the least advanced work it owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// No partition assigned yet (or all revoked).
    Unassigned,
    /// Reading the snapshot at `Es` for owned vnodes; the log is not fetched.
    Snapshot,
    /// Replaying the log from just after `Es` until caught up. A vnode bitmap update is an invariant
    /// violation here.
    LogStore,
    /// Caught up: consuming changes as they arrive.
    Streaming,
}

impl Phase {
    pub const ALL: [Phase; 4] = [
        Phase::Unassigned,
        Phase::Snapshot,
        Phase::LogStore,
        Phase::Streaming,
    ];

    /// Stable lower-case name, used as a metric label and in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Unassigned => "unassigned",
            Phase::Snapshot => "snapshot",
            Phase::LogStore => "log_store",
            Phase::Streaming => "streaming",
        }
    }
}

/// A partition as the store hands it to a worker that claimed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimedPartition {
    pub partition: PartitionId,
    pub lease: Lease,
    pub progress: PartitionProgress,
    /// Progress of every vnode the partition owns.
    pub vnodes: Vec<VnodeProgress>,
}

/// Identifies one snapshot scan plan; rows of an older plan are ignored.
pub type ScanId = u64;

/// Where the scan of one vnode starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanStart {
    pub vnode: Vnode,
    /// Resume strictly after this primary key; `None` from the beginning.
    pub after: Option<Vec<u8>>,
}

/// What the driver observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Partitions newly assigned and claimed in the store (the first assignment, or a bitmap update).
    Assigned(Vec<ClaimedPartition>),
    /// Partitions being revoked. Decisions are carried out before the revocation is acknowledged.
    Revoked(Vec<PartitionId>),
    /// One row of the snapshot scan `scan`, in primary-key order within its vnode.
    SnapshotRow {
        scan: ScanId,
        vnode: Vnode,
        row: Row,
    },
    /// The scan of `vnode` reached its end.
    SnapshotVnodeDone { scan: ScanId, vnode: Vnode },
    /// One decoded log record.
    Record {
        partition: PartitionId,
        offset: u64,
        record: LogRecord,
    },
    /// A record that did not decode: handled like any bad record (docs/OPERATIONS.md "Bad input").
    Undecodable {
        partition: PartitionId,
        offset: u64,
        reason: String,
    },
    /// The consumer has read `partition` up to `next_offset` (exclusive) and the driver has fed
    /// every record it returned below it: the offsets in between hold no data records (transaction
    /// commit markers, aborted transactions' records).
    ReadTo {
        partition: PartitionId,
        next_offset: u64,
    },
    /// The partition's high watermark (offset after its last message), as last seen by the driver.
    Watermark { partition: PartitionId, high: u64 },
    /// Wall-clock time, for local checkpoints.
    Tick { now_ms: u64 },
    /// The job's generation as the store holds it now (the driver looks every housekeeping round).
    JobGeneration { generation: Generation },
    /// Stop: commit what is complete.
    Shutdown,
}

/// What the driver must do, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Apply this checkpoint in one store transaction, then commit its offsets to the Kafka group.
    Commit(Checkpoint),
    /// Replace the snapshot scan with this plan (an empty plan stops scanning).
    Scan {
        scan: ScanId,
        vnodes: Vec<ScanStart>,
    },
    /// Start (or restart) fetching the partition at this offset, unpaused.
    Fetch {
        partition: PartitionId,
        offset: u64,
    },
    /// Stop delivering records of the partition until resumed (alignment back-pressure).
    Pause(PartitionId),
    Resume(PartitionId),
    PhaseChanged {
        from: Phase,
        to: Phase,
    },
    /// Stop the worker with this error, after the decisions before it are carried out.
    Fail(CoreError),
    /// This executor is stale (the job was recreated, the store is at `generation`): drop it and
    /// restart from the store.
    Restart {
        generation: Generation,
        reason: String,
    },
}
