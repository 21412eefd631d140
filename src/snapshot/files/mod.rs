//! The snapshot as Avro object container files plus `manifest.json` (docs/DESIGN.md §3).
//!
//! The writer (`produce`) writes one file per vnode, rows sorted by key bytes, codec `null`. The
//! reader takes any layout `schemas/snapshot_manifest.schema.json` allows: a file may hold many
//! vnodes (rows grouped or interleaved, in any order), a vnode may be spread over several files, the
//! files may be listed in any order, and blocks may use the codecs `null`, `deflate`, `snappy` or
//! `zstandard`. A vnode's scan gathers its rows from every file that lists it, sorts them by key
//! bytes and resumes strictly after the cursor, so resuming is exact in every layout. Each file's
//! header schema must be the manifest's `row_schema` (compared in Avro's Parsing Canonical Form).
//!
//! Rows are handed on as datum bytes without building values; any Avro tool reads the files
//! (`tests` reads one with apache-avro).
//!
//! Memory is bounded by a vnode, not by a file: files are read block by block, never whole. A file
//! that lists one vnode is read straight into that vnode's scan. A file that lists several is read
//! once, the first time one of its vnodes is scanned, and its rows are *spilled* — appended, as they
//! come, to at most [`SPILL_BUCKETS`] bucket files (a vnode's rows all in bucket `vnode mod
//! buckets`) in a private folder under the system's temporary directory (`TMPDIR`), removed when
//! the snapshot is dropped. A vnode's scan then reads only its bucket, keeps only its own rows and
//! sorts them: peak memory is about one vnode's rows whatever the file's size (`docs/BENCHMARKS.md`,
//! the single-file snapshot).
//!
//! Here: the manifest and what reads or writes it; `write` the container files, `sort` the
//! capture's bounded sort of a snapshot by vnode, `read` the reader; each file owns one of them.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::codec::varint::{get_long, put_long};
use crate::codec::{CodecError, TableSchema};
use crate::core::{vnode_of, Epoch, PartitionProgress, Row, Vnode};
use crate::ports::{RowIter, SnapshotInfo, SnapshotSource, SourceError};

mod read;
mod sort;
mod write;

pub use read::*;
pub use sort::*;
pub use write::*;

pub(super) const MAGIC: &[u8; 4] = b"Obj\x01";
pub(super) const ROWS_PER_BLOCK: usize = 4096;
/// Bucket files a multi-vnode file is spilled into, at most (one open file each while spilling).
pub const SPILL_BUCKETS: usize = 256;

/// `manifest.json`, exactly as `schemas/snapshot_manifest.schema.json` describes it (the tests
/// validate both ways).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// `Es`, RisingWave's epoch layout.
    pub snapshot_epoch: Epoch,
    pub vnode_count: u32,
    pub partition_count: u32,
    /// The log topic the snapshot belongs to: informational (the job's `topic` is what is read);
    /// absent = not stated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// The row schema (the container files' schema).
    pub row_schema: serde_json::Value,
    /// The primary-key fields, in key order (the key bytes concatenate their encodings).
    pub primary_key: Vec<String>,
    pub files: Vec<ManifestFile>,
    /// Per partition: the offset just after the barrier with `prev = Es`, and that barrier's `curr`.
    pub start: Vec<ManifestStart>,
}

/// `manifest.json` of a log carrying several tables (docs/WIRE.md, "Several tables"): the tables
/// share the snapshot epoch, the vnode map and the start offsets; each has its own row schema,
/// primary key and files. A one-table [`Manifest`] is the same log with one table.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TablesManifest {
    pub snapshot_epoch: Epoch,
    pub vnode_count: u32,
    pub partition_count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// The log's tables, in the order that numbers them (a change's table is found by its writer
    /// schema's fingerprint).
    pub tables: Vec<ManifestTable>,
    pub start: Vec<ManifestStart>,
    /// Tables the capture removed before this snapshot (docs/CAPTURE.md "Removing a table"): not
    /// in `tables`, and the log has none of their changes from `from_epoch` on. Named so that a
    /// job of one is told why its table is missing. Absent when none (and in manifests of
    /// releases before it, which read it as an unknown key they ignore).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<ManifestRemoved>,
}

/// A table a capture removed ([`TablesManifest::removed`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ManifestRemoved {
    /// The table's name as `tables[].name` had it (what a job names in `snapshot.table`).
    pub name: String,
    /// The epoch from which the log has none of its changes.
    pub from_epoch: Epoch,
}

/// One table of a [`TablesManifest`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ManifestTable {
    /// The table's name: what a job names in `snapshot.table`, and its store table by default.
    pub name: String,
    pub row_schema: serde_json::Value,
    pub primary_key: Vec<String>,
    pub files: Vec<ManifestFile>,
}

impl TablesManifest {
    /// The one-table manifest of table `index` (what a job of that table reads).
    pub fn table_view(&self, index: usize) -> Manifest {
        let t = &self.tables[index];
        Manifest {
            snapshot_epoch: self.snapshot_epoch,
            vnode_count: self.vnode_count,
            partition_count: self.partition_count,
            topic: self.topic.clone(),
            row_schema: t.row_schema.clone(),
            primary_key: t.primary_key.clone(),
            files: t.files.clone(),
            start: self.start.clone(),
        }
    }
}

/// A table of the log a snapshot folder describes: its name and row schema.
#[derive(Clone, Debug)]
pub struct LogTable {
    pub name: String,
    pub schema: TableSchema,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ManifestFile {
    /// Relative to the manifest's folder.
    pub path: String,
    /// The vnodes whose rows the file holds (any order; a vnode may be listed by several files).
    pub vnodes: Vec<Vnode>,
    /// Rows in the file (informational).
    pub rows: u64,
}

/// Where a partition's log starts: the offset just after the barrier with `prev = Es`, and that
/// barrier's `curr`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ManifestStart {
    pub partition: crate::core::PartitionId,
    pub next_offset: u64,
    pub epoch: Epoch,
}

impl From<&PartitionProgress> for ManifestStart {
    fn from(p: &PartitionProgress) -> Self {
        ManifestStart {
            partition: p.partition,
            next_offset: p.next_offset,
            epoch: p.epoch,
        }
    }
}

impl From<&ManifestStart> for PartitionProgress {
    fn from(s: &ManifestStart) -> Self {
        PartitionProgress {
            partition: s.partition,
            next_offset: s.next_offset,
            epoch: s.epoch,
            streaming: false,
        }
    }
}

/// The `snapshot_epoch` of the manifest in `folder`, without opening the snapshot; `None` when
/// there is no manifest or it does not say (a folder being written, or not a snapshot's).
pub fn manifest_epoch(folder: &Path) -> Option<crate::core::Epoch> {
    manifest_head(folder).map(|h| h.snapshot_epoch)
}

/// What a manifest says of where its snapshot stands, read without the rest.
#[derive(serde::Deserialize)]
pub(super) struct ManifestHead {
    snapshot_epoch: Epoch,
    #[serde(default)]
    start: Vec<ManifestStart>,
}

pub(super) fn manifest_head(folder: &Path) -> Option<ManifestHead> {
    let text = std::fs::read(folder.join("manifest.json")).ok()?;
    serde_json::from_slice(&text).ok()
}

/// The snapshot epoch of the manifest in `folder` and its start offsets by partition (index =
/// partition), without opening the snapshot; `None` as for [`manifest_epoch`].
pub fn manifest_starts(folder: &Path) -> Option<(Epoch, Vec<u64>)> {
    let mut head = manifest_head(folder)?;
    head.start.sort_by_key(|s| s.partition);
    let offsets = head.start.iter().map(|s| s.next_offset).collect();
    Some((head.snapshot_epoch, offsets))
}

/// Atomically: written to a temporary file, synced, renamed over `manifest.json`, the folder synced
/// (a reader sees the old manifest or the whole new one, never part of one).
pub fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<PathBuf, SourceError> {
    write_manifest_json(dir, manifest)
}

pub(super) fn write_manifest_json(
    dir: &Path,
    manifest: &impl serde::Serialize,
) -> Result<PathBuf, SourceError> {
    use std::io::Write;
    let path = dir.join("manifest.json");
    let tmp = dir.join(".manifest.json.tmp");
    let json = serde_json::to_vec_pretty(manifest).expect("manifest serialises");
    let mut f = fs::File::create(&tmp).map_err(|e| file_err(&tmp, e))?;
    f.write_all(&json)
        .and_then(|()| f.sync_all())
        .map_err(|e| file_err(&tmp, e))?;
    fs::rename(&tmp, &path).map_err(|e| file_err(&path, e))?;
    if let Ok(d) = fs::File::open(dir) {
        d.sync_all().map_err(|e| file_err(dir, e))?;
    }
    Ok(path)
}

pub(super) fn sync_marker(seed: Vnode) -> [u8; 16] {
    let mut s = [0u8; 16];
    let x = crc32fast::hash(&seed.to_le_bytes()).to_le_bytes();
    for (i, b) in s.iter_mut().enumerate() {
        *b = x[i % 4] ^ (i as u8).wrapping_mul(37);
    }
    s
}

pub(super) fn file_err(path: &Path, e: impl std::fmt::Display) -> SourceError {
    SourceError::File {
        file: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// A multi-vnode file spilled into bucket files: vnode `v`'s rows are all in bucket `v % buckets`,
/// each row as `vnode u32, key length u32, key, datum length u32, datum` (little-endian).
pub(super) struct Spill {
    dir: PathBuf,
    buckets: usize,
}

impl Spill {
    fn bucket(&self, vnode: Vnode) -> PathBuf {
        self.dir
            .join(format!("bucket-{:05}.rows", vnode as usize % self.buckets))
    }
}

/// The tables of a several-table manifest, checked: names unique and usable as table names, row
/// records of distinct full names (so their writer schemas' fingerprints differ).
pub(super) fn log_tables(m: &TablesManifest, mpath: &Path) -> Result<Vec<LogTable>, SourceError> {
    if m.tables.is_empty() {
        return Err(file_err(mpath, "invalid manifest: `tables` is empty"));
    }
    let mut out: Vec<LogTable> = Vec::with_capacity(m.tables.len());
    // Each table's writer-schema fingerprint, computed once: comparing every pair by building its
    // codec again made opening a 200-table snapshot take minutes (quadratic, once per table).
    let mut fingerprints: std::collections::HashMap<String, usize> =
        std::collections::HashMap::with_capacity(m.tables.len());
    for (i, t) in m.tables.iter().enumerate() {
        let schema = TableSchema::parse(&t.row_schema.to_string(), &t.primary_key)
            .map_err(|e| file_err(mpath, format!("tables[{i}] ({}): {e}", t.name)))?;
        crate::ports::check_table_name(&t.name)
            .map_err(|e| file_err(mpath, format!("tables[{i}].name: {e}")))?;
        if let Some(o) = out.iter().find(|o| o.name == t.name) {
            return Err(file_err(
                mpath,
                format!("tables[{i}]: table {} is named twice", o.name),
            ));
        }
        let fingerprint = crate::codec::LogCodec::new(schema.clone())
            .map_err(|e| file_err(mpath, format!("tables[{i}] ({}): {e}", t.name)))?
            .fingerprint_hex();
        if let Some(&o) = fingerprints.get(&fingerprint) {
            return Err(file_err(
                mpath,
                format!(
                    "tables[{i}] ({}) and table {} have one writer schema (fingerprint {fingerprint}): a change's table is told by it, so give each table's row record its own full name",
                    t.name, out[o].name
                ),
            ));
        }
        fingerprints.insert(fingerprint, i);
        out.push(LogTable {
            name: t.name.clone(),
            schema,
        });
    }
    Ok(out)
}

pub(super) fn names(tables: &[LogTable]) -> String {
    tables
        .iter()
        .map(|t| t.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Writes a several-table `manifest.json` (atomically, as [`write_manifest`]).
pub fn write_tables_manifest(
    dir: &Path,
    manifest: &TablesManifest,
) -> Result<PathBuf, SourceError> {
    write_manifest_json(dir, manifest)
}

/// Spill folders get distinct names within a process.
static SPILL_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[cfg(test)]
mod tests;
