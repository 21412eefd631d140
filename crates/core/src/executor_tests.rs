//! Decision-level tests of the executor: what it answers, in which order.

use super::*;
use crate::barrier::{BarrierKind, Change};

const ES: Epoch = Epoch(1 << 20);

fn e(n: u64) -> Epoch {
    Epoch(ES.0 + n * 65_536)
}

fn spec(partitions: u32) -> JobSpec {
    JobSpec {
        topic: "log".into(),
        snapshot_epoch: ES,
        map: PartitionMap::new(8, partitions).unwrap(),
        generation: crate::Generation(3),
        worker: "w".into(),
        policy: JobPolicy {
            local_checkpoint: LocalCheckpointPolicy {
                max_rows: 2,
                max_interval_ms: 100,
            },
            max_epochs_ahead: 1,
            max_bytes_ahead: u64::MAX,
            reschedule: false,
            max_dead_letters: None,
            commit_every_checkpoint: false,
            tables: crate::tables::JobTables::One(0),
        },
    }
}

/// A claim of partition `p` whose snapshot is finished and whose log starts at offset 1, epoch e(1).
fn claimed(map: PartitionMap, p: PartitionId, snapshot_done: bool) -> ClaimedPartition {
    ClaimedPartition {
        partition: p,
        lease: crate::Lease(10 + p as u64),
        progress: PartitionProgress {
            partition: p,
            next_offset: 1,
            epoch: e(1),
            streaming: false,
        },
        vnodes: map
            .vnodes_of(p)
            .map(|v| VnodeProgress {
                finished: snapshot_done,
                ..VnodeProgress::fresh(v, ES)
            })
            .collect(),
    }
}

fn key_for_vnode(map: PartitionMap, v: Vnode) -> Vec<u8> {
    (0u32..)
        .map(|i| i.to_be_bytes().to_vec())
        .find(|k| vnode_of(k, map.vnode_count()) == v)
        .unwrap()
}

fn change(map: PartitionMap, epoch: Epoch, v: Vnode, op: Op) -> LogRecord {
    LogRecord::Change(Change {
        epoch,
        op,
        vnode: v,
        table: 0,
        row: Row {
            key: key_for_vnode(map, v),
            value: b"x".to_vec(),
        },
    })
}

fn barrier(prev: u64, curr: u64, kind: BarrierKind) -> LogRecord {
    LogRecord::Barrier(Barrier {
        prev: e(prev),
        curr: e(curr),
        kind,
        schema_change: false,
    })
}

fn rec(partition: PartitionId, offset: u64, record: LogRecord) -> Event {
    Event::Record {
        partition,
        offset,
        record,
    }
}

fn commits(ds: &[Decision]) -> Vec<&Checkpoint> {
    ds.iter()
        .filter_map(|d| {
            if let Decision::Commit(c) = d {
                Some(c)
            } else {
                None
            }
        })
        .collect()
}

/// Feeds a bad record to an executor whose partitions hold nothing more to read, and returns the
/// error it fails with (after pausing the partition).
fn bad_record(x: &mut Executor, event: Event) -> CoreError {
    for p in x.owned_partitions() {
        x.handle(Event::Watermark {
            partition: p,
            high: 1,
        })
        .unwrap();
    }
    let ds = x.handle(event).unwrap();
    match ds.last() {
        Some(Decision::Fail(e)) => e.clone(),
        other => panic!("expected a failure, got {other:?} in {ds:?}"),
    }
}

/// An executor in the log-store phase over two partitions.
fn in_log_store() -> Executor {
    in_log_store_with(spec(2))
}

/// [`in_log_store`] with a spec of two partitions changed by the test.
fn in_log_store_with(s: JobSpec) -> Executor {
    let map = s.map;
    let mut x = Executor::new(s, 0);
    let ds = x
        .handle(Event::Assigned(vec![
            claimed(map, 0, true),
            claimed(map, 1, true),
        ]))
        .unwrap();
    assert_eq!(x.phase(), Phase::LogStore);
    assert!(ds.contains(&Decision::Fetch {
        partition: 0,
        offset: 1
    }));
    assert!(ds.contains(&Decision::Fetch {
        partition: 1,
        offset: 1
    }));
    x
}

#[test]
fn aligns_barriers_pausing_the_partition_that_is_ahead() {
    let mut x = in_log_store();
    let map = x.spec().map;
    assert!(x
        .handle(rec(0, 1, change(map, e(1), 0, Op::Insert)))
        .unwrap()
        .is_empty());
    let ds = x
        .handle(rec(0, 2, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    assert_eq!(
        ds,
        vec![Decision::Pause(0)],
        "partition 0 is ahead: paused, nothing committed"
    );
    let ds = x
        .handle(rec(1, 1, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    let cs = commits(&ds);
    assert_eq!(cs.len(), 1, "{ds:?}");
    assert_eq!(cs[0].epoch, Some(e(1)));
    assert_eq!(cs[0].rows.len(), 1);
    assert_eq!(
        cs[0].leases,
        vec![(0, crate::Lease(10)), (1, crate::Lease(11))]
    );
    assert!(cs[0]
        .partitions
        .iter()
        .all(|p| p.next_offset == 3 || p.next_offset == 2));
    assert!(cs[0].vnodes.iter().all(|v| v.epoch == e(1)));
    assert!(ds.contains(&Decision::Resume(0)));
}

/// In a log of several tables a job stages only its own table's changes; another table's are held
/// to the same contract (epoch, routing) and read past, so the checkpoint's offsets pass them.
#[test]
fn another_table_s_changes_are_checked_and_read_past_never_staged() {
    let mut x = in_log_store();
    let map = x.spec().map;
    let other = |epoch: Epoch, v: Vnode| match change(map, epoch, v, Op::Insert) {
        LogRecord::Change(c) => LogRecord::Change(Change {
            table: 1,
            row: Row {
                key: c.row.key,
                value: Vec::new(),
            },
            ..c
        }),
        b => b,
    };
    x.handle(rec(0, 1, change(map, e(1), 0, Op::Insert)))
        .unwrap();
    x.handle(rec(0, 2, other(e(1), 1))).unwrap();
    x.handle(rec(0, 3, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    x.handle(rec(1, 1, other(e(1), 5))).unwrap();
    let ds = x
        .handle(rec(1, 2, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    let cs = commits(&ds);
    assert_eq!(cs.len(), 1, "{ds:?}");
    assert_eq!(cs[0].rows.len(), 1, "only the job's own table's row");
    let mut next: Vec<u64> = cs[0].partitions.iter().map(|p| p.next_offset).collect();
    next.sort();
    assert_eq!(next, [3, 4], "past the other table's changes");
    // Another table's change in the wrong epoch is the same violation as the job's own.
    let e = bad_record(&mut x, rec(1, 3, other(e(1), 5)));
    assert!(matches!(e, CoreError::EpochMismatch { .. }), "{e}");
}

/// A job of several tables (tables 0 and 2 of a log of three) stages each of its tables' changes
/// keyed by (table, key), so one key in two tables is two rows of the one checkpoint; table 1's are
/// read past; a rebalance in the log store is still the invariant error.
#[test]
fn a_job_of_several_tables_stages_each_table_s_rows_under_its_table_key() {
    let mut spec = spec(2);
    spec.policy.tables = crate::tables::JobTables::Several(vec![0, 2]);
    let mut x = in_log_store_with(spec);
    let map = x.spec().map;
    let of_table = |table: u16, epoch: Epoch, v: Vnode| match change(map, epoch, v, Op::Insert) {
        LogRecord::Change(c) => LogRecord::Change(Change { table, ..c }),
        b => b,
    };
    for (offset, table) in [(1, 0), (2, 1), (3, 2)] {
        x.handle(rec(0, offset, of_table(table, e(1), 0))).unwrap();
    }
    x.handle(rec(0, 4, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    let ds = x
        .handle(rec(1, 1, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    let cs = commits(&ds);
    assert_eq!(cs.len(), 1, "{ds:?}");
    let bare = key_for_vnode(map, 0);
    let mut keys: Vec<Vec<u8>> = cs[0].rows.iter().map(|m| m.key().to_vec()).collect();
    keys.sort();
    assert_eq!(
        keys,
        [crate::table_key(0, &bare), crate::table_key(2, &bare)],
        "one row per table of the job, none of table 1"
    );
    assert!(
        cs[0].rows.iter().all(|m| m.vnode() == 0),
        "the vnode is the bare key's"
    );
    let ds = x.handle(Event::Revoked(vec![1])).unwrap();
    match ds.last() {
        Some(Decision::Fail(e)) => assert_eq!(
            e.to_string(),
            "should not update vnode bitmap during consuming log store"
        ),
        other => panic!("expected the invariant error, got {other:?}"),
    }
}

#[test]
fn a_partition_ahead_is_paused_by_the_bytes_it_stages_beyond_its_share_and_resumed_at_half() {
    let mut s = spec(2);
    s.policy.max_epochs_ahead = 100;
    s.policy.max_bytes_ahead = 2_000; // a share of 1,000 bytes for each of the two partitions
    let map = s.map;
    let mut x = in_log_store_with(s);
    let big = |v: Vnode| {
        LogRecord::Change(Change {
            epoch: e(2),
            op: Op::Insert,
            vnode: v,
            table: 0,
            row: Row {
                key: key_for_vnode(map, v),
                value: vec![7; 400],
            },
        })
    };
    let ds = x
        .handle(rec(0, 1, barrier(1, 2, BarrierKind::Barrier)))
        .unwrap();
    assert!(ds.is_empty(), "one barrier ahead, nothing staged: {ds:?}");
    let mut offset = 2;
    for v in map.vnodes_of(0) {
        assert!(x.handle(rec(0, offset, big(v))).unwrap().is_empty());
        offset += 1;
    }
    let ds = x
        .handle(rec(0, offset, barrier(2, 3, BarrierKind::Barrier)))
        .unwrap();
    assert_eq!(
        ds,
        vec![Decision::Pause(0)],
        "two barriers ahead of 100 allowed, but ~2 KiB staged beyond the frontier"
    );
    // The frontier partition is never paused; once it passes, nothing is staged beyond the new
    // frontier and the partition ahead is resumed.
    let ds = x
        .handle(rec(1, 1, barrier(1, 2, BarrierKind::Barrier)))
        .unwrap();
    assert_eq!(ds, vec![Decision::Resume(0)]);
}

#[test]
fn non_checkpoint_barriers_accumulate_and_commit_with_the_next_checkpoint() {
    let mut x = in_log_store();
    let map = x.spec().map;
    x.handle(rec(0, 1, change(map, e(1), 1, Op::Insert)))
        .unwrap();
    x.handle(rec(0, 2, barrier(1, 2, BarrierKind::Barrier)))
        .unwrap();
    let ds = x
        .handle(rec(1, 1, barrier(1, 2, BarrierKind::Barrier)))
        .unwrap();
    assert!(commits(&ds).is_empty(), "{ds:?}");
    x.handle(rec(1, 2, change(map, e(2), 5, Op::Insert)))
        .unwrap();
    x.handle(rec(0, 3, barrier(2, 3, BarrierKind::Checkpoint)))
        .unwrap();
    let ds = x
        .handle(rec(1, 3, barrier(2, 3, BarrierKind::Checkpoint)))
        .unwrap();
    let cs = commits(&ds);
    assert_eq!(cs.len(), 1);
    assert_eq!(cs[0].epoch, Some(e(2)));
    assert_eq!(cs[0].rows.len(), 2, "both epochs' changes in one commit");
}

#[test]
fn rebalance_in_log_store_commits_then_fails_with_the_exact_text() {
    let mut x = in_log_store();
    let map = x.spec().map;
    x.handle(rec(0, 1, change(map, e(1), 1, Op::Insert)))
        .unwrap();
    x.handle(rec(0, 2, barrier(1, 2, BarrierKind::Barrier)))
        .unwrap();
    x.handle(rec(1, 1, barrier(1, 2, BarrierKind::Barrier)))
        .unwrap();
    x.handle(rec(1, 2, change(map, e(2), 5, Op::Insert)))
        .unwrap(); // in flight, epoch 2 incomplete
    let ds = x.handle(Event::Revoked(vec![1])).unwrap();
    assert_eq!(ds.len(), 2, "{ds:?}");
    let Decision::Commit(cp) = &ds[0] else {
        panic!("commit first: {ds:?}")
    };
    assert_eq!(cp.epoch, Some(e(1)), "only the complete epoch is committed");
    assert_eq!(cp.rows.len(), 1);
    assert_eq!(
        cp.leases.len(),
        2,
        "still owns the revoked partition while committing"
    );
    let Decision::Fail(err) = &ds[1] else {
        panic!("then fail: {ds:?}")
    };
    assert_eq!(
        err.to_string(),
        "should not update vnode bitmap during consuming log store"
    );
}

#[test]
fn assignment_in_log_store_also_fails_after_committing() {
    let mut x = in_log_store();
    let map = PartitionMap::new(8, 2).unwrap();
    let ds = x
        .handle(Event::Assigned(vec![claimed(map, 1, true)]))
        .unwrap();
    assert!(ds.is_empty(), "already owned: not an update");
    let mut x = Executor::new(spec(2), 0);
    x.handle(Event::Assigned(vec![claimed(map, 0, true)]))
        .unwrap();
    let ds = x
        .handle(Event::Assigned(vec![claimed(map, 1, true)]))
        .unwrap();
    assert_eq!(
        ds,
        vec![Decision::Fail(CoreError::VnodeBitmapUpdateDuringLogStore)]
    );
}

#[test]
fn a_barrier_that_breaks_the_chain_names_topic_partition_offset_and_epochs() {
    let mut x = in_log_store();
    let err = bad_record(&mut x, rec(1, 7, barrier(5, 6, BarrierKind::Checkpoint)));
    assert_eq!(
        err.to_string(),
        format!(
            "barrier chain broken at topic log partition 1 offset 7: expected prev_epoch {}, got barrier {} -> {}",
            e(1),
            e(5),
            e(6)
        )
    );
}

#[test]
fn a_change_for_a_vnode_its_partition_does_not_own_is_rejected() {
    let mut x = in_log_store();
    let map = x.spec().map;
    let err = bad_record(&mut x, rec(0, 1, change(map, e(1), 6, Op::Insert)));
    assert_eq!(
        err.to_string(),
        "change at topic log partition 0 offset 1 is for vnode 6, which partition 0 does not own (it owns vnodes 0..4)"
    );
}

#[test]
fn an_update_delete_must_be_followed_by_its_update_insert() {
    let mut x = in_log_store();
    let map = x.spec().map;
    x.handle(rec(0, 1, change(map, e(1), 1, Op::UpdateDelete)))
        .unwrap();
    let err = bad_record(&mut x, rec(0, 2, change(map, e(1), 2, Op::Insert)));
    assert!(
        matches!(
            err,
            CoreError::UnpairedUpdate {
                offset: 2,
                update_delete_offset: 1,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn snapshot_commits_locally_by_rows_and_by_time_and_cursors_increase() {
    let s = spec(1);
    let map = s.map;
    let mut x = Executor::new(s, 0);
    let ds = x
        .handle(Event::Assigned(vec![claimed(map, 0, false)]))
        .unwrap();
    assert_eq!(
        ds[0],
        Decision::PhaseChanged {
            from: Phase::Unassigned,
            to: Phase::Snapshot
        }
    );
    assert!(
        ds.contains(&Decision::Pause(0)),
        "the log is not fetched in the snapshot phase"
    );
    let Some(Decision::Scan { scan, vnodes }) = ds
        .iter()
        .find(|d| matches!(d, Decision::Scan { .. }))
        .cloned()
    else {
        panic!("{ds:?}")
    };
    assert_eq!(vnodes.len(), 8);
    let v = 3;
    let mut keys: Vec<Vec<u8>> = (0u32..400)
        .map(|i| i.to_be_bytes().to_vec())
        .filter(|k| vnode_of(k, 8) == v)
        .collect();
    keys.sort();
    let row = |k: &Vec<u8>| Event::SnapshotRow {
        scan,
        vnode: v,
        row: Row {
            key: k.clone(),
            value: vec![],
        },
    };
    assert!(x.handle(row(&keys[0])).unwrap().is_empty());
    let ds = x.handle(row(&keys[1])).unwrap();
    let cs = commits(&ds);
    assert_eq!(cs.len(), 1, "max_rows = 2");
    assert_eq!(cs[0].cause, CheckpointCause::Local);
    assert_eq!(cs[0].vnodes[0].cursor.as_ref(), Some(&keys[1]));
    x.handle(row(&keys[2])).unwrap();
    assert!(commits(&x.handle(Event::Tick { now_ms: 50 }).unwrap()).is_empty());
    assert_eq!(
        commits(&x.handle(Event::Tick { now_ms: 100 }).unwrap()).len(),
        1,
        "by time"
    );
    let err = x.handle(row(&keys[1])).unwrap_err();
    assert!(matches!(
        err,
        CoreError::SnapshotCursorWentBack { vnode: 3, .. }
    ));
}

#[test]
fn a_stale_scan_is_ignored_after_a_replan() {
    let s = spec(2);
    let map = s.map;
    let mut x = Executor::new(s, 0);
    x.handle(Event::Assigned(vec![claimed(map, 0, false)]))
        .unwrap();
    let ds = x
        .handle(Event::Assigned(vec![claimed(map, 1, false)]))
        .unwrap();
    let scan = ds
        .iter()
        .find_map(|d| {
            if let Decision::Scan { scan, .. } = d {
                Some(*scan)
            } else {
                None
            }
        })
        .unwrap();
    assert_eq!(scan, 2);
    let k = key_for_vnode(map, 0);
    let ds = x
        .handle(Event::SnapshotRow {
            scan: 1,
            vnode: 0,
            row: Row {
                key: k,
                value: vec![],
            },
        })
        .unwrap();
    assert!(ds.is_empty());
    assert_eq!(x.status().counters.snapshot_rows, 0);
}

#[test]
fn empty_log_switches_to_streaming_once_watermarks_are_reached() {
    let mut x = in_log_store();
    assert!(x
        .handle(Event::Watermark {
            partition: 0,
            high: 1
        })
        .unwrap()
        .is_empty());
    let ds = x
        .handle(Event::Watermark {
            partition: 1,
            high: 1,
        })
        .unwrap();
    assert_eq!(
        ds[0],
        Decision::PhaseChanged {
            from: Phase::LogStore,
            to: Phase::Streaming
        }
    );
    let cs = commits(&ds);
    assert_eq!(cs[0].cause, CheckpointCause::CaughtUp);
    assert!(cs[0].partitions.iter().all(|p| p.streaming));
}

#[test]
fn catch_up_waits_for_a_checkpoint_beyond_the_probe() {
    let mut x = in_log_store();
    // Both partitions hold a full checkpoint epoch: not caught up until it is committed.
    x.handle(Event::Watermark {
        partition: 0,
        high: 2,
    })
    .unwrap();
    x.handle(Event::Watermark {
        partition: 1,
        high: 2,
    })
    .unwrap();
    assert_eq!(x.phase(), Phase::LogStore, "targets not reached");
    x.handle(rec(0, 1, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    assert_eq!(x.phase(), Phase::LogStore, "a checkpoint is staged");
    let ds = x
        .handle(rec(1, 1, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    assert_eq!(commits(&ds)[0].cause, CheckpointCause::Barrier);
    assert_eq!(x.phase(), Phase::Streaming);
}

/// A bad record deep in partition 0's backlog: partition 0 stops there while partition 1 is read on,
/// every checkpoint complete before the bad record is committed, and only then the executor fails.
#[test]
fn a_bad_record_commits_every_checkpoint_complete_before_it_then_fails() {
    let mut x = in_log_store();
    let map = x.spec().map;
    // Partition 0 runs ahead: epoch 1 (checkpoint), epoch 2 (checkpoint), then garbage in epoch 3.
    x.handle(rec(0, 1, change(map, e(1), 0, Op::Insert)))
        .unwrap();
    x.handle(rec(0, 2, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    x.handle(rec(0, 3, barrier(2, 3, BarrierKind::Checkpoint)))
        .unwrap();
    let ds = x
        .handle(Event::Undecodable {
            partition: 0,
            offset: 4,
            reason: "garbage".into(),
        })
        .unwrap();
    assert_eq!(
        ds,
        vec![Decision::Pause(0)],
        "stops partition 0, not the job"
    );
    // A later record of the stopped partition is ignored.
    assert!(x
        .handle(rec(0, 5, barrier(3, 4, BarrierKind::Checkpoint)))
        .unwrap()
        .is_empty());
    // Partition 1 delivers epoch 1's checkpoint: epoch 1 commits, the job goes on.
    x.handle(rec(1, 1, change(map, e(1), 4, Op::Insert)))
        .unwrap();
    let ds = x
        .handle(rec(1, 2, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    let cps = commits(&ds);
    assert_eq!(cps.len(), 1);
    assert_eq!(cps[0].epoch, Some(e(1)));
    assert_eq!(cps[0].rows.len(), 2);
    assert!(!ds.iter().any(|d| matches!(d, Decision::Fail(_))));
    // Partition 1 reaches epoch 3, where partition 0 stopped: epoch 2 commits, then the failure.
    let ds = x
        .handle(rec(1, 3, barrier(2, 3, BarrierKind::Checkpoint)))
        .unwrap();
    let cps = commits(&ds);
    assert_eq!(cps.len(), 1);
    assert_eq!(cps[0].epoch, Some(e(2)));
    let offsets: Vec<u64> = cps[0].partitions.iter().map(|p| p.next_offset).collect();
    assert_eq!(offsets, vec![4, 4], "nothing at or after the bad record");
    match ds.last() {
        Some(Decision::Fail(CoreError::Undecodable {
            partition, offset, ..
        })) => assert_eq!((*partition, *offset), (0, 4)),
        other => panic!("expected the bad record's error last, got {other:?}"),
    }
}

/// The drain is bounded: a partition that stays behind (and not at its high watermark) does not
/// hold the failure back past the drain time.
#[test]
fn a_bad_record_fails_after_the_drain_time_when_others_stay_behind() {
    let mut x = in_log_store();
    let map = x.spec().map;
    x.handle(rec(0, 1, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    let ds = x
        .handle(rec(0, 2, change(map, e(2), 5, Op::Insert)))
        .unwrap();
    // vnode 5 belongs to partition 1: a routing error on partition 0.
    assert_eq!(ds, vec![Decision::Pause(0)]);
    x.handle(Event::Watermark {
        partition: 1,
        high: 100,
    })
    .unwrap();
    assert!(x.handle(Event::Tick { now_ms: 5_000 }).unwrap().is_empty());
    let ds = x
        .handle(Event::Tick {
            now_ms: POISON_DRAIN_MS,
        })
        .unwrap();
    assert!(
        matches!(
            ds.last(),
            Some(Decision::Fail(CoreError::VnodeNotOwnedByPartition { .. }))
        ),
        "{ds:?}"
    );
}

/// A partition already read to its high watermark cannot complete anything more: the failure comes
/// at once.
#[test]
fn a_bad_record_fails_at_once_when_the_others_have_nothing_more() {
    let mut x = in_log_store();
    x.handle(Event::Watermark {
        partition: 1,
        high: 1,
    })
    .unwrap();
    let ds = x
        .handle(Event::Undecodable {
            partition: 0,
            offset: 1,
            reason: "garbage".into(),
        })
        .unwrap();
    assert!(matches!(ds.last(), Some(Decision::Fail(_))), "{ds:?}");
}

/// `caught_up` holds while upstream keeps writing, as long as each refresh finds the partitions read
/// up to the previous refresh's high watermark; it drops when reading falls behind.
#[test]
fn caught_up_holds_under_continuous_writes_and_drops_when_reading_falls_behind() {
    let s = spec(1);
    let map = s.map;
    let mut x = Executor::new(s, 0);
    assert!(!x.status().caught_up, "not before the group answered");
    x.handle(Event::Assigned(vec![])).unwrap();
    assert!(
        x.status().caught_up,
        "a member that owns nothing is caught up"
    );
    let mut claim = claimed(map, 0, true);
    claim.progress.streaming = true;
    x.handle(Event::Assigned(vec![claim])).unwrap();
    assert_eq!(x.phase(), Phase::Streaming);
    assert!(!x.status().caught_up, "no watermark seen yet");
    let wm = |x: &mut Executor, high| {
        x.handle(Event::Watermark { partition: 0, high }).unwrap();
    };
    wm(&mut x, 1);
    assert!(x.status().caught_up, "read to the end");
    // Upstream writes 3 records per refresh; the worker reads them before the next refresh.
    let mut offset = 1;
    let mut epoch = 1;
    for _ in 0..5 {
        wm(&mut x, offset + 3); // the end moved on while the worker read
        for _ in 0..3 {
            let r = if offset % 3 == 0 {
                epoch += 1;
                barrier(epoch - 1, epoch, BarrierKind::Checkpoint)
            } else {
                change(map, e(epoch), 1, Op::Insert)
            };
            x.handle(rec(0, offset, r)).unwrap();
            offset += 1;
        }
        let before = x.status().caught_up;
        wm(&mut x, offset + 3);
        assert!(
            x.status().caught_up,
            "caught up at offset {offset} (was {before})"
        );
    }
    // Reading stops: two refreshes later the worker is behind.
    wm(&mut x, offset + 10);
    wm(&mut x, offset + 20);
    assert!(!x.status().caught_up);
}

/// A transactional log ends in a commit marker the consumer never returns: once the driver reports
/// the consumer has read past it, the partition counts as read to its high watermark.
#[test]
fn read_to_moves_past_offsets_that_hold_no_records() {
    let s = spec(1);
    let map = s.map;
    let mut x = Executor::new(s, 0);
    let mut claim = claimed(map, 0, true);
    claim.progress.streaming = true;
    x.handle(Event::Assigned(vec![claim])).unwrap();
    x.handle(rec(0, 1, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    // The marker sits at offset 2: the high watermark is 3, the last record was at 1.
    let wm = |x: &mut Executor| {
        x.handle(Event::Watermark {
            partition: 0,
            high: 3,
        })
        .unwrap();
    };
    wm(&mut x);
    wm(&mut x);
    assert!(!x.status().caught_up, "offset 2 looks unread");
    x.handle(Event::ReadTo {
        partition: 0,
        next_offset: 3,
    })
    .unwrap();
    wm(&mut x);
    assert!(x.status().caught_up);
    // Everything read is committed and only the marker lies beyond: no lag (it was 1, the marker
    // counted as a record, for ever).
    let p = &x.status().partitions[0];
    assert_eq!((p.committed_offset, p.settled_offset), (2, 3));
    assert_eq!(p.lag(), Some(0));
    // A ReadTo behind what was read changes nothing.
    x.handle(Event::ReadTo {
        partition: 0,
        next_offset: 1,
    })
    .unwrap();
    assert_eq!(x.status().partitions[0].next_offset, 3);
    assert_eq!(
        x.next_offset(0),
        Some(3),
        "the same, without a whole status"
    );
    assert_eq!(x.next_offset(99), None, "not owned");
    // A record read but not yet committed is lag again, counted from the committed offset.
    x.handle(rec(0, 3, barrier(2, 3, BarrierKind::Barrier)))
        .unwrap();
    x.handle(Event::Watermark {
        partition: 0,
        high: 4,
    })
    .unwrap();
    let p = &x.status().partitions[0];
    assert_eq!((p.settled_offset, p.lag()), (2, Some(2)));
}

#[test]
fn a_new_job_generation_restarts_the_executor_and_the_same_one_does_nothing() {
    let mut x = in_log_store();
    assert!(x
        .handle(Event::JobGeneration {
            generation: crate::Generation(3)
        })
        .unwrap()
        .is_empty());
    let ds = x
        .handle(Event::JobGeneration {
            generation: crate::Generation(4),
        })
        .unwrap();
    assert_eq!(
        ds,
        vec![Decision::Restart {
            generation: crate::Generation(4),
            reason: "job recreated: generation 3 -> 4".into()
        }]
    );
}

/// The snapshot phase to its end: counts, row counts in the committed progress, vnodes left, and a
/// vnode end from a stale scan or outside the snapshot phase ignored.
#[test]
fn the_snapshot_phase_counts_rows_and_ends_when_every_vnode_is_done() {
    let s = spec(2);
    let map = s.map;
    let mut x = Executor::new(s, 0);
    let ds = x
        .handle(Event::Assigned(vec![
            claimed(map, 0, false),
            claimed(map, 1, false),
        ]))
        .unwrap();
    assert_eq!(x.owned_partitions(), vec![0, 1]);
    let Some(Decision::Scan { scan, vnodes }) = ds
        .iter()
        .find(|d| matches!(d, Decision::Scan { .. }))
        .cloned()
    else {
        panic!("{ds:?}")
    };
    assert_eq!(x.status().snapshot_vnodes_left, 8);
    // A stale scan's vnode end changes nothing.
    x.handle(Event::SnapshotVnodeDone {
        scan: scan + 99,
        vnode: 0,
    })
    .unwrap();
    assert_eq!(x.status().snapshot_vnodes_left, 8);
    let v = vnodes[0].vnode;
    let key = key_for_vnode(map, v);
    let mut all = Vec::new();
    all.extend(
        x.handle(Event::SnapshotRow {
            scan,
            vnode: v,
            row: Row { key, value: vec![] },
        })
        .unwrap(),
    );
    assert_eq!(x.status().counters.snapshot_rows, 1);
    for start in &vnodes {
        all.extend(
            x.handle(Event::SnapshotVnodeDone {
                scan,
                vnode: start.vnode,
            })
            .unwrap(),
        );
    }
    assert_eq!(x.status().snapshot_vnodes_left, 0);
    assert_eq!(
        x.phase(),
        Phase::LogStore,
        "every vnode done: the log store"
    );
    let done = commits(&all);
    let last = done.last().expect("the snapshot's last commit");
    assert_eq!(last.cause, CheckpointCause::SnapshotDone);
    let p = last.vnodes.iter().find(|p| p.vnode == v).expect("vnode");
    assert_eq!((p.row_count, p.finished), (1, true));
    assert_eq!(x.status().counters.checkpoints, done.len() as u64);
    // Outside the snapshot phase a vnode end changes nothing.
    assert!(x
        .handle(Event::SnapshotVnodeDone { scan, vnode: v })
        .unwrap()
        .is_empty());
}

/// The log store's counters and epoch lag, per op and barrier.
#[test]
fn log_store_counters_count_each_op_and_barrier_and_the_epoch_lag() {
    let mut x = in_log_store();
    let map = spec(2).map;
    let v = map.vnodes_of(0).next().unwrap();
    let ops = [Op::Insert, Op::Delete, Op::UpdateDelete, Op::UpdateInsert];
    let mut offset = 1;
    for op in ops {
        x.handle(rec(0, offset, change(map, e(1), v, op))).unwrap();
        offset += 1;
    }
    x.handle(rec(0, offset, change(map, e(1), v, Op::Insert)))
        .unwrap();
    offset += 1;
    assert_eq!(x.status().counters.changes, [2, 1, 1, 1]);
    x.handle(rec(0, offset, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    x.handle(rec(1, 1, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    x.handle(rec(0, offset + 1, barrier(2, 5, BarrierKind::Barrier)))
        .unwrap();
    let s = x.status();
    assert_eq!(s.counters.barriers, 3);
    assert_eq!(s.committed_epoch, Some(e(1)));
    assert_eq!(s.newest_epoch, Some(e(5)));
    assert_eq!(s.epoch_lag_seconds, e(5).seconds_since(e(1)));
    assert!(s.epoch_lag_seconds > 0.0);
}

/// Under `reschedule` a vnode-bitmap update in the log store is absorbed: what is complete is
/// committed, the revoked partition's staged changes are dropped, a newly owned one is fetched from
/// its committed offset, and the worker stays in the log store.
#[test]
fn reschedule_absorbs_a_bitmap_update_in_the_log_store() {
    let mut s = spec(2);
    s.policy.reschedule = true;
    let map = s.map;
    let mut x = Executor::new(s, 0);
    x.handle(Event::Assigned(vec![claimed(map, 0, true)]))
        .unwrap();
    assert_eq!(x.phase(), Phase::LogStore);
    let v0 = map.vnodes_of(0).next().unwrap();
    x.handle(rec(0, 1, change(map, e(1), v0, Op::Insert)))
        .unwrap();
    let ds = x
        .handle(Event::Assigned(vec![claimed(map, 1, true)]))
        .unwrap();
    assert!(!ds.iter().any(|d| matches!(d, Decision::Fail(_))), "{ds:?}");
    assert!(ds.contains(&Decision::Fetch {
        partition: 1,
        offset: 1
    }));
    assert_eq!(x.phase(), Phase::LogStore);
    assert_eq!(x.owned_partitions(), vec![0, 1]);
    let ds = x.handle(Event::Revoked(vec![0])).unwrap();
    assert!(!ds.iter().any(|d| matches!(d, Decision::Fail(_))), "{ds:?}");
    assert_eq!(x.owned_partitions(), vec![1]);
    assert_eq!(x.phase(), Phase::LogStore);
    // Without reschedule the same update is the seed's error.
    let mut y = in_log_store();
    let ds = y.handle(Event::Revoked(vec![0])).unwrap();
    assert_eq!(
        ds.last(),
        Some(&Decision::Fail(CoreError::VnodeBitmapUpdateDuringLogStore))
    );
}

/// An executor in the log-store phase over two partitions whose policy is `dead-letter`.
fn dead_lettering(reschedule: bool) -> Executor {
    let mut s = spec(2);
    s.policy.max_dead_letters = Some(10);
    s.policy.reschedule = reschedule;
    let map = s.map;
    let mut x = Executor::new(s, 0);
    x.handle(Event::Assigned(vec![
        claimed(map, 0, true),
        claimed(map, 1, true),
    ]))
    .unwrap();
    assert_eq!(x.phase(), Phase::LogStore);
    x
}

/// Under `dead-letter` a record that does not decode is skipped, not a stop: the partition reads on,
/// and the dead letter rides with the checkpoint whose offsets pass it — not an earlier one, not a
/// later one — naming topic, partition and offset.
#[test]
fn a_dead_letter_is_skipped_and_recorded_with_the_checkpoint_that_passes_it() {
    let mut x = dead_lettering(false);
    let map = x.spec().map;
    x.handle(rec(0, 1, change(map, e(1), 0, Op::Insert)))
        .unwrap();
    x.handle(rec(0, 2, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    // Garbage in epoch 2 of partition 0: no pause, no failure.
    let ds = x
        .handle(Event::Undecodable {
            partition: 0,
            offset: 3,
            reason: "garbage".into(),
        })
        .unwrap();
    assert!(ds.is_empty(), "{ds:?}");
    x.handle(rec(0, 4, change(map, e(2), 0, Op::Insert)))
        .unwrap();
    x.handle(rec(0, 5, barrier(2, 3, BarrierKind::Checkpoint)))
        .unwrap();
    // Partition 1 completes epoch 1: its checkpoint does not carry the epoch-2 dead letter.
    x.handle(rec(1, 1, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    let ds = x
        .handle(rec(1, 2, barrier(2, 3, BarrierKind::Checkpoint)))
        .unwrap();
    let cps = commits(&ds);
    assert_eq!(cps.len(), 1, "{ds:?}");
    assert_eq!(cps[0].epoch, Some(e(2)), "epochs 1 and 2 in one commit");
    assert_eq!(cps[0].max_dead_letters, 10);
    let letters = &cps[0].dead_letters;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!((letters[0].partition, letters[0].offset), (0, 3));
    assert_eq!(letters[0].epoch, e(2));
    assert!(
        letters[0]
            .reason
            .contains("record at topic log partition 0 offset 3 does not decode"),
        "{}",
        letters[0].reason
    );
    let offsets: Vec<u64> = cps[0].partitions.iter().map(|p| p.next_offset).collect();
    assert_eq!(
        offsets,
        vec![6, 3],
        "partition 0 read on past the dead letter"
    );
    assert_eq!(x.counters.dead_letters, 1);
}

/// A dead letter of an epoch not yet committed goes with its partition: revoked (absorbed under
/// `reschedule`), it is read again by whoever reads the partition next, and is never in a commit of
/// the old owner.
#[test]
fn an_uncommitted_dead_letter_is_dropped_with_its_partition() {
    let mut x = dead_lettering(true);
    x.handle(Event::Undecodable {
        partition: 0,
        offset: 1,
        reason: "garbage".into(),
    })
    .unwrap();
    x.handle(rec(0, 2, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    let mut x2 = x;
    let ds = x2.handle(Event::Revoked(vec![0])).unwrap();
    assert!(
        commits(&ds).iter().all(|c| c.dead_letters.is_empty()),
        "{ds:?}"
    );
    // Partition 1 completes epoch 1 alone now: nothing of partition 0's is in its commit.
    let ds = x2
        .handle(rec(1, 1, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    let cps = commits(&ds);
    assert!(!cps.is_empty(), "{ds:?}");
    for c in cps {
        assert!(c.dead_letters.is_empty(), "{c:?}");
    }
}

/// A barrier that does not decode, skipped as a dead letter, breaks the chain at the next barrier:
/// the job still stops there (a broken chain makes every later epoch unreliable).
#[test]
fn a_dead_lettered_barrier_still_stops_at_the_broken_chain() {
    let mut x = dead_lettering(false);
    x.handle(Event::Undecodable {
        partition: 0,
        offset: 1,
        reason: "garbage where barrier 1 -> 2 was".into(),
    })
    .unwrap();
    let e = bad_record(&mut x, rec(0, 2, barrier(2, 3, BarrierKind::Checkpoint)));
    assert!(matches!(e, CoreError::BarrierChainBroken { .. }), "{e:?}");
}

/// When the frontier jumps several checkpoints at once (the lagging partition revoked under
/// `reschedule`), the executor commits through the newest in one checkpoint, or — with
/// `commit_every_checkpoint` — each checkpoint epoch on its own, oldest first, each with the rows
/// of its own epochs (docs/design/several-tables.md §2: the boundaries of all workers meet).
#[test]
fn a_jump_of_the_frontier_commits_each_checkpoint_on_its_own_when_asked() {
    let run = |every: bool| {
        let mut s = spec(2);
        s.policy.reschedule = true;
        s.policy.max_epochs_ahead = 100;
        s.policy.commit_every_checkpoint = every;
        let map = s.map;
        let mut x = in_log_store_with(s);
        let vnodes: Vec<Vnode> = map.vnodes_of(0).collect();
        let mut offset = 1;
        for n in 1..=3u64 {
            x.handle(rec(
                0,
                offset,
                change(map, e(n), vnodes[n as usize - 1], Op::Insert),
            ))
            .unwrap();
            offset += 1;
            let ds = x
                .handle(rec(0, offset, barrier(n, n + 1, BarrierKind::Checkpoint)))
                .unwrap();
            assert!(commits(&ds).is_empty(), "partition 1 has delivered nothing");
            offset += 1;
        }
        let ds = x.handle(Event::Revoked(vec![1])).unwrap();
        assert!(!ds.iter().any(|d| matches!(d, Decision::Fail(_))), "{ds:?}");
        commits(&ds)
            .into_iter()
            .map(|c| (c.epoch, c.rows.len(), c.partitions[0].next_offset))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(false), vec![(Some(e(3)), 3, 7)]);
    assert_eq!(
        run(true),
        vec![(Some(e(1)), 1, 3), (Some(e(2)), 1, 5), (Some(e(3)), 1, 7)]
    );
}

/// A schema change (docs/WIRE.md "Schema changes") splits a commit: when the frontier jumps past
/// the checkpoint barrier a new row-schema version starts at, the epochs before it are committed
/// in a checkpoint of their own, so that every checkpoint's rows are of one version (the store
/// resolves them by the checkpoint's epoch).
#[test]
fn a_commit_never_takes_epochs_on_both_sides_of_a_schema_change() {
    let mut s = spec(2);
    s.policy.reschedule = true;
    s.policy.max_epochs_ahead = 100;
    let map = s.map;
    let mut x = in_log_store_with(s);
    let vnodes: Vec<Vnode> = map.vnodes_of(0).collect();
    let mut offset = 1;
    for n in 1..=3u64 {
        x.handle(rec(
            0,
            offset,
            change(map, e(n), vnodes[n as usize - 1], Op::Insert),
        ))
        .unwrap();
        offset += 1;
        let mut b = barrier(n, n + 1, BarrierKind::Checkpoint);
        if let LogRecord::Barrier(b) = &mut b {
            // A version starts at e(3).
            b.schema_change = n == 2;
        }
        let ds = x.handle(rec(0, offset, b)).unwrap();
        assert!(commits(&ds).is_empty(), "partition 1 has delivered nothing");
        offset += 1;
    }
    let ds = x.handle(Event::Revoked(vec![1])).unwrap();
    assert!(!ds.iter().any(|d| matches!(d, Decision::Fail(_))), "{ds:?}");
    let got: Vec<_> = commits(&ds)
        .into_iter()
        .map(|c| (c.epoch, c.rows.len(), c.partitions[0].next_offset))
        .collect();
    assert_eq!(got, vec![(Some(e(2)), 2, 5), (Some(e(3)), 1, 7)]);
}

#[test]
fn a_truncation_supersedes_its_table_s_earlier_changes_in_its_partition_and_commits_first() {
    let mut spec = spec(2);
    spec.policy.tables = crate::tables::JobTables::Several(vec![0, 2]);
    let mut x = in_log_store_with(spec);
    let map = x.spec().map;
    let of_table = |table: u16, epoch: Epoch, v: Vnode, op: Op| match change(map, epoch, v, op) {
        LogRecord::Change(c) => LogRecord::Change(Change { table, ..c }),
        b => b,
    };
    let truncate =
        |table: u16, epoch: Epoch| LogRecord::Truncate(crate::barrier::Truncate { epoch, table });
    // Epoch 1: table 2 changed in vnode 0 (partition 0) and vnode 4 (partition 1), table 0 in
    // vnode 1; partition 0 then truncates table 2, writes one of its rows again, and truncates
    // table 1, which the job does not materialise.
    x.handle(rec(0, 1, of_table(2, e(1), 0, Op::Insert)))
        .unwrap();
    x.handle(rec(0, 2, of_table(0, e(1), 1, Op::Insert)))
        .unwrap();
    x.handle(rec(1, 1, of_table(2, e(1), 4, Op::Insert)))
        .unwrap();
    x.handle(rec(0, 3, truncate(2, e(1)))).unwrap();
    x.handle(rec(0, 4, truncate(1, e(1)))).unwrap();
    x.handle(rec(0, 5, of_table(2, e(1), 2, Op::Insert)))
        .unwrap();
    x.handle(rec(0, 6, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    let ds = x
        .handle(rec(1, 2, barrier(1, 2, BarrierKind::Checkpoint)))
        .unwrap();
    let cs = commits(&ds);
    assert_eq!(cs.len(), 1, "{ds:?}");
    let rows: Vec<(Vnode, Vec<u8>, &str)> = cs[0]
        .rows
        .iter()
        .map(|m| {
            let kind = match m {
                RowMutation::Upsert { .. } => "upsert",
                RowMutation::Delete { .. } => "delete",
                RowMutation::Truncate { .. } => "truncate",
            };
            (m.vnode(), m.key().to_vec(), kind)
        })
        .collect();
    let t2 = vec![0u8, 2];
    let expected: Vec<(Vnode, Vec<u8>, &str)> = vec![
        (0, t2.clone(), "truncate"),
        (1, crate::table_key(0, &key_for_vnode(map, 1)), "upsert"),
        (1, t2.clone(), "truncate"),
        (2, t2.clone(), "truncate"),
        (2, crate::table_key(2, &key_for_vnode(map, 2)), "upsert"),
        (3, t2.clone(), "truncate"),
        (4, crate::table_key(2, &key_for_vnode(map, 4)), "upsert"),
    ];
    assert_eq!(
        rows, expected,
        "partition 0's vnodes lose table 2's rows before the row written after the truncation; \
         table 0's row stays; partition 1's vnodes are untouched"
    );
    assert_eq!(x.status().counters.truncates, 1);
}

#[test]
fn a_truncation_must_carry_its_partition_s_open_epoch() {
    let mut x = in_log_store();
    let truncate = LogRecord::Truncate(crate::barrier::Truncate {
        epoch: e(2),
        table: 0,
    });
    let err = bad_record(&mut x, rec(0, 1, truncate));
    assert!(
        err.to_string().contains("partition 0") && err.to_string().contains("offset 1"),
        "{err}"
    );
}
