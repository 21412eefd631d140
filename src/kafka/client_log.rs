//! What Kafka clients say, each cause at most once a minute: librdkafka's log lines and its error
//! callbacks repeat one cause every few hundred milliseconds while a broker is away or refuses the
//! credentials (a wrong port once gave 14 s of identical warnings). A line is written the first
//! time its cause is seen in a minute; the repeats are counted and the next line written says how
//! many were left out. The cause is the text without its digits and without librdkafka's
//! "(after …)" suffix (so "after 0ms" and "after 3ms, 1 identical error(s) suppressed", or two
//! partitions' numbers, are one cause), and a log line and the error callback of one failure share
//! it: a refused password is written once, not by each of them.
//!
//! Owns the throttle only; what a line means (fatal, permanent) is decided by its caller.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::config::RDKafkaLogLevel;

/// A cause is written at most once in this long.
pub const EVERY: Duration = Duration::from_secs(60);

/// Causes remembered at once; past it the oldest minute is forgotten (a cause then written again).
const MAX_CAUSES: usize = 1024;

/// The causes seen, process-wide as the log itself is: cause → (last written, left out since).
static SEEN: OnceLock<Mutex<HashMap<String, (Instant, u64)>>> = OnceLock::new();

/// `Some(left out since the last one written)` when a line of this cause is to be written now;
/// `None` when it is a repeat within [`EVERY`] (counted).
pub fn admit(text: &str) -> Option<u64> {
    admit_at(text, Instant::now())
}

fn admit_at(text: &str, now: Instant) -> Option<u64> {
    // librdkafka's log lines start with the thread ("[thrd:…]: "), its error callbacks do not.
    let text = match text
        .strip_prefix("[thrd:")
        .and_then(|t| t.split_once("]: "))
    {
        Some((_, rest)) => rest,
        None => text,
    };
    let text = text.split(" (after ").next().unwrap_or(text);
    let cause: String = text.chars().filter(|c| !c.is_ascii_digit()).collect();
    let mut seen = SEEN.get_or_init(Default::default).lock().unwrap();
    if seen.len() >= MAX_CAUSES && !seen.contains_key(&cause) {
        seen.retain(|_, (at, _)| now.duration_since(*at) < EVERY);
    }
    match seen.get_mut(&cause) {
        Some((at, left_out)) if now.duration_since(*at) < EVERY => {
            *left_out += 1;
            None
        }
        Some((at, left_out)) => {
            let n = *left_out;
            (*at, *left_out) = (now, 0);
            Some(n)
        }
        None => {
            seen.insert(cause, (now, 0));
            Some(0)
        }
    }
}

/// A librdkafka log line (`ClientContext::log`), throttled, under the target `librdkafka` (so
/// `RUST_LOG=librdkafka=…` still picks its level).
pub fn log(level: RDKafkaLogLevel, fac: &str, message: &str) {
    let Some(left_out) = admit(message) else {
        return;
    };
    use RDKafkaLogLevel::*;
    match level {
        Emerg | Alert | Critical | Error => {
            tracing::error!(target: "librdkafka", left_out, "{fac} {message}")
        }
        Warning => tracing::warn!(target: "librdkafka", left_out, "{fac} {message}"),
        Notice | Info => tracing::info!(target: "librdkafka", left_out, "{fac} {message}"),
        Debug => tracing::debug!(target: "librdkafka", left_out, "{fac} {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_is_written_once_a_minute_and_then_says_how_many_were_left_out() {
        let t0 = Instant::now();
        let cause = "test-cause FAIL 127.0.0.1:1 refused (after 0ms)";
        assert_eq!(admit_at(cause, t0), Some(0));
        // The same cause with other numbers, within the minute: left out.
        assert_eq!(
            admit_at(
                "test-cause FAIL 127.0.0.1:1 refused (after 3ms)",
                t0 + Duration::from_secs(1)
            ),
            None
        );
        assert_eq!(admit_at(cause, t0 + Duration::from_secs(59)), None);
        // librdkafka's own repeat of it, its log line's form and its error callback's text: the
        // same cause.
        assert_eq!(
            admit_at(
                "[thrd:127.0.0.1:1/bootstrap]: test-cause FAIL 127.0.0.1:1 refused (after 1ms)",
                t0 + Duration::from_secs(2)
            ),
            None
        );
        assert_eq!(
            admit_at(
                "test-cause FAIL 127.0.0.1:1 refused (after 4ms in state CONNECT, 1 identical error(s) suppressed)",
                t0 + Duration::from_secs(2)
            ),
            None
        );
        // Another cause is its own.
        assert_eq!(
            admit_at("test-cause SASL authentication error", t0),
            Some(0)
        );
        // A minute on: written again, saying two were left out.
        assert_eq!(admit_at(cause, t0 + EVERY), Some(4));
        assert_eq!(admit_at(cause, t0 + EVERY + Duration::from_secs(1)), None);
    }
}
