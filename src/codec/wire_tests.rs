use apache_avro::types::Value;

use super::*;

fn table() -> TableSchema {
    TableSchema::parse(
        include_str!("../../schemas/example_row.avsc"),
        &["id".to_string()],
    )
    .unwrap()
}

fn row(id: i64) -> Value {
    Value::Record(vec![
        ("id".into(), Value::Long(id)),
        ("owner".into(), Value::String(format!("owner-{id}"))),
        ("balance".into(), Value::Long(-5)),
        ("version".into(), Value::Long(1)),
        ("payload".into(), Value::String("é".into())),
    ])
}

#[test]
fn hand_encoding_equals_apache_avro_single_object_encoding() {
    let codec = LogCodec::new(table()).unwrap();
    let datum = codec.table.encode_row(&row(42)).unwrap();
    let ours = codec.encode_change(Epoch(1 << 30), Op::UpdateInsert, 17, &datum);
    let value = Value::Union(
        0,
        Box::new(Value::Record(vec![
            ("epoch".into(), Value::Long(1 << 30)),
            ("op".into(), Value::Enum(3, "UPDATE_INSERT".into())),
            ("vnode".into(), Value::Int(17)),
            ("row".into(), row(42)),
        ])),
    );
    let theirs = apache_avro::to_avro_datum(&codec.schema, value).unwrap();
    assert_eq!(&ours[..2], &[0xC3, 0x01]);
    assert_eq!(&ours[10..], &theirs[..]);
    // And apache-avro reads ours back.
    let mut rest = &ours[10..];
    let back = apache_avro::from_avro_datum(&codec.schema, &mut rest, None).unwrap();
    assert!(matches!(back, Value::Union(0, _)));
}

#[test]
fn published_schema_is_the_example_instance() {
    // schemas/log_record.avsc, parsed as published, has the same fingerprint as the codec builds.
    let published = Schema::parse_str(LOG_RECORD_TEMPLATE).unwrap();
    let codec = LogCodec::new(table()).unwrap();
    assert_eq!(
        published.fingerprint::<Rabin>().bytes,
        codec.fingerprint.to_vec()
    );
}

#[test]
fn round_trips_changes_and_barriers() {
    let codec = LogCodec::new(table()).unwrap();
    let fields = codec
        .table
        .decode_row(&codec.table.encode_row(&row(7)).unwrap())
        .unwrap();
    let key = codec.table.key_of(&fields).unwrap();
    assert_eq!(key, vec![14], "key bytes: zig-zag long 7");
    assert_eq!(
        codec
            .table
            .key_of_datum(&codec.table.encode_row(&row(7)).unwrap())
            .unwrap(),
        key
    );
    let datum = codec.table.encode_row(&row(7)).unwrap();
    let msg = codec.encode_change(Epoch(99), Op::Delete, 3, &datum);
    let LogRecord::Change(c) = codec.decode(&msg, Some(&key)).unwrap() else {
        panic!()
    };
    assert_eq!((c.epoch, c.op, c.vnode), (Epoch(99), Op::Delete, 3));
    assert_eq!(c.row.value, datum);
    assert_eq!(c.row.key, key);
    let b = Barrier {
        prev: Epoch(5),
        curr: Epoch(9),
        kind: BarrierKind::Checkpoint,
        schema_change: false,
    };
    assert_eq!(
        codec.decode(&codec.encode_barrier(&b), None).unwrap(),
        LogRecord::Barrier(b)
    );
}

#[test]
fn malformed_inputs_are_clear_errors() {
    let codec = LogCodec::new(table()).unwrap();
    let datum = codec.table.encode_row(&row(7)).unwrap();
    let msg = codec.encode_change(Epoch(99), Op::Insert, 3, &datum);
    // truncated row
    let err = codec
        .decode(&msg[..msg.len() - 3], Some(&[14]))
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("truncated or malformed datum: Change.row: field payload"),
        "{err}"
    );
    // trailing garbage
    let mut long = msg.clone();
    long.push(0);
    assert!(codec
        .decode(&long, Some(&[14]))
        .unwrap_err()
        .to_string()
        .contains("trailing"));
    // a message key that is not the row's key bytes (id 7 encodes as [14])
    let err = codec.decode(&msg, Some(&[16])).unwrap_err().to_string();
    assert_eq!(
        err,
        "truncated or malformed datum: the message key 10 is not the row's primary-key bytes 0e"
    );
    codec.decode(&msg, Some(&[14])).unwrap();
    // unknown fingerprint
    let mut other = msg.clone();
    other[2] ^= 0xff;
    let err = codec.decode(&other, Some(&[14])).unwrap_err();
    assert!(matches!(err, CodecError::UnknownFingerprint { .. }));
    assert!(
        err.to_string()
            .starts_with("unknown writer schema fingerprint "),
        "{err}"
    );
    // not single-object encoding at all
    assert!(matches!(
        codec.decode(b"{\"json\":1}", None),
        Err(CodecError::NoMarker(_))
    ));
    // wrong type: an enum index out of range
    let mut bad = codec.encode_barrier(&Barrier {
        prev: Epoch(1),
        curr: Epoch(2),
        kind: BarrierKind::Barrier,
        schema_change: false,
    });
    *bad.last_mut().unwrap() = 40;
    assert!(codec
        .decode(&bad, None)
        .unwrap_err()
        .to_string()
        .contains("Barrier.kind: enum index 20"));
    // a change without a key
    assert!(codec.decode(&msg, None).is_err());
}

#[test]
fn primary_key_must_name_fields() {
    let err = TableSchema::parse(
        include_str!("../../schemas/example_row.avsc"),
        &["nope".to_string()],
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "bad schema: primary-key field nope is not a field of Account"
    );
}
