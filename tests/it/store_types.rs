//! Every Avro type a row may use, through both SQL stores: the typed columns read back as docs/OPERATIONS.md's
//! "Column types" table says, and a value a store cannot hold (or a table it cannot write) is a
//! permanent error naming the column, never one to retry.

use crate::support;

use apache_avro::types::Value;
use kafka_backfill::codec::TableSchema;
use kafka_backfill::core::{
    vnode_of, Checkpoint, CheckpointCause, Epoch, PartitionProgress, Row, RowMutation,
};
use kafka_backfill::ports::{SnapshotInfo, StateStore, StoreError};
use kafka_backfill::store::postgres::PostgresStore;
use kafka_backfill::store::sqlite::SqliteStore;
use kafka_backfill::workload::{typed_row, TableKind};
use support::pg_url;

const V: u32 = 8;

fn info() -> SnapshotInfo {
    SnapshotInfo {
        snapshot_epoch: Epoch(1 << 16),
        vnode_count: V,
        partition_count: 1,
        start: vec![PartitionProgress {
            partition: 0,
            next_offset: 0,
            epoch: Epoch(2 << 16),
            streaming: false,
        }],
    }
}

/// Commits `rows` (row values of the typed table) in one checkpoint, as job `job`.
fn commit_rows(
    store: &mut dyn StateStore,
    table: &TableSchema,
    job: &str,
    rows: &[Value],
) -> Result<(), StoreError> {
    store.ensure_job(job, &info())?;
    let claim = store.claim(job, kafka_backfill::core::Generation(0), "w", &[0], &info())?;
    let mutations = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let datum = table.encode_row(r).unwrap();
            let key = table.key_of_datum(&datum).unwrap();
            RowMutation::Upsert {
                vnode: vnode_of(&key, V),
                row: Row { key, value: datum },
                offset: Some(i as u64),
            }
        })
        .collect();
    store.commit(
        job,
        &Checkpoint {
            generation: kafka_backfill::core::Generation(0),
            worker: "w".into(),
            cause: CheckpointCause::Local,
            epoch: None,
            leases: vec![(0, claim[0].lease)],
            rows: mutations,
            vnodes: vec![],
            partitions: vec![],
            dead_letters: Vec::new(),
            max_dead_letters: 0,
        },
    )
}

fn rows(n: i64) -> Vec<Value> {
    let mut rng = kafka_backfill::rng::SimRng::new(3);
    (0..n).map(|id| typed_row(id, id, 150, &mut rng)).collect()
}

/// The expected text of a few columns of row `id` (as `typed_row(id, id, ..)` makes it).
fn price(id: i64) -> String {
    let unscaled = (id * 1000 + id) * if id % 2 == 0 { 1 } else { -1 };
    let sign = if unscaled < 0 { "-" } else { "" };
    let u = unscaled.abs();
    format!("{sign}{}.{:03}", u / 1000, u % 1000)
}

#[test]
fn every_avro_type_round_trips_through_sqlite() {
    let dir = std::env::temp_dir().join(format!("kb-types-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("types.sqlite");
    let _ = std::fs::remove_file(&path);
    let table = TableKind::Typed.schema().unwrap();
    let mut store = SqliteStore::open(&path, "typed", table.clone()).unwrap();
    commit_rows(&mut store, &table, "types", &rows(12)).unwrap();
    let c = rusqlite::Connection::open(&path).unwrap();
    let get = |id: i64, expr: &str| -> rusqlite::types::Value {
        c.query_row(
            &format!("SELECT {expr} FROM typed WHERE id = ?1"),
            [id],
            |r| r.get(0),
        )
        .unwrap()
    };
    use rusqlite::types::Value as S;
    // Doubles: NaN as the text NaN (SQLite has none), ±Inf as REALs, −0.0 reads back as 0.0.
    assert_eq!(get(0, "amount"), S::Text("NaN".into()));
    assert_eq!(get(1, "amount"), S::Real(f64::INFINITY));
    assert_eq!(get(2, "amount"), S::Real(f64::NEG_INFINITY));
    assert_eq!(get(3, "amount"), S::Real(0.0));
    assert_eq!(get(4, "amount"), S::Real(4.0 * 1.5 + 4.0));
    // Nullable unions in either branch order.
    assert_eq!(get(0, "label"), S::Null);
    assert_eq!(get(1, "label"), S::Text("\"label\" 1".into()));
    assert_eq!(get(3, "score"), S::Null);
    assert_eq!(get(4, "score"), S::Real(4.0 / 3.0));
    assert_eq!(get(4, "active"), S::Integer(1));
    assert_eq!(get(5, "count"), S::Integer(5 - 500));
    assert_eq!(get(5, "blob"), S::Blob(5i64.to_be_bytes().to_vec()));
    assert_eq!(get(5, "hex(tag)"), S::Text("00000005".into()));
    assert_eq!(get(5, "color"), S::Text("BLUE".into()));
    for id in 0..12 {
        assert_eq!(get(id, "price"), S::Text(price(id)), "decimal of {id}");
    }
    assert_eq!(
        get(5, "uid"),
        S::Text("00000000-0000-0005-0000-000000000005".into())
    );
    assert_eq!(get(5, "day"), S::Integer(19_005));
    assert_eq!(get(5, "tod"), S::Integer(5_000_000));
    assert_eq!(get(5, "ts_ms"), S::Integer(1_700_000_000_005));
    assert_eq!(get(5, "local_ts"), S::Integer(1_700_000_000_000_000 - 5));
    assert_eq!(get(5, "tags"), S::Text(r#"["t0","t1"]"#.into()));
    assert_eq!(
        get(4, "address"),
        S::Text(r#"{"street":"4 Main St","zip":null}"#.into())
    );
    assert_eq!(get(5, "region"), S::Text("région-5".into()));
}

/// Both write paths: multi-row statements (12 rows) and `COPY … (FORMAT binary)` through a staging
/// table (1,200 rows, over `COPY_FROM_ROWS`).
#[test]
fn every_avro_type_round_trips_through_postgres() {
    for n in [12, 1_200] {
        round_trip_through_postgres(n);
    }
}

fn round_trip_through_postgres(n: i64) {
    let url = pg_url();
    let tname = format!("typed_{}_{n}", std::process::id());
    let table = TableKind::Typed.schema().unwrap();
    let mut store = PostgresStore::open(&url, &tname, table.clone()).unwrap();
    let job = format!("types-{}-{n}", std::process::id());
    commit_rows(&mut store, &table, &job, &rows(n)).unwrap();
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let count: i64 = c
        .query_one(&format!("SELECT count(*) FROM \"{tname}\""), &[])
        .unwrap()
        .get(0);
    assert_eq!(count, n);
    let mut text = |id: i64, expr: &str| -> Option<String> {
        c.query_one(
            &format!("SELECT ({expr})::text FROM \"{tname}\" WHERE id = $1"),
            &[&id],
        )
        .unwrap()
        .get(0)
    };
    // PostgreSQL holds every double exactly.
    assert_eq!(text(0, "amount").as_deref(), Some("NaN"));
    assert_eq!(text(1, "amount").as_deref(), Some("Infinity"));
    assert_eq!(text(2, "amount").as_deref(), Some("-Infinity"));
    assert_eq!(text(3, "amount").as_deref(), Some("-0"));
    assert_eq!(text(0, "label"), None);
    assert_eq!(text(1, "label").as_deref(), Some("\"label\" 1"));
    assert_eq!(text(3, "score"), None);
    assert_eq!(text(4, "active").as_deref(), Some("true"));
    assert_eq!(text(5, "count").as_deref(), Some("-495"));
    assert_eq!(text(5, "encode(tag, 'hex')").as_deref(), Some("00000005"));
    assert_eq!(text(5, "color").as_deref(), Some("BLUE"));
    for id in 0..12 {
        assert_eq!(text(id, "price"), Some(price(id)), "decimal of {id}");
    }
    assert_eq!(
        text(5, "pg_typeof(price)").as_deref(),
        Some("numeric"),
        "decimal is NUMERIC"
    );
    assert_eq!(text(5, "day").as_deref(), Some("19005"));
    let json = |s: Option<String>| serde_json::from_str::<serde_json::Value>(&s.unwrap()).unwrap();
    assert_eq!(json(text(5, "tags")), serde_json::json!(["t0", "t1"]));
    assert_eq!(
        json(text(4, "address")),
        serde_json::json!({"street": "4 Main St", "zip": null})
    );
    assert_eq!(text(5, "pg_typeof(attrs)").as_deref(), Some("jsonb"));
    assert_eq!(text(5, "region").as_deref(), Some("région-5"));
}

/// A string holding U+0000 cannot be stored in PostgreSQL text: a permanent error naming the
/// column (and the key), not a transient one.
#[test]
fn a_value_postgres_cannot_hold_is_a_permanent_error_naming_the_column() {
    let url = pg_url();
    let tname = format!("typed_nul_{}", std::process::id());
    let table = TableKind::Typed.schema().unwrap();
    let mut store = PostgresStore::open(&url, &tname, table.clone()).unwrap();
    let job = format!("types-nul-{}", std::process::id());
    let mut bad = rows(1);
    if let Value::Record(fields) = &mut bad[0] {
        let payload = fields.last_mut().unwrap();
        assert_eq!(payload.0, "payload");
        payload.1 = Value::String("nul\0here".into());
    }
    let e = commit_rows(&mut store, &table, &job, &bad).unwrap_err();
    assert!(!e.is_transient(), "{e}");
    match &e {
        StoreError::Value { column, .. } => assert_eq!(column, "payload"),
        other => panic!("expected a value error, got {other}"),
    }
}

/// A table whose columns are not the schema's (an earlier, different table of the same name) is a
/// permanent error in both stores.
#[test]
fn a_table_the_store_cannot_write_is_a_permanent_error_in_both_stores() {
    let table = TableKind::Typed.schema().unwrap();
    // SQLite
    let dir = std::env::temp_dir().join(format!("kb-types-perm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("perm.sqlite");
    let _ = std::fs::remove_file(&path);
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch("CREATE TABLE typed (_kb_key BLOB PRIMARY KEY, other TEXT)")
        .unwrap();
    let mut store = SqliteStore::open(&path, "typed", table.clone()).unwrap();
    let e = commit_rows(&mut store, &table, "perm", &rows(2)).unwrap_err();
    assert!(matches!(e, StoreError::Rejected { .. }), "{e}");
    assert!(!e.is_transient());
    // PostgreSQL
    let url = pg_url();
    let tname = format!("typed_perm_{}", std::process::id());
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    c.batch_execute(&format!(
        "DROP TABLE IF EXISTS \"{tname}\"; CREATE TABLE \"{tname}\" (_kb_key BYTEA PRIMARY KEY, other TEXT)"
    ))
    .unwrap();
    let mut store = PostgresStore::open(&url, &tname, table.clone()).unwrap();
    let e = commit_rows(
        &mut store,
        &table,
        &format!("perm-{}", std::process::id()),
        &rows(2),
    )
    .unwrap_err();
    assert!(matches!(e, StoreError::Rejected { .. }), "{e}");
    assert!(!e.is_transient());
}
