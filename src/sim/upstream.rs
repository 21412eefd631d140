//! The simulated upstream: a table that writes changes and barriers into an in-memory log, and
//! remembers the table at the end of every epoch (the oracle's truth).
//!
//! With several tables (`SimConfig::tables` > 1) it is pgbench's shape: each transaction adds one
//! delta to a row of every table, or moves one row's balance onto another row of its table (a
//! delete and an update), so every table's sum of balances is the same in every committed state —
//! the cross-table invariant the oracle checks on the published replica. Its rows are keyed by
//! (table, key) as a job of several tables stores them (`core::table_key`); the log carries the
//! bare key and the table's index, the vnode is the bare key's.

use std::collections::{BTreeMap, BTreeSet};

use crate::core::{
    vnode_of, Barrier, BarrierKind, Change, Epoch, LogRecord, Op, PartitionId, PartitionMap, Row,
};
use crate::ports::LogStore;
use crate::rng::SimRng;
use crate::store::memory::MemoryLog;

pub(super) struct Upstream {
    pub(super) map: PartitionMap,
    pub(super) rng_values: u64,
    pub(super) table: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The table at the end of each completed epoch (and at `Es`).
    pub(super) history: BTreeMap<Epoch, BTreeMap<Vec<u8>, Vec<u8>>>,
    pub(super) log: MemoryLog,
    pub(super) epoch: Epoch,
    pub(super) barriers: u32,
    pub(super) epochs_left: u32,
    pub(super) changes_in_epoch: u32,
    /// Offsets holding a record that does not decode (seeds with `dead_letters`).
    pub(super) poison: BTreeSet<(PartitionId, u64)>,
    /// Tables of the log (1: the one-table log, bare keys).
    pub(super) tables: u16,
}

/// A row key of a several-table upstream's `table`: (table, key).
pub(super) fn row_key(table: u16, k: u32) -> Vec<u8> {
    crate::core::table_key(table, &key_bytes(k))
}

/// The key a row's vnode is computed from: the bare key (a several-table row key without its
/// table prefix).
pub(super) fn routing(key: &[u8], tables: u16) -> &[u8] {
    if tables > 1 {
        crate::core::split_table_key(key).map_or(key, |(_, k)| k)
    } else {
        key
    }
}

/// A balance as a several-table upstream's rows hold it.
fn balance(value: &[u8]) -> i64 {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a balance, not {value:?}"))
}

/// Each table's sum of balances over the rows of a several-table replica (keyed by (table, key)).
pub(super) fn sums(rows: &BTreeMap<Vec<u8>, Vec<u8>>, tables: u16) -> Vec<i64> {
    let mut out = vec![0i64; tables as usize];
    for (k, v) in rows {
        let (t, _) = crate::core::split_table_key(k).expect("a (table, key) key");
        out[t as usize] += balance(v);
    }
    out
}

/// One transaction of a several-table upstream over `table` (applied to it): the changes it makes,
/// as (table, bare key, op, value), in order. With probability 3/10 it moves a row's balance onto
/// another row of one table (a delete, then an update or insert); else it adds one delta to a row
/// of every table. Either way every table's sum moves by the same amount.
pub(super) fn transaction(
    table: &mut BTreeMap<Vec<u8>, Vec<u8>>,
    tables: u16,
    rng: &mut SimRng,
    key_space: u32,
) -> Vec<(u16, Vec<u8>, Op, Vec<u8>)> {
    let mut out = Vec::new();
    let t = rng.below(tables as u64) as u16;
    let (from, to) = (
        rng.below(key_space as u64) as u32,
        rng.below(key_space as u64) as u32,
    );
    if from != to && rng.chance(30) {
        if let Some(moved) = table.remove(&row_key(t, from)) {
            out.push((t, key_bytes(from), Op::Delete, moved.clone()));
            add(table, &mut out, t, to, balance(&moved));
            return out;
        }
    }
    let d = rng.below(100) as i64 - 50;
    for t in 0..tables {
        let k = rng.below(key_space as u64) as u32;
        add(table, &mut out, t, k, d);
    }
    out
}

/// Adds `d` to row `k` of table `t` (inserting it at `d`), pushing the changes that makes.
fn add(
    table: &mut BTreeMap<Vec<u8>, Vec<u8>>,
    out: &mut Vec<(u16, Vec<u8>, Op, Vec<u8>)>,
    t: u16,
    k: u32,
    d: i64,
) {
    let key = row_key(t, k);
    let (op, new) = match table.get(&key) {
        Some(old) => {
            out.push((t, key_bytes(k), Op::UpdateDelete, old.clone()));
            (Op::UpdateInsert, balance(old) + d)
        }
        None => (Op::Insert, d),
    };
    let value = new.to_string().into_bytes();
    out.push((t, key_bytes(k), op, value.clone()));
    table.insert(key, value);
}

pub(super) fn key_bytes(k: u32) -> Vec<u8> {
    k.to_be_bytes().to_vec()
}

impl Upstream {
    pub(super) fn next_value(&mut self) -> Vec<u8> {
        self.rng_values += 1;
        format!("v{}", self.rng_values).into_bytes()
    }

    pub(super) fn write_change(&mut self, rng: &mut SimRng, key_space: u32) {
        if self.tables > 1 {
            let changes = transaction(&mut self.table, self.tables, rng, key_space);
            self.append_changes(changes);
            self.changes_in_epoch += 1;
            return;
        }
        let key = key_bytes(rng.below(key_space as u64) as u32);
        let vnode = vnode_of(&key, self.map.vnode_count());
        let partition = self.map.partition_of(vnode);
        let epoch = self.epoch;
        let emit = |log: &mut MemoryLog, op: Op, value: Vec<u8>| {
            log.append(
                partition,
                LogRecord::Change(Change {
                    epoch,
                    op,
                    vnode,
                    table: 0,
                    row: Row {
                        key: key.clone(),
                        value,
                    },
                }),
            );
        };
        match self.table.get(&key).cloned() {
            Some(old) if rng.chance(40) => {
                emit(&mut self.log, Op::Delete, old);
                self.table.remove(&key);
            }
            Some(old) => {
                let new = self.next_value();
                emit(&mut self.log, Op::UpdateDelete, old);
                emit(&mut self.log, Op::UpdateInsert, new.clone());
                self.table.insert(key.clone(), new);
            }
            None => {
                let new = self.next_value();
                emit(&mut self.log, Op::Insert, new.clone());
                self.table.insert(key.clone(), new);
            }
        }
        self.changes_in_epoch += 1;
    }

    /// Appends a several-table transaction's changes (table, bare key, op, value), each to the
    /// partition of its vnode, in the open epoch.
    fn append_changes(&mut self, changes: Vec<(u16, Vec<u8>, Op, Vec<u8>)>) {
        let epoch = self.epoch;
        for (table, key, op, value) in changes {
            let vnode = vnode_of(&key, self.map.vnode_count());
            self.log.append(
                self.map.partition_of(vnode),
                LogRecord::Change(Change {
                    epoch,
                    op,
                    vnode,
                    table,
                    row: Row { key, value },
                }),
            );
        }
    }

    /// A `TRUNCATE` of one table (docs/WIRE.md "Truncate"): a truncation record in every
    /// partition. A several-table upstream puts the table's sum back as one row in the same
    /// transaction (a truncation alone would break pgbench's invariant upstream too), so every
    /// committed state still has every table's sum equal. Returns how many rows it emptied.
    pub(super) fn write_truncate(&mut self, rng: &mut SimRng) -> usize {
        let epoch = self.epoch;
        let table = rng.below(self.tables as u64) as u16;
        let several = self.tables > 1;
        let sum = several.then(|| sums(&self.table, self.tables)[table as usize]);
        let before = self.table.len();
        self.table.retain(|k, _| {
            several && crate::core::split_table_key(k).map(|(t, _)| t) != Some(table)
        });
        let emptied = before - self.table.len();
        for p in 0..self.map.partition_count() {
            self.log.append(
                p,
                LogRecord::Truncate(crate::core::Truncate { epoch, table }),
            );
        }
        if let Some(sum) = sum {
            let mut out = Vec::new();
            add(&mut self.table, &mut out, table, 0, sum);
            self.append_changes(out);
        }
        self.changes_in_epoch += 1;
        emptied
    }

    /// A record that does not decode, in a random partition: it changes nothing upstream. Its slot
    /// in the log holds an insert of a key the table never has, so a loop that applied it anyway
    /// would fail the oracle.
    pub(super) fn write_poison(&mut self, rng: &mut SimRng) {
        let partition = rng.below(self.map.partition_count() as u64) as PartitionId;
        let vnode = self
            .map
            .vnodes_of(partition)
            .next()
            .expect("a partition has vnodes");
        let offset = self.log.append(
            partition,
            LogRecord::Change(Change {
                epoch: self.epoch,
                op: Op::Insert,
                vnode,
                table: 0,
                row: Row {
                    key: b"poison".to_vec(),
                    value: b"poison".to_vec(),
                },
            }),
        );
        self.poison.insert((partition, offset));
    }

    pub(super) fn end_epoch(&mut self, checkpoint_every: u32) {
        self.barriers += 1;
        let kind = if self.barriers.is_multiple_of(checkpoint_every) || self.epochs_left == 1 {
            BarrierKind::Checkpoint
        } else {
            BarrierKind::Barrier
        };
        self.epochs_left -= 1;
        self.write_barrier(kind);
    }

    pub(super) fn write_barrier(&mut self, kind: BarrierKind) {
        let next = Epoch(self.epoch.0 + (1 << 16) * 1000); // one simulated second per epoch
        let barrier = Barrier {
            prev: self.epoch,
            curr: next,
            kind,
            schema_change: false,
        };
        for p in 0..self.map.partition_count() {
            self.log.append(p, LogRecord::Barrier(barrier));
        }
        self.history.insert(self.epoch, self.table.clone());
        self.epoch = next;
        self.changes_in_epoch = 0;
    }

    pub(super) fn writing(&self) -> bool {
        self.epochs_left > 0
    }
}
