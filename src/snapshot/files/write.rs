//! Writing a snapshot's Avro object container files (one per vnode, or one file of all) and
//! syncing them; the manifest is written last, by the parent module.

use super::*;

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
pub(super) fn write_container<D: AsRef<[u8]>>(
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
pub(super) struct ContainerWriter {
    path: PathBuf,
    w: BufWriter<fs::File>,
    sync: [u8; 16],
    block: Vec<u8>,
    in_block: usize,
    rows: u64,
    /// `finish` syncs the file (else the caller syncs it, with others at once: [`sync_files`]).
    pub(super) sync_on_finish: bool,
}

impl ContainerWriter {
    pub(super) fn create(
        path: &Path,
        schema_json: &str,
        sync: [u8; 16],
    ) -> Result<Self, SourceError> {
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

    pub(super) fn push(&mut self, datum: &[u8]) -> Result<(), SourceError> {
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
    pub(super) fn finish(mut self) -> Result<u64, SourceError> {
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
pub(super) fn sync_files(dir: &Path, names: &[&str]) -> Result<(), SourceError> {
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
