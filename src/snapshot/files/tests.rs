use super::*;

/// A spill record whose varint has bits beyond the 64th is refused (its reader once dropped
/// them and read another number); one that ends inside a varint is an error, not an end.
#[test]
fn a_spill_record_with_an_overlong_or_cut_varint_is_refused() {
    let overlong = [0xffu8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
    let e = next_owned_record(&mut &overlong[..]).unwrap_err();
    assert!(e.to_string().contains("longer than 64 bits"), "{e}");
    assert!(next_owned_record(&mut &[0x80u8][..]).is_err());
    assert!(next_owned_record(&mut &[][..]).unwrap().is_none());
    let mut good = Vec::new();
    put_spill_record(&mut good, 7, b"k", b"datum");
    assert_eq!(
        next_owned_record(&mut &good[..]).unwrap(),
        Some((7, b"k".to_vec(), b"datum".to_vec()))
    );
}
use apache_avro::types::Value;

fn table() -> TableSchema {
    TableSchema::parse(crate::workload::EXAMPLE_ROW_SCHEMA, &["id".to_string()]).unwrap()
}

/// A container's block counts are read with the codec's varint reader: a 10-byte varint whose
/// last byte carries bits beyond the 64th is refused (the old reader dropped them and read 1).
#[test]
fn a_varint_longer_than_64_bits_is_refused_not_truncated() {
    let hostile = [0x82u8, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02];
    let e = read_long(&mut &hostile[..]).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
    let endless = [0xffu8; 12];
    assert!(read_long(&mut &endless[..]).is_err());
    // The largest values still read, a clean end is None and a cut varint an error.
    for n in [i64::MIN, -1, 0, 1, 300, i64::MAX] {
        let mut out = Vec::new();
        crate::codec::varint::put_long(&mut out, n);
        assert_eq!(read_long(&mut &out[..]).unwrap(), Some(n));
    }
    assert_eq!(read_long(&mut &[][..]).unwrap(), None);
    assert_eq!(
        read_long(&mut &[0x80u8][..]).unwrap_err().kind(),
        std::io::ErrorKind::UnexpectedEof
    );
}

fn write(dir: &Path) -> Manifest {
    let t = table();
    let mut rows: BTreeMap<Vnode, BTreeMap<Vec<u8>, Vec<u8>>> = BTreeMap::new();
    for id in 0..300i64 {
        let datum = t
            .encode_row(&Value::Record(vec![
                ("id".into(), Value::Long(id)),
                ("owner".into(), Value::String(format!("o{id}"))),
                ("balance".into(), Value::Long(id * 10)),
                ("version".into(), Value::Long(0)),
                ("payload".into(), Value::String("x".repeat(20))),
            ]))
            .unwrap();
        let key = t.key_of_datum(&datum).unwrap();
        rows.entry(vnode_of(&key, 16))
            .or_default()
            .insert(key, datum);
    }
    let _ = std::fs::remove_dir_all(dir);
    let files = write_files(dir, &t, rows).unwrap();
    let m = Manifest {
        snapshot_epoch: Epoch(1 << 16),
        vnode_count: 16,
        partition_count: 2,
        topic: Some("t".into()),
        row_schema: t.json.clone(),
        primary_key: t.primary_key.clone(),
        files,
        start: vec![],
    };
    write_manifest(dir, &m).unwrap();
    m
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("kb-snapfiles-{name}-{}", std::process::id()))
}

/// Rows added in any order come out as the same files `write_files` writes from sorted maps,
/// the spill folder is gone, and a repeated key is refused.
#[test]
fn the_sorted_writer_writes_what_write_files_writes_from_rows_in_any_order() {
    let want = tmp("sorted-want");
    let m = write(&want);
    let t = table();
    let src = SnapshotFiles::open(&want).unwrap();
    let mut all = Vec::new();
    for v in 0..16 {
        all.extend(src.scan(v, None).unwrap().map(|r| (v, r.unwrap())));
    }
    let mut rng = crate::rng::SimRng::new(7);
    for i in (1..all.len()).rev() {
        all.swap(i, rng.below(i as u64 + 1) as usize);
    }
    // In memory, and in runs of 200 bytes merged (every bucket, ~850 bytes, is larger than a run).
    for run_bytes in [SORT_RUN_BYTES, 200] {
        let got = tmp(&format!("sorted-got-{run_bytes}"));
        let _ = std::fs::remove_dir_all(&got);
        let mut w = SortedWriter::new(&got, &t, 16)
            .unwrap()
            .with_run_bytes(run_bytes);
        for (v, row) in &all {
            w.add(*v, &row.key, &row.value).unwrap();
        }
        let files = w.finish().unwrap();
        assert_eq!(files.len(), m.files.len());
        for f in &files {
            assert_eq!(
                std::fs::read(got.join(&f.path)).unwrap(),
                std::fs::read(want.join(&f.path)).unwrap(),
                "{} (runs of {run_bytes} bytes)",
                f.path
            );
        }
        assert!(!got.join(".spill").exists());
    }
    let dup = tmp("sorted-dup");
    for run_bytes in [SORT_RUN_BYTES, 10] {
        let _ = std::fs::remove_dir_all(&dup);
        let mut w = SortedWriter::new(&dup, &t, 16)
            .unwrap()
            .with_run_bytes(run_bytes);
        let (v, row) = &all[0];
        w.add(*v, &row.key, &row.value).unwrap();
        w.add(*v, &all[1].1.key, &all[1].1.value).unwrap();
        w.add(*v, &row.key, &row.value).unwrap();
        assert!(w
            .finish()
            .unwrap_err()
            .to_string()
            .contains("appears twice"));
    }
}

#[test]
fn scans_per_vnode_in_key_order_from_a_cursor_and_apache_avro_reads_the_files() {
    let dir = tmp("ok");
    let m = write(&dir);
    let s = SnapshotFiles::open(&dir).unwrap();
    let mut total = 0;
    for v in 0..16 {
        let rows: Vec<Row> = s.scan(v, None).unwrap().map(|r| r.unwrap()).collect();
        assert!(rows.windows(2).all(|w| w[0].key < w[1].key), "key order");
        total += rows.len();
        if rows.len() > 2 {
            let after: Vec<Row> = s
                .scan(v, Some(&rows[1].key))
                .unwrap()
                .map(|r| r.unwrap())
                .collect();
            assert_eq!(
                after,
                rows[2..].to_vec(),
                "resumes strictly after the cursor"
            );
        }
    }
    assert_eq!(total, 300);
    let f = std::fs::File::open(dir.join(&m.files[0].path)).unwrap();
    let n = apache_avro::Reader::new(f)
        .unwrap()
        .filter(|v| v.as_ref().map(|_| true).expect("valid record"))
        .count();
    assert_eq!(n as u64, m.files[0].rows);
}

#[test]
fn a_missing_or_corrupt_file_is_an_error_naming_it() {
    let dir = tmp("bad");
    let m = write(&dir);
    let victim = dir.join(&m.files[0].path);
    let mut bytes = std::fs::read(&victim).unwrap();
    let n = bytes.len();
    bytes[n - 20] ^= 0xff; // inside the last block's data or sync marker
    std::fs::write(&victim, &bytes).unwrap();
    let s = SnapshotFiles::open(&dir).unwrap();
    let v = m.files[0].vnodes[0];
    let e = s.scan(v, None).err().expect("corrupt").to_string();
    assert!(
        e.starts_with(&format!("snapshot file {}", victim.display())),
        "{e}"
    );
    std::fs::remove_file(&victim).unwrap();
    let e = SnapshotFiles::open(&dir)
        .err()
        .expect("missing")
        .to_string();
    assert_eq!(
        e,
        format!(
            "snapshot file {}: missing (listed in manifest.json)",
            victim.display()
        )
    );
}

/// (key, datum) rows by vnode.
type ByVnode = BTreeMap<Vnode, Vec<(Vec<u8>, Vec<u8>)>>;

/// Row `id` of the example table with a payload of `payload` bytes, as a datum.
fn datum(t: &TableSchema, id: i64, payload: usize) -> Vec<u8> {
    t.encode_row(&Value::Record(vec![
        ("id".into(), Value::Long(id)),
        ("owner".into(), Value::String(format!("o{id}"))),
        ("balance".into(), Value::Long(id)),
        ("version".into(), Value::Long(0)),
        ("payload".into(), Value::String("y".repeat(payload))),
    ]))
    .unwrap()
}

/// Rows of the example table by vnode (16 vnodes).
fn rows_by_vnode(n: i64) -> ByVnode {
    let t = table();
    let mut out: ByVnode = BTreeMap::new();
    for id in 0..n {
        let datum = datum(&t, id, 30);
        let key = t.key_of_datum(&datum).unwrap();
        out.entry(vnode_of(&key, 16))
            .or_default()
            .push((key, datum));
    }
    out
}

/// Writes `rows` (datums, in the given order) with apache-avro's writer and `codec`.
fn write_avro(path: &Path, schema_json: &str, datums: &[&[u8]], codec: apache_avro::Codec) {
    let schema = apache_avro::Schema::parse_str(schema_json).unwrap();
    let f = std::fs::File::create(path).unwrap();
    let mut w = apache_avro::Writer::builder()
        .schema(&schema)
        .writer(f)
        .codec(codec)
        .block_size(512)
        .build();
    for d in datums {
        let v = apache_avro::from_avro_datum(&schema, &mut &d[..], None).unwrap();
        w.append(v).unwrap();
    }
    w.flush().unwrap();
}

fn manifest_with(files: Vec<ManifestFile>) -> Manifest {
    let t = table();
    Manifest {
        snapshot_epoch: Epoch(1 << 16),
        vnode_count: 16,
        partition_count: 2,
        topic: None,
        row_schema: t.json.clone(),
        primary_key: t.primary_key.clone(),
        files,
        start: vec![],
    }
}

/// Every row of every vnode, scanned (and resumed from a cursor) the same in every layout.
fn check_layout(dir: &Path, expected: &ByVnode) {
    let s = SnapshotFiles::open(dir).unwrap();
    for v in 0..16 {
        let mut want: Vec<Row> = expected
            .get(&v)
            .map(|rs| {
                rs.iter()
                    .map(|(k, d)| Row {
                        key: k.clone(),
                        value: d.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        want.sort_by(|a, b| a.key.cmp(&b.key));
        let got: Vec<Row> = s.scan(v, None).unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(got, want, "vnode {v}");
        for cut in [0, want.len() / 2, want.len().saturating_sub(1)] {
            if let Some(c) = want.get(cut) {
                let rest: Vec<Row> = s
                    .scan(v, Some(&c.key))
                    .unwrap()
                    .map(|r| r.unwrap())
                    .collect();
                assert_eq!(rest, want[cut + 1..].to_vec(), "vnode {v} after row {cut}");
            }
        }
    }
}

/// One file of more vnodes than spill buckets, rows shuffled: every vnode scans exactly (its
/// bucket shared with others), the file is spilled once, and the spill folder goes with the
/// snapshot.
#[test]
fn a_file_of_many_vnodes_is_spilled_once_by_vnode_and_cleaned_up() {
    let t = table();
    let vnodes = 600u32;
    let mut rows: BTreeMap<Vnode, BTreeMap<Vec<u8>, Vec<u8>>> = BTreeMap::new();
    for id in 0..3_000i64 {
        let datum = datum(&t, id, 10);
        let key = t.key_of_datum(&datum).unwrap();
        rows.entry(vnode_of(&key, vnodes))
            .or_default()
            .insert(key, datum);
    }
    let dir = tmp("spill");
    let _ = std::fs::remove_dir_all(&dir);
    let file = write_single_file(&dir, &t, rows.clone(), 9).unwrap();
    assert!(file.vnodes.len() > SPILL_BUCKETS);
    write_manifest(
        &dir,
        &Manifest {
            vnode_count: vnodes,
            ..manifest_with(vec![file])
        },
    )
    .unwrap();
    let s = SnapshotFiles::open(&dir).unwrap();
    let root = s.spill_root.clone();
    assert!(!root.exists(), "nothing is spilled before a scan");
    for v in 0..vnodes as Vnode {
        let want: Vec<Row> = rows
            .get(&v)
            .map(|r| {
                r.iter()
                    .map(|(k, d)| Row {
                        key: k.clone(),
                        value: d.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let got: Vec<Row> = s.scan(v, None).unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(got, want, "vnode {v}");
    }
    assert_eq!(s.spills.lock().unwrap().len(), 1, "spilled once");
    let buckets = std::fs::read_dir(root.join("file-00000")).unwrap().count();
    assert_eq!(buckets, SPILL_BUCKETS);
    drop(s);
    assert!(!root.exists(), "the spill folder outlived the snapshot");
}

#[test]
fn reads_every_layout_the_manifest_allows_in_every_codec() {
    let t = table();
    let schema = t.json.to_string();
    let rows = rows_by_vnode(400);
    let all_vnodes: Vec<Vnode> = (0..16).collect();
    for codec in [
        apache_avro::Codec::Null,
        apache_avro::Codec::Deflate(Default::default()),
        apache_avro::Codec::Snappy,
        apache_avro::Codec::Zstandard(Default::default()),
    ] {
        let name: &str = codec.into();
        // (a) one file holding every vnode, rows interleaved (id order, not key order).
        let dir = tmp(&format!("one-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut interleaved: Vec<(i64, &[u8])> = Vec::new();
        for rs in rows.values() {
            for (k, d) in rs {
                let id = t.decode_row(d).unwrap()[0].clone();
                let Value::Long(id) = id else { panic!() };
                interleaved.push((id, d.as_slice()));
                let _ = k;
            }
        }
        interleaved.sort_by_key(|(id, _)| *id);
        let datums: Vec<&[u8]> = interleaved.iter().map(|(_, d)| *d).collect();
        write_avro(&dir.join("all.avro"), &schema, &datums, codec);
        write_manifest(
            &dir,
            &manifest_with(vec![ManifestFile {
                path: "all.avro".into(),
                vnodes: all_vnodes.iter().rev().copied().collect(),
                rows: datums.len() as u64,
            }]),
        )
        .unwrap();
        check_layout(&dir, &rows);

        // (b) each vnode split over two files, vnodes grouped, files listed in reverse order.
        let dir = tmp(&format!("split-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (mut first, mut second) = (Vec::new(), Vec::new());
        for rs in rows.values() {
            for (i, (_, d)) in rs.iter().enumerate() {
                if i % 2 == 0 {
                    first.push(d.as_slice());
                } else {
                    second.push(d.as_slice());
                }
            }
        }
        write_avro(&dir.join("a.avro"), &schema, &first, codec);
        write_avro(&dir.join("b.avro"), &schema, &second, codec);
        write_manifest(
            &dir,
            &manifest_with(vec![
                ManifestFile {
                    path: "b.avro".into(),
                    vnodes: all_vnodes.clone(),
                    rows: second.len() as u64,
                },
                ManifestFile {
                    path: "a.avro".into(),
                    vnodes: all_vnodes.clone(),
                    rows: first.len() as u64,
                },
            ]),
        )
        .unwrap();
        check_layout(&dir, &rows);
    }
}

#[test]
fn a_header_schema_other_than_the_manifests_or_a_row_of_an_unlisted_vnode_is_an_error_naming_the_file(
) {
    let t = table();
    let rows = rows_by_vnode(100);
    let datums: Vec<&[u8]> = rows.values().flatten().map(|(_, d)| d.as_slice()).collect();
    let dir = tmp("mismatch");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let other = t.json.to_string().replace("\"balance\"", "\"saldo\"");
    write_avro(
        &dir.join("x.avro"),
        &other,
        &datums,
        apache_avro::Codec::Null,
    );
    let all: Vec<Vnode> = (0..16).collect();
    write_manifest(
        &dir,
        &manifest_with(vec![ManifestFile {
            path: "x.avro".into(),
            vnodes: all,
            rows: 0,
        }]),
    )
    .unwrap();
    let e = SnapshotFiles::open(&dir)
        .err()
        .expect("mismatch")
        .to_string();
    assert!(
        e.starts_with(&format!("snapshot file {}", dir.join("x.avro").display()))
            && e.contains("is not the manifest's row_schema"),
        "{e}"
    );
    // The right schema, but the file lists only vnode 3 while holding others.
    write_avro(
        &dir.join("x.avro"),
        &t.json.to_string(),
        &datums,
        apache_avro::Codec::Null,
    );
    write_manifest(
        &dir,
        &manifest_with(vec![ManifestFile {
            path: "x.avro".into(),
            vnodes: vec![3],
            rows: 0,
        }]),
    )
    .unwrap();
    let s = SnapshotFiles::open(&dir).unwrap();
    let e = s.scan(3, None).err().expect("unlisted vnode").to_string();
    assert!(
        e.contains("which manifest.json does not list for this file"),
        "{e}"
    );
}

/// A capture's one-table manifest (its row record `<schema>_<table>`) answers to the table's plain
/// name, as the capture's later manifests of several tables name it; nothing else does.
#[test]
fn a_one_table_manifest_answers_to_its_record_and_its_plain_table_name() {
    assert!(one_table_answers_to(
        "public_pgbench_accounts",
        "public_pgbench_accounts"
    ));
    assert!(one_table_answers_to(
        "public_pgbench_accounts",
        "pgbench_accounts"
    ));
    assert!(!one_table_answers_to(
        "public_pgbench_accounts",
        "accounts_x"
    ));
    assert!(!one_table_answers_to(
        "public_pgbench_accounts",
        "bench_accounts"
    ));
    assert!(!one_table_answers_to("_accounts", "accounts"));
}
