//! `kafka-backfill capture`: a PostgreSQL table into a job's snapshot and log store, exactly once.
//!
//! This module owns the capture loop ([`run_session`]): it feeds what the source delivers to the
//! pure [`Assembler`](crate::core::capture::Assembler) and carries its decisions out against two
//! ports, [`ReplicationPort`] (the slot's change stream) and [`LogPort`] (one Kafka transaction per
//! checkpoint, with the resume state). It must not reach PostgreSQL or Kafka itself: `pg.rs` and
//! `log.rs` are the real ports, `src/sim/capture.rs` the simulated ones, and both run this loop.
//! `job.rs` wires a job's configuration to the real ports (preconditions, snapshot, resume);
//! `types.rs` is the one PostgreSQL → Avro mapping both the snapshot and the stream use.

use std::time::Duration;

use crate::core::capture::{
    Action, Assembler, CaptureError, CaptureState, Lsn, SourceEvent, TableIndex,
};
use crate::core::{Barrier, Epoch, Op, PartitionId, Vnode};

pub mod job;
pub mod log;
pub mod pg;
pub mod report;
pub mod snapshots;
pub mod types;

/// Why a capture session ended.
#[derive(Debug, thiserror::Error)]
pub enum CaptureFailure {
    /// The connection dropped, the source replayed, a Kafka transaction must be aborted: abort the
    /// open Kafka transaction and resume from the last committed state.
    #[error("{0}")]
    Transient(String),
    /// Fenced by a newer capture, a refused table change, a lost slot: stop.
    #[error("{0}")]
    Permanent(String),
}

impl From<CaptureError> for CaptureFailure {
    fn from(e: CaptureError) -> Self {
        match e {
            CaptureError::Replayed { .. } | CaptureError::NestedTransaction { .. } => {
                CaptureFailure::Transient(e.to_string())
            }
            _ => CaptureFailure::Permanent(e.to_string()),
        }
    }
}

/// The slot's stream of committed transactions.
pub trait ReplicationPort {
    /// Starts streaming at `lsn` (a transaction boundary); returns the slot's confirmed position.
    fn start(&mut self, lsn: Lsn) -> Result<Lsn, CaptureFailure>;
    /// The next event; [`SourceEvent::Idle`] when nothing arrived within `idle`.
    fn next(&mut self, idle: Duration) -> Result<SourceEvent, CaptureFailure>;
    /// Tells the source that everything before `lsn` is durable elsewhere.
    fn ack(&mut self, lsn: Lsn) -> Result<(), CaptureFailure>;
}

/// The log store's writer: one transaction at a time.
pub trait LogPort {
    fn begin(&mut self) -> Result<(), CaptureFailure>;
    fn barrier(&mut self, barrier: &Barrier) -> Result<(), CaptureFailure>;
    /// Writes a change of `table` (its index in the capture's tables) with that table's row schema.
    #[allow(clippy::too_many_arguments)]
    fn change(
        &mut self,
        table: TableIndex,
        partition: PartitionId,
        vnode: Vnode,
        epoch: Epoch,
        op: Op,
        key: &[u8],
        row: &[u8],
    ) -> Result<(), CaptureFailure>;
    /// Announces a row-schema version starting at `from_epoch` (durably, before the barrier into
    /// it) and writes the changes after that barrier with it (docs/WIRE.md "Schema changes").
    fn announce_schema(
        &mut self,
        from_epoch: Epoch,
        row_schema: &str,
    ) -> Result<(), CaptureFailure>;
    /// The barrier just written closes `snapshot_epoch`, a snapshot's epoch
    /// ([`Action::SnapshotPoint`]): once this transaction commits, the offsets just after that
    /// barrier are the snapshot's start offsets.
    fn snapshot_point(
        &mut self,
        snapshot_epoch: Epoch,
        next_epoch: Epoch,
        consistent: Lsn,
    ) -> Result<(), CaptureFailure>;
    /// Writes `state` into the transaction and commits it.
    fn commit(&mut self, state: &CaptureState) -> Result<(), CaptureFailure>;
    /// Aborts the open transaction, if any.
    fn abort(&mut self) -> Result<(), CaptureFailure>;
}

/// What one session did, for status and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionStats {
    pub transactions: u64,
    pub changes: u64,
    pub checkpoints: u64,
    /// The source's position as far as it told (the end of the last transaction or an idle
    /// report): what the committed position lags behind.
    pub source_lsn: Lsn,
    /// The commit time (Unix ms) of the last source transaction read.
    pub last_source_commit_ms: u64,
}

/// Observes a session's progress (the service's metrics and status; nothing in tests).
pub trait CaptureObserver {
    fn committed(&mut self, _state: &CaptureState, _stats: &SessionStats) {}
}

impl CaptureObserver for () {}

/// Carries out `actions` against the ports; a commit is followed by the next transaction's begin.
fn carry_out(
    a: &mut Assembler,
    actions: &mut Vec<Action>,
    repl: &mut dyn ReplicationPort,
    log: &mut dyn LogPort,
    stats: &mut SessionStats,
    observer: &mut dyn CaptureObserver,
) -> Result<(), CaptureFailure> {
    let mut i = 0;
    while i < actions.len() {
        match &actions[i] {
            Action::Barrier(b) => log.barrier(b)?,
            Action::Change {
                table,
                partition,
                vnode,
                epoch,
                op,
                key,
                row,
            } => {
                stats.changes += 1;
                log.change(*table, *partition, *vnode, *epoch, *op, key, row)?
            }
            Action::CommitLog(state) => {
                let state = *state;
                log.commit(&state)?;
                stats.checkpoints += 1;
                let mut after = Vec::new();
                a.log_committed(&mut after);
                observer.committed(&state, stats);
                log.begin()?;
                actions.extend(after);
            }
            Action::Ack(lsn) => repl.ack(*lsn)?,
            Action::AnnounceSchema {
                from_epoch,
                row_schema,
            } => log.announce_schema(*from_epoch, row_schema)?,
            Action::SnapshotPoint {
                snapshot_epoch,
                next_epoch,
                consistent,
            } => log.snapshot_point(*snapshot_epoch, *next_epoch, *consistent)?,
        }
        i += 1;
    }
    actions.clear();
    Ok(())
}

/// Runs one session until `between()` says to stop (it is called between source transactions,
/// where it may also ask the assembler for a snapshot: [`Assembler::snapshot_at`]), or a failure:
/// starts the transaction, starts replication at the assembler's resume position and checks the
/// slot, carries out `initial` (a fresh capture's first actions), then reads. On a failure the
/// caller aborts and resumes from `assembler.committed()` with a new assembler and a new source
/// session.
pub fn run_session(
    a: &mut Assembler,
    initial: Vec<Action>,
    repl: &mut dyn ReplicationPort,
    log: &mut dyn LogPort,
    idle: Duration,
    between: &mut dyn FnMut(&mut Assembler) -> Result<bool, CaptureFailure>,
    observer: &mut dyn CaptureObserver,
) -> Result<SessionStats, CaptureFailure> {
    let mut stats = SessionStats::default();
    let mut actions = initial;
    log.begin()?;
    let confirmed = repl.start(a.start_lsn())?;
    a.check_slot(confirmed)?;
    carry_out(a, &mut actions, repl, log, &mut stats, observer)?;
    loop {
        if !a.in_transaction() && between(a)? {
            log.abort()?;
            return Ok(stats);
        }
        let event = repl.next(idle)?;
        match &event {
            SourceEvent::Begin { commit_ms, .. } => stats.last_source_commit_ms = *commit_ms,
            SourceEvent::Commit { end_lsn } => {
                stats.transactions += 1;
                stats.source_lsn = stats.source_lsn.max(*end_lsn);
            }
            SourceEvent::Idle { wal_end, .. } => stats.source_lsn = stats.source_lsn.max(*wal_end),
            SourceEvent::Change { .. } | SourceEvent::SchemaChange { .. } => {}
        }
        a.on_event(event, &mut actions)?;
        carry_out(a, &mut actions, repl, log, &mut stats, observer)?;
    }
}
