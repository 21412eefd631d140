//! The pure core: everything that decides, nothing that does.
//!
//! This crate owns the domain (epochs, barriers, vnodes, progress), the per-worker state machine, the
//! supervisor's recreation policy and the retry policy. It performs no I/O, reads no clock and cannot
//! import the async runtime or the Kafka client (its only dependencies are serde, thiserror and
//! crc32fast): drivers feed it events and carry out its decisions. `tests/it/architecture.rs` also fails
//! on any use of files, sockets, threads or clocks here. The main crate re-exports it as
//! `kafka_backfill::core`.

pub mod barrier;
pub mod capture;
pub mod contract;
pub mod epoch;
pub mod error;
pub mod executor;
pub mod faults;
pub mod phase;
pub mod progress;
pub mod publication;
pub mod retention;
pub mod retry;
pub mod staging;
pub mod supervisor;
pub mod tables;
pub mod throughput;
pub mod vnode;

#[cfg(test)]
mod unit_tests;

pub use barrier::{Barrier, BarrierKind, Change, LogRecord, Op, Row, Truncate};
pub use epoch::{Epoch, Generation};
pub use error::{check_log_start, CoreError, LogStartGone, VNODE_BITMAP_UPDATE_IN_LOG_STORE};
pub use executor::{Executor, JobPolicy, JobSpec, LocalCheckpointPolicy, WorkerStatus};
pub use phase::{ClaimedPartition, Decision, Event, Phase, ScanId, ScanStart};
pub use progress::{
    Checkpoint, CheckpointCause, DeadLetter, JobProgress, Lease, PartitionProgress, RowMutation,
    VnodeProgress,
};
pub use supervisor::{RecreationPolicy, Supervisor, SupervisorConfig, Verdict, WorkerFailure};
pub use tables::{split_table_key, table_key, JobTables};
pub use throughput::{Adaptive, AdaptiveConfig, Rate, RateLimits, Throttle};
pub use vnode::{vnode_of, PartitionId, PartitionMap, Vnode, VnodeBitmap};
