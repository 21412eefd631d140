//! Restarts that do not rebalance: two processes share a job in the log-store phase; one is stopped
//! with SIGTERM and started again within `session.timeout.ms`. With static membership
//! (`group.instance.id`) the group keeps its partitions — no vnode-bitmap update, no recreation; without
//! it the restart is a rebalance and the documented recreation follows. Both end exactly equal to
//! `verify`'s expectation. Checked on the bundled librdkafka and the real broker.

use crate::support;

use std::time::Duration;

use support::{serial, Fixture, Runner};

const MIN: Duration = Duration::from_secs(60);

/// How a fixture's processes join the group.
#[derive(Clone, Copy, PartialEq)]
enum Ids {
    /// `group.instance.id` read from `KB_INSTANCE`.
    Configured,
    /// Nothing configured: `run --worker-prefix P` is the static member `P-<index>`.
    ByPrefix,
    /// `group.instance.id = ""`: dynamic membership.
    Off,
}

fn fixture(name: &str, ids: Ids) -> Fixture {
    let f = Fixture::new(name, 1, "max_rows_per_second = 2500");
    let text = std::fs::read_to_string(&f.config).unwrap();
    let kafka = match ids {
        Ids::Configured => {
            "\"session.timeout.ms\" = \"30000\"\n\"group.instance.id\" = \"${KB_INSTANCE}\""
        }
        Ids::ByPrefix => "\"session.timeout.ms\" = \"30000\"",
        Ids::Off => "\"session.timeout.ms\" = \"30000\"\n\"group.instance.id\" = \"\"",
    };
    std::fs::write(
        &f.config,
        text.replace("\"session.timeout.ms\" = \"6000\"", kafka),
    )
    .unwrap();
    produce(&f);
    f
}

/// The same under the consumer protocol of KIP-848 (the session timeout is the broker's
/// `group.consumer.session.timeout.ms`, 10 s in `scripts/kafka.sh`).
fn consumer_protocol_fixture(name: &str) -> Fixture {
    let f = Fixture::new(name, 1, "max_rows_per_second = 2500");
    f.edit_config(
        "\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n",
        "\"group.protocol\" = \"consumer\"\n\"group.instance.id\" = \"${KB_INSTANCE}\"\n",
    );
    produce(&f);
    f
}

fn produce(f: &Fixture) {
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
/// What was there when b was stopped.
struct BeforeRestart {
    recreations: i64,
    a_log_len: usize,
}

fn restart_b_mid_log_store(
    f: &Fixture,
    before_restart: Option<&str>,
    restart_as: &str,
) -> (Runner, Runner, BeforeRestart) {
    let mut a = spawn(f, "a", "a");
    let mut b = spawn(f, "b", "b");
    a.wait_for("partitions assigned", MIN);
    b.wait_for("partitions assigned", MIN);
    a.wait_for("to=\"log_store\"", 2 * MIN);
    b.wait_for("to=\"log_store\"", 2 * MIN);
    let before = BeforeRestart {
        recreations: f.sql::<i64>("SELECT recreations FROM kb_jobs")[0][0],
        a_log_len: a.log_text().len(),
    };
    b.signal("TERM");
    assert!(
        b.wait_exit(MIN).success(),
        "{}",
        support::tail(&b.log_text())
    );
    if let Some(line) = before_restart {
        a.wait_for(line, 2 * MIN);
    }
    let b2 = spawn(f, "b", restart_as);
    (a, b2, before)
}

#[test]
fn a_static_member_restarted_within_the_session_timeout_causes_no_rebalance() {
    let _g = serial();
    static_restart_is_no_rebalance(&fixture("staticid", Ids::Configured), "b2");
}

/// With nothing configured, `run --worker-prefix b` joins as the static member `b-0`: restarted
/// under the same prefix it is the same member, and the group keeps its partitions.
#[test]
fn a_process_restarted_under_its_worker_prefix_is_the_same_static_member() {
    let _g = serial();
    static_restart_is_no_rebalance(&fixture("prefixid", Ids::ByPrefix), "b");
}

#[test]
fn under_the_consumer_protocol_a_static_member_restart_causes_no_rebalance() {
    let _g = serial();
    static_restart_is_no_rebalance(&consumer_protocol_fixture("static848"), "b2");
}

/// Restarts b mid log store: from the restart on, a sees no vnode-bitmap update and the job is not
/// recreated. (Under the consumer protocol members join one by one, with no initial rebalance
/// delay: the second member's first assignment may itself land in the first's log store and recreate
/// the job before the restart — that is counted before, not after.)
fn static_restart_is_no_rebalance(f: &Fixture, restart_as: &str) {
    let (mut a, mut b, before) = restart_b_mid_log_store(f, None, restart_as);
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
    let after_restart = &log[before.a_log_len.min(log.len())..];
    for line in ["should not update vnode bitmap", "partitions revoked"] {
        assert!(
            !after_restart.contains(line),
            "{line} after the restart: {}",
            support::tail(after_restart)
        );
    }
    let recreations: Vec<Vec<i64>> = f.sql("SELECT recreations FROM kb_jobs");
    assert_eq!(recreations[0][0], before.recreations, "no recreation");
    let text = f.verify_eventually(MIN);
    assert!(text.contains(" 0 missing, 0 extra, 0 different"), "{text}");
}

#[test]
fn without_static_membership_the_restart_is_a_rebalance_and_the_job_is_recreated() {
    let _g = serial();
    let f = fixture("dynid", Ids::Off);
    let (mut a, mut b, _) = restart_b_mid_log_store(
        &f,
        Some("should not update vnode bitmap during consuming log store"),
        "b2",
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
