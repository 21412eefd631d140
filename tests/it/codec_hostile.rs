//! The datum walker on hostile input: a differential test against apache-avro over generated schemas
//! and datums (valid ones must be walked exactly as apache-avro reads them; mutated ones must never
//! panic, must end quickly, and may be accepted only if apache-avro accepts them too), plus
//! adversarial cases, each an error within bounded time. `CODEC_FUZZ_CASES` sets the number of
//! generated inputs (default 100,000).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use apache_avro::types::Value;
use apache_avro::Schema;
use kafka_backfill::codec::{skip_datum, LogCodec, TableSchema};
use kafka_backfill::rng::SimRng;

/// A random schema of bounded depth (types both readers agree on: no logical types).
fn schema_json(rng: &mut SimRng, depth: u32, names: &mut u32) -> serde_json::Value {
    use serde_json::json;
    let leaf = depth >= 3 || rng.below(3) == 0;
    let pick = if leaf { rng.below(8) } else { 8 + rng.below(5) };
    fn name(names: &mut u32) -> String {
        *names += 1;
        format!("n{names}")
    }
    match pick {
        0 => json!("null"),
        1 => json!("boolean"),
        2 => json!("int"),
        3 => json!("long"),
        4 => json!("float"),
        5 => json!("double"),
        6 => json!("bytes"),
        7 => json!("string"),
        8 => json!({"type": "fixed", "name": name(names), "size": rng.below(5)}),
        9 => json!({"type": "enum", "name": name(names), "symbols": ["A", "B", "C"]}),
        10 => json!({"type": "array", "items": schema_json(rng, depth + 1, names)}),
        11 => json!({"type": "map", "values": schema_json(rng, depth + 1, names)}),
        _ => {
            let n = 1 + rng.below(4);
            let fields: Vec<serde_json::Value> = (0..n)
                .map(|i| {
                    let inner = schema_json(rng, depth + 1, names);
                    let t = if rng.below(4) == 0 && inner != json!("null") {
                        json!(["null", inner])
                    } else {
                        inner
                    };
                    json!({"name": format!("f{i}"), "type": t})
                })
                .collect();
            json!({"type": "record", "name": name(names), "fields": fields})
        }
    }
}

/// A random value of `schema`.
fn value(rng: &mut SimRng, schema: &Schema) -> Value {
    match schema {
        Schema::Null => Value::Null,
        Schema::Boolean => Value::Boolean(rng.below(2) == 0),
        Schema::Int => Value::Int(rng.below(1 << 20) as i32 - (1 << 19)),
        Schema::Long => Value::Long(rng.below(u64::MAX >> 1) as i64 - (1 << 40)),
        Schema::Float => Value::Float(rng.below(1000) as f32 / 7.0),
        Schema::Double => Value::Double(rng.below(1000) as f64 / 3.0),
        Schema::Bytes => Value::Bytes((0..rng.below(6)).map(|i| i as u8).collect()),
        Schema::String => Value::String("é".repeat(rng.below(4) as usize)),
        Schema::Fixed(f) => Value::Fixed(f.size, vec![7; f.size]),
        Schema::Enum(e) => {
            let i = rng.below(e.symbols.len() as u64) as u32;
            Value::Enum(i, e.symbols[i as usize].clone())
        }
        Schema::Array(a) => Value::Array((0..rng.below(4)).map(|_| value(rng, &a.items)).collect()),
        Schema::Map(m) => Value::Map(
            (0..rng.below(3))
                .map(|i| (format!("k{i}"), value(rng, &m.types)))
                .collect::<HashMap<_, _>>(),
        ),
        Schema::Union(u) => {
            let i = rng.below(u.variants().len() as u64) as u32;
            Value::Union(i, Box::new(value(rng, &u.variants()[i as usize])))
        }
        Schema::Record(r) => Value::Record(
            r.fields
                .iter()
                .map(|f| (f.name.clone(), value(rng, &f.schema)))
                .collect(),
        ),
        other => panic!("not generated: {other:?}"),
    }
}

fn apache_reads(schema: &Schema, bytes: &[u8]) -> Option<usize> {
    let mut r = bytes;
    apache_avro::from_avro_datum(schema, &mut r, None)
        .ok()
        .map(|_| bytes.len() - r.len())
}

#[test]
fn differential_against_apache_avro_on_generated_schemas_and_mutated_datums() {
    let cases: u64 = std::env::var("CODEC_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let mut rng = SimRng::new(20_261_130);
    let mut schema = None;
    let (mut valid, mut mutated, mut accepted_mutants) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    for case in 0..cases {
        if case % 50 == 0 {
            let mut names = 0;
            let json = schema_json(&mut rng, 0, &mut names);
            schema = Some(Schema::parse(&json).expect("generated schema parses"));
        }
        let schema = schema.as_ref().unwrap();
        let v = value(&mut rng, schema);
        let bytes = apache_avro::to_avro_datum(schema, v).expect("encodes");
        // Valid: walked exactly as apache-avro reads it.
        let mut b = &bytes[..];
        skip_datum(schema, &mut b)
            .unwrap_or_else(|e| panic!("case {case}: valid datum refused: {e}"));
        assert!(b.is_empty(), "case {case}: walker stopped early");
        valid += 1;
        // Mutated: flip, insert or cut bytes.
        let mut m = bytes.clone();
        match rng.below(3) {
            0 if !m.is_empty() => {
                let i = rng.below(m.len() as u64) as usize;
                m[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(m.len() as u64 + 1) as usize;
                m.insert(i, rng.below(256) as u8);
            }
            _ => m.truncate(rng.below(m.len() as u64 + 1) as usize),
        }
        mutated += 1;
        let t = Instant::now();
        let mut b = &m[..];
        let walked = skip_datum(schema, &mut b).map(|()| m.len() - b.len());
        assert!(t.elapsed() < Duration::from_secs(1), "case {case}: slow");
        if let Ok(n) = walked {
            accepted_mutants += 1;
            if apache_reads(schema, &m) != Some(n) {
                let mut r = &m[..];
                eprintln!(
                    "schema {} bytes {:02x?} apache: {:?}",
                    schema.canonical_form(),
                    m,
                    apache_avro::from_avro_datum(schema, &mut r, None).err()
                );
            }
            assert_eq!(
                apache_reads(schema, &m),
                Some(n),
                "case {case}: the walker accepted {n} bytes apache-avro does not read the same way"
            );
        }
    }
    println!(
        "codec differential: {valid} valid and {mutated} mutated datums ({accepted_mutants} mutants still well-formed) in {:?}",
        started.elapsed()
    );
    assert_eq!(valid + mutated, 2 * cases);
}

fn bounded(schema: &str, bytes: &[u8]) -> String {
    let schema = Schema::parse_str(schema).unwrap();
    let t = Instant::now();
    let mut b = bytes;
    let e = skip_datum(&schema, &mut b).expect_err("must be refused");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t.elapsed()
    );
    e
}

#[test]
fn adversarial_inputs_are_errors_in_bounded_time() {
    // A block count of 2^62 over null items: an array of nulls may claim any count, but the walk
    // stops at MAX_EMPTY_ITEMS instead of looping 2^62 times.
    let mut huge = Vec::new();
    kafka_backfill::codec::varint::put_long(&mut huge, 1 << 62);
    let e = bounded(r#"{"type":"array","items":"null"}"#, &huge);
    assert!(e.contains("take no bytes"), "{e}");
    // The same through an empty record and a zero-size fixed, and a map of nulls.
    let e = bounded(
        r#"{"type":"array","items":{"type":"record","name":"E","fields":[]}}"#,
        &huge,
    );
    assert!(e.contains("take no bytes"), "{e}");
    let e = bounded(
        r#"{"type":"array","items":{"type":"fixed","name":"Z","size":0}}"#,
        &huge,
    );
    assert!(e.contains("take no bytes"), "{e}");
    // A negative count (block with a byte size) of i64::MIN items.
    let mut neg = Vec::new();
    kafka_backfill::codec::varint::put_long(&mut neg, i64::MIN);
    kafka_backfill::codec::varint::put_long(&mut neg, 0);
    let e = bounded(r#"{"type":"array","items":"null"}"#, &neg);
    assert!(e.contains("take no bytes"), "{e}");
    // A huge count over items that take bytes: truncated, not looping.
    let e = bounded(r#"{"type":"array","items":"long"}"#, &huge);
    assert!(e.contains("truncated"), "{e}");
    // A 10-byte varint carrying bits beyond the 64th.
    let e = bounded(
        r#""long""#,
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
    );
    assert!(e.contains("over-64-bit"), "{e}");
    // A string claiming more bytes than there are.
    let mut s = Vec::new();
    kafka_backfill::codec::varint::put_long(&mut s, i64::MAX);
    let e = bounded(r#""string""#, &s);
    assert!(e.contains("truncated"), "{e}");
    // Deep nesting: arrays of arrays deeper than MAX_DEPTH, each level holding one item.
    let mut nested = String::from(r#""null""#);
    for _ in 0..60 {
        nested = format!(r#"{{"type":"array","items":{nested}}}"#);
    }
    let e = bounded(&nested, &[0x02; 64]);
    assert!(e.contains("nested deeper"), "{e}");
}

/// Through the log codec, a hostile change is a decode error (the worker then names topic,
/// partition and offset: `CoreError::Undecodable`), in bounded time.
#[test]
fn a_hostile_change_is_a_decode_error() {
    let table = TableSchema::parse(
        r#"{"type":"record","name":"T","fields":[{"name":"id","type":"long"},{"name":"xs","type":{"type":"array","items":"null"}}]}"#,
        &["id".to_string()],
    )
    .unwrap();
    let codec = LogCodec::new(table).unwrap();
    let mut row = vec![0x02]; // id 1
    kafka_backfill::codec::varint::put_long(&mut row, 1 << 62);
    let msg = codec.encode_change(
        kafka_backfill::core::Epoch(1),
        kafka_backfill::core::Op::Insert,
        0,
        &row,
    );
    let t = Instant::now();
    let e = codec.decode(&msg, Some(&[0x02])).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(2));
    assert!(e.to_string().contains("take no bytes"), "{e}");
}
