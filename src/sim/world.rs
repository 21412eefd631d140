//! The simulated world the loop's ports share: group members' consumers (events and fetching), their
//! committers (checkpoints applied when the simulator decides), the clock, the store and the oracle.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;

use super::upstream::Upstream;
use super::{SimConfig, SimResult, EMPTY, JOB};
use crate::core::{
    vnode_of, Checkpoint, Epoch, PartitionId, PartitionMap, PartitionProgress, Vnode,
};
use crate::ports::MAX_PENDING_COMMITS;
use crate::ports::{
    Clock, CommitDone, CommitPort, ConsumerPort, LogStore, Polled, SnapshotInfo, StateStore,
    StoreError,
};
use crate::rng::SimRng;
use crate::store::memory::MemoryStore;

// ----- the simulated world the ports share -----------------------------------------------------

/// One member's consumer, as the group and the fetcher see it.
#[derive(Default)]
pub(super) struct ConsumerState {
    /// Group events not yet polled.
    pub(super) inbox: VecDeque<Polled>,
    /// Assigned partitions: (next offset to deliver, paused).
    pub(super) assigned: BTreeMap<PartitionId, (u64, bool)>,
    /// Records the member may still be handed in the current step.
    pub(super) allowance: usize,
}

impl ConsumerState {
    /// What the member will hold once it has polled its inbox.
    pub(super) fn eventual(&self) -> BTreeSet<PartitionId> {
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
pub(super) struct CommitQueue {
    pub(super) pending: VecDeque<Checkpoint>,
    pub(super) done: Vec<CommitDone>,
    pub(super) poisoned: bool,
}

pub(super) struct World {
    pub(super) rng: SimRng,
    pub(super) config: SimConfig,
    pub(super) map: PartitionMap,
    pub(super) info: SnapshotInfo,
    pub(super) upstream: Upstream,
    pub(super) store: MemoryStore,
    pub(super) now_ms: u64,
    pub(super) consumers: Vec<ConsumerState>,
    pub(super) commits: Vec<CommitQueue>,
    /// Commits applied to the store.
    pub(super) applied: u64,
    /// Applied commits whose outcome never reached a worker (a crash dropped its committer).
    pub(super) unreported: u64,
    /// The first oracle violation.
    pub(super) violation: Option<String>,
    /// Every dead letter written to the (simulated) dead-letter topic, in order, repeats included.
    pub(super) dead_letters_sent: Vec<(PartitionId, u64)>,
    /// See `SimReport::truncations` and `SimReport::truncated_rows`.
    pub(super) truncations: u64,
    pub(super) truncated_rows: u64,
    /// See `SimReport::torn` and `SimReport::published_checks`.
    pub(super) torn: u64,
    pub(super) published_checks: u64,
    pub(super) published_moves: u64,
    /// With publication: the epoch the replica was last seen published at (it never goes back).
    pub(super) last_published: Option<Epoch>,
    /// See `SimReport::sum_checks` and `SimReport::sums_torn`.
    pub(super) sum_checks: u64,
    pub(super) sums_torn: u64,
}

impl World {
    /// Member `i`'s committer is gone with it (a crash): outcomes not taken are never reported.
    pub(super) fn drop_commits(&mut self, i: usize) {
        let q = std::mem::take(&mut self.commits[i]);
        self.unreported += q.done.iter().filter(|d| d.result.is_ok()).count() as u64;
    }

    /// Applies member `i`'s oldest pending checkpoint (the committer thread's work), then checks
    /// the oracle.
    pub(super) fn apply_commit(&mut self, i: usize) {
        // Sometimes every pending checkpoint completes as one group, as the committer thread
        // commits what queued up during its last transaction.
        let n = if self.commits[i].pending.len() > 1 && self.rng.chance(30) {
            self.commits[i].pending.len()
        } else {
            1
        };
        let group: Vec<Checkpoint> = self.commits[i].pending.drain(..n).collect();
        if group.is_empty() {
            return;
        }
        let results = if self.commits[i].poisoned {
            group
                .iter()
                .map(|_| {
                    Err(StoreError::backend(
                        "an earlier checkpoint failed; later ones are not applied",
                    ))
                })
                .collect()
        } else {
            crate::store::commit_in_order(&mut self.store, JOB, &group, Vec::new())
        };
        let group_size = group.len();
        for (n, (cp, result)) in group.into_iter().zip(results).enumerate() {
            if result.is_ok() {
                self.applied += 1;
            } else {
                self.commits[i].poisoned = true;
            }
            // Simulated time does not pass inside a transaction; one sample per transaction.
            self.commits[i].done.push(CommitDone {
                checkpoint: cp,
                result,
                transaction_ms: (n == 0).then_some(0.0),
                group_size,
            });
        }
        if let Err(v) = self
            .oracle_check()
            .and_then(|()| self.whole_replica_check())
        {
            self.violation.get_or_insert(v);
        }
    }

    /// Every committed vnode agrees with the upstream table at its committed epoch.
    /// The replica as a whole, after an applied commit. With publication: the published replica is
    /// the upstream table at its epoch, and that epoch never goes back (a recreation keeps the old
    /// replica visible until the new generation reaches it). Without: counts the commits after
    /// which the whole replica was no upstream state although every vnode had left its snapshot.
    pub(super) fn whole_replica_check(&mut self) -> SimResult<()> {
        if self.config.publication {
            let Some((at, rows)) = self.store.published(JOB) else {
                return match self.last_published {
                    Some(was) => Err(format!(
                        "the replica was published at {was} and is not published any more"
                    )),
                    None => Ok(()),
                };
            };
            if self.last_published.is_some_and(|was| at < was) {
                return Err(format!(
                    "the published replica went back from epoch {} to {at}",
                    self.last_published.unwrap()
                ));
            }
            if self.last_published != Some(at) {
                self.published_moves += 1;
            }
            self.last_published = Some(at);
            self.published_checks += 1;
            if self.upstream.tables > 1 {
                // The cross-table invariant, read off the replica alone: every table's sum equal.
                self.sum_checks += 1;
                let sums = super::upstream::sums(&rows, self.upstream.tables);
                if sums.windows(2).any(|w| w[0] != w[1]) {
                    return Err(format!(
                        "the replica published at epoch {at} breaks the cross-table invariant: the tables' sums are {sums:?}"
                    ));
                }
            }
            let table = self.upstream.history.get(&at).ok_or_else(|| {
                format!("published at epoch {at}, which the upstream never completed")
            })?;
            if rows != *table {
                return Err(format!(
                    "the replica published at epoch {at} is not the upstream table there: {} rows vs {}",
                    rows.len(),
                    table.len()
                ));
            }
            return Ok(());
        }
        let progress = self.store.vnode_progress(JOB);
        let started = progress.len() == self.map.vnode_count() as usize
            && progress.values().all(|p| p.finished);
        if started {
            let rows = self.store.clone().rows(JOB).map_err(|e| e.to_string())?;
            if !self.upstream.history.values().any(|t| *t == rows) {
                self.torn += 1;
            }
            if self.upstream.tables > 1 {
                self.sum_checks += 1;
                let sums = super::upstream::sums(&rows, self.upstream.tables);
                if sums.windows(2).any(|w| w[0] != w[1]) {
                    self.sums_torn += 1;
                }
            }
        }
        Ok(())
    }

    pub(super) fn oracle_check(&self) -> SimResult<()> {
        // Dead letters: each recorded one is a record that does not decode, written to the
        // dead-letter topic before the store recorded it (the sink is written before the commit).
        for d in self
            .store
            .clone()
            .dead_letters(JOB)
            .map_err(|e| e.to_string())?
        {
            let at = (d.partition, d.offset);
            if !self.upstream.poison.contains(&at) {
                return Err(format!(
                    "dead letter at partition {} offset {} is not a bad record",
                    at.0, at.1
                ));
            }
            if !self.dead_letters_sent.contains(&at) {
                return Err(format!(
                    "dead letter at partition {} offset {} recorded before it was written to the dead-letter topic",
                    at.0, at.1
                ));
            }
        }
        let es = self.info.snapshot_epoch;
        let progress = self.store.vnode_progress(JOB);
        // Under publication, what the commits hold: the shadow table with the pending units applied
        // (each vnode at its own epoch, as without publication).
        let rows = if self.config.publication {
            self.store.rows_with_pending(JOB)
        } else {
            self.store.clone().rows(JOB).map_err(|e| e.to_string())?
        };
        let mut by_vnode: BTreeMap<Vnode, BTreeMap<&Vec<u8>, &Vec<u8>>> = BTreeMap::new();
        for (k, v) in &rows {
            by_vnode
                .entry(vnode_of(
                    super::upstream::routing(k, self.upstream.tables),
                    self.map.vnode_count(),
                ))
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
                .filter(|(k, _)| {
                    vnode_of(
                        super::upstream::routing(k, self.upstream.tables),
                        self.map.vnode_count(),
                    ) == v
                })
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

pub(super) type Shared = Rc<RefCell<World>>;

/// A simulated group member's consumer: group events first, then records of unpaused partitions
/// (a paused one leaks with `leaky_pause_percent`, as prefetched records do).
pub struct SimConsumer {
    pub(super) world: Shared,
    pub(super) i: usize,
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
        let record = if w.upstream.poison.contains(&(p, offset)) {
            Err(crate::ports::Undecoded {
                reason: "sim: not a log record".into(),
                key: Some(b"poison".to_vec()),
                value: format!("poison {p}/{offset}").into_bytes(),
            })
        } else {
            Ok(record)
        };
        Some(Polled::Record {
            partition: p,
            offset,
            record,
        })
    }

    fn assign(
        &mut self,
        starts: &[(PartitionId, Option<u64>)],
    ) -> Result<(), crate::ports::AssignError> {
        let mut w = self.world.borrow_mut();
        for &(p, offset) in starts {
            // Without a claimed offset the group would start at its own committed offset: the
            // snapshot's start stands in for it (the loop seeks before it reads).
            let from = offset.unwrap_or_else(|| w.info.start_of(p).map_or(0, |s| s.next_offset));
            w.consumers[self.i].assigned.insert(p, (from, false));
        }
        Ok(())
    }

    fn unassign(&mut self, partitions: &[PartitionId]) -> Result<(), String> {
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
        Ok(())
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

    fn pause(&mut self, partition: PartitionId) -> Result<(), String> {
        if let Some(a) = self.world.borrow_mut().consumers[self.i]
            .assigned
            .get_mut(&partition)
        {
            a.1 = true;
        }
        Ok(())
    }

    /// Resumes; `at` must be where this consumer stopped (the Kafka port seeks there, so a loop
    /// that lost count of what it was given would skip or repeat records).
    fn resume(&mut self, partition: PartitionId, at: Option<u64>) -> Result<(), String> {
        if let Some(a) = self.world.borrow_mut().consumers[self.i]
            .assigned
            .get_mut(&partition)
        {
            if let Some(at) = at.filter(|at| *at != a.0) {
                return Err(format!(
                    "resume of partition {partition} at offset {at}, where the consumer stopped at {}",
                    a.0
                ));
            }
            a.1 = false;
        }
        Ok(())
    }

    /// The group's offsets are the owner's to tell: a partition revoked (and perhaps read by
    /// another worker since) must not get its old owner's offsets later (the loop holds them back
    /// between tells, `GROUP_OFFSETS_EVERY_MS`).
    fn commit_offsets(&mut self, progress: &[PartitionProgress], _sync: bool) {
        let mut w = self.world.borrow_mut();
        for p in progress {
            if !w.consumers[self.i].assigned.contains_key(&p.partition) {
                let v = format!(
                    "worker w{} told the group offset {} of partition {}, which it does not own",
                    self.i, p.next_offset, p.partition
                );
                w.violation.get_or_insert(v);
            }
        }
    }

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
    pub(super) world: Shared,
    pub(super) i: usize,
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

    fn restart(&mut self) -> Result<Vec<CommitDone>, StoreError> {
        let mut w = self.world.borrow_mut();
        while !w.commits[self.i].pending.is_empty() {
            w.apply_commit(self.i);
        }
        let done = std::mem::take(&mut w.commits[self.i].done);
        w.commits[self.i] = CommitQueue::default();
        Ok(done)
    }
}

/// Simulated time: one millisecond per step; a throttling wait moves it on.
pub struct SimClock {
    pub(super) world: Shared,
}

impl Clock for SimClock {
    fn now_ms(&self) -> u64 {
        self.world.borrow().now_ms
    }

    fn sleep_ms(&mut self, ms: u64) {
        self.world.borrow_mut().now_ms += ms;
    }
}

/// The simulated dead-letter topic: what was written, in the world.
pub struct SimDeadLetters {
    pub(super) world: Shared,
}

impl crate::ports::DeadLetterSink for SimDeadLetters {
    fn send(&mut self, letters: &[crate::ports::DeadLetterRecord<'_>]) -> Result<(), String> {
        let mut w = self.world.borrow_mut();
        for r in letters {
            if r.value != format!("poison {}/{}", r.letter.partition, r.letter.offset).as_bytes() {
                w.violation.get_or_insert(format!(
                    "dead letter at partition {} offset {} carries other bytes",
                    r.letter.partition, r.letter.offset
                ));
            }
            w.dead_letters_sent
                .push((r.letter.partition, r.letter.offset));
        }
        Ok(())
    }
}
