//! The snapshots a running capture published beside its first one
//! (`<snapshot.dir>/snapshots/<epoch>/manifest.json`, docs/CAPTURE.md "Snapshots of a running
//! capture"), which one a job reads, and which may be retired. Owns that folder layout; must not
//! write it (the capture does: `crate::capture::snapshots`), except a job's reader mark.

use std::path::{Path, PathBuf};

use crate::core::Epoch;

/// The folder of the later snapshots, under a job's `snapshot.dir`.
pub const SNAPSHOTS: &str = "snapshots";

/// The folder, inside a later snapshot's, naming the jobs that read it (a file per job): the
/// capture does not retire a snapshot that a job reads.
pub const READERS: &str = "readers";

/// Records that `job` reads the later snapshot in `folder` (its store names that snapshot's
/// epoch, and a recreation reads it again): the capture keeps it while the file is there.
pub fn mark_reader(folder: &Path, job: &str) -> std::io::Result<()> {
    let readers = folder.join(READERS);
    std::fs::create_dir_all(&readers)?;
    std::fs::write(readers.join(job), b"")
}

/// Whether a job reads the later snapshot in `folder` ([`mark_reader`]).
pub fn has_readers(folder: &Path) -> bool {
    std::fs::read_dir(folder.join(READERS)).is_ok_and(|mut d| d.next().is_some())
}

/// The later snapshots under `dir` that may be retired to keep `keep` of them: all but the newest
/// `keep`, except those a job reads, oldest first.
pub fn retirable(dir: &Path, keep: usize) -> Vec<(Epoch, PathBuf)> {
    let mut later = later_snapshots(dir);
    later.truncate(later.len().saturating_sub(keep));
    later.retain(|(_, folder)| !has_readers(folder));
    later
}

/// The later snapshots published under `dir` (each folder named by its epoch, with its manifest;
/// a copy in progress is a hidden `.pending-…` folder and not listed), oldest first.
pub fn later_snapshots(dir: &Path) -> Vec<(Epoch, PathBuf)> {
    let mut found: Vec<(Epoch, PathBuf)> = std::fs::read_dir(dir.join(SNAPSHOTS))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("manifest.json").exists())
        .filter_map(|e| Some((Epoch(e.file_name().to_str()?.parse().ok()?), e.path())))
        .collect();
    found.sort();
    found
}

/// The snapshot folder a job of `dir` reads: the one at the epoch its store recorded, when the
/// job has started before (`recorded`); else the newest published (the least log to replay).
/// `None`: `dir` itself (no later snapshot, or the recorded epoch is not a later one).
pub fn choose(dir: &Path, recorded: Option<Epoch>) -> Option<(Epoch, PathBuf)> {
    let later = later_snapshots(dir);
    match recorded {
        Some(e) => later.into_iter().find(|(l, _)| *l == e),
        None => later.into_iter().next_back(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_job_reads_the_newest_and_a_started_one_its_own() {
        let dir = std::env::temp_dir().join(format!("kb-published-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (name, manifest) in [
            ("100", true),
            ("300", true),
            ("200", true),
            (".pending-0-1", true),
            ("400", false),
        ] {
            let d = dir.join(SNAPSHOTS).join(name);
            std::fs::create_dir_all(&d).unwrap();
            if manifest {
                std::fs::write(d.join("manifest.json"), "{}").unwrap();
            }
        }
        let epochs: Vec<u64> = later_snapshots(&dir).iter().map(|(e, _)| e.0).collect();
        assert_eq!(
            epochs,
            vec![100, 200, 300],
            "hidden and unpublished folders are not listed"
        );
        assert_eq!(choose(&dir, None).unwrap().0, Epoch(300));
        assert_eq!(
            choose(&dir, Some(Epoch(200))).unwrap().1,
            dir.join("snapshots/200")
        );
        assert_eq!(
            choose(&dir, Some(Epoch(7))),
            None,
            "the first snapshot's epoch"
        );
        assert_eq!(choose(&dir.join("none"), None), None);
        // Keeping two: 100 may go; 200 too unless a job reads it.
        let epochs = |v: Vec<(Epoch, PathBuf)>| v.iter().map(|(e, _)| e.0).collect::<Vec<_>>();
        assert_eq!(epochs(retirable(&dir, 1)), vec![100, 200]);
        mark_reader(&dir.join("snapshots/200"), "late").unwrap();
        assert_eq!(epochs(retirable(&dir, 1)), vec![100]);
        assert_eq!(epochs(retirable(&dir, 3)), Vec::<u64>::new());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
