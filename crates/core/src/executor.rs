//! The per-worker backfill state machine: snapshot → log store → streaming.
//!
//! [`Executor::handle`] takes one [`Event`] and answers with the [`Decision`]s the driver must carry out,
//! in order. It owns alignment, staging, progress and the phase; it performs no I/O and never blocks.
//! An `Err` means the input was bad (nothing after it may be committed); a [`Decision::Fail`] means the
//! worker must stop after carrying out the decisions before it (the log-store bitmap-update error).

use crate::Generation;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::barrier::{Barrier, LogRecord, Op, Row};
use super::epoch::Epoch;
use super::error::CoreError;
use super::phase::{ClaimedPartition, Decision, Event, Phase, ScanId, ScanStart};
use super::progress::{
    Checkpoint, CheckpointCause, DeadLetter, Lease, PartitionProgress, RowMutation, VnodeProgress,
};
use super::staging::{snapshot_upsert, Staging};
use super::vnode::{vnode_of, PartitionId, PartitionMap, Vnode};

/// When the snapshot phase commits on its own (there are no upstream barriers then).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalCheckpointPolicy {
    /// Commit after this many snapshot rows.
    pub max_rows: u64,
    /// Commit when this much time has passed since the last commit and something is pending.
    pub max_interval_ms: u64,
}

impl Default for LocalCheckpointPolicy {
    fn default() -> Self {
        LocalCheckpointPolicy {
            max_rows: 50_000,
            max_interval_ms: 1_000,
        }
    }
}

/// What a worker needs to know about its job.
#[derive(Clone, Debug)]
pub struct JobSpec {
    /// The log topic, for error messages.
    pub topic: String,
    pub snapshot_epoch: Epoch,
    pub map: PartitionMap,
    pub generation: Generation,
    pub worker: String,
    /// The job's configured behaviour, built once from its configuration.
    pub policy: JobPolicy,
}

/// How a job behaves, as configured: built once from the job's configuration by the service (or
/// the simulation) and carried unchanged to every worker's executor.
#[derive(Clone, Debug)]
pub struct JobPolicy {
    pub local_checkpoint: LocalCheckpointPolicy,
    /// Alignment back-pressure: a partition is paused once it holds this many barriers beyond the
    /// frontier (1 = pause as soon as it is ahead). Larger values trade memory for fewer pauses.
    pub max_epochs_ahead: usize,
    /// Alignment back-pressure by memory: a partition ahead of the frontier is paused once the
    /// changes it delivered beyond the frontier hold more than its share of this many bytes (the
    /// budget over the owned partitions; key and datum bytes plus a fixed overhead per change,
    /// checked at each barrier), until they hold half of its share. The partitions at the frontier
    /// are never paused, so the frontier always moves. Pausing each partition by its own share, not
    /// all at once when the total passes: librdkafka drops a paused partition's prefetched
    /// messages, and pausing every partition ahead together made a 64-partition replay 7× slower.
    pub max_bytes_ahead: u64,
    /// `recreation.policy = "reschedule"`: a vnode-bitmap update in the log-store phase is absorbed
    /// (as in the streaming phase) instead of raising the invariant error.
    pub reschedule: bool,
    /// `on_bad_record = "dead-letter"`: a record that does not decode is skipped and recorded as a
    /// dead letter with the checkpoint that passes it, at most this many in all (the store refuses
    /// more); `None` = `"stop"`, the default. Records that break the barrier chain or the routing
    /// still stop: they make every later epoch unreliable.
    pub max_dead_letters: Option<u64>,
    /// Commit every checkpoint epoch as its own checkpoint, oldest first, instead of one commit
    /// through the newest checkpoint every owned partition has passed. Publication at one epoch
    /// across workers needs it (docs/design/several-tables.md §2: every checkpoint barrier is then
    /// a commit boundary of every partition, so the workers' boundaries meet); off, a backlog's
    /// checkpoints coalesce into fewer, larger commits.
    pub commit_every_checkpoint: bool,
    /// The tables of the log this job materialises (`Change::table`): one (0 in a one-table log),
    /// or several keyed by (table, key) ([`crate::tables`]); the other tables' changes are checked
    /// against the contract and passed over.
    pub tables: super::tables::JobTables,
}

/// Runtime state of one owned partition.
#[derive(Debug)]
struct PartitionState {
    lease: Lease,
    committed: PartitionProgress,
    /// Next offset expected from the log.
    next_offset: u64,
    /// Just after the last *record* delivered (not moved by `ReadTo`, which skips what the consumer
    /// never returns: transaction markers, aborted records).
    record_end: u64,
    /// The epoch of data now arriving: `curr` of the last barrier delivered.
    open_epoch: Epoch,
    /// Barriers delivered since the last commit, with the offset just after each.
    barriers: VecDeque<(Barrier, u64)>,
    pending_update_delete: Option<u64>,
    /// Dead letters read since the last commit, in offset order.
    dead_letters: Vec<DeadLetter>,
    high_watermark: Option<u64>,
    paused: bool,
    /// Bytes of the changes delivered per epoch beyond the frontier (as of the last pause update).
    bytes_by_epoch: BTreeMap<Epoch, u64>,
    /// Over its share of `max_bytes_ahead` and not yet back under half of it.
    over_bytes: bool,
    /// At the last watermark refresh, the partition had been read up to the high watermark of the
    /// refresh before it (see [`WorkerStatus::caught_up`]).
    caught_up: bool,
}

impl PartitionState {
    fn new(lease: Lease, committed: PartitionProgress) -> Self {
        PartitionState {
            lease,
            next_offset: committed.next_offset,
            record_end: committed.next_offset,
            open_epoch: committed.epoch,
            committed,
            barriers: VecDeque::new(),
            pending_update_delete: None,
            dead_letters: Vec::new(),
            high_watermark: None,
            paused: false,
            bytes_by_epoch: BTreeMap::new(),
            over_bytes: false,
            caught_up: false,
        }
    }

    /// Forgets uncommitted reads: the partition will be fetched again from its committed offset.
    fn rewind(&mut self) {
        self.next_offset = self.committed.next_offset;
        self.record_end = self.committed.next_offset;
        self.open_epoch = self.committed.epoch;
        self.barriers.clear();
        self.bytes_by_epoch.clear();
        self.over_bytes = false;
        self.pending_update_delete = None;
        self.dead_letters.clear();
        self.paused = false;
    }
}

/// A bounded catch-up test (see docs/ARCHITECTURE.md, "Catch-up"): the high watermarks sampled when the probe was
/// taken. The worker has caught up once every owned partition has been read to its target without a
/// checkpoint barrier appearing beyond the last committed one.
#[derive(Debug, Clone)]
struct CatchUpProbe {
    targets: BTreeMap<PartitionId, u64>,
}

/// Counters since the executor was created.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecutorCounters {
    pub snapshot_rows: u64,
    /// Log-store changes staged, by [`Op`] in `Op::ALL` order.
    pub changes: [u64; 4],
    pub barriers: u64,
    pub checkpoints: u64,
    /// Records skipped as dead letters (read, not necessarily committed yet).
    pub dead_letters: u64,
    /// Truncations of the job's tables read (each partition's record counts once).
    pub truncates: u64,
}

/// A view of one owned partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionStatus {
    pub partition: PartitionId,
    pub committed_offset: u64,
    pub next_offset: u64,
    /// The offset up to which nothing is left to commit: the committed offset, or the read position
    /// when every record read is committed and only records the consumer never returns
    /// (transaction markers, aborted records) lie beyond. Lag is counted from here.
    pub settled_offset: u64,
    pub high_watermark: Option<u64>,
    pub open_epoch: Epoch,
    pub committed_epoch: Epoch,
    pub paused: bool,
}

/// A view of the executor, for status pages, metrics and tests.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerStatus {
    pub phase: Phase,
    pub generation: Generation,
    pub owned_vnodes: u32,
    pub snapshot_vnodes_left: u32,
    pub partitions: Vec<PartitionStatus>,
    /// The last committed checkpoint epoch (the smallest vnode-progress epoch of the owned vnodes, as
    /// in the store), once the log store was started.
    pub committed_epoch: Option<Epoch>,
    pub newest_epoch: Option<Epoch>,
    pub epoch_lag_seconds: f64,
    pub counters: ExecutorCounters,
    /// Streaming, and at the last watermark refresh every owned partition had been read up to the
    /// high watermark of the refresh before it: the worker trails the log's end by at most one
    /// refresh interval of reading, and its committed state by at most the open checkpoint interval.
    /// Holds under continuous upstream writes as long as consumption outpaces production. A worker
    /// that joined the group and owns no partition is caught up (the job's completion is decided
    /// over all its vnodes).
    pub caught_up: bool,
    /// The group has answered (an assignment, possibly empty): the worker is a member.
    pub joined: bool,
}

/// The state machine of one worker of one job generation.
#[derive(Debug)]
pub struct Executor {
    spec: JobSpec,
    phase: Phase,
    partitions: BTreeMap<PartitionId, PartitionState>,
    vnodes: BTreeMap<Vnode, VnodeProgress>,
    dirty_vnodes: BTreeSet<Vnode>,
    scan: ScanId,
    snapshot_rows: Vec<RowMutation>,
    rows_since_checkpoint: u64,
    now_ms: u64,
    last_checkpoint_ms: u64,
    staging: Staging,
    /// Barriers seen by `prev`, to check that every partition carries the same chain.
    registry: BTreeMap<Epoch, Barrier>,
    probe: Option<CatchUpProbe>,
    newest_epoch: Option<Epoch>,
    failed: bool,
    counters: ExecutorCounters,
    /// A bad record stopped its partition: the others are read on until every checkpoint complete
    /// before it is committed, then the executor fails with the record's error (docs/OPERATIONS.md "Bad input").
    poison: Option<Poison>,
    /// The group has answered at least once (an assignment, possibly empty).
    joined: bool,
}

/// A partition stopped at a bad record.
#[derive(Debug)]
struct Poison {
    partition: PartitionId,
    error: CoreError,
    since_ms: u64,
}

/// How long the other partitions are read on after a bad record, at most, to complete the
/// checkpoints before it.
pub const POISON_DRAIN_MS: u64 = 10_000;

impl Executor {
    pub fn new(spec: JobSpec, now_ms: u64) -> Self {
        Executor {
            spec,
            phase: Phase::Unassigned,
            partitions: BTreeMap::new(),
            vnodes: BTreeMap::new(),
            dirty_vnodes: BTreeSet::new(),
            scan: 0,
            snapshot_rows: Vec::new(),
            rows_since_checkpoint: 0,
            now_ms,
            last_checkpoint_ms: now_ms,
            staging: Staging::default(),
            registry: BTreeMap::new(),
            probe: None,
            newest_epoch: None,
            failed: false,
            counters: ExecutorCounters::default(),
            poison: None,
            joined: false,
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    pub fn spec(&self) -> &JobSpec {
        &self.spec
    }

    pub fn owned_partitions(&self) -> Vec<PartitionId> {
        self.partitions.keys().copied().collect()
    }

    /// Feeds one event. After an `Err` or a [`Decision::Fail`] the executor must be dropped.
    pub fn handle(&mut self, event: Event) -> Result<Vec<Decision>, CoreError> {
        assert!(!self.failed, "executor used after it failed");
        let mut out = Vec::new();
        let result = match event {
            Event::Assigned(claims) => {
                self.joined = true;
                self.on_assigned(claims, &mut out);
                Ok(())
            }
            Event::Revoked(ps) => {
                self.on_revoked(ps, &mut out);
                Ok(())
            }
            Event::SnapshotRow { scan, vnode, row } => {
                self.on_snapshot_row(scan, vnode, row, &mut out)
            }
            Event::SnapshotVnodeDone { scan, vnode } => {
                self.on_snapshot_vnode_done(scan, vnode, &mut out);
                Ok(())
            }
            Event::Record {
                partition,
                offset,
                record,
            } => match self.on_record(partition, offset, record, &mut out) {
                Err(e) if e.is_bad_record() => {
                    self.on_bad_record(partition, e, &mut out);
                    Ok(())
                }
                other => other,
            },
            Event::Undecodable {
                partition,
                offset,
                reason,
            } => {
                let fetching = matches!(self.phase, Phase::LogStore | Phase::Streaming);
                let fresh = self
                    .partitions
                    .get(&partition)
                    .is_some_and(|p| offset >= p.next_offset);
                let stopped = self
                    .poison
                    .as_ref()
                    .is_some_and(|x| x.partition == partition);
                if fetching && fresh && !stopped {
                    let e = CoreError::Undecodable {
                        topic: self.spec.topic.clone(),
                        partition,
                        offset,
                        reason,
                    };
                    match (
                        self.spec.policy.max_dead_letters,
                        self.partitions.get_mut(&partition),
                    ) {
                        (Some(_), Some(p)) => {
                            // Skipped: the partition reads on past it; the checkpoint whose offsets
                            // pass it records it.
                            p.dead_letters.push(DeadLetter {
                                partition,
                                offset,
                                epoch: p.open_epoch,
                                reason: e.to_string(),
                            });
                            p.next_offset = offset + 1;
                            p.record_end = offset + 1;
                            self.counters.dead_letters += 1;
                        }
                        _ => self.on_bad_record(partition, e, &mut out),
                    }
                }
                Ok(())
            }
            Event::ReadTo {
                partition,
                next_offset,
            } => {
                let fetching = matches!(self.phase, Phase::LogStore | Phase::Streaming);
                let stopped = self
                    .poison
                    .as_ref()
                    .is_some_and(|x| x.partition == partition);
                if let Some(p) = self.partitions.get_mut(&partition) {
                    if fetching && !stopped && next_offset > p.next_offset {
                        p.next_offset = next_offset;
                    }
                }
                Ok(())
            }
            Event::Watermark { partition, high } => {
                if let Some(p) = self.partitions.get_mut(&partition) {
                    p.caught_up = p.next_offset >= p.high_watermark.unwrap_or(high);
                    p.high_watermark = Some(p.high_watermark.map_or(high, |h| h.max(high)));
                }
                Ok(())
            }
            Event::Tick { now_ms } => {
                self.now_ms = self.now_ms.max(now_ms);
                if self.phase == Phase::Snapshot
                    && self.now_ms - self.last_checkpoint_ms
                        >= self.spec.policy.local_checkpoint.max_interval_ms
                {
                    self.commit_snapshot(CheckpointCause::Local, &mut out);
                }
                Ok(())
            }
            Event::JobGeneration { generation } => {
                let skip = crate::faults::active(crate::faults::Fault::SkipGenerationCheck);
                if generation != self.spec.generation && !skip {
                    out.push(Decision::Restart {
                        generation,
                        reason: format!(
                            "job recreated: generation {} -> {generation}",
                            self.spec.generation
                        ),
                    });
                }
                Ok(())
            }
            Event::Shutdown => {
                match self.phase {
                    Phase::Snapshot => self.commit_snapshot(CheckpointCause::Shutdown, &mut out),
                    Phase::LogStore | Phase::Streaming => {
                        self.commit_complete(CheckpointCause::Shutdown, &mut out)
                    }
                    Phase::Unassigned => {}
                }
                Ok(())
            }
        };
        if let Err(e) = result {
            self.failed = true;
            return Err(e);
        }
        if self.poison.is_some() && self.poison_drained() {
            let poison = self.poison.take().expect("poison");
            // Every checkpoint complete before the bad record has been committed by `advance`.
            out.push(Decision::Fail(poison.error));
        }
        if out.iter().any(|d| matches!(d, Decision::Fail(_))) {
            self.failed = true;
            return Ok(out);
        }
        if self.phase == Phase::LogStore && self.poison.is_none() {
            self.evaluate_probe(&mut out);
        }
        Ok(out)
    }

    // ----- assignment -------------------------------------------------------------------------

    fn on_assigned(&mut self, claims: Vec<ClaimedPartition>, out: &mut Vec<Decision>) {
        let claims: Vec<ClaimedPartition> = claims
            .into_iter()
            .filter(|c| !self.partitions.contains_key(&c.partition))
            .collect();
        if claims.is_empty() {
            return;
        }
        match self.phase {
            Phase::Unassigned => {
                self.add_partitions(claims);
                let to = self.natural_phase();
                self.enter(to, out);
            }
            Phase::Snapshot => {
                self.commit_snapshot(CheckpointCause::Rebalance, out);
                let new: Vec<PartitionId> = claims.iter().map(|c| c.partition).collect();
                self.add_partitions(claims);
                for p in new {
                    self.set_paused(p, true, out);
                }
                self.plan_snapshot(out);
            }
            Phase::LogStore if !self.spec.policy.reschedule => self.fail_bitmap_update(out),
            Phase::LogStore | Phase::Streaming => {
                self.commit_complete(CheckpointCause::Rebalance, out);
                let new: Vec<PartitionId> = claims.iter().map(|c| c.partition).collect();
                self.add_partitions(claims);
                if self.natural_phase() == Phase::Snapshot {
                    // A newly owned vnode still needs its snapshot: roll back to the committed offsets
                    // and go back to the snapshot phase for it.
                    self.staging.clear();
                    for p in self.partitions.values_mut() {
                        p.rewind();
                    }
                    self.enter(Phase::Snapshot, out);
                } else {
                    for p in new {
                        let offset = self.partitions[&p].committed.next_offset;
                        out.push(Decision::Fetch {
                            partition: p,
                            offset,
                        });
                    }
                    self.update_pauses(out);
                }
            }
        }
    }

    fn on_revoked(&mut self, revoked: Vec<PartitionId>, out: &mut Vec<Decision>) {
        let revoked: Vec<PartitionId> = revoked
            .into_iter()
            .filter(|p| self.partitions.contains_key(p))
            .collect();
        if revoked.is_empty() {
            return;
        }
        match self.phase {
            Phase::Unassigned => {}
            Phase::Snapshot => {
                self.commit_snapshot(CheckpointCause::Rebalance, out);
                self.remove_partitions(&revoked);
                if self.partitions.is_empty() {
                    out.push(Decision::Scan {
                        scan: self.next_scan(),
                        vnodes: Vec::new(),
                    });
                    self.enter(Phase::Unassigned, out);
                } else {
                    self.plan_snapshot(out);
                }
            }
            Phase::LogStore if !self.spec.policy.reschedule => self.fail_bitmap_update(out),
            Phase::LogStore | Phase::Streaming => {
                self.commit_complete(CheckpointCause::Rebalance, out);
                let map = self.spec.map;
                let gone: BTreeSet<PartitionId> = revoked.iter().copied().collect();
                self.staging
                    .discard(|v| gone.contains(&map.partition_of(v)));
                self.remove_partitions(&revoked);
                if self.partitions.is_empty() {
                    self.enter(Phase::Unassigned, out);
                } else {
                    // The frontier may have advanced past a staged checkpoint.
                    self.advance(out);
                }
            }
        }
    }

    /// The log-store rule: commit what is complete, then fail with the seed's error.
    fn fail_bitmap_update(&mut self, out: &mut Vec<Decision>) {
        self.commit_complete(CheckpointCause::Rebalance, out);
        out.push(Decision::Fail(CoreError::VnodeBitmapUpdateDuringLogStore));
    }

    fn add_partitions(&mut self, claims: Vec<ClaimedPartition>) {
        for c in claims {
            for v in c.vnodes {
                self.vnodes.insert(v.vnode, v);
            }
            for v in self.spec.map.vnodes_of(c.partition) {
                self.vnodes
                    .entry(v)
                    .or_insert_with(|| VnodeProgress::fresh(v, self.spec.snapshot_epoch));
            }
            self.partitions
                .insert(c.partition, PartitionState::new(c.lease, c.progress));
        }
    }

    fn remove_partitions(&mut self, ps: &[PartitionId]) {
        for &p in ps {
            self.partitions.remove(&p);
            for v in self.spec.map.vnodes_of(p) {
                self.vnodes.remove(&v);
                self.dirty_vnodes.remove(&v);
            }
        }
        self.probe = None;
    }

    /// The phase the owned progress calls for.
    fn natural_phase(&self) -> Phase {
        if self.partitions.is_empty() {
            Phase::Unassigned
        } else if self.vnodes.values().any(|v| !v.finished) {
            Phase::Snapshot
        } else if self.phase == Phase::Streaming
            || self.partitions.values().all(|p| p.committed.streaming)
        {
            Phase::Streaming
        } else {
            Phase::LogStore
        }
    }

    fn enter(&mut self, to: Phase, out: &mut Vec<Decision>) {
        let from = self.phase;
        self.phase = to;
        if from != to {
            out.push(Decision::PhaseChanged { from, to });
        }
        match to {
            Phase::Unassigned => {}
            Phase::Snapshot => {
                let ps: Vec<PartitionId> = self.partitions.keys().copied().collect();
                for p in ps {
                    self.partitions.get_mut(&p).unwrap().paused = false;
                    self.set_paused(p, true, out);
                }
                self.plan_snapshot(out);
            }
            Phase::LogStore | Phase::Streaming => {
                self.probe = None;
                for (&partition, p) in self.partitions.iter_mut() {
                    p.rewind();
                    out.push(Decision::Fetch {
                        partition,
                        offset: p.committed.next_offset,
                    });
                }
                self.update_pauses(out);
            }
        }
    }

    // ----- snapshot phase ---------------------------------------------------------------------

    fn next_scan(&mut self) -> ScanId {
        self.scan += 1;
        self.scan
    }

    /// Plans the scan of every owned vnode whose snapshot is unfinished, from its cursor; enters the
    /// log store when none is left.
    fn plan_snapshot(&mut self, out: &mut Vec<Decision>) {
        let vnodes: Vec<ScanStart> = self
            .vnodes
            .values()
            .filter(|v| !v.finished)
            .map(|v| ScanStart {
                vnode: v.vnode,
                after: v.cursor.clone(),
            })
            .collect();
        if vnodes.is_empty() {
            out.push(Decision::Scan {
                scan: self.next_scan(),
                vnodes,
            });
            let to = self.natural_phase();
            self.enter(to, out);
            return;
        }
        let scan = self.next_scan();
        out.push(Decision::Scan { scan, vnodes });
    }

    fn on_snapshot_row(
        &mut self,
        scan: ScanId,
        vnode: Vnode,
        row: Row,
        out: &mut Vec<Decision>,
    ) -> Result<(), CoreError> {
        if scan != self.scan || self.phase != Phase::Snapshot {
            return Ok(());
        }
        let Some(progress) = self.vnodes.get_mut(&vnode) else {
            return Ok(());
        };
        if progress.finished {
            return Ok(());
        }
        let computed = vnode_of(
            self.spec.policy.tables.routing_key(&row.key),
            self.spec.map.vnode_count(),
        );
        if computed != vnode {
            return Err(CoreError::SnapshotRowVnodeMismatch { vnode, computed });
        }
        if let Some(cursor) = &progress.cursor {
            if row.key <= *cursor {
                return Err(CoreError::SnapshotCursorWentBack {
                    vnode,
                    cursor: cursor.clone(),
                    key: row.key,
                });
            }
        }
        progress.cursor = Some(row.key.clone());
        progress.row_count += 1;
        self.dirty_vnodes.insert(vnode);
        self.snapshot_rows.push(snapshot_upsert(vnode, row));
        self.rows_since_checkpoint += 1;
        self.counters.snapshot_rows += 1;
        if self.rows_since_checkpoint >= self.spec.policy.local_checkpoint.max_rows {
            self.commit_snapshot(CheckpointCause::Local, out);
        }
        Ok(())
    }

    fn on_snapshot_vnode_done(&mut self, scan: ScanId, vnode: Vnode, out: &mut Vec<Decision>) {
        if scan != self.scan || self.phase != Phase::Snapshot {
            return;
        }
        let Some(progress) = self.vnodes.get_mut(&vnode) else {
            return;
        };
        if progress.finished {
            return;
        }
        progress.finished = true;
        progress.cursor = None;
        self.dirty_vnodes.insert(vnode);
        if self.vnodes.values().all(|v| v.finished) {
            self.commit_snapshot(CheckpointCause::SnapshotDone, out);
            let to = self.natural_phase();
            self.enter(to, out);
        }
    }

    fn commit_snapshot(&mut self, cause: CheckpointCause, out: &mut Vec<Decision>) {
        self.last_checkpoint_ms = self.now_ms;
        if self.snapshot_rows.is_empty() && self.dirty_vnodes.is_empty() {
            return;
        }
        let rows = std::mem::take(&mut self.snapshot_rows);
        let vnodes = std::mem::take(&mut self.dirty_vnodes)
            .into_iter()
            .map(|v| self.vnodes[&v].clone())
            .collect();
        self.rows_since_checkpoint = 0;
        self.push_commit(cause, None, rows, vnodes, Vec::new(), out);
    }

    fn push_commit(
        &mut self,
        cause: CheckpointCause,
        epoch: Option<Epoch>,
        rows: Vec<RowMutation>,
        vnodes: Vec<VnodeProgress>,
        partitions: Vec<PartitionProgress>,
        out: &mut Vec<Decision>,
    ) {
        self.counters.checkpoints += 1;
        out.push(Decision::Commit(Checkpoint {
            generation: self.spec.generation,
            worker: self.spec.worker.clone(),
            cause,
            epoch,
            leases: self.partitions.iter().map(|(p, s)| (*p, s.lease)).collect(),
            rows,
            vnodes,
            partitions,
            dead_letters: Vec::new(),
            max_dead_letters: self.spec.policy.max_dead_letters.unwrap_or(0),
        }));
    }

    // ----- log store and streaming ------------------------------------------------------------

    /// A record that does not decode or breaks the contract: its partition stops before it (paused,
    /// later records ignored) while the others are read on, so that every checkpoint complete
    /// before it is committed; then [`Self::poison_drained`] ends the executor with `error`.
    fn on_bad_record(&mut self, partition: PartitionId, error: CoreError, out: &mut Vec<Decision>) {
        if self.poison.is_some() {
            return; // the first bad record is the one reported
        }
        self.poison = Some(Poison {
            partition,
            error,
            since_ms: self.now_ms,
        });
        if let Some(p) = self.partitions.get_mut(&partition) {
            p.paused = true;
            out.push(Decision::Pause(partition));
        }
    }

    /// Whether nothing more can complete before the bad record: every other owned partition has
    /// reached the stopped partition's open epoch or read all it holds, or the drain timed out, or
    /// the stopped partition is no longer owned.
    fn poison_drained(&self) -> bool {
        let Some(poison) = &self.poison else {
            return false;
        };
        let Some(stopped) = self.partitions.get(&poison.partition) else {
            return true;
        };
        if self.now_ms.saturating_sub(poison.since_ms) >= POISON_DRAIN_MS {
            return true;
        }
        self.partitions.iter().all(|(id, p)| {
            *id == poison.partition
                || p.open_epoch >= stopped.open_epoch
                || p.high_watermark.is_some_and(|h| p.next_offset >= h)
        })
    }

    fn on_record(
        &mut self,
        partition: PartitionId,
        offset: u64,
        record: LogRecord,
        out: &mut Vec<Decision>,
    ) -> Result<(), CoreError> {
        if !matches!(self.phase, Phase::LogStore | Phase::Streaming) {
            return Ok(()); // not fetching yet: the record will be fetched again
        }
        let topic = &self.spec.topic;
        let map = self.spec.map;
        if self
            .poison
            .as_ref()
            .is_some_and(|x| x.partition == partition)
        {
            return Ok(()); // stopped at a bad record
        }
        let Some(p) = self.partitions.get_mut(&partition) else {
            return Ok(()); // revoked: its new owner reads it
        };
        if offset < p.next_offset {
            return Ok(()); // already seen (a re-fetch)
        }
        let at = super::contract::LogPosition {
            open_epoch: p.open_epoch,
            pending_update_delete: p.pending_update_delete,
        };
        super::contract::check_record(topic, map, partition, offset, &at, &record, &self.registry)?;
        let mut moved = at;
        moved.advance(offset, &record, &mut self.registry);
        p.open_epoch = moved.open_epoch;
        p.pending_update_delete = moved.pending_update_delete;
        p.next_offset = offset + 1;
        p.record_end = offset + 1;
        match record {
            LogRecord::Change(mut change) => {
                let Some(key) = self
                    .spec
                    .policy
                    .tables
                    .staged_key(change.table, std::mem::take(&mut change.row.key))
                else {
                    // Another table of the log: checked, read past, never staged.
                    self.newest_epoch = self.newest_epoch.max(Some(change.epoch));
                    return Ok(());
                };
                change.row.key = key;
                // What staging the change holds, estimated: its bytes, the staging map's copy of
                // the key and a fixed overhead for the entry and its allocations.
                *p.bytes_by_epoch.entry(change.epoch).or_default() +=
                    (2 * change.row.key.len() + change.row.value.len()) as u64 + 128;
                self.counters.changes[op_index(change.op)] += 1;
                self.newest_epoch = self.newest_epoch.max(Some(change.epoch));
                self.staging.stage(change, offset);
                Ok(())
            }
            LogRecord::Truncate(t) => {
                self.newest_epoch = self.newest_epoch.max(Some(t.epoch));
                if self.spec.policy.tables.includes(t.table) {
                    let prefix = self.spec.policy.tables.table_prefix(t.table);
                    self.staging
                        .truncate(t.epoch, map.vnodes_of(partition), &prefix);
                    self.counters.truncates += 1;
                }
                Ok(())
            }
            LogRecord::Barrier(barrier) => {
                p.barriers.push_back((barrier, offset + 1));
                self.counters.barriers += 1;
                self.newest_epoch = self.newest_epoch.max(Some(barrier.curr));
                self.advance(out);
                Ok(())
            }
        }
    }

    /// The epoch every owned partition has reached: all epochs below it are complete.
    fn frontier(&self) -> Option<Epoch> {
        let open = self.partitions.values().map(|p| p.open_epoch);
        if super::faults::active(super::faults::Fault::CommitAboveFrontier) {
            return open.max();
        }
        open.min()
    }

    /// Commits through the newest checkpoint below the frontier, if any, and updates pauses: called
    /// whenever the frontier may have moved (a barrier arrived, a lagging partition was revoked).
    fn advance(&mut self, out: &mut Vec<Decision>) {
        let Some(frontier) = self.frontier() else {
            return;
        };
        // The newest checkpoint barrier that every owned partition has passed (or, committing every
        // checkpoint, the oldest, again until none is left: each commit pops the barriers it passes).
        // A schema change splits: the epochs before it commit apart from later ones.
        loop {
            let checkpoints = self
                .partitions
                .values()
                .flat_map(|p| p.barriers.iter())
                .filter(|(b, _)| b.is_checkpoint() && b.prev < frontier)
                .map(|(b, _)| b.prev);
            let split = self.schema_split_below(frontier);
            let checkpoint = if self.spec.policy.commit_every_checkpoint {
                checkpoints.min()
            } else {
                split.or_else(|| checkpoints.max())
            };
            let Some(epoch) = checkpoint else { break };
            self.commit_through(epoch, CheckpointCause::Barrier, out);
            if !self.spec.policy.commit_every_checkpoint && split.is_none() {
                break;
            }
        }
        self.update_pauses(out);
    }

    /// The oldest barrier below `frontier` at which a new row-schema version starts (its `prev`):
    /// a commit never takes epochs on both sides of it (docs/WIRE.md "Schema changes").
    fn schema_split_below(&self, frontier: Epoch) -> Option<Epoch> {
        self.partitions
            .values()
            .flat_map(|p| p.barriers.iter())
            .filter(|(b, _)| b.schema_change && b.prev < frontier)
            .map(|(b, _)| b.prev)
            .min()
    }

    /// Commits every complete epoch (all barriers below the frontier), checkpoint or not: used before
    /// a bitmap update is acknowledged and at shutdown.
    fn commit_complete(&mut self, cause: CheckpointCause, out: &mut Vec<Decision>) {
        let Some(frontier) = self.frontier() else {
            return;
        };
        // Each schema change's earlier epochs first, apart from later ones.
        let mut done = None;
        while let Some(split) = self.schema_split_below(frontier) {
            if done == Some(split) {
                break; // committed and still listed: nothing more to split
            }
            self.commit_through(split, cause, out);
            done = Some(split);
        }
        let complete = self
            .partitions
            .values()
            .flat_map(|p| p.barriers.iter())
            .filter(|(b, _)| b.prev < frontier)
            .map(|(b, _)| b.prev)
            .max();
        if let Some(epoch) = complete {
            self.commit_through(epoch, cause, out);
        }
    }

    /// Commits the data of every epoch `≤ through` and moves each partition past its barrier ending
    /// the last such epoch. Requires `through < frontier` (invariant 3).
    fn commit_through(&mut self, through: Epoch, cause: CheckpointCause, out: &mut Vec<Decision>) {
        debug_assert!(self.frontier().is_some_and(|f| through < f));
        let taken = self.staging.take_through(through);
        let streaming = self.phase == Phase::Streaming;
        let map = self.spec.map;
        let mut vnodes = Vec::new();
        let mut partitions = Vec::new();
        let mut dead_letters = Vec::new();
        for (&partition, p) in self.partitions.iter_mut() {
            // Dead letters of the committed epochs: below the offsets this checkpoint records.
            let upto = p.dead_letters.partition_point(|d| d.epoch <= through);
            dead_letters.extend(p.dead_letters.drain(..upto));
            let mut last = None;
            while p.barriers.front().is_some_and(|(b, _)| b.prev <= through) {
                last = p.barriers.pop_front();
            }
            if let Some((barrier, offset_after)) = last {
                p.committed = PartitionProgress {
                    partition,
                    next_offset: offset_after,
                    epoch: barrier.curr,
                    streaming,
                };
                for v in map.vnodes_of(partition) {
                    let progress = self.vnodes.get_mut(&v).expect("owned vnode has progress");
                    debug_assert!(progress.epoch <= barrier.prev, "vnode epoch went back");
                    progress.epoch = barrier.prev;
                    progress.finished = true;
                    progress.cursor = None;
                    progress.row_count += taken.counts.get(&v).copied().unwrap_or(0);
                    vnodes.push(progress.clone());
                }
            }
            partitions.push(p.committed.clone());
        }
        let min_committed = self.partitions.values().map(|p| p.committed.epoch).min();
        if let Some(min) = min_committed {
            self.registry = self.registry.split_off(&min);
        }
        self.push_commit(cause, Some(through), taken.rows, vnodes, partitions, out);
        if let Some(Decision::Commit(cp)) = out.last_mut() {
            cp.dead_letters = dead_letters;
        }
    }

    /// Pauses partitions that are `max_epochs_ahead` barriers ahead of the frontier or hold more
    /// than their share of `max_bytes_ahead` beyond it, and resumes the others.
    fn update_pauses(&mut self, out: &mut Vec<Decision>) {
        let Some(frontier) = self.frontier() else {
            return;
        };
        let limit = self.spec.policy.max_epochs_ahead.max(1);
        let share = self.spec.policy.max_bytes_ahead / self.partitions.len().max(1) as u64;
        let ps: Vec<(PartitionId, bool)> = self
            .partitions
            .iter_mut()
            .map(|(p, s)| {
                let ahead = s
                    .barriers
                    .iter()
                    .filter(|(b, _)| b.prev >= frontier)
                    .count();
                // Drop what the frontier has passed, in place (no new map per partition per barrier).
                while s
                    .bytes_by_epoch
                    .first_key_value()
                    .is_some_and(|(e, _)| *e <= frontier)
                {
                    s.bytes_by_epoch.pop_first();
                }
                let bytes: u64 = s.bytes_by_epoch.values().sum();
                s.over_bytes = bytes > share || (s.over_bytes && bytes > share / 2);
                (
                    *p,
                    s.open_epoch > frontier && (ahead >= limit || s.over_bytes),
                )
            })
            .collect();
        let stopped = self.poison.as_ref().map(|x| x.partition);
        for (p, ahead) in ps {
            if Some(p) != stopped {
                self.set_paused(p, ahead, out);
            }
        }
    }

    fn set_paused(&mut self, partition: PartitionId, paused: bool, out: &mut Vec<Decision>) {
        let p = self.partitions.get_mut(&partition).expect("owned");
        if p.paused != paused {
            p.paused = paused;
            out.push(if paused {
                Decision::Pause(partition)
            } else {
                Decision::Resume(partition)
            });
        }
    }

    /// The catch-up test of the log-store phase: take a probe of the high watermarks when no
    /// checkpoint barrier is staged; drop it when one appears; switch to streaming when every owned
    /// partition has been read up to its target.
    fn evaluate_probe(&mut self, out: &mut Vec<Decision>) {
        if self.partitions.is_empty() {
            return;
        }
        let staged_checkpoint = self
            .partitions
            .values()
            .any(|p| p.barriers.iter().any(|(b, _)| b.is_checkpoint()));
        if staged_checkpoint {
            self.probe = None;
            return;
        }
        if self
            .probe
            .as_ref()
            .is_some_and(|probe| !probe.targets.keys().eq(self.partitions.keys()))
        {
            // The owned set changed (a rescheduled bitmap update): probe the new set afresh.
            self.probe = None;
        }
        if self.probe.is_none() {
            let targets: Option<BTreeMap<PartitionId, u64>> = self
                .partitions
                .iter()
                .map(|(p, s)| s.high_watermark.map(|h| (*p, h)))
                .collect();
            match targets {
                Some(targets) => self.probe = Some(CatchUpProbe { targets }),
                None => return,
            }
        }
        let probe = self.probe.as_ref().expect("probe");
        let reached = self
            .partitions
            .iter()
            .all(|(p, s)| s.next_offset >= probe.targets[p]);
        if reached {
            self.probe = None;
            self.phase = Phase::Streaming;
            out.push(Decision::PhaseChanged {
                from: Phase::LogStore,
                to: Phase::Streaming,
            });
            let partitions = self
                .partitions
                .values_mut()
                .map(|p| {
                    p.committed.streaming = true;
                    p.committed.clone()
                })
                .collect();
            self.push_commit(
                CheckpointCause::CaughtUp,
                None,
                Vec::new(),
                Vec::new(),
                partitions,
                out,
            );
        }
    }

    // ----- status -----------------------------------------------------------------------------

    /// The next offset fed for an owned partition (`None`: not owned) — `status()` without building
    /// all of it.
    pub fn next_offset(&self, p: PartitionId) -> Option<u64> {
        self.partitions.get(&p).map(|s| s.next_offset)
    }

    pub fn status(&self) -> WorkerStatus {
        let log_started = matches!(self.phase, Phase::LogStore | Phase::Streaming);
        // The checkpoint epoch the store and `verify` use: every owned vnode is complete up to it.
        let committed_epoch = if log_started {
            self.vnodes.values().map(|v| v.epoch).min()
        } else {
            None
        };
        let epoch_lag_seconds = match (self.newest_epoch, committed_epoch) {
            (Some(n), Some(c)) => n.seconds_since(c),
            _ => 0.0,
        };
        WorkerStatus {
            phase: self.phase,
            generation: self.spec.generation,
            owned_vnodes: self.vnodes.len() as u32,
            snapshot_vnodes_left: self.vnodes.values().filter(|v| !v.finished).count() as u32,
            partitions: self
                .partitions
                .iter()
                .map(|(p, s)| PartitionStatus {
                    partition: *p,
                    committed_offset: s.committed.next_offset,
                    next_offset: s.next_offset,
                    settled_offset: if s.record_end <= s.committed.next_offset {
                        s.committed.next_offset.max(s.next_offset)
                    } else {
                        s.committed.next_offset
                    },
                    high_watermark: s.high_watermark,
                    open_epoch: s.open_epoch,
                    committed_epoch: s.committed.epoch,
                    paused: s.paused,
                })
                .collect(),
            committed_epoch,
            newest_epoch: self.newest_epoch,
            epoch_lag_seconds,
            counters: self.counters.clone(),
            joined: self.joined,
            caught_up: self.joined && self.partitions.is_empty()
                || (self.phase == Phase::Streaming
                    && self.partitions.values().all(|p| p.caught_up)),
        }
    }
}

fn op_index(op: Op) -> usize {
    Op::ALL.iter().position(|o| *o == op).expect("op")
}

#[cfg(test)]
#[path = "executor_tests.rs"]
mod tests;
