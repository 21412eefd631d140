//! The pure core: everything that decides, nothing that does.
//!
//! This module owns the domain (epochs, barriers, vnodes, progress), the per-worker state machine and
//! the supervisor's recreation policy. It performs no I/O, reads no clock and imports neither the async
//! runtime nor the Kafka client: drivers feed it events and carry out its decisions. Keep it that way
//! — `tests/architecture.rs` fails on any use of them (or of files, sockets, threads or clocks) here.

pub mod barrier;
pub mod contract;
pub mod epoch;
pub mod error;
pub mod executor;
pub mod faults;
pub mod phase;
pub mod progress;
pub mod retry;
pub mod staging;
pub mod supervisor;
pub mod vnode;

pub use barrier::{Barrier, BarrierKind, Change, LogRecord, Op, Row};
pub use epoch::Epoch;
pub use error::{CoreError, VNODE_BITMAP_UPDATE_IN_LOG_STORE};
pub use executor::{Executor, JobSpec, LocalCheckpointPolicy, WorkerStatus};
pub use phase::{ClaimedPartition, Decision, Event, Phase, ScanId, ScanStart};
pub use progress::{
    Checkpoint, CheckpointCause, JobProgress, Lease, PartitionProgress, RowMutation, VnodeProgress,
};
pub use supervisor::{RecreationPolicy, Supervisor, SupervisorConfig, Verdict, WorkerFailure};
pub use vnode::{vnode_of, PartitionId, PartitionMap, Vnode, VnodeBitmap};
