//! Uncommitted log-store changes, bucketed by epoch and coalesced to their net effect per key.
//!
//! Data of an epoch may only be committed once every owned partition has passed the barrier ending it,
//! so staging keeps epochs apart; within one commit the buckets merge, later epochs winning.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hash, Hasher};

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

/// A staged mutation, hashed and compared by its key alone: a bucket finds a key's mutation
/// without a copy of the key (one allocation per staged change fewer; the issue's "staging keyed
/// without per-record allocation", docs/BENCHMARKS.md "CPU per record").
#[derive(Debug)]
struct Keyed(RowMutation);

impl PartialEq for Keyed {
    fn eq(&self, other: &Self) -> bool {
        self.0.key() == other.0.key()
    }
}

impl Eq for Keyed {}

impl Hash for Keyed {
    // As `[u8]` hashes: `Borrow<[u8]>` requires the same hash for the borrowed form.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.key().hash(state)
    }
}

impl Borrow<[u8]> for Keyed {
    fn borrow(&self) -> &[u8] {
        self.0.key()
    }
}

use super::barrier::{Change, Op, Row};
use super::epoch::Epoch;
use super::progress::RowMutation;
use super::vnode::Vnode;

#[derive(Default, Debug)]
struct EpochBucket {
    /// One mutation per key, the last staged.
    rows: HashSet<Keyed, BuildHasherDefault<FxHasher>>,
    /// Changes applied per vnode (before coalescing): the `row_count` of vnode progress.
    counts: FxMap<Vnode, u64>,
    /// Truncations of this epoch, as (vnode, table prefix): a commit deletes the stored rows they
    /// name before it applies its rows. The mutations they supersede are gone from staging.
    truncates: BTreeSet<(Vnode, Vec<u8>)>,
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
                rows: HashSet::with_capacity_and_hasher(hint, Default::default()),
                counts: FxMap::default(),
                truncates: BTreeSet::new(),
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
        bucket.rows.replace(Keyed(mutation));
        self.bucket_hint = self.bucket_hint.max(bucket.rows.len());
    }

    /// Records a truncation at `epoch` of the table whose keys start with `prefix`, in `vnodes` (the
    /// vnodes of the partition it was read in): the epoch's staged mutations of those rows lie
    /// before it (a vnode's changes come from its one partition, in order) and are superseded now;
    /// an earlier epoch's are superseded only in a commit that takes this epoch too
    /// ([`Self::take_through`]), since a commit may stop before it. That commit deletes the stored
    /// rows first.
    pub fn truncate(&mut self, epoch: Epoch, vnodes: std::ops::Range<Vnode>, prefix: &[u8]) {
        let bucket = self.epochs.entry(epoch).or_default();
        bucket
            .rows
            .retain(|m| !(vnodes.contains(&m.0.vnode()) && m.0.key().starts_with(prefix)));
        bucket
            .truncates
            .extend(vnodes.map(|v| (v, prefix.to_vec())));
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
        // Epochs in order, each bucket already one mutation per key: a key's mutations lie in
        // epoch order, so the last of each run of equal keys in a (vnode, key, position) order is
        // its net effect (a key's vnode is a function of the key, so equal keys sort together).
        let mut rows: Vec<Option<RowMutation>> =
            Vec::with_capacity(taken.values().map(|b| b.rows.len()).sum());
        for (_, bucket) in taken {
            for (v, c) in bucket.counts {
                *counts.entry(v).or_default() += c;
                self.changes -= c;
            }
            if !bucket.truncates.is_empty() {
                // The earlier epochs' mutations of a truncated table's vnode are superseded.
                for slot in rows.iter_mut() {
                    let hit = slot.as_ref().is_some_and(|m| {
                        bucket
                            .truncates
                            .range((m.vnode(), Vec::new())..)
                            .take_while(|(v, _)| *v == m.vnode())
                            .any(|(_, prefix)| m.key().starts_with(prefix))
                    });
                    if hit {
                        *slot = None;
                    }
                }
                rows.retain(Option::is_some);
            }
            rows.extend(bucket.rows.into_iter().map(|k| Some(k.0)));
            // A truncation sorts before its table's rows in its vnode (its prefix is a prefix of
            // their keys) and equals no row's key.
            rows.extend(
                bucket
                    .truncates
                    .into_iter()
                    .map(|(vnode, prefix)| Some(RowMutation::Truncate { vnode, prefix })),
            );
        }
        // The stores cluster rows by (vnode, key), RisingWave's state-table layout: in that order a
        // commit walks each B-tree once, left to right. Sorted as an index of 16-byte entries
        // (vnode, the key's first 8 bytes, position) rather than the mutations themselves; the
        // key's remaining bytes are compared only where those are equal (the sort's moves and
        // `memcmp` calls were most of `take_through`, docs/BENCHMARKS.md "CPU per record").
        let key = |e: &SortEntry| {
            rows[e.position as usize]
                .as_ref()
                .expect("taken once")
                .key()
        };
        let mut order: Vec<SortEntry> = rows
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let m = m.as_ref().expect("just staged");
                SortEntry {
                    vnode: m.vnode(),
                    prefix: key_prefix(m.key()),
                    position: u32::try_from(i).expect("fewer than 2^32 rows in one commit"),
                }
            })
            .collect();
        let same_key = |a: &SortEntry, b: &SortEntry| {
            (a.vnode, a.prefix) == (b.vnode, b.prefix) && key(a) == key(b)
        };
        order.sort_unstable_by(|a, b| {
            (a.vnode, a.prefix)
                .cmp(&(b.vnode, b.prefix))
                .then_with(|| key(a).cmp(key(b)))
                .then(a.position.cmp(&b.position))
        });
        let mut net = Vec::with_capacity(order.len());
        for (n, e) in order.iter().enumerate() {
            if order.get(n + 1).is_some_and(|next| same_key(e, next)) {
                continue; // a later epoch's mutation of the same key follows
            }
            net.push(e.position);
        }
        let rows = net
            .into_iter()
            .map(|p| rows[p as usize].take().expect("each position taken once"))
            .collect();
        Taken { rows, counts }
    }

    /// Drops staged changes of the vnodes for which `revoked` holds (rollback of a revoked partition).
    pub fn discard(&mut self, revoked: impl Fn(Vnode) -> bool) {
        for bucket in self.epochs.values_mut() {
            bucket.rows.retain(|m| !revoked(m.0.vnode()));
            bucket.truncates.retain(|(v, _)| !revoked(*v));
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
            .retain(|_, b| !b.rows.is_empty() || !b.counts.is_empty() || !b.truncates.is_empty());
    }

    /// Drops everything.
    pub fn clear(&mut self) {
        self.epochs.clear();
        self.changes = 0;
    }
}

/// One row of a commit in its sort: `(vnode, prefix, then the whole key, position)` is the order.
struct SortEntry {
    vnode: Vnode,
    prefix: u64,
    position: u32,
}

/// The key's first 8 bytes, big-endian, zero-padded: `key_prefix(a) < key_prefix(b)` implies
/// `a < b` byte-wise (a shorter key pads with zeros, below any byte that a longer one has there, or
/// equal to a zero byte, which the whole-key comparison then orders).
fn key_prefix(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = key.len().min(8);
    b[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(b)
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

    fn described(t: &Taken) -> Vec<String> {
        t.rows
            .iter()
            .map(|m| match m {
                RowMutation::Upsert { vnode, row, .. } => {
                    format!("{vnode} upsert {}", String::from_utf8_lossy(&row.key))
                }
                RowMutation::Delete { vnode, key } => {
                    format!("{vnode} delete {}", String::from_utf8_lossy(key))
                }
                RowMutation::Truncate { vnode, .. } => format!("{vnode} truncate"),
            })
            .collect()
    }

    /// A truncation supersedes its vnodes' earlier mutations only in a commit that takes it: one
    /// that stops at an earlier epoch keeps them (the simulation's seed 28 found the first form,
    /// which dropped them at once, losing a row committed before the truncation).
    #[test]
    fn a_truncation_supersedes_earlier_epochs_only_in_the_commit_that_takes_it() {
        let stage = |s: &mut Staging| {
            s.stage(change(1, Op::Insert, 0, "a", "1"), 0);
            s.stage(change(1, Op::Insert, 2, "z", "1"), 1);
            s.stage(change(2, Op::Insert, 0, "b", "1"), 2);
            s.truncate(Epoch(2), 0..2, b"");
            s.stage(change(2, Op::Insert, 1, "c", "1"), 3);
        };
        let mut s = Staging::default();
        stage(&mut s);
        assert_eq!(
            described(&s.take_through(Epoch(1))),
            ["0 upsert a", "2 upsert z"],
            "epoch 1 committed alone keeps its rows"
        );
        assert_eq!(
            described(&s.take_through(Epoch(2))),
            ["0 truncate", "1 truncate", "1 upsert c"]
        );
        let mut s = Staging::default();
        stage(&mut s);
        assert_eq!(
            described(&s.take_through(Epoch(2))),
            ["0 truncate", "1 truncate", "1 upsert c", "2 upsert z"],
            "taken together, vnodes 0 and 1 lose what came before the truncation; vnode 2 keeps it"
        );
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
                    // Short keys, keys that differ only by a trailing zero byte, and keys longer
                    // than the sort's 8-byte prefix that share it.
                    let key = match k % 4 {
                        0 => format!("k{k}"),
                        1 => format!("k\0{}", "\0".repeat(k as usize % 3)),
                        2 => format!("prefix8_{k}"),
                        _ => format!("prefix8_\0{k}"),
                    };
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
