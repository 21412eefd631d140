//! The upstream writer: generates a table workload, writes the snapshot at `Es` (Avro container files
//! plus manifest), then streams changes and barriers into the log topic with an idempotent producer,
//! and finally records the expected table at its last checkpoint (for `verify`).

use std::collections::{BTreeMap, HashMap};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use apache_avro::types::Value;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientContext;

use crate::codec::{LogCodec, TableSchema};
use crate::core::{
    vnode_of, Barrier, BarrierKind, Epoch, Op, PartitionMap, PartitionProgress, Vnode,
};
use crate::rng::SimRng;
use crate::snapshot::files::{
    write_files, write_manifest, write_single_file, write_tables_manifest, Manifest, ManifestTable,
    TablesManifest,
};

/// The example table's row schema.
pub const EXAMPLE_ROW_SCHEMA: &str = include_str!("../schemas/example_row.avsc");
/// The typed table's row schema: every Avro type a row may use.
pub const TYPED_ROW_SCHEMA: &str = include_str!("../schemas/typed_row.avsc");

/// Which table `produce` generates.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum TableKind {
    /// `schemas/example_row.avsc`, primary key `id`.
    #[default]
    Accounts,
    /// `schemas/typed_row.avsc`: every Avro type (NaN, ±Inf and −0.0 doubles among them), primary
    /// key `[region, id]` (not in field order).
    Typed,
}

/// How `produce` lays the snapshot's rows out in files.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SnapshotLayout {
    /// One file per vnode, rows in key order (what the reader handles best).
    #[default]
    PerVnode,
    /// One file holding every vnode's rows in random order, as a data-lake export usually is (the
    /// reader spills it by vnode: `snapshot::files`).
    SingleFile,
}

impl TableKind {
    /// The kind's name, as `--table` spells it.
    pub fn name(self) -> &'static str {
        match self {
            TableKind::Accounts => "accounts",
            TableKind::Typed => "typed",
        }
    }

    /// The log's tables when it carries `n` of this kind: for `n > 1`, `<kind>_1` … `<kind>_n`,
    /// whose row records are the kind's with the number appended to the record name (so each
    /// table's writer schema has its own fingerprint).
    pub fn log_tables(self, n: u32) -> Result<Vec<(String, TableSchema)>> {
        let base = self.schema()?;
        if n <= 1 {
            return Ok(vec![(base.name.clone(), base)]);
        }
        (1..=n)
            .map(|i| {
                let mut json = base.json.clone();
                json["name"] = serde_json::Value::String(format!("{}{i}", base.name));
                let schema = TableSchema::parse(&json.to_string(), &base.primary_key)?;
                Ok((format!("{}_{i}", self.name()), schema))
            })
            .collect()
    }

    pub fn schema(self) -> Result<TableSchema> {
        Ok(match self {
            TableKind::Accounts => TableSchema::parse(EXAMPLE_ROW_SCHEMA, &["id".to_string()])?,
            TableKind::Typed => {
                TableSchema::parse(TYPED_ROW_SCHEMA, &["region".to_string(), "id".to_string()])?
            }
        })
    }

    /// The row with id `id` at `version`.
    pub fn row(self, id: i64, version: i64, row_size: usize, rng: &mut SimRng) -> Value {
        match self {
            TableKind::Accounts => example_row(id, version, row_size, rng),
            TableKind::Typed => typed_row(id, version, row_size, rng),
        }
    }
}

/// The typed table's row: every column exercised, special doubles by `id % 5`, nulls by parity.
pub fn typed_row(id: i64, version: i64, row_size: usize, rng: &mut SimRng) -> Value {
    let amount = match id % 5 {
        0 => f64::NAN,
        1 => f64::INFINITY,
        2 => f64::NEG_INFINITY,
        3 => -0.0,
        _ => id as f64 * 1.5 + version as f64,
    };
    let unscaled = (id * 1000 + version) * if id % 2 == 0 { 1 } else { -1 };
    let filler = row_size.saturating_sub(120).max(1);
    // One entry: a map's encoding follows its (random) hash order, and vectors must be stable.
    let mut attrs = std::collections::HashMap::new();
    attrs.insert(
        "v".to_string(),
        Value::Long(version * 1000 + rng.below(1000) as i64),
    );
    Value::Record(vec![
        ("id".into(), Value::Long(id)),
        ("region".into(), Value::String(format!("région-{}", id % 7))),
        (
            "label".into(),
            if id % 2 == 0 {
                Value::Union(0, Box::new(Value::Null))
            } else {
                Value::Union(1, Box::new(Value::String(format!("\"label\" {id}"))))
            },
        ),
        (
            "score".into(),
            if id % 3 == 0 {
                Value::Union(1, Box::new(Value::Null))
            } else {
                Value::Union(0, Box::new(Value::Double(version as f64 / 3.0)))
            },
        ),
        ("ratio".into(), Value::Float(id as f32 / 7.0)),
        ("amount".into(), Value::Double(amount)),
        ("active".into(), Value::Boolean(version % 2 == 0)),
        ("count".into(), Value::Int((id % 1000) as i32 - 500)),
        ("blob".into(), Value::Bytes(id.to_be_bytes().to_vec())),
        (
            "tag".into(),
            Value::Fixed(4, (id as u32).to_be_bytes().to_vec()),
        ),
        (
            "color".into(),
            Value::Enum(
                (id % 3) as u32,
                ["RED", "GREEN", "BLUE"][(id % 3) as usize].into(),
            ),
        ),
        (
            "price".into(),
            Value::Decimal(apache_avro::Decimal::from(unscaled.to_be_bytes())),
        ),
        (
            "uid".into(),
            Value::Uuid(apache_avro::Uuid::from_u128(
                (id as u128) << 64 | version as u128,
            )),
        ),
        ("day".into(), Value::Date(19_000 + (id % 365) as i32)),
        ("tod".into(), Value::TimeMicros(id % 86_400 * 1_000_000)),
        (
            "ts_ms".into(),
            Value::TimestampMillis(1_700_000_000_000 + id),
        ),
        (
            "ts_us".into(),
            Value::TimestampMicros(1_700_000_000_000_000 + id),
        ),
        (
            "local_ts".into(),
            Value::LocalTimestampMicros(1_700_000_000_000_000 - id),
        ),
        (
            "tags".into(),
            Value::Array(
                (0..id % 3)
                    .map(|i| Value::String(format!("t{i}")))
                    .collect(),
            ),
        ),
        ("attrs".into(), Value::Map(attrs)),
        (
            "address".into(),
            Value::Record(vec![
                ("street".into(), Value::String(format!("{id} Main St"))),
                (
                    "zip".into(),
                    if id % 4 == 0 {
                        Value::Union(0, Box::new(Value::Null))
                    } else {
                        Value::Union(1, Box::new(Value::Int(10_000 + (id % 90_000) as i32)))
                    },
                ),
            ]),
        ),
        ("payload".into(), Value::String("x".repeat(filler))),
    ])
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct Workload {
    pub bootstrap: String,
    pub topic: String,
    pub partitions: u32,
    pub vnode_count: u32,
    /// Rows in the snapshot.
    pub rows: u64,
    /// Ids are drawn from `0..key_space` (≥ rows).
    pub key_space: u64,
    /// Changes after the snapshot.
    pub changes: u64,
    pub changes_per_epoch: u64,
    /// Every n-th barrier is a checkpoint (the last one always is).
    pub checkpoint_every: u64,
    /// Percent of changes to an existing row that are updates (the rest are deletes).
    pub update_percent: u64,
    /// Approximate row size in bytes.
    pub row_size: usize,
    /// Changes per second; 0 = as fast as possible.
    pub rate: u64,
    pub out: PathBuf,
    pub seed: u64,
    pub progress: bool,
    /// Continue the log of an earlier run into the same folder (no new snapshot).
    pub append: bool,
    /// Which table to generate.
    pub table: TableKind,
    /// Tables of that shape in the one log (1: the one-table log; more: `<kind>_1` … `<kind>_N`,
    /// docs/WIRE.md "Several tables").
    pub tables: u32,
    /// How the snapshot's files are laid out.
    pub snapshot_layout: SnapshotLayout,
    /// More librdkafka properties for every client (security: `security.protocol`, SASL, TLS).
    pub kafka_properties: BTreeMap<String, String>,
    /// Write with a transactional producer: one transaction per checkpoint (committed at its
    /// checkpoint barrier), and after every third one a transaction of deletes that is aborted
    /// (a consumer that applied aborted records would lose those rows).
    pub transactional: bool,
    /// Change the row schema three times during the log (docs/WIRE.md "Schema changes",
    /// [`evolved_schemas`]): at the first checkpoint barrier after each quarter of the changes.
    pub evolve: bool,
    /// With `evolve`: the first schema change waits until this file exists (a test starts a job
    /// on the snapshot, waits for it to stream, then lets the versions come).
    pub evolve_gate: Option<PathBuf>,
}

impl Workload {
    /// The properties every client of the writer is built from.
    pub fn client_properties(&self) -> BTreeMap<String, String> {
        let mut p = self.kafka_properties.clone();
        p.insert("bootstrap.servers".into(), self.bootstrap.clone());
        p
    }
}

/// Where an earlier run left the log, for `--append`.
#[derive(serde::Serialize, serde::Deserialize)]
struct WriterState {
    topic: String,
    snapshot_epoch: Epoch,
    /// The `curr` of the last barrier written: the epoch the next change belongs to.
    next_epoch: Epoch,
    #[serde(default)]
    table: TableKind,
    /// Tables in the log (absent in a state written before several tables: one).
    #[serde(default = "one_table")]
    tables: u32,
}

fn one_table() -> u32 {
    1
}

const WRITER_STATE: &str = "writer.json";

#[derive(Clone, Debug, serde::Serialize)]
pub struct WorkloadReport {
    pub snapshot_epoch: Epoch,
    pub final_epoch: Epoch,
    pub snapshot_rows: u64,
    pub changes: u64,
    pub barriers: u64,
    pub final_rows: u64,
    pub seconds: f64,
}

struct Ctx {
    failed: Arc<AtomicU64>,
    first_error: std::sync::Mutex<Option<String>>,
    /// The highest delivered offset per partition: where the initial barrier landed.
    delivered: std::sync::Mutex<HashMap<i32, i64>>,
}

impl ClientContext for Ctx {}

impl ProducerContext for Ctx {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Err((e, _)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                self.first_error
                    .lock()
                    .unwrap()
                    .get_or_insert_with(|| e.to_string());
            }
            Ok(m) => {
                use rdkafka::Message;
                let mut d = self.delivered.lock().unwrap();
                let o = d.entry(m.partition()).or_insert(-1);
                *o = (*o).max(m.offset());
            }
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The example table's row with id `id` at `version`.
pub fn example_row(id: i64, version: i64, row_size: usize, rng: &mut SimRng) -> Value {
    let filler = row_size.saturating_sub(40).max(1);
    let c = (b'a' + (rng.below(26) as u8)) as char;
    Value::Record(vec![
        ("id".into(), Value::Long(id)),
        (
            "owner".into(),
            Value::String(format!("owner-{}", id % 9973)),
        ),
        ("balance".into(), Value::Long(rng.below(1_000_000) as i64)),
        ("version".into(), Value::Long(version)),
        (
            "payload".into(),
            Value::String(std::iter::repeat_n(c, filler).collect()),
        ),
    ])
}

struct Writer<'a> {
    producer: BaseProducer<Ctx>,
    /// One per table of the log; barriers are written with the first's fingerprint.
    codecs: Vec<LogCodec>,
    topic: &'a str,
    map: PartitionMap,
}

impl Writer<'_> {
    fn send(&self, partition: u32, key: &[u8], value: &[u8]) -> Result<()> {
        crate::kafka::send_waiting(&self.producer, self.topic, partition as i32, key, value)
            .with_context(|| format!("producing to {}", self.topic))
    }

    fn barrier(&self, b: Barrier) -> Result<()> {
        let value = self.codecs[0].encode_barrier(&b);
        for p in 0..self.map.partition_count() {
            self.send(p, &[], &value)?;
        }
        Ok(())
    }

    /// A change of table `t` of the log.
    fn change(&self, t: usize, epoch: Epoch, op: Op, key: &[u8], datum: &[u8]) -> Result<()> {
        let vnode = vnode_of(key, self.map.vnode_count());
        let value = self.codecs[t].encode_change(epoch, op, vnode, datum);
        self.send(self.map.partition_of(vnode), key, &value)
    }
}

/// One table's rows by id: (key bytes, datum).
pub type TableRows = HashMap<i64, (Vec<u8>, Vec<u8>)>;

/// Writes the log's tables as a snapshot-format folder at `epoch`: one table as today's one-table
/// manifest, several as a `tables` manifest with each table's files in a folder of its name.
#[allow(clippy::too_many_arguments)]
pub fn write_tables(
    dir: &std::path::Path,
    layout: SnapshotLayout,
    tables: &[(String, TableSchema)],
    map: PartitionMap,
    topic: &str,
    epoch: Epoch,
    rows: &[TableRows],
    start: Vec<PartitionProgress>,
) -> Result<()> {
    if tables.len() == 1 {
        return write_table(
            dir,
            layout,
            &tables[0].1,
            map,
            topic,
            epoch,
            &rows[0],
            start,
        );
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    let mut entries = Vec::new();
    for ((name, table), rows) in tables.iter().zip(rows) {
        let sub = dir.join(name);
        write_table(&sub, layout, table, map, topic, epoch, rows, Vec::new())?;
        let one = sub.join("manifest.json");
        let mut files = serde_json::from_slice::<Manifest>(&std::fs::read(&one)?)?.files;
        std::fs::remove_file(&one)?;
        for f in &mut files {
            f.path = format!("{name}/{}", f.path);
        }
        entries.push(ManifestTable {
            name: name.clone(),
            row_schema: table.json.clone(),
            primary_key: table.primary_key.clone(),
            files,
        });
    }
    write_tables_manifest(
        dir,
        &TablesManifest {
            snapshot_epoch: epoch,
            vnode_count: map.vnode_count(),
            partition_count: map.partition_count(),
            topic: Some(topic.to_string()),
            tables: entries,
            start: start.iter().map(Into::into).collect(),
            removed: Vec::new(),
        },
    )?;
    Ok(())
}

/// Writes a table's rows as a snapshot-format folder (files + manifest) at `epoch`.
#[allow(clippy::too_many_arguments)]
fn write_table(
    dir: &std::path::Path,
    layout: SnapshotLayout,
    table: &TableSchema,
    map: PartitionMap,
    topic: &str,
    epoch: Epoch,
    rows: &TableRows,
    start: Vec<PartitionProgress>,
) -> Result<()> {
    let mut by_vnode: BTreeMap<Vnode, BTreeMap<Vec<u8>, Vec<u8>>> = BTreeMap::new();
    for (key, datum) in rows.values() {
        by_vnode
            .entry(vnode_of(key, map.vnode_count()))
            .or_default()
            .insert(key.clone(), datum.clone());
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    let files = match layout {
        SnapshotLayout::PerVnode => write_files(dir, table, by_vnode)?,
        SnapshotLayout::SingleFile => {
            vec![write_single_file(dir, table, by_vnode, rows.len() as u64)?]
        }
    };
    write_manifest(
        dir,
        &Manifest {
            snapshot_epoch: epoch,
            vnode_count: map.vnode_count(),
            partition_count: map.partition_count(),
            topic: Some(topic.to_string()),
            row_schema: table.json.clone(),
            primary_key: table.primary_key.clone(),
            files,
            start: start.iter().map(Into::into).collect(),
        },
    )?;
    Ok(())
}

/// Runs the workload: snapshot, then changes and barriers, then the expected final table.
pub fn produce(w: &Workload) -> Result<WorkloadReport> {
    let started = Instant::now();
    if !w.append && w.key_space < w.rows {
        bail!(
            "key space {} is smaller than the snapshot's {} rows",
            w.key_space,
            w.rows
        );
    }
    let map = PartitionMap::new(w.vnode_count, w.partitions)?;
    let props = w.client_properties();
    crate::kafka::admin::ensure_topic(&props, &w.topic, w.partitions)?;
    let tables = w.table.log_tables(w.tables)?;
    let n = tables.len();
    if w.append && n > 1 {
        bail!("--append continues a one-table log; --tables {n} writes a new one (leave out --append)");
    }
    if w.evolve && (n > 1 || w.append || w.table != TableKind::Accounts) {
        bail!("--evolve writes a new log of the accounts table (one table, no --append)");
    }
    let mut table = tables[0].1.clone();
    let codecs: Vec<LogCodec> = tables
        .iter()
        .map(|(_, t)| LogCodec::new(t.clone()))
        .collect::<Result<_, _>>()?;
    let ctx = Ctx {
        failed: Arc::new(AtomicU64::new(0)),
        first_error: Default::default(),
        delivered: Default::default(),
    };
    let mut pconfig = crate::kafka::admin::client_config(&props);
    if w.transactional {
        pconfig.set(
            "transactional.id",
            format!("kafka-backfill-writer-{}", w.topic),
        );
    }
    let producer: BaseProducer<Ctx> = pconfig
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .set("queue.buffering.max.kbytes", "1048576")
        .create_with_context(ctx)
        .context("creating the producer")?;
    if w.transactional {
        producer
            .init_transactions(Duration::from_secs(30))
            .context("initialising transactions")?;
        if !w.append {
            // The initial barrier's transaction (an appended log has no initial barrier).
            producer.begin_transaction()?;
        }
    }
    let mut writer = Writer {
        producer,
        codecs: codecs.clone(),
        topic: &w.topic,
        map,
    };
    let mut rng = SimRng::new(w.seed);

    // The table at Es.
    let mut versions: Vec<HashMap<i64, i64>> = vec![HashMap::new(); n];
    let (mut rows, es, mut epoch, snapshot_rows) = if w.append {
        // Continue the chain of an earlier run: its expected table is the table now, and the open
        // epoch is the `curr` of its last barrier.
        let state: WriterState =
            serde_json::from_slice(&std::fs::read(w.out.join(WRITER_STATE)).with_context(
                || format!("--append needs {}", w.out.join(WRITER_STATE).display()),
            )?)?;
        if state.tables != 1 {
            bail!(
                "--append: {} holds a log of {} tables; --append continues a one-table log",
                w.out.display(),
                state.tables
            );
        }
        if state.table != w.table {
            bail!(
                "--append: {} holds the {:?} table, not {:?} (pass --table)",
                w.out.display(),
                state.table,
                w.table
            );
        }
        if state.topic != w.topic {
            bail!(
                "--append: {} was written for topic {}, not {}",
                w.out.display(),
                state.topic,
                w.topic
            );
        }
        let expected = crate::snapshot::files::SnapshotFiles::open(&w.out.join("expected"))?;
        let mut rows = HashMap::new();
        for v in 0..w.vnode_count as Vnode {
            use crate::ports::SnapshotSource;
            for row in expected.scan(v, None)? {
                let row = row?;
                // Both tables have `id` (a long) as their first field.
                let Value::Long(id) = table.decode_row(&row.value)?[0] else {
                    bail!("id is not a long")
                };
                rows.insert(id, (row.key, row.value));
            }
        }
        (vec![rows], state.snapshot_epoch, state.next_epoch, 0)
    } else {
        let mut rows: Vec<TableRows> = Vec::with_capacity(n);
        for (_, table) in &tables {
            let mut t = HashMap::with_capacity(w.rows as usize);
            for id in 0..w.rows as i64 {
                let datum = table.encode_row(&w.table.row(id, 0, w.row_size, &mut rng))?;
                let key = table.key_of_datum(&datum)?;
                t.insert(id, (key, datum));
            }
            rows.push(t);
        }
        let es = Epoch::from_unix_millis(unix_ms());
        let epoch = es.next_at(unix_ms());
        writer.barrier(Barrier {
            prev: es,
            curr: epoch,
            kind: BarrierKind::Initial,
            schema_change: false,
        })?;
        writer.producer.flush(Duration::from_secs(60))?;
        if w.transactional {
            writer
                .producer
                .commit_transaction(Duration::from_secs(60))?;
        }
        // The offset just after the initial barrier, from its delivery report (the high watermark
        // would also count a transaction's commit marker, and may lag the delivery).
        let delivered = writer.producer.context().delivered.lock().unwrap().clone();
        let mut start = Vec::new();
        for p in 0..w.partitions {
            let at = delivered
                .get(&(p as i32))
                .copied()
                .filter(|o| *o >= 0)
                .with_context(|| {
                    format!("no delivery report for the initial barrier in partition {p}")
                })?;
            start.push(PartitionProgress {
                partition: p,
                next_offset: at as u64 + 1,
                epoch,
                streaming: false,
            });
        }
        let snapshot_dir = w.out.join("snapshot");
        write_tables(
            &snapshot_dir,
            w.snapshot_layout,
            &tables,
            map,
            &w.topic,
            es,
            &rows,
            start,
        )?;
        let total = rows.iter().map(|t| t.len() as u64).sum();
        (rows, es, epoch, total)
    };

    // Changes and barriers.
    if w.transactional {
        writer.producer.begin_transaction()?;
    }
    let mut transactions = 0u64;
    let tty = w.progress && std::io::stderr().is_terminal();
    let mut barriers = 0u64;
    let mut in_epoch = 0u64;
    let mut last_checkpoint = epoch; // overwritten by the first checkpoint barrier
    let mut checkpoint_rows = rows.clone();
    // `--evolve`: the row schema's version now (0: the manifest's) and the versions after it.
    let mut version = 0usize;
    let evolved = if w.evolve {
        evolved_schemas()?
    } else {
        Vec::new()
    };
    for i in 0..w.changes {
        if w.rate > 0 {
            let due = started + Duration::from_secs_f64(i as f64 / w.rate as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
        }
        // A one-table log draws no table (the same seed writes the same log as before).
        let t = if n > 1 {
            rng.below(n as u64) as usize
        } else {
            0
        };
        let tb = if t == 0 { &table } else { &tables[t].1 };
        let id = rng.below(w.key_space) as i64;
        match rows[t].get(&id).cloned() {
            Some((key, old)) => {
                if rng.below(100) < w.update_percent {
                    let v = versions[t].entry(id).or_default();
                    *v += 1;
                    let new = tb.encode_row(&evolve_row(
                        w.table.row(id, *v, w.row_size, &mut rng),
                        version,
                        id,
                    ))?;
                    writer.change(t, epoch, Op::UpdateDelete, &key, &old)?;
                    writer.change(t, epoch, Op::UpdateInsert, &key, &new)?;
                    rows[t].insert(id, (key, new));
                } else {
                    writer.change(t, epoch, Op::Delete, &key, &old)?;
                    rows[t].remove(&id);
                }
            }
            None => {
                let new = tb.encode_row(&evolve_row(
                    w.table.row(id, 0, w.row_size, &mut rng),
                    version,
                    id,
                ))?;
                let key = tb.key_of_datum(&new)?;
                writer.change(t, epoch, Op::Insert, &key, &new)?;
                rows[t].insert(id, (key, new));
            }
        }
        in_epoch += 1;
        let last = i + 1 == w.changes;
        if in_epoch >= w.changes_per_epoch || last {
            barriers += 1;
            let kind = if last || barriers.is_multiple_of(w.checkpoint_every) {
                BarrierKind::Checkpoint
            } else {
                BarrierKind::Barrier
            };
            let next = epoch.next_at(unix_ms());
            // A schema change starts after a checkpoint barrier: its version file is written
            // before the barrier, so that every record with its fingerprint follows the file.
            let due = (i + 1) * (evolved.len() as u64 + 1) / w.changes.max(1);
            let switch = kind == BarrierKind::Checkpoint
                && !last
                && version < evolved.len()
                && due as usize > version;
            if switch {
                if let (0, Some(gate)) = (version, &w.evolve_gate) {
                    wait_for_gate(gate, w.progress)?;
                }
                let to = evolved[version].clone();
                let codec = LogCodec::new(to.clone())?;
                crate::snapshot::versions::write(
                    &w.out.join("snapshot"),
                    &codec.fingerprint_hex(),
                    &crate::snapshot::versions::VersionFile {
                        table: None,
                        from_epoch: next,
                        row_schema: to.json.clone(),
                        primary_key: None,
                    },
                )
                .with_context(|| format!("writing schema version {}", version + 1))?;
            }
            writer.barrier(Barrier {
                prev: epoch,
                curr: next,
                kind,
                schema_change: false,
            })?;
            if kind == BarrierKind::Checkpoint {
                last_checkpoint = epoch;
                checkpoint_rows = rows.clone();
            }
            if switch {
                // Every live row as the new version reads it: what the writer's next deletes
                // and updates carry as the old row, and what the expected table holds.
                let to = evolved[version].clone();
                for (_, datum) in rows[0].values_mut() {
                    *datum = crate::codec::versions::resolve(datum, &table, &to)?;
                }
                writer.codecs[0] = LogCodec::new(to.clone())?;
                table = to;
                version += 1;
            }
            if kind == BarrierKind::Checkpoint && w.transactional {
                writer
                    .producer
                    .commit_transaction(Duration::from_secs(60))?;
                transactions += 1;
                if transactions.is_multiple_of(3) {
                    // Deletes of live rows in the open epoch, aborted: never to be applied.
                    writer.producer.begin_transaction()?;
                    for (key, datum) in rows[0].values().take(20) {
                        writer.change(0, next, Op::Delete, key, datum)?;
                    }
                    writer.producer.flush(Duration::from_secs(60))?;
                    writer.producer.abort_transaction(Duration::from_secs(60))?;
                }
                if !last {
                    writer.producer.begin_transaction()?;
                }
            }
            epoch = next;
            in_epoch = 0;
            writer.producer.poll(Duration::ZERO);
        }
        if tty && i % 10_000 == 0 {
            let pct = (i + 1) * 100 / w.changes.max(1);
            eprint!(
                "\r[{:<40}] {pct:>3}% {} changes",
                "#".repeat((pct * 40 / 100) as usize),
                i + 1
            );
        }
    }
    writer.producer.flush(Duration::from_secs(120))?;
    if tty {
        eprintln!();
    }
    let failed = writer.producer.context().failed.load(Ordering::Relaxed);
    if failed > 0 {
        let first = writer
            .producer
            .context()
            .first_error
            .lock()
            .unwrap()
            .clone()
            .unwrap_or_default();
        bail!(
            "{failed} messages were not delivered to {}: {first}",
            w.topic
        );
    }
    let final_rows = checkpoint_rows.iter().map(|t| t.len() as u64).sum();
    // The expected table at the last checkpoint, in the version in force there (the writer's
    // version now: a switch follows a checkpoint barrier, and the last barrier switches nothing).
    let mut final_tables = tables.clone();
    if version > 0 {
        final_tables[0].1 = table.clone();
    }
    write_tables(
        &w.out.join("expected"),
        SnapshotLayout::PerVnode,
        &final_tables,
        map,
        &w.topic,
        last_checkpoint,
        &checkpoint_rows,
        Vec::new(),
    )?;
    let state = WriterState {
        topic: w.topic.clone(),
        snapshot_epoch: es,
        next_epoch: epoch,
        table: w.table,
        tables: n as u32,
    };
    std::fs::write(w.out.join(WRITER_STATE), serde_json::to_vec_pretty(&state)?)?;
    std::io::stderr().flush().ok();
    Ok(WorkloadReport {
        snapshot_epoch: es,
        final_epoch: last_checkpoint,
        snapshot_rows,
        changes: w.changes,
        barriers,
        final_rows,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Waits until `gate` exists (created by whoever holds the writer), at most ten minutes.
fn wait_for_gate(gate: &Path, progress: bool) -> Result<()> {
    if progress {
        eprintln!(
            "holding the first schema change until {} exists",
            gate.display()
        );
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    while !gate.exists() {
        if Instant::now() > deadline {
            bail!("{} did not appear within ten minutes", gate.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// `produce --evolve`'s versions of the accounts table after the manifest's (docs/WIRE.md "Schema
/// changes"): 1 adds `tier` (an int, default 1) and `note` (a nullable string, default null), 2
/// widens `tier` to a long, 3 drops `payload`.
pub fn evolved_schemas() -> Result<Vec<TableSchema>> {
    let base = TableKind::Accounts.schema()?;
    let mut json = base.json.clone();
    let mut out = Vec::new();
    let fields = |json: &mut serde_json::Value| -> Result<Vec<serde_json::Value>> {
        json["fields"]
            .as_array()
            .cloned()
            .context("the row schema has fields")
    };
    let mut f = fields(&mut json)?;
    f.push(serde_json::json!({"name": "tier", "type": "int", "default": 1}));
    f.push(serde_json::json!({"name": "note", "type": ["null", "string"], "default": null}));
    json["fields"] = serde_json::Value::Array(f);
    out.push(TableSchema::parse(&json.to_string(), &base.primary_key)?);
    let mut f = fields(&mut json)?;
    for x in &mut f {
        if x["name"] == "tier" {
            x["type"] = serde_json::json!("long");
        }
    }
    json["fields"] = serde_json::Value::Array(f);
    out.push(TableSchema::parse(&json.to_string(), &base.primary_key)?);
    let mut f = fields(&mut json)?;
    f.retain(|x| x["name"] != "payload");
    json["fields"] = serde_json::Value::Array(f);
    out.push(TableSchema::parse(&json.to_string(), &base.primary_key)?);
    Ok(out)
}

/// An accounts row (`schemas/example_row.avsc`) as version `version` of [`evolved_schemas`] has it.
pub fn evolve_row(row: Value, version: usize, id: i64) -> Value {
    if version == 0 {
        return row;
    }
    let Value::Record(mut fields) = row else {
        return row;
    };
    fields.push((
        "tier".into(),
        if version == 1 {
            Value::Int((id % 5) as i32)
        } else {
            Value::Long(id % 5 + (1 << 40))
        },
    ));
    fields.push((
        "note".into(),
        if id % 3 == 0 {
            Value::Union(0, Box::new(Value::Null))
        } else {
            Value::Union(1, Box::new(Value::String(format!("note {id}"))))
        },
    ));
    if version >= 3 {
        fields.retain(|(n, _)| n != "payload");
    }
    Value::Record(fields)
}
