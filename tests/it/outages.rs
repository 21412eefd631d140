//! Outages survived, on real processes: PostgreSQL stopped and started again, and the Kafka broker
//! halted for 20 s, both in the middle of the log-store phase. The job resumes and ends exactly
//! equal to `verify`'s expectation; the outage shows in `/status` and a metric while it lasts.
//! `check-log` met by a broker outage waits it out too; so does the capture, through a PostgreSQL
//! restart and a broker halt.
//!
//! These tests stop the broker and PostgreSQL every other test shares: `scripts/test.sh` runs this
//! module alone, after the rest (`cargo test --test it -- --skip outages::`, then `outages::`).

use crate::support;

use std::time::Duration;

use support::{free_port, http_get, pg_url, script, serial, status, wait_status, Fixture};

use crate::capture_e2e::{
    assert_exact, capture_fixture, database, pgbench_init, pgbench_run, spawn_capture,
    stop_capture, wait_child, MIN as CMIN,
};

const MIN: Duration = Duration::from_secs(60);

#[test]
fn postgres_stopped_and_started_mid_log_store_then_verify_is_exact() {
    let _g = serial();
    let url = pg_url();
    let stamp = support::stamp();
    let f = Fixture::new(&format!("pgout{stamp}"), 1, "max_rows_per_second = 4000");
    f.use_postgres(&url);
    let addr = format!("127.0.0.1:{}", free_port());
    f.set_http(&addr);
    f.produce(&[
        "--partitions",
        "2",
        "--rows",
        "1000",
        "--changes",
        "40000",
        "--epoch-changes",
        "200",
    ]);
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    run.wait_for("to=\"log_store\"", 2 * MIN);
    script("postgres.sh", "stop");
    // Observed, not slept on: the worker reports the store unreachable and /readyz turns 503.
    wait_status(&addr, MIN, "store unreachable", |w| {
        w["store_reachable"] == false
    });
    let (code, _) = http_get(&format!("http://{addr}/readyz"));
    assert_eq!(code, 503, "not ready while the store is away");
    let (_, metrics) = http_get(&format!("http://{addr}/metrics"));
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("kafka_backfill_store_unreachable{") && l.ends_with(" 1")),
        "the gauge shows the outage"
    );
    let s = status(&addr);
    let last_error = s["jobs"][0]["workers"][0]["last_error"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        last_error.contains("PostgreSQL") || last_error.contains("unavailable"),
        "last_error names the outage: {s}"
    );
    script("postgres.sh", "start");
    let status = run.wait_exit(3 * MIN);
    assert!(status.success(), "{}", support::tail(&run.log_text()));
    let out = f.verify();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(" 0 missing, 0 extra, 0 different"), "{text}");
}

#[test]
fn the_broker_halted_for_20_s_mid_log_store_then_verify_is_exact() {
    let _g = serial();
    let f = Fixture::new("kafkaout", 1, "max_rows_per_second = 4000");
    let addr = format!("127.0.0.1:{}", free_port());
    f.set_http(&addr);
    f.produce(&[
        "--partitions",
        "2",
        "--rows",
        "1000",
        "--changes",
        "40000",
        "--epoch-changes",
        "200",
    ]);
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    run.wait_for("to=\"log_store\"", 2 * MIN);
    script("kafka.sh", "halt");
    wait_status(&addr, MIN, "a Kafka error", |w| {
        w["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("Kafka: "))
    });
    let (_, metrics) = http_get(&format!("http://{addr}/metrics"));
    assert!(
        metrics.lines().any(
            |l| l.starts_with("kafka_backfill_kafka_client_errors_total{") && !l.ends_with(" 0")
        ),
        "the counter shows the outage"
    );
    // The outage lasts 20 s (the point of the test, not a synchronisation).
    std::thread::sleep(Duration::from_secs(20));
    script("kafka.sh", "resume");
    let status = run.wait_exit(3 * MIN);
    assert!(status.success(), "{}", support::tail(&run.log_text()));
    let out = f.verify();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(" 0 missing, 0 extra, 0 different"), "{text}");
}

/// `check-log` started while the broker is away waits for it (within its bound) and then checks the
/// whole log: a broker restart is not a failure of the log, nor of the check.
#[test]
fn check_log_started_while_the_broker_is_away_waits_for_it_and_passes() {
    let _g = serial();
    let f = Fixture::new("checkout", 1, "");
    f.produce(&[
        "--partitions",
        "2",
        "--rows",
        "300",
        "--changes",
        "2000",
        "--epoch-changes",
        "100",
    ]);
    script("kafka.sh", "halt");
    let mut check = f.spawn_subcommand("check", "check-log");
    // Observed: the check has met the outage and waits on.
    check.wait_for("Kafka client error", MIN);
    script("kafka.sh", "resume");
    let status = check.wait_exit(2 * MIN);
    let text = check.log_text();
    assert!(status.success(), "{}", support::tail(&text));
    assert!(text.contains(": 0 violations"), "{text}");
}

/// A PostgreSQL restart and a broker outage while the capture streams: each session that fails
/// resumes from the state Kafka holds, and the end is exact.
#[test]
fn a_postgres_restart_and_a_broker_outage_mid_stream_stay_exact() {
    let _serial = serial();
    let source = database("cap-outage");
    let url = source.url.clone();
    pgbench_init(&url);
    let f = capture_fixture("cap-outage", &url, "public.pgbench_accounts");
    let mut capture = spawn_capture(&f, "capture");
    capture.wait_for("capture checkpoint committed", CMIN);
    let mut run = f.spawn_run("r", &[]);
    let mut bench = pgbench_run(&f, &url, 100, 4);
    wait_child(&mut bench, CMIN);
    script("postgres.sh", "restart");
    capture.wait_for("capture session failed", CMIN);
    let before = capture
        .log_text()
        .matches("capture checkpoint committed")
        .count();
    capture.wait_for_count("capture checkpoint committed", before + 3, CMIN);
    let mut bench = pgbench_run(&f, &url, 100, 4);
    wait_child(&mut bench, CMIN);
    script("kafka.sh", "halt");
    capture.wait_for_count("capture session failed", 2, CMIN);
    // The outage lasts 10 s (the point of the test, not a synchronisation); pgbench writes on.
    let mut bench = pgbench_run(&f, &url, 100, 10);
    wait_child(&mut bench, CMIN);
    script("kafka.sh", "resume");
    let before = capture
        .log_text()
        .matches("capture checkpoint committed")
        .count();
    capture.wait_for_count("capture checkpoint committed", before + 3, 2 * CMIN);
    assert_exact(&f, 10_000, 2 * CMIN);
    run.signal("TERM");
    run.wait_exit(CMIN);
    stop_capture(&mut capture);
}
