//! `produce`: a generated table written as snapshot files and a change log (docs/WIRE.md).

use super::*;
use kafka_backfill::workload::{self, Workload};

/// `produce`'s flags.
#[derive(clap::Args)]
pub struct ProduceArgs {
    /// Write the log a job of this configuration reads: its topic, vnode_count, brokers and
    /// security settings ([jobs.kafka], consumer-only keys left out) replace --topic,
    /// --vnodes, --bootstrap and -X.
    #[arg(long, short, conflicts_with_all = ["bootstrap", "topic", "vnodes", "properties"])]
    pub config: Option<PathBuf>,
    /// With --config: the job (default: the only job).
    #[arg(long, requires = "config")]
    pub job: Option<String>,
    /// Kafka bootstrap servers.
    #[arg(long, default_value = "127.0.0.1:19092")]
    pub bootstrap: String,
    /// The log topic (created with --partitions when absent).
    #[arg(long, default_value = "accounts-log")]
    pub topic: String,
    /// Partitions of the topic.
    #[arg(long, default_value_t = 4)]
    pub partitions: u32,
    /// Vnodes of the table (the job's vnode_count).
    #[arg(long, default_value_t = 256)]
    pub vnodes: u32,
    /// Rows in the snapshot.
    #[arg(long, default_value_t = 10_000)]
    pub rows: u64,
    /// Ids come from 0..key-space (default: 2 × rows).
    #[arg(long)]
    pub key_space: Option<u64>,
    /// Changes after the snapshot.
    #[arg(long, default_value_t = 50_000)]
    pub changes: u64,
    /// Changes per epoch (between two barriers).
    #[arg(long, default_value_t = 500)]
    pub epoch_changes: u64,
    /// Every n-th barrier is a checkpoint (the last one always is).
    #[arg(long, default_value_t = 4)]
    pub checkpoint_every: u64,
    /// Percent of changes to existing rows that are updates (the rest delete).
    #[arg(long, default_value_t = 70)]
    pub update_percent: u64,
    /// Approximate size of a row in bytes.
    #[arg(long, default_value_t = 100)]
    pub row_size: usize,
    /// Changes per second (0 = as fast as possible).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Folder for snapshot/ and expected/.
    #[arg(long, default_value = ".run/demo")]
    pub out: PathBuf,
    /// Seed of the generator (the same seed writes the same table and log).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Continue the log written earlier into --out (same topic): more changes, no new snapshot.
    #[arg(long)]
    pub append: bool,
    /// The table to generate: `accounts` (schemas/example_row.avsc) or `typed`
    /// (schemas/typed_row.avsc: every Avro type, primary key [region, id]).
    #[arg(long, value_enum, default_value_t)]
    pub table: kafka_backfill::workload::TableKind,
    /// Tables in the one log (docs/WIRE.md, "Several tables"): with more than one, tables
    /// `<table>_1` … `<table>_N` of the --table shape share the topic, the barriers and the
    /// epochs, each change of one drawn at random; the snapshot and expected folders hold a
    /// several-table manifest (a job names its table with `snapshot.table`).
    #[arg(long, default_value_t = 1)]
    pub tables: u32,
    /// A librdkafka property for every client, e.g. -X security.protocol=SASL_SSL (repeatable;
    /// a value may be ${ENV}).
    #[arg(short = 'X', long = "property", value_name = "KEY=VALUE")]
    pub properties: Vec<String>,
    /// Write with a transactional producer: a transaction per checkpoint, and some aborted
    /// transactions of deletes that must never be applied.
    #[arg(long)]
    pub transactional: bool,
    /// How the snapshot's rows are laid out in files: one file per vnode in key order, or one
    /// file of every vnode in random order (as a data-lake export usually is).
    #[arg(long, value_enum, default_value_t)]
    pub snapshot_layout: kafka_backfill::workload::SnapshotLayout,
    /// Change the row schema three times during the log, each at a checkpoint barrier (add
    /// two columns, widen one to a long, drop one: docs/WIRE.md "Schema changes"); the
    /// versions go to `<out>/snapshot/schema_versions/`.
    #[arg(long)]
    pub evolve: bool,
    /// With --evolve: hold the first schema change until this file exists (tests start a job
    /// on the snapshot first).
    #[arg(long, value_name = "FILE", requires = "evolve")]
    pub evolve_gate: Option<PathBuf>,
}

/// `produce`: a generated snapshot and log, and the table expected of them.
pub fn produce(args: ProduceArgs) -> Result<ExitCode> {
    let ProduceArgs {
        config,
        job,
        bootstrap,
        topic,
        partitions,
        vnodes,
        rows,
        key_space,
        changes,
        epoch_changes,
        checkpoint_every,
        update_percent,
        row_size,
        rate,
        out,
        seed,
        append,
        table,
        tables,
        properties,
        transactional,
        snapshot_layout,
        evolve,
        evolve_gate,
    } = args;
    init_logs(LogFormat::Text, None);
    let (bootstrap, topic, vnodes, kafka_properties) = match &config {
        Some(path) => {
            let config = match load(path) {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            let j = pick_job(&config, job.as_deref())?;
            let props = kafka_backfill::kafka::producer_properties(&j.kafka);
            (
                j.kafka["bootstrap.servers"].clone(),
                j.topic.clone(),
                j.vnode_count,
                props,
            )
        }
        None => (
            bootstrap,
            topic,
            vnodes,
            kafka_backfill::config::parse_properties(&properties)?,
        ),
    };
    let w = Workload {
        bootstrap,
        topic,
        partitions,
        vnode_count: vnodes,
        rows,
        key_space: key_space.unwrap_or(rows.max(1) * 2),
        changes,
        changes_per_epoch: epoch_changes.max(1),
        checkpoint_every: checkpoint_every.max(1),
        update_percent,
        row_size,
        rate,
        out: out.clone(),
        seed,
        progress: true,
        append,
        table,
        tables: tables.max(1),
        kafka_properties,
        transactional,
        snapshot_layout,
        evolve,
        evolve_gate,
    };
    let r = workload::produce(&w)?;
    if append {
        println!(
            "appended {} changes and {} barriers to {}; expected table: {} rows at epoch {} in {}",
            r.changes,
            r.barriers,
            w.topic,
            r.final_rows,
            r.final_epoch,
            out.join("expected").display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "wrote {} snapshot rows at epoch {} to {}, then {} changes and {} barriers to {}; expected table: {} rows at epoch {} in {}",
        r.snapshot_rows,
        r.snapshot_epoch,
        out.join("snapshot").display(),
        r.changes,
        r.barriers,
        w.topic,
        r.final_rows,
        r.final_epoch,
        out.join("expected").display()
    );
    Ok(ExitCode::SUCCESS)
}
