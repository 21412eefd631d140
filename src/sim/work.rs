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
        if let Some((worker, phase)) = self
            .counts
            .lock()
            .unwrap()
            .invariant_errors
            .iter()
            .find(|(_, p)| *p != Phase::LogStore)
        {
            return Err(format!(
                "worker {worker} raised the invariant error outside the log-store phase ({phase:?})"
            ));
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
        // Every record that does not decode ends up recorded, once (the store keys them).
        let recorded: std::collections::BTreeSet<(PartitionId, u64)> = self
            .store
            .dead_letters(JOB)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|d| (d.partition, d.offset))
            .collect();
        if recorded != w.upstream.poison {
            return Err(format!(
                "dead letters recorded {recorded:?}, bad records written {:?}",
                w.upstream.poison
            ));
        }
        let last = *w.upstream.history.keys().last().unwrap();
        if self.config.publication {
            match self.store.published(JOB) {
                Some((at, rows)) if at == last && rows == w.upstream.table => {}
                Some((at, rows)) => {
                    return Err(format!(
                        "the replica ends published at epoch {at} with {} rows, not at the last epoch {last} with the final table's {}",
                        rows.len(),
                        w.upstream.table.len()
                    ))
                }
                None => return Err("the replica was never published".into()),
            }
        }
        for (v, p) in self.store.vnode_progress(JOB) {
            if p.epoch != last {
                return Err(format!(
                    "vnode {v} ends at epoch {} instead of {last}",
                    p.epoch
                ));
            }
        }
        // What operators would see agrees with the oracle: every commit the store applied was
        // reported exactly once (but those whose outcome a crash took with it), every recreation
        // the store counts was reported by the worker whose compare-and-set applied it.
        let c = self.counts.lock().unwrap();
        let unreported: u64 = w.unreported
            + w.commits
                .iter()
                .map(|q| q.done.iter().filter(|d| d.result.is_ok()).count() as u64)
                .sum::<u64>();
        if c.commits + unreported != w.applied {
            return Err(format!(
                "observers counted {} commits (+{unreported} whose report a crash lost), the store applied {}",
                c.commits, w.applied
            ));
        }
        let recreations = self.store.job_row(JOB).map_or(0, |r| r.recreations);
        if c.recreations != recreations {
            return Err(format!(
                "observers counted {} recreations, the store {recreations}",
                c.recreations
            ));
        }
        let raised_in_log_store = c.invariant_errors.len() as u64;
        let updates_ending_in_it: u64 = c
            .updates
            .iter()
            .filter(|((_, o), _)| *o == crate::ports::BitmapOutcome::InvariantError)
            .map(|(_, n)| n)
            .sum();
        if raised_in_log_store > updates_ending_in_it {
            return Err(format!(
                "{raised_in_log_store} invariant errors raised, but only {updates_ending_in_it} bitmap updates ended in one"
            ));
        }
        drop(c);
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
