//! Barriers and log records: the values the log store carries (docs/DESIGN.md §2, §3).

use super::epoch::Epoch;
use super::vnode::Vnode;

/// What a barrier asks of the executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BarrierKind {
    /// The first barrier a writer emits.
    Initial,
    /// Ends an epoch; its data accumulates into the next checkpoint.
    Barrier,
    /// Ends an epoch and commits everything since the last checkpoint.
    Checkpoint,
}

/// `{prev_epoch, curr_epoch, kind}`: data of `prev` lies before it, data of `curr` after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Barrier {
    pub prev: Epoch,
    pub curr: Epoch,
    pub kind: BarrierKind,
    /// A new row-schema version starts at `curr` (docs/WIRE.md "Schema changes"; known from the
    /// schema versions beside the manifest, not carried on the wire): the epochs up to `prev` are
    /// committed apart from later ones, so that every checkpoint's rows are of one version.
    pub schema_change: bool,
}

impl Barrier {
    pub fn is_checkpoint(&self) -> bool {
        self.kind == BarrierKind::Checkpoint
    }
}

/// The operation a change applies to its row (`as usize` is its index in `Op::ALL` and in the Avro enum).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Insert = 0,
    Delete = 1,
    /// The old image of an update; the next record of the partition is its `UpdateInsert`.
    UpdateDelete = 2,
    /// The new image of an update.
    UpdateInsert = 3,
}

impl Op {
    pub const ALL: [Op; 4] = [Op::Insert, Op::Delete, Op::UpdateDelete, Op::UpdateInsert];

    /// Stable lower-case name, used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Insert => "insert",
            Op::Delete => "delete",
            Op::UpdateDelete => "update_delete",
            Op::UpdateInsert => "update_insert",
        }
    }
}

/// A row as the core sees it: the primary-key bytes (Avro binary encoding of the key) and the row
/// datum (Avro binary encoding of the row record). The core never looks inside `value`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Row {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// One change of the upstream table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub epoch: Epoch,
    pub op: Op,
    pub vnode: Vnode,
    /// The table of the log the change is of (0 in a one-table log): a job stages only its own
    /// table's ([`crate::JobPolicy::tables`]); another table's row is not decoded (`row.value` empty).
    pub table: u16,
    pub row: Row,
}

/// Every row of table `table` of the log is deleted at this point of its partition (the upstream's
/// `TRUNCATE`, docs/WIRE.md "Truncate"): the partition's vnodes lose the table's rows written before
/// it; changes after it, in the same epoch or later, apply on the emptied table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Truncate {
    /// The epoch of the truncating transaction: the `curr` of the last barrier before it.
    pub epoch: Epoch,
    /// The table of the log (0 in a one-table log).
    pub table: u16,
}

/// A log-store message value: a change, a truncation or a barrier marker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogRecord {
    Change(Change),
    Barrier(Barrier),
    Truncate(Truncate),
}
