//! Section `staging` of the benchmark (benches/backfill.rs) (`scripts/bench.sh --only staging`): the
//! pure core's staging (`kafka_backfill::core::staging::Staging`) on the log section's shape, in this
//! process and with no broker — the worker's share that an A/B of the replay cannot resolve on a
//! noisy host (docs/BENCHMARKS.md "CPU per record").
//!
//! The shape is `log_workload`'s: keys uniform over 100,000 ids (Avro `long` encodings, the vnode
//! from the key as the contract routes it), a 100-byte datum, 7 changes in 10 updates, epochs of
//! 2,000 changes and a commit every 5 epochs (`take_through`). Each change's key and datum are
//! allocated as decoding a record allocates them. The baseline in the same run is those rows
//! alone: the same allocations, moved into a vector and dropped at each commit, with no staging.

use std::time::Instant;

use kafka_backfill::core::staging::Staging;
use kafka_backfill::core::{vnode_of, Change, Epoch, Op, Row};
use serde_json::json;

use super::{median, Report};

const KEYS: u64 = 100_000;
const EPOCH_CHANGES: usize = 2_000;
const COMMIT_EVERY: usize = 5 * EPOCH_CHANGES;
const VNODES: u32 = 256;

/// The changes' keys (zigzag varint of the id, as Avro writes a `long`) and ops.
fn changes(n: usize) -> Vec<(Vec<u8>, Op)> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let id = (x % KEYS) as i64;
            let mut z = ((id << 1) ^ (id >> 63)) as u64;
            let mut key = Vec::with_capacity(3);
            while z >= 0x80 {
                key.push((z as u8 & 0x7f) | 0x80);
                z >>= 7;
            }
            key.push(z as u8);
            let op = if i % 10 < 7 {
                Op::UpdateInsert
            } else {
                Op::Insert
            };
            (key, op)
        })
        .collect()
}

/// Nanoseconds per change of one pass: staged and taken, or (`stage = false`) the rows alone.
fn pass(changes: &[(Vec<u8>, Op)], datum: &[u8], stage: bool) -> (f64, usize) {
    let started = Instant::now();
    let mut staging = Staging::default();
    let mut alone: Vec<Row> = Vec::with_capacity(COMMIT_EVERY);
    let mut taken = 0;
    for (i, (key, op)) in changes.iter().enumerate() {
        let row = Row {
            key: key.clone(),
            value: datum.to_vec(),
        };
        let epoch = Epoch((i / EPOCH_CHANGES) as u64 + 1);
        if stage {
            let change = Change {
                epoch,
                op: *op,
                vnode: vnode_of(key, VNODES),
                table: 0,
                row,
            };
            staging.stage(change, i as u64);
        } else {
            alone.push(row);
        }
        if (i + 1) % COMMIT_EVERY == 0 {
            taken += if stage {
                staging.take_through(epoch).rows.len()
            } else {
                std::mem::take(&mut alone).len()
            };
        }
    }
    (
        started.elapsed().as_secs_f64() * 1e9 / changes.len() as f64,
        taken,
    )
}

pub fn run(changes_n: usize, reps: usize, r: &mut Report) {
    eprintln!("staging: {changes_n} changes, stage + take_through, in process…");
    let changes = changes(changes_n);
    let datum = vec![0x2a_u8; 100];
    let (mut staged, mut alone) = (Vec::new(), Vec::new());
    let mut net = 0;
    // Interleaved, so that a slow moment of the host falls on both.
    for _ in 0..reps.max(1) {
        let (ns, n) = pass(&changes, &datum, true);
        staged.push(ns);
        net = n;
        alone.push(pass(&changes, &datum, false).0);
    }
    let (s, b) = (median(staged.clone()), median(alone.clone()));
    r.figure(
        "staging_rows_alone_ns_per_change",
        &format!("the baseline: each change's key and 100-byte datum allocated, kept until its commit and dropped, no staging ({changes_n} changes), median of {alone:?}"),
        format!("{b:.0} ns per change"),
        json!({"ns_per_change": b, "runs": alone}),
    );
    r.figure(
        "staging_ns_per_change",
        &format!("Staging::stage of each change and take_through every {COMMIT_EVERY} (net {net} rows in (vnode, key) order), the same rows, {KEYS} keys, median of {staged:?}"),
        format!("{s:.0} ns per change ({:.2}× the rows alone)", s / b),
        json!({"ns_per_change": s, "over_rows_alone": s / b, "runs": staged}),
    );
}
