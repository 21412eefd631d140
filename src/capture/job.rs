//! One job's capture from PostgreSQL, wired: preconditions, the fence and the state read, the
//! snapshot on a fresh start, the resume checks otherwise, and the sessions of
//! [`super::run_session`] with the bounded retry of `session.rs`; a MariaDB `source_url` is handed
//! to `mariadb::job`. Also `InProcess`, the captures of `run --capture`. Owns the process side of
//! the capture; decisions stay in the core.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::shutdown::CancellationToken;
use anyhow::{bail, Context, Result};

use super::log::StateRecord;
use super::pg::{self, unix_ms, PgReplication, StreamTable, TableName};
use super::report::{CaptureBoard, CaptureMeter};
use super::session::{
    end_session, first_snapshot_here, log_partitions, open_log, retry, schema_in_force,
    sync_versions, transient, write_durably, Progress, Published, Started, PENDING_MANIFEST,
};
use super::snapshots::{CopySpec, CopyTable, OnDemand, PgExporter};
use super::{run_session, CaptureFailure};
use crate::codec::TableSchema;
use crate::config::{JobConfig, SnapshotConfig};
use crate::core::capture::{Assembler, CaptureConfig};
use crate::core::{Epoch, PartitionMap};

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
    /// The publication is the capture's own (`capture.publication` not set): it follows `tables`.
    owned: bool,
    props: BTreeMap<String, String>,
    map: PartitionMap,
    partitions: u32,
    config: CaptureConfig,
    /// The copy of the tables, for the first snapshot and every later one.
    spec: CopySpec,
    /// Column changes a session found inside a transaction, for the next to announce.
    announcements: pg::Announcements,
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
    // The capture's own publication (none named in capture.publication) follows `tables`.
    let owned = c.publication.is_none();
    pg::ensure_publication(&mut client, &c.publication_name(&job.name), &all, owned)?;
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
        dir: dir.clone(),
    };
    let exporter = PgExporter {
        spec: spec.clone(),
        slot: c.slot_name(&job.name),
        publication: c.publication_name(&job.name),
    };
    let mut on_demand = OnDemand::new(
        spec.shape(),
        Box::new(exporter),
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
        owned,
        tables,
        url,
        props,
        map,
        partitions,
        config: CaptureConfig {
            barrier_interval_ms: c.barrier_interval_ms,
            checkpoint_interval_ms: c.checkpoint_interval_ms(),
            ..CaptureConfig::default()
        },
        spec,
        announcements: pg::Announcements::default(),
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
    log.table_names = s.tables.iter().map(|t| t.table.table.clone()).collect();
    on_demand.session_started(&mut log, committed.as_ref());
    let mut client = pg::connect(&s.url).map_err(transient("connecting to PostgreSQL"))?;
    let slot_state = pg::slot_state(&mut client, &s.slot)
        .map_err(|e| CaptureFailure::permanent(crate::error::line(&e)))?;
    let in_kafka = on_demand.stores_in_kafka();
    let connect = |create: bool, tables: Vec<StreamTable>| {
        PgReplication::connect(&s.url, &s.slot, &s.publication, tables, create, &s.dir)
            .map(|mut r| {
                r.announcements = s.announcements.clone();
                r
            })
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
            if record.slot != s.slot {
                return refuse(format!("the log of topic {} was captured through slot {}, not {}: a capture continues its log through the same slot; capture into a new topic", job.topic, record.slot, s.slot));
            }
            // Tables left out of the list leave the log, tables appended join it (docs/CAPTURE.md
            // "Removing a table", "Adding a table"); any other change needs a new topic.
            let now: Vec<String> = s.tables.iter().map(|t| t.table.to_string()).collect();
            let change = super::session::tables_now(&job.topic, &record, &now)?;
            // The tables kept: removed ones are the last recorded, added ones the last listed.
            let recorded = record.tables();
            for ((_, columns), t) in recorded.iter().zip(&s.tables) {
                // Columns added since are the Relation message the stream brings next (a new
                // version); the reason a change is not followed is the stream's own.
                let captured: Vec<&str> = columns.iter().map(String::as_str).collect();
                let now: Vec<&str> = t.columns.iter().map(String::as_str).collect();
                if let Err(why) = crate::core::capture::columns_followed(&captured, &now) {
                    return refuse(format!(
                        "the columns of {} are now {:?}, captured as {:?}: {why}",
                        t.table, t.columns, columns
                    ));
                }
            }
            first_snapshot_here(&job.name, &s.props, &s.dir, &record)?;
            if let Some(p) = &progress.published {
                p.tell();
            }
            if slot_state.is_none() {
                return refuse(format!("replication slot {} is gone: the changes since {} cannot be read; capture into a new topic", s.slot, pg::format_lsn(record.state.lsn)));
            }
            if in_kafka {
                sync_versions(&s.props, &job.topic, &s.dir)?;
            }
            // Each table with the columns of its row schema in force at the resume epoch.
            let mut streams = Vec::new();
            for i in 0..s.tables.len() {
                let (encoder, table) = in_force(s, i, record.state.epoch)?;
                log.use_table(i, table)
                    .map_err(|e| CaptureFailure::permanent(crate::error::line(&e)))?;
                streams.push(s.tables[i].stream_table(encoder));
            }
            let repl = connect(false, streams)?;
            let (sys, tli) = repl.identity();
            if record.system_id != sys.to_string() || record.timeline != tli {
                return refuse(format!("the source is system {sys} timeline {tli}, the log was captured from system {} timeline {}: a restore or failover happened; capture into a new topic", record.system_id, record.timeline));
            }
            log.record = record.clone();
            super::session::remove_tables(job, &mut log, on_demand, &change.removed);
            if s.owned && !log.record.removed.is_empty() {
                log.after_next_commit = Some(unpublish_removed(s));
            }
            let mut a = Assembler::resume(s.config, s.map, record.state);
            let mut initial = Vec::new();
            if !change.added.is_empty() {
                join_tables(s, &mut log, &mut a, &change.added, &mut initial)?;
            }
            (a, initial, repl)
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

/// After a commit whose state record names the removed tables: those the capture's own
/// publication still publishes leave it. Not before: a removal that never committed may be undone
/// by listing the table again, and its changes must still be in the slot's stream then. A failure
/// is only logged (the stream passes over the table's changes all the same) and tried again at
/// the next session.
fn unpublish_removed(s: &Setup) -> super::log::AfterCommit {
    let (url, publication) = (s.url.clone(), s.publication.clone());
    Box::new(move |record: &StateRecord| {
        let tables: Result<Vec<TableName>> = record
            .removed
            .iter()
            .map(|r| TableName::parse(&r.table))
            .collect();
        let done = tables.and_then(|tables| {
            let mut client = pg::connect(&url)?;
            pg::unpublish(&mut client, &publication, &tables)
        });
        if let Err(e) = done {
            tracing::warn!(%publication, error = %crate::error::line(&e), "leaving the removed tables in the capture's publication (their changes are passed over); tried again at the next start");
        }
    })
}

/// Tables appended to the capture's list join its log ([`super::session::join_tables`]), each
/// with its row schema in force.
fn join_tables(
    s: &Setup,
    log: &mut super::log::KafkaLog,
    a: &mut Assembler,
    added: &[usize],
    initial: &mut Vec<crate::core::capture::Action>,
) -> Result<(), CaptureFailure> {
    let mut joining = Vec::new();
    for &i in added {
        let (_, schema) = in_force(s, i, log.record.state.epoch)?;
        joining.push(super::session::Joining {
            index: i,
            table: s.tables[i].table.clone(),
            columns: s.tables[i].columns.clone(),
            row_schema: schema.json.to_string(),
        });
    }
    super::session::join_tables(s.job, &s.props, &s.dir, log, a, joining, initial)
}

/// The row schema in force at `epoch` ([`schema_in_force`]) and the encoder of its columns, which
/// are the catalog's first ones.
fn in_force(
    s: &Setup,
    i: usize,
    epoch: Epoch,
) -> Result<(super::types::RowEncoder, TableSchema), CaptureFailure> {
    let t = &s.tables[i];
    let permanent = |e: String| CaptureFailure::permanent(e);
    let name = s.several().then_some(t.table.table.as_str());
    let schema = schema_in_force(&s.dir, i, name, epoch, &t.table_schema.json.to_string())?;
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
    let mut columns = catalog[..n].to_vec();
    super::types::order_nulls(&mut columns, &super::types::nulls_last(&table.json));
    let encoder = super::types::RowEncoder {
        columns,
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
