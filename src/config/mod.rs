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
use std::path::PathBuf;

use serde::Deserialize;

use crate::core::{vnode::MAX_VNODE_COUNT, RecreationPolicy};

mod load;
mod validate;

pub use load::{parse_properties, ENV_PREFIX};

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
    /// The source database: `postgresql://user:password@host:port/database` (the user needs the
    /// REPLICATION attribute), or `mariadb://user:password@host:port/database` (also `mysql://`;
    /// the user needs REPLICATION SLAVE and REPLICATION CLIENT, docs/CAPTURE.md "MariaDB").
    /// Never printed.
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
    /// A checkpoint (and one Kafka transaction) at most this often (ms): how stale the replica
    /// may be (about half of it at the median). Default 200, or `barrier_interval_ms` when that is
    /// set longer ([`CaptureSection::checkpoint_interval_ms`]). An idle source checkpoints at most
    /// once a second whatever this is.
    #[serde(default, rename = "checkpoint_interval_ms")]
    pub checkpoint_interval: Option<u64>,
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
    /// MariaDB only: the server_id the capture's binlog client registers with, which no server of
    /// the replication topology may have; default derived from the job's name (2^31 and up).
    #[serde(default)]
    pub server_id: Option<u32>,
}

impl CaptureSection {
    /// The checkpoint interval in force: the one set, or the default (200 ms) but never below
    /// `barrier_interval_ms` — a configuration of the last release (whose default was 1000) that
    /// set only a longer barrier interval keeps validating.
    pub fn checkpoint_interval_ms(&self) -> u64 {
        self.checkpoint_interval.unwrap_or_else(|| {
            crate::core::capture::CaptureConfig::default()
                .checkpoint_interval_ms
                .max(self.barrier_interval_ms)
        })
    }
}

/// True when `url` names a MariaDB or MySQL server (`mariadb://` or `mysql://`).
pub fn is_mariadb_url(url: &str) -> bool {
    url.starts_with("mariadb://") || url.starts_with("mysql://")
}

/// The connection options of a MariaDB `url`, `mariadb://` read as `mysql://`; it must name a
/// database.
pub fn mariadb_opts(url: &str) -> Result<mysql::Opts, String> {
    let url = match url.strip_prefix("mariadb://") {
        Some(rest) => format!("mysql://{rest}"),
        None => url.to_string(),
    };
    let opts = mysql::Opts::from_url(&url).map_err(|e| format!("not a MariaDB URL: {e}"))?;
    if opts.get_db_name().is_none() {
        return Err("the URL names no database (mariadb://user@host:port/database)".into());
    }
    Ok(opts)
}

impl CaptureSection {
    /// The binlog client's server_id: `server_id`, or one derived from the job's name.
    pub fn binlog_server_id(&self, job: &str) -> u32 {
        self.server_id
            .unwrap_or_else(|| 0x8000_0000 | (crc32fast::hash(job.as_bytes()) & 0x7fff_ffff))
    }
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

fn err(path: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        path: path.into(),
        message: message.into(),
    }
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
mod tests;
