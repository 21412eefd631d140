//! The Kafka side of the capture: a transactional producer with a stable `transactional.id` per job
//! (a newer capture fences an older one), one Kafka transaction per checkpoint interval holding the
//! changes, the barriers and the resume state on the compacted state topic `<topic>.capture`, as a
//! [`LogPort`]. [`read_state`] reads that topic back, only after `init_transactions` (so a zombie's
//! pending commit cannot land after it was read).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};

use super::{CaptureFailure, LogPort};
use crate::codec::LogCodec;
use crate::core::capture::{CaptureState, Lsn, TableIndex};
use crate::core::{Barrier, Epoch, Op, PartitionId, Vnode};

/// The state record's format version.
pub const STATE_VERSION: u32 = 1;

/// The state topic of a log topic.
pub fn state_topic(topic: &str) -> String {
    format!("{topic}.capture")
}

/// What each committed Kafka transaction records on the state topic (JSON, key = the job).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateRecord {
    /// Format version of this record.
    pub version: u32,
    pub job: String,
    pub table: String,
    pub slot: String,
    pub system_id: String,
    pub timeline: u32,
    pub snapshot_epoch: Epoch,
    /// The initial barrier's `curr_epoch` (the manifest's `start[].epoch`).
    pub initial_epoch: Epoch,
    /// Per partition, the offset just after the initial barrier (the manifest's `start`).
    pub start_offsets: Vec<u64>,
    /// The column names captured (a table whose columns differ is refused).
    pub columns: Vec<String>,
    /// A capture of several tables: the tables after the first (which is `table` and `columns`),
    /// in the capture's order. Empty, and left out, for one table (as every record before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_tables: Vec<StateTable>,
    /// The tables removed from the capture (docs/CAPTURE.md "Removing a table"), in the order they
    /// were removed: the log has none of their changes from `from_epoch` on. Empty, and left out,
    /// when none was (as every record before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<RemovedTable>,
    /// The snapshots taken of the running capture after the first, each published (its manifest
    /// written), oldest first. Empty, and left out, when there are none (as every record before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapshotRecord>,
    /// `snapshot_storage = "kafka"`: the topic holding the first snapshot, once stored whole
    /// (`crate::snapshot::kafka`). Absent, and left out, until then (and with files only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_topic: Option<String>,
    pub state: CaptureState,
}

impl StateRecord {
    /// A fresh capture's record of `job` through `slot` (a PostgreSQL slot, or what a source
    /// without one names its client by), for `tables` (name, columns) in the log's order.
    pub fn fresh(job: &str, slot: String, tables: &[(String, Vec<String>)]) -> StateRecord {
        StateRecord {
            version: STATE_VERSION,
            job: job.to_string(),
            table: tables[0].0.clone(),
            slot,
            system_id: String::new(),
            timeline: 0,
            snapshot_epoch: Epoch(0),
            initial_epoch: Epoch(0),
            start_offsets: Vec::new(),
            columns: tables[0].1.clone(),
            snapshots: Vec::new(),
            snapshot_topic: None,
            removed: Vec::new(),
            other_tables: tables[1..]
                .iter()
                .map(|(table, columns)| StateTable {
                    table: table.clone(),
                    columns: columns.clone(),
                    added: false,
                })
                .collect(),
            state: CaptureState {
                lsn: 0,
                epoch: Epoch(0),
                checkpoints: 0,
            },
        }
    }

    /// Removes the tables at `positions` (of [`StateRecord::tables`]: the last ones, never the
    /// first, so no table changes its place in the log) from the record,
    /// naming each in [`StateRecord::removed`] with the open epoch: every change of theirs in
    /// the log is in an earlier epoch, and none is written from it on.
    pub fn remove_tables(&mut self, positions: &[usize]) {
        let from_epoch = self.state.epoch;
        let mut gone = Vec::new();
        for &p in positions.iter().rev() {
            assert!(p > 0, "the log's first table is never removed");
            gone.push(self.other_tables.remove(p - 1).table);
        }
        self.removed.extend(
            gone.into_iter()
                .rev()
                .map(|table| RemovedTable { table, from_epoch }),
        );
    }

    /// The removed tables (name, epoch from which the log has none of their changes).
    pub fn removed(&self) -> Vec<(&str, Epoch)> {
        self.removed
            .iter()
            .map(|r| (r.table.as_str(), r.from_epoch))
            .collect()
    }

    /// Every recorded table (name, columns), in the log's order.
    pub fn tables(&self) -> Vec<(&str, &[String])> {
        std::iter::once((self.table.as_str(), self.columns.as_slice()))
            .chain(
                self.other_tables
                    .iter()
                    .map(|t| (t.table.as_str(), t.columns.as_slice())),
            )
            .collect()
    }
}

/// The snapshots the next state record lists, as the capture knows them between commits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listed {
    /// The first snapshot's topic, once stored ([`StateRecord::snapshot_topic`]).
    pub first_topic: Option<String>,
    /// The later snapshots published and not retired, oldest first.
    pub later: Vec<SnapshotRecord>,
    /// Retired (dropped from `later`), but a committed record may still list them: a runner
    /// may be about to restore one. Kept until a commit whose record left them out.
    pub retired: Vec<SnapshotRecord>,
    /// Retired and left out of a committed record: their topics and folders may go now.
    pub unlisted: Vec<SnapshotRecord>,
}

impl Listed {
    /// Drops `s` from the next record; its topic and folder go once that record is committed
    /// ([`Listed::unlisted`]).
    pub fn retire(&mut self, s: SnapshotRecord) {
        self.later.retain(|l| l.snapshot_epoch != s.snapshot_epoch);
        self.retired.push(s);
    }

    /// What the next record lists, and the retired snapshots it leaves out (to hand to
    /// [`Listed::committed`] once it is committed).
    pub fn for_record(&self) -> (Vec<SnapshotRecord>, Vec<Epoch>) {
        let leaving = self.retired.iter().map(|s| s.snapshot_epoch).collect();
        (self.later.clone(), leaving)
    }

    /// A record that left out `leaving` is committed: those are unlisted.
    pub fn committed(&mut self, leaving: &[Epoch]) {
        let (gone, still): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retired)
            .into_iter()
            .partition(|s| leaving.contains(&s.snapshot_epoch));
        self.retired = still;
        self.unlisted.extend(gone);
    }
}

/// A snapshot of the running capture (docs/CAPTURE.md "Snapshots of a running capture").
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRecord {
    /// The epoch its checkpoint barrier closed: the snapshot holds every source transaction of
    /// the log up to and including this epoch, and none after.
    pub snapshot_epoch: Epoch,
    /// That barrier's `curr_epoch` (the manifest's `start[].epoch`).
    pub next_epoch: Epoch,
    /// Per partition, the offset just after that barrier (the manifest's `start`).
    pub start_offsets: Vec<u64>,
    /// The folder holding its `manifest.json`.
    pub dir: String,
    /// The state topic's offset of the newest request ([`super::snapshots::request`]) seen when
    /// this snapshot was exported: every request up to it is answered by this snapshot or an
    /// earlier one. Absent for a snapshot of the interval that no request preceded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<i64>,
    /// `snapshot_storage = "kafka"`: the topic holding it, once stored whole. Absent until then
    /// (and with files only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
}

/// A snapshot's checkpoint barrier, committed: what its manifest needs of the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotPlaced {
    pub snapshot_epoch: Epoch,
    pub next_epoch: Epoch,
    /// The source position the snapshot was exported at.
    pub consistent: Lsn,
    pub start_offsets: Vec<u64>,
}

/// A table of a capture of several, after the first, in its [`StateRecord`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateTable {
    pub table: String,
    pub columns: Vec<String>,
    /// The table joined the capture after its first snapshot (docs/CAPTURE.md "Adding a table"):
    /// its versions name its primary key (docs/WIRE.md "Tables added"). Left out when false (as
    /// every record before).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub added: bool,
}

/// A table removed from the capture ([`StateRecord::removed`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemovedTable {
    pub table: String,
    /// The epoch from which the log has none of the table's changes: the open epoch when the
    /// capture resumed without it (its last changes are in the epochs before, whose barriers
    /// every partition has).
    pub from_epoch: Epoch,
}

#[derive(Default)]
struct Ctx {
    failed: Mutex<Option<String>>,
    /// Highest delivered offset per partition of the log topic in the open transaction.
    delivered: Mutex<HashMap<i32, i64>>,
}

impl ClientContext for Ctx {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        crate::kafka::client_log::log(level, fac, message);
    }
}

impl ProducerContext for Ctx {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Err((e, m)) => {
                self.failed.lock().unwrap().get_or_insert_with(|| {
                    format!("{} partition {}: {e}", m.topic(), m.partition())
                });
            }
            Ok(m) => {
                let mut d = self.delivered.lock().unwrap();
                let o = d.entry(m.partition()).or_insert(-1);
                *o = (*o).max(m.offset());
            }
        }
    }
}

/// What [`KafkaLog::after_next_commit`] calls, with the committed record.
pub type AfterCommit = Box<dyn FnOnce(&StateRecord) + Send>;

/// What runs once the initial barrier's transaction committed.
pub type InitialCommitHook = Box<dyn FnOnce(&StateRecord) -> Result<()> + Send>;

/// The transactional writer of one job's log.
pub struct KafkaLog {
    producer: BaseProducer<Ctx>,
    /// One codec per captured table, in the capture's order (a change of table `i` is written with
    /// `codecs[i]`'s writer schema, whose fingerprint tells the reader its table).
    codecs: Vec<LogCodec>,
    topic: String,
    state_topic: String,
    partitions: u32,
    /// Everything but `state`, written with each commit.
    pub record: StateRecord,
    open: bool,
    /// Called once after the initial barrier's transaction committed (writes the manifest).
    pub on_initial_commit: Option<InitialCommitHook>,
    /// Called once after the next commit (of any checkpoint): what may happen only once the
    /// state record it wrote is durable (a removed table leaving the publication).
    pub after_next_commit: Option<AfterCommit>,
    /// Told how long each commit took (the service's histogram).
    pub on_commit: Option<Box<dyn FnMut(Duration) + Send>>,
    /// The snapshot folder, beside whose manifest schema versions are announced.
    pub snapshot_dir: Option<std::path::PathBuf>,
    /// `snapshot_storage = "kafka"`: the job's producer properties; each schema version is also
    /// written to the log's versions topic, before its file
    /// ([`crate::snapshot::kafka::versions_topic`]).
    pub versions_to_kafka: Option<BTreeMap<String, String>>,
    /// A snapshot barrier in the open transaction ([`LogPort::snapshot_point`]).
    snapshot_point: Option<(Epoch, Epoch, Lsn)>,
    /// Told each snapshot barrier once its transaction committed.
    pub on_snapshot_placed: Option<std::sync::mpsc::Sender<SnapshotPlaced>>,
    /// The snapshots published and not retired (the committed record's, and those published or
    /// stored since it was read): the record lists them from the next commit on.
    pub published: Option<std::sync::Arc<Mutex<Listed>>>,
    /// A log of several tables: each table's name in the manifest (`tables[].name`), in the
    /// capture's order, which its schema versions name (docs/WIRE.md "Schema changes").
    pub table_names: Vec<String>,
}

/// A producer error as the loop sees it. Permanent once librdkafka has put the producer in its
/// fatal state (`fatal_error`: a newer capture's `init_transactions` fenced it), however the error
/// reached us (a commit, a produce, an abort): a fenced capture that retried would fence its
/// successor in turn. Anything else aborts and resumes.
fn txn_failure(producer: &BaseProducer<Ctx>, what: &str, e: KafkaError) -> CaptureFailure {
    let fatal = matches!(&e, KafkaError::Transaction(t) if t.is_fatal())
        || e.rdkafka_error_code() == Some(RDKafkaErrorCode::ProducerFenced)
        || producer.client().fatal_error().is_some();
    if fatal {
        CaptureFailure::permanent(format!(
            "{what}: {e} (a newer capture of this job fenced this one)"
        ))
    } else {
        CaptureFailure::transient_from(what, e)
    }
}

impl KafkaLog {
    /// Creates the producer and fences every older capture of the job (`init_transactions`).
    /// `codecs`: one per captured table, at least one.
    pub fn connect(
        props: &BTreeMap<String, String>,
        job: &str,
        topic: &str,
        partitions: u32,
        codecs: Vec<LogCodec>,
        record: StateRecord,
    ) -> Result<KafkaLog> {
        let mut config = crate::kafka::admin::client_config(props);
        config
            .set("transactional.id", format!("kafka-backfill-capture-{job}"))
            .set("enable.idempotence", "true")
            .set("transaction.timeout.ms", "60000")
            .set("queue.buffering.max.messages", "1000000")
            .set("queue.buffering.max.kbytes", "1048576");
        if !props.contains_key("linger.ms") && !props.contains_key("queue.buffering.max.ms") {
            config.set("linger.ms", PRODUCER_LINGER_MS.to_string());
        }
        let producer: BaseProducer<Ctx> = config
            .create_with_context(Ctx::default())
            .context("creating the capture's producer")?;
        producer
            .init_transactions(Duration::from_secs(60))
            .context("initialising the capture's Kafka transactions (fences an older capture)")?;
        anyhow::ensure!(!codecs.is_empty(), "a capture writes at least one table");
        Ok(KafkaLog {
            producer,
            codecs,
            topic: topic.to_string(),
            state_topic: state_topic(topic),
            partitions,
            record,
            open: false,
            on_initial_commit: None,
            after_next_commit: None,
            on_commit: None,
            snapshot_dir: None,
            versions_to_kafka: None,
            snapshot_point: None,
            on_snapshot_placed: None,
            published: None,
            table_names: Vec::new(),
        })
    }

    /// Per partition, the offset just after the last barrier of the open transaction (the last
    /// record written to each partition), from the delivery reports.
    fn offsets_after_barrier(&self, what: &str) -> Result<Vec<u64>, CaptureFailure> {
        crate::kafka::flush::flush(&self.producer, Duration::from_secs(60))
            .map_err(|e| txn_failure(&self.producer, &format!("flushing {what}"), e))?;
        let delivered = self.producer.context().delivered.lock().unwrap().clone();
        (0..self.partitions as i32)
            .map(|p| {
                delivered
                    .get(&p)
                    .filter(|o| **o >= 0)
                    .map(|o| *o as u64 + 1)
                    .ok_or_else(|| {
                        CaptureFailure::transient(format!(
                            "no delivery report for {what} in partition {p}"
                        ))
                    })
            })
            .collect()
    }

    fn send(
        &self,
        topic: &str,
        partition: i32,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), CaptureFailure> {
        crate::kafka::send_waiting(&self.producer, topic, partition, key, value)
            .map_err(|e| txn_failure(&self.producer, &format!("producing to {topic}"), e))
    }
}

impl KafkaLog {
    /// Writes table `t`'s changes with `table`'s row schema (the version in force where the
    /// capture resumes).
    pub fn use_table(&mut self, t: usize, table: crate::codec::TableSchema) -> Result<()> {
        self.codecs[t] = LogCodec::new(table)?;
        Ok(())
    }

    /// Aborts the open transaction, waiting at most `timeout`. After a failed session the wait is
    /// short ([`ABORT_AFTER_FAILURE`]): the next session's `init_transactions` aborts whatever is
    /// left open anyway, and a producer whose commit just timed out can block a full minute
    /// flushing messages the broker will never take (measured: a 10 s broker halt held the capture
    /// 60 s in the commit and another 60 s in the abort).
    ///
    /// The transaction's records still queued or in flight are purged and their delivery reports
    /// served first: librdkafka's abort waits until no record is outstanding, and a `BaseProducer`
    /// hands out its delivery reports only when polled, which the abort does not do (rdkafka's
    /// commit flushes first for the same reason). Without it a capture stopped under load waited
    /// out the whole timeout in the abort: `run --capture` took its 30 s shutdown grace.
    pub fn abort_within(&mut self, timeout: Duration) -> Result<(), CaptureFailure> {
        if self.open {
            let deadline = std::time::Instant::now() + timeout;
            self.producer
                .purge(rdkafka::producer::PurgeConfig::default().queue().inflight());
            // The purged records' reports, served; they fail as purged, which says nothing of a
            // transaction that is being aborted.
            if let Err(e) = crate::kafka::flush::flush(&self.producer, timeout) {
                tracing::warn!(error = %e, "serving the purged records' delivery reports before the abort");
            }
            self.producer.context().failed.lock().unwrap().take();
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            self.producer
                .abort_transaction(left)
                .map_err(|e| txn_failure(&self.producer, "aborting the Kafka transaction", e))?;
            self.open = false;
        }
        Ok(())
    }
}

impl LogPort for KafkaLog {
    fn announce_schema(
        &mut self,
        t: TableIndex,
        from_epoch: Epoch,
        row_schema: &str,
    ) -> Result<(), CaptureFailure> {
        let permanent = |e: String| CaptureFailure::permanent(e);
        let dir = self.snapshot_dir.clone().ok_or_else(|| {
            permanent("no snapshot folder to announce a schema version in".into())
        })?;
        let t = t as usize;
        let (captured, _) = self.record.tables()[t];
        let captured = captured.to_string();
        let name = if self.codecs.len() > 1 {
            Some(self.table_names.get(t).cloned().ok_or_else(|| {
                permanent(format!(
                    "no manifest name for table {captured} of a capture of several tables"
                ))
            })?)
        } else {
            None
        };
        let previous = &self.codecs[t].table;
        let table = crate::codec::TableSchema::parse(row_schema, &previous.primary_key)
            .map_err(|e| permanent(format!("the new row schema of {captured}: {e}")))?;
        crate::codec::versions::compatible(previous, &table).map_err(|why| {
            permanent(format!(
                "incompatible schema change of {captured} at epoch {from_epoch}: {why}"
            ))
        })?;
        let codec = LogCodec::new(table.clone()).map_err(|e| permanent(e.to_string()))?;
        // A table that joined the capture after its first snapshot: its versions name its key.
        let added = t > 0 && self.record.other_tables[t - 1].added;
        let file = crate::snapshot::versions::VersionFile {
            table: name,
            from_epoch,
            row_schema: table.json.clone(),
            primary_key: added.then(|| table.primary_key.clone()),
        };
        if let Some(props) = &self.versions_to_kafka {
            crate::snapshot::kafka::store_version(
                props,
                &self.topic,
                &codec.fingerprint_hex(),
                &file,
            )
            .map_err(|e| {
                CaptureFailure::transient_from("writing the schema version to Kafka", e)
            })?;
        }
        crate::snapshot::versions::write(&dir, &codec.fingerprint_hex(), &file)
            .map_err(|e| CaptureFailure::transient_from("writing the schema version file", e))?;
        tracing::info!(table = %captured, %from_epoch, fingerprint = %codec.fingerprint_hex(), "schema version announced");
        let columns = table.columns.iter().map(|c| c.name.clone()).collect();
        match t {
            0 => self.record.columns = columns,
            _ => self.record.other_tables[t - 1].columns = columns,
        }
        self.codecs[t] = codec;
        Ok(())
    }

    fn begin(&mut self) -> Result<(), CaptureFailure> {
        if !self.open {
            self.producer
                .begin_transaction()
                .map_err(|e| txn_failure(&self.producer, "beginning a Kafka transaction", e))?;
            self.open = true;
            self.producer.context().delivered.lock().unwrap().clear();
        }
        Ok(())
    }

    fn barrier(&mut self, barrier: &Barrier) -> Result<(), CaptureFailure> {
        // Any table's writer schema may carry a barrier (docs/WIRE.md "Several tables").
        let value = self.codecs[0].encode_barrier(barrier);
        for p in 0..self.partitions {
            self.send(&self.topic, p as i32, &[], &value)?;
        }
        Ok(())
    }

    fn change(
        &mut self,
        table: TableIndex,
        partition: PartitionId,
        vnode: Vnode,
        epoch: Epoch,
        op: Op,
        key: &[u8],
        row: &[u8],
    ) -> Result<(), CaptureFailure> {
        let codec = self.codecs.get(table as usize).ok_or_else(|| {
            CaptureFailure::permanent(format!(
                "a change of table {table}, which the capture does not have"
            ))
        })?;
        let value = codec.encode_change(epoch, op, vnode, row);
        self.send(&self.topic, partition as i32, key, &value)?;
        self.producer.poll(Duration::ZERO);
        Ok(())
    }

    fn truncate(&mut self, table: TableIndex, epoch: Epoch) -> Result<(), CaptureFailure> {
        if table as usize >= self.codecs.len() {
            return Err(CaptureFailure::permanent(format!(
                "a truncation of table {table}, which the capture does not have"
            )));
        }
        let value = crate::codec::LogCodec::encode_truncate(epoch, table);
        for p in 0..self.partitions {
            self.send(&self.topic, p as i32, &[], &value)?;
        }
        Ok(())
    }

    fn snapshot_point(
        &mut self,
        snapshot_epoch: Epoch,
        next_epoch: Epoch,
        consistent: Lsn,
    ) -> Result<(), CaptureFailure> {
        self.snapshot_point = Some((snapshot_epoch, next_epoch, consistent));
        Ok(())
    }

    fn commit(&mut self, state: &CaptureState) -> Result<(), CaptureFailure> {
        if state.checkpoints == 0 {
            self.record.initial_epoch = state.epoch;
            self.record.start_offsets = self.offsets_after_barrier("the initial barrier")?;
        }
        let placed = match self.snapshot_point.take() {
            Some((snapshot_epoch, next_epoch, consistent)) => Some(SnapshotPlaced {
                snapshot_epoch,
                next_epoch,
                consistent,
                start_offsets: self.offsets_after_barrier("a snapshot's barrier")?,
            }),
            None => None,
        };
        let mut leaving = Vec::new();
        if let Some(published) = &self.published {
            let listed = published.lock().unwrap();
            (self.record.snapshots, leaving) = listed.for_record();
            if listed.first_topic.is_some() {
                self.record.snapshot_topic = listed.first_topic.clone();
            }
        }
        self.record.state = *state;
        let value = serde_json::to_vec(&self.record).expect("a state record serialises");
        let state_topic = self.state_topic.clone();
        self.send(&state_topic, 0, self.record.job.as_bytes(), &value)?;
        let started = std::time::Instant::now();
        // Flushed here, promptly: rdkafka's commit flushes first in steps of 100 ms
        // (`crate::kafka::flush`), and finds nothing left.
        crate::kafka::flush::flush(&self.producer, COMMIT_WITHIN)
            .map_err(|e| txn_failure(&self.producer, "flushing the transaction's records", e))?;
        let left = COMMIT_WITHIN.saturating_sub(started.elapsed());
        self.producer
            .commit_transaction(left)
            .map_err(|e| txn_failure(&self.producer, "committing the Kafka transaction", e))?;
        if let Some(f) = self.on_commit.as_mut() {
            f(started.elapsed());
        }
        if let Some(published) = &self.published {
            published.lock().unwrap().committed(&leaving);
        }
        self.open = false;
        if let Some(failed) = self.producer.context().failed.lock().unwrap().take() {
            // A committed transaction whose delivery failed would have aborted; guard anyway.
            return Err(CaptureFailure::permanent_from(
                "a record of a committed transaction failed",
                failed,
            ));
        }
        if state.checkpoints == 0 {
            if let Some(hook) = self.on_initial_commit.take() {
                hook(&self.record)
                    .map_err(|e| CaptureFailure::permanent(crate::error::line(&e)))?;
            }
        }
        if let Some(hook) = self.after_next_commit.take() {
            hook(&self.record);
        }
        if let (Some(placed), Some(tx)) = (placed, &self.on_snapshot_placed) {
            // The receiver lives as long as the capture; gone, nobody waits for the snapshot.
            let _ = tx.send(placed);
        }
        Ok(())
    }

    fn abort(&mut self) -> Result<(), CaptureFailure> {
        self.abort_within(Duration::from_secs(60))
    }
}

/// How long a failed session waits for its open transaction's abort.
pub const ABORT_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// The capture producer's `linger.ms` unless the job's `kafka` table sets it: longer than the
/// default checkpoint interval, so a partition's records of a checkpoint go in one produce request,
/// sent when the commit flushes (which waives the linger: `crate::kafka::flush`), or earlier when a
/// batch fills (`batch.size`). No reader sees a record before its transaction commits, so the
/// linger costs no freshness. Measured at 200 pgbench transactions/s, a checkpoint every 200 ms:
/// the commit 16 ms after its epoch at a 1 s linger as at 50 ms, with fewer produce requests for
/// the broker (docs/BENCHMARKS.md "What the pipeline costs the cluster").
pub const PRODUCER_LINGER_MS: u64 = 1000;

/// How long a checkpoint's Kafka commit (its records flushed, then the commit) may take before the
/// session fails and resumes from the last committed state. A commit that lands after this is found
/// in the state topic at the resume (the state record is in the same transaction), so the bound
/// costs nothing in exactness; it was 60 s, the broker's whole `transaction.timeout.ms`, and a
/// broker outage stalled the capture that long before it said so (`tests/it/outages.rs`).
pub const COMMIT_WITHIN: Duration = Duration::from_secs(20);

/// Creates the state topic of `topic` when absent (one partition, compacted); returns its name.
pub fn ensure_state_topic(props: &BTreeMap<String, String>, topic: &str) -> Result<String> {
    let state_topic = state_topic(topic);
    crate::kafka::admin::ensure_topic_with(
        props,
        &state_topic,
        1,
        &[("cleanup.policy", "compact")],
    )?;
    Ok(state_topic)
}

/// The job's last committed state record, or `None` if the state topic holds none. Call after
/// [`KafkaLog::connect`] (which fenced every older capture).
pub fn read_state(
    props: &BTreeMap<String, String>,
    topic: &str,
    job: &str,
) -> Result<Option<StateRecord>> {
    read_state_keyed(props, topic, job, &|key| key == job.as_bytes())
}

/// The last committed state record of the capture writing `topic`, whatever its job's name (a job
/// reading a log another job captures): the newest record keyed by a job name (requests and
/// marks have a `/` in their keys; a job name has none).
pub fn read_capture_state(
    props: &BTreeMap<String, String>,
    topic: &str,
) -> Result<Option<StateRecord>> {
    read_state_keyed(props, topic, "snapshot-reader", &|key| !key.contains(&b'/'))
}

fn read_state_keyed(
    props: &BTreeMap<String, String>,
    topic: &str,
    job: &str,
    wanted: &dyn Fn(&[u8]) -> bool,
) -> Result<Option<StateRecord>> {
    let state_topic = ensure_state_topic(props, topic)?;
    let consumer: BaseConsumer = crate::kafka::admin::client_config(props)
        .set("group.id", format!("kafka-backfill-capture-state-{job}"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .context("creating the state topic's reader")?;
    let (_, high) = consumer
        .fetch_watermarks(&state_topic, 0, Duration::from_secs(30))
        .with_context(|| format!("reading the watermarks of {state_topic}"))?;
    if high <= 0 {
        return Ok(None);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&state_topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let mut last = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        // The position passes commit markers too: done once it reaches the high watermark.
        let position = consumer
            .position()?
            .find_partition(&state_topic, 0)
            .and_then(|e| e.offset().to_raw())
            .unwrap_or(-1);
        if position >= high {
            break;
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!(
                "reading {state_topic} to its end ({high}) took over 60 s (at {position})"
            );
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(e)) => return Err(e).with_context(|| format!("reading {state_topic}")),
            Some(Ok(m)) if m.key().is_some_and(wanted) => {
                let payload = m.payload().unwrap_or_default();
                let record: StateRecord = serde_json::from_slice(payload).with_context(|| {
                    format!(
                        "{state_topic} partition 0 offset {}: not a capture state record",
                        m.offset()
                    )
                })?;
                last = Some(record);
            }
            // Another job's state on a shared state topic.
            Some(Ok(_)) => {}
        }
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state record as the last release wrote it (no `snapshots`) reads, and one without
    /// snapshots is written as before (the key left out); one with a snapshot keeps it.
    #[test]
    fn a_state_record_of_the_last_release_reads_and_round_trips() {
        let before = r#"{"version":1,"job":"j","table":"public.t","slot":"kb_j","system_id":"7","timeline":1,"snapshot_epoch":65536,"initial_epoch":131072,"start_offsets":[1,1],"columns":["id","v"],"state":{"lsn":4096,"epoch":196608,"checkpoints":3}}"#;
        let record: StateRecord = serde_json::from_str(before).unwrap();
        assert!(record.snapshots.is_empty() && record.other_tables.is_empty());
        let again = serde_json::to_string(&record).unwrap();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&again).unwrap(),
            serde_json::from_str::<serde_json::Value>(before).unwrap()
        );
        let mut with = record.clone();
        with.snapshots.push(SnapshotRecord {
            snapshot_epoch: Epoch(262144),
            next_epoch: Epoch(327680),
            start_offsets: vec![9, 9],
            dir: "/s/snapshots/262144".into(),
            request: None,
            topic: None,
        });
        let text = serde_json::to_string(&with).unwrap();
        assert!(
            !text.contains("request") && !text.contains("topic"),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<StateRecord>(&text).unwrap(), with);
    }

    /// The last tables removed: out of `other_tables`, named in `removed` with the open epoch
    /// (left out of the JSON when none, so the last release's records read as before), the others
    /// keeping their places.
    #[test]
    fn tables_removed_are_named_with_the_epoch_their_changes_stop_at() {
        let tables: Vec<(String, Vec<String>)> = ["public.a", "public.b", "public.c", "public.d"]
            .iter()
            .map(|t| (t.to_string(), vec!["id".to_string()]))
            .collect();
        let mut record = StateRecord::fresh("j", "kb_j".into(), &tables);
        assert!(!serde_json::to_string(&record).unwrap().contains("removed"));
        record.state.epoch = Epoch(196608);
        record.remove_tables(&[2, 3]);
        let names: Vec<&str> = record.tables().iter().map(|t| t.0).collect();
        assert_eq!(names, ["public.a", "public.b"]);
        assert_eq!(
            record.removed(),
            [("public.c", Epoch(196608)), ("public.d", Epoch(196608))]
        );
        let text = serde_json::to_string(&record).unwrap();
        assert!(
            text.contains(r#""removed":[{"table":"public.c","from_epoch":196608}"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<StateRecord>(&text).unwrap(), record);
    }

    fn later(epoch: u64) -> SnapshotRecord {
        SnapshotRecord {
            snapshot_epoch: Epoch(epoch),
            next_epoch: Epoch(epoch + 1),
            start_offsets: vec![0],
            dir: format!("/s/snapshots/{epoch}"),
            request: None,
            topic: Some(format!("t.snapshot.{epoch}")),
        }
    }

    /// A clean CI run read a committed record listing a snapshot whose topic was already deleted:
    /// retirement deleted it before a record left it out. A retired snapshot is unlisted (its
    /// topic may go) only once a record written without it is committed; one retired while that
    /// record was being committed waits for the next.
    #[test]
    fn a_retired_snapshot_is_unlisted_only_after_a_record_without_it_commits() {
        let mut listed = Listed {
            later: vec![later(1), later(2), later(3)],
            ..Listed::default()
        };
        listed.retire(later(1));
        assert!(listed.unlisted.is_empty(), "no record has left it out yet");
        let (records, leaving) = listed.for_record();
        assert_eq!(records, vec![later(2), later(3)]);
        listed.retire(later(2)); // while the record is being committed: it still lists 2
        listed.committed(&leaving);
        assert_eq!(listed.unlisted, vec![later(1)]);
        assert_eq!(listed.retired, vec![later(2)]);
        let (records, leaving) = listed.for_record();
        assert_eq!(records, vec![later(3)]);
        listed.committed(&leaving);
        assert_eq!(listed.unlisted, vec![later(1), later(2)]);
        assert!(listed.retired.is_empty());
    }
}
