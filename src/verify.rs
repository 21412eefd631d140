//! `kafka-backfill verify`: compares the materialised table with the upstream table at the committed
//! epoch, as the writer recorded it (`<out>/expected`, in the snapshot format).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};

use crate::codec::ColumnValue;
use crate::core::{Epoch, Vnode};
use crate::ports::SnapshotSource;
use crate::ports::StateStore;
use crate::snapshot::files::SnapshotFiles;

#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct VerifyReport {
    pub expected_epoch: Epoch,
    /// The smallest committed vnode epoch (`None` when nothing is committed).
    pub committed_epoch: Option<Epoch>,
    pub compared: u64,
    pub missing: u64,
    pub extra: u64,
    pub different: u64,
}

impl VerifyReport {
    pub fn clean(&self) -> bool {
        self.missing == 0
            && self.extra == 0
            && self.different == 0
            && self.committed_epoch == Some(self.expected_epoch)
    }
}

impl std::fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} rows compared: {} missing, {} extra, {} different; committed epoch {} (expected {}) — {}",
            self.compared,
            self.missing,
            self.extra,
            self.different,
            self.committed_epoch.map_or("none".to_string(), |e| e.to_string()),
            self.expected_epoch,
            if self.clean() { "clean" } else { "DIFFERENT" }
        )
    }
}

/// Compares `store`'s rows and progress with the expected table in `expected_dir`.
pub fn verify(store: &mut dyn StateStore, job: &str, expected_dir: &Path) -> Result<VerifyReport> {
    verify_table(store, job, expected_dir, None)
}

/// [`verify`] against table `table` of an expected folder of several tables (`None`: its only one).
pub fn verify_table(
    store: &mut dyn StateStore,
    job: &str,
    expected_dir: &Path,
    table: Option<&str>,
) -> Result<VerifyReport> {
    let expected = SnapshotFiles::open_table(expected_dir, table)
        .with_context(|| format!("opening {}", expected_dir.display()))?;
    let info = expected.info().clone();
    let mut want: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for v in 0..info.vnode_count as Vnode {
        for row in expected.scan(v, None)? {
            let row = row?;
            want.insert(row.key, row.value);
        }
    }
    compare(
        store,
        job,
        info.vnode_count,
        Some(info.snapshot_epoch),
        &want,
    )
    .map(|c| c.report)
}

/// The capture writing `job`'s topic: the job's own `[jobs.capture]`, or that of the job in `jobs`
/// capturing its topic.
fn capture_of<'a>(
    job: &'a crate::config::JobConfig,
    jobs: &'a [crate::config::JobConfig],
) -> Result<&'a crate::config::CaptureSection> {
    job.capture
        .as_ref()
        .or_else(|| {
            jobs.iter()
                .filter(|j| j.topic == job.topic)
                .find_map(|j| j.capture.as_ref())
        })
        .with_context(|| {
            format!(
                "job {} has no [jobs.capture] section, nor does any job capturing its topic {}",
                job.name, job.topic
            )
        })
}

/// Compares `store`'s rows with the captured source table as it is now (`capture` and the job
/// caught up, the source quiet): the rows the capture's type mapping makes of `SELECT *` must equal
/// the store's, byte for byte. The expected epoch is the store's own (the source has no epoch).
/// The capture is the job's own `[jobs.capture]` or, for a job reading one table of a log of
/// several, that of the job in `jobs` capturing its topic; the table is `snapshot.table`'s.
pub fn verify_against_source(
    store: &mut dyn StateStore,
    job: &crate::config::JobConfig,
    jobs: &[crate::config::JobConfig],
) -> Result<VerifyReport> {
    let c = capture_of(job, jobs)?;
    let tables = c
        .table_names()
        .map_err(|(key, m)| anyhow::anyhow!("capture.{key}: {m}"))?;
    let wanted = match &job.snapshot {
        crate::config::SnapshotConfig::Files { table: Some(t), .. } => Some(t.as_str()),
        _ => None,
    };
    let table = match wanted {
        None => &tables[0],
        Some(name) => tables.iter().find(|t| t.table == name).with_context(|| {
            format!(
                "job {}: snapshot.table {name:?} is none of the captured tables",
                job.name
            )
        })?,
    };
    let nulls_last = source_nulls_last(job, wanted, table == &tables[0])?;
    let want = crate::capture::read_source_table(c.source_url.expose(), table, &nulls_last)?;
    compare(store, &job.name, job.vnode_count, None, &want).map(|c| c.report)
}

/// The columns of the source table the job's log writes `[T, "null"]` (its newest version's,
/// read beside the job's snapshot: [`crate::capture::nulls_last_of`]), so the source's rows are
/// encoded as the log's.
fn source_nulls_last(
    job: &crate::config::JobConfig,
    name: Option<&str>,
    first: bool,
) -> Result<Vec<String>> {
    match &job.snapshot {
        crate::config::SnapshotConfig::Files { dir, .. } => {
            crate::capture::nulls_last_of(dir, name, first)
                .with_context(|| format!("job {}: reading its log's schema versions", job.name))
        }
        _ => Ok(Vec::new()),
    }
}

/// `verify` of a job of several tables (`store.tables`): one report per table (by its store name),
/// all from one read of the store — against the expected folder of several tables `expected`, or
/// against the source tables of the capture writing the job's topic (`expected = None`).
pub fn verify_several(
    store: &mut dyn StateStore,
    job: &crate::config::JobConfig,
    jobs: &[crate::config::JobConfig],
    tables: &[crate::store::StoreTable],
    expected: Option<&Path>,
) -> Result<Vec<(String, VerifyReport)>> {
    let mut want: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut expected_epoch = None;
    match expected {
        Some(dir) => {
            for t in tables {
                let e = SnapshotFiles::open_table(dir, Some(&t.source))
                    .with_context(|| format!("opening {}", dir.display()))?;
                expected_epoch = Some(e.info().snapshot_epoch);
                for v in 0..e.info().vnode_count as Vnode {
                    for row in e.scan(v, None)? {
                        let row = row?;
                        want.insert(crate::core::table_key(t.index, &row.key), row.value);
                    }
                }
            }
        }
        None => {
            let c = capture_of(job, jobs)?;
            let captured = c
                .table_names()
                .map_err(|(key, m)| anyhow::anyhow!("capture.{key}: {m}"))?;
            for t in tables {
                let source = captured
                    .iter()
                    .find(|c| c.table == t.source)
                    .with_context(|| {
                        format!(
                            "job {}: store.tables.{} is none of the captured tables",
                            job.name, t.source
                        )
                    })?;
                let nulls_last =
                    source_nulls_last(job, Some(t.source.as_str()), source == &captured[0])?;
                let url = c.source_url.expose();
                for (k, v) in crate::capture::read_source_table(url, source, &nulls_last)? {
                    want.insert(crate::core::table_key(t.index, &k), v);
                }
            }
        }
    }
    let whole = compare(store, &job.name, job.vnode_count, expected_epoch, &want)?;
    Ok(tables
        .iter()
        .map(|t| {
            let of =
                |k: &Vec<u8>| crate::core::split_table_key(k).is_some_and(|(i, _)| i == t.index);
            let mut r = VerifyReport {
                expected_epoch: whole.report.expected_epoch,
                committed_epoch: whole.report.committed_epoch,
                ..Default::default()
            };
            for (k, v) in want.iter().filter(|(k, _)| of(k)) {
                r.compared += 1;
                match whole.have.get(k) {
                    None => r.missing += 1,
                    Some(h) if h != v => r.different += 1,
                    Some(_) => {}
                }
            }
            r.extra = whole
                .have
                .keys()
                .filter(|k| of(k) && !want.contains_key(*k))
                .count() as u64;
            (t.name.clone(), r)
        })
        .collect())
}

/// What [`compare`] read, with its report.
struct Compared {
    report: VerifyReport,
    have: BTreeMap<Vec<u8>, Vec<u8>>,
}

fn compare(
    store: &mut dyn StateStore,
    job: &str,
    vnode_count: u32,
    expected_epoch: Option<Epoch>,
    want: &BTreeMap<Vec<u8>, Vec<u8>>,
) -> Result<Compared> {
    let have = store.rows(job)?;
    // A table without `_kb_row` rebuilds each datum from its typed columns: two rows whose bytes
    // differ are the same row when their column values are (a double by value: SQLite holds −0.0
    // as 0.0; every NaN is NaN).
    let by_values = store.datumless_table();
    let same = |h: &Vec<u8>, v: &Vec<u8>| {
        h == v
            || by_values
                .as_ref()
                .is_some_and(|t| match (t.column_values(h), t.column_values(v)) {
                    (Ok(a), Ok(b)) => {
                        a.len() == b.len()
                            && a.iter().zip(&b).all(|(x, y)| match (x, y) {
                                (ColumnValue::Real(p), ColumnValue::Real(q)) => {
                                    p == q || (p.is_nan() && q.is_nan())
                                }
                                (x, y) => x == y,
                            })
                    }
                    _ => false,
                })
    };
    let progress = store.committed_vnodes(job)?;
    let committed_epoch = if progress.len() == vnode_count as usize {
        progress.values().map(|p| p.epoch).min()
    } else {
        None
    };
    let mut r = VerifyReport {
        // Against the source, the epoch the rows were read at (read once with them: a second read
        // of the progress races the job's next commit, and a large table never verified clean).
        expected_epoch: expected_epoch.or(committed_epoch).unwrap_or_default(),
        committed_epoch,
        ..Default::default()
    };
    for (k, v) in want {
        r.compared += 1;
        match have.get(k) {
            None => r.missing += 1,
            Some(h) if !same(h, v) => r.different += 1,
            Some(_) => {}
        }
    }
    r.extra = have.keys().filter(|k| !want.contains_key(*k)).count() as u64;
    Ok(Compared { report: r, have })
}
