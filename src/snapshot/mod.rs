//! Snapshot sources (`crate::ports::SnapshotSource`): Avro container files with a manifest
//! (`files`, written by `produce`) and a PostgreSQL table (`postgres`, written by `export-snapshot`),
//! and several tables of one snapshot scanned as one (`tables`); the later snapshots of a running
//! capture beside the first (`published`); snapshot folders stored in and restored from Kafka (`kafka`).

pub mod files;
pub mod kafka;
pub mod postgres;
pub mod published;
pub mod tables;
pub mod versions;
