//! What every source's capture session shares (PostgreSQL's in `job.rs`, MariaDB's in
//! `mariadb/job.rs`): the progress a session reports (board, meter, logs), the pending manifest
//! and its publication, the bounded retry of transient failures, the log topic's partitions, a
//! session's Kafka log opened (fencing) and ended (aborted within a bound), and the row schema in
//! force at a resume epoch. It owns no source: it must not import a source's module, so both
//! sources' sessions import it and neither imports the other.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::log::{read_state, KafkaLog, StateRecord};
use super::report::{CaptureBoard, CaptureMeter, CaptureReport, Positions};
use super::{CaptureFailure, CaptureObserver, SessionStats};
use crate::codec::{LogCodec, TableSchema};
use crate::config::JobConfig;
use crate::core::capture::CaptureState;
use crate::core::{Epoch, PartitionMap};
use crate::shutdown::{wait_blocking, CancellationToken};
use crate::snapshot::files::{write_manifest, write_tables_manifest, Manifest, TablesManifest};

/// The wall clock in Unix milliseconds (0 before 1970): the capture's epochs and lag.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub(in crate::capture) const PENDING_MANIFEST: &str = "manifest.pending.json";

pub(in crate::capture) struct Progress {
    job: String,
    last_log_ms: u64,
    /// The session totals last counted (a new session starts again from zero).
    counted: SessionStats,
    board: CaptureBoard,
    pub(in crate::capture) meter: Arc<dyn CaptureMeter>,
    /// Told each time a session finds the snapshot published (`manifest.json` written).
    pub(in crate::capture) published: Option<Published>,
    /// How the source's positions read (set by the MariaDB capture).
    pub(in crate::capture) positions: Positions,
}

/// Tells [`InProcess::start`] that a job's capture has published its snapshot.
#[derive(Clone)]
pub struct Published {
    pub(in crate::capture) job: String,
    pub(in crate::capture) tx: mpsc::Sender<Started>,
}

impl Published {
    pub(in crate::capture) fn tell(&self) {
        // The receiver is gone once every job it waited for has started: nothing is listening.
        let _ = self.tx.send(Started::Published(self.job.clone()));
    }
}

/// What [`InProcess::start`] waits for, per job.
pub(in crate::capture) enum Started {
    Published(String),
    Stopped(String),
}

impl Progress {
    pub(in crate::capture) fn new(
        job: &JobConfig,
        board: CaptureBoard,
        meter: Arc<dyn CaptureMeter>,
        published: Option<Published>,
    ) -> Progress {
        Progress {
            job: job.name.clone(),
            last_log_ms: 0,
            counted: SessionStats::default(),
            board,
            meter,
            published,
            positions: Positions::Wal,
        }
    }

    /// The hook of a fresh capture's first commit: `manifest.json` written into `dir` from the
    /// pending one, and the publication told.
    pub(in crate::capture) fn publish_on_initial_commit(
        &self,
        dir: &Path,
    ) -> super::log::InitialCommitHook {
        let (dir, published) = (dir.to_path_buf(), self.published.clone());
        Box::new(move |r: &StateRecord| {
            finish_manifest(&dir, r)?;
            if let Some(p) = &published {
                p.tell();
            }
            Ok(())
        })
    }

    pub(in crate::capture) fn set(&self, f: impl FnOnce(&mut CaptureReport)) {
        let mut b = self.board.lock().unwrap();
        f(b.entry(self.job.clone()).or_default());
    }
}

impl CaptureObserver for Progress {
    fn committed(&mut self, state: &CaptureState, stats: &SessionStats) {
        // Each commit of a session counts one more checkpoint: a count not past the last one
        // told is a new session's, whose counts start again from 0.
        if stats.checkpoints <= self.counted.checkpoints {
            self.counted = SessionStats::default();
        }
        let (transactions, changes) = (
            stats.transactions - self.counted.transactions,
            stats.changes - self.counted.changes,
        );
        let source = stats.source_lsn.max(state.lsn);
        let lag_bytes = self.positions.lag_bytes(state.lsn, source);
        self.meter
            .committed(&self.job, state, stats, transactions, changes, lag_bytes);
        let (committed, source) = (
            self.positions.format(state.lsn),
            self.positions.format(source),
        );
        self.set(|r| {
            r.state = "streaming";
            r.committed_lsn = committed.clone();
            r.source_lsn = source;
            r.lag_bytes = lag_bytes;
            if stats.last_source_commit_ms > 0 {
                r.last_source_commit_unix_ms = stats.last_source_commit_ms;
            }
            r.checkpoints = state.checkpoints;
            r.transactions += transactions;
            r.changes += changes;
        });
        self.counted = *stats;
        let now = unix_ms();
        tracing::debug!(job = %self.job, lsn = %committed, epoch = state.epoch.0, checkpoint = state.checkpoints, "capture checkpoint committed");
        if now.saturating_sub(self.last_log_ms) >= 10_000 || state.checkpoints <= 1 {
            self.last_log_ms = now;
            tracing::info!(
                job = %self.job,
                lsn = %committed,
                epoch = state.epoch.0,
                checkpoints = state.checkpoints,
                transactions = stats.transactions,
                changes = stats.changes,
                "capture progress"
            );
        }
    }
}

/// Writes `bytes` to `path` and syncs it (the pending manifest must outlive a crash after the
/// initial transaction's commit).
pub(in crate::capture) fn write_durably(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

/// Writes `manifest.json` from the pending manifest and the state record's start offsets.
pub(in crate::capture) fn finish_manifest(dir: &Path, record: &StateRecord) -> Result<()> {
    let pending = dir.join(PENDING_MANIFEST);
    let bytes =
        std::fs::read(&pending).with_context(|| format!("reading {}", pending.display()))?;
    // The initial barrier's `curr`, which the first state recorded; later states moved on, so it
    // is the successor of the snapshot epoch the initial barrier named.
    let start = super::snapshots::start_after(&record.start_offsets, record.initial_epoch);
    let not_a_manifest = || format!("{}: not a manifest", pending.display());
    if record.other_tables.is_empty() {
        let mut manifest: Manifest = serde_json::from_slice(&bytes).with_context(not_a_manifest)?;
        manifest.start = start;
        write_manifest(dir, &manifest)?;
    } else {
        let mut manifest: TablesManifest =
            serde_json::from_slice(&bytes).with_context(not_a_manifest)?;
        manifest.start = start;
        write_tables_manifest(dir, &manifest)?;
    }
    std::fs::remove_file(&pending).with_context(|| format!("removing {}", pending.display()))?;
    Ok(())
}

/// A resumed capture's first snapshot on this disk: `manifest.json` written from the pending one,
/// or (Kafka storage, and this disk is not the one the capture wrote to) the first snapshot
/// restored from its topic (its schema is what the stream resumes with; a job of this process may
/// read it).
pub(in crate::capture) fn first_snapshot_here(
    job: &str,
    props: &BTreeMap<String, String>,
    dir: &Path,
    record: &StateRecord,
) -> Result<(), CaptureFailure> {
    if dir.join("manifest.json").exists() {
        return Ok(());
    }
    match &record.snapshot_topic {
        Some(topic) if !dir.join(PENDING_MANIFEST).exists() => {
            let moved = crate::snapshot::kafka::restore(props, topic, dir, &|_| true)
                .map_err(transient("restoring the first snapshot from Kafka"))?;
            tracing::info!(job, %topic, bytes = moved.bytes, seconds = moved.seconds, "the first snapshot restored from Kafka (its folder was not on this disk)");
            Ok(())
        }
        _ => finish_manifest(dir, record)
            .map_err(|e| CaptureFailure::permanent(crate::error::line(&e))),
    }
}

/// Kafka storage: the versions announced since the first snapshot was stored, from
/// `<topic>.schema-versions` into `dir` (a disk that is not the one the capture wrote to has none
/// of them).
pub(in crate::capture) fn sync_versions(
    props: &BTreeMap<String, String>,
    topic: &str,
    dir: &Path,
) -> Result<(), CaptureFailure> {
    crate::snapshot::kafka::VersionsMirror::new(props, topic, dir)
        .and_then(|mut m| m.sync())
        .map(drop)
        .map_err(transient("reading the schema versions from Kafka"))
}

/// How long transient failures are retried without a checkpoint committed before the capture
/// gives up (a broker or database outage shorter than this is ridden out).
pub(in crate::capture) const RETRY_FOR: Duration = Duration::from_secs(180);

/// Runs `session` again after each transient failure, with backoff, until it stops at a
/// checkpoint, fails for good, or commits no checkpoint for [`RETRY_FOR`]. `session` gets the
/// progress and a slot for the checkpoint counts at its start and end.
pub(in crate::capture) fn retry(
    job: &JobConfig,
    names: &str,
    stop: &CancellationToken,
    progress: &mut Progress,
    mut session: impl FnMut(
        &mut Progress,
        &mut (Option<u64>, Option<u64>),
    ) -> Result<(), CaptureFailure>,
) -> Result<()> {
    let mut failures = 0u32;
    let mut last_progress = std::time::Instant::now();
    loop {
        let mut checkpoints = (None, None);
        match session(progress, &mut checkpoints) {
            Ok(()) => {
                tracing::info!(job = %job.name, "capture stopped at a checkpoint");
                return Ok(());
            }
            Err(e @ CaptureFailure::Permanent { .. }) => {
                // One line, each cause said once (`describe`).
                bail!(
                    "capture of {} for job {} stopped: {}",
                    names,
                    job.name,
                    e.describe()
                )
            }
            Err(e @ CaptureFailure::Transient { .. }) => {
                let e = e.describe();
                if checkpoints.1 > checkpoints.0 {
                    failures = 0;
                    last_progress = std::time::Instant::now();
                }
                failures += 1;
                if last_progress.elapsed() > RETRY_FOR {
                    bail!(
                        "capture of {} for job {}: no checkpoint committed for {} s of retries, the last failure: {e}",
                        names,
                        job.name,
                        RETRY_FOR.as_secs()
                    );
                }
                progress.meter.restarted(&job.name);
                let backoff = Duration::from_millis((100u64 << failures.min(6)).min(5_000));
                tracing::warn!(job = %job.name, error = %e, attempt = failures, backoff_ms = backoff.as_millis() as u64, "capture session failed; resuming from the last committed state");
                // Waits out the backoff, or stops at once when asked to.
                if wait_blocking(stop, backoff) {
                    tracing::info!(job = %job.name, "capture stopped while retrying");
                    return Ok(());
                }
            }
        }
    }
}

/// The log topic's partitions (the topic created with `capture.partitions` when absent) and the
/// vnodes' map onto them.
pub(in crate::capture) fn log_partitions(
    job: &JobConfig,
    props: &BTreeMap<String, String>,
) -> Result<(u32, PartitionMap)> {
    let c = job.capture.as_ref().context("no [jobs.capture]")?;
    let partitions = match crate::kafka::admin::partition_count(props, &job.topic)? {
        Some(n) => n,
        None => {
            crate::kafka::admin::ensure_topic(props, &job.topic, c.partitions)?;
            c.partitions
        }
    };
    let map = PartitionMap::new(job.vnode_count, partitions)
        .with_context(|| format!("topic {} against vnode_count", job.topic))?;
    Ok((partitions, map))
}

pub(in crate::capture) fn transient(
    what: &str,
) -> impl FnOnce(anyhow::Error) -> CaptureFailure + '_ {
    move |e| CaptureFailure::transient_from(what, e)
}

/// A session's Kafka log, connected (which fences every older producer of the job), its commit
/// times told to the meter and its snapshot folder set, and the state Kafka really committed
/// (none on a fresh start). Both sources' sessions start here.
pub(in crate::capture) fn open_log(
    job: &JobConfig,
    props: &BTreeMap<String, String>,
    partitions: u32,
    schemas: &[TableSchema],
    template: StateRecord,
    progress: &Progress,
    dir: &Path,
) -> Result<(KafkaLog, Option<StateRecord>), CaptureFailure> {
    let codecs = schemas
        .iter()
        .map(|t| LogCodec::new(t.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CaptureFailure::permanent(e.to_string()))?;
    let mut log = KafkaLog::connect(props, &job.name, &job.topic, partitions, codecs, template)
        .map_err(transient("connecting to Kafka"))?;
    let (name, meter) = (job.name.clone(), progress.meter.clone());
    log.on_commit = Some(Box::new(move |d| meter.commit_took(&name, d)));
    log.snapshot_dir = Some(dir.to_path_buf());
    let committed = read_state(props, &job.topic, &job.name)
        .map_err(transient("reading the capture's state"))?;
    Ok((log, committed))
}

/// Ends a session with its loop's `result`: after a failure the open Kafka transaction is aborted
/// within a bound (nothing past the last checkpoint is committed, and the next session's producer
/// would abort it anyway, so the wait is short).
pub(in crate::capture) fn end_session<T>(
    job: &JobConfig,
    log: &mut KafkaLog,
    result: Result<T, CaptureFailure>,
) -> Result<(), CaptureFailure> {
    if result.is_err() {
        if let Err(abort) = log.abort_within(super::log::ABORT_AFTER_FAILURE) {
            tracing::warn!(job = %job.name, error = %abort, "aborting the open Kafka transaction");
        }
    }
    result.map(|_| ())
}

/// The row schema (Avro JSON) of captured table `t` in force at `epoch`: the last version
/// announced into `dir` for it from an epoch at or before it, else the manifest's, else `catalog`
/// (a capture whose manifest is not written yet). `name`: the table's name in the manifest of a
/// capture of several tables (its versions name it), `None` for one table. Both sources resume
/// with it.
pub(in crate::capture) fn schema_in_force(
    dir: &Path,
    t: usize,
    name: Option<&str>,
    epoch: Epoch,
    catalog: &str,
) -> Result<String, CaptureFailure> {
    let permanent = |e: String| CaptureFailure::permanent(e);
    let manifest = dir.join("manifest.json");
    let mut schema = match std::fs::read(&manifest) {
        Ok(text) => {
            let m = serde_json::from_slice::<serde_json::Value>(&text)
                .map_err(|e| permanent(format!("{}: {e}", manifest.display())))?;
            // The manifest of several tables lists each by name; a one-table manifest is its
            // log's first table (a log that began with one table and gained others). A table
            // added since is in no manifest: its versions say (from the catalog's, its first).
            let row = match (name, m["tables"].as_array()) {
                (Some(n), Some(tables)) => tables
                    .iter()
                    .find(|x| x["name"].as_str() == Some(n))
                    .map(|x| x["row_schema"].clone())
                    .unwrap_or_default(),
                (None, _) | (Some(_), None) if t == 0 => m["row_schema"].clone(),
                _ => serde_json::Value::Null,
            };
            if row.is_null() {
                catalog.to_string()
            } else {
                row.to_string()
            }
        }
        Err(_) => catalog.to_string(),
    };
    let versions = crate::snapshot::versions::read(dir).map_err(|e| permanent(e.to_string()))?;
    // A log that began with one table wrote its versions without a name until it had several.
    let ours = |v: &crate::codec::versions::AnnouncedVersion| {
        v.table.as_deref() == name || (t == 0 && v.table.is_none())
    };
    if let Some(v) = versions
        .iter()
        .filter(|v| ours(v) && v.from_epoch <= epoch)
        .max_by_key(|v| v.from_epoch)
    {
        schema = v.row_schema.clone();
    }
    Ok(schema)
}

/// A table appended to a capture's list, as it joins the log: its index among the log's tables,
/// its name as the state record lists it (`schema.table` or `database.table`), its columns, and
/// the JSON of its row schema in force.
pub(in crate::capture) struct Joining {
    pub index: usize,
    pub table: crate::config::TableName,
    pub columns: Vec<String>,
    pub row_schema: String,
}

/// The capture's configured tables `now` against its state `record`, for every source
/// ([`crate::core::capture::tables_changed`], docs/CAPTURE.md "Adding a table" and "Removing a
/// table"); a list that cannot continue the log is a permanent failure naming both lists.
pub(in crate::capture) fn tables_now(
    topic: &str,
    record: &StateRecord,
    now: &[String],
) -> Result<crate::core::capture::TablesChange, CaptureFailure> {
    let recorded = record.tables();
    let recorded: Vec<&str> = recorded.iter().map(|t| t.0).collect();
    let now: Vec<&str> = now.iter().map(String::as_str).collect();
    crate::core::capture::tables_changed(&recorded, &record.removed(), &now).map_err(|why| {
        CaptureFailure::permanent(format!(
            "the log of topic {topic} was captured from {}, the tables are now {}: {why}; for any other change capture into a new topic",
            recorded.join(", "),
            now.join(", ")
        ))
    })
}

/// The tables a capture no longer lists leave its log: named in the state record from the open
/// epoch (committed with the session's first commit), the stream passing over their changes
/// from then on because it no longer reads them; the manifests of the next snapshots name every
/// table removed so far.
pub(in crate::capture) fn remove_tables(
    job: &JobConfig,
    log: &mut KafkaLog,
    on_demand: &mut super::snapshots::OnDemand,
    removed: &[usize],
) {
    if removed.is_empty() {
        on_demand.tables_removed(&log.record.removed);
        return;
    }
    let names: Vec<String> = removed
        .iter()
        .map(|&i| log.record.tables()[i].0.to_string())
        .collect();
    log.record.remove_tables(removed);
    on_demand.tables_removed(&log.record.removed);
    let from_epoch = log.record.state.epoch;
    tracing::info!(job = %job.name, tables = %names.join(", "), %from_epoch, "tables removed from the capture: the log has none of their changes from this epoch on");
}

/// Tables appended to a capture's list join its log, for every source (docs/CAPTURE.md "Adding a
/// table"): each recorded in the state record as added, their first versions (naming their
/// primary key) announced from one next epoch at a checkpoint barrier before any of their changes —
/// from the epoch announced already, when a session failed between announcing and committing —
/// as the session's first actions (`initial`), and a snapshot asked for, which holds them: a job of
/// an added table starts from it.
pub(in crate::capture) fn join_tables(
    job: &JobConfig,
    props: &BTreeMap<String, String>,
    dir: &Path,
    log: &mut KafkaLog,
    a: &mut crate::core::capture::Assembler,
    added: Vec<Joining>,
    initial: &mut Vec<crate::core::capture::Action>,
) -> Result<(), CaptureFailure> {
    let announced = crate::snapshot::versions::read(dir)
        .map_err(|e| CaptureFailure::permanent(e.to_string()))?;
    let mut tables = Vec::new();
    let mut names = Vec::new();
    for t in added {
        let name = t.table.table.as_str();
        let before = announced
            .iter()
            .find(|v| v.table.as_deref() == Some(name) && v.primary_key.is_some())
            .map(|v| v.from_epoch);
        log.record.other_tables.push(super::log::StateTable {
            table: t.table.to_string(),
            columns: t.columns,
            added: true,
        });
        tables.push((
            t.index as crate::core::capture::TableIndex,
            t.row_schema,
            before,
        ));
        names.push(t.table.to_string());
    }
    a.on_event(
        crate::core::capture::SourceEvent::TablesAdded {
            tables,
            now_ms: unix_ms(),
        },
        initial,
    )
    .map_err(|e| CaptureFailure::permanent(e.to_string()))?;
    tracing::info!(job = %job.name, tables = %names.join(", "), "tables join the capture; asking for a snapshot that holds them");
    super::snapshots::request(props, &job.topic, &job.name).map_err(|e| {
        CaptureFailure::transient_from("asking for a snapshot of the added tables", e)
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts what [`CaptureMeter::committed`] is told.
    #[derive(Default)]
    struct Counted(std::sync::Mutex<(u64, u64)>);

    impl CaptureMeter for Counted {
        fn committed(
            &self,
            _: &str,
            _: &CaptureState,
            _: &SessionStats,
            transactions: u64,
            changes: u64,
            _: u64,
        ) {
            let mut c = self.0.lock().unwrap();
            c.0 += transactions;
            c.1 += changes;
        }
        fn restarted(&self, _: &str) {}
        fn commit_took(&self, _: &str, _: Duration) {}
        fn started(&self, _: &str) {}
        fn snapshot(&self, _: &str, _: super::super::report::SnapshotOutcome, _: Option<Duration>) {
        }
    }

    /// A session that committed once, then a new session whose first commit read fewer
    /// transactions: each commit counted once, none negative (it overflowed when the new
    /// session's first commit had as many checkpoints as the old one's last).
    #[test]
    fn a_new_session_counts_from_zero_whatever_the_last_one_counted() {
        let meter = Arc::new(Counted::default());
        let job: JobConfig = toml::from_str(
            "name = \"j\"\ntopic = \"t\"\nsnapshot = { kind = \"files\", dir = \"s\" }\nstore = { kind = \"sqlite\", path = \"r.sqlite\", table = \"t\" }\n[kafka]\n\"bootstrap.servers\" = \"k:9092\"\n",
        )
        .unwrap();
        let mut p = Progress::new(&job, CaptureBoard::default(), meter.clone(), None);
        let state = CaptureState {
            lsn: 10,
            epoch: Epoch(1 << 16),
            checkpoints: 1,
        };
        let stats = |checkpoints, transactions| SessionStats {
            transactions,
            changes: transactions * 2,
            checkpoints,
            ..SessionStats::default()
        };
        p.committed(&state, &stats(1, 100));
        // The next session.
        p.committed(&state, &stats(1, 40));
        p.committed(&state, &stats(2, 50));
        assert_eq!(*meter.0.lock().unwrap(), (150, 300));
    }
}
