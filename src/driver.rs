//! The one worker loop: one consumer-group member driving one [`Executor`], generic over its ports
//! ([`ConsumerPort`], [`CommitPort`], [`Clock`]). `kafka::worker` runs it on librdkafka and the
//! committer thread; `sim` runs the very same loop on simulated members, commits that complete when
//! the simulator decides, and a simulated clock.
//!
//! Each [`Driver::step`] polls records and group events, feeds them to the executor and carries out its
//! decisions, advances the snapshot scan, and every `housekeeping_ms` looks at watermarks, the store's
//! generation and publishes the status. Ordering contract (invariant 4 and `CommitPort`): a
//! revocation is fed to the executor, which commits what is complete; the loop waits for every
//! pending commit, and only then acknowledges the revocation (`unassign`). An assignment is claimed
//! in the store first, so partitions start at their committed offsets. The invariant error is
//! raised only after the commits before it are durable. Failures go to the job's supervisor; a
//! restart keeps the consumer (and so the group membership and assignment) and rebuilds the
//! executor from the store.
//!
//! The loop owns no decision (the core does) and does no I/O of its own: everything goes through the
//! ports and the [`StateStore`].

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tracing::{debug, error, info, warn};

use crate::core::{
    ClaimedPartition, CoreError, Decision, Event, Executor, JobSpec, LocalCheckpointPolicy,
    LogRecord, PartitionId, PartitionMap, PartitionProgress, Phase, Rate, Row, ScanId, ScanStart,
    Supervisor, Throttle, Verdict, Vnode, WorkerFailure, WorkerStatus,
};
use crate::ports::{
    Clock, CommitDone, CommitPort, ConsumerPort, Polled, SnapshotSource, StateStore, StoreError,
};
use crate::service::metrics::metrics;
pub use crate::service::status::{StatusBoard, WorkerReport};

/// The loop's settings.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    pub job: String,
    pub topic: String,
    pub worker: String,
    pub local_checkpoint: LocalCheckpointPolicy,
    /// Alignment back-pressure (see `JobSpec::max_epochs_ahead`).
    pub max_epochs_ahead: usize,
    /// Snapshot rows plus log records per second; 0 = unlimited.
    pub max_rows_per_second: u64,
    /// Records handled between two looks at the scan, the clock and the watermarks.
    pub max_messages_per_round: usize,
    /// Snapshot rows fed per step, at most.
    pub max_scan_rows_per_round: usize,
    /// The first poll of a step waits this long when no scan is running.
    pub idle_poll_ms: u64,
    /// How often watermarks, the generation check and the status report run.
    pub housekeeping_ms: u64,
    /// A static member closes without leaving the group.
    pub static_member: bool,
}

/// The job stopped: the supervisor will not retry this worker's failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopped {
    pub job: String,
    pub reason: String,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "job {} stopped: {}", self.job, self.reason)
    }
}

impl std::error::Error for Stopped {}

/// What one driver did, for the simulation's report (production reads metrics instead).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverStats {
    pub commits: u64,
    pub fenced: u64,
    pub recreations: u64,
    /// Invariant errors raised, by the phase the worker was in.
    pub bitmap_errors_by_phase: BTreeMap<Phase, u64>,
    /// Vnode-bitmap updates (assignments and revocations) by the phase the worker was in.
    pub updates_by_phase: BTreeMap<Phase, u64>,
    pub phases_seen: BTreeSet<Phase>,
}

struct Scan {
    id: ScanId,
    queue: VecDeque<ScanStart>,
    current: Option<Vnode>,
    rows: VecDeque<Row>,
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

/// A store error as the supervisor sees it: transient → unavailable (restart, bounded), fencing →
/// fenced, anything else fatal.
pub fn store_failure(e: StoreError) -> WorkerFailure {
    if e.is_transient() {
        WorkerFailure::Unavailable(e.to_string())
    } else if e.is_fenced() {
        WorkerFailure::Fenced(e.to_string())
    } else {
        WorkerFailure::Fatal(e.to_string())
    }
}

/// One worker: the loop's state and its ports.
pub struct Driver<C: ConsumerPort, K: CommitPort, T: Clock> {
    cfg: DriverConfig,
    consumer: C,
    committer: K,
    clock: T,
    store: Box<dyn StateStore>,
    snapshot: Arc<dyn SnapshotSource>,
    supervisor: Arc<Mutex<Supervisor>>,
    board: StatusBoard,
    map: PartitionMap,
    exec: Option<Executor>,
    scan: Option<Scan>,
    failure: Option<WorkerFailure>,
    /// Next offset the consumer will deliver per partition, when known.
    position: HashMap<PartitionId, u64>,
    /// When each paused partition was paused (ms).
    paused_at: HashMap<PartitionId, u64>,
    last_error: Option<String>,
    store_reachable: bool,
    /// Records handled per second, for the status report.
    rate: Rate,
    /// The rows-per-second limit.
    throttle: Throttle,
    counters: HotCounters,
    last_house: Option<u64>,
    /// While backing off before a restart: when to restart.
    restart_at: Option<u64>,
    stats: DriverStats,
}

impl<C: ConsumerPort, K: CommitPort, T: Clock> Driver<C, K, T> {
    /// A worker with its executor started from the store.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: DriverConfig,
        consumer: C,
        committer: K,
        clock: T,
        store: Box<dyn StateStore>,
        snapshot: Arc<dyn SnapshotSource>,
        supervisor: Arc<Mutex<Supervisor>>,
        board: StatusBoard,
    ) -> Result<Self, WorkerFailure> {
        let info = snapshot.info();
        let map = PartitionMap::new(info.vnode_count, info.partition_count)
            .map_err(|e| WorkerFailure::Fatal(e.to_string()))?;
        let now = clock.now_ms();
        let counters = HotCounters::new(&cfg.job);
        let cfg_limit = cfg.max_rows_per_second;
        let mut d = Driver {
            cfg,
            consumer,
            committer,
            clock,
            store,
            snapshot,
            supervisor,
            board,
            map,
            exec: None,
            scan: None,
            failure: None,
            position: HashMap::new(),
            paused_at: HashMap::new(),
            last_error: None,
            store_reachable: true,
            rate: Rate::new(now, 500),
            throttle: Throttle::new(cfg_limit, now),
            counters,
            last_house: None,
            restart_at: None,
            stats: DriverStats::default(),
        };
        d.start_executor()?;
        Ok(d)
    }

    pub fn phase(&self) -> Option<Phase> {
        self.exec.as_ref().map(|e| e.phase())
    }

    pub fn status(&self) -> Option<WorkerStatus> {
        self.exec.as_ref().map(|e| e.status())
    }

    pub fn stats(&self) -> &DriverStats {
        &self.stats
    }

    /// Whether the worker is backing off before a restart.
    pub fn restarting(&self) -> bool {
        self.restart_at.is_some()
    }

    /// One round of the loop. `Err` when the job stopped.
    pub fn step(&mut self) -> Result<(), Stopped> {
        if let Some(at) = self.restart_at {
            // Keep serving the group (heartbeats, rebalances) while backing off; with no executor,
            // events only (un)assign.
            if let Some(p) = self.consumer.poll(20) {
                self.on_polled(p);
            }
            if self.clock.now_ms() < at {
                return Ok(());
            }
            self.restart_at = None;
            return self.restart();
        }
        let scanning = self.scan.is_some();
        let mut timeout = if scanning { 0 } else { self.cfg.idle_poll_ms };
        // The throttle (a token bucket in the core) says how many records this round may handle.
        let want = self.cfg.max_messages_per_round;
        let mut budget = self.throttle.allowance(self.clock.now_ms(), want);
        if budget == 0 {
            let wait = self.throttle.wait_ms();
            self.clock.sleep_ms(wait);
            budget = self.throttle.allowance(self.clock.now_ms(), want);
        }
        let mut records = 0;
        while records < budget {
            let Some(p) = self.consumer.poll(timeout) else {
                break;
            };
            timeout = 0;
            records += matches!(p, Polled::Record { .. }) as usize;
            self.on_polled(p);
            if self.failure.is_some() {
                break;
            }
        }
        self.settle(false);
        let mut rows = 0;
        if self.failure.is_none() {
            let scan_budget = if self.throttle.limit() == 0 {
                self.cfg.max_scan_rows_per_round
            } else {
                budget
                    .saturating_sub(records)
                    .min(self.cfg.max_scan_rows_per_round)
            };
            rows = self.scan_batch(scan_budget);
        }
        self.throttle.spend(records + rows);
        let now = self.clock.now_ms();
        let due = self
            .last_house
            .is_none_or(|t| now.saturating_sub(t) >= self.cfg.housekeeping_ms);
        if due {
            self.last_house = Some(now);
        }
        self.housekeeping(due);
        if let Some(f) = self.failure.take() {
            return self.handle_failure(f);
        }
        Ok(())
    }

    /// Shutdown: commit what is complete, wait for it, hand the offsets to the group, close.
    pub fn shutdown(&mut self) {
        self.feed(Event::Shutdown);
        self.settle(true);
        self.commit_group_offsets_sync();
        self.exec = None;
        self.consumer.close(!self.cfg.static_member);
        if self.cfg.static_member {
            // Closed without leaving the group: restarted within session.timeout.ms it gets its
            // partitions back with no rebalance, so a log-store phase survives a rolling restart.
            info!(job = %self.cfg.job, worker = %self.cfg.worker, "worker stopped (static member: the group keeps its partitions)");
        } else {
            info!(job = %self.cfg.job, worker = %self.cfg.worker, "worker stopped");
        }
    }

    fn label(&self) -> [&str; 2] {
        [self.cfg.job.as_str(), self.cfg.worker.as_str()]
    }

    fn start_executor(&mut self) -> Result<(), WorkerFailure> {
        // A fresh committer: the old one may hold checkpoints of the failed executor.
        self.committer.restart().map_err(store_failure)?;
        let info = self.snapshot.info().clone();
        let row = self
            .store
            .ensure_job(&self.cfg.job, &info)
            .map_err(store_failure)?;
        let spec = JobSpec {
            topic: self.cfg.topic.clone(),
            snapshot_epoch: info.snapshot_epoch,
            map: self.map,
            generation: row.generation,
            worker: self.cfg.worker.clone(),
            local_checkpoint: self.cfg.local_checkpoint,
            max_epochs_ahead: self.cfg.max_epochs_ahead,
        };
        metrics()
            .generation
            .with_label_values(&self.label())
            .set(row.generation as i64);
        self.exec = Some(Executor::new(spec, self.clock.now_ms()));
        self.scan = None;
        self.paused_at.clear();
        Ok(())
    }

    /// Claims partitions in the store; returns the claims or records the failure.
    fn claim(&mut self, parts: &[PartitionId]) -> Option<Vec<ClaimedPartition>> {
        let exec = self.exec.as_ref()?;
        let generation = exec.spec().generation;
        let info = self.snapshot.info().clone();
        match self
            .store
            .claim(&self.cfg.job, generation, &self.cfg.worker, parts, &info)
        {
            Ok(c) => Some(c),
            Err(e) => {
                self.fail(store_failure(e));
                None
            }
        }
    }

    fn fail(&mut self, f: WorkerFailure) {
        if self.failure.is_none() {
            if matches!(f, WorkerFailure::Fenced(_)) {
                self.stats.fenced += 1;
            }
            self.failure = Some(f);
        }
        self.exec = None;
        self.scan = None;
    }

    fn on_polled(&mut self, polled: Polled) {
        match polled {
            Polled::Record {
                partition,
                offset,
                record,
            } => self.on_record(partition, offset, record),
            Polled::Assigned(parts) => self.on_assigned(parts),
            Polled::Revoked { partitions, lost } => self.on_revoked(partitions, lost),
            Polled::ClientError { reason, fatal } => {
                warn!(job = %self.cfg.job, worker = %self.cfg.worker, %reason, "Kafka client error");
                self.last_error = Some(format!("Kafka: {reason}"));
                if fatal {
                    self.fail(WorkerFailure::Fatal(format!("fatal Kafka error: {reason}")));
                }
            }
        }
    }

    /// The group gives partitions: claim them in the store, start them at the claimed offsets,
    /// then tell the executor.
    fn on_assigned(&mut self, parts: Vec<PartitionId>) {
        let ranges = self.map.bitmap_of(parts.iter().copied()).ranges();
        info!(job = %self.cfg.job, worker = %self.cfg.worker, partitions = ?parts, vnodes = ?ranges, "partitions assigned");
        let claims = self.claim(&parts);
        let starts: Vec<(PartitionId, Option<u64>)> = match &claims {
            Some(claims) => claims
                .iter()
                .map(|c| {
                    self.position.insert(c.partition, c.progress.next_offset);
                    (c.partition, Some(c.progress.next_offset))
                })
                .collect(),
            None => parts
                .iter()
                .map(|p| {
                    self.position.remove(p);
                    (*p, None)
                })
                .collect(),
        };
        self.consumer.assign(&starts);
        if let Some(claims) = claims {
            self.feed(Event::Assigned(claims));
            self.settle(true);
        }
    }

    /// The group takes partitions: the executor commits what is complete and rolls back the rest;
    /// the revocation is acknowledged only once those commits are durable.
    fn on_revoked(&mut self, parts: Vec<PartitionId>, lost: bool) {
        let ranges = self.map.bitmap_of(parts.iter().copied()).ranges();
        info!(job = %self.cfg.job, worker = %self.cfg.worker, partitions = ?parts, vnodes = ?ranges, lost, "partitions revoked");
        self.feed(Event::Revoked(parts.clone()));
        // Commit → acknowledge: what the revocation committed is durable before unassigning.
        let ack_early =
            crate::core::faults::active(crate::core::faults::Fault::AckRevocationBeforeCommit);
        self.settle(!ack_early);
        for p in &parts {
            self.position.remove(p);
            self.paused_at.remove(p);
            // Its new owner reports its lag; a stale series here would double it.
            let _ = metrics()
                .partition_lag
                .remove_label_values(&[&self.cfg.job, &p.to_string()]);
        }
        self.consumer.unassign(&parts);
    }

    fn on_record(
        &mut self,
        partition: PartitionId,
        offset: u64,
        record: Result<LogRecord, String>,
    ) {
        tracing::trace!(worker = %self.cfg.worker, partition, offset, "message");
        self.position.insert(partition, offset + 1);
        let Some(exec) = &self.exec else { return };
        if !matches!(exec.phase(), Phase::LogStore | Phase::Streaming) {
            return; // fetched before the pause took effect: read again at Fetch
        }
        match record {
            Ok(record) => {
                if let LogRecord::Change(c) = &record {
                    self.counters.log_records[c.op as usize].inc();
                }
                self.feed(Event::Record {
                    partition,
                    offset,
                    record,
                })
            }
            Err(reason) => {
                metrics()
                    .decode_errors
                    .with_label_values(&[&self.cfg.job])
                    .inc();
                self.feed(Event::Undecodable {
                    partition,
                    offset,
                    reason,
                });
            }
        }
    }

    fn feed(&mut self, event: Event) {
        let Some(exec) = self.exec.as_mut() else {
            return;
        };
        let phase = exec.phase();
        let update =
            matches!(event, Event::Assigned(_) | Event::Revoked(_)) && phase != Phase::Unassigned;
        match exec.handle(event) {
            Ok(ds) => {
                if update {
                    *self.stats.updates_by_phase.entry(phase).or_default() += 1;
                    let outcome = if ds.iter().any(|d| matches!(d, Decision::Fail(_))) {
                        "invariant_error"
                    } else {
                        "applied"
                    };
                    metrics()
                        .bitmap_updates
                        .with_label_values(&[&self.cfg.job, phase.as_str(), outcome])
                        .inc();
                }
                self.execute(phase, ds);
            }
            Err(e) => {
                error!(job = %self.cfg.job, worker = %self.cfg.worker, error = %e, "worker stopped on bad input");
                self.fail(WorkerFailure::Core(e));
            }
        }
    }

    fn execute(&mut self, phase_before: Phase, decisions: Vec<Decision>) {
        for d in decisions {
            match d {
                Decision::Commit(cp) => {
                    // Pipelined: the committer applies it while this loop goes on fetching.
                    self.committer.submit(cp);
                    if !self.settle(false) {
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
                    debug!(worker = %self.cfg.worker, partition, offset, position = ?self.position.get(&partition), "fetch");
                    if self.position.get(&partition) != Some(&offset) {
                        if let Err(e) = self.consumer.seek(partition, offset) {
                            return self.fail(WorkerFailure::Unavailable(format!(
                                "seek partition {partition} to {offset}: {e}"
                            )));
                        }
                        self.position.insert(partition, offset);
                    }
                    self.consumer.resume(partition);
                    self.paused_at.remove(&partition);
                }
                Decision::Pause(p) => {
                    debug!(worker = %self.cfg.worker, partition = p, "pause");
                    self.consumer.pause(p);
                    self.paused_at.insert(p, self.clock.now_ms());
                }
                Decision::Resume(p) => {
                    debug!(worker = %self.cfg.worker, partition = p, "resume");
                    self.consumer.resume(p);
                    if let Some(t) = self.paused_at.remove(&p) {
                        metrics()
                            .alignment_seconds
                            .with_label_values(&[&self.cfg.job])
                            .observe(self.clock.now_ms().saturating_sub(t) as f64 / 1000.0);
                    }
                }
                Decision::PhaseChanged { from, to } => {
                    info!(job = %self.cfg.job, worker = %self.cfg.worker, from = from.as_str(), to = to.as_str(), "phase changed");
                    self.stats.phases_seen.insert(to);
                    for p in Phase::ALL {
                        metrics()
                            .phase
                            .with_label_values(&[&self.cfg.job, &self.cfg.worker, p.as_str()])
                            .set((p == to) as i64);
                    }
                }
                Decision::Fail(e) => {
                    // Invariant 4: the error is raised only after the checkpoint before it is durable.
                    if !self.settle(true) {
                        return;
                    }
                    if e == CoreError::VnodeBitmapUpdateDuringLogStore {
                        metrics()
                            .invariant_errors
                            .with_label_values(&[&self.cfg.job])
                            .inc();
                        *self
                            .stats
                            .bitmap_errors_by_phase
                            .entry(phase_before)
                            .or_default() += 1;
                    }
                    error!(job = %self.cfg.job, worker = %self.cfg.worker, "{e}");
                    return self.fail(WorkerFailure::Core(e));
                }
            }
        }
    }

    /// Takes in finished commits (all pending ones when `wait`): metrics and group offsets for each
    /// success; the first failure fails the worker. Returns whether all were successes.
    fn settle(&mut self, wait: bool) -> bool {
        let done = if wait {
            self.committer.drain()
        } else {
            self.committer.finished()
        };
        for d in done {
            self.on_commit_done(d);
        }
        self.failure.is_none()
    }

    fn on_commit_done(&mut self, d: CommitDone) {
        let job = self.cfg.job.clone();
        let cp = d.checkpoint;
        match d.result {
            Ok(()) => {
                self.stats.commits += 1;
                let m = metrics();
                m.commit_seconds
                    .with_label_values(&[&job])
                    .observe(d.elapsed_ms / 1000.0);
                m.checkpoints
                    .with_label_values(&[&job, &format!("{:?}", cp.cause).to_lowercase()])
                    .inc();
                debug!(job = %job, worker = %self.cfg.worker, cause = ?cp.cause, epoch = ?cp.epoch, rows = cp.rows.len(), ms = d.elapsed_ms as u64, "committed");
                if !cp.partitions.is_empty() {
                    self.consumer.commit_offsets(&cp.partitions, false);
                }
            }
            Err(e) if self.failure.is_some() => {
                debug!(job = %job, worker = %self.cfg.worker, error = %e, "later checkpoint not applied");
            }
            Err(e) if e.is_fenced() => {
                warn!(job = %job, worker = %self.cfg.worker, error = %e, "commit fenced");
                self.fail(WorkerFailure::Fenced(e.to_string()));
            }
            Err(e) if e.is_transient() => {
                warn!(job = %job, worker = %self.cfg.worker, error = %e, "store unavailable; restarting from the last commit");
                self.fail(WorkerFailure::Unavailable(e.to_string()));
            }
            Err(e) => {
                let e = self.describe_rejection(&cp, e);
                error!(job = %job, worker = %self.cfg.worker, error = %e, "checkpoint refused by the store; stopping");
                self.fail(WorkerFailure::Fatal(e));
            }
        }
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
                        self.cfg.topic
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
    fn commit_group_offsets_sync(&mut self) {
        let Some(exec) = &self.exec else { return };
        let progress: Vec<PartitionProgress> = exec
            .status()
            .partitions
            .iter()
            .filter(|p| p.committed_epoch.0 > 0)
            .map(|p| PartitionProgress {
                partition: p.partition,
                next_offset: p.committed_offset,
                epoch: p.committed_epoch,
                streaming: false,
            })
            .collect();
        if !progress.is_empty() {
            self.consumer.commit_offsets(&progress, true);
        }
    }

    /// Feeds up to `max` snapshot rows (and vnode ends); returns how many rows.
    fn scan_batch(&mut self, max: usize) -> usize {
        let mut rows = 0;
        for _ in 0..max {
            let Some(scan) = self.scan.as_mut() else {
                return rows;
            };
            let id = scan.id;
            if scan.current.is_none() {
                let Some(start) = scan.queue.pop_front() else {
                    self.scan = None;
                    return rows;
                };
                let fetched = self
                    .snapshot
                    .scan(start.vnode, start.after.as_deref())
                    .and_then(|it| it.collect::<Result<VecDeque<Row>, _>>());
                let scan = self.scan.as_mut().expect("scan");
                match fetched {
                    Ok(fetched) => {
                        scan.current = Some(start.vnode);
                        scan.rows = fetched;
                    }
                    Err(e) => {
                        self.fail(WorkerFailure::Fatal(e.to_string()));
                        return rows;
                    }
                }
            }
            let scan = self.scan.as_mut().expect("scan");
            let vnode = scan.current.expect("current");
            let event = match scan.rows.pop_front() {
                Some(row) => {
                    rows += 1;
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
            self.feed(event);
            if self.failure.is_some() {
                return rows;
            }
        }
        rows
    }

    /// Watermarks, the generation check and the status report (when `due`); the clock always.
    fn housekeeping(&mut self, due: bool) {
        let Some(exec) = &self.exec else { return };
        let generation = exec.spec().generation;
        let owned = exec.owned_partitions();
        let log_phase = matches!(exec.phase(), Phase::LogStore | Phase::Streaming);
        if due {
            let check_generation =
                !crate::core::faults::active(crate::core::faults::Fault::SkipGenerationCheck);
            match self.store.job(&self.cfg.job) {
                Ok(Some(row)) if row.generation != generation && check_generation => {
                    info!(job = %self.cfg.job, worker = %self.cfg.worker, from = generation, to = row.generation, "job was recreated; restarting");
                    return self.fail(WorkerFailure::Fenced(format!(
                        "job recreated: generation {generation} -> {}",
                        row.generation
                    )));
                }
                Ok(_) => {
                    if !self.store_reachable {
                        info!(job = %self.cfg.job, worker = %self.cfg.worker, "state store reachable again");
                    }
                    self.store_reachable = true;
                    metrics()
                        .store_unreachable
                        .with_label_values(&self.label())
                        .set(0);
                }
                Err(e) => {
                    if self.store_reachable {
                        warn!(job = %self.cfg.job, worker = %self.cfg.worker, error = %e, "state store unreachable");
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
                    if let Some(high) = self.consumer.high_watermark(p) {
                        self.feed(Event::Watermark { partition: p, high });
                    }
                    self.report_read_position(p);
                }
            }
            self.publish();
        }
        self.feed(Event::Tick {
            now_ms: self.clock.now_ms(),
        });
    }

    /// Tells the executor how far the consumer has read `p` when that is past the last record it
    /// returned (transaction markers and aborted records are never returned), and only once every
    /// returned record has been fed.
    fn report_read_position(&mut self, p: PartitionId) {
        let Some(exec) = &self.exec else { return };
        let fed = exec
            .status()
            .partitions
            .iter()
            .find(|s| s.partition == p)
            .map(|s| s.next_offset);
        let delivered = self.position.get(&p).copied();
        let Some(read) = self.consumer.read_position(p) else {
            return;
        };
        if fed.is_some() && fed == delivered && read > fed.unwrap_or(0) {
            self.position.insert(p, read);
            self.feed(Event::ReadTo {
                partition: p,
                next_offset: read,
            });
        }
    }

    /// The worker's report on the status board, and its gauges.
    fn publish(&mut self) {
        let status = self.exec.as_ref().map(|e| e.status());
        let now = self.clock.now_ms();
        let records_per_second = match &status {
            Some(s) => self.rate.observe(now, s.handled()),
            None => self.rate.per_second(),
        };
        let estimated_catch_up_seconds = status
            .as_ref()
            .and_then(|s| s.catch_up_eta_seconds(records_per_second));
        let m = metrics();
        if let Some(s) = &status {
            m.epoch_lag_seconds
                .with_label_values(&self.label())
                .set(s.epoch_lag_seconds);
            for p in &s.partitions {
                if let Some(lag) = p.lag() {
                    m.partition_lag
                        .with_label_values(&[&self.cfg.job, &p.partition.to_string()])
                        .set(lag as i64);
                }
            }
        }
        let caught_up = status.as_ref().is_some_and(|s| s.caught_up);
        let recreations = self.supervisor.lock().unwrap().recreations();
        let mut board = self.board.lock().unwrap();
        board.entry(self.cfg.job.clone()).or_default().insert(
            self.cfg.worker.clone(),
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

    /// A failure goes to the supervisor: stop, or recreate / restart after a backoff.
    fn handle_failure(&mut self, f: WorkerFailure) -> Result<(), Stopped> {
        let generation = self
            .store
            .job(&self.cfg.job)
            .ok()
            .flatten()
            .map_or(0, |r| r.generation);
        self.last_error = Some(f.to_string());
        self.publish();
        let now = self.clock.now_ms();
        let verdict = self
            .supervisor
            .lock()
            .unwrap()
            .on_failure(&f, generation, now);
        match verdict {
            Verdict::Stop { reason } => {
                error!(job = %self.cfg.job, worker = %self.cfg.worker, %reason, "job stopped");
                Err(self.stopped(reason))
            }
            Verdict::Recreate {
                from_generation,
                backoff_ms,
            } => {
                let row = self
                    .store
                    .recreate(&self.cfg.job, from_generation)
                    .map_err(|e| self.stopped(format!("recreating the job: {e}")))?;
                if row.generation == from_generation + 1 {
                    self.stats.recreations += 1;
                    metrics()
                        .recreations
                        .with_label_values(&[&self.cfg.job, "vnode_bitmap_update_in_log_store"])
                        .inc();
                }
                info!(job = %self.cfg.job, worker = %self.cfg.worker, generation = row.generation, recreations = row.recreations, backoff_ms, "recreating the job: backfill restarts from the snapshot under the new assignment");
                self.begin_restart(backoff_ms)
            }
            Verdict::Restart { backoff_ms } => {
                info!(job = %self.cfg.job, worker = %self.cfg.worker, reason = %f, backoff_ms, "restarting the worker from the store");
                self.begin_restart(backoff_ms)
            }
        }
    }

    fn stopped(&self, reason: String) -> Stopped {
        Stopped {
            job: self.cfg.job.clone(),
            reason,
        }
    }

    fn begin_restart(&mut self, backoff_ms: u64) -> Result<(), Stopped> {
        if backoff_ms == 0 {
            return self.restart();
        }
        self.restart_at = Some(self.clock.now_ms() + backoff_ms);
        Ok(())
    }

    /// Rebuilds the executor from the store and claims what the consumer holds.
    fn restart(&mut self) -> Result<(), Stopped> {
        match self.start_executor() {
            Ok(()) => {
                let assigned = self.consumer.assignment();
                self.position.clear();
                if !assigned.is_empty() {
                    if let Some(claims) = self.claim(&assigned) {
                        self.feed(Event::Assigned(claims));
                    }
                }
                Ok(())
            }
            Err(f) => {
                self.last_error = Some(f.to_string());
                self.publish();
                // The store is still away (or worse): the supervisor decides, within its bound.
                let now = self.clock.now_ms();
                let verdict = self.supervisor.lock().unwrap().on_failure(&f, 0, now);
                match verdict {
                    Verdict::Restart { backoff_ms } => {
                        warn!(job = %self.cfg.job, worker = %self.cfg.worker, reason = %f, backoff_ms, "restart failed; retrying");
                        self.restart_at = Some(now + backoff_ms.max(1));
                        Ok(())
                    }
                    Verdict::Stop { reason } => {
                        error!(job = %self.cfg.job, worker = %self.cfg.worker, %reason, "job stopped");
                        Err(self.stopped(reason))
                    }
                    Verdict::Recreate { .. } => Err(self.stopped(f.to_string())),
                }
            }
        }
    }
}
