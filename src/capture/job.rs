//! One job's capture, wired: preconditions, the fence and the state read, the snapshot on a fresh
//! start, the resume checks otherwise, and the sessions of [`super::run_session`] with a bounded
//! retry of transient failures. Owns the process side of the capture; decisions stay in the core.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::shutdown::{wait_blocking, CancellationToken};
use anyhow::{bail, Context, Result};

use super::log::{read_state, KafkaLog, StateRecord};
use super::pg::{self, unix_ms, PgReplication, StreamTable, TableName};
use super::report::{CaptureBoard, CaptureMeter, CaptureReport, Positions};
use super::snapshots::{CopySpec, CopyTable, OnDemand};
use super::{run_session, CaptureFailure, CaptureObserver, SessionStats};
use crate::codec::{LogCodec, TableSchema};
use crate::config::{JobConfig, SnapshotConfig};
use crate::core::capture::{Assembler, CaptureConfig, CaptureState};
use crate::core::{Epoch, PartitionMap};
use crate::snapshot::files::{write_manifest, write_tables_manifest, Manifest, TablesManifest};

pub(super) const PENDING_MANIFEST: &str = "manifest.pending.json";

pub(super) struct Progress {
    job: String,
    last_log_ms: u64,
    /// The session totals last counted (a new session starts again from zero).
    counted: SessionStats,
    board: CaptureBoard,
    pub(super) meter: Arc<dyn CaptureMeter>,
    /// Told each time a session finds the snapshot published (`manifest.json` written).
    pub(super) published: Option<Published>,
    /// How the source's positions read (set by the MariaDB capture).
    pub(super) positions: Positions,
}

/// Tells [`InProcess::start`] that a job's capture has published its snapshot.
#[derive(Clone)]
pub struct Published {
    job: String,
    tx: mpsc::Sender<Started>,
}

impl Published {
    pub(super) fn tell(&self) {
        // The receiver is gone once every job it waited for has started: nothing is listening.
        let _ = self.tx.send(Started::Published(self.job.clone()));
    }
}

/// What [`InProcess::start`] waits for, per job.
enum Started {
    Published(String),
    Stopped(String),
}

impl Progress {
    fn new(
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
    pub(super) fn publish_on_initial_commit(&self, dir: &Path) -> super::log::InitialCommitHook {
        let (dir, published) = (dir.to_path_buf(), self.published.clone());
        Box::new(move |r: &StateRecord| {
            finish_manifest(&dir, r)?;
            if let Some(p) = &published {
                p.tell();
            }
            Ok(())
        })
    }

    pub(super) fn set(&self, f: impl FnOnce(&mut CaptureReport)) {
        let mut b = self.board.lock().unwrap();
        f(b.entry(self.job.clone()).or_default());
    }
}

impl CaptureObserver for Progress {
    fn committed(&mut self, state: &CaptureState, stats: &SessionStats) {
        if stats.checkpoints < self.counted.checkpoints {
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
pub(super) fn write_durably(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

/// Writes `manifest.json` from the pending manifest and the state record's start offsets.
pub(super) fn finish_manifest(dir: &Path, record: &StateRecord) -> Result<()> {
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

/// How long transient failures are retried without a checkpoint committed before the capture
/// gives up (a broker or database outage shorter than this is ridden out).
const RETRY_FOR: Duration = Duration::from_secs(180);

/// One captured table, as the catalog had it when the capture started.
struct Captured {
    table: TableName,
    info: pg::TableInfo,
    table_schema: TableSchema,
    columns: Vec<String>,
}

impl Captured {
    fn stream_table(&self, encoder: super::types::RowEncoder) -> StreamTable {
        StreamTable {
            name: self.table.clone(),
            oid: self.info.oid,
            encoder,
        }
    }
}

/// Everything a session needs that does not change between sessions.
struct Setup<'a> {
    job: &'a JobConfig,
    dir: PathBuf,
    /// In the log's order; a log of several tables names each by `table.table`.
    tables: Vec<Captured>,
    url: String,
    slot: String,
    publication: String,
    props: BTreeMap<String, String>,
    map: PartitionMap,
    partitions: u32,
    config: CaptureConfig,
    /// The copy of the tables, for the first snapshot and every later one.
    spec: CopySpec,
}

impl Setup<'_> {
    /// The captured tables for messages: `public.a` or `public.a, public.b`.
    fn names(&self) -> String {
        let names: Vec<String> = self.tables.iter().map(|t| t.table.to_string()).collect();
        names.join(", ")
    }

    fn several(&self) -> bool {
        self.tables.len() > 1
    }

    /// Every table as the stream reads it, with the catalog's columns.
    fn catalog_streams(&self) -> Vec<StreamTable> {
        self.tables
            .iter()
            .map(|t| t.stream_table(t.info.encoder.clone()))
            .collect()
    }
}

/// Runs the capture of `job` until `stop` is cancelled (checked between source transactions); its
/// report is kept on `board`, what it counts told to `meter`.
pub fn run(
    job: &JobConfig,
    stop: CancellationToken,
    board: CaptureBoard,
    meter: Arc<dyn CaptureMeter>,
) -> Result<()> {
    run_telling(job, stop, board, meter, None)
}

fn run_telling(
    job: &JobConfig,
    stop: CancellationToken,
    board: CaptureBoard,
    meter: Arc<dyn CaptureMeter>,
    published: Option<Published>,
) -> Result<()> {
    let c = job
        .capture
        .as_ref()
        .with_context(|| format!("job {} has no [jobs.capture] section", job.name))?;
    let SnapshotConfig::Files { dir, .. } = &job.snapshot else {
        bail!(
            "job {}: capture writes the snapshot as files (snapshot.kind = \"files\")",
            job.name
        );
    };
    let names = c
        .table_names()
        .map_err(|(key, m)| anyhow::anyhow!("job {}: capture.{key}: {m}", job.name))?;
    let url = c.source_url.expose().to_string();
    if super::mariadb::is_mariadb_url(&url) {
        let mut progress = Progress::new(job, board, meter, published);
        return super::mariadb::job::run(job, &names, dir, &stop, &mut progress);
    }
    let props = crate::kafka::producer_properties(&job.kafka);
    // The preconditions, once: each failure names its fix.
    let mut client = pg::connect(&url)?;
    let mut tables = Vec::new();
    for table in names {
        let info = pg::table_info(&mut client, &table)?;
        let schema_json = super::types::row_schema(&table.to_string(), &info.encoder.columns);
        let table_schema = TableSchema::parse(&schema_json.to_string(), &info.primary_key)?;
        tables.push(Captured {
            columns: info
                .encoder
                .columns
                .iter()
                .map(|c| c.name.clone())
                .collect(),
            table,
            info,
            table_schema,
        });
    }
    let all: Vec<TableName> = tables.iter().map(|t| t.table.clone()).collect();
    pg::ensure_publication(&mut client, &c.publication_name(&job.name), &all)?;
    drop(client);
    let (partitions, map) = log_partitions(job, &props)?;
    let spec = CopySpec {
        url: url.clone(),
        tables: tables
            .iter()
            .map(|t| CopyTable {
                table: t.table.clone(),
                schema: t.table_schema.clone(),
                columns: t.info.encoder.columns.clone(),
            })
            .collect(),
        vnode_count: map.vnode_count(),
        partitions,
        topic: job.topic.clone(),
        copy_connections: c.copy_connections,
    };
    let mut on_demand = OnDemand::new(
        spec.clone(),
        &c.slot_name(&job.name),
        &c.publication_name(&job.name),
        dir,
        c.snapshot_interval_ms.map(Duration::from_millis),
        super::snapshots::Requests::new(&props, &job.topic, &job.name)?,
        c.snapshot_keep,
        c.stores_in_kafka().then(|| props.clone()),
    )?
    .with_meter(&job.name, meter.clone());
    let setup = Setup {
        job,
        dir: dir.clone(),
        slot: c.slot_name(&job.name),
        publication: c.publication_name(&job.name),
        tables,
        url,
        props,
        map,
        partitions,
        config: CaptureConfig {
            barrier_interval_ms: c.barrier_interval_ms,
            checkpoint_interval_ms: c.checkpoint_interval_ms,
            ..CaptureConfig::default()
        },
        spec,
    };
    let mut progress = Progress::new(job, board, meter, published);
    progress.set(|r| r.state = "starting");
    progress.meter.started(&job.name);
    let names = setup.names();
    retry(
        job,
        &names,
        &stop,
        &mut progress,
        |progress, checkpoints| session(&setup, &stop, progress, &mut on_demand, checkpoints),
    )
}

/// Runs `session` again after each transient failure, with backoff, until it stops at a
/// checkpoint, fails for good, or commits no checkpoint for [`RETRY_FOR`]. `session` gets the
/// progress and a slot for the checkpoint counts at its start and end.
pub(super) fn retry(
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
pub(super) fn log_partitions(
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

pub(super) fn transient(what: &str) -> impl FnOnce(anyhow::Error) -> CaptureFailure + '_ {
    move |e| CaptureFailure::transient_from(what, e)
}

/// One session: fence every older capture and read what Kafka really committed (so a commit whose
/// outcome was unknown is never repeated), then a fresh start or a resume, then the loop.
/// `checkpoints` gets the committed checkpoint count at the start and at the end.
fn session(
    s: &Setup,
    stop: &CancellationToken,
    progress: &mut Progress,
    on_demand: &mut OnDemand,
    checkpoints: &mut (Option<u64>, Option<u64>),
) -> Result<(), CaptureFailure> {
    let job = s.job;
    let tables: Vec<(String, Vec<String>)> = s
        .tables
        .iter()
        .map(|t| (t.table.to_string(), t.columns.clone()))
        .collect();
    let schemas: Vec<TableSchema> = s.tables.iter().map(|t| t.table_schema.clone()).collect();
    let template = StateRecord::fresh(&job.name, s.slot.clone(), &tables);
    let (mut log, committed) = open_log(
        job,
        &s.props,
        s.partitions,
        &schemas,
        template,
        progress,
        &s.dir,
    )?;
    log.on_snapshot_placed = Some(on_demand.placed_sender());
    log.published = Some(on_demand.published.clone());
    on_demand.session_started(committed.as_ref());
    let mut client = pg::connect(&s.url).map_err(transient("connecting to PostgreSQL"))?;
    let slot_state = pg::slot_state(&mut client, &s.slot)
        .map_err(|e| CaptureFailure::permanent(crate::error::line(&e)))?;
    let in_kafka = job
        .capture
        .as_ref()
        .is_some_and(crate::config::CaptureSection::stores_in_kafka);
    if in_kafka {
        log.versions_to_kafka = Some(s.props.clone());
    }
    let connect = |create: bool, tables: Vec<StreamTable>| {
        PgReplication::connect(&s.url, &s.slot, &s.publication, tables, create, &s.dir)
            .map_err(transient("opening the replication connection"))
    };
    let (mut a, initial, mut repl) = match committed {
        None => {
            // A fresh capture: a slot left by an attempt that never committed is dropped.
            match slot_state {
                Some((_, true)) => {
                    return Err(CaptureFailure::transient(format!(
                        "replication slot {} is in use by another connection (a capture of job {} that is being fenced?)",
                        s.slot, job.name
                    )))
                }
                Some(_) => {
                    tracing::warn!(slot = %s.slot, "dropping the replication slot of a capture that never committed");
                    client
                        .execute("SELECT pg_drop_replication_slot($1)", &[&s.slot])
                        .map_err(|e| CaptureFailure::transient_from(format!("dropping slot {}", s.slot), e))?;
                }
                None => {}
            }
            let repl = connect(true, s.catalog_streams())?;
            progress.set(|r| r.state = "snapshot");
            let (es, consistent) = snapshot(s, &repl, &mut client)
                .map_err(|e| CaptureFailure::permanent(crate::error::line(&e)))?;
            let (sys, tli) = repl.identity();
            log.record.system_id = sys.to_string();
            log.record.timeline = tli;
            log.record.snapshot_epoch = es;
            log.on_initial_commit = Some(progress.publish_on_initial_commit(&s.dir));
            let (a, initial) = Assembler::fresh(s.config, s.map, es, consistent, unix_ms());
            (a, initial, repl)
        }
        Some(record) => {
            let refuse = |m: String| Err(CaptureFailure::permanent(m));
            let recorded = record.tables();
            let recorded_names: Vec<&str> = recorded.iter().map(|r| r.0).collect();
            if record.slot != s.slot
                || recorded_names.len() != s.tables.len()
                || recorded_names
                    .iter()
                    .zip(&s.tables)
                    .any(|(r, t)| *r != t.table.to_string())
            {
                return refuse(format!("the log of topic {} was captured from {} through slot {}, not {} through {}: capture into a new topic", job.topic, recorded_names.join(", "), record.slot, s.names(), s.slot));
            }
            for ((_, columns), t) in recorded.iter().zip(&s.tables) {
                // Columns added since are the Relation message the stream brings next (a new
                // version); the reason a change is not followed is the stream's own.
                let captured: Vec<&str> = columns.iter().map(String::as_str).collect();
                let now: Vec<&str> = t.columns.iter().map(String::as_str).collect();
                if let Err(why) =
                    crate::core::capture::columns_followed(s.several(), &captured, &now)
                {
                    return refuse(format!(
                        "the columns of {} are now {:?}, captured as {:?}: {why}",
                        t.table, t.columns, columns
                    ));
                }
            }
            if !s.dir.join("manifest.json").exists() {
                match &record.snapshot_topic {
                    // Kafka storage, and this capture's disk is not the one it wrote to: the
                    // first snapshot comes back from its topic (its schema is what the stream
                    // resumes with; a job of this process may read it).
                    Some(topic) if !s.dir.join(PENDING_MANIFEST).exists() => {
                        let moved =
                            crate::snapshot::kafka::restore(&s.props, topic, &s.dir, &|_| true)
                                .map_err(transient("restoring the first snapshot from Kafka"))?;
                        tracing::info!(job = %job.name, %topic, bytes = moved.bytes, seconds = moved.seconds, "the first snapshot restored from Kafka (its folder was not on this disk)");
                    }
                    _ => finish_manifest(&s.dir, &record)
                        .map_err(|e| CaptureFailure::permanent(crate::error::line(&e)))?,
                }
            }
            if let Some(p) = &progress.published {
                p.tell();
            }
            if slot_state.is_none() {
                return refuse(format!("replication slot {} is gone: the changes since {} cannot be read; capture into a new topic", s.slot, pg::format_lsn(record.state.lsn)));
            }
            if in_kafka {
                // Versions announced since the first snapshot was stored (a disk that is not the
                // one the capture wrote to has none of them).
                crate::snapshot::kafka::VersionsMirror::new(&s.props, &job.topic, &s.dir)
                    .and_then(|mut m| m.sync())
                    .map_err(transient("reading the schema versions from Kafka"))?;
            }
            let streams = if s.several() {
                s.catalog_streams()
            } else {
                let (encoder, table) = in_force(s, record.state.epoch)?;
                log.use_table(table)
                    .map_err(|e| CaptureFailure::permanent(crate::error::line(&e)))?;
                vec![s.tables[0].stream_table(encoder)]
            };
            let repl = connect(false, streams)?;
            let (sys, tli) = repl.identity();
            if record.system_id != sys.to_string() || record.timeline != tli {
                return refuse(format!("the source is system {sys} timeline {tli}, the log was captured from system {} timeline {}: a restore or failover happened; capture into a new topic", record.system_id, record.timeline));
            }
            log.record = record.clone();
            (
                Assembler::resume(s.config, s.map, record.state),
                Vec::new(),
                repl,
            )
        }
    };
    checkpoints.0 = Some(a.committed().checkpoints);
    let result = run_session(
        &mut a,
        initial,
        &mut repl,
        &mut log,
        Duration::from_millis(100),
        &mut |a| {
            on_demand.between(a);
            Ok(stop.is_cancelled())
        },
        progress,
    );
    checkpoints.1 = Some(a.committed().checkpoints);
    end_session(job, &mut log, result)
}

/// A session's Kafka log, connected (which fences every older producer of the job), its commit
/// times told to the meter and its snapshot folder set, and the state Kafka really committed
/// (none on a fresh start). Both sources' sessions start here.
pub(super) fn open_log(
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
pub(super) fn end_session<T>(
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

/// The row schema (Avro JSON) of a one-table capture in force at `epoch`: the last version
/// announced into `dir` from an epoch at or before it, else the manifest's, else `catalog` (a
/// capture whose manifest is not written yet). Both sources resume with it.
pub(super) fn schema_in_force(
    dir: &Path,
    epoch: Epoch,
    catalog: &str,
) -> Result<String, CaptureFailure> {
    let permanent = |e: String| CaptureFailure::permanent(e);
    let manifest = dir.join("manifest.json");
    let mut schema = match std::fs::read(&manifest) {
        Ok(text) => serde_json::from_slice::<serde_json::Value>(&text)
            .map_err(|e| permanent(format!("{}: {e}", manifest.display())))?["row_schema"]
            .to_string(),
        Err(_) => catalog.to_string(),
    };
    let versions = crate::snapshot::versions::read(dir).map_err(|e| permanent(e.to_string()))?;
    if let Some(v) = versions
        .iter()
        .filter(|v| v.from_epoch <= epoch)
        .max_by_key(|v| v.from_epoch)
    {
        schema = v.row_schema.clone();
    }
    Ok(schema)
}

/// The row schema in force at `epoch` ([`schema_in_force`]) and the encoder of its columns, which
/// are the catalog's first ones.
fn in_force(
    s: &Setup,
    epoch: Epoch,
) -> Result<(super::types::RowEncoder, TableSchema), CaptureFailure> {
    let t = &s.tables[0];
    let permanent = |e: String| CaptureFailure::permanent(e);
    let schema = schema_in_force(&s.dir, epoch, &t.table_schema.json.to_string())?;
    let table =
        TableSchema::parse(&schema, &t.info.primary_key).map_err(|e| permanent(e.to_string()))?;
    let catalog = &t.info.encoder.columns;
    let n = table.columns.len();
    if catalog.len() < n
        || catalog[..n]
            .iter()
            .zip(&table.columns)
            .any(|(c, t)| c.name != t.name)
    {
        return Err(permanent(format!(
            "the columns of {} are now {:?}, the log's row schema at epoch {epoch} has {:?}: only columns added at the end are followed",
            t.table,
            t.columns,
            table.columns.iter().map(|c| &c.name).collect::<Vec<_>>()
        )));
    }
    let encoder = super::types::RowEncoder {
        columns: catalog[..n].to_vec(),
        key: t.info.encoder.key.clone(),
    };
    Ok((encoder, table))
}

/// Copies every table in the slot's exported snapshot into the snapshot folder and writes the
/// pending manifest; returns the snapshot epoch and the slot's consistent position. Every table
/// is read in the one exported snapshot, so together they are one source state: the one the log
/// continues from.
fn snapshot(
    s: &Setup,
    repl: &PgReplication,
    client: &mut postgres::Client,
) -> Result<(Epoch, u64)> {
    let name = repl
        .exported_snapshot()
        .context("the slot was created without an exported snapshot")?;
    if s.dir.exists() {
        std::fs::remove_dir_all(&s.dir).with_context(|| format!("clearing {}", s.dir.display()))?;
    }
    let started = std::time::Instant::now();
    let copied = s.spec.copy(&name, &s.dir)?;
    let rows = copied.rows;
    let consistent = pg::slot_state(client, &s.slot)?
        .map(|(lsn, _)| lsn)
        .with_context(|| format!("slot {} vanished after its creation", s.slot))?;
    let es = Epoch::from_unix_millis(copied.import_ms);
    let pending = s.spec.manifest(copied, es, Vec::new()).to_json()?;
    write_durably(&s.dir.join(PENDING_MANIFEST), &pending)?;
    tracing::info!(tables = %s.names(), rows, seconds = started.elapsed().as_secs_f64(), lsn = %pg::format_lsn(consistent), "snapshot copied");
    Ok((es, consistent))
}

/// Captures running inside `kafka-backfill run --capture` (the embedded and demo case).
pub struct InProcess {
    threads: Vec<(String, std::thread::JoinHandle<Result<()>>)>,
    stop: CancellationToken,
}

impl InProcess {
    /// Starts the capture of every job with a `[jobs.capture]` on a thread of its own, and returns
    /// once each has published its snapshot (`manifest.json` written: the job can start), or with
    /// the error of a capture that stopped first. Cancelling `stop` ends them (at a checkpoint);
    /// so does [`InProcess::finish`].
    pub fn start(
        jobs: &[JobConfig],
        stop: CancellationToken,
        board: CaptureBoard,
        meter: Arc<dyn CaptureMeter>,
    ) -> Result<InProcess> {
        let (tx, rx) = mpsc::channel();
        let mut threads = Vec::new();
        for job in jobs.iter().filter(|j| j.capture.is_some()) {
            let (j, s, b, m) = (job.clone(), stop.clone(), board.clone(), meter.clone());
            let published = Published {
                job: job.name.clone(),
                tx: tx.clone(),
            };
            let handle = std::thread::Builder::new()
                .name(format!("capture-{}", job.name))
                .spawn(move || {
                    let r = run_telling(&j, s, b, m, Some(published.clone()));
                    // Sent before the thread ends; the handle then holds the result.
                    let _ = published.tx.send(Started::Stopped(published.job));
                    r
                })
                .context("starting a capture thread")?;
            threads.push((job.name.clone(), handle));
        }
        drop(tx);
        let mut me = InProcess { threads, stop };
        let mut waiting: std::collections::BTreeSet<String> =
            me.threads.iter().map(|(n, _)| n.clone()).collect();
        while !waiting.is_empty() {
            match rx.recv() {
                Ok(Started::Published(job)) => {
                    if waiting.remove(&job) {
                        tracing::info!(job = %job, "the capture published the snapshot; starting the job");
                    }
                }
                Ok(Started::Stopped(job)) => {
                    let i = me
                        .threads
                        .iter()
                        .position(|(n, _)| *n == job)
                        .expect("a started capture");
                    let (name, t) = me.threads.remove(i);
                    let cancelled = me.stop.is_cancelled();
                    me.stop_all();
                    return Err(match t.join() {
                        Ok(Err(e)) => e.context(format!("the capture of job {name}")),
                        Ok(Ok(())) if cancelled => anyhow::anyhow!(
                            "stopped before the capture of job {name} published its snapshot"
                        ),
                        Ok(Ok(())) => {
                            anyhow::anyhow!("the capture of job {name} stopped before its snapshot")
                        }
                        Err(_) => anyhow::anyhow!("the capture of job {name} panicked"),
                    });
                }
                Err(mpsc::RecvError) => {
                    bail!("the capture threads ended without publishing their snapshots")
                }
            }
        }
        Ok(me)
    }

    fn stop_all(&mut self) {
        self.stop.cancel();
        for (_, t) in self.threads.drain(..) {
            // Each ends at its next source-transaction boundary; errors were logged by its session.
            if let Ok(Err(e)) = t.join() {
                tracing::warn!(error = %crate::error::line(&e), "an in-process capture stopped with an error");
            }
        }
    }

    /// Stops every capture at a checkpoint and returns the first error one stopped with.
    pub fn finish(mut self) -> Result<()> {
        self.stop.cancel();
        let mut first = None;
        for (name, t) in self.threads.drain(..) {
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first.get_or_insert(e.context(format!("the capture of job {name}")));
                }
                Err(_) => {
                    first.get_or_insert(anyhow::anyhow!("the capture of job {name} panicked"));
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}
