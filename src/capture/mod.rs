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
mod session;
pub use session::unix_ms;
pub mod log;
pub mod mariadb;
pub mod pg;
pub mod report;
pub mod snapshots;
pub mod types;

/// The source table as it is now, encoded by its source's mapping: key bytes → row datum (for
/// `verify --against-source`). `nulls_last`: the nullable columns the log's newest version
/// writes `[T, "null"]` ([`nulls_last_of`]).
pub fn read_source_table(
    url: &str,
    table: &pg::TableName,
    nulls_last: &[String],
) -> anyhow::Result<std::collections::BTreeMap<Vec<u8>, Vec<u8>>> {
    if mariadb::is_mariadb_url(url) {
        mariadb::read_table(url, table, nulls_last)
    } else {
        pg::read_table(url, table, nulls_last)
    }
}

/// The nullable columns of a table that the newest schema version in the snapshot folder `dir`
/// writes `[T, "null"]` (columns added with a default, [`types::PgColumn::null_last`]): the
/// versions naming `name`, or naming none when `first` (the log's first table, whose versions
/// name no table while the log has one).
pub fn nulls_last_of(
    dir: &std::path::Path,
    name: Option<&str>,
    first: bool,
) -> anyhow::Result<Vec<String>> {
    let home = crate::snapshot::versions::home(dir);
    let versions = crate::snapshot::versions::read(&home)?;
    let newest = versions
        .iter()
        .filter(|v| v.table.as_deref() == name || (first && v.table.is_none()))
        .max_by_key(|v| v.from_epoch);
    Ok(match newest {
        Some(v) => types::nulls_last(&serde_json::from_str(&v.row_schema)?),
        None => Vec::new(),
    })
}

/// A cause kept beneath a [`CaptureFailure`].
pub use crate::error::Cause;

/// Why a capture session ended: what failed, and the error that made it fail (its `source`).
/// `Display` is what failed; [`CaptureFailure::describe`] is the one line an operator reads, with
/// every cause after it.
#[derive(Debug, thiserror::Error)]
pub enum CaptureFailure {
    /// The connection dropped, the source replayed, a Kafka transaction must be aborted: abort the
    /// open Kafka transaction and resume from the last committed state.
    #[error("{what}")]
    Transient {
        what: String,
        #[source]
        cause: Option<Cause>,
    },
    /// Fenced by a newer capture, a refused table change, a lost slot: stop.
    #[error("{what}")]
    Permanent {
        what: String,
        #[source]
        cause: Option<Cause>,
    },
}

impl CaptureFailure {
    /// A transient failure with nothing beneath it.
    pub fn transient(what: impl Into<String>) -> Self {
        CaptureFailure::Transient {
            what: what.into(),
            cause: None,
        }
    }

    /// A permanent failure with nothing beneath it.
    pub fn permanent(what: impl Into<String>) -> Self {
        CaptureFailure::Permanent {
            what: what.into(),
            cause: None,
        }
    }

    /// `what` failed, transiently, because of `cause`.
    pub fn transient_from(what: impl Into<String>, cause: impl Into<Cause>) -> Self {
        CaptureFailure::Transient {
            what: what.into(),
            cause: Some(cause.into()),
        }
    }

    /// `what` failed, for good, because of `cause`.
    pub fn permanent_from(what: impl Into<String>, cause: impl Into<Cause>) -> Self {
        CaptureFailure::Permanent {
            what: what.into(),
            cause: Some(cause.into()),
        }
    }

    pub fn is_transient(&self) -> bool {
        matches!(self, CaptureFailure::Transient { .. })
    }

    /// What failed and each cause beneath it, `: `-separated, on one line, each cause said once
    /// ([`crate::error::chain_line`]).
    pub fn describe(&self) -> String {
        crate::error::chain_line(self)
    }
}

impl From<CaptureError> for CaptureFailure {
    fn from(e: CaptureError) -> Self {
        let what = e.to_string();
        match e {
            CaptureError::Replayed { .. } | CaptureError::NestedTransaction { .. } => {
                CaptureFailure::transient(what)
            }
            _ => CaptureFailure::permanent(what),
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
    /// Writes a truncation of `table` at `epoch` into every partition (docs/WIRE.md "Truncate").
    fn truncate(&mut self, table: TableIndex, epoch: Epoch) -> Result<(), CaptureFailure>;
    /// Announces a row-schema version starting at `from_epoch` (durably, before the barrier into
    /// it) and writes the changes after that barrier with it (docs/WIRE.md "Schema changes").
    fn announce_schema(
        &mut self,
        table: TableIndex,
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
            Action::Truncate { table, epoch } => {
                stats.changes += 1;
                log.truncate(*table, *epoch)?
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
                table,
                from_epoch,
                row_schema,
            } => log.announce_schema(*table, *from_epoch, row_schema)?,
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
            SourceEvent::Change { .. }
            | SourceEvent::SchemaChange { .. }
            | SourceEvent::TablesAdded { .. }
            | SourceEvent::Truncate { .. } => {}
        }
        a.on_event(event, &mut actions)?;
        carry_out(a, &mut actions, repl, log, &mut stats, observer)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error whose text repeats its source's, as some clients' errors do.
    #[derive(Debug, thiserror::Error)]
    #[error("db error: {0}")]
    struct Repeats(#[source] std::io::Error);

    /// A failure keeps its cause as its `source` (typed, reachable), and the operator's line says
    /// what failed and every cause once.
    #[test]
    fn a_failure_keeps_its_cause_and_says_each_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
        let f = CaptureFailure::transient_from("reading the catalog", Repeats(io));
        assert!(f.is_transient());
        assert_eq!(f.to_string(), "reading the catalog");
        let source = std::error::Error::source(&f).expect("the cause is kept");
        assert!(source.downcast_ref::<Repeats>().is_some(), "{source:?}");
        assert_eq!(
            f.describe(),
            "reading the catalog: db error: connection reset"
        );
        let p = CaptureFailure::permanent("a change of table t, which the capture does not have");
        assert!(!p.is_transient());
        assert_eq!(
            p.describe(),
            "a change of table t, which the capture does not have"
        );
    }
}
