//! Publishing a replica at one epoch across every partition (docs/design/several-tables.md §2, issue
//! 23; `src/store/protocol.rs`, `publish`, calls it): which epoch a store may publish, given the
//! checkpoints each partition has committed and not yet published, and which partition holds the
//! published table back.
//!
//! A committed checkpoint not yet published is a *pending unit*: its epoch and the partitions it
//! covers. Its rows are coalesced over (that worker's previous commit, epoch], so a unit is applied
//! whole or not at all. A partition is *at* epoch `e` only if one of its units ends at `e` (or `e` is
//! the published epoch and nothing of it is pending), so the replica can be published at `e` only
//! when `e` is such a boundary of every partition. Pure: the stores read the inputs in their
//! transaction and apply every unit at or below the answer, in epoch order.

use std::collections::BTreeMap;

use super::epoch::Epoch;
use super::progress::{Checkpoint, PartitionProgress};
use super::vnode::{PartitionId, PartitionMap};

/// The partitions a log-store checkpoint through `epoch` puts *at* `epoch`: those whose vnodes'
/// progress it moves there. A worker's checkpoint also carries the progress of owned partitions it
/// did not move — one gained under `reschedule` or in streaming whose previous owner committed
/// beyond this worker's frontier — and such a partition is not at `epoch` (the simulation found a
/// replica published torn when they were counted).
pub fn partitions_at(map: PartitionMap, epoch: Epoch, cp: &Checkpoint) -> Vec<PartitionId> {
    if super::faults::active(super::faults::Fault::PublishEveryOwnedPartition) {
        return cp.partitions.iter().map(|p| p.partition).collect();
    }
    let mut out: Vec<PartitionId> = cp
        .vnodes
        .iter()
        .filter(|v| v.epoch == epoch)
        .map(|v| map.partition_of(v.vnode))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The greatest epoch above `published` that is a boundary of every partition `0..partition_count`:
/// the epoch of a pending unit of each. `None` when there is none (some partition has nothing pending
/// above `published`, or its units end elsewhere). Units at or below `published` are ignored (they
/// were applied); partitions outside the range are ignored.
pub fn publication_epoch<'a>(
    partition_count: u32,
    published: Option<Epoch>,
    units: impl IntoIterator<Item = (Epoch, &'a [PartitionId])>,
) -> Option<Epoch> {
    if partition_count == 0 {
        return None;
    }
    // Per epoch, the partitions with a unit ending there (as a bitmap of seen partitions, counted).
    let mut boundaries: BTreeMap<Epoch, (Vec<bool>, u32)> = BTreeMap::new();
    for (epoch, partitions) in units {
        if published.is_some_and(|p| epoch <= p) {
            continue;
        }
        let (seen, count) = boundaries
            .entry(epoch)
            .or_insert_with(|| (vec![false; partition_count as usize], 0));
        for &p in partitions {
            if let Some(s) = seen.get_mut(p as usize) {
                if !*s {
                    *s = true;
                    *count += 1;
                }
            }
        }
    }
    boundaries
        .into_iter()
        .rev()
        .find(|(_, (_, count))| *count == partition_count)
        .map(|(epoch, _)| epoch)
}

/// What holds a published table back: the partition whose committed progress is the oldest, while
/// another stands further. The table can be published no further than that partition's last commit,
/// so its owner (or its lack of one: a worker gone, a partition unassigned) is what an operator
/// looks at when the table is stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldBack {
    pub partition: PartitionId,
    /// The partition's committed progress: the epoch its next data belongs to.
    pub epoch: Epoch,
    /// The furthest partition's.
    pub freshest: Epoch,
}

impl HeldBack {
    /// How far the slowest partition trails the furthest, in the epochs' own time.
    pub fn seconds(&self) -> f64 {
        self.freshest.seconds_since(self.epoch)
    }
}

/// The partition holding the published table back, from every partition's committed progress
/// (the lowest-numbered of the oldest); `None` when all stand at one epoch (or none committed).
pub fn held_back<'a>(
    partitions: impl IntoIterator<Item = &'a PartitionProgress>,
) -> Option<HeldBack> {
    let mut slowest: Option<&PartitionProgress> = None;
    let mut freshest: Option<Epoch> = None;
    for p in partitions {
        freshest = freshest.max(Some(p.epoch));
        if slowest.is_none_or(|s| (p.epoch, p.partition) < (s.epoch, s.partition)) {
            slowest = Some(p);
        }
    }
    let (slowest, freshest) = (slowest?, freshest?);
    (slowest.epoch < freshest).then_some(HeldBack {
        partition: slowest.partition,
        epoch: slowest.epoch,
        freshest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn e(n: u64) -> Epoch {
        Epoch(n << 16)
    }

    #[test]
    fn the_oldest_partition_holds_the_table_back_while_another_stands_further() {
        let at = |partition, epoch| PartitionProgress {
            partition,
            next_offset: 1,
            epoch,
            streaming: false,
        };
        assert_eq!(held_back(&[]), None);
        assert_eq!(
            held_back(&[at(0, e(5)), at(1, e(5))]),
            None,
            "all at one epoch"
        );
        let ms = |n: u64| Epoch::from_unix_millis(1_767_225_600_000 + n);
        let h = held_back(&[
            at(0, ms(3_000)),
            at(2, ms(500)),
            at(1, ms(500)),
            at(3, ms(2_000)),
        ])
        .unwrap();
        assert_eq!((h.partition, h.epoch, h.freshest), (1, ms(500), ms(3_000)));
        assert_eq!(h.seconds(), 2.5);
    }

    #[test]
    fn one_worker_owning_every_partition_publishes_each_of_its_checkpoints() {
        let all = [0, 1, 2, 3];
        assert_eq!(publication_epoch(4, None, [(e(1), &all[..])]), Some(e(1)));
        assert_eq!(
            publication_epoch(4, Some(e(1)), [(e(2), &all[..])]),
            Some(e(2))
        );
    }

    #[test]
    fn a_worker_ahead_waits_for_the_others_to_reach_its_epoch() {
        let a = [0, 1];
        let b = [2, 3];
        assert_eq!(publication_epoch(4, None, [(e(1), &a[..])]), None);
        assert_eq!(
            publication_epoch(4, None, [(e(1), &a[..]), (e(2), &a[..]), (e(1), &b[..])]),
            Some(e(1)),
            "published where both are, not where the one ahead is"
        );
        // Nothing pending for a partition after the published epoch holds the replica there.
        assert_eq!(publication_epoch(4, Some(e(1)), [(e(2), &a[..])]), None);
    }

    #[test]
    fn the_minimum_committed_epoch_is_not_enough_when_units_end_elsewhere() {
        // A committed through e3 in one unit (c1 and c3 coalesced: a backlog), B through e2: the
        // minimum committed epoch is e2, but A is not at e2 — its unit cannot be split.
        let a = [0];
        let b = [1];
        assert_eq!(
            publication_epoch(2, None, [(e(1), &a[..]), (e(3), &a[..]), (e(2), &b[..])]),
            None
        );
        assert_eq!(
            publication_epoch(
                2,
                None,
                [
                    (e(1), &a[..]),
                    (e(3), &a[..]),
                    (e(2), &b[..]),
                    (e(3), &b[..])
                ]
            ),
            Some(e(3))
        );
    }

    #[test]
    fn units_already_published_and_partitions_out_of_range_are_ignored() {
        let all = [0, 1, 7];
        assert_eq!(publication_epoch(2, Some(e(2)), [(e(2), &all[..])]), None);
        assert_eq!(
            publication_epoch(2, Some(e(2)), [(e(3), &all[..])]),
            Some(e(3))
        );
        assert_eq!(publication_epoch(0, None, [(e(3), &all[..])]), None);
    }

    /// Over random histories (workers owning random partition sets committing random increasing
    /// epochs), the answer puts every partition exactly at it — each partition's last unit at or
    /// below it ends there — and no greater epoch does.
    #[test]
    fn the_answer_is_the_greatest_epoch_at_which_every_partition_stands() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let at = |units: &[(Epoch, Vec<PartitionId>)], p: PartitionId, upto: Epoch| {
            units
                .iter()
                .filter(|(ep, ps)| *ep <= upto && ps.contains(&p))
                .map(|(ep, _)| *ep)
                .max()
        };
        let mut published_somewhere = 0;
        for _ in 0..2_000 {
            let partitions = 1 + next(5) as u32;
            let mut units: Vec<(Epoch, Vec<PartitionId>)> = Vec::new();
            // Each partition's commits: an increasing chain of epochs; partitions of one worker
            // commit together.
            let mut p = 0;
            while p < partitions {
                let width = 1 + next((partitions - p) as u64) as u32;
                let owned: Vec<PartitionId> = (p..p + width).collect();
                let mut epoch = 0;
                for _ in 0..next(5) {
                    epoch += 1 + next(3);
                    units.push((e(epoch), owned.clone()));
                }
                p += width;
            }
            let answer = publication_epoch(
                partitions,
                None,
                units.iter().map(|(ep, ps)| (*ep, ps.as_slice())),
            );
            let candidates: BTreeSet<Epoch> = units.iter().map(|(ep, _)| *ep).collect();
            let stands_at = |c: Epoch| (0..partitions).all(|p| at(&units, p, c) == Some(c));
            let expected = candidates.into_iter().rev().find(|&c| stands_at(c));
            assert_eq!(answer, expected, "{units:?}");
            published_somewhere += answer.is_some() as u32;
        }
        assert!(published_somewhere > 100, "{published_somewhere}");
    }
}
