//! Snapshot sources (`crate::ports::SnapshotSource`): Avro container files with a manifest
//! (`files`, written by `produce`) and a PostgreSQL table (`postgres`, written by `export-snapshot`).

pub mod files;
pub mod postgres;
pub mod versions;
