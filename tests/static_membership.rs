//! Restarts that do not rebalance: two processes share a job in the log-store phase; one is stopped
//! with SIGTERM and started again within `session.timeout.ms`. With static membership
//! (`group.instance.id`) the group keeps its partitions — no vnode-bitmap update, no recreation; without
//! it the restart is a rebalance and the documented recreation follows. Both end exactly equal to
//! `verify`'s expectation. Checked on the bundled librdkafka and the real broker.

mod support;

use std::time::Duration;

use support::{serial, Fixture, Runner};

const MIN: Duration = Duration::from_secs(60);

/// A fixture whose processes read `group.instance.id` (when `static_ids`) from `KB_INSTANCE`.
fn fixture(name: &str, static_ids: bool) -> Fixture {
    let f = Fixture::new(name, 1, "max_rows_per_second = 2500");
    let text = std::fs::read_to_string(&f.config).unwrap();
    let kafka = if static_ids {
        "\"session.timeout.ms\" = \"30000\"\n\"group.instance.id\" = \"${KB_INSTANCE}\""
    } else {
        "\"session.timeout.ms\" = \"30000\""
    };
    std::fs::write(
        &f.config,
        text.replace("\"session.timeout.ms\" = \"6000\"", kafka),
    )
    .unwrap();
    f.produce(&[
        "--partitions",
        "4",
        "--rows",
        "1000",
        "--changes",
        "40000",
        "--epoch-changes",
        "200",
    ]);
    f
}

/// Starts a process whose static id (when configured) is `instance`, logging to `<prefix>.log`.
fn spawn(f: &Fixture, instance: &str, prefix: &str) -> Runner {
    // The child inherits the variable its configuration refers to.
    std::env::set_var("KB_INSTANCE", instance);
    f.spawn_run(prefix, &["--exit-when-caught-up"])
}

/// Starts a and b, waits until both replay the log, restarts b, and returns both runners.
/// Stops `b` mid log store and starts it again as `b2`. With `before_restart`, waits for `a` to log
/// that line first (a dynamic member's leave is a rebalance of its own; started at once, `b2` could
/// join the same rebalance and take `b`'s partitions straight back, leaving `a` untouched).
fn restart_b_mid_log_store(f: &Fixture, before_restart: Option<&str>) -> (Runner, Runner) {
    let mut a = spawn(f, "a", "a");
    let mut b = spawn(f, "b", "b");
    a.wait_for("partitions assigned", MIN);
    b.wait_for("partitions assigned", MIN);
    a.wait_for("to=\"log_store\"", 2 * MIN);
    b.wait_for("to=\"log_store\"", 2 * MIN);
    b.signal("TERM");
    assert!(
        b.wait_exit(MIN).success(),
        "{}",
        support::tail(&b.log_text())
    );
    if let Some(line) = before_restart {
        a.wait_for(line, 2 * MIN);
    }
    let b2 = spawn(f, "b", "b2");
    (a, b2)
}

#[test]
fn a_static_member_restarted_within_the_session_timeout_causes_no_rebalance() {
    let _g = serial();
    let f = fixture("staticid", true);
    let (mut a, mut b) = restart_b_mid_log_store(&f, None);
    assert!(
        a.wait_exit(3 * MIN).success(),
        "{}",
        support::tail(&a.log_text())
    );
    assert!(
        b.wait_exit(3 * MIN).success(),
        "{}",
        support::tail(&b.log_text())
    );
    let log = a.log_text();
    assert!(
        !log.contains("should not update vnode bitmap"),
        "no bitmap update in the log store: {}",
        support::tail(&log)
    );
    let recreations: Vec<Vec<i64>> = f.sql("SELECT recreations FROM kb_jobs");
    assert_eq!(recreations[0][0], 0, "no recreation");
    let text = f.verify_eventually(MIN);
    assert!(text.contains(" 0 missing, 0 extra, 0 different"), "{text}");
}

#[test]
fn without_static_membership_the_restart_is_a_rebalance_and_the_job_is_recreated() {
    let _g = serial();
    let f = fixture("dynid", false);
    let (mut a, mut b) = restart_b_mid_log_store(
        &f,
        Some("should not update vnode bitmap during consuming log store"),
    );
    assert!(
        a.wait_exit(4 * MIN).success(),
        "{}",
        support::tail(&a.log_text())
    );
    assert!(
        b.wait_exit(4 * MIN).success(),
        "{}",
        support::tail(&b.log_text())
    );
    let recreations: Vec<Vec<i64>> = f.sql("SELECT recreations FROM kb_jobs");
    assert!(recreations[0][0] >= 1, "the documented recreation");
    let text = f.verify_eventually(MIN);
    assert!(text.contains(" 0 missing, 0 extra, 0 different"), "{text}");
}
