//! The simulation's [`Observer`]: every simulated worker's events counted in one place, the counts
//! the simulation reports (`SimReport`) and checks against its oracle — the same events the
//! service turns into metrics (`service::observe`), so what operators would see is simulated too.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use crate::core::Phase;
use crate::ports::{BitmapOutcome, FailureKind, Observer, WorkerEvent};

/// What the workers of one simulated job reported, over all their drivers.
#[derive(Clone, Debug, Default)]
pub struct SimCounts {
    /// Checkpoints reported committed.
    pub commits: u64,
    pub fenced: u64,
    /// Recreations reported applied.
    pub recreations: u64,
    /// Vnode-bitmap updates by the phase the worker was in, and how they ended.
    pub updates: BTreeMap<(Phase, BitmapOutcome), u64>,
    /// Invariant errors raised, by worker and phase.
    pub invariant_errors: Vec<(String, Phase)>,
    pub phases_seen: BTreeSet<Phase>,
}

/// One worker's observer; all of a job's share the counts.
pub struct SimObserver {
    pub(super) worker: String,
    pub(super) counts: Arc<Mutex<SimCounts>>,
}

impl Observer for SimObserver {
    fn observe(&mut self, event: WorkerEvent) {
        let mut c = self.counts.lock().unwrap();
        match event {
            WorkerEvent::CommitApplied { .. } => c.commits += 1,
            WorkerEvent::Failed {
                kind: FailureKind::Fenced,
                ..
            } => c.fenced += 1,
            WorkerEvent::Recreated => c.recreations += 1,
            WorkerEvent::BitmapUpdate { phase, outcome } => {
                *c.updates.entry((phase, outcome)).or_default() += 1
            }
            WorkerEvent::InvariantError { phase } => {
                c.invariant_errors.push((self.worker.clone(), phase))
            }
            WorkerEvent::PhaseChanged { to, .. } => {
                c.phases_seen.insert(to);
            }
            _ => {}
        }
    }
}
