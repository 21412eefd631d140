//! What a capture shows of itself: its report on the process's capture board (`/status`'s
//! `captures`), and the happenings it counts through a [`CaptureMeter`] (the service's metrics
//! implement it). The capture owns these types; the service reads and implements them, so the
//! capture never imports the service.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::core::capture::CaptureState;

use super::SessionStats;

/// What a capture of this process (`kafka-backfill capture`, `run --capture`) shows under
/// `/status`'s `captures`, updated at each checkpoint and on each state change.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CaptureReport {
    /// `starting`, `snapshot`, `streaming`, `retrying` or `stopped`.
    pub state: &'static str,
    /// The last committed (and acknowledged) source position: PostgreSQL's LSN text form, or
    /// MariaDB's `binlog-file:offset`.
    pub committed_lsn: String,
    /// The source's position as last heard, in the same form.
    pub source_lsn: String,
    /// WAL (or binlog) bytes between them ([`Positions::lag_bytes`]).
    pub lag_bytes: u64,
    /// Commit time (Unix ms) of the last source transaction read.
    pub last_source_commit_unix_ms: u64,
    pub checkpoints: u64,
    pub transactions: u64,
    pub changes: u64,
    pub last_error: Option<String>,
}

/// How a source's positions (the core's `Lsn`) read: PostgreSQL's WAL positions, or MariaDB's
/// binlog file number above the byte offset in it (`capture::mariadb::lsn`).
#[derive(Clone, Debug)]
pub enum Positions {
    Wal,
    /// `base`: the binlog's base name (`mariadb-bin`), for `mariadb-bin.000003:1234`.
    Binlog {
        base: String,
    },
}

impl Positions {
    /// `lsn` as an operator reads it.
    pub fn format(&self, lsn: u64) -> String {
        match self {
            Positions::Wal => super::pg::format_lsn(lsn),
            Positions::Binlog { base } => super::mariadb::format_lsn(base, lsn),
        }
    }

    /// The bytes from `committed` to `source` (0 when `source` is not past it): across binlog files, the bytes written to the source's file so far (a lower
    /// bound: the earlier files' sizes are not known here).
    pub fn lag_bytes(&self, committed: u64, source: u64) -> u64 {
        match self {
            Positions::Wal => source.saturating_sub(committed),
            Positions::Binlog { .. } if source >> 32 <= committed >> 32 => {
                source.saturating_sub(committed)
            }
            Positions::Binlog { .. } => source & 0xffff_ffff,
        }
    }
}

/// Job → its capture's report.
pub type CaptureBoard = Arc<Mutex<BTreeMap<String, CaptureReport>>>;

/// What a capture counts, told as it happens (the service's metrics implement it; tests may count).
pub trait CaptureMeter: Send + Sync {
    /// A checkpoint committed, with the source transactions and changes since the last one and
    /// the source's lag behind it ([`Positions::lag_bytes`]).
    fn committed(
        &self,
        job: &str,
        state: &CaptureState,
        stats: &SessionStats,
        transactions: u64,
        changes: u64,
        lag_bytes: u64,
    );
    /// A session failed transiently and will resume from the last checkpoint.
    fn restarted(&self, job: &str);
    /// One Kafka transaction commit (the state record's included) took `d`.
    fn commit_took(&self, job: &str, d: Duration);
    /// The capture of `job` starts: every series it will count exists from now, at 0.
    fn started(&self, job: &str);
    /// A snapshot of the running capture came to `outcome`; `took`: from its start to its
    /// publication (published ones only).
    fn snapshot(&self, job: &str, outcome: SnapshotOutcome, took: Option<Duration>);
}

/// What became of a snapshot of the running capture (the `outcome` label of
/// `kafka_backfill_capture_snapshots_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotOutcome {
    /// Copied, its barrier committed, its manifest written.
    Published,
    /// Its copy, publication or start failed, or its barrier did not commit: the next is taken
    /// at the next interval.
    Failed,
    /// Stored whole in its Kafka topic (`snapshot_storage = "kafka"`).
    Stored,
    /// Storing it in Kafka failed (tried again later).
    StoreFailed,
    /// Retired: no job reads it and newer ones are kept.
    Retired,
}

impl SnapshotOutcome {
    pub const ALL: [SnapshotOutcome; 5] = [
        SnapshotOutcome::Published,
        SnapshotOutcome::Failed,
        SnapshotOutcome::Stored,
        SnapshotOutcome::StoreFailed,
        SnapshotOutcome::Retired,
    ];

    pub fn label(self) -> &'static str {
        match self {
            SnapshotOutcome::Published => "published",
            SnapshotOutcome::Failed => "failed",
            SnapshotOutcome::Stored => "stored",
            SnapshotOutcome::StoreFailed => "store_failed",
            SnapshotOutcome::Retired => "retired",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Positions;

    #[test]
    fn lag_is_the_bytes_between_the_positions_and_never_below_zero() {
        let binlog = Positions::Binlog {
            base: "mariadb-bin".into(),
        };
        assert_eq!(Positions::Wal.lag_bytes(100, 350), 250);
        assert_eq!(Positions::Wal.lag_bytes(350, 100), 0);
        assert_eq!(binlog.lag_bytes((3 << 32) | 100, (3 << 32) | 350), 250);
        assert_eq!(binlog.lag_bytes((3 << 32) | 350, (3 << 32) | 100), 0);
        // Across a file's end: the bytes into the newer file (the older file's rest unknown).
        assert_eq!(binlog.lag_bytes((3 << 32) | 350, (4 << 32) | 40), 40);
        assert_eq!(binlog.lag_bytes((4 << 32) | 40, (3 << 32) | 350), 0);
    }
}
