//! One conformance suite for every state store (tansu's shape: one test per scenario × backend).
//! Each scenario is a function of a fresh store and job; `scenarios!` runs every one against memory,
//! SQLite, SQLite without the datum column, PostgreSQL (`scripts/postgres.sh`) and a PostgreSQL
//! table keyed as the last release made it — job shape, claims and leases, the checkpoint
//! invariants, group commits, fencing by lease and by generation, job-level phase, dead letters,
//! rate limits and pause, recreation. Publication, several tables, table ownership and schema
//! changes follow, per backend. The rules live once in `src/store/protocol.rs`; this suite proves
//! each backend carries them out.

use crate::support;
use kafka_backfill::codec::versions::resolve;

use std::collections::BTreeMap;

use apache_avro::types::Value as Avro;
use kafka_backfill::codec::TableSchema;
use kafka_backfill::core::{
    vnode_of, Checkpoint, CheckpointCause, DeadLetter, Epoch, Generation, Lease, PartitionId,
    PartitionMap, PartitionProgress, RateLimits, Row, RowMutation, Vnode, VnodeProgress,
};
use kafka_backfill::ports::{SnapshotInfo, StateStore, StoreError};
use kafka_backfill::store::postgres::PostgresStore;
use kafka_backfill::store::sqlite::SqliteStore;

const VNODES: u32 = 8;
const PARTITIONS: u32 = 2;
const ES: Epoch = Epoch(1 << 16);
const E1: Epoch = Epoch(2 << 16);
const E2: Epoch = Epoch(3 << 16);
const E3: Epoch = Epoch(4 << 16);
const E4: Epoch = Epoch(5 << 16);
const E5: Epoch = Epoch(6 << 16);

fn table() -> TableSchema {
    TableSchema::parse(
        kafka_backfill::workload::EXAMPLE_ROW_SCHEMA,
        &["id".to_string()],
    )
    .unwrap()
}

fn info() -> SnapshotInfo {
    SnapshotInfo {
        snapshot_epoch: ES,
        vnode_count: VNODES,
        partition_count: PARTITIONS,
        start: (0..PARTITIONS)
            .map(|p| PartitionProgress {
                partition: p,
                next_offset: 1 + p as u64,
                epoch: E1,
                streaming: false,
            })
            .collect(),
    }
}

fn map() -> PartitionMap {
    PartitionMap::new(VNODES, PARTITIONS).unwrap()
}

/// The rows of the example table whose vnodes belong to `partition`, ids counted from `first_id`,
/// each with balance `id × balance_per_id`: (key, datum, vnode).
fn rows_in(
    partition: PartitionId,
    first_id: i64,
    balance_per_id: i64,
) -> impl Iterator<Item = (Vec<u8>, Vec<u8>, Vnode)> {
    let t = table();
    (first_id..).filter_map(move |id| {
        let datum = t
            .encode_row(&Avro::Record(vec![
                ("id".into(), Avro::Long(id)),
                ("owner".into(), Avro::String(format!("o{id}"))),
                ("balance".into(), Avro::Long(id * balance_per_id)),
                ("version".into(), Avro::Long(1)),
                ("payload".into(), Avro::String("p".into())),
            ]))
            .unwrap();
        let key = t.key_of_datum(&datum).unwrap();
        let vnode = vnode_of(&key, VNODES);
        (map().partition_of(vnode) == partition).then_some((key, datum, vnode))
    })
}

/// A row of the example table whose vnode belongs to `partition`: (key, datum, vnode).
fn row_in(partition: PartitionId, nth: usize) -> (Vec<u8>, Vec<u8>, Vnode) {
    rows_in(partition, 0, 10).nth(nth).unwrap()
}

fn checkpoint(generation: u64, leases: Vec<(PartitionId, Lease)>) -> Checkpoint {
    Checkpoint {
        generation: Generation(generation),
        worker: "w".into(),
        cause: CheckpointCause::Local,
        epoch: None,
        leases,
        rows: vec![],
        vnodes: vec![],
        partitions: vec![],
        dead_letters: vec![],
        max_dead_letters: 0,
    }
}

fn is_invariant(r: Result<(), StoreError>) -> bool {
    matches!(&r, Err(StoreError::Invariant { .. }))
        && !r.as_ref().unwrap_err().is_fenced()
        && !r.as_ref().unwrap_err().is_transient()
}

/// A handle on the store under test; each call opens another on the same store.
type Open<'a> = &'a dyn Fn() -> Box<dyn StateStore>;

/// The scenarios, each run against every backend by [`scenarios!`]: `open` is a store no other
/// scenario uses, `job` a name no earlier run used.
macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        #[cfg(feature = "testing")]
        mod on_memory {
            $(
                #[test]
                fn $name() {
                    let store = kafka_backfill::store::memory::MemoryStore::new();
                    super::$name(&|| Box::new(store.clone()), stringify!($name));
                }
            )*
        }
        mod on_sqlite {
            use kafka_backfill::store::sqlite::SqliteStore;
            $(
                #[test]
                fn $name() {
                    let path = super::fresh_sqlite(concat!("conformance-", stringify!($name)));
                    super::$name(
                        &|| Box::new(SqliteStore::open(&path, "accounts", super::table()).unwrap()),
                        stringify!($name),
                    );
                }
            )*
        }
        /// `store_datum = false`: the table has no `_kb_row`; every scenario holds with the rows
        /// rebuilt from the typed columns.
        mod on_sqlite_without_the_datum {
            use kafka_backfill::store::sqlite::SqliteStore;
            $(
                #[test]
                fn $name() {
                    let path = super::fresh_sqlite(concat!("conformance-nodatum-", stringify!($name)));
                    super::$name(
                        &|| Box::new(SqliteStore::open_layout(&path, "accounts", super::table(), false).unwrap()),
                        stringify!($name),
                    );
                    assert!(!super::sqlite_has_datum(&path));
                }
            )*
        }
        mod on_postgres {
            use kafka_backfill::store::postgres::PostgresStore;
            $(
                #[test]
                fn $name() {
                    let (url, stamp) = (crate::support::pg_url(), crate::support::stamp());
                    let table = super::pg_table_name(stringify!($name), stamp);
                    super::$name(
                        &|| Box::new(PostgresStore::open(&url, &table, super::table()).unwrap()),
                        &format!("{}-{stamp}", stringify!($name)),
                    );
                }
            )*
        }
        /// A table the last release created, keyed by `_kb_key` alone: it keeps its key.
        mod on_postgres_keyed_by_key_alone {
            use kafka_backfill::store::postgres::PostgresStore;
            $(
                #[test]
                fn $name() {
                    let (url, stamp) = (crate::support::pg_url(), crate::support::stamp());
                    let table = super::pg_table_name(concat!("old-", stringify!($name)), stamp);
                    super::last_release_table(&url, &table);
                    super::$name(
                        &|| Box::new(PostgresStore::open(&url, &table, super::table()).unwrap()),
                        &format!("old-{}-{stamp}", stringify!($name)),
                    );
                    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
                    assert_eq!(super::pg_primary_key(&mut client, &table), ["_kb_key"]);
                }
            )*
        }
    };
}

scenarios!(
    a_missing_job_is_named,
    the_job_shape_is_fixed_at_creation,
    first_claims_start_at_the_snapshot_with_distinct_leases,
    a_snapshot_checkpoint_replayed_changes_nothing,
    progress_going_back_is_a_broken_invariant,
    rows_or_offsets_outside_the_lease_are_a_broken_invariant,
    a_group_commit_is_checked_in_order_all_or_nothing,
    the_job_streams_once_every_partition_does_and_a_claim_resumes,
    a_commit_under_a_lease_taken_over_is_fenced,
    dead_letters_are_recorded_once_and_capped,
    rate_limits_and_pause_are_shared_by_every_handle,
    recreation_fences_the_old_generation_and_keeps_limits_pause_and_letters,
    a_recreation_onto_a_newer_snapshot_records_its_epoch,
    a_bulk_snapshot_checkpoint_replayed_holds_each_row_once,
    a_truncation_empties_its_partition_s_vnodes_before_the_checkpoint_s_rows,
);

/// A PostgreSQL table name for a scenario (63 bytes at most: the scenario's name is hashed).
fn pg_table_name(scenario: &str, stamp: u128) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    scenario.hash(&mut h);
    format!("conformance_{:x}_{stamp}", h.finish())
}

/// Whether the SQLite table `accounts` at `path` has the datum column.
fn sqlite_has_datum(path: &std::path::Path) -> bool {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row(
            "SELECT COUNT(*) FROM pragma_table_info('accounts') WHERE name = '_kb_row'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
        > 0
}

/// Two handles on `job`, created, with partition 0 claimed by `a` and 1 by `b`: (a, b, a's lease,
/// b's lease).
fn claimed(open: Open, job: &str) -> (Box<dyn StateStore>, Box<dyn StateStore>, Lease, Lease) {
    let (mut a, mut b) = (open(), open());
    a.ensure_job(job, &info()).unwrap();
    let la = a.claim(job, Generation(0), "a", &[0], &info()).unwrap()[0].lease;
    let lb = b.claim(job, Generation(0), "b", &[1], &info()).unwrap()[0].lease;
    (a, b, la, lb)
}

/// The snapshot-phase upsert of `row` (no log offset).
fn snapshot_upsert((key, datum, vnode): (Vec<u8>, Vec<u8>, Vnode)) -> RowMutation {
    RowMutation::Upsert {
        vnode,
        row: Row { key, value: datum },
        offset: None,
    }
}

/// Vnode `v`'s snapshot done at `epoch` (or not, `finished`), one row copied.
fn done(v: Vnode, epoch: Epoch, finished: bool) -> VnodeProgress {
    VnodeProgress {
        vnode: v,
        epoch,
        row_count: 1,
        finished,
        cursor: None,
    }
}

/// Partition `p` at offset 10 in epoch E2, in the log store or `streaming`.
fn at_ten(p: PartitionId, streaming: bool) -> PartitionProgress {
    PartitionProgress {
        partition: p,
        next_offset: 10,
        epoch: E2,
        streaming,
    }
}

/// Partition 0's first row, copied by a checkpoint of `la` that also moves its vnode's cursor.
fn first_row_copied(la: Lease) -> Checkpoint {
    let (key, datum, v) = row_in(0, 0);
    let mut snap = checkpoint(0, vec![(0, la)]);
    snap.rows = vec![snapshot_upsert((key.clone(), datum, v))];
    snap.vnodes = vec![VnodeProgress {
        cursor: Some(key),
        row_count: 1,
        ..VnodeProgress::fresh(v, ES)
    }];
    snap
}

fn a_missing_job_is_named(open: Open, job: &str) {
    let mut a = open();
    assert!(a.job(job).unwrap().is_none());
    assert!(matches!(
        a.claim(job, Generation(0), "a", &[0], &info()),
        Err(StoreError::NoJob { .. })
    ));
}

fn the_job_shape_is_fixed_at_creation(open: Open, job: &str) {
    let (mut a, mut b) = (open(), open());
    let row = a.ensure_job(job, &info()).unwrap();
    assert_eq!(
        (row.generation, row.recreations, row.phase.as_str()),
        (Generation(0), 0, "snapshot")
    );
    assert_eq!(b.ensure_job(job, &info()).unwrap(), row);
    let mut other = info();
    other.partition_count = 3;
    assert_eq!(
        a.ensure_job(job, &other).unwrap_err().to_string(),
        format!("job {job}: partition count is 2 in the store but 3 in the configuration; a job's partition count is fixed")
    );
    let mut other = info();
    other.vnode_count = 16;
    assert!(matches!(
        a.ensure_job(job, &other),
        Err(StoreError::JobMismatch {
            what: "vnode count",
            ..
        })
    ));
    let mut other = info();
    other.snapshot_epoch = E1;
    assert!(matches!(
        a.ensure_job(job, &other),
        Err(StoreError::JobMismatch {
            what: "snapshot epoch",
            ..
        })
    ));
}

fn first_claims_start_at_the_snapshot_with_distinct_leases(open: Open, job: &str) {
    let (mut a, mut b) = (open(), open());
    let info = info();
    a.ensure_job(job, &info).unwrap();
    let ca = a.claim(job, Generation(0), "a", &[0], &info).unwrap();
    let cb = b.claim(job, Generation(0), "b", &[1], &info).unwrap();
    assert_eq!(ca[0].progress, info.start[0]);
    assert_eq!(cb[0].progress, info.start[1]);
    assert_eq!(
        ca[0].vnodes,
        map()
            .vnodes_of(0)
            .map(|v| VnodeProgress::fresh(v, ES))
            .collect::<Vec<_>>()
    );
    assert_ne!(ca[0].lease, cb[0].lease);
    assert_eq!(
        b.owners(job).unwrap(),
        BTreeMap::from([(0, "a".to_string()), (1, "b".to_string())])
    );
}

/// A replay of the same checkpoint (a transaction retried after its commit's answer was lost) is
/// accepted and changes nothing.
fn a_snapshot_checkpoint_replayed_changes_nothing(open: Open, job: &str) {
    let (mut a, mut b, la, _) = claimed(open, job);
    let snap = first_row_copied(la);
    let (key, datum, v) = row_in(0, 0);
    a.commit(job, &snap).unwrap();
    assert_eq!(b.rows(job).unwrap().get(&key), Some(&datum));
    assert_eq!(
        b.committed_vnodes(job).unwrap().get(&v).unwrap().cursor,
        Some(key.clone())
    );
    a.commit(job, &snap).unwrap();
    assert_eq!(b.rows(job).unwrap().len(), 1);
}

/// Each refused as a broken invariant (permanent, not fencing), changing nothing.
fn progress_going_back_is_a_broken_invariant(open: Open, job: &str) {
    let (mut a, mut b, la, _) = claimed(open, job);
    let snap = first_row_copied(la);
    a.commit(job, &snap).unwrap();
    let mut same_cursor = snap.clone();
    same_cursor.vnodes[0].row_count = 2;
    assert!(
        is_invariant(a.commit(job, &same_cursor)),
        "other progress at the same cursor"
    );
    let mut behind = snap.clone();
    behind.vnodes[0].cursor = Some(vec![]);
    assert!(is_invariant(a.commit(job, &behind)), "a cursor going back");
    let v = snap.vnodes[0].vnode;
    let mut forward = checkpoint(0, vec![(0, la)]);
    forward.vnodes = vec![done(v, E2, true)];
    a.commit(job, &forward).unwrap();
    let mut back = checkpoint(0, vec![(0, la)]);
    back.vnodes = vec![done(v, E1, true)];
    assert!(is_invariant(a.commit(job, &back)), "an epoch going back");
    let mut unfinished = checkpoint(0, vec![(0, la)]);
    unfinished.vnodes = vec![done(v, E2, false)];
    assert!(
        is_invariant(a.commit(job, &unfinished)),
        "a finished vnode unfinished again"
    );
    assert_eq!(b.committed_vnodes(job).unwrap()[&v], done(v, E2, true));
}

fn rows_or_offsets_outside_the_lease_are_a_broken_invariant(open: Open, job: &str) {
    let (mut a, mut b, la, _) = claimed(open, job);
    let mut outside = checkpoint(0, vec![(0, la)]);
    outside.rows = vec![snapshot_upsert(row_in(1, 0))];
    assert!(
        is_invariant(a.commit(job, &outside)),
        "a row outside the lease"
    );
    let mut no_lease = checkpoint(0, vec![(0, la)]);
    no_lease.partitions = vec![PartitionProgress {
        partition: 1,
        ..info().start[1].clone()
    }];
    assert!(
        is_invariant(a.commit(job, &no_lease)),
        "partition progress without its lease"
    );
    assert!(
        b.rows(job).unwrap().is_empty(),
        "refused checkpoints change nothing"
    );
    assert!(b.committed_partitions(job).unwrap().is_empty());
}

/// Checked in order (each against what the earlier ones left), all or nothing.
fn a_group_commit_is_checked_in_order_all_or_nothing(open: Open, job: &str) {
    let (mut a, mut b, la, _) = claimed(open, job);
    let (k3, d3, v3) = row_in(0, 2);
    let mut first = checkpoint(0, vec![(0, la)]);
    first.rows = vec![RowMutation::Upsert {
        vnode: v3,
        row: Row {
            key: k3.clone(),
            value: d3.clone(),
        },
        offset: Some(7),
    }];
    first.vnodes = vec![done(v3, E4, true)];
    // Alone, this one is valid; after `first` it would go back.
    let mut behind_first = checkpoint(0, vec![(0, la)]);
    behind_first.vnodes = vec![done(v3, E3, true)];
    a.commit(job, &behind_first).unwrap();
    let err = a
        .commit_group(job, &[first.clone(), behind_first])
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Invariant { .. }) && !err.is_fenced(),
        "the second goes back from the first: {err}"
    );
    assert!(
        !b.rows(job).unwrap().contains_key(&k3),
        "a refused group applies none of its checkpoints"
    );
    assert_eq!(b.committed_vnodes(job).unwrap()[&v3].epoch, E3);
    let mut after_first = checkpoint(0, vec![(0, la)]);
    after_first.vnodes = vec![done(v3, E5, true)];
    a.commit_group(job, &[first, after_first]).unwrap();
    assert_eq!(b.rows(job).unwrap().get(&k3), Some(&d3));
    assert_eq!(b.committed_vnodes(job).unwrap()[&v3].epoch, E5);
}

/// The job is in the log store until every partition has committed in streaming; a later claim
/// starts at the committed progress.
fn the_job_streams_once_every_partition_does_and_a_claim_resumes(open: Open, job: &str) {
    let (mut a, mut b, la, lb) = claimed(open, job);
    let v = map().vnodes_of(0).next().unwrap();
    let mut log = checkpoint(0, vec![(0, la)]);
    log.partitions = vec![at_ten(0, true)];
    log.vnodes = vec![done(v, E2, true)];
    a.commit(job, &log).unwrap();
    assert_eq!(a.job(job).unwrap().unwrap().phase, "log_store");
    let mut log = checkpoint(0, vec![(1, lb)]);
    log.partitions = vec![at_ten(1, true)];
    b.commit(job, &log).unwrap();
    assert_eq!(a.job(job).unwrap().unwrap().phase, "streaming");
    assert_eq!(
        a.committed_partitions(job).unwrap().get(&1),
        Some(&at_ten(1, true))
    );
    let again = b.claim(job, Generation(0), "b", &[0], &info()).unwrap();
    assert_eq!(again[0].progress, at_ten(0, true));
    assert_eq!(
        again[0].vnodes.iter().find(|x| x.vnode == v),
        Some(&done(v, E2, true))
    );
    assert_eq!(
        a.owners(job).unwrap()[&0],
        "b",
        "the last claim holds the lease"
    );
}

/// `b` took partition 0 from `a`: `a`'s commit is refused, as fenced, and changes nothing.
fn a_commit_under_a_lease_taken_over_is_fenced(open: Open, job: &str) {
    let (mut a, mut b, la, _) = claimed(open, job);
    b.claim(job, Generation(0), "b", &[0], &info()).unwrap();
    let (k2, _, v2) = row_in(0, 1);
    let mut stale = checkpoint(0, vec![(0, la)]);
    stale.rows = vec![RowMutation::Delete { vnode: v2, key: k2 }];
    let err = a.commit(job, &stale).unwrap_err();
    assert!(
        matches!(&err, StoreError::NotOwner { partition: 0, owner, .. } if owner == "b")
            && err.is_fenced(),
        "{err}"
    );
}

fn letter(p: PartitionId, o: u64) -> DeadLetter {
    DeadLetter {
        partition: p,
        offset: o,
        epoch: E2,
        reason: format!("record at partition {p} offset {o} does not decode"),
    }
}

/// Recorded with the checkpoint that carries them, once per record (a replayed checkpoint records
/// nothing twice), capped: the checkpoint that would pass the cap is refused, permanently, and
/// applies nothing.
fn dead_letters_are_recorded_once_and_capped(open: Open, job: &str) {
    let (mut a, mut b, la, lb) = claimed(open, job);
    assert!(a.dead_letters(job).unwrap().is_empty());
    let mut dl = checkpoint(0, vec![(0, la), (1, lb)]);
    dl.partitions = vec![
        PartitionProgress {
            next_offset: 12,
            ..at_ten(0, true)
        },
        at_ten(1, true),
    ];
    dl.dead_letters = vec![letter(0, 10), letter(0, 11)];
    dl.max_dead_letters = 2;
    b.commit(job, &dl).unwrap();
    let got = a.dead_letters(job).unwrap();
    assert_eq!(
        got.iter()
            .map(|d| (d.partition, d.offset, d.epoch, d.generation))
            .collect::<Vec<_>>(),
        vec![(0, 10, E2.0, Generation(0)), (0, 11, E2.0, Generation(0))]
    );
    assert!(
        got[0].reason.contains("offset 10 does not decode"),
        "{got:?}"
    );
    b.commit(job, &dl).unwrap();
    assert_eq!(
        a.dead_letters(job).unwrap().len(),
        2,
        "a replay records nothing twice"
    );
    let mut over = checkpoint(0, vec![(0, la), (1, lb)]);
    over.partitions = vec![PartitionProgress {
        next_offset: 20,
        ..at_ten(1, true)
    }];
    over.dead_letters = vec![letter(1, 19)];
    over.max_dead_letters = 2;
    let err = b.commit(job, &over).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::DeadLetterCap {
                max: 2,
                would_be: 3,
                ..
            }
        ) && !err.is_transient()
            && !err.is_fenced(),
        "{err}"
    );
    assert_eq!(a.dead_letters(job).unwrap().len(), 2);
    assert_eq!(
        a.committed_partitions(job).unwrap()[&1],
        at_ten(1, true),
        "the refused checkpoint's offsets are not applied"
    );
}

/// None until set; set from one handle, read from another; a pause resumed the same way.
fn rate_limits_and_pause_are_shared_by_every_handle(open: Open, job: &str) {
    let (mut a, mut b, _, _) = claimed(open, job);
    assert_eq!(a.rate_limits(job).unwrap(), None);
    let limits = RateLimits {
        snapshot_rows_per_second: 1_000,
        log_records_per_second: 250,
    };
    a.set_rate_limits(job, limits).unwrap();
    assert_eq!(b.rate_limits(job).unwrap(), Some(limits));
    a.set_rate_limits(job, RateLimits::both(7)).unwrap();
    assert_eq!(b.rate_limits(job).unwrap(), Some(RateLimits::both(7)));
    assert!(!a.paused(job).unwrap());
    a.set_paused(job, true).unwrap();
    assert!(b.paused(job).unwrap());
    b.set_paused(job, false).unwrap();
    assert!(!a.paused(job).unwrap());
}

/// Compare-and-set; discards rows, progress and leases; fences the old generation; limits, a
/// pause and dead letters outlive it (a dead letter met again is recorded once).
fn recreation_fences_the_old_generation_and_keeps_limits_pause_and_letters(open: Open, job: &str) {
    let (mut a, mut b, la, lb) = claimed(open, job);
    let mut dl = first_row_copied(la);
    dl.leases.push((1, lb));
    dl.dead_letters = vec![letter(0, 10)];
    dl.max_dead_letters = 2;
    a.commit(job, &dl).unwrap();
    a.set_rate_limits(job, RateLimits::both(7)).unwrap();
    a.set_paused(job, true).unwrap();
    let row = a.recreate(job, Generation(0)).unwrap();
    assert_eq!(
        (row.generation, row.recreations, row.phase.as_str()),
        (Generation(1), 1, "snapshot")
    );
    assert_eq!(
        b.recreate(job, Generation(0)).unwrap().generation,
        Generation(1),
        "only once"
    );
    assert!(a.rows(job).unwrap().is_empty());
    assert!(a.committed_vnodes(job).unwrap().is_empty());
    assert!(a.committed_partitions(job).unwrap().is_empty());
    assert!(
        a.owners(job).unwrap().is_empty(),
        "recreation drops the leases"
    );
    assert_eq!(a.rate_limits(job).unwrap(), Some(RateLimits::both(7)));
    assert!(a.paused(job).unwrap(), "a pause outlives a recreation");
    let err = b.commit(job, &dl).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::StaleGeneration {
                attempted: Generation(0),
                current: Generation(1),
                ..
            }
        ) && err.is_fenced(),
        "{err}"
    );
    assert!(matches!(
        a.claim(job, Generation(0), "a", &[0], &info()),
        Err(StoreError::StaleGeneration { .. })
    ));
    let fresh = a.claim(job, Generation(1), "a", &[0, 1], &info()).unwrap();
    assert_eq!(fresh[0].progress, info().start[0], "progress starts over");
    assert!(fresh[0]
        .vnodes
        .iter()
        .all(|x| *x == VnodeProgress::fresh(x.vnode, ES)));
    let mut again = checkpoint(1, vec![(0, fresh[0].lease), (1, fresh[1].lease)]);
    again.dead_letters = vec![letter(0, 10)];
    again.max_dead_letters = 2;
    a.commit(job, &again).unwrap();
    let kept = a.dead_letters(job).unwrap();
    assert_eq!(
        kept.len(),
        1,
        "read again after a recreation, recorded once"
    );
    assert_eq!(
        kept[0].generation,
        Generation(0),
        "its first generation is kept"
    );
}

/// A job whose log was deleted moves to a newer snapshot (`core::retention`): one recreation,
/// fenced and compare-and-set like any other, that also records the new snapshot epoch; the job
/// row then matches that snapshot (and no longer the old one), and claims start at its offsets.
fn a_recreation_onto_a_newer_snapshot_records_its_epoch(open: Open, job: &str) {
    let (mut a, mut b, la, lb) = claimed(open, job);
    let mut cp = first_row_copied(la);
    cp.leases.push((1, lb));
    a.commit(job, &cp).unwrap();
    let newer = SnapshotInfo {
        snapshot_epoch: Epoch(ES.0 * 4),
        start: info()
            .start
            .iter()
            .map(|s| PartitionProgress {
                next_offset: s.next_offset + 100,
                ..s.clone()
            })
            .collect(),
        ..info()
    };
    let row = a
        .recreate_onto(job, Generation(0), Some(newer.snapshot_epoch))
        .unwrap();
    assert_eq!(
        (row.generation, row.snapshot_epoch),
        (Generation(1), newer.snapshot_epoch)
    );
    let again = b
        .recreate_onto(job, Generation(0), Some(Epoch(ES.0 * 8)))
        .unwrap();
    assert_eq!(
        (again.generation, again.snapshot_epoch),
        (Generation(1), newer.snapshot_epoch),
        "a second mover of the same generation changes nothing"
    );
    assert!(a.rows(job).unwrap().is_empty());
    assert!(a.committed_partitions(job).unwrap().is_empty());
    a.ensure_job(job, &newer).unwrap();
    assert!(
        a.ensure_job(job, &info()).is_err(),
        "the old snapshot no longer matches the job"
    );
    let fresh = a.claim(job, Generation(1), "a", &[0, 1], &newer).unwrap();
    assert_eq!(
        fresh[0].progress, newer.start[0],
        "progress starts at the newer snapshot"
    );
}

/// PostgreSQL copies a snapshot checkpoint of many rows straight into the table; its replay, meeting
/// rows the table holds, upserts them instead. Each row is there once, with its datum.
fn a_bulk_snapshot_checkpoint_replayed_holds_each_row_once(open: Open, job: &str) {
    let (mut a, mut b, la, lb) = claimed(open, job);
    a.commit(job, &first_row_copied(la)).unwrap();
    let bulk = bulk_rows(1_100);
    let mut many = checkpoint(0, vec![(0, la), (1, lb)]);
    many.rows = bulk.iter().cloned().map(snapshot_upsert).collect();
    a.commit(job, &many).unwrap();
    a.commit(job, &many)
        .expect("a snapshot checkpoint replayed is accepted");
    let rows = b.rows(job).unwrap();
    assert_eq!(rows.len(), 1 + bulk.len());
    for (k, d, _) in &bulk {
        assert_eq!(rows.get(k), Some(d));
    }
}

/// A table belongs to one job: another job on it, or the job on another table, is refused before
/// anything is written. `open(table)` opens the store on `table`.
fn table_ownership(open: &dyn Fn(&str) -> Box<dyn StateStore>, t: &str, u: &str, a: &str, b: &str) {
    let info = info();
    let mut on_t = open(t);
    on_t.ensure_job(a, &info).unwrap();
    on_t.ensure_job(a, &info)
        .expect("the owner itself may start again");
    match on_t.ensure_job(b, &info) {
        Err(StoreError::TableOwned { table, owner, job }) => {
            assert_eq!((table.as_str(), owner.as_str(), job.as_str()), (t, a, b))
        }
        other => panic!("a second job on {t} was not refused: {other:?}"),
    }
    assert_eq!(on_t.job(b).unwrap(), None, "the refused job left a row");
    let msg = on_t.ensure_job(b, &info).unwrap_err().to_string();
    assert!(
        msg.contains(&format!("table {t} belongs to job {a}")),
        "{msg}"
    );
    // The same job name over a different snapshot is refused too.
    let mut other_snapshot = info.clone();
    other_snapshot.snapshot_epoch = E1;
    assert!(matches!(
        on_t.ensure_job(a, &other_snapshot),
        Err(StoreError::JobMismatch {
            what: "snapshot epoch",
            ..
        })
    ));
    // The owner moved onto another table of the same store is refused; the other job may have it.
    let mut on_u = open(u);
    match on_u.ensure_job(a, &info) {
        Err(StoreError::JobMismatch {
            what: "table",
            expected,
            found,
            ..
        }) => assert_eq!((expected.as_str(), found.as_str()), (u, t)),
        other => panic!("job {a} moved onto {u} was not refused: {other:?}"),
    }
    on_u.ensure_job(b, &info).unwrap();
    assert_eq!(on_t.job(a).unwrap().unwrap().generation, Generation(0));
}

/// The rows of a checkpoint truncating the table in `partition`'s vnodes and then writing
/// `after`, in the order the core commits them: (vnode, key), a truncation's empty prefix first.
fn truncated_then(partition: PartitionId, after: Vec<RowMutation>) -> Vec<RowMutation> {
    let mut rows: Vec<RowMutation> = map()
        .vnodes_of(partition)
        .map(|vnode| RowMutation::Truncate {
            vnode,
            prefix: Vec::new(),
        })
        .chain(after)
        .collect();
    rows.sort_by(|a, b| (a.vnode(), a.key()).cmp(&(b.vnode(), b.key())));
    rows
}

/// A truncation (the upstream's `TRUNCATE`, docs/WIRE.md "Truncate") deletes every committed row
/// of its partition's vnodes, then the rows written after it in the same checkpoint apply; the
/// other partition's rows stay.
fn a_truncation_empties_its_partition_s_vnodes_before_the_checkpoint_s_rows(open: Open, job: &str) {
    let (mut a, mut b, la, lb) = claimed(open, job);
    let (k0, _, u0) = upsert(0, 0);
    let (_, _, u1) = upsert(0, 1);
    let (k2, d2, u2) = upsert(0, 2);
    let (k3, d3, u3) = upsert(1, 0);
    a.commit(job, &log_checkpoint(0, la, E1, 10, vec![u0, u1]))
        .unwrap();
    b.commit(job, &log_checkpoint(1, lb, E1, 11, vec![u3]))
        .unwrap();
    assert_eq!(a.rows(job).unwrap().len(), 3);
    a.commit(
        job,
        &log_checkpoint(0, la, E2, 20, truncated_then(0, vec![u2])),
    )
    .unwrap();
    assert_eq!(
        b.rows(job).unwrap(),
        BTreeMap::from([(k2, d2), (k3, d3)]),
        "partition 0's rows before the truncation are gone, the row after it stays"
    );
    assert!(!b.rows(job).unwrap().contains_key(&k0));
}

/// A log-store checkpoint of the worker holding `partition` (lease `lease`) through `epoch`: its
/// vnodes finished at `epoch`, the partition's next offset `offset`.
fn log_checkpoint(
    partition: PartitionId,
    lease: Lease,
    epoch: Epoch,
    offset: u64,
    rows: Vec<RowMutation>,
) -> Checkpoint {
    let mut cp = checkpoint(0, vec![(partition, lease)]);
    cp.cause = CheckpointCause::Barrier;
    cp.epoch = Some(epoch);
    cp.rows = rows;
    cp.vnodes = map()
        .vnodes_of(partition)
        .map(|v| VnodeProgress {
            finished: true,
            ..VnodeProgress::fresh(v, epoch)
        })
        .collect();
    cp.partitions = vec![PartitionProgress {
        partition,
        next_offset: offset,
        epoch: Epoch(epoch.0 + (1 << 16)),
        streaming: false,
    }];
    cp
}

fn upsert(partition: PartitionId, nth: usize) -> (Vec<u8>, Vec<u8>, RowMutation) {
    upsert_of(row_in(partition, nth))
}

/// The upsert of row `(key, datum, vnode)`: its key, its datum and the mutation.
fn upsert_of((key, datum, vnode): (Vec<u8>, Vec<u8>, Vnode)) -> (Vec<u8>, Vec<u8>, RowMutation) {
    let m = RowMutation::Upsert {
        vnode,
        row: Row {
            key: key.clone(),
            value: datum.clone(),
        },
        offset: Some(1),
    };
    (key, datum, m)
}

/// Publication (`consistency = "epoch"`, docs/design/several-tables.md §2): two workers, one
/// partition each. The one ahead commits and nothing of it shows; the laggard's commit at the
/// same epoch publishes both; a checkpoint whose own epoch is published at once shows at once; a
/// replay of a published checkpoint changes nothing; a recreation starts the publication over.
fn publication(open: Open, job: &str) {
    let (mut a, mut b, la, lb) = claimed(open, job);
    assert_eq!(a.published_epoch(job).unwrap(), None);
    let (k0, d0, u0) = upsert(0, 0);
    let (k1, d1, u1) = upsert(1, 0);
    let (k2, d2, u2) = upsert(0, 1);
    // A is ahead: E1 and E2 committed, nothing published, the table unchanged.
    a.commit(job, &log_checkpoint(0, la, E1, 10, vec![u0.clone()]))
        .unwrap();
    a.commit(job, &log_checkpoint(0, la, E2, 20, vec![u2.clone()]))
        .unwrap();
    assert_eq!(b.published_epoch(job).unwrap(), None);
    assert!(b.rows(job).unwrap().is_empty(), "nothing published yet");
    assert_eq!(
        b.committed_partitions(job).unwrap()[&0].next_offset,
        20,
        "progress is committed as ever"
    );
    // B reaches E1: both published at E1, A's E2 still waiting.
    b.commit(job, &log_checkpoint(1, lb, E1, 11, vec![u1]))
        .unwrap();
    assert_eq!(a.published_epoch(job).unwrap(), Some(E1));
    assert_eq!(
        a.rows(job).unwrap(),
        BTreeMap::from([(k0.clone(), d0.clone()), (k1.clone(), d1.clone())])
    );
    // B reaches E2 deleting its row: published at E2, B's rows straight in, A's E2 unit applied.
    let del = RowMutation::Delete {
        vnode: row_in(1, 0).2,
        key: k1.clone(),
    };
    b.commit(job, &log_checkpoint(1, lb, E2, 21, vec![del]))
        .unwrap();
    assert_eq!(a.published_epoch(job).unwrap(), Some(E2));
    assert_eq!(
        a.rows(job).unwrap(),
        BTreeMap::from([(k0.clone(), d0.clone()), (k2.clone(), d2.clone())])
    );
    // A replay of A's E2 checkpoint (its answer lost): published already, nothing changes.
    a.commit(job, &log_checkpoint(0, la, E2, 20, vec![u2]))
        .unwrap();
    assert_eq!(a.published_epoch(job).unwrap(), Some(E2));
    assert_eq!(a.rows(job).unwrap().len(), 2);
    publication_across_a_recreation(&mut a, &mut b, job);
}

/// Both workers claimed (A partition 0, B partition 1), each having committed its first row at
/// E1: the stores, the leases and the two rows (key, datum).
#[allow(clippy::type_complexity)]
fn both_at_e1(
    open: Open,
    job: &str,
) -> (
    Box<dyn StateStore>,
    Box<dyn StateStore>,
    Lease,
    Lease,
    [(Vec<u8>, Vec<u8>); 2],
) {
    let (mut a, mut b, la, lb) = claimed(open, job);
    let (k0, d0, u0) = upsert(0, 0);
    let (k1, d1, u1) = upsert(1, 0);
    a.commit(job, &log_checkpoint(0, la, E1, 10, vec![u0]))
        .unwrap();
    b.commit(job, &log_checkpoint(1, lb, E1, 11, vec![u1]))
        .unwrap();
    (a, b, la, lb, [(k0, d0), (k1, d1)])
}

/// Under publication a truncation waits with its checkpoint's other rows: readers see the table
/// whole until every partition reaches its epoch, then without the truncated rows.
fn a_truncation_is_published_with_its_epoch(open: Open, job: &str) {
    let (mut a, mut b, la, lb, [(k0, d0), (k1, d1)]) = both_at_e1(open, job);
    let (k2, d2, u2) = upsert(0, 1);
    let before = BTreeMap::from([(k0, d0), (k1.clone(), d1.clone())]);
    assert_eq!(a.rows(job).unwrap(), before);
    a.commit(
        job,
        &log_checkpoint(0, la, E2, 20, truncated_then(0, vec![u2])),
    )
    .unwrap();
    assert_eq!(a.rows(job).unwrap(), before, "held until B reaches E2");
    b.commit(job, &log_checkpoint(1, lb, E2, 21, vec![]))
        .unwrap();
    assert_eq!(a.published_epoch(job).unwrap(), Some(E2));
    assert_eq!(
        a.rows(job).unwrap(),
        BTreeMap::from([(k1, d1), (k2, d2)]),
        "published at E2: partition 0 truncated, then its row of E2"
    );
}

/// Generation 0 recreated by A; both claim generation 1 and B commits a snapshot checkpoint of one
/// row (`upsert(1, 1)`): the leases and that row (key, datum).
fn recreated_with_a_snapshot_row(
    a: &mut Box<dyn StateStore>,
    b: &mut Box<dyn StateStore>,
    job: &str,
) -> (Lease, Lease, (Vec<u8>, Vec<u8>)) {
    let info = info();
    let row = a.recreate(job, Generation(0)).unwrap();
    assert_eq!(row.generation, Generation(1));
    let la = a.claim(job, Generation(1), "a", &[0], &info).unwrap()[0].lease;
    let lb = b.claim(job, Generation(1), "b", &[1], &info).unwrap()[0].lease;
    let (k3, d3, u3) = upsert(1, 1);
    let mut snap = checkpoint(1, vec![(1, lb)]);
    snap.rows = vec![u3];
    b.commit(job, &snap).unwrap();
    (la, lb, (k3, d3))
}

/// An empty log checkpoint of generation 1.
fn gen1(p: PartitionId, lease: Lease, epoch: Epoch, offset: u64) -> Checkpoint {
    let mut cp = log_checkpoint(p, lease, epoch, offset, vec![]);
    cp.generation = Generation(1);
    cp
}

/// Publication, continued: a recreation keeps the replica readers see until the new generation
/// reaches its epoch, and a stale generation publishes nothing.
fn publication_across_a_recreation(
    a: &mut Box<dyn StateStore>,
    b: &mut Box<dyn StateStore>,
    job: &str,
) {
    // A recreation keeps the replica readers see until the new generation reaches its epoch: the
    // new one's snapshot rows and its publication at E1 do not show; at E3 it replaces the old.
    let old = a.rows(job).unwrap();
    let (la, lb, (k3, d3)) = recreated_with_a_snapshot_row(a, b, job);
    assert_eq!(a.job(job).unwrap().unwrap().generation, Generation(1));
    assert_eq!(a.published_epoch(job).unwrap(), Some(E2));
    assert_eq!(a.rows(job).unwrap(), old, "the old replica stays visible");
    a.commit(job, &gen1(0, la, E1, 10)).unwrap();
    b.commit(job, &gen1(1, lb, E1, 11)).unwrap();
    assert_eq!(a.published_epoch(job).unwrap(), Some(E2), "E1 is older");
    assert_eq!(a.rows(job).unwrap(), old);
    a.commit(job, &gen1(0, la, E3, 30)).unwrap();
    b.commit(job, &gen1(1, lb, E3, 31)).unwrap();
    assert_eq!(a.published_epoch(job).unwrap(), Some(E3));
    assert_eq!(
        b.rows(job).unwrap(),
        BTreeMap::from([(k3, d3)]),
        "the new generation replaced the old"
    );
    // A stale generation's checkpoint is fenced as ever and publishes nothing.
    assert!(a
        .commit(job, &log_checkpoint(0, la, E4, 40, vec![]))
        .unwrap_err()
        .is_fenced());
    assert_eq!(a.published_epoch(job).unwrap(), Some(E3));
}

/// A row of `upsert(partition, nth)` keyed for log table `table` of a several-table job: the
/// (table, key) key, the datum, the mutation (its vnode the bare key's).
fn upsert_in(table: u16, partition: PartitionId, nth: usize) -> (Vec<u8>, Vec<u8>, RowMutation) {
    let (key, datum, vnode) = row_in(partition, nth);
    upsert_of((kafka_backfill::core::table_key(table, &key), datum, vnode))
}

/// Opens the store on the SQL tables `(name, log table)` of a job.
type OpenTables<'a> = &'a dyn Fn(&[(&str, u16)]) -> Box<dyn StateStore>;

/// The store tables `(name, log table)` of a several-table job, every one of the example schema.
fn store_tables(tables: &[(&str, u16)]) -> Vec<kafka_backfill::store::StoreTable> {
    tables
        .iter()
        .map(|(name, index)| kafka_backfill::store::StoreTable {
            index: *index,
            source: format!("source_{index}"),
            name: name.to_string(),
            schema: table(),
        })
        .collect()
}

/// Several tables in one job (docs/design/several-tables.md §3), under publication: `open(tables)`
/// opens the store on the tables `(SQL name, log table)` (one table: the single-table store),
/// `count(name)` counts SQL table `name`'s rows. One checkpoint's rows of two tables land in their
/// tables together, at the same published epoch; a row of a table the job does not have is refused
/// with nothing written; each table is owned by the job; the set of tables is fixed; a recreation
/// keeps both tables' old rows visible until the new generation publishes, then replaces both.
fn several_tables(
    open: OpenTables,
    count: &dyn Fn(&str) -> usize,
    present: &dyn Fn(&str) -> bool,
    names: [&str; 3],
    job: &str,
) {
    let [x, y, _] = names;
    let both = [(x, 0), (y, 1)];
    let (mut a, mut b) = (open(&both), open(&both));
    let info = info();
    a.ensure_job(job, &info).unwrap();
    let la = a.claim(job, Generation(0), "a", &[0], &info).unwrap()[0].lease;
    let lb = b.claim(job, Generation(0), "b", &[1], &info).unwrap()[0].lease;
    let (kx0, dx0, ux0) = upsert_in(0, 0, 0);
    let (ky0, dy0, uy0) = upsert_in(1, 0, 1);
    let (kx1, dx1, ux1) = upsert_in(0, 1, 0);
    // A's checkpoint carries both tables' rows; nothing shows until B reaches E1 as well.
    a.commit(job, &log_checkpoint(0, la, E1, 10, vec![ux0, uy0]))
        .unwrap();
    assert_eq!((count(x), count(y)), (0, 0), "nothing published yet");
    b.commit(job, &log_checkpoint(1, lb, E1, 11, vec![ux1]))
        .unwrap();
    assert_eq!(a.published_epoch(job).unwrap(), Some(E1));
    assert_eq!((count(x), count(y)), (2, 1), "each row in its own table");
    assert_eq!(
        b.rows(job).unwrap(),
        BTreeMap::from([
            (kx0.clone(), dx0.clone()),
            (kx1.clone(), dx1.clone()),
            (ky0.clone(), dy0.clone())
        ]),
        "rows() reads every table, keyed by (table, key)"
    );
    several_tables_refused(open, names, job, &mut a, la);
    several_tables_across_a_recreation(count, [x, y], job, &mut a, &mut b);
    several_tables_grown(open, count, present, names, job);
}

/// Several tables, continued: the job gains a table (docs/CAPTURE.md "Adding a table"). Its start
/// on the three tables moves it to a new generation that loads every table from the snapshot it was
/// opened on; readers keep the two old tables, and see none of the added one, until that
/// generation publishes; then all three at one epoch.
fn several_tables_grown(
    open: OpenTables,
    count: &dyn Fn(&str) -> usize,
    present: &dyn Fn(&str) -> bool,
    [x, y, z]: [&str; 3],
    job: &str,
) {
    let info = info();
    let all = [(x, 0), (y, 1), (z, 2)];
    let (mut a, mut b) = (open(&all), open(&all));
    assert!(
        !present(z),
        "an open creates no table added to a published job"
    );
    assert_eq!(a.ensure_job(job, &info).unwrap().generation, Generation(2));
    assert_eq!(
        b.ensure_job(job, &info).unwrap().generation,
        Generation(2),
        "grown once"
    );
    assert_eq!(
        (count(x), count(y)),
        (1, 1),
        "the old replica stays visible"
    );
    assert!(!present(z), "the added table appears with its generation");
    let la = a.claim(job, Generation(2), "a", &[0], &info).unwrap()[0].lease;
    let lb = b.claim(job, Generation(2), "b", &[1], &info).unwrap()[0].lease;
    let (kz, dz, uz) = upsert_in(2, 0, 5);
    let (kx, dx, ux) = upsert_in(0, 1, 6);
    let mut snap = checkpoint(2, vec![(0, la)]);
    snap.rows = vec![uz];
    a.commit(job, &snap).unwrap();
    let gen2 = |p: PartitionId, lease: Lease, epoch: Epoch, offset: u64, rows: Vec<RowMutation>| {
        let mut cp = log_checkpoint(p, lease, epoch, offset, rows);
        cp.generation = Generation(2);
        cp
    };
    a.commit(job, &gen2(0, la, E4, 40, vec![])).unwrap();
    assert_eq!(a.published_epoch(job).unwrap(), Some(E3));
    assert!(!present(z));
    b.commit(job, &gen2(1, lb, E4, 41, vec![ux])).unwrap();
    assert_eq!(a.published_epoch(job).unwrap(), Some(E4));
    assert_eq!((count(x), count(y), count(z)), (1, 0, 1));
    assert_eq!(
        a.rows(job).unwrap(),
        BTreeMap::from([(kx, dx), (kz, dz)]),
        "the three tables at the new generation's epoch"
    );
    // Once grown, the two tables alone are a table left out.
    match open(&[(x, 0), (y, 1)]).ensure_job(job, &info) {
        Err(StoreError::JobMismatch {
            what: "set of tables",
            ..
        }) => {}
        other => panic!("job {job} opened without {z}: {other:?}"),
    }
}

/// Several tables, continued: a row of a table the job does not have, another job on one of its
/// tables, and a changed set of tables are each refused, writing nothing.
fn several_tables_refused(
    open: OpenTables,
    names: [&str; 3],
    job: &str,
    a: &mut Box<dyn StateStore>,
    la: Lease,
) {
    let [x, y, z] = names;
    let info = info();
    // A row of log table 5, which the job does not have: refused, nothing of the checkpoint written.
    let (_, _, stray) = upsert_in(5, 0, 2);
    let (_, _, ux2) = upsert_in(0, 0, 3);
    match a.commit(job, &log_checkpoint(0, la, E2, 20, vec![ux2, stray])) {
        Err(StoreError::Rejected { what: reason, .. }) => assert!(
            reason.contains("of log table 5, which is not one of this store's tables"),
            "{reason}"
        ),
        other => panic!("a row of another table was not refused: {other:?}"),
    }
    assert_eq!(
        a.committed_partitions(job).unwrap()[&0].next_offset,
        10,
        "the refused checkpoint left no progress"
    );
    // Each table is the job's: another job on one of them is refused.
    let mut on_y = open(&[(y, 0)]);
    match on_y.ensure_job("another", &info) {
        Err(StoreError::TableOwned { table, owner, .. }) => {
            assert_eq!((table.as_str(), owner.as_str()), (y, job))
        }
        other => panic!("another job on {y} was not refused: {other:?}"),
    }
    // A table left out, or one under another log index, is refused (one added is a growth:
    // [`several_tables_grown`]).
    for tables in [vec![(x, 0)], vec![(x, 0), (y, 2)], vec![(x, 0), (z, 1)]] {
        match open(&tables).ensure_job(job, &info) {
            Err(StoreError::JobMismatch {
                what: "set of tables",
                ..
            }) => {}
            other => panic!("job {job} opened on {tables:?}: {other:?}"),
        }
    }
}

/// Several tables, continued: a recreation keeps both tables' old rows visible until the new
/// generation publishes.
fn several_tables_across_a_recreation(
    count: &dyn Fn(&str) -> usize,
    [x, y]: [&str; 2],
    job: &str,
    a: &mut Box<dyn StateStore>,
    b: &mut Box<dyn StateStore>,
) {
    let info = info();
    // A recreation: both tables' old rows stay visible until the new generation publishes.
    let old = a.rows(job).unwrap();
    assert_eq!(
        a.recreate(job, Generation(0)).unwrap().generation,
        Generation(1)
    );
    let la = a.claim(job, Generation(1), "a", &[0], &info).unwrap()[0].lease;
    let lb = b.claim(job, Generation(1), "b", &[1], &info).unwrap()[0].lease;
    let (ky3, dy3, uy3) = upsert_in(1, 1, 3);
    let mut snap = checkpoint(1, vec![(1, lb)]);
    snap.rows = vec![uy3];
    b.commit(job, &snap).unwrap();
    let gen1 = |p: PartitionId, lease: Lease, epoch: Epoch, offset: u64, rows: Vec<RowMutation>| {
        let mut cp = log_checkpoint(p, lease, epoch, offset, rows);
        cp.generation = Generation(1);
        cp
    };
    let (kx4, dx4, ux4) = upsert_in(0, 0, 4);
    a.commit(job, &gen1(0, la, E3, 30, vec![ux4])).unwrap();
    assert_eq!(a.rows(job).unwrap(), old, "the old replica stays visible");
    assert_eq!((count(x), count(y)), (2, 1));
    b.commit(job, &gen1(1, lb, E3, 31, vec![])).unwrap();
    assert_eq!(a.published_epoch(job).unwrap(), Some(E3));
    assert_eq!(
        a.rows(job).unwrap(),
        BTreeMap::from([(kx4, dx4), (ky3, dy3)]),
        "the new generation replaced both tables"
    );
    assert_eq!((count(x), count(y)), (1, 1));
}

#[test]
fn sqlite_several_tables() {
    use kafka_backfill::store::sqlite::SqliteOptions;
    let path = fresh_sqlite("several-tables");
    let options = SqliteOptions {
        publication: true,
        ..Default::default()
    };
    several_tables(
        &|tables| {
            Box::new(if tables.len() == 1 {
                SqliteStore::open_with(&path, tables[0].0, table(), options).unwrap()
            } else {
                SqliteStore::open_tables(&path, store_tables(tables), options).unwrap()
            })
        },
        &|name| {
            rusqlite::Connection::open(&path)
                .unwrap()
                .query_row(&format!("SELECT COUNT(*) FROM \"{name}\""), [], |r| {
                    r.get::<_, i64>(0)
                })
                .unwrap() as usize
        },
        &|name| {
            rusqlite::Connection::open(&path)
                .unwrap()
                .query_row(
                    "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
                    [name],
                    |r| r.get::<_, i64>(0),
                )
                .unwrap()
                > 0
        },
        ["xs", "ys", "zs"],
        "several",
    );
}

#[test]
fn postgres_several_tables() {
    let url = support::pg_url();
    let stamp = support::stamp();
    let names = [
        format!("xs_{stamp}"),
        format!("ys_{stamp}"),
        format!("zs_{stamp}"),
    ];
    several_tables(
        &|tables| {
            Box::new(if tables.len() == 1 {
                PostgresStore::open_with(&url, tables[0].0, table(), true).unwrap()
            } else {
                PostgresStore::open_tables(&url, store_tables(tables), true).unwrap()
            })
        },
        &|name| {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            client
                .query_one(&format!("SELECT COUNT(*) FROM \"{name}\""), &[])
                .map(|r| r.get::<_, i64>(0) as usize)
                .unwrap()
        },
        &|name| {
            let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            client
                .query_one("SELECT to_regclass(quote_ident($1)) IS NOT NULL", &[&name])
                .map(|r| r.get::<_, bool>(0))
                .unwrap()
        },
        [&names[0], &names[1], &names[2]],
        &format!("several-{stamp}"),
    );
}

/// Leaving `consistency = "epoch"` with checkpoints pending would lose them: refused, saying what to
/// do; entering it from `"vnode"` is fine (the table's rows are each vnode's, the units continue).
#[test]
fn sqlite_leaving_publication_with_work_pending_is_refused() {
    use kafka_backfill::store::sqlite::SqliteOptions;
    let path = fresh_sqlite("publication-switch");
    let epoch = SqliteOptions {
        publication: true,
        ..Default::default()
    };
    let job = "switch";
    let mut a = SqliteStore::open_with(&path, "accounts", table(), epoch).unwrap();
    a.ensure_job(job, &info()).unwrap();
    let la = a.claim(job, Generation(0), "a", &[0], &info()).unwrap()[0].lease;
    let (_, _, u0) = upsert(0, 0);
    a.commit(job, &log_checkpoint(0, la, E1, 10, vec![u0]))
        .unwrap();
    let mut vnode = SqliteStore::open(&path, "accounts", table()).unwrap();
    let e = vnode.ensure_job(job, &info()).unwrap_err().to_string();
    assert!(
        e.contains("was run with consistency = \"epoch\" and holds 1 checkpoint(s) waiting for publication; set consistency = \"epoch\" again"),
        "{e}"
    );
    a.ensure_job(job, &info())
        .expect("with publication it opens");
    let fresh = fresh_sqlite("publication-enter");
    let mut v = SqliteStore::open(&fresh, "accounts", table()).unwrap();
    v.ensure_job(job, &info()).unwrap();
    drop(v);
    SqliteStore::open_with(&fresh, "accounts", table(), epoch)
        .unwrap()
        .ensure_job(job, &info())
        .expect("a vnode job may move to epoch");
}

#[cfg(feature = "testing")]
#[test]
fn memory_publication() {
    for (scenario, name) in PUBLICATION_SCENARIOS {
        let store = kafka_backfill::store::memory::MemoryStore::publishing();
        scenario(&|| Box::new(store.clone()), name);
    }
}

/// A scenario: a store opener and a job name.
type Scenario = fn(Open, &str);

/// The publication scenarios, each run on a store of its own (a table belongs to one job).
const PUBLICATION_SCENARIOS: [(Scenario, &str); 2] = [
    (publication, "publication"),
    (a_truncation_is_published_with_its_epoch, "truncated"),
];

#[test]
fn sqlite_publication() {
    for (scenario, name) in PUBLICATION_SCENARIOS {
        let path = fresh_sqlite(name);
        let options = kafka_backfill::store::sqlite::SqliteOptions {
            publication: true,
            ..Default::default()
        };
        scenario(
            &|| Box::new(SqliteStore::open_with(&path, "accounts", table(), options).unwrap()),
            name,
        );
    }
}

/// A store with typed columns refuses an upserted row whose datum does not decode, naming its key,
/// and applies nothing of its checkpoint (SQLite reads a row's values in place from its datum, so
/// the refusal comes from the same bind path; PostgreSQL decodes them first).
fn a_row_that_does_not_decode_is_refused(open: &dyn Fn() -> Box<dyn StateStore>, job: &str) {
    let mut a = open();
    let info = info();
    a.ensure_job(job, &info).unwrap();
    let lease = a.claim(job, Generation(0), "a", &[0], &info).unwrap()[0].lease;
    let (good_key, _, good) = upsert(0, 0);
    let (bad_key, datum, vnode) = row_in(0, 1);
    let bad = RowMutation::Upsert {
        vnode,
        row: Row {
            key: bad_key.clone(),
            value: datum[..datum.len() - 1].to_vec(),
        },
        offset: Some(2),
    };
    let err = a
        .commit(job, &log_checkpoint(0, lease, E1, 3, vec![good, bad]))
        .unwrap_err();
    let hex: String = bad_key.iter().map(|b| format!("{b:02x}")).collect();
    assert!(
        matches!(err, StoreError::Rejected { .. })
            && err.to_string().contains("does not decode")
            && err.to_string().contains(&hex),
        "{err}"
    );
    let rows = a.rows(job).unwrap();
    assert!(
        !rows.contains_key(&good_key) && !rows.contains_key(&bad_key),
        "nothing of the refused checkpoint is applied"
    );
}

#[test]
fn sqlite_refuses_a_row_that_does_not_decode() {
    let path = fresh_sqlite("undecodable");
    a_row_that_does_not_decode_is_refused(
        &|| Box::new(SqliteStore::open(&path, "accounts", table()).unwrap()),
        "undecodable",
    );
}

#[test]
fn postgres_refuses_a_row_that_does_not_decode() {
    let stamp = support::stamp();
    a_row_that_does_not_decode_is_refused(
        &|| {
            Box::new(
                PostgresStore::open(&support::pg_url(), &format!("undecodable_{stamp}"), table())
                    .unwrap(),
            )
        },
        &format!("undecodable-{stamp}"),
    );
}

/// A new SQLite file for one test, `name`.
fn fresh_sqlite(name: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.sqlite");
    let _ = std::fs::remove_file(&path);
    path
}

/// A table keeps the layout it was created with (the last release's tables all have `_kb_row`);
/// the other layout is refused with what to do, and so is `store_datum = false` for a row schema
/// that its typed columns cannot rebuild.
#[test]
fn sqlite_tables_keep_their_layout() {
    let path = fresh_sqlite("layout");
    drop(SqliteStore::open(&path, "with_datum", table()).unwrap());
    drop(SqliteStore::open_layout(&path, "without", table(), false).unwrap());
    let e = SqliteStore::open_layout(&path, "with_datum", table(), false)
        .err()
        .expect("a table with _kb_row refuses store_datum = false")
        .to_string();
    assert!(
        e.contains("table with_datum")
            && e.contains("created with _kb_row")
            && e.contains("set store_datum = true"),
        "{e}"
    );
    let e = SqliteStore::open(&path, "without", table())
        .err()
        .expect("a table without _kb_row refuses store_datum = true")
        .to_string();
    assert!(
        e.contains("created without _kb_row") && e.contains("set store_datum = false"),
        "{e}"
    );
    SqliteStore::open(&path, "with_datum", table()).expect("the default opens the old layout");
    let typed = TableSchema::parse(
        kafka_backfill::workload::TYPED_ROW_SCHEMA,
        &["region".to_string(), "id".to_string()],
    )
    .unwrap();
    let e = SqliteStore::open_layout(&path, "typed", typed, false)
        .err()
        .expect("a schema with composite fields refuses store_datum = false")
        .to_string();
    assert!(
        e.contains("store_datum = false needs a row schema of primitives"),
        "{e}"
    );
}

#[test]
fn sqlite_table_ownership() {
    let path = fresh_sqlite("ownership");
    table_ownership(
        &|t| Box::new(SqliteStore::open(&path, t, table()).unwrap()),
        "accounts",
        "accounts_b",
        "a",
        "b",
    );
}

/// A worker starting while another's commit holds the job row (`FOR UPDATE`, as every commit's
/// check takes it) is not held up by it: the start reads the row without locking it. Locking it
/// there deadlocked against the commit, whose phase update needs the `kb_jobs` lock the start
/// holds.
#[test]
fn postgres_a_start_does_not_wait_on_a_commit_holding_the_job_row() {
    let url = support::pg_url();
    let stamp = support::stamp();
    let (t, job) = (format!("start_{stamp}"), format!("start-{stamp}"));
    let info = info();
    PostgresStore::open(&url, &t, table())
        .unwrap()
        .ensure_job(&job, &info)
        .unwrap();
    let mut commit = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let mut holding = commit.transaction().unwrap();
    holding
        .query("SELECT job FROM kb_jobs WHERE job = $1 FOR UPDATE", &[&job])
        .unwrap();
    let (done, started) = std::sync::mpsc::channel();
    let (u, j, i) = (url.clone(), job.clone(), info.clone());
    std::thread::spawn(move || {
        let mut store = PostgresStore::open(&u, &t, table()).unwrap();
        done.send(store.ensure_job(&j, &i).map(|r| r.generation))
            .unwrap();
    });
    let started = started.recv_timeout(std::time::Duration::from_secs(20));
    holding.rollback().unwrap();
    let started = started.expect("the start waited on the row lock a commit holds");
    assert!(matches!(started, Ok(Generation(0))), "{started:?}");
}

#[test]
fn postgres_table_ownership() {
    let url = support::pg_url();
    let stamp = support::stamp();
    let (t, u) = (format!("owned_{stamp}"), format!("owned_b_{stamp}"));
    table_ownership(
        &|t| Box::new(PostgresStore::open(&url, t, table()).unwrap()),
        &t,
        &u,
        &format!("a-{stamp}"),
        &format!("b-{stamp}"),
    );
}

#[test]
fn postgres_publication() {
    let url = support::pg_url();
    for (scenario, name) in PUBLICATION_SCENARIOS {
        let stamp = support::stamp();
        let tname = format!("{name}_{stamp}");
        scenario(
            &|| Box::new(PostgresStore::open_with(&url, &tname, table(), true).unwrap()),
            &format!("{name}-{stamp}"),
        );
    }
}

/// The primary-key columns of PostgreSQL table `t`, in key order.
fn pg_primary_key(client: &mut postgres::Client, t: &str) -> Vec<String> {
    client
        .query(
            "SELECT a.attname::text FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
             WHERE i.indrelid = to_regclass(quote_ident($1)) AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)",
            &[&t],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// New PostgreSQL tables are keyed `(_kb_vnode, _kb_key)`; a table the last release created, keyed
/// by `_kb_key` alone, keeps its key under publication (every scenario on such a table:
/// `on_postgres_keyed_by_key_alone`).
#[test]
fn postgres_tables_of_the_last_release_keep_their_key() {
    let url = support::pg_url();
    let stamp = support::stamp();
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let new = format!("keyed_new_{stamp}");
    PostgresStore::open(&url, &new, table()).unwrap();
    assert_eq!(pg_primary_key(&mut client, &new), ["_kb_vnode", "_kb_key"]);
    let old = format!("keyed_old_publication_{stamp}");
    last_release_table(&url, &old);
    let open = || {
        Box::new(PostgresStore::open_with(&url, &old, table(), true).unwrap())
            as Box<dyn StateStore>
    };
    publication(&open, &format!("keyed-old-publication-{stamp}"));
    assert_eq!(pg_primary_key(&mut client, &old), ["_kb_key"]);
}

/// Creates PostgreSQL table `name` as the last release did: keyed by `_kb_key` alone.
fn last_release_table(url: &str, name: &str) {
    postgres::Client::connect(url, postgres::NoTls)
        .unwrap()
        .batch_execute(&format!(
            "CREATE TABLE \"{name}\" (_kb_key BYTEA PRIMARY KEY, _kb_vnode INT NOT NULL, {}, _kb_row BYTEA NOT NULL)",
            table().column_ddl(kafka_backfill::codec::ColumnType::postgres)
        ))
        .unwrap();
}

/// The log's versions for [`schema_change`]: `produce --evolve`'s first (adds `tier` and `note`)
/// from E2, and that one without `payload` from E3.
fn evolution() -> std::sync::Arc<kafka_backfill::codec::versions::Evolution> {
    use kafka_backfill::codec::versions::{AnnouncedVersion, Evolution};
    let v1 = kafka_backfill::workload::evolved_schemas().unwrap()[0].clone();
    let mut v2 = v1.json.clone();
    v2["fields"]
        .as_array_mut()
        .unwrap()
        .retain(|f| f["name"] != "payload");
    let announced = vec![
        AnnouncedVersion {
            source: "v1".into(),
            table: None,
            from_epoch: E2,
            row_schema: v1.json.to_string(),
            named_fingerprint: None,
            primary_key: None,
        },
        AnnouncedVersion {
            source: "v2".into(),
            table: None,
            from_epoch: E3,
            row_schema: v2.to_string(),
            named_fingerprint: None,
            primary_key: None,
        },
    ];
    std::sync::Arc::new(
        Evolution::new(
            vec![table()],
            vec![None],
            ES,
            Box::new(move || Ok(announced.clone())),
            Box::new(|| 2),
        )
        .unwrap(),
    )
}

/// SQLite table `t`'s column names.
fn sqlite_columns(c: &rusqlite::Connection, t: &str) -> Vec<String> {
    c.prepare(&format!("SELECT name FROM pragma_table_info('{t}')"))
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The versions a job reads after a resync onto a snapshot taken at version 1 of [`evolution`]:
/// that version is the new manifest's (the list's first), and version 2 (`payload` dropped, from
/// E3) the only one after it.
fn evolution_after_a_resync() -> std::sync::Arc<kafka_backfill::codec::versions::Evolution> {
    use kafka_backfill::codec::versions::{AnnouncedVersion, Evolution};
    let vs = evolution().current();
    let (v1, v2) = (vs.of(0)[1].table.clone(), vs.of(0)[2].table.clone());
    let announced = vec![AnnouncedVersion {
        source: "v2".into(),
        table: None,
        from_epoch: E3,
        row_schema: v2.json.to_string(),
        named_fingerprint: None,
        primary_key: None,
    }];
    std::sync::Arc::new(
        Evolution::new(
            vec![v1],
            vec![None],
            ES,
            Box::new(move || Ok(announced.clone())),
            Box::new(|| 1),
        )
        .unwrap(),
    )
}

/// A job moved onto a later snapshot (a resync) after its table took version 1 reads a list of
/// versions that starts at that version: the table's version is found by its fingerprint, the
/// next version applied and recorded as number 2 — not refused as a store of another log.
#[test]
fn sqlite_schema_versions_go_on_after_a_move_to_a_later_snapshot() {
    let path = fresh_sqlite("schema-after-resync");
    let job = "resynced";
    let open = |ev| {
        SqliteStore::open(&path, "accounts", table())
            .unwrap()
            .with_evolution(ev, 0)
    };
    let mut a = open(evolution());
    a.ensure_job(job, &info()).unwrap();
    let la = a.claim(job, Generation(0), "a", &[0], &info()).unwrap()[0].lease;
    a.commit(job, &log_checkpoint(0, la, E2, 20, vec![]))
        .unwrap();
    let c = rusqlite::Connection::open(&path).unwrap();
    let history = |c: &rusqlite::Connection| -> Vec<(i64, String)> {
        c.prepare("SELECT version, fingerprint FROM kb_schema_history ORDER BY version")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    assert_eq!(history(&c).len(), 1);
    let mut b = open(evolution_after_a_resync());
    b.commit(job, &log_checkpoint(0, la, E3, 30, vec![]))
        .unwrap();
    let recorded = history(&c);
    let v2 = evolution().current().of(0)[2].clone();
    assert_eq!(
        recorded.iter().map(|h| h.0).collect::<Vec<_>>(),
        vec![1, 2],
        "{recorded:?}"
    );
    assert_eq!(
        recorded[1].1,
        kafka_backfill::codec::versions::hex(&v2.fingerprint)
    );
    let columns = sqlite_columns(&c, "accounts");
    assert!(
        columns.contains(&"tier".to_string()) && !columns.contains(&"payload".to_string()),
        "{columns:?}"
    );
}

/// What the schema-change scenario's steps share: two workers' stores and leases, the three
/// versions of the table, the bulk rows, and how the backend's columns and history are read.
struct SchemaChange<'a> {
    job: &'a str,
    a: Box<dyn StateStore>,
    b: Box<dyn StateStore>,
    la: Lease,
    lb: Lease,
    /// The table at versions 0, 1 (columns added) and 2 (`payload` dropped).
    v: [TableSchema; 3],
    bulk: Vec<(Vec<u8>, Vec<u8>, Vnode)>,
    columns: &'a dyn Fn() -> Vec<String>,
    history: &'a dyn Fn() -> i64,
}

/// Schema changes (docs/WIRE.md "Schema changes"): the first checkpoint at or after a version's
/// epoch alters the table in its own transaction — columns added, rows resolved, the version
/// recorded — a worker's later commit of an older epoch has its rows resolved forward, and a
/// checkpoint that fails after its ALTER leaves the table and history as they were.
fn schema_change(
    open: &dyn Fn() -> Box<dyn StateStore>,
    job: &str,
    columns: &dyn Fn() -> Vec<String>,
    history: &dyn Fn() -> i64,
) {
    let mut s = SchemaChange::start(open, job, columns, history);
    let (k2, d2) = s.a_version_alters_the_table_with_its_first_checkpoint();
    s.a_refused_checkpoint_takes_its_alter_with_it(&k2, &d2);
    s.copy_takes_the_new_shape_in_the_same_session();
}

impl<'a> SchemaChange<'a> {
    /// Both workers claimed; A commits version 0's rows at E1, enough of them for PostgreSQL's
    /// COPY path (its session staging table has the row's shape).
    fn start(
        open: &dyn Fn() -> Box<dyn StateStore>,
        job: &'a str,
        columns: &'a dyn Fn() -> Vec<String>,
        history: &'a dyn Fn() -> i64,
    ) -> Self {
        let vs = evolution().current();
        let v = [0, 1, 2].map(|i| vs.of(0)[i].table.clone());
        let (mut a, mut b) = (open(), open());
        let info = info();
        a.ensure_job(job, &info).unwrap();
        let la = a.claim(job, Generation(0), "a", &[0], &info).unwrap()[0].lease;
        let lb = b.claim(job, Generation(0), "b", &[1], &info).unwrap()[0].lease;
        let bulk = bulk_rows(1_100);
        let mut first = vec![upsert(0, 0).2];
        first.extend(bulk.iter().map(|(k, d, v)| RowMutation::Upsert {
            vnode: *v,
            row: Row {
                key: k.clone(),
                value: d.clone(),
            },
            offset: Some(1),
        }));
        a.commit(job, &log_checkpoint(0, la, E1, 10, first))
            .unwrap();
        assert_eq!(history(), 0);
        SchemaChange {
            job,
            a,
            b,
            la,
            lb,
            v,
            bulk,
            columns,
            history,
        }
    }

    /// E2 is version 1: a row written with it, and the table altered in the same commit; B, still
    /// at E1 (version 0), has its row resolved to the table's version 1. Returns E2's row.
    fn a_version_alters_the_table_with_its_first_checkpoint(&mut self) -> (Vec<u8>, Vec<u8>) {
        let [v0, v1, _] = &self.v;
        let job = self.job;
        let (k2, d2, u2) = version_1_row(v0, v1);
        self.a
            .commit(job, &log_checkpoint(0, self.la, E2, 20, vec![u2]))
            .unwrap();
        assert_eq!((self.history)(), 1);
        let cols = (self.columns)();
        assert!(cols.contains(&"tier".to_string()) && cols.contains(&"note".to_string()));
        let (k1, d1, u1) = upsert(1, 0);
        self.b
            .commit(job, &log_checkpoint(1, self.lb, E1, 11, vec![u1]))
            .unwrap();
        let (k0, d0, _) = upsert(0, 0);
        let mut want = BTreeMap::from([
            (k0, resolve(&d0, v0, v1).unwrap()),
            (k1, resolve(&d1, v0, v1).unwrap()),
            (k2.clone(), d2.clone()),
        ]);
        for (k, d, _) in &self.bulk {
            want.insert(k.clone(), resolve(d, v0, v1).unwrap());
        }
        assert_eq!(self.a.rows(job).unwrap(), want);
        (k2, d2)
    }

    /// E3 (version 2 drops payload) with a row that does not decode: refused, and the ALTER with
    /// it; then E3 alone applies version 2 and resolves E2's row to it.
    fn a_refused_checkpoint_takes_its_alter_with_it(&mut self, k2: &[u8], d2: &[u8]) {
        let job = self.job;
        let bad = RowMutation::Upsert {
            vnode: row_in(0, 1).2,
            row: Row {
                key: k2.to_vec(),
                value: vec![0xff],
            },
            offset: Some(3),
        };
        assert!(self
            .a
            .commit(job, &log_checkpoint(0, self.la, E3, 30, vec![bad]))
            .is_err());
        assert_eq!((self.history)(), 1);
        assert!((self.columns)().contains(&"payload".to_string()));
        self.a
            .commit(job, &log_checkpoint(0, self.la, E3, 30, vec![]))
            .unwrap();
        assert_eq!((self.history)(), 2);
        assert!(!(self.columns)().contains(&"payload".to_string()));
        let [_, v1, v2] = &self.v;
        assert_eq!(self.a.rows(job).unwrap()[k2], resolve(d2, v1, v2).unwrap());
    }

    /// The bulk rows again, written with version 2 in one checkpoint: COPY with the new shape in
    /// the session that copied the old one (its staging table was the old shape's: refused before).
    fn copy_takes_the_new_shape_in_the_same_session(&mut self) {
        let [v0, _, v2] = &self.v;
        let again: Vec<RowMutation> = self
            .bulk
            .iter()
            .map(|(k, d, v)| RowMutation::Upsert {
                vnode: *v,
                row: Row {
                    key: k.clone(),
                    value: resolve(d, v0, v2).unwrap(),
                },
                offset: Some(4),
            })
            .collect();
        self.a
            .commit(self.job, &log_checkpoint(0, self.la, E4, 40, again))
            .unwrap();
        let rows = self.a.rows(self.job).unwrap();
        for (k, d, _) in &self.bulk {
            assert_eq!(rows[k], resolve(d, v0, v2).unwrap());
        }
    }
}

/// Schema changes under publication (`consistency = "epoch"`): the table readers see changes
/// with the epoch a version starts at, together with that epoch's rows — not at the checkpoint
/// of one partition that reached it first — and a generation building beside the visible replica
/// takes the recorded version's columns, its snapshot rows resolved to them, the versions after
/// it applied to it, and replaces the visible table whole.
fn schema_change_under_publication(
    open: &dyn Fn() -> Box<dyn StateStore>,
    job: &str,
    columns: &dyn Fn() -> Vec<String>,
    history: &dyn Fn() -> i64,
) {
    let vs = evolution().current();
    let [v0, v1, v2] = [0, 1, 2].map(|i| vs.of(0)[i].table.clone());
    let (mut a, mut b, la, lb, [(k0, d0), (k1, d1)]) = both_at_e1(open, job);
    assert_eq!(a.published_epoch(job).unwrap(), Some(E1));
    // A reaches E2, version 1's first epoch, with a row of it: held, and the table unchanged.
    let (k2, d2, u2) = version_1_row(&v0, &v1);
    a.commit(job, &log_checkpoint(0, la, E2, 20, vec![u2]))
        .unwrap();
    assert_eq!(history(), 0, "altered before E2 is published");
    assert!(!columns().contains(&"tier".to_string()), "{:?}", columns());
    assert_eq!(
        a.rows(job).unwrap(),
        BTreeMap::from([(k0.clone(), d0.clone()), (k1.clone(), d1.clone())])
    );
    // B reaches E2: published, the table altered in the same transaction, every row of version 1.
    b.commit(job, &log_checkpoint(1, lb, E2, 21, vec![]))
        .unwrap();
    assert_eq!(a.published_epoch(job).unwrap(), Some(E2));
    assert_eq!(history(), 1);
    let cols = columns();
    assert!(cols.contains(&"tier".to_string()) && cols.contains(&"note".to_string()));
    assert_eq!(
        a.rows(job).unwrap(),
        BTreeMap::from([
            (k0, resolve(&d0, &v0, &v1).unwrap()),
            (k1, resolve(&d1, &v0, &v1).unwrap()),
            (k2, d2),
        ])
    );
    // A recreation: the next table builds at version 1; its snapshot row (of the manifest's
    // version) is resolved to it; version 2 (from E3) applies to it, and at E3 it replaces the
    // visible table, which kept version 1's rows meanwhile.
    let visible = a.rows(job).unwrap();
    let (la, lb, (k3, d3)) = recreated_with_a_snapshot_row(&mut a, &mut b, job);
    a.commit(job, &gen1(0, la, E3, 30)).unwrap();
    assert_eq!(a.rows(job).unwrap(), visible, "held until B reaches E3");
    b.commit(job, &gen1(1, lb, E3, 31)).unwrap();
    assert_eq!(a.published_epoch(job).unwrap(), Some(E3));
    assert_eq!(history(), 2);
    let cols = columns();
    assert!(
        cols.contains(&"tier".to_string()) && !cols.contains(&"payload".to_string()),
        "{cols:?}"
    );
    assert_eq!(
        a.rows(job).unwrap(),
        BTreeMap::from([(k3, resolve(&d3, &v0, &v2).unwrap())])
    );
}

/// Partition 0's second row written with version 1 (`v1`, from `v0`) at offset 2: its key, datum
/// and upsert.
fn version_1_row(v0: &TableSchema, v1: &TableSchema) -> (Vec<u8>, Vec<u8>, RowMutation) {
    let (k2, d2_v0, _) = upsert(0, 1);
    let d2 = resolve(&d2_v0, v0, v1).unwrap();
    let u2 = RowMutation::Upsert {
        vnode: row_in(0, 1).2,
        row: Row {
            key: k2.clone(),
            value: d2.clone(),
        },
        offset: Some(2),
    };
    (k2, d2, u2)
}

/// `n` rows of the example table in partition 0 with ids from 1,000,000: (key, datum, vnode).
fn bulk_rows(n: usize) -> Vec<(Vec<u8>, Vec<u8>, Vnode)> {
    rows_in(0, 1_000_000, 1).take(n).collect()
}

/// `scenario` against a SQLite store of `options`.
fn sqlite_schema_scenario(
    scenario: SchemaScenario,
    options: kafka_backfill::store::sqlite::SqliteOptions,
    name: &str,
) {
    let path = fresh_sqlite(name);
    let ev = evolution();
    let q = |sql: &str| -> Vec<String> {
        let c = rusqlite::Connection::open(&path).unwrap();
        let mut s = c.prepare(sql).unwrap();
        s.query_map([], |r| r.get::<_, rusqlite::types::Value>(0))
            .unwrap()
            .map(|v| match v.unwrap() {
                rusqlite::types::Value::Text(t) => t,
                rusqlite::types::Value::Integer(i) => i.to_string(),
                other => format!("{other:?}"),
            })
            .collect()
    };
    scenario(
        &|| {
            Box::new(
                SqliteStore::open_with(&path, "accounts", table(), options)
                    .unwrap()
                    .with_evolution(ev.clone(), 0),
            )
        },
        name,
        &|| q("SELECT name FROM pragma_table_info('accounts')"),
        &|| {
            q("SELECT count(*) FROM kb_schema_history")[0]
                .parse()
                .unwrap()
        },
    );
}

#[test]
fn sqlite_schema_change() {
    sqlite_schema_scenario(schema_change, Default::default(), "conformance-schema");
}

#[test]
fn sqlite_schema_change_under_publication() {
    let options = kafka_backfill::store::sqlite::SqliteOptions {
        publication: true,
        ..Default::default()
    };
    sqlite_schema_scenario(
        schema_change_under_publication,
        options,
        "conformance-schema-publication",
    );
}

/// A schema version under a layout that cannot take one yet (`store_datum = false`: no datum to
/// resolve) is refused at the checkpoint of its epoch with an error naming the setting to change,
/// and leaves the table as it was.
#[test]
fn sqlite_schema_change_is_refused_without_datum() {
    let options = kafka_backfill::store::sqlite::SqliteOptions {
        store_datum: false,
        ..Default::default()
    };
    let says = "schema changes are applied with store_datum = true";
    {
        let path = fresh_sqlite("schema-refused");
        let job = "refused";
        let mut a = SqliteStore::open_with(&path, "accounts", table(), options)
            .unwrap()
            .with_evolution(evolution(), 0);
        a.ensure_job(job, &info()).unwrap();
        let la = a.claim(job, Generation(0), "a", &[0], &info()).unwrap()[0].lease;
        let (_, _, u0) = upsert(0, 0);
        a.commit(job, &log_checkpoint(0, la, E1, 10, vec![u0]))
            .unwrap();
        let e = a
            .commit(job, &log_checkpoint(0, la, E2, 20, vec![]))
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{e}");
        let c = rusqlite::Connection::open(&path).unwrap();
        let columns = sqlite_columns(&c, "accounts");
        assert!(!columns.contains(&"tier".to_string()), "{columns:?}");
        let history: i64 = c
            .query_row("SELECT count(*) FROM kb_schema_history", [], |r| r.get(0))
            .unwrap();
        assert_eq!(history, 0);
    }
}

/// A schema-change scenario: the store opened (with the example evolution), the job, how the
/// backend's columns and recorded versions are read.
type SchemaScenario =
    fn(&dyn Fn() -> Box<dyn StateStore>, &str, &dyn Fn() -> Vec<String>, &dyn Fn() -> i64);

/// `scenario` against the PostgreSQL store (`publication`: `consistency = "epoch"`).
fn postgres_schema_scenario(scenario: SchemaScenario, publication: bool) {
    let url = support::pg_url();
    let stamp = support::stamp();
    let tname = format!("schema_{}{stamp}", if publication { "pub_" } else { "" });
    let job = format!("schema-{stamp}");
    let ev = evolution();
    let client = std::cell::RefCell::new(postgres::Client::connect(&url, postgres::NoTls).unwrap());
    scenario(
        &|| {
            Box::new(
                PostgresStore::open_with(&url, &tname, table(), publication)
                    .unwrap()
                    .with_evolution(ev.clone(), 0),
            )
        },
        &job,
        &|| {
            client
                .borrow_mut()
                .query(
                    "SELECT column_name::text FROM information_schema.columns WHERE table_name = $1",
                    &[&tname],
                )
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect()
        },
        &|| {
            client
                .borrow_mut()
                .query_one(
                    "SELECT count(*) FROM kb_schema_history WHERE job = $1",
                    &[&job],
                )
                .unwrap()
                .get(0)
        },
    );
}

#[test]
fn postgres_schema_change() {
    postgres_schema_scenario(schema_change, false);
}

#[test]
fn postgres_schema_change_under_publication() {
    postgres_schema_scenario(schema_change_under_publication, true);
}
