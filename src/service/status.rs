//! What the service shows of each worker: the report each worker's loop publishes on the status
//! board, the `/status` document, and readiness and liveness. Lag, rate and ETA are computed by the
//! core (`kafka_backfill_core::throughput`); this module only lays them out.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub use crate::ports::WorkerReport;

/// A worker's last report and when it arrived (`/livez` fails when a worker stops reporting).
#[derive(Clone, Debug)]
pub struct Reported {
    pub report: WorkerReport,
    pub reported_at: Instant,
}

impl std::ops::Deref for Reported {
    type Target = WorkerReport;
    fn deref(&self) -> &WorkerReport {
        &self.report
    }
}

/// Shared between the workers of a process and the HTTP endpoints: job → worker → report.
pub type StatusBoard = Arc<Mutex<BTreeMap<String, BTreeMap<String, Reported>>>>;

pub use crate::capture::report::{CaptureBoard, CaptureReport};

/// The `/status` document.
pub fn status_json(board: &StatusBoard, jobs: &crate::service::runtime::Runtimes) -> Value {
    let board = board.lock().unwrap();
    let jobs_list: Vec<Value> = board
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
                        "rate_limits": r.rate_limits,
                        "paused": r.paused,
                    })
                })
                .collect();
            let progress = jobs.progress_of(job);
            json!({
                "job": job,
                "progress": progress,
                "dead_letters": jobs.dead_letters_of(job),
                "published_epoch": jobs.published_epoch_of(job).map(|e| e.0),
                "tables": jobs.tables_of(job),
                "published_held_back_by": jobs.held_back_of(job).map(|(h, owner)| json!({
                    "partition": h.partition,
                    "epoch": h.epoch.0,
                    "owner": owner,
                    "seconds_behind": h.seconds(),
                })),
                "workers": ws,
            })
        })
        .collect();
    let captures = jobs_captures(jobs);
    if captures.as_object().is_none_or(|o| o.is_empty()) {
        json!({ "jobs": jobs_list })
    } else {
        json!({ "jobs": jobs_list, "captures": captures })
    }
}

fn jobs_captures(jobs: &crate::service::runtime::Runtimes) -> Value {
    let board = jobs.captures().lock().unwrap();
    if board.is_empty() {
        return Value::Object(Default::default());
    }
    serde_json::to_value(&*board).expect("capture reports serialise")
}

/// `/status/jobs/{name}/vnodes`: every vnode of a job as its store has it committed — its partition,
/// phase, epoch, row count, whether its snapshot is finished, and the worker holding its partition's
/// lease (in any process). Phase: `snapshot` until the vnode's snapshot is finished (or before any
/// progress), then `log_store`, then `streaming` once its partition has committed in the streaming
/// phase. A job of several tables (`tables`) also names, for a vnode still in its snapshot, the
/// store table its scan is in (`snapshot_table`: its cursor's, the first before any cursor).
pub fn vnodes_json(
    job: &str,
    map: &crate::core::PartitionMap,
    vnodes: &BTreeMap<crate::core::Vnode, crate::core::VnodeProgress>,
    partitions: &BTreeMap<crate::core::PartitionId, crate::core::PartitionProgress>,
    owners: &BTreeMap<crate::core::PartitionId, String>,
    tables: Option<&(crate::core::JobTables, Vec<crate::store::StoreTable>)>,
) -> Value {
    let rows: Vec<Value> = (0..map.vnode_count() as crate::core::Vnode)
        .map(|v| {
            let partition = map.partition_of(v);
            let p = vnodes.get(&v);
            let finished = p.is_some_and(|p| p.finished);
            let phase = if !finished {
                "snapshot"
            } else if partitions.get(&partition).is_some_and(|p| p.streaming) {
                "streaming"
            } else {
                "log_store"
            };
            let mut row = json!({
                "vnode": v,
                "partition": partition,
                "phase": phase,
                "epoch": p.map(|p| p.epoch.0),
                "row_count": p.map_or(0, |p| p.row_count),
                "finished": finished,
                "owner": owners.get(&partition),
            });
            if let Some((layout, stores)) = tables {
                let scanning = (!finished).then(|| {
                    let at = p
                        .and_then(|p| p.cursor.as_deref())
                        .map(|c| layout.table_of(c));
                    let store = match at {
                        Some(t) => stores.iter().find(|s| s.index == t),
                        None => stores.first(),
                    };
                    store.map(|s| s.name.clone())
                });
                row["snapshot_table"] = json!(scanning.flatten());
            }
            row
        })
        .collect();
    json!({ "job": job, "vnodes": rows })
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
            .all(|r| r.reported_at.elapsed() < LIVENESS_STALL)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Event, Executor, JobPolicy, JobSpec, LocalCheckpointPolicy, PartitionMap};
    use std::time::{Duration, Instant};

    fn board_with(joined: bool, store_reachable: bool, reported: Duration) -> StatusBoard {
        let mut x = Executor::new(
            JobSpec {
                topic: "t".into(),
                snapshot_epoch: crate::core::Epoch(1 << 16),
                map: PartitionMap::new(8, 2).unwrap(),
                generation: crate::core::Generation(0),
                worker: "w".into(),
                policy: JobPolicy {
                    local_checkpoint: LocalCheckpointPolicy {
                        max_rows: 10,
                        max_interval_ms: 10,
                    },
                    max_epochs_ahead: 4,
                    max_bytes_ahead: u64::MAX,
                    reschedule: false,
                    max_dead_letters: None,
                    commit_every_checkpoint: false,
                    tables: crate::core::JobTables::One(0),
                },
            },
            0,
        );
        if joined {
            x.handle(Event::Assigned(vec![])).unwrap(); // a member that owns nothing
        }
        let board = crate::service::job::new_board();
        board.lock().unwrap().entry("j".into()).or_default().insert(
            "w".into(),
            Reported {
                report: WorkerReport {
                    status: Some(x.status()),
                    store_reachable,
                    ..Default::default()
                },
                reported_at: Instant::now()
                    .checked_sub(reported)
                    .unwrap_or_else(Instant::now),
            },
        );
        board
    }

    #[test]
    fn vnodes_show_phase_owner_and_progress_from_the_store() {
        use crate::core::{Epoch, PartitionProgress, VnodeProgress};
        let map = PartitionMap::new(4, 2).unwrap();
        let es = Epoch(1 << 16);
        let (v_snap, v_log, v_stream) = (
            map.vnodes_of(0).next().unwrap(),
            map.vnodes_of(0).nth(1).unwrap(),
            map.vnodes_of(1).next().unwrap(),
        );
        let vnodes = BTreeMap::from([
            (
                v_snap,
                VnodeProgress {
                    cursor: Some(vec![1]),
                    row_count: 3,
                    ..VnodeProgress::fresh(v_snap, es)
                },
            ),
            (
                v_log,
                VnodeProgress {
                    epoch: Epoch(2 << 16),
                    finished: true,
                    row_count: 7,
                    ..VnodeProgress::fresh(v_log, es)
                },
            ),
            (
                v_stream,
                VnodeProgress {
                    epoch: Epoch(3 << 16),
                    finished: true,
                    ..VnodeProgress::fresh(v_stream, es)
                },
            ),
        ]);
        let partitions = BTreeMap::from([(
            1,
            PartitionProgress {
                partition: 1,
                next_offset: 9,
                epoch: Epoch(3 << 16),
                streaming: true,
            },
        )]);
        let owners = BTreeMap::from([(0, "a-0".to_string())]);
        let v = vnodes_json("j", &map, &vnodes, &partitions, &owners, None);
        let row = |n: u16| v["vnodes"][n as usize].clone();
        assert!(
            row(v_snap).get("snapshot_table").is_none(),
            "a job of one table names none"
        );
        assert_eq!(v["vnodes"].as_array().unwrap().len(), 4);
        assert_eq!(row(v_snap)["phase"], "snapshot");
        assert_eq!(row(v_snap)["row_count"], 3);
        assert_eq!(row(v_snap)["owner"], "a-0");
        assert_eq!(row(v_log)["phase"], "log_store");
        assert_eq!(row(v_log)["epoch"], 2u64 << 16);
        assert_eq!(row(v_stream)["phase"], "streaming");
        assert_eq!(row(v_stream)["owner"], Value::Null, "no lease");
        let untouched = (0..4u16)
            .find(|x| ![v_snap, v_log, v_stream].contains(x))
            .unwrap();
        assert_eq!(row(untouched)["phase"], "snapshot");
        assert_eq!(row(untouched)["epoch"], Value::Null);
        // A job of several tables: the table each vnode's scan is in.
        let store = |index: u16, name: &str| crate::store::StoreTable {
            index,
            source: format!("pgbench_{name}"),
            name: name.into(),
            schema: crate::codec::TableSchema::parse(
                crate::workload::EXAMPLE_ROW_SCHEMA,
                &["id".to_string()],
            )
            .unwrap(),
        };
        let mut vnodes = vnodes;
        vnodes.get_mut(&v_snap).unwrap().cursor = Some(crate::core::table_key(3, b"k"));
        let tables = (
            crate::core::JobTables::Several(vec![1, 3]),
            vec![store(1, "accounts"), store(3, "tellers")],
        );
        let v = vnodes_json("j", &map, &vnodes, &partitions, &owners, Some(&tables));
        let row = |n: u16| v["vnodes"][n as usize].clone();
        assert_eq!(row(v_snap)["snapshot_table"], "tellers");
        assert_eq!(
            row(untouched)["snapshot_table"],
            "accounts",
            "no cursor: the first"
        );
        assert_eq!(row(v_log)["snapshot_table"], Value::Null, "finished");
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
