//! The capture's sort of a snapshot by vnode and key in bounded memory: rows spilled to bucket
//! runs, each bucket sorted and merged into its vnodes' container files.

use super::*;

/// Writes a snapshot of rows that arrive in any order as sorted per-vnode files, in bounded
/// memory: rows are appended to at most 256 bucket files by vnode under `<dir>/.spill`, then each
/// bucket is sorted by key and written as its vnodes' container files (what `capture` uses). A
/// bucket up to [`SORT_RUN_BYTES`] is sorted in memory; a larger one is sorted in runs of that size
/// and merged, so memory stays under two runs (two buckets are sorted at a time) whatever the table's
/// size. A key seen twice is an error.
pub struct SortedWriter {
    dir: PathBuf,
    spill: PathBuf,
    schema_json: String,
    buckets: Vec<BufWriter<fs::File>>,
    rows: u64,
    run_bytes: usize,
    /// One row's spill header, reused.
    head: Vec<u8>,
}

/// The largest bucket sorted in memory, and the size of each sorted run of a larger one.
pub const SORT_RUN_BYTES: usize = 2 << 20;

impl SortedWriter {
    pub fn new(dir: &Path, table: &TableSchema, vnode_count: u32) -> Result<Self, SourceError> {
        let spill = dir.join(".spill");
        fs::create_dir_all(&spill).map_err(|e| file_err(&spill, e))?;
        let n = vnode_count.clamp(1, 256) as usize;
        let buckets = (0..n)
            .map(|i| {
                let p = spill.join(format!("bucket-{i:03}"));
                fs::File::create(&p)
                    .map(|f| BufWriter::with_capacity(64 * 1024, f))
                    .map_err(|e| file_err(&p, e))
            })
            .collect::<Result<_, _>>()?;
        Ok(SortedWriter {
            dir: dir.to_path_buf(),
            spill,
            schema_json: table.json.to_string(),
            buckets,
            rows: 0,
            run_bytes: SORT_RUN_BYTES,
            head: Vec::with_capacity(32),
        })
    }

    /// Sorts in runs of `bytes` (tests exercise the merge with small runs).
    pub fn with_run_bytes(mut self, bytes: usize) -> Self {
        self.run_bytes = bytes.max(1);
        self
    }

    /// Adds one row.
    pub fn add(&mut self, vnode: Vnode, key: &[u8], datum: &[u8]) -> Result<(), SourceError> {
        let i = vnode as usize % self.buckets.len();
        let head = &mut self.head;
        head.clear();
        put_long(head, vnode as i64);
        put_long(head, key.len() as i64);
        put_long(head, datum.len() as i64);
        let w = &mut self.buckets[i];
        w.write_all(head)
            .and_then(|()| w.write_all(key))
            .and_then(|()| w.write_all(datum))
            .map_err(|e| file_err(&self.spill, e))?;
        self.rows += 1;
        Ok(())
    }

    /// Sorts every bucket into its vnodes' files, two buckets at a time; returns the manifest's
    /// file list.
    pub fn finish(self) -> Result<Vec<ManifestFile>, SourceError> {
        let mut paths = Vec::new();
        for (i, w) in self.buckets.into_iter().enumerate() {
            let path = self.spill.join(format!("bucket-{i:03}"));
            w.into_inner()
                .map_err(|e| file_err(&path, e.into_error()))?;
            paths.push(path);
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let (dir, schema, run_bytes) = (&self.dir, self.schema_json.as_str(), self.run_bytes);
        let results: Vec<Result<Vec<ManifestFile>, SourceError>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..2)
                .map(|_| {
                    scope.spawn(|| {
                        let mut files = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(path) = paths.get(i) else {
                                return Ok(files);
                            };
                            files.extend(sort_bucket(path, dir, schema, run_bytes)?);
                        }
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().expect("a bucket sorter panicked"))
                .collect()
        });
        let mut files = Vec::new();
        for r in results {
            files.extend(r?);
        }
        fs::remove_dir(&self.spill).map_err(|e| file_err(&self.spill, e))?;
        files.sort_by_key(|f| f.vnodes[0]);
        let names: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        sync_files(&self.dir, &names)?;
        Ok(files)
    }

    /// Rows added so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }
}

/// One spill record: (vnode, key, datum), the encoding `SortedWriter::add` appends.
pub(super) fn read_spill_record<'a>(rest: &mut &'a [u8]) -> Option<(Vnode, &'a [u8], &'a [u8])> {
    let vnode = get_long(rest)? as Vnode;
    let klen = get_long(rest)? as usize;
    let dlen = get_long(rest)? as usize;
    if rest.len() < klen + dlen {
        return None;
    }
    let (key, tail) = rest.split_at(klen);
    let (datum, tail) = tail.split_at(dlen);
    *rest = tail;
    Some((vnode, key, datum))
}

pub(super) fn put_spill_record(out: &mut Vec<u8>, vnode: Vnode, key: &[u8], datum: &[u8]) {
    put_long(out, vnode as i64);
    put_long(out, key.len() as i64);
    put_long(out, datum.len() as i64);
    out.extend_from_slice(key);
    out.extend_from_slice(datum);
}

/// Writes rows sorted by (vnode, key) as one container file per vnode, refusing a repeated key.
pub(super) struct VnodeFiles<'a> {
    dir: &'a Path,
    schema_json: &'a str,
    open: Option<(Vnode, ContainerWriter)>,
    last: Option<(Vnode, Vec<u8>)>,
    files: Vec<ManifestFile>,
}

impl VnodeFiles<'_> {
    fn push(&mut self, vnode: Vnode, key: &[u8], datum: &[u8]) -> Result<(), SourceError> {
        if self
            .last
            .as_ref()
            .is_some_and(|(v, k)| *v == vnode && k == key)
        {
            return Err(SourceError::Other(format!(
                "key {} appears twice in the snapshot",
                crate::core::error::key_hex(key)
            )));
        }
        self.last = Some((vnode, key.to_vec()));
        if self.open.as_ref().is_none_or(|(v, _)| *v != vnode) {
            self.close()?;
            let name = format!("vnode-{vnode:05}.avro");
            let mut w = ContainerWriter::create(
                &self.dir.join(&name),
                self.schema_json,
                sync_marker(vnode),
            )?;
            // SortedWriter::finish syncs every vnode file at once.
            w.sync_on_finish = false;
            self.open = Some((vnode, w));
        }
        self.open.as_mut().expect("opened above").1.push(datum)
    }

    fn close(&mut self) -> Result<(), SourceError> {
        if let Some((vnode, w)) = self.open.take() {
            let rows = w.finish()?;
            self.files.push(ManifestFile {
                path: format!("vnode-{vnode:05}.avro"),
                vnodes: vec![vnode],
                rows,
            });
        }
        Ok(())
    }
}

/// One spilled bucket sorted by (vnode, key) and written as its vnodes' container files: in memory
/// when it is at most `run_bytes`, else in sorted runs of that size merged; the bucket file (and
/// its runs) are removed.
pub(super) fn sort_bucket(
    path: &Path,
    dir: &Path,
    schema_json: &str,
    run_bytes: usize,
) -> Result<Vec<ManifestFile>, SourceError> {
    let bad = || file_err(path, std::io::Error::other("truncated spill record"));
    let size = fs::metadata(path).map_err(|e| file_err(path, e))?.len() as usize;
    let mut out = VnodeFiles {
        dir,
        schema_json,
        open: None,
        last: None,
        files: Vec::new(),
    };
    if size <= run_bytes {
        let bytes = fs::read(path).map_err(|e| file_err(path, e))?;
        // (vnode, key, datum) as slices of the bucket: no copy per row.
        let mut rows: Vec<(Vnode, &[u8], &[u8])> = Vec::new();
        let mut rest = bytes.as_slice();
        while !rest.is_empty() {
            rows.push(read_spill_record(&mut rest).ok_or_else(bad)?);
        }
        rows.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        for (v, k, d) in rows {
            out.push(v, k, d)?;
        }
    } else {
        // Sorted runs of about `run_bytes`, each its own file.
        let mut runs = Vec::new();
        let mut reader = std::io::BufReader::with_capacity(
            1 << 20,
            fs::File::open(path).map_err(|e| file_err(path, e))?,
        );
        let mut chunk: Vec<u8> = Vec::new();
        loop {
            let more = read_records_into(&mut reader, &mut chunk, run_bytes)
                .map_err(|e| file_err(path, e))?;
            if chunk.is_empty() {
                break;
            }
            let mut rows: Vec<(Vnode, &[u8], &[u8])> = Vec::new();
            let mut rest = chunk.as_slice();
            while !rest.is_empty() {
                rows.push(read_spill_record(&mut rest).ok_or_else(bad)?);
            }
            rows.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
            let run = path.with_extension(format!("run{}", runs.len()));
            let mut w = BufWriter::with_capacity(
                1 << 16,
                fs::File::create(&run).map_err(|e| file_err(&run, e))?,
            );
            let mut buf = Vec::new();
            for (v, k, d) in rows {
                buf.clear();
                put_spill_record(&mut buf, v, k, d);
                w.write_all(&buf).map_err(|e| file_err(&run, e))?;
            }
            w.flush().map_err(|e| file_err(&run, e))?;
            runs.push(run);
            chunk.clear();
            if !more {
                break;
            }
        }
        // Merge: the smallest head of the runs next.
        let mut readers = runs
            .iter()
            .map(|r| {
                fs::File::open(r)
                    .map(|f| std::io::BufReader::with_capacity(1 << 16, f))
                    .map_err(|e| file_err(r, e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut heap = std::collections::BinaryHeap::new();
        let mut heads: Vec<Option<OwnedRecord>> = Vec::new();
        for (i, r) in readers.iter_mut().enumerate() {
            let head = next_owned_record(r).map_err(|e| file_err(&runs[i], e))?;
            if let Some((v, k, _)) = &head {
                heap.push(std::cmp::Reverse((*v, k.clone(), i)));
            }
            heads.push(head);
        }
        while let Some(std::cmp::Reverse((_, _, i))) = heap.pop() {
            let (v, k, d) = heads[i].take().expect("a queued run has a head");
            out.push(v, &k, &d)?;
            heads[i] = next_owned_record(&mut readers[i]).map_err(|e| file_err(&runs[i], e))?;
            if let Some((v, k, _)) = &heads[i] {
                heap.push(std::cmp::Reverse((*v, k.clone(), i)));
            }
        }
        for r in &runs {
            fs::remove_file(r).map_err(|e| file_err(r, e))?;
        }
    }
    out.close()?;
    fs::remove_file(path).map_err(|e| file_err(path, e))?;
    Ok(out.files)
}

/// Appends whole spill records from `r` to `chunk` until it holds at least `limit` bytes; returns
/// whether more may follow.
pub(super) fn read_records_into(
    r: &mut impl std::io::BufRead,
    chunk: &mut Vec<u8>,
    limit: usize,
) -> std::io::Result<bool> {
    while chunk.len() < limit {
        match next_owned_record(r)? {
            None => return Ok(false),
            Some((v, k, d)) => put_spill_record(chunk, v, &k, &d),
        }
    }
    Ok(true)
}

/// A spill record read from a stream: (vnode, key, datum).
pub(super) type OwnedRecord = (Vnode, Vec<u8>, Vec<u8>);

/// The next spill record of a stream, owned; `None` at its end.
pub(super) fn next_owned_record(
    r: &mut impl std::io::BufRead,
) -> std::io::Result<Option<OwnedRecord>> {
    // The codec's varint reader: bits beyond the 64th are refused, never dropped.
    let Some(vnode) = read_long(r)? else {
        return Ok(None);
    };
    let truncated = || std::io::Error::other("truncated spill record");
    let klen = read_long(r)?.ok_or_else(truncated)? as usize;
    let dlen = read_long(r)?.ok_or_else(truncated)? as usize;
    let mut key = vec![0u8; klen];
    r.read_exact(&mut key)?;
    let mut datum = vec![0u8; dlen];
    r.read_exact(&mut datum)?;
    Ok(Some((vnode as Vnode, key, datum)))
}
