//! Running the simulation: a step of one worker's loop or one commit completing, and the checks
//! after each (the oracle's verdict, the invariant error only in the log store, convergence).

use super::{Sim, SimResult, JOB};
use crate::core::{CoreError, PartitionId, Phase, RecreationPolicy};
use crate::ports::Polled;
use crate::ports::{LogStore, StateStore};

impl Sim {
    // ----- work ---------------------------------------------------------------------------------

    /// A pending commit completes (sometimes), else a random runnable worker runs a loop step.
    pub(super) fn worker_step(&mut self) -> SimResult<()> {
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
    pub(super) fn work(&mut self, i: usize, batch: usize) -> SimResult<()> {
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
        if let Err(e) = &r {
            // The `fail` policy stops the job on the seed's error, and only on it.
            let seed_error = CoreError::VnodeBitmapUpdateDuringLogStore.to_string();
            if self.config.supervisor.policy == RecreationPolicy::Fail
                && e.reason.starts_with(&seed_error)
            {
                self.stopped = Some(format!("worker {id}: {e}"));
                return self.check();
            }
        }
        r.map_err(|e| format!("worker {id}: {e}"))?;
        self.check()
    }

    /// The oracle's verdict so far, and what the report notes after each step.
    pub(super) fn check(&mut self) -> SimResult<()> {
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

    pub(super) fn converged(&self) -> bool {
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

    pub(super) fn final_check(&mut self) -> SimResult<()> {
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

    pub(super) fn describe(&self) -> String {
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
