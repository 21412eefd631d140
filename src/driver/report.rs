//! Housekeeping: watermarks and read positions fed to the executor, the store's generation,
//! reachability and live rate limits, and the worker's report on the status board (rate and ETA from
//! the core).

use tracing::{debug, info, warn};

use super::{Driver, WorkerReport};
use crate::core::{Event, PartitionId, Phase, RateLimits};
use crate::ports::{Clock, CommitPort, ConsumerPort, WorkerEvent};

impl<C: ConsumerPort, K: CommitPort, T: Clock> Driver<C, K, T> {
    /// Watermarks, the generation check and the status report (when `due`); the clock always.
    pub(super) fn housekeeping(&mut self, due: bool) {
        let Some(exec) = &self.exec else { return };
        let owned = exec.owned_partitions();
        let log_phase = matches!(exec.phase(), Phase::LogStore | Phase::Streaming);
        if due {
            match self.store.job(&self.cfg.job) {
                Ok(row) => {
                    if !self.store_reachable {
                        info!(job = %self.cfg.job, worker = %self.cfg.worker, "state store reachable again");
                    }
                    self.store_reachable = true;
                    self.observer.observe(WorkerEvent::StoreReachable(true));
                    if let Some(row) = row {
                        // The core decides what the job's generation means for this executor.
                        self.feed(Event::JobGeneration {
                            generation: row.generation,
                        });
                        if self.exec.is_none() {
                            return;
                        }
                    }
                }
                Err(e) => {
                    if self.store_reachable {
                        warn!(job = %self.cfg.job, worker = %self.cfg.worker, error = %e, "state store unreachable");
                    }
                    self.store_reachable = false;
                    self.observer.observe(WorkerEvent::StoreReachable(false));
                    self.last_error = Some(e.to_string());
                }
            }
            self.read_rate_limits();
            self.read_pause();
            if log_phase {
                for p in owned {
                    let high = if self.job_paused {
                        self.consumer.broker_high_watermark(p)
                    } else {
                        self.consumer.high_watermark(p)
                    };
                    if let Some(high) = high {
                        self.feed(Event::Watermark { partition: p, high });
                    }
                    self.report_read_position(p);
                }
            }
            self.publish();
        }
        self.feed(Event::Tick {
            now_ms: self.clock.now_ms(),
        });
    }

    /// Tells the executor how far the consumer has read `p` when that is past the last record it
    /// returned (transaction markers and aborted records are never returned), and only once every
    /// returned record has been fed.
    pub(super) fn report_read_position(&mut self, p: PartitionId) {
        let Some(exec) = &self.exec else { return };
        let fed = exec.next_offset(p);
        let delivered = self.position.get(&p).copied();
        let Some(read) = self.consumer.read_position(p) else {
            return;
        };
        if fed.is_some() && fed == delivered && read > fed.unwrap_or(0) {
            self.position.insert(p, read);
            self.feed(Event::ReadTo {
                partition: p,
                next_offset: read,
            });
        }
    }

    /// The job's live rate limits from the store (every worker of every process reads them at
    /// housekeeping, so a change reaches all within `housekeeping_ms`); until some are set, the
    /// configured `max_rows_per_second` holds. Then the adaptive cap's decision, and both applied.
    fn read_rate_limits(&mut self) {
        // Not while the store is away: the job read has just waited out its retries.
        let read = if self.store_reachable {
            self.store.rate_limits(&self.cfg.job)
        } else {
            Ok(None)
        };
        match read {
            Ok(Some(l)) => {
                if l != self.live_limits {
                    info!(job = %self.cfg.job, worker = %self.cfg.worker, snapshot_rows_per_second = l.snapshot_rows_per_second, log_records_per_second = l.log_records_per_second, "rate limits changed");
                }
                self.live_limits = l;
            }
            Ok(None) => {}
            // Reachability is the job read's business; the limits in force stay.
            Err(e) => {
                debug!(job = %self.cfg.job, worker = %self.cfg.worker, error = %e, "rate limits not read")
            }
        }
        let now = self.clock.now_ms();
        // The phase and epoch lag only matter to an adaptive cap (a status is a whole snapshot of
        // the executor; `publish` builds one anyway).
        let status = self
            .adaptive
            .enabled()
            .then(|| self.exec.as_ref().map(|e| e.status()))
            .flatten();
        let (ceiling, epoch_lag) = match status {
            Some(s) if s.phase == Phase::Snapshot => (
                self.live_limits.snapshot_rows_per_second,
                s.epoch_lag_seconds,
            ),
            Some(s) => (self.live_limits.log_records_per_second, s.epoch_lag_seconds),
            None => (self.live_limits.log_records_per_second, 0.0),
        };
        let before = self.adaptive.cap();
        let cap = self
            .adaptive
            .decide(now, self.rate.per_second(), epoch_lag, ceiling);
        if cap != before {
            info!(job = %self.cfg.job, worker = %self.cfg.worker, cap = ?cap, "adaptive rate cap changed");
        }
        // The cap lowers a limit, or sets one where there is none.
        let under = |limit: u64| match (limit, cap) {
            (l, None) => l,
            (0, Some(c)) => c,
            (l, Some(c)) => l.min(c),
        };
        self.snapshot_throttle
            .set_limit(under(self.live_limits.snapshot_rows_per_second), now);
        self.log_throttle
            .set_limit(under(self.live_limits.log_records_per_second), now);
    }

    /// Whether the job is paused, from the store (every worker of every process looks at
    /// housekeeping, so a pause reaches all within `housekeeping_ms`); not while the store is away.
    fn read_pause(&mut self) {
        if !self.store_reachable || self.exec.is_none() {
            return;
        }
        match self.store.paused(&self.cfg.job) {
            Ok(p) if p != self.job_paused => self.set_job_paused(p),
            Ok(_) => {}
            Err(e) => {
                debug!(job = %self.cfg.job, worker = %self.cfg.worker, error = %e, "pause not read")
            }
        }
    }

    /// Pauses every owned partition in the consumer, or resumes those the executor fetches (an
    /// alignment pause stays). The members stay in the group: the loop keeps polling.
    pub(super) fn set_job_paused(&mut self, paused: bool) {
        let Some(exec) = &self.exec else { return };
        let owned = exec.owned_partitions();
        self.job_paused = paused;
        if paused {
            info!(job = %self.cfg.job, worker = %self.cfg.worker, partitions = ?owned, "job paused: nothing is fetched or scanned until it is resumed");
        } else {
            info!(job = %self.cfg.job, worker = %self.cfg.worker, partitions = ?owned, "job resumed");
        }
        self.observer.observe(WorkerEvent::Paused(paused));
        for p in owned {
            let r = if paused {
                self.consumer.pause(p)
            } else if !self.paused_at.contains_key(&p) && self.fetching(p) {
                self.consumer.resume(p, self.position.get(&p).copied())
            } else {
                Ok(())
            };
            if let Err(e) = r {
                return self.fail(crate::core::WorkerFailure::Unavailable(e));
            }
        }
    }

    /// Whether the executor reads `p` from the log now (log store or streaming, not held back).
    fn fetching(&self, p: PartitionId) -> bool {
        self.exec.as_ref().is_some_and(|e| {
            matches!(e.phase(), Phase::LogStore | Phase::Streaming) && e.next_offset(p).is_some()
        })
    }

    /// The limits in force (0 = none).
    pub fn rate_limits(&self) -> RateLimits {
        RateLimits {
            snapshot_rows_per_second: self.snapshot_throttle.limit(),
            log_records_per_second: self.log_throttle.limit(),
        }
    }

    /// The worker's report, to its observer (the status board and the gauges, in the service).
    pub(super) fn publish(&mut self) {
        let status = self.exec.as_ref().map(|e| e.status());
        let now = self.clock.now_ms();
        let records_per_second = match &status {
            Some(s) => self.rate.observe(now, s.handled()),
            None => self.rate.per_second(),
        };
        // A paused job reads nothing: no estimate.
        let estimated_catch_up_seconds = status
            .as_ref()
            .filter(|_| !self.job_paused)
            .and_then(|s| s.catch_up_eta_seconds(records_per_second));
        let caught_up = status.as_ref().is_some_and(|s| s.caught_up);
        let recreations = self.supervisor.lock().unwrap().recreations();
        let report = WorkerReport {
            status,
            records_per_second,
            estimated_catch_up_seconds,
            caught_up,
            last_error: self.last_error.clone(),
            recreations,
            store_reachable: self.store_reachable,
            rate_limits: self.rate_limits(),
            paused: self.job_paused,
        };
        self.observer.observe(WorkerEvent::Report(Box::new(report)));
    }
}
