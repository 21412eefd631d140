//! `schemas/snapshot_manifest.schema.json` is the reader's schema: what it accepts the reader reads,
//! what it refuses the reader refuses, and what the writer writes it accepts (validated with a JSON
//! Schema validator, both ways).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kafka_backfill::codec::TableSchema;
use kafka_backfill::core::{vnode_of, Epoch, Vnode};
use kafka_backfill::ports::SnapshotSource;
use kafka_backfill::snapshot::files::{
    write_files, write_manifest, Manifest, ManifestStart, SnapshotFiles,
};
use kafka_backfill::workload::{TableKind, EXAMPLE_ROW_SCHEMA};

fn validator() -> (boon::Schemas, boon::SchemaIndex) {
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../../schemas/snapshot_manifest.schema.json")).unwrap();
    let mut schemas = boon::Schemas::new();
    let mut compiler = boon::Compiler::new();
    compiler
        .add_resource("snapshot_manifest.schema.json", schema)
        .unwrap();
    let idx = compiler
        .compile("snapshot_manifest.schema.json", &mut schemas)
        .unwrap();
    (schemas, idx)
}

fn valid(doc: &serde_json::Value) -> Result<(), String> {
    let (schemas, idx) = validator();
    schemas.validate(doc, idx).map_err(|e| e.to_string())
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kb-manifest-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A snapshot folder written by the writer's own functions (what `produce` calls).
fn written(d: &Path) -> Manifest {
    let table = TableKind::Accounts.schema().unwrap();
    let mut rows: BTreeMap<Vnode, BTreeMap<Vec<u8>, Vec<u8>>> = BTreeMap::new();
    let mut rng = kafka_backfill::rng::SimRng::new(7);
    for id in 0..50 {
        let datum = table
            .encode_row(&kafka_backfill::workload::example_row(id, 0, 60, &mut rng))
            .unwrap();
        let key = table.key_of_datum(&datum).unwrap();
        rows.entry(vnode_of(&key, 8))
            .or_default()
            .insert(key, datum);
    }
    let files = write_files(d, &table, rows).unwrap();
    let m = Manifest {
        snapshot_epoch: Epoch(5 << 16),
        vnode_count: 8,
        partition_count: 2,
        topic: Some("log".into()),
        row_schema: table.json.clone(),
        primary_key: table.primary_key.clone(),
        files,
        start: (0..2)
            .map(|p| ManifestStart {
                partition: p,
                next_offset: 1,
                epoch: Epoch(6 << 16),
            })
            .collect(),
    };
    write_manifest(d, &m).unwrap();
    m
}

fn read_json(d: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(d.join("manifest.json")).unwrap()).unwrap()
}

fn write_json(d: &Path, v: &serde_json::Value) {
    std::fs::write(d.join("manifest.json"), serde_json::to_vec(v).unwrap()).unwrap();
}

#[test]
fn what_the_writer_writes_the_schema_accepts_and_the_reader_reads() {
    let d = dir("writer");
    written(&d);
    valid(&read_json(&d)).unwrap();
    SnapshotFiles::open(&d).unwrap();
}

#[test]
fn a_manifest_with_only_the_required_keys_is_accepted_by_both() {
    let d = dir("minimal");
    written(&d);
    let mut v = read_json(&d);
    v.as_object_mut().unwrap().remove("topic");
    valid(&v).unwrap();
    write_json(&d, &v);
    let s = SnapshotFiles::open(&d).unwrap();
    assert_eq!(s.manifest.topic, None);
}

/// Documents that the schema refuses, the reader refuses too: a missing required key, a wrong type.
#[test]
fn what_the_schema_refuses_the_reader_refuses() {
    let d = dir("refused");
    written(&d);
    let base = read_json(&d);
    type Change = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, Change)> = vec![
        (
            "missing start",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("start");
            }),
        ),
        (
            "vnode_count as a string",
            Box::new(|v| {
                v["vnode_count"] = serde_json::json!("8");
            }),
        ),
        (
            "files[] without rows",
            Box::new(|v| {
                v["files"][0].as_object_mut().unwrap().remove("rows");
            }),
        ),
    ];
    for (what, change) in cases {
        let mut v = base.clone();
        change(&mut v);
        assert!(valid(&v).is_err(), "the schema accepts {what}");
        write_json(&d, &v);
        let e = SnapshotFiles::open(&d).err();
        assert!(
            e.as_ref()
                .is_some_and(|e| e.to_string().contains("invalid manifest")),
            "the reader accepts {what}: {e:?}"
        );
    }
}

/// Keys this release does not know are accepted by the schema and ignored by the reader, which
/// names them.
#[test]
fn unknown_keys_are_accepted_and_named() {
    let d = dir("unknown");
    written(&d);
    let mut v = read_json(&d);
    v["written_by"] = serde_json::json!("a later release");
    v["files"][0]["checksum"] = serde_json::json!("abc");
    v["start"][1]["streaming"] = serde_json::json!(false);
    valid(&v).unwrap();
    write_json(&d, &v);
    let s = SnapshotFiles::open(&d).unwrap();
    assert_eq!(
        s.ignored_keys,
        ["files.0.checksum", "start.1.streaming", "written_by"]
    );
}

/// Compatibility: `manifest.json` exactly as the previous release's `produce` wrote it (pretty
/// JSON, `topic` always present, every `start[]` entry with `streaming: false`, as the reader of that
/// release required) opens after an upgrade, with the same snapshot info.
#[test]
fn a_manifest_written_by_the_previous_release_is_read() {
    let d = dir("previous-release");
    let m = written(&d);
    let files: Vec<String> = m
        .files
        .iter()
        .map(|f| {
            let vnodes: Vec<String> = f.vnodes.iter().map(|v| format!("\n        {v}")).collect();
            format!(
                "\n    {{\n      \"path\": \"{}\",\n      \"vnodes\": [{}\n      ],\n      \"rows\": {}\n    }}",
                f.path,
                vnodes.join(","),
                f.rows
            )
        })
        .collect();
    let schema = serde_json::to_string_pretty(&m.row_schema)
        .unwrap()
        .replace('\n', "\n  ");
    let text = format!(
        r#"{{
  "snapshot_epoch": 327680,
  "vnode_count": 8,
  "partition_count": 2,
  "topic": "log",
  "row_schema": {schema},
  "primary_key": [
    "id"
  ],
  "files": [{files}
  ],
  "start": [
    {{
      "partition": 0,
      "next_offset": 1,
      "epoch": 393216,
      "streaming": false
    }},
    {{
      "partition": 1,
      "next_offset": 1,
      "epoch": 393216,
      "streaming": false
    }}
  ]
}}"#,
        files = files.join(",")
    );
    std::fs::write(d.join("manifest.json"), &text).unwrap();
    valid(&serde_json::from_str(&text).unwrap()).unwrap();
    let s = SnapshotFiles::open(&d).unwrap();
    assert_eq!(s.manifest, m, "read as the writer meant it");
    assert_eq!(s.ignored_keys, ["start.0.streaming", "start.1.streaming"]);
}

#[test]
fn the_typed_table_schema_is_a_row_schema() {
    let t = TableKind::Typed.schema().unwrap();
    assert_eq!(t.primary_key, vec!["region".to_string(), "id".to_string()]);
    TableSchema::parse(EXAMPLE_ROW_SCHEMA, &["id".to_string()]).unwrap();
}

/// A manifest of two tables sharing the log, as the writer lays it out (each table's files in a
/// folder of its name): the schema accepts it, the reader opens each table by name and refuses to
/// guess which one a job means.
fn written_two_tables(d: &Path) -> serde_json::Value {
    let tables = TableKind::Accounts.log_tables(2).unwrap();
    let mut rng = kafka_backfill::rng::SimRng::new(7);
    let rows: Vec<kafka_backfill::workload::TableRows> = tables
        .iter()
        .map(|(_, table)| {
            (0..20)
                .map(|id| {
                    let row = kafka_backfill::workload::example_row(id, 0, 60, &mut rng);
                    let datum = table.encode_row(&row).unwrap();
                    (id, (table.key_of_datum(&datum).unwrap(), datum))
                })
                .collect()
        })
        .collect();
    let start = (0..2)
        .map(|p| kafka_backfill::core::PartitionProgress {
            partition: p,
            next_offset: 1,
            epoch: Epoch(6 << 16),
            streaming: false,
        })
        .collect();
    kafka_backfill::workload::write_tables(
        d,
        Default::default(),
        &tables,
        kafka_backfill::core::PartitionMap::new(8, 2).unwrap(),
        "log",
        Epoch(5 << 16),
        &rows,
        start,
    )
    .unwrap();
    read_json(d)
}

#[test]
fn a_manifest_of_several_tables_is_read_table_by_table() {
    let d = dir("tables");
    let v = written_two_tables(&d);
    valid(&v).unwrap();
    for (i, name) in ["accounts_1", "accounts_2"].into_iter().enumerate() {
        let s = SnapshotFiles::open_table(&d, Some(name)).unwrap();
        assert_eq!(s.table_index, i);
        assert_eq!(s.tables.len(), 2);
        assert_eq!(s.table.name, format!("Account{}", i + 1));
        let rows: usize = (0..8).map(|v| s.scan(v, None).unwrap().count()).sum();
        assert_eq!(rows, 20, "{name}");
    }
    let e = SnapshotFiles::open(&d).err().unwrap().to_string();
    assert!(
        e.contains("holds 2 tables (accounts_1, accounts_2): name the job's with `snapshot.table`"),
        "{e}"
    );
    let e = SnapshotFiles::open_table(&d, Some("tellers"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("no table tellers in the manifest (its tables: accounts_1, accounts_2)"),
        "{e}"
    );
    // A table its capture removed is named as removed, with the epoch its changes stop at.
    let mut removed = v.clone();
    removed["removed"] = serde_json::json!([{"name": "tellers", "from_epoch": 77}]);
    valid(&removed).unwrap();
    let gone = dir("tables-removed");
    written_two_tables(&gone);
    write_json(&gone, &removed);
    SnapshotFiles::open_table(&gone, Some("accounts_2")).unwrap();
    let e = SnapshotFiles::open_table(&gone, Some("tellers"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("table tellers was removed from its capture at epoch 77"),
        "{e}"
    );
    // A one-table manifest's table is named by its row record.
    let one = dir("tables-one");
    written(&one);
    SnapshotFiles::open_table(&one, Some("Account")).unwrap();
    let e = SnapshotFiles::open_table(&one, Some("accounts_1"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("its one table is Account"), "{e}");
}

/// What the schema refuses of the several-table form the reader refuses too; and what no JSON
/// Schema can say — two tables whose changes could not be told apart — the reader refuses naming
/// both.
#[test]
fn several_tables_the_schema_refuses_the_reader_refuses() {
    let d = dir("tables-refused");
    let base = written_two_tables(&d);
    type Change = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, &str, Change)> = vec![
        (
            "both forms",
            "beside `tables`",
            Box::new(|v| {
                v["row_schema"] = v["tables"][0]["row_schema"].clone();
            }),
        ),
        (
            "no tables",
            "`tables` is empty",
            Box::new(|v| {
                v["tables"] = serde_json::json!([]);
            }),
        ),
        (
            "a table without files",
            "invalid manifest",
            Box::new(|v| {
                v["tables"][1].as_object_mut().unwrap().remove("files");
            }),
        ),
        (
            "a removed table without its epoch",
            "invalid manifest",
            Box::new(|v| {
                v["removed"] = serde_json::json!([{"name": "tellers"}]);
            }),
        ),
        (
            "a table name that is no SQL name",
            "tables[1].name",
            Box::new(|v| {
                v["tables"][1]["name"] = serde_json::json!("accounts-2");
            }),
        ),
    ];
    for (what, says, change) in cases {
        let mut v = base.clone();
        change(&mut v);
        assert!(valid(&v).is_err(), "the schema accepts {what}");
        write_json(&d, &v);
        let e = SnapshotFiles::open_table(&d, Some("accounts_1"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains(says), "the reader on {what}: {e:?}");
    }
    let mut v = base.clone();
    v["tables"][1]["row_schema"] = v["tables"][0]["row_schema"].clone();
    v["tables"][1]["files"] = serde_json::json!([]);
    valid(&v).unwrap();
    write_json(&d, &v);
    let e = SnapshotFiles::open_table(&d, Some("accounts_1"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("tables[1] (accounts_2) and table accounts_1 have one writer schema"),
        "{e}"
    );
}
