//! What the core detects. Every variant names where it happened; the invariant error's `Display` is
//! exactly RisingWave's text.

use super::epoch::Epoch;
use super::vnode::{PartitionId, Vnode};

/// Key bytes as hex for errors and logs, cut after 32 bytes (operators read `Display`, and a key is
/// bytes, not a list of numbers).
pub fn key_hex(key: &[u8]) -> String {
    let mut s: String = key.iter().take(32).map(|b| format!("{b:02x}")).collect();
    if key.len() > 32 {
        s.push_str(&format!("… ({} bytes)", key.len()));
    }
    s
}

/// The exact text of the seed error.
pub const VNODE_BITMAP_UPDATE_IN_LOG_STORE: &str =
    "should not update vnode bitmap during consuming log store";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// A consumer-group rebalance (a vnode bitmap update) arrived in the log-store phase. Raised only
    /// after the checkpoint it interrupts is durable; the supervisor then recreates the job.
    #[error("should not update vnode bitmap during consuming log store")]
    VnodeBitmapUpdateDuringLogStore,

    #[error("vnode count {vnode_count} is out of range 1..=32768")]
    BadVnodeCount { vnode_count: u32 },

    #[error("partition count {partition_count} exceeds vnode count {vnode_count} (need P ≤ V)")]
    TooManyPartitions {
        partition_count: u32,
        vnode_count: u32,
    },

    #[error("partition count of {source_name} changed from {expected} to {found}; a job's partition count is fixed (recreate the job to change it)")]
    PartitionCountChanged {
        source_name: String,
        expected: u32,
        found: u32,
    },

    #[error("barrier chain broken at topic {topic} partition {partition} offset {offset}: expected prev_epoch {expected_prev}, got barrier {prev} -> {curr}")]
    BarrierChainBroken {
        topic: String,
        partition: PartitionId,
        offset: u64,
        expected_prev: Epoch,
        prev: Epoch,
        curr: Epoch,
    },

    #[error("barrier at topic {topic} partition {partition} offset {offset} ({prev} -> {curr}, {kind}) disagrees with the same epoch's barrier on another partition ({other_curr}, {other_kind})")]
    BarrierMismatch {
        topic: String,
        partition: PartitionId,
        offset: u64,
        prev: Epoch,
        curr: Epoch,
        kind: String,
        other_curr: Epoch,
        other_kind: String,
    },

    #[error("change at topic {topic} partition {partition} offset {offset} has epoch {found} but the partition is in epoch {expected}")]
    EpochMismatch {
        topic: String,
        partition: PartitionId,
        offset: u64,
        expected: Epoch,
        found: Epoch,
    },

    #[error("change at topic {topic} partition {partition} offset {offset} is for vnode {vnode}, which partition {partition} does not own (it owns vnodes {owned_start}..{owned_end})")]
    VnodeNotOwnedByPartition {
        topic: String,
        partition: PartitionId,
        offset: u64,
        vnode: Vnode,
        owned_start: Vnode,
        owned_end: Vnode,
    },

    #[error("change at topic {topic} partition {partition} offset {offset} says vnode {vnode} but its key hashes to vnode {computed}")]
    VnodeMismatch {
        topic: String,
        partition: PartitionId,
        offset: u64,
        vnode: Vnode,
        computed: Vnode,
    },

    #[error("record at topic {topic} partition {partition} offset {offset} should be the UPDATE_INSERT following the UPDATE_DELETE at offset {update_delete_offset}")]
    UnpairedUpdate {
        topic: String,
        partition: PartitionId,
        offset: u64,
        update_delete_offset: u64,
    },

    #[error(
        "record at topic {topic} partition {partition} offset {offset} does not decode: {reason}"
    )]
    Undecodable {
        topic: String,
        partition: PartitionId,
        offset: u64,
        reason: String,
    },

    #[error(
        "snapshot cursor of vnode {vnode} would go back: row key {} is not after {}",
        key_hex(.key),
        key_hex(.cursor)
    )]
    SnapshotCursorWentBack {
        vnode: Vnode,
        cursor: Vec<u8>,
        key: Vec<u8>,
    },

    #[error("snapshot row for vnode {vnode} has a key that hashes to vnode {computed}")]
    SnapshotRowVnodeMismatch { vnode: Vnode, computed: Vnode },

    #[error("progress of vnode {vnode} would go back from epoch {from} to {to}")]
    EpochWentBack {
        vnode: Vnode,
        from: Epoch,
        to: Epoch,
    },
}

impl CoreError {
    /// A record in the log that breaks the wire contract (it does not decode, its vnode or epoch is
    /// wrong, the barrier chain breaks): the job stops at it, after committing what is complete
    /// before it.
    pub fn is_bad_record(&self) -> bool {
        matches!(
            self,
            CoreError::BarrierChainBroken { .. }
                | CoreError::BarrierMismatch { .. }
                | CoreError::EpochMismatch { .. }
                | CoreError::VnodeNotOwnedByPartition { .. }
                | CoreError::VnodeMismatch { .. }
                | CoreError::UnpairedUpdate { .. }
                | CoreError::Undecodable { .. }
        )
    }
}

/// A partition whose needed offset (the snapshot's start, or the job's committed progress) lies
/// below the log's earliest offset: records the job must apply were deleted (the topic's retention,
/// `DeleteRecords`) before it read them. The job reads nothing of that partition: no offset reset,
/// ever (a reset would skip the gap and leave the replica wrong).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("topic {topic} partition {partition}: the job needs offset {needed} but the log now starts at offset {earliest}; records {needed}..{earliest} were deleted (the topic's retention.ms / retention.bytes, or DeleteRecords) before the job read them, and nothing past that gap is read. The way out is a snapshot whose start offsets are still in the log: with `capture`, the job moves at its start to the newest such snapshot of its capture, a new generation, and asks the capture for one when none is (docs/CAPTURE.md, \"Snapshots of a running capture\"); with your own producer, write a new snapshot and start a new job from it; raise the topic's retention for the jobs to come")]
pub struct LogStartGone {
    pub topic: String,
    pub partition: PartitionId,
    /// The first offset the job must read.
    pub needed: u64,
    /// The broker's earliest offset of the partition (its low watermark).
    pub earliest: u64,
}

/// Whether a partition can be read from `needed` when the broker's log starts at `earliest`.
pub fn check_log_start(
    topic: &str,
    partition: PartitionId,
    needed: u64,
    earliest: u64,
) -> Result<(), LogStartGone> {
    if needed < earliest {
        return Err(LogStartGone {
            topic: topic.to_string(),
            partition,
            needed,
            earliest,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_that_starts_at_or_before_the_needed_offset_is_readable() {
        assert_eq!(check_log_start("t", 0, 5000, 5000), Ok(()));
        assert_eq!(check_log_start("t", 0, 5001, 0), Ok(()));
    }

    #[test]
    fn a_log_whose_start_is_past_the_needed_offset_is_named_with_the_way_out() {
        let e = check_log_start("ret-log", 1, 4999, 5000).unwrap_err();
        let text = e.to_string();
        for part in [
            "topic ret-log partition 1",
            "needs offset 4999",
            "starts at offset 5000",
            "deleted",
            "snapshot",
        ] {
            assert!(text.contains(part), "{part:?} missing from {text}");
        }
    }
}
