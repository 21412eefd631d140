//! The loop's reaction to what it polls — records, assignments, revocations, client errors — and to
//! the snapshot scan: events fed to the executor, its decisions carried out through the ports.

use std::collections::VecDeque;

use tracing::{debug, error, info, warn};

use super::{Driver, Scan};
use crate::core::{CoreError, Decision, Event, LogRecord, PartitionId, Phase, Row, WorkerFailure};
use crate::ports::{
    BitmapOutcome, Clock, CommitPort, ConsumerPort, Polled, Undecoded, WorkerEvent,
};

impl<C: ConsumerPort, K: CommitPort, T: Clock> Driver<C, K, T> {
    pub(super) fn on_polled(&mut self, polled: Polled) {
        match polled {
            Polled::Record {
                partition,
                offset,
                record,
            } => self.on_record(partition, offset, record),
            Polled::Assigned(parts) => self.on_assigned(parts),
            Polled::Revoked { partitions, lost } => self.on_revoked(partitions, lost),
            Polled::ClientError {
                reason,
                fatal,
                repeat,
            } => {
                if !repeat {
                    warn!(job = %self.cfg.job, worker = %self.cfg.worker, %reason, "Kafka client error");
                }
                self.observer.observe(WorkerEvent::KafkaError { fatal });
                self.last_error = Some(format!("Kafka: {reason}"));
                if fatal {
                    self.fail(WorkerFailure::Fatal(format!("fatal Kafka error: {reason}")));
                }
            }
        }
    }

    /// The group gives partitions: claim them in the store, start them at the claimed offsets,
    /// then tell the executor.
    pub(super) fn on_assigned(&mut self, parts: Vec<PartitionId>) {
        let ranges = self.map.bitmap_of(parts.iter().copied()).ranges();
        info!(job = %self.cfg.job, worker = %self.cfg.worker, partitions = ?parts, vnodes = ?ranges, "partitions assigned");
        let claims = self.claim(&parts);
        let starts: Vec<(PartitionId, Option<u64>)> = match &claims {
            Some(claims) => claims
                .iter()
                .map(|c| {
                    self.position.insert(c.partition, c.progress.next_offset);
                    (c.partition, Some(c.progress.next_offset))
                })
                .collect(),
            None => parts
                .iter()
                .map(|p| {
                    self.position.remove(p);
                    (*p, None)
                })
                .collect(),
        };
        if let Err(e) = self.consumer.assign(&starts) {
            // The group says this worker owns them but the client will not fetch them: no restart
            // in place can mend that; the job stops and its process is restarted.
            return self.fail(WorkerFailure::Fatal(e.to_string()));
        }
        if self.job_paused {
            for (p, _) in &starts {
                if let Err(e) = self.consumer.pause(*p) {
                    return self.fail(WorkerFailure::Unavailable(e));
                }
            }
        }
        if let Some(claims) = claims {
            self.feed(Event::Assigned(claims));
            self.settle(true);
        }
    }

    /// The group takes partitions: the executor commits what is complete and rolls back the rest;
    /// the revocation is acknowledged only once those commits are durable.
    pub(super) fn on_revoked(&mut self, parts: Vec<PartitionId>, lost: bool) {
        let ranges = self.map.bitmap_of(parts.iter().copied()).ranges();
        info!(job = %self.cfg.job, worker = %self.cfg.worker, partitions = ?parts, vnodes = ?ranges, lost, "partitions revoked");
        self.feed(Event::Revoked(parts.clone()));
        // Commit → acknowledge: what the revocation committed is durable before unassigning.
        let ack_early =
            crate::core::faults::active(crate::core::faults::Fault::AckRevocationBeforeCommit);
        self.settle(!ack_early);
        self.tell_group(|p| parts.contains(&p));
        for p in &parts {
            self.position.remove(p);
            self.paused_at.remove(p);
            // Whoever reads the partition next meets its bad records again.
            self.undecoded.retain(|(q, _), _| q != p);
            self.observer.observe(WorkerEvent::PartitionReleased(*p));
        }
        if let Err(e) = self.consumer.unassign(&parts) {
            self.fail(WorkerFailure::Fatal(format!(
                "{e}; the revocation could not be acknowledged"
            )));
        }
    }

    pub(super) fn on_record(
        &mut self,
        partition: PartitionId,
        offset: u64,
        record: Result<LogRecord, Undecoded>,
    ) {
        tracing::trace!(worker = %self.cfg.worker, partition, offset, "message");
        self.position.insert(partition, offset + 1);
        let Some(exec) = &self.exec else { return };
        if !matches!(exec.phase(), Phase::LogStore | Phase::Streaming) {
            return; // fetched before the pause took effect: read again at Fetch
        }
        match record {
            Ok(record) => {
                match &record {
                    LogRecord::Change(c) if self.cfg.policy.tables.includes(c.table) => {
                        self.observer.observe(WorkerEvent::Change {
                            op: c.op,
                            table: c.table,
                        });
                    }
                    LogRecord::Truncate(t) if self.cfg.policy.tables.includes(t.table) => {
                        info!(job = %self.cfg.job, worker = %self.cfg.worker, partition, offset, table = t.table, epoch = %t.epoch, "truncation read: the table's rows of this partition's vnodes are deleted in the checkpoint of its epoch");
                        self.observer
                            .observe(WorkerEvent::Truncate { table: t.table });
                    }
                    _ => {}
                }
                self.feed(Event::Record {
                    partition,
                    offset,
                    record,
                })
            }
            Err(bad) => {
                self.observer.observe(WorkerEvent::DecodeError);
                let reason = bad.reason.clone();
                if let Some(max) = self.cfg.policy.max_dead_letters {
                    // Bounded: past the cap the checkpoint would be refused anyway.
                    if self.undecoded.len() as u64 > max {
                        return self.fail(WorkerFailure::Fatal(format!(
                            "more than max_dead_letters = {max} records of topic {} did not decode since the last checkpoint (the last: partition {partition} offset {offset}: {reason}); the job stops",
                            self.cfg.topic
                        )));
                    }
                    self.undecoded.insert((partition, offset), bad);
                }
                self.feed(Event::Undecodable {
                    partition,
                    offset,
                    reason,
                });
            }
        }
    }

    pub(super) fn feed(&mut self, event: Event) {
        let Some(exec) = self.exec.as_mut() else {
            return;
        };
        let phase = exec.phase();
        // An empty assignment or revocation (the consumer protocol of KIP-848 sends them while it
        // reconciles) changes no bitmap.
        let update = match &event {
            Event::Assigned(claims) => !claims.is_empty(),
            Event::Revoked(ps) => !ps.is_empty(),
            _ => false,
        } && phase != Phase::Unassigned;
        let moved: Vec<PartitionId> = match &event {
            Event::Assigned(claims) => claims.iter().map(|c| c.partition).collect(),
            Event::Revoked(ps) => ps.clone(),
            _ => Vec::new(),
        };
        match exec.handle(event) {
            Ok(ds) => {
                if update {
                    let outcome = if ds.iter().any(|d| matches!(d, Decision::Fail(_))) {
                        BitmapOutcome::InvariantError
                    } else if phase == Phase::LogStore {
                        info!(job = %self.cfg.job, worker = %self.cfg.worker, partitions = ?moved, "vnode bitmap updated during log store: rescheduled");
                        BitmapOutcome::Rescheduled
                    } else {
                        BitmapOutcome::Applied
                    };
                    self.observer
                        .observe(WorkerEvent::BitmapUpdate { phase, outcome });
                }
                self.execute(phase, ds);
            }
            Err(e) => {
                error!(job = %self.cfg.job, worker = %self.cfg.worker, error = %e, "worker stopped on bad input");
                self.fail(WorkerFailure::Core(e));
            }
        }
    }

    pub(super) fn execute(&mut self, phase_before: Phase, decisions: Vec<Decision>) {
        for d in decisions {
            match d {
                Decision::Commit(cp) => {
                    if !cp.dead_letters.is_empty() && !self.send_dead_letters(&cp) {
                        return;
                    }
                    // Pipelined: the committer applies it while this loop goes on fetching.
                    self.committer.submit(cp);
                    if !self.settle(false) {
                        return;
                    }
                }
                Decision::Scan { scan, vnodes } => {
                    self.scan = if vnodes.is_empty() {
                        None
                    } else {
                        Some(Scan {
                            id: scan,
                            queue: vnodes.into(),
                            current: None,
                            rows: VecDeque::new(),
                        })
                    };
                }
                Decision::Fetch { partition, offset } => {
                    debug!(worker = %self.cfg.worker, partition, offset, position = ?self.position.get(&partition), "fetch");
                    if self.position.get(&partition) != Some(&offset) {
                        if let Err(e) = self.consumer.seek(partition, offset) {
                            return self.fail(WorkerFailure::Unavailable(format!(
                                "seek partition {partition} to {offset}: {e}"
                            )));
                        }
                        self.position.insert(partition, offset);
                    }
                    // A paused job resumes it when it is resumed (`set_job_paused`).
                    if !self.job_paused {
                        if let Err(e) = self.consumer.resume(partition, Some(offset)) {
                            return self.fail(WorkerFailure::Unavailable(e));
                        }
                    }
                    self.paused_at.remove(&partition);
                }
                Decision::Pause(p) => {
                    debug!(worker = %self.cfg.worker, partition = p, "pause");
                    if let Err(e) = self.consumer.pause(p) {
                        return self.fail(WorkerFailure::Unavailable(e));
                    }
                    self.paused_at.insert(p, self.clock.now_ms());
                }
                Decision::Resume(p) => {
                    debug!(worker = %self.cfg.worker, partition = p, "resume");
                    if !self.job_paused {
                        let at = self.position.get(&p).copied();
                        if let Err(e) = self.consumer.resume(p, at) {
                            return self.fail(WorkerFailure::Unavailable(e));
                        }
                    }
                    if let Some(t) = self.paused_at.remove(&p) {
                        let seconds = self.clock.now_ms().saturating_sub(t) as f64 / 1000.0;
                        self.observer
                            .observe(WorkerEvent::AlignmentWait { seconds });
                    }
                }
                Decision::PhaseChanged { from, to } => {
                    info!(job = %self.cfg.job, worker = %self.cfg.worker, from = from.as_str(), to = to.as_str(), "phase changed");
                    self.observer
                        .observe(WorkerEvent::PhaseChanged { from, to });
                }
                Decision::Restart { generation, reason } => {
                    info!(job = %self.cfg.job, worker = %self.cfg.worker, %reason, "restarting from the store");
                    return self.fail(WorkerFailure::Recreated {
                        generation,
                        detail: reason,
                    });
                }
                Decision::Fail(e) => {
                    // Invariant 4: the error is raised only after the checkpoint before it is durable.
                    if !self.settle(true) {
                        return;
                    }
                    if e == CoreError::VnodeBitmapUpdateDuringLogStore {
                        self.observer.observe(WorkerEvent::InvariantError {
                            phase: phase_before,
                        });
                    }
                    error!(job = %self.cfg.job, worker = %self.cfg.worker, "{e}");
                    return self.fail(WorkerFailure::Core(e));
                }
            }
        }
    }

    /// Writes a checkpoint's dead letters to the sink and waits for them, before the checkpoint
    /// goes to the store; `false` (and the worker failed) if that cannot be done.
    fn send_dead_letters(&mut self, cp: &crate::core::Checkpoint) -> bool {
        let Some(sink) = self.dead_letter_sink.as_mut() else {
            self.fail(WorkerFailure::Fatal(
                "a checkpoint carries dead letters but the worker has no dead-letter topic".into(),
            ));
            return false;
        };
        let mut records = Vec::with_capacity(cp.dead_letters.len());
        for d in &cp.dead_letters {
            match self.undecoded.get(&(d.partition, d.offset)) {
                Some(bad) => records.push(crate::ports::DeadLetterRecord {
                    letter: d,
                    key: bad.key.as_deref(),
                    value: &bad.value,
                }),
                None => {
                    self.fail(WorkerFailure::Fatal(format!(
                        "dead letter at partition {} offset {} has no bytes kept",
                        d.partition, d.offset
                    )));
                    return false;
                }
            }
        }
        if let Err(e) = sink.send(&records) {
            self.fail(WorkerFailure::Unavailable(format!(
                "writing {} dead letter(s) to the dead-letter topic: {e}",
                records.len()
            )));
            return false;
        }
        for d in &cp.dead_letters {
            warn!(job = %self.cfg.job, worker = %self.cfg.worker, partition = d.partition, offset = d.offset, reason = %d.reason, "dead letter written; the checkpoint records it");
            self.undecoded.remove(&(d.partition, d.offset));
        }
        self.observer.observe(WorkerEvent::DeadLettered {
            count: cp.dead_letters.len(),
        });
        true
    }

    /// Feeds up to `max` snapshot rows (and vnode ends); returns how many rows.
    pub(super) fn scan_batch(&mut self, max: usize) -> usize {
        let mut rows = 0;
        for _ in 0..max {
            let Some(scan) = self.scan.as_mut() else {
                return rows;
            };
            let id = scan.id;
            if scan.current.is_none() {
                let Some(start) = scan.queue.pop_front() else {
                    self.scan = None;
                    return rows;
                };
                let fetched = self
                    .snapshot
                    .scan(start.vnode, start.after.as_deref())
                    .and_then(|it| it.collect::<Result<VecDeque<Row>, _>>());
                let scan = self.scan.as_mut().expect("scan");
                match fetched {
                    Ok(fetched) => {
                        scan.current = Some(start.vnode);
                        scan.rows = fetched;
                    }
                    Err(e) => {
                        self.fail(WorkerFailure::Fatal(e.to_string()));
                        return rows;
                    }
                }
            }
            let scan = self.scan.as_mut().expect("scan");
            let vnode = scan.current.expect("current");
            let event = match scan.rows.pop_front() {
                Some(row) => {
                    rows += 1;
                    self.observer.observe(WorkerEvent::SnapshotRow {
                        table: self.cfg.policy.tables.table_of(&row.key),
                    });
                    Event::SnapshotRow {
                        scan: id,
                        vnode,
                        row,
                    }
                }
                None => {
                    scan.current = None;
                    Event::SnapshotVnodeDone { scan: id, vnode }
                }
            };
            self.feed(event);
            if self.failure.is_some() {
                return rows;
            }
        }
        rows
    }
}
