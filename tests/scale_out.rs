//! Scaling a running backfill on real processes (real Kafka, the PostgreSQL store, dynamic
//! membership): 1 → 3 processes during the snapshot phase, one of them killed with `kill -9` in the
//! log store (3 → 2), then 2 → 4 while the others are mid log store. Under
//! `recreation.policy = "reschedule"` no process raises the invariant error, the job is never
//! recreated, and the table ends exactly equal to `verify`'s expectation; the same schedule under
//! `recreate` recreates the job (the contrast) and ends exact too.

mod support;

use std::time::Duration;

use support::{pg_url, serial, tail, Fixture, Runner};

const MIN: Duration = Duration::from_secs(60);

/// Runs the schedule; returns every process's log and the job's recreations (from the store).
fn one_three_two_four(policy: &str) -> (Vec<String>, i64, Fixture) {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    // Throttled so that every phase lasts while processes come and go.
    let f = Fixture::new(
        &format!("scale{policy}{stamp}"),
        1,
        "max_rows_per_second = 2500",
    );
    f.use_postgres(&pg_url());
    f.set_recreation_policy(policy);
    f.produce(&[
        "--partitions",
        "4",
        "--rows",
        "6000",
        "--changes",
        "40000",
        "--epoch-changes",
        "200",
    ]);
    let args = ["--exit-when-caught-up"];
    let mut a = f.spawn_run("a", &args);
    a.wait_for("to=\"snapshot\"", MIN);
    // 1 → 3 during the snapshot.
    let mut b = f.spawn_run("b", &args);
    let mut c = f.spawn_run("c", &args);
    c.wait_for("partitions assigned", MIN);
    // 3 → 2: the third process dies in the log store.
    c.wait_for("to=\"log_store\"", 2 * MIN);
    c.wait_for("cause=Barrier", MIN);
    c.signal("KILL");
    c.wait_exit(MIN);
    assert_eq!(
        support::phase_at_death(&c.log_text()),
        "log_store",
        "killed in the log store"
    );
    // 2 → 4 while the others replay the log.
    let mut d = f.spawn_run("d", &args);
    let mut e = f.spawn_run("e", &args);
    let mut survivors: Vec<(&str, &mut Runner)> =
        vec![("a", &mut a), ("b", &mut b), ("d", &mut d), ("e", &mut e)];
    for (name, r) in survivors.iter_mut() {
        assert!(
            r.wait_exit(5 * MIN).success(),
            "process {name}: {}",
            tail(&r.log_text())
        );
    }
    let text = f.verify_eventually(MIN);
    assert!(text.contains(" 0 missing, 0 extra, 0 different"), "{text}");
    let mut logs: Vec<String> = survivors.iter().map(|(_, r)| r.log_text()).collect();
    logs.push(c.log_text());
    let mut pg = postgres::Client::connect(&pg_url(), postgres::NoTls).unwrap();
    let recreations: i64 = pg
        .query_one("SELECT recreations FROM kb_jobs WHERE job = $1", &[&f.name])
        .unwrap()
        .get(0);
    (logs, recreations, f)
}

#[test]
fn under_reschedule_one_three_two_four_processes_with_a_kill_9_recreate_nothing_and_verify() {
    let _g = serial();
    let (logs, recreations, _f) = one_three_two_four("reschedule");
    assert_eq!(recreations, 0, "no recreation under reschedule");
    for log in &logs {
        assert!(
            !log.contains("should not update vnode bitmap during consuming log store"),
            "no invariant error: {}",
            tail(log)
        );
    }
    assert!(
        logs.iter()
            .any(|l| l.contains("vnode bitmap updated during log store: rescheduled")),
        "a bitmap update reached the log store and was absorbed"
    );
}

#[test]
fn under_recreate_the_same_schedule_recreates_the_job_and_verifies() {
    let _g = serial();
    let (logs, recreations, _f) = one_three_two_four("recreate");
    assert!(recreations >= 1, "the contrast: the job was recreated");
    assert!(logs
        .iter()
        .any(|l| l.contains("should not update vnode bitmap during consuming log store")));
}
