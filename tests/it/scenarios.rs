//! RisingWave's snapshot-backfill scenarios as named tests, on the simulator with scripted schedules.
//! Every commit is checked against the upstream table by the simulator's oracle; `settle` checks that
//! the final store equals the final upstream table.

use kafka_backfill::core::{BarrierKind, Phase};
use kafka_backfill::sim::{GroupProtocol, Sim, SimConfig};

const CP: BarrierKind = BarrierKind::Checkpoint;
const NB: BarrierKind = BarrierKind::Barrier;

fn calm(seed: u64, vnodes: u32, partitions: u32, rows: u32) -> Sim {
    Sim::new(calm_config(seed, vnodes, partitions, rows))
}

/// A scripted run's shape: no churn, no chaos; workers and upstream moved by the test.
fn calm_config(seed: u64, vnodes: u32, partitions: u32, rows: u32) -> SimConfig {
    let mut c = SimConfig::random(seed);
    c.vnode_count = vnodes;
    c.partition_count = partitions;
    c.initial_rows = rows;
    c.key_space = 64;
    c.epochs = 0;
    c.initial_workers = 0;
    c.chaos_percent = 0;
    c.leaky_pause_percent = 0;
    c.local_checkpoint_rows = 3;
    c.max_fetch_batch = 4;
    c.max_steps = 20_000;
    // The scripted scenarios below say which protocol they run under; the classic one unless
    // they say otherwise.
    c.protocol = GroupProtocol::Classic;
    c
}

fn calm_under(protocol: GroupProtocol, seed: u64, vnodes: u32, partitions: u32, rows: u32) -> Sim {
    let mut c = calm_config(seed, vnodes, partitions, rows);
    c.protocol = protocol;
    Sim::new(c)
}

fn phase_is(i: usize, p: Phase) -> impl Fn(&Sim) -> bool {
    move |s: &Sim| s.phase(i) == Some(p)
}

/// Worker `i` is in phase `p` and the checkpoint that took it there is durable (commits are
/// pipelined: a crash loses what is still pending).
fn committed_in(i: usize, p: Phase) -> impl Fn(&Sim) -> bool {
    move |s: &Sim| s.phase(i) == Some(p) && s.pending_commits(i) == 0
}

#[test]
fn snapshot_with_an_empty_log_goes_straight_to_streaming() {
    let mut s = calm(1, 16, 4, 40);
    let w = s.join().unwrap();
    s.run_until(10_000, phase_is(w, Phase::Streaming)).unwrap();
    s.settle().unwrap();
    assert_eq!(s.report().final_rows, s.store().clone().rows_len("sim"));
}

#[test]
fn snapshot_then_log_then_streaming() {
    let mut s = calm(2, 16, 4, 30);
    for _ in 0..6 {
        s.write_epoch(5, CP);
    }
    let w = s.join().unwrap();
    s.run_until(10_000, phase_is(w, Phase::LogStore)).unwrap();
    s.run_until(10_000, phase_is(w, Phase::Streaming)).unwrap();
    s.write_epoch(5, CP);
    s.settle().unwrap();
    let seen = &s.report().phases_seen;
    assert!(
        seen.contains(&Phase::Snapshot)
            && seen.contains(&Phase::LogStore)
            && seen.contains(&Phase::Streaming)
    );
}

#[test]
fn non_checkpoint_barriers_accumulate_into_the_next_checkpoint() {
    let mut s = calm(3, 8, 2, 5);
    let w = s.join().unwrap();
    s.run_until(10_000, committed_in(w, Phase::Streaming))
        .unwrap();
    let before = s.store().commits("sim");
    s.write_epoch(4, NB);
    s.write_epoch(4, NB);
    s.write_changes(2);
    // Everything of those two epochs is read, but nothing is committed without a checkpoint.
    s.run_steps(500).unwrap();
    assert_eq!(
        s.store().commits("sim"),
        before,
        "a non-checkpoint barrier committed"
    );
    s.write_epoch(1, CP);
    s.settle().unwrap();
    assert!(s.store().commits("sim") > before);
}

/// Crash (and restart in place) in each progress state; the result must verify.
#[test]
fn crash_and_resume_in_every_progress_state() {
    // none: before anything committed
    let mut s = calm(4, 16, 4, 30);
    s.write_epoch(3, CP);
    let w = s.join().unwrap();
    s.crash_and_restart(w).unwrap();
    s.settle().unwrap();

    // mid-snapshot
    let mut s = calm(5, 16, 4, 60);
    s.write_epoch(3, CP);
    let w = s.join().unwrap();
    s.run_until(10_000, |s| s.store().commits("sim") >= 3)
        .unwrap();
    assert_eq!(s.phase(w), Some(Phase::Snapshot));
    s.crash_and_restart(w).unwrap();
    assert_eq!(s.phase(w), Some(Phase::Snapshot));
    s.settle().unwrap();

    // snapshot finished, log store not started / mid-log
    let mut s = calm(6, 16, 4, 20);
    for _ in 0..10 {
        s.write_epoch(4, CP);
    }
    let w = s.join().unwrap();
    s.run_until(10_000, |s| {
        let done = s.store().vnode_progress("sim");
        s.phase(w) == Some(Phase::LogStore)
            && done.len() == s.snapshot_info().vnode_count as usize
            && done.values().all(|p| p.finished)
    })
    .unwrap();
    s.crash_and_restart(w).unwrap();
    assert_eq!(
        s.phase(w),
        Some(Phase::LogStore),
        "snapshot finished: resume in the log store"
    );
    s.run_until(10_000, |s| s.store().commits("sim") >= 8)
        .unwrap();
    s.crash_and_restart(w).unwrap();
    s.settle().unwrap();

    // log finished (streaming) and mid-streaming
    let mut s = calm(7, 16, 4, 20);
    s.write_epoch(4, CP);
    let w = s.join().unwrap();
    s.run_until(10_000, committed_in(w, Phase::Streaming))
        .unwrap();
    s.crash_and_restart(w).unwrap();
    assert_eq!(
        s.phase(w),
        Some(Phase::Streaming),
        "caught up: resume streaming"
    );
    s.write_epoch(4, NB);
    s.write_changes(3);
    s.run_steps(200).unwrap();
    s.crash_and_restart(w).unwrap();
    s.write_epoch(2, CP);
    s.settle().unwrap();
}

#[test]
fn restart_with_a_different_number_of_workers() {
    let mut s = calm(8, 32, 4, 50);
    s.write_epoch(5, CP);
    let a = s.join().unwrap();
    s.run_until(10_000, |s| s.store().commits("sim") >= 4)
        .unwrap();
    // The single worker dies; three come back.
    s.crash(a).unwrap();
    let ws: Vec<usize> = (0..3).map(|_| s.join().unwrap()).collect();
    s.write_epoch(5, CP);
    s.settle().unwrap();
    assert!(ws.iter().all(|&w| !s.owned(w).is_empty()));
}

#[test]
fn reassignment_during_the_snapshot_scales_out_and_in_without_loss() {
    reassignment_during_the_snapshot_scales_out_and_in_without_loss_under(GroupProtocol::Classic);
}

/// The same under KIP-848: the coordinator's staggered, sticky, piecewise steps.
#[test]
fn reassignment_during_the_snapshot_scales_out_and_in_without_loss_under_kip848() {
    reassignment_during_the_snapshot_scales_out_and_in_without_loss_under(GroupProtocol::Consumer);
}

fn reassignment_during_the_snapshot_scales_out_and_in_without_loss_under(protocol: GroupProtocol) {
    let mut s = calm_under(protocol, 9, 32, 4, 60);
    s.write_epoch(5, CP);
    let a = s.join().unwrap();
    s.run_until(10_000, |s| s.store().commits("sim") >= 3)
        .unwrap();
    assert_eq!(s.phase(a), Some(Phase::Snapshot));
    let gen = s.generation();
    let b = s.join().unwrap(); // scale out mid-snapshot: allowed, re-planned
    assert_eq!(s.owned(a).len(), 2);
    assert_eq!(s.owned(b).len(), 2);
    s.run_until(10_000, |s| s.store().commits("sim") >= 8)
        .unwrap();
    if s.phase(a) == Some(Phase::Snapshot) {
        s.leave(b).unwrap(); // scale in mid-snapshot
    }
    s.settle().unwrap();
    assert_eq!(
        s.generation(),
        gen,
        "no recreation for a snapshot-phase rebalance"
    );
    assert_eq!(s.report().bitmap_errors, 0);
}

#[test]
fn reassignment_during_the_log_store_raises_the_error_then_recreates() {
    reassignment_during_the_log_store_raises_the_error_then_recreates_under(GroupProtocol::Classic);
}

/// The same under KIP-848: the coordinator's staggered, sticky, piecewise steps.
#[test]
fn reassignment_during_the_log_store_raises_the_error_then_recreates_under_kip848() {
    reassignment_during_the_log_store_raises_the_error_then_recreates_under(
        GroupProtocol::Consumer,
    );
}

fn reassignment_during_the_log_store_raises_the_error_then_recreates_under(
    protocol: GroupProtocol,
) {
    let mut s = calm_under(protocol, 10, 16, 4, 20);
    for _ in 0..30 {
        s.write_epoch(4, CP);
    }
    let a = s.join().unwrap();
    s.run_until(10_000, phase_is(a, Phase::LogStore)).unwrap();
    s.run_until(10_000, |s| s.store().commits("sim") >= 6)
        .unwrap();
    assert_eq!(s.phase(a), Some(Phase::LogStore));
    let gen = s.generation();
    let _b = s.join().unwrap();
    assert_eq!(
        s.report().bitmap_errors,
        1,
        "the exact invariant error is raised once"
    );
    assert_eq!(s.generation(), gen.next(), "the job was recreated");
    assert_eq!(s.store().job_row("sim").unwrap().recreations, 1);
    s.settle().unwrap();
}

#[test]
fn reassignment_during_streaming_loses_nothing() {
    reassignment_during_streaming_loses_nothing_under(GroupProtocol::Classic);
}

/// The same under KIP-848: the coordinator's staggered, sticky, piecewise steps.
#[test]
fn reassignment_during_streaming_loses_nothing_under_kip848() {
    reassignment_during_streaming_loses_nothing_under(GroupProtocol::Consumer);
}

fn reassignment_during_streaming_loses_nothing_under(protocol: GroupProtocol) {
    let mut s = calm_under(protocol, 11, 16, 4, 20);
    s.write_epoch(4, CP);
    let a = s.join().unwrap();
    s.run_until(10_000, phase_is(a, Phase::Streaming)).unwrap();
    let b = s.join().unwrap();
    s.write_epoch(6, CP);
    s.write_epoch(6, NB);
    s.run_steps(300).unwrap();
    s.leave(b).unwrap();
    s.write_epoch(6, CP);
    s.settle().unwrap();
    assert_eq!(s.report().bitmap_errors, 0);
    assert!(
        s.report()
            .updates_by_phase
            .get(&Phase::Streaming)
            .copied()
            .unwrap_or(0)
            >= 2
    );
}

#[test]
fn revocation_in_the_middle_of_an_epoch_rolls_back_in_flight_work() {
    let mut s = calm(12, 16, 2, 10);
    s.write_epoch(2, CP);
    let a = s.join().unwrap();
    s.run_until(10_000, phase_is(a, Phase::Streaming)).unwrap();
    // Half an epoch is read by `a`, then its partition moves to `b`.
    s.write_changes(8);
    s.run_steps(200).unwrap();
    let b = s.join().unwrap();
    assert_eq!(s.owned(b).len(), 1);
    s.write_changes(4);
    s.write_epoch(0, CP);
    s.settle().unwrap();
}

#[test]
fn a_frozen_zombie_is_fenced_and_nothing_is_lost() {
    let mut s = calm(13, 16, 4, 20);
    s.write_epoch(3, CP);
    let a = s.join().unwrap();
    let b = s.join().unwrap();
    s.run_until(10_000, |s| {
        s.phase(0) == Some(Phase::Streaming) && s.phase(1) == Some(Phase::Streaming)
    })
    .unwrap();
    s.freeze(a).unwrap();
    s.write_epoch(5, CP);
    s.run_until(10_000, |s| {
        s.owned(1).len() == 4 && s.store().commits("sim") > 6
    })
    .unwrap();
    s.thaw(a);
    s.write_epoch(5, CP);
    s.settle().unwrap();
    assert!(
        s.report().fenced >= 1,
        "the zombie's commit was not rejected"
    );
    let _ = b;
}

/// `calm`, under `recreation.policy = "reschedule"`.
fn calm_rescheduling(seed: u64, vnodes: u32, partitions: u32, rows: u32) -> Sim {
    let mut c = calm_config(seed, vnodes, partitions, rows);
    c.supervisor.policy = kafka_backfill::core::RecreationPolicy::Reschedule;
    Sim::new(c)
}

/// Under `reschedule`: nothing failed, nothing was recreated, and `at_least` updates were absorbed.
fn absorbed(s: &Sim, at_least: u64) {
    let r = s.report();
    assert_eq!((r.bitmap_errors, r.recreations), (0, 0), "{r:?}");
    assert!(r.rescheduled >= at_least, "{r:?}");
    assert_eq!(s.generation(), kafka_backfill::core::Generation(0));
}

#[test]
fn under_reschedule_a_partition_moving_twice_before_its_first_checkpoint_loses_nothing() {
    let mut s = calm_rescheduling(20, 16, 4, 20);
    for _ in 0..30 {
        s.write_epoch(4, CP);
    }
    let a = s.join().unwrap();
    s.run_until(10_000, phase_is(a, Phase::LogStore)).unwrap();
    // b takes partitions from a and, as soon as the rebalance has settled (no checkpoint barrier
    // has passed under b), gives them back.
    let b = s.join().unwrap();
    assert!(!s.owned(b).is_empty(), "b took partitions");
    s.leave(b).unwrap();
    assert_eq!(s.owned(a).len(), 4, "back with a");
    s.settle().unwrap();
    absorbed(&s, 2);
}

#[test]
fn under_reschedule_a_rebalance_between_a_checkpoint_barrier_and_its_commit_loses_nothing() {
    let mut s = calm_rescheduling(21, 16, 4, 20);
    for _ in 0..30 {
        s.write_epoch(4, CP);
    }
    let a = s.join().unwrap();
    s.run_until(10_000, phase_is(a, Phase::LogStore)).unwrap();
    // A checkpoint handed to the committer and not yet applied when the group rebalances.
    s.run_until(10_000, |s| s.pending_commits(0) > 0).unwrap();
    assert_eq!(s.phase(a), Some(Phase::LogStore));
    let _b = s.join().unwrap();
    s.settle().unwrap();
    absorbed(&s, 1);
}

#[test]
fn under_reschedule_a_frozen_zombie_is_fenced_while_its_partitions_move() {
    let mut s = calm_rescheduling(22, 16, 4, 20);
    for _ in 0..40 {
        s.write_epoch(4, CP);
    }
    let a = s.join().unwrap();
    let b = s.join().unwrap();
    s.run_until(10_000, |s| {
        s.phase(0) == Some(Phase::LogStore) && s.phase(1) == Some(Phase::LogStore)
    })
    .unwrap();
    // a stops answering past its session timeout; its partitions move to b mid log store.
    s.freeze(a).unwrap();
    let commits = s.store().commits("sim");
    s.run_until(10_000, |s| {
        s.owned(1).len() == 4 && s.store().commits("sim") > commits + 2
    })
    .unwrap();
    s.thaw(a);
    s.settle().unwrap();
    assert!(
        s.report().fenced >= 1,
        "the zombie's commit was not rejected"
    );
    absorbed(&s, 1);
    let _ = b;
}

/// One rebalance seen by four workers of one process in the log store: each raises the invariant
/// error, but it is one recreation (generation + 1) and one use of `max_recreations`: the
/// supervisor recreates from the *failed executor's* generation, and a failure from a generation
/// already recreated only restarts the worker under the new one.
#[test]
fn one_rebalance_seen_by_four_workers_is_one_recreation() {
    // A snapshot long enough that all four join while every worker is still in it.
    let mut c = calm_config(12, 32, 8, 1_500);
    c.key_space = 4_096;
    c.supervisor.max_recreations = 1;
    // As in production (500 ms by default): the group settles before the recreated job restarts.
    c.supervisor.backoff_initial_ms = 500;
    let mut s = Sim::new(c);
    for _ in 0..400 {
        s.write_epoch(4, CP);
    }
    let ws: Vec<usize> = (0..4).map(|_| s.join().unwrap()).collect();
    s.run_until(20_000, |s| {
        ws.iter().all(|&w| s.phase(w) == Some(Phase::LogStore))
    })
    .unwrap();
    let gen = s.generation();
    let _fifth = s.join().unwrap();
    s.settle().unwrap();
    let r = s.report();
    // Every worker of the old generation stopped on it: the invariant error, or its revocation's
    // commit fenced by the recreation that came first.
    assert!(
        r.bitmap_errors >= 1 && r.bitmap_errors + r.fenced >= 4,
        "{r:?}"
    );
    assert_eq!(s.generation(), gen.next(), "one recreation: {r:?}");
    assert_eq!(r.recreations, 1, "{r:?}");
    assert_eq!(s.store().job_row("sim").unwrap().recreations, 1);
    assert_eq!(r.stopped, None, "the cap of 1 was not used up: {r:?}");
}

/// The members of a second process join one by one — a rebalance each, as the classic protocol
/// does when they start a few hundred milliseconds apart — while the job is in the log store. The
/// first join is the invariant error and a recreation; every worker of the old generation then
/// waits out the recreation's backoff (not only the one that recreated), so the later joins move
/// partitions of no running executor and the job is recreated once. Before, a sibling fenced by the
/// recreation restarted after 200 ms, finished its short snapshot and met the next join in the log
/// store: a second recreation, and with `max_recreations = 1` the job stopped (the four-worker test
/// in `tests/it/kafka_e2e.rs` failed so in CI).
#[test]
fn members_of_a_second_process_joining_one_by_one_are_one_recreation() {
    let mut c = calm_config(13, 32, 8, 64);
    c.key_space = 4_096;
    c.supervisor.max_recreations = 1;
    c.supervisor.backoff_initial_ms = 1_500;
    let mut s = Sim::new(c);
    for _ in 0..400 {
        s.write_epoch(4, CP);
    }
    let ws = s.join_together(4).unwrap();
    s.run_until(20_000, |s| {
        ws.iter().all(|&w| s.phase(w) == Some(Phase::LogStore))
    })
    .unwrap();
    let gen = s.generation();
    assert_eq!(s.report().recreations, 0);
    // The second process's members, 500 ms apart: well within the recreation's backoff, long
    // enough for a worker restarted after 200 ms to be back in the log store.
    for _ in 0..4 {
        s.join().unwrap();
        s.run_steps(500).unwrap();
    }
    s.settle().unwrap();
    let r = s.report();
    assert_eq!(r.stopped, None, "the cap of 1 was not used up: {r:?}");
    assert_eq!(s.generation(), gen.next(), "one recreation: {r:?}");
    assert_eq!(r.recreations, 1, "{r:?}");
}
