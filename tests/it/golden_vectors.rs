//! The producer's kit: `schemas/testdata/vectors.json` holds golden vectors a writer in another
//! language can check itself against (row datum, key bytes, vnode, partition, the single-object
//! bytes of a change and a barrier, the fingerprint). This test recomputes every vector with the
//! project's own codec and fails if one differs, so the file and the code cannot drift apart.
//! `KB_WRITE_GOLDEN=1 cargo test --test it golden_vectors::` rewrites the file after a deliberate change.

use apache_avro::rabin::Rabin;
use kafka_backfill::codec::{to_json, LogCodec};
use kafka_backfill::core::{vnode_of, Barrier, BarrierKind, Epoch, Op, PartitionMap};
use kafka_backfill::rng::SimRng;
use kafka_backfill::workload::TableKind;
use serde_json::{json, Value};

const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/schemas/testdata/vectors.json");
const V: u32 = 256;
const P: u32 = 4;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn vectors() -> Value {
    let mut tables = Vec::new();
    for (kind, name, ids) in [
        (TableKind::Accounts, "accounts", vec![0i64, 1, 300, -7]),
        (TableKind::Typed, "typed", vec![0i64, 1, 2, 3, 4, 5]),
    ] {
        let table = kind.schema().unwrap();
        let codec = LogCodec::new(table.clone()).unwrap();
        let map = PartitionMap::new(V, P).unwrap();
        let canonical = codec.schema.canonical_form();
        let fingerprint = codec.schema.fingerprint::<Rabin>().bytes;
        let mut rng = SimRng::new(42);
        let epoch = Epoch::from_unix_millis(1_767_225_600_000); // 2026-01-01T00:00:00Z
        let changes: Vec<Value> = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                let row = kind.row(id, 1, 60, &mut rng);
                let datum = table.encode_row(&row).unwrap();
                let key = table.key_of_datum(&datum).unwrap();
                let vnode = vnode_of(&key, V);
                let op = Op::ALL[i % 4];
                let value = codec.encode_change(epoch, op, vnode, &datum);
                json!({
                    "row_json": to_json(row, Some(&table.schema)).unwrap(),
                    "row_datum_hex": hex(&datum),
                    "key_hex": hex(&key),
                    "crc32_of_key": crc32fast::hash(&key),
                    "vnode": vnode,
                    "partition": map.partition_of(vnode),
                    "epoch": epoch.0,
                    "op": op.as_str(),
                    "message_value_hex": hex(&value),
                })
            })
            .collect();
        let barrier = Barrier {
            prev: epoch,
            curr: Epoch(epoch.0 + (1 << 16)),
            kind: BarrierKind::Checkpoint,
            schema_change: false,
        };
        tables.push(json!({
            "table": name,
            "row_schema": table.json,
            "primary_key": table.primary_key,
            "log_record_schema_canonical_form": canonical,
            "fingerprint_hex": hex(&fingerprint),
            "vnode_count": V,
            "partition_count": P,
            "changes": changes,
            "barrier": {
                "prev_epoch": barrier.prev.0,
                "curr_epoch": barrier.curr.0,
                "kind": "CHECKPOINT",
                "message_value_hex": hex(&codec.encode_barrier(&barrier)),
            },
        }));
    }
    json!({
        "schema_change": schema_change(),
        "several_tables": several_tables(),
        "$comment": "Golden vectors of the wire format (docs/WIRE.md). several_tables: one log carrying two tables (\"Several tables\"): each table's row schema and fingerprint, then messages in log order, each change naming its table by that fingerprint, and a barrier under the first table's. For each table: the log-record schema with the row substituted, in Avro Parsing Canonical Form, and its CRC-64-AVRO fingerprint (8 bytes, little-endian, as written after C3 01); per change: the row (as JSON, for reading), its Avro binary datum, its key bytes (the primary-key fields' encodings concatenated in primary_key order), crc32 of the key, vnode = crc32 mod vnode_count, the partition that owns the vnode, and the whole message value. schema_change: a log whose accounts table gains two columns at a CHECKPOINT barrier (\"Schema changes\"): the version file (its name and content), a change before the barrier under the manifest's fingerprint, the barrier, a change after it under the new version's fingerprint, and the first change's row as the new version reads it (Avro schema resolution, re-encoded). Checked by tests/it/golden_vectors.rs.",
        "tables": tables,
    })
}

/// One log whose accounts table switches to `produce --evolve`'s first version at a checkpoint
/// barrier: the version file, a change of each version around the barrier, and the resolution of
/// the first change's row.
fn schema_change() -> Value {
    let v0 = TableKind::Accounts.schema().unwrap();
    let v1 = kafka_backfill::workload::evolved_schemas().unwrap()[0].clone();
    let (c0, c1) = (
        LogCodec::new(v0.clone()).unwrap(),
        LogCodec::new(v1.clone()).unwrap(),
    );
    let mut rng = SimRng::new(44);
    let epoch = Epoch::from_unix_millis(1_767_225_600_000);
    let next = Epoch(epoch.0 + (1 << 16));
    let mut change =
        |codec: &LogCodec, table: &kafka_backfill::codec::TableSchema, epoch, version| {
            let row = kafka_backfill::workload::evolve_row(
                TableKind::Accounts.row(7, 1, 40, &mut rng),
                version,
                7,
            );
            let datum = table.encode_row(&row).unwrap();
            let key = table.key_of_datum(&datum).unwrap();
            let vnode = vnode_of(&key, V);
            json!({
                "epoch": epoch,
                "op": "insert",
                "key_hex": hex(&key),
                "vnode": vnode,
                "row_datum_hex": hex(&datum),
                "fingerprint_hex": codec.fingerprint_hex(),
                "message_value_hex": hex(&codec.encode_change(epoch, Op::Insert, vnode, &datum)),
            })
        };
    let before = change(&c0, &v0, epoch, 0);
    let after = change(&c1, &v1, next, 1);
    let first = unhex(before["row_datum_hex"].as_str().unwrap());
    let resolved = kafka_backfill::codec::versions::resolve(&first, &v0, &v1).unwrap();
    let barrier = Barrier {
        prev: epoch,
        curr: next,
        kind: BarrierKind::Checkpoint,
        schema_change: true,
    };
    json!({
        "manifest_row_schema": v0.json,
        "manifest_fingerprint_hex": c0.fingerprint_hex(),
        "version_file_name": format!("schema_versions/{}.json", c1.fingerprint_hex()),
        "version_file": {"from_epoch": next.0, "row_schema": v1.json},
        "messages": [
            before,
            {
                "barrier": {"prev_epoch": epoch.0, "curr_epoch": next.0, "kind": "CHECKPOINT"},
                "message_value_hex": hex(&c0.encode_barrier(&barrier)),
            },
            after,
        ],
        "first_row_as_the_new_version_reads_it_hex": hex(&resolved),
    })
}

/// The schema-change vector: read with the manifest's schema and the version file, each change is
/// read with its own version, the barrier is marked as the one the version starts at, and a change
/// after it written with the manifest's schema is refused, naming the version in force.
#[test]
fn the_schema_change_vector_reads_each_epoch_with_its_own_version() {
    use kafka_backfill::codec::versions::{AnnouncedVersion, Evolution};
    use kafka_backfill::core::LogRecord;
    let stored: Value = serde_json::from_str(&std::fs::read_to_string(PATH).unwrap()).unwrap();
    let v = stored["schema_change"].clone();
    let file = v["version_file"].clone();
    let name = v["version_file_name"].as_str().unwrap().to_string();
    let announced = AnnouncedVersion {
        source: name.clone(),
        table: None,
        from_epoch: Epoch(file["from_epoch"].as_u64().unwrap()),
        row_schema: file["row_schema"].to_string(),
        named_fingerprint: name
            .strip_prefix("schema_versions/")
            .and_then(|n| n.strip_suffix(".json"))
            .map(str::to_string),
        primary_key: None,
    };
    let v0 = TableKind::Accounts.schema().unwrap();
    let known = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = known.clone();
    // The version is announced only once the test says so: a reader that met the new
    // fingerprint first finds it by reading the versions again.
    let evolution = Evolution::new(
        vec![v0.clone()],
        vec![None],
        Epoch(1),
        Box::new(move || {
            Ok(if seen.load(std::sync::atomic::Ordering::SeqCst) {
                vec![announced.clone()]
            } else {
                Vec::new()
            })
        }),
        Box::new(|| 0),
    )
    .unwrap();
    let codec = LogCodec::new(v0)
        .unwrap()
        .with_evolution(std::sync::Arc::new(evolution));
    let msgs = v["messages"].as_array().unwrap();
    let decode = |m: &Value| {
        codec.decode(
            &unhex(m["message_value_hex"].as_str().unwrap()),
            m["key_hex"].as_str().map(unhex).as_deref(),
        )
    };
    assert!(matches!(decode(&msgs[0]), Ok(LogRecord::Change(_))));
    known.store(true, std::sync::atomic::Ordering::SeqCst);
    match decode(&msgs[2]).unwrap() {
        LogRecord::Change(c) => {
            assert_eq!(
                hex(&c.row.value),
                msgs[2]["row_datum_hex"].as_str().unwrap()
            )
        }
        other => panic!("{other:?}"),
    }
    match decode(&msgs[1]).unwrap() {
        LogRecord::Barrier(b) => assert!(b.schema_change, "the barrier the version starts at"),
        other => panic!("{other:?}"),
    }
    // The first change's row, written with the manifest's schema, at the new version's epoch:
    // refused, naming the version in force.
    let v0 = TableKind::Accounts.schema().unwrap();
    let datum = unhex(msgs[0]["row_datum_hex"].as_str().unwrap());
    let key = unhex(msgs[0]["key_hex"].as_str().unwrap());
    let late = LogCodec::new(v0).unwrap().encode_change(
        Epoch(file["from_epoch"].as_u64().unwrap()),
        Op::Insert,
        msgs[0]["vnode"].as_u64().unwrap() as u16,
        &datum,
    );
    let e = codec.decode(&late, Some(&key)).unwrap_err().to_string();
    assert!(e.contains("version 1") && e.contains("is in force"), "{e}");
}

/// One log of two tables: `accounts_1` and `accounts_2` (the accounts row with the record renamed,
/// so each has its own fingerprint), changes of both in one epoch, then a barrier.
fn several_tables() -> Value {
    let tables = TableKind::Accounts.log_tables(2).unwrap();
    let schemas: Vec<_> = tables.iter().map(|(_, t)| t.clone()).collect();
    let codecs: Vec<LogCodec> = (0..2)
        .map(|i| LogCodec::of_log(&schemas, i).unwrap())
        .collect();
    let mut rng = SimRng::new(43);
    let epoch = Epoch::from_unix_millis(1_767_225_600_000);
    let mut messages = Vec::new();
    for (t, id, op) in [
        (0usize, 5i64, Op::Insert),
        (1, 5, Op::Insert),
        (1, 6, Op::Delete),
    ] {
        let table = &schemas[t];
        let row = TableKind::Accounts.row(id, 1, 40, &mut rng);
        let datum = table.encode_row(&row).unwrap();
        let key = table.key_of_datum(&datum).unwrap();
        let vnode = vnode_of(&key, V);
        messages.push(json!({
            "table": tables[t].0,
            "op": op.as_str(),
            "epoch": epoch.0,
            "key_hex": hex(&key),
            "vnode": vnode,
            "row_datum_hex": hex(&datum),
            "message_value_hex": hex(&codecs[t].encode_change(epoch, op, vnode, &datum)),
        }));
    }
    // The second table truncated (docs/WIRE.md "Truncate"): its own schema, the table by index.
    messages.push(json!({
        "truncate": {"epoch": epoch.0, "table": 1},
        "message_value_hex": hex(&LogCodec::encode_truncate(epoch, 1)),
    }));
    let barrier = Barrier {
        prev: epoch,
        curr: Epoch(epoch.0 + (1 << 16)),
        kind: BarrierKind::Checkpoint,
        schema_change: false,
    };
    messages.push(json!({
        "barrier": {"prev_epoch": barrier.prev.0, "curr_epoch": barrier.curr.0, "kind": "CHECKPOINT"},
        "message_value_hex": hex(&codecs[0].encode_barrier(&barrier)),
    }));
    json!({
        "vnode_count": V,
        "tables": tables.iter().zip(&codecs).map(|((name, t), c)| json!({
            "name": name,
            "row_schema": t.json,
            "primary_key": t.primary_key,
            "fingerprint_hex": c.fingerprint_hex(),
        })).collect::<Vec<_>>(),
        "truncate_fingerprint_hex": hex(&kafka_backfill::codec::truncate_fingerprint()),
        "messages": messages,
    })
}

/// The several-table vector decodes with the codec of either table: each change's table is the
/// one its fingerprint names; a table's own rows come back whole, the other's by key only.
#[test]
fn the_several_table_vector_tells_each_change_s_table_by_its_fingerprint() {
    let stored: Value = serde_json::from_str(&std::fs::read_to_string(PATH).unwrap()).unwrap();
    let log = &stored["several_tables"];
    let tables = TableKind::Accounts.log_tables(2).unwrap();
    let schemas: Vec<_> = tables.iter().map(|(_, t)| t.clone()).collect();
    let names: Vec<&str> = log["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["accounts_1", "accounts_2"]);
    let fps: Vec<&str> = log["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["fingerprint_hex"].as_str().unwrap())
        .collect();
    assert_ne!(fps[0], fps[1]);
    for own in 0..2 {
        let codec = LogCodec::of_log(&schemas, own).unwrap();
        for m in log["messages"].as_array().unwrap() {
            let value = unhex(m["message_value_hex"].as_str().unwrap());
            let key = m["key_hex"].as_str().map(unhex);
            match codec.decode(&value, key.as_deref()).unwrap() {
                kafka_backfill::core::LogRecord::Change(c) => {
                    let t = names
                        .iter()
                        .position(|n| *n == m["table"].as_str().unwrap())
                        .unwrap();
                    assert_eq!(c.table as usize, t);
                    assert_eq!(hex(&value[2..10]), fps[t]);
                    let want = if t == own {
                        m["row_datum_hex"].as_str().unwrap()
                    } else {
                        ""
                    };
                    assert_eq!(hex(&c.row.value), want);
                }
                kafka_backfill::core::LogRecord::Barrier(b) => {
                    assert_eq!(b.prev.0, m["barrier"]["prev_epoch"].as_u64().unwrap());
                }
                kafka_backfill::core::LogRecord::Truncate(t) => {
                    assert_eq!(t.table as u64, m["truncate"]["table"].as_u64().unwrap());
                    assert_eq!(t.epoch.0, m["truncate"]["epoch"].as_u64().unwrap());
                    assert_eq!(
                        hex(&value[2..10]),
                        log["truncate_fingerprint_hex"].as_str().unwrap(),
                        "one truncation schema for every table"
                    );
                }
            }
        }
    }
    // The truncation's fingerprint is its schema file's, computed here apart from the codec.
    let truncate = apache_avro::Schema::parse_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/schemas/truncate.avsc"
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        log["truncate_fingerprint_hex"].as_str().unwrap(),
        hex(&truncate.fingerprint::<Rabin>().bytes)
    );
    // A codec of one table alone refuses the other's changes: the fingerprint is unknown to it.
    let alone = LogCodec::new(schemas[0].clone()).unwrap();
    let m = &log["messages"][1];
    let e = alone
        .decode(
            &unhex(m["message_value_hex"].as_str().unwrap()),
            Some(&unhex(m["key_hex"].as_str().unwrap())),
        )
        .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("unknown writer schema fingerprint"),
        "{e}"
    );
}

#[test]
fn golden_vectors_match_the_codec() {
    let now = vectors();
    if std::env::var("KB_WRITE_GOLDEN").is_ok() {
        std::fs::write(PATH, serde_json::to_string_pretty(&now).unwrap() + "\n").unwrap();
    }
    let stored: Value = serde_json::from_str(&std::fs::read_to_string(PATH).unwrap()).unwrap();
    assert!(
        stored == now,
        "schemas/testdata/vectors.json differs from what the codec produces (rewrite it with \
         KB_WRITE_GOLDEN=1 only after a deliberate wire-format change)"
    );
}

/// The vectors decode back with the project's decoder, and each vnode and partition follows from
/// the stated rules (not only from the code that wrote them).
#[test]
fn golden_vectors_decode_and_follow_the_rules() {
    let stored: Value = serde_json::from_str(&std::fs::read_to_string(PATH).unwrap()).unwrap();
    for t in stored["tables"].as_array().unwrap() {
        let kind = match t["table"].as_str().unwrap() {
            "accounts" => TableKind::Accounts,
            _ => TableKind::Typed,
        };
        let codec = LogCodec::new(kind.schema().unwrap()).unwrap();
        let v = t["vnode_count"].as_u64().unwrap();
        let p = t["partition_count"].as_u64().unwrap();
        for c in t["changes"].as_array().unwrap() {
            let key = unhex(c["key_hex"].as_str().unwrap());
            let crc = crc32fast::hash(&key) as u64;
            assert_eq!(c["crc32_of_key"].as_u64().unwrap(), crc);
            let vnode = crc % v;
            assert_eq!(c["vnode"].as_u64().unwrap(), vnode);
            // Partition p owns [p·V/P, (p+1)·V/P).
            let part = (0..p).find(|q| q * v / p <= vnode && vnode < (q + 1) * v / p);
            assert_eq!(c["partition"].as_u64(), part);
            let value = unhex(c["message_value_hex"].as_str().unwrap());
            assert_eq!(value[..2], [0xC3, 0x01]);
            assert_eq!(hex(&value[2..10]), t["fingerprint_hex"].as_str().unwrap());
            let record = codec.decode(&value, Some(&key)).unwrap();
            let kafka_backfill::core::LogRecord::Change(change) = record else {
                panic!("a change")
            };
            assert_eq!(hex(&change.row.value), c["row_datum_hex"].as_str().unwrap());
        }
        let b = &t["barrier"];
        let value = unhex(b["message_value_hex"].as_str().unwrap());
        assert!(matches!(
            codec.decode(&value, None).unwrap(),
            kafka_backfill::core::LogRecord::Barrier(_)
        ));
    }
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}
