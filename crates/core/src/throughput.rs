//! How fast a worker goes and when it will have caught up: the smoothed rate, the lag, the ETA, the
//! throttle that holds a rows-per-second limit, and the adaptive cap (holding the commit latency p99 at a target) under
//! it. Pure functions of counts and a clock the driver
//! passes in; `/status`, the metrics and the loop all read them from here.

use crate::executor::{PartitionStatus, WorkerStatus};
use crate::phase::Phase;

impl PartitionStatus {
    /// Records between what is settled (committed, or carrying no data past it: transaction
    /// markers) and the log's end (`None` before the first watermark).
    pub fn lag(&self) -> Option<u64> {
        self.high_watermark
            .map(|h| h.saturating_sub(self.settled_offset))
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

/// Adaptive rate limiting: what to hold and within which bounds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AdaptiveConfig {
    /// Checkpoint commit latency (ms) the p99 is held under; `None`: not adaptive on latency. Each
    /// commit over it lowers the rate by a tenth, each under it raises it by a 199th of that (see
    /// `Adaptive`).
    pub target_commit_p99_ms: Option<f64>,
    /// Epoch lag (seconds) past which the rate is never lowered and is raised: freshness bounds how
    /// far the service may slow itself down.
    pub max_epoch_lag_secs: Option<f64>,
    /// The lowest rate it sets (records or rows per second).
    pub floor: u64,
    /// How often it decides, in ms (it needs some commits per window to judge).
    pub window_ms: u64,
}

impl AdaptiveConfig {
    pub fn enabled(&self) -> bool {
        self.target_commit_p99_ms.is_some() || self.max_epoch_lag_secs.is_some()
    }
}

/// Rate control on the worker's own checkpoint commit latency, holding its p99 under the target: a
/// cap on the rate that every commit over the target lowers by a tenth (`CUT`) and every commit under
/// it raises by a 199th of that — so the cap settles where 0.5 % of commits are over the target, and
/// the p99 under it. A lone slow commit (a WAL flush, a checkpoint of the database) costs a tenth, recovered over
/// the next hundred commits; many halve the cap at most per window, and the window after a cut cuts
/// nothing (its commits were mostly submitted at the old rate). With clear headroom
/// (`CLEAR_SAMPLES` commits in a row under 80 % of the target) the cap grows by the square root of
/// the room those commits leave (latency grows faster than the rate near a database's limit), up to
/// a quarter. Never below `floor`, never above the configured limit
/// (`ceiling`; 0 = none, and then the cap is lifted once it is twice what the worker does anyway).
/// Past `max_epoch_lag_secs` of epoch lag it is raised by a tenth per window, never lowered.
/// Decides once per window; the driver applies the cap under the live limits.
#[derive(Clone, Debug, PartialEq)]
pub struct Adaptive {
    cfg: AdaptiveConfig,
    /// The cap in force (`None`: none).
    cap: Option<f64>,
    samples: Vec<f64>,
    /// Commits in a row under 80 % of the target, and the slowest of them.
    clear: (usize, f64),
    /// The last window cut the cap.
    cooling: bool,
    window_start: Option<u64>,
}

/// The cut per commit over the target (the raise per commit under it is `CUT / 199`).
const CUT: f64 = 0.1;

/// Commits in a row under 80 % of the target that make clear headroom.
const CLEAR_SAMPLES: usize = 50;

impl Adaptive {
    pub fn new(cfg: AdaptiveConfig) -> Self {
        Adaptive {
            cfg,
            cap: None,
            samples: Vec::new(),
            clear: (0, 0.0),
            cooling: false,
            window_start: None,
        }
    }

    /// Whether it decides anything (a target or a lag bound is configured).
    pub fn enabled(&self) -> bool {
        self.cfg.enabled()
    }

    /// One committed checkpoint's latency.
    pub fn observe_commit(&mut self, ms: f64) {
        if self.cfg.enabled() {
            self.samples.push(ms);
        }
    }

    /// The cap in force (records or rows per second; `None`: none).
    pub fn cap(&self) -> Option<u64> {
        self.cap.map(|c| c.round() as u64)
    }

    /// At each housekeeping round: once a window is over, lower, raise or keep the cap from the
    /// window's commit latencies, the worker's epoch lag and its current rate. Returns the cap in
    /// force.
    pub fn decide(
        &mut self,
        now_ms: u64,
        observed_rate: f64,
        epoch_lag_secs: f64,
        ceiling: u64,
    ) -> Option<u64> {
        if !self.cfg.enabled() {
            return None;
        }
        let start = *self.window_start.get_or_insert(now_ms);
        if now_ms.saturating_sub(start) < self.cfg.window_ms {
            return self.cap();
        }
        self.window_start = Some(now_ms);
        let samples = std::mem::take(&mut self.samples);
        let floor = self.cfg.floor.max(1) as f64;
        let lag_over = self
            .cfg
            .max_epoch_lag_secs
            .is_some_and(|m| epoch_lag_secs > m);
        // The factor the window's commits ask for: the per-commit tracking of the p99, or the room
        // a clear run of commits leaves.
        let factor = match self.cfg.target_commit_p99_ms {
            Some(t) => {
                let over = samples.iter().filter(|&&ms| ms > t).count();
                let under = samples.len() - over;
                for &ms in &samples {
                    self.clear = if ms < 0.8 * t {
                        (self.clear.0 + 1, self.clear.1.max(ms))
                    } else {
                        (0, 0.0)
                    };
                }
                let tracked = ((1.0 - CUT).powi(over as i32)
                    * (1.0 + CUT / 199.0).powi(under as i32))
                .clamp(0.5, 1.25);
                if self.clear.0 >= CLEAR_SAMPLES {
                    let room = (0.8 * t / self.clear.1.max(1e-3)).sqrt().clamp(1.0, 1.25);
                    self.clear = (0, 0.0);
                    tracked.max(room)
                } else {
                    tracked
                }
            }
            // Only the lag bound: nothing to hold back for.
            None => 1.25,
        };
        let current = self
            .cap
            .unwrap_or(if ceiling > 0 {
                ceiling as f64
            } else {
                observed_rate
            })
            .max(floor);
        let next = if lag_over {
            // Freshness first: never slower, and a tenth faster.
            self.cap.map(|_| current * 1.1)
        } else if self.cooling {
            self.cap.map(|_| current * factor.max(1.0))
        } else if factor < 1.0 || self.cap.is_some() {
            Some((current * factor).max(floor))
        } else {
            None
        };
        self.cooling = matches!(next, Some(n) if n < current);
        self.cap = next.and_then(|next| {
            if ceiling > 0 && next >= ceiling as f64 {
                Some(ceiling as f64)
            } else if ceiling == 0 && next > 2.0 * observed_rate.max(floor) {
                None
            } else {
                Some(next)
            }
        });
        self.cap()
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

    /// A worker against a shared database whose commit latency grows with the worker's rate and
    /// with a competing load: `latency = 5 ms + rate / 1000 + load`. Simulated from `from` to `to`, a
    /// decision every 2 s, one commit every 100 ms.
    fn simulate(
        a: &mut Adaptive,
        ceiling: u64,
        demand: f64,
        load_ms: impl Fn(u64) -> f64,
        from: u64,
        to: u64,
    ) -> Vec<(u64, f64, f64)> {
        let mut out = Vec::new();
        let mut now = from;
        while now < to {
            // The worker goes as fast as its demand, its cap and the configured limit allow.
            let limit = match (a.cap(), ceiling) {
                (Some(c), _) => c as f64,
                (None, 0) => demand,
                (None, c) => c as f64,
            };
            let rate = limit.min(demand);
            let latency = 5.0 + rate / 1000.0 + load_ms(now);
            a.observe_commit(latency);
            a.decide(now, rate, 1.0, ceiling);
            out.push((now, rate, latency));
            now += 100;
        }
        out
    }

    /// The `p` quantile of `samples` (`None` when empty).
    fn percentile(mut samples: Vec<f64>, p: f64) -> Option<f64> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_by(|a, b| a.total_cmp(b));
        let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
        Some(samples[i])
    }

    fn config(target: f64) -> AdaptiveConfig {
        AdaptiveConfig {
            target_commit_p99_ms: Some(target),
            max_epoch_lag_secs: None,
            floor: 100,
            window_ms: 2_000,
        }
    }

    #[test]
    fn adaptive_holds_the_commit_latency_near_its_target_under_a_competing_load() {
        // Unloaded, 50k/s gives 55 ms; the target is 40 ms. From 60 s on, a competing load adds 20 ms.
        let mut a = Adaptive::new(config(40.0));
        let load = |now: u64| if now >= 60_000 { 20.0 } else { 0.0 };
        let run = simulate(&mut a, 0, 50_000.0, load, 0, 120_000);
        let p99 = |from: u64, to: u64| {
            percentile(
                run.iter()
                    .filter(|(t, _, _)| (from..to).contains(t))
                    .map(|(_, _, l)| *l)
                    .collect(),
                0.99,
            )
            .unwrap()
        };
        let mean_rate = |from: u64, to: u64| {
            let r: Vec<f64> = run
                .iter()
                .filter(|(t, _, _)| (from..to).contains(t))
                .map(|(_, r, _)| *r)
                .collect();
            r.iter().sum::<f64>() / r.len() as f64
        };
        // Settled before the load: under the target at most by one AIMD tooth, and busy.
        assert!(
            p99(20_000, 60_000) <= 40.0 * 1.15,
            "{}",
            p99(20_000, 60_000)
        );
        assert!(
            mean_rate(20_000, 60_000) > 15_000.0,
            "{}",
            mean_rate(20_000, 60_000)
        );
        // With the load it backs off further and still holds the target.
        assert!(
            p99(80_000, 120_000) <= 40.0 * 1.15,
            "{}",
            p99(80_000, 120_000)
        );
        assert!(
            mean_rate(80_000, 120_000) < mean_rate(20_000, 60_000),
            "it slowed down for the other load"
        );
        assert!(a.cap().unwrap() >= 100, "never below the floor");
    }

    /// Commits at `rate`: 5 ms + rate / 1000, and every `stall_every`-th one 200 ms (a WAL flush or
    /// a checkpoint of the database). Ten commits a second, a decision every second.
    fn noisy(a: &mut Adaptive, demand: f64, stall_every: u64, secs: u64) -> Vec<f64> {
        let mut rates = Vec::new();
        for i in 0..secs * 10 {
            let now = i * 100;
            let rate = a.cap().map_or(demand, |c| (c as f64).min(demand));
            let latency = if i % stall_every == stall_every - 1 {
                200.0
            } else {
                5.0 + rate / 1000.0
            };
            a.observe_commit(latency);
            a.decide(now, rate, 1.0, 0);
            rates.push(rate);
        }
        rates
    }

    #[test]
    fn a_lone_slow_commit_is_not_a_slow_database_but_many_are() {
        let cfg = AdaptiveConfig {
            window_ms: 1_000,
            ..config(40.0)
        };
        // 30k/s: 35 ms, under the 40 ms target; one commit in 300 stalls (under 0.5 %: the p99 holds).
        // A p99 over one window's ten commits would be the stall, and halve the rate each time.
        let mut a = Adaptive::new(cfg);
        let rates = noisy(&mut a, 30_000.0, 300, 120);
        let lowest = rates.iter().cloned().fold(f64::MAX, f64::min);
        let mean = rates.iter().sum::<f64>() / rates.len() as f64;
        assert!(
            lowest >= 0.85 * 30_000.0 && mean >= 0.93 * 30_000.0,
            "a lone stall costs a tenth at most: lowest {lowest}, mean {mean}"
        );
        // One commit in 20 stalls (5 %: the p99 is 200 ms): it backs off.
        let mut a = Adaptive::new(cfg);
        let rates = noisy(&mut a, 30_000.0, 20, 120);
        assert!(
            rates.last().unwrap() < &10_000.0,
            "backed off: {}",
            rates.last().unwrap()
        );
    }

    #[test]
    fn adaptive_gives_back_the_rate_when_the_load_goes_and_respects_the_ceiling() {
        let mut a = Adaptive::new(config(40.0));
        let load = |now: u64| if now < 30_000 { 60.0 } else { 0.0 };
        let run = simulate(&mut a, 20_000, 50_000.0, load, 0, 300_000);
        let last = run.last().unwrap();
        assert_eq!(
            last.1, 20_000.0,
            "back at the configured limit once the load is gone"
        );
        assert!(
            run.iter().all(|(_, r, _)| *r <= 20_000.0),
            "never above the ceiling"
        );
        assert!(
            run.iter().any(|(_, r, _)| *r < 5_000.0),
            "it had backed off under the load"
        );
    }

    #[test]
    fn the_epoch_lag_bound_stops_the_slowdown_and_no_config_means_no_cap() {
        let mut a = Adaptive::new(AdaptiveConfig {
            max_epoch_lag_secs: Some(30.0),
            ..config(10.0)
        });
        a.observe_commit(100.0);
        assert_eq!(
            a.decide(0, 10_000.0, 1.0, 0),
            None,
            "the first window starts"
        );
        a.observe_commit(100.0);
        assert_eq!(
            a.decide(2_000, 10_000.0, 1.0, 0),
            Some(8_100),
            "two slow commits: a tenth off each"
        );
        for now in [4_000, 6_000] {
            for _ in 0..20 {
                a.observe_commit(100.0);
            }
            let cap = a.decide(now, 8_100.0, 1.0, 0);
            if now == 4_000 {
                assert_eq!(cap, Some(8_100), "the window after a cut cuts nothing");
            } else {
                assert_eq!(cap, Some(4_050), "many slow commits: halved, no more");
            }
        }
        a.observe_commit(100.0);
        assert_eq!(
            a.decide(8_000, 4_050.0, 45.0, 0),
            Some(4_455),
            "slow, but the epoch lag is past its bound: raised by a tenth"
        );
        let mut off = Adaptive::new(AdaptiveConfig::default());
        off.observe_commit(1_000.0);
        assert_eq!(off.decide(10_000, 1.0, 100.0, 0), None);
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
