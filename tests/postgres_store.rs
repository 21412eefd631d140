//! The PostgreSQL store against a real PostgreSQL (`scripts/postgres.sh`): fencing, recreation, and
//! two processes sharing one job where one is frozen past its session timeout (a zombie).

mod support;

use std::process::Command;
use std::time::Duration;

use kafka_backfill::codec::TableSchema;
use kafka_backfill::core::{
    Checkpoint, CheckpointCause, Epoch, PartitionProgress, Row, RowMutation, VnodeProgress,
};
use kafka_backfill::ports::{SnapshotInfo, StateStore, StoreError};
use kafka_backfill::postgres_store::PostgresStore;
use support::{pg_url, serial, Fixture};

fn table() -> TableSchema {
    TableSchema::parse(
        kafka_backfill::workload::EXAMPLE_ROW_SCHEMA,
        &["id".to_string()],
    )
    .unwrap()
}

#[test]
fn fencing_recreation_and_partition_count_checks_in_postgres() {
    let url = pg_url();
    let job = format!("unit-{}", std::process::id());
    let tname = format!("accounts_unit_{}", std::process::id());
    let info = SnapshotInfo {
        snapshot_epoch: Epoch(1 << 16),
        vnode_count: 8,
        partition_count: 2,
        start: (0..2)
            .map(|p| PartitionProgress {
                partition: p,
                next_offset: 1,
                epoch: Epoch(2 << 16),
                streaming: false,
            })
            .collect(),
    };
    let t = table();
    let mut a = PostgresStore::open(&url, &tname, t.clone()).unwrap();
    let mut b = PostgresStore::open(&url, &tname, t.clone()).unwrap();
    a.ensure_job(&job, &info).unwrap();
    let datum = t
        .encode_row(&apache_avro::types::Value::Record(vec![
            ("id".into(), apache_avro::types::Value::Long(5)),
            (
                "owner".into(),
                apache_avro::types::Value::String("ann".into()),
            ),
            ("balance".into(), apache_avro::types::Value::Long(100)),
            ("version".into(), apache_avro::types::Value::Long(1)),
            (
                "payload".into(),
                apache_avro::types::Value::String("p".into()),
            ),
        ]))
        .unwrap();
    let key = t.key_of_datum(&datum).unwrap();
    let vnode = kafka_backfill::core::vnode_of(&key, 8);
    let p = kafka_backfill::core::PartitionMap::new(8, 2)
        .unwrap()
        .partition_of(vnode);
    let claim = a.claim(&job, 0, "a", &[p], &info).unwrap();
    let cp = Checkpoint {
        generation: 0,
        worker: "a".into(),
        cause: CheckpointCause::Local,
        epoch: None,
        leases: vec![(p, claim[0].lease)],
        rows: vec![RowMutation::Upsert {
            vnode,
            row: Row {
                key: key.clone(),
                value: datum.clone(),
            },
            offset: None,
        }],
        vnodes: vec![VnodeProgress {
            cursor: Some(key.clone()),
            row_count: 1,
            ..VnodeProgress::fresh(vnode, Epoch(1 << 16))
        }],
        partitions: vec![],
    };
    a.commit(&job, &cp).unwrap();
    a.commit(&job, &cp).unwrap_err(); // the cursor must increase: the same checkpoint twice is refused
    assert_eq!(a.rows(&job).unwrap().get(&key), Some(&datum));
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let bal: i64 = client
        .query_one(&format!("SELECT balance FROM {tname} WHERE id = 5"), &[])
        .unwrap()
        .get(0);
    assert_eq!(bal, 100, "rows are real columns");
    // b claims the partition: a's commit is rejected and changes nothing.
    b.claim(&job, 0, "b", &[p], &info).unwrap();
    let mut stale = cp.clone();
    stale.rows = vec![RowMutation::Delete {
        vnode,
        key: key.clone(),
    }];
    stale.vnodes.clear();
    assert!(matches!(
        a.commit(&job, &stale),
        Err(StoreError::NotOwner { .. })
    ));
    assert_eq!(a.rows(&job).unwrap().len(), 1);
    // Recreation: one transaction, compare-and-set.
    assert_eq!(b.recreate(&job, 0).unwrap().generation, 1);
    assert_eq!(a.recreate(&job, 0).unwrap().generation, 1, "only once");
    assert!(a.rows(&job).unwrap().is_empty());
    assert!(matches!(
        a.commit(&job, &cp),
        Err(StoreError::StaleGeneration { .. })
    ));
    let mut other = info.clone();
    other.partition_count = 4;
    assert!(matches!(
        a.ensure_job(&job, &other),
        Err(StoreError::JobMismatch { .. })
    ));
}

#[test]
fn two_processes_share_postgres_and_a_frozen_zombie_is_fenced() {
    let _g = serial();
    let url = pg_url();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
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
    // ...when it freezes past its session timeout (6 s): the group gives its partitions to b.
    a.signal("STOP");
    b.wait_for_count("partitions assigned", 2, Duration::from_secs(60));
    a.signal("CONT");
    assert!(writer.wait_with_output().unwrap().status.success());
    // a wakes up a zombie: whatever it tries to commit for partitions it lost is rejected.
    a.wait_for("fenced", Duration::from_secs(60));
    let text = f.verify_eventually(Duration::from_secs(90));
    assert!(text.contains(" 0 missing, 0 extra, 0 different"), "{text}");
    a.signal("TERM");
    b.signal("TERM");
    a.wait_exit(Duration::from_secs(60));
    b.wait_exit(Duration::from_secs(60));
}

#[test]
fn kill_9_in_every_phase_on_postgres_then_restart_verifies_clean() {
    let _g = serial();
    let url = pg_url();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let f = Fixture::new(&format!("pgkill{stamp}"), 2, "max_rows_per_second = 5000");
    f.use_postgres(&url);
    support::kill_9_in_every_phase(&f);
}

#[test]
fn a_postgres_table_as_the_snapshot_source() {
    let _g = serial();
    let url = pg_url();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
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
