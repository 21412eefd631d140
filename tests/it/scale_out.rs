//! Scaling a running backfill on real processes (real Kafka, the PostgreSQL store, dynamic
//! membership): 1 → 3 processes during the snapshot phase, one of them killed with `kill -9` in the
//! log store (3 → 2), then 2 → 4 while the others are mid log store; in the streaming phase, with
//! new changes arriving, 4 → 2 (two stop) and 2 → 3. Under
//! `recreation.policy = "reschedule"` no process raises the invariant error, the job is never
//! recreated, and the table ends exactly equal to `verify`'s expectation; the same schedule under
//! `recreate` recreates the job (the contrast) and ends exact too.

use crate::support;

use std::time::Duration;

use support::{pg_url, serial, tail, Fixture, Runner};

const MIN: Duration = Duration::from_secs(60);

/// Runs the schedule; returns every process's log and the job's recreations (from the store).
fn one_three_two_four(policy: &str) -> (Vec<String>, i64, Fixture) {
    let stamp = support::stamp();
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
    // Processes stay up into the streaming phase (no --exit-when-caught-up).
    let args: [&str; 0] = [];
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
    d.wait_for("partitions assigned", MIN);
    e.wait_for("partitions assigned", MIN);
    // The streaming phase: the whole job (every partition) streams, as the store records it.
    wait_job_phase(&f.name, "streaming", 5 * MIN);
    // New changes arrive while the group changes under them.
    let writer = f.append(&[
        "--changes",
        "12000",
        "--rate",
        "1500",
        "--seed",
        "7",
        "--key-space",
        "12000",
    ]);
    let assigned = |r: &Runner| r.log_text().matches("partitions assigned").count();
    let (a_before, b_before) = (assigned(&a), assigned(&b));
    // 4 → 2 in the streaming phase: two processes leave (graceful stop).
    for (name, r) in [("d", &mut d), ("e", &mut e)] {
        r.signal("TERM");
        assert!(
            r.wait_exit(MIN).success(),
            "process {name}: {}",
            tail(&r.log_text())
        );
    }
    // The survivors take over what d and e owned: they are assigned again.
    let deadline = std::time::Instant::now() + MIN;
    while assigned(&a) + assigned(&b) == a_before + b_before {
        assert!(
            std::time::Instant::now() < deadline,
            "nobody took over d's and e's partitions:\n{}",
            tail(&a.log_text())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // 2 → 3 in the streaming phase.
    let mut g = f.spawn_run("g", &args);
    g.wait_for("partitions assigned", MIN);
    let out = writer.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every change, the appended ones too, reaches the table while a, b and g stream.
    let text = f.verify_eventually(2 * MIN);
    assert!(text.contains(" 0 missing, 0 extra, 0 different"), "{text}");
    let mut survivors: Vec<(&str, &mut Runner)> = vec![("a", &mut a), ("b", &mut b), ("g", &mut g)];
    for (name, r) in survivors.iter_mut() {
        r.signal("TERM");
        assert!(
            r.wait_exit(MIN).success(),
            "process {name}: {}",
            tail(&r.log_text())
        );
    }
    let mut logs: Vec<String> = survivors.iter().map(|(_, r)| r.log_text()).collect();
    logs.extend([c.log_text(), d.log_text(), e.log_text()]);
    let mut pg = postgres::Client::connect(&pg_url(), postgres::NoTls).unwrap();
    let recreations: i64 = pg
        .query_one("SELECT recreations FROM kb_jobs WHERE job = $1", &[&f.name])
        .unwrap()
        .get(0);
    (logs, recreations, f)
}

/// Waits until the store's job row shows `phase`.
fn wait_job_phase(job: &str, phase: &str, within: Duration) {
    let mut pg = postgres::Client::connect(&pg_url(), postgres::NoTls).unwrap();
    let deadline = std::time::Instant::now() + within;
    loop {
        let now: Option<String> = pg
            .query_opt("SELECT phase FROM kb_jobs WHERE job = $1", &[&job])
            .unwrap()
            .map(|r| r.get(0));
        if now.as_deref() == Some(phase) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "job {job} not in {phase} within {within:?} (now {now:?})"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
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
