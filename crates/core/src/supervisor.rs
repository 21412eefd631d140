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
//!
//! A recreation's workers restart together, at the end of its backoff: a worker of a generation
//! already recreated (its executor fenced, its own invariant error, its store briefly away) waits
//! until then too, and so does a worker that learns of another process's recreation
//! ([`WorkerFailure::Recreated`]; it waits the first backoff, as that process's workers do at
//! least). The backoff is when the group settles — a second process's members join one by one, a
//! rebalance each — so those later rebalances move partitions of no running executor. A sibling
//! restarted early would finish its snapshot and meet the next one in the log store: a second
//! recreation for one process joining.

use crate::Generation;
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
    /// new set. No error, no recreation (the executor decides; see `JobPolicy::reschedule`).
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
    /// The store rejected a commit: a partition claimed by someone else: restart from what is
    /// committed.
    Fenced(String),
    /// The job was recreated while this executor ran (the store is at `generation`, newer than the
    /// executor's): restart under it, when the recreation's workers do.
    Recreated {
        generation: Generation,
        detail: String,
    },
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
            WorkerFailure::Recreated { generation, detail } => write!(
                f,
                "fenced by the job's recreation (generation {generation}), restarting under it: {detail}"
            ),
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
        from_generation: Generation,
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
    recreated_from: Option<Generation>,
    /// When restarts for an unavailable store happened, within [`UNAVAILABLE_WINDOW_MS`].
    unavailable: VecDeque<u64>,
    /// When the newest recreation's workers restart (its backoff's end): a restart of a worker
    /// of a generation it recreated waits until then.
    restart_at_ms: u64,
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
            restart_at_ms: 0,
        }
    }

    /// When a recreation's workers restart, while that is still ahead of `now_ms`: a worker that
    /// starts before then waits for it as well.
    pub fn recreation_pending(&self, now_ms: u64) -> Option<u64> {
        (self.restart_at_ms > now_ms).then_some(self.restart_at_ms)
    }

    /// A restart's backoff: at least `backoff_ms`, and for a worker of a generation already
    /// recreated, until the recreation's workers restart.
    fn restart(&self, generation: Generation, backoff_ms: u64, now_ms: u64) -> Verdict {
        let recreated = self.recreated_from.is_some_and(|g| generation <= g);
        let wait = if recreated {
            self.restart_at_ms.saturating_sub(now_ms)
        } else {
            0
        };
        Verdict::Restart {
            backoff_ms: backoff_ms.max(wait),
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
    pub fn on_failure(
        &mut self,
        failure: &WorkerFailure,
        generation: Generation,
        now_ms: u64,
    ) -> Verdict {
        match failure {
            WorkerFailure::Fenced(_) => self.restart(generation, FENCED_RESTART_MS, now_ms),
            WorkerFailure::Recreated {
                generation: current,
                ..
            } => {
                let from = Generation(current.0.saturating_sub(1));
                if self.recreated_from.is_none_or(|g| g < from) {
                    // Another process recreated the job: its workers wait at least the first
                    // backoff; so do this one's.
                    self.recreated_from = Some(from);
                    self.restart_at_ms = now_ms.saturating_add(self.config.backoff_initial_ms);
                }
                self.restart(generation, FENCED_RESTART_MS, now_ms)
            }
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
                self.restart(generation, backoff_ms, now_ms)
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
                    return self.restart(generation, FENCED_RESTART_MS, now_ms);
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
                self.restart_at_ms = now_ms.saturating_add(backoff_ms);
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
                let v = s.on_failure(&bitmap(), crate::Generation(i), i * 10);
                s.recreation_outcome(matches!(v, Verdict::Recreate { .. }), i * 10);
                v
            })
            .collect();
        assert_eq!(
            v[..3],
            [
                Verdict::Recreate {
                    from_generation: crate::Generation(0),
                    backoff_ms: 100
                },
                Verdict::Recreate {
                    from_generation: crate::Generation(1),
                    backoff_ms: 200
                },
                Verdict::Recreate {
                    from_generation: crate::Generation(2),
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
            s.on_failure(&bitmap(), crate::Generation(3), 20_000),
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
            s.on_failure(&bitmap(), crate::Generation(4), 0),
            Verdict::Recreate {
                from_generation: crate::Generation(4),
                backoff_ms: 100
            }
        );
        s.recreation_outcome(true, 0);
        // ... three more workers of the same (failed) generation only restart under generation 5,
        // however late their failure is handled, and the cap of 1 is not used up by them.
        for at in [1, 2, 5_000] {
            assert_eq!(
                s.on_failure(&bitmap(), crate::Generation(4), at),
                Verdict::Restart {
                    backoff_ms: FENCED_RESTART_MS
                }
            );
        }
        assert_eq!(s.recreations(), 1);
        // A failure of an even older executor is no new rebalance either.
        assert!(matches!(
            s.on_failure(&bitmap(), crate::Generation(3), 6_000),
            Verdict::Restart { .. }
        ));
        // A rebalance of generation 5 is a new one: the cap of 1 stops it.
        assert!(matches!(
            s.on_failure(&bitmap(), crate::Generation(5), 7_000),
            Verdict::Stop { .. }
        ));
    }

    /// A recreation's workers restart together at its backoff's end: a sibling whose executor was
    /// fenced by it, raised the same error or found the store away waits until then; a worker of the
    /// new generation does not; another process's recreation makes this one's workers wait the
    /// first backoff.
    #[test]
    fn the_workers_of_a_recreated_generation_restart_when_the_recreation_does() {
        let mut s = Supervisor::new(SupervisorConfig {
            backoff_initial_ms: 3_000,
            ..Default::default()
        });
        assert_eq!(
            s.on_failure(&bitmap(), crate::Generation(0), 10_000),
            Verdict::Recreate {
                from_generation: crate::Generation(0),
                backoff_ms: 3_000
            }
        );
        s.recreation_outcome(true, 10_000);
        let recreated = WorkerFailure::Recreated {
            generation: crate::Generation(1),
            detail: "commit from generation 0 rejected".into(),
        };
        let fenced = WorkerFailure::Fenced("lease 3 taken".into());
        let away = WorkerFailure::Unavailable("connection refused".into());
        for (f, at, wait) in [
            (&recreated, 10_100, 2_900),
            (&bitmap(), 11_000, 2_000),
            (&fenced, 12_500, 500),
            (&away, 12_800, 500),
            (&recreated, 12_900, FENCED_RESTART_MS),
        ] {
            assert_eq!(
                s.on_failure(f, crate::Generation(0), at),
                Verdict::Restart { backoff_ms: wait },
                "{f} at {at}"
            );
        }
        // A worker of the new generation fenced by a partition's new owner: no recreation to wait for.
        assert_eq!(
            s.on_failure(&fenced, crate::Generation(1), 10_500),
            Verdict::Restart {
                backoff_ms: FENCED_RESTART_MS
            }
        );
        // Another process recreated 1 -> 2: this one's workers of generation 1 wait its first backoff.
        let by_other = WorkerFailure::Recreated {
            generation: crate::Generation(2),
            detail: "commit from generation 1 rejected".into(),
        };
        assert_eq!(
            s.on_failure(&by_other, crate::Generation(1), 50_000),
            Verdict::Restart { backoff_ms: 3_000 }
        );
        assert_eq!(
            s.on_failure(&bitmap(), crate::Generation(1), 51_000),
            Verdict::Restart { backoff_ms: 2_000 },
            "the same rebalance seen here: no second recreation"
        );
        assert_eq!(s.recreations(), 1);
        assert_eq!(s.recreation_pending(51_000), Some(53_000));
        assert_eq!(s.recreation_pending(53_000), None);
    }

    #[test]
    fn a_recreation_another_process_applied_is_not_counted_here() {
        let mut s = Supervisor::new(SupervisorConfig {
            max_recreations: 1,
            ..Default::default()
        });
        assert!(matches!(
            s.on_failure(&bitmap(), crate::Generation(0), 0),
            Verdict::Recreate { .. }
        ));
        // The compare-and-set found generation 1 already: the other process recreated.
        s.recreation_outcome(false, 0);
        assert_eq!(s.recreations(), 0);
        // This process may still recreate once from the next generation.
        assert!(matches!(
            s.on_failure(&bitmap(), crate::Generation(1), 10),
            Verdict::Recreate {
                from_generation: crate::Generation(1),
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
            s.on_failure(&bitmap(), crate::Generation(0), 0),
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
            s.on_failure(&decode, crate::Generation(0), 0),
            Verdict::Stop {
                reason: "record at topic t partition 1 offset 7 does not decode: truncated".into()
            }
        );
        assert_eq!(
            s.on_failure(
                &WorkerFailure::Fenced("stale".into()),
                crate::Generation(0),
                0
            ),
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
            .map(
                |i| match s.on_failure(&down, crate::Generation(0), i * 1_000) {
                    Verdict::Restart { backoff_ms } => backoff_ms,
                    other => panic!("restart {i}: {other:?}"),
                },
            )
            .collect();
        assert_eq!(waits[..4], [500, 1_000, 2_000, 4_000]);
        assert!(waits.iter().all(|w| *w <= 30_000));
        match s.on_failure(&down, crate::Generation(0), 20_000) {
            Verdict::Stop { reason } => assert!(
                reason.starts_with("state store unavailable: connection refused; gave up after 10"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
        // Restarts age out of the window.
        assert!(matches!(
            s.on_failure(&down, crate::Generation(0), 20_000 + UNAVAILABLE_WINDOW_MS),
            Verdict::Restart { .. }
        ));
    }
}
