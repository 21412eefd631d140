//! A seeded, deterministic simulation of one job: an upstream table writing changes and barriers into
//! an in-memory log, several workers driving real [`Executor`]s against a shared in-memory store, a
//! group coordinator that rebalances as workers join, leave, crash and freeze, and the supervisor
//! recreating the job on the log-store invariant error.
//!
//! The oracle is the upstream table: after every successful commit, each vnode's committed rows must
//! equal the upstream table at that vnode's committed epoch (or the snapshot up to its cursor). At the
//! end, with churn stopped, every worker must catch up and the store must equal the final table.
//! Same seed, same run: there is no clock, no thread and no hash-order dependence.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::core::{
    vnode_of, Barrier, BarrierKind, Change, CoreError, Decision, Epoch, Event, Executor, JobSpec,
    LocalCheckpointPolicy, LogRecord, Op, PartitionId, PartitionMap, PartitionProgress, Phase, Row,
    ScanId, ScanStart, Supervisor, SupervisorConfig, Verdict, Vnode, WorkerFailure,
    VNODE_BITMAP_UPDATE_IN_LOG_STORE,
};
use crate::memory::{MemoryLog, MemorySnapshot, MemoryStore};
use crate::ports::{LogStore, SnapshotInfo, SnapshotSource, StateStore, StoreError};

const JOB: &str = "sim";

/// A small, fast, seedable PRNG (SplitMix64): the simulation's only source of choice.
#[derive(Clone, Debug)]
pub struct SimRng(u64);

impl SimRng {
    pub fn new(seed: u64) -> Self {
        SimRng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// True with probability `p` percent.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

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

/// The snapshot scan a worker is running.
struct ScanState {
    scan: ScanId,
    queue: VecDeque<ScanStart>,
}

struct SimWorker {
    id: String,
    store: MemoryStore,
    exec: Option<Executor>,
    /// Partitions the worker believes it owns.
    owned: BTreeSet<PartitionId>,
    scan: Option<ScanState>,
    /// Fetch position and pause flag per fetching partition.
    fetch: BTreeMap<PartitionId, (u64, bool)>,
    member: bool,
    alive: bool,
    frozen: bool,
}

enum Stop {
    Core(CoreError),
    Fenced(StoreError),
}

/// One simulated job.
pub struct Sim {
    pub config: SimConfig,
    rng: SimRng,
    map: PartitionMap,
    info: SnapshotInfo,
    snapshot: MemorySnapshot,
    upstream: Upstream,
    store: MemoryStore,
    workers: Vec<SimWorker>,
    supervisor: Supervisor,
    now_ms: u64,
    pub report: SimReport,
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
        let snapshot = MemorySnapshot {
            info: info.clone(),
            rows,
        };
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
        let supervisor = Supervisor::new(config.supervisor);
        Sim {
            rng,
            map,
            info,
            snapshot,
            upstream,
            store,
            workers: Vec::new(),
            supervisor,
            now_ms: 0,
            report: SimReport::default(),
            config,
        }
    }

    /// Runs the whole schedule: churn while the upstream writes, then a calm drain, then the final
    /// oracle check. `Err` carries what went wrong.
    pub fn run(&mut self) -> SimResult<SimReport> {
        for _ in 0..self.config.initial_workers {
            self.add_worker();
        }
        self.rebalance()?;
        let mut steps = 0u64;
        while self.upstream.writing() {
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
        self.report.steps = steps + drained;
        self.final_check()?;
        Ok(self.report.clone())
    }

    /// One scheduling step.
    pub fn step(&mut self, chaos: bool) -> SimResult<()> {
        self.now_ms += 1;
        if chaos && self.rng.chance(self.config.chaos_percent) {
            return self.chaos();
        }
        if self.upstream.writing() && self.rng.chance(self.config.upstream_percent) {
            if self.upstream.changes_in_epoch >= self.config.max_changes_per_epoch
                || self.rng.chance(25)
            {
                self.upstream.end_epoch(self.config.checkpoint_every);
            } else {
                self.upstream
                    .write_change(&mut self.rng, self.config.key_space);
            }
            return Ok(());
        }
        let runnable: Vec<usize> = (0..self.workers.len())
            .filter(|&i| {
                self.workers[i].alive && !self.workers[i].frozen && self.workers[i].exec.is_some()
            })
            .collect();
        if runnable.is_empty() {
            return Ok(());
        }
        let w = runnable[self.rng.below(runnable.len() as u64) as usize];
        self.work(w)
    }

    // ----- scripted control (named scenarios) ----------------------------------------------------

    /// Adds a worker to the group and rebalances; returns its index.
    pub fn join(&mut self) -> SimResult<usize> {
        let i = self.add_worker();
        self.rebalance()?;
        Ok(i)
    }

    /// Worker `i` leaves gracefully (revokes everything first).
    pub fn leave(&mut self, i: usize) -> SimResult<()> {
        let owned: Vec<PartitionId> = self.workers[i].owned.iter().copied().collect();
        if !owned.is_empty() && self.workers[i].exec.is_some() {
            self.note_update(i);
            self.workers[i].owned.clear();
            self.workers[i].fetch.clear();
            self.feed(i, Event::Revoked(owned))?;
        }
        self.retire(i);
        self.rebalance()
    }

    /// Worker `i` dies without a word; the group reassigns its partitions.
    pub fn crash(&mut self, i: usize) -> SimResult<()> {
        self.report.crashes += 1;
        self.retire(i);
        self.rebalance()
    }

    /// Worker `i` dies and comes back at once with the same assignment (a process restart).
    pub fn crash_and_restart(&mut self, i: usize) -> SimResult<()> {
        self.report.crashes += 1;
        self.restart(i)
    }

    /// Worker `i` stops answering; the group moves its partitions to others.
    pub fn freeze(&mut self, i: usize) -> SimResult<()> {
        self.report.freezes += 1;
        self.workers[i].frozen = true;
        self.workers[i].member = false;
        self.rebalance()
    }

    pub fn thaw(&mut self, i: usize) {
        self.workers[i].frozen = false;
    }

    /// The upstream writes `changes` changes and ends the epoch with a barrier of `kind`.
    pub fn write_epoch(&mut self, changes: u32, kind: BarrierKind) {
        for _ in 0..changes {
            self.upstream
                .write_change(&mut self.rng, self.config.key_space);
        }
        self.upstream.write_barrier(kind);
    }

    /// The upstream writes changes of the open epoch without ending it.
    pub fn write_changes(&mut self, changes: u32) {
        for _ in 0..changes {
            self.upstream
                .write_change(&mut self.rng, self.config.key_space);
        }
    }

    /// Lets workers (only) run until `done` holds, at most `max` steps.
    pub fn run_until(&mut self, max: u64, done: impl Fn(&Sim) -> bool) -> SimResult<()> {
        for _ in 0..max {
            if done(self) {
                return Ok(());
            }
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
            self.worker_step()?;
        }
        Ok(())
    }

    /// One step of one runnable worker, picked by the seed's generator.
    fn worker_step(&mut self) -> SimResult<()> {
        self.now_ms += 1;
        let runnable: Vec<usize> = (0..self.workers.len())
            .filter(|&i| {
                self.workers[i].alive && !self.workers[i].frozen && self.workers[i].exec.is_some()
            })
            .collect();
        if runnable.is_empty() {
            return Ok(());
        }
        let w = runnable[self.rng.below(runnable.len() as u64) as usize];
        self.work(w)
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
        self.workers[i].exec.as_ref().map(|e| e.phase())
    }

    /// Partitions worker `i` owns.
    pub fn owned(&self, i: usize) -> Vec<PartitionId> {
        self.workers[i].owned.iter().copied().collect()
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

    // ----- membership ---------------------------------------------------------------------------

    fn add_worker(&mut self) -> usize {
        let id = format!("w{}", self.workers.len());
        self.workers.push(SimWorker {
            id,
            store: self.store.clone(),
            exec: None,
            owned: BTreeSet::new(),
            scan: None,
            fetch: BTreeMap::new(),
            member: true,
            alive: true,
            frozen: false,
        });
        let i = self.workers.len() - 1;
        self.start_executor(i);
        i
    }

    fn start_executor(&mut self, i: usize) {
        let generation = self.store.job_row(JOB).expect("job").generation;
        let spec = JobSpec {
            topic: "sim-log".into(),
            snapshot_epoch: self.info.snapshot_epoch,
            map: self.map,
            generation,
            worker: self.workers[i].id.clone(),
            local_checkpoint: LocalCheckpointPolicy {
                max_rows: self.config.local_checkpoint_rows,
                max_interval_ms: 50,
            },
            max_epochs_ahead: self.config.max_epochs_ahead,
        };
        let w = &mut self.workers[i];
        w.exec = Some(Executor::new(spec, self.now_ms));
        w.owned.clear();
        w.scan = None;
        w.fetch.clear();
    }

    fn members(&self) -> Vec<usize> {
        (0..self.workers.len())
            .filter(|&i| self.workers[i].member)
            .collect()
    }

    /// Cooperative rebalance: every member learns what it loses, then what it gains. Frozen members
    /// are not told (they find out when the store fences them).
    fn rebalance(&mut self) -> SimResult<()> {
        let members = self.members();
        if members.is_empty() {
            return Ok(());
        }
        self.report.rebalances += 1;
        let mut target: BTreeMap<usize, BTreeSet<PartitionId>> = BTreeMap::new();
        for p in 0..self.config.partition_count {
            target
                .entry(members[p as usize % members.len()])
                .or_default()
                .insert(p);
        }
        // Revocations first.
        for &i in &members {
            let keep = target.get(&i).cloned().unwrap_or_default();
            let revoked: Vec<PartitionId> =
                self.workers[i].owned.difference(&keep).copied().collect();
            if revoked.is_empty() {
                continue;
            }
            if self.workers[i].frozen || self.workers[i].exec.is_none() {
                for p in &revoked {
                    self.workers[i].owned.remove(p);
                }
                continue;
            }
            self.note_update(i);
            for p in &revoked {
                self.workers[i].owned.remove(p);
                self.workers[i].fetch.remove(p);
            }
            self.feed(i, Event::Revoked(revoked))?;
        }
        // Then assignments, claimed in the store first.
        for &i in &members {
            let want = target.get(&i).cloned().unwrap_or_default();
            let gained: Vec<PartitionId> =
                want.difference(&self.workers[i].owned).copied().collect();
            if gained.is_empty() {
                continue;
            }
            for p in &gained {
                self.workers[i].owned.insert(*p);
            }
            if self.workers[i].frozen || self.workers[i].exec.is_none() {
                continue;
            }
            self.assign(i, gained)?;
        }
        Ok(())
    }

    fn note_update(&mut self, i: usize) {
        if let Some(exec) = &self.workers[i].exec {
            let phase = exec.phase();
            if phase != Phase::Unassigned {
                *self.report.updates_by_phase.entry(phase).or_default() += 1;
            }
        }
    }

    fn assign(&mut self, i: usize, partitions: Vec<PartitionId>) -> SimResult<()> {
        let Some(exec) = &self.workers[i].exec else {
            return Ok(());
        };
        let generation = exec.spec().generation;
        let worker = self.workers[i].id.clone();
        self.note_update(i);
        match self.workers[i]
            .store
            .claim(JOB, generation, &worker, &partitions, &self.info)
        {
            Ok(claims) => self.feed(i, Event::Assigned(claims)),
            Err(e) if e.is_fenced() => self.stop(i, Stop::Fenced(e)),
            Err(e) => Err(format!("claim failed: {e}")),
        }
    }

    fn chaos(&mut self) -> SimResult<()> {
        let n = self.workers.len();
        match self.rng.below(6) {
            0 if self.members().len() < self.config.max_workers as usize => {
                self.add_worker();
                self.rebalance()
            }
            1 if self.members().len() > 1 => {
                // Graceful leave: revoke everything, then go.
                let members = self.members();
                let i = members[self.rng.below(members.len() as u64) as usize];
                if self.workers[i].frozen {
                    return Ok(());
                }
                self.leave(i)
            }
            2 if n > 0 => {
                // Crash: the worker disappears mid-flight; the group notices.
                let i = self.rng.below(n as u64) as usize;
                if !self.workers[i].alive {
                    return Ok(());
                }
                self.report.crashes += 1;
                self.retire(i);
                if self.members().is_empty() {
                    self.add_worker();
                }
                self.rebalance()
            }
            3 if n > 0 => {
                // Freeze: the worker stops; after its session times out the group moves on.
                let i = self.rng.below(n as u64) as usize;
                if !self.workers[i].alive || self.workers[i].frozen || self.members().len() < 2 {
                    return Ok(());
                }
                self.report.freezes += 1;
                self.workers[i].frozen = true;
                self.workers[i].member = false;
                self.rebalance()
            }
            4 => {
                // Thaw a frozen worker: it goes on with what it believes it owns.
                if let Some(i) = (0..n).find(|&i| self.workers[i].frozen) {
                    self.workers[i].frozen = false;
                }
                Ok(())
            }
            _ => {
                // Crash and restart in place: same membership, executor rebuilt from the store.
                let alive: Vec<usize> = (0..n)
                    .filter(|&i| self.workers[i].alive && !self.workers[i].frozen)
                    .collect();
                if alive.is_empty() {
                    return Ok(());
                }
                let i = alive[self.rng.below(alive.len() as u64) as usize];
                self.report.crashes += 1;
                self.restart(i)
            }
        }
    }

    fn retire(&mut self, i: usize) {
        let w = &mut self.workers[i];
        w.alive = false;
        w.member = false;
        w.exec = None;
        w.owned.clear();
        w.fetch.clear();
        w.scan = None;
    }

    /// Rebuilds the worker's executor from the store, with the partitions the group gives it.
    fn restart(&mut self, i: usize) -> SimResult<()> {
        let owned: Vec<PartitionId> = self.workers[i].owned.iter().copied().collect();
        self.start_executor(i);
        if !self.workers[i].member {
            self.workers[i].member = true;
            return self.rebalance();
        }
        if owned.is_empty() {
            return Ok(());
        }
        for p in &owned {
            self.workers[i].owned.insert(*p);
        }
        self.assign(i, owned)
    }

    /// Stops churn: thaws and re-admits everyone, makes sure someone works.
    fn calm_down(&mut self) -> SimResult<()> {
        for i in 0..self.workers.len() {
            if self.workers[i].frozen {
                self.workers[i].frozen = false;
            }
        }
        if self.members().is_empty() {
            self.add_worker();
            self.rebalance()?;
        }
        Ok(())
    }

    // ----- work ---------------------------------------------------------------------------------

    fn work(&mut self, i: usize) -> SimResult<()> {
        // Watermarks and time first: cheap, and what a real driver keeps feeding.
        let fetching: Vec<PartitionId> = self.workers[i].fetch.keys().copied().collect();
        for p in fetching {
            let high = self.upstream.log.high_watermark(p);
            self.feed(i, Event::Watermark { partition: p, high })?;
            if self.workers[i].exec.is_none() {
                return Ok(());
            }
        }
        self.feed(
            i,
            Event::Tick {
                now_ms: self.now_ms,
            },
        )?;
        if self.workers[i].exec.is_none() {
            return Ok(());
        }
        if let Some(event) = self.next_snapshot_event(i) {
            return self.feed(i, event);
        }
        let leaky = self.rng.chance(self.config.leaky_pause_percent);
        let ready: Vec<PartitionId> = self.workers[i]
            .fetch
            .iter()
            .filter(|(p, (off, paused))| {
                (!paused || leaky) && *off < self.upstream.log.high_watermark(**p)
            })
            .map(|(p, _)| *p)
            .collect();
        if ready.is_empty() {
            return Ok(());
        }
        // A fetch: a small batch from one partition, delivered record by record.
        let p = ready[self.rng.below(ready.len() as u64) as usize];
        let batch = 1 + self.rng.below(self.config.max_fetch_batch) as usize;
        for _ in 0..batch {
            let Some(&(off, paused)) = self.workers[i].fetch.get(&p) else {
                break;
            };
            if paused && !leaky {
                break;
            }
            let Some((offset, record)) = self.upstream.log.read(p, off, 1).pop() else {
                break;
            };
            self.workers[i].fetch.get_mut(&p).unwrap().0 = offset + 1;
            self.feed(
                i,
                Event::Record {
                    partition: p,
                    offset,
                    record,
                },
            )?;
            if self.workers[i].exec.is_none() {
                break;
            }
        }
        Ok(())
    }

    fn next_snapshot_event(&mut self, i: usize) -> Option<Event> {
        let scan = self.workers[i].scan.as_mut()?;
        let start = scan.queue.front_mut()?;
        let next = self
            .snapshot
            .scan(start.vnode, start.after.as_deref())
            .expect("memory scan")
            .next()
            .map(|r| r.expect("memory row"));
        let (scan_id, vnode) = (scan.scan, start.vnode);
        Some(match next {
            Some(row) => {
                start.after = Some(row.key.clone());
                Event::SnapshotRow {
                    scan: scan_id,
                    vnode,
                    row,
                }
            }
            None => {
                scan.queue.pop_front();
                Event::SnapshotVnodeDone {
                    scan: scan_id,
                    vnode,
                }
            }
        })
    }

    /// Feeds one event to worker `i` and carries out the decisions.
    fn feed(&mut self, i: usize, event: Event) -> SimResult<()> {
        let Some(exec) = self.workers[i].exec.as_mut() else {
            return Ok(());
        };
        let phase_before = exec.phase();
        let decisions = match exec.handle(event) {
            Ok(d) => d,
            Err(e) => {
                return Err(format!(
                    "worker {} failed on good input: {e}",
                    self.workers[i].id
                ))
            }
        };
        for d in decisions {
            match d {
                Decision::Commit(cp) => {
                    let job = JOB;
                    match self.workers[i].store.commit(job, &cp) {
                        Ok(()) => {
                            self.report.commits += 1;
                            self.oracle_check()?;
                        }
                        Err(e) if e.is_fenced() => return self.stop(i, Stop::Fenced(e)),
                        Err(e) => return Err(format!("store rejected a commit: {e}")),
                    }
                }
                Decision::Scan { scan, vnodes } => {
                    self.workers[i].scan = Some(ScanState {
                        scan,
                        queue: vnodes.into(),
                    });
                }
                Decision::Fetch { partition, offset } => {
                    self.workers[i].fetch.insert(partition, (offset, false));
                }
                Decision::Pause(p) => {
                    if let Some(f) = self.workers[i].fetch.get_mut(&p) {
                        f.1 = true;
                    }
                }
                Decision::Resume(p) => {
                    if let Some(f) = self.workers[i].fetch.get_mut(&p) {
                        f.1 = false;
                    }
                }
                Decision::PhaseChanged { to, .. } => {
                    self.report.phases_seen.insert(to);
                    if to == Phase::Streaming && self.upstream.writing() {
                        self.report.streamed_while_writing = true;
                    }
                    if to == Phase::Snapshot {
                        for f in self.workers[i].fetch.values_mut() {
                            f.1 = true;
                        }
                    }
                }
                Decision::Fail(e) => {
                    if phase_before != Phase::LogStore {
                        return Err(format!(
                            "Fail outside the log-store phase ({phase_before:?}): {e}"
                        ));
                    }
                    if e.to_string() != VNODE_BITMAP_UPDATE_IN_LOG_STORE {
                        return Err(format!("unexpected error text: {e}"));
                    }
                    self.report.bitmap_errors += 1;
                    return self.stop(i, Stop::Core(e));
                }
            }
        }
        Ok(())
    }

    /// A worker stopped: the supervisor decides.
    fn stop(&mut self, i: usize, why: Stop) -> SimResult<()> {
        let generation = self.workers[i]
            .exec
            .as_ref()
            .map_or(0, |e| e.spec().generation);
        let failure = match why {
            Stop::Core(e) => WorkerFailure::Core(e),
            Stop::Fenced(e) => {
                self.report.fenced += 1;
                WorkerFailure::Fenced(e.to_string())
            }
        };
        self.workers[i].exec = None;
        match self
            .supervisor
            .on_failure(&failure, generation, self.now_ms)
        {
            Verdict::Recreate {
                from_generation, ..
            } => {
                let before = self.store.job_row(JOB).expect("job").generation;
                let after = self
                    .store
                    .recreate(JOB, from_generation)
                    .map_err(|e| e.to_string())?;
                if after.generation == before + 1 {
                    self.report.recreations += 1;
                    if !self.store.rows(JOB).unwrap().is_empty() {
                        return Err("recreation left rows behind".into());
                    }
                }
                self.restart(i)
            }
            Verdict::Restart { .. } => self.restart(i),
            Verdict::Stop { reason } => Err(format!("supervisor stopped the job: {reason}")),
        }
    }

    // ----- oracle -------------------------------------------------------------------------------

    /// Every committed vnode agrees with the upstream table at its committed epoch.
    fn oracle_check(&mut self) -> SimResult<()> {
        let es = self.info.snapshot_epoch;
        let progress = self.store.vnode_progress(JOB);
        let rows = self.store.rows(JOB).unwrap();
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
                None => (es, Some(&Vec::new())),
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

    fn converged(&self) -> bool {
        if self.upstream.writing() {
            return false;
        }
        let parts = self.store.partition_progress(JOB);
        let all_committed = (0..self.config.partition_count).all(|p| {
            parts
                .get(&p)
                .is_some_and(|pp| pp.next_offset == self.upstream.log.high_watermark(p))
        });
        let all_streaming = self.workers.iter().filter(|w| w.member).all(|w| {
            w.exec
                .as_ref()
                .is_some_and(|e| matches!(e.phase(), Phase::Streaming | Phase::Unassigned))
        });
        all_committed && all_streaming
    }

    fn final_check(&mut self) -> SimResult<()> {
        self.oracle_check()?;
        let rows = self.store.rows(JOB).unwrap();
        if rows != self.upstream.table {
            return Err(format!(
                "final table differs: store {} rows, upstream {} rows",
                rows.len(),
                self.upstream.table.len()
            ));
        }
        let last = *self.upstream.history.keys().last().unwrap();
        for (v, p) in self.store.vnode_progress(JOB) {
            if p.epoch != last {
                return Err(format!(
                    "vnode {v} ends at epoch {} instead of {last}",
                    p.epoch
                ));
            }
        }
        self.report.final_rows = rows.len();
        Ok(())
    }

    fn describe(&self) -> String {
        let ws: Vec<String> = self
            .workers
            .iter()
            .filter(|w| w.alive)
            .map(|w| {
                format!(
                    "{}(member={} frozen={} owned={:?} fetch={:?} status={:?})",
                    w.id,
                    w.member,
                    w.frozen,
                    w.owned,
                    w.fetch,
                    w.exec.as_ref().map(|e| e.status())
                )
            })
            .collect();
        format!(
            "{ws:?} store partitions {:?}",
            self.store.partition_progress(JOB)
        )
    }
}

static EMPTY: Vec<u8> = Vec::new();
