//! One job's capture from MariaDB, wired: the preconditions, the state read, the snapshot in one
//! consistent snapshot on a fresh start, the resume checks otherwise, and the sessions of
//! [`crate::capture::run_session`] with the PostgreSQL capture's bounded retry
//! (`capture::session::retry`). Not yet here (refused by check-config): snapshots of a running
//! capture, Kafka snapshot storage, column changes (a changed table stops the capture, naming it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use super::binlog::MyReplication;
use super::types::row_schema;
use super::MyTable;
use crate::capture::log::StateRecord;
use crate::capture::report::Positions;
use crate::capture::session::{
    end_session, finish_manifest, log_partitions, open_log, retry, schema_in_force, transient,
    write_durably, Progress, PENDING_MANIFEST,
};
use crate::capture::unix_ms;
use crate::capture::{run_session, CaptureFailure};
use crate::codec::TableSchema;
use crate::config::{JobConfig, TableName};
use crate::core::capture::{columns_followed, Assembler, CaptureConfig};
use crate::core::{vnode_of, Epoch, PartitionMap};
use crate::shutdown::CancellationToken;
use crate::snapshot::files::{Manifest, ManifestTable, SortedWriter, TablesManifest};

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
    drop(conn);
    let (partitions, map) = log_partitions(job, &props)?;
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
        config: CaptureConfig {
            barrier_interval_ms: c.barrier_interval_ms,
            checkpoint_interval_ms: c.checkpoint_interval_ms,
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
        |progress, checkpoints| session(&mut setup, stop, progress, checkpoints),
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
            let recorded = record.tables();
            if recorded.len() != tables.len()
                || recorded.iter().zip(&tables).any(|(r, n)| r.0 != n.0)
            {
                return refuse(format!(
                    "the log of topic {} was captured from {:?}, the tables are now {:?}: a MariaDB capture follows no change of its tables yet; capture into a new topic",
                    job.topic,
                    recorded.iter().map(|r| r.0).collect::<Vec<_>>(),
                    tables.iter().map(|t| &t.0).collect::<Vec<_>>()
                ));
            }
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
            if !s.dir.join("manifest.json").exists() {
                finish_manifest(&s.dir, &record).map_err(permanent)?;
            }
            if let Some(p) = &progress.published {
                p.tell();
            }
            // Each table with the columns of its row schema in force at the resume epoch.
            streams = Vec::new();
            for i in 0..s.tables.len() {
                let (table, schema) = in_force(s, i, record.state.epoch)?;
                log.use_table(i, schema).map_err(permanent)?;
                streams.push(table);
            }
            log.record = record.clone();
            (Assembler::resume(s.config, s.map, record.state), Vec::new())
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
        &mut |_| Ok(stop.is_cancelled()),
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
    let prefix = &catalog[..n.min(catalog.len())];
    let then: serde_json::Value = serde_json::from_str(&schema)
        .map_err(|e| CaptureFailure::permanent(format!("the row schema in force: {e}")))?;
    // A NOT NULL column added with a default declares it in the version (the value the rows
    // already there hold); the catalog's mapping has no defaults.
    let required_defaults_out = |mut schema: serde_json::Value| {
        if let Some(fields) = schema["fields"].as_array_mut() {
            for f in fields.iter_mut().filter(|f| !f["type"].is_array()) {
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
            "the columns of {} are now {}, the log's row schema at epoch {epoch} is {then}: only columns added at the end, nullable without a default, are followed; capture into a new topic",
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
    let several = s.tables.len() > 1;
    let vnodes = s.map.vnode_count();
    let mut writers = s
        .tables
        .iter()
        .zip(&s.schemas)
        .map(|(t, schema)| {
            let dir = if several {
                s.dir.join(&t.name.table)
            } else {
                s.dir.clone()
            };
            SortedWriter::new(&dir, schema, vnodes)
        })
        .collect::<Result<Vec<_>, _>>()?;
    tracing::info!(job = %s.job.name, tables = s.tables.len(), "reading the tables in one consistent snapshot");
    let snap = super::snapshot(&s.url, &s.tables, |i, datum, key| {
        writers[i].add(vnode_of(key, vnodes), key, datum)?;
        Ok(())
    })?;
    let mut tables = Vec::new();
    for ((t, schema), w) in s.tables.iter().zip(&s.schemas).zip(writers) {
        let mut files = w.finish()?;
        if several {
            for f in &mut files {
                f.path = format!("{}/{}", t.name.table, f.path);
            }
        }
        tables.push(ManifestTable {
            name: t.name.table.clone(),
            row_schema: schema.json.clone(),
            primary_key: schema.primary_key.clone(),
            files,
        });
    }
    let es = Epoch::from_unix_millis(snap.now_ms);
    let pending = if several {
        serde_json::to_vec_pretty(&TablesManifest {
            snapshot_epoch: es,
            vnode_count: vnodes,
            partition_count: s.partitions,
            topic: Some(s.job.topic.clone()),
            tables,
            start: Vec::new(),
        })?
    } else {
        let t = tables.remove(0);
        serde_json::to_vec_pretty(&Manifest {
            snapshot_epoch: es,
            vnode_count: vnodes,
            partition_count: s.partitions,
            topic: Some(s.job.topic.clone()),
            row_schema: t.row_schema,
            primary_key: t.primary_key,
            files: t.files,
            start: Vec::new(),
        })?
    };
    write_durably(&s.dir.join(PENDING_MANIFEST), &pending)?;
    tracing::info!(job = %s.job.name, rows = snap.rows, seconds = started.elapsed().as_secs_f64(), binlog = %snap.position, "snapshot read in one consistent snapshot");
    Ok((es, snap.lsn))
}
