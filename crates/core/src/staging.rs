//! Uncommitted log-store changes, bucketed by epoch and coalesced to their net effect per key.
//!
//! Data of an epoch may only be committed once every owned partition has passed the barrier ending it,
//! so staging keeps epochs apart; within one commit the buckets merge, later epochs winning.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// FxHash (rustc's hasher): keys are primary-key bytes chosen by the upstream, not by an attacker
/// of this process, and SipHash was a visible share of the replay profile.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_le_bytes(c.try_into().expect("8 bytes"));
            self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(K);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

use super::barrier::{Change, Op, Row};
use super::epoch::Epoch;
use super::progress::RowMutation;
use super::vnode::Vnode;

#[derive(Default, Debug)]
struct EpochBucket {
    rows: FxMap<Vec<u8>, RowMutation>,
    /// Changes applied per vnode (before coalescing): the `row_count` of vnode progress.
    counts: FxMap<Vnode, u64>,
}

/// Staged changes of the log-store and streaming phases.
#[derive(Default, Debug)]
pub struct Staging {
    epochs: BTreeMap<Epoch, EpochBucket>,
    changes: u64,
    /// Keys of the largest epoch bucket seen: a new bucket starts at that capacity, so a bucket
    /// does not rehash its way up from empty in every epoch (a visible share of the worker's
    /// profile, docs/BENCHMARKS.md "CPU per record").
    bucket_hint: usize,
}

/// What a commit takes out of staging.
#[derive(Debug, Default)]
pub struct Taken {
    /// Net mutations, ordered by (vnode, key).
    pub rows: Vec<RowMutation>,
    pub counts: HashMap<Vnode, u64>,
}

impl Staging {
    /// Records one change. `UpdateDelete` stages a delete that its `UpdateInsert` then overwrites.
    pub fn stage(&mut self, change: Change, offset: u64) {
        let hint = self.bucket_hint;
        let bucket = self
            .epochs
            .entry(change.epoch)
            .or_insert_with(|| EpochBucket {
                rows: FxMap::with_capacity_and_hasher(hint, Default::default()),
                counts: FxMap::default(),
            });
        *bucket.counts.entry(change.vnode).or_default() += 1;
        self.changes += 1;
        let vnode = change.vnode;
        let mutation = match change.op {
            Op::Insert | Op::UpdateInsert => RowMutation::Upsert {
                vnode,
                row: change.row,
                offset: Some(offset),
            },
            Op::Delete | Op::UpdateDelete => RowMutation::Delete {
                vnode,
                key: change.row.key,
            },
        };
        bucket.rows.insert(mutation.key().to_vec(), mutation);
        self.bucket_hint = self.bucket_hint.max(bucket.rows.len());
    }

    /// Changes staged and not yet taken (before coalescing).
    pub fn len(&self) -> u64 {
        self.changes
    }

    pub fn is_empty(&self) -> bool {
        self.changes == 0
    }

    /// Takes every epoch `≤ through`, merged to one net mutation per key (later epochs win).
    pub fn take_through(&mut self, through: Epoch) -> Taken {
        let later = self.epochs.split_off(&Epoch(through.0 + 1));
        let taken = std::mem::replace(&mut self.epochs, later);
        let mut counts: HashMap<Vnode, u64> = HashMap::new();
        let mut rows: Vec<RowMutation> =
            Vec::with_capacity(taken.values().map(|b| b.rows.len()).sum());
        // Epochs in order, each bucket already one mutation per key; a stable sort keeps a key's
        // mutations in epoch order, so the last of each run of equal keys is its net effect (a
        // key's vnode is a function of the key, so equal keys sort together).
        for (_, bucket) in taken {
            for (v, c) in bucket.counts {
                *counts.entry(v).or_default() += c;
                self.changes -= c;
            }
            rows.extend(bucket.rows.into_values());
        }
        // The stores cluster rows by (vnode, key), RisingWave's state-table layout: in that order a
        // commit walks each B-tree once, left to right.
        rows.sort_by(|a, b| (a.vnode(), a.key()).cmp(&(b.vnode(), b.key())));
        dedup_keep_last(&mut rows);
        Taken { rows, counts }
    }

    /// Drops staged changes of the vnodes for which `revoked` holds (rollback of a revoked partition).
    pub fn discard(&mut self, revoked: impl Fn(Vnode) -> bool) {
        for bucket in self.epochs.values_mut() {
            bucket.rows.retain(|_, m| !revoked(m.vnode()));
            bucket.counts.retain(|v, c| {
                if revoked(*v) {
                    self.changes -= *c;
                    false
                } else {
                    true
                }
            });
        }
        self.epochs
            .retain(|_, b| !b.rows.is_empty() || !b.counts.is_empty());
    }

    /// Drops everything.
    pub fn clear(&mut self) {
        self.epochs.clear();
        self.changes = 0;
    }
}

/// Keeps the last mutation of each run of equal (vnode, key) in a sorted vector.
fn dedup_keep_last(rows: &mut Vec<RowMutation>) {
    if rows.len() < 2 {
        return;
    }
    let mut write = 0;
    for read in 0..rows.len() {
        let last_of_run = read + 1 == rows.len()
            || (rows[read].vnode(), rows[read].key())
                != (rows[read + 1].vnode(), rows[read + 1].key());
        if last_of_run {
            rows.swap(write, read);
            write += 1;
        }
    }
    rows.truncate(write);
}

/// A snapshot row as a mutation (snapshot rows are inserts).
pub fn snapshot_upsert(vnode: Vnode, row: Row) -> RowMutation {
    RowMutation::Upsert {
        vnode,
        row,
        offset: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(epoch: u64, op: Op, vnode: Vnode, key: &str, value: &str) -> Change {
        Change {
            epoch: Epoch(epoch),
            op,
            vnode,
            table: 0,
            row: Row {
                key: key.as_bytes().to_vec(),
                value: value.as_bytes().to_vec(),
            },
        }
    }

    #[test]
    fn coalesces_to_net_effect_per_key_with_later_epochs_winning() {
        let mut s = Staging::default();
        s.stage(change(1, Op::Insert, 0, "a", "1"), 0);
        s.stage(change(1, Op::UpdateDelete, 0, "a", "1"), 1);
        s.stage(change(1, Op::UpdateInsert, 0, "a", "2"), 2);
        s.stage(change(2, Op::Delete, 1, "b", "x"), 3);
        s.stage(change(2, Op::Insert, 0, "a", "3"), 4);
        s.stage(change(3, Op::Delete, 0, "a", "3"), 5);
        assert_eq!(s.len(), 6);
        let t = s.take_through(Epoch(2));
        assert_eq!(
            t.rows,
            vec![
                RowMutation::Upsert {
                    vnode: 0,
                    row: Row {
                        key: b"a".to_vec(),
                        value: b"3".to_vec()
                    },
                    offset: Some(4),
                },
                RowMutation::Delete {
                    vnode: 1,
                    key: b"b".to_vec()
                },
            ]
        );
        assert_eq!(t.counts[&0], 4);
        assert_eq!(t.counts[&1], 1);
        assert_eq!(s.len(), 1, "epoch 3 stays staged");
        let t = s.take_through(Epoch(3));
        assert_eq!(t.rows.len(), 1);
        assert!(s.is_empty());
    }

    #[test]
    fn many_epochs_merge_like_a_map_applied_in_order() {
        // A small LCG: no dependency for one test.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % n
        };
        for round in 0..200 {
            let mut s = Staging::default();
            let mut model: BTreeMap<(Vnode, Vec<u8>), RowMutation> = BTreeMap::new();
            let epochs = 1 + next(6);
            let mut offset = 0;
            for e in 1..=epochs {
                for _ in 0..next(40) {
                    let k = next(12);
                    let key = format!("k{k}");
                    // A key's vnode is a function of the key (the contract's routing).
                    let vnode = (k % 3) as Vnode;
                    let op = [Op::Insert, Op::Delete, Op::UpdateDelete, Op::UpdateInsert]
                        [next(4) as usize];
                    let c = change(e, op, vnode, &key, &format!("{round}.{offset}"));
                    let m = match op {
                        Op::Insert | Op::UpdateInsert => RowMutation::Upsert {
                            vnode,
                            row: c.row.clone(),
                            offset: Some(offset),
                        },
                        Op::Delete | Op::UpdateDelete => RowMutation::Delete {
                            vnode,
                            key: c.row.key.clone(),
                        },
                    };
                    model.insert((vnode, c.row.key.clone()), m);
                    s.stage(c, offset);
                    offset += 1;
                }
            }
            let t = s.take_through(Epoch(epochs));
            assert_eq!(
                t.rows,
                model.into_values().collect::<Vec<_>>(),
                "round {round}"
            );
            assert!(s.is_empty());
        }
    }

    #[test]
    fn discard_drops_only_revoked_vnodes() {
        let mut s = Staging::default();
        s.stage(change(1, Op::Insert, 0, "a", "1"), 6);
        s.stage(change(1, Op::Insert, 5, "b", "1"), 7);
        s.stage(change(2, Op::Insert, 5, "c", "1"), 8);
        s.discard(|v| v == 5);
        assert_eq!(s.len(), 1);
        let t = s.take_through(Epoch(9));
        assert_eq!(t.rows.len(), 1);
        assert_eq!(t.rows[0].key(), b"a");
    }
}
