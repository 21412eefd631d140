//! Adaptive rate limiting on a real process and a real PostgreSQL: a competing writer that holds a
//! lock the worker's checkpoint commits need (a batch job on the same database) slows the commits
//! past `target_commit_p99_ms`; the worker lowers its own rate (the cap shows in `/status`); when
//! the competing writer stops, the cap rises again.

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::{alone, free_port, pg_url, status, wait_status, Fixture};

/// The first worker's phase and log-records limit in force.
fn phase_and_limit(w: &serde_json::Value) -> Option<(&str, u64)> {
    Some((
        w["phase"].as_str()?,
        w["rate_limits"]["log_records_per_second"].as_u64()?,
    ))
}

#[test]
fn a_competing_writer_slows_the_commits_and_the_worker_yields_then_recovers() {
    // Commit latencies against a target: no other test's processes on the two cores meanwhile.
    let _g = alone();
    let stamp = support::stamp();
    let f = Fixture::new(
        &format!("adaptive{stamp}"),
        1,
        "max_rows_per_second = 3000\n[jobs.rate_limit]\ntarget_commit_p99_ms = 100\nwindow_secs = 1\nmin_per_second = 100",
    );
    f.use_postgres(&pg_url());
    let addr = format!("127.0.0.1:{}", free_port());
    f.set_http(&addr);
    f.produce(&[
        "--partitions",
        "2",
        "--rows",
        "500",
        "--changes",
        // Enough that the log store outlasts the load and the recovery after it at 3,000/s.
        "150000",
        "--epoch-changes",
        "100",
    ]);
    let mut run = f.spawn_run("a", &[]);
    let minute = Duration::from_secs(60);
    wait_status(
        &addr,
        minute,
        "in the log store at the configured limit",
        |w| phase_and_limit(w) == Some(("log_store", 3000)),
    );
    // The competing writer: transactions that hold the vnode-progress table for 400 ms each.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&pg_url(), postgres::NoTls).unwrap();
            while !stop.load(Ordering::SeqCst) {
                c.batch_execute(
                    "BEGIN; LOCK TABLE kb_vnode_progress IN EXCLUSIVE MODE; SELECT pg_sleep(0.4); COMMIT;",
                )
                .unwrap();
            }
        })
    };
    wait_status(&addr, minute, "the worker lowered its rate", |w| {
        phase_and_limit(w).is_some_and(|(p, l)| p == "log_store" && l < 3000)
    });
    let lowered = phase_and_limit(&status(&addr)["jobs"][0]["workers"][0])
        .expect("a worker in /status")
        .1;
    stop.store(true, Ordering::SeqCst);
    load.join().unwrap();
    wait_status(
        &addr,
        minute,
        "the rate came back once the load stopped",
        |w| phase_and_limit(w).is_some_and(|(_, l)| l > lowered),
    );
    let log = run.log_text();
    assert!(
        log.contains("adaptive rate cap changed"),
        "{}",
        support::tail(&log)
    );
    run.signal("TERM");
    assert!(
        run.wait_exit(minute).success(),
        "{}",
        support::tail(&run.log_text())
    );
}
