//! Unit tests of the core's small pieces (names, texts, counters, the hasher, staging, progress,
//! the log contract's position, throughput), written to catch the mutants `scripts/mutants.sh`
//! found surviving: each asserts a value a wrong implementation would change.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hasher;

use crate::barrier::{Barrier, BarrierKind, Change, LogRecord, Op, Row};
use crate::contract::{check_record, LogPosition};
use crate::epoch::Epoch;
use crate::error::CoreError;
use crate::executor::{ExecutorCounters, PartitionStatus, WorkerStatus};
use crate::phase::Phase;
use crate::progress::{
    Checkpoint, CheckpointCause, JobProgress, PartitionProgress, RowMutation, VnodeProgress,
};
use crate::retry::Backoff;
use crate::staging::{FxHasher, Staging};
use crate::supervisor::WorkerFailure;
use crate::throughput::Throttle;
use crate::vnode::{PartitionMap, Vnode};

#[test]
fn names_and_texts_operators_read() {
    let ops: Vec<&str> = Op::ALL.iter().map(|o| o.as_str()).collect();
    assert_eq!(ops, ["insert", "delete", "update_delete", "update_insert"]);
    let phases: Vec<&str> = Phase::ALL.iter().map(|p| p.as_str()).collect();
    assert_eq!(phases, ["unassigned", "snapshot", "log_store", "streaming"]);
    assert_eq!(Epoch(65_536).to_string(), "65536");
    assert_eq!(
        WorkerFailure::Fenced("lease 3 taken".into()).to_string(),
        "fenced, restarting from the store: lease 3 taken"
    );
    assert_eq!(
        WorkerFailure::Unavailable("connection refused".into()).to_string(),
        "connection refused; restarting from the last commit"
    );
    assert_eq!(
        WorkerFailure::Fatal("no such table".into()).to_string(),
        "no such table"
    );
    assert!(!CoreError::VnodeBitmapUpdateDuringLogStore.is_bad_record());
    assert!(CoreError::Undecodable {
        topic: "t".into(),
        partition: 0,
        offset: 1,
        reason: "r".into()
    }
    .is_bad_record());
}

#[test]
fn the_hasher_mixes_every_byte_of_long_and_short_keys() {
    let hash = |b: &[u8]| {
        let mut h = FxHasher::default();
        h.write(b);
        h.finish()
    };
    let long = b"0123456789abcdef";
    let mut seen = BTreeSet::new();
    for i in 0..long.len() {
        let mut k = *long;
        k[i] ^= 1;
        assert!(seen.insert(hash(&k)), "byte {i} does not change the hash");
    }
    assert!(seen.insert(hash(long)));
    assert!(seen.insert(hash(b"abc")) && seen.insert(hash(b"abd")));
    assert_ne!(hash(b"abc"), 0);
    assert_ne!(hash(b"abc"), 1);
    // Known values: FxHash's rotate-xor-multiply over the 8-byte word and the remainder.
    let k: u64 = 0x51_7c_c1_b7_27_22_0a_95;
    let w = u64::from_le_bytes(*b"01234567");
    let expected =
        ((0u64.rotate_left(5) ^ w).wrapping_mul(k).rotate_left(5) ^ b'8' as u64).wrapping_mul(k);
    assert_eq!(hash(b"012345678"), expected);
}

fn change(epoch: Epoch, op: Op, vnode: Vnode, key: &[u8]) -> Change {
    Change {
        epoch,
        op,
        vnode,
        table: 0,
        row: Row {
            key: key.to_vec(),
            value: b"v".to_vec(),
        },
    }
}

#[test]
fn staging_discards_only_revoked_vnodes_and_clears_all() {
    let e1 = Epoch(2 << 16);
    let mut s = Staging::default();
    assert!(s.is_empty());
    s.stage(change(e1, Op::Insert, 0, b"a"), 0);
    s.stage(change(e1, Op::Insert, 1, b"b"), 0);
    assert!(!s.is_empty());
    assert_eq!(s.len(), 2);
    s.discard(|v| v == 1);
    assert_eq!(s.len(), 1);
    let taken = s.take_through(e1);
    assert_eq!(taken.rows.len(), 1);
    assert_eq!(taken.rows[0].key(), b"a");
    assert!(s.is_empty());
    s.stage(change(e1, Op::Insert, 0, b"c"), 0);
    s.discard(|_| false);
    assert_eq!(s.len(), 1, "nothing revoked, nothing dropped");
    s.discard(|_| true);
    assert!(s.is_empty());
    assert!(
        s.take_through(e1).rows.is_empty(),
        "an emptied epoch is gone"
    );
    s.stage(change(e1, Op::Insert, 0, b"d"), 0);
    s.clear();
    assert!(s.is_empty());
    assert!(s.take_through(e1).rows.is_empty());
}

#[test]
fn progress_helpers() {
    let v = VnodeProgress::fresh(3, Epoch(1 << 16));
    assert!(!v.snapshot_finished());
    assert!(VnodeProgress {
        finished: true,
        ..v.clone()
    }
    .snapshot_finished());
    let empty = Checkpoint {
        generation: crate::Generation(0),
        worker: "w".into(),
        cause: CheckpointCause::Local,
        epoch: None,
        leases: vec![(0, crate::Lease(1))],
        rows: vec![],
        vnodes: vec![],
        partitions: vec![],
        dead_letters: vec![],
        max_dead_letters: 0,
    };
    assert!(empty.is_empty(), "leases alone change nothing");
    let mut rows = empty.clone();
    rows.rows = vec![RowMutation::Delete {
        vnode: 0,
        key: b"k".to_vec(),
    }];
    assert!(!rows.is_empty());
    let mut vnodes = empty.clone();
    vnodes.vnodes = vec![v.clone()];
    assert!(!vnodes.is_empty());
    let mut parts = empty.clone();
    parts.partitions = vec![PartitionProgress {
        partition: 0,
        next_offset: 1,
        epoch: Epoch(2 << 16),
        streaming: false,
    }];
    assert!(!parts.is_empty());
}

#[test]
fn job_progress_needs_every_partition_streaming_and_every_snapshot_finished() {
    let map = PartitionMap::new(4, 2).unwrap();
    let finished = |v: Vnode| {
        (
            v,
            VnodeProgress {
                finished: true,
                ..VnodeProgress::fresh(v, Epoch(1 << 16))
            },
        )
    };
    let all: BTreeMap<Vnode, VnodeProgress> = (0..4).map(finished).collect();
    let streaming = |p: u32, s: bool| {
        (
            p,
            PartitionProgress {
                partition: p,
                next_offset: 5,
                epoch: Epoch(2 << 16),
                streaming: s,
            },
        )
    };
    let both: BTreeMap<_, _> = [streaming(0, true), streaming(1, true)].into();
    let p = JobProgress::of(map, &all, &both);
    assert!(p.caught_up);
    assert_eq!(
        (p.vnodes_streaming, p.vnodes_log_store, p.vnodes_snapshot),
        (4, 0, 0)
    );
    let one: BTreeMap<_, _> = [streaming(0, true), streaming(1, false)].into();
    let p = JobProgress::of(map, &all, &one);
    assert!(!p.caught_up);
    assert_eq!(p.partitions_behind, vec![1]);
    let mut three = all.clone();
    three.remove(&0);
    let p = JobProgress::of(map, &three, &both);
    assert!(!p.caught_up, "a vnode still in its snapshot");
    assert_eq!(p.vnodes_snapshot, 1);
}

#[test]
fn the_contract_position_follows_update_pairs_and_barrier_kinds() {
    let map = PartitionMap::new(4, 2).unwrap();
    let e1 = Epoch(2 << 16);
    let e2 = Epoch(3 << 16);
    let mut at = LogPosition {
        open_epoch: e1,
        pending_update_delete: None,
    };
    let mut barriers = BTreeMap::new();
    let ud = LogRecord::Change(change(e1, Op::UpdateDelete, 0, b"k"));
    let ui = LogRecord::Change(change(e1, Op::UpdateInsert, 0, b"k"));
    at.advance(7, &ud, &mut barriers);
    assert_eq!(at.pending_update_delete, Some(7));
    at.advance(8, &ui, &mut barriers);
    assert_eq!(at.pending_update_delete, None, "the pair is complete");
    // A barrier of the same epoch with another kind on another partition is a mismatch.
    let cp = LogRecord::Barrier(Barrier {
        prev: e1,
        curr: e2,
        kind: BarrierKind::Checkpoint,
        schema_change: false,
    });
    at.advance(9, &cp, &mut barriers);
    assert_eq!(at.open_epoch, e2);
    let other = LogPosition {
        open_epoch: e1,
        pending_update_delete: None,
    };
    let plain = LogRecord::Barrier(Barrier {
        prev: e1,
        curr: e2,
        kind: BarrierKind::Barrier,
        schema_change: false,
    });
    assert!(matches!(
        check_record("t", map, 1, 3, &other, &plain, &barriers),
        Err(CoreError::BarrierMismatch { .. })
    ));
    assert!(check_record("t", map, 1, 3, &other, &cp, &barriers).is_ok());
    // Resync: a bad update-delete leaves its pair pending, any other change or a barrier clears it.
    let mut r = LogPosition {
        open_epoch: e1,
        pending_update_delete: Some(1),
    };
    r.resync(4, &ud);
    assert_eq!(r.pending_update_delete, Some(4));
    r.resync(5, &ui);
    assert_eq!(r.pending_update_delete, None);
    r.resync(6, &ud);
    r.resync(7, &plain);
    assert_eq!((r.open_epoch, r.pending_update_delete), (e2, None));
}

#[test]
fn a_retry_that_would_end_exactly_at_the_deadline_is_not_made() {
    let b = Backoff {
        initial_ms: 100,
        max_ms: 1_000,
        deadline_ms: 1_000,
    };
    assert_eq!(b.wait_before(1, 899), Some(100));
    assert_eq!(b.wait_before(1, 900), None);
}

fn status(phase: Phase, partitions: &[(u64, Option<u64>)]) -> WorkerStatus {
    WorkerStatus {
        phase,
        generation: crate::Generation(0),
        owned_vnodes: 0,
        snapshot_vnodes_left: 0,
        partitions: partitions
            .iter()
            .enumerate()
            .map(|(i, (committed, high))| PartitionStatus {
                partition: i as u32,
                committed_offset: *committed,
                next_offset: *committed,
                settled_offset: *committed,
                high_watermark: *high,
                open_epoch: Epoch(1 << 16),
                committed_epoch: Epoch(1 << 16),
                paused: false,
            })
            .collect(),
        committed_epoch: None,
        newest_epoch: None,
        epoch_lag_seconds: 0.0,
        counters: ExecutorCounters {
            snapshot_rows: 2,
            changes: [1, 2, 3, 4],
            barriers: 5,
            checkpoints: 9,
            dead_letters: 0,
            truncates: 0,
        },
        caught_up: false,
        joined: true,
    }
}

#[test]
fn lag_handled_and_eta() {
    let s = status(Phase::LogStore, &[(10, Some(15)), (3, None), (7, Some(7))]);
    let lags: Vec<Option<u64>> = s.partitions.iter().map(|p| p.lag()).collect();
    assert_eq!(lags, [Some(5), None, Some(0)]);
    assert_eq!(s.lag(), 5);
    assert_eq!(s.handled(), 2 + 10 + 5);
    assert_eq!(s.catch_up_eta_seconds(2.0), Some(2.5));
    assert_eq!(
        s.catch_up_eta_seconds(0.0),
        None,
        "no rate yet: no estimate"
    );
    let streaming = status(Phase::Streaming, &[(10, Some(20))]);
    assert_eq!(streaming.catch_up_eta_seconds(5.0), Some(2.0));
    assert_eq!(streaming.catch_up_eta_seconds(0.0), Some(0.0));
    assert_eq!(status(Phase::Snapshot, &[]).catch_up_eta_seconds(9.0), None);
}

#[test]
fn the_throttle_waits_for_the_fraction_of_a_token_it_lacks() {
    let mut t = Throttle::new(400, 0);
    let n = t.allowance(0, 1_000);
    assert_eq!(n, 20, "burst: 50 ms of 400/s");
    t.spend(n);
    assert_eq!(t.allowance(1, 1_000), 0, "0.4 of a token after 1 ms");
    assert_eq!(t.wait_ms(), 2, "0.6 of a token at 0.4 per ms");
    let mut unlimited = Throttle::new(0, 0);
    unlimited.spend(1_000);
    assert_eq!(unlimited.wait_ms(), 0);
    assert_eq!(unlimited.allowance(0, 7), 7);
}

#[test]
fn a_truncation_missing_from_a_partition_that_passed_its_epoch_is_named() {
    use crate::contract::{truncations_missing, TruncationsSeen};
    let e = |n: u64| Epoch(n << 16);
    let mut seen = TruncationsSeen::new();
    seen.entry((1, e(2))).or_default().extend([0, 1]);
    // Partition 2 is past epoch 2 without it; partition 3 stopped reading at epoch 2 (it may come).
    let open = BTreeMap::from([(0, e(5)), (1, e(5)), (2, e(3)), (3, e(2))]);
    assert_eq!(truncations_missing(&seen, &open), [(1, e(2), 2)]);
    seen.get_mut(&(1, e(2))).unwrap().insert(2);
    assert!(truncations_missing(&seen, &open).is_empty());
}
