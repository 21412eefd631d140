//! Adaptive rate limiting on a real process and a real PostgreSQL: a competing writer that holds a
//! lock the worker's checkpoint commits need (a batch job on the same database) slows the commits
//! past `target_commit_p99_ms`; the worker lowers its own rate (the cap shows in `/status`); when
//! the competing writer stops, the cap rises again.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{free_port, http_get, pg_url, serial, Fixture};

/// The first worker's phase and log-records limit in force, from `/status`.
fn worker(addr: &str) -> Option<(String, u64)> {
    let (_, s) = http_get(&format!("http://{addr}/status"));
    let v: serde_json::Value = serde_json::from_str(&s).ok()?;
    let w = &v["jobs"][0]["workers"][0];
    Some((
        w["phase"].as_str()?.to_string(),
        w["rate_limits"]["log_records_per_second"].as_u64()?,
    ))
}

fn wait(addr: &str, what: &str, within: Duration, ok: impl Fn(&str, u64) -> bool) {
    let t = Instant::now();
    loop {
        if let Some((phase, limit)) = worker(addr) {
            if ok(&phase, limit) {
                return;
            }
        }
        assert!(
            t.elapsed() < within,
            "{what}: the worker reports {:?}",
            worker(addr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_competing_writer_slows_the_commits_and_the_worker_yields_then_recovers() {
    let _g = serial();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
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
        "60000",
        "--epoch-changes",
        "100",
    ]);
    let mut run = f.spawn_run("a", &[]);
    let minute = Duration::from_secs(60);
    wait(
        &addr,
        "in the log store at the configured limit",
        minute,
        |p, l| p == "log_store" && l == 3000,
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
    wait(&addr, "the worker lowered its rate", minute, |p, l| {
        p == "log_store" && l < 3000
    });
    let (_, lowered) = worker(&addr).unwrap();
    stop.store(true, Ordering::SeqCst);
    load.join().unwrap();
    wait(
        &addr,
        "the rate came back once the load stopped",
        minute,
        |_, l| l > lowered,
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
