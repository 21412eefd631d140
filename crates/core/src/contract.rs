//! The log's per-record contract (docs/DESIGN.md §3 and §5, invariants 2 and 5): barrier chains, the same
//! epoch's barrier agreeing across partitions, a change's (or a truncation's) epoch, vnode routing and
//! update pairs.
//!
//! Written once and used twice: the [`Executor`](super::Executor) stops at the first violation;
//! `check-log` reports every one, resynchronising after each ([`LogPosition::resync`]). Pure: no I/O.

use std::collections::BTreeMap;

use super::barrier::{Barrier, LogRecord, Op};
use super::epoch::Epoch;
use super::error::CoreError;
use super::vnode::{vnode_of, PartitionId, PartitionMap};

/// Where one partition's log stands for the contract checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogPosition {
    /// The epoch of data now arriving: `curr` of the last barrier.
    pub open_epoch: Epoch,
    /// The offset of an `UPDATE_DELETE` still waiting for its `UPDATE_INSERT`.
    pub pending_update_delete: Option<u64>,
}

/// Checks `record` at `offset` of `partition` against the contract, given where the partition stands
/// and the barriers already seen on any partition (by `prev`). Changes nothing.
pub fn check_record(
    topic: &str,
    map: PartitionMap,
    partition: PartitionId,
    offset: u64,
    at: &LogPosition,
    record: &LogRecord,
    barriers: &BTreeMap<Epoch, Barrier>,
) -> Result<(), CoreError> {
    match record {
        LogRecord::Change(change) => {
            if change.epoch != at.open_epoch {
                return Err(CoreError::EpochMismatch {
                    topic: topic.to_string(),
                    partition,
                    offset,
                    expected: at.open_epoch,
                    found: change.epoch,
                });
            }
            let owned = map.vnodes_of(partition);
            if !owned.contains(&change.vnode) {
                return Err(CoreError::VnodeNotOwnedByPartition {
                    topic: topic.to_string(),
                    partition,
                    offset,
                    vnode: change.vnode,
                    owned_start: owned.start,
                    owned_end: owned.end,
                });
            }
            let computed = vnode_of(&change.row.key, map.vnode_count());
            if computed != change.vnode {
                return Err(CoreError::VnodeMismatch {
                    topic: topic.to_string(),
                    partition,
                    offset,
                    vnode: change.vnode,
                    computed,
                });
            }
            if change.op != Op::UpdateInsert {
                no_pending_update(topic, partition, offset, at)?;
            }
            Ok(())
        }
        LogRecord::Truncate(t) => {
            if t.epoch != at.open_epoch {
                return Err(CoreError::EpochMismatch {
                    topic: topic.to_string(),
                    partition,
                    offset,
                    expected: at.open_epoch,
                    found: t.epoch,
                });
            }
            no_pending_update(topic, partition, offset, at)
        }
        LogRecord::Barrier(barrier) => {
            no_pending_update(topic, partition, offset, at)?;
            if barrier.prev != at.open_epoch || barrier.curr <= barrier.prev {
                return Err(CoreError::BarrierChainBroken {
                    topic: topic.to_string(),
                    partition,
                    offset,
                    expected_prev: at.open_epoch,
                    prev: barrier.prev,
                    curr: barrier.curr,
                });
            }
            if let Some(other) = barriers.get(&barrier.prev) {
                if other.curr != barrier.curr || other.kind != barrier.kind {
                    return Err(CoreError::BarrierMismatch {
                        topic: topic.to_string(),
                        partition,
                        offset,
                        prev: barrier.prev,
                        curr: barrier.curr,
                        kind: format!("{:?}", barrier.kind),
                        other_curr: other.curr,
                        other_kind: format!("{:?}", other.kind),
                    });
                }
            }
            Ok(())
        }
    }
}

/// Truncations read, by (table, epoch): the partitions that carry each.
pub type TruncationsSeen = BTreeMap<(u16, Epoch), std::collections::BTreeSet<PartitionId>>;

/// A truncation must be in **every** partition (docs/WIRE.md "Truncate"): of those `seen`, each
/// (table, epoch, partition) a partition passed without it — its `open` epoch (where reading it
/// stopped) is past the truncation's, so the record can no longer come.
pub fn truncations_missing(
    seen: &TruncationsSeen,
    open: &BTreeMap<PartitionId, Epoch>,
) -> Vec<(u16, Epoch, PartitionId)> {
    let mut out = Vec::new();
    for ((table, epoch), carried) in seen {
        for (p, at) in open {
            if at > epoch && !carried.contains(p) {
                out.push((*table, *epoch, *p));
            }
        }
    }
    out
}

/// Only an `UPDATE_INSERT` may follow an `UPDATE_DELETE`: a barrier or a truncation there breaks
/// the pair.
fn no_pending_update(
    topic: &str,
    partition: PartitionId,
    offset: u64,
    at: &LogPosition,
) -> Result<(), CoreError> {
    match at.pending_update_delete {
        Some(ud) => Err(CoreError::UnpairedUpdate {
            topic: topic.to_string(),
            partition,
            offset,
            update_delete_offset: ud,
        }),
        None => Ok(()),
    }
}

impl LogPosition {
    /// Moves past a record that [`check_record`] accepted; records a barrier in `barriers`.
    pub fn advance(
        &mut self,
        offset: u64,
        record: &LogRecord,
        barriers: &mut BTreeMap<Epoch, Barrier>,
    ) {
        match record {
            LogRecord::Change(c) => {
                self.pending_update_delete = match c.op {
                    Op::UpdateDelete => Some(offset),
                    Op::UpdateInsert => None,
                    _ => self.pending_update_delete,
                }
            }
            LogRecord::Barrier(b) => {
                self.open_epoch = b.curr;
                barriers.entry(b.prev).or_insert(*b);
            }
            LogRecord::Truncate(_) => {}
        }
    }

    /// Moves past a record that broke the contract, so that checking can go on: a barrier opens its
    /// `curr`, a change clears a pending update pair.
    pub fn resync(&mut self, offset: u64, record: &LogRecord) {
        match record {
            LogRecord::Change(c) => {
                self.pending_update_delete = (c.op == Op::UpdateDelete).then_some(offset);
            }
            LogRecord::Barrier(b) => {
                self.open_epoch = b.curr;
                self.pending_update_delete = None;
            }
            LogRecord::Truncate(_) => self.pending_update_delete = None,
        }
    }
}
