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
    counts: HashMap<Vnode, u64>,
}

/// Staged changes of the log-store and streaming phases.
#[derive(Default, Debug)]
pub struct Staging {
    epochs: BTreeMap<Epoch, EpochBucket>,
    changes: u64,
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
        let bucket = self.epochs.entry(change.epoch).or_default();
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
        let mut merged: FxMap<Vec<u8>, RowMutation> = FxMap::default();
        let mut counts: HashMap<Vnode, u64> = HashMap::new();
        for (_, bucket) in taken {
            for (v, c) in bucket.counts {
                *counts.entry(v).or_default() += c;
                self.changes -= c;
            }
            merged.extend(bucket.rows);
        }
        let mut rows: Vec<RowMutation> = merged.into_values().collect();
        // The stores cluster rows by (vnode, key), RisingWave's state-table layout: in that order a
        // commit walks each B-tree once, left to right.
        rows.sort_unstable_by(|a, b| (a.vnode(), a.key()).cmp(&(b.vnode(), b.key())));
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
