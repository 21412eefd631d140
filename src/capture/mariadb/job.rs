//! One job's capture from MariaDB, wired: the preconditions, the state read, the snapshot in one
//! consistent snapshot on a fresh start, the resume checks otherwise, and the sessions of
//! [`crate::capture::run_session`] with the PostgreSQL capture's bounded retry
//! (`capture::session::retry`); snapshots of the running capture through the shared
//! [`OnDemand`] with MariaDB's exporter ([`super::snapshots::MyExporter`]), stored in Kafka too
//! with `snapshot_storage = "kafka"`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use super::binlog::MyReplication;
use super::snapshots::{copy, Columns};
use super::types::row_schema;
use super::MyTable;
use crate::capture::log::StateRecord;
use crate::capture::report::Positions;
use crate::capture::session::{
    end_session, first_snapshot_here, join_tables, log_partitions, open_log, retry,
    schema_in_force, sync_versions, transient, write_durably, Joining, Progress, PENDING_MANIFEST,
};
use crate::capture::snapshots::{LogShape, OnDemand, Requests};
use crate::capture::unix_ms;
use crate::capture::{run_session, CaptureFailure};
use crate::codec::TableSchema;
use crate::config::{JobConfig, TableName};
use crate::core::capture::{columns_followed, Assembler, CaptureConfig};
use crate::core::{Epoch, PartitionMap};
use crate::shutdown::CancellationToken;

/// Everything a session needs that does not change between sessions.
struct Setup<'a> {
    job: &'a JobConfig,
    dir: PathBuf,
    url: String,
    server_id: u32,
    /// In the log's order.
    tables: Vec<MyTable>,
    schemas: Vec<TableSchema>,
    props: BTreeMap<String, String>,
    map: PartitionMap,
    partitions: u32,
    /// What the snapshots' manifests say of the log.
    shape: LogShape,
    config: CaptureConfig,
}

impl Setup<'_> {
    fn columns(&self, i: usize) -> Vec<String> {
        self.tables[i]
            .encoder
            .columns
            .iter()
            .map(|c| c.name.clone())
            .collect()
    }
}

/// Runs the capture of `job` (a MariaDB `source_url`) from `names` into `dir` and the job's topic
/// until `stop` is cancelled.
pub(in crate::capture) fn run(
    job: &JobConfig,
    names: &[TableName],
    dir: &Path,
    stop: &CancellationToken,
    progress: &mut Progress,
) -> Result<()> {
    let c = job.capture.as_ref().context("no [jobs.capture]")?;
    let url = c.source_url.expose().to_string();
    let server_id = c.binlog_server_id(&job.name);
    let props = crate::kafka::producer_properties(&job.kafka);
    // The preconditions, once: each failure names its fix.
    let mut conn = super::connect(&url)?;
    super::check_server(&mut conn, server_id)?;
    let (tables, schemas) = catalog(&mut conn, &url, names)?;
    // The binlog's base name, for the positions the snapshots' logs show.
    let (base, _) = super::binlogs(&mut conn)?;
    drop(conn);
    let (partitions, map) = log_partitions(job, &props)?;
    let exporter = super::snapshots::MyExporter {
        url: url.clone(),
        tables: tables.clone(),
        schemas: schemas.clone(),
        vnode_count: map.vnode_count(),
        base,
        dir: dir.to_path_buf(),
    };
    let shape = LogShape {
        tables: names.to_vec(),
        vnode_count: map.vnode_count(),
        partitions,
        topic: job.topic.clone(),
        removed: Vec::new(),
    };
    let mut on_demand = OnDemand::new(
        shape.clone(),
        Box::new(exporter),
        dir,
        c.snapshot_interval_ms.map(Duration::from_millis),
        Requests::new(&props, &job.topic, &job.name)?,
        c.snapshot_keep,
        c.stores_in_kafka().then(|| props.clone()),
    )?
    .with_meter(&job.name, progress.meter.clone());
    let mut setup = Setup {
        job,
        dir: dir.to_path_buf(),
        url,
        server_id,
        tables,
        schemas,
        props,
        map,
        partitions,
        shape,
        config: CaptureConfig {
            barrier_interval_ms: c.barrier_interval_ms,
            checkpoint_interval_ms: c.checkpoint_interval_ms(),
            ..CaptureConfig::default()
        },
    };
    progress.set(|r| r.state = "starting");
    progress.meter.started(&job.name);
    let shown: Vec<String> = setup.tables.iter().map(MyTable::quoted).collect();
    retry(
        job,
        &shown.join(", "),
        stop,
        progress,
        |progress, checkpoints| session(&mut setup, stop, progress, &mut on_demand, checkpoints),
    )
}

/// The tables' columns and keys as the catalog has them now, and their row schemas.
fn catalog(
    conn: &mut mysql::Conn,
    url: &str,
    names: &[TableName],
) -> Result<(Vec<MyTable>, Vec<TableSchema>)> {
    let mut tables = Vec::new();
    let mut schemas = Vec::new();
    for name in names {
        let t = super::table_info(conn, &super::database_of(name, url), name)?;
        let json = row_schema(&name.to_string(), &t.encoder.columns);
        schemas.push(TableSchema::parse(&json.to_string(), &t.primary_key)?);
        tables.push(t);
    }
    Ok((tables, schemas))
}

fn permanent(e: anyhow::Error) -> CaptureFailure {
    CaptureFailure::permanent(crate::error::line(&e))
}

/// One session: fence every older capture and read what Kafka committed, then a fresh start (the
/// snapshot) or a resume, then the loop.
fn session(
    s: &mut Setup,
    stop: &CancellationToken,
    progress: &mut Progress,
    on_demand: &mut OnDemand,
    checkpoints: &mut (Option<u64>, Option<u64>),
) -> Result<(), CaptureFailure> {
    let job = s.job;
    let tables: Vec<(String, Vec<String>)> = (0..s.tables.len())
        .map(|i| (s.tables[i].name.to_string(), s.columns(i)))
        .collect();
    let template = StateRecord::fresh(&job.name, format!("binlog client {}", s.server_id), &tables);
    let (mut log, committed) = open_log(
        job,
        &s.props,
        s.partitions,
        &s.schemas,
        template,
        progress,
        &s.dir,
    )?;
    log.table_names = s.tables.iter().map(|t| t.name.table.clone()).collect();
    on_demand.session_started(&mut log, committed.as_ref());
    let mut conn = super::connect(&s.url).map_err(transient("connecting to MariaDB"))?;
    let (base, _) = super::binlogs(&mut conn).map_err(transient("listing the binary logs"))?;
    let server: Option<u32> =
        mysql::prelude::Queryable::query_first(&mut conn, "SELECT @@server_id")
            .map_err(|e| CaptureFailure::transient_from("reading @@server_id", e))?;
    drop(conn);
    // What says "the same server" across restarts: its server_id and binlog base name.
    let system = format!("mariadb server_id {} binlog {base}", server.unwrap_or(0));
    progress.positions = Positions::Binlog { base: base.clone() };
    // The tables as the stream resumes with them: the catalog's, or (one table) the columns of
    // the row schema in force at the resume epoch.
    let mut streams = s.tables.clone();
    let (mut a, initial) = match committed {
        None => {
            progress.set(|r| r.state = "snapshot");
            let (es, consistent) = match snapshot(s) {
                Ok(done) => done,
                // A table changed between the catalog read and the snapshot (nothing is
                // committed yet): the next session starts from the catalog as it is now.
                Err(e) if e.downcast_ref::<super::ColumnsMoved>().is_some() => {
                    let names: Vec<TableName> = s.tables.iter().map(|t| t.name.clone()).collect();
                    let mut conn =
                        super::connect(&s.url).map_err(transient("connecting to MariaDB"))?;
                    (s.tables, s.schemas) =
                        catalog(&mut conn, &s.url, &names).map_err(permanent)?;
                    return Err(CaptureFailure::transient_from(
                        "taking the first snapshot",
                        e,
                    ));
                }
                Err(e) => return Err(permanent(e)),
            };
            log.record.system_id = system;
            log.record.snapshot_epoch = es;
            log.on_initial_commit = Some(progress.publish_on_initial_commit(&s.dir));
            Assembler::fresh(s.config, s.map, es, consistent, unix_ms())
        }
        Some(record) => {
            let refuse = |m: String| Err(CaptureFailure::permanent(m));
            // Tables left out of the list leave the log, tables appended join it (docs/CAPTURE.md
            // "Removing a table", "Adding a table"); any other change needs a new topic.
            let now: Vec<String> = tables.iter().map(|t| t.0.clone()).collect();
            let change = crate::capture::session::tables_now(&job.topic, &record, &now)?;
            // The tables kept: removed ones are the last recorded, added ones the last listed.
            let recorded = record.tables();
            for ((name, captured), (_, now)) in recorded.iter().zip(&tables) {
                // Columns added since are a statement the binlog brings next (a new version).
                let captured: Vec<&str> = captured.iter().map(String::as_str).collect();
                let now: Vec<&str> = now.iter().map(String::as_str).collect();
                if let Err(why) = columns_followed(&captured, &now) {
                    return refuse(format!(
                        "the columns of {name} are now {now:?}, captured as {captured:?}: {why}; capture into a new topic"
                    ));
                }
            }
            if record.system_id != system {
                return refuse(format!(
                    "the source is {system}, the log was captured from {}: another server (a restore or failover); capture into a new topic",
                    record.system_id
                ));
            }
            first_snapshot_here(&job.name, &s.props, &s.dir, &record)?;
            if let Some(p) = &progress.published {
                p.tell();
            }
            if on_demand.stores_in_kafka() {
                sync_versions(&s.props, &job.topic, &s.dir)?;
            }
            // Each table with the columns of its row schema in force at the resume epoch.
            streams = Vec::new();
            for i in 0..s.tables.len() {
                let (table, schema) = in_force(s, i, record.state.epoch)?;
                log.use_table(i, schema).map_err(permanent)?;
                streams.push(table);
            }
            log.record = record.clone();
            crate::capture::session::remove_tables(job, &mut log, on_demand, &change.removed);
            let mut a = Assembler::resume(s.config, s.map, record.state);
            let mut initial = Vec::new();
            if !change.added.is_empty() {
                let mut joining = Vec::new();
                for &i in &change.added {
                    joining.push(Joining {
                        index: i,
                        table: s.tables[i].name.clone(),
                        columns: s.columns(i),
                        row_schema: in_force(s, i, record.state.epoch)?.1.json.to_string(),
                    });
                }
                join_tables(
                    job,
                    &s.props,
                    &s.dir,
                    &mut log,
                    &mut a,
                    joining,
                    &mut initial,
                )?;
            }
            (a, initial)
        }
    };
    checkpoints.0 = Some(a.committed().checkpoints);
    let mut repl = MyReplication::new(&s.url, s.server_id, &base, streams, &s.dir);
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

/// The one table with the columns of the row schema in force at `epoch` (the catalog's first
/// ones, their types unchanged), and that schema.
fn in_force(s: &Setup, i: usize, epoch: Epoch) -> Result<(MyTable, TableSchema), CaptureFailure> {
    let t = &s.tables[i];
    let name = (s.tables.len() > 1).then_some(t.name.table.as_str());
    let schema = schema_in_force(&s.dir, i, name, epoch, &s.schemas[i].json.to_string())?;
    let table = TableSchema::parse(&schema, &t.primary_key)
        .map_err(|e| CaptureFailure::permanent(e.to_string()))?;
    let n = table.columns.len();
    let catalog = &t.encoder.columns;
    let then: serde_json::Value = serde_json::from_str(&schema)
        .map_err(|e| CaptureFailure::permanent(format!("the row schema in force: {e}")))?;
    // Each union written as the version in force has it (null last: a column added with a default).
    let mut prefix = catalog[..n.min(catalog.len())].to_vec();
    super::types::order_nulls(&mut prefix, &crate::capture::types::nulls_last(&then));
    let prefix = &prefix[..];
    // A column added with a default declares it in the version (the value the rows already
    // there hold); the catalog's mapping has no defaults.
    let required_defaults_out = |mut schema: serde_json::Value| {
        if let Some(fields) = schema["fields"].as_array_mut() {
            for f in fields.iter_mut().filter(|f| f["type"][0] != "null") {
                if let Some(o) = f.as_object_mut() {
                    o.remove("default");
                }
            }
        }
        schema
    };
    if n > catalog.len()
        || row_schema(&t.name.to_string(), prefix) != required_defaults_out(then.clone())
    {
        return Err(CaptureFailure::permanent(format!(
            "the columns of {} are now {}, the log's row schema at epoch {epoch} is {then}: only columns added at the end are followed; capture into a new topic",
            t.quoted(),
            row_schema(&t.name.to_string(), catalog)
        )));
    }
    let mut table_now = t.clone();
    table_now.encoder.columns = prefix.to_vec();
    Ok((table_now, table))
}

/// Reads every table in one consistent snapshot into sorted per-vnode files in the snapshot
/// folder (several tables: a folder each) and writes the pending manifest; returns the snapshot
/// epoch and the binlog position the snapshot is at.
fn snapshot(s: &Setup) -> Result<(Epoch, u64)> {
    if s.dir.exists() {
        std::fs::remove_dir_all(&s.dir).with_context(|| format!("clearing {}", s.dir.display()))?;
    }
    let started = std::time::Instant::now();
    tracing::info!(job = %s.job.name, tables = s.tables.len(), "reading the tables in one consistent snapshot");
    let opened = super::Opened::open(&s.url)?;
    let (lsn, position) = (opened.lsn, opened.position.clone());
    let vnodes = s.shape.vnode_count;
    let copied = copy(
        opened,
        &s.tables,
        &s.schemas,
        vnodes,
        &s.dir,
        Columns::AsCaptured,
    )?;
    let rows = copied.rows;
    let es = Epoch::from_unix_millis(copied.import_ms);
    let pending = s.shape.manifest(copied, es, Vec::new()).to_json()?;
    write_durably(&s.dir.join(PENDING_MANIFEST), &pending)?;
    tracing::info!(job = %s.job.name, rows, seconds = started.elapsed().as_secs_f64(), binlog = %position, "snapshot read in one consistent snapshot");
    Ok((es, lsn))
}
