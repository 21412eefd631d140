//! The simulated group: members joining, leaving, crashing, freezing and restarting, and the
//! coordinator's cooperative rebalances (revocations first; a partition reaches its new owner once
//! its old owner acknowledged, unless the old owner froze).

use std::collections::{BTreeMap, BTreeSet};

use super::{
    CommitQueue, ConsumerState, GroupProtocol, Sim, SimClock, SimCommitter, SimConsumer, SimResult,
    SimWorker, JOB,
};
use crate::core::{LocalCheckpointPolicy, PartitionId, RecreationPolicy};
use crate::driver::{Driver, DriverConfig};
use crate::ports::Polled;

impl Sim {
    // ----- membership ---------------------------------------------------------------------------

    pub(super) fn add_worker(&mut self) -> SimResult<usize> {
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
        });
        self.start_driver(i)?;
        Ok(i)
    }

    /// A new loop for worker `i` (its executor starts from the store).
    pub(super) fn start_driver(&mut self, i: usize) -> SimResult<()> {
        let cfg = DriverConfig {
            job: JOB.into(),
            topic: "sim-log".into(),
            worker: self.workers[i].id.clone(),
            policy: crate::core::JobPolicy {
                local_checkpoint: LocalCheckpointPolicy {
                    max_rows: self.config.local_checkpoint_rows,
                    max_interval_ms: 50,
                },
                max_epochs_ahead: self.config.max_epochs_ahead,
                max_bytes_ahead: self.config.max_bytes_ahead,
                reschedule: self.config.supervisor.policy == RecreationPolicy::Reschedule,
                max_dead_letters: self.config.dead_letters.then_some(1_000_000),
                commit_every_checkpoint: self.config.commit_every_checkpoint,
                tables: if self.config.tables > 1 {
                    crate::core::JobTables::Several((0..self.config.tables).collect())
                } else {
                    crate::core::JobTables::One(0)
                },
            },
            max_rows_per_second: 0,
            adaptive: crate::core::AdaptiveConfig::default(),
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
            Box::new(super::SimObserver {
                worker: self.workers[i].id.clone(),
                counts: self.counts.clone(),
            }),
        )
        .map_err(|f| format!("worker {} did not start: {f}", self.workers[i].id))?
        .with_dead_letters(Box::new(super::world::SimDeadLetters {
            world: self.world.clone(),
        }));
        self.workers[i].driver = Some(driver);
        Ok(())
    }

    pub(super) fn drop_driver(&mut self, i: usize) {
        self.workers[i].driver = None;
    }

    pub(super) fn members(&self) -> Vec<usize> {
        (0..self.workers.len())
            .filter(|&i| self.workers[i].alive && self.workers[i].member)
            .collect()
    }

    /// The coordinator's new target, and every member told what it loses. Members that froze are
    /// not members: their partitions are given away without their word (they become zombies).
    pub(super) fn rebalance(&mut self) {
        let members = self.members();
        self.target.clear();
        if members.is_empty() {
            return;
        }
        self.rebalances += 1;
        if self.config.protocol == GroupProtocol::Consumer {
            // Nobody is told now: each member learns its part at a heartbeat (deliver_assignments).
            self.target = self.sticky_target(&members);
            return;
        }
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

    /// KIP-848's server-side assignor: balanced (each member ⌊P/m⌋ or ⌈P/m⌉ partitions) and
    /// sticky — a member keeps what it holds up to its share (the members holding most get the
    /// larger shares), and only the rest moves.
    fn sticky_target(&self, members: &[usize]) -> BTreeMap<usize, BTreeSet<PartitionId>> {
        let w = self.world.borrow();
        let holds: BTreeMap<usize, BTreeSet<PartitionId>> = members
            .iter()
            .map(|&i| (i, w.consumers[i].eventual()))
            .collect();
        let parts = self.config.partition_count as usize;
        let mut by_holding = members.to_vec();
        by_holding.sort_by_key(|i| std::cmp::Reverse(holds[i].len()));
        let share: BTreeMap<usize, usize> = by_holding
            .iter()
            .enumerate()
            .map(|(rank, &i)| {
                let extra = usize::from(rank < parts % members.len());
                (i, parts / members.len() + extra)
            })
            .collect();
        let mut target: BTreeMap<usize, BTreeSet<PartitionId>> = BTreeMap::new();
        let mut taken = BTreeSet::new();
        for &i in members {
            let mine = target.entry(i).or_default();
            for &p in &holds[&i] {
                if mine.len() < share[&i] && taken.insert(p) {
                    mine.insert(p);
                }
            }
        }
        let mut free = (0..self.config.partition_count).filter(|p| !taken.contains(p));
        for &i in members {
            let mine = target.entry(i).or_default();
            while mine.len() < share[&i] {
                match free.next() {
                    Some(p) => mine.insert(p),
                    None => break,
                };
            }
        }
        target
    }

    /// Whether a KIP-848 member still has something to revoke, or a target partition it could be
    /// given now.
    pub(super) fn reconciling(&self) -> bool {
        self.config.protocol == GroupProtocol::Consumer
            && self.members().iter().any(|&i| {
                let (lose, gain) = self.reconciliation(i);
                !lose.is_empty() || !gain.is_empty()
            })
    }

    /// Member `i`'s KIP-848 step: what it must revoke, and what of its target is free to give it
    /// (no other member holds it, counting partitions whose revocation it has not yet polled).
    fn reconciliation(&self, i: usize) -> (Vec<PartitionId>, Vec<PartitionId>) {
        let members = self.members();
        let w = self.world.borrow();
        let want = self.target.get(&i).cloned().unwrap_or_default();
        let eventual = w.consumers[i].eventual();
        let lose: Vec<PartitionId> = eventual.difference(&want).copied().collect();
        let held_elsewhere: BTreeSet<PartitionId> = members
            .iter()
            .filter(|&&j| j != i)
            .flat_map(|&j| {
                let mut h = w.consumers[j].eventual();
                h.extend(w.consumers[j].assigned.keys().copied());
                h
            })
            .collect();
        let gain: Vec<PartitionId> = want
            .difference(&eventual)
            .filter(|p| !held_elsewhere.contains(p))
            .copied()
            .collect();
        (lose, gain)
    }

    /// One KIP-848 heartbeat, some steps none: one member with something to reconcile revokes
    /// what it must and gains some (not always all) of its target's free partitions.
    fn heartbeat(&mut self) {
        let pending: Vec<(usize, Vec<PartitionId>, Vec<PartitionId>)> = self
            .members()
            .into_iter()
            .map(|i| {
                let (lose, gain) = self.reconciliation(i);
                (i, lose, gain)
            })
            .filter(|(_, lose, gain)| !lose.is_empty() || !gain.is_empty())
            .collect();
        let mut w = self.world.borrow_mut();
        if pending.is_empty() || !w.rng.chance(50) {
            return;
        }
        let (i, lose, mut gain) = pending[w.rng.below(pending.len() as u64) as usize].clone();
        if !lose.is_empty() {
            w.consumers[i].inbox.push_back(Polled::Revoked {
                partitions: lose,
                lost: false,
            });
        }
        if !gain.is_empty() {
            let n = 1 + w.rng.below(gain.len() as u64) as usize;
            gain.truncate(n);
            w.consumers[i].inbox.push_back(Polled::Assigned(gain));
        }
        drop(w);
        self.reconciliations += 1;
    }

    /// KIP-848 fences member `i` (its member epoch went stale: FENCED_MEMBER_EPOCH): every
    /// partition it holds is lost at once, and it rejoins at epoch 0 for a new target.
    pub(super) fn fence_member(&mut self, i: usize) {
        {
            let mut w = self.world.borrow_mut();
            let lost: Vec<PartitionId> = w.consumers[i].eventual().into_iter().collect();
            if lost.is_empty() {
                return;
            }
            w.consumers[i].inbox.push_back(Polled::Revoked {
                partitions: lost,
                lost: true,
            });
        }
        self.member_fences += 1;
        self.rebalance();
    }

    /// Gives each member the partitions of its target that no other member holds any more
    /// (cooperative: the old owner acknowledged the revocation first); under KIP-848 one
    /// member's reconciliation step at a heartbeat.
    pub(super) fn deliver_assignments(&mut self) {
        if self.config.protocol == GroupProtocol::Consumer {
            self.heartbeat();
            return;
        }
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
    pub(super) fn settle_group(&mut self) -> SimResult<()> {
        for _ in 0..1_000 {
            self.deliver_assignments();
            let busy: Vec<usize> = (0..self.workers.len())
                .filter(|&i| self.runnable(i) && !self.world.borrow().consumers[i].inbox.is_empty())
                .collect();
            if busy.is_empty() && !self.reconciling() {
                return Ok(());
            }
            for i in busy {
                self.work(i, 0)?;
            }
        }
        Err(format!("the group did not settle: {}", self.describe()))
    }

    pub(super) fn runnable(&self, i: usize) -> bool {
        let w = &self.workers[i];
        w.alive && !w.frozen && w.driver.is_some()
    }

    pub(super) fn chaos(&mut self) -> SimResult<()> {
        let n = self.workers.len();
        let pick = |s: &Sim, n: u64| s.world.borrow_mut().rng.below(n);
        if self.config.protocol == GroupProtocol::Consumer && pick(self, 8) == 0 {
            let members: Vec<usize> = self
                .members()
                .into_iter()
                .filter(|&i| self.runnable(i))
                .collect();
            if !members.is_empty() {
                let i = members[pick(self, members.len() as u64) as usize];
                self.fence_member(i);
            }
            return Ok(());
        }
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
    pub(super) fn retire(&mut self, i: usize) {
        self.drop_driver(i);
        let w = &mut self.workers[i];
        w.alive = false;
        w.member = false;
        w.rejoin_in = None;
        let mut world = self.world.borrow_mut();
        world.consumers[i] = ConsumerState::default();
        world.drop_commits(i);
    }

    pub(super) fn restart_in_place(&mut self, i: usize) -> SimResult<()> {
        let holds = self.world.borrow().consumers[i].eventual();
        self.drop_driver(i);
        {
            let mut w = self.world.borrow_mut();
            w.drop_commits(i);
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
    pub(super) fn calm_down(&mut self) -> SimResult<()> {
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
}
