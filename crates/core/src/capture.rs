//! The capture's decisions: committed source transactions in, log records, Kafka commits and source
//! acknowledgements out (docs/DESIGN.md §9).
//!
//! [`Assembler`] owns the rules that make a PostgreSQL table's change stream a log store, exactly
//! once: barriers fall only between source transactions; an epoch closes when it is old enough or
//! full; every `checkpoint_interval` the barrier is a `CHECKPOINT` and the open Kafka transaction
//! commits with the resume state ([`CaptureState`]); a source position is acknowledged only after
//! the Kafka transaction holding it committed; a restart resumes at a transaction boundary (the end
//! of the last committed transaction) and drops a transaction the log already holds; a transaction
//! delivered twice in one session means the source replayed, and the open Kafka transaction must be
//! aborted. It reads no clock: times come in with the events. No I/O; `src/capture/` carries the
//! decisions out against PostgreSQL and Kafka, `src/sim/capture.rs` against models of both.

use super::barrier::{Barrier, BarrierKind, Op};
use super::epoch::Epoch;
use super::faults::{self, Fault};
use super::vnode::{vnode_of, PartitionId, PartitionMap, Vnode};

/// A source position (PostgreSQL's LSN: a byte position in the WAL).
pub type Lsn = u64;

/// Which of the capture's tables a change belongs to: its index in the capture's table list (the
/// manifest's `tables` order; 0 for a one-table capture). Opaque to the rules: every table's
/// changes share the epochs, so a source transaction touching several lands in one epoch.
pub type TableIndex = u16;

/// How often the capture closes epochs and commits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaptureConfig {
    /// An epoch closes at the first transaction boundary after it is this old.
    pub barrier_interval_ms: u64,
    /// A barrier is a checkpoint (and the Kafka transaction commits) when the last checkpoint is at
    /// least this old.
    pub checkpoint_interval_ms: u64,
    /// An epoch also closes, at a transaction boundary, once it holds this many changes.
    pub max_epoch_changes: u64,
}

/// A checkpoint whose Kafka transaction would hold no change (an idle source: it only moves the
/// epoch on and acknowledges the source's position) comes at most this often, however short
/// `checkpoint_interval_ms` is: freshness needs short checkpoints only when there is something to
/// see, and each one costs the broker a transaction.
pub const IDLE_CHECKPOINT_MS: u64 = 1_000;

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            barrier_interval_ms: 200,
            checkpoint_interval_ms: 200,
            max_epoch_changes: 100_000,
        }
    }
}

/// What a committed Kafka transaction records of the capture: where to resume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CaptureState {
    /// Every source transaction that ends at or before this position is in the log; resume here.
    pub lsn: Lsn,
    /// The open epoch: the `curr_epoch` of the last barrier written (the next barrier's `prev`).
    pub epoch: Epoch,
    /// Checkpoints committed so far (the initial barrier's transaction is 0).
    pub checkpoints: u64,
}

/// One row change of a source transaction, already encoded: `key` is the row's key bytes and
/// `row` its datum (the core never looks inside either).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowChange {
    Insert {
        key: Vec<u8>,
        row: Vec<u8>,
    },
    Update {
        old_key: Vec<u8>,
        old_row: Vec<u8>,
        new_key: Vec<u8>,
        new_row: Vec<u8>,
    },
    Delete {
        key: Vec<u8>,
        row: Vec<u8>,
    },
}

/// What the source delivers, in its order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceEvent {
    /// A committed transaction starts; `final_lsn` is its commit record's position.
    Begin { final_lsn: Lsn, commit_ms: u64 },
    Change {
        table: TableIndex,
        change: RowChange,
    },
    /// Inside a transaction: these captured tables are emptied (`TRUNCATE`) at this point of it.
    Truncate { tables: Vec<TableIndex> },
    /// The transaction ends; `end_lsn` lies just past its commit record.
    Commit { end_lsn: Lsn },
    /// Nothing arrived for a while: the source has sent everything before `wal_end` (0 when it
    /// did not say), and the wall clock reads `now_ms`.
    Idle { wal_end: Lsn, now_ms: u64 },
    /// Inside a transaction, before its first change: table `table`'s row schema changed to a new,
    /// compatible version (`row_schema`, opaque to the core). `announced`: the epoch a version of
    /// that schema was already announced from (a session that failed after announcing it), which
    /// the new version must start at again.
    SchemaChange {
        table: TableIndex,
        row_schema: String,
        announced: Option<Epoch>,
        now_ms: u64,
    },
    /// Between transactions (a session's first event): these tables join the capture, each with
    /// its row schema (opaque) and the epoch it was already announced from, if a session that
    /// failed after announcing it did. Their first versions start together at the next epoch,
    /// before any of their changes (docs/WIRE.md "Tables added").
    TablesAdded {
        tables: Vec<(TableIndex, String, Option<Epoch>)>,
        now_ms: u64,
    },
}

/// A decision for the shell, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Write this barrier to every partition.
    Barrier(Barrier),
    /// Write this change of `table` to `partition`.
    Change {
        table: TableIndex,
        partition: PartitionId,
        vnode: Vnode,
        epoch: Epoch,
        op: Op,
        key: Vec<u8>,
        row: Vec<u8>,
    },
    /// Write a truncation of `table` at `epoch` to every partition (docs/WIRE.md "Truncate"), after
    /// the changes before it and before the changes after it.
    Truncate { table: TableIndex, epoch: Epoch },
    /// Write `state` to the state topic and commit the Kafka transaction; then call
    /// [`Assembler::log_committed`] (or, if the commit failed, abort and resume from the last
    /// committed state).
    CommitLog(CaptureState),
    /// Acknowledge this position to the source (it may free the WAL before it).
    Ack(Lsn),
    /// Announce a row-schema version starting at `from_epoch` (docs/WIRE.md "Schema changes"):
    /// durably, before the barrier into `from_epoch`; the changes after that barrier are written
    /// with it.
    AnnounceSchema {
        table: TableIndex,
        from_epoch: Epoch,
        row_schema: String,
    },
    /// The checkpoint barrier just written closes `snapshot_epoch`, the epoch of a snapshot
    /// exported at `consistent` (every source transaction whose commit record lies below it, and
    /// none at or past it): its offsets in every partition are that snapshot's start offsets
    /// once this transaction commits ([`Assembler::snapshot_at`]).
    SnapshotPoint {
        snapshot_epoch: Epoch,
        next_epoch: Epoch,
        consistent: Lsn,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaptureError {
    #[error("the source delivered transaction {final_lsn:#x} again in one session (after {last:#x}): it reconnected and replayed; the open Kafka transaction is aborted and the capture resumes from its last commit")]
    Replayed { final_lsn: Lsn, last: Lsn },
    #[error("a change arrived outside a source transaction")]
    ChangeOutsideTransaction,
    #[error("a transaction began inside transaction {open:#x}")]
    NestedTransaction { open: Lsn },
    #[error("events arrived while the Kafka commit of checkpoint {checkpoint} was pending")]
    CommitPending { checkpoint: u64 },
    #[error("the table's row schema changed inside transaction {open:#x} after it changed rows: a schema change must come before a transaction's changes (ALTER TABLE in its own transaction)")]
    SchemaChangeMidTransaction { open: Lsn },
    #[error("tables can join a capture only between source transactions")]
    TablesAddedInTransaction,
    #[error("tables joining a capture were announced from different epochs ({first} and {second}): they join at one")]
    TablesAddedApart { first: Epoch, second: Epoch },
    #[error("a schema version announced from epoch {announced} cannot start after the open epoch {open}: it must be later")]
    SchemaChangeEpoch { announced: Epoch, open: Epoch },
    #[error("the slot's confirmed position {confirmed:#x} is past the log's resume position {resume:#x}: changes between them were acknowledged but are not in the log (a new snapshot into a new topic is needed)")]
    SlotAhead { confirmed: Lsn, resume: Lsn },
    #[error("a snapshot exported at {consistent:#x} cannot be placed: transaction {written:#x}, at or past it, is in the log already (take another snapshot)")]
    SnapshotPassed { consistent: Lsn, written: Lsn },
    #[error("a snapshot can be placed only between source transactions, and one at a time")]
    SnapshotNotBetween,
}

/// The capture's state machine for one job.
#[derive(Debug)]
pub struct Assembler {
    config: CaptureConfig,
    map: PartitionMap,
    /// The last state a Kafka commit made durable.
    committed: CaptureState,
    /// A commit asked for and not yet confirmed.
    pending: Option<CaptureState>,
    /// The open epoch and when it opened (source time; `None` until the first event of a
    /// session tells the time: a backlog replayed after a restart is checkpointed by its own
    /// commit times, not held in one Kafka transaction until it reaches the present).
    epoch: Epoch,
    epoch_opened_ms: Option<u64>,
    epoch_changes: u64,
    /// Changes (and truncations) written since the last checkpoint: none, and the next checkpoint is
    /// an idle one ([`IDLE_CHECKPOINT_MS`]).
    checkpoint_changes: u64,
    last_checkpoint_ms: Option<u64>,
    /// The end of the last transaction written (or the last idle position): the resume position the
    /// next checkpoint records.
    written_lsn: Lsn,
    /// The transaction being read: its `final_lsn`, and whether it is dropped (already in the log).
    open: Option<(Lsn, bool)>,
    /// Whether the open transaction has written a change.
    open_wrote: bool,
    /// The highest `final_lsn` seen this session.
    last_final_lsn: Option<Lsn>,
    /// A snapshot's consistent point waiting for its checkpoint barrier ([`Self::snapshot_at`]).
    snapshot_at: Option<Lsn>,
}

impl Assembler {
    /// A capture whose snapshot was taken at `snapshot_epoch`, consistent at `consistent_lsn`: the
    /// first transaction writes the initial barrier into every partition and commits with the first
    /// state. Returns the assembler and those actions.
    pub fn fresh(
        config: CaptureConfig,
        map: PartitionMap,
        snapshot_epoch: Epoch,
        consistent_lsn: Lsn,
        now_ms: u64,
    ) -> (Assembler, Vec<Action>) {
        let first = snapshot_epoch.next_at(now_ms);
        let state = CaptureState {
            lsn: consistent_lsn,
            epoch: first,
            checkpoints: 0,
        };
        let mut a = Assembler::resume(
            config,
            map,
            CaptureState {
                lsn: consistent_lsn,
                epoch: snapshot_epoch,
                checkpoints: 0,
            },
        );
        a.epoch = first;
        a.epoch_opened_ms = Some(now_ms);
        a.last_checkpoint_ms = Some(now_ms);
        a.pending = Some(state);
        let actions = vec![
            Action::Barrier(Barrier {
                prev: snapshot_epoch,
                curr: first,
                kind: BarrierKind::Initial,
                schema_change: false,
            }),
            Action::CommitLog(state),
        ];
        (a, actions)
    }

    /// A capture resuming from the last committed state (read back from the state topic).
    pub fn resume(config: CaptureConfig, map: PartitionMap, state: CaptureState) -> Assembler {
        Assembler {
            config,
            map,
            committed: state,
            pending: None,
            epoch: state.epoch,
            epoch_opened_ms: None,
            epoch_changes: 0,
            checkpoint_changes: 0,
            last_checkpoint_ms: None,
            written_lsn: state.lsn,
            open: None,
            open_wrote: false,
            last_final_lsn: None,
            snapshot_at: None,
        }
    }

    /// Places a snapshot exported at `consistent` in the log: a checkpoint barrier between the
    /// last source transaction whose commit record lies below `consistent` and the first at or
    /// past it, followed by [`Action::SnapshotPoint`]. The barrier comes at the `Begin` of that
    /// first transaction, or at an idle report at or past `consistent` (everything before it was
    /// delivered). Call between transactions, one snapshot at a time; refused when a transaction
    /// at or past `consistent` is already written (the snapshot came too late: take another).
    pub fn snapshot_at(&mut self, consistent: Lsn) -> Result<(), CaptureError> {
        if self.open.is_some() || self.pending.is_some() || self.snapshot_at.is_some() {
            return Err(CaptureError::SnapshotNotBetween);
        }
        if let Some(written) = self.last_final_lsn.filter(|&l| l >= consistent) {
            return Err(CaptureError::SnapshotPassed {
                consistent,
                written,
            });
        }
        self.snapshot_at = Some(consistent);
        Ok(())
    }

    /// Whether a snapshot waits for its barrier.
    pub fn snapshot_waiting(&self) -> bool {
        self.snapshot_at.is_some()
    }

    /// The snapshot's checkpoint barrier, if the source reached `position` (a transaction's commit
    /// record, or an idle report's end of WAL) at or past its consistent point.
    fn place_snapshot(&mut self, position: Lsn, now_ms: u64, out: &mut Vec<Action>) {
        let reached = |c: Lsn| {
            if faults::active(Fault::SnapshotBarrierEarly) {
                true
            } else if faults::active(Fault::SnapshotBarrierLate) {
                position > c + 1 && self.written_lsn > c
            } else {
                position >= c
            }
        };
        let Some(consistent) = self.snapshot_at.filter(|&c| reached(c)) else {
            return;
        };
        self.snapshot_at = None;
        let snapshot_epoch = self.epoch;
        self.close_epoch(true, now_ms, out);
        let commit = out.pop();
        out.push(Action::SnapshotPoint {
            snapshot_epoch,
            next_epoch: self.epoch,
            consistent,
        });
        out.extend(commit);
    }

    /// Where replication starts: the resume position.
    pub fn start_lsn(&self) -> Lsn {
        self.committed.lsn
    }

    /// The last committed state.
    pub fn committed(&self) -> CaptureState {
        self.committed
    }

    /// The open epoch.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Whether a source transaction is being read.
    pub fn in_transaction(&self) -> bool {
        self.open.is_some()
    }

    /// Checks the slot before replication starts: a slot confirmed past the resume position lost
    /// what lies between.
    pub fn check_slot(&self, confirmed: Lsn) -> Result<(), CaptureError> {
        if confirmed > self.committed.lsn {
            return Err(CaptureError::SlotAhead {
                confirmed,
                resume: self.committed.lsn,
            });
        }
        Ok(())
    }

    /// Feeds one source event; the decisions are appended to `out`.
    pub fn on_event(
        &mut self,
        event: SourceEvent,
        out: &mut Vec<Action>,
    ) -> Result<(), CaptureError> {
        if let Some(p) = self.pending {
            return Err(CaptureError::CommitPending {
                checkpoint: p.checkpoints,
            });
        }
        match event {
            SourceEvent::Begin {
                final_lsn,
                commit_ms,
            } => {
                if let Some((open, _)) = self.open {
                    return Err(CaptureError::NestedTransaction { open });
                }
                if let Some(last) = self.last_final_lsn {
                    if final_lsn <= last {
                        return Err(CaptureError::Replayed { final_lsn, last });
                    }
                }
                self.last_final_lsn = Some(final_lsn);
                // PostgreSQL skips a transaction whose commit record starts before the start
                // position; one that ends at or before the resume position is in the log already.
                let skip = final_lsn < self.committed.lsn;
                if !skip {
                    self.place_snapshot(final_lsn, commit_ms, out);
                    self.close_epoch_if_due(commit_ms, out);
                }
                self.open = Some((final_lsn, skip));
                self.open_wrote = false;
            }
            SourceEvent::Change { table, change } => {
                let Some((_, skip)) = self.open else {
                    return Err(CaptureError::ChangeOutsideTransaction);
                };
                if !skip {
                    self.write_change(table, change, out);
                    self.open_wrote = true;
                }
            }
            SourceEvent::Truncate { tables } => {
                let Some((_, skip)) = self.open else {
                    return Err(CaptureError::ChangeOutsideTransaction);
                };
                if !skip {
                    for table in tables {
                        out.push(Action::Truncate {
                            table,
                            epoch: self.epoch,
                        });
                        self.epoch_changes += 1;
                        self.checkpoint_changes += 1;
                    }
                    self.open_wrote = true;
                }
            }
            SourceEvent::SchemaChange {
                table,
                row_schema,
                announced,
                now_ms,
            } => {
                let Some((open, skip)) = self.open else {
                    return Err(CaptureError::ChangeOutsideTransaction);
                };
                if skip {
                    // Already in the log, and so is the version it uses.
                    return Ok(());
                }
                if self.open_wrote {
                    return Err(CaptureError::SchemaChangeMidTransaction { open });
                }
                self.change_schema(table, row_schema, announced, now_ms, out)?;
            }
            SourceEvent::TablesAdded { tables, now_ms } => {
                if self.open.is_some() {
                    return Err(CaptureError::TablesAddedInTransaction);
                }
                self.add_tables(tables, now_ms, out)?;
            }
            SourceEvent::Commit { end_lsn } => {
                let Some((_, skip)) = self.open.take() else {
                    return Err(CaptureError::ChangeOutsideTransaction);
                };
                if !skip {
                    self.written_lsn = self.written_lsn.max(end_lsn);
                }
            }
            SourceEvent::Idle { wal_end, now_ms } => {
                if self.open.is_none() {
                    // Everything before `wal_end` was delivered and none of it is open: a checkpoint
                    // may acknowledge it (WAL of other tables is freed on an idle table).
                    self.written_lsn = self.written_lsn.max(wal_end);
                    self.place_snapshot(wal_end, now_ms, out);
                    self.close_epoch_if_due(now_ms, out);
                }
            }
        }
        Ok(())
    }

    /// The Kafka transaction of the last [`Action::CommitLog`] committed: the position it holds may
    /// be acknowledged.
    pub fn log_committed(&mut self, out: &mut Vec<Action>) {
        if let Some(state) = self.pending.take() {
            self.committed = state;
            if !faults::active(Fault::CaptureAckBeforeCommit) {
                out.push(Action::Ack(state.lsn));
            }
        }
    }

    fn close_epoch_if_due(&mut self, now_ms: u64, out: &mut Vec<Action>) {
        let last_checkpoint = *self.last_checkpoint_ms.get_or_insert(now_ms);
        let opened = *self.epoch_opened_ms.get_or_insert(now_ms);
        let interval = if self.checkpoint_changes > 0 {
            self.config.checkpoint_interval_ms
        } else {
            self.config.checkpoint_interval_ms.max(IDLE_CHECKPOINT_MS)
        };
        let checkpoint = now_ms.saturating_sub(last_checkpoint) >= interval;
        let barrier = self.epoch_changes > 0
            && (now_ms.saturating_sub(opened) >= self.config.barrier_interval_ms
                || self.epoch_changes >= self.config.max_epoch_changes);
        if checkpoint || barrier {
            self.close_epoch(checkpoint, now_ms, out);
        }
    }

    /// Closes the open epoch with a barrier; a checkpoint barrier is followed by the commit of the
    /// Kafka transaction (the last action).
    fn close_epoch(&mut self, checkpoint: bool, now_ms: u64, out: &mut Vec<Action>) {
        let next = self.epoch.next_at(now_ms);
        out.push(Action::Barrier(Barrier {
            prev: self.epoch,
            curr: next,
            kind: if checkpoint {
                BarrierKind::Checkpoint
            } else {
                BarrierKind::Barrier
            },
            schema_change: false,
        }));
        self.epoch = next;
        self.epoch_opened_ms = Some(now_ms);
        self.epoch_changes = 0;
        if checkpoint {
            self.last_checkpoint_ms = Some(now_ms);
            self.checkpoint_changes = 0;
            let state = CaptureState {
                lsn: self.written_lsn,
                epoch: next,
                checkpoints: self.committed.checkpoints + 1,
            };
            if faults::active(Fault::CaptureAckBeforeCommit) {
                out.push(Action::Ack(state.lsn));
            }
            out.push(Action::CommitLog(state));
            self.pending = Some(state);
        }
    }

    /// Tables joining the capture: each one's first version announced from one next epoch, then
    /// the checkpoint barrier into it and its commit, as [`Self::change_schema`] does for one.
    fn add_tables(
        &mut self,
        tables: Vec<(TableIndex, String, Option<Epoch>)>,
        now_ms: u64,
        out: &mut Vec<Action>,
    ) -> Result<(), CaptureError> {
        let mut announced: Option<Epoch> = None;
        for (_, _, a) in &tables {
            match (announced, a) {
                (Some(first), Some(second)) if first != *second => {
                    return Err(CaptureError::TablesAddedApart {
                        first,
                        second: *second,
                    })
                }
                (None, Some(a)) => announced = Some(*a),
                _ => {}
            }
        }
        let mut rest = tables.into_iter();
        let Some((table, row_schema, _)) = rest.next() else {
            return Ok(());
        };
        let mut actions = Vec::new();
        self.change_schema(table, row_schema, announced, now_ms, &mut actions)?;
        let Some(Action::AnnounceSchema { from_epoch, .. }) = actions.first().cloned() else {
            unreachable!("change_schema announces first");
        };
        out.push(actions.remove(0));
        for (table, row_schema, _) in rest {
            out.push(Action::AnnounceSchema {
                table,
                from_epoch,
                row_schema,
            });
        }
        out.extend(actions);
        Ok(())
    }

    /// A new row-schema version from the next epoch: announced, then a checkpoint barrier into it
    /// and its commit, so that every epoch's changes are of one version and the switch is a
    /// checkpoint (docs/WIRE.md "Schema changes"). The open transaction has written nothing: its
    /// changes follow in the new epoch.
    fn change_schema(
        &mut self,
        table: TableIndex,
        row_schema: String,
        announced: Option<Epoch>,
        now_ms: u64,
        out: &mut Vec<Action>,
    ) -> Result<(), CaptureError> {
        let next = match announced {
            Some(e) if e <= self.epoch => {
                return Err(CaptureError::SchemaChangeEpoch {
                    announced: e,
                    open: self.epoch,
                })
            }
            Some(e) => e,
            None => self.epoch.next_at(now_ms),
        };
        out.push(Action::AnnounceSchema {
            table,
            from_epoch: next,
            row_schema,
        });
        out.push(Action::Barrier(Barrier {
            prev: self.epoch,
            curr: next,
            kind: BarrierKind::Checkpoint,
            schema_change: true,
        }));
        self.epoch = next;
        self.epoch_opened_ms = Some(now_ms);
        self.epoch_changes = 0;
        self.checkpoint_changes = 0;
        self.last_checkpoint_ms = Some(now_ms);
        let state = CaptureState {
            lsn: self.written_lsn,
            epoch: next,
            checkpoints: self.committed.checkpoints + 1,
        };
        out.push(Action::CommitLog(state));
        self.pending = Some(state);
        Ok(())
    }

    fn push(
        &mut self,
        table: TableIndex,
        op: Op,
        key: Vec<u8>,
        row: Vec<u8>,
        out: &mut Vec<Action>,
    ) {
        let vnode = vnode_of(&key, self.map.vnode_count());
        out.push(Action::Change {
            table,
            partition: self.map.partition_of(vnode),
            vnode,
            epoch: self.epoch,
            op,
            key,
            row,
        });
        self.epoch_changes += 1;
        self.checkpoint_changes += 1;
    }

    fn write_change(&mut self, table: TableIndex, change: RowChange, out: &mut Vec<Action>) {
        match change {
            RowChange::Insert { key, row } => self.push(table, Op::Insert, key, row, out),
            RowChange::Delete { key, row } => self.push(table, Op::Delete, key, row, out),
            RowChange::Update {
                old_key,
                old_row,
                new_key,
                new_row,
            } => {
                if old_key == new_key {
                    // One partition, consecutive: the log's update pair.
                    self.push(table, Op::UpdateDelete, old_key, old_row, out);
                    self.push(table, Op::UpdateInsert, new_key, new_row, out);
                } else {
                    // The key moved: the old row leaves its vnode, the new one enters another.
                    self.push(table, Op::Delete, old_key, old_row, out);
                    self.push(table, Op::Insert, new_key, new_row, out);
                }
            }
        }
    }
}

/// Whether a capture follows a table whose columns were `captured` and are `now` — the one answer
/// the stream (a Relation message, a binlog DDL) and a restart (the catalog against the state
/// record) both give, so a capture that stops says the same reason when it is started again. `Err`
/// is why not. Columns added at the end are followed, in a capture of one table or of several
/// (the stream then checks each new column has no default and is nullable); nothing else yet.
pub fn columns_followed(captured: &[&str], now: &[&str]) -> Result<(), &'static str> {
    if now == captured || (now.len() > captured.len() && now[..captured.len()] == *captured) {
        Ok(())
    } else {
        Err("only columns added at the end are followed (ALTER TABLE … ADD COLUMN); a column dropped, renamed or retyped stops the capture")
    }
}

/// How a capture's list of tables changed between its state record and its configuration
/// ([`tables_changed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TablesChange {
    /// Positions in the recorded list of the tables the configuration no longer lists (the last
    /// ones): their changes stop at the resume epoch.
    pub removed: Vec<usize>,
    /// Positions in the configuration's list of the tables appended to it: they join the log.
    pub added: Vec<usize>,
}

/// Why a capture's new list of tables cannot continue its log ([`tables_changed`]). The log
/// numbers its tables by their place in the list, and that number is on the wire and in the
/// stores (a truncation record names its table by it, a job's store prefixes its keys with it,
/// a manifest lists its tables in that order): a table keeps its place for the life of the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TablesChangeError {
    #[error("table {table} moved in the list: tables may only be added at the end of [jobs.capture] tables or removed from its end, the recorded ones keeping their order and places")]
    Moved { table: String },
    #[error("table {table} is not at the end of the list, and only the last tables of [jobs.capture] tables can be removed: the log numbers its tables by their place (truncation records, the stores' keys and the manifests name a table by it), so a table removed from the middle would renumber the ones after it")]
    NotLast { table: String },
    #[error("table {table} is the log's first table, which cannot be removed (a one-table manifest and versions that name no table are read as the first table's)")]
    FirstRemoved { table: String },
    #[error("table {table} cannot join: the capture removed {removed} (at epoch {epoch}), whose place in the log a new table would take, and a job of it would read the new table's truncations as its own")]
    AddedAfterRemoval {
        table: String,
        removed: String,
        epoch: Epoch,
    },
    #[error("a capture of several tables keeps two at least (its log and its manifests are of several tables); {left} would be left")]
    TooFew { left: usize },
}

/// Whether a capture whose state record lists `recorded` (in the log's order) and names
/// `removed_before` (with the epoch each was removed at) continues with the configuration's
/// `now`: the recorded tables in their order, then either tables appended (added) or the last
/// ones left out (removed) — any but the first. The one answer for every source: removing a table
/// needs nothing of it, so a table dropped upstream can be removed too.
pub fn tables_changed(
    recorded: &[&str],
    removed_before: &[(&str, Epoch)],
    now: &[&str],
) -> Result<TablesChange, TablesChangeError> {
    let mut removed: Vec<usize> = Vec::new();
    let mut j = 0;
    for (i, table) in recorded.iter().enumerate() {
        if now.get(j) == Some(table) {
            if let Some(&r) = removed.first() {
                return Err(TablesChangeError::NotLast {
                    table: recorded[r].to_string(),
                });
            }
            j += 1;
            continue;
        }
        if now.contains(table) {
            return Err(TablesChangeError::Moved {
                table: table.to_string(),
            });
        }
        if i == 0 {
            return Err(TablesChangeError::FirstRemoved {
                table: table.to_string(),
            });
        }
        removed.push(i);
    }
    if let Some(t) = now[j..].iter().find(|t| recorded.contains(t)) {
        return Err(TablesChangeError::Moved {
            table: t.to_string(),
        });
    }
    let added: Vec<usize> = (j..now.len()).collect();
    let gone = removed
        .first()
        .map(|&r| (recorded[r], None))
        .or_else(|| removed_before.first().map(|&(t, e)| (t, Some(e))));
    if let (Some(&a), Some((table, epoch))) = (added.first(), gone) {
        return Err(TablesChangeError::AddedAfterRemoval {
            table: now[a].to_string(),
            removed: table.to_string(),
            epoch: epoch.unwrap_or(Epoch(0)),
        });
    }
    if recorded.len() > 1 && now.len() < 2 {
        return Err(TablesChangeError::TooFew { left: now.len() });
    }
    Ok(TablesChange { removed, added })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> PartitionMap {
        PartitionMap::new(16, 2).unwrap()
    }

    fn cfg() -> CaptureConfig {
        CaptureConfig {
            barrier_interval_ms: 100,
            checkpoint_interval_ms: 1000,
            max_epoch_changes: 3,
        }
    }

    fn insert(k: u8) -> SourceEvent {
        insert_into(0, k)
    }

    fn insert_into(table: TableIndex, k: u8) -> SourceEvent {
        SourceEvent::Change {
            table,
            change: RowChange::Insert {
                key: vec![k],
                row: vec![k, 1],
            },
        }
    }

    fn begin(a: &mut Assembler, final_lsn: Lsn, commit_ms: u64, out: &mut Vec<Action>) {
        a.on_event(
            SourceEvent::Begin {
                final_lsn,
                commit_ms,
            },
            out,
        )
        .unwrap();
    }

    fn barriers(out: &[Action]) -> Vec<Barrier> {
        out.iter()
            .filter_map(|a| match a {
                Action::Barrier(b) => Some(*b),
                _ => None,
            })
            .collect()
    }

    fn committed_start(now: u64) -> Assembler {
        let (mut a, first) = Assembler::fresh(cfg(), map(), Epoch(1 << 16), 100, now);
        assert!(matches!(
            first[0],
            Action::Barrier(Barrier {
                kind: BarrierKind::Initial,
                ..
            })
        ));
        let mut out = Vec::new();
        a.log_committed(&mut out);
        assert_eq!(out, vec![Action::Ack(100)]);
        a
    }

    /// Tables joining a capture between transactions: every first version announced from one next
    /// epoch, then one checkpoint barrier into it (marked as a switch) and its commit; announced
    /// before by a failed session, they start at that epoch again; never inside a transaction,
    /// never from two epochs.
    #[test]
    fn tables_added_are_announced_together_at_one_checkpoint() {
        let t = 1_000_000;
        let mut a = committed_start(t);
        let open = a.epoch();
        let mut out = Vec::new();
        let added = |announced: Option<Epoch>| SourceEvent::TablesAdded {
            tables: vec![(2, "e".into(), announced), (3, "f".into(), None)],
            now_ms: t + 30,
        };
        a.on_event(added(None), &mut out).unwrap();
        let Action::AnnounceSchema { from_epoch, .. } = out[0].clone() else {
            panic!("{out:?}")
        };
        assert!(from_epoch > open);
        assert_eq!(
            out,
            vec![
                Action::AnnounceSchema {
                    table: 2,
                    from_epoch,
                    row_schema: "e".into()
                },
                Action::AnnounceSchema {
                    table: 3,
                    from_epoch,
                    row_schema: "f".into()
                },
                Action::Barrier(Barrier {
                    prev: open,
                    curr: from_epoch,
                    kind: BarrierKind::Checkpoint,
                    schema_change: true,
                }),
                Action::CommitLog(CaptureState {
                    lsn: 100,
                    epoch: from_epoch,
                    checkpoints: 1,
                }),
            ]
        );
        // A session that failed after announcing them: the same epoch again.
        let mut b = committed_start(t);
        let mut again = Vec::new();
        b.on_event(added(Some(from_epoch)), &mut again).unwrap();
        assert_eq!(again, out);
        let mut c = committed_start(t);
        let apart = SourceEvent::TablesAdded {
            tables: vec![
                (2, "e".into(), Some(from_epoch)),
                (3, "f".into(), Some(from_epoch.next_at(t + 99))),
            ],
            now_ms: t + 30,
        };
        assert!(matches!(
            c.on_event(apart, &mut Vec::new()),
            Err(CaptureError::TablesAddedApart { .. })
        ));
        let mut d = committed_start(t);
        begin(&mut d, 200, t + 10, &mut Vec::new());
        assert_eq!(
            d.on_event(added(None), &mut Vec::new()),
            Err(CaptureError::TablesAddedInTransaction)
        );
    }

    /// A schema change before a transaction's first change: the version is announced, then a
    /// checkpoint barrier into the epoch it starts at (marked as the switch) commits everything
    /// before the transaction, whose changes follow in the new epoch. One after a change of the
    /// same transaction is refused; one announced before (a session that failed after announcing
    /// it) starts at the same epoch again.
    #[test]
    fn a_schema_change_is_announced_then_committed_at_a_checkpoint_before_the_transaction() {
        let t = 1_000_000;
        let mut a = committed_start(t);
        let mut out = Vec::new();
        begin(&mut a, 200, t + 10, &mut out);
        a.on_event(insert(1), &mut out).unwrap();
        a.on_event(SourceEvent::Commit { end_lsn: 210 }, &mut out)
            .unwrap();
        begin(&mut a, 300, t + 20, &mut out);
        out.clear();
        let open = a.epoch();
        a.on_event(
            SourceEvent::SchemaChange {
                table: 0,
                row_schema: "v1".into(),
                announced: None,
                now_ms: t + 30,
            },
            &mut out,
        )
        .unwrap();
        let Action::AnnounceSchema { from_epoch, .. } = out[0].clone() else {
            panic!("{out:?}")
        };
        assert!(from_epoch > open);
        let b = barriers(&out);
        assert_eq!(b.len(), 1);
        assert_eq!(
            (b[0].prev, b[0].curr, b[0].kind, b[0].schema_change),
            (open, from_epoch, BarrierKind::Checkpoint, true)
        );
        // Resumes after the transaction before this one: this one is read again after a failure.
        assert!(
            matches!(out.last(), Some(Action::CommitLog(st)) if st.lsn == 210 && st.epoch == from_epoch)
        );
        a.log_committed(&mut out);
        out.clear();
        a.on_event(insert(2), &mut out).unwrap();
        assert!(matches!(&out[0], Action::Change { epoch, .. } if *epoch == from_epoch));
        // After a change of the same transaction: refused.
        let e = a
            .on_event(
                SourceEvent::SchemaChange {
                    table: 0,
                    row_schema: "v2".into(),
                    announced: None,
                    now_ms: t + 40,
                },
                &mut out,
            )
            .unwrap_err();
        assert_eq!(e, CaptureError::SchemaChangeMidTransaction { open: 300 });

        // Announced before from a later epoch: it starts there again.
        let mut b2 = committed_start(t);
        begin(&mut b2, 200, t + 10, &mut out);
        let again = Epoch(b2.epoch().0 + (5 << 16));
        out.clear();
        b2.on_event(
            SourceEvent::SchemaChange {
                table: 0,
                row_schema: "v1".into(),
                announced: Some(again),
                now_ms: t + 11,
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(barriers(&out)[0].curr, again);
        // An announcement at or before the open epoch cannot be honoured.
        let mut b3 = committed_start(t);
        begin(&mut b3, 200, t + 10, &mut out);
        let open = b3.epoch();
        let e = b3
            .on_event(
                SourceEvent::SchemaChange {
                    table: 0,
                    row_schema: "v1".into(),
                    announced: Some(open),
                    now_ms: t + 11,
                },
                &mut out,
            )
            .unwrap_err();
        assert!(matches!(e, CaptureError::SchemaChangeEpoch { .. }));
    }

    #[test]
    fn barriers_fall_between_transactions_and_checkpoints_ack_after_the_commit() {
        let mut a = committed_start(1_000_000);
        let mut out = Vec::new();
        let t = 1_000_000;
        begin(&mut a, 200, t + 10, &mut out);
        a.on_event(insert(1), &mut out).unwrap();
        a.on_event(SourceEvent::Commit { end_lsn: 210 }, &mut out)
            .unwrap();
        assert!(
            barriers(&out).is_empty(),
            "no barrier inside or right after a young epoch"
        );
        // The next transaction comes after the barrier interval: a barrier before it.
        begin(&mut a, 300, t + 150, &mut out);
        let b = barriers(&out);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].kind, BarrierKind::Barrier);
        a.on_event(insert(2), &mut out).unwrap();
        a.on_event(SourceEvent::Commit { end_lsn: 310 }, &mut out)
            .unwrap();
        // Idle past the checkpoint interval: a checkpoint that records the end of the last
        // transaction, and no acknowledgement until the Kafka commit.
        out.clear();
        a.on_event(
            SourceEvent::Idle {
                wal_end: 0,
                now_ms: t + 1200,
            },
            &mut out,
        )
        .unwrap();
        let state = CaptureState {
            lsn: 310,
            epoch: a.epoch(),
            checkpoints: 1,
        };
        assert_eq!(out.last(), Some(&Action::CommitLog(state)));
        assert!(!out.iter().any(|x| matches!(x, Action::Ack(_))));
        assert!(matches!(
            a.on_event(insert(3), &mut Vec::new()),
            Err(CaptureError::CommitPending { .. })
        ));
        out.clear();
        a.log_committed(&mut out);
        assert_eq!(out, vec![Action::Ack(310)]);
        assert_eq!(a.committed(), state);
    }

    /// A snapshot exported at 250 while transactions commit at 200 and 300: its checkpoint
    /// barrier comes at the Begin of 300 (the first at or past it), closes the epoch holding 200,
    /// and is marked as the snapshot's; 300's changes follow in the next epoch.
    #[test]
    fn a_snapshot_is_placed_at_the_first_transaction_at_or_past_its_consistent_point() {
        let t = 1_000_000;
        let mut a = committed_start(t);
        let mut out = Vec::new();
        begin(&mut a, 200, t + 10, &mut out);
        a.on_event(insert(1), &mut out).unwrap();
        assert_eq!(
            a.snapshot_at(250),
            Err(CaptureError::SnapshotNotBetween),
            "not inside a transaction"
        );
        a.on_event(SourceEvent::Commit { end_lsn: 210 }, &mut out)
            .unwrap();
        a.snapshot_at(250).unwrap();
        assert_eq!(a.snapshot_at(260), Err(CaptureError::SnapshotNotBetween));
        let holding = a.epoch();
        out.clear();
        begin(&mut a, 300, t + 20, &mut out);
        let b = barriers(&out);
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].kind, b[0].prev), (BarrierKind::Checkpoint, holding));
        let n = out.len();
        assert_eq!(
            out[n - 2],
            Action::SnapshotPoint {
                snapshot_epoch: holding,
                next_epoch: b[0].curr,
                consistent: 250
            }
        );
        assert!(matches!(
            out[n - 1],
            Action::CommitLog(CaptureState { lsn: 210, .. })
        ));
        a.log_committed(&mut out);
        out.clear();
        a.on_event(insert(2), &mut out).unwrap();
        assert!(matches!(out[0], Action::Change { epoch, .. } if epoch == b[0].curr));
        assert!(!a.snapshot_waiting());
    }

    /// On an idle source the barrier comes with the first idle report at or past the consistent
    /// point; one that comes after a transaction at or past it was written is refused.
    #[test]
    fn a_snapshot_on_an_idle_source_is_placed_at_the_wal_end_and_a_late_one_is_refused() {
        let mut a = committed_start(0);
        let mut out = Vec::new();
        a.snapshot_at(5000).unwrap();
        let idle = |wal_end| SourceEvent::Idle {
            wal_end,
            now_ms: 10,
        };
        a.on_event(idle(4000), &mut out).unwrap();
        assert!(out.is_empty(), "the source has not reached the point yet");
        a.on_event(idle(5000), &mut out).unwrap();
        assert!(matches!(
            out[out.len() - 2],
            Action::SnapshotPoint {
                consistent: 5000,
                ..
            }
        ));
        assert!(matches!(
            out.last(),
            Some(Action::CommitLog(CaptureState { lsn: 5000, .. }))
        ));
        a.log_committed(&mut out);
        out.clear();
        begin(&mut a, 7000, 20, &mut out);
        a.on_event(SourceEvent::Commit { end_lsn: 7010 }, &mut out)
            .unwrap();
        assert_eq!(
            a.snapshot_at(6000),
            Err(CaptureError::SnapshotPassed {
                consistent: 6000,
                written: 7000
            })
        );
        assert!(!a.snapshot_waiting());
    }

    #[test]
    fn an_idle_source_gets_checkpoints_that_acknowledge_the_wal_end() {
        let mut a = committed_start(0);
        let mut out = Vec::new();
        a.on_event(
            SourceEvent::Idle {
                wal_end: 5000,
                now_ms: 999,
            },
            &mut out,
        )
        .unwrap();
        assert!(out.is_empty());
        a.on_event(
            SourceEvent::Idle {
                wal_end: 6000,
                now_ms: 1000,
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(barriers(&out)[0].kind, BarrierKind::Checkpoint);
        assert!(matches!(
            out.last(),
            Some(Action::CommitLog(CaptureState { lsn: 6000, .. }))
        ));
    }

    #[test]
    fn a_short_checkpoint_interval_commits_changes_at_it_and_an_idle_source_once_a_second() {
        let config = CaptureConfig {
            barrier_interval_ms: 200,
            checkpoint_interval_ms: 200,
            max_epoch_changes: 1_000,
        };
        let (mut a, _) = Assembler::fresh(config, map(), Epoch(1 << 16), 100, 0);
        let mut out = Vec::new();
        a.log_committed(&mut out);
        out.clear();
        // Idle: no checkpoint at 200 ms, one at IDLE_CHECKPOINT_MS.
        let idle = |wal_end, now_ms| SourceEvent::Idle { wal_end, now_ms };
        a.on_event(idle(100, 0), &mut out).unwrap();
        a.on_event(idle(200, 200), &mut out).unwrap();
        a.on_event(idle(300, IDLE_CHECKPOINT_MS - 1), &mut out)
            .unwrap();
        assert!(barriers(&out).is_empty(), "{out:?}");
        a.on_event(idle(400, IDLE_CHECKPOINT_MS), &mut out).unwrap();
        assert_eq!(barriers(&out).len(), 1);
        assert!(matches!(
            out.last(),
            Some(Action::CommitLog(CaptureState { lsn: 400, .. }))
        ));
        a.log_committed(&mut out);
        out.clear();
        // A change: the checkpoint that holds it comes at the configured 200 ms.
        begin(&mut a, 500, IDLE_CHECKPOINT_MS + 50, &mut out);
        a.on_event(insert(1), &mut out).unwrap();
        a.on_event(SourceEvent::Commit { end_lsn: 510 }, &mut out)
            .unwrap();
        a.on_event(idle(600, IDLE_CHECKPOINT_MS + 200), &mut out)
            .unwrap();
        assert_eq!(
            barriers(&out).last().map(|b| b.kind),
            Some(BarrierKind::Checkpoint),
            "{out:?}"
        );
        assert!(matches!(
            out.last(),
            Some(Action::CommitLog(CaptureState { lsn: 600, .. }))
        ));
    }

    #[test]
    fn an_idle_position_inside_a_transaction_is_not_recorded() {
        let mut a = committed_start(0);
        let mut out = Vec::new();
        begin(&mut a, 900, 10, &mut out);
        a.on_event(
            SourceEvent::Idle {
                wal_end: 800,
                now_ms: 5000,
            },
            &mut out,
        )
        .unwrap();
        assert!(out.is_empty(), "no barrier inside a transaction");
        a.on_event(SourceEvent::Commit { end_lsn: 910 }, &mut out)
            .unwrap();
        a.on_event(
            SourceEvent::Idle {
                wal_end: 0,
                now_ms: 5001,
            },
            &mut out,
        )
        .unwrap();
        assert!(matches!(
            out.last(),
            Some(Action::CommitLog(CaptureState { lsn: 910, .. }))
        ));
    }

    #[test]
    fn updates_pair_in_one_partition_and_a_moved_key_is_delete_plus_insert() {
        let mut a = committed_start(0);
        let mut out = Vec::new();
        begin(&mut a, 200, 1, &mut out);
        for (old, new) in [(1u8, 1u8), (1, 9)] {
            a.on_event(
                SourceEvent::Change {
                    table: 0,
                    change: RowChange::Update {
                        old_key: vec![old],
                        old_row: vec![old],
                        new_key: vec![new],
                        new_row: vec![new],
                    },
                },
                &mut out,
            )
            .unwrap();
        }
        let ops: Vec<Op> = out
            .iter()
            .filter_map(|x| match x {
                Action::Change { op, .. } => Some(*op),
                _ => None,
            })
            .collect();
        assert_eq!(
            ops,
            [Op::UpdateDelete, Op::UpdateInsert, Op::Delete, Op::Insert]
        );
    }

    #[test]
    fn a_full_epoch_closes_at_the_next_boundary_not_inside_a_transaction() {
        let mut a = committed_start(0);
        let mut out = Vec::new();
        begin(&mut a, 200, 1, &mut out);
        for k in 0..5 {
            a.on_event(insert(k), &mut out).unwrap();
        }
        assert!(barriers(&out).is_empty());
        a.on_event(SourceEvent::Commit { end_lsn: 210 }, &mut out)
            .unwrap();
        begin(&mut a, 300, 2, &mut out);
        assert_eq!(barriers(&out).len(), 1);
    }

    #[test]
    fn a_backlog_replayed_after_a_restart_is_checkpointed_by_its_commit_times() {
        let state = CaptureState {
            lsn: 100,
            epoch: Epoch(7 << 16),
            checkpoints: 3,
        };
        let mut a = Assembler::resume(cfg(), map(), state);
        let mut out = Vec::new();
        let mut commits = 0;
        // Transactions committed long ago, 300 ms apart: a checkpoint every ~1 s of them.
        for i in 0..10u64 {
            begin(&mut a, 200 + i * 10, 5_000 + i * 300, &mut out);
            if matches!(out.last(), Some(Action::CommitLog(_))) {
                commits += 1;
                a.log_committed(&mut out);
            }
            a.on_event(insert(i as u8), &mut out).unwrap();
            a.on_event(
                SourceEvent::Commit {
                    end_lsn: 205 + i * 10,
                },
                &mut out,
            )
            .unwrap();
        }
        assert_eq!(commits, 2, "{out:?}");
    }

    #[test]
    fn resume_drops_what_the_log_holds_and_a_replay_is_an_error() {
        let state = CaptureState {
            lsn: 500,
            epoch: Epoch(7 << 16),
            checkpoints: 3,
        };
        let mut a = Assembler::resume(cfg(), map(), state);
        assert_eq!(a.start_lsn(), 500);
        assert!(a.check_slot(500).is_ok());
        assert_eq!(
            a.check_slot(501),
            Err(CaptureError::SlotAhead {
                confirmed: 501,
                resume: 500
            })
        );
        let mut out = Vec::new();
        begin(&mut a, 490, 1, &mut out);
        a.on_event(insert(1), &mut out).unwrap();
        a.on_event(SourceEvent::Commit { end_lsn: 500 }, &mut out)
            .unwrap();
        assert!(
            out.is_empty(),
            "a transaction that ends at the resume position is in the log"
        );
        begin(&mut a, 600, 2, &mut out);
        a.on_event(insert(2), &mut out).unwrap();
        a.on_event(SourceEvent::Commit { end_lsn: 610 }, &mut out)
            .unwrap();
        assert_eq!(out.len(), 1);
        assert!(matches!(
            a.on_event(
                SourceEvent::Begin {
                    final_lsn: 600,
                    commit_ms: 3
                },
                &mut out
            ),
            Err(CaptureError::Replayed {
                final_lsn: 600,
                last: 600
            })
        ));
    }

    /// A source transaction touching several tables lands in one epoch, each change tagged with its
    /// table, and a barrier never falls inside it, however many changes it holds.
    #[test]
    fn a_transaction_over_several_tables_is_one_epoch_with_each_change_tagged() {
        let mut a = committed_start(0);
        let mut out = Vec::new();
        begin(&mut a, 200, 1, &mut out);
        for (table, k) in [(0, 1u8), (1, 2), (2, 3), (1, 4), (0, 5)] {
            a.on_event(insert_into(table, k), &mut out).unwrap();
        }
        a.on_event(SourceEvent::Commit { end_lsn: 210 }, &mut out)
            .unwrap();
        let changes: Vec<(TableIndex, Epoch, u8)> = out
            .iter()
            .filter_map(|x| match x {
                Action::Change {
                    table, epoch, key, ..
                } => Some((*table, *epoch, key[0])),
                _ => None,
            })
            .collect();
        assert_eq!(
            changes.iter().map(|c| (c.0, c.2)).collect::<Vec<_>>(),
            vec![(0, 1), (1, 2), (2, 3), (1, 4), (0, 5)]
        );
        assert!(
            changes.iter().all(|c| c.1 == changes[0].1),
            "one epoch: {changes:?}"
        );
        assert!(barriers(&out).is_empty(), "no barrier inside a transaction");
        // The next transaction, past max_epoch_changes, starts a new epoch for every table.
        begin(&mut a, 300, 500, &mut out);
        assert_eq!(barriers(&out).len(), 1);
    }

    /// pgbench's `TRUNCATE pgbench_history` (or any): a truncation of each table named, in the
    /// transaction's epoch and in its place among the changes; none for a transaction replayed.
    #[test]
    fn a_truncate_is_written_in_its_place_in_the_transaction_s_epoch() {
        let mut a = committed_start(0);
        let mut out = Vec::new();
        begin(&mut a, 200, 1, &mut out);
        a.on_event(insert_into(1, 1), &mut out).unwrap();
        a.on_event(SourceEvent::Truncate { tables: vec![1, 2] }, &mut out)
            .unwrap();
        a.on_event(insert_into(1, 2), &mut out).unwrap();
        a.on_event(SourceEvent::Commit { end_lsn: 210 }, &mut out)
            .unwrap();
        let epoch = a.epoch();
        let seen: Vec<String> = out
            .iter()
            .filter_map(|x| match x {
                Action::Change {
                    table,
                    epoch: e,
                    key,
                    ..
                } if *e == epoch => Some(format!("change {table}/{}", key[0])),
                Action::Truncate { table, epoch: e } if *e == epoch => {
                    Some(format!("truncate {table}"))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            seen,
            ["change 1/1", "truncate 1", "truncate 2", "change 1/2"]
        );
        assert!(
            a.on_event(SourceEvent::Truncate { tables: vec![0] }, &mut out)
                .is_err(),
            "outside a transaction"
        );
        // A transaction the log holds already (before the resume position) writes nothing.
        let mut a = Assembler::resume(
            cfg(),
            map(),
            CaptureState {
                lsn: 500,
                ..a.committed()
            },
        );
        let mut out = Vec::new();
        begin(&mut a, 400, 2, &mut out);
        a.on_event(SourceEvent::Truncate { tables: vec![0] }, &mut out)
            .unwrap();
        assert!(!out.iter().any(|x| matches!(x, Action::Truncate { .. })));
    }

    #[test]
    fn columns_are_followed_only_when_added_at_the_end() {
        let (ab, abc, ac) = (["a", "b"], ["a", "b", "c"], ["a", "c"]);
        assert_eq!(columns_followed(&ab, &ab), Ok(()));
        assert_eq!(columns_followed(&ab, &abc), Ok(()));
        for now in [&ac[..], &["a"][..], &["b", "a"][..]] {
            let e = columns_followed(&ab, now).unwrap_err();
            assert!(e.contains("only columns added at the end"), "{now:?}: {e}");
        }
    }

    #[test]
    fn a_list_of_tables_may_lose_its_last_and_gain_at_its_end_but_not_both() {
        let abcd = ["a", "b", "c", "d"];
        let ok = |now: &[&str]| tables_changed(&abcd, &[], now).unwrap();
        assert_eq!(
            ok(&abcd),
            TablesChange {
                removed: vec![],
                added: vec![]
            }
        );
        assert_eq!(ok(&["a", "b", "c"]).removed, vec![3]);
        assert_eq!(ok(&["a", "b"]).removed, vec![2, 3]);
        assert_eq!(ok(&["a", "b", "c", "d", "e"]).added, vec![4]);
        let e = |now: &[&str], before: &[(&str, Epoch)]| tables_changed(&abcd, before, now);
        let not_last = e(&["a", "c", "d"], &[]).unwrap_err();
        assert_eq!(
            not_last,
            TablesChangeError::NotLast {
                table: "b".to_string()
            }
        );
        assert!(not_last.to_string().contains("renumber"), "{not_last}");
        assert!(matches!(
            e(&["b", "c", "d"], &[]),
            Err(TablesChangeError::FirstRemoved { .. })
        ));
        assert!(matches!(
            e(&["a", "c", "b", "d"], &[]),
            Err(TablesChangeError::Moved { .. })
        ));
        assert!(matches!(
            e(&["b", "a", "c", "d"], &[]),
            Err(TablesChangeError::Moved { .. })
        ));
        assert!(matches!(
            e(&["a", "b", "c", "e"], &[]),
            Err(TablesChangeError::AddedAfterRemoval { .. })
        ));
        // A table removed by an earlier restart: none joins after it, itself neither.
        for now in [&["a", "b", "c", "d", "x"][..], &["a", "b", "c", "d", "e"]] {
            assert!(matches!(
                e(now, &[("x", Epoch(7))]),
                Err(TablesChangeError::AddedAfterRemoval { .. })
            ));
        }
        assert_eq!(ok(&["a", "b", "c"]).removed, vec![3]);
        assert!(matches!(
            tables_changed(&["a", "b"], &[], &["a"]),
            Err(TablesChangeError::TooFew { left: 1 })
        ));
        // A one-table log: its table stays, others may join.
        assert_eq!(
            tables_changed(&["a"], &[], &["a", "b"]).unwrap().added,
            vec![1]
        );
        assert!(tables_changed(&["a"], &[], &["b"]).is_err());
    }
}
