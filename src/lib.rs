//! kafka-backfill: backfill a table from a snapshot plus a Kafka change log, then keep it streaming.
//!
//! See README.md, "Architecture", for the codemap and the invariants.

/// The process allocator: mimalloc. Rows are allocated on a worker thread (fetch, decode, staging)
/// and freed on its committer thread; glibc's malloc serialised those cross-thread frees on one arena
/// lock, and the worker spent most of its off-CPU time waiting for it (`docs/BENCHMARKS.md`,
/// "What the profile says"). Every binary linking this crate (the service, tests, the benchmark)
/// uses it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod check_log;
pub mod codec;
/// The pure core (the `kafka-backfill-core` crate, `crates/core`): every decision, no I/O.
pub use kafka_backfill_core as core;
pub mod demo;
pub mod driver;
pub mod kafka;
pub mod pg_tls;
pub mod ports;
pub mod retry;
pub mod rng;
pub mod service;
#[cfg(any(test, feature = "testing"))]
pub mod sim;
pub mod snapshot;
pub mod store;
pub mod verify;
pub mod workload;
