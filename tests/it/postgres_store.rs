//! The PostgreSQL store end to end against a real PostgreSQL (`scripts/postgres.sh`): two processes
//! sharing one job where one is frozen past its session timeout (a zombie), `kill -9` in every phase,
//! a PostgreSQL table as the snapshot source. The store's rules are in `tests/it/store_conformance.rs`.

use crate::support;

use std::process::Command;
use std::time::Duration;

use support::{pg_url, serial, Fixture};

#[test]
fn two_processes_share_postgres_and_a_frozen_zombie_is_fenced() {
    let _g = serial();
    let url = pg_url();
    let stamp = support::stamp();
    let f = Fixture::new(&format!("zombie{stamp}"), 1, "");
    f.use_postgres(&url);
    f.produce(&["--partitions", "4", "--rows", "2000", "--changes", "3000"]);
    let mut a = f.spawn_run("a", &[]);
    let mut b = f.spawn_run("b", &[]);
    a.wait_for("to=\"streaming\"", Duration::from_secs(120));
    b.wait_for("to=\"streaming\"", Duration::from_secs(120));
    // More changes with rare checkpoints, so that a holds complete but uncommitted epochs...
    let writer = f.append(&[
        "--changes",
        "6000",
        "--rate",
        "1000",
        "--seed",
        "5",
        "--key-space",
        "4000",
        "--epoch-changes",
        "40",
        "--checkpoint-every",
        "50",
    ]);
    // a has committed a checkpoint of the appended changes (so it is reading them), and the next
    // one is 50 epochs away...
    let committed = a.log_text().matches("cause=Barrier").count();
    a.wait_for_count("cause=Barrier", committed + 1, Duration::from_secs(60));
    // ...and the writer has written about 7 complete epochs since (about half a second), which a,
    // caught up, reads as they come: complete, not yet committed...
    let written = support::high_watermarks(&f, 4);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while support::high_watermarks(&f, 4) < written + 500 {
        assert!(std::time::Instant::now() < deadline, "the writer stalled");
        std::thread::sleep(Duration::from_millis(20));
    }
    // ...when it freezes past its session timeout (6 s): the group gives its partitions to b.
    a.signal("STOP");
    b.wait_for_count("partitions assigned", 2, Duration::from_secs(60));
    a.signal("CONT");
    assert!(writer.wait_with_output().unwrap().status.success());
    // a wakes up a zombie: whatever it tries to commit for partitions it lost is rejected.
    a.wait_for("fenced", Duration::from_secs(60));
    let text = f.verify_eventually(Duration::from_secs(90));
    assert!(text.contains(" 0 missing, 0 extra, 0 different"), "{text}");
    // Every store handle re-runs the DDL; its `IF NOT EXISTS` notices are not logged.
    for r in [&a, &b] {
        assert!(
            !r.log_text().contains("already exists, skipping"),
            "{}",
            support::tail(&r.log_text())
        );
    }
    a.signal("TERM");
    b.signal("TERM");
    a.wait_exit(Duration::from_secs(60));
    b.wait_exit(Duration::from_secs(60));
}

#[test]
fn kill_9_in_every_phase_on_postgres_then_restart_verifies_clean() {
    let _g = serial();
    let url = pg_url();
    let stamp = support::stamp();
    let f = Fixture::new(&format!("pgkill{stamp}"), 2, "max_rows_per_second = 5000");
    f.use_postgres(&url);
    support::kill_9_in_every_phase(&f);
}

#[test]
fn a_postgres_table_as_the_snapshot_source() {
    let _g = serial();
    let url = pg_url();
    let stamp = support::stamp();
    let f = Fixture::new(&format!("pgsnap{stamp}"), 2, "");
    f.produce(&["--partitions", "4", "--rows", "5000", "--changes", "5000"]);
    let snap = format!("snap_{stamp}");
    let out = Command::new(support::BIN)
        .args(["export-snapshot", "--from"])
        .arg(f.dir.join("out/snapshot"))
        .args(["--to-postgres", &url, "--name", &snap, "--table", &snap])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("exported 5000 rows"));
    f.use_postgres_snapshot(&url, &snap);
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    assert!(
        run.wait_exit(Duration::from_secs(120)).success(),
        "{}",
        support::tail(&run.log_text())
    );
    let out = f.verify();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // A snapshot name that does not exist is a clear error.
    std::fs::write(
        &f.config,
        std::fs::read_to_string(&f.config)
            .unwrap()
            .replace(&format!("name = \"{snap}\""), "name = \"nope\""),
    )
    .unwrap();
    let out = Command::new(support::BIN)
        .args(["run", "--config"])
        .arg(&f.config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no snapshot named nope in kb_snapshots"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
