use super::*;

/// A snapshot of one partition and 256 vnodes.
fn one_partition() -> SnapshotInfo {
    SnapshotInfo {
        snapshot_epoch: Epoch(1 << 16),
        vnode_count: 256,
        partition_count: 1,
        start: vec![PartitionProgress {
            partition: 0,
            next_offset: 0,
            epoch: Epoch(2 << 16),
            streaming: false,
        }],
    }
}

fn table() -> TableSchema {
    TableSchema::parse(
        include_str!("../../../schemas/example_row.avsc"),
        &["id".to_string()],
    )
    .unwrap()
}

/// Stores of one file in a process share its checkpointer, so its gate holds back every job
/// writing the file while the WAL restarts (one gate per store let the other jobs starve the
/// restart); another file has its own, and a file opened again after its last store was
/// dropped gets a new one.
#[test]
fn jobs_sharing_a_file_share_its_checkpointer() {
    let dir = std::env::temp_dir().join(format!("kb-shared-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (one, other) = (dir.join("one.sqlite"), dir.join("other.sqlite"));
    let a = SqliteStore::open(&one, "accounts", table()).unwrap();
    let b = SqliteStore::open(&dir.join(".").join("one.sqlite"), "tellers", table()).unwrap();
    let c = SqliteStore::open(&other, "accounts", table()).unwrap();
    assert!(
        Arc::ptr_eq(&a.checkpointer, &b.checkpointer),
        "one file, one checkpointer"
    );
    assert!(!Arc::ptr_eq(&a.checkpointer, &c.checkpointer));
    // A gate closed by one job's restart holds the other job's commits too.
    a.checkpointer.gate.set(true);
    assert!(*b.checkpointer.gate.closed.lock().unwrap());
    a.checkpointer.gate.set(false);
    let was = Arc::downgrade(&a.checkpointer);
    drop((a, b));
    assert!(
        was.upgrade().is_none(),
        "stopped with the file's last store"
    );
    let d = SqliteStore::open(&one, "accounts", table()).unwrap();
    assert_eq!(Arc::strong_count(&d.checkpointer), 1);
    drop((c, d));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_wal_stays_bounded_under_continuous_commits() {
    use crate::core::{CheckpointCause, Row};
    let dir = std::env::temp_dir().join(format!("kb-wal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.sqlite");
    let t = table();
    // A restart past 1 MiB; 150 commits of ~200 scattered rows each write about 100 MiB of
    // frames if the WAL never starts over.
    let mut store = SqliteStore::open_with(
        &path,
        "accounts",
        t.clone(),
        SqliteOptions {
            restart_bytes: 1 << 20,
            // A checkpointer slower than the committer, as on a busy machine.
            checkpoint_pause: std::time::Duration::from_millis(20),
            ..SqliteOptions::default()
        },
    )
    .unwrap();
    let info = one_partition();
    store.ensure_job("j", &info).unwrap();
    let lease = store
        .claim("j", crate::core::Generation(0), "w", &[0], &info)
        .unwrap()[0]
        .lease;
    let mut rng = crate::rng::SimRng::new(3);
    // Made first, committed back to back (a committer behind its worker).
    let mut checkpoints = Vec::new();
    for r in 0..150u64 {
        let mut rows: Vec<RowMutation> = (0..200)
            .map(|_| {
                let id = rng.below(20_000) as i64;
                let datum = t
                    .encode_row(&crate::workload::example_row(id, r as i64, 100, &mut rng))
                    .unwrap();
                let key = t.key_of_datum(&datum).unwrap();
                RowMutation::Upsert {
                    vnode: crate::core::vnode_of(&key, 256),
                    row: Row { key, value: datum },
                    offset: None,
                }
            })
            .collect();
        rows.sort_by(|a, b| (a.vnode(), a.key()).cmp(&(b.vnode(), b.key())));
        rows.dedup_by(|a, b| a.key() == b.key());
        let epoch = Epoch((3 + r) << 16);
        let cp = Checkpoint {
            generation: crate::core::Generation(0),
            worker: "w".into(),
            cause: CheckpointCause::Barrier,
            epoch: Some(epoch),
            leases: vec![(0, lease)],
            rows,
            vnodes: vec![],
            partitions: vec![],
            dead_letters: Vec::new(),
            max_dead_letters: 0,
        };
        checkpoints.push(cp);
    }
    // The peak after any commit: the WAL must not grow by the commits made while the
    // checkpointer's round runs (CI, other tests on both cores: 34 MiB before the hold).
    let mut wal = 0;
    for cp in &checkpoints {
        store.commit("j", cp).unwrap();
        wal = wal.max(std::fs::metadata(dir.join("s.sqlite-wal")).unwrap().len());
    }
    drop(store);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        wal <= 16 << 20,
        "the WAL file reached {} MiB under a 1 MiB restart threshold",
        wal >> 20
    );
}

/// A file the store creates has 64 KiB pages; a file an earlier release made (SQLite's default
/// 4 KiB, in WAL mode) keeps its pages and takes the job's rows as before.
#[test]
fn new_files_get_64_kib_pages_and_existing_files_keep_theirs() {
    let dir = std::env::temp_dir().join(format!("kb-pages-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let page_size = |path: &std::path::Path| -> i64 {
        Connection::open(path)
            .unwrap()
            .pragma_query_value(None, "page_size", |r| r.get(0))
            .unwrap()
    };
    let fresh = dir.join("fresh.sqlite");
    drop(SqliteStore::open(&fresh, "accounts", table()).unwrap());
    assert_eq!(page_size(&fresh), PAGE_SIZE);
    let old = dir.join("old.sqlite");
    {
        let c = Connection::open(&old).unwrap();
        c.pragma_update(None, "journal_mode", "WAL").unwrap();
        c.execute_batch("CREATE TABLE earlier (x INTEGER)").unwrap();
    }
    assert_eq!(page_size(&old), 4096);
    let mut store = SqliteStore::open(&old, "accounts", table()).unwrap();
    let info = one_partition();
    store.ensure_job("j", &info).unwrap();
    drop(store);
    assert_eq!(
        page_size(&old),
        4096,
        "an existing file keeps its page size"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn busy_and_io_errors_are_transient_constraint_and_type_errors_are_permanent() {
    use rusqlite::ffi;
    let err = |code, msg: &str| {
        rusqlite::Error::SqliteFailure(ffi::Error::new(code), Some(msg.to_string()))
    };
    assert!(classify(err(ffi::SQLITE_BUSY, "database is locked")).is_transient());
    assert!(classify(err(ffi::SQLITE_IOERR, "disk I/O error")).is_transient());
    assert!(classify(err(ffi::SQLITE_FULL, "database or disk is full")).is_transient());
    let e = classify(err(
        ffi::SQLITE_CONSTRAINT_NOTNULL,
        "NOT NULL constraint failed: t.amount",
    ));
    assert!(
        !e.is_transient() && matches!(e, StoreError::Rejected { .. }),
        "{e}"
    );
    // SQLite's own error stays beneath it, by type; the operator's line says it once.
    let kept = std::error::Error::source(&e)
        .and_then(|c| c.downcast_ref::<rusqlite::Error>())
        .expect("the rusqlite error is the store error's source");
    assert_eq!(
        kept.sqlite_error_code(),
        Some(rusqlite::ErrorCode::ConstraintViolation)
    );
    assert_eq!(
        crate::error::chain_line(&e),
        "state store refused the checkpoint: NOT NULL constraint failed: t.amount"
    );
    assert!(!classify(err(ffi::SQLITE_MISMATCH, "datatype mismatch")).is_transient());
    // A constraint on a row names the column.
    let t = table();
    let e = row_error(
        err(
            ffi::SQLITE_CONSTRAINT_NOTNULL,
            "NOT NULL constraint failed: accounts.balance",
        ),
        &t,
        b"k",
    );
    assert!(
        matches!(&e, StoreError::Value { column, key, .. } if column == "balance" && key == "6b"),
        "{e}"
    );
}
