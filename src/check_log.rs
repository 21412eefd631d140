//! `check-log`: reads a job's snapshot and log topic without materialising anything and reports every
//! violation of the wire contract it finds (docs/WIRE.md), so that a producer written in
//! another language can be checked before a job depends on it.
//!
//! Owns only reading and reporting: the per-record rules are the core's
//! ([`crate::core::contract`]), the same the executor applies; the snapshot rules are the snapshot
//! source's (every row's vnode listed for its file, key order, no key twice, header schemas).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::codec::{LogCodec, TableSchema};
use crate::config::{JobConfig, SnapshotConfig};
use crate::core::contract::{check_record, LogPosition};
use crate::core::{check_log_start, CoreError, LogRecord, PartitionMap, Vnode};
use crate::kafka::admin::{while_broker_away, ErrorCapture};
use crate::kafka::consumer_position;
use crate::ports::SnapshotSource;

/// What `check-log` found (`check-log --json` prints it).
#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    pub snapshot_rows: u64,
    pub records: u64,
    pub partitions: u32,
    /// The first violations, as operators read them (at most the requested number).
    pub violations: Vec<String>,
    /// Row-schema versions of the log's tables, the manifest's included (docs/WIRE.md "Schema
    /// changes").
    pub schema_versions: u64,
    /// All violations found.
    pub violation_count: u64,
    /// Truncations read, and where each partition's reading stopped: every truncation must be in
    /// every partition (`contract::truncations_missing`).
    truncations: crate::core::contract::TruncationsSeen,
    open: std::collections::BTreeMap<u32, crate::core::Epoch>,
}

impl Report {
    fn violation(&mut self, max: usize, what: String) {
        self.violation_count += 1;
        if self.violations.len() < max {
            self.violations.push(what);
        }
    }
}

/// How long to wait for a record below the high watermark before giving up on a partition; a
/// broker that is away (restarting) for less than this is waited out.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Metadata and watermark requests while the broker is away: long enough for a broker restart.
const BROKER_AWAY: crate::core::retry::Backoff = crate::core::retry::Backoff {
    initial_ms: 100,
    max_ms: 2_000,
    deadline_ms: READ_TIMEOUT.as_millis() as u64,
};

/// Checks job `job`'s snapshot and its topic from the manifest's start offsets to the high
/// watermarks taken when checking starts.
pub fn check_log(job: &JobConfig, max_report: usize) -> Result<Report> {
    let mut tables: Vec<TableSchema> = Vec::new();
    let mut report = Report::default();
    // Every table of the log, each with its snapshot: a log of several tables is checked whole,
    // whichever of them the job materialises.
    let mut snapshots: Vec<Arc<dyn SnapshotSource>> = Vec::new();
    let mut evolution = None;
    let (snapshot, table): (Arc<dyn SnapshotSource>, TableSchema) = match &job.snapshot {
        SnapshotConfig::Files { dir, table } => {
            // A job of several tables names them in `store.tables`: any of them opens the log's.
            let table = table
                .as_deref()
                .or_else(|| job.store.tables().keys().next().map(String::as_str));
            match crate::snapshot::files::SnapshotFiles::open_table(dir, table) {
                Ok(s) => {
                    let t = s.table.clone();
                    for lt in s.tables.iter() {
                        if lt.name != s.tables[s.table_index].name {
                            match crate::snapshot::files::SnapshotFiles::open_table(
                                dir,
                                Some(&lt.name),
                            ) {
                                Ok(o) => snapshots.push(Arc::new(o)),
                                Err(e) => report.violation(max_report, e.to_string()),
                            }
                        }
                    }
                    tables = s.tables.iter().map(|t| t.schema.clone()).collect();
                    // The schema versions beside the manifest (docs/WIRE.md "Schema changes").
                    match crate::snapshot::versions::evolution(
                        dir,
                        tables.clone(),
                        s.tables.iter().map(|t| Some(t.name.clone())).collect(),
                        s.info().snapshot_epoch,
                        None,
                    ) {
                        Ok(ev) => {
                            let vs = ev.current();
                            report.schema_versions =
                                (0..tables.len()).map(|i| vs.of(i).len() as u64).sum();
                            evolution = Some(ev);
                        }
                        Err(e) => report.violation(max_report, e.to_string()),
                    }
                    (Arc::new(s), t)
                }
                Err(e) => {
                    // Without a manifest there is no schema to check the log with.
                    report.violation(max_report, e.to_string());
                    return Ok(report);
                }
            }
        }
        SnapshotConfig::Postgres { url, name } => {
            let s = crate::snapshot::postgres::PostgresSnapshot::open(url.expose(), name)
                .with_context(|| format!("job {}: opening the snapshot", job.name))?;
            let t = s.table().clone();
            (Arc::new(s), t)
        }
    };
    let info = snapshot.info().clone();
    if info.vnode_count != job.vnode_count {
        report.violation(
            max_report,
            format!(
                "snapshot: vnode_count is {} but the job's is {}",
                info.vnode_count, job.vnode_count
            ),
        );
    }
    let map = match PartitionMap::new(info.vnode_count, info.partition_count) {
        Ok(m) => m,
        Err(e) => {
            report.violation(max_report, format!("snapshot: {e}"));
            return Ok(report);
        }
    };
    snapshots.insert(0, snapshot.clone());
    for (v, snapshot) in
        (0..info.vnode_count as Vnode).flat_map(|v| snapshots.iter().map(move |s| (v, s)))
    {
        match snapshot.scan(v, None) {
            Ok(rows) => {
                for row in rows {
                    match row {
                        Ok(_) => report.snapshot_rows += 1,
                        Err(e) => {
                            report.violation(max_report, format!("snapshot vnode {v}: {e}"));
                            break;
                        }
                    }
                }
            }
            Err(e) => report.violation(max_report, format!("snapshot vnode {v}: {e}")),
        }
    }

    // `assign` only: it never joins the group nor commits, so the job's own group is harmless.
    let mut config = crate::kafka::admin::client_config(&job.kafka);
    if !job.kafka.contains_key("group.id") {
        config.set("group.id", job.group_id());
    }
    // What the service reads: committed transactions only (aborted records and commit markers are
    // not part of the log a job applies).
    let consumer: BaseConsumer<ErrorCapture> = config
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create_with_context(ErrorCapture::default())
        .context("creating the consumer")?;
    let topic = &job.topic;
    let md = while_broker_away(&consumer, BROKER_AWAY, || {
        consumer.fetch_metadata(Some(topic), Duration::from_secs(5))
    })
    .map_err(anyhow::Error::msg)
    .with_context(|| format!("fetching metadata of topic {topic}"))?;
    let partitions = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map_or(0, |t| t.partitions().len() as u32);
    if partitions != info.partition_count {
        report.violation(
            max_report,
            format!(
                "topic {topic} has {partitions} partitions but the snapshot's partition_count is {}",
                info.partition_count
            ),
        );
        return Ok(report);
    }
    report.partitions = partitions;
    // One codec per table of the log, each decoding its own table's rows whole.
    let mut codecs: Vec<LogCodec> = if tables.len() > 1 {
        (0..tables.len())
            .map(|i| LogCodec::of_log(&tables, i))
            .collect::<Result<_, _>>()?
    } else {
        vec![LogCodec::new(table)?]
    };
    if let Some(ev) = &evolution {
        codecs = codecs
            .into_iter()
            .map(|c| c.with_evolution(ev.clone()))
            .collect();
    }
    let mut barriers = std::collections::BTreeMap::new();
    for p in 0..partitions {
        check_partition(
            &consumer,
            &codecs,
            job,
            map,
            &info,
            p,
            &mut barriers,
            &mut report,
            max_report,
        )?;
    }
    for (table, epoch, p) in
        crate::core::contract::truncations_missing(&report.truncations, &report.open)
    {
        report.violation(
            max_report,
            format!(
                "topic {} partition {p}: no truncation of table {table} at epoch {epoch}, which partition(s) {:?} carry: a truncation is written into every partition",
                job.topic, report.truncations[&(table, epoch)]
            ),
        );
    }
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
fn check_partition(
    consumer: &BaseConsumer<ErrorCapture>,
    codecs: &[LogCodec],
    job: &JobConfig,
    map: PartitionMap,
    info: &crate::ports::SnapshotInfo,
    p: u32,
    barriers: &mut std::collections::BTreeMap<crate::core::Epoch, crate::core::Barrier>,
    report: &mut Report,
    max_report: usize,
) -> Result<()> {
    let topic = &job.topic;
    let starts: Vec<_> = info.start.iter().filter(|s| s.partition == p).collect();
    let [start] = starts.as_slice() else {
        report.violation(
            max_report,
            format!(
                "snapshot: start lists partition {p} {} times (must be once)",
                starts.len()
            ),
        );
        return Ok(());
    };
    let (low, high) = while_broker_away(consumer, BROKER_AWAY, || {
        consumer.fetch_watermarks(topic, p as i32, Duration::from_secs(5))
    })
    .map_err(anyhow::Error::msg)
    .with_context(|| format!("watermarks of topic {topic} partition {p}"))?;
    let (low, high) = (low.max(0) as u64, high.max(0) as u64);
    // The job would stop here, before reading: say why, as the job would.
    if let Err(gone) = check_log_start(topic, p, start.next_offset, low) {
        report.violation(max_report, format!("snapshot: {gone}"));
        return Ok(());
    }
    if start.next_offset == 0 || start.next_offset - 1 < low || start.next_offset > high {
        report.violation(
            max_report,
            format!(
                "snapshot: start offset {} of partition {p} does not follow a barrier in topic {topic} (offsets {low}..{high})",
                start.next_offset
            ),
        );
        return Ok(());
    }
    let first = start.next_offset - 1;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, p as i32, Offset::Offset(first as i64))?;
    consumer.assign(&tpl)?;
    let mut at = LogPosition {
        open_epoch: info.snapshot_epoch,
        pending_update_delete: None,
    };
    let mut next = first;
    let mut last_progress = Instant::now();
    let mut client_error = None;
    // No record within READ_TIMEOUT while the client reported errors: the broker stayed away,
    // which is not the log's fault.
    let stayed_away = |e: rdkafka::error::KafkaError, next: u64| {
        anyhow::Error::new(e).context(format!(
            "reading topic {topic} partition {p} at offset {next}: no record within {READ_TIMEOUT:?}"
        ))
    };
    while next < high {
        let Some(m) = consumer.poll(Duration::from_millis(500)) else {
            // Past a trailing transaction marker (or aborted records) there is nothing to deliver:
            // the consumer's position says how far it has read.
            if consumer_position(consumer, topic, p).is_some_and(|pos| pos >= high) {
                break;
            }
            if last_progress.elapsed() > READ_TIMEOUT {
                if let Some(e) = client_error.take() {
                    return Err(stayed_away(e, next));
                }
                report.violation(
                    max_report,
                    format!("topic {topic} partition {p}: no record at offset {next} within {READ_TIMEOUT:?} (high watermark {high})"),
                );
                break;
            }
            continue;
        };
        let m = match m {
            Ok(m) => m,
            // A broker away (restarting, a connection dropped) is waited out within READ_TIMEOUT,
            // as the service does; what waiting cannot cure (credentials, TLS) stops at once.
            Err(e) if !consumer.context().permanent() => {
                tracing::warn!(error = %e, topic = %topic, partition = p, offset = next, "consumer error; waiting for the broker");
                if last_progress.elapsed() > READ_TIMEOUT {
                    return Err(stayed_away(e, next));
                }
                client_error = Some(e);
                continue;
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "reading topic {topic} partition {p}: {}",
                        consumer.context().last().unwrap_or_default()
                    )
                })
            }
        };
        client_error = None;
        last_progress = Instant::now();
        let offset = m.offset() as u64;
        next = offset + 1;
        report.records += 1;
        let value = m.payload().unwrap_or(&[]);
        // The first codec tells the record's table; that table's codec checks its row. A table
        // added to the log after its first snapshot is in no manifest this reads: its changes are
        // checked by their header (epoch, routing, pairs), its rows not (docs/WIRE.md "Tables
        // added").
        let decoded = match codecs[0].decode(value, m.key()) {
            Ok(LogRecord::Change(c)) if c.table != 0 => match codecs.get(c.table as usize) {
                Some(codec) => codec.decode(value, m.key()),
                None => Ok(LogRecord::Change(c)),
            },
            other => other,
        };
        let record = match decoded {
            Ok(r) => r,
            Err(e) => {
                let e = CoreError::Undecodable {
                    topic: topic.clone(),
                    partition: p,
                    offset,
                    reason: e.to_string(),
                };
                report.violation(max_report, e.to_string());
                continue;
            }
        };
        if offset == first {
            let ok = matches!(&record, LogRecord::Barrier(b) if b.prev == info.snapshot_epoch && b.curr == start.epoch);
            if !ok {
                report.violation(
                    max_report,
                    format!(
                        "topic {topic} partition {p} offset {offset}: the record before the manifest's start offset must be the barrier {} -> {}, found {}",
                        info.snapshot_epoch, start.epoch, describe(&record)
                    ),
                );
            }
        }
        if let LogRecord::Truncate(t) = &record {
            report
                .truncations
                .entry((t.table, t.epoch))
                .or_default()
                .insert(p);
        }
        match check_record(topic, map, p, offset, &at, &record, barriers) {
            Ok(()) => at.advance(offset, &record, barriers),
            Err(e) => {
                report.violation(max_report, e.to_string());
                at.resync(offset, &record);
            }
        }
    }
    report.open.insert(p, at.open_epoch);
    consumer.unassign()?;
    Ok(())
}

fn describe(r: &LogRecord) -> String {
    match r {
        LogRecord::Barrier(b) => format!("the barrier {} -> {}", b.prev, b.curr),
        LogRecord::Change(c) => format!("a change of epoch {}", c.epoch),
        LogRecord::Truncate(t) => format!("a truncation of table {} at epoch {}", t.table, t.epoch),
    }
}
