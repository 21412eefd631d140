//! Snapshots stored in Kafka (`[jobs.capture] snapshot_storage = "kafka"`, docs/CAPTURE.md "Where
//! snapshots are stored"): a snapshot's folder — its row files, its manifest and the schema
//! versions beside it — copied into a topic of its own, `<log topic>.snapshot.<epoch>` (one
//! partition, no retention limit), which any runner restores into its own `snapshot.dir` before it
//! reads it, as Kafka Streams restores a state store from its changelog. No volume is shared: a
//! runner needs the brokers it already reads the log from.
//!
//! The topic holds each file as records keyed by its path in the folder, in pieces of at most
//! [`PIECE`] bytes, one file after another, `manifest.json` last; then one record keyed
//! [`COMPLETE`] listing every file and its size. A topic without that record is a copy a crash
//! interrupted: it is never restored, and the capture deletes it before it stores the snapshot
//! again. A restore writes into a hidden folder and moves `manifest.json` into place last, so a
//! snapshot folder is visible whole or not at all, as the capture's own are.
//!
//! Owns that topic's layout; must not decide which snapshot a job reads (`service::job`) nor when
//! one is stored or retired (`capture::snapshots`).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};

use crate::core::Epoch;

/// The largest piece of a file in one record (under the broker's default `message.max.bytes`).
pub const PIECE: usize = 512 * 1024;

/// The key of the last record of a complete snapshot topic.
pub const COMPLETE: &str = ".kb-complete";

/// What a restore says of a snapshot topic that is not there (or went while it was read).
pub const GONE: &str = "does not exist (the snapshot was retired, or the topic deleted)";

/// How long a store or a restore may go without progress before it fails.
const STALL: Duration = Duration::from_secs(60);

/// The topic holding the snapshot at `epoch` of the log `log_topic`.
pub fn topic_of(log_topic: &str, epoch: Epoch) -> String {
    format!("{log_topic}.snapshot.{}", epoch.0)
}

/// The [`COMPLETE`] record: every file of the folder, in the order stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Complete {
    files: Vec<StoredFile>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct StoredFile {
    path: String,
    bytes: u64,
}

/// What a store or a restore moved.
#[derive(Debug, Clone, Copy, Default)]
pub struct Moved {
    pub files: usize,
    pub bytes: u64,
    pub seconds: f64,
}

/// Every file under `folder` by its path relative to it (`/`-separated), `manifest.json` last;
/// hidden entries and the capture's reader marks are left out.
fn files_of(folder: &Path) -> Result<Vec<(String, PathBuf)>> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> Result<()> {
        for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
            let e = e.with_context(|| format!("listing {}", dir.display()))?;
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with('.') || name == crate::snapshot::published::READERS {
                continue;
            }
            let path = e.path();
            if e.file_type()?.is_dir() {
                if dir == root && name == crate::snapshot::published::SNAPSHOTS {
                    continue; // the later snapshots beside the first: each has its own topic
                }
                walk(root, &path, out)?;
            } else {
                let rel = path
                    .strip_prefix(root)
                    .expect("under the root")
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy())
                    .collect::<Vec<_>>()
                    .join("/");
                out.push((rel, path));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(folder, folder, &mut out)?;
    out.sort_by(|a, b| (a.0 == "manifest.json", &a.0).cmp(&(b.0 == "manifest.json", &b.0)));
    if out.last().is_none_or(|(p, _)| p != "manifest.json") {
        bail!("{}: no manifest.json to store", folder.display());
    }
    Ok(out)
}

#[derive(Default)]
struct Deliveries {
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.failed.fetch_add(1, Ordering::Relaxed);
            self.first_error
                .lock()
                .unwrap()
                .get_or_insert_with(|| e.to_string());
        }
    }
}

/// Stores the snapshot folder `folder` (its `manifest.json` written) in `topic`: a topic of that
/// name left by an interrupted store is deleted first. Done when every record is acknowledged.
pub fn store(props: &BTreeMap<String, String>, folder: &Path, topic: &str) -> Result<Moved> {
    let started = Instant::now();
    let files = files_of(folder)?;
    crate::kafka::admin::delete_topic(props, topic)
        .with_context(|| format!("removing {topic}, a snapshot store a crash interrupted"))?;
    crate::kafka::admin::ensure_topic_with(
        props,
        topic,
        1,
        &[
            ("cleanup.policy", "delete"),
            ("retention.ms", "-1"),
            ("retention.bytes", "-1"),
        ],
    )?;
    let producer: BaseProducer<Deliveries> = crate::kafka::admin::client_config(props)
        .set("enable.idempotence", "true")
        .set("compression.type", "lz4")
        .set("linger.ms", "5")
        .create_with_context(Deliveries::default())
        .context("creating the snapshot store's producer")?;
    let mut listed = Vec::new();
    let mut bytes = 0u64;
    let mut piece = vec![0u8; PIECE];
    for (rel, path) in &files {
        let mut f =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut size = 0u64;
        loop {
            let n = read_full(&mut f, &mut piece)
                .with_context(|| format!("reading {}", path.display()))?;
            if n > 0 || size == 0 {
                crate::kafka::send_waiting(&producer, topic, 0, rel.as_bytes(), &piece[..n])
                    .with_context(|| format!("storing {rel} in {topic}"))?;
                producer.poll(Duration::ZERO);
            }
            size += n as u64;
            if n < PIECE {
                break;
            }
        }
        bytes += size;
        listed.push(StoredFile {
            path: rel.clone(),
            bytes: size,
        });
    }
    let complete = serde_json::to_vec(&Complete { files: listed })?;
    crate::kafka::send_waiting(&producer, topic, 0, COMPLETE.as_bytes(), &complete)
        .with_context(|| format!("completing {topic}"))?;
    // The prompt flush: rdkafka's own polls in 100 ms steps to their end.
    crate::kafka::flush::flush(&producer, STALL)
        .with_context(|| format!("waiting for {topic}'s acknowledgements"))?;
    let ctx = producer.context();
    if ctx.failed.load(Ordering::Relaxed) > 0 {
        bail!(
            "storing the snapshot in {topic}: {} record(s) not delivered, the first: {}",
            ctx.failed.load(Ordering::Relaxed),
            ctx.first_error.lock().unwrap().clone().unwrap_or_default()
        );
    }
    Ok(Moved {
        files: files.len(),
        bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// A path of a stored file, checked to stay inside the folder it is restored into.
fn safe_path(topic: &str, offset: i64, key: &str) -> Result<PathBuf> {
    let p = Path::new(key);
    let inside = !key.is_empty()
        && p.components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
    if !inside {
        bail!("{topic} partition 0 offset {offset}: the key {key:?} is not a file path inside a snapshot folder");
    }
    Ok(p.to_path_buf())
}

/// Removes the hidden folders `<prefix><pid>` in `parent` that restores of processes no longer
/// running left (a `kill -9` during a restore): their pid has no `/proc/<pid>`. A restore of a
/// live process is left alone.
fn remove_abandoned(parent: &Path, prefix: &str) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Ok(());
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(pid) = name.strip_prefix(prefix) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            std::fs::remove_dir_all(e.path()).with_context(|| {
                format!(
                    "removing {}, a restore a stopped process left",
                    e.path().display()
                )
            })?;
            tracing::info!(dir = %e.path().display(), "removed a restore a stopped process left");
        }
    }
    Ok(())
}

/// Restores the snapshot stored in `topic` into the folder `into` (created; entries already there
/// are kept, and a file of the snapshot already there is replaced), restoring only the files whose
/// path `wanted` accepts. `manifest.json` is moved into place last: once it is there, the folder
/// holds the whole snapshot. Fails, naming the topic, when it does not exist or holds no
/// complete snapshot.
pub fn restore(
    props: &BTreeMap<String, String>,
    topic: &str,
    into: &Path,
    wanted: &dyn Fn(&str) -> bool,
) -> Result<Moved> {
    let started = Instant::now();
    let gone = || anyhow::anyhow!("the snapshot topic {topic} {GONE}");
    if crate::kafka::admin::partition_count(props, topic)?.is_none() {
        return Err(gone());
    }
    let parent = into.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let prefix = format!(
        ".restoring-{}-",
        into.file_name()
            .map_or("snapshot".into(), |n| n.to_string_lossy())
    );
    remove_abandoned(parent, &prefix)?;
    let hidden = parent.join(format!("{prefix}{}", std::process::id()));
    if hidden.exists() {
        std::fs::remove_dir_all(&hidden)
            .with_context(|| format!("removing {}", hidden.display()))?;
    }
    std::fs::create_dir_all(&hidden).with_context(|| format!("creating {}", hidden.display()))?;
    let consumer: BaseConsumer = crate::kafka::admin::client_config(props)
        .set("group.id", "kafka-backfill-snapshot-restore")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "error")
        .set("fetch.max.bytes", "52428800")
        .set("max.partition.fetch.bytes", "16777216")
        .create()
        .context("creating the snapshot restore's reader")?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let mut written: BTreeMap<String, u64> = BTreeMap::new();
    let mut open: Option<(String, std::io::BufWriter<std::fs::File>)> = None;
    let mut last_progress = Instant::now();
    let complete = loop {
        let m = match consumer.poll(Duration::from_millis(200)) {
            None => {
                if last_progress.elapsed() > STALL {
                    bail!(
                        "restoring {topic}: nothing read for {} s and no {COMPLETE} record yet (a store that did not finish?)",
                        STALL.as_secs()
                    );
                }
                continue;
            }
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                // Deleted while read: the capture retired it.
                if crate::kafka::admin::partition_count(props, topic)?.is_none() {
                    return Err(gone());
                }
                return Err(e).with_context(|| format!("reading {topic}"));
            }
        };
        last_progress = Instant::now();
        let key = String::from_utf8_lossy(m.key().unwrap_or_default()).to_string();
        let payload = m.payload().unwrap_or_default();
        if key == COMPLETE {
            let c: Complete = serde_json::from_slice(payload).with_context(|| {
                format!(
                    "{topic} partition 0 offset {}: not a {COMPLETE} record",
                    m.offset()
                )
            })?;
            break c;
        }
        let rel = safe_path(topic, m.offset(), &key)?;
        if !wanted(&key) {
            continue;
        }
        if open.as_ref().is_none_or(|(k, _)| *k != key) {
            if let Some((_, mut w)) = open.take() {
                w.flush()?;
            }
            let path = hidden.join(&rel);
            if let Some(d) = path.parent() {
                std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            }
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .with_context(|| format!("writing {}", path.display()))?;
            open = Some((key.clone(), std::io::BufWriter::new(f)));
        }
        let (_, w) = open.as_mut().expect("opened");
        w.write_all(payload)
            .with_context(|| format!("writing {key} under {}", hidden.display()))?;
        *written.entry(key).or_default() += payload.len() as u64;
    };
    if let Some((_, mut w)) = open.take() {
        w.flush()?;
    }
    let mut bytes = 0;
    let mut files = 0;
    for f in complete.files.iter().filter(|f| wanted(&f.path)) {
        let got = written.get(&f.path).copied().unwrap_or(0);
        if got != f.bytes {
            bail!(
                "restoring {topic}: {} has {got} bytes, the snapshot listed {}",
                f.path,
                f.bytes
            );
        }
        if f.bytes == 0 {
            // An empty file is one empty record; make sure it exists.
            let p = hidden.join(&f.path);
            if let Some(d) = p.parent() {
                std::fs::create_dir_all(d)?;
            }
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)?;
        }
        bytes += f.bytes;
        files += 1;
    }
    // Into place: every file, then the manifest (each file synced first).
    std::fs::create_dir_all(into).with_context(|| format!("creating {}", into.display()))?;
    let mut listed: Vec<&StoredFile> = complete.files.iter().filter(|f| wanted(&f.path)).collect();
    listed.sort_by_key(|f| f.path == "manifest.json");
    for f in listed {
        let from = hidden.join(&f.path);
        let to = into.join(&f.path);
        std::fs::File::open(&from)
            .and_then(|h| h.sync_all())
            .with_context(|| format!("syncing {}", from.display()))?;
        if let Some(d) = to.parent() {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        std::fs::rename(&from, &to)
            .with_context(|| format!("moving {} to {}", from.display(), to.display()))?;
    }
    std::fs::remove_dir_all(&hidden).with_context(|| format!("removing {}", hidden.display()))?;
    Ok(Moved {
        files,
        bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The topic of the schema versions of the log `log_topic` (docs/WIRE.md "Schema changes"): with
/// Kafka storage, each version file the capture writes beside its snapshot is first written there
/// too, keyed by its fingerprint (one partition, compacted), so that a runner without the
/// capture's folder reads it ([`VersionsMirror`]). A topic of its own: it grows only when a
/// version is announced, so a look at it is one watermark request.
pub fn versions_topic(log_topic: &str) -> String {
    format!("{log_topic}.schema-versions")
}

/// Creates the versions topic of `log_topic` when absent; returns its name.
pub fn ensure_versions_topic(props: &BTreeMap<String, String>, log_topic: &str) -> Result<String> {
    let topic = versions_topic(log_topic);
    crate::kafka::admin::ensure_topic_with(props, &topic, 1, &[("cleanup.policy", "compact")])?;
    Ok(topic)
}

/// Writes the version file `file` with fingerprint `fingerprint_hex` to the versions topic of
/// `log_topic`, waiting for its acknowledgement.
pub fn store_version(
    props: &BTreeMap<String, String>,
    log_topic: &str,
    fingerprint_hex: &str,
    file: &crate::snapshot::versions::VersionFile,
) -> Result<()> {
    let topic = ensure_versions_topic(props, log_topic)?;
    let producer: BaseProducer<Deliveries> = crate::kafka::admin::client_config(props)
        .set("enable.idempotence", "true")
        .create_with_context(Deliveries::default())
        .context("creating the schema versions' producer")?;
    let value = serde_json::to_vec(file)?;
    crate::kafka::send_waiting(&producer, &topic, 0, fingerprint_hex.as_bytes(), &value)
        .with_context(|| format!("writing a schema version to {topic}"))?;
    crate::kafka::flush::flush(&producer, STALL)
        .with_context(|| format!("waiting for {topic}'s acknowledgement"))?;
    if let Some(e) = producer.context().first_error.lock().unwrap().clone() {
        bail!("writing a schema version to {topic}: {e}");
    }
    Ok(())
}

/// The versions topic of a log, copied into a snapshot folder's `schema_versions/`
/// (`crate::snapshot::versions::write`, whole files by rename) as versions come: read from the
/// start once, then only what was added since (one watermark request when nothing was).
pub struct VersionsMirror {
    consumer: BaseConsumer,
    topic: String,
    dir: PathBuf,
    /// The offset read up to.
    position: i64,
}

impl VersionsMirror {
    /// A mirror of the versions of the log `log_topic` into `dir/schema_versions/` (the topic is
    /// created when absent: a log without versions yet).
    pub fn new(
        props: &BTreeMap<String, String>,
        log_topic: &str,
        dir: &Path,
    ) -> Result<VersionsMirror> {
        let topic = ensure_versions_topic(props, log_topic)?;
        let consumer: BaseConsumer = crate::kafka::admin::client_config(props)
            .set("group.id", "kafka-backfill-schema-versions")
            .set("enable.auto.commit", "false")
            .create()
            .context("creating the schema versions' reader")?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, 0, Offset::Beginning)?;
        consumer.assign(&tpl)?;
        // Paused between syncs: a fetch waiting on the broker would hold the connection, and the
        // watermark request behind it, for `fetch.wait.max.ms`.
        consumer.pause(&tpl)?;
        Ok(VersionsMirror {
            consumer,
            topic,
            dir: dir.to_path_buf(),
            position: 0,
        })
    }

    /// Reads the versions topic to its present end, writing each version not in the folder yet.
    /// Returns how many were written.
    pub fn sync(&mut self) -> Result<usize> {
        let (_, high) = self
            .consumer
            .fetch_watermarks(&self.topic, 0, Duration::from_secs(30))
            .with_context(|| format!("reading the watermarks of {}", self.topic))?;
        let mut written = 0;
        if self.position >= high {
            return Ok(0);
        }
        let tpl = self.consumer.assignment()?;
        self.consumer.resume(&tpl)?;
        let read = self.read_to(high, &mut written);
        self.consumer.pause(&tpl)?;
        read.map(|()| written)
    }

    fn read_to(&mut self, high: i64, written: &mut usize) -> Result<()> {
        let started = Instant::now();
        while self.position < high {
            if started.elapsed() > STALL {
                bail!(
                    "reading {} to its end ({high}) took over {} s (at {})",
                    self.topic,
                    STALL.as_secs(),
                    self.position
                );
            }
            let Some(m) = self.consumer.poll(Duration::from_millis(200)) else {
                continue;
            };
            let m = m.with_context(|| format!("reading {}", self.topic))?;
            self.position = m.offset() + 1;
            let fingerprint = String::from_utf8_lossy(m.key().unwrap_or_default()).to_string();
            if fingerprint.is_empty() || !fingerprint.chars().all(|c| c.is_ascii_hexdigit()) {
                bail!(
                    "{} partition 0 offset {}: the key {fingerprint:?} is not a fingerprint",
                    self.topic,
                    m.offset()
                );
            }
            let path = self
                .dir
                .join(crate::snapshot::versions::VERSIONS_DIR)
                .join(format!("{fingerprint}.json"));
            if path.exists() {
                continue;
            }
            let file: crate::snapshot::versions::VersionFile =
                serde_json::from_slice(m.payload().unwrap_or_default()).with_context(|| {
                    format!(
                        "{} partition 0 offset {}: not a schema version file",
                        self.topic,
                        m.offset()
                    )
                })?;
            crate::snapshot::versions::write(&self.dir, &fingerprint, &file)
                .with_context(|| format!("writing {}", path.display()))?;
            *written += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_is_stored_manifest_last_without_hidden_files_readers_or_later_snapshots() {
        let dir = std::env::temp_dir().join(format!("kb-store-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for f in [
            "manifest.json",
            "vnode-0.avro",
            "accounts/vnode-1.avro",
            "schema_versions/ab.json",
            ".pending/x",
            "readers/job",
            "snapshots/12/manifest.json",
        ] {
            let p = dir.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, f).unwrap();
        }
        let names: Vec<String> = files_of(&dir).unwrap().into_iter().map(|f| f.0).collect();
        assert_eq!(
            names,
            vec![
                "accounts/vnode-1.avro",
                "schema_versions/ab.json",
                "vnode-0.avro",
                "manifest.json"
            ]
        );
        std::fs::remove_file(dir.join("manifest.json")).unwrap();
        assert!(files_of(&dir).is_err(), "a folder without a manifest");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A `kill -9` during a restore leaves `.restoring-<name>-<pid>`: the next restore removes it,
    /// and leaves alone that of a live process and any other folder.
    #[test]
    fn a_restore_a_stopped_process_left_is_removed_and_a_live_ones_kept() {
        let dir = std::env::temp_dir().join(format!("kb-abandoned-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // A pid above Linux's pid_max (2^22): no process has it.
        let dead = dir.join(".restoring-snapshot-4194305");
        let live = dir.join(format!(".restoring-snapshot-{}", std::process::id()));
        let other = dir.join(".restoring-other-4194305");
        for d in [&dead, &live, &other] {
            std::fs::create_dir_all(d.join("accounts")).unwrap();
            std::fs::write(d.join("accounts/vnode-0.avro"), "x").unwrap();
        }
        remove_abandoned(&dir, ".restoring-snapshot-").unwrap();
        assert!(!dead.exists(), "the stopped process's restore is removed");
        assert!(live.exists(), "a live process's restore is kept");
        assert!(other.exists(), "another folder's restore is not this one's");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_key_outside_the_folder_is_refused() {
        for bad in ["", "../x", "/etc/passwd", "a/../../b"] {
            let e = safe_path("t", 7, bad).unwrap_err().to_string();
            assert!(e.contains("t partition 0 offset 7"), "{e}");
        }
        assert_eq!(
            safe_path("t", 0, "a/b.avro").unwrap(),
            PathBuf::from("a/b.avro")
        );
    }
}
