//! Runs the configured jobs: checks each job's snapshot, topic and store against its configuration,
//! registers each job's runtime (`service::runtime`: its supervisor, store handles, progress and
//! limits) and runs its workers on dedicated threads.

use crate::shutdown::CancellationToken;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tracing::{error, info, warn};

use crate::codec::LogCodec;
use crate::codec::TableSchema;
use crate::config::{Config, JobConfig, SnapshotConfig, StoreConfig};
use crate::core::{PartitionMap, Supervisor, SupervisorConfig};
use crate::ports::StoreFactory;
use crate::ports::{SnapshotSource, StateStore};
use crate::service::runtime::{JobRuntime, Runtimes};
use crate::service::status::StatusBoard;
use crate::service::worker::{run_worker, WorkerSetup};
use crate::snapshot::files::SnapshotFiles;
use crate::snapshot::postgres::PostgresSnapshot;
use crate::store::sqlite::SqliteStore;

/// `run --exit-when-caught-up` gave up: this process's workers caught up, but the rest of the job
/// made no progress for [`RunOptions::job_wait`] (its vnodes are unowned or their owners stalled).
/// `main` exits with code 3 on it.
#[derive(Debug, thiserror::Error)]
#[error("job {job}: this process has caught up, but the job has not: partitions {partitions:?} have not reached the streaming phase ({vnodes_snapshot} vnodes in the snapshot, {vnodes_log_store} in the log store) and made no progress for {waited_secs} s; start workers for them or check their owners")]
pub struct JobIncomplete {
    pub job: String,
    pub partitions: Vec<crate::core::PartitionId>,
    pub vnodes_snapshot: u32,
    pub vnodes_log_store: u32,
    pub waited_secs: u64,
}

/// How `run` behaves.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Stop (exit 0) once every worker of every job is streaming with no lag.
    pub exit_when_caught_up: bool,
    /// Prefix of worker names (default: `<host>-p<pid>`), so that processes do not collide.
    pub worker_prefix: Option<String>,
    /// Workers join their groups as static members named `<worker_prefix>-<index>` unless the
    /// job's `[jobs.kafka]` names `group.instance.id` itself (`""` turns it off): set by `run`
    /// when the operator gives the prefix, a name that outlives the process.
    pub static_membership: bool,
    /// With `exit_when_caught_up`: how long to wait without any progress of the job's other vnodes
    /// once this process's workers have caught up, before giving up with [`JobIncomplete`].
    pub job_wait: Duration,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            exit_when_caught_up: false,
            worker_prefix: None,
            static_membership: false,
            job_wait: Duration::from_secs(60),
        }
    }
}

/// A job's checked inputs.
pub struct PreparedJob {
    pub config: JobConfig,
    pub snapshot: Arc<dyn SnapshotSource>,
    pub table: TableSchema,
    pub codec: Arc<LogCodec>,
    pub open_store: StoreFactory,
    /// The tables of the log the job materialises (`store.tables` for several).
    pub tables: crate::core::JobTables,
    /// A job of several tables: each one's store table, by log index (empty for one table).
    pub store_tables: Vec<crate::store::StoreTable>,
}

/// How often a job waiting for its snapshot looks for the manifest, and how often it says it still
/// waits.
const SNAPSHOT_LOOK_EVERY: Duration = Duration::from_millis(250);
const SNAPSHOT_WAIT_SAID_EVERY: Duration = Duration::from_secs(60);

/// A job with a capture whose snapshot folder has no `manifest.json` yet (`capture` started beside
/// this `run`, still copying): waits until the capture publishes it, saying so in the log and in
/// `/readyz`. The manifest is renamed into place whole (`snapshot::files::write_manifest`), so its
/// existence is the publication; with `snapshot_storage = "kafka"`, the publication is the state
/// record naming the snapshot's topic. False when the process is told to stop first. A job
/// without a capture does not wait: a missing snapshot is an error `prepare` names.
fn wait_for_snapshot(
    job: &JobConfig,
    shutdown: &CancellationToken,
    runtimes: &Runtimes,
) -> Result<bool> {
    let (Some(c), SnapshotConfig::Files { dir, .. }) = (&job.capture, &job.snapshot) else {
        return Ok(true);
    };
    let manifest = dir.join("manifest.json");
    let in_kafka = c.stores_in_kafka();
    let published = || snapshot_published(job);
    if published()? {
        return Ok(true);
    }
    let (what, look_every) = if in_kafka {
        (
            format!(
                "its snapshot, stored in Kafka by its capture (kafka-backfill capture --job {}; the topic {} lists it)",
                job.name,
                crate::capture::log::state_topic(&job.topic)
            ),
            SNAPSHOT_LOOK_EVERY * 4,
        )
    } else {
        (
            format!(
                "its snapshot {} (its capture publishes it: kafka-backfill capture --job {})",
                manifest.display(),
                job.name
            ),
            SNAPSHOT_LOOK_EVERY,
        )
    };
    info!(job = %job.name, "waiting for {what}");
    runtimes.set_waiting(&job.name, what);
    let started = std::time::Instant::now();
    let mut said = started;
    while !published()? {
        if crate::shutdown::wait_blocking(shutdown, look_every) {
            return Ok(false);
        }
        if said.elapsed() >= SNAPSHOT_WAIT_SAID_EVERY {
            said = std::time::Instant::now();
            info!(job = %job.name, waited_secs = started.elapsed().as_secs(), "still waiting for the capture to publish the snapshot");
        }
    }
    runtimes.clear_waiting(&job.name);
    info!(job = %job.name, waited_ms = started.elapsed().as_millis() as u64, "the snapshot is published; starting the job");
    Ok(true)
}

/// Whether the snapshot a job starts from is published: always for a job without a capture (a
/// missing snapshot is an error `prepare` names); for a captured one, its manifest in the snapshot
/// folder (renamed into place whole by `snapshot::files::write_manifest`, so its existence is the
/// publication), or with `snapshot_storage = "kafka"` a snapshot listed by the capture's state
/// record.
pub fn snapshot_published(job: &JobConfig) -> Result<bool> {
    let (Some(c), SnapshotConfig::Files { dir, .. }) = (&job.capture, &job.snapshot) else {
        return Ok(true);
    };
    Ok(if c.stores_in_kafka() {
        kafka_stored(job)?.is_some_and(|s| !s.list.is_empty())
    } else {
        dir.join("manifest.json").exists()
    })
}

/// `snapshot_storage = "kafka"`: the schema versions of the job's log come from the versions topic
/// (`<topic>.schema-versions`, [`crate::snapshot::kafka::versions_topic`]) into the snapshot folder
/// of `dir` ([`crate::snapshot::versions::home`]) before each look at them (the capture's folder
/// is elsewhere).
fn versions_sync(
    job: &JobConfig,
    dir: &std::path::Path,
) -> Result<Option<crate::snapshot::versions::SyncVersions>> {
    if !job
        .capture
        .as_ref()
        .is_some_and(crate::config::CaptureSection::stores_in_kafka)
    {
        return Ok(None);
    }
    let props = crate::kafka::producer_properties(&job.kafka);
    let home = crate::snapshot::versions::home(dir);
    let mirror = crate::snapshot::kafka::VersionsMirror::new(&props, &job.topic, &home)
        .with_context(|| format!("job {}: reading the schema versions from Kafka", job.name))?;
    let mirror = Mutex::new(mirror);
    Ok(Some(Arc::new(move || {
        mirror
            .lock()
            .unwrap()
            .sync()
            .map(|_| ())
            .map_err(|e| crate::error::line(&e))
    })))
}

/// A job's snapshot, opened and checked against the job's configuration (what `run` and
/// `check-config` both read, so the two refuse the same snapshots).
struct OpenedSnapshot {
    snapshot: Arc<dyn SnapshotSource>,
    table: TableSchema,
    /// Where it is, for errors (the manifest's path, or the PostgreSQL snapshot's name).
    manifest: String,
    log_tables: Vec<TableSchema>,
    table_index: usize,
    evolution: Option<Arc<crate::codec::versions::Evolution>>,
    store_tables: Vec<crate::store::StoreTable>,
    info: crate::ports::SnapshotInfo,
    map: PartitionMap,
}

/// Opens the job's snapshot (its tables, schema versions and start) and checks it against the job.
fn open_snapshot(job: &JobConfig) -> Result<OpenedSnapshot> {
    // The log's tables, when the snapshot names them (files); else the job's table is the log's one.
    let mut log_tables: Vec<TableSchema> = Vec::new();
    let mut table_index = 0;
    // The log's schema versions (docs/WIRE.md "Schema changes"): a folder beside a file snapshot.
    let mut evolution = None;
    // A job of several tables: each one's store table (docs/design/several-tables.md §3).
    let mut store_tables: Vec<crate::store::StoreTable> = Vec::new();
    let (snapshot, table, manifest): (Arc<dyn SnapshotSource>, TableSchema, String) = match &job
        .snapshot
    {
        SnapshotConfig::Files { dir, .. } if !job.store.tables().is_empty() => {
            let mut parts: Vec<(u16, Box<dyn SnapshotSource>)> = Vec::new();
            let names: Vec<&str> = job.store.tables().keys().map(|n| n.as_str()).collect();
            let opened = SnapshotFiles::open_tables(dir, &names).with_context(|| {
                format!("job {}: opening the snapshot of store.tables", job.name)
            })?;
            // The manifest's names, which the schema versions name (not the row records').
            let mut log_names: Vec<Option<String>> = Vec::new();
            for ((name, sql), s) in job.store.tables().iter().zip(opened) {
                log_tables = s.tables.iter().map(|t| t.schema.clone()).collect();
                log_names = s.tables.iter().map(|t| Some(t.name.clone())).collect();
                store_tables.push(crate::store::StoreTable {
                    index: s.table_index as u16,
                    source: name.clone(),
                    name: sql.clone(),
                    schema: s.table.clone(),
                });
                parts.push((s.table_index as u16, Box::new(s)));
            }
            store_tables.sort_by_key(|t| t.index);
            let manifest = dir.join("manifest.json").display().to_string();
            let ev = crate::snapshot::versions::evolution(
                dir,
                log_tables.clone(),
                log_names,
                parts[0].1.info().snapshot_epoch,
                versions_sync(job, dir)?,
            )
            .with_context(|| format!("job {}: reading the snapshot's schema versions", job.name))?;
            // The codec knows every table's versions (the others' changes are passed over);
            // the store follows each of its own tables' ([`store_factory`]).
            evolution = Some(ev);
            let s = crate::snapshot::tables::TablesSnapshot::new(parts, &manifest)
                .with_context(|| format!("job {}: opening the snapshot", job.name))?;
            (Arc::new(s), store_tables[0].schema.clone(), manifest)
        }
        SnapshotConfig::Files { dir, table } => {
            let s = SnapshotFiles::open_table(dir, table.as_deref())
                .with_context(|| format!("job {}: opening the snapshot", job.name))?;
            let table = s.table.clone();
            log_tables = s.tables.iter().map(|t| t.schema.clone()).collect();
            table_index = s.table_index;
            let ev = crate::snapshot::versions::evolution(
                dir,
                log_tables.clone(),
                s.tables.iter().map(|t| Some(t.name.clone())).collect(),
                s.info().snapshot_epoch,
                versions_sync(job, dir)?,
            )
            .with_context(|| format!("job {}: reading the snapshot's schema versions", job.name))?;
            check_versions_allowed(job, &ev.current(), table_index)?;
            evolution = Some(ev);
            (
                Arc::new(s),
                table,
                dir.join("manifest.json").display().to_string(),
            )
        }
        SnapshotConfig::Postgres { url, name } => {
            let s = PostgresSnapshot::open(url.expose(), name)
                .with_context(|| format!("job {}: opening the snapshot", job.name))?;
            let table = s.table().clone();
            (
                Arc::new(s),
                table,
                format!(
                    "snapshot {name} in {}",
                    crate::pg_tls::redact_url(url.expose())
                ),
            )
        }
    };
    let info = snapshot.info().clone();
    check_against_snapshot(job, &table, &info, &manifest)?;
    let map = PartitionMap::new(info.vnode_count, info.partition_count)
        .with_context(|| manifest.clone())?;
    Ok(OpenedSnapshot {
        snapshot,
        table,
        manifest,
        log_tables,
        table_index,
        evolution,
        store_tables,
        info,
        map,
    })
}

/// Opens the snapshot, checks it against the configuration and the topic, and prepares the store.
/// A job with a capture reads the snapshot its store recorded, or (a new job) the newest one: from
/// `snapshot.dir` and its later snapshots, or (`snapshot_storage = "kafka"`) restored from the
/// topics the capture's state record lists.
pub fn prepare(job: &JobConfig, check_topic: bool) -> Result<PreparedJob> {
    if let Some(stored) = kafka_stored(job)? {
        return prepare_stored(job, check_topic, stored);
    }
    // A capture's later snapshots (docs/CAPTURE.md "Snapshots of a running capture"): a new job
    // starts from the newest, one that started before goes on with the one its store recorded.
    let later = match &job.snapshot {
        SnapshotConfig::Files { dir, .. } => {
            !crate::snapshot::published::later_snapshots(dir).is_empty()
        }
        SnapshotConfig::Postgres { .. } => false,
    };
    match (later, &job.snapshot) {
        (true, SnapshotConfig::Files { dir, .. }) => {
            let first = dir.clone();
            let mark = |folder: &std::path::Path| {
                if let Err(e) = crate::snapshot::published::mark_reader(folder, &job.name) {
                    warn!(job = %job.name, dir = %folder.display(), error = %e, "cannot mark the snapshot as read by this job: the capture's snapshot_keep may retire it while the job needs it (a recreation reads it again)");
                }
            };
            let newer = |current, earliest: &[u64]| {
                let candidates: Vec<_> = crate::snapshot::published::later_snapshots(&first)
                    .into_iter()
                    .filter_map(|(_, f)| {
                        crate::snapshot::files::manifest_starts(&f).map(|(e, s)| (e, s, f))
                    })
                    .collect();
                let listed: Vec<_> = candidates.iter().map(|(e, s, _)| (*e, s.clone())).collect();
                let Some(e) = crate::core::retention::newest_within(&listed, current, earliest)
                else {
                    return Ok(None);
                };
                let folder = candidates
                    .into_iter()
                    .find(|(c, _, _)| *c == e)
                    .expect("listed")
                    .2;
                mark(&folder);
                Ok(Some((e, folder)))
            };
            // Opened at the newest first: a new job's table is created from the snapshot it will
            // read (a later one may have columns the first has not); a job that started before
            // moves to the one its store recorded.
            let newest = crate::snapshot::published::choose(&first, None)
                .expect("a later snapshot is published");
            prepare_at(
                &job_at(job, newest.1.clone()),
                check_topic,
                Some(&|recorded| {
                    let (epoch, folder) = match recorded {
                        None => newest.clone(),
                        Some(e) => {
                            let chosen = crate::snapshot::published::choose(&first, Some(e))
                                .unwrap_or((e, first.clone()));
                            if holds_job_tables(job, &chosen.1) {
                                chosen
                            } else {
                                gains_tables(job, e, newest.0);
                                newest.clone()
                            }
                        }
                    };
                    if folder != first {
                        mark(&folder);
                    }
                    Ok(Some((epoch, folder)))
                }),
                Some(&newer),
            )
        }
        _ => prepare_at(job, check_topic, None, None),
    }
}

/// A snapshot the capture stored in Kafka: its epoch, its topic, and the folder under the job's
/// `snapshot.dir` it is restored into (the first: `snapshot.dir` itself; a later one:
/// `snapshots/<epoch>`).
#[derive(Clone, Debug)]
struct Stored {
    epoch: crate::core::Epoch,
    /// Its start offsets, by partition.
    start_offsets: Vec<u64>,
    topic: String,
    folder: std::path::PathBuf,
}

/// The snapshots a capture stored in Kafka, oldest first, and the capture's job name.
#[derive(Clone, Debug, Default)]
struct StoredSnapshots {
    capture_job: String,
    list: Vec<Stored>,
}

/// `snapshot_storage = "kafka"`: the snapshots the state record of the capture writing the job's
/// topic lists as stored (`None` with files only, or without a capture).
fn kafka_stored(job: &JobConfig) -> Result<Option<StoredSnapshots>> {
    let (Some(c), SnapshotConfig::Files { dir, .. }) = (&job.capture, &job.snapshot) else {
        return Ok(None);
    };
    if !c.stores_in_kafka() {
        return Ok(None);
    }
    let props = crate::kafka::producer_properties(&job.kafka);
    let record = crate::capture::log::read_capture_state(&props, &job.topic)
        .with_context(|| format!("job {}: reading its capture's state record", job.name))?;
    let mut stored = StoredSnapshots::default();
    if let Some(r) = record {
        stored.capture_job = r.job.clone();
        if let Some(topic) = &r.snapshot_topic {
            stored.list.push(Stored {
                epoch: r.snapshot_epoch,
                start_offsets: r.start_offsets.clone(),
                topic: topic.clone(),
                folder: dir.clone(),
            });
        }
        for l in &r.snapshots {
            if let Some(topic) = &l.topic {
                stored.list.push(Stored {
                    epoch: l.snapshot_epoch,
                    start_offsets: l.start_offsets.clone(),
                    topic: topic.clone(),
                    folder: dir
                        .join(crate::snapshot::published::SNAPSHOTS)
                        .join(l.snapshot_epoch.0.to_string()),
                });
            }
        }
    }
    Ok(Some(stored))
}

/// The folder of `stored`, restored from its topic unless this machine has it already (a
/// manifest of that epoch there); a manifest of another epoch there is refused.
fn restored(job: &JobConfig, stored: &Stored) -> Result<std::path::PathBuf> {
    let manifest = stored.folder.join("manifest.json");
    if let Ok(text) = std::fs::read(&manifest) {
        let epoch = serde_json::from_slice::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["snapshot_epoch"].as_u64());
        if epoch == Some(stored.epoch.0) {
            return Ok(stored.folder.clone());
        }
        bail!(
            "job {}: {} is the snapshot at epoch {}, but the capture stored the one at epoch {} there (topic {}): snapshot.dir holds another log's snapshot; empty it or choose another folder",
            job.name,
            manifest.display(),
            epoch.map_or("?".to_string(), |e| e.to_string()),
            stored.epoch,
            stored.topic
        );
    }
    let props = crate::kafka::producer_properties(&job.kafka);
    info!(job = %job.name, topic = %stored.topic, epoch = %stored.epoch, dir = %stored.folder.display(), "restoring the snapshot from Kafka");
    let moved = crate::snapshot::kafka::restore(&props, &stored.topic, &stored.folder, &|_| true)
        .with_context(|| format!("job {}: restoring its snapshot", job.name))?;
    info!(job = %job.name, topic = %stored.topic, files = moved.files, bytes = moved.bytes, seconds = moved.seconds, "snapshot restored from Kafka");
    Ok(stored.folder.clone())
}

/// `job` reading the snapshot folder `dir`.
fn job_at(job: &JobConfig, dir: std::path::PathBuf) -> JobConfig {
    let mut at = job.clone();
    if let SnapshotConfig::Files { dir: d, .. } = &mut at.snapshot {
        *d = dir;
    }
    at
}

/// [`prepare`] with `snapshot_storage = "kafka"`: the newest stored snapshot is restored and opened
/// (a new job reads it); a job whose store recorded another reads that one, restored in turn. The
/// job's choice is marked on the state topic so that the capture keeps it. A snapshot retired
/// between the state record's read and its restore (the capture had not seen the mark yet) is
/// given up for the then newest, a bounded number of times.
fn prepare_stored(
    job: &JobConfig,
    check_topic: bool,
    mut stored: StoredSnapshots,
) -> Result<PreparedJob> {
    const ATTEMPTS: u32 = 3;
    let mut attempt = 1;
    loop {
        match prepare_stored_once(job, check_topic, &stored) {
            Err(e) if attempt < ATTEMPTS && crate::error::line(&e).contains(RETIRED) => {
                warn!(job = %job.name, error = %crate::error::line(&e), attempt, "the snapshot was retired before it was restored; reading the capture's list again");
                attempt += 1;
                stored = kafka_stored(job)?.unwrap_or_default();
            }
            done => return done,
        }
    }
}

/// What [`crate::snapshot::kafka::restore`] says of a topic that is gone.
const RETIRED: &str = crate::snapshot::kafka::GONE;

fn prepare_stored_once(
    job: &JobConfig,
    check_topic: bool,
    stored: &StoredSnapshots,
) -> Result<PreparedJob> {
    let Some(newest) = stored.list.last().cloned() else {
        bail!(
            "job {}: its capture has stored no snapshot in Kafka yet (snapshot_storage = \"kafka\"): start kafka-backfill capture --job {}",
            job.name,
            job.name
        );
    };
    // Two marks keep what the job needs from retirement: `<job>.starting` the newest while the
    // job looks (it reads it unless its store recorded another), then `<job>` its choice.
    let starting = format!("{}.starting", job.name);
    let mark = |reader: &str, epoch: Option<crate::core::Epoch>| {
        let props = crate::kafka::producer_properties(&job.kafka);
        let marked = crate::capture::snapshots::mark_reading(
            &props,
            &job.topic,
            &stored.capture_job,
            reader,
            epoch,
        );
        if let Err(e) = marked {
            warn!(job = %job.name, error = %crate::error::line(&e), "cannot mark the snapshot as read by this job: the capture's snapshot_keep may retire it while the job needs it (a recreation reads it again)");
        }
    };
    mark(&starting, Some(newest.epoch));
    let at = job_at(job, restored(job, &newest)?);
    let chose = |epoch| {
        mark(&job.name, Some(epoch));
        mark(&starting, None);
    };
    let redirect = |recorded: Option<crate::core::Epoch>| -> Result<Option<(crate::core::Epoch, std::path::PathBuf)>> {
        let Some(e) = recorded.filter(|e| *e != newest.epoch) else {
            chose(newest.epoch);
            return Ok(None);
        };
        let Some(chosen) = stored.list.iter().find(|s| s.epoch == e) else {
            // Retired in Kafka (its mark came too late), but restored here before: read it here.
            let local = match &job.snapshot {
                SnapshotConfig::Files { dir, .. } => Some(
                    dir.join(crate::snapshot::published::SNAPSHOTS)
                        .join(e.0.to_string()),
                ),
                SnapshotConfig::Postgres { .. } => None,
            };
            if let Some(folder) =
                local.filter(|f| crate::snapshot::files::manifest_epoch(f) == Some(e))
            {
                chose(e);
                return Ok(Some((e, folder)));
            }
            bail!(
                "job {}: it started from the snapshot at epoch {e}, which its capture no longer stores (stored: {}); a new job name starts from the newest",
                job.name,
                stored.list.iter().map(|s| s.epoch.to_string()).collect::<Vec<_>>().join(", ")
            );
        };
        let folder = restored(job, chosen)?;
        if !holds_job_tables(job, &folder) {
            gains_tables(job, chosen.epoch, newest.epoch);
            chose(newest.epoch);
            return Ok(None);
        }
        chose(chosen.epoch);
        Ok(Some((chosen.epoch, folder)))
    };
    let newer = |current, earliest: &[u64]| {
        let listed: Vec<_> = stored
            .list
            .iter()
            .map(|s| (s.epoch, s.start_offsets.clone()))
            .collect();
        let Some(e) = crate::core::retention::newest_within(&listed, current, earliest) else {
            return Ok(None);
        };
        let chosen = stored.list.iter().find(|s| s.epoch == e).expect("listed");
        let folder = restored(job, chosen)?;
        chose(e);
        Ok(Some((e, folder)))
    };
    prepare_at(&at, check_topic, Some(&redirect), Some(&newer))
}

/// Where a job whose log was deleted goes (`crate::core::retention`): given the snapshot epoch it
/// reads and the log's earliest offsets, the epoch and folder of the newest snapshot of its
/// capture newer than that whose start offsets all still exist, ready to open (restored, marked
/// as read), or `None`.
type Newer<'a> = &'a dyn Fn(
    crate::core::Epoch,
    &[u64],
) -> Result<Option<(crate::core::Epoch, std::path::PathBuf)>>;

/// A job whose log is gone, and no snapshot of its capture starts within the log: `run` asks the
/// capture for one ([`ask_for_a_snapshot`]) and prepares the job again.
#[derive(Debug, thiserror::Error)]
#[error("job {job}: {gone} — and its capture has no snapshot newer than epoch {current} whose start offsets are all still in the log (earliest offsets {earliest:?})")]
pub struct NoSnapshotWithinLog {
    job: String,
    gone: crate::core::LogStartGone,
    current: crate::core::Epoch,
    earliest: Vec<u64>,
}

/// How long a job whose log is gone waits for the snapshot it asked its capture for.
const ASKED_SNAPSHOT_WITHIN: Duration = Duration::from_secs(600);

/// A job whose log is gone asks its capture for a snapshot ([`crate::capture::snapshots::request`],
/// as `kafka-backfill snapshot` does) and waits, saying so in the log and in `/readyz`, until the
/// capture's state record lists one that answers the request (stored, with Kafka storage). False
/// when the process is told to stop first; an error when none answers within
/// [`ASKED_SNAPSHOT_WITHIN`].
fn ask_for_a_snapshot(
    job: &JobConfig,
    why: &NoSnapshotWithinLog,
    shutdown: &CancellationToken,
    runtimes: &Runtimes,
) -> Result<bool> {
    let props = crate::kafka::producer_properties(&job.kafka);
    let in_kafka = job
        .capture
        .as_ref()
        .is_some_and(crate::config::CaptureSection::stores_in_kafka);
    let capture_job = crate::capture::log::read_capture_state(&props, &job.topic)
        .with_context(|| format!("job {}: reading its capture's state record", job.name))?
        .map_or_else(|| job.name.clone(), |r| r.job);
    let offset = crate::capture::snapshots::request(&props, &job.topic, &capture_job)
        .with_context(|| format!("job {}: asking its capture for a snapshot", job.name))?;
    let what = format!(
        "a snapshot it asked its capture (job {capture_job}) for: its log is gone and no snapshot starts within it"
    );
    warn!(job = %job.name, cause = %why, request = offset, "the job asks its capture for a snapshot that starts within the log, and waits for it");
    runtimes.set_waiting(&job.name, what);
    let started = std::time::Instant::now();
    loop {
        let answer =
            crate::capture::snapshots::answer(&props, &job.topic, &capture_job, offset, in_kafka)
                .with_context(|| format!("job {}: reading its capture's state record", job.name))?;
        if answer.is_some() {
            break;
        }
        if started.elapsed() >= ASKED_SNAPSHOT_WITHIN {
            bail!(
                "{why}; the snapshot it asked its capture (job {capture_job}) for was not published within {} s: is `kafka-backfill capture --job {capture_job}` running? Its log says why a snapshot failed",
                ASKED_SNAPSHOT_WITHIN.as_secs()
            );
        }
        if crate::shutdown::wait_blocking(shutdown, SNAPSHOT_LOOK_EVERY * 4) {
            return Ok(false);
        }
    }
    runtimes.clear_waiting(&job.name);
    info!(job = %job.name, waited_ms = started.elapsed().as_millis() as u64, "the capture published the snapshot the job asked for");
    Ok(true)
}

/// Before a job reads anything: if a partition's needed offset (its committed offset, else the
/// snapshot's start) was deleted from the log, the folder of the snapshot it moves to instead
/// (`newer`; a started job is recreated onto it, a new generation), or the error that names the
/// gap when there is none. `None`: the log holds what the job needs.
fn move_if_log_gone(
    job: &JobConfig,
    info: &crate::ports::SnapshotInfo,
    store: &mut dyn StateStore,
    newer: Option<Newer<'_>>,
) -> Result<Option<std::path::PathBuf>> {
    let earliest =
        crate::kafka::admin::earliest_offsets(&job.kafka, &job.topic, info.partition_count)
            .with_context(|| format!("job {}", job.name))?;
    let row = store
        .job(&job.name)
        .with_context(|| format!("job {}: reading its job row", job.name))?;
    let committed = match &row {
        Some(r) if r.snapshot_epoch == info.snapshot_epoch => store
            .committed_partitions(&job.name)
            .with_context(|| format!("job {}: reading its progress", job.name))?,
        _ => BTreeMap::new(),
    };
    let needed: Vec<_> = info
        .start
        .iter()
        .map(|s| {
            let at = committed.get(&s.partition).unwrap_or(s);
            (s.partition, at.next_offset)
        })
        .collect();
    let Err(gone) = crate::core::retention::first_gone(&job.topic, &needed, &earliest) else {
        return Ok(None);
    };
    let Some(newer) = newer else {
        return Err(anyhow::Error::new(gone).context(format!("job {}", job.name)));
    };
    let Some((epoch, folder)) = newer(info.snapshot_epoch, &earliest)? else {
        return Err(NoSnapshotWithinLog {
            job: job.name.clone(),
            gone,
            current: info.snapshot_epoch,
            earliest,
        }
        .into());
    };
    match row {
        Some(r) => {
            let moved = store
                .recreate_onto(&job.name, r.generation, Some(epoch))
                .with_context(|| {
                    format!("job {}: moving to the snapshot at epoch {epoch}", job.name)
                })?;
            warn!(job = %job.name, cause = %gone, from = %info.snapshot_epoch, to = %epoch, generation = %moved.generation, dir = %folder.display(), "the log the job needs was deleted: it moves to a newer snapshot of its capture (a new generation; its rows are loaded again from that snapshot)");
        }
        None => {
            warn!(job = %job.name, cause = %gone, from = %info.snapshot_epoch, to = %epoch, dir = %folder.display(), "the log after the snapshot was deleted: the new job starts from a newer snapshot of its capture");
        }
    }
    Ok(Some(folder))
}

/// Where a job with later snapshots reads: given the snapshot epoch its store recorded (`None`: a
/// new job), the epoch and folder of another snapshot to read instead (`None`: the one opened).
type Redirect<'a> = &'a dyn Fn(
    Option<crate::core::Epoch>,
) -> Result<Option<(crate::core::Epoch, std::path::PathBuf)>>;

/// [`prepare`] of the snapshot `job.snapshot` names, or of the one `redirect` says.
fn prepare_at(
    job: &JobConfig,
    check_topic: bool,
    redirect: Option<Redirect<'_>>,
    newer: Option<Newer<'_>>,
) -> Result<PreparedJob> {
    let OpenedSnapshot {
        snapshot,
        table,
        manifest,
        log_tables,
        table_index,
        evolution,
        store_tables,
        info,
        map,
    } = open_snapshot(job)?;
    if check_topic {
        crate::service::doctor::wait_reachable(job)?;
        let bootstrap = &job.kafka["bootstrap.servers"];
        match crate::kafka::admin::partition_count(&job.kafka, &job.topic)
            .with_context(|| format!("job {}", job.name))?
        {
            None => bail!(
                "job {}: topic {} does not exist at {bootstrap}",
                job.name,
                job.topic
            ),
            Some(n) => map
                .check_partition_count(n, &format!("topic {}", job.topic))
                .with_context(|| format!("job {} (snapshot {manifest})", job.name))?,
        }
    }
    let tables = if store_tables.is_empty() {
        crate::core::JobTables::One(table_index as u16)
    } else {
        crate::core::JobTables::Several(store_tables.iter().map(|t| t.index).collect())
    };
    let mut codec = if let crate::core::JobTables::Several(own) = &tables {
        LogCodec::of_tables(&log_tables, own)?
    } else if log_tables.len() > 1 {
        LogCodec::of_log(&log_tables, table_index)?
    } else {
        LogCodec::new(table.clone())?
    };
    if let Some(ev) = &evolution {
        codec = codec.with_evolution(ev.clone());
    }
    let codec = Arc::new(codec);
    let open_store = store_factory(
        &job.store,
        table.clone(),
        job.consistency == crate::config::Consistency::Epoch,
        evolution.map(|ev| (ev, table_index)),
        store_tables.clone(),
    )?;
    // Fail fast on a store that disagrees with the snapshot (e.g. a changed partition count).
    let mut store = open_store().with_context(|| format!("job {}: opening the store", job.name))?;
    if let Some(redirect) = redirect {
        let recorded = store
            .job(&job.name)
            .with_context(|| format!("job {}: reading its job row", job.name))?
            .map(|r| r.snapshot_epoch);
        if let Some((epoch, folder)) = redirect(recorded)? {
            drop(store);
            if crate::snapshot::versions::home(&folder) == folder {
                info!(job = %job.name, %epoch, dir = %folder.display(), "reading the capture's first snapshot: the one the job started from");
            } else {
                let which = match recorded {
                    Some(e) if e == epoch => "the one the job started from",
                    Some(_) => "the newest, which holds the tables the job gained",
                    None => "the newest published",
                };
                info!(job = %job.name, %epoch, dir = %folder.display(), "reading a later snapshot of the capture: {which}");
            }
            return prepare_at(&job_at(job, folder), check_topic, None, newer);
        }
    }
    if check_topic {
        if let Some(folder) = move_if_log_gone(job, &info, &mut *store, newer)? {
            drop(store);
            return prepare_at(&job_at(job, folder), check_topic, None, newer);
        }
    }
    store
        .ensure_job(&job.name, &info)
        .with_context(|| format!("job {}", job.name))?;
    Ok(PreparedJob {
        config: job.clone(),
        snapshot,
        table,
        codec,
        open_store,
        tables,
        store_tables,
    })
}

/// What a job's configuration must agree on with its snapshot's table (read from `source`, a manifest
/// path or a PostgreSQL snapshot): the vnode count, and a store layout the row schema allows. `run`
/// refuses these before it opens anything else; `check-config` checks them whenever it can read the
/// snapshot ([`check_snapshot_files`]), so that it never passes what `run` refuses.
pub fn check_against_snapshot(
    job: &JobConfig,
    table: &TableSchema,
    info: &crate::ports::SnapshotInfo,
    source: &str,
) -> Result<()> {
    if info.vnode_count != job.vnode_count {
        bail!(
            "job {}: vnode_count is {} in the configuration but {} in {}",
            job.name,
            job.vnode_count,
            info.vnode_count,
            source
        );
    }
    if let StoreConfig::Sqlite {
        store_datum: false, ..
    } = &job.store
    {
        if let Some((field, ty)) = table.first_composite_field() {
            bail!(
                "job {}: store.store_datum = false needs a row schema of primitives and nullable primitives (each row is rebuilt from its typed columns), but field {field} of the row schema in {source} is {ty}: keep store_datum = true for this table",
                job.name
            );
        }
    }
    Ok(())
}

/// `check-config`'s look at a job's snapshot files: `Ok(None)` when `dir/manifest.json` was read and
/// agrees with the job ([`check_against_snapshot`]); `Ok(Some(why))` when there is nothing to read
/// yet (no manifest: a capture or a producer writes it later; a PostgreSQL snapshot is not
/// connected to); an error for a manifest that `run` would refuse.
pub fn check_snapshot_files(job: &JobConfig) -> Result<Option<String>> {
    let SnapshotConfig::Files { dir, .. } = &job.snapshot else {
        return Ok(Some(format!(
            "job {}: snapshot not checked (a PostgreSQL snapshot is read at run)",
            job.name
        )));
    };
    let manifest = dir.join("manifest.json");
    if !manifest.exists() {
        return Ok(Some(format!(
            "job {}: snapshot not checked ({} does not exist yet)",
            job.name,
            manifest.display()
        )));
    }
    // Exactly what `run` reads and checks before it opens the store.
    open_snapshot(job)?;
    Ok(None)
}

/// A job whose store cannot take a schema version yet (SQLite with `store_datum = false`: no datum
/// to resolve; a job of several tables always stores it) is refused at start when its log already
/// announces one, rather than at that version's checkpoint, hours in. A version announced later
/// is refused by the store at its checkpoint, with nothing of it committed.
fn check_versions_allowed(
    job: &JobConfig,
    versions: &crate::codec::versions::SchemaVersions,
    table: usize,
) -> Result<()> {
    let all = versions.of(table);
    let Some(first) = all.get(1) else {
        return Ok(());
    };
    let setting = if matches!(
        job.store,
        StoreConfig::Sqlite {
            store_datum: false,
            ..
        }
    ) {
        "jobs.store.store_datum = false: schema changes are applied with store_datum = true (each row's datum is resolved to the new version)"
    } else {
        return Ok(());
    };
    bail!(
        "job {}: the log announces {} schema version(s) of its table {} (the first from epoch {}), and {setting}",
        job.name,
        all.len() - 1,
        all[0].table.name,
        first.from_epoch
    )
}

/// Opens state stores of the configured kind (one handle per worker); `publication`:
/// `consistency = "epoch"`.
pub fn store_factory(
    store: &StoreConfig,
    schema: crate::codec::TableSchema,
    publication: bool,
    evolution: Option<(Arc<crate::codec::versions::Evolution>, usize)>,
    several: Vec<crate::store::StoreTable>,
) -> Result<StoreFactory> {
    Ok(match store.clone() {
        StoreConfig::Sqlite {
            path,
            table,
            store_datum,
            ..
        } => {
            if let Some(parent) = path.parent() {
                if !parent.as_os_str().is_empty() {
                    std::fs::create_dir_all(parent)
                        .with_context(|| format!("creating {}", parent.display()))?;
                }
            }
            let options = crate::store::sqlite::SqliteOptions {
                store_datum,
                publication,
                ..Default::default()
            };
            if !several.is_empty() {
                return Ok(Arc::new(move || {
                    SqliteStore::open_tables(&path, several.clone(), options).map(|s| {
                        Box::new(match &evolution {
                            Some((ev, t)) => s.with_evolution(ev.clone(), *t),
                            None => s,
                        }) as Box<dyn StateStore>
                    })
                }));
            }
            Arc::new(move || {
                SqliteStore::open_with(&path, &table, schema.clone(), options).map(|s| {
                    Box::new(match &evolution {
                        Some((ev, t)) => s.with_evolution(ev.clone(), *t),
                        None => s,
                    }) as Box<dyn StateStore>
                })
            })
        }
        StoreConfig::Postgres { url, .. } if !several.is_empty() => Arc::new(move || {
            crate::store::postgres::PostgresStore::open_tables(
                url.expose(),
                several.clone(),
                publication,
            )
            .map(|s| {
                Box::new(match &evolution {
                    Some((ev, t)) => s.with_evolution(ev.clone(), *t),
                    None => s,
                }) as Box<dyn StateStore>
            })
        }),
        StoreConfig::Postgres { url, table, .. } => Arc::new(move || {
            crate::store::postgres::PostgresStore::open_with(
                url.expose(),
                &table,
                schema.clone(),
                publication,
            )
            .map(|s| {
                Box::new(match &evolution {
                    Some((ev, t)) => s.with_evolution(ev.clone(), *t),
                    None => s,
                }) as Box<dyn StateStore>
            })
        }),
    })
}

/// A job's workers as `run` started them: what a restart onto a moved snapshot replaces.
struct RunningJob {
    /// Its index in the configuration.
    index: usize,
    runtime: Arc<JobRuntime>,
    /// The snapshot epoch its workers read.
    epoch: crate::core::Epoch,
    open_store: StoreFactory,
    /// Cancels this job's workers only (a child of the process's shutdown).
    stop: CancellationToken,
    handles: Vec<(String, JoinHandle<Result<()>>)>,
}

/// Per topic, the tables a capture section of the configuration lists (their names without the
/// schema, as manifests name them).
pub(crate) type CapturedTables = std::collections::HashMap<String, Vec<String>>;

pub(crate) fn captured_tables(config: &crate::config::Config) -> CapturedTables {
    let mut out = CapturedTables::new();
    for job in &config.jobs {
        if let Some(names) = job.capture.as_ref().and_then(|c| c.table_names().ok()) {
            out.entry(job.topic.clone())
                .or_default()
                .extend(names.into_iter().map(|n| n.table));
        }
    }
    out
}

/// Whether the snapshot in `folder` holds every table of a job of several (`store.tables`); true for
/// a job of one table.
fn holds_job_tables(job: &JobConfig, folder: &std::path::Path) -> bool {
    let Some(manifest) = read_manifest(folder) else {
        return false;
    };
    job.store
        .tables()
        .keys()
        .all(|table| names_table(&manifest, table))
}

/// A job of several tables whose snapshot lacks a table its configuration added: it reads the
/// newest snapshot of its capture instead, and its store moves it there (a new generation loading
/// every table; `store::transactions::ensure_job`).
fn gains_tables(job: &JobConfig, from: crate::core::Epoch, to: crate::core::Epoch) {
    let tables: Vec<&str> = job.store.tables().keys().map(String::as_str).collect();
    info!(job = %job.name, %from, %to, tables = %tables.join(", "), "the job's tables grew: the snapshot it started from lacks one, so it moves to the newest snapshot of its capture and loads every table again from it (under consistency = \"epoch\" readers keep the old replica until the new one is published whole)");
}

/// Whether the manifest in `dir` holds table `table` (as `snapshot.table` names it).
fn manifest_holds(dir: &std::path::Path, table: &str) -> bool {
    read_manifest(dir).is_some_and(|m| names_table(&m, table))
}

/// The manifest in `dir`, as JSON; `None` when there is none yet (or it cannot be read).
fn read_manifest(dir: &std::path::Path) -> Option<serde_json::Value> {
    let text = std::fs::read(dir.join("manifest.json")).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Whether manifest `m` holds table `table` (as `snapshot.table` names it).
fn names_table(m: &serde_json::Value, table: &str) -> bool {
    match m["tables"].as_array() {
        Some(tables) => tables.iter().any(|t| t["name"].as_str() == Some(table)),
        None => m["row_schema"]["name"]
            .as_str()
            .is_some_and(|record| crate::snapshot::files::one_table_answers_to(record, table)),
    }
}

/// Whether manifest `m` names table `table` as removed from its capture (docs/CAPTURE.md
/// "Removing a table"): no later snapshot will hold it.
fn names_removed(m: &serde_json::Value, table: &str) -> bool {
    m["removed"]
        .as_array()
        .is_some_and(|r| r.iter().any(|t| t["name"].as_str() == Some(table)))
}

/// A job's table that may have joined its capture after the snapshots published so far
/// (docs/CAPTURE.md "Adding a table"): where to look for the table's announcement and for a
/// snapshot that holds it.
pub(crate) struct AddedTable<'a> {
    job: &'a JobConfig,
    table: &'a str,
    dir: &'a std::path::Path,
    in_kafka: bool,
    sync: Option<crate::snapshot::versions::SyncVersions>,
    home: std::path::PathBuf,
}

impl<'a> AddedTable<'a> {
    /// `None` for a job that names no table of a snapshot in files. With `mirror`, the versions
    /// topic of Kafka storage is mirrored into the folder before each look (`doctor` only reads:
    /// it looks at what the folder has).
    pub(crate) fn of(job: &'a JobConfig, mirror: bool) -> Result<Option<Self>> {
        let SnapshotConfig::Files {
            dir,
            table: Some(table),
        } = &job.snapshot
        else {
            return Ok(None);
        };
        let sync = if mirror {
            versions_sync(job, dir)?
        } else {
            None
        };
        Ok(Some(Self::table(job, dir, table, sync)))
    }

    /// Every table of `job` that may have joined its capture later: its `snapshot.table`, or each
    /// of a job of several (`store.tables`), which may gain one. Empty for a snapshot not in files.
    fn all(job: &'a JobConfig, mirror: bool) -> Result<Vec<Self>> {
        if let Some(one) = Self::of(job, mirror)? {
            return Ok(vec![one]);
        }
        let SnapshotConfig::Files { dir, .. } = &job.snapshot else {
            return Ok(Vec::new());
        };
        // One mirror of the versions topic for them all.
        let sync = if mirror {
            versions_sync(job, dir)?
        } else {
            None
        };
        Ok(job
            .store
            .tables()
            .keys()
            .map(|table| Self::table(job, dir, table, sync.clone()))
            .collect())
    }

    fn table(
        job: &'a JobConfig,
        dir: &'a std::path::Path,
        table: &'a str,
        sync: Option<crate::snapshot::versions::SyncVersions>,
    ) -> Self {
        AddedTable {
            job,
            table,
            dir,
            in_kafka: job
                .capture
                .as_ref()
                .is_some_and(crate::config::CaptureSection::stores_in_kafka),
            sync,
            home: crate::snapshot::versions::home(dir),
        }
    }

    /// The epoch the table joined the log at, once announced (a version naming it with its key).
    fn joined_at(&self) -> Result<Option<crate::core::Epoch>> {
        if let Some(sync) = &self.sync {
            sync().map_err(|e| anyhow::anyhow!("job {}: {e}", self.job.name))?;
        }
        Ok(crate::snapshot::versions::read(&self.home)
            .with_context(|| format!("job {}: reading its log's schema versions", self.job.name))?
            .into_iter()
            .find(|v| v.table.as_deref() == Some(self.table) && v.primary_key.is_some())
            .map(|v| v.from_epoch))
    }

    /// Whether the newest snapshot holds the table: published files are looked at in their
    /// manifests. With Kafka storage, a table announced as joining (from `joined`) is held by a
    /// stored snapshot at or past that epoch (every snapshot placed after it copies it); one not
    /// announced is held when the capture's state record lists it (a table of its first snapshot).
    fn held(&self, joined: Option<crate::core::Epoch>) -> Result<bool> {
        if !self.in_kafka {
            let newest = crate::snapshot::published::choose(self.dir, None)
                .map_or_else(|| self.dir.to_path_buf(), |(_, folder)| folder);
            return Ok(manifest_holds(&newest, self.table));
        }
        if let Some(f) = joined {
            let newest = kafka_stored(self.job)?.and_then(|s| s.list.last().map(|l| l.epoch));
            return Ok(newest.is_some_and(|e| e >= f));
        }
        let props = crate::kafka::producer_properties(&self.job.kafka);
        let record = crate::capture::log::read_capture_state(&props, &self.job.topic)
            .with_context(|| {
                format!("job {}: reading its capture's state record", self.job.name)
            })?;
        Ok(record.is_some_and(|r| {
            r.tables()
                .iter()
                .any(|(name, _)| name.rsplit_once('.').map_or(*name, |(_, t)| t) == self.table)
        }))
    }

    /// Whether the newest published snapshot in files names the table as removed from its capture:
    /// nothing is to wait for, and opening that snapshot says why the table is missing. (With
    /// Kafka storage a snapshot stored after the table joined is [`held`](Self::held), and its
    /// manifest says the same.)
    fn removed(&self) -> bool {
        if self.in_kafka {
            return false;
        }
        let newest = crate::snapshot::published::choose(self.dir, None)
            .map_or_else(|| self.dir.to_path_buf(), |(_, folder)| folder);
        read_manifest(&newest).is_some_and(|m| names_removed(&m, self.table))
    }

    /// `Some(joined)` when the job must wait for a snapshot holding its table: no snapshot has it,
    /// and the log announces it (from `joined`) or a capture of this configuration lists it and
    /// has not announced it yet (`run --capture`: it does at its start; `joined` is `None`).
    pub(crate) fn pending(
        &self,
        captured: &CapturedTables,
    ) -> Result<Option<Option<crate::core::Epoch>>> {
        let joined = self.joined_at()?;
        if self.held(joined)? || self.removed() {
            return Ok(None);
        }
        let listed = captured
            .get(&self.job.topic)
            .is_some_and(|ts| ts.iter().any(|t| t == self.table));
        Ok((joined.is_some() || listed).then_some(joined))
    }
}

/// A job of a table added to its capture started before the snapshot holding that table is
/// published ([`AddedTable::pending`]); the capture took that snapshot on itself when the table
/// joined. The job waits for it (bounded, saying so in its log and in `/readyz`) instead of
/// failing on a manifest without its table. False when the process is told to stop first.
fn wait_for_added_table(
    job: &JobConfig,
    captured: &CapturedTables,
    shutdown: &CancellationToken,
    runtimes: &Runtimes,
) -> Result<bool> {
    for added in AddedTable::all(job, true)? {
        if !wait_for_table(job, &added, captured, shutdown, runtimes)? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// [`wait_for_added_table`] of one table.
fn wait_for_table(
    job: &JobConfig,
    added: &AddedTable<'_>,
    captured: &CapturedTables,
    shutdown: &CancellationToken,
    runtimes: &Runtimes,
) -> Result<bool> {
    let Some(mut joined) = added.pending(captured)? else {
        return Ok(true);
    };
    let table = added.table;
    let what = format!(
        "a snapshot of its capture holding table {table}, which joined its log (the capture takes one when a table joins)"
    );
    info!(job = %job.name, "waiting for {what}");
    runtimes.set_waiting(&job.name, what);
    let started = std::time::Instant::now();
    while !added.held(joined)? {
        if started.elapsed() >= ASKED_SNAPSHOT_WITHIN {
            bail!(
                "job {}: table {table} joined its capture's log{}, and no snapshot holding it was {} within {} s: is its capture running? Its log says why a snapshot failed (`kafka-backfill snapshot` asks for one)",
                job.name,
                joined.map_or(String::new(), |f| format!(" at epoch {f}")),
                if added.in_kafka { "stored in Kafka".to_string() } else { format!("published under {}", added.dir.display()) },
                ASKED_SNAPSHOT_WITHIN.as_secs()
            );
        }
        if crate::shutdown::wait_blocking(shutdown, SNAPSHOT_LOOK_EVERY * 4) {
            return Ok(false);
        }
        if joined.is_none() {
            joined = added.joined_at()?;
        }
    }
    runtimes.clear_waiting(&job.name);
    info!(job = %job.name, waited_ms = started.elapsed().as_millis() as u64, %table, "a snapshot holding the job's added table is published");
    Ok(true)
}

/// A job checked and its store prepared ([`prepare`]), after waiting for its capture's snapshot
/// (and, when its log is gone, asking for a newer one); `None` when the process is told to stop
/// first.
fn prepare_to_run(
    job: &JobConfig,
    captured: &CapturedTables,
    shutdown: &CancellationToken,
    runtimes: &Runtimes,
) -> Result<Option<PreparedJob>> {
    if !wait_for_snapshot(job, shutdown, runtimes)? {
        info!(job = %job.name, "stopped while waiting for the snapshot");
        return Ok(None);
    }
    if !wait_for_added_table(job, captured, shutdown, runtimes)? {
        info!(job = %job.name, "stopped while waiting for a snapshot of its added table");
        return Ok(None);
    }
    match prepare(job, true) {
        Err(e) if job.capture.is_some() && e.downcast_ref::<NoSnapshotWithinLog>().is_some() => {
            let why = e.downcast_ref::<NoSnapshotWithinLog>().expect("checked");
            if !ask_for_a_snapshot(job, why, shutdown, runtimes)? {
                info!(job = %job.name, "stopped while waiting for the snapshot it asked for");
                return Ok(None);
            }
            prepare(job, true).map(Some)
        }
        prepared => prepared.map(Some),
    }
}

/// What every job `run` starts shares: the options, the workers' name prefix, the process's
/// shutdown, its status board and runtimes.
struct Shared<'a> {
    opts: &'a RunOptions,
    prefix: &'a str,
    shutdown: &'a CancellationToken,
    board: &'a StatusBoard,
    runtimes: &'a Runtimes,
}

/// Registers `job`'s runtime and starts its workers on `prepared`.
fn start_job(
    index: usize,
    job: &JobConfig,
    prepared: &PreparedJob,
    shared: &Shared<'_>,
) -> Result<RunningJob> {
    let info = prepared.snapshot.info();
    let map = PartitionMap::new(info.vnode_count, info.partition_count)?;
    let r = &job.recreation;
    let supervisor = Arc::new(Mutex::new(Supervisor::new(SupervisorConfig {
        policy: r.policy,
        max_recreations: r.max_recreations,
        window_ms: r.window_secs * 1000,
        backoff_initial_ms: r.backoff_initial_ms,
        backoff_max_ms: r.backoff_max_ms,
    })));
    let runtime = Arc::new(
        JobRuntime::new(
            &job.name,
            map,
            supervisor.clone(),
            prepared.open_store.clone(),
            crate::core::RateLimits::both(job.max_rows_per_second),
            job.consistency == crate::config::Consistency::Epoch,
            shared.runtimes.metrics().clone(),
        )
        .with_tables(prepared.tables.clone(), &prepared.store_tables),
    );
    shared.runtimes.insert(runtime.clone());
    let table_counts = runtime.table_counts();
    let policy = job.policy(prepared.tables.clone());
    let mut kafka = job.kafka.clone();
    kafka
        .entry("group.id".into())
        .or_insert_with(|| job.group_id());
    let stop = shared.shutdown.child_token();
    let mut handles = Vec::new();
    for i in 0..job.workers {
        let mut kafka = kafka.clone();
        // Static membership: one stable, distinct instance id per worker (`<id>-<index>`), so
        // the workers of one process do not fence each other; by default the worker's own
        // name when the operator named the process; `""` is dynamic membership.
        let instance = match job.kafka.get("group.instance.id") {
            Some(id) if id.is_empty() => None,
            Some(id) => Some(format!("{id}-{i}")),
            None if shared.opts.static_membership => Some(format!("{}-{i}", shared.prefix)),
            None => None,
        };
        match instance {
            Some(id) => kafka.insert("group.instance.id".into(), id),
            None => kafka.remove("group.instance.id"),
        };
        let setup = WorkerSetup {
            job: job.name.clone(),
            topic: job.topic.clone(),
            worker: format!("{}-{i}", shared.prefix),
            kafka: kafka.clone(),
            snapshot: prepared.snapshot.clone(),
            codec: prepared.codec.clone(),
            open_store: prepared.open_store.clone(),
            policy: policy.clone(),
            supervisor: supervisor.clone(),
            shutdown: stop.clone(),
            board: shared.board.clone(),
            max_rows_per_second: job.max_rows_per_second,
            adaptive: job.rate_limit.core(),
            dead_letter_topic: job.dead_letters().map(|(topic, _)| topic),
            tables: table_counts.clone(),
            metrics: shared.runtimes.metrics().clone(),
        };
        let name = format!("{}/{}", job.name, setup.worker);
        let h = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || run_worker(setup))?;
        handles.push((name, h));
    }
    info!(job = %job.name, topic = %job.topic, workers = job.workers, snapshot_epoch = %info.snapshot_epoch, "job started");
    Ok(RunningJob {
        index,
        runtime,
        epoch: info.snapshot_epoch,
        open_store: prepared.open_store.clone(),
        stop,
        handles,
    })
}

/// The newer snapshot epoch `running`'s store records, when the job was moved onto one while its
/// workers ran (`kafka-backfill resync`, [`crate::service::resync`]; or another process moving it
/// when its log was gone): its workers then fail against the new generation, and `run` starts the
/// job again on that snapshot instead of stopping.
fn moved_snapshot(job: &str, running: &RunningJob) -> Result<Option<crate::core::Epoch>> {
    let mut store =
        (running.open_store)().with_context(|| format!("job {job}: opening its store"))?;
    let row = store
        .job(job)
        .with_context(|| format!("job {job}: reading its job row"))?;
    Ok(row.map(|r| r.snapshot_epoch).filter(|e| *e > running.epoch))
}

/// Runs every job until `shutdown` is cancelled, a job stops, or (with `exit_when_caught_up`) all
/// caught up (then it cancels `shutdown` itself, so everything else the process runs stops too).
/// A job moved onto a newer snapshot while it ran ([`moved_snapshot`]) is started again on it.
pub fn run(
    config: &Config,
    opts: &RunOptions,
    shutdown: CancellationToken,
    board: StatusBoard,
    runtimes: Runtimes,
) -> Result<()> {
    let prefix = opts.worker_prefix.clone().unwrap_or_else(default_prefix);
    let shared = Shared {
        opts,
        prefix: &prefix,
        shutdown: &shutdown,
        board: &board,
        runtimes: &runtimes,
    };
    let captured = captured_tables(config);
    let mut running: Vec<RunningJob> = Vec::new();
    let mut expected = 0usize;
    for (index, job) in config.jobs.iter().enumerate() {
        let Some(prepared) = prepare_to_run(job, &captured, &shutdown, &runtimes)? else {
            return Ok(());
        };
        running.push(start_job(index, job, &prepared, &shared)?);
        expected += job.workers as usize;
    }
    let mut result = Ok(());
    let mut waiting = JobWait::default();
    let mut last_progress = std::time::Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let jobs: Vec<Arc<JobRuntime>> = running.iter().map(|r| r.runtime.clone()).collect();
        if last_progress.elapsed() >= Duration::from_secs(2) {
            last_progress = std::time::Instant::now();
            if let Err(e) = read_progress(&jobs) {
                // Shown in /status by the workers' own errors; the next read retries.
                tracing::debug!(error = %crate::error::line(&e), "reading job progress");
            }
        }
        let finished = running.iter().enumerate().find_map(|(j, r)| {
            r.handles
                .iter()
                .position(|(_, h)| h.is_finished())
                .map(|i| (j, i))
        });
        if let Some((j, i)) = finished {
            let (name, h) = running[j].handles.remove(i);
            let r = h
                .join()
                .map_err(|_| anyhow::anyhow!("worker {name} panicked"))
                .and_then(|r| r);
            if let Err(e) = r {
                let job = &config.jobs[running[j].index];
                let moved = if shutdown.is_cancelled() {
                    None
                } else {
                    moved_snapshot(&job.name, &running[j]).unwrap_or_else(|m| {
                        warn!(job = %job.name, error = %crate::error::line(&m), "cannot tell whether the job moved to another snapshot");
                        None
                    })
                };
                match moved {
                    Some(to) => {
                        let old = running.remove(j);
                        warn!(job = %job.name, from = %old.epoch, to = %to, worker = %name, error = %crate::error::line(&e), "the job was moved to a newer snapshot of its capture (a resync): starting it again on that snapshot");
                        runtimes
                            .metrics()
                            .snapshot_moves
                            .with_label_values(&[&job.name])
                            .inc();
                        old.stop.cancel();
                        for (other, h) in old.handles {
                            // They fail against the new generation as this one did, or stop.
                            match h.join() {
                                Ok(Err(e)) => {
                                    info!(worker = %other, error = %crate::error::line(&e), "worker stopped by the move to a newer snapshot")
                                }
                                Err(_) => error!(worker = %other, "worker panicked"),
                                Ok(Ok(())) => {}
                            }
                        }
                        match prepare_to_run(job, &captured, &shutdown, &runtimes) {
                            Ok(Some(prepared)) => {
                                running.push(start_job(old.index, job, &prepared, &shared)?)
                            }
                            Ok(None) => {}
                            Err(p) => {
                                error!(job = %job.name, error = %crate::error::line(&p), "cannot start the job again on its new snapshot; stopping");
                                result = Err(p);
                                shutdown.cancel();
                            }
                        }
                    }
                    None => {
                        error!(worker = %name, error = %crate::error::line(&e), "worker failed; stopping");
                        result = Err(e);
                        shutdown.cancel();
                    }
                }
            }
        }
        if opts.exit_when_caught_up {
            let b = board.lock().unwrap();
            let reports: Vec<bool> = b
                .values()
                .flat_map(|w| w.values().map(|r| r.caught_up))
                .collect();
            if reports.len() == expected && reports.iter().all(|c| *c) {
                drop(b);
                match waiting.check(&jobs, opts.job_wait) {
                    Ok(true) => {
                        info!("every vnode of every job has caught up; stopping");
                        shutdown.cancel();
                    }
                    Ok(false) => {}
                    Err(e) => {
                        error!(error = %crate::error::line(&e), "stopping");
                        result = Err(e);
                        shutdown.cancel();
                    }
                }
            }
        }
        if shutdown.is_cancelled() {
            for (name, h) in running.drain(..).flat_map(|r| r.handles) {
                match h.join() {
                    Ok(Err(e)) if result.is_ok() => result = Err(e),
                    Err(_) => error!(worker = %name, "worker panicked"),
                    _ => {}
                }
            }
            return result;
        }
    }
}

/// Every job's progress over all its vnodes, as committed in its store.
fn read_progress(jobs: &[Arc<JobRuntime>]) -> Result<Vec<crate::core::JobProgress>> {
    jobs.iter().map(|j| j.read_progress()).collect()
}

/// The job-level completion check of `--exit-when-caught-up`, once a second.
#[derive(Default)]
struct JobWait {
    last_check: Option<std::time::Instant>,
    last_log: Option<std::time::Instant>,
    /// The progress last seen and since when it has not changed.
    seen: Option<(Vec<crate::core::JobProgress>, std::time::Instant)>,
}

impl JobWait {
    /// Whether every job has caught up (from the store); an error once the rest of a job made no
    /// progress for `wait`.
    fn check(&mut self, jobs: &[Arc<JobRuntime>], wait: Duration) -> Result<bool> {
        let now = std::time::Instant::now();
        if self
            .last_check
            .is_some_and(|t| now - t < Duration::from_secs(1))
        {
            return Ok(false);
        }
        self.last_check = Some(now);
        let all = read_progress(jobs)?;
        if all.iter().all(|p| p.caught_up) {
            return Ok(true);
        }
        let since = match &self.seen {
            Some((p, t)) if *p == all => *t,
            _ => now,
        };
        self.seen = Some((all.clone(), since));
        if self
            .last_log
            .is_none_or(|t| now - t >= Duration::from_secs(10))
        {
            self.last_log = Some(now);
            for (job, p) in jobs.iter().zip(&all).filter(|(_, p)| !p.caught_up) {
                info!(job = %job.name, partitions_behind = ?p.partitions_behind, vnodes_snapshot = p.vnodes_snapshot, vnodes_log_store = p.vnodes_log_store, "this process has caught up; waiting for the rest of the job");
            }
        }
        if now - since >= wait {
            let (job, p) = jobs
                .iter()
                .zip(&all)
                .find(|(_, p)| !p.caught_up)
                .map(|(j, p)| (j.name.clone(), p.clone()))
                .expect("one job behind");
            return Err(JobIncomplete {
                job,
                partitions: p.partitions_behind,
                vnodes_snapshot: p.vnodes_snapshot,
                vnodes_log_store: p.vnodes_log_store,
                waited_secs: wait.as_secs(),
            }
            .into());
        }
        Ok(false)
    }
}

/// Worker names: `<host>-p<pid>` (the host name tells containers apart, where every pid is 1).
fn default_prefix() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty());
    match host {
        Some(h) => format!("{h}-p{}", std::process::id()),
        None => format!("p{}", std::process::id()),
    }
}

/// A fresh, empty status board.
pub fn new_board() -> StatusBoard {
    Arc::new(Mutex::new(BTreeMap::new()))
}
