//! One job's capture, wired: preconditions, the fence and the state read, the snapshot on a fresh
//! start, the resume checks otherwise, and the sessions of [`super::run_session`] with a bounded
//! retry of transient failures. Owns the process side of the capture; decisions stay in the core.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

use super::log::{read_state, KafkaLog, StateRecord};
use super::pg::{self, PgReplication, TableName};
use super::{run_session, CaptureFailure, CaptureObserver, LogPort, SessionStats};
use crate::codec::{LogCodec, TableSchema};
use crate::core::capture::{Assembler, CaptureConfig, CaptureState};
use crate::core::{vnode_of, Epoch, PartitionMap};
use crate::service::config::{JobConfig, SnapshotConfig};
use crate::snapshot::files::{write_manifest, Manifest, ManifestStart, SortedWriter};

/// The state record's format version.
const STATE_VERSION: u32 = 1;
/// Consecutive failed sessions (none committing anything) before the capture gives up.
const MAX_FAILED_SESSIONS: u32 = 10;
const PENDING_MANIFEST: &str = "manifest.pending.json";

pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

struct Progress {
    job: String,
    last_log_ms: u64,
    /// The session totals last counted (a new session starts again from zero).
    counted: SessionStats,
}

impl CaptureObserver for Progress {
    fn committed(&mut self, state: &CaptureState, stats: &SessionStats) {
        if stats.checkpoints < self.counted.checkpoints {
            self.counted = SessionStats::default();
        }
        crate::service::metrics::capture_committed(
            &self.job,
            state,
            stats.transactions - self.counted.transactions,
            stats.changes - self.counted.changes,
        );
        self.counted = *stats;
        let now = unix_ms();
        tracing::debug!(job = %self.job, lsn = %pg::format_lsn(state.lsn), epoch = state.epoch.0, checkpoint = state.checkpoints, "capture checkpoint committed");
        if now.saturating_sub(self.last_log_ms) >= 10_000 || state.checkpoints <= 1 {
            self.last_log_ms = now;
            tracing::info!(
                job = %self.job,
                lsn = %pg::format_lsn(state.lsn),
                epoch = state.epoch.0,
                checkpoints = state.checkpoints,
                transactions = stats.transactions,
                changes = stats.changes,
                "capture progress"
            );
        }
    }
}

/// Whether a librdkafka property is the consumer's alone (the job's `kafka` table serves the
/// consumers; the capture's producer takes the rest: brokers, security, client id).
fn is_consumer_only(key: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "group.",
        "partition.assignment",
        "session.timeout",
        "heartbeat.",
        "max.poll",
        "auto.",
        "enable.auto",
        "isolation.level",
        "fetch.",
        "queued.",
        "check.crcs",
        "enable.partition.eof",
        "consume",
    ];
    PREFIXES.iter().any(|p| key.starts_with(p))
}

/// Writes `bytes` to `path` and syncs it (the pending manifest must outlive a crash after the
/// initial transaction's commit).
fn write_durably(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

/// Writes `manifest.json` from the pending manifest and the state record's start offsets.
fn finish_manifest(dir: &Path, record: &StateRecord) -> Result<()> {
    let pending = dir.join(PENDING_MANIFEST);
    let mut manifest: Manifest = serde_json::from_slice(
        &std::fs::read(&pending).with_context(|| format!("reading {}", pending.display()))?,
    )
    .with_context(|| format!("{}: not a manifest", pending.display()))?;
    manifest.start = record
        .start_offsets
        .iter()
        .enumerate()
        .map(|(p, &next_offset)| ManifestStart {
            partition: p as u32,
            next_offset,
            // The initial barrier's `curr`, which the first state recorded; later states moved
            // on, so it is the successor of the snapshot epoch the initial barrier named.
            epoch: record.initial_epoch,
        })
        .collect();
    write_manifest(dir, &manifest)?;
    std::fs::remove_file(&pending).with_context(|| format!("removing {}", pending.display()))?;
    Ok(())
}

/// Runs the capture of `job` until `stop` is set (checked between source transactions).
pub fn run(job: &JobConfig, stop: Arc<AtomicBool>) -> Result<()> {
    let c = job
        .capture
        .as_ref()
        .with_context(|| format!("job {} has no [jobs.capture] section", job.name))?;
    let SnapshotConfig::Files { dir } = &job.snapshot else {
        bail!(
            "job {}: capture writes the snapshot as files (snapshot.kind = \"files\")",
            job.name
        );
    };
    let dir: PathBuf = dir.clone();
    let table = TableName::parse(&c.table)?;
    let url = c.source_url.expose().to_string();
    let slot = c.slot_name(&job.name);
    let publication = c.publication_name(&job.name);
    let props: BTreeMap<String, String> = job
        .kafka
        .iter()
        .filter(|(k, _)| !is_consumer_only(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();

    let mut client = pg::connect(&url)?;
    let info = pg::table_info(&mut client, &table)?;
    pg::ensure_publication(&mut client, &publication, &table)?;
    let partitions = match crate::kafka::admin::partition_count(&props, &job.topic)? {
        Some(n) => n,
        None => {
            crate::kafka::admin::ensure_topic(&props, &job.topic, c.partitions)?;
            c.partitions
        }
    };
    let map = PartitionMap::new(job.vnode_count, partitions)
        .with_context(|| format!("topic {} against vnode_count", job.topic))?;
    let schema_json = super::types::row_schema(&table.to_string(), &info.encoder.columns);
    let table_schema = TableSchema::parse(&schema_json.to_string(), &info.primary_key)?;
    let codec = LogCodec::new(table_schema.clone())?;
    let columns: Vec<String> = info
        .encoder
        .columns
        .iter()
        .map(|c| c.name.clone())
        .collect();
    let config = CaptureConfig {
        barrier_interval_ms: c.barrier_interval_ms,
        checkpoint_interval_ms: c.checkpoint_interval_ms,
        ..CaptureConfig::default()
    };

    let template = StateRecord {
        version: STATE_VERSION,
        job: job.name.clone(),
        table: table.to_string(),
        slot: slot.clone(),
        system_id: String::new(),
        timeline: 0,
        snapshot_epoch: Epoch(0),
        initial_epoch: Epoch(0),
        start_offsets: Vec::new(),
        columns: columns.clone(),
        state: CaptureState {
            lsn: 0,
            epoch: Epoch(0),
            checkpoints: 0,
        },
    };
    // Fence every older capture of the job, then read where the last one committed.
    let mut log = KafkaLog::connect(&props, &job.name, &job.topic, partitions, codec, template)?;
    let mut committed = read_state(&props, &job.topic, &job.name)?;
    let mut progress = Progress {
        job: job.name.clone(),
        last_log_ms: 0,
        counted: SessionStats::default(),
    };
    let connect = |create: bool| {
        PgReplication::connect(
            &url,
            &slot,
            &publication,
            table.clone(),
            info.encoder.clone(),
            create,
        )
    };
    let mut failures = 0u32;
    loop {
        let (mut a, initial, mut repl) = match &committed {
            None => {
                // A fresh capture: a slot left by an attempt that never committed is dropped.
                match pg::slot_state(&mut client, &slot)? {
                    Some((_, true)) => bail!("replication slot {slot} is in use by another connection (a capture of job {} still running?)", job.name),
                    Some(_) => {
                        tracing::warn!(slot = %slot, "dropping the replication slot of a capture that never committed");
                        client.execute("SELECT pg_drop_replication_slot($1)", &[&slot])?;
                    }
                    None => {}
                }
                let repl = connect(true)?;
                let name = repl
                    .exported_snapshot()
                    .context("the slot was created without an exported snapshot")?;
                let (sys, tli) = repl.identity();
                // Written as sorted per-vnode files in bounded memory (spilled by vnode first).
                if dir.exists() {
                    std::fs::remove_dir_all(&dir)
                        .with_context(|| format!("clearing {}", dir.display()))?;
                }
                let mut writer = SortedWriter::new(&dir, &table_schema, map.vnode_count())?;
                let started = std::time::Instant::now();
                let (snap_info, now_ms, rows) =
                    pg::copy_snapshot(&url, &table, &name, |datum, key| {
                        writer.add(vnode_of(&key, map.vnode_count()), &key, &datum)?;
                        Ok(())
                    })?;
                if snap_info.encoder.columns != info.encoder.columns {
                    bail!(
                        "the columns of {table} changed while the capture started; start it again"
                    );
                }
                let consistent = pg::slot_state(&mut client, &slot)?
                    .map(|(lsn, _)| lsn)
                    .with_context(|| format!("slot {slot} vanished after its creation"))?;
                let es = Epoch::from_unix_millis(now_ms);
                let files = writer.finish()?;
                let manifest = Manifest {
                    snapshot_epoch: es,
                    vnode_count: map.vnode_count(),
                    partition_count: partitions,
                    topic: Some(job.topic.clone()),
                    row_schema: table_schema.json.clone(),
                    primary_key: table_schema.primary_key.clone(),
                    files,
                    start: Vec::new(),
                };
                write_durably(
                    &dir.join(PENDING_MANIFEST),
                    &serde_json::to_vec_pretty(&manifest)?,
                )?;
                tracing::info!(table = %table, rows, seconds = started.elapsed().as_secs_f64(), lsn = %pg::format_lsn(consistent), "snapshot copied");
                log.record.system_id = sys.to_string();
                log.record.timeline = tli;
                log.record.snapshot_epoch = es;
                let hook_dir = dir.clone();
                log.on_initial_commit = Some(Box::new(move |r: &StateRecord| {
                    finish_manifest(&hook_dir, r)
                }));
                let (a, initial) = Assembler::fresh(config, map, es, consistent, unix_ms());
                (a, initial, repl)
            }
            Some(record) => {
                if record.slot != slot || record.table != table.to_string() {
                    bail!("the log of topic {} was captured from {} through slot {}, not {} through {}: capture into a new topic", job.topic, record.table, record.slot, table, slot);
                }
                if record.columns != columns {
                    bail!("the columns of {table} are now {columns:?}, captured as {:?}: a schema change stops the capture", record.columns);
                }
                if !dir.join("manifest.json").exists() {
                    finish_manifest(&dir, record)?;
                }
                if pg::slot_state(&mut client, &slot)?.is_none() {
                    bail!("replication slot {slot} is gone: the changes since {} cannot be read; capture into a new topic", pg::format_lsn(record.state.lsn));
                }
                let repl = connect(false)?;
                let (sys, tli) = repl.identity();
                if record.system_id != sys.to_string() || record.timeline != tli {
                    bail!("the source is system {sys} timeline {tli}, the log was captured from system {} timeline {}: a restore or failover happened; capture into a new topic", record.system_id, record.timeline);
                }
                log.record = record.clone();
                (
                    Assembler::resume(config, map, record.state),
                    Vec::new(),
                    repl,
                )
            }
        };
        let before = a.committed().checkpoints;
        let result = run_session(
            &mut a,
            initial,
            &mut repl,
            &mut log,
            Duration::from_millis(100),
            &mut |_| stop.load(Ordering::Relaxed),
            &mut progress,
        );
        drop(repl);
        let committed_now = a.committed();
        let mut record = log.record.clone();
        record.state = committed_now;
        let made_progress = committed_now.checkpoints > before;
        match result {
            Ok(_) => {
                tracing::info!(job = %job.name, lsn = %pg::format_lsn(committed_now.lsn), "capture stopped at a checkpoint");
                return Ok(());
            }
            Err(CaptureFailure::Permanent(e)) => {
                // Nothing past the last checkpoint is committed.
                if let Err(abort) = log.abort() {
                    tracing::warn!(job = %job.name, error = %abort, "aborting the open Kafka transaction");
                }
                bail!("capture of {table} for job {} stopped: {e}", job.name);
            }
            Err(CaptureFailure::Transient(e)) => {
                log.abort().map_err(|e| anyhow::anyhow!("{e}"))?;
                failures = if made_progress { 1 } else { failures + 1 };
                if failures > MAX_FAILED_SESSIONS {
                    bail!("capture of {table} for job {}: {failures} sessions in a row failed, the last with: {e}", job.name);
                }
                crate::service::metrics::capture_restart(&job.name);
                tracing::warn!(job = %job.name, error = %e, attempt = failures, "capture session failed; resuming from the last checkpoint");
                if log.on_initial_commit.is_none() {
                    committed = Some(record);
                } else {
                    // The initial transaction never committed: start afresh.
                    log.on_initial_commit = None;
                    committed = None;
                }
                std::thread::sleep(Duration::from_millis(200 * failures as u64));
            }
        }
    }
}
