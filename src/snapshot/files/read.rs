//! Reading a snapshot: [`SnapshotFiles`] opens a manifest, checks every file's header, and scans
//! a vnode in key order from a cursor, spilling files of several vnodes once (module docs above).

use super::*;

/// A snapshot on disk, opened through its manifest.
pub struct SnapshotFiles {
    dir: PathBuf,
    /// The manifest of the table read (for a several-table manifest, that table's view).
    pub manifest: Manifest,
    /// Every table of the log, in manifest order (one for a one-table manifest).
    pub tables: std::sync::Arc<[LogTable]>,
    /// Which of them this snapshot reads.
    pub table_index: usize,
    /// Keys of `manifest.json` this release does not know and ignored (paths such as
    /// `start.0.streaming`), warned about once at open.
    pub ignored_keys: Vec<String>,
    pub table: TableSchema,
    info: SnapshotInfo,
    /// The files of each vnode, as indexes into `manifest.files`.
    by_vnode: BTreeMap<Vnode, Vec<usize>>,
    /// Multi-vnode files spilled so far, by index into `manifest.files`.
    pub(super) spills: std::sync::Mutex<BTreeMap<usize, std::sync::Arc<Spill>>>,
    /// This snapshot's spill folder (created on the first spill, removed on drop).
    pub(super) spill_root: PathBuf,
}

impl Drop for SnapshotFiles {
    fn drop(&mut self) {
        if self.spill_root.exists() {
            if let Err(e) = fs::remove_dir_all(&self.spill_root) {
                tracing::warn!(dir = %self.spill_root.display(), error = %e, "could not remove the snapshot's spill folder");
            }
        }
    }
}

impl SnapshotFiles {
    /// Opens `dir/manifest.json`, checks that every file it names exists, lists only vnodes below
    /// `vnode_count`, and has the manifest's row schema in its header.
    pub fn open(dir: &Path) -> Result<Self, SourceError> {
        Self::open_table(dir, None)
    }

    /// [`open`](Self::open) for table `name` of the log (`None`: its only table). A several-table
    /// manifest (`tables`) needs a name when it holds more than one; a one-table manifest's table is
    /// named by its row record.
    pub fn open_table(dir: &Path, name: Option<&str>) -> Result<Self, SourceError> {
        ParsedManifest::read(dir)?.table(dir, name)
    }

    /// [`open_table`](Self::open_table) for each of `names`, the manifest read and its tables
    /// checked once (each table's own files' headers are still each checked): opening a
    /// 200-table snapshot table by table read and checked the manifest 200 times.
    pub fn open_tables(dir: &Path, names: &[&str]) -> Result<Vec<Self>, SourceError> {
        let parsed = ParsedManifest::read(dir)?;
        names.iter().map(|n| parsed.table(dir, Some(n))).collect()
    }
}

/// A manifest's two forms (docs/WIRE.md "Several tables").
enum Form {
    Several(TablesManifest),
    One(Manifest),
}

/// A manifest read and its tables checked, before one table of it is opened.
struct ParsedManifest {
    mpath: PathBuf,
    ignored_keys: Vec<String>,
    form: Form,
    tables: std::sync::Arc<[LogTable]>,
}

impl ParsedManifest {
    fn read(dir: &Path) -> Result<Self, SourceError> {
        let mpath = dir.join("manifest.json");
        let text = fs::read_to_string(&mpath).map_err(|e| file_err(&mpath, e))?;
        // Keys this release does not know are ignored with one warning naming them: a manifest
        // written for an earlier release (whose `start[]` entries carried `streaming`) or by a later
        // writer still opens. Every key this release needs is required and typed.
        let mut ignored_keys = Vec::new();
        let several = serde_json::from_str::<serde_json::Value>(&text)
            .map_err(|e| file_err(&mpath, format!("invalid manifest: {e}")))?
            .get("tables")
            .is_some();
        if several {
            let m: TablesManifest = serde_ignored::deserialize(
                &mut serde_json::Deserializer::from_str(&text),
                |path| ignored_keys.push(path.to_string()),
            )
            .map_err(|e| file_err(&mpath, format!("invalid manifest: {e}")))?;
            if let Some(k) = ignored_keys
                .iter()
                .find(|k| ["row_schema", "primary_key", "files"].contains(&k.as_str()))
            {
                return Err(file_err(
                    &mpath,
                    format!("invalid manifest: `{k}` beside `tables`: a manifest is one table (row_schema, primary_key, files) or several (tables), not both"),
                ));
            }
            let tables = log_tables(&m, &mpath)?.into();
            Ok(ParsedManifest {
                mpath,
                ignored_keys,
                form: Form::Several(m),
                tables,
            })
        } else {
            let m: Manifest = serde_ignored::deserialize(
                &mut serde_json::Deserializer::from_str(&text),
                |path| ignored_keys.push(path.to_string()),
            )
            .map_err(|e| file_err(&mpath, format!("invalid manifest: {e}")))?;
            let schema = TableSchema::parse(&m.row_schema.to_string(), &m.primary_key)
                .map_err(|e: CodecError| file_err(&mpath, e))?;
            let tables = vec![LogTable {
                name: schema.name.clone(),
                schema,
            }]
            .into();
            Ok(ParsedManifest {
                mpath,
                ignored_keys,
                form: Form::One(m),
                tables,
            })
        }
    }

    /// Opens table `name` of the manifest (`None`: its only table).
    fn table(&self, dir: &Path, name: Option<&str>) -> Result<SnapshotFiles, SourceError> {
        let (mpath, tables) = (&self.mpath, self.tables.clone());
        let ignored_keys = self.ignored_keys.clone();
        let (manifest, table_index) = match &self.form {
            Form::Several(m) => {
                let index = match name {
                    Some(n) => tables.iter().position(|t| t.name == n).ok_or_else(|| {
                        let why = match m.removed.iter().find(|r| r.name == n) {
                            Some(r) => format!(
                                "table {n} was removed from its capture at epoch {} (docs/CAPTURE.md \"Removing a table\"): snapshots taken since do not hold it, and the log has none of its changes from that epoch on; take it out of the job (its tables: {})",
                                r.from_epoch,
                                names(&tables)
                            ),
                            None => format!(
                                "no table {n} in the manifest (its tables: {})",
                                names(&tables)
                            ),
                        };
                        file_err(mpath, why)
                    })?,
                    None if tables.len() == 1 => 0,
                    None => {
                        return Err(file_err(
                            mpath,
                            format!(
                                "the manifest holds {} tables ({}): name the job's with `snapshot.table`",
                                tables.len(),
                                names(&tables)
                            ),
                        ))
                    }
                };
                (m.table_view(index), index)
            }
            Form::One(m) => {
                // Named by its row record; a capture's record is `<schema>_<table>`, and a job of
                // a capture that gained tables names it by the table alone, as the capture's
                // later manifests do (docs/CAPTURE.md "Adding a table").
                let table_name = &tables[0].name;
                if let Some(n) = name.filter(|n| !one_table_answers_to(table_name, n)) {
                    return Err(file_err(
                        mpath,
                        format!("no table {n} in the manifest (its one table is {table_name})"),
                    ));
                }
                (m.clone(), 0)
            }
        };
        let mpath = mpath.clone();
        if !ignored_keys.is_empty() {
            tracing::warn!(file = %mpath.display(), keys = %ignored_keys.join(", "), "manifest.json: ignoring keys this release does not know");
        }
        let table = tables[table_index].schema.clone();
        let canonical = table.schema.canonical_form();
        let mut by_vnode: BTreeMap<Vnode, Vec<usize>> = BTreeMap::new();
        for (i, f) in manifest.files.iter().enumerate() {
            let p = dir.join(&f.path);
            if !p.is_file() {
                return Err(file_err(&p, "missing (listed in manifest.json)"));
            }
            let header = read_header(&p)?;
            let schema = apache_avro::Schema::parse_str(&header.schema)
                .map_err(|e| file_err(&p, format!("header schema does not parse: {e}")))?;
            if schema.canonical_form() != canonical {
                return Err(file_err(
                    &p,
                    format!(
                        "header schema {} is not the manifest's row_schema {canonical}",
                        schema.canonical_form()
                    ),
                ));
            }
            for v in &f.vnodes {
                if *v as u32 >= manifest.vnode_count {
                    return Err(file_err(
                        &mpath,
                        format!(
                            "file {} lists vnode {v} beyond vnode_count {}",
                            f.path, manifest.vnode_count
                        ),
                    ));
                }
                let files = by_vnode.entry(*v).or_default();
                if !files.contains(&i) {
                    files.push(i);
                }
            }
        }
        let info = SnapshotInfo {
            snapshot_epoch: manifest.snapshot_epoch,
            vnode_count: manifest.vnode_count,
            partition_count: manifest.partition_count,
            start: manifest.start.iter().map(PartitionProgress::from).collect(),
        };
        Ok(SnapshotFiles {
            dir: dir.to_path_buf(),
            manifest,
            tables,
            table_index,
            ignored_keys,
            table,
            info,
            by_vnode,
            spills: std::sync::Mutex::new(BTreeMap::new()),
            spill_root: std::env::temp_dir().join(format!(
                "kafka-backfill-spill-{}-{}",
                std::process::id(),
                SPILL_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            )),
        })
    }
}

impl SnapshotFiles {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every row datum of one file, checked against the schema (the bare-decode baseline).
    pub fn read_file(&self, path: &Path) -> Result<Vec<Vec<u8>>, SourceError> {
        read_container(path, &self.table)
    }

    /// Calls `each(n, key, datum)` for every row of file `index` in file order, checking that its
    /// key hashes to a vnode the manifest lists for the file (an error names the file and row).
    fn for_each_row(
        &self,
        index: usize,
        mut each: impl FnMut(Vnode, Vec<u8>, Vec<u8>) -> Result<(), SourceError>,
    ) -> Result<(), SourceError> {
        let f = &self.manifest.files[index];
        let path = self.dir.join(&f.path);
        // Checked for every row: a bitmap, not a scan of the list (a file may list every vnode).
        let mut listed = crate::core::VnodeBitmap::new(self.manifest.vnode_count);
        for &v in &f.vnodes {
            listed.set(v);
        }
        let mut n = 0u64;
        for_each_datum(&path, &self.table, |value| {
            let key = self
                .table
                .key_of_datum(&value)
                .map_err(|e| file_err(&path, format!("row {n}: {e}")))?;
            let vnode = vnode_of(&key, self.manifest.vnode_count);
            if !listed.contains(vnode) {
                return Err(file_err(
                    &path,
                    format!(
                        "row {n} has a key that hashes to vnode {vnode}, which manifest.json does not list for this file"
                    ),
                ));
            }
            n += 1;
            each(vnode, key, value)
        })
    }

    /// File `index` (listing several vnodes) spilled into bucket files, once.
    fn spill(&self, index: usize) -> Result<std::sync::Arc<Spill>, SourceError> {
        let mut spills = self.spills.lock().unwrap();
        if let Some(s) = spills.get(&index) {
            return Ok(s.clone());
        }
        let f = &self.manifest.files[index];
        let spill = Spill {
            dir: self.spill_root.join(format!("file-{index:05}")),
            buckets: f.vnodes.len().clamp(1, SPILL_BUCKETS),
        };
        fs::create_dir_all(&spill.dir).map_err(|e| file_err(&spill.dir, e))?;
        let mut writers: BTreeMap<usize, BufWriter<fs::File>> = BTreeMap::new();
        let started = std::time::Instant::now();
        let mut rows = 0u64;
        self.for_each_row(index, |vnode, key, value| {
            let b = vnode as usize % spill.buckets;
            let w = match writers.entry(b) {
                std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => {
                    let p = spill.bucket(vnode);
                    let file = fs::File::create(&p).map_err(|e| file_err(&p, e))?;
                    v.insert(BufWriter::with_capacity(64 * 1024, file))
                }
            };
            let mut put = |bytes: &[u8]| w.write_all(bytes);
            put(&u32::from(vnode).to_le_bytes())
                .and_then(|_| put(&(key.len() as u32).to_le_bytes()))
                .and_then(|_| put(&key))
                .and_then(|_| put(&(value.len() as u32).to_le_bytes()))
                .and_then(|_| put(&value))
                .map_err(|e| file_err(&spill.bucket(vnode), format!("spilling: {e}")))?;
            rows += 1;
            Ok(())
        })?;
        for (b, mut w) in writers {
            w.flush()
                .map_err(|e| file_err(&spill.dir.join(format!("bucket-{b:05}.rows")), e))?;
        }
        tracing::info!(file = %self.dir.join(&f.path).display(), rows, buckets = spill.buckets, ms = started.elapsed().as_millis() as u64, spill = %spill.dir.display(), "multi-vnode snapshot file spilled by vnode");
        let spill = std::sync::Arc::new(spill);
        spills.insert(index, spill.clone());
        Ok(spill)
    }

    /// Vnode `vnode`'s rows of file `index`, in file order.
    fn rows_of(&self, index: usize, vnode: Vnode, out: &mut Vec<Row>) -> Result<(), SourceError> {
        if self.manifest.files[index].vnodes.len() <= 1 {
            return self.for_each_row(index, |_, key, value| {
                out.push(Row { key, value });
                Ok(())
            });
        }
        let spill = self.spill(index)?;
        let path = spill.bucket(vnode);
        let file = match fs::File::open(&path) {
            Ok(f) => f,
            // No row of this bucket's vnodes in the file.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(file_err(&path, e)),
        };
        let mut r = std::io::BufReader::with_capacity(64 * 1024, file);
        let bad = |e: std::io::Error| file_err(&path, format!("reading the spill: {e}"));
        loop {
            let mut head = [0u8; 4];
            match std::io::Read::read_exact(&mut r, &mut head) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(bad(e)),
            }
            let v = u32::from_le_bytes(head);
            let field = |r: &mut std::io::BufReader<fs::File>| -> std::io::Result<Vec<u8>> {
                let mut len = [0u8; 4];
                std::io::Read::read_exact(r, &mut len)?;
                let mut bytes = vec![0u8; u32::from_le_bytes(len) as usize];
                std::io::Read::read_exact(r, &mut bytes)?;
                Ok(bytes)
            };
            let key = field(&mut r).map_err(bad)?;
            let value = field(&mut r).map_err(bad)?;
            if v == u32::from(vnode) {
                out.push(Row { key, value });
            }
        }
    }
}

/// What a container file's header says.
pub(super) struct Header {
    schema: String,
    codec: apache_avro::Codec,
    sync: [u8; 16],
    /// Bytes the header takes.
    len: usize,
}

pub(super) fn parse_header(path: &Path, bytes: &[u8]) -> Result<Header, SourceError> {
    let corrupt = |what: &str| file_err(path, format!("corrupt container file: {what}"));
    let mut buf = bytes;
    if buf.len() < 4 || &buf[..4] != MAGIC {
        return Err(corrupt("no Avro magic"));
    }
    buf = &buf[4..];
    let mut codec = b"null".to_vec();
    let mut schema = None;
    loop {
        let n = get_long(&mut buf).ok_or_else(|| corrupt("truncated header"))?;
        if n == 0 {
            break;
        }
        if n < 0 {
            get_long(&mut buf).ok_or_else(|| corrupt("truncated header"))?;
        }
        for _ in 0..n.unsigned_abs() {
            let mut field = || -> Option<Vec<u8>> {
                let l = usize::try_from(get_long(&mut buf)?).ok()?;
                if buf.len() < l {
                    return None;
                }
                let (v, rest) = buf.split_at(l);
                buf = rest;
                Some(v.to_vec())
            };
            let k = field().ok_or_else(|| corrupt("truncated header"))?;
            let v = field().ok_or_else(|| corrupt("truncated header"))?;
            match k.as_slice() {
                b"avro.codec" => codec = v,
                b"avro.schema" => schema = Some(String::from_utf8_lossy(&v).into_owned()),
                _ => {}
            }
        }
    }
    let codec_name = String::from_utf8_lossy(&codec).into_owned();
    let codec = match codec_name.as_str() {
        "null" | "deflate" | "snappy" | "zstandard" => {
            <apache_avro::Codec as std::str::FromStr>::from_str(&codec_name)
                .map_err(|_| file_err(path, format!("codec {codec_name} is not built in")))?
        }
        other => {
            return Err(file_err(
                path,
                format!("codec {other} is not supported (use null, deflate, snappy or zstandard)"),
            ))
        }
    };
    let schema = schema.ok_or_else(|| corrupt("no avro.schema in the header"))?;
    if buf.len() < 16 {
        return Err(corrupt("truncated header"));
    }
    let mut sync = [0u8; 16];
    sync.copy_from_slice(&buf[..16]);
    Ok(Header {
        schema,
        codec,
        sync,
        len: bytes.len() - buf.len() + 16,
    })
}

/// Reads only the header of a container file.
pub(super) fn read_header(path: &Path) -> Result<Header, SourceError> {
    use std::io::Read;
    let mut f = fs::File::open(path).map_err(|e| file_err(path, e))?;
    let mut bytes = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut chunk).map_err(|e| file_err(path, e))?;
        bytes.extend_from_slice(&chunk[..n]);
        match parse_header(path, &bytes) {
            Ok(h) => return Ok(h),
            Err(e) if n == 0 || bytes.len() > 16 << 20 => return Err(e),
            Err(_) => {}
        }
    }
}

/// Reads one container file (any supported codec), checking every datum.
pub(super) fn read_container(
    path: &Path,
    table: &TableSchema,
) -> Result<Vec<Vec<u8>>, SourceError> {
    let mut rows = Vec::new();
    for_each_datum(path, table, |d| {
        rows.push(d);
        Ok(())
    })?;
    Ok(rows)
}

/// A zig-zag varint from a reader; `None` at a clean end of input before its first byte.
pub(super) fn read_long(r: &mut impl std::io::Read) -> std::io::Result<Option<i64>> {
    // The bytes of one varint (at most 10), decoded by the codec's own reader, which refuses bits
    // beyond the 64th instead of dropping them.
    let mut bytes = [0u8; 10];
    let mut n = 0;
    while n < bytes.len() {
        let mut b = [0u8; 1];
        if r.read(&mut b)? == 0 {
            return if n == 0 {
                Ok(None)
            } else {
                Err(std::io::ErrorKind::UnexpectedEof.into())
            };
        }
        bytes[n] = b[0];
        n += 1;
        if b[0] & 0x80 == 0 {
            break;
        }
    }
    let mut slice = &bytes[..n];
    match crate::codec::varint::get_long(&mut slice) {
        Some(v) => Ok(Some(v)),
        None => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "varint longer than 64 bits",
        )),
    }
}

/// Calls `each` with every datum of a container file (any supported codec), checked against the
/// schema, reading one block at a time (memory: one block, never the file).
pub(super) fn for_each_datum(
    path: &Path,
    table: &TableSchema,
    mut each: impl FnMut(Vec<u8>) -> Result<(), SourceError>,
) -> Result<(), SourceError> {
    use std::io::{Read, Seek};
    let corrupt = |what: String| file_err(path, format!("corrupt container file: {what}"));
    let header = read_header(path)?;
    let mut f = fs::File::open(path).map_err(|e| file_err(path, e))?;
    f.seek(std::io::SeekFrom::Start(header.len as u64))
        .map_err(|e| file_err(path, e))?;
    let mut r = std::io::BufReader::with_capacity(256 * 1024, f);
    let mut block_no = 0;
    let mut data = Vec::new();
    loop {
        let count = match read_long(&mut r) {
            Ok(None) => return Ok(()),
            Ok(Some(c)) => c,
            Err(_) => return Err(corrupt(format!("block {block_no}: truncated count"))),
        };
        let size = read_long(&mut r)
            .ok()
            .flatten()
            .ok_or_else(|| corrupt(format!("block {block_no}: truncated size")))?;
        let size = usize::try_from(size)
            .map_err(|_| corrupt(format!("block {block_no}: negative size")))?;
        if count < 0 {
            return Err(corrupt(format!("block {block_no}: truncated")));
        }
        data.resize(size, 0);
        let mut sync = [0u8; 16];
        r.read_exact(&mut data)
            .and_then(|_| r.read_exact(&mut sync))
            .map_err(|_| corrupt(format!("block {block_no}: truncated")))?;
        if sync != header.sync {
            return Err(corrupt(format!("block {block_no}: sync marker mismatch")));
        }
        let mut block = std::mem::take(&mut data);
        header
            .codec
            .decompress(&mut block)
            .map_err(|e| corrupt(format!("block {block_no}: does not decompress: {e}")))?;
        let mut d = &block[..];
        for i in 0..count {
            let before = d;
            let mut probe = d;
            crate::codec::skip_datum(&table.schema, &mut probe)
                .map_err(|e| corrupt(format!("block {block_no} row {i}: {e}")))?;
            let used = before.len() - probe.len();
            each(before[..used].to_vec())?;
            d = probe;
        }
        if !d.is_empty() {
            return Err(corrupt(format!(
                "block {block_no}: {} bytes beyond its {count} rows",
                d.len()
            )));
        }
        data = block;
        block_no += 1;
    }
}

impl SnapshotSource for SnapshotFiles {
    fn info(&self) -> &SnapshotInfo {
        &self.info
    }

    fn scan(&self, vnode: Vnode, after: Option<&[u8]>) -> Result<RowIter<'_>, SourceError> {
        let Some(files) = self.by_vnode.get(&vnode) else {
            return Ok(Box::new(std::iter::empty()));
        };
        let mut rows: Vec<Row> = Vec::new();
        for &i in files {
            self.rows_of(i, vnode, &mut rows)?;
        }
        rows.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        if let Some(w) = rows.windows(2).find(|w| w[0].key == w[1].key) {
            return Err(file_err(
                &self.dir.join("manifest.json"),
                format!(
                    "vnode {vnode} holds the key {} twice (in its files {})",
                    crate::ports::key_hex(&w[0].key),
                    files
                        .iter()
                        .map(|&i| self.manifest.files[i].path.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        if let Some(a) = after {
            let start = rows.partition_point(|r| r.key.as_slice() <= a);
            rows.drain(..start);
        }
        Ok(Box::new(rows.into_iter().map(Ok)))
    }
}

/// Whether a one-table manifest whose row record is named `record` answers to `name`: its record's
/// name, or the table's alone when the record is a capture's `<schema>_<table>`.
pub fn one_table_answers_to(record: &str, name: &str) -> bool {
    name == record
        || record
            .strip_suffix(name)
            .is_some_and(|schema| schema.ends_with('_') && schema.len() > 1)
}
