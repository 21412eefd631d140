//! Carries out [`crate::core::retry::Backoff`] for blocking operations: retries `op` while it fails
//! with an error `transient` accepts and the policy leaves time, calling `wait` for each pause (a
//! sleep, or a loop that keeps a consumer polled).

use std::time::{Duration, Instant};

use crate::core::retry::Backoff;

/// Runs `op` under `policy`; returns its first success, its first permanent error, or its last
/// transient error once the deadline has passed.
pub fn retry<T, E>(
    policy: Backoff,
    mut op: impl FnMut() -> Result<T, E>,
    transient: impl Fn(&E) -> bool,
    mut wait: impl FnMut(Duration),
) -> Result<T, E> {
    let started = Instant::now();
    let mut attempt = 0;
    loop {
        match op() {
            Ok(v) => return Ok(v),
            Err(e) if transient(&e) => {
                attempt += 1;
                match policy.wait_before(attempt, started.elapsed().as_millis() as u64) {
                    Some(ms) => wait(Duration::from_millis(ms)),
                    None => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// [`retry`] with plain sleeps between attempts.
pub fn retry_sleeping<T, E>(
    policy: Backoff,
    op: impl FnMut() -> Result<T, E>,
    transient: impl Fn(&E) -> bool,
) -> Result<T, E> {
    retry(policy, op, transient, std::thread::sleep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_transient_errors_within_the_deadline_and_stops_on_permanent_ones() {
        let policy = Backoff {
            initial_ms: 1,
            max_ms: 2,
            deadline_ms: 50,
        };
        let mut n = 0;
        let r: Result<u32, &str> = retry_sleeping(
            policy,
            || {
                n += 1;
                if n < 3 {
                    Err("busy")
                } else {
                    Ok(n)
                }
            },
            |e| *e == "busy",
        );
        assert_eq!(r, Ok(3));
        let mut n = 0;
        let r: Result<(), &str> = retry_sleeping(
            policy,
            || {
                n += 1;
                Err("constraint")
            },
            |e| *e == "busy",
        );
        assert_eq!(
            (r, n),
            (Err("constraint"), 1),
            "a permanent error is not retried"
        );
        let started = Instant::now();
        let mut waits = Vec::new();
        let r: Result<(), &str> = retry(
            policy,
            || Err("busy"),
            |_| true,
            |d| {
                waits.push(d);
                std::thread::sleep(d)
            },
        );
        assert_eq!(r, Err("busy"));
        assert!(started.elapsed() < Duration::from_millis(200), "bounded");
        assert!(waits.len() > 5, "retried until the deadline: {waits:?}");
    }
}
