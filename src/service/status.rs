//! What the service shows of each worker: the report each worker's loop publishes on the status
//! board, the `/status` document, and readiness and liveness. Lag, rate and ETA are computed by the
//! core (`kafka_backfill_core::throughput`); this module only lays them out.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::core::WorkerStatus;

/// What the status page and the job runner see of a worker.
#[derive(Clone, Debug, Default)]
pub struct WorkerReport {
    pub status: Option<WorkerStatus>,
    /// Snapshot rows plus log records handled per second (smoothed, `core::Rate`).
    pub records_per_second: f64,
    /// Partition lag divided by the rate, while the log is being replayed
    /// (`WorkerStatus::catch_up_eta_seconds`).
    pub estimated_catch_up_seconds: Option<f64>,
    pub caught_up: bool,
    pub last_error: Option<String>,
    pub recreations: u64,
    /// The state store answered the last look (every 0.5 s); `/readyz` is false while it does not.
    pub store_reachable: bool,
    /// When the worker's loop last reported (every 0.5 s while it runs); `/livez` fails when it stops.
    pub reported_at: Option<Instant>,
}

/// Shared between the workers of a process and the HTTP endpoints: job → worker → report.
pub type StatusBoard = Arc<Mutex<BTreeMap<String, BTreeMap<String, WorkerReport>>>>;

/// The `/status` document.
pub fn status_json(board: &StatusBoard) -> Value {
    let board = board.lock().unwrap();
    let jobs: Vec<Value> = board
        .iter()
        .map(|(job, workers)| {
            let ws: Vec<Value> = workers
                .iter()
                .map(|(name, r)| {
                    let s = r.status.as_ref();
                    let partitions: Vec<Value> = s
                        .map(|s| {
                            s.partitions
                                .iter()
                                .map(|p| {
                                    json!({
                                        "partition": p.partition,
                                        "committed_offset": p.committed_offset,
                                        "next_offset": p.next_offset,
                                        "high_watermark": p.high_watermark,
                                        "lag": p.lag(),
                                        "committed_epoch": p.committed_epoch.0,
                                        "paused": p.paused,
                                    })
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    let log_store_changes = s.map_or(0, |s| s.counters.changes.iter().sum::<u64>());
                    json!({
                        "worker": name,
                        "phase": s.map_or("stopped", |s| s.phase.as_str()),
                        "generation": s.map(|s| s.generation),
                        "owned_vnodes": s.map_or(0, |s| s.owned_vnodes),
                        "snapshot_vnodes_left": s.map_or(0, |s| s.snapshot_vnodes_left),
                        "partitions": partitions,
                        "rows": {
                            "snapshot": s.map_or(0, |s| s.counters.snapshot_rows),
                            "log_store_changes": log_store_changes,
                        },
                        "checkpoints": s.map_or(0, |s| s.counters.checkpoints),
                        "committed_epoch": s.and_then(|s| s.committed_epoch).map(|e| e.0),
                        "epoch_lag_seconds": s.map_or(0.0, |s| s.epoch_lag_seconds),
                        "lag_records": s.map_or(0, |s| s.lag()),
                        "records_per_second": r.records_per_second,
                        "estimated_catch_up_seconds": r.estimated_catch_up_seconds,
                        "caught_up": r.caught_up,
                        "recreations": r.recreations,
                        "last_error": r.last_error,
                        "store_reachable": r.store_reachable,
                    })
                })
                .collect();
            let progress = crate::service::job::job_progress()
                .lock()
                .unwrap()
                .get(job)
                .cloned();
            json!({ "job": job, "progress": progress, "workers": ws })
        })
        .collect();
    json!({ "jobs": jobs })
}

/// Ready (Kubernetes may route to it) when every known worker has joined its group — owning no
/// partition is still ready — and reaches its state store.
pub fn ready(board: &StatusBoard) -> bool {
    let board = board.lock().unwrap();
    !board.is_empty()
        && board.values().all(|ws| {
            ws.values()
                .all(|r| r.store_reachable && r.status.as_ref().is_some_and(|s| s.joined))
        })
}

/// A worker whose loop has not reported for this long is stuck: `/livez` fails (the worker reports
/// every 0.5 s, and at most 30 s pass in a restart backoff).
pub const LIVENESS_STALL: Duration = Duration::from_secs(60);

/// Live (Kubernetes keeps it) while every worker's loop keeps reporting. A worker that stopped on a
/// fatal error ends the process, so it needs no rule here.
pub fn live(board: &StatusBoard) -> bool {
    let board = board.lock().unwrap();
    board.values().all(|ws| {
        ws.values()
            .all(|r| r.reported_at.is_none_or(|t| t.elapsed() < LIVENESS_STALL))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Event, Executor, JobSpec, LocalCheckpointPolicy, PartitionMap};
    use std::time::{Duration, Instant};

    fn board_with(joined: bool, store_reachable: bool, reported: Duration) -> StatusBoard {
        let mut x = Executor::new(
            JobSpec {
                topic: "t".into(),
                snapshot_epoch: crate::core::Epoch(1 << 16),
                map: PartitionMap::new(8, 2).unwrap(),
                generation: 0,
                worker: "w".into(),
                local_checkpoint: LocalCheckpointPolicy {
                    max_rows: 10,
                    max_interval_ms: 10,
                },
                max_epochs_ahead: 4,
                reschedule: false,
            },
            0,
        );
        if joined {
            x.handle(Event::Assigned(vec![])).unwrap(); // a member that owns nothing
        }
        let board = crate::service::job::new_board();
        board.lock().unwrap().entry("j".into()).or_default().insert(
            "w".into(),
            WorkerReport {
                status: Some(x.status()),
                store_reachable,
                reported_at: Instant::now().checked_sub(reported),
                ..Default::default()
            },
        );
        board
    }

    #[test]
    fn ready_means_joined_and_store_reachable_even_with_no_partition() {
        assert!(ready(&board_with(true, true, Duration::ZERO)));
        assert!(
            !ready(&board_with(false, true, Duration::ZERO)),
            "not joined yet"
        );
        assert!(
            !ready(&board_with(true, false, Duration::ZERO)),
            "store away"
        );
    }

    #[test]
    fn live_until_a_workers_loop_stops_reporting() {
        assert!(live(&board_with(true, true, Duration::from_secs(1))));
        assert!(!live(&board_with(
            true,
            true,
            LIVENESS_STALL + Duration::from_secs(1)
        )));
    }
}
