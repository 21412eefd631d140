//! The one worker loop: one consumer-group member driving one [`Executor`], generic over its ports
//! ([`ConsumerPort`], [`CommitPort`], [`Clock`], [`Observer`]). `service::worker` runs it on
//! librdkafka (`kafka::consumer`), the committer thread (`store::committer`) and the service's
//! observer; `sim` runs the very same loop on simulated members, commits that complete when
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
//! The loop owns no decision (the core does) and does no I/O of its own: the consumer, the committer,
//! the clock, the store and the snapshot are its ports, and what it did goes out as typed
//! [`WorkerEvent`]s to its [`Observer`] — it never imports the service, metrics or the status board
//! (`tests/it/architecture.rs` fails if it does, or reads a clock of its own).

use crate::core::Generation;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tracing::{error, info, warn};

use crate::core::{
    Adaptive, AdaptiveConfig, ClaimedPartition, Event, Executor, JobPolicy, JobSpec, PartitionId,
    PartitionMap, Phase, Rate, RateLimits, Row, ScanId, ScanStart, Supervisor, Throttle, Verdict,
    Vnode, WorkerFailure, WorkerStatus,
};
use crate::ports::{
    Clock, CommitPort, ConsumerPort, DeadLetterSink, FailureKind, Observer, Polled, SnapshotSource,
    StateStore, StoreError, Undecoded, WorkerEvent, WorkerReport,
};

mod commits;
mod events;
mod report;

/// The loop's settings.
#[derive(Clone, Debug)]
pub struct DriverConfig {
    pub job: String,
    pub topic: String,
    pub worker: String,
    /// The job's behaviour (`JobPolicy`), built once from its configuration, handed to each
    /// generation's executor unchanged.
    pub policy: JobPolicy,
    /// Snapshot rows and log records per second each, until the store holds live limits
    /// (`StateStore::rate_limits`); 0 = unlimited.
    pub max_rows_per_second: u64,
    /// Adaptive rate limiting: a cap under the limits, holding the commit latency p99 at a target (`core::Adaptive`).
    pub adaptive: AdaptiveConfig,
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

struct Scan {
    id: ScanId,
    queue: VecDeque<ScanStart>,
    current: Option<Vnode>,
    rows: VecDeque<Row>,
}

/// A store error as the supervisor sees it: transient → unavailable (restart, bounded), a newer
/// generation → recreated, another owner's lease → fenced, anything else fatal.
pub fn store_failure(e: StoreError) -> WorkerFailure {
    if e.is_transient() {
        WorkerFailure::Unavailable(e.to_string())
    } else if let StoreError::StaleGeneration { current, .. } = e {
        WorkerFailure::Recreated {
            generation: current,
            detail: e.to_string(),
        }
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
    observer: Box<dyn Observer>,
    map: PartitionMap,
    exec: Option<Executor>,
    scan: Option<Scan>,
    failure: Option<WorkerFailure>,
    /// Next offset the consumer will deliver per partition, when known.
    position: HashMap<PartitionId, u64>,
    /// When each paused partition was paused (ms).
    paused_at: HashMap<PartitionId, u64>,
    /// Committed progress not yet told to the group, per partition ([`GROUP_OFFSETS_EVERY_MS`]).
    group_offsets: std::collections::BTreeMap<PartitionId, crate::core::PartitionProgress>,
    /// When the group was last told (ms).
    group_told_at: u64,
    last_error: Option<String>,
    store_reachable: bool,
    /// Records handled per second, for the status report.
    rate: Rate,
    /// The snapshot rows-per-second limit.
    snapshot_throttle: Throttle,
    /// The log records-per-second limit.
    log_throttle: Throttle,
    /// The live (or configured) limits; the throttles hold these under the adaptive cap.
    live_limits: RateLimits,
    /// The adaptive cap (off unless configured).
    adaptive: Adaptive,
    last_house: Option<u64>,
    /// While backing off before a restart: when to restart.
    restart_at: Option<u64>,
    /// The generation of the executor last started: a failure is the supervisor's to judge by the
    /// generation of the executor that failed, never by the store's current one (which another
    /// worker's recreation may already have moved on).
    generation: Generation,
    /// The job is paused (`StateStore::paused`): every owned partition is paused in the consumer,
    /// the scan stands still, and the executor's own fetch and resume decisions wait for the resume.
    job_paused: bool,
    /// Where a checkpoint's dead letters are written before it is committed.
    dead_letter_sink: Option<Box<dyn DeadLetterSink>>,
    /// The bytes of records that did not decode, by (partition, offset), until the checkpoint
    /// that passes them is handed to the store (or their partition goes): at most
    /// `max_dead_letters` + 1, since more would be refused at the commit anyway.
    undecoded: std::collections::BTreeMap<(PartitionId, u64), Undecoded>,
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
        observer: Box<dyn Observer>,
    ) -> Result<Self, WorkerFailure> {
        let info = snapshot.info();
        let map = PartitionMap::new(info.vnode_count, info.partition_count)
            .map_err(|e| WorkerFailure::Fatal(e.to_string()))?;
        let now = clock.now_ms();
        let cfg_limit = cfg.max_rows_per_second;
        let cfg_adaptive = cfg.adaptive;
        let mut d = Driver {
            cfg,
            consumer,
            committer,
            clock,
            store,
            snapshot,
            supervisor,
            observer,
            map,
            exec: None,
            scan: None,
            failure: None,
            position: HashMap::new(),
            paused_at: HashMap::new(),
            group_offsets: Default::default(),
            group_told_at: 0,
            last_error: None,
            store_reachable: true,
            rate: Rate::new(now, 500),
            snapshot_throttle: Throttle::new(cfg_limit, now),
            log_throttle: Throttle::new(cfg_limit, now),
            live_limits: RateLimits::both(cfg_limit),
            adaptive: Adaptive::new(cfg_adaptive),
            last_house: None,
            restart_at: None,
            generation: crate::core::Generation(0),
            job_paused: false,
            dead_letter_sink: None,
            undecoded: Default::default(),
        };
        let pending = d.supervisor.lock().unwrap().recreation_pending(now);
        match pending {
            // Started during a recreation's backoff (one of this process's workers recreated the
            // job): it starts the new generation with the recreation's workers, not before.
            Some(at) => d.restart_at = Some(at),
            None => d.start_executor()?,
        }
        Ok(d)
    }

    /// Where the job's dead letters go (`on_bad_record = "dead-letter"`).
    pub fn with_dead_letters(mut self, sink: Box<dyn DeadLetterSink>) -> Self {
        self.dead_letter_sink = Some(sink);
        self
    }

    pub fn phase(&self) -> Option<Phase> {
        self.exec.as_ref().map(|e| e.phase())
    }

    pub fn status(&self) -> Option<WorkerStatus> {
        self.exec.as_ref().map(|e| e.status())
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
            if let Some(f) = self.failure.take() {
                // A failure while backing off (a commit of the old executor fenced, a fatal client
                // error): the supervisor decides again; it must not leak into the next executor.
                self.restart_at = None;
                return self.handle_failure(f);
            }
            if self.clock.now_ms() < at {
                return Ok(());
            }
            self.restart_at = None;
            return self.restart();
        }
        let scanning = self.scan.is_some();
        let mut timeout = if scanning { 0 } else { self.cfg.idle_poll_ms };
        // The throttles (token buckets in the core) say how many log records and snapshot rows
        // this round may handle; when neither may, wait for the first that will.
        let want = self.cfg.max_messages_per_round;
        let scan_want = self.cfg.max_scan_rows_per_round;
        let now = self.clock.now_ms();
        let mut budget = self.log_throttle.allowance(now, want);
        let mut scan_budget = self.snapshot_throttle.allowance(now, scan_want);
        if budget == 0 && (!scanning || scan_budget == 0) {
            let wait = if scanning {
                self.log_throttle
                    .wait_ms()
                    .min(self.snapshot_throttle.wait_ms())
            } else {
                self.log_throttle.wait_ms()
            };
            self.clock.sleep_ms(wait);
            let now = self.clock.now_ms();
            budget = self.log_throttle.allowance(now, want);
            scan_budget = self.snapshot_throttle.allowance(now, scan_want);
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
        if self.failure.is_none() && !self.job_paused {
            rows = self.scan_batch(scan_budget);
        }
        self.log_throttle.spend(records);
        self.snapshot_throttle.spend(rows);
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

    fn start_executor(&mut self) -> Result<(), WorkerFailure> {
        // A fresh committer: the old one may hold checkpoints of the failed executor. Those that
        // applied are commits all the same (reported, never fed to the new executor).
        for d in self.committer.restart().map_err(store_failure)? {
            if d.result.is_ok() {
                self.observer.observe(WorkerEvent::CommitApplied {
                    cause: d.checkpoint.cause,
                    transaction_ms: d.transaction_ms,
                    group_size: d.group_size,
                });
            }
        }
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
            policy: self.cfg.policy.clone(),
        };
        self.undecoded.clear();
        self.observer
            .observe(WorkerEvent::Generation(row.generation));
        self.generation = row.generation;
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
            self.observer.observe(WorkerEvent::Failed {
                kind: FailureKind::of(&f),
                generation: self.generation,
            });
            self.failure = Some(f);
        }
        self.exec = None;
        self.scan = None;
    }

    /// A failure goes to the supervisor: stop, or recreate / restart after a backoff.
    fn handle_failure(&mut self, f: WorkerFailure) -> Result<(), Stopped> {
        let generation = self.generation;
        self.last_error = Some(f.to_string());
        self.publish();
        let now = self.clock.now_ms();
        // The supervisor stays locked through the store's compare-and-set: the job's other workers
        // in this process see the recreation's outcome, not a decision still in flight.
        let supervisor = self.supervisor.clone();
        let mut supervisor = supervisor.lock().unwrap();
        let verdict = supervisor.on_failure(&f, generation, now);
        match verdict {
            Verdict::Stop { reason } => {
                drop(supervisor);
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
                let applied = row.generation == from_generation.next();
                supervisor.recreation_outcome(applied, now);
                drop(supervisor);
                if applied {
                    self.observer.observe(WorkerEvent::Recreated);
                    info!(job = %self.cfg.job, worker = %self.cfg.worker, generation = %row.generation, recreations = row.recreations, backoff_ms, "recreating the job: backfill restarts from the snapshot under the new assignment");
                } else {
                    info!(job = %self.cfg.job, worker = %self.cfg.worker, generation = %row.generation, %from_generation, backoff_ms, "the job was already recreated by another process; restarting under its generation");
                }
                self.begin_restart(backoff_ms)
            }
            Verdict::Restart { backoff_ms } => {
                drop(supervisor);
                info!(job = %self.cfg.job, worker = %self.cfg.worker, reason = %f, %generation, backoff_ms, "restarting the worker from the store");
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
                let generation = self.generation;
                let verdict = self
                    .supervisor
                    .lock()
                    .unwrap()
                    .on_failure(&f, generation, now);
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
