//! Persisted progress in RisingWave's layout (docs/DESIGN.md §4) and the checkpoint that carries it.
//!
//! A [`Checkpoint`] is what one store transaction must apply atomically: rows, vnode progress,
//! partition progress, fenced by generation and partition leases. This module only describes it; the
//! store ports apply it.

use super::barrier::Row;
use super::epoch::Epoch;
use super::vnode::{PartitionId, Vnode};
use crate::Generation;

/// Progress of one vnode.
///
/// - `epoch == Es && !finished`: in the snapshot; `cursor` is the last primary key applied (the scan
///   resumes strictly after it), `None` before the first row.
/// - `epoch == Es && finished`: snapshot done, log store not started (`cursor` is `None`).
/// - `epoch > Es`: in the log store, every change up to and including `epoch` applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VnodeProgress {
    pub vnode: Vnode,
    pub epoch: Epoch,
    pub row_count: u64,
    pub finished: bool,
    pub cursor: Option<Vec<u8>>,
}

impl VnodeProgress {
    /// A vnode nobody has started: at the snapshot epoch, no cursor.
    pub fn fresh(vnode: Vnode, snapshot_epoch: Epoch) -> Self {
        VnodeProgress {
            vnode,
            epoch: snapshot_epoch,
            row_count: 0,
            finished: false,
            cursor: None,
        }
    }

    pub fn snapshot_finished(&self) -> bool {
        self.finished
    }
}

/// Progress of one log partition: where reading resumes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PartitionProgress {
    pub partition: PartitionId,
    /// Next Kafka offset to read: just after the last committed barrier.
    pub next_offset: u64,
    /// The epoch whose data starts at `next_offset` (the `curr` of that barrier).
    pub epoch: Epoch,
    /// The partition's owner had caught up (streaming phase) when it committed this.
    pub streaming: bool,
}

pub use crate::epoch::Lease;

/// A row change as the store applies it: the net effect per key within one checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowMutation {
    /// `offset`: where the change came from in its partition's log (None for snapshot rows), so a
    /// store that refuses a value can name it.
    Upsert {
        vnode: Vnode,
        row: Row,
        offset: Option<u64>,
    },
    Delete {
        vnode: Vnode,
        key: Vec<u8>,
    },
    /// Every row of the vnode whose key starts with `prefix` is deleted, before the checkpoint's
    /// other rows apply: a truncated table ([`crate::Truncate`]). `prefix` is the table's prefix in
    /// the job's layout ([`crate::JobTables::table_prefix`]: empty for a job of one table), so a
    /// store routes it to its table as it routes a row.
    Truncate {
        vnode: Vnode,
        prefix: Vec<u8>,
    },
}

impl RowMutation {
    /// The row's key (a truncation's prefix, which sorts before every key of its table).
    pub fn key(&self) -> &[u8] {
        match self {
            RowMutation::Upsert { row, .. } => &row.key,
            RowMutation::Delete { key, .. } => key,
            RowMutation::Truncate { prefix, .. } => prefix,
        }
    }

    pub fn vnode(&self) -> Vnode {
        match self {
            RowMutation::Upsert { vnode, .. }
            | RowMutation::Delete { vnode, .. }
            | RowMutation::Truncate { vnode, .. } => *vnode,
        }
    }
}

/// Why a checkpoint is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointCause {
    /// Snapshot phase: rows or time since the last local checkpoint.
    Local,
    /// Snapshot phase finished for every owned vnode.
    SnapshotDone,
    /// A checkpoint barrier completed on every owned partition.
    Barrier,
    /// A vnode bitmap update (rebalance): commit what is complete before acknowledging it.
    Rebalance,
    /// The worker caught up: the streaming flag is persisted.
    CaughtUp,
    /// Graceful shutdown.
    Shutdown,
}

impl CheckpointCause {
    pub const ALL: [CheckpointCause; 6] = [
        CheckpointCause::Local,
        CheckpointCause::SnapshotDone,
        CheckpointCause::Barrier,
        CheckpointCause::Rebalance,
        CheckpointCause::CaughtUp,
        CheckpointCause::Shutdown,
    ];

    /// The name operators see (metric label `cause`), snake_case.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckpointCause::Local => "local",
            CheckpointCause::SnapshotDone => "snapshot_done",
            CheckpointCause::Barrier => "barrier",
            CheckpointCause::Rebalance => "rebalance",
            CheckpointCause::CaughtUp => "caught_up",
            CheckpointCause::Shutdown => "shutdown",
        }
    }
}

/// A record skipped under `on_bad_record = "dead-letter"`: it did not decode. Recorded in the store
/// in the transaction of the checkpoint whose offsets pass it, so it is recorded exactly once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    pub partition: PartitionId,
    pub offset: u64,
    /// The partition's open epoch where it stood.
    pub epoch: Epoch,
    /// Why it was skipped (the bad record's error, naming topic, partition and offset).
    pub reason: String,
}

/// One atomic store transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub generation: Generation,
    pub worker: String,
    pub cause: CheckpointCause,
    /// The last epoch whose log data this checkpoint completes, if it carries log data.
    pub epoch: Option<Epoch>,
    /// Every partition the worker owns, with its lease: the store rejects the commit if any is stale.
    pub leases: Vec<(PartitionId, Lease)>,
    pub rows: Vec<RowMutation>,
    pub vnodes: Vec<VnodeProgress>,
    pub partitions: Vec<PartitionProgress>,
    /// Records this checkpoint's offsets skip as dead letters (empty unless the job's policy is
    /// `dead-letter`).
    pub dead_letters: Vec<DeadLetter>,
    /// The job's cap on dead letters recorded (distinct records, over every generation): the store
    /// refuses a checkpoint that would pass it, so the job stops there.
    pub max_dead_letters: u64,
}

impl Checkpoint {
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
            && self.vnodes.is_empty()
            && self.partitions.is_empty()
            && self.dead_letters.is_empty()
    }
}

/// A job's progress over all its vnodes, from what the store has committed (docs/DESIGN.md §6
/// "Job-level completion"): a job is caught up only when every partition has committed in the
/// streaming phase, so no process reports the job done on the strength of its own part.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct JobProgress {
    /// Vnodes whose snapshot is unfinished (or not started).
    pub vnodes_snapshot: u32,
    /// Vnodes past their snapshot whose partition has not caught up yet.
    pub vnodes_log_store: u32,
    /// Vnodes whose partition has committed in the streaming phase.
    pub vnodes_streaming: u32,
    /// Partitions not yet committed in the streaming phase, in order.
    pub partitions_behind: Vec<super::vnode::PartitionId>,
    /// Every vnode streams.
    pub caught_up: bool,
}

impl JobProgress {
    pub fn of(
        map: super::vnode::PartitionMap,
        vnodes: &std::collections::BTreeMap<Vnode, VnodeProgress>,
        partitions: &std::collections::BTreeMap<super::vnode::PartitionId, PartitionProgress>,
    ) -> JobProgress {
        let mut out = JobProgress::default();
        for p in 0..map.partition_count() {
            let streaming = partitions.get(&p).is_some_and(|pp| pp.streaming);
            if !streaming {
                out.partitions_behind.push(p);
            }
            for v in map.vnodes_of(p) {
                let finished = vnodes.get(&v).is_some_and(|vp| vp.finished);
                if !finished {
                    out.vnodes_snapshot += 1;
                } else if streaming {
                    out.vnodes_streaming += 1;
                } else {
                    out.vnodes_log_store += 1;
                }
            }
        }
        out.caught_up = out.partitions_behind.is_empty() && out.vnodes_snapshot == 0;
        out
    }
}

#[cfg(test)]
mod job_progress_tests {
    use super::*;
    use crate::vnode::PartitionMap;
    use std::collections::BTreeMap;

    #[test]
    fn a_job_is_caught_up_only_when_every_partition_streams() {
        let map = PartitionMap::new(8, 2).unwrap();
        let es = Epoch(1 << 16);
        let mut vnodes: BTreeMap<Vnode, VnodeProgress> = (0..8)
            .map(|v| {
                (
                    v,
                    VnodeProgress {
                        finished: true,
                        ..VnodeProgress::fresh(v, es)
                    },
                )
            })
            .collect();
        vnodes.get_mut(&6).unwrap().finished = false;
        let mut partitions = BTreeMap::new();
        partitions.insert(
            0,
            PartitionProgress {
                partition: 0,
                next_offset: 9,
                epoch: es,
                streaming: true,
            },
        );
        let p = JobProgress::of(map, &vnodes, &partitions);
        assert_eq!(
            (p.vnodes_snapshot, p.vnodes_log_store, p.vnodes_streaming),
            (1, 3, 4)
        );
        assert_eq!(p.partitions_behind, vec![1]);
        assert!(!p.caught_up, "half the job streams");
        vnodes.get_mut(&6).unwrap().finished = true;
        partitions.insert(
            1,
            PartitionProgress {
                partition: 1,
                next_offset: 9,
                epoch: es,
                streaming: true,
            },
        );
        let p = JobProgress::of(map, &vnodes, &partitions);
        assert!(p.caught_up);
        assert_eq!(p.vnodes_streaming, 8);
    }
}
