//! How fast a worker goes and when it will have caught up: the smoothed rate, the lag, the ETA, and
//! the throttle that holds a rows-per-second limit. Pure functions of counts and a clock the driver
//! passes in; `/status`, the metrics and the loop all read them from here.

use crate::executor::{PartitionStatus, WorkerStatus};
use crate::phase::Phase;

impl PartitionStatus {
    /// Records between what is committed and the log's end (`None` before the first watermark).
    pub fn lag(&self) -> Option<u64> {
        self.high_watermark
            .map(|h| h.saturating_sub(self.committed_offset))
    }
}

impl WorkerStatus {
    /// Records behind over every owned partition with a known watermark.
    pub fn lag(&self) -> u64 {
        self.partitions.iter().filter_map(|p| p.lag()).sum()
    }

    /// Snapshot rows, log changes and barriers handled so far.
    pub fn handled(&self) -> u64 {
        self.counters.snapshot_rows
            + self.counters.changes.iter().sum::<u64>()
            + self.counters.barriers
    }

    /// Seconds until the lag is read at `per_second` (log phases only; 0 once caught up in streaming
    /// with no rate).
    pub fn catch_up_eta_seconds(&self, per_second: f64) -> Option<f64> {
        match self.phase {
            Phase::LogStore | Phase::Streaming if per_second > 0.0 => {
                Some(self.lag() as f64 / per_second)
            }
            Phase::Streaming => Some(0.0),
            _ => None,
        }
    }
}

/// Records per second, smoothed: a new sample every `window_ms` at least, folded in with weight 0.3.
#[derive(Clone, Debug, PartialEq)]
pub struct Rate {
    window_ms: u64,
    at_ms: u64,
    count: u64,
    per_second: f64,
}

impl Rate {
    pub fn new(now_ms: u64, window_ms: u64) -> Self {
        Rate {
            window_ms: window_ms.max(1),
            at_ms: now_ms,
            count: 0,
            per_second: 0.0,
        }
    }

    /// Takes the running total; returns the smoothed rate.
    pub fn observe(&mut self, now_ms: u64, total: u64) -> f64 {
        let dt = now_ms.saturating_sub(self.at_ms);
        if dt >= self.window_ms {
            let sample = total.saturating_sub(self.count) as f64 * 1000.0 / dt as f64;
            self.per_second = if self.per_second == 0.0 {
                sample
            } else {
                0.7 * self.per_second + 0.3 * sample
            };
            self.at_ms = now_ms;
            self.count = total;
        }
        self.per_second
    }

    pub fn per_second(&self) -> f64 {
        self.per_second
    }
}

/// A job's live rate limits, per worker (0 = none): snapshot rows and log records per second. Set
/// while the job runs (`kafka-backfill rate-limit`), kept in the store, read by every worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RateLimits {
    pub snapshot_rows_per_second: u64,
    pub log_records_per_second: u64,
}

impl RateLimits {
    /// Both limits the same (the `max_rows_per_second` setting).
    pub fn both(per_second: u64) -> Self {
        RateLimits {
            snapshot_rows_per_second: per_second,
            log_records_per_second: per_second,
        }
    }
}

/// A rows-per-second limit as a token bucket (burst: 50 ms worth, at least one record).
#[derive(Clone, Debug, PartialEq)]
pub struct Throttle {
    per_second: u64,
    tokens: f64,
    at_ms: u64,
}

impl Throttle {
    /// `per_second` = 0: unlimited.
    pub fn new(per_second: u64, now_ms: u64) -> Self {
        let mut t = Throttle {
            per_second,
            tokens: 0.0,
            at_ms: now_ms,
        };
        t.tokens = t.burst();
        t
    }

    fn burst(&self) -> f64 {
        (self.per_second as f64 / 20.0).max(1.0)
    }

    pub fn limit(&self) -> u64 {
        self.per_second
    }

    /// A new limit from now on; tokens already earned are kept up to the new burst.
    pub fn set_limit(&mut self, per_second: u64, now_ms: u64) {
        if per_second == self.per_second {
            return;
        }
        self.allowance(now_ms, 0);
        self.per_second = per_second;
        self.tokens = self.tokens.min(self.burst());
    }

    /// How many records may be handled now, at most `want`.
    pub fn allowance(&mut self, now_ms: u64, want: usize) -> usize {
        if self.per_second == 0 {
            self.tokens = self.burst();
            return want;
        }
        let dt = now_ms.saturating_sub(self.at_ms) as f64;
        self.at_ms = now_ms.max(self.at_ms);
        self.tokens = (self.tokens + dt * self.per_second as f64 / 1000.0).min(self.burst());
        (self.tokens.floor() as usize).min(want)
    }

    /// Records handled (may exceed the allowance by a few: a round finishes its record).
    pub fn spend(&mut self, n: usize) {
        self.tokens -= n as f64;
    }

    /// How long until at least one record may be handled (0 when one may now, or unlimited).
    pub fn wait_ms(&self) -> u64 {
        if self.per_second == 0 || self.tokens >= 1.0 {
            return 0;
        }
        ((1.0 - self.tokens) * 1000.0 / self.per_second as f64).ceil() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_sampled_per_window_and_smoothed() {
        let mut r = Rate::new(0, 500);
        assert_eq!(r.observe(100, 1_000), 0.0, "no full window yet");
        assert_eq!(r.observe(500, 1_000), 2_000.0, "1,000 in 0.5 s");
        // The next window runs at 4,000/s: 0.7 × 2,000 + 0.3 × 4,000.
        assert_eq!(r.observe(1_000, 3_000), 2_600.0);
        assert_eq!(r.per_second(), 2_600.0);
        assert_eq!(
            r.observe(1_200, 9_000),
            2_600.0,
            "inside a window nothing changes"
        );
    }

    #[test]
    fn the_throttle_holds_its_limit_over_a_simulated_second() {
        let mut t = Throttle::new(1_000, 0);
        let mut handled = 0;
        let mut now = 0;
        while now < 1_000 {
            let n = t.allowance(now, 10_000);
            t.spend(n);
            handled += n;
            now += t.wait_ms().max(1);
        }
        // One burst (50) up front, then 1,000/s.
        assert!((1_000..=1_050).contains(&handled), "{handled}");
        assert_eq!(t.limit(), 1_000);
    }

    #[test]
    fn a_limit_changed_mid_run_holds_from_then_on() {
        let mut t = Throttle::new(1_000, 0);
        let run = |t: &mut Throttle, from: u64, to: u64| {
            let (mut handled, mut now) = (0, from);
            while now < to {
                let n = t.allowance(now, 10_000);
                t.spend(n);
                handled += n;
                now += t.wait_ms().max(1);
            }
            handled
        };
        let first = run(&mut t, 0, 1_000);
        t.set_limit(100, 1_000);
        let second = run(&mut t, 1_000, 2_000);
        assert!((1_000..=1_050).contains(&first), "{first}");
        assert!((95..=110).contains(&second), "{second} at 100/s");
        t.set_limit(0, 2_000);
        assert_eq!(t.allowance(2_000, 777), 777, "0 lifts the limit");
        assert_eq!(RateLimits::both(5).log_records_per_second, 5);
    }

    #[test]
    fn an_unlimited_throttle_never_waits() {
        let mut t = Throttle::new(0, 0);
        assert_eq!(t.allowance(0, 123), 123);
        t.spend(10_000);
        assert_eq!(t.wait_ms(), 0);
    }

    #[test]
    fn an_empty_bucket_says_how_long_to_wait() {
        let mut t = Throttle::new(100, 0);
        let n = t.allowance(0, 1_000);
        assert_eq!(n, 5, "burst: 50 ms of 100/s");
        t.spend(n);
        assert_eq!(t.allowance(0, 1_000), 0);
        assert_eq!(t.wait_ms(), 10, "one record every 10 ms");
        assert_eq!(t.allowance(10, 1_000), 1);
    }
}
