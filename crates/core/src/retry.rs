//! The one retry policy: every transient failure (a store or broker that is briefly away) is
//! retried with doubling backoff and a total deadline per operation; anything else fails at once.
//! Pure: it decides how long to wait, the caller waits (and keeps its consumer polled meanwhile).

/// Doubling backoff from `initial_ms` to `max_ms`, giving up once `deadline_ms` have passed since the
/// first attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub initial_ms: u64,
    pub max_ms: u64,
    pub deadline_ms: u64,
}

impl Backoff {
    /// A state-store transaction or connection (PostgreSQL reconnects, SQLite busy files).
    pub const STORE: Backoff = Backoff {
        initial_ms: 100,
        max_ms: 2_000,
        deadline_ms: 30_000,
    };
    /// No retry: one attempt.
    pub const ONCE: Backoff = Backoff {
        initial_ms: 0,
        max_ms: 0,
        deadline_ms: 0,
    };
    /// A consumer seek while the broker is briefly away.
    pub const SEEK: Backoff = Backoff {
        initial_ms: 50,
        max_ms: 1_000,
        deadline_ms: 10_000,
    };
    /// Waiting for metadata to show a topic.
    pub const METADATA: Backoff = Backoff {
        initial_ms: 100,
        max_ms: 1_000,
        deadline_ms: 15_000,
    };

    /// The wait before attempt `attempt` (1 = the first retry), or `None` once `elapsed_ms` since
    /// the first attempt leaves no time for it.
    pub fn wait_before(&self, attempt: u32, elapsed_ms: u64) -> Option<u64> {
        let wait = self
            .initial_ms
            .saturating_mul(1u64 << attempt.saturating_sub(1).min(20))
            .min(self.max_ms);
        (elapsed_ms.saturating_add(wait) < self.deadline_ms).then_some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_stops_at_the_deadline() {
        let b = Backoff {
            initial_ms: 100,
            max_ms: 400,
            deadline_ms: 1_000,
        };
        assert_eq!(b.wait_before(1, 0), Some(100));
        assert_eq!(b.wait_before(2, 100), Some(200));
        assert_eq!(b.wait_before(3, 300), Some(400));
        assert_eq!(b.wait_before(4, 500), Some(400), "capped");
        assert_eq!(b.wait_before(5, 700), None, "700 + 400 passes the deadline");
        assert_eq!(b.wait_before(60, 0), Some(400), "no overflow");
    }
}
