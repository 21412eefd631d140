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
//! With several tables (`SimConfig::tables`) one job materialises all of them, and the published
//! replica must also keep pgbench's invariant (every table's sum equal) at every commit.
//! Same seed, same run: one generator decides everything, time is a step counter, nothing hashes.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use crate::core::{
    vnode_of, Barrier, BarrierKind, Epoch, LogRecord, PartitionId, PartitionMap, PartitionProgress,
    Phase, Supervisor, SupervisorConfig, Vnode,
};
use crate::driver::Driver;
use crate::ports::{LogStore, SnapshotInfo, StateStore};
pub use crate::rng::SimRng;
use crate::store::memory::{MemoryLog, MemorySnapshot, MemoryStore};
use observe::{SimCounts, SimObserver};
use upstream::{key_bytes, Upstream};
use world::{CommitQueue, ConsumerState, Shared, SimClock, SimCommitter, SimConsumer, World};

pub mod capture;
mod group;
pub mod observe;
mod upstream;
mod work;
mod world;

const JOB: &str = "sim";

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
    /// Alignment back-pressure (see `JobPolicy::max_epochs_ahead`).
    pub max_epochs_ahead: usize,
    /// Alignment back-pressure by memory (see `JobPolicy::max_bytes_ahead`): unbounded or a few
    /// rows' worth.
    pub max_bytes_ahead: u64,
    /// `JobPolicy::commit_every_checkpoint`: each checkpoint epoch committed on its own.
    pub commit_every_checkpoint: bool,
    /// The store publishes the replica at one epoch across every partition
    /// (`MemoryStore::publishing`, issue 23's proposed protocol): the oracle then reads the
    /// published replica after every commit and requires it to be the whole upstream table at one
    /// epoch, never going back; without it the oracle checks each vnode at its own epoch and counts
    /// the commits after which the whole replica was no upstream state at all (`torn`).
    pub publication: bool,
    /// A fetch delivers up to this many records of one partition.
    pub max_fetch_batch: u64,
    pub max_steps: u64,
    pub supervisor: SupervisorConfig,
    /// Percent of steps in which one pending checkpoint commit completes (commits otherwise
    /// complete when the worker waits for them, or when too many are pending).
    pub commit_percent: u64,
    /// How the coordinator moves partitions between members.
    pub protocol: GroupProtocol,
    /// Tables of the log, all materialised by the job (`JobTables::Several`) when more than one:
    /// the upstream is then pgbench-shaped (every table's sum of balances equal in every committed
    /// state, `upstream::transaction`) and the oracle checks that invariant on the replica too.
    pub tables: u16,
    /// `on_bad_record = "dead-letter"`: the upstream also writes records that do not decode, and
    /// the workers dead-letter them (checked: each recorded once, each written to the sink first,
    /// all recorded in the end).
    pub dead_letters: bool,
    /// The upstream also truncates a table now and then (`Upstream::write_truncate`).
    pub truncates: bool,
}

/// How the simulated coordinator moves partitions (`group.protocol`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupProtocol {
    /// The classic protocol with the cooperative-sticky assignor: at a rebalance every member is
    /// told at once what it loses, and a partition reaches its new owner once the old owner let it
    /// go.
    Classic,
    /// KIP-848 (`group.protocol = "consumer"`): the coordinator computes a sticky target (the
    /// server-side assignor) and reconciles one member per heartbeat, some heartbeats none: the
    /// member revokes what its target leaves out, then gains the target's partitions in pieces as
    /// their old owners release them, so members move in smaller, staggered steps; a member can be
    /// fenced (a stale member epoch: every partition lost at once) and rejoins.
    Consumer,
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
            // Drawn last, so every other field of a seed's shape is what it was before.
            protocol: if r.below(2) == 0 {
                GroupProtocol::Classic
            } else {
                GroupProtocol::Consumer
            },
            dead_letters: r.below(3) == 0,
            max_bytes_ahead: if r.below(2) == 0 {
                u64::MAX
            } else {
                200 + r.below(2_000)
            },
            commit_every_checkpoint: r.below(2) == 0,
            publication: r.below(2) == 0,
            tables: 1,
            truncates: r.below(3) == 0,
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
    /// Vnode-bitmap updates absorbed in the log-store phase (`reschedule`).
    pub rescheduled: u64,
    pub final_rows: usize,
    pub phases_seen: BTreeSet<Phase>,
    /// Bitmap updates seen by workers, per phase they were in.
    pub updates_by_phase: BTreeMap<Phase, u64>,
    /// Upstream was still writing when a worker first reached streaming.
    pub streamed_while_writing: bool,
    /// Under `recreation.policy = "fail"`: the job stopped on the invariant error (the worker's
    /// stop message), as that policy says; the oracle held at every commit up to there.
    pub stopped: Option<String>,
    /// The run's coordinator spoke KIP-848 (`GroupProtocol::Consumer`).
    pub consumer_protocol: bool,
    /// Records that do not decode the upstream wrote (all dead-lettered by the end).
    pub dead_letters: u64,
    /// Dead letters written to the sink, repeats included (a crash between the sink and the
    /// commit writes one again).
    pub dead_letters_sent: u64,
    /// Tables the upstream truncated, and the rows that emptied upstream.
    pub truncations: u64,
    pub truncated_rows: u64,
    /// Members fenced by the KIP-848 coordinator (all partitions lost, then a rejoin).
    pub member_fences: u64,
    /// KIP-848 reconciliation steps delivered (one member's revocation and/or partial gain).
    pub reconciliations: u64,
    /// Without publication: applied commits after which every vnode had finished its snapshot
    /// and yet the whole replica equalled the upstream table at no epoch (each vnode right at its
    /// own epoch, the whole torn across workers).
    pub torn: u64,
    /// With publication: applied commits after which the published replica was checked.
    pub published_checks: u64,
    /// With publication: how many times the published epoch moved.
    pub published_moves: u64,
    /// Several tables: applied commits after which the replica readers see (the published one,
    /// or the whole table without publication once every vnode left its snapshot) was checked
    /// for equal sums across the tables.
    pub sum_checks: u64,
    /// Several tables without publication: of those, the commits after which the sums disagreed.
    pub sums_torn: u64,
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
    /// What every worker reported through its observer.
    counts: Arc<Mutex<SimCounts>>,
    /// The partitions the group wants each member to hold after the last rebalance.
    target: BTreeMap<usize, BTreeSet<PartitionId>>,
    steps: u64,
    rebalances: u64,
    crashes: u64,
    freezes: u64,
    member_fences: u64,
    reconciliations: u64,
    streamed_while_writing: bool,
    final_rows: usize,
    /// Set when a worker stopped the job as the `fail` policy says (the run ends there).
    stopped: Option<String>,
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
            if config.tables > 1 {
                upstream::transaction(&mut table, config.tables, &mut rng, config.key_space);
                continue;
            }
            let k = rng.below(config.key_space as u64) as u32;
            table.insert(key_bytes(k), format!("init{i}").into_bytes());
        }
        let mut rows: BTreeMap<Vnode, BTreeMap<Vec<u8>, Vec<u8>>> = BTreeMap::new();
        for (k, v) in &table {
            rows.entry(vnode_of(
                upstream::routing(k, config.tables),
                map.vnode_count(),
            ))
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
            schema_change: false,
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
            poison: Default::default(),
            tables: config.tables.max(1),
        };
        let mut store = if config.publication {
            MemoryStore::publishing()
        } else {
            MemoryStore::new()
        };
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
            unreported: 0,
            violation: None,
            dead_letters_sent: Vec::new(),
            truncations: 0,
            truncated_rows: 0,
            torn: 0,
            published_checks: 0,
            published_moves: 0,
            last_published: None,
            sum_checks: 0,
            sums_torn: 0,
        }));
        Sim {
            config,
            world,
            info,
            snapshot,
            store,
            workers: Vec::new(),
            supervisor,
            counts: Default::default(),
            target: BTreeMap::new(),
            steps: 0,
            rebalances: 0,
            crashes: 0,
            freezes: 0,
            member_fences: 0,
            reconciliations: 0,
            streamed_while_writing: false,
            final_rows: 0,
            stopped: None,
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
            if self.stopped.is_some() {
                return self.stopped_run(steps);
            }
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
            if self.stopped.is_some() {
                return self.stopped_run(steps + drained);
            }
        }
        self.steps = steps + drained;
        self.final_check()?;
        Ok(self.report())
    }

    /// The end of a run the `fail` policy stopped: what was committed agrees with the upstream.
    fn stopped_run(&mut self, steps: u64) -> SimResult<SimReport> {
        self.steps = steps;
        self.check()?;
        self.world.borrow().oracle_check()?;
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
            if self.config.dead_letters && w.rng.chance(4) {
                w.upstream.write_poison(&mut w.rng);
                return Ok(());
            }
            if w.upstream.changes_in_epoch >= self.config.max_changes_per_epoch || w.rng.chance(25)
            {
                w.upstream.end_epoch(self.config.checkpoint_every);
            } else if self.config.truncates && w.rng.chance(3) {
                w.truncated_rows += w.upstream.write_truncate(&mut w.rng) as u64;
                w.truncations += 1;
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

    /// Adds `n` workers to the group in one rebalance (a process starting its workers together);
    /// returns their indexes.
    pub fn join_together(&mut self, n: usize) -> SimResult<Vec<usize>> {
        let ws = (0..n)
            .map(|_| self.add_worker())
            .collect::<SimResult<Vec<usize>>>()?;
        self.rebalance();
        self.settle_group()?;
        Ok(ws)
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

    pub fn generation(&self) -> crate::core::Generation {
        self.store.job_row(JOB).expect("job").generation
    }

    pub fn snapshot_info(&self) -> &SnapshotInfo {
        &self.info
    }

    /// What the run did so far, as the workers' observers counted it.
    pub fn report(&self) -> SimReport {
        let c = self.counts.lock().unwrap();
        let mut updates_by_phase: BTreeMap<Phase, u64> = BTreeMap::new();
        let mut rescheduled = 0;
        for ((phase, outcome), n) in &c.updates {
            *updates_by_phase.entry(*phase).or_default() += n;
            if *outcome == crate::ports::BitmapOutcome::Rescheduled {
                rescheduled += n;
            }
        }
        SimReport {
            steps: self.steps,
            commits: self.world.borrow().applied,
            rebalances: self.rebalances,
            crashes: self.crashes,
            freezes: self.freezes,
            fenced: c.fenced,
            bitmap_errors: c.invariant_errors.len() as u64,
            recreations: c.recreations,
            rescheduled,
            final_rows: self.final_rows,
            phases_seen: c.phases_seen.clone(),
            updates_by_phase,
            streamed_while_writing: self.streamed_while_writing,
            stopped: self.stopped.clone(),
            consumer_protocol: self.config.protocol == GroupProtocol::Consumer,
            dead_letters: self.world.borrow().upstream.poison.len() as u64,
            dead_letters_sent: self.world.borrow().dead_letters_sent.len() as u64,
            truncations: self.world.borrow().truncations,
            truncated_rows: self.world.borrow().truncated_rows,
            member_fences: self.member_fences,
            reconciliations: self.reconciliations,
            torn: self.world.borrow().torn,
            published_checks: self.world.borrow().published_checks,
            published_moves: self.world.borrow().published_moves,
            sum_checks: self.world.borrow().sum_checks,
            sums_torn: self.world.borrow().sums_torn,
        }
    }

    /// What the observers counted.
    pub fn counts(&self) -> SimCounts {
        self.counts.lock().unwrap().clone()
    }
}

static EMPTY: Vec<u8> = Vec::new();
