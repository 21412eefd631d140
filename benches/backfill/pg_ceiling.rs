//! Section `pg-ceiling` of the benchmark (benches/backfill.rs) (`scripts/bench.sh --only
//! pg-key,pg-ceiling`): what the durable PostgreSQL itself does with the store's two statement shapes,
//! from a tiny client and no kafka-backfill — the denominator of the PostgreSQL figures, and the
//! measurement that decides whether a checkpoint applied over several connections (two-phase commit)
//! is worth building on this machine.
//!
//! - **snapshot**: rows in `(_kb_vnode, _kb_key)` order, `COPY … FROM STDIN (FORMAT binary)` straight
//!   into the table, a transaction every 10,000 rows;
//! - **upserts**: checkpoints of 10,000 changes with keys uniform over twice the snapshot's keys (half
//!   updates, half inserts, as the log store's workload), each `COPY` into a session staging table, one
//!   `INSERT … SELECT … ON CONFLICT (_kb_vnode, _kb_key) DO UPDATE` and a commit
//!   (`src/store/postgres.rs`, `copy_upserts`).
//!
//! Each from one session, and from two in parallel with the rows split by vnode, the two sessions
//! in lockstep at every checkpoint (a `std::sync::Barrier` before each commit) but without
//! `PREPARE TRANSACTION`: an upper bound on what two connections with one atomic outcome could gain.
//! The tables are made as the store makes them (`PRIMARY KEY (_kb_vnode, _kb_key)`, the accounts
//! columns, `_kb_row`).

use std::sync::{Arc, Barrier};
use std::time::Instant;

use postgres::binary_copy::BinaryCopyInWriter;
use postgres::types::{ToSql, Type};
use serde_json::{json, Value};

use super::{fmt_rate, median, rand_suffix, Report};

const CHECKPOINT_ROWS: usize = 10_000;
const VNODES: u32 = 256;

/// One row as the store writes it: key, vnode, datum, then id, owner, balance, version, payload.
struct Row {
    key: Vec<u8>,
    vnode: i32,
    datum: Vec<u8>,
    id: i64,
    owner: String,
    balance: i64,
    version: i64,
    payload: String,
}

fn row(id: i64, version: i64) -> Row {
    let key = id.to_be_bytes().to_vec();
    let vnode = (crc32fast::hash(&key) % VNODES) as i32;
    let payload: String = std::iter::repeat_n(char::from(b'a' + (id % 26) as u8), 100).collect();
    // About the size of the workload's datum (≈ 130 bytes).
    let mut datum = Vec::with_capacity(130);
    datum.extend_from_slice(&key);
    datum.extend_from_slice(&version.to_le_bytes());
    datum.extend_from_slice(payload.as_bytes());
    datum.resize(130, 0);
    Row {
        key,
        vnode,
        datum,
        id,
        owner: format!("owner-{id}"),
        balance: id.wrapping_mul(7919) % 1_000_000,
        version,
        payload,
    }
}

const COLUMNS: &str = "_kb_key, _kb_vnode, _kb_row, id, owner, balance, version, payload";
const TYPES: [Type; 8] = [
    Type::BYTEA,
    Type::INT4,
    Type::BYTEA,
    Type::INT8,
    Type::TEXT,
    Type::INT8,
    Type::INT8,
    Type::TEXT,
];

fn copy_rows(tx: &mut postgres::Transaction<'_>, into: &str, rows: &[&Row]) {
    let sink = tx
        .copy_in(&format!(
            "COPY \"{into}\" ({COLUMNS}) FROM STDIN (FORMAT binary)"
        ))
        .unwrap();
    let mut w = BinaryCopyInWriter::new(sink, &TYPES);
    for r in rows {
        let values: [&(dyn ToSql + Sync); 8] = [
            &r.key, &r.vnode, &r.datum, &r.id, &r.owner, &r.balance, &r.version, &r.payload,
        ];
        w.write(&values).unwrap();
    }
    w.finish().unwrap();
}

fn create(pg: &str, table: &str) {
    let mut c = postgres::Client::connect(pg, postgres::NoTls).unwrap();
    c.batch_execute(&format!(
        "DROP TABLE IF EXISTS \"{table}\"; CREATE TABLE \"{table}\" (_kb_key BYTEA NOT NULL, _kb_vnode INT NOT NULL, _kb_row BYTEA NOT NULL, id BIGINT NOT NULL, owner TEXT NOT NULL, balance BIGINT NOT NULL, version BIGINT NOT NULL, payload TEXT NOT NULL, PRIMARY KEY (_kb_vnode, _kb_key))"
    ))
    .unwrap();
}

/// Runs `work(session, client)` in `sessions` threads, each with its own connection; wall seconds.
fn in_sessions(
    pg: &str,
    sessions: usize,
    work: impl Fn(usize, &mut postgres::Client) + Sync,
) -> f64 {
    let clients: Vec<postgres::Client> = (0..sessions)
        .map(|_| postgres::Client::connect(pg, postgres::NoTls).unwrap())
        .collect();
    let t = Instant::now();
    std::thread::scope(|s| {
        for (i, mut c) in clients.into_iter().enumerate() {
            let work = &work;
            s.spawn(move || work(i, &mut c));
        }
    });
    t.elapsed().as_secs_f64()
}

/// The snapshot shape into `table`: seconds.
fn snapshot(pg: &str, table: &str, rows: &[Row], sessions: usize) -> f64 {
    in_sessions(pg, sessions, |i, c| {
        let mine: Vec<&Row> = rows
            .iter()
            .filter(|r| r.vnode as usize * sessions / VNODES as usize == i)
            .collect();
        for chunk in mine.chunks(CHECKPOINT_ROWS) {
            let mut tx = c.transaction().unwrap();
            copy_rows(&mut tx, table, chunk);
            tx.commit().unwrap();
        }
    })
}

/// The upsert shape into `table`, checkpoint by checkpoint, the sessions in lockstep: seconds.
fn upserts(pg: &str, table: &str, checkpoints: &[Vec<Row>], sessions: usize) -> f64 {
    let lockstep = Arc::new(Barrier::new(sessions));
    in_sessions(pg, sessions, |i, c| {
        let stage = format!("kb_stage_ceiling_{i}");
        c.batch_execute(&format!(
            "CREATE TEMP TABLE \"{stage}\" (_kb_key BYTEA, _kb_vnode INT4, _kb_row BYTEA, id INT8, owner TEXT, balance INT8, version INT8, payload TEXT) ON COMMIT DELETE ROWS"
        ))
        .unwrap();
        for cp in checkpoints {
            let mine: Vec<&Row> = cp
                .iter()
                .filter(|r| r.vnode as usize * sessions / VNODES as usize == i)
                .collect();
            let mut tx = c.transaction().unwrap();
            copy_rows(&mut tx, &stage, &mine);
            tx.execute(
                &format!(
                    "INSERT INTO \"{table}\" ({COLUMNS}) SELECT {COLUMNS} FROM \"{stage}\" ON CONFLICT (_kb_vnode, _kb_key) DO UPDATE SET _kb_row = EXCLUDED._kb_row, id = EXCLUDED.id, owner = EXCLUDED.owner, balance = EXCLUDED.balance, version = EXCLUDED.version, payload = EXCLUDED.payload"
                ),
                &[],
            )
            .unwrap();
            tx.batch_execute(&format!("TRUNCATE \"{stage}\"")).unwrap();
            lockstep.wait();
            tx.commit().unwrap();
        }
    })
}

pub fn run(pg: &str, pg_label: &str, rows: u64, changes: u64, reps: usize, r: &mut Report) {
    eprintln!("pg-ceiling: {rows}-row snapshot, {changes} upserts, one session and two…");
    let mut snapshot_rows: Vec<Row> = (0..rows as i64).map(|id| row(id, 1)).collect();
    snapshot_rows.sort_by(|a, b| (a.vnode, &a.key).cmp(&(b.vnode, &b.key)));
    // Keys uniform over twice the snapshot's, by a fixed multiplicative sequence (no RNG needed);
    // a checkpoint's changes to one key coalesce to the last, as the executor's staging does.
    let space = (rows * 2).max(1);
    let mut checkpoints = Vec::new();
    let mut n = 0u64;
    while n < changes {
        let take = (changes - n).min(CHECKPOINT_ROWS as u64);
        let mut cp = std::collections::BTreeMap::new();
        for j in n..n + take {
            let id = (j.wrapping_mul(2_654_435_761) % space) as i64;
            cp.insert(id, row(id, 2 + j as i64));
        }
        checkpoints.push(cp.into_values().collect::<Vec<_>>());
        n += take;
    }
    let upserted: usize = checkpoints.iter().map(Vec::len).sum();
    let mut snap: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut ups: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    // Alternating, so that both meet the same server state.
    for _ in 0..reps {
        for sessions in [1usize, 2] {
            let table = format!("bench_ceiling_{sessions}_{}", rand_suffix());
            create(pg, &table);
            snap[sessions - 1].push(rows as f64 / snapshot(pg, &table, &snapshot_rows, sessions));
            ups[sessions - 1].push(upserted as f64 / upserts(pg, &table, &checkpoints, sessions));
            let mut c = postgres::Client::connect(pg, postgres::NoTls).unwrap();
            c.batch_execute(&format!("DROP TABLE \"{table}\"")).unwrap();
        }
    }
    let rounded = |v: &Vec<f64>| v.iter().map(|x| x.round()).collect::<Vec<_>>();
    let mut med = |what: &str, id: &str, runs: &[Vec<f64>; 2], unit: &str| -> (f64, f64) {
        let (one, two) = (median(runs[0].clone()), median(runs[1].clone()));
        r.figure(
            &format!("pg_ceiling_{id}_1"),
            &format!(
                "{what} into {pg_label} from a tiny client, one session, median of {:?}",
                rounded(&runs[0])
            ),
            format!("{} {unit}/s", fmt_rate(one)),
            json!(one),
        );
        r.figure(
            &format!("pg_ceiling_{id}_2"),
            &format!("the same from two sessions in parallel, rows split by vnode, in lockstep at every checkpoint, no PREPARE (an upper bound for two connections with one atomic outcome), median of {:?}", rounded(&runs[1])),
            format!("{} {unit}/s ({:.2}× one session)", fmt_rate(two), two / one),
            json!({"per_s": two, "over_one_session": two / one}),
        );
        (one, two)
    };
    let (snap_one, _) = med(
        &format!("snapshot shape: {rows} rows in (_kb_vnode, _kb_key) order, COPY straight into the table, a commit every {CHECKPOINT_ROWS}"),
        "snapshot",
        &snap,
        "rows",
    );
    let (ups_one, _) = med(
        &format!("log-store shape: {changes} changes over {space} keys, {upserted} upserts after coalescing, checkpoints of {CHECKPOINT_ROWS} changes each COPY into a staging table + INSERT … ON CONFLICT DO UPDATE + commit"),
        "upserts",
        &ups,
        "upserts",
    );
    // kafka-backfill's own figures for the same shapes, when the pg-key section ran in this run.
    let ours = |r: &Report, id: &str| match r.json.get(id) {
        Some(Value::Number(n)) => n.as_f64(),
        Some(Value::Object(o)) => o.get("records_per_s").and_then(Value::as_f64),
        _ => None,
    };
    if let Some(s) = ours(r, "l_pg_key_snapshot_vnode_key") {
        r.figure(
            "ratio_pg_snapshot_over_ceiling",
            "kafka-backfill's snapshot phase into the same server (section pg-key, this run) / the one-session ceiling of the snapshot shape",
            format!("{:.2}", s / snap_one),
            json!(s / snap_one),
        );
    }
    if let Some(l) = ours(r, "l_pg_key_log_vnode_key") {
        r.figure(
            "ratio_pg_log_over_ceiling",
            "kafka-backfill's log-store phase into the same server (section pg-key, this run; records/s, ≈ changes/s for this log) / the one-session ceiling of the upsert shape (upserts/s)",
            format!("{:.2}", l / ups_one),
            json!(l / ups_one),
        );
    }
}
