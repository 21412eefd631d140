//! Deliberate bugs, to prove the simulation can fail (Cargo feature `testing`, tests only).
//!
//! Each [`Fault`] breaks one rule the system depends on; `tests/it/simulation.rs` switches each on in
//! turn and asserts that the simulation catches it within a bounded number of seeds. Without the
//! feature [`active`] is a constant `false` and the code paths it guards compile away. The switch is
//! per thread (the simulation runs on its test's thread), so parallel tests do not see each other's.

/// A deliberate bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The worker loop acknowledges a revocation (`unassign`) before the commits the revocation made
    /// are durable (breaks invariant 4's ordering).
    AckRevocationBeforeCommit,
    /// The executor commits a checkpoint whose epoch is not yet below the frontier: some owned
    /// partition has not delivered that epoch completely (breaks invariant 3).
    CommitAboveFrontier,
    /// Generations fence nothing: the store skips its generation check when claiming partitions
    /// and committing (and a recreation keeps the leases, which would otherwise fence on their
    /// own), and the loop skips its look at the job's generation (breaks the fencing of workers of
    /// an earlier generation, invariant 7).
    SkipGenerationCheck,
    /// The capture acknowledges a source position to PostgreSQL before the Kafka transaction that
    /// holds it committed (a crash in between loses what lies between for good).
    CaptureAckBeforeCommit,
    /// Publication (issue 23's proposed protocol) publishes at the minimum epoch every vnode has
    /// committed, not at an epoch every partition stands at: a unit coalesced across that epoch
    /// is left out, and the replica is published torn.
    PublishAtMinimumCommitted,
    /// Publication counts every partition a checkpoint carries progress for as standing at its
    /// epoch, also one the worker gained whose previous owner had committed beyond it.
    PublishEveryOwnedPartition,
    /// A snapshot's barrier is placed at the next transaction boundary, whatever its position: the
    /// transactions below the snapshot's point still to come land after it, in both.
    SnapshotBarrierEarly,
    /// A snapshot's barrier waits for a transaction past the point, not at it: the first
    /// transaction at or past the point lands before it, in neither.
    SnapshotBarrierLate,
}

impl Fault {
    /// The faults of the consumer's simulation (`tests/it/simulation.rs`).
    pub const ALL: [Fault; 5] = [
        Fault::AckRevocationBeforeCommit,
        Fault::CommitAboveFrontier,
        Fault::SkipGenerationCheck,
        Fault::PublishAtMinimumCommitted,
        Fault::PublishEveryOwnedPartition,
    ];
}

#[cfg(feature = "testing")]
thread_local! {
    static ACTIVE: std::cell::Cell<Option<Fault>> = const { std::cell::Cell::new(None) };
}

/// Whether `fault` is switched on for this thread (always `false` without the feature).
#[inline]
pub fn active(fault: Fault) -> bool {
    #[cfg(feature = "testing")]
    {
        ACTIVE.with(|a| a.get() == Some(fault))
    }
    #[cfg(not(feature = "testing"))]
    {
        let _ = fault;
        false
    }
}

/// Switches a fault on (or all off) for this thread.
#[cfg(feature = "testing")]
pub fn inject(fault: Option<Fault>) {
    ACTIVE.with(|a| a.set(fault));
}
