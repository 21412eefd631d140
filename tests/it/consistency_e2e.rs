//! `consistency = "epoch"` on the real broker (docs/design/several-tables.md §2), SQLite and
//! PostgreSQL, and through a recreation: two workers of one job commit their partitions independently, and a reader of the SQLite file, sampling the table
//! in one read transaction at a time while the job catches up, must see the whole table equal the
//! upstream at `kb_publication.visible_epoch` every time. The upstream at each epoch is rebuilt
//! here from the snapshot files and the topic itself, independently of the service. The same
//! schedule under `"vnode"` is sampled too and its torn states are printed (not asserted: whether
//! a sample lands between two workers' commits is timing).

use crate::support;

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kafka_backfill::codec::LogCodec;
use kafka_backfill::core::{Epoch, LogRecord, Op, Vnode};
use kafka_backfill::ports::SnapshotSource;
use kafka_backfill::snapshot::files::SnapshotFiles;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use support::{serial, Fixture};

type Table = BTreeMap<Vec<u8>, Vec<u8>>;
/// A change as the oracle applies it: op, key, datum.
type Change = (Op, Vec<u8>, Vec<u8>);
/// A sample of the table: the epoch it says it is at (`None`: not published) and its digest.
type Sample = (Option<Epoch>, u64);

fn digest(t: &Table) -> u64 {
    let mut h = DefaultHasher::new();
    t.hash(&mut h);
    h.finish()
}

/// The log every test here reads: 4 partitions, a 2,000-row snapshot, `changes` changes of 200 per
/// epoch, every barrier a checkpoint.
fn produce_log(f: &Fixture, changes: &str) {
    f.produce(&[
        "--partitions",
        "4",
        "--rows",
        "2000",
        "--changes",
        changes,
        "--epoch-changes",
        "200",
        "--checkpoint-every",
        "1",
    ]);
}

/// The upstream table after every epoch, by digest: the snapshot, then each epoch's changes (a
/// key's changes are in one partition, in order), read back from the topic.
fn upstream_by_epoch(f: &Fixture) -> HashMap<u64, Vec<Epoch>> {
    let snap = SnapshotFiles::open(&f.dir.join("out/snapshot")).unwrap();
    let info = snap.info().clone();
    let mut table = Table::new();
    for v in 0..info.vnode_count as Vnode {
        for row in snap.scan(v, None).unwrap() {
            let row = row.unwrap();
            table.insert(row.key, row.value);
        }
    }
    let codec = LogCodec::new(snap.table.clone()).unwrap();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &f.bootstrap)
        .set("group.id", format!("{}-oracle", f.group))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    // Per epoch, the changes of every partition in partition order.
    let mut by_epoch: BTreeMap<Epoch, Vec<Change>> = BTreeMap::new();
    let mut epochs = std::collections::BTreeSet::new();
    for start in &info.start {
        let p = start.partition as i32;
        let (_, high) = consumer
            .fetch_watermarks(&f.topic, p, Duration::from_secs(10))
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&f.topic, p, Offset::Offset(start.next_offset as i64))
            .unwrap();
        consumer.assign(&tpl).unwrap();
        let mut next = start.next_offset as i64;
        while next < high {
            let Some(m) = consumer.poll(Duration::from_secs(10)) else {
                panic!("partition {p}: nothing at offset {next} (high {high})");
            };
            let m = m.unwrap();
            next = m.offset() + 1;
            match codec.decode(m.payload().unwrap(), m.key()).unwrap() {
                LogRecord::Change(c) => {
                    by_epoch
                        .entry(c.epoch)
                        .or_default()
                        .push((c.op, c.row.key, c.row.value))
                }
                LogRecord::Barrier(b) => {
                    epochs.insert(b.prev);
                }
                LogRecord::Truncate(t) => panic!("the workload truncates nothing: {t:?}"),
            }
        }
    }
    let mut out = HashMap::new();
    out.entry(digest(&table))
        .or_insert_with(Vec::new)
        .push(info.snapshot_epoch);
    for e in epochs {
        for (op, key, value) in by_epoch.remove(&e).unwrap_or_default() {
            match op {
                Op::Insert | Op::UpdateInsert => {
                    table.insert(key, value);
                }
                Op::Delete | Op::UpdateDelete => {
                    table.remove(&key);
                }
            }
        }
        // Two epochs may leave the same table: a digest names every epoch it is.
        out.entry(digest(&table)).or_insert_with(Vec::new).push(e);
    }
    out
}

/// One sample: in one read transaction, the epoch the table says it is at (`None`: not published,
/// or every vnode not yet past its snapshot under `"vnode"`) and the table's digest.
fn sample(
    conn: &rusqlite::Connection,
    job: &str,
    vnodes: u32,
    epoch_mode: bool,
) -> rusqlite::Result<Option<(Option<Epoch>, u64)>> {
    conn.execute_batch("BEGIN")?;
    let result = (|| {
        let published: Option<i64> = conn
            .query_row(
                "SELECT visible_epoch FROM kb_publication WHERE job = ?1",
                [job],
                |r| r.get(0),
            )
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(None),
                e => Err(e),
            })?;
        let finished: u32 = conn.query_row(
            "SELECT COUNT(*) FROM kb_vnode_progress WHERE job = ?1 AND finished = 1",
            [job],
            |r| r.get(0),
        )?;
        // Under "epoch" only a published table is a replica state (an unpublished one is recorded
        // as such: once published it must stay so); under "vnode" once every vnode is past its
        // snapshot (before, the table is still filling).
        if published.is_none() && epoch_mode {
            return Ok(Some((None, 0)));
        }
        if published.is_none() && finished < vnodes {
            return Ok(None);
        }
        let mut q = conn.prepare_cached("SELECT _kb_key, _kb_row FROM accounts")?;
        let table: Table = q
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(Some((published.map(|e| Epoch(e as u64)), digest(&table))))
    })();
    conn.execute_batch("COMMIT")?;
    result
}

/// Runs the job until it has caught up while `sampler` samples; stops and returns its samples.
fn run_to_caught_up(
    f: &Fixture,
    stop: Arc<AtomicBool>,
    sampler: std::thread::JoinHandle<Vec<Sample>>,
) -> Vec<Sample> {
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    let status = run.wait_exit(Duration::from_secs(180));
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().unwrap();
    assert!(status.success(), "run: {}", run.log_text());
    samples
}

/// One sample from PostgreSQL, in one `REPEATABLE READ` transaction (`None`: nothing published yet,
/// or the tables not created yet).
fn sample_pg(client: &mut postgres::Client, job: &str, table: &str) -> Option<Sample> {
    let mut tx = client
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .start()
        .unwrap();
    let published = match tx.query_opt(
        "SELECT visible_epoch FROM kb_publication WHERE job = $1",
        &[&job],
    ) {
        Ok(row) => match row.and_then(|r| r.get::<_, Option<i64>>(0)) {
            Some(e) => e,
            None => return Some((None, 0)),
        },
        // Before the run created its tables: not a sample.
        Err(e) if e.code() == Some(&postgres::error::SqlState::UNDEFINED_TABLE) => return None,
        Err(e) => panic!("sampling kb_publication: {e}"),
    };
    let table: Table = tx
        .query(&format!("SELECT _kb_key, _kb_row FROM \"{table}\""), &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    tx.commit().unwrap();
    Some((Some(Epoch(published as u64)), digest(&table)))
}

/// Runs the job to caught-up into PostgreSQL table `table` under `"epoch"`, sampling it meanwhile.
fn run_sampled_pg(f: &Fixture, url: &str, table: &str) -> Vec<Sample> {
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        let (url, job, table) = (url.to_string(), f.name.clone(), table.to_string());
        std::thread::spawn(move || {
            let mut client = kafka_backfill::pg_tls::connect(&url).unwrap();
            let mut samples = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                samples.extend(sample_pg(&mut client, &job, &table));
            }
            samples
        })
    };
    run_to_caught_up(f, stop, sampler)
}

/// Samples the job's SQLite table until the flag is set (a thread); returns the flag and the thread.
fn start_sqlite_sampler(
    f: &Fixture,
    epoch_mode: bool,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<Vec<Sample>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        let db = f.db();
        let job = f.name.clone();
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            let mut conn: Option<rusqlite::Connection> = None;
            while !stop.load(Ordering::Relaxed) {
                if conn.is_none() && db.exists() {
                    conn = Some(rusqlite::Connection::open(&db).unwrap());
                }
                let Some(c) = &conn else {
                    std::thread::yield_now();
                    continue;
                };
                match sample(c, &job, 256, epoch_mode) {
                    Ok(Some(s)) => samples.push(s),
                    Ok(None) => {}
                    // Before the run created its tables, or while it holds the write lock past
                    // the busy timeout: not a sample.
                    Err(rusqlite::Error::SqliteFailure(e, _))
                        if matches!(
                            e.code,
                            rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                        ) => {}
                    Err(e) if e.to_string().contains("no such table") => {}
                    Err(e) => panic!("sampling {}: {e}", db.display()),
                }
            }
            samples
        })
    };
    (stop, sampler)
}

/// Runs the job to caught-up under `consistency`, sampling the table meanwhile; returns the samples.
fn run_sampled(f: &Fixture, epoch_mode: bool) -> Vec<Sample> {
    let (stop, sampler) = start_sqlite_sampler(f, epoch_mode);
    run_to_caught_up(f, stop, sampler)
}

/// Under `"epoch"`: once the table is published it stays published, its epoch never goes back, and
/// every published sample is exactly the upstream table at its epoch. Returns the epochs seen.
fn check_published(
    samples: &[Sample],
    upstream: &HashMap<u64, Vec<Epoch>>,
) -> std::collections::BTreeSet<Epoch> {
    let mut epochs = std::collections::BTreeSet::new();
    let mut last: Option<Epoch> = None;
    for (i, (at, d)) in samples.iter().enumerate() {
        let Some(at) = *at else {
            assert!(
                last.is_none(),
                "sample {i}: the table was published at {last:?} and is not any more"
            );
            continue;
        };
        assert!(
            last.is_none_or(|l| l <= at),
            "sample {i}: the published epoch went back from {last:?} to {at}"
        );
        assert!(
            upstream.get(d).is_some_and(|es| es.contains(&at)),
            "sample {i}: the table published at epoch {at} is not the upstream table there"
        );
        last = Some(at);
        epochs.insert(at);
    }
    epochs
}

/// The run ended with the table published at the log's last epoch, and `verify` agrees with the
/// producer's expected table.
fn ends_published_and_verified(
    f: &Fixture,
    epochs: &std::collections::BTreeSet<Epoch>,
    upstream: &HashMap<u64, Vec<Epoch>>,
) {
    let last = *upstream.values().flatten().max().unwrap();
    assert_eq!(
        epochs.last(),
        Some(&last),
        "published at the last epoch by the end"
    );
    let out = f.verify();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn epoch_consistency_shows_the_whole_table_at_one_upstream_epoch_at_every_sample() {
    let _g = serial();
    let f = Fixture::new("consistent", 2, "consistency = \"epoch\"");
    produce_log(&f, "24000");
    let upstream = upstream_by_epoch(&f);
    let samples = run_sampled(&f, true);
    let epochs = check_published(&samples, &upstream);
    ends_published_and_verified(&f, &epochs, &upstream);
    assert!(samples.len() >= 50, "{} samples", samples.len());
    assert!(epochs.len() >= 5, "published at {} epochs", epochs.len());

    // The same schedule per vnode: how many samples were no upstream state at all.
    let g = Fixture::new("pervnode", 2, "");
    produce_log(&g, "24000");
    let upstream = upstream_by_epoch(&g);
    let per_vnode = run_sampled(&g, false);
    let torn = per_vnode
        .iter()
        .filter(|(_, d)| !upstream.contains_key(d))
        .count();
    println!(
        "consistency = \"epoch\": {} samples at {} published epochs, none torn; \"vnode\": {torn} of {} samples torn",
        samples.iter().filter(|s| s.0.is_some()).count(),
        epochs.len(),
        per_vnode.len()
    );
}

/// The same on PostgreSQL, where two workers' commits run concurrently (each takes the job's
/// `kb_publication` row in turn): every sample, read in one `REPEATABLE READ` transaction, is the
/// upstream table at its `visible_epoch`, and the run ends published at the last epoch.
#[test]
fn epoch_consistency_on_postgres_shows_one_upstream_epoch_at_every_sample() {
    let _g = serial();
    let url = support::pg_url();
    // A job and table of their own in the shared database, as every PostgreSQL test.
    let name = format!("consistent-pg-{}", support::stamp());
    let f = Fixture::new(&name, 2, "consistency = \"epoch\"");
    f.use_postgres(&url);
    produce_log(&f, "20000");
    let upstream = upstream_by_epoch(&f);
    let samples = run_sampled_pg(&f, &url, &format!("accounts_{}", name.replace('-', "_")));
    let epochs = check_published(&samples, &upstream);
    ends_published_and_verified(&f, &epochs, &upstream);
    assert!(epochs.len() >= 5, "published at {} epochs", epochs.len());
    println!(
        "consistency = \"epoch\" on PostgreSQL: {} published samples at {} epochs, none torn",
        samples.iter().filter(|s| s.0.is_some()).count(),
        epochs.len()
    );
}

/// A rebalance in the log store under `recreate` with `consistency = "epoch"`: a second process
/// joins, the job is recreated and backfills again from the snapshot — and a reader never sees a
/// half-filled or older table meanwhile: the old replica stays visible (its epoch held) until the new
/// generation reaches it, then the new one replaces it, every sample exact.
#[test]
fn a_recreation_under_epoch_consistency_keeps_the_old_table_until_the_new_one_reaches_it() {
    let _g = serial();
    let f = Fixture::new(
        "consistent-recreate",
        1,
        "consistency = \"epoch\"\nmax_rows_per_second = 3000",
    );
    produce_log(&f, "24000");
    let upstream = upstream_by_epoch(&f);
    let (stop, sampler) = start_sqlite_sampler(&f, true);
    let mut a = f.spawn_run("a", &["--exit-when-caught-up"]);
    a.wait_for("to=\"log_store\"", Duration::from_secs(60));
    a.wait_for("cause=Barrier", Duration::from_secs(60));
    let mut b = f.spawn_run("b", &["--exit-when-caught-up"]);
    for (name, r) in [("a", &mut a), ("b", &mut b)] {
        let status = r.wait_exit(Duration::from_secs(180));
        assert!(status.success(), "process {name}: {}", r.log_text());
    }
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().unwrap();
    let recreations = f.sql::<i64>("SELECT recreations FROM kb_jobs")[0][0];
    assert!(
        recreations >= 1,
        "the rebalance in the log store recreated the job"
    );
    let epochs = check_published(&samples, &upstream);
    ends_published_and_verified(&f, &epochs, &upstream);
    assert!(
        f.sql::<i64>("SELECT COUNT(*) FROM sqlite_master WHERE name = 'accounts__kb_next'")[0][0]
            == 0,
        "the new generation's table replaced the old"
    );
    println!(
        "recreation under consistency = \"epoch\": {recreations} recreation(s), {} published samples at {} epochs, never torn, never back, never unpublished",
        samples.iter().filter(|s| s.0.is_some()).count(),
        epochs.len()
    );
}
