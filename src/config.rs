//! The configuration file (TOML) and its validation. Every key is documented here and in
//! `config/example.toml`; unknown keys, wrong types and impossible combinations are rejected at start-up
//! with the key's path.
//!
//! Two ways in from the environment: any string value may be written as `"${ENV_NAME}"` and is
//! replaced by that variable at load time (for secrets such as `sasl.password`), and any key may be
//! overridden by a `KAFKA_BACKFILL__…` variable ([`ENV_PREFIX`]). Values under `kafka` are strings
//! (a number or boolean is kept as its text, in the file and in overrides); other keys are typed.
//!
//! [`Config::validate`] checks everything `run` would refuse before it touches a broker or a store
//! (librdkafka's own check of every property name and value, PostgreSQL URLs and their TLS options,
//! listen addresses, the log filter, reserved table names, two jobs on one table); `check-config`
//! is that validation and nothing more: reachability is not checked.
//!
//! It sits below every part it configures (the service, the capture, `check-log`, `verify`, the
//! benches read it) and imports none of them: only the core's names and limits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::core::{vnode::MAX_VNODE_COUNT, RecreationPolicy};

/// The whole file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// HTTP endpoints (`/metrics`, `/livez`, `/readyz`, `/status`).
    #[serde(default)]
    pub http: HttpConfig,
    /// Logging.
    #[serde(default)]
    pub log: LogConfig,
    /// After SIGTERM/SIGINT, how long workers may take to commit and leave the group before the
    /// process exits anyway (in-flight work is then abandoned; the store holds the last checkpoint).
    #[serde(default = "default_grace")]
    pub shutdown_grace_secs: u64,
    /// The jobs this process runs.
    pub jobs: Vec<JobConfig>,
}

fn default_grace() -> u64 {
    30
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Listen address; empty disables HTTP.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Connections served at once; more are closed as they arrive. Keep it well below the process's
    /// open-file limit (librdkafka and the stores need descriptors too).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// A connection that has not sent its whole request head within this time is closed.
    #[serde(default = "default_header_timeout_ms")]
    pub header_timeout_ms: u64,
    /// Serve the write endpoint (live rate limits, `kafka-backfill rate-limit`) on `admin_listen`.
    /// Off by default: anyone who reaches it can slow a job down or lift its limits.
    #[serde(default)]
    pub admin: bool,
    /// Where the write endpoint listens when `admin = true`: its own listener, loopback by default
    /// (reach it with `kubectl port-forward` or from inside the pod), apart from the probes and
    /// metrics on `listen`.
    #[serde(default = "default_admin_listen")]
    pub admin_listen: String,
    /// The bearer token every request to the write endpoint must carry (`Authorization: Bearer …`);
    /// write it as `"${ENV}"` (or `ENV_FILE`). Required when `admin_listen` is not a loopback
    /// address. Never printed.
    #[serde(default)]
    pub admin_token: Option<Secret>,
}

fn default_admin_listen() -> String {
    "127.0.0.1:9465".into()
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: default_listen(),
            max_connections: default_max_connections(),
            header_timeout_ms: default_header_timeout_ms(),
            admin: false,
            admin_listen: default_admin_listen(),
            admin_token: None,
        }
    }
}

fn default_max_connections() -> usize {
    4096
}

fn default_header_timeout_ms() -> u64 {
    5000
}

fn default_listen() -> String {
    "127.0.0.1:9464".into()
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    /// `text` (default) or `json`.
    #[serde(default)]
    pub format: LogFormat,
    /// A tracing filter such as `info` or `kafka_backfill=debug`; `RUST_LOG` wins when set.
    #[serde(default)]
    pub level: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// One job: one upstream table materialised from one snapshot and one log topic.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobConfig {
    /// Unique name; the state store keys everything by it.
    pub name: String,
    /// The log topic (change records and barriers).
    pub topic: String,
    /// Consumers this process runs for the job (each a member of the job's consumer group).
    #[serde(default = "one")]
    pub workers: u32,
    /// Vnodes of the job, fixed for its life; must equal the snapshot's.
    #[serde(default = "default_vnodes")]
    pub vnode_count: u32,
    /// librdkafka properties passed through as they are (`bootstrap.servers`, `group.id`, SASL/SSL …).
    /// The keys in `kafka::MANAGED_CONSUMER_KEYS` are set by kafka-backfill and refused here, unless
    /// set to the very value kafka-backfill enforces. A number or boolean is kept as its text.
    #[serde(default, deserialize_with = "kafka_properties")]
    pub kafka: BTreeMap<String, String>,
    /// Where the snapshot comes from.
    pub snapshot: SnapshotConfig,
    /// Where state and the materialised table live.
    pub store: StoreConfig,
    /// Snapshot-phase commits.
    #[serde(default)]
    pub local_checkpoint: LocalCheckpointConfig,
    /// What to do on the log-store invariant error.
    #[serde(default)]
    pub recreation: RecreationConfig,
    /// Throttle: at most about this many snapshot rows per second and, separately, this many log
    /// records per second, per worker
    /// (0 = unlimited). Limits the load on the snapshot source and the store; demos use it to make
    /// the phases visible.
    #[serde(default)]
    pub max_rows_per_second: u64,
    /// Barrier alignment buffer: how many barriers a partition may run ahead of the slowest owned
    /// partition before it is paused. More uses memory for fewer pauses.
    #[serde(default = "default_ahead")]
    pub max_epochs_ahead: usize,
    /// Alignment buffer by memory, per worker: a partition ahead of the slowest owned partition is
    /// paused once the changes it delivered beyond the slowest's epoch hold more than its share of
    /// this many MiB (over the worker's partitions), until they hold half of it (checked at each
    /// barrier; the slowest is never paused).
    #[serde(default = "default_mib_ahead")]
    pub max_mib_ahead: u64,
    /// What a reader of the table sees while the job moves. `"vnode"` (the default): each vnode at
    /// its own committed epoch — the freshest rows, but with several workers the whole table may be
    /// at no upstream state at all. `"epoch"`: the whole table at one upstream epoch every
    /// partition stands at (`kb_publication.visible_epoch`, `published_epoch` in `/status`); a
    /// worker ahead of the slowest keeps its rows pending until the slowest arrives, and a
    /// recreation keeps the old replica visible until the new generation reaches it
    /// (docs/design/several-tables.md). SQLite and PostgreSQL.
    #[serde(default)]
    pub consistency: Consistency,
    /// Adaptive rate limiting (off unless a target or a lag bound is set).
    #[serde(default)]
    pub rate_limit: AdaptiveRateConfig,
    /// `kafka-backfill capture` writes this job's snapshot and log from a PostgreSQL table
    /// (docs/CAPTURE.md); absent = something else writes them.
    #[serde(default)]
    pub capture: Option<CaptureSection>,
    /// A log record that does not decode: `"stop"` (the default: the job stops at it, every
    /// checkpoint before it committed) or `"dead-letter"` (written to `dead_letter_topic` and
    /// skipped, recorded in the store with the checkpoint that passes it, at most
    /// `max_dead_letters`). Records that break the barrier chain or the routing always stop.
    #[serde(default)]
    pub on_bad_record: OnBadRecord,
    /// The dead-letter topic; default `<topic>.dead-letters`, created with one partition when absent.
    #[serde(default)]
    pub dead_letter_topic: Option<String>,
    /// Dead letters the job may record in all (over restarts and recreations); the checkpoint that
    /// would record one more is refused and the job stops.
    #[serde(default = "default_max_dead_letters")]
    pub max_dead_letters: u64,
}

/// `consistency`: what a reader of the table sees while the job moves.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Consistency {
    /// Each vnode at its own committed epoch.
    #[default]
    Vnode,
    /// The whole table at one epoch every partition stands at (publication).
    Epoch,
}

/// `on_bad_record`: what a record that does not decode does.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum OnBadRecord {
    #[default]
    Stop,
    DeadLetter,
}

fn default_max_dead_letters() -> u64 {
    100
}

impl JobConfig {
    /// The dead-letter topic and cap, when the job dead-letters.
    /// The job's behaviour as the core takes it, built once here from the configuration and
    /// carried unchanged to every worker's executor; `tables` are the log tables it materialises
    /// (known once its snapshot is read).
    pub fn policy(&self, tables: crate::core::JobTables) -> crate::core::JobPolicy {
        crate::core::JobPolicy {
            local_checkpoint: crate::core::LocalCheckpointPolicy {
                max_rows: self.local_checkpoint.max_rows,
                max_interval_ms: self.local_checkpoint.interval_ms,
            },
            max_epochs_ahead: self.max_epochs_ahead,
            max_bytes_ahead: self.max_mib_ahead << 20,
            reschedule: self.recreation.policy == crate::core::RecreationPolicy::Reschedule,
            max_dead_letters: self.dead_letters().map(|(_, max)| max),
            commit_every_checkpoint: self.consistency == Consistency::Epoch,
            tables,
        }
    }

    pub fn dead_letters(&self) -> Option<(String, u64)> {
        (self.on_bad_record == OnBadRecord::DeadLetter).then(|| {
            (
                self.dead_letter_topic
                    .clone()
                    .unwrap_or_else(|| format!("{}.dead-letters", self.topic)),
                self.max_dead_letters,
            )
        })
    }
}

/// `[jobs.capture]`: the PostgreSQL table `kafka-backfill capture` turns into the job's snapshot
/// (the job's `snapshot.dir`) and log (the job's `topic`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureSection {
    /// The source database, `postgresql://user:password@host:port/database` (the user needs the
    /// REPLICATION attribute). Never printed.
    pub source_url: Secret,
    /// The table, `schema.table` (`public` when the schema is left out). Or `tables`.
    #[serde(default)]
    pub table: Option<String>,
    /// Several tables into one log of one epoch chain (docs/WIRE.md "Several tables"), each
    /// `schema.table`, with distinct table names: the manifest names each table by its name without
    /// the schema, which is what `snapshot.table` of a job reading the log names. Or `table`.
    #[serde(default)]
    pub tables: Vec<String>,
    /// The publication (created for the table when absent); default `kb_<job>`.
    #[serde(default)]
    pub publication: Option<String>,
    /// The logical replication slot; default `kb_<job>`.
    #[serde(default)]
    pub slot: Option<String>,
    /// Partitions of the topic when capture creates it (an existing topic keeps its own; either
    /// way at most `vnode_count`).
    #[serde(default = "default_capture_partitions")]
    pub partitions: u32,
    /// An epoch closes at the first transaction boundary after it is this old (ms).
    #[serde(default = "default_capture_barrier_ms")]
    pub barrier_interval_ms: u64,
    /// A checkpoint (and one Kafka transaction) at most this often (ms).
    #[serde(default = "default_capture_checkpoint_ms")]
    pub checkpoint_interval_ms: u64,
    /// Connections that copy the snapshot in parallel, each a range of the table's pages (ctid)
    /// in the same exported snapshot; at most one per 16 MiB of the table.
    #[serde(default = "default_copy_connections")]
    pub copy_connections: usize,
    /// A new snapshot of the running capture this often (ms), each at a checkpoint barrier of the
    /// live log, into `<snapshot.dir>/snapshots/<epoch>/` (docs/CAPTURE.md "Snapshots of a running
    /// capture"), so a job started later replays at most about this much log; none when absent.
    #[serde(default)]
    pub snapshot_interval_ms: Option<u64>,
    /// Snapshots of the running capture kept, newest first (≥ 1); older ones are deleted unless a
    /// job reads them (its mark in the snapshot's `readers/`). The first snapshot is never deleted.
    #[serde(default = "default_snapshot_keep")]
    pub snapshot_keep: usize,
    /// Where the capture's snapshots are kept for the runners: `"files"` (the default: in
    /// `snapshot.dir`, which every runner reads, so several machines need a shared volume) or
    /// `"kafka"` (each snapshot also stored in a topic of its own, `<topic>.snapshot.<epoch>`,
    /// which a runner restores into its own `snapshot.dir`: no shared volume; docs/CAPTURE.md
    /// "Where snapshots are stored").
    #[serde(default)]
    pub snapshot_storage: SnapshotStorage,
}

/// `[jobs.capture] snapshot_storage`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotStorage {
    /// The snapshot folders in `snapshot.dir` only.
    #[default]
    Files,
    /// Each snapshot folder also stored in a Kafka topic of its own.
    Kafka,
}

fn default_snapshot_keep() -> usize {
    3
}

fn default_copy_connections() -> usize {
    2
}

fn default_capture_partitions() -> u32 {
    4
}

fn default_capture_barrier_ms() -> u64 {
    200
}

fn default_capture_checkpoint_ms() -> u64 {
    1000
}

impl CaptureSection {
    /// `snapshot_storage = "kafka"`: each snapshot is stored in a topic of its own
    /// ([`crate::snapshot::kafka`]), the schema versions in the versions topic.
    pub fn stores_in_kafka(&self) -> bool {
        self.snapshot_storage == SnapshotStorage::Kafka
    }

    /// The captured tables, in the log's order (one for `table`), checked: `table` or `tables`, not
    /// both; each a `schema.table`; no two with one name (the manifest's names). The error names
    /// the key under `[jobs.capture]`.
    pub fn table_names(&self) -> Result<Vec<TableName>, (&'static str, String)> {
        let (key, names): (&str, Vec<&String>) = match (&self.table, self.tables.as_slice()) {
            (Some(_), [_, ..]) => return Err(("tables", "set table or tables, not both".into())),
            (Some(t), []) => ("table", vec![t]),
            (None, []) => {
                return Err((
                    "table",
                    "missing: the table to capture (or tables = [...])".into(),
                ))
            }
            (None, ts) => ("tables", ts.iter().collect()),
        };
        if names.len() > usize::from(u16::MAX) {
            return Err((key, format!("{} tables: at most {}", names.len(), u16::MAX)));
        }
        let mut out: Vec<TableName> = Vec::new();
        for n in names {
            let t = TableName::parse(n).map_err(|e| (key, e.to_string()))?;
            if let Some(other) = out.iter().find(|o| o.table == t.table) {
                return Err((
                    key,
                    format!("{other} and {t}: the log names its tables without the schema, so their names must differ"),
                ));
            }
            out.push(t);
        }
        Ok(out)
    }

    fn default_name(job: &str) -> String {
        let s: String = job
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        format!("kb_{s}")
    }

    /// The publication's name.
    pub fn publication_name(&self, job: &str) -> String {
        self.publication
            .clone()
            .unwrap_or_else(|| Self::default_name(job))
    }

    /// The slot's name.
    pub fn slot_name(&self, job: &str) -> String {
        self.slot.clone().unwrap_or_else(|| Self::default_name(job))
    }
}

/// `[jobs.rate_limit]`: each worker caps its own rate to hold the p99 of its checkpoint commit
/// latency under a target (`kafka_backfill_core::Adaptive`), under the live or configured limits.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdaptiveRateConfig {
    /// Hold the p99 of checkpoint commit latency under this many ms (a shared downstream database
    /// under load): every commit over it lowers the rate by a tenth, every commit under it raises the
    /// rate by a 199th of that, so 0.5 % of commits end up over it; at most halved per window.
    #[serde(default)]
    pub target_commit_p99_ms: Option<u64>,
    /// Never slow down past this epoch lag (seconds): over it, the rate is raised instead.
    #[serde(default)]
    pub max_epoch_lag_secs: Option<u64>,
    /// The lowest rate the adaptive mode sets (records or rows per second per worker).
    #[serde(default = "default_min_rate")]
    pub min_per_second: u64,
    /// How often it decides (seconds).
    #[serde(default = "default_adaptive_window")]
    pub window_secs: u64,
}

impl Default for AdaptiveRateConfig {
    fn default() -> Self {
        AdaptiveRateConfig {
            target_commit_p99_ms: None,
            max_epoch_lag_secs: None,
            min_per_second: default_min_rate(),
            window_secs: default_adaptive_window(),
        }
    }
}

impl AdaptiveRateConfig {
    /// The core's view of it.
    pub fn core(&self) -> crate::core::AdaptiveConfig {
        crate::core::AdaptiveConfig {
            target_commit_p99_ms: self.target_commit_p99_ms.map(|t| t as f64),
            max_epoch_lag_secs: self.max_epoch_lag_secs.map(|t| t as f64),
            floor: self.min_per_second,
            window_ms: self.window_secs * 1000,
        }
    }
}

fn default_min_rate() -> u64 {
    100
}

fn default_adaptive_window() -> u64 {
    5
}

fn default_ahead() -> usize {
    256
}

fn default_store_datum() -> bool {
    true
}

fn default_mib_ahead() -> u64 {
    32
}

fn one() -> u32 {
    1
}

fn default_vnodes() -> u32 {
    crate::core::vnode::DEFAULT_VNODE_COUNT
}

/// A value that must never be printed (a URL with a password, a key): `Debug` and `Display` show
/// `***`; [`Secret::expose`] hands it to the one place that uses it.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value itself, for the client that needs it; never for logs or output.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "snake_case")]
pub enum SnapshotConfig {
    /// Avro container files plus `manifest.json`, as `kafka-backfill produce` writes them.
    Files {
        /// The folder holding `manifest.json`.
        dir: PathBuf,
        /// The table of the log this job materialises, by its manifest name, when the manifest
        /// holds several (`tables`); absent: the manifest's only table.
        #[serde(default)]
        table: Option<String>,
    },
    /// A PostgreSQL table recorded in `kb_snapshots` (see `kafka-backfill export-snapshot`).
    Postgres {
        /// `postgresql://user:password@host:port/database` (TLS options as in libpq: `sslmode`,
        /// `sslrootcert`, `sslcert`, `sslkey`). Never printed.
        url: Secret,
        /// The snapshot's name in `kb_snapshots`.
        name: String,
    },
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "snake_case")]
pub enum StoreConfig {
    /// One SQLite file.
    Sqlite {
        /// The database file (created if missing).
        path: PathBuf,
        /// The SQL table that receives the rows (or `tables`).
        #[serde(default)]
        table: String,
        /// A job materialising several tables of its log, each into its own SQL table, all
        /// committed in one transaction per checkpoint: `{ <manifest table name> = "<SQL table>" … }`
        /// (docs/design/several-tables.md §3). Instead of `table`; needs `consistency = "epoch"` and a
        /// file snapshot.
        #[serde(default)]
        tables: BTreeMap<String, String>,
        /// Keep each row's Avro datum in a `_kb_row` column beside its typed columns (the default).
        /// `false` leaves it out of a new table — fewer bytes per row to write — for row schemas
        /// whose fields are all primitives or nullable primitives; `verify` then rebuilds each row
        /// from its typed columns (a double by value: SQLite holds −0.0 as 0.0). A table keeps the
        /// layout it was created with: asking an existing table for the other one is refused.
        #[serde(default = "default_store_datum")]
        store_datum: bool,
    },
    /// PostgreSQL, so that workers on several machines share one job.
    Postgres {
        /// `postgresql://user:password@host:port/database` (write the password as `${ENV}`; TLS
        /// options as in libpq: `sslmode`, `sslrootcert`, `sslcert`, `sslkey`). Never printed.
        url: Secret,
        /// The SQL table that receives the rows (or `tables`).
        #[serde(default)]
        table: String,
        /// As SQLite's `tables`: several tables of the log, each into its own SQL table.
        #[serde(default)]
        tables: BTreeMap<String, String>,
    },
}

impl StoreConfig {
    pub fn table(&self) -> &str {
        match self {
            StoreConfig::Sqlite { table, .. } | StoreConfig::Postgres { table, .. } => table,
        }
    }

    /// `tables`: the log's tables a job of several materialises, each with its SQL table (empty for
    /// a job of one table).
    pub fn tables(&self) -> &BTreeMap<String, String> {
        match self {
            StoreConfig::Sqlite { tables, .. } | StoreConfig::Postgres { tables, .. } => tables,
        }
    }

    /// Every SQL table the job writes.
    pub fn table_names(&self) -> Vec<&str> {
        if self.tables().is_empty() {
            vec![self.table()]
        } else {
            self.tables().values().map(String::as_str).collect()
        }
    }

    fn describe_tables(&self) -> String {
        match self.table_names().as_slice() {
            [one] => format!("table {one}"),
            several => format!("tables {}", several.join(", ")),
        }
    }

    /// Where the store is, with any password masked.
    pub fn describe(&self) -> String {
        match self {
            StoreConfig::Sqlite {
                path, store_datum, ..
            } => format!(
                "sqlite {} {}{}",
                path.display(),
                self.describe_tables(),
                if *store_datum { "" } else { " (no _kb_row)" }
            ),
            StoreConfig::Postgres { url, .. } => {
                format!(
                    "postgres {} {}",
                    crate::pg_tls::redact_url(url.expose()),
                    self.describe_tables()
                )
            }
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalCheckpointConfig {
    /// Commit after this many snapshot rows. (Each pending checkpoint holds its rows and their
    /// decoded columns in memory, and consecutive ones are group-committed anyway: 10,000 keeps a
    /// 1M-row snapshot's peak RSS near 185 MiB where 50,000 took it past 270 MiB, at the same speed
    /// — `docs/BENCHMARKS.md`.)
    #[serde(default = "default_rows")]
    pub max_rows: u64,
    /// Commit at least this often while rows are pending (milliseconds).
    #[serde(default = "default_interval")]
    pub interval_ms: u64,
}

impl Default for LocalCheckpointConfig {
    fn default() -> Self {
        LocalCheckpointConfig {
            max_rows: default_rows(),
            interval_ms: default_interval(),
        }
    }
}

fn default_rows() -> u64 {
    10_000
}

fn default_interval() -> u64 {
    1_000
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecreationConfig {
    /// `recreate` (default) or `fail`.
    #[serde(default = "default_policy")]
    pub policy: RecreationPolicy,
    /// At most this many recreations within `window_secs`; one more stops the job.
    #[serde(default = "default_max")]
    pub max_recreations: u32,
    #[serde(default = "default_window")]
    pub window_secs: u64,
    /// Backoff before a recreation, doubled each time within the window, capped by `backoff_max_ms`.
    #[serde(default = "default_backoff")]
    pub backoff_initial_ms: u64,
    #[serde(default = "default_backoff_max")]
    pub backoff_max_ms: u64,
}

impl Default for RecreationConfig {
    fn default() -> Self {
        RecreationConfig {
            policy: default_policy(),
            max_recreations: default_max(),
            window_secs: default_window(),
            backoff_initial_ms: default_backoff(),
            backoff_max_ms: default_backoff_max(),
        }
    }
}

fn default_policy() -> RecreationPolicy {
    RecreationPolicy::Recreate
}
fn default_max() -> u32 {
    5
}
fn default_window() -> u64 {
    600
}
fn default_backoff() -> u64 {
    500
}
fn default_backoff_max() -> u64 {
    30_000
}

/// librdkafka properties: any scalar, kept as its text (`session.timeout.ms = 45000` and
/// `"enable.idempotence" = true` are librdkafka's `"45000"` and `"true"`).
fn kafka_properties<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Scalar {
        Text(String),
        Integer(i64),
        Float(f64),
        Bool(bool),
    }
    let raw = BTreeMap::<String, Scalar>::deserialize(d)?;
    Ok(raw
        .into_iter()
        .map(|(k, v)| {
            let text = match v {
                Scalar::Text(s) => s,
                Scalar::Integer(i) => i.to_string(),
                Scalar::Float(f) => f.to_string(),
                Scalar::Bool(b) => b.to_string(),
            };
            (k, text)
        })
        .collect())
}

/// A configuration problem, naming the key.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

/// What a job of several tables (`store.tables`) needs of the rest of its configuration.
fn check_several_tables(job: &JobConfig, at: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
    if job.consistency != Consistency::Epoch {
        return Err(err(
            at("consistency"),
            "a job of several tables (store.tables) needs consistency = \"epoch\": its tables then move together by whole epochs, across every worker (docs/design/several-tables.md §2)",
        ));
    }
    match &job.snapshot {
        SnapshotConfig::Files { table: Some(_), .. } => {
            return Err(err(
                at("snapshot.table"),
                "names the one table of a job of one table; a job of several names its tables in store.tables: leave snapshot.table out",
            ))
        }
        SnapshotConfig::Files { .. } => {}
        SnapshotConfig::Postgres { .. } => {
            return Err(err(
                at("snapshot.kind"),
                "a job of several tables reads a file snapshot (a PostgreSQL snapshot holds one table)",
            ))
        }
    }
    match &job.store {
        StoreConfig::Sqlite {
            store_datum: false, ..
        } => Err(err(
            at("store.store_datum"),
            "a job of several tables keeps each row's datum: leave store_datum out (true)",
        )),
        StoreConfig::Sqlite { .. } | StoreConfig::Postgres { .. } => Ok(()),
    }
}

fn err(path: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        path: path.into(),
        message: message.into(),
    }
}

impl Config {
    /// Reads, substitutes `${ENV}` values, parses and validates a file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| err(path.display().to_string(), e.to_string()))?;
        Self::parse(&text, &path.display().to_string())
    }

    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let overrides: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| k.starts_with(ENV_PREFIX))
            .collect();
        Self::parse_with(text, origin, &overrides)
    }

    /// Parses with explicit `KAFKA_BACKFILL__…` overrides (the environment's, in [`Config::parse`]).
    pub fn parse_with(
        text: &str,
        origin: &str,
        overrides: &[(String, String)],
    ) -> Result<Config, ConfigError> {
        // Parse first, then substitute `${ENV}` inside string values only: a value can never change
        // the file's structure, whatever characters it holds.
        let mut doc: toml::Table = toml::from_str(text).map_err(|e: toml::de::Error| {
            let span = e.span().map(|s| line_of(text, s.start)).unwrap_or_default();
            err(format!("{origin}{span}"), e.message().trim().to_string())
        })?;
        substitute_env_values(&mut doc, "")?;
        let mut set_by = Vec::new();
        for (k, v) in overrides {
            set_by.push((apply_override(&mut doc, k, v)?, k.clone()));
        }
        // An error at a key an override set names the variable that set it.
        let blame = |e: ConfigError| match set_by
            .iter()
            .rev()
            .find(|(path, _)| same_key(&e.path, path))
        {
            Some((_, var)) => err(format!("{} (set by {var})", e.path), e.message),
            None => e,
        };
        let config: Config = serde_path_to_error::deserialize(toml::Value::Table(doc))
            .map_err(|e| {
                let path = e.path().to_string();
                let path = if path == "." {
                    origin.to_string()
                } else {
                    path
                };
                err(path, e.inner().message().trim().to_string())
            })
            .map_err(blame)?;
        config.validate().map_err(blame)?;
        Ok(config)
    }

    /// What validation accepted but an operator should know (a managed key set to the value
    /// kafka-backfill enforces anyway), as `key path: note` lines for `check-config`.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        for (i, job) in self.jobs.iter().enumerate() {
            for (k, value, _) in crate::kafka::managed_keys(&job.kafka) {
                if job.kafka.get(*k).is_some_and(|v| v == value) {
                    notes.push(format!(
                        "jobs[{i}].kafka.\"{k}\": {value} is what kafka-backfill sets anyway; the key can be removed"
                    ));
                }
            }
        }
        notes
    }

    /// Checks what types cannot: ranges, combinations, uniqueness.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.jobs.is_empty() {
            return Err(err("jobs", "no job configured"));
        }
        if self.http.max_connections == 0 {
            return Err(err("http.max_connections", "must be at least 1"));
        }
        if self.http.admin && self.http.admin_listen.is_empty() {
            return Err(err(
                "http.admin_listen",
                "must be an address when http.admin = true",
            ));
        }
        if self.http.header_timeout_ms == 0 {
            return Err(err("http.header_timeout_ms", "must be at least 1"));
        }
        let listen = listen_addr("http.listen", &self.http.listen)?;
        if self.http.admin {
            let admin = listen_addr("http.admin_listen", &self.http.admin_listen)?;
            if admin.is_some() && admin == listen {
                return Err(err(
                    "http.admin_listen",
                    "is http.listen's address: the write endpoint needs its own listener",
                ));
            }
            if let Some(t) = &self.http.admin_token {
                if t.expose().trim().is_empty() {
                    return Err(err("http.admin_token", "empty"));
                }
            } else if admin.is_some_and(|a| !a.ip().is_loopback()) {
                return Err(err(
                    "http.admin_token",
                    format!("required: http.admin_listen ({}) is not a loopback address, and anyone who reaches it could pause a job or change its limits; set admin_token = \"${{KB_ADMIN_TOKEN}}\"", self.http.admin_listen),
                ));
            }
        }
        if let Some(level) = &self.log.level {
            check_log_filter(level).map_err(|m| err("log.level", m))?;
        }
        let mut names = std::collections::BTreeSet::new();
        // (store identity, table) → the job that writes it.
        let mut tables: BTreeMap<(String, String), String> = BTreeMap::new();
        for (i, job) in self.jobs.iter().enumerate() {
            let at = |k: &str| format!("jobs[{i}].{k}");
            if job.name.is_empty()
                || !job
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(err(at("name"), "use letters, digits, - and _"));
            }
            if !names.insert(job.name.clone()) {
                return Err(err(
                    at("name"),
                    format!("job {} is configured twice", job.name),
                ));
            }
            if job.topic.is_empty() {
                return Err(err(at("topic"), "empty"));
            }
            if job.workers == 0 || job.workers > 64 {
                return Err(err(at("workers"), "must be 1..=64"));
            }
            if job.vnode_count == 0 || job.vnode_count > MAX_VNODE_COUNT {
                return Err(err(
                    at("vnode_count"),
                    format!("must be 1..={MAX_VNODE_COUNT}"),
                ));
            }
            match job.kafka.get("bootstrap.servers") {
                None => return Err(err(at("kafka"), "bootstrap.servers is required")),
                Some(b) if b.trim().is_empty() => {
                    return Err(err(at("kafka.\"bootstrap.servers\""), "empty"))
                }
                _ => {}
            }
            if job
                .kafka
                .get("group.id")
                .is_some_and(|g| g.trim().is_empty())
            {
                return Err(err(
                    at("kafka.\"group.id\""),
                    "empty (leave it out for kafka-backfill-<job name>)",
                ));
            }
            if let Some(c) = &job.capture {
                let SnapshotConfig::Files { table, .. } = &job.snapshot else {
                    return Err(err(
                        at("capture"),
                        "capture writes the snapshot as files: set snapshot = { kind = \"files\", dir = … }",
                    ));
                };
                let tables = c
                    .table_names()
                    .map_err(|(key, m)| err(at(&format!("capture.{key}")), m))?;
                match (tables.as_slice(), table) {
                    ([_], Some(_)) => {
                        return Err(err(
                            at("snapshot.table"),
                            "capture writes a log of one table: leave snapshot.table out",
                        ))
                    }
                    ([_], None) => {}
                    (_, None) if !job.store.tables().is_empty() => {
                        for name in job.store.tables().keys() {
                            if !tables.iter().any(|t| &t.table == name) {
                                return Err(err(
                                    at(&format!("store.tables.{name}")),
                                    format!(
                                        "{name:?} is none of the captured tables ({})",
                                        tables.iter().map(|t| t.table.as_str()).collect::<Vec<_>>().join(", ")
                                    ),
                                ));
                            }
                        }
                    }
                    (_, None) => {
                        return Err(err(
                            at("snapshot.table"),
                            format!(
                                "capture writes a log of several tables ({}): name the one this job materialises",
                                tables.iter().map(|t| t.table.as_str()).collect::<Vec<_>>().join(", ")
                            ),
                        ))
                    }
                    (_, Some(name)) => {
                        if !tables.iter().any(|t| &t.table == name) {
                            return Err(err(
                                at("snapshot.table"),
                                format!(
                                    "{name:?} is none of the captured tables ({})",
                                    tables.iter().map(|t| t.table.as_str()).collect::<Vec<_>>().join(", ")
                                ),
                            ));
                        }
                    }
                }
                crate::pg_tls::check_url(c.source_url.expose())
                    .map_err(|m| err(at("capture.source_url"), m))?;
                let slot = c.slot_name(&job.name);
                if slot.len() > 63
                    || !slot
                        .chars()
                        .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_')
                {
                    return Err(err(
                        at("capture.slot"),
                        format!(
                            "{slot:?}: a slot name is at most 63 lower-case letters, digits and _"
                        ),
                    ));
                }
                let publication = c.publication_name(&job.name);
                if publication.is_empty() || publication.len() > 63 {
                    return Err(err(
                        at("capture.publication"),
                        format!("{publication:?}: a publication name is 1 to 63 bytes (PostgreSQL would cut a longer one)"),
                    ));
                }
                if !(1..=16).contains(&c.copy_connections) {
                    return Err(err(at("capture.copy_connections"), "must be 1..=16"));
                }
                if c.snapshot_keep == 0 {
                    return Err(err(
                        at("capture.snapshot_keep"),
                        "must be at least 1 (a job that starts reads the newest snapshot)",
                    ));
                }
                if c.snapshot_interval_ms.is_some_and(|ms| ms < 1000) {
                    return Err(err(
                        at("capture.snapshot_interval_ms"),
                        "must be at least 1000 (a snapshot copies every captured table)",
                    ));
                }
                if c.partitions == 0 || c.partitions > job.vnode_count {
                    return Err(err(
                        at("capture.partitions"),
                        format!("must be 1..={} (the job's vnode_count)", job.vnode_count),
                    ));
                }
                if c.barrier_interval_ms == 0 || c.checkpoint_interval_ms < c.barrier_interval_ms {
                    return Err(err(
                        at("capture.checkpoint_interval_ms"),
                        "barrier_interval_ms must be ≥ 1 and checkpoint_interval_ms ≥ barrier_interval_ms",
                    ));
                }
            }
            match job.dead_letters() {
                Some((topic, max)) => {
                    if topic == job.topic || topic.is_empty() {
                        return Err(err(
                            at("dead_letter_topic"),
                            "must be a topic of its own, not the job's log topic",
                        ));
                    }
                    if max == 0 {
                        return Err(err(
                            at("max_dead_letters"),
                            "must be at least 1 with on_bad_record = \"dead-letter\"",
                        ));
                    }
                }
                None if job.dead_letter_topic.is_some() => {
                    return Err(err(
                        at("dead_letter_topic"),
                        "is used only with on_bad_record = \"dead-letter\"; set it, or remove this key",
                    ));
                }
                None => {}
            }
            if crate::kafka::uses_consumer_protocol(&job.kafka) {
                for (k, why) in crate::kafka::CLASSIC_PROTOCOL_KEYS {
                    if job.kafka.contains_key(k) {
                        return Err(err(
                            at(&format!("kafka.\"{k}\"")),
                            format!("is not allowed with \"group.protocol\" = \"consumer\" (librdkafka refuses it: {why}); remove it"),
                        ));
                    }
                }
            }
            for (k, value, why) in crate::kafka::managed_keys(&job.kafka) {
                if job.kafka.get(*k).is_some_and(|v| v != value) {
                    return Err(err(
                        at(&format!("kafka.\"{k}\"")),
                        format!("is managed by kafka-backfill (always {value}: {why}); remove it"),
                    ));
                }
            }
            if let Some(v) = job.kafka.get("max.poll.interval.ms") {
                let min = 2 * crate::core::retry::Backoff::STORE.deadline_ms;
                if v.trim().parse::<u64>().is_ok_and(|ms| ms < min) {
                    return Err(err(
                        at("kafka.\"max.poll.interval.ms\""),
                        format!("{v} is below {min}: the loop acknowledges a revocation only once the commits before it are durable, which the store may take its whole retry deadline ({} ms) to confirm; under \"group.protocol\" = \"consumer\" it is also the rebalance timeout", crate::core::retry::Backoff::STORE.deadline_ms),
                    ));
                }
            }
            crate::kafka::check_properties(&job.kafka)
                .map_err(|(k, m)| err(at(&format!("kafka.\"{k}\"")), m))?;
            let several = job.store.tables();
            // (the key path of each SQL table's name, the name)
            let names: Vec<(String, &str)> = if several.is_empty() {
                vec![(at("store.table"), job.store.table())]
            } else {
                if !job.store.table().is_empty() {
                    return Err(err(
                        at("store.table"),
                        "set store.table (one table) or store.tables (several), not both",
                    ));
                }
                several
                    .iter()
                    .map(|(t, n)| (at(&format!("store.tables.{t}")), n.as_str()))
                    .collect()
            };
            if !several.is_empty() {
                check_several_tables(job, &at)?;
            }
            let store_id = match &job.store {
                StoreConfig::Sqlite { path, .. } => format!("sqlite:{}", lexical(path).display()),
                StoreConfig::Postgres { url, .. } => {
                    crate::pg_tls::check_url(url.expose()).map_err(|m| err(at("store.url"), m))?;
                    format!("postgres:{}", url.expose())
                }
            };
            for (key, table) in names {
                if table.is_empty() {
                    return Err(err(
                        key,
                        "missing: name the SQL table that receives the rows (or store.tables for several)",
                    ));
                }
                if !table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err(err(key, "use letters, digits and _"));
                }
                if table.to_ascii_lowercase().starts_with("kb_") {
                    return Err(err(
                        key,
                        format!("{table}: names starting with kb_ are kafka-backfill's own tables"),
                    ));
                }
                if let Some(other) = tables.insert(
                    (store_id.clone(), table.to_ascii_lowercase()),
                    job.name.clone(),
                ) {
                    return Err(err(
                        key,
                        if other == job.name {
                            format!("table {table} is named twice; each table of the log goes to a table of its own")
                        } else {
                            format!("job {other} writes table {table} of this store too; a table belongs to one job")
                        },
                    ));
                }
            }
            if let SnapshotConfig::Postgres { url, .. } = &job.snapshot {
                crate::pg_tls::check_url(url.expose()).map_err(|m| err(at("snapshot.url"), m))?;
            }
            match &job.store {
                StoreConfig::Sqlite { path, .. } if path.as_os_str().is_empty() => {
                    return Err(err(at("store.path"), "empty"));
                }
                StoreConfig::Postgres { url, .. }
                    if !(url.expose().starts_with("postgresql://")
                        || url.expose().starts_with("postgres://")) =>
                {
                    return Err(err(
                        at("store.url"),
                        "a PostgreSQL store needs a postgresql:// URL",
                    ));
                }
                _ => {}
            }
            if job.rate_limit.target_commit_p99_ms == Some(0) {
                return Err(err(
                    at("rate_limit.target_commit_p99_ms"),
                    "must be at least 1",
                ));
            }
            if job.rate_limit.window_secs == 0 || job.rate_limit.min_per_second == 0 {
                return Err(err(
                    at(if job.rate_limit.window_secs == 0 {
                        "rate_limit.window_secs"
                    } else {
                        "rate_limit.min_per_second"
                    }),
                    "must be at least 1",
                ));
            }
            if job.local_checkpoint.max_rows == 0 {
                return Err(err(at("local_checkpoint.max_rows"), "must be at least 1"));
            }
            if job.max_mib_ahead == 0 || job.max_mib_ahead > 1 << 20 {
                return Err(err(at("max_mib_ahead"), "must be from 1 to 1048576 (MiB)"));
            }
            let r = &job.recreation;
            if r.backoff_initial_ms > r.backoff_max_ms {
                return Err(err(
                    at("recreation.backoff_initial_ms"),
                    "exceeds recreation.backoff_max_ms",
                ));
            }
        }
        Ok(())
    }
}

/// Log levels a filter directive may name.
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// A `log.level` filter as `RUST_LOG` takes it, and no looser: each comma-separated directive is a
/// level, `target=level`, or a bare module path (`a::b`) or one of this binary's crates. tracing
/// would take any bare word as a target to log at every level, so `verbose` would silently mean
/// "trace the target `verbose`" and log nothing more.
fn check_log_filter(filter: &str) -> Result<(), String> {
    const CRATES: [&str; 8] = [
        "kafka_backfill",
        "kafka_backfill_core",
        "librdkafka",
        "rdkafka",
        "postgres",
        "tokio_postgres",
        "hyper",
        "axum",
    ];
    tracing_subscriber::EnvFilter::builder()
        .parse(filter)
        .map_err(|e| format!("{filter:?} is not a log filter: {e}"))?;
    for d in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let ok = match d.split_once('=') {
            Some((_, level)) => LEVELS.contains(&level.to_ascii_lowercase().as_str()),
            None => {
                LEVELS.contains(&d.to_ascii_lowercase().as_str())
                    || d.contains("::")
                    || d.contains('[')
                    || CRATES.contains(&d)
            }
        };
        if !ok {
            return Err(format!(
                "{d:?} in {filter:?} is neither a level ({}) nor target=level",
                LEVELS.join(", ")
            ));
        }
    }
    Ok(())
}

/// A listen address (`host:port`); empty = off.
fn listen_addr(key: &str, value: &str) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    if value.is_empty() {
        return Ok(None);
    }
    use std::net::ToSocketAddrs;
    value
        .parse::<std::net::SocketAddr>()
        .map(Some)
        .or_else(|_| {
            // A host name (`localhost:9464`) resolves locally, without a network.
            value
                .to_socket_addrs()
                .map(|mut a| a.next())
                .map_err(|e| e.to_string())
        })
        .map_err(|e| {
            err(
                key,
                format!("{value:?} is not a host:port listen address: {e}"),
            )
        })
}

/// A path with `.` and `..` folded (no file system access): `./state.sqlite` and `state.sqlite`
/// are one store.
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir if out.file_name().is_some() => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Whether a validation or type error at `error_path` is at the key an override set at `set`
/// (paths compared without the quoting validation puts around dotted Kafka keys).
fn same_key(error_path: &str, set: &str) -> bool {
    let e = error_path.replace('"', "");
    e == set || e.starts_with(&format!("{set}.")) || e.starts_with(&format!("{set}["))
}

/// `KEY=VALUE` pairs (from the command line) as librdkafka properties; `${ENV}` in a value is
/// substituted.
pub fn parse_properties(pairs: &[String]) -> Result<BTreeMap<String, String>, ConfigError> {
    pairs
        .iter()
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| err(kv, "expected KEY=VALUE"))?;
            let v = substitute_line(v).map_err(|m| err(k, m))?;
            Ok((k.trim().to_string(), v))
        })
        .collect()
}

impl std::fmt::Debug for JobConfig {
    /// Kafka secrets masked, URLs as `***` (for logs and panics).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobConfig")
            .field("name", &self.name)
            .field("topic", &self.topic)
            .field("workers", &self.workers)
            .field("vnode_count", &self.vnode_count)
            .field("kafka", &self.kafka_redacted())
            .field("snapshot", &self.snapshot)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

impl JobConfig {
    /// The consumer group: `group.id` if given, else `kafka-backfill-<name>`.
    pub fn group_id(&self) -> String {
        self.kafka
            .get("group.id")
            .cloned()
            .unwrap_or_else(|| format!("kafka-backfill-{}", self.name))
    }

    /// Kafka properties with secrets masked, for logs and `check-config`.
    pub fn kafka_redacted(&self) -> BTreeMap<String, String> {
        self.kafka
            .iter()
            .map(|(k, v)| {
                let secret = ["password", "secret", "token", "key"]
                    .iter()
                    .any(|s| k.contains(s));
                (
                    k.clone(),
                    if secret { "***".to_string() } else { v.clone() },
                )
            })
            .collect()
    }
}

/// Environment overrides: `KAFKA_BACKFILL__HTTP__LISTEN=0.0.0.0:9464`,
/// `KAFKA_BACKFILL__JOBS__0__WORKERS=4`, `KAFKA_BACKFILL__JOBS__0__KAFKA__bootstrap.servers=…`: the path
/// after the prefix, `__`-separated (table keys lower-cased, except under `kafka`), array items by index.
/// A Kafka property may also be written in a form a shell can export: upper case with `_` for `.`
/// (`KAFKA_BACKFILL__JOBS__0__KAFKA__SESSION_TIMEOUT_MS=45000` sets `session.timeout.ms`).
/// Values under `kafka` are strings, and so is a value replacing a string of the file
/// (`…__TOPIC=12345` is the topic `"12345"`); elsewhere a value is read as a TOML scalar when it
/// parses as one (`…__WORKERS=4`), else as a string.
pub const ENV_PREFIX: &str = "KAFKA_BACKFILL__";

/// Applies one override; returns the key path it set (`jobs[0].workers`), for errors to name it.
fn apply_override(doc: &mut toml::Table, key: &str, value: &str) -> Result<String, ConfigError> {
    let path: Vec<&str> = key[ENV_PREFIX.len()..].split("__").collect();
    let scalar: toml::Value = toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .filter(|v| !matches!(v, toml::Value::Table(_) | toml::Value::Array(_)))
        .unwrap_or_else(|| toml::Value::String(value.to_string()));
    let text = toml::Value::String(value.to_string());
    // A string in the file stays a string; a key under `kafka` is always one.
    let typed = |existing: Option<&toml::Value>, in_kafka: bool| {
        if in_kafka || matches!(existing, Some(toml::Value::String(_))) {
            text.clone()
        } else {
            scalar.clone()
        }
    };
    let mut node = doc;
    let mut in_kafka = false;
    let mut at = String::new();
    for (i, seg) in path.iter().enumerate() {
        let name = if in_kafka {
            if !seg.contains('.') && seg.chars().all(|c| !c.is_ascii_lowercase()) {
                seg.to_ascii_lowercase().replace('_', ".")
            } else {
                seg.to_string()
            }
        } else {
            seg.to_lowercase()
        };
        if !at.is_empty() {
            at.push('.');
        }
        at.push_str(&name);
        let last = i + 1 == path.len();
        if last {
            let v = typed(node.get(&name), in_kafka);
            node.insert(name, v);
            return Ok(at);
        }
        in_kafka = name == "kafka";
        let entry = node
            .entry(name.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        node = match entry {
            toml::Value::Table(t) => t,
            toml::Value::Array(items) => {
                let idx: usize = path[i + 1].parse().map_err(|_| {
                    err(
                        key,
                        format!("{name} is a list: the next segment must be an index"),
                    )
                })?;
                let item = items
                    .get_mut(idx)
                    .ok_or_else(|| err(key, format!("{name} has no item {idx}")))?;
                at.push_str(&format!("[{idx}]"));
                if i + 2 == path.len() {
                    *item = typed(Some(item), false);
                    return Ok(at);
                }
                // Skip the index segment.
                match item {
                    toml::Value::Table(t) => {
                        let rest = apply_override(
                            t,
                            &format!("{ENV_PREFIX}{}", path[i + 2..].join("__")),
                            value,
                        )?;
                        return Ok(format!("{at}.{rest}"));
                    }
                    _ => return Err(err(key, format!("{name}[{idx}] is not a table"))),
                }
            }
            _ => return Err(err(key, format!("{name} is not a table"))),
        };
    }
    Ok(at)
}

fn line_of(text: &str, offset: usize) -> String {
    let line = text[..offset.min(text.len())].matches('\n').count() + 1;
    format!(":{line}")
}

/// Replaces `${NAME}` by the environment variable NAME in every string value of the parsed file
/// (keys and comments are left alone); an unset variable is an error naming the key.
fn substitute_env_values(table: &mut toml::Table, at: &str) -> Result<(), ConfigError> {
    fn walk(v: &mut toml::Value, at: &str) -> Result<(), ConfigError> {
        match v {
            toml::Value::String(s) if s.contains("${") => {
                *s = substitute_line(s).map_err(|m| err(at, m))?;
            }
            toml::Value::Array(items) => {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(item, &format!("{at}[{i}]"))?;
                }
            }
            toml::Value::Table(t) => substitute_env_values(t, at)?,
            _ => {}
        }
        Ok(())
    }
    for (k, v) in table.iter_mut() {
        let key = if k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            k.clone()
        } else {
            format!("{k:?}")
        };
        let path = if at.is_empty() {
            key
        } else {
            format!("{at}.{key}")
        };
        walk(v, &path)?;
    }
    Ok(())
}

/// The environment variable `name`, else the contents of the file named by `name_FILE` (Docker and
/// Kubernetes secret files; one trailing newline dropped).
fn env_or_file(name: &str) -> Result<String, String> {
    if let Ok(v) = std::env::var(name) {
        return Ok(v);
    }
    let file_var = format!("{name}_FILE");
    match std::env::var(&file_var) {
        Ok(path) => std::fs::read_to_string(&path)
            .map(|s| s.strip_suffix('\n').map(str::to_string).unwrap_or(s))
            .map_err(|e| format!("{file_var} = {path}: {e} (used for ${{{name}}})")),
        Err(_) => Err(format!(
            "environment variable {name} is not set, nor {file_var} (used as ${{{name}}})"
        )),
    }
}

fn substitute_line(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let j = after
            .find('}')
            .ok_or_else(|| "unterminated ${ in the value".to_string())?;
        let name = &after[..j];
        let value = env_or_file(name)?;
        out.push_str(&value);
        rest = &after[j + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A schema-qualified table name, split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableName {
    pub schema: String,
    pub table: String,
}

impl TableName {
    pub fn parse(s: &str) -> anyhow::Result<TableName> {
        let (schema, table) = s.split_once('.').unwrap_or(("public", s));
        if schema.is_empty() || table.is_empty() || table.contains('.') {
            anyhow::bail!("{s:?} is not a table name (schema.table)");
        }
        Ok(TableName {
            schema: schema.into(),
            table: table.into(),
        })
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.schema, self.table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[[jobs]]
name = "accounts"
topic = "accounts-log"
kafka = { "bootstrap.servers" = "127.0.0.1:19092" }
snapshot = { kind = "files", dir = "snap" }
store = { kind = "sqlite", path = "state.sqlite", table = "accounts" }
"#;

    #[test]
    fn example_and_minimal_configs_load() {
        let c = Config::parse(GOOD, "t.toml").unwrap();
        assert_eq!(c.jobs[0].vnode_count, 256);
        assert_eq!(c.jobs[0].group_id(), "kafka-backfill-accounts");
        assert_eq!(c.jobs[0].recreation.policy, RecreationPolicy::Recreate);
        Config::parse(
            include_str!("../config/example.toml"),
            "config/example.toml",
        )
        .unwrap();
    }

    /// `store.tables` (a job of several tables): each error names its key path.
    #[test]
    fn several_tables_errors_name_the_key() {
        const SEVERAL: &str = r#"
[[jobs]]
name = "pgbench"
topic = "pgbench-log"
consistency = "epoch"
kafka = { "bootstrap.servers" = "127.0.0.1:19092" }
snapshot = { kind = "files", dir = "snap" }
store = { kind = "sqlite", path = "state.sqlite", tables = { pgbench_accounts = "accounts", pgbench_tellers = "tellers" } }
"#;
        let c = Config::parse(SEVERAL, "t.toml").unwrap();
        assert_eq!(
            c.jobs[0].store.table_names(),
            ["accounts".to_string(), "tellers".to_string()]
        );
        let msg = |text: &str| Config::parse(text, "t.toml").unwrap_err().to_string();
        let cases = [
            (
                SEVERAL.replace("consistency = \"epoch\"\n", ""),
                "jobs[0].consistency: a job of several tables (store.tables) needs consistency = \"epoch\"",
            ),
            (
                SEVERAL.replace("dir = \"snap\"", "dir = \"snap\", table = \"pgbench_accounts\""),
                "jobs[0].snapshot.table: names the one table of a job of one table",
            ),
            (
                SEVERAL.replace("tables = {", "table = \"a\", tables = {"),
                "jobs[0].store.table: set store.table (one table) or store.tables (several), not both",
            ),
            (
                SEVERAL.replace("= \"tellers\"", "= \"kb_tellers\""),
                "jobs[0].store.tables.pgbench_tellers: kb_tellers: names starting with kb_",
            ),
            (
                SEVERAL.replace("= \"tellers\"", "= \"tell-ers\""),
                "jobs[0].store.tables.pgbench_tellers: use letters, digits and _",
            ),
            (
                SEVERAL.replace("= \"tellers\"", "= \"Accounts\""),
                "jobs[0].store.tables.pgbench_tellers: table Accounts is named twice",
            ),
            (
                SEVERAL.replace("= \"tellers\"", "= \"\""),
                "jobs[0].store.tables.pgbench_tellers: missing",
            ),
            (
                SEVERAL.replace("tables = {", "store_datum = false, tables = {"),
                "jobs[0].store.store_datum: a job of several tables keeps each row's datum",
            ),
            (
                format!("{SEVERAL}{}", GOOD.replace("table = \"accounts\"", "table = \"tellers\"")),
                "jobs[1].store.table: job pgbench writes table tellers of this store too",
            ),
        ];
        for (text, expected) in cases {
            let e = msg(&text);
            assert!(e.starts_with(expected), "expected {expected:?}, got {e:?}");
        }
    }

    #[test]
    fn unknown_keys_wrong_types_and_bad_combinations_name_the_key() {
        let e = Config::parse(&GOOD.replace("topic =", "topik = \"x\"\ntopic ="), "t.toml")
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("jobs[0].topik: unknown field `topik`"),
            "{e}"
        );
        let e = Config::parse(
            &GOOD.replace(
                "name = \"accounts\"",
                "name = \"accounts\"\nworkers = \"two\"",
            ),
            "t.toml",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "jobs[0].workers: invalid type: string \"two\", expected u32"
        );
        let e = Config::parse(&GOOD.replace("[[jobs]]", "[[jobs]\n"), "t.toml").unwrap_err();
        assert!(
            e.to_string().starts_with("t.toml:2: "),
            "a syntax error names the line: {e}"
        );
        let e = Config::parse(
            &GOOD.replace(
                "name = \"accounts\"",
                "name = \"accounts\"\nvnode_count = 40000",
            ),
            "t.toml",
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "jobs[0].vnode_count: must be 1..=32768");
        let e = Config::parse(
            &GOOD.replace(
                "name = \"accounts\"",
                "name = \"accounts\"\nmax_mib_ahead = 0",
            ),
            "t.toml",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "jobs[0].max_mib_ahead: must be from 1 to 1048576 (MiB)"
        );
        let rate =
            |extra: &str| Config::parse(&format!("{GOOD}rate_limit = {{ {extra} }}\n"), "t.toml");
        assert_eq!(
            rate("target_commit_p99_ms = 0").unwrap_err().to_string(),
            "jobs[0].rate_limit.target_commit_p99_ms: must be at least 1"
        );
        assert_eq!(
            rate("window_secs = 0").unwrap_err().to_string(),
            "jobs[0].rate_limit.window_secs: must be at least 1"
        );
        assert!(rate("target_p99 = 3")
            .unwrap_err()
            .to_string()
            .starts_with("jobs[0].rate_limit.target_p99: unknown field"));
        let c = rate("target_commit_p99_ms = 200, max_epoch_lag_secs = 60").unwrap();
        let a = c.jobs[0].rate_limit.core();
        assert_eq!(
            (
                a.target_commit_p99_ms,
                a.max_epoch_lag_secs,
                a.floor,
                a.window_ms
            ),
            (Some(200.0), Some(60.0), 100, 5_000)
        );
        let e = Config::parse(
            &GOOD.replace(
                "\"bootstrap.servers\"",
                "\"enable.auto.commit\" = \"true\", \"bootstrap.servers\"",
            ),
            "t.toml",
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "jobs[0].kafka.\"enable.auto.commit\": is managed by kafka-backfill (always false: offsets are committed to the group after each store commit, never on a timer); remove it"
        );
    }

    /// The last release accepted `auto.offset.reset = "earliest"` (then the managed value): such a
    /// config is refused now with the way to migrate, since a reset would skip deleted records.
    #[test]
    fn the_earlier_managed_offset_reset_is_refused_with_the_way_to_migrate() {
        let e = Config::parse(
            &GOOD.replace(
                "\"bootstrap.servers\"",
                "\"auto.offset.reset\" = \"earliest\", \"bootstrap.servers\"",
            ),
            "t.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with(
                "jobs[0].kafka.\"auto.offset.reset\": is managed by kafka-backfill (always error: "
            ),
            "{e}"
        );
        assert!(
            e.ends_with("(earlier releases set earliest)); remove it"),
            "{e}"
        );
    }

    #[test]
    fn dead_letter_settings_name_the_key() {
        let job = |extra: &str| {
            Config::parse(
                &GOOD.replace(
                    "name = \"accounts\"",
                    &format!("name = \"accounts\"\n{extra}"),
                ),
                "t.toml",
            )
        };
        assert_eq!(
            job("").unwrap().jobs[0].dead_letters(),
            None,
            "stop by default"
        );
        assert_eq!(
            job("on_bad_record = \"dead-letter\"").unwrap().jobs[0].dead_letters(),
            Some(("accounts-log.dead-letters".to_string(), 100))
        );
        assert_eq!(
            job("on_bad_record = \"dead-letter\"\ndead_letter_topic = \"dlq\"\nmax_dead_letters = 5")
                .unwrap()
                .jobs[0]
                .dead_letters(),
            Some(("dlq".to_string(), 5))
        );
        assert_eq!(
            job("on_bad_record = \"dead-letter\"\ndead_letter_topic = \"accounts-log\"")
                .unwrap_err()
                .to_string(),
            "jobs[0].dead_letter_topic: must be a topic of its own, not the job's log topic"
        );
        assert_eq!(
            job("on_bad_record = \"dead-letter\"\nmax_dead_letters = 0")
                .unwrap_err()
                .to_string(),
            "jobs[0].max_dead_letters: must be at least 1 with on_bad_record = \"dead-letter\""
        );
        assert!(job("dead_letter_topic = \"dlq\"")
            .unwrap_err()
            .to_string()
            .starts_with("jobs[0].dead_letter_topic: is used only with on_bad_record"));
        assert!(job("on_bad_record = \"skip\"")
            .unwrap_err()
            .to_string()
            .starts_with("jobs[0].on_bad_record: unknown variant `skip`"));
    }

    #[test]
    fn capture_settings_name_the_key() {
        let capture = |extra: &str| {
            Config::parse(
                &format!("{GOOD}[jobs.capture]\nsource_url = \"postgresql://u@h/db\"\ntable = \"public.t\"\n{extra}\n"),
                "t.toml",
            )
        };
        let c = capture("").unwrap();
        let section = c.jobs[0].capture.as_ref().unwrap();
        assert_eq!(section.copy_connections, 2);
        assert_eq!(section.publication_name("accounts"), "kb_accounts");
        assert_eq!(
            capture("copy_connections = 0").unwrap_err().to_string(),
            "jobs[0].capture.copy_connections: must be 1..=16"
        );
        assert!(capture("copy_connections = 16").is_ok());
        assert_eq!(
            capture("snapshot_interval_ms = 999").unwrap_err().to_string(),
            "jobs[0].capture.snapshot_interval_ms: must be at least 1000 (a snapshot copies every captured table)"
        );
        assert!(capture("snapshot_interval_ms = 60000").is_ok());
        assert_eq!(section.snapshot_storage, SnapshotStorage::Files);
        assert_eq!(
            capture("snapshot_storage = \"kafka\"").unwrap().jobs[0]
                .capture
                .as_ref()
                .unwrap()
                .snapshot_storage,
            SnapshotStorage::Kafka
        );
        let e = capture("snapshot_storage = \"s3\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("jobs[0].capture.snapshot_storage") && e.contains("kafka"),
            "{e}"
        );
        assert_eq!(
            capture("snapshot_keep = 0").unwrap_err().to_string(),
            "jobs[0].capture.snapshot_keep: must be at least 1 (a job that starts reads the newest snapshot)"
        );
        let long = "p".repeat(64);
        assert_eq!(
            capture(&format!("publication = \"{long}\"")).unwrap_err().to_string(),
            format!("jobs[0].capture.publication: \"{long}\": a publication name is 1 to 63 bytes (PostgreSQL would cut a longer one)")
        );
        assert!(capture(&format!("publication = \"{}\"", &long[..63])).is_ok());
        assert!(capture("slot = \"Bad-Slot\"")
            .unwrap_err()
            .to_string()
            .starts_with("jobs[0].capture.slot: "));
        assert!(capture("partitions = 0")
            .unwrap_err()
            .to_string()
            .starts_with("jobs[0].capture.partitions: must be 1..="));
    }

    /// A capture of several tables: `table` or `tables`, names distinct without their schema, and
    /// the capturing job names the one it materialises; each refusal names its key.
    #[test]
    fn a_capture_of_several_tables_is_checked_naming_the_key() {
        let capture = |snapshot: &str, tables: &str| {
            let good = GOOD.replace(
                "snapshot = { kind = \"files\", dir = \"snap\" }",
                &format!("snapshot = {{ kind = \"files\", dir = \"snap\"{snapshot} }}"),
            );
            Config::parse(
                &format!("{good}[jobs.capture]\nsource_url = \"postgresql://u@h/db\"\n{tables}\n"),
                "t.toml",
            )
        };
        let c = capture(", table = \"b\"", "tables = [\"a\", \"s.b\"]").unwrap();
        let names = c.jobs[0].capture.as_ref().unwrap().table_names().unwrap();
        assert_eq!(
            names.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["public.a", "s.b"]
        );
        let refused =
            |snapshot: &str, tables: &str| capture(snapshot, tables).unwrap_err().to_string();
        assert_eq!(
            refused("", "tables = [\"a\", \"b\"]"),
            "jobs[0].snapshot.table: capture writes a log of several tables (a, b): name the one this job materialises"
        );
        assert_eq!(
            refused(", table = \"c\"", "tables = [\"a\", \"b\"]"),
            "jobs[0].snapshot.table: \"c\" is none of the captured tables (a, b)"
        );
        assert_eq!(
            refused(", table = \"a\"", "tables = [\"a\"]"),
            "jobs[0].snapshot.table: capture writes a log of one table: leave snapshot.table out"
        );
        assert_eq!(
            refused(", table = \"a\"", "tables = [\"public.a\", \"s.a\"]"),
            "jobs[0].capture.tables: public.a and s.a: the log names its tables without the schema, so their names must differ"
        );
        assert_eq!(
            refused("", "table = \"a\"\ntables = [\"b\"]"),
            "jobs[0].capture.tables: set table or tables, not both"
        );
        assert_eq!(
            refused("", ""),
            "jobs[0].capture.table: missing: the table to capture (or tables = [...])"
        );
        assert!(refused(", table = \"a\"", "tables = [\"a\", \"x.y.z\"]")
            .starts_with("jobs[0].capture.tables: \"x.y.z\" is not a table name"));
    }

    #[test]
    fn environment_overrides_set_nested_keys_and_are_validated() {
        let o = |k: &str, v: &str| (format!("KAFKA_BACKFILL__{k}"), v.to_string());
        let c = Config::parse_with(
            GOOD,
            "t.toml",
            &[
                o("HTTP__LISTEN", "0.0.0.0:1234"),
                o("JOBS__0__WORKERS", "3"),
                o("JOBS__0__KAFKA__group.id", "g1"),
            ],
        )
        .unwrap();
        assert_eq!(c.http.listen, "0.0.0.0:1234");
        assert_eq!(c.jobs[0].workers, 3);
        assert_eq!(c.jobs[0].kafka["group.id"], "g1");
        let e = Config::parse_with(GOOD, "t.toml", &[o("JOBS__0__WORKERS", "0")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "jobs[0].workers (set by KAFKA_BACKFILL__JOBS__0__WORKERS): must be 1..=64"
        );
        let e = Config::parse_with(GOOD, "t.toml", &[o("JOBS__0__WORKERZ", "2")]).unwrap_err();
        assert!(e.to_string().contains("unknown field `workerz`"), "{e}");
    }

    /// Every mistake `run` would refuse (or that would misbehave) is refused by validation, which is
    /// all `check-config` runs, naming the key.
    #[test]
    fn validation_refuses_what_run_would_refuse() {
        let refused = |text: &str| {
            Config::parse_with(text, "t.toml", &[])
                .unwrap_err()
                .to_string()
        };
        let kafka = |extra: &str| {
            GOOD.replace(
                "kafka = { \"bootstrap.servers\" = \"127.0.0.1:19092\" }",
                &format!("kafka = {{ \"bootstrap.servers\" = \"127.0.0.1:19092\", {extra} }}"),
            )
        };
        let e = refused(&kafka("\"session.timout.ms\" = \"1\""));
        assert!(
            e.starts_with("jobs[0].kafka.\"session.timout.ms\": No such configuration property"),
            "{e}"
        );
        let e = refused(&kafka("\"session.timeout.ms\" = \"soon\""));
        assert!(
            e.starts_with("jobs[0].kafka.\"session.timeout.ms\": "),
            "{e}"
        );
        let e = refused(&kafka("\"group.id\" = \"\""));
        assert!(e.starts_with("jobs[0].kafka.\"group.id\": empty"), "{e}");
        let e = refused(&GOOD.replace("127.0.0.1:19092", " "));
        assert_eq!(e, "jobs[0].kafka.\"bootstrap.servers\": empty");
        let store = |s: &str| {
            GOOD.replace(
                "store = { kind = \"sqlite\", path = \"state.sqlite\", table = \"accounts\" }",
                s,
            )
        };
        let e = refused(&store(
            "store = { kind = \"postgres\", url = \"postgresql://u@h/db?sslmode=verify_full\", table = \"t\" }",
        ));
        assert!(
            e.starts_with("jobs[0].store.url: sslmode verify_full is not one of"),
            "{e}"
        );
        let e = refused(&GOOD.replace(
            "snapshot = { kind = \"files\", dir = \"snap\" }",
            "snapshot = { kind = \"postgres\", url = \"mysql://u@h/db\", name = \"s\" }",
        ));
        assert!(e.starts_with("jobs[0].snapshot.url: scheme mysql"), "{e}");
        let e = refused(&format!("[http]\nlisten = \"nine-four-six-four\"\n{GOOD}"));
        assert!(
            e.starts_with("http.listen: \"nine-four-six-four\" is not a host:port"),
            "{e}"
        );
        let e = refused(&format!(
            "[http]\nlisten = \"127.0.0.1:9464\"\nadmin = true\nadmin_listen = \"127.0.0.1:9464\"\n{GOOD}"
        ));
        assert!(
            e.starts_with("http.admin_listen: is http.listen's address"),
            "{e}"
        );
        let e = refused(&format!("[log]\nlevel = \"verbose=[\"\n{GOOD}"));
        assert!(
            e.starts_with("log.level: \"verbose=[\" is not a log filter"),
            "{e}"
        );
        let c = Config::parse(
            &GOOD.replace(
                "name = \"accounts\"",
                "name = \"accounts\"\nconsistency = \"epoch\"",
            ),
            "t.toml",
        )
        .unwrap();
        assert_eq!(c.jobs[0].consistency, Consistency::Epoch);
        let e = refused(&store(
            "store = { kind = \"sqlite\", path = \"state.sqlite\", table = \"kb_jobs\" }",
        ));
        assert!(
            e.starts_with("jobs[0].store.table: kb_jobs: names starting with kb_"),
            "{e}"
        );
        let two = format!(
            "{GOOD}{}",
            GOOD.replace("\"accounts\"\ntopic", "\"other\"\ntopic")
                .replace("path = \"state.sqlite\"", "path = \"./state.sqlite\"")
        );
        let e = refused(&two);
        assert_eq!(
            e,
            "jobs[1].store.table: job accounts writes table accounts of this store too; a table belongs to one job"
        );
        // The value kafka-backfill enforces is accepted, with a note.
        let c = Config::parse_with(
            &kafka("\"isolation.level\" = \"read_committed\""),
            "t.toml",
            &[],
        )
        .unwrap();
        assert_eq!(c.notes().len(), 1, "{:?}", c.notes());
        let e = refused(&kafka("\"isolation.level\" = \"read_uncommitted\""));
        assert!(e.contains("is managed by kafka-backfill"), "{e}");
    }

    /// KIP-848: the consumer protocol is accepted without the classic protocol's keys, which
    /// librdkafka would refuse at client creation; validation names them first.
    #[test]
    fn the_consumer_group_protocol_refuses_the_classic_keys() {
        let with = |extra: &str| {
            GOOD.replace(
                "\"bootstrap.servers\" = \"127.0.0.1:19092\"",
                &format!("\"bootstrap.servers\" = \"127.0.0.1:19092\", \"group.protocol\" = \"consumer\"{extra}"),
            )
        };
        Config::parse_with(&with(""), "t.toml", &[]).unwrap();
        Config::parse_with(
            &with(", \"group.remote.assignor\" = \"uniform\""),
            "t.toml",
            &[],
        )
        .unwrap();
        for key in [
            "session.timeout.ms",
            "heartbeat.interval.ms",
            "partition.assignment.strategy",
        ] {
            let e = Config::parse_with(&with(&format!(", \"{key}\" = \"6000\"")), "t.toml", &[])
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!("jobs[0].kafka.\"{key}\": is not allowed with \"group.protocol\" = \"consumer\"")),
                "{e}"
            );
        }
        let e = Config::parse_with(
            &with(", \"max.poll.interval.ms\" = \"10000\""),
            "t.toml",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("jobs[0].kafka.\"max.poll.interval.ms\": 10000 is below 60000"),
            "{e}"
        );
        Config::parse_with(
            &with(", \"max.poll.interval.ms\" = \"300000\""),
            "t.toml",
            &[],
        )
        .unwrap();
        let consumer: BTreeMap<String, String> =
            [("group.protocol".to_string(), "consumer".to_string())].into();
        assert!(crate::kafka::managed_keys(&consumer)
            .all(|(k, _, _)| *k != "partition.assignment.strategy"));
        assert_eq!(crate::kafka::managed_keys(&BTreeMap::new()).count(), 6);
    }

    #[test]
    fn kafka_values_are_text_in_the_file_and_in_overrides() {
        let o = |k: &str, v: &str| (format!("KAFKA_BACKFILL__{k}"), v.to_string());
        let text = GOOD.replace(
            "\"bootstrap.servers\" = \"127.0.0.1:19092\"",
            "\"bootstrap.servers\" = \"127.0.0.1:19092\", \"session.timeout.ms\" = 45000, \"enable.idempotence\" = true",
        );
        let c = Config::parse_with(&text, "t.toml", &[]).unwrap();
        assert_eq!(c.jobs[0].kafka["session.timeout.ms"], "45000");
        assert_eq!(c.jobs[0].kafka["enable.idempotence"], "true");
        let c = Config::parse_with(
            GOOD,
            "t.toml",
            &[
                o("JOBS__0__KAFKA__session.timeout.ms", "45000"),
                o("JOBS__0__KAFKA__enable.idempotence", "true"),
                o("JOBS__0__KAFKA__FETCH_WAIT_MAX_MS", "50"),
                o("JOBS__0__TOPIC", "12345"),
            ],
        )
        .unwrap();
        let k = &c.jobs[0].kafka;
        assert_eq!(
            (
                k["session.timeout.ms"].as_str(),
                k["enable.idempotence"].as_str(),
                k["fetch.wait.max.ms"].as_str()
            ),
            ("45000", "true", "50")
        );
        assert_eq!(c.jobs[0].topic, "12345");
        // An error at a key an override set names the variable.
        let e = Config::parse_with(GOOD, "t.toml", &[o("JOBS__0__WORKERS", "many")])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "jobs[0].workers (set by KAFKA_BACKFILL__JOBS__0__WORKERS): invalid type"
            ),
            "{e}"
        );
        let e = Config::parse_with(
            GOOD,
            "t.toml",
            &[o("JOBS__0__KAFKA__SESSION_TIMEOUT_MS", "soon")],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with(
                "jobs[0].kafka.\"session.timeout.ms\" (set by KAFKA_BACKFILL__JOBS__0__KAFKA__SESSION_TIMEOUT_MS): "
            ),
            "{e}"
        );
    }

    #[test]
    fn env_substitution_and_redaction() {
        std::env::set_var("KB_TEST_SECRET", "hunter2");
        let text = GOOD.replace(
            "\"bootstrap.servers\" = \"127.0.0.1:19092\"",
            "\"bootstrap.servers\" = \"127.0.0.1:19092\", \"sasl.password\" = \"${KB_TEST_SECRET}\"",
        );
        let c = Config::parse(&text, "t.toml").unwrap();
        assert_eq!(c.jobs[0].kafka["sasl.password"], "hunter2");
        assert_eq!(c.jobs[0].kafka_redacted()["sasl.password"], "***");
        let e = Config::parse(
            &text.replace("KB_TEST_SECRET", "KB_TEST_UNSET_VAR"),
            "t.toml",
        )
        .unwrap_err();
        assert!(e.to_string().contains("KB_TEST_UNSET_VAR is not set"));
        assert!(
            e.to_string()
                .starts_with("jobs[0].kafka.\"sasl.password\": "),
            "{e}"
        );
    }

    /// A secret holding quotes, backslashes, a newline, `#` and unicode is taken as it is, and
    /// cannot add keys to the file.
    #[test]
    fn env_values_with_any_characters_round_trip_and_cannot_inject_keys() {
        let secret = "p\"a\\s#s\nworkers = 9\n[http]\nlisten = \"0.0.0.0:1\" ünï ${NOT}";
        std::env::set_var("KB_TEST_NASTY_SECRET", secret);
        let text = GOOD.replace(
            "\"bootstrap.servers\" = \"127.0.0.1:19092\"",
            "\"bootstrap.servers\" = \"127.0.0.1:19092\", \"sasl.password\" = \"${KB_TEST_NASTY_SECRET}\"",
        );
        let c = Config::parse(&text, "t.toml").unwrap();
        assert_eq!(c.jobs[0].kafka["sasl.password"], secret);
        assert_eq!(c.jobs[0].workers, 1);
        assert_eq!(c.http.listen, "127.0.0.1:9464");
    }

    /// Secrets never print: the store URL and Kafka passwords are masked in `Debug` (what a panic
    /// or a `{:?}` would show) and in `check-config`'s output.
    #[test]
    fn secrets_never_print() {
        std::env::set_var("KB_TEST_PG_PW", "pg-hunter2");
        let text = GOOD
            .replace(
                "store = { kind = \"sqlite\", path = \"state.sqlite\", table = \"accounts\" }",
                "store = { kind = \"postgres\", url = \"postgresql://kb:${KB_TEST_PG_PW}@db/x\", table = \"accounts\" }",
            )
            .replace(
                "\"bootstrap.servers\" = \"127.0.0.1:19092\"",
                "\"bootstrap.servers\" = \"127.0.0.1:19092\", \"sasl.password\" = \"kafka-hunter2\"",
            );
        let c = Config::parse(&text, "t.toml").unwrap();
        let debug = format!("{c:?} {:?}", c.jobs[0]);
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(c.jobs[0].store.describe().contains("kb:***@db"));
        let StoreConfig::Postgres { url, .. } = &c.jobs[0].store else {
            panic!("postgres")
        };
        assert_eq!(url.expose(), "postgresql://kb:pg-hunter2@db/x");
        assert_eq!(url.to_string(), "***");
    }

    /// `${NAME}` falls back to the file named by `NAME_FILE` (Docker and Kubernetes secrets).
    #[test]
    fn env_values_can_come_from_secret_files() {
        let dir = std::env::temp_dir().join(format!("kb-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pw");
        std::fs::write(&file, "from-a-file\n").unwrap();
        std::env::remove_var("KB_TEST_FILE_SECRET");
        std::env::set_var("KB_TEST_FILE_SECRET_FILE", &file);
        let text = GOOD.replace(
            "\"bootstrap.servers\" = \"127.0.0.1:19092\"",
            "\"bootstrap.servers\" = \"127.0.0.1:19092\", \"sasl.password\" = \"${KB_TEST_FILE_SECRET}\"",
        );
        let c = Config::parse(&text, "t.toml").unwrap();
        assert_eq!(c.jobs[0].kafka["sasl.password"], "from-a-file");
        std::env::set_var("KB_TEST_FILE_SECRET_FILE", dir.join("missing"));
        let e = Config::parse(&text, "t.toml").unwrap_err().to_string();
        assert!(
            e.starts_with("jobs[0].kafka.\"sasl.password\": KB_TEST_FILE_SECRET_FILE = "),
            "{e}"
        );
    }
}
