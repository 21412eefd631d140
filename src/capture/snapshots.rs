//! The capture's snapshots: the copy of its tables in an exported snapshot into sorted per-vnode
//! files (the first snapshot's and every later one's), and the snapshots of a running capture
//! ([`OnDemand`], docs/CAPTURE.md "Snapshots of a running capture"): the source opens a consistent
//! snapshot at a point `C` ([`Exporter`]: PostgreSQL a temporary slot's exported snapshot, MariaDB
//! a consistent-snapshot transaction and its binlog position); the assembler places a checkpoint
//! barrier between the source transactions committed below `C` and those at or past it
//! ([`Assembler::snapshot_at`]); the tables are copied in that snapshot on a thread of their own
//! while the stream goes on; once the copy is done and the barrier's Kafka transaction committed,
//! the manifest (start offsets: just after that barrier) is written and the folder renamed into
//! place, so a snapshot is visible whole or not at all. Owns the snapshot folders; must not
//! decide where a barrier goes (the core does) nor write the log (the loop does).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::log::{KafkaLog, Listed, SnapshotPlaced, SnapshotRecord};
use super::pg::{self, unix_ms, PgReplication, TableName};
use super::report::{CaptureMeter, SnapshotOutcome};
use super::types::PgColumn;
use crate::codec::TableSchema;
use crate::core::capture::{Assembler, Lsn};
use crate::core::{vnode_of, Epoch};
use crate::snapshot::files::{
    write_manifest, write_tables_manifest, Manifest, ManifestRemoved, ManifestStart, ManifestTable,
    SortedWriter, TablesManifest,
};

/// One captured table, as a copy needs it.
#[derive(Clone, Debug)]
pub struct CopyTable {
    pub table: TableName,
    pub schema: TableSchema,
    /// The catalog's columns when the capture started (a copy that finds others fails).
    pub columns: Vec<PgColumn>,
}

/// What a copy needs, owned: it runs on a thread of its own.
#[derive(Clone, Debug)]
pub struct CopySpec {
    pub url: String,
    /// In the log's order; a log of several tables names each by `table.table`.
    pub tables: Vec<CopyTable>,
    pub vnode_count: u32,
    pub partitions: u32,
    pub topic: String,
    pub copy_connections: usize,
    /// The capture's snapshot folder, beside whose manifest the log's schema versions are: a copy
    /// writes each table's union branches as the newest version has them
    /// ([`super::types::PgColumn::null_last`]).
    pub dir: PathBuf,
}

/// What a copy wrote into its folder.
pub struct Copied {
    pub tables: Vec<ManifestTable>,
    pub rows: u64,
    /// The server's clock (Unix ms) at the snapshot's import.
    pub import_ms: u64,
}

/// A manifest of one table or of several.
pub enum AnyManifest {
    One(Manifest),
    Tables(TablesManifest),
}

impl AnyManifest {
    pub fn to_json(&self) -> Result<Vec<u8>> {
        Ok(match self {
            AnyManifest::One(m) => serde_json::to_vec_pretty(m)?,
            AnyManifest::Tables(m) => serde_json::to_vec_pretty(m)?,
        })
    }

    /// Writes `manifest.json` into `dir` (atomically).
    pub fn write(&self, dir: &Path) -> Result<()> {
        match self {
            AnyManifest::One(m) => write_manifest(dir, m)?,
            AnyManifest::Tables(m) => write_tables_manifest(dir, m)?,
        };
        Ok(())
    }
}

/// What a snapshot's manifest says of the log, whatever the source: its tables (in the log's
/// order), vnodes, partitions and topic.
#[derive(Clone, Debug)]
pub struct LogShape {
    pub tables: Vec<TableName>,
    pub vnode_count: u32,
    pub partitions: u32,
    pub topic: String,
    /// The tables the capture removed (its state record's `removed`), which its manifests name
    /// ([`OnDemand::tables_removed`]).
    pub removed: Vec<ManifestRemoved>,
}

impl LogShape {
    fn several(&self) -> bool {
        self.tables.len() > 1
    }

    /// The manifest of `copied` at `snapshot_epoch`, starting at `start`.
    pub fn manifest(
        &self,
        mut copied: Copied,
        snapshot_epoch: Epoch,
        start: Vec<ManifestStart>,
    ) -> AnyManifest {
        if self.several() {
            AnyManifest::Tables(TablesManifest {
                snapshot_epoch,
                vnode_count: self.vnode_count,
                partition_count: self.partitions,
                topic: Some(self.topic.clone()),
                tables: copied.tables,
                start,
                removed: self.removed.clone(),
            })
        } else {
            let t = copied.tables.remove(0);
            AnyManifest::One(Manifest {
                snapshot_epoch,
                vnode_count: self.vnode_count,
                partition_count: self.partitions,
                topic: Some(self.topic.clone()),
                row_schema: t.row_schema,
                primary_key: t.primary_key,
                files: t.files,
                start,
            })
        }
    }
}

/// A source's consistent snapshot of the captured tables, opened for a snapshot of the running
/// capture. Called between source transactions on the capture's thread.
pub trait Exporter {
    /// Opens a consistent snapshot now: its point (the transactions committed below it are in
    /// it, none at or past it) and the copy into a folder, run on a thread of its own.
    fn export(&mut self) -> Result<Exported>;
    /// A point as the source writes it (an LSN, `file:position`), for logs.
    fn show(&self, point: Lsn) -> String;
}

/// A snapshot's copy into a folder, run on a thread of its own.
pub type CopyJob = Box<dyn FnOnce(&Path) -> Result<Copied> + Send>;

/// An opened snapshot ([`Exporter::export`]).
pub struct Exported {
    pub point: Lsn,
    /// Held until the copy is done (PostgreSQL: the session that exported the snapshot).
    pub side: Option<Box<dyn std::any::Any>>,
    pub copy: CopyJob,
}

/// PostgreSQL's [`Exporter`]: a temporary slot on the capture's publication exports a snapshot at
/// its consistent point; the copy imports it ([`CopySpec::copy`]).
pub struct PgExporter {
    pub spec: CopySpec,
    pub slot: String,
    pub publication: String,
}

impl Exporter for PgExporter {
    fn export(&mut self) -> Result<Exported> {
        let mut client = pg::connect(&self.spec.url)?;
        // At most 63 bytes, as every slot name.
        let base = &self.slot[..self.slot.len().min(52)];
        let slot = format!("{base}_s{}", unix_ms() % 1_000_000_000);
        let (side, name, point) =
            PgReplication::export_snapshot(&self.spec.url, &slot, &self.publication, &mut client)?;
        let spec = self.spec.clone();
        Ok(Exported {
            point,
            side: Some(Box::new(side)),
            copy: Box::new(move |folder: &Path| spec.copy(&name, folder)),
        })
    }

    fn show(&self, point: Lsn) -> String {
        pg::format_lsn(point)
    }
}

impl CopySpec {
    fn several(&self) -> bool {
        self.tables.len() > 1
    }

    /// What its manifests say of the log.
    pub fn shape(&self) -> LogShape {
        LogShape {
            tables: self.tables.iter().map(|t| t.table.clone()).collect(),
            vnode_count: self.vnode_count,
            partitions: self.partitions,
            topic: self.topic.clone(),
            removed: Vec::new(),
        }
    }

    /// Copies every table in the exported snapshot `snapshot_name` into sorted per-vnode files in
    /// `folder` (a log of several tables: one folder per table). Every table is read in the one
    /// snapshot, so together they are one source state.
    pub fn copy(&self, snapshot_name: &str, folder: &Path) -> Result<Copied> {
        let started = Instant::now();
        let mut first_ms = None;
        let mut tables = Vec::new();
        let mut total = 0;
        let mut session = pg::SnapshotSession::open(&self.url, snapshot_name)?;
        for (i, t) in self.tables.iter().enumerate() {
            let dir = if self.several() {
                folder.join(&t.table.table)
            } else {
                folder.to_path_buf()
            };
            // The table as the snapshot has it: columns added since the capture started are
            // copied (the log's version in force at the snapshot's epoch must have them: checked
            // at publication, [`in_force`]); any other change is the stream's to refuse.
            let mut at = session.info(&t.table)?;
            // A nullable column added with a default is written `[T, "null"]`, as its version.
            let name = self.several().then_some(t.table.table.as_str());
            let nulls_last = super::nulls_last_of(&self.dir, name, i == 0)?;
            super::types::order_nulls(&mut at.encoder.columns, &nulls_last);
            let n = t.columns.len();
            // The columns the capture started with, whatever their union's order now.
            let started_with = |now: &[PgColumn]| {
                now.len() == n
                    && now
                        .iter()
                        .zip(&t.columns)
                        .all(|(a, b)| (&a.name, &a.ty, a.nullable) == (&b.name, &b.ty, b.nullable))
            };
            let at_columns = &at.encoder.columns;
            let schema = if at_columns == &t.columns {
                t.schema.clone()
            } else if at_columns.len() >= n && started_with(&at_columns[..n]) {
                let json = super::types::row_schema(&t.table.to_string(), &at.encoder.columns);
                TableSchema::parse(&json.to_string(), &t.schema.primary_key)?
            } else {
                bail!(
                    "the columns of {} changed since the capture started other than by columns added at the end; start it again",
                    t.table
                );
            };
            let mut writer = SortedWriter::new(&dir, &schema, self.vnode_count)?;
            let (info, now_ms, rows) = session.copy(
                &t.table,
                self.copy_connections,
                &nulls_last,
                |datum, key| {
                    writer.add(vnode_of(key, self.vnode_count), key, datum)?;
                    Ok(())
                },
            )?;
            if info.encoder.columns != at.encoder.columns {
                bail!(
                    "the columns of {} differ within one snapshot (read {:?}, copied {:?})",
                    t.table,
                    at.encoder
                        .columns
                        .iter()
                        .map(|c| &c.name)
                        .collect::<Vec<_>>(),
                    info.encoder
                        .columns
                        .iter()
                        .map(|c| &c.name)
                        .collect::<Vec<_>>()
                );
            }
            tracing::debug!(table = %t.table, rows, seconds = started.elapsed().as_secs_f64(), "snapshot rows read and spilled; sorting");
            let mut files = writer.finish()?;
            if self.several() {
                for f in &mut files {
                    f.path = format!("{}/{}", t.table.table, f.path);
                }
            }
            first_ms.get_or_insert(now_ms);
            total += rows;
            tables.push(ManifestTable {
                name: t.table.table.clone(),
                row_schema: schema.json.clone(),
                primary_key: schema.primary_key.clone(),
                files,
            });
        }
        Ok(Copied {
            tables,
            rows: total,
            import_ms: first_ms.unwrap_or_else(unix_ms),
        })
    }

    /// The manifest of `copied` at `snapshot_epoch`, starting at `start`.
    pub fn manifest(
        &self,
        copied: Copied,
        snapshot_epoch: Epoch,
        start: Vec<ManifestStart>,
    ) -> AnyManifest {
        self.shape().manifest(copied, snapshot_epoch, start)
    }
}

/// The manifest's `start`: per partition, the offset just after the barrier into `epoch`.
pub fn start_after(offsets: &[u64], epoch: Epoch) -> Vec<ManifestStart> {
    offsets
        .iter()
        .enumerate()
        .map(|(p, &next_offset)| ManifestStart {
            partition: p as u32,
            next_offset,
            epoch,
        })
        .collect()
}

/// The state topic's key of `job`'s snapshot requests (a state reader reads only the key `job`).
pub fn request_key(job: &str) -> String {
    format!("{job}/snapshot-request")
}

/// Asks the capture of `job` (writing `topic`) for a snapshot of the running capture: a record on
/// its state topic, which the capture reads between transactions. Returns the record's offset: a
/// snapshot listed with a `request` at or past it answers it.
pub fn request(props: &BTreeMap<String, String>, topic: &str, job: &str) -> Result<i64> {
    let value = serde_json::json!({ "job": job, "requested_unix_ms": unix_ms() }).to_string();
    to_state_topic(
        props,
        topic,
        &request_key(job),
        &value,
        "a snapshot request",
    )
}

/// The state topic's keys naming the snapshot each job reads of the capture of `capture_job`
/// ([`mark_reading`]): this prefix, then the reading job's name.
pub fn reading_prefix(capture_job: &str) -> String {
    format!("{capture_job}/snapshot-reader/")
}

/// Records on the state topic of `topic`, whose capture is `capture_job`'s, that `reader` (a job,
/// or a job starting) reads the snapshot at `epoch` (`None`: no longer): the capture of
/// `snapshot_storage = "kafka"` does not retire a snapshot a reader's newest mark names.
pub fn mark_reading(
    props: &BTreeMap<String, String>,
    topic: &str,
    capture_job: &str,
    reader: &str,
    epoch: Option<Epoch>,
) -> Result<i64> {
    let value =
        serde_json::json!({ "job": reader, "snapshot_epoch": epoch.map(|e| e.0) }).to_string();
    let key = format!("{}{reader}", reading_prefix(capture_job));
    to_state_topic(props, topic, &key, &value, "a snapshot reader's mark")
}

/// Writes one record to the state topic of `topic`; returns its offset.
fn to_state_topic(
    props: &BTreeMap<String, String>,
    topic: &str,
    key: &str,
    value: &str,
    what: &str,
) -> Result<i64> {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let state_topic = super::log::state_topic(topic);
    let producer: FutureProducer = crate::kafka::admin::client_config(props)
        .set("enable.idempotence", "true")
        .create()
        .with_context(|| format!("creating the producer of {what}"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let delivered = rt
        .block_on(
            producer.send(
                FutureRecord::to(&state_topic)
                    .partition(0)
                    .key(key)
                    .payload(value),
                Duration::from_secs(30),
            ),
        )
        .map_err(|(e, _)| e)
        .with_context(|| format!("writing {what} to {state_topic}"))?;
    Ok(delivered.offset)
}

/// Asks `job`'s capture for a snapshot ([`request`]) and waits up to `within` for the state
/// record to list one that answers it (`None`: not within; with `within` zero, `None` at once).
/// The capture is the one whose state record the job's topic holds (a job of another name may
/// read its log); with `snapshot_storage = "kafka"` the answer is awaited until stored there, so a
/// runner can restore it.
pub fn request_and_wait(
    job: &crate::config::JobConfig,
    within: Duration,
) -> Result<Option<SnapshotRecord>> {
    let props = crate::kafka::producer_properties(&job.kafka);
    let capture_job = super::log::read_capture_state(&props, &job.topic)?
        .map_or_else(|| job.name.clone(), |r| r.job);
    let stored = job
        .capture
        .as_ref()
        .is_some_and(crate::config::CaptureSection::stores_in_kafka);
    let offset = request(&props, &job.topic, &capture_job)?;
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(s) = answer(&props, &job.topic, &capture_job, offset, stored)? {
            return Ok(Some(s));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Ok(None)
}

/// The snapshot the state record of `capture_job` (writing `topic`) lists as the answer to the
/// request at `offset` ([`request`]), if any yet; with `stored`, only once stored in Kafka.
pub fn answer(
    props: &BTreeMap<String, String>,
    topic: &str,
    capture_job: &str,
    offset: i64,
    stored: bool,
) -> Result<Option<SnapshotRecord>> {
    let record = super::log::read_state(props, topic, capture_job)?;
    Ok(record.and_then(|r| {
        r.snapshots
            .into_iter()
            .find(|s| s.request.is_some_and(|q| q >= offset) && (!stored || s.topic.is_some()))
    }))
}

/// The requests on a capture's state topic, read from its start (the topic is compacted: a job's
/// newest request is kept) without blocking, at most once a second.
pub struct Requests {
    consumer: rdkafka::consumer::BaseConsumer,
    state_topic: String,
    key: String,
    reading_prefix: String,
    last_poll: Option<Instant>,
    /// The offset of the newest request read.
    pub newest: Option<i64>,
    /// Per reading job, the snapshot it last said it reads ([`mark_reading`]).
    pub reading: BTreeMap<String, Epoch>,
    /// The state topic's end when the capture started: until the reader has passed it, a job's
    /// mark may be unread, and nothing is retired.
    start_end: i64,
    pub caught_up: bool,
}

impl Requests {
    pub fn new(
        props: &std::collections::BTreeMap<String, String>,
        topic: &str,
        job: &str,
    ) -> Result<Requests> {
        use rdkafka::consumer::Consumer;
        let state_topic = super::log::ensure_state_topic(props, topic)?;
        let consumer: rdkafka::consumer::BaseConsumer = crate::kafka::admin::client_config(props)
            .set("group.id", format!("kafka-backfill-capture-requests-{job}"))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .context("creating the snapshot requests' reader")?;
        let (_, start_end) = consumer
            .fetch_watermarks(&state_topic, 0, Duration::from_secs(30))
            .with_context(|| format!("reading the watermarks of {state_topic}"))?;
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset(&state_topic, 0, rdkafka::Offset::Beginning)?;
        consumer.assign(&tpl)?;
        Ok(Requests {
            start_end,
            caught_up: start_end <= 0,
            consumer,
            state_topic,
            key: request_key(job),
            reading_prefix: reading_prefix(job),
            last_poll: None,
            newest: None,
            reading: BTreeMap::new(),
        })
    }

    /// Reads what arrived (nothing waits), at most once a second.
    fn poll(&mut self) {
        use rdkafka::Message;
        if self
            .last_poll
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return;
        }
        self.last_poll = Some(Instant::now());
        while let Some(m) = self.consumer.poll(Duration::ZERO) {
            match m {
                Ok(m) if m.key() == Some(self.key.as_bytes()) => {
                    self.newest = self.newest.max(Some(m.offset()));
                }
                Ok(m)
                    if m.key()
                        .is_some_and(|k| k.starts_with(self.reading_prefix.as_bytes())) =>
                {
                    let reader = String::from_utf8_lossy(
                        &m.key().unwrap_or_default()[self.reading_prefix.len()..],
                    )
                    .to_string();
                    let mark = serde_json::from_slice::<serde_json::Value>(
                        m.payload().unwrap_or_default(),
                    )
                    .ok()
                    .and_then(|v| v.get("snapshot_epoch").cloned());
                    match mark {
                        // A tombstone (a dropped job's mark deleted by hand) or a cleared mark.
                        _ if m.payload().is_none() => {
                            self.reading.remove(&reader);
                        }
                        Some(serde_json::Value::Null) => {
                            self.reading.remove(&reader);
                        }
                        Some(e) if e.is_u64() => {
                            self.reading.insert(reader, Epoch(e.as_u64().expect("u64")));
                        }
                        _ => {
                            tracing::warn!(topic = %self.state_topic, offset = m.offset(), "a snapshot reader's mark without a snapshot_epoch: ignored")
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    // A broker outage: the capture's own commits report it; read again later.
                    tracing::debug!(topic = %self.state_topic, error = %e, "reading snapshot requests");
                    return;
                }
            }
        }
        if !self.caught_up {
            use rdkafka::consumer::Consumer;
            // The position passes commit markers too.
            let position = self
                .consumer
                .position()
                .ok()
                .and_then(|p| {
                    p.find_partition(&self.state_topic, 0)
                        .and_then(|e| e.offset().to_raw())
                })
                .unwrap_or(-1);
            self.caught_up = position >= self.start_end;
        }
    }
}

/// A snapshot being copied.
struct Copying {
    consistent: Lsn,
    /// The newest request it answers.
    request: Option<i64>,
    /// `<snapshots>/.pending-<C>`: renamed to `<snapshots>/<epoch>` once published.
    folder: PathBuf,
    /// What the export holds until the copy is done ([`Exported::side`]).
    side: Option<Box<dyn std::any::Any>>,
    /// The copy, until it is done; then what it wrote.
    thread: Option<std::thread::JoinHandle<Result<Copied>>>,
    copied: Option<Copied>,
    /// The barrier's commit, once it came.
    placed: Option<SnapshotPlaced>,
}

/// The snapshots of a running capture: every `interval`, one exported, placed, copied and
/// published. Lives as long as the capture (across its sessions).
pub struct OnDemand {
    shape: LogShape,
    exporter: Box<dyn Exporter>,
    interval: Option<Duration>,
    last: Instant,
    copying: Option<Copying>,
    placed_tx: mpsc::Sender<SnapshotPlaced>,
    placed_rx: mpsc::Receiver<SnapshotPlaced>,
    /// Requests for a snapshot, and the newest one a published snapshot answered.
    requests: Requests,
    answered: Option<i64>,
    /// The snapshots published and not retired, and where they are stored (the log lists them at
    /// its next commit: [`super::log::KafkaLog::published`]).
    pub published: Arc<Mutex<Listed>>,
    /// The job's `snapshot.dir`, and how many later snapshots are kept (more when jobs read them).
    dir: PathBuf,
    keep: usize,
    /// `snapshot_storage = "kafka"`: the job's producer properties; each snapshot is stored in a
    /// topic of its own ([`crate::snapshot::kafka`]) on a thread, one at a time.
    kafka: Option<BTreeMap<String, String>>,
    storing: Option<Storing>,
    /// When the last store failed (the next is tried [`STORE_RETRY`] later).
    store_failed: Option<Instant>,
    /// Kafka storage: when each later snapshot was first found retirable ([`retire_after_grace`]).
    superseded: BTreeMap<Epoch, Instant>,
    /// When retirement was last looked at outside a store (at most every 5 s).
    retire_looked: Instant,
    /// Told what becomes of each snapshot ([`OnDemand::with_meter`]).
    meter: Option<(String, Arc<dyn CaptureMeter>)>,
}

/// A snapshot being stored in Kafka.
struct Storing {
    /// `None`: the first snapshot.
    later: Option<Epoch>,
    topic: String,
    thread: std::thread::JoinHandle<Result<crate::snapshot::kafka::Moved>>,
}

/// How long after a failed store the next is tried.
const STORE_RETRY: Duration = Duration::from_secs(10);

/// How long a stored snapshot outlives the moment it became retirable (a newer one stored): a
/// runner that read the capture's list just before marks the snapshot it restores within this
/// (`<job>.starting`, written right after the read), and the capture reads the mark before it
/// retires anything.
pub const RETIRE_GRACE: Duration = Duration::from_secs(30);

/// The retirement of later snapshots with Kafka storage, decided without I/O: splits `later`
/// (oldest first) into those to retire now and those kept. Kept: the newest `keep` stored, those
/// not stored yet that are newer than the newest stored (their store is to come), those `read`
/// says a job reads, and a retirable one until [`RETIRE_GRACE`] after `superseded` first saw it
/// retirable (`now` is recorded then). `superseded` forgets what is no longer listed.
pub fn retire_after_grace(
    later: Vec<SnapshotRecord>,
    keep: usize,
    read: impl Fn(&SnapshotRecord) -> bool,
    superseded: &mut BTreeMap<Epoch, Instant>,
    now: Instant,
) -> (Vec<SnapshotRecord>, Vec<SnapshotRecord>) {
    let stored: Vec<Epoch> = later
        .iter()
        .filter(|s| s.topic.is_some())
        .map(|s| s.snapshot_epoch)
        .collect();
    let oldest_kept = stored
        .len()
        .checked_sub(keep)
        .map_or(Epoch(0), |i| stored[i]);
    let (mut gone, mut kept) = (Vec::new(), Vec::new());
    for s in later {
        // One not stored that is older than a stored one would never be read.
        let old = if s.topic.is_some() {
            s.snapshot_epoch < oldest_kept
        } else {
            stored
                .last()
                .is_some_and(|newest| s.snapshot_epoch < *newest)
        };
        let since = old.then(|| *superseded.entry(s.snapshot_epoch).or_insert(now));
        let graced = since.is_some_and(|t| now.duration_since(t) >= RETIRE_GRACE);
        if graced && !read(&s) {
            superseded.remove(&s.snapshot_epoch);
            gone.push(s);
        } else {
            kept.push(s);
        }
    }
    superseded.retain(|e, _| kept.iter().any(|s| s.snapshot_epoch == *e));
    (gone, kept)
}

impl OnDemand {
    /// Snapshots of the log of `shape`, each opened by `exporter`, into `<dir>/snapshots`, one
    /// every `interval` (none without) and one for each request read by `requests`, each stored
    /// in Kafka too with `kafka` (the job's producer properties). Folders of copies a crash left
    /// are removed.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        shape: LogShape,
        exporter: Box<dyn Exporter>,
        dir: &Path,
        interval: Option<Duration>,
        requests: Requests,
        keep: usize,
        kafka: Option<BTreeMap<String, String>>,
    ) -> Result<OnDemand> {
        if let Ok(entries) = std::fs::read_dir(dir.join(crate::snapshot::published::SNAPSHOTS)) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if name.starts_with(".pending-") || name.starts_with(".retired-") {
                    std::fs::remove_dir_all(e.path()).with_context(|| {
                        format!("removing {}, a copy a crash left", e.path().display())
                    })?;
                }
            }
        }
        let (placed_tx, placed_rx) = mpsc::channel();
        Ok(OnDemand {
            shape,
            exporter,
            interval,
            last: Instant::now(),
            copying: None,
            placed_tx,
            placed_rx,
            requests,
            answered: None,
            published: Arc::new(Mutex::new(Listed::default())),
            dir: dir.to_path_buf(),
            keep,
            kafka,
            storing: None,
            store_failed: None,
            superseded: BTreeMap::new(),
            retire_looked: Instant::now(),
            meter: None,
        })
    }

    /// Tells `meter` what becomes of each snapshot of `job`'s capture (one log line, one count).
    pub fn with_meter(mut self, job: &str, meter: Arc<dyn CaptureMeter>) -> OnDemand {
        self.meter = Some((job.to_string(), meter));
        self
    }

    fn tell(&self, outcome: SnapshotOutcome, took: Option<Duration>) {
        if let Some((job, meter)) = &self.meter {
            meter.snapshot(job, outcome, took);
        }
    }

    /// `<snapshot.dir>/snapshots`.
    fn root(&self) -> PathBuf {
        self.dir.join(crate::snapshot::published::SNAPSHOTS)
    }

    /// Whether each snapshot is stored in Kafka too (`snapshot_storage = "kafka"`).
    pub fn stores_in_kafka(&self) -> bool {
        self.kafka.is_some()
    }

    /// A new session begins with `log`, from the committed state `record`: the log tells this
    /// where each snapshot barrier committed and lists the published snapshots (with Kafka
    /// storage it announces versions on the state topic too); the snapshots in `record` answered
    /// the requests they name; a copy whose barrier did not commit is abandoned (the assembler that
    /// held its point is gone; a new snapshot has a new point).
    /// The tables the capture removed (its state record's `removed`, as the session resumes
    /// with it): the manifests of its next snapshots name them, so that a job of one is told why
    /// its table is missing.
    pub fn tables_removed(&mut self, removed: &[super::log::RemovedTable]) {
        self.shape.removed = removed
            .iter()
            .map(|r| ManifestRemoved {
                name: r
                    .table
                    .rsplit_once('.')
                    .map_or(r.table.as_str(), |(_, t)| t)
                    .to_string(),
                from_epoch: r.from_epoch,
            })
            .collect();
    }

    pub fn session_started(
        &mut self,
        log: &mut KafkaLog,
        record: Option<&super::log::StateRecord>,
    ) {
        log.on_snapshot_placed = Some(self.placed_tx.clone());
        log.published = Some(self.published.clone());
        if let Some(props) = &self.kafka {
            log.versions_to_kafka = Some(props.clone());
        }
        if let Some(r) = record {
            self.answered = self
                .answered
                .max(r.snapshots.iter().filter_map(|s| s.request).max());
            // The committed list, with those published since (a session that failed before
            // committing them), less those retired: each one whose manifest is there, or (Kafka
            // storage: a capture whose disk was replaced) whose topic is.
            let mut listed = self.published.lock().unwrap();
            if listed.first_topic.is_none() {
                listed.first_topic = r.snapshot_topic.clone();
            }
            for s in &r.snapshots {
                // One retired since is not listed again (its record is to come).
                if listed
                    .retired
                    .iter()
                    .any(|l| l.snapshot_epoch == s.snapshot_epoch)
                {
                    continue;
                }
                match listed
                    .later
                    .iter_mut()
                    .find(|l| l.snapshot_epoch == s.snapshot_epoch)
                {
                    Some(l) => {
                        if l.topic.is_none() {
                            l.topic = s.topic.clone();
                        }
                    }
                    None => listed.later.push(s.clone()),
                }
            }
            let stored = self.kafka.is_some();
            listed.later.retain(|s| {
                Path::new(&s.dir).join("manifest.json").exists() || (stored && s.topic.is_some())
            });
            listed.later.sort_by_key(|s| s.snapshot_epoch);
        }
        self.take_placed();
        if let Some(c) = self.copying.as_ref().filter(|c| c.placed.is_none()) {
            tracing::warn!(at = %self.exporter.show(c.consistent), "a snapshot whose barrier did not commit is abandoned; the next one is taken at the next interval");
            self.tell(SnapshotOutcome::Failed, None);
            self.copying = None;
            self.last = Instant::now();
        }
    }

    fn take_placed(&mut self) {
        while let Ok(p) = self.placed_rx.try_recv() {
            if let Some(c) = self
                .copying
                .as_mut()
                .filter(|c| c.consistent == p.consistent)
            {
                tracing::info!(epoch = %p.snapshot_epoch, at = %self.exporter.show(p.consistent), "snapshot barrier committed");
                c.placed = Some(p);
            }
        }
    }

    /// Between source transactions: starts a snapshot when one is due (a failure to start one is
    /// logged and tried again at the next interval), and publishes one whose copy and barrier
    /// are both done (a failure to publish one is logged; its folder stays hidden).
    pub fn between(&mut self, a: &mut Assembler) {
        self.take_placed();
        if let Some(c) = &mut self.copying {
            if c.thread.as_ref().is_some_and(|t| t.is_finished()) {
                let done = c.thread.take().expect("a copy").join();
                // Every reader imported the snapshot: the exporting session may go.
                c.side = None;
                match done {
                    Ok(Ok(copied)) => c.copied = Some(copied),
                    Ok(Err(e)) => {
                        tracing::warn!(error = %crate::error::line(&e), "a snapshot's copy failed; the next one is taken at the next interval");
                        self.tell(SnapshotOutcome::Failed, None);
                        self.copying = None;
                        self.last = Instant::now();
                    }
                    Err(_) => {
                        tracing::warn!("a snapshot's copy panicked; the next one is taken at the next interval");
                        self.tell(SnapshotOutcome::Failed, None);
                        self.copying = None;
                        self.last = Instant::now();
                    }
                }
            }
        }
        if self
            .copying
            .as_ref()
            .is_some_and(|c| c.copied.is_some() && c.placed.is_some())
        {
            let c = self.copying.take().expect("a copy");
            let (copied, placed) = (c.copied.expect("copied"), c.placed.expect("placed"));
            match self.publish(&c.folder, copied, placed, c.request) {
                Ok(()) => {
                    self.tell(SnapshotOutcome::Published, Some(self.last.elapsed()));
                    self.answered = self.answered.max(c.request);
                    self.retire();
                }
                Err(e) => {
                    tracing::warn!(error = %crate::error::line(&e), "a snapshot could not be published; the next one is taken at the next interval");
                    self.tell(SnapshotOutcome::Failed, None);
                }
            }
            self.last = Instant::now();
        }
        self.store_next();
        self.requests.poll();
        let requested = self.requests.newest;
        let asked = requested > self.answered;
        let due = self.copying.is_none()
            && (asked || self.interval.is_some_and(|i| self.last.elapsed() >= i));
        if due {
            self.last = Instant::now();
            if let Err(e) = self.start(a, requested) {
                tracing::warn!(error = %crate::error::line(&e), "a snapshot could not be started; the next one is taken at the next interval");
                self.tell(SnapshotOutcome::Failed, None);
            }
        }
    }

    /// Opens a snapshot at the source, hands its point to the assembler and starts the copy. Runs
    /// between transactions on the capture's thread, which reads nothing meanwhile: the stream
    /// cannot pass the point before the assembler holds it.
    fn start(&mut self, a: &mut Assembler, request: Option<i64>) -> Result<()> {
        let Exported { point, side, copy } = self.exporter.export()?;
        a.snapshot_at(point)?;
        let shown = self.exporter.show(point);
        let folder = self
            .root()
            .join(format!(".pending-{}", shown.replace(['/', ':'], "-")));
        std::fs::create_dir_all(&folder)
            .with_context(|| format!("creating {}", folder.display()))?;
        let f = folder.clone();
        let thread = std::thread::Builder::new()
            .name("capture-snapshot".into())
            .spawn(move || copy(&f))
            .context("starting the snapshot's copy")?;
        tracing::info!(at = %shown, folder = %folder.display(), "snapshot of the running capture started");
        if let Some(r) = request {
            tracing::info!(request = r, "a snapshot was requested");
        }
        self.copying = Some(Copying {
            consistent: point,
            request,
            folder,
            side,
            thread: Some(thread),
            copied: None,
            placed: None,
        });
        Ok(())
    }

    /// Retires the later snapshots beyond the newest `keep` that no job reads: each renamed out of
    /// sight first (a reader never sees one half-deleted), then removed, and left out of the next
    /// state record. A failure is logged; the folder is tried again after the next snapshot.
    fn retire(&mut self) {
        if self.kafka.is_some() {
            return self.retire_stored();
        }
        let root = self.root();
        for (epoch, folder) in crate::snapshot::published::retirable(&self.dir, self.keep) {
            let hidden = root.join(format!(".retired-{}", epoch.0));
            let gone =
                std::fs::rename(&folder, &hidden).and_then(|()| std::fs::remove_dir_all(&hidden));
            match gone {
                Ok(()) => {
                    self.published
                        .lock()
                        .unwrap()
                        .later
                        .retain(|s| s.snapshot_epoch != epoch);
                    tracing::info!(%epoch, dir = %folder.display(), keep = self.keep, "snapshot retired (no job reads it)");
                    self.tell(SnapshotOutcome::Retired, None);
                }
                Err(e) => {
                    tracing::warn!(%epoch, dir = %folder.display(), error = %e, "retiring a snapshot")
                }
            }
        }
    }

    /// [`retire`](Self::retire) with Kafka storage: what [`retire_after_grace`] retires (a job's
    /// newest mark, [`mark_reading`], or a reader mark in its folder keeps a snapshot) is dropped
    /// from the next record ([`Listed::retire`]: a runner restores only what a record lists); its
    /// topic is deleted and its folder removed once a committed record left it out
    /// ([`Self::delete_unlisted`]).
    fn retire_stored(&mut self) {
        if !self.requests.caught_up {
            return; // a job's mark may be unread yet: retired after the next snapshot
        }
        let mut listed = self.published.lock().unwrap();
        let reading = &self.requests.reading;
        let read = |s: &SnapshotRecord| {
            reading.values().any(|e| *e == s.snapshot_epoch)
                || crate::snapshot::published::has_readers(Path::new(&s.dir))
        };
        let (gone, kept) = retire_after_grace(
            std::mem::take(&mut listed.later),
            self.keep,
            read,
            &mut self.superseded,
            Instant::now(),
        );
        listed.later = kept;
        listed.retired.extend(gone);
    }

    /// Deletes the topics and folders of the snapshots a committed record no longer lists
    /// ([`Listed::unlisted`]). A failure is logged; the topic is left.
    fn delete_unlisted(&mut self, props: &BTreeMap<String, String>) {
        let gone = std::mem::take(&mut self.published.lock().unwrap().unlisted);
        for s in gone {
            if let Some(topic) = &s.topic {
                if let Err(e) = crate::kafka::admin::delete_topic(props, topic) {
                    tracing::warn!(epoch = %s.snapshot_epoch, %topic, error = %crate::error::line(&e), "deleting a retired snapshot's topic");
                }
            }
            let folder = Path::new(&s.dir);
            if folder.exists() {
                let hidden = self.root().join(format!(".retired-{}", s.snapshot_epoch.0));
                if let Err(e) =
                    std::fs::rename(folder, &hidden).and_then(|()| std::fs::remove_dir_all(&hidden))
                {
                    tracing::warn!(epoch = %s.snapshot_epoch, dir = %folder.display(), error = %e, "removing a retired snapshot's folder");
                }
            }
            tracing::info!(epoch = %s.snapshot_epoch, topic = s.topic.as_deref().unwrap_or("-"), keep = self.keep, "snapshot retired (no job reads it)");
            self.tell(SnapshotOutcome::Retired, None);
        }
    }

    /// Kafka storage: collects a finished store (its topic listed from the next commit on), and
    /// starts the next: the first snapshot when it is published and not stored, else the newest
    /// later one not stored (an older one left is retired once a newer is stored). One at a time, on a thread: the stream goes on meanwhile.
    fn store_next(&mut self) {
        let Some(props) = self.kafka.clone() else {
            return;
        };
        self.delete_unlisted(&props);
        if let Some(st) = &self.storing {
            if !st.thread.is_finished() {
                return;
            }
            let st = self.storing.take().expect("storing");
            let done = st
                .thread
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the store panicked")));
            match done {
                Ok(moved) => {
                    let mut listed = self.published.lock().unwrap();
                    match st.later {
                        None => listed.first_topic = Some(st.topic.clone()),
                        Some(e) => {
                            if let Some(l) = listed.later.iter_mut().find(|l| l.snapshot_epoch == e)
                            {
                                l.topic = Some(st.topic.clone());
                            }
                        }
                    }
                    drop(listed);
                    tracing::info!(topic = %st.topic, files = moved.files, bytes = moved.bytes, seconds = moved.seconds, "snapshot stored in Kafka");
                    self.tell(SnapshotOutcome::Stored, None);
                    self.retire();
                }
                Err(e) => {
                    self.store_failed = Some(Instant::now());
                    tracing::warn!(topic = %st.topic, error = %crate::error::line(&e), "storing a snapshot in Kafka failed; tried again in {} s", STORE_RETRY.as_secs());
                    self.tell(SnapshotOutcome::StoreFailed, None);
                }
            }
        }
        if self.retire_looked.elapsed() >= Duration::from_secs(5)
            && self
                .superseded
                .values()
                .any(|t| t.elapsed() >= RETIRE_GRACE)
        {
            self.retire_looked = Instant::now();
            self.retire(); // what a store found retirable, once its grace is over
        }
        if self.store_failed.is_some_and(|t| t.elapsed() < STORE_RETRY) {
            return;
        }
        let next = {
            let listed = self.published.lock().unwrap();
            let first = listed
                .first_topic
                .is_none()
                .then(|| crate::snapshot::files::manifest_epoch(&self.dir))
                .flatten();
            if let Some(e) = first {
                Some((None, e, self.dir.clone()))
            } else {
                listed
                    .later
                    .iter()
                    .rev()
                    .find(|l| l.topic.is_none() && Path::new(&l.dir).join("manifest.json").exists())
                    .map(|l| {
                        (
                            Some(l.snapshot_epoch),
                            l.snapshot_epoch,
                            PathBuf::from(&l.dir),
                        )
                    })
            }
        };
        let Some((later, epoch, folder)) = next else {
            return;
        };
        let topic = crate::snapshot::kafka::topic_of(&self.shape.topic, epoch);
        let t = topic.clone();
        let spawned = std::thread::Builder::new()
            .name("capture-snapshot-store".into())
            .spawn(move || crate::snapshot::kafka::store(&props, &folder, &t));
        match spawned {
            Ok(thread) => {
                tracing::info!(%topic, %epoch, "storing a snapshot in Kafka");
                self.storing = Some(Storing {
                    later,
                    topic,
                    thread,
                });
            }
            Err(e) => {
                self.store_failed = Some(Instant::now());
                tracing::warn!(%topic, error = %e, "starting a snapshot's store");
            }
        }
    }

    /// `copied` with each table's row schema the log's version in force at `epoch` (the changes
    /// after the snapshot are written with it; its defaults resolve the rows of older versions),
    /// which must have the columns the copy found. A column added before the snapshot's point
    /// whose version the log announces only at the table's next change (later than `epoch`) fails
    /// the snapshot: the next one has it.
    fn in_force(&self, mut copied: Copied, epoch: Epoch) -> Result<Copied> {
        let several = self.shape.several();
        for (i, t) in copied.tables.iter_mut().enumerate() {
            let name = several.then_some(t.name.as_str());
            let text = super::session::schema_in_force(
                &self.dir,
                i,
                name,
                epoch,
                &t.row_schema.to_string(),
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?;
            let log: serde_json::Value = serde_json::from_str(&text)?;
            let fields = |v: &serde_json::Value| -> Vec<String> {
                v["fields"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|f| f["name"].as_str().unwrap_or_default().to_string())
                    .collect()
            };
            let (copied_fields, log_fields) = (fields(&t.row_schema), fields(&log));
            if copied_fields != log_fields {
                bail!(
                    "table {}: the snapshot copied columns {copied_fields:?}, but the log's version in force at epoch {epoch} has {log_fields:?} (a column change the log announces with the table's next change): the next snapshot holds it",
                    self.shape.tables[i]
                );
            }
            t.row_schema = log;
        }
        Ok(copied)
    }

    /// Writes the manifest into the copy's folder and renames it to `<snapshots>/<epoch>`.
    fn publish(
        &self,
        folder: &Path,
        copied: Copied,
        placed: SnapshotPlaced,
        request: Option<i64>,
    ) -> Result<()> {
        let rows = copied.rows;
        let copied = self.in_force(copied, placed.snapshot_epoch)?;
        let manifest = self.shape.manifest(
            copied,
            placed.snapshot_epoch,
            start_after(&placed.start_offsets, placed.next_epoch),
        );
        manifest.write(folder)?;
        let root = self.root();
        let target = root.join(placed.snapshot_epoch.0.to_string());
        std::fs::rename(folder, &target)
            .with_context(|| format!("renaming {} to {}", folder.display(), target.display()))?;
        if let Ok(d) = std::fs::File::open(&root) {
            d.sync_all()
                .with_context(|| format!("syncing {}", root.display()))?;
        }
        tracing::info!(epoch = %placed.snapshot_epoch, rows, dir = %target.display(), "snapshot of the running capture published");
        self.published.lock().unwrap().later.push(SnapshotRecord {
            snapshot_epoch: placed.snapshot_epoch,
            next_epoch: placed.next_epoch,
            start_offsets: placed.start_offsets,
            dir: target.display().to_string(),
            request,
            topic: None,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn later(epoch: u64, stored: bool) -> SnapshotRecord {
        SnapshotRecord {
            snapshot_epoch: Epoch(epoch),
            next_epoch: Epoch(epoch + 1),
            start_offsets: vec![0],
            dir: format!("/nowhere/{epoch}"),
            request: None,
            topic: stored.then(|| format!("t.snapshot.{epoch}")),
        }
    }

    fn epochs(v: &[SnapshotRecord]) -> Vec<u64> {
        v.iter().map(|s| s.snapshot_epoch.0).collect()
    }

    /// The race a clean CI run met: a runner reads the list (newest: 1), a store of 2 finishes
    /// before its mark arrives. With keep = 1, 1 is kept for the grace, then retired unless read.
    #[test]
    fn a_superseded_snapshot_outlives_the_store_of_a_newer_one_by_the_grace() {
        let mut superseded = BTreeMap::new();
        let t0 = Instant::now();
        let list = vec![later(1, true), later(2, true)];
        let (gone, kept) = retire_after_grace(list, 1, |_| false, &mut superseded, t0);
        assert!(gone.is_empty());
        assert_eq!(epochs(&kept), [1, 2]);
        // Within the grace the runner's mark arrives: kept while it reads.
        let half = t0 + RETIRE_GRACE / 2;
        let (gone, kept) = retire_after_grace(
            kept,
            1,
            |s| s.snapshot_epoch == Epoch(1),
            &mut superseded,
            half,
        );
        assert!(gone.is_empty());
        let after = t0 + RETIRE_GRACE;
        let (gone, kept) = retire_after_grace(
            kept,
            1,
            |s| s.snapshot_epoch == Epoch(1),
            &mut superseded,
            after,
        );
        assert!(gone.is_empty(), "read: kept");
        // The mark cleared: retired at once (its grace is long over), and forgotten.
        let (gone, kept) = retire_after_grace(kept, 1, |_| false, &mut superseded, after);
        assert_eq!(epochs(&gone), [1]);
        assert_eq!(epochs(&kept), [2]);
        assert!(superseded.is_empty());
    }

    #[test]
    fn the_newest_stored_and_newer_unstored_ones_are_never_retired() {
        let mut superseded = BTreeMap::new();
        let t0 = Instant::now();
        let list = vec![
            later(1, false),
            later(2, true),
            later(3, true),
            later(4, false),
        ];
        let (gone, kept) = retire_after_grace(list, 2, |_| false, &mut superseded, t0);
        assert!(gone.is_empty());
        let (gone, kept) =
            retire_after_grace(kept, 2, |_| false, &mut superseded, t0 + RETIRE_GRACE);
        // 1: not stored and older than a stored one, never to be read; 2 and 3 the newest two
        // stored; 4 is to be stored.
        assert_eq!(epochs(&gone), [1]);
        assert_eq!(epochs(&kept), [2, 3, 4]);
        assert!(superseded.is_empty());
    }
}
