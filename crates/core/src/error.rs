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
