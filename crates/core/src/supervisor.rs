//! The job supervisor's policy: what to do when a worker stops with an error (docs/DESIGN.md §6).
//!
//! It decides, it does not act: the driver bumps the generation in the store (a compare-and-set that
//! fences every worker of the old generation), sleeps the backoff and restarts the workers.
//!
//! One rebalance is one recreation, however many workers saw it: every worker of the job raises the
//! invariant error with the generation of *its own failed executor*. The first failure from a
//! generation decides a recreation from it; a later failure from a generation already recreated (or
//! older) only restarts that worker under the new generation, uses none of `max_recreations` and
//! doubles no backoff. The cap counts recreations that *applied* (the driver reports each
//! compare-and-set's outcome with [`Supervisor::recreation_outcome`]): a compare-and-set that another
//! process won is not this process's recreation.

use std::collections::VecDeque;

use super::error::CoreError;

/// What to do on the log-store invariant error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecreationPolicy {
    /// Bump the generation, discard the job's rows and progress, restart from the snapshot.
    Recreate,
    /// Stop the job with the error (non-zero exit) for an orchestrator to handle.
    Fail,
    /// Absorb the vnode-bitmap update in the log-store phase as the streaming phase does: commit what
    /// is complete, drop revoked partitions' in-flight work, fetch newly owned partitions from their
    /// committed offsets (back to the snapshot phase for an unfinished vnode), keep aligning over the
    /// new set. No error, no recreation (the executor decides; see `JobSpec::reschedule`).
    Reschedule,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SupervisorConfig {
    pub policy: RecreationPolicy,
    /// At most this many recreations within `window_ms`; one more stops the job.
    pub max_recreations: u32,
    pub window_ms: u64,
    /// Backoff before the first recreation of a window, doubled for each further one.
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        SupervisorConfig {
            policy: RecreationPolicy::Recreate,
            max_recreations: 5,
            window_ms: 600_000,
            backoff_initial_ms: 500,
            backoff_max_ms: 30_000,
        }
    }
}

/// Why a worker stopped, as the supervisor classifies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerFailure {
    /// The core raised an error (the bitmap-update invariant or bad input).
    Core(CoreError),
    /// The store rejected a commit: stale generation or a partition claimed by someone else: restart
    /// from what is committed.
    Fenced(String),
    /// The store was unavailable or busy (transient): restart from what is committed.
    Unavailable(String),
    /// Anything else that cannot be retried (a corrupt snapshot file, a value the store refuses, a
    /// broken store invariant): the job stops.
    Fatal(String),
}

impl std::fmt::Display for WorkerFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerFailure::Core(e) => write!(f, "{e}"),
            WorkerFailure::Fenced(e) => write!(f, "fenced, restarting from the store: {e}"),
            WorkerFailure::Unavailable(e) => write!(f, "{e}; restarting from the last commit"),
            WorkerFailure::Fatal(e) => write!(f, "{e}"),
        }
    }
}

/// The supervisor's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Recreate the job: bump the generation from `from_generation`, then restart after `backoff_ms`.
    Recreate {
        from_generation: u64,
        backoff_ms: u64,
    },
    /// Restart the worker from what is committed after `backoff_ms` (it was fenced, or its store
    /// was briefly away; the job is fine).
    Restart { backoff_ms: u64 },
    /// Stop the job and report this reason.
    Stop { reason: String },
}

/// Counts recreations in a sliding window and turns failures into verdicts.
#[derive(Clone, Debug)]
pub struct Supervisor {
    config: SupervisorConfig,
    /// When each applied recreation happened, within the window.
    recreations: VecDeque<u64>,
    /// Recreations applied since start.
    total: u64,
    /// The newest generation a recreation was decided from: failures from it or older are already
    /// handled (their executors are fenced by the generation after it).
    recreated_from: Option<u64>,
    /// When restarts for an unavailable store happened, within [`UNAVAILABLE_WINDOW_MS`].
    unavailable: VecDeque<u64>,
}

/// Restarts for an unavailable store counted over this window.
pub const UNAVAILABLE_WINDOW_MS: u64 = 300_000;
/// This many restarts for an unavailable store within the window stop the job (each restart has
/// already retried within [`super::retry::Backoff::STORE`]).
pub const MAX_UNAVAILABLE_RESTARTS: usize = 10;
/// A restart after fencing waits this long (the job itself is fine).
pub const FENCED_RESTART_MS: u64 = 200;

impl Supervisor {
    pub fn new(config: SupervisorConfig) -> Self {
        Supervisor {
            config,
            recreations: VecDeque::new(),
            total: 0,
            recreated_from: None,
            unavailable: VecDeque::new(),
        }
    }

    /// Recreations applied since start (decided here and won in the store).
    pub fn recreations(&self) -> u64 {
        self.total
    }

    /// The outcome of a [`Verdict::Recreate`]'s compare-and-set in the store: `applied` when this
    /// process bumped the generation (counted against `max_recreations`), not when another process
    /// had already (the job was recreated once, by it).
    pub fn recreation_outcome(&mut self, applied: bool, now_ms: u64) {
        if applied {
            self.recreations.push_back(now_ms);
            self.total += 1;
        }
    }

    /// What to do with a worker's failure. `generation` is the generation of the executor that
    /// failed (not the store's current one: another worker may have recreated the job since).
    pub fn on_failure(&mut self, failure: &WorkerFailure, generation: u64, now_ms: u64) -> Verdict {
        match failure {
            WorkerFailure::Fenced(_) => Verdict::Restart {
                backoff_ms: FENCED_RESTART_MS,
            },
            WorkerFailure::Unavailable(e) => {
                while self
                    .unavailable
                    .front()
                    .is_some_and(|t| now_ms.saturating_sub(*t) >= UNAVAILABLE_WINDOW_MS)
                {
                    self.unavailable.pop_front();
                }
                if self.unavailable.len() >= MAX_UNAVAILABLE_RESTARTS {
                    return Verdict::Stop {
                        reason: format!(
                            "{e}; gave up after {MAX_UNAVAILABLE_RESTARTS} restarts within {} s",
                            UNAVAILABLE_WINDOW_MS / 1000
                        ),
                    };
                }
                // Doubling from 500 ms to 30 s with each restart in the window.
                let backoff_ms = (500u64 << self.unavailable.len().min(6)).min(30_000);
                self.unavailable.push_back(now_ms);
                Verdict::Restart { backoff_ms }
            }
            WorkerFailure::Core(CoreError::VnodeBitmapUpdateDuringLogStore) => {
                if self.config.policy == RecreationPolicy::Fail {
                    return Verdict::Stop {
                        reason: format!(
                            "{}; recreation policy is `fail`",
                            CoreError::VnodeBitmapUpdateDuringLogStore
                        ),
                    };
                }
                if self.recreated_from.is_some_and(|g| generation <= g) {
                    // Another worker's failure from this generation already recreated the job.
                    return Verdict::Restart {
                        backoff_ms: FENCED_RESTART_MS,
                    };
                }
                while self
                    .recreations
                    .front()
                    .is_some_and(|t| now_ms.saturating_sub(*t) >= self.config.window_ms)
                {
                    self.recreations.pop_front();
                }
                let recent = self.recreations.len() as u32;
                if recent >= self.config.max_recreations {
                    return Verdict::Stop {
                        reason: format!(
                            "{}; gave up after {recent} recreations within {} s (max_recreations = {})",
                            CoreError::VnodeBitmapUpdateDuringLogStore,
                            self.config.window_ms / 1000,
                            self.config.max_recreations
                        ),
                    };
                }
                let backoff_ms = self
                    .config
                    .backoff_initial_ms
                    .saturating_mul(1u64 << recent.min(20))
                    .min(self.config.backoff_max_ms);
                self.recreated_from = Some(generation);
                Verdict::Recreate {
                    from_generation: generation,
                    backoff_ms,
                }
            }
            WorkerFailure::Core(other) => Verdict::Stop {
                reason: other.to_string(),
            },
            WorkerFailure::Fatal(reason) => Verdict::Stop {
                reason: reason.clone(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bitmap() -> WorkerFailure {
        WorkerFailure::Core(CoreError::VnodeBitmapUpdateDuringLogStore)
    }

    #[test]
    fn recreates_with_doubling_backoff_then_stops_at_the_cap() {
        let mut s = Supervisor::new(SupervisorConfig {
            max_recreations: 3,
            window_ms: 10_000,
            backoff_initial_ms: 100,
            backoff_max_ms: 250,
            ..Default::default()
        });
        let v: Vec<Verdict> = (0..4)
            .map(|i| {
                let v = s.on_failure(&bitmap(), i, i * 10);
                s.recreation_outcome(matches!(v, Verdict::Recreate { .. }), i * 10);
                v
            })
            .collect();
        assert_eq!(
            v[..3],
            [
                Verdict::Recreate {
                    from_generation: 0,
                    backoff_ms: 100
                },
                Verdict::Recreate {
                    from_generation: 1,
                    backoff_ms: 200
                },
                Verdict::Recreate {
                    from_generation: 2,
                    backoff_ms: 250
                },
            ]
        );
        match &v[3] {
            Verdict::Stop { reason } => assert!(
                reason.starts_with("should not update vnode bitmap during consuming log store; gave up after 3 recreations"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
        // The window slides: later failures may recreate again.
        assert!(matches!(
            s.on_failure(&bitmap(), 3, 20_000),
            Verdict::Recreate { .. }
        ));
        s.recreation_outcome(true, 20_000);
        assert_eq!(s.recreations(), 4);
    }

    #[test]
    fn one_rebalance_seen_by_many_workers_is_one_recreation() {
        let mut s = Supervisor::new(SupervisorConfig {
            max_recreations: 1,
            backoff_initial_ms: 100,
            ..Default::default()
        });
        // The first worker's failure from generation 4 decides the recreation 4 -> 5 ...
        assert_eq!(
            s.on_failure(&bitmap(), 4, 0),
            Verdict::Recreate {
                from_generation: 4,
                backoff_ms: 100
            }
        );
        s.recreation_outcome(true, 0);
        // ... three more workers of the same (failed) generation only restart under generation 5,
        // however late their failure is handled, and the cap of 1 is not used up by them.
        for at in [1, 2, 5_000] {
            assert_eq!(
                s.on_failure(&bitmap(), 4, at),
                Verdict::Restart {
                    backoff_ms: FENCED_RESTART_MS
                }
            );
        }
        assert_eq!(s.recreations(), 1);
        // A failure of an even older executor is no new rebalance either.
        assert!(matches!(
            s.on_failure(&bitmap(), 3, 6_000),
            Verdict::Restart { .. }
        ));
        // A rebalance of generation 5 is a new one: the cap of 1 stops it.
        assert!(matches!(
            s.on_failure(&bitmap(), 5, 7_000),
            Verdict::Stop { .. }
        ));
    }

    #[test]
    fn a_recreation_another_process_applied_is_not_counted_here() {
        let mut s = Supervisor::new(SupervisorConfig {
            max_recreations: 1,
            ..Default::default()
        });
        assert!(matches!(
            s.on_failure(&bitmap(), 0, 0),
            Verdict::Recreate { .. }
        ));
        // The compare-and-set found generation 1 already: the other process recreated.
        s.recreation_outcome(false, 0);
        assert_eq!(s.recreations(), 0);
        // This process may still recreate once from the next generation.
        assert!(matches!(
            s.on_failure(&bitmap(), 1, 10),
            Verdict::Recreate {
                from_generation: 1,
                ..
            }
        ));
    }

    #[test]
    fn fail_policy_stops_and_other_errors_stop_and_fencing_restarts() {
        let mut s = Supervisor::new(SupervisorConfig {
            policy: RecreationPolicy::Fail,
            ..Default::default()
        });
        assert!(matches!(
            s.on_failure(&bitmap(), 0, 0),
            Verdict::Stop { .. }
        ));
        let mut s = Supervisor::new(SupervisorConfig::default());
        let decode = WorkerFailure::Core(CoreError::Undecodable {
            topic: "t".into(),
            partition: 1,
            offset: 7,
            reason: "truncated".into(),
        });
        assert_eq!(
            s.on_failure(&decode, 0, 0),
            Verdict::Stop {
                reason: "record at topic t partition 1 offset 7 does not decode: truncated".into()
            }
        );
        assert_eq!(
            s.on_failure(&WorkerFailure::Fenced("stale".into()), 0, 0),
            Verdict::Restart {
                backoff_ms: FENCED_RESTART_MS
            }
        );
    }

    #[test]
    fn an_unavailable_store_restarts_with_doubling_backoff_then_stops() {
        let mut s = Supervisor::new(SupervisorConfig::default());
        let down = WorkerFailure::Unavailable("state store unavailable: connection refused".into());
        let waits: Vec<u64> = (0..MAX_UNAVAILABLE_RESTARTS as u64)
            .map(|i| match s.on_failure(&down, 0, i * 1_000) {
                Verdict::Restart { backoff_ms } => backoff_ms,
                other => panic!("restart {i}: {other:?}"),
            })
            .collect();
        assert_eq!(waits[..4], [500, 1_000, 2_000, 4_000]);
        assert!(waits.iter().all(|w| *w <= 30_000));
        match s.on_failure(&down, 0, 20_000) {
            Verdict::Stop { reason } => assert!(
                reason.starts_with("state store unavailable: connection refused; gave up after 10"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
        // Restarts age out of the window.
        assert!(matches!(
            s.on_failure(&down, 0, 20_000 + UNAVAILABLE_WINDOW_MS),
            Verdict::Restart { .. }
        ));
    }
}
