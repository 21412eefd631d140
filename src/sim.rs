//! A seeded, deterministic simulation of one job, running the production worker loop
//! ([`crate::driver::Driver`], the same code `kafka-backfill run` runs) on simulated ports: an
//! upstream table writing changes and barriers into an in-memory log, consumer-group members whose
//! rebalances arrive as events (cooperative: a partition is given to its new owner only after its
//! old owner acknowledged the revocation, unless the old owner froze), checkpoint commits that
//! complete when the simulator decides (late, out of step with fetching, interleaved with rebalances
//! and crashes), a shared in-memory store and the job's supervisor.
//!
//! The oracle is the upstream table: after every applied commit, each vnode's committed rows must
//! equal the upstream table at that vnode's committed epoch (or the snapshot up to its cursor). At the
//! end, with churn stopped, every worker must catch up and the store must equal the final table.
//! Same seed, same run: one generator decides everything, time is a step counter, nothing hashes.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use crate::core::{
    vnode_of, Barrier, BarrierKind, Change, Checkpoint, Epoch, LocalCheckpointPolicy, LogRecord,
    Op, PartitionId, PartitionMap, PartitionProgress, Phase, Row, Supervisor, SupervisorConfig,
    Vnode,
};
use crate::driver::{Driver, DriverConfig, DriverStats};
use crate::ports::{
    Clock, CommitDone, CommitPort, ConsumerPort, LogStore, Polled, SnapshotInfo, StateStore,
    StoreError,
};
pub use crate::rng::SimRng;
use crate::service::status::StatusBoard;
use crate::store::memory::{MemoryLog, MemorySnapshot, MemoryStore};

const JOB: &str = "sim";

/// Checkpoints a worker may have waiting before `submit` waits for the oldest (as the committer
/// thread's channel does).
const MAX_PENDING_COMMITS: usize = 2;

/// The shape of one simulated run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    pub vnode_count: u32,
    pub partition_count: u32,
    pub key_space: u32,
    pub initial_rows: u32,
    /// Epochs the upstream writes before it stops.
    pub epochs: u32,
    /// Every n-th barrier is a checkpoint.
    pub checkpoint_every: u32,
    /// Changes per epoch, at most.
    pub max_changes_per_epoch: u32,
    pub initial_workers: u32,
    pub max_workers: u32,
    /// Percent of steps that change membership or crash something (0 = a calm run).
    pub chaos_percent: u64,
    /// Percent of steps in which the upstream writes (workers work in the rest).
    pub upstream_percent: u64,
    /// Percent of deliveries that ignore a pause (records already fetched when paused).
    pub leaky_pause_percent: u64,
    pub local_checkpoint_rows: u64,
    /// Alignment back-pressure (see `JobSpec::max_epochs_ahead`).
    pub max_epochs_ahead: usize,
    /// A fetch delivers up to this many records of one partition.
    pub max_fetch_batch: u64,
    pub max_steps: u64,
    pub supervisor: SupervisorConfig,
    /// Percent of steps in which one pending checkpoint commit completes (commits otherwise
    /// complete when the worker waits for them, or when too many are pending).
    pub commit_percent: u64,
}

impl SimConfig {
    /// A random shape for `seed`.
    pub fn random(seed: u64) -> Self {
        let mut r = SimRng::new(seed.wrapping_mul(31).wrapping_add(7));
        let partition_count = 1 + r.below(4) as u32;
        let vnode_count = partition_count * (1 + r.below(4) as u32) + r.below(3) as u32;
        SimConfig {
            seed,
            vnode_count,
            partition_count,
            key_space: 8 + r.below(40) as u32,
            initial_rows: r.below(30) as u32,
            epochs: 5 + r.below(30) as u32,
            checkpoint_every: 1 + r.below(3) as u32,
            max_changes_per_epoch: 1 + r.below(8) as u32,
            initial_workers: 1 + r.below(3) as u32,
            max_workers: 4,
            chaos_percent: r.below(6),
            upstream_percent: 15 + r.below(20),
            leaky_pause_percent: r.below(10),
            local_checkpoint_rows: 1 + r.below(10),
            max_fetch_batch: 1 + r.below(8),
            max_epochs_ahead: 1 + r.below(4) as usize,
            max_steps: 200_000,
            supervisor: SupervisorConfig {
                max_recreations: 1_000,
                backoff_initial_ms: 0,
                ..SupervisorConfig::default()
            },
            commit_percent: 5 + r.below(40),
        }
    }
}

/// What a run did, for the test's summary line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimReport {
    pub steps: u64,
    pub commits: u64,
    pub rebalances: u64,
    pub crashes: u64,
    pub freezes: u64,
    pub fenced: u64,
    pub bitmap_errors: u64,
    pub recreations: u64,
    pub final_rows: usize,
    pub phases_seen: BTreeSet<Phase>,
    /// Bitmap updates seen by workers, per phase they were in.
    pub updates_by_phase: BTreeMap<Phase, u64>,
    /// Upstream was still writing when a worker first reached streaming.
    pub streamed_while_writing: bool,
}

struct Upstream {
    map: PartitionMap,
    rng_values: u64,
    table: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The table at the end of each completed epoch (and at `Es`).
    history: BTreeMap<Epoch, BTreeMap<Vec<u8>, Vec<u8>>>,
    log: MemoryLog,
    epoch: Epoch,
    barriers: u32,
    epochs_left: u32,
    changes_in_epoch: u32,
}

fn key_bytes(k: u32) -> Vec<u8> {
    k.to_be_bytes().to_vec()
}

impl Upstream {
    fn next_value(&mut self) -> Vec<u8> {
        self.rng_values += 1;
        format!("v{}", self.rng_values).into_bytes()
    }

    fn write_change(&mut self, rng: &mut SimRng, key_space: u32) {
        let key = key_bytes(rng.below(key_space as u64) as u32);
        let vnode = vnode_of(&key, self.map.vnode_count());
        let partition = self.map.partition_of(vnode);
        let epoch = self.epoch;
        let emit = |log: &mut MemoryLog, op: Op, value: Vec<u8>| {
            log.append(
                partition,
                LogRecord::Change(Change {
                    epoch,
                    op,
                    vnode,
                    row: Row {
                        key: key.clone(),
                        value,
                    },
                }),
            );
        };
        match self.table.get(&key).cloned() {
            Some(old) if rng.chance(40) => {
                emit(&mut self.log, Op::Delete, old);
                self.table.remove(&key);
            }
            Some(old) => {
                let new = self.next_value();
                emit(&mut self.log, Op::UpdateDelete, old);
                emit(&mut self.log, Op::UpdateInsert, new.clone());
                self.table.insert(key.clone(), new);
            }
            None => {
                let new = self.next_value();
                emit(&mut self.log, Op::Insert, new.clone());
                self.table.insert(key.clone(), new);
            }
        }
        self.changes_in_epoch += 1;
    }

    fn end_epoch(&mut self, checkpoint_every: u32) {
        self.barriers += 1;
        let kind = if self.barriers % checkpoint_every == 0 || self.epochs_left == 1 {
            BarrierKind::Checkpoint
        } else {
            BarrierKind::Barrier
        };
        self.epochs_left -= 1;
        self.write_barrier(kind);
    }

    fn write_barrier(&mut self, kind: BarrierKind) {
        let next = Epoch(self.epoch.0 + (1 << 16) * 1000); // one simulated second per epoch
        let barrier = Barrier {
            prev: self.epoch,
            curr: next,
            kind,
        };
        for p in 0..self.map.partition_count() {
            self.log.append(p, LogRecord::Barrier(barrier));
        }
        self.history.insert(self.epoch, self.table.clone());
        self.epoch = next;
        self.changes_in_epoch = 0;
    }

    fn writing(&self) -> bool {
        self.epochs_left > 0
    }
}

// ----- the simulated world the ports share -----------------------------------------------------

/// One member's consumer, as the group and the fetcher see it.
#[derive(Default)]
struct ConsumerState {
    /// Group events not yet polled.
    inbox: VecDeque<Polled>,
    /// Assigned partitions: (next offset to deliver, paused).
    assigned: BTreeMap<PartitionId, (u64, bool)>,
    /// Records the member may still be handed in the current step.
    allowance: usize,
}

impl ConsumerState {
    /// What the member will hold once it has polled its inbox.
    fn eventual(&self) -> BTreeSet<PartitionId> {
        let mut holds: BTreeSet<PartitionId> = self.assigned.keys().copied().collect();
        for e in &self.inbox {
            match e {
                Polled::Assigned(ps) => holds.extend(ps.iter().copied()),
                Polled::Revoked { partitions, .. } => {
                    for p in partitions {
                        holds.remove(p);
                    }
                }
                _ => {}
            }
        }
        holds
    }
}

/// One member's committer: checkpoints handed over, outcomes not yet taken.
#[derive(Default)]
struct CommitQueue {
    pending: VecDeque<Checkpoint>,
    done: Vec<CommitDone>,
    poisoned: bool,
}

struct World {
    rng: SimRng,
    config: SimConfig,
    map: PartitionMap,
    info: SnapshotInfo,
    upstream: Upstream,
    store: MemoryStore,
    now_ms: u64,
    consumers: Vec<ConsumerState>,
    commits: Vec<CommitQueue>,
    /// Commits applied to the store.
    applied: u64,
    /// The first oracle violation.
    violation: Option<String>,
}

impl World {
    /// Applies member `i`'s oldest pending checkpoint (the committer thread's work), then checks
    /// the oracle.
    fn apply_commit(&mut self, i: usize) {
        let Some(cp) = self.commits[i].pending.pop_front() else {
            return;
        };
        let result = if self.commits[i].poisoned {
            Err(StoreError::Backend(
                "an earlier checkpoint failed; later ones are not applied".into(),
            ))
        } else {
            self.store.commit(JOB, &cp)
        };
        if result.is_ok() {
            self.applied += 1;
            if let Err(v) = self.oracle_check() {
                self.violation.get_or_insert(v);
            }
        } else {
            self.commits[i].poisoned = true;
        }
        self.commits[i].done.push(CommitDone {
            checkpoint: cp,
            result,
            elapsed_ms: 0.0,
        });
    }

    /// Every committed vnode agrees with the upstream table at its committed epoch.
    fn oracle_check(&self) -> SimResult<()> {
        let es = self.info.snapshot_epoch;
        let progress = self.store.vnode_progress(JOB);
        let rows = self.store.clone().rows(JOB).map_err(|e| e.to_string())?;
        let mut by_vnode: BTreeMap<Vnode, BTreeMap<&Vec<u8>, &Vec<u8>>> = BTreeMap::new();
        for (k, v) in &rows {
            by_vnode
                .entry(vnode_of(k, self.map.vnode_count()))
                .or_default()
                .insert(k, v);
        }
        for v in 0..self.map.vnode_count() as Vnode {
            let actual = by_vnode.remove(&v).unwrap_or_default();
            let (at, upto): (Epoch, Option<&Vec<u8>>) = match progress.get(&v) {
                None => (es, Some(&EMPTY)),
                Some(p) if p.epoch == es && !p.finished => {
                    (es, Some(p.cursor.as_ref().unwrap_or(&EMPTY)))
                }
                Some(p) => (p.epoch, None),
            };
            let table = self.upstream.history.get(&at).ok_or_else(|| {
                format!("vnode {v} committed at epoch {at}, which the upstream never completed")
            })?;
            let expected: BTreeMap<&Vec<u8>, &Vec<u8>> = table
                .iter()
                .filter(|(k, _)| vnode_of(k, self.map.vnode_count()) == v)
                .filter(|(k, _)| upto.is_none_or(|c| !c.is_empty() && *k <= c))
                .collect();
            if actual != expected {
                return Err(format!(
                    "vnode {v} at epoch {at} (cursor {upto:?}): store has {} rows, upstream {} rows: {actual:?} vs {expected:?}",
                    actual.len(),
                    expected.len()
                ));
            }
        }
        Ok(())
    }
}

type Shared = Rc<RefCell<World>>;

/// A simulated group member's consumer: group events first, then records of unpaused partitions
/// (a paused one leaks with `leaky_pause_percent`, as prefetched records do).
pub struct SimConsumer {
    world: Shared,
    i: usize,
}

impl ConsumerPort for SimConsumer {
    fn poll(&mut self, _timeout_ms: u64) -> Option<Polled> {
        let mut guard = self.world.borrow_mut();
        let w = &mut *guard;
        let c = &mut w.consumers[self.i];
        if let Some(e) = c.inbox.pop_front() {
            return Some(e);
        }
        if c.allowance == 0 {
            return None;
        }
        c.allowance -= 1;
        let leaky = w.rng.chance(w.config.leaky_pause_percent);
        let log = &w.upstream.log;
        let ready: Vec<PartitionId> = w.consumers[self.i]
            .assigned
            .iter()
            .filter(|(p, (off, paused))| (!paused || leaky) && *off < log.high_watermark(**p))
            .map(|(p, _)| *p)
            .collect();
        if ready.is_empty() {
            return None;
        }
        let p = ready[w.rng.below(ready.len() as u64) as usize];
        let at = w.consumers[self.i].assigned[&p].0;
        let (offset, record) = w.upstream.log.read(p, at, 1).pop()?;
        w.consumers[self.i]
            .assigned
            .get_mut(&p)
            .expect("assigned")
            .0 = offset + 1;
        Some(Polled::Record {
            partition: p,
            offset,
            record: Ok(record),
        })
    }

    fn assign(&mut self, starts: &[(PartitionId, Option<u64>)]) {
        let mut w = self.world.borrow_mut();
        for &(p, offset) in starts {
            // Without a claimed offset the group would start at its own committed offset: the
            // snapshot's start stands in for it (the loop seeks before it reads).
            let from = offset.unwrap_or_else(|| w.info.start_of(p).map_or(0, |s| s.next_offset));
            w.consumers[self.i].assigned.insert(p, (from, false));
        }
    }

    fn unassign(&mut self, partitions: &[PartitionId]) {
        let mut w = self.world.borrow_mut();
        // The loop's contract: a revocation is acknowledged only once every commit before it is
        // durable (the new owner starts from the store).
        let pending = w.commits[self.i].pending.len();
        if pending > 0 {
            let v = format!(
                "worker w{} acknowledged the revocation of partitions {partitions:?} with {pending} commit(s) still pending",
                self.i
            );
            w.violation.get_or_insert(v);
        }
        for p in partitions {
            w.consumers[self.i].assigned.remove(p);
        }
    }

    fn seek(&mut self, partition: PartitionId, offset: u64) -> Result<(), String> {
        let mut w = self.world.borrow_mut();
        match w.consumers[self.i].assigned.get_mut(&partition) {
            Some(a) => {
                a.0 = offset;
                Ok(())
            }
            None => Err(format!("partition {partition} is not assigned")),
        }
    }

    fn pause(&mut self, partition: PartitionId) {
        if let Some(a) = self.world.borrow_mut().consumers[self.i]
            .assigned
            .get_mut(&partition)
        {
            a.1 = true;
        }
    }

    fn resume(&mut self, partition: PartitionId) {
        if let Some(a) = self.world.borrow_mut().consumers[self.i]
            .assigned
            .get_mut(&partition)
        {
            a.1 = false;
        }
    }

    fn commit_offsets(&mut self, _progress: &[PartitionProgress], _sync: bool) {}

    fn high_watermark(&mut self, partition: PartitionId) -> Option<u64> {
        Some(self.world.borrow().upstream.log.high_watermark(partition))
    }

    fn read_position(&mut self, _partition: PartitionId) -> Option<u64> {
        None // the simulated log has no transaction markers
    }

    fn assignment(&mut self) -> Vec<PartitionId> {
        self.world.borrow().consumers[self.i]
            .assigned
            .keys()
            .copied()
            .collect()
    }

    fn close(&mut self, _leave: bool) {}
}

/// A simulated committer: checkpoints wait until the simulator completes them, the worker waits for
/// them (`drain`), or too many are pending.
pub struct SimCommitter {
    world: Shared,
    i: usize,
}

impl CommitPort for SimCommitter {
    fn submit(&mut self, checkpoint: Checkpoint) {
        let mut w = self.world.borrow_mut();
        if w.commits[self.i].pending.len() >= MAX_PENDING_COMMITS {
            w.apply_commit(self.i);
        }
        w.commits[self.i].pending.push_back(checkpoint);
    }

    fn finished(&mut self) -> Vec<CommitDone> {
        std::mem::take(&mut self.world.borrow_mut().commits[self.i].done)
    }

    fn drain(&mut self) -> Vec<CommitDone> {
        let mut w = self.world.borrow_mut();
        while !w.commits[self.i].pending.is_empty() {
            w.apply_commit(self.i);
        }
        std::mem::take(&mut w.commits[self.i].done)
    }

    fn restart(&mut self) -> Result<(), StoreError> {
        let mut w = self.world.borrow_mut();
        while !w.commits[self.i].pending.is_empty() {
            w.apply_commit(self.i);
        }
        w.commits[self.i] = CommitQueue::default();
        Ok(())
    }
}

/// Simulated time: one millisecond per step; a throttling wait moves it on.
pub struct SimClock {
    world: Shared,
}

impl Clock for SimClock {
    fn now_ms(&self) -> u64 {
        self.world.borrow().now_ms
    }

    fn sleep_ms(&mut self, ms: u64) {
        self.world.borrow_mut().now_ms += ms;
    }
}

type SimDriver = Driver<SimConsumer, SimCommitter, SimClock>;

struct SimWorker {
    id: String,
    driver: Option<SimDriver>,
    member: bool,
    alive: bool,
    frozen: bool,
    /// After a thaw: steps until the worker learns its assignment was lost and rejoins.
    rejoin_in: Option<u64>,
    /// What this worker's earlier drivers did (before a crash-restart).
    past: DriverStats,
}

/// One simulated job.
pub struct Sim {
    pub config: SimConfig,
    world: Shared,
    info: SnapshotInfo,
    snapshot: Arc<MemorySnapshot>,
    store: MemoryStore,
    workers: Vec<SimWorker>,
    supervisor: Arc<Mutex<Supervisor>>,
    board: StatusBoard,
    /// The partitions the group wants each member to hold after the last rebalance.
    target: BTreeMap<usize, BTreeSet<PartitionId>>,
    steps: u64,
    rebalances: u64,
    crashes: u64,
    freezes: u64,
    streamed_while_writing: bool,
    final_rows: usize,
}

type SimResult<T> = Result<T, String>;

impl Sim {
    pub fn new(config: SimConfig) -> Self {
        let mut rng = SimRng::new(config.seed);
        let map =
            PartitionMap::new(config.vnode_count, config.partition_count).expect("valid shape");
        let es = Epoch::from_unix_millis(crate::core::epoch::EPOCH_BASE_UNIX_MILLIS + 1_000_000);
        let mut table = BTreeMap::new();
        for i in 0..config.initial_rows {
            let k = rng.below(config.key_space as u64) as u32;
            table.insert(key_bytes(k), format!("init{i}").into_bytes());
        }
        let mut rows: BTreeMap<Vnode, BTreeMap<Vec<u8>, Vec<u8>>> = BTreeMap::new();
        for (k, v) in &table {
            rows.entry(vnode_of(k, map.vnode_count()))
                .or_default()
                .insert(k.clone(), v.clone());
        }
        // Each partition starts with the barrier that ends Es; the log store starts after it.
        let e1 = Epoch(es.0 + (1 << 16) * 1000);
        let mut log = MemoryLog::new(config.partition_count);
        let first = Barrier {
            prev: es,
            curr: e1,
            kind: BarrierKind::Initial,
        };
        let mut start = Vec::new();
        for p in 0..config.partition_count {
            log.append(p, LogRecord::Barrier(first));
            start.push(PartitionProgress {
                partition: p,
                next_offset: 1,
                epoch: e1,
                streaming: false,
            });
        }
        let info = SnapshotInfo {
            snapshot_epoch: es,
            vnode_count: config.vnode_count,
            partition_count: config.partition_count,
            start,
        };
        let snapshot = Arc::new(MemorySnapshot {
            info: info.clone(),
            rows,
        });
        let mut history = BTreeMap::new();
        history.insert(es, table.clone());
        let upstream = Upstream {
            map,
            rng_values: 0,
            table,
            history,
            log,
            epoch: e1,
            barriers: 0,
            epochs_left: config.epochs,
            changes_in_epoch: 0,
        };
        let mut store = MemoryStore::new();
        store.ensure_job(JOB, &info).expect("job");
        let supervisor = Arc::new(Mutex::new(Supervisor::new(config.supervisor)));
        let world = Rc::new(RefCell::new(World {
            rng,
            config: config.clone(),
            map,
            info: info.clone(),
            upstream,
            store: store.clone(),
            now_ms: 0,
            consumers: Vec::new(),
            commits: Vec::new(),
            applied: 0,
            violation: None,
        }));
        Sim {
            config,
            world,
            info,
            snapshot,
            store,
            workers: Vec::new(),
            supervisor,
            board: StatusBoard::default(),
            target: BTreeMap::new(),
            steps: 0,
            rebalances: 0,
            crashes: 0,
            freezes: 0,
            streamed_while_writing: false,
            final_rows: 0,
        }
    }

    /// Runs the whole schedule: churn while the upstream writes, then a calm drain, then the final
    /// oracle check. `Err` carries what went wrong.
    pub fn run(&mut self) -> SimResult<SimReport> {
        for _ in 0..self.config.initial_workers {
            self.add_worker()?;
        }
        self.rebalance();
        let mut steps = 0u64;
        while self.world.borrow().upstream.writing() {
            steps += 1;
            if steps > self.config.max_steps {
                return Err("upstream did not finish writing within max_steps".into());
            }
            self.step(true)?;
        }
        self.calm_down()?;
        let mut drained = 0u64;
        while !self.converged() {
            drained += 1;
            if drained > self.config.max_steps {
                return Err(format!(
                    "did not converge after the upstream stopped: {}",
                    self.describe()
                ));
            }
            self.step(false)?;
        }
        self.steps = steps + drained;
        self.final_check()?;
        Ok(self.report())
    }

    /// One scheduling step: churn, an upstream write, a commit completing, or a worker's loop step.
    pub fn step(&mut self, chaos: bool) -> SimResult<()> {
        self.world.borrow_mut().now_ms += 1;
        self.deliver_assignments();
        let (chaos_now, write_now) = {
            let mut w = self.world.borrow_mut();
            let c = chaos && w.rng.chance(self.config.chaos_percent);
            let writing = w.upstream.writing();
            let wr = !c && writing && w.rng.chance(self.config.upstream_percent);
            (c, wr)
        };
        if chaos_now {
            return self.chaos();
        }
        if write_now {
            let mut guard = self.world.borrow_mut();
            let w = &mut *guard;
            if w.upstream.changes_in_epoch >= self.config.max_changes_per_epoch || w.rng.chance(25)
            {
                w.upstream.end_epoch(self.config.checkpoint_every);
            } else {
                w.upstream.write_change(&mut w.rng, self.config.key_space);
            }
            return Ok(());
        }
        self.worker_step()
    }

    // ----- scripted control (named scenarios) ----------------------------------------------------

    /// Adds a worker to the group and completes the rebalance; returns its index.
    pub fn join(&mut self) -> SimResult<usize> {
        let i = self.add_worker()?;
        self.rebalance();
        self.settle_group()?;
        Ok(i)
    }

    /// Worker `i` leaves gracefully: it commits what is complete and leaves the group.
    pub fn leave(&mut self, i: usize) -> SimResult<()> {
        if let Some(d) = self.workers[i].driver.as_mut() {
            d.shutdown();
        }
        self.retire(i);
        self.rebalance();
        self.check()?;
        self.settle_group()
    }

    /// Worker `i` dies without a word; the group reassigns its partitions.
    pub fn crash(&mut self, i: usize) -> SimResult<()> {
        self.crashes += 1;
        self.retire(i);
        self.rebalance();
        self.settle_group()
    }

    /// Worker `i` dies and comes back at once as the same member (a static member's restart): the
    /// group hands it the same partitions, and its loop starts from the store.
    pub fn crash_and_restart(&mut self, i: usize) -> SimResult<()> {
        self.crashes += 1;
        self.restart_in_place(i)?;
        self.settle_group()
    }

    /// Worker `i` stops answering; the group moves its partitions to others.
    pub fn freeze(&mut self, i: usize) -> SimResult<()> {
        self.freezes += 1;
        self.workers[i].frozen = true;
        self.workers[i].member = false;
        self.rebalance();
        self.settle_group()
    }

    /// Worker `i` runs again; a few steps later it learns it lost its assignment and rejoins.
    pub fn thaw(&mut self, i: usize) {
        self.workers[i].frozen = false;
        let n = self.world.borrow_mut().rng.below(5);
        self.workers[i].rejoin_in = Some(n);
    }

    /// The upstream writes `changes` changes and ends the epoch with a barrier of `kind`.
    pub fn write_epoch(&mut self, changes: u32, kind: BarrierKind) {
        self.write_changes(changes);
        self.world.borrow_mut().upstream.write_barrier(kind);
    }

    /// The upstream writes changes of the open epoch without ending it.
    pub fn write_changes(&mut self, changes: u32) {
        let mut guard = self.world.borrow_mut();
        let w = &mut *guard;
        for _ in 0..changes {
            w.upstream.write_change(&mut w.rng, self.config.key_space);
        }
    }

    /// Lets workers (only) run until `done` holds, at most `max` steps.
    pub fn run_until(&mut self, max: u64, done: impl Fn(&Sim) -> bool) -> SimResult<()> {
        for _ in 0..max {
            if done(self) {
                return Ok(());
            }
            self.world.borrow_mut().now_ms += 1;
            self.deliver_assignments();
            self.worker_step()?;
        }
        if done(self) {
            Ok(())
        } else {
            Err(format!(
                "condition not reached in {max} steps: {}",
                self.describe()
            ))
        }
    }

    /// Lets workers (only) run exactly `steps` steps; a violation the oracle finds is an error.
    pub fn run_steps(&mut self, steps: u64) -> SimResult<()> {
        for _ in 0..steps {
            self.world.borrow_mut().now_ms += 1;
            self.deliver_assignments();
            self.worker_step()?;
        }
        Ok(())
    }

    /// Runs workers until everything written is committed and every member streams, then checks
    /// the store against the upstream table.
    pub fn settle(&mut self) -> SimResult<()> {
        self.calm_down()?;
        self.run_until(self.config.max_steps, |s| s.converged())?;
        self.final_check()
    }

    /// The phase worker `i` is in (`None` when it is not running).
    pub fn phase(&self, i: usize) -> Option<Phase> {
        self.workers[i].driver.as_ref().and_then(|d| d.phase())
    }

    /// Partitions assigned to worker `i`.
    pub fn owned(&self, i: usize) -> Vec<PartitionId> {
        self.world.borrow().consumers[i]
            .assigned
            .keys()
            .copied()
            .collect()
    }

    /// Checkpoints worker `i` handed over that are not applied yet.
    pub fn pending_commits(&self, i: usize) -> usize {
        self.world.borrow().commits[i].pending.len()
    }

    pub fn store(&self) -> &MemoryStore {
        &self.store
    }

    pub fn generation(&self) -> u64 {
        self.store.job_row(JOB).expect("job").generation
    }

    pub fn snapshot_info(&self) -> &SnapshotInfo {
        &self.info
    }

    /// What the run did so far.
    pub fn report(&self) -> SimReport {
        let mut stats = DriverStats::default();
        for w in &self.workers {
            for s in std::iter::once(&w.past).chain(w.driver.as_ref().map(|d| d.stats())) {
                add_stats(&mut stats, s);
            }
        }
        SimReport {
            steps: self.steps,
            commits: self.world.borrow().applied,
            rebalances: self.rebalances,
            crashes: self.crashes,
            freezes: self.freezes,
            fenced: stats.fenced,
            bitmap_errors: stats.bitmap_errors_by_phase.values().sum(),
            recreations: stats.recreations,
            final_rows: self.final_rows,
            phases_seen: stats.phases_seen,
            updates_by_phase: stats.updates_by_phase,
            streamed_while_writing: self.streamed_while_writing,
        }
    }

    // ----- membership ---------------------------------------------------------------------------

    fn add_worker(&mut self) -> SimResult<usize> {
        let i = self.workers.len();
        {
            let mut w = self.world.borrow_mut();
            w.consumers.push(ConsumerState::default());
            w.commits.push(CommitQueue::default());
        }
        self.workers.push(SimWorker {
            id: format!("w{i}"),
            driver: None,
            member: true,
            alive: true,
            frozen: false,
            rejoin_in: None,
            past: DriverStats::default(),
        });
        self.start_driver(i)?;
        Ok(i)
    }

    /// A new loop for worker `i` (its executor starts from the store).
    fn start_driver(&mut self, i: usize) -> SimResult<()> {
        let cfg = DriverConfig {
            job: JOB.into(),
            topic: "sim-log".into(),
            worker: self.workers[i].id.clone(),
            local_checkpoint: LocalCheckpointPolicy {
                max_rows: self.config.local_checkpoint_rows,
                max_interval_ms: 50,
            },
            max_epochs_ahead: self.config.max_epochs_ahead,
            max_rows_per_second: 0,
            max_messages_per_round: 64,
            max_scan_rows_per_round: self.config.max_fetch_batch as usize,
            idle_poll_ms: 0,
            housekeeping_ms: 1,
            static_member: false,
        };
        let driver = Driver::new(
            cfg,
            SimConsumer {
                world: self.world.clone(),
                i,
            },
            SimCommitter {
                world: self.world.clone(),
                i,
            },
            SimClock {
                world: self.world.clone(),
            },
            Box::new(self.store.clone()),
            self.snapshot.clone(),
            self.supervisor.clone(),
            self.board.clone(),
        )
        .map_err(|f| format!("worker {} did not start: {f}", self.workers[i].id))?;
        self.workers[i].driver = Some(driver);
        Ok(())
    }

    fn drop_driver(&mut self, i: usize) {
        if let Some(d) = self.workers[i].driver.take() {
            add_stats(&mut self.workers[i].past, d.stats());
        }
    }

    fn members(&self) -> Vec<usize> {
        (0..self.workers.len())
            .filter(|&i| self.workers[i].alive && self.workers[i].member)
            .collect()
    }

    /// The coordinator's new target, and every member told what it loses. Members that froze are
    /// not members: their partitions are given away without their word (they become zombies).
    fn rebalance(&mut self) {
        let members = self.members();
        self.target.clear();
        if members.is_empty() {
            return;
        }
        self.rebalances += 1;
        for p in 0..self.config.partition_count {
            self.target
                .entry(members[p as usize % members.len()])
                .or_default()
                .insert(p);
        }
        let mut w = self.world.borrow_mut();
        for &i in &members {
            let keep = self.target.get(&i).cloned().unwrap_or_default();
            let lose: Vec<PartitionId> = w.consumers[i]
                .eventual()
                .difference(&keep)
                .copied()
                .collect();
            if !lose.is_empty() {
                w.consumers[i].inbox.push_back(Polled::Revoked {
                    partitions: lose,
                    lost: false,
                });
            }
        }
    }

    /// Gives each member the partitions of its target that no other member holds any more
    /// (cooperative: the old owner acknowledged the revocation first).
    fn deliver_assignments(&mut self) {
        let members = self.members();
        let mut w = self.world.borrow_mut();
        let eventual: BTreeMap<usize, BTreeSet<PartitionId>> = members
            .iter()
            .map(|&i| {
                let mut h = w.consumers[i].eventual();
                h.extend(w.consumers[i].assigned.keys().copied());
                (i, h)
            })
            .collect();
        for &i in &members {
            let Some(want) = self.target.get(&i) else {
                continue;
            };
            let gain: Vec<PartitionId> = want
                .iter()
                .copied()
                .filter(|p| !eventual[&i].contains(p))
                .filter(|p| members.iter().all(|&j| j == i || !eventual[&j].contains(p)))
                .collect();
            if !gain.is_empty() {
                w.consumers[i].inbox.push_back(Polled::Assigned(gain));
            }
        }
    }

    /// Runs the members with group events until none is left (a scripted rebalance completes).
    fn settle_group(&mut self) -> SimResult<()> {
        for _ in 0..1_000 {
            self.deliver_assignments();
            let busy: Vec<usize> = (0..self.workers.len())
                .filter(|&i| self.runnable(i) && !self.world.borrow().consumers[i].inbox.is_empty())
                .collect();
            if busy.is_empty() {
                return Ok(());
            }
            for i in busy {
                self.work(i, 0)?;
            }
        }
        Err(format!("the group did not settle: {}", self.describe()))
    }

    fn runnable(&self, i: usize) -> bool {
        let w = &self.workers[i];
        w.alive && !w.frozen && w.driver.is_some()
    }

    fn chaos(&mut self) -> SimResult<()> {
        let n = self.workers.len();
        let pick = |s: &Sim, n: u64| s.world.borrow_mut().rng.below(n);
        match pick(self, 6) {
            0 if self.members().len() < self.config.max_workers as usize => {
                self.add_worker()?;
                self.rebalance();
                Ok(())
            }
            1 if self.members().len() > 1 => {
                // Graceful leave: commit what is complete, then go.
                let members = self.members();
                let i = members[pick(self, members.len() as u64) as usize];
                if self.workers[i].frozen {
                    return Ok(());
                }
                if let Some(d) = self.workers[i].driver.as_mut() {
                    d.shutdown();
                }
                self.retire(i);
                self.rebalance();
                self.check()
            }
            2 if n > 0 => {
                // Crash: the worker disappears mid-flight (its pending commits with it).
                let i = pick(self, n as u64) as usize;
                if !self.workers[i].alive {
                    return Ok(());
                }
                self.crashes += 1;
                self.retire(i);
                if self.members().is_empty() {
                    self.add_worker()?;
                }
                self.rebalance();
                Ok(())
            }
            3 if n > 0 => {
                // Freeze: the worker stops; after its session times out the group moves on.
                let i = pick(self, n as u64) as usize;
                if !self.workers[i].alive || self.workers[i].frozen || self.members().len() < 2 {
                    return Ok(());
                }
                self.freezes += 1;
                self.workers[i].frozen = true;
                self.workers[i].member = false;
                self.rebalance();
                Ok(())
            }
            4 => {
                // Thaw a frozen worker: it goes on with what it believes it owns, for a while.
                if let Some(i) = (0..n).find(|&i| self.workers[i].frozen) {
                    self.thaw(i);
                }
                Ok(())
            }
            _ => {
                // Crash and restart in place: same membership, the loop rebuilt from the store.
                let alive: Vec<usize> = (0..n)
                    .filter(|&i| self.workers[i].alive && !self.workers[i].frozen)
                    .collect();
                if alive.is_empty() {
                    return Ok(());
                }
                let i = alive[pick(self, alive.len() as u64) as usize];
                self.crashes += 1;
                self.restart_in_place(i)
            }
        }
    }

    /// The worker is gone: its loop, consumer and pending commits.
    fn retire(&mut self, i: usize) {
        self.drop_driver(i);
        let w = &mut self.workers[i];
        w.alive = false;
        w.member = false;
        w.rejoin_in = None;
        let mut world = self.world.borrow_mut();
        world.consumers[i] = ConsumerState::default();
        world.commits[i] = CommitQueue::default();
    }

    fn restart_in_place(&mut self, i: usize) -> SimResult<()> {
        let holds = self.world.borrow().consumers[i].eventual();
        self.drop_driver(i);
        {
            let mut w = self.world.borrow_mut();
            w.commits[i] = CommitQueue::default();
            w.consumers[i] = ConsumerState::default();
            if self.workers[i].member && !holds.is_empty() {
                w.consumers[i]
                    .inbox
                    .push_back(Polled::Assigned(holds.into_iter().collect()));
            }
        }
        self.workers[i].rejoin_in = None;
        self.start_driver(i)?;
        if !self.workers[i].member {
            self.workers[i].member = true;
            self.rebalance();
        }
        Ok(())
    }

    /// Stops churn: thaws and re-admits everyone, makes sure someone works.
    fn calm_down(&mut self) -> SimResult<()> {
        let mut changed = false;
        for i in 0..self.workers.len() {
            if self.workers[i].frozen {
                self.workers[i].frozen = false;
            }
            if self.workers[i].alive && !self.workers[i].member {
                self.workers[i].rejoin_in = Some(0);
            }
        }
        if self.members().is_empty() && !self.workers.iter().any(|w| w.rejoin_in.is_some()) {
            self.add_worker()?;
            changed = true;
        }
        if changed {
            self.rebalance();
        }
        Ok(())
    }

    // ----- work ---------------------------------------------------------------------------------

    /// A pending commit completes (sometimes), else a random runnable worker runs a loop step.
    fn worker_step(&mut self) -> SimResult<()> {
        let complete = {
            let mut w = self.world.borrow_mut();
            w.rng.chance(self.config.commit_percent)
        };
        if complete {
            let pending: Vec<usize> = (0..self.workers.len())
                .filter(|&i| self.runnable(i) && !self.world.borrow().commits[i].pending.is_empty())
                .collect();
            if !pending.is_empty() {
                let mut w = self.world.borrow_mut();
                let i = pending[w.rng.below(pending.len() as u64) as usize];
                w.apply_commit(i);
                drop(w);
                return self.check();
            }
        }
        let runnable: Vec<usize> = (0..self.workers.len())
            .filter(|&i| self.runnable(i))
            .collect();
        if runnable.is_empty() {
            return Ok(());
        }
        let (i, batch) = {
            let mut w = self.world.borrow_mut();
            let i = runnable[w.rng.below(runnable.len() as u64) as usize];
            (i, 1 + w.rng.below(self.config.max_fetch_batch) as usize)
        };
        self.work(i, batch)
    }

    /// One loop step of worker `i`, handed at most `batch` records.
    fn work(&mut self, i: usize, batch: usize) -> SimResult<()> {
        match self.workers[i].rejoin_in {
            Some(0) => {
                // The thawed zombie learns at its next heartbeat that it was dropped: its
                // assignment is lost, and it rejoins.
                self.workers[i].rejoin_in = None;
                {
                    let mut w = self.world.borrow_mut();
                    let lost: Vec<PartitionId> = w.consumers[i].eventual().into_iter().collect();
                    if !lost.is_empty() {
                        w.consumers[i].inbox.push_back(Polled::Revoked {
                            partitions: lost,
                            lost: true,
                        });
                    }
                }
                self.workers[i].member = true;
                self.rebalance();
            }
            Some(n) => self.workers[i].rejoin_in = Some(n - 1),
            None => {}
        }
        self.world.borrow_mut().consumers[i].allowance = batch;
        let id = self.workers[i].id.clone();
        let driver = self.workers[i].driver.as_mut().expect("runnable");
        let r = driver.step();
        self.world.borrow_mut().consumers[i].allowance = 0;
        r.map_err(|e| format!("worker {id}: {e}"))?;
        self.check()
    }

    /// The oracle's verdict so far, and what the report notes after each step.
    fn check(&mut self) -> SimResult<()> {
        if let Some(v) = self.world.borrow().violation.clone() {
            return Err(v);
        }
        for w in &self.workers {
            for s in std::iter::once(&w.past).chain(w.driver.as_ref().map(|d| d.stats())) {
                if let Some(phase) = s
                    .bitmap_errors_by_phase
                    .keys()
                    .find(|p| **p != Phase::LogStore)
                {
                    return Err(format!(
                        "worker {} raised the invariant error outside the log-store phase ({phase:?})",
                        w.id
                    ));
                }
            }
        }
        if self.world.borrow().upstream.writing()
            && self
                .workers
                .iter()
                .any(|w| w.driver.as_ref().and_then(|d| d.phase()) == Some(Phase::Streaming))
        {
            self.streamed_while_writing = true;
        }
        Ok(())
    }

    fn converged(&self) -> bool {
        let w = self.world.borrow();
        if w.upstream.writing() {
            return false;
        }
        let parts = self.store.partition_progress(JOB);
        let all_committed = (0..self.config.partition_count).all(|p| {
            parts
                .get(&p)
                .is_some_and(|pp| pp.next_offset == w.upstream.log.high_watermark(p))
        });
        let quiet = w.commits.iter().all(|c| c.pending.is_empty())
            && w.consumers.iter().all(|c| c.inbox.is_empty());
        let all_streaming = self
            .workers
            .iter()
            .filter(|x| x.alive && x.member)
            .all(|x| {
                x.driver
                    .as_ref()
                    .and_then(|d| d.phase())
                    .is_some_and(|p| matches!(p, Phase::Streaming | Phase::Unassigned))
            });
        all_committed && quiet && all_streaming
    }

    fn final_check(&mut self) -> SimResult<()> {
        self.check()?;
        let w = self.world.borrow();
        w.oracle_check()?;
        let rows = self.store.rows(JOB).map_err(|e| e.to_string())?;
        if rows != w.upstream.table {
            return Err(format!(
                "final table differs: store {} rows, upstream {} rows",
                rows.len(),
                w.upstream.table.len()
            ));
        }
        let last = *w.upstream.history.keys().last().unwrap();
        for (v, p) in self.store.vnode_progress(JOB) {
            if p.epoch != last {
                return Err(format!(
                    "vnode {v} ends at epoch {} instead of {last}",
                    p.epoch
                ));
            }
        }
        drop(w);
        self.final_rows = rows.len();
        Ok(())
    }

    fn describe(&self) -> String {
        let world = self.world.borrow();
        let ws: Vec<String> = self
            .workers
            .iter()
            .enumerate()
            .filter(|(_, w)| w.alive)
            .map(|(i, w)| {
                format!(
                    "{}(member={} frozen={} assigned={:?} inbox={:?} pending_commits={} status={:?})",
                    w.id,
                    w.member,
                    w.frozen,
                    world.consumers[i].assigned,
                    world.consumers[i].inbox,
                    world.commits[i].pending.len(),
                    w.driver.as_ref().and_then(|d| d.status())
                )
            })
            .collect();
        format!(
            "{ws:?} store partitions {:?}",
            self.store.partition_progress(JOB)
        )
    }
}

fn add_stats(into: &mut DriverStats, s: &DriverStats) {
    into.commits += s.commits;
    into.fenced += s.fenced;
    into.recreations += s.recreations;
    for (p, n) in &s.bitmap_errors_by_phase {
        *into.bitmap_errors_by_phase.entry(*p).or_default() += n;
    }
    for (p, n) in &s.updates_by_phase {
        *into.updates_by_phase.entry(*p).or_default() += n;
    }
    into.phases_seen.extend(s.phases_seen.iter().copied());
}

static EMPTY: Vec<u8> = Vec::new();
