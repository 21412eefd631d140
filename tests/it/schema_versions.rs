//! `schemas/schema_version.schema.json` describes what the reader accepts as a schema-version file
//! (docs/WIRE.md "Schema changes"): what `produce --evolve` writes validates, and what the reader
//! refuses (unknown keys, a missing epoch) the schema refuses too.

use kafka_backfill::codec::versions::{AnnouncedVersion, SchemaVersions};
use kafka_backfill::codec::LogCodec;
use kafka_backfill::core::Epoch;
use kafka_backfill::snapshot::versions::{read, write, VersionFile};
use kafka_backfill::workload::{evolved_schemas, TableKind};

fn valid(doc: &serde_json::Value) -> Result<(), String> {
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../../schemas/schema_version.schema.json")).unwrap();
    let mut schemas = boon::Schemas::new();
    let mut compiler = boon::Compiler::new();
    compiler
        .add_resource("schema_version.schema.json", schema)
        .unwrap();
    let idx = compiler
        .compile("schema_version.schema.json", &mut schemas)
        .unwrap();
    schemas.validate(doc, idx).map_err(|e| e.to_string())
}

#[test]
fn what_the_writer_writes_validates_and_reads_back() {
    let dir = std::env::temp_dir().join(format!("kb-versions-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (i, schema) in evolved_schemas().unwrap().into_iter().enumerate() {
        let fp = LogCodec::new(schema.clone()).unwrap().fingerprint_hex();
        let file = VersionFile {
            table: None,
            from_epoch: Epoch(1_000 + i as u64),
            row_schema: schema.json.clone(),
            primary_key: None,
        };
        let path = write(&dir, &fp, &file).unwrap();
        let doc: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        valid(&doc).unwrap();
    }
    let back = read(&dir).unwrap();
    assert_eq!(back.len(), 3);
    assert!(back.iter().all(|v| v.named_fingerprint.is_some()));
    // A file being written (`.<name>.tmp`) is not read.
    std::fs::write(dir.join("schema_versions/.x.json.tmp"), "{").unwrap();
    assert_eq!(read(&dir).unwrap().len(), 3);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn what_the_reader_refuses_the_schema_refuses() {
    let row = evolved_schemas().unwrap()[0].json.clone();
    for bad in [
        serde_json::json!({"row_schema": row}),
        serde_json::json!({"from_epoch": 5, "row_schema": row, "since": 1}),
        serde_json::json!({"from_epoch": 5, "row_schema": {"type": "string"}}),
    ] {
        assert!(valid(&bad).is_err(), "{bad}");
        let base = TableKind::Accounts.schema().unwrap();
        let refused = match serde_json::from_value::<VersionFile>(bad.clone()) {
            Err(_) => true,
            // Parsed: refused when the version is checked against the one before it.
            Ok(f) => SchemaVersions::new(
                &[base],
                &[None],
                Epoch(1),
                &[AnnouncedVersion {
                    source: "test".into(),
                    table: f.table,
                    from_epoch: f.from_epoch,
                    row_schema: f.row_schema.to_string(),
                    named_fingerprint: None,
                    primary_key: None,
                }],
            )
            .is_err(),
        };
        assert!(refused, "{bad}");
    }
}
