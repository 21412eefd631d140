//! kafka-backfill: backfill a table from a snapshot plus a Kafka change log, then keep it streaming.
//!
//! See docs/ARCHITECTURE.md for the codemap and the invariants, docs/DESIGN.md for the contract.

/// The process allocator: mimalloc. Rows are allocated on a worker thread (fetch, decode, staging)
/// and freed on its committer thread; with glibc's malloc those cross-thread frees contend on arena
/// locks. Measured on the same 1.5M-record replay and 1M-row snapshot (`docs/BENCHMARKS.md`, "What
/// moved each figure"): log-store phase 4.8–5.0 s with glibc, 2.5–3.1 s with mimalloc; snapshot
/// phase 3.5–3.9 s vs 1.5 s; peak RSS about 35 MiB higher. Every binary linking this crate (the
/// service, tests, the benchmark) uses it.
///
/// Built with mimalloc's `no_thp` (Cargo.toml): its arenas are not advised into transparent huge
/// pages, where one touched 4 KiB page makes a 2 MiB page resident (36 MiB of a 4-partition replay's
/// 135 MiB peak RSS were huge pages). Without them the same replay peaks 9–17 MiB lower at the same
/// speed (docs/BENCHMARKS.md, "The outside check, in-repo").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod capture;
pub mod check_log;
pub mod codec;
pub mod config;
/// The pure core (the `kafka-backfill-core` crate, `crates/core`): every decision, no I/O.
pub use kafka_backfill_core as core;
pub mod demo;
pub mod driver;
pub mod error;
pub mod kafka;
pub mod pg_tls;
pub mod ports;
pub mod retry;
pub mod rng;
pub mod service;
pub mod shutdown;
#[cfg(any(test, feature = "testing"))]
pub mod sim;
pub mod snapshot;
pub mod store;
pub mod verify;
pub mod workload;
