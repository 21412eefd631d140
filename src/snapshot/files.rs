//! The snapshot as Avro object container files plus `manifest.json` (docs/DESIGN.md §3).
//!
//! The writer (`produce`) writes one file per vnode, rows sorted by key bytes, codec `null`. The
//! reader takes any layout `schemas/snapshot_manifest.schema.json` allows: a file may hold many
//! vnodes (rows grouped or interleaved, in any order), a vnode may be spread over several files, the
//! files may be listed in any order, and blocks may use the codecs `null`, `deflate`, `snappy` or
//! `zstandard`. A vnode's scan gathers its rows from every file that lists it, sorts them by key
//! bytes and resumes strictly after the cursor, so resuming is exact in every layout. Each file's
//! header schema must be the manifest's `row_schema` (compared in Avro's Parsing Canonical Form).
//!
//! Rows are handed on as datum bytes without building values; any Avro tool reads the files
//! (`tests` reads one with apache-avro).
//!
//! Memory is bounded by a vnode, not by a file: files are read block by block, never whole. A file
//! that lists one vnode is read straight into that vnode's scan. A file that lists several is read
//! once, the first time one of its vnodes is scanned, and its rows are *spilled* — appended, as they
//! come, to at most [`SPILL_BUCKETS`] bucket files (a vnode's rows all in bucket `vnode mod
//! buckets`) in a private folder under the system's temporary directory (`TMPDIR`), removed when
//! the snapshot is dropped. A vnode's scan then reads only its bucket, keeps only its own rows and
//! sorts them: peak memory is about one vnode's rows whatever the file's size (`docs/BENCHMARKS.md`,
//! the single-file snapshot).

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::codec::varint::{get_long, put_long};
use crate::codec::{CodecError, TableSchema};
use crate::core::{vnode_of, Epoch, PartitionProgress, Row, Vnode};
use crate::ports::{RowIter, SnapshotInfo, SnapshotSource, SourceError};

const MAGIC: &[u8; 4] = b"Obj\x01";
const ROWS_PER_BLOCK: usize = 4096;
/// Bucket files a multi-vnode file is spilled into, at most (one open file each while spilling).
pub const SPILL_BUCKETS: usize = 256;

/// `manifest.json`, exactly as `schemas/snapshot_manifest.schema.json` describes it (the tests
/// validate both ways).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// `Es`, RisingWave's epoch layout.
    pub snapshot_epoch: Epoch,
    pub vnode_count: u32,
    pub partition_count: u32,
    /// The log topic the snapshot belongs to: informational (the job's `topic` is what is read);
    /// absent = not stated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// The row schema (the container files' schema).
    pub row_schema: serde_json::Value,
    /// The primary-key fields, in key order (the key bytes concatenate their encodings).
    pub primary_key: Vec<String>,
    pub files: Vec<ManifestFile>,
    /// Per partition: the offset just after the barrier with `prev = Es`, and that barrier's `curr`.
    pub start: Vec<ManifestStart>,
}

/// `manifest.json` of a log carrying several tables (docs/WIRE.md, "Several tables"): the tables
/// share the snapshot epoch, the vnode map and the start offsets; each has its own row schema,
/// primary key and files. A one-table [`Manifest`] is the same log with one table.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TablesManifest {
    pub snapshot_epoch: Epoch,
    pub vnode_count: u32,
    pub partition_count: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// The log's tables, in the order that numbers them (a change's table is found by its writer
    /// schema's fingerprint).
    pub tables: Vec<ManifestTable>,
    pub start: Vec<ManifestStart>,
}

/// One table of a [`TablesManifest`].
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ManifestTable {
    /// The table's name: what a job names in `snapshot.table`, and its store table by default.
    pub name: String,
    pub row_schema: serde_json::Value,
    pub primary_key: Vec<String>,
    pub files: Vec<ManifestFile>,
}

impl TablesManifest {
    /// The one-table manifest of table `index` (what a job of that table reads).
    pub fn table_view(&self, index: usize) -> Manifest {
        let t = &self.tables[index];
        Manifest {
            snapshot_epoch: self.snapshot_epoch,
            vnode_count: self.vnode_count,
            partition_count: self.partition_count,
            topic: self.topic.clone(),
            row_schema: t.row_schema.clone(),
            primary_key: t.primary_key.clone(),
            files: t.files.clone(),
            start: self.start.clone(),
        }
    }
}

/// A table of the log a snapshot folder describes: its name and row schema.
#[derive(Clone, Debug)]
pub struct LogTable {
    pub name: String,
    pub schema: TableSchema,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ManifestFile {
    /// Relative to the manifest's folder.
    pub path: String,
    /// The vnodes whose rows the file holds (any order; a vnode may be listed by several files).
    pub vnodes: Vec<Vnode>,
    /// Rows in the file (informational).
    pub rows: u64,
}

/// Where a partition's log starts: the offset just after the barrier with `prev = Es`, and that
/// barrier's `curr`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ManifestStart {
    pub partition: crate::core::PartitionId,
    pub next_offset: u64,
    pub epoch: Epoch,
}

impl From<&PartitionProgress> for ManifestStart {
    fn from(p: &PartitionProgress) -> Self {
        ManifestStart {
            partition: p.partition,
            next_offset: p.next_offset,
            epoch: p.epoch,
        }
    }
}

impl From<&ManifestStart> for PartitionProgress {
    fn from(s: &ManifestStart) -> Self {
        PartitionProgress {
            partition: s.partition,
            next_offset: s.next_offset,
            epoch: s.epoch,
            streaming: false,
        }
    }
}

/// Writes the snapshot's files: `rows` is (vnode, key, datum); the manifest is written by
/// [`write_manifest`] once the start offsets are known.
pub fn write_files(
    dir: &Path,
    table: &TableSchema,
    rows: BTreeMap<Vnode, BTreeMap<Vec<u8>, Vec<u8>>>,
) -> Result<Vec<ManifestFile>, SourceError> {
    fs::create_dir_all(dir).map_err(|e| file_err(dir, e))?;
    let schema_json = table.json.to_string();
    let mut files = Vec::new();
    for (vnode, rows) in rows {
        if rows.is_empty() {
            continue;
        }
        let name = format!("vnode-{vnode:05}.avro");
        let path = dir.join(&name);
        let count = rows.len();
        write_container(&path, &schema_json, sync_marker(vnode), rows.values())?;
        files.push(ManifestFile {
            path: name,
            vnodes: vec![vnode],
            rows: count as u64,
        });
    }
    Ok(files)
}

/// Writes every row into one file, `snapshot.avro`, in an order shuffled by `seed` (vnodes
/// interleaved, keys unsorted: the layout of a typical data-lake export).
pub fn write_single_file(
    dir: &Path,
    table: &TableSchema,
    rows: BTreeMap<Vnode, BTreeMap<Vec<u8>, Vec<u8>>>,
    seed: u64,
) -> Result<ManifestFile, SourceError> {
    fs::create_dir_all(dir).map_err(|e| file_err(dir, e))?;
    let vnodes: Vec<Vnode> = rows
        .iter()
        .filter(|(_, r)| !r.is_empty())
        .map(|(v, _)| *v)
        .collect();
    let mut all: Vec<Vec<u8>> = rows.into_values().flat_map(|r| r.into_values()).collect();
    let mut rng = crate::rng::SimRng::new(seed);
    for i in (1..all.len()).rev() {
        all.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let name = "snapshot.avro".to_string();
    let path = dir.join(&name);
    write_container(
        &path,
        &table.json.to_string(),
        sync_marker(Vnode::MAX),
        all.iter(),
    )?;
    Ok(ManifestFile {
        path: name,
        vnodes,
        rows: all.len() as u64,
    })
}

/// Writes one container file (codec `null`) of these datums, in this order.
fn write_container<D: AsRef<[u8]>>(
    path: &Path,
    schema_json: &str,
    sync: [u8; 16],
    datums: impl Iterator<Item = D>,
) -> Result<(), SourceError> {
    let mut w = ContainerWriter::create(path, schema_json, sync)?;
    for d in datums {
        w.push(d.as_ref())?;
    }
    w.finish().map(|_| ())
}

/// A container file written as its datums arrive: one block buffered at a time.
struct ContainerWriter {
    path: PathBuf,
    w: BufWriter<fs::File>,
    sync: [u8; 16],
    block: Vec<u8>,
    in_block: usize,
    rows: u64,
    /// `finish` syncs the file (else the caller syncs it, with others at once: [`sync_files`]).
    sync_on_finish: bool,
}

impl ContainerWriter {
    fn create(path: &Path, schema_json: &str, sync: [u8; 16]) -> Result<Self, SourceError> {
        let f = fs::File::create(path).map_err(|e| file_err(path, e))?;
        let mut w = BufWriter::new(f);
        let mut header = Vec::new();
        header.extend_from_slice(MAGIC);
        put_long(&mut header, 2);
        for (k, v) in [
            ("avro.schema", schema_json.as_bytes()),
            ("avro.codec", b"null".as_slice()),
        ] {
            put_long(&mut header, k.len() as i64);
            header.extend_from_slice(k.as_bytes());
            put_long(&mut header, v.len() as i64);
            header.extend_from_slice(v);
        }
        put_long(&mut header, 0);
        header.extend_from_slice(&sync);
        w.write_all(&header).map_err(|e| file_err(path, e))?;
        Ok(ContainerWriter {
            path: path.to_path_buf(),
            w,
            sync,
            block: Vec::new(),
            in_block: 0,
            rows: 0,
            sync_on_finish: true,
        })
    }

    fn push(&mut self, datum: &[u8]) -> Result<(), SourceError> {
        self.block.extend_from_slice(datum);
        self.in_block += 1;
        self.rows += 1;
        if self.in_block == ROWS_PER_BLOCK {
            self.flush_block()?;
        }
        Ok(())
    }

    fn flush_block(&mut self) -> Result<(), SourceError> {
        if self.in_block == 0 {
            return Ok(());
        }
        let mut head = Vec::with_capacity(20);
        put_long(&mut head, self.in_block as i64);
        put_long(&mut head, self.block.len() as i64);
        let path = &self.path;
        self.w
            .write_all(&head)
            .and_then(|()| self.w.write_all(&self.block))
            .and_then(|()| self.w.write_all(&self.sync))
            .map_err(|e| file_err(path, e))?;
        self.block.clear();
        self.in_block = 0;
        Ok(())
    }

    /// Flushes, syncs (unless the caller does); returns the rows written.
    fn finish(mut self) -> Result<u64, SourceError> {
        self.flush_block()?;
        let path = &self.path;
        self.w.flush().map_err(|e| file_err(path, e))?;
        if self.sync_on_finish {
            self.w.get_ref().sync_all().map_err(|e| file_err(path, e))?;
        }
        Ok(self.rows)
    }
}

/// Syncs `dir`'s files `names` (several at once: one by one, the waits for the disk add up to
/// half the sort's time) and then `dir` itself, so the files and their names are durable.
fn sync_files(dir: &Path, names: &[&str]) -> Result<(), SourceError> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Result<(), SourceError>> = std::thread::scope(|scope| {
        let syncers: Vec<_> = (0..names.len().min(8))
            .map(|_| {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(name) = names.get(i) else {
                        return Ok(());
                    };
                    let path = dir.join(name);
                    fs::File::open(&path)
                        .and_then(|f| f.sync_all())
                        .map_err(|e| file_err(&path, e))?;
                })
            })
            .collect();
        syncers
            .into_iter()
            .map(|s| s.join().expect("a file syncer panicked"))
            .collect()
    });
    results.into_iter().collect::<Result<(), _>>()?;
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| file_err(dir, e))
}

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
fn read_spill_record<'a>(rest: &mut &'a [u8]) -> Option<(Vnode, &'a [u8], &'a [u8])> {
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

fn put_spill_record(out: &mut Vec<u8>, vnode: Vnode, key: &[u8], datum: &[u8]) {
    put_long(out, vnode as i64);
    put_long(out, key.len() as i64);
    put_long(out, datum.len() as i64);
    out.extend_from_slice(key);
    out.extend_from_slice(datum);
}

/// Writes rows sorted by (vnode, key) as one container file per vnode, refusing a repeated key.
struct VnodeFiles<'a> {
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
fn sort_bucket(
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
fn read_records_into(
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
type OwnedRecord = (Vnode, Vec<u8>, Vec<u8>);

/// The next spill record of a stream, owned; `None` at its end.
fn next_owned_record(r: &mut impl std::io::BufRead) -> std::io::Result<Option<OwnedRecord>> {
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

/// The `snapshot_epoch` of the manifest in `folder`, without opening the snapshot; `None` when
/// there is no manifest or it does not say (a folder being written, or not a snapshot's).
pub fn manifest_epoch(folder: &Path) -> Option<crate::core::Epoch> {
    manifest_head(folder).map(|h| h.snapshot_epoch)
}

/// What a manifest says of where its snapshot stands, read without the rest.
#[derive(serde::Deserialize)]
struct ManifestHead {
    snapshot_epoch: Epoch,
    #[serde(default)]
    start: Vec<ManifestStart>,
}

fn manifest_head(folder: &Path) -> Option<ManifestHead> {
    let text = std::fs::read(folder.join("manifest.json")).ok()?;
    serde_json::from_slice(&text).ok()
}

/// The snapshot epoch of the manifest in `folder` and its start offsets by partition (index =
/// partition), without opening the snapshot; `None` as for [`manifest_epoch`].
pub fn manifest_starts(folder: &Path) -> Option<(Epoch, Vec<u64>)> {
    let mut head = manifest_head(folder)?;
    head.start.sort_by_key(|s| s.partition);
    let offsets = head.start.iter().map(|s| s.next_offset).collect();
    Some((head.snapshot_epoch, offsets))
}

/// Atomically: written to a temporary file, synced, renamed over `manifest.json`, the folder synced
/// (a reader sees the old manifest or the whole new one, never part of one).
pub fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<PathBuf, SourceError> {
    write_manifest_json(dir, manifest)
}

fn write_manifest_json(
    dir: &Path,
    manifest: &impl serde::Serialize,
) -> Result<PathBuf, SourceError> {
    use std::io::Write;
    let path = dir.join("manifest.json");
    let tmp = dir.join(".manifest.json.tmp");
    let json = serde_json::to_vec_pretty(manifest).expect("manifest serialises");
    let mut f = fs::File::create(&tmp).map_err(|e| file_err(&tmp, e))?;
    f.write_all(&json)
        .and_then(|()| f.sync_all())
        .map_err(|e| file_err(&tmp, e))?;
    fs::rename(&tmp, &path).map_err(|e| file_err(&path, e))?;
    if let Ok(d) = fs::File::open(dir) {
        d.sync_all().map_err(|e| file_err(dir, e))?;
    }
    Ok(path)
}

fn sync_marker(seed: Vnode) -> [u8; 16] {
    let mut s = [0u8; 16];
    let x = crc32fast::hash(&seed.to_le_bytes()).to_le_bytes();
    for (i, b) in s.iter_mut().enumerate() {
        *b = x[i % 4] ^ (i as u8).wrapping_mul(37);
    }
    s
}

fn file_err(path: &Path, e: impl std::fmt::Display) -> SourceError {
    SourceError::File {
        file: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// A multi-vnode file spilled into bucket files: vnode `v`'s rows are all in bucket `v % buckets`,
/// each row as `vnode u32, key length u32, key, datum length u32, datum` (little-endian).
struct Spill {
    dir: PathBuf,
    buckets: usize,
}

impl Spill {
    fn bucket(&self, vnode: Vnode) -> PathBuf {
        self.dir
            .join(format!("bucket-{:05}.rows", vnode as usize % self.buckets))
    }
}

/// The tables of a several-table manifest, checked: names unique and usable as table names, row
/// records of distinct full names (so their writer schemas' fingerprints differ).
fn log_tables(m: &TablesManifest, mpath: &Path) -> Result<Vec<LogTable>, SourceError> {
    if m.tables.is_empty() {
        return Err(file_err(mpath, "invalid manifest: `tables` is empty"));
    }
    let mut out: Vec<LogTable> = Vec::with_capacity(m.tables.len());
    for (i, t) in m.tables.iter().enumerate() {
        let schema = TableSchema::parse(&t.row_schema.to_string(), &t.primary_key)
            .map_err(|e| file_err(mpath, format!("tables[{i}] ({}): {e}", t.name)))?;
        crate::ports::check_table_name(&t.name)
            .map_err(|e| file_err(mpath, format!("tables[{i}].name: {e}")))?;
        if let Some(o) = out.iter().find(|o| o.name == t.name) {
            return Err(file_err(
                mpath,
                format!("tables[{i}]: table {} is named twice", o.name),
            ));
        }
        let fingerprint = crate::codec::LogCodec::new(schema.clone())
            .map_err(|e| file_err(mpath, format!("tables[{i}] ({}): {e}", t.name)))?
            .fingerprint_hex();
        for o in &out {
            if crate::codec::LogCodec::new(o.schema.clone())
                .map_err(|e| file_err(mpath, e))?
                .fingerprint_hex()
                == fingerprint
            {
                return Err(file_err(
                    mpath,
                    format!(
                        "tables[{i}] ({}) and table {} have one writer schema (fingerprint {fingerprint}): a change's table is told by it, so give each table's row record its own full name",
                        t.name, o.name
                    ),
                ));
            }
        }
        out.push(LogTable {
            name: t.name.clone(),
            schema,
        });
    }
    Ok(out)
}

fn names(tables: &[LogTable]) -> String {
    tables
        .iter()
        .map(|t| t.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Writes a several-table `manifest.json` (atomically, as [`write_manifest`]).
pub fn write_tables_manifest(
    dir: &Path,
    manifest: &TablesManifest,
) -> Result<PathBuf, SourceError> {
    write_manifest_json(dir, manifest)
}

/// Spill folders get distinct names within a process.
static SPILL_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A snapshot on disk, opened through its manifest.
pub struct SnapshotFiles {
    dir: PathBuf,
    /// The manifest of the table read (for a several-table manifest, that table's view).
    pub manifest: Manifest,
    /// Every table of the log, in manifest order (one for a one-table manifest).
    pub tables: Vec<LogTable>,
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
    spills: std::sync::Mutex<BTreeMap<usize, std::sync::Arc<Spill>>>,
    /// This snapshot's spill folder (created on the first spill, removed on drop).
    spill_root: PathBuf,
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
        let (manifest, tables, table_index) = if several {
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
            let tables = log_tables(&m, &mpath)?;
            let index = match name {
                Some(n) => tables.iter().position(|t| t.name == n).ok_or_else(|| {
                    file_err(
                        &mpath,
                        format!(
                            "no table {n} in the manifest (its tables: {})",
                            names(&tables)
                        ),
                    )
                })?,
                None if tables.len() == 1 => 0,
                None => {
                    return Err(file_err(
                        &mpath,
                        format!(
                        "the manifest holds {} tables ({}): name the job's with `snapshot.table`",
                        tables.len(),
                        names(&tables)
                    ),
                    ))
                }
            };
            (m.table_view(index), tables, index)
        } else {
            let m: Manifest = serde_ignored::deserialize(
                &mut serde_json::Deserializer::from_str(&text),
                |path| ignored_keys.push(path.to_string()),
            )
            .map_err(|e| file_err(&mpath, format!("invalid manifest: {e}")))?;
            let schema = TableSchema::parse(&m.row_schema.to_string(), &m.primary_key)
                .map_err(|e: CodecError| file_err(&mpath, e))?;
            let table_name = schema.name.clone();
            if let Some(n) = name.filter(|n| *n != table_name) {
                return Err(file_err(
                    &mpath,
                    format!("no table {n} in the manifest (its one table is {table_name})"),
                ));
            }
            let tables = vec![LogTable {
                name: table_name,
                schema,
            }];
            (m, tables, 0)
        };
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
struct Header {
    schema: String,
    codec: apache_avro::Codec,
    sync: [u8; 16],
    /// Bytes the header takes.
    len: usize,
}

fn parse_header(path: &Path, bytes: &[u8]) -> Result<Header, SourceError> {
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
fn read_header(path: &Path) -> Result<Header, SourceError> {
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
fn read_container(path: &Path, table: &TableSchema) -> Result<Vec<Vec<u8>>, SourceError> {
    let mut rows = Vec::new();
    for_each_datum(path, table, |d| {
        rows.push(d);
        Ok(())
    })?;
    Ok(rows)
}

/// A zig-zag varint from a reader; `None` at a clean end of input before its first byte.
fn read_long(r: &mut impl std::io::Read) -> std::io::Result<Option<i64>> {
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
fn for_each_datum(
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

#[cfg(test)]
mod tests {
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
}
