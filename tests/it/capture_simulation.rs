//! Deterministic simulation of `kafka-backfill capture` (src/sim/capture.rs) against its oracle: the
//! production capture loop and assembler against a model PostgreSQL and a model transactional Kafka,
//! with crashes before and after the Kafka commit, between the commit and the acknowledgement and
//! mid-transaction, dropped and silently replaying replication connections, and zombies; and
//! snapshots of the running capture asked for between transactions.
//!
//! `SIM_SEEDS` (default 1000) seeds run from `SIM_FIRST_SEED` (default 0); a failure prints the seed
//! and the command that replays it:
//! `SIM_SEED=<seed> cargo test --features testing --test it -- --exact capture_simulation::replay --nocapture`.

use kafka_backfill::sim::capture::{run_capture_sim, CaptureSimReport};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const TXNS: u64 = 60;

fn run_seed(seed: u64) -> Result<CaptureSimReport, String> {
    std::panic::catch_unwind(|| run_capture_sim(seed, TXNS))
        .unwrap_or_else(|_| Err(format!("seed {seed} panicked")))
        .map_err(|e| format!("{e}\n  replay: SIM_SEED={seed} cargo test --features testing --test it -- --exact capture_simulation::replay --nocapture"))
}

#[test]
fn random_capture_schedules_against_the_oracle() {
    let seeds = env_u64("SIM_SEEDS", 1000);
    let first = env_u64("SIM_FIRST_SEED", 0);
    let mut total = CaptureSimReport::default();
    let mut failures = Vec::new();
    for seed in first..first + seeds {
        match run_seed(seed) {
            Ok(r) => {
                total.transactions += r.transactions;
                total.changes += r.changes;
                total.checkpoints += r.checkpoints;
                total.processes += r.processes;
                total.crashes += r.crashes;
                total.drops += r.drops;
                total.replays += r.replays;
                total.zombies_fenced += r.zombies_fenced;
                total.later_snapshots += r.later_snapshots;
            }
            Err(e) => failures.push(e),
        }
    }
    println!("{seeds} capture seeds: {total:?}");
    assert!(
        failures.is_empty(),
        "{} of {seeds} seeds failed; first:\n{}",
        failures.len(),
        failures[0]
    );
    // The schedules exercise what they claim to.
    assert!(total.crashes > seeds / 4, "{total:?}");
    assert!(
        total.drops > 0 && total.replays > 0 && total.zombies_fenced > 0,
        "{total:?}"
    );
    assert!(total.checkpoints > seeds * 2, "{total:?}");
    assert!(total.later_snapshots > seeds / 2, "{total:?}");
}

/// The simulation can fail: acknowledging the source position before the Kafka commit (RisingWave
/// #25071's bug) is caught within a bounded number of seeds.
#[test]
fn acknowledging_before_the_kafka_commit_is_caught() {
    caught_within(kafka_backfill::core::faults::Fault::CaptureAckBeforeCommit);
}

/// A snapshot's barrier placed before its point, or after the first transaction past it, is
/// caught: the snapshot is not the log up to its barrier.
#[test]
fn a_snapshot_barrier_early_or_late_is_caught() {
    use kafka_backfill::core::faults::Fault;
    caught_within(Fault::SnapshotBarrierEarly);
    caught_within(Fault::SnapshotBarrierLate);
}

/// `fault` makes a seed fail within 300; that seed passes without it.
fn caught_within(fault: kafka_backfill::core::faults::Fault) {
    use kafka_backfill::core::faults::inject;
    const BOUND: u64 = 300;
    inject(Some(fault));
    let caught = (0..BOUND).find_map(|seed| run_seed(seed).err().map(|e| (seed, e)));
    inject(None);
    let Some((seed, e)) = caught else {
        panic!("{fault:?} was not caught within {BOUND} seeds");
    };
    println!(
        "{fault:?} caught by seed {seed}: {}",
        e.lines().next().unwrap_or_default()
    );
    run_seed(seed).unwrap();
}

#[test]
fn replay() {
    if let Ok(seed) = std::env::var("SIM_SEED") {
        let seed: u64 = seed.parse().expect("SIM_SEED is a number");
        println!("{:?}", run_capture_sim(seed, TXNS));
    }
}
