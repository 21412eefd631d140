//! Commits coming back from the committer: metrics and group offsets for each success, the first
//! failure classified (fenced, unavailable, refused) and, for a refused value, named by topic,
//! partition and offset.

use tracing::{debug, error, warn};

use super::Driver;
use crate::core::{PartitionId, PartitionProgress, WorkerFailure};
use crate::ports::{Clock, CommitDone, CommitPort, ConsumerPort, StoreError, WorkerEvent};

/// The group's offsets are told at most this often (ms): they are informational (the store holds
/// the offsets a worker resumes from: docs/DESIGN.md), and each commit is a write to the broker's
/// offsets topic, five a second at the capture's default checkpoint interval. A revocation tells
/// the revoked partitions' at once; a shutdown tells all, waited for.
pub const GROUP_OFFSETS_EVERY_MS: u64 = 1000;

impl<C: ConsumerPort, K: CommitPort, T: Clock> Driver<C, K, T> {
    /// Takes in finished commits (all pending ones when `wait`): metrics and group offsets for each
    /// success; the first failure fails the worker. Returns whether all were successes.
    pub(super) fn settle(&mut self, wait: bool) -> bool {
        let done = if wait {
            self.committer.drain()
        } else {
            self.committer.finished()
        };
        for d in done {
            self.on_commit_done(d);
        }
        if self.failure.is_some() {
            // A failed worker's executor is never fed again.
            self.exec = None;
            self.scan = None;
        }
        self.failure.is_none()
    }

    pub(super) fn on_commit_done(&mut self, d: CommitDone) {
        let job = self.cfg.job.clone();
        let cp = d.checkpoint;
        match d.result {
            Ok(()) => {
                // One latency sample per store transaction, not per checkpoint it carried.
                if let Some(ms) = d.transaction_ms {
                    self.adaptive.observe_commit(ms);
                }
                self.observer.observe(WorkerEvent::CommitApplied {
                    cause: cp.cause,
                    transaction_ms: d.transaction_ms,
                    group_size: d.group_size,
                });
                debug!(job = %job, worker = %self.cfg.worker, cause = ?cp.cause, epoch = ?cp.epoch, rows = cp.rows.len(), transaction_ms = d.transaction_ms.map(|ms| ms as u64), group = d.group_size, "committed");
                for p in cp.partitions {
                    self.group_offsets.insert(p.partition, p);
                }
                let now = self.clock.now_ms();
                if now.saturating_sub(self.group_told_at) >= GROUP_OFFSETS_EVERY_MS {
                    self.tell_group(|_| true);
                    self.group_told_at = now;
                }
            }
            Err(e) if self.failure.is_some() => {
                debug!(job = %job, worker = %self.cfg.worker, error = %e, "later checkpoint not applied");
            }
            Err(e) if e.is_fenced() => {
                warn!(job = %job, worker = %self.cfg.worker, error = %e, "commit fenced");
                self.fail(super::store_failure(e));
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

    /// Tells the group the committed offsets held back of the partitions `which` takes
    /// (asynchronously, best effort), and forgets them.
    pub(super) fn tell_group(&mut self, which: impl Fn(PartitionId) -> bool) {
        let (told, kept) = std::mem::take(&mut self.group_offsets)
            .into_iter()
            .partition(|(p, _)| which(*p));
        self.group_offsets = kept;
        let told: Vec<PartitionProgress> = told.into_values().collect();
        if !told.is_empty() {
            self.consumer.commit_offsets(&told, false);
        }
    }

    /// A store's refusal, with the topic, partition and offset of the row it names (or its snapshot
    /// vnode), so an operator can find the record.
    pub(super) fn describe_rejection(&self, cp: &crate::core::Checkpoint, e: StoreError) -> String {
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
    pub(super) fn commit_group_offsets_sync(&mut self) {
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
}
