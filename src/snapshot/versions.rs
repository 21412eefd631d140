//! The schema versions folder beside a manifest (docs/WIRE.md "Schema changes"):
//! `<snapshot dir>/schema_versions/<fingerprint hex>.json`, one immutable file per later version of
//! a table's row schema, written (whole, by rename) before any record carries its fingerprint.
//!
//! This module reads and writes those files; which versions are valid and how rows resolve is
//! `codec::versions`'.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::codec::versions::{AnnouncedVersion, Evolution, SchemaChangeError};
use crate::codec::TableSchema;
use crate::core::Epoch;

/// The folder's name, beside `manifest.json`.
pub const VERSIONS_DIR: &str = "schema_versions";

/// One version file.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionFile {
    /// The table the version belongs to: required in a log of several tables, absent in a one-table
    /// log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    /// The first epoch whose changes are written with this version: the `curr_epoch` of a
    /// CHECKPOINT barrier after the snapshot epoch.
    pub from_epoch: Epoch,
    /// The row schema (an Avro record), as the manifest's `row_schema`.
    pub row_schema: serde_json::Value,
    /// The table's primary key: present in the versions of a table added to the log after its
    /// first snapshot (the first of them announces the table: docs/WIRE.md "Tables added"), absent
    /// otherwise. A release before tables could be added refuses a file with it, naming the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_key: Option<Vec<String>>,
}

/// Every version file of the snapshot in `dir` (none when the folder does not exist: a log
/// without schema changes, as every log before them).
pub fn read(dir: &Path) -> Result<Vec<AnnouncedVersion>, SchemaChangeError> {
    let folder = dir.join(VERSIONS_DIR);
    let entries = match std::fs::read_dir(&folder) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(SchemaChangeError::Bad {
                place: folder.display().to_string(),
                why: e.to_string(),
            })
        }
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| SchemaChangeError::Bad {
            place: folder.display().to_string(),
            why: e.to_string(),
        })?;
        let path = entry.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        // A file being written is `.<name>.tmp`; only whole `<fingerprint>.json` files count.
        let Some(fingerprint) = name.strip_suffix(".json") else {
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        let source = path.display().to_string();
        let bad = |why: String| SchemaChangeError::Bad {
            place: source.clone(),
            why,
        };
        let text = std::fs::read(&path).map_err(|e| bad(e.to_string()))?;
        let file: VersionFile = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
        out.push(AnnouncedVersion {
            source: source.clone(),
            table: file.table,
            from_epoch: file.from_epoch,
            row_schema: file.row_schema.to_string(),
            named_fingerprint: Some(fingerprint.to_string()),
            primary_key: file.primary_key,
        });
    }
    out.sort_by(|a, b| a.source.cmp(&b.source));
    Ok(out)
}

/// Writes a version file (a temporary file renamed into place, so a reader never sees half of
/// it) and returns its path. `fingerprint_hex` names it: the fingerprint of the log-record schema
/// with `file.row_schema`.
pub fn write(dir: &Path, fingerprint_hex: &str, file: &VersionFile) -> std::io::Result<PathBuf> {
    let folder = dir.join(VERSIONS_DIR);
    std::fs::create_dir_all(&folder)?;
    let path = folder.join(format!("{fingerprint_hex}.json"));
    let tmp = folder.join(format!(".{fingerprint_hex}.json.tmp"));
    std::fs::write(&tmp, serde_json::to_vec_pretty(file)?)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Brings a versions folder up to date from elsewhere (`crate::snapshot::kafka::VersionsMirror`)
/// before it is read; the error says why it could not.
pub type SyncVersions = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The folder whose versions a snapshot in `dir` reads: its own; for a later snapshot of a capture
/// (`<snapshot.dir>/snapshots/<epoch>`, [`crate::snapshot::published`]) the first snapshot's
/// folder, beside whose manifest the capture announces every version of the log (those at or
/// before the later snapshot's epoch it holds already: `codec::versions`).
pub fn home(dir: &Path) -> PathBuf {
    match dir.parent() {
        Some(parent)
            if parent.file_name()
                == Some(std::ffi::OsStr::new(crate::snapshot::published::SNAPSHOTS)) =>
        {
            parent
                .parent()
                .map_or_else(|| dir.to_path_buf(), Path::to_path_buf)
        }
        _ => dir.to_path_buf(),
    }
}

/// The schema versions of the log whose snapshot is in `dir` (read from [`home`]`(dir)`) (its tables `tables`, named `names`),
/// re-read from the folder whenever the codec or a store needs a version it does not know; with
/// `sync`, the folder is brought up to date first (when it cannot be at a checkpoint's look, the
/// look says so in a warning and reads what the folder has).
pub fn evolution(
    dir: &Path,
    tables: Vec<TableSchema>,
    names: Vec<Option<String>>,
    snapshot_epoch: Epoch,
    sync: Option<SyncVersions>,
) -> Result<Arc<Evolution>, SchemaChangeError> {
    let dir = home(dir);
    let folder = dir.join(VERSIONS_DIR);
    let (load_sync, probe_sync) = (sync.clone(), sync);
    Ok(Arc::new(Evolution::new(
        tables,
        names,
        snapshot_epoch,
        Box::new(move || {
            if let Some(sync) = &load_sync {
                sync().map_err(|why| SchemaChangeError::Bad {
                    place: dir.join(VERSIONS_DIR).display().to_string(),
                    why,
                })?;
            }
            read(&dir)
        }),
        Box::new(move || {
            if let Some(sync) = &probe_sync {
                if let Err(e) = sync() {
                    tracing::warn!(folder = %folder.display(), error = %e, "bringing the schema versions up to date");
                }
            }
            std::fs::read_dir(&folder).map_or(0, |entries| {
                entries
                    .filter_map(Result::ok)
                    .filter(|e| {
                        let name = e.file_name();
                        let name = name.to_string_lossy();
                        name.ends_with(".json") && !name.starts_with('.')
                    })
                    .count()
            })
        }),
    )?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_later_snapshot_reads_the_versions_of_its_capture_folder() {
        let root = Path::new("/data/snap");
        assert_eq!(home(root), root);
        assert_eq!(home(&root.join("snapshots/4096")), root);
        // Only a folder directly under `snapshots` is a later snapshot.
        assert_eq!(home(&root.join("snapshots")), root.join("snapshots"));
        assert_eq!(home(&root.join("other/4096")), root.join("other/4096"));
    }
}
