//! Every metric the service exports, defined in one place (Prometheus naming, bounded label sets:
//! `job` and `worker` come from the configuration, `table` from a job's configured `store.tables`,
//! `phase`, `op`, `cause`, `outcome` and `reason` from closed enums, `partition` from the topic's
//! fixed partition count).

use std::sync::Arc;

use prometheus::{
    exponential_buckets, Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    pub registry: Registry,
    /// 1 for the phase each worker is in, 0 for the others.
    pub phase: IntGaugeVec,
    pub snapshot_rows: IntCounterVec,
    pub log_records: IntCounterVec,
    /// A job of several tables: snapshot rows and log-store changes applied, per store table, and
    /// the vnodes whose snapshot of the table is done (as last read from the store).
    pub table_snapshot_rows: IntCounterVec,
    pub table_changes: IntCounterVec,
    pub table_snapshot_vnodes_done: IntGaugeVec,
    pub checkpoints: IntCounterVec,
    pub commit_seconds: HistogramVec,
    pub alignment_seconds: HistogramVec,
    pub epoch_lag_seconds: GaugeVec,
    pub catch_up_eta_seconds: GaugeVec,
    /// Under `consistency = "epoch"`: how far the partition holding the published table back
    /// trails the furthest one (0 when none does).
    pub publication_lag_seconds: GaugeVec,
    pub rate_limit: IntGaugeVec,
    pub paused: IntGaugeVec,
    pub http_unauthorized: prometheus::IntCounter,
    pub partition_lag: IntGaugeVec,
    pub bitmap_updates: IntCounterVec,
    pub invariant_errors: IntCounterVec,
    pub recreations: IntCounterVec,
    /// Jobs started again on a newer snapshot of their capture that they were moved to while they
    /// ran (`kafka-backfill resync`): kept apart from recreations, whose alert reads a loop.
    pub snapshot_moves: IntCounterVec,
    pub decode_errors: IntCounterVec,
    pub dead_letters: IntCounterVec,
    pub generation: IntGaugeVec,
    /// HTTP connections closed at once because `http.max_connections` were being served.
    pub http_rejected: prometheus::IntCounter,
    /// 1 while a worker's state store does not answer, else 0.
    pub store_unreachable: IntGaugeVec,
    /// Errors librdkafka reported (brokers away, authentication), per job.
    pub kafka_errors: IntCounterVec,
    /// The capture's last committed source position (PostgreSQL LSN as a number).
    pub capture_lsn: IntGaugeVec,
    pub capture_checkpoints: IntCounterVec,
    pub capture_transactions: IntCounterVec,
    pub capture_changes: IntCounterVec,
    pub capture_restarts: IntCounterVec,
    pub capture_source_lsn: IntGaugeVec,
    pub capture_lag_bytes: IntGaugeVec,
    pub capture_last_source_commit: GaugeVec,
    pub capture_commit_seconds: HistogramVec,
    pub capture_snapshots: IntCounterVec,
    pub capture_snapshot_seconds: HistogramVec,
}

fn counter(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("metric");
    r.register(Box::new(c.clone())).expect("register");
    c
}

fn gauge(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("metric");
    r.register(Box::new(g.clone())).expect("register");
    g
}

fn histogram(r: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help)
            .buckets(exponential_buckets(0.0005, 2.0, 16).expect("buckets")),
        labels,
    )
    .expect("metric");
    r.register(Box::new(h.clone())).expect("register");
    h
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Every family registered in a registry of its own (one per process: `service::process`
    /// makes it and hands it to the runner, the captures and the HTTP endpoints).
    pub fn new() -> Self {
        let r = Registry::new();
        let epoch_lag = GaugeVec::new(
            Opts::new(
                "kafka_backfill_epoch_lag_seconds",
                "Newest epoch seen minus the last committed epoch, in seconds.",
            ),
            &["job_name", "worker"],
        )
        .expect("metric");
        r.register(Box::new(epoch_lag.clone())).expect("register");
        let eta = GaugeVec::new(
            Opts::new(
                "kafka_backfill_catch_up_eta_seconds",
                "While replaying the log: partition lag divided by the worker's rate (NaN with no estimate).",
            ),
            &["job_name", "worker"],
        )
        .expect("metric");
        r.register(Box::new(eta.clone())).expect("register");
        let publication_lag = GaugeVec::new(
            Opts::new(
                "kafka_backfill_publication_lag_seconds",
                "Under consistency = \"epoch\": the committed epoch of the furthest partition minus that of the partition holding the published table back, in seconds (0 when all stand at one epoch).",
            ),
            &["job_name"],
        )
        .expect("metric");
        r.register(Box::new(publication_lag.clone()))
            .expect("register");
        let http_rejected = prometheus::IntCounter::new(
            "kafka_backfill_http_connections_rejected_total",
            "HTTP connections closed at once because http.max_connections were being served.",
        )
        .expect("metric");
        r.register(Box::new(http_rejected.clone()))
            .expect("register");
        let http_unauthorized = prometheus::IntCounter::new(
            "kafka_backfill_http_unauthorized_total",
            "Requests to the write endpoint refused for a missing or wrong bearer token.",
        )
        .expect("metric");
        r.register(Box::new(http_unauthorized.clone()))
            .expect("register");
        Metrics {
            http_rejected,
            http_unauthorized,
            paused: gauge(&r, "kafka_backfill_paused", "1 while a worker's job is paused (kafka-backfill pause).", &["job_name", "worker"]),
            kafka_errors: counter(&r, "kafka_backfill_kafka_client_errors_total", "Errors the Kafka client reported (brokers away, authentication).", &["job_name"]),
            store_unreachable: gauge(&r, "kafka_backfill_store_unreachable", "1 while a worker's state store does not answer.", &["job_name", "worker"]),
            phase: gauge(&r, "kafka_backfill_phase", "1 for the phase a worker is in.", &["job_name", "worker", "phase"]),
            snapshot_rows: counter(&r, "kafka_backfill_snapshot_rows_total", "Snapshot rows applied.", &["job_name"]),
            log_records: counter(&r, "kafka_backfill_log_records_applied_total", "Log-store records applied, by op (a change's, or truncate: one partition's truncation record).", &["job_name", "op"]),
            table_snapshot_rows: counter(&r, "kafka_backfill_table_snapshot_rows_total", "A job of several tables: snapshot rows applied, per store table.", &["job_name", "table"]),
            table_changes: counter(&r, "kafka_backfill_table_log_changes_total", "A job of several tables: log-store changes applied, per store table.", &["job_name", "table"]),
            table_snapshot_vnodes_done: gauge(&r, "kafka_backfill_table_snapshot_vnodes_done", "A job of several tables: vnodes whose snapshot of the table is done, from the store.", &["job_name", "table"]),
            checkpoints: counter(&r, "kafka_backfill_checkpoints_total", "Checkpoints committed, by cause.", &["job_name", "cause"]),
            commit_seconds: histogram(&r, "kafka_backfill_checkpoint_commit_seconds", "Store commit duration of one checkpoint.", &["job_name"]),
            alignment_seconds: histogram(
                &r,
                "kafka_backfill_barrier_alignment_seconds",
                "How long a partition that was ahead stayed paused waiting for the others.",
                &["job_name"],
            ),
            epoch_lag_seconds: epoch_lag,
            catch_up_eta_seconds: eta,
            publication_lag_seconds: publication_lag,
            rate_limit: gauge(&r, "kafka_backfill_rate_limit", "Rate limit in force per worker, by kind (snapshot_rows, log_records per second; 0 = none).", &["job_name", "worker", "kind"]),
            partition_lag: gauge(&r, "kafka_backfill_partition_lag", "High watermark minus committed offset.", &["job_name", "partition"]),
            bitmap_updates: counter(
                &r,
                "kafka_backfill_vnode_bitmap_updates_total",
                "Vnode bitmap updates (rebalances), by phase and outcome (applied, invariant_error, rescheduled).",
                &["job_name", "phase", "outcome"],
            ),
            invariant_errors: counter(
                &r,
                "kafka_backfill_invariant_errors_total",
                "`should not update vnode bitmap during consuming log store` raised.",
                &["job_name"],
            ),
            recreations: counter(&r, "kafka_backfill_recreations_total", "Job recreations, by reason.", &["job_name", "reason"]),
            snapshot_moves: counter(&r, "kafka_backfill_snapshot_moves_total", "Jobs started again on a newer snapshot of their capture, moved to it while they ran (kafka-backfill resync).", &["job_name"]),
            decode_errors: counter(&r, "kafka_backfill_decode_errors_total", "Log records that did not decode.", &["job_name"]),
            dead_letters: counter(&r, "kafka_backfill_dead_letters_total", "Records written to the job's dead-letter topic (on_bad_record = dead-letter), each just before the checkpoint that records it in the store.", &["job_name"]),
            generation: gauge(&r, "kafka_backfill_generation", "The job generation a worker runs.", &["job_name", "worker"]),
            capture_lsn: gauge(&r, "kafka_backfill_capture_committed_lsn", "The capture's last committed and acknowledged source position (LSN as a number).", &["job_name"]),
            capture_checkpoints: counter(&r, "kafka_backfill_capture_checkpoints_total", "Capture checkpoints committed (Kafka transactions).", &["job_name"]),
            capture_transactions: counter(&r, "kafka_backfill_capture_transactions_total", "Source transactions read by the capture (counted at each checkpoint).", &["job_name"]),
            capture_changes: counter(&r, "kafka_backfill_capture_changes_total", "Change records the capture wrote (counted at each checkpoint).", &["job_name"]),
            capture_restarts: counter(&r, "kafka_backfill_capture_session_restarts_total", "Capture sessions that failed transiently and resumed from the last checkpoint.", &["job_name"]),
            capture_source_lsn: gauge(&r, "kafka_backfill_capture_source_lsn", "The source's WAL position as the capture last heard it (LSN as a number).", &["job_name"]),
            capture_lag_bytes: gauge(&r, "kafka_backfill_capture_lag_bytes", "Bytes between the source's position and the capture's committed one: WAL bytes from PostgreSQL, binlog bytes from MariaDB (across a binlog file's end, the bytes into the newer file).", &["job_name"]),
            capture_last_source_commit: {
                let g = GaugeVec::new(Opts::new("kafka_backfill_capture_last_source_commit_timestamp_seconds", "Commit time (Unix seconds) of the last source transaction the capture read."), &["job_name"]).expect("metric");
                r.register(Box::new(g.clone())).expect("register");
                g
            },
            capture_commit_seconds: histogram(&r, "kafka_backfill_capture_kafka_commit_seconds", "Duration of the capture's Kafka transaction commits (state record included).", &["job_name"]),
            capture_snapshots: counter(&r, "kafka_backfill_capture_snapshots_total", "Snapshots of the running capture, by outcome (published, failed, stored, store_failed, retired).", &["job_name", "outcome"]),
            capture_snapshot_seconds: {
                let h = HistogramVec::new(
                    HistogramOpts::new("kafka_backfill_capture_snapshot_seconds", "Duration of a snapshot of the running capture, from its start to its publication.")
                        .buckets(exponential_buckets(0.25, 2.0, 14).expect("buckets")),
                    &["job_name"],
                )
                .expect("metric");
                r.register(Box::new(h.clone())).expect("register");
                h
            },
            registry: {
                build_info(&r);
                // `process_*`: CPU seconds, resident memory, open descriptors, start time (Linux).
                r.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))
                    .expect("register");
                r
            },
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("encode");
        String::from_utf8(buf).expect("utf-8")
    }
}

/// `kafka_backfill_build_info{version, commit}` = 1: which build serves these metrics (`commit` from
/// `build.rs`: the Git commit the binary was built from, `unknown` outside a checkout).
fn build_info(r: &Registry) {
    let g = IntGaugeVec::new(
        Opts::new(
            "kafka_backfill_build_info",
            "1, labelled with the version and the Git commit of this build.",
        ),
        &["version", "commit"],
    )
    .expect("metric");
    r.register(Box::new(g.clone())).expect("register");
    g.with_label_values(&[env!("CARGO_PKG_VERSION"), env!("KB_GIT_COMMIT")])
        .set(1);
}

/// The captures' meter: each happening a capture tells becomes its metrics in this registry.
pub struct CaptureMetrics(pub Arc<Metrics>);

impl crate::capture::report::CaptureMeter for CaptureMetrics {
    /// A capture checkpoint committed, with the source transactions and changes since the last one.
    fn committed(
        &self,
        job: &str,
        state: &crate::core::capture::CaptureState,
        stats: &crate::capture::SessionStats,
        transactions: u64,
        changes: u64,
        lag_bytes: u64,
    ) {
        let m = &self.0;
        m.capture_lsn
            .with_label_values(&[job])
            .set(state.lsn as i64);
        let source = stats.source_lsn.max(state.lsn);
        m.capture_source_lsn
            .with_label_values(&[job])
            .set(source as i64);
        m.capture_lag_bytes
            .with_label_values(&[job])
            .set(lag_bytes as i64);
        if stats.last_source_commit_ms > 0 {
            m.capture_last_source_commit
                .with_label_values(&[job])
                .set(stats.last_source_commit_ms as f64 / 1000.0);
        }
        m.capture_checkpoints.with_label_values(&[job]).inc();
        m.capture_transactions
            .with_label_values(&[job])
            .inc_by(transactions);
        m.capture_changes.with_label_values(&[job]).inc_by(changes);
    }
    /// A capture session failed transiently and resumes.
    fn restarted(&self, job: &str) {
        self.0.capture_restarts.with_label_values(&[job]).inc();
    }
    /// One Kafka transaction commit of the capture took `d`.
    fn commit_took(&self, job: &str, d: std::time::Duration) {
        self.0
            .capture_commit_seconds
            .with_label_values(&[job])
            .observe(d.as_secs_f64());
    }
    fn started(&self, job: &str) {
        let m = &self.0;
        for c in [
            &m.capture_checkpoints,
            &m.capture_transactions,
            &m.capture_changes,
            &m.capture_restarts,
        ] {
            c.with_label_values(&[job]);
        }
        for g in [&m.capture_lsn, &m.capture_source_lsn, &m.capture_lag_bytes] {
            g.with_label_values(&[job]);
        }
        m.capture_commit_seconds.with_label_values(&[job]);
        for o in crate::capture::report::SnapshotOutcome::ALL {
            m.capture_snapshots.with_label_values(&[job, o.label()]);
        }
        m.capture_snapshot_seconds.with_label_values(&[job]);
    }
    fn snapshot(
        &self,
        job: &str,
        outcome: crate::capture::report::SnapshotOutcome,
        took: Option<std::time::Duration>,
    ) {
        let m = &self.0;
        m.capture_snapshots
            .with_label_values(&[job, outcome.label()])
            .inc();
        if let Some(d) = took {
            m.capture_snapshot_seconds
                .with_label_values(&[job])
                .observe(d.as_secs_f64());
        }
    }
}
