//! One consumer-group member driving one [`Executor`]: the thin driver of the core.
//!
//! The loop polls the consumer, feeds records, snapshot rows, ticks and watermarks to the executor and
//! carries out its decisions. Rebalance callbacks run inside `poll` on this same thread: a revocation
//! is fed to the executor (which commits what is complete and rolls back the rest) *before* the
//! partitions are unassigned; an assignment is claimed in the store first, so the partitions start at
//! their committed offsets. Failures go to the job's supervisor; a restart keeps the consumer (and so
//! the group membership and assignment) and rebuilds the executor from the store.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context, Result};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tracing::{debug, error, info, warn};

use crate::codec::LogCodec;
use crate::core::{
    CoreError, Decision, Event, Executor, JobSpec, LocalCheckpointPolicy, PartitionId,
    PartitionMap, Phase, Row, ScanId, ScanStart, Supervisor, Verdict, Vnode, WorkerFailure,
    WorkerStatus,
};
use crate::kafka::admin::{cached_high_watermark, client_config};
use crate::metrics::metrics;
use crate::ports::{SnapshotSource, StateStore, StoreError};

/// Messages handled between two looks at the snapshot scan, the clock and the watermarks.
const MAX_MESSAGES_PER_ROUND: usize = 10_000;

/// Opens a state store handle for one worker.
pub type StoreFactory = Arc<dyn Fn() -> Result<Box<dyn StateStore>, StoreError> + Send + Sync>;

/// What the status page and the job runner see of a worker.
#[derive(Clone, Debug, Default)]
pub struct WorkerReport {
    pub status: Option<WorkerStatus>,
    /// Snapshot rows plus log records handled per second (smoothed).
    pub records_per_second: f64,
    /// Partition lag divided by the rate, while the log is being replayed.
    pub estimated_catch_up_seconds: Option<f64>,
    pub caught_up: bool,
    pub last_error: Option<String>,
    pub recreations: u64,
    /// The state store answered the last look (every 0.5 s); `/readyz` is false while it does not.
    pub store_reachable: bool,
    /// When the worker's loop last reported (every 0.5 s while it runs); `/livez` fails when it stops.
    pub reported_at: Option<Instant>,
}

/// Shared between the workers of a process and the HTTP endpoints.
pub type StatusBoard = Arc<Mutex<BTreeMap<String, BTreeMap<String, WorkerReport>>>>;

/// Everything a worker thread needs.
#[derive(Clone)]
pub struct WorkerSetup {
    pub job: String,
    pub topic: String,
    pub worker: String,
    pub kafka: BTreeMap<String, String>,
    pub snapshot: Arc<dyn SnapshotSource>,
    pub codec: Arc<LogCodec>,
    pub open_store: StoreFactory,
    pub local_checkpoint: LocalCheckpointPolicy,
    pub supervisor: Arc<Mutex<Supervisor>>,
    pub shutdown: Arc<AtomicBool>,
    pub board: StatusBoard,
    /// Snapshot rows plus log records per second; 0 = unlimited.
    pub max_rows_per_second: u64,
    /// Alignment back-pressure (librdkafka drops a paused partition's prefetched messages, so pausing
    /// often is costly).
    pub max_epochs_ahead: usize,
}

struct Scan {
    id: ScanId,
    queue: VecDeque<ScanStart>,
    current: Option<Vnode>,
    rows: VecDeque<Row>,
}

struct Inner {
    setup: WorkerSetup,
    map: PartitionMap,
    exec: Option<Executor>,
    store: Box<dyn StateStore>,
    scan: Option<Scan>,
    failure: Option<WorkerFailure>,
    /// Next offset the consumer will deliver per partition, when known.
    position: HashMap<PartitionId, u64>,
    paused_at: HashMap<PartitionId, Instant>,
    last_error: Option<String>,
    /// Whether the state store answered the last generation check.
    store_reachable: bool,
    /// (when, records handled so far, smoothed rate) for the status report.
    rate: (Instant, u64, f64),
    /// Per-record counters, resolved once (label lookups are too slow for the hot path).
    counters: HotCounters,
    committer: crate::kafka::committer::Committer,
}

struct HotCounters {
    /// Indexed by `Op as usize`.
    log_records: Vec<prometheus::IntCounter>,
    snapshot_rows: prometheus::IntCounter,
}

impl HotCounters {
    fn new(job: &str) -> Self {
        let m = metrics();
        HotCounters {
            log_records: crate::core::Op::ALL
                .iter()
                .map(|op| m.log_records.with_label_values(&[job, op.as_str()]))
                .collect(),
            snapshot_rows: m.snapshot_rows.with_label_values(&[job]),
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

type Kc = BaseConsumer<Ctx>;

/// A store error as the supervisor sees it: transient → unavailable (restart, bounded), fencing →
/// fenced, anything else fatal.
fn store_failure(e: StoreError) -> WorkerFailure {
    if e.is_transient() {
        WorkerFailure::Unavailable(e.to_string())
    } else if e.is_fenced() {
        WorkerFailure::Fenced(e.to_string())
    } else {
        WorkerFailure::Fatal(e.to_string())
    }
}

impl Inner {
    fn label(&self) -> [&str; 2] {
        [self.setup.job.as_str(), self.setup.worker.as_str()]
    }

    fn start_executor(&mut self) -> Result<(), WorkerFailure> {
        // A fresh committer: the old one may hold checkpoints of the failed executor.
        let _ = self.committer.drain();
        let store = (self.setup.open_store)().map_err(store_failure)?;
        self.committer = crate::kafka::committer::Committer::start(self.setup.job.clone(), store);
        let info = self.setup.snapshot.info().clone();
        let row = self
            .store
            .ensure_job(&self.setup.job, &info)
            .map_err(store_failure)?;
        let spec = JobSpec {
            topic: self.setup.topic.clone(),
            snapshot_epoch: info.snapshot_epoch,
            map: self.map,
            generation: row.generation,
            worker: self.setup.worker.clone(),
            local_checkpoint: self.setup.local_checkpoint,
            max_epochs_ahead: self.setup.max_epochs_ahead,
        };
        metrics()
            .generation
            .with_label_values(&self.label())
            .set(row.generation as i64);
        self.exec = Some(Executor::new(spec, now_ms()));
        self.scan = None;
        self.paused_at.clear();
        Ok(())
    }

    /// Claims partitions in the store; returns the claims or records the failure.
    fn claim(&mut self, parts: &[PartitionId]) -> Option<Vec<crate::core::ClaimedPartition>> {
        let exec = self.exec.as_ref()?;
        let generation = exec.spec().generation;
        let info = self.setup.snapshot.info().clone();
        match self.store.claim(
            &self.setup.job,
            generation,
            &self.setup.worker,
            parts,
            &info,
        ) {
            Ok(c) => Some(c),
            Err(e) if e.is_transient() => {
                self.fail(WorkerFailure::Unavailable(e.to_string()));
                None
            }
            Err(e) if e.is_fenced() => {
                self.fail(WorkerFailure::Fenced(e.to_string()));
                None
            }
            Err(e) => {
                self.fail(WorkerFailure::Fatal(e.to_string()));
                None
            }
        }
    }

    fn fail(&mut self, f: WorkerFailure) {
        if self.failure.is_none() {
            self.failure = Some(f);
        }
        self.exec = None;
        self.scan = None;
    }

    fn feed(&mut self, consumer: &Kc, event: Event) {
        let Some(exec) = self.exec.as_mut() else {
            return;
        };
        let phase = exec.phase();
        let update =
            matches!(event, Event::Assigned(_) | Event::Revoked(_)) && phase != Phase::Unassigned;
        match exec.handle(event) {
            Ok(ds) => {
                if update {
                    let outcome = if ds.iter().any(|d| matches!(d, Decision::Fail(_))) {
                        "invariant_error"
                    } else {
                        "applied"
                    };
                    metrics()
                        .bitmap_updates
                        .with_label_values(&[&self.setup.job, phase.as_str(), outcome])
                        .inc();
                }
                self.execute(consumer, ds);
            }
            Err(e) => {
                error!(job = %self.setup.job, worker = %self.setup.worker, error = %e, "worker stopped on bad input");
                self.fail(WorkerFailure::Core(e));
            }
        }
    }

    fn tpl(&self, p: PartitionId, offset: Option<u64>) -> TopicPartitionList {
        let mut t = TopicPartitionList::new();
        match offset {
            Some(o) => {
                t.add_partition_offset(&self.setup.topic, p as i32, Offset::Offset(o as i64))
                    .expect("offset");
            }
            None => {
                t.add_partition(&self.setup.topic, p as i32);
            }
        }
        t
    }

    fn execute(&mut self, consumer: &Kc, decisions: Vec<Decision>) {
        let job = self.setup.job.clone();
        for d in decisions {
            match d {
                Decision::Commit(cp) => {
                    // Pipelined: the committer applies it while this thread goes on fetching.
                    self.committer.submit(cp);
                    if !self.settle(consumer, false) {
                        return;
                    }
                }
                Decision::Scan { scan, vnodes } => {
                    self.scan = if vnodes.is_empty() {
                        None
                    } else {
                        Some(Scan {
                            id: scan,
                            queue: vnodes.into(),
                            current: None,
                            rows: VecDeque::new(),
                        })
                    };
                }
                Decision::Fetch { partition, offset } => {
                    debug!(worker = %self.setup.worker, partition, offset, position = ?self.position.get(&partition), "fetch");
                    if self.position.get(&partition) != Some(&offset) {
                        if let Err(e) = seek(consumer, &self.setup.topic, partition, offset) {
                            return self.fail(WorkerFailure::Fenced(format!(
                                "seek partition {partition} to {offset}: {e}"
                            )));
                        }
                        self.position.insert(partition, offset);
                    }
                    let _ = consumer.resume(&self.tpl(partition, None));
                    self.paused_at.remove(&partition);
                }
                Decision::Pause(p) => {
                    debug!(worker = %self.setup.worker, partition = p, "pause");
                    let _ = consumer.pause(&self.tpl(p, None));
                    self.paused_at.insert(p, Instant::now());
                }
                Decision::Resume(p) => {
                    debug!(worker = %self.setup.worker, partition = p, "resume");
                    let _ = consumer.resume(&self.tpl(p, None));
                    if let Some(t) = self.paused_at.remove(&p) {
                        metrics()
                            .alignment_seconds
                            .with_label_values(&[&job])
                            .observe(t.elapsed().as_secs_f64());
                    }
                }
                Decision::PhaseChanged { from, to } => {
                    info!(job = %job, worker = %self.setup.worker, from = from.as_str(), to = to.as_str(), "phase changed");
                    for p in Phase::ALL {
                        metrics()
                            .phase
                            .with_label_values(&[&job, &self.setup.worker, p.as_str()])
                            .set((p == to) as i64);
                    }
                }
                Decision::Fail(e) => {
                    // Invariant 4: the error is raised only after the checkpoint before it is durable.
                    if !self.settle(consumer, true) {
                        return;
                    }
                    if e == CoreError::VnodeBitmapUpdateDuringLogStore {
                        metrics().invariant_errors.with_label_values(&[&job]).inc();
                    }
                    error!(job = %job, worker = %self.setup.worker, "{e}");
                    return self.fail(WorkerFailure::Core(e));
                }
            }
        }
    }

    /// Takes in finished commits (all pending ones when `wait`): metrics and group offsets for each
    /// success; the first failure fails the worker. Returns whether all were successes.
    fn settle(&mut self, consumer: &Kc, wait: bool) -> bool {
        let done = if wait {
            self.committer.drain()
        } else {
            self.committer.finished()
        };
        let job = self.setup.job.clone();
        for d in done {
            let cp = d.checkpoint;
            match d.result {
                Ok(()) => {
                    let m = metrics();
                    m.commit_seconds
                        .with_label_values(&[&job])
                        .observe(d.elapsed.as_secs_f64());
                    m.checkpoints
                        .with_label_values(&[&job, &format!("{:?}", cp.cause).to_lowercase()])
                        .inc();
                    debug!(job = %job, worker = %self.setup.worker, cause = ?cp.cause, epoch = ?cp.epoch, rows = cp.rows.len(), ms = d.elapsed.as_millis() as u64, "committed");
                    if !cp.partitions.is_empty() {
                        let mut tpl = TopicPartitionList::new();
                        for p in &cp.partitions {
                            tpl.add_partition_offset(
                                &self.setup.topic,
                                p.partition as i32,
                                Offset::Offset(p.next_offset as i64),
                            )
                            .expect("offset");
                            if let Some(mut e) =
                                tpl.find_partition(&self.setup.topic, p.partition as i32)
                            {
                                e.set_metadata(format!("epoch={}", p.epoch));
                            }
                        }
                        if let Err(e) = consumer.commit(&tpl, CommitMode::Async) {
                            debug!(error = %e, "group offset commit failed (best effort)");
                        }
                    }
                }
                Err(e) if self.failure.is_some() => {
                    debug!(job = %job, worker = %self.setup.worker, error = %e, "later checkpoint not applied");
                }
                Err(e) if e.is_fenced() => {
                    warn!(job = %job, worker = %self.setup.worker, error = %e, "commit fenced");
                    self.fail(WorkerFailure::Fenced(e.to_string()));
                }
                Err(e) if e.is_transient() => {
                    warn!(job = %job, worker = %self.setup.worker, error = %e, "store unavailable; restarting from the last commit");
                    self.fail(WorkerFailure::Unavailable(e.to_string()));
                }
                Err(e) => {
                    let e = self.describe_rejection(&cp, e);
                    error!(job = %job, worker = %self.setup.worker, error = %e, "checkpoint refused by the store; stopping");
                    self.fail(WorkerFailure::Fatal(e));
                }
            }
        }
        self.failure.is_none()
    }

    /// A store's refusal, with the topic, partition and offset of the row it names (or its snapshot
    /// vnode), so an operator can find the record.
    fn describe_rejection(&self, cp: &crate::core::Checkpoint, e: StoreError) -> String {
        if let StoreError::Value {
            column,
            key,
            reason,
        } = &e
        {
            let row = cp
                .rows
                .iter()
                .find(|m| crate::ports::key_hex(m.key()) == *key);
            if let Some(crate::core::RowMutation::Upsert { vnode, offset, .. }) = row {
                let partition = self.map.partition_of(*vnode);
                return match offset {
                    Some(o) => format!(
                        "topic {}, partition {partition}, offset {o}: the store cannot hold column {column} (key {key}): {reason}",
                        self.setup.topic
                    ),
                    None => format!(
                        "snapshot row of vnode {vnode} (key {key}): the store cannot hold column {column}: {reason}"
                    ),
                };
            }
        }
        e.to_string()
    }

    /// At shutdown: the store's offsets of the owned partitions, committed to the group and waited
    /// for (the per-checkpoint commits are asynchronous and may be lost to a rebalance).
    fn commit_group_offsets_sync(&self, consumer: &Kc) {
        let Some(exec) = &self.exec else { return };
        let mut tpl = TopicPartitionList::new();
        for p in exec.status().partitions {
            if p.committed_epoch.0 > 0 {
                let _ = tpl.add_partition_offset(
                    &self.setup.topic,
                    p.partition as i32,
                    Offset::Offset(p.committed_offset as i64),
                );
                if let Some(mut e) = tpl.find_partition(&self.setup.topic, p.partition as i32) {
                    e.set_metadata(format!("epoch={}", p.committed_epoch));
                }
            }
        }
        if tpl.count() > 0 {
            if let Err(e) = consumer.commit(&tpl, CommitMode::Sync) {
                info!(job = %self.setup.job, worker = %self.setup.worker, error = %e, "final group offset commit failed (best effort; the store holds the offsets)");
            }
        }
    }

    fn on_message(&mut self, consumer: &Kc, m: &BorrowedMessage<'_>) {
        let p = m.partition() as PartitionId;
        let offset = m.offset() as u64;
        tracing::trace!(worker = %self.setup.worker, partition = p, offset, "message");
        self.position.insert(p, offset + 1);
        let Some(exec) = &self.exec else { return };
        if !matches!(exec.phase(), Phase::LogStore | Phase::Streaming) {
            return; // fetched before the pause took effect: read again at Fetch
        }
        match self.setup.codec.decode(m.payload().unwrap_or(&[]), m.key()) {
            Ok(record) => {
                if let crate::core::LogRecord::Change(c) = &record {
                    self.counters.log_records[c.op as usize].inc();
                }
                self.feed(
                    consumer,
                    Event::Record {
                        partition: p,
                        offset,
                        record,
                    },
                )
            }
            Err(e) => {
                metrics()
                    .decode_errors
                    .with_label_values(&[&self.setup.job])
                    .inc();
                self.feed(
                    consumer,
                    Event::Undecodable {
                        partition: p,
                        offset,
                        reason: e.to_string(),
                    },
                );
            }
        }
    }

    /// Feeds up to `max` snapshot rows; returns whether a scan is active.
    fn scan_batch(&mut self, consumer: &Kc, max: usize) -> bool {
        for _ in 0..max {
            let Some(scan) = self.scan.as_mut() else {
                return false;
            };
            let id = scan.id;
            if scan.current.is_none() {
                let Some(start) = scan.queue.pop_front() else {
                    self.scan = None;
                    return false;
                };
                let rows = self
                    .setup
                    .snapshot
                    .scan(start.vnode, start.after.as_deref())
                    .and_then(|it| it.collect::<Result<VecDeque<Row>, _>>());
                let scan = self.scan.as_mut().expect("scan");
                match rows {
                    Ok(rows) => {
                        scan.current = Some(start.vnode);
                        scan.rows = rows;
                    }
                    Err(e) => {
                        self.fail(WorkerFailure::Fatal(e.to_string()));
                        return false;
                    }
                }
            }
            let scan = self.scan.as_mut().expect("scan");
            let vnode = scan.current.expect("current");
            let event = match scan.rows.pop_front() {
                Some(row) => {
                    self.counters.snapshot_rows.inc();
                    Event::SnapshotRow {
                        scan: id,
                        vnode,
                        row,
                    }
                }
                None => {
                    scan.current = None;
                    Event::SnapshotVnodeDone { scan: id, vnode }
                }
            };
            self.feed(consumer, event);
            if self.failure.is_some() {
                return false;
            }
        }
        self.scan.is_some()
    }

    /// Watermarks, the generation check and the status report.
    fn housekeeping(&mut self, consumer: &Kc, watermarks: bool) {
        let Some(exec) = &self.exec else { return };
        let generation = exec.spec().generation;
        let owned = exec.owned_partitions();
        let log_phase = matches!(exec.phase(), Phase::LogStore | Phase::Streaming);
        if watermarks {
            match self.store.job(&self.setup.job) {
                Ok(Some(row)) if row.generation != generation => {
                    info!(job = %self.setup.job, worker = %self.setup.worker, from = generation, to = row.generation, "job was recreated; restarting");
                    return self.fail(WorkerFailure::Fenced(format!(
                        "job recreated: generation {generation} -> {}",
                        row.generation
                    )));
                }
                Ok(_) => {
                    if !self.store_reachable {
                        info!(job = %self.setup.job, worker = %self.setup.worker, "state store reachable again");
                    }
                    self.store_reachable = true;
                    metrics()
                        .store_unreachable
                        .with_label_values(&self.label())
                        .set(0);
                }
                Err(e) => {
                    if self.store_reachable {
                        warn!(job = %self.setup.job, worker = %self.setup.worker, error = %e, "state store unreachable");
                    }
                    self.store_reachable = false;
                    metrics()
                        .store_unreachable
                        .with_label_values(&self.label())
                        .set(1);
                    self.last_error = Some(e.to_string());
                }
            }
            if log_phase {
                for p in owned {
                    // The watermark of the last fetch response; a partition not fetched yet (paused
                    // from the start) is asked over the network.
                    let high =
                        cached_high_watermark(consumer.client(), &self.setup.topic, p as i32)
                            .or_else(|| {
                                consumer
                                    .fetch_watermarks(
                                        &self.setup.topic,
                                        p as i32,
                                        Duration::from_secs(2),
                                    )
                                    .ok()
                                    .map(|(_, h)| h as u64)
                            });
                    if let Some(high) = high {
                        self.feed(consumer, Event::Watermark { partition: p, high });
                    }
                    self.report_read_position(consumer, p);
                }
            }
            self.publish();
        }
        self.feed(consumer, Event::Tick { now_ms: now_ms() });
    }

    /// Tells the executor how far the consumer has read `p` when that is past the last record it
    /// returned (transaction markers and aborted records are never returned), and only once every
    /// returned record has been fed.
    fn report_read_position(&mut self, consumer: &Kc, p: PartitionId) {
        let Some(exec) = &self.exec else { return };
        let fed = exec
            .status()
            .partitions
            .iter()
            .find(|s| s.partition == p)
            .map(|s| s.next_offset);
        let delivered = self.position.get(&p).copied();
        let Some(read) = crate::check_log::consumer_position(consumer, &self.setup.topic, p) else {
            return;
        };
        if fed.is_some() && fed == delivered && read > fed.unwrap_or(0) {
            self.position.insert(p, read);
            self.feed(
                consumer,
                Event::ReadTo {
                    partition: p,
                    next_offset: read,
                },
            );
        }
    }

    fn publish(&mut self) {
        let status = self.exec.as_ref().map(|e| e.status());
        let handled = status.as_ref().map_or(0, |s| {
            s.counters.snapshot_rows + s.counters.changes.iter().sum::<u64>() + s.counters.barriers
        });
        let (then, before, ewma) = self.rate;
        let dt = then.elapsed().as_secs_f64();
        if dt >= 0.5 {
            let now_rate = handled.saturating_sub(before) as f64 / dt;
            self.rate = (
                Instant::now(),
                handled,
                if ewma == 0.0 {
                    now_rate
                } else {
                    0.7 * ewma + 0.3 * now_rate
                },
            );
        }
        let records_per_second = self.rate.2;
        let lag: u64 = status.as_ref().map_or(0, |s| {
            s.partitions
                .iter()
                .filter_map(|p| {
                    p.high_watermark
                        .map(|h| h.saturating_sub(p.committed_offset))
                })
                .sum()
        });
        let estimated_catch_up_seconds = match status.as_ref().map(|s| s.phase) {
            Some(Phase::LogStore | Phase::Streaming) if records_per_second > 0.0 => {
                Some(lag as f64 / records_per_second)
            }
            Some(Phase::Streaming) => Some(0.0),
            _ => None,
        };
        let m = metrics();
        if let Some(s) = &status {
            m.epoch_lag_seconds
                .with_label_values(&self.label())
                .set(s.epoch_lag_seconds);
            for p in &s.partitions {
                if let Some(h) = p.high_watermark {
                    m.partition_lag
                        .with_label_values(&[&self.setup.job, &p.partition.to_string()])
                        .set(h.saturating_sub(p.committed_offset) as i64);
                }
            }
        }
        let caught_up = status.as_ref().is_some_and(|s| s.caught_up);
        let recreations = self.setup.supervisor.lock().unwrap().recreations();
        let mut board = self.setup.board.lock().unwrap();
        board.entry(self.setup.job.clone()).or_default().insert(
            self.setup.worker.clone(),
            WorkerReport {
                status,
                records_per_second,
                estimated_catch_up_seconds,
                caught_up,
                last_error: self.last_error.clone(),
                recreations,
                store_reachable: self.store_reachable,
                reported_at: Some(Instant::now()),
            },
        );
    }
}

/// Seeks under [`Backoff::SEEK`](crate::core::retry::Backoff::SEEK): librdkafka refuses a seek
/// until the partition's fetcher is set up, and while the broker is briefly away.
fn seek(consumer: &Kc, topic: &str, p: PartitionId, offset: u64) -> KafkaResult<()> {
    crate::retry::retry_sleeping(
        crate::core::retry::Backoff::SEEK,
        || {
            consumer.seek(
                topic,
                p as i32,
                Offset::Offset(offset as i64),
                Duration::from_secs(1),
            )
        },
        |_| true,
    )
}

/// The consumer context: turns rebalance callbacks into core events, in the callback.
pub struct Ctx {
    inner: Arc<Mutex<Inner>>,
}

impl ClientContext for Ctx {
    /// librdkafka's own errors (a broker away, authentication): visible in `/status` `last_error`
    /// and counted while they last; librdkafka reconnects by itself.
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        warn!(error = %error, reason, "Kafka client error");
        let mut inner = self.inner.lock().unwrap();
        metrics()
            .kafka_errors
            .with_label_values(&[&inner.setup.job])
            .inc();
        inner.last_error = Some(format!("Kafka: {reason}"));
        if error.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::Fatal) {
            // E.g. FENCED_INSTANCE_ID: another member took this group.instance.id. librdkafka
            // will not recover; the worker stops (and the process exits, failing /livez).
            let fenced = reason.contains("FENCED_INSTANCE_ID") || reason.contains("instance");
            inner.fail(WorkerFailure::Fatal(format!(
                "fatal Kafka error: {reason}{}",
                if fenced {
                    "; another consumer joined with this worker's group.instance.id — give every worker a distinct one"
                } else {
                    ""
                }
            )));
        }
    }
}

impl ConsumerContext for Ctx {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let mut inner = self.inner.lock().unwrap();
        let topic = inner.setup.topic.clone();
        let parts: Vec<PartitionId> = tpl
            .elements_for_topic(&topic)
            .iter()
            .map(|e| e.partition() as PartitionId)
            .collect();
        let ranges = inner.map.bitmap_of(parts.iter().copied()).ranges();
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                info!(job = %inner.setup.job, worker = %inner.setup.worker, partitions = ?parts, vnodes = ?ranges, "partitions assigned");
                let claims = inner.claim(&parts);
                if let Some(claims) = &claims {
                    for c in claims {
                        let _ = tpl.set_partition_offset(
                            &topic,
                            c.partition as i32,
                            Offset::Offset(c.progress.next_offset as i64),
                        );
                        inner.position.insert(c.partition, c.progress.next_offset);
                    }
                } else {
                    for p in &parts {
                        inner.position.remove(p);
                    }
                }
                if let Err(e) = consumer.incremental_assign(tpl) {
                    error!(error = %e, "incremental_assign failed");
                }
                if let Some(claims) = claims {
                    inner.feed(consumer, Event::Assigned(claims));
                    inner.settle(consumer, true);
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let lost = consumer.assignment_lost();
                info!(job = %inner.setup.job, worker = %inner.setup.worker, partitions = ?parts, vnodes = ?ranges, lost, "partitions revoked");
                inner.feed(consumer, Event::Revoked(parts.clone()));
                // Commit → acknowledge: what the revocation committed is durable before unassigning.
                inner.settle(consumer, true);
                for p in &parts {
                    inner.position.remove(p);
                    inner.paused_at.remove(p);
                    // Its new owner reports its lag; a stale series here would double it.
                    let _ = metrics()
                        .partition_lag
                        .remove_label_values(&[&inner.setup.job, &p.to_string()]);
                }
                if let Err(e) = consumer.incremental_unassign(tpl) {
                    error!(error = %e, "incremental_unassign failed");
                }
            }
            other => error!(error = ?other, "rebalance error"),
        }
    }
}

/// Runs one worker until shutdown or a failure the supervisor will not retry.
pub fn run_worker(setup: WorkerSetup) -> Result<()> {
    let map = PartitionMap::new(
        setup.snapshot.info().vnode_count,
        setup.snapshot.info().partition_count,
    )?;
    let store = (setup.open_store)()
        .with_context(|| format!("opening the state store of job {}", setup.job))?;
    let inner = Arc::new(Mutex::new(Inner {
        setup: setup.clone(),
        map,
        exec: None,
        store,
        scan: None,
        failure: None,
        position: HashMap::new(),
        paused_at: HashMap::new(),
        last_error: None,
        store_reachable: true,
        rate: (Instant::now(), 0, 0.0),
        counters: HotCounters::new(&setup.job),
        committer: crate::kafka::committer::Committer::start(
            setup.job.clone(),
            (setup.open_store)()
                .with_context(|| format!("opening the state store of job {}", setup.job))?,
        ),
    }));
    if let Err(f) = inner.lock().unwrap().start_executor() {
        return Err(anyhow!("{f}"));
    }
    let mut config = client_config(&setup.kafka);
    for (k, v, _) in crate::kafka::MANAGED_CONSUMER_KEYS {
        config.set(k, v);
    }
    if !setup.kafka.contains_key("fetch.wait.max.ms") {
        // A default, not managed: short fetch waits keep alignment and catch-up responsive.
        config.set("fetch.wait.max.ms", "100");
    }
    if !setup.kafka.contains_key("group.id") {
        config.set("group.id", format!("kafka-backfill-{}", setup.job));
    }
    let consumer: Kc = config
        .create_with_context(Ctx {
            inner: inner.clone(),
        })
        .with_context(|| format!("creating the consumer of job {}", setup.job))?;
    consumer
        .subscribe(&[&setup.topic])
        .with_context(|| format!("subscribing to {}", setup.topic))?;
    info!(job = %setup.job, worker = %setup.worker, topic = %setup.topic, "worker started");
    let mut last_house = Instant::now() - Duration::from_secs(10);
    loop {
        if setup.shutdown.load(Ordering::SeqCst) {
            let mut g = inner.lock().unwrap();
            g.feed(&consumer, Event::Shutdown);
            g.settle(&consumer, true);
            g.commit_group_offsets_sync(&consumer);
            g.exec = None;
            drop(g);
            if setup.kafka.contains_key("group.instance.id") {
                // A static member closes without leaving the group (dropping the consumer closes
                // it): restarted within session.timeout.ms it gets its partitions back with no
                // rebalance, so a log-store phase survives a rolling restart.
                info!(job = %setup.job, worker = %setup.worker, "worker stopped (static member: the group keeps its partitions)");
                return Ok(());
            }
            consumer.unsubscribe();
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                let _ = consumer.poll(Duration::from_millis(50));
            }
            info!(job = %setup.job, worker = %setup.worker, "worker stopped");
            return Ok(());
        }
        let scanning = inner.lock().unwrap().scan.is_some();
        // Drain what librdkafka has fetched (the first poll may wait a little when idle).
        let mut timeout = if scanning {
            Duration::ZERO
        } else {
            Duration::from_millis(50)
        };
        let budget = match setup.max_rows_per_second {
            0 => MAX_MESSAGES_PER_ROUND,
            r => (r as usize / 20).max(1),
        };
        if setup.max_rows_per_second > 0 {
            std::thread::sleep(Duration::from_millis(50));
        }
        for _ in 0..budget {
            let Some(msg) = consumer.poll(timeout) else {
                break;
            };
            timeout = Duration::ZERO;
            let mut g = inner.lock().unwrap();
            match msg {
                Ok(m) => g.on_message(&consumer, &m),
                Err(e) => {
                    warn!(job = %setup.job, worker = %setup.worker, error = %e, "consumer error")
                }
            }
            if g.failure.is_some() {
                break;
            }
        }
        let mut g = inner.lock().unwrap();
        g.settle(&consumer, false);
        if g.failure.is_none() {
            g.scan_batch(&consumer, budget.min(1_000));
        }
        let due = last_house.elapsed() >= Duration::from_millis(500);
        if due {
            last_house = Instant::now();
        }
        g.housekeeping(&consumer, due);
        if let Some(f) = g.failure.take() {
            let generation = g
                .store
                .job(&setup.job)
                .ok()
                .flatten()
                .map_or(0, |r| r.generation);
            g.last_error = Some(f.to_string());
            g.publish();
            drop(g);
            handle_failure(&setup, &inner, &consumer, f, generation)?;
        }
    }
}

fn handle_failure(
    setup: &WorkerSetup,
    inner: &Arc<Mutex<Inner>>,
    consumer: &Kc,
    f: WorkerFailure,
    generation: u64,
) -> Result<()> {
    let verdict = setup
        .supervisor
        .lock()
        .unwrap()
        .on_failure(&f, generation, now_ms());
    match verdict {
        Verdict::Stop { reason } => {
            error!(job = %setup.job, worker = %setup.worker, %reason, "job stopped");
            Err(anyhow!("job {} stopped: {reason}", setup.job))
        }
        Verdict::Recreate {
            from_generation,
            backoff_ms,
        } => {
            let row = inner
                .lock()
                .unwrap()
                .store
                .recreate(&setup.job, from_generation)?;
            if row.generation == from_generation + 1 {
                metrics()
                    .recreations
                    .with_label_values(&[&setup.job, "vnode_bitmap_update_in_log_store"])
                    .inc();
            }
            info!(job = %setup.job, worker = %setup.worker, generation = row.generation, recreations = row.recreations, backoff_ms, "recreating the job: backfill restarts from the snapshot under the new assignment");
            pause_then_restart(setup, inner, consumer, Duration::from_millis(backoff_ms))
        }
        Verdict::Restart { backoff_ms } => {
            info!(job = %setup.job, worker = %setup.worker, reason = %f, backoff_ms, "restarting the worker from the store");
            pause_then_restart(setup, inner, consumer, Duration::from_millis(backoff_ms))
        }
    }
}

fn pause_then_restart(
    setup: &WorkerSetup,
    inner: &Arc<Mutex<Inner>>,
    consumer: &Kc,
    backoff: Duration,
) -> Result<()> {
    let mut backoff = backoff;
    let mut g = loop {
        let until = Instant::now() + backoff;
        while Instant::now() < until && !setup.shutdown.load(Ordering::SeqCst) {
            // Keep serving the group (heartbeats, callbacks) while backing off; the executor is
            // gone, so callbacks only (un)assign.
            let _ = consumer.poll(Duration::from_millis(20));
        }
        let mut g = inner.lock().unwrap();
        match g.start_executor() {
            Ok(()) => break g,
            Err(f) => {
                g.last_error = Some(f.to_string());
                g.publish();
                drop(g);
                // The store is still away (or worse): the supervisor decides, within its bound.
                match setup.supervisor.lock().unwrap().on_failure(&f, 0, now_ms()) {
                    Verdict::Restart { backoff_ms } => {
                        warn!(job = %setup.job, worker = %setup.worker, reason = %f, backoff_ms, "restart failed; retrying");
                        backoff = Duration::from_millis(backoff_ms);
                    }
                    Verdict::Stop { reason } => {
                        error!(job = %setup.job, worker = %setup.worker, %reason, "job stopped");
                        return Err(anyhow!("job {} stopped: {reason}", setup.job));
                    }
                    Verdict::Recreate { .. } => return Err(anyhow!("{f}")),
                }
            }
        }
    };
    let assigned: Vec<PartitionId> = consumer
        .assignment()
        .map(|t| {
            t.elements_for_topic(&setup.topic)
                .iter()
                .map(|e| e.partition() as PartitionId)
                .collect()
        })
        .unwrap_or_default();
    g.position.clear();
    if !assigned.is_empty() {
        if let Some(claims) = g.claim(&assigned) {
            g.feed(consumer, Event::Assigned(claims));
        }
    }
    Ok(())
}
