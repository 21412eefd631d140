//! The service's side of the worker loop's [`Observer`] port: each [`WorkerEvent`] becomes its
//! Prometheus series (`metrics`) and the worker's entry on the status board (`status`). The loop
//! never touches either; this module is the only place where what a worker did turns into what
//! operators see, so the simulation (`sim::observe`) can stand in for it and check the counts.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::core::{CheckpointCause, Op, Phase};
use crate::ports::{BitmapOutcome, Observer, WorkerEvent};
use crate::service::metrics::Metrics;
use crate::service::runtime::TableCounts;
use crate::service::status::{Reported, StatusBoard};

/// The one reason a job is recreated (the `reason` label of `kafka_backfill_recreations_total`).
const RECREATION_REASON: &str = "vnode_bitmap_update_in_log_store";

/// One worker's observer: its series resolved once (the per-record ones are hot), and the board.
pub struct ServiceObserver {
    metrics: Arc<Metrics>,
    job: String,
    worker: String,
    board: StatusBoard,
    changes: Vec<prometheus::IntCounter>,
    truncations: prometheus::IntCounter,
    snapshot_rows: prometheus::IntCounter,
    /// A job of several tables: each table's changes' and snapshot rows' series, in the order of
    /// `counts` (the runtime's, for `/status`); both empty for a job of one table.
    tables: Vec<(prometheus::IntCounter, prometheus::IntCounter)>,
    counts: Arc<[TableCounts]>,
    checkpoints: Vec<prometheus::IntCounter>,
}

impl ServiceObserver {
    /// `counts`: a job of several tables' per-table counts, shared with its runtime (empty for one
    /// table).
    pub fn new(
        metrics: Arc<Metrics>,
        job: &str,
        worker: &str,
        board: StatusBoard,
        counts: Arc<[TableCounts]>,
    ) -> Self {
        let m = &*metrics;
        // Every series an alert reads exists from the start, at 0: `increase()` over a counter that
        // appears only when it first fires sees no data (docs/OPERATIONS.md "Metrics reference").
        for c in [
            &m.decode_errors,
            &m.dead_letters,
            &m.kafka_errors,
            &m.invariant_errors,
        ] {
            c.with_label_values(&[job]);
        }
        m.recreations.with_label_values(&[job, RECREATION_REASON]);
        m.snapshot_moves.with_label_values(&[job]);
        for phase in Phase::ALL {
            for outcome in BitmapOutcome::ALL {
                m.bitmap_updates
                    .with_label_values(&[job, phase.as_str(), outcome.as_str()]);
            }
        }
        for g in [&m.paused, &m.store_unreachable] {
            g.with_label_values(&[job, worker]).set(0);
        }
        m.commit_seconds.with_label_values(&[job]);
        m.alignment_seconds.with_label_values(&[job]);
        ServiceObserver {
            metrics: metrics.clone(),
            job: job.to_string(),
            worker: worker.to_string(),
            board,
            // Indexed by `Op as usize` and by position in `CheckpointCause::ALL`.
            changes: Op::ALL
                .iter()
                .map(|op| m.log_records.with_label_values(&[job, op.as_str()]))
                .collect(),
            truncations: m.log_records.with_label_values(&[job, "truncate"]),
            snapshot_rows: m.snapshot_rows.with_label_values(&[job]),
            tables: counts
                .iter()
                .map(|t| {
                    (
                        m.table_changes.with_label_values(&[job, &t.name]),
                        m.table_snapshot_rows.with_label_values(&[job, &t.name]),
                    )
                })
                .collect(),
            counts,
            checkpoints: CheckpointCause::ALL
                .iter()
                .map(|c| m.checkpoints.with_label_values(&[job, c.as_str()]))
                .collect(),
        }
    }

    /// The position of log table `index` among the job's tables (none for a job of one table).
    fn table(&self, index: u16) -> Option<usize> {
        self.counts.iter().position(|t| t.index == index)
    }

    fn label(&self) -> [&str; 2] {
        [self.job.as_str(), self.worker.as_str()]
    }
}

impl Observer for ServiceObserver {
    fn observe(&mut self, event: WorkerEvent) {
        let m = &*self.metrics;
        match event {
            WorkerEvent::Change { op, table } => {
                self.changes[op as usize].inc();
                if let Some(i) = self.table(table) {
                    self.tables[i].0.inc();
                    self.counts[i].changes.fetch_add(1, Ordering::Relaxed);
                }
            }
            WorkerEvent::Truncate { .. } => self.truncations.inc(),
            WorkerEvent::SnapshotRow { table } => {
                self.snapshot_rows.inc();
                if let Some(i) = self.table(table) {
                    self.tables[i].1.inc();
                    self.counts[i].snapshot_rows.fetch_add(1, Ordering::Relaxed);
                }
            }
            WorkerEvent::DecodeError => m.decode_errors.with_label_values(&[&self.job]).inc(),
            WorkerEvent::DeadLettered { count } => m
                .dead_letters
                .with_label_values(&[&self.job])
                .inc_by(count as u64),
            WorkerEvent::KafkaError { .. } => m.kafka_errors.with_label_values(&[&self.job]).inc(),
            WorkerEvent::CommitApplied {
                cause,
                transaction_ms,
                ..
            } => {
                let i = CheckpointCause::ALL
                    .iter()
                    .position(|c| *c == cause)
                    .expect("every cause is listed");
                self.checkpoints[i].inc();
                if let Some(ms) = transaction_ms {
                    m.commit_seconds
                        .with_label_values(&[&self.job])
                        .observe(ms / 1000.0);
                }
            }
            WorkerEvent::BitmapUpdate { phase, outcome } => m
                .bitmap_updates
                .with_label_values(&[&self.job, phase.as_str(), outcome.as_str()])
                .inc(),
            WorkerEvent::InvariantError { .. } => {
                m.invariant_errors.with_label_values(&[&self.job]).inc()
            }
            WorkerEvent::PhaseChanged { to, .. } => {
                for p in Phase::ALL {
                    m.phase
                        .with_label_values(&[&self.job, &self.worker, p.as_str()])
                        .set((p == to) as i64);
                }
            }
            WorkerEvent::Recreated => m
                .recreations
                .with_label_values(&[&self.job, RECREATION_REASON])
                .inc(),
            // Logged by the loop with its reason; counted by what follows (recreation, restart).
            WorkerEvent::Failed { .. } => {}
            WorkerEvent::Generation(g) => m
                .generation
                .with_label_values(&self.label())
                .set(g.0 as i64),
            WorkerEvent::AlignmentWait { seconds } => m
                .alignment_seconds
                .with_label_values(&[&self.job])
                .observe(seconds),
            WorkerEvent::PartitionReleased(p) => {
                // Its new owner reports its lag; a stale series here would double it. Absent when
                // it was never reported: nothing to remove.
                let _ = m
                    .partition_lag
                    .remove_label_values(&[&self.job, &p.to_string()]);
            }
            WorkerEvent::StoreReachable(up) => m
                .store_unreachable
                .with_label_values(&self.label())
                .set(!up as i64),
            WorkerEvent::Paused(paused) => {
                m.paused.with_label_values(&self.label()).set(paused as i64)
            }
            WorkerEvent::Report(report) => {
                m.catch_up_eta_seconds
                    .with_label_values(&self.label())
                    .set(report.estimated_catch_up_seconds.unwrap_or(f64::NAN));
                for (kind, v) in [
                    ("snapshot_rows", report.rate_limits.snapshot_rows_per_second),
                    ("log_records", report.rate_limits.log_records_per_second),
                ] {
                    m.rate_limit
                        .with_label_values(&[&self.job, &self.worker, kind])
                        .set(v as i64);
                }
                if let Some(s) = &report.status {
                    m.epoch_lag_seconds
                        .with_label_values(&self.label())
                        .set(s.epoch_lag_seconds);
                    for p in &s.partitions {
                        if let Some(lag) = p.lag() {
                            m.partition_lag
                                .with_label_values(&[&self.job, &p.partition.to_string()])
                                .set(lag as i64);
                        }
                    }
                }
                self.board
                    .lock()
                    .unwrap()
                    .entry(self.job.clone())
                    .or_default()
                    .insert(
                        self.worker.clone(),
                        Reported {
                            report: *report,
                            reported_at: Instant::now(),
                        },
                    );
            }
        }
    }
}
