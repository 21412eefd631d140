//! Vnodes, vnode bitmaps and the partition ↔ vnode-range mapping (docs/DESIGN.md §2).
//!
//! `vnode(key) = crc32(key bytes) mod V`; partition `p` of `P` owns `[p·V/P, (p+1)·V/P)`. The mapping is
//! fixed for the life of a job: a different partition count is an error, never a silent remap.

use std::fmt;
use std::ops::Range;

use super::error::CoreError;

/// A virtual node: `0..vnode_count`.
pub type Vnode = u16;
/// A Kafka partition of the log topic.
pub type PartitionId = u32;

/// The largest vnode count a job may have (RisingWave's limit).
pub const MAX_VNODE_COUNT: u32 = 32_768;
/// RisingWave's default vnode count.
pub const DEFAULT_VNODE_COUNT: u32 = 256;

/// The vnode of a row: CRC-32 (IEEE) of its primary-key bytes modulo the vnode count.
pub fn vnode_of(key: &[u8], vnode_count: u32) -> Vnode {
    (crc32fast::hash(key) % vnode_count) as Vnode
}

/// The fixed mapping of a job's vnodes onto the partitions of its log topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionMap {
    vnode_count: u32,
    partition_count: u32,
}

impl PartitionMap {
    /// Checks `1 ≤ P ≤ V ≤ 32768`.
    pub fn new(vnode_count: u32, partition_count: u32) -> Result<Self, CoreError> {
        if vnode_count == 0 || vnode_count > MAX_VNODE_COUNT {
            return Err(CoreError::BadVnodeCount { vnode_count });
        }
        if partition_count == 0 || partition_count > vnode_count {
            return Err(CoreError::TooManyPartitions {
                partition_count,
                vnode_count,
            });
        }
        Ok(PartitionMap {
            vnode_count,
            partition_count,
        })
    }

    pub fn vnode_count(&self) -> u32 {
        self.vnode_count
    }

    pub fn partition_count(&self) -> u32 {
        self.partition_count
    }

    /// The vnodes partition `p` owns.
    pub fn vnodes_of(&self, p: PartitionId) -> Range<Vnode> {
        let (v, n) = (self.vnode_count as u64, self.partition_count as u64);
        let p = p as u64;
        ((p * v / n) as Vnode)..(((p + 1) * v / n) as Vnode)
    }

    /// The partition that owns vnode `v`.
    pub fn partition_of(&self, v: Vnode) -> PartitionId {
        // Largest p with floor(p·V/P) ≤ v, i.e. p = ceil((v+1)·P/V) − 1.
        let (vc, n) = (self.vnode_count as u64, self.partition_count as u64);
        (((v as u64 + 1) * n).div_ceil(vc) - 1) as PartitionId
    }

    /// The bitmap of the vnodes owned through a set of partitions.
    pub fn bitmap_of(&self, partitions: impl IntoIterator<Item = PartitionId>) -> VnodeBitmap {
        let mut bitmap = VnodeBitmap::new(self.vnode_count);
        for p in partitions {
            for v in self.vnodes_of(p) {
                bitmap.set(v);
            }
        }
        bitmap
    }

    /// Checks that a stored or advertised partition count matches this job's.
    pub fn check_partition_count(&self, found: u32, source: &str) -> Result<(), CoreError> {
        if found != self.partition_count {
            return Err(CoreError::PartitionCountChanged {
                source_name: source.to_string(),
                expected: self.partition_count,
                found,
            });
        }
        Ok(())
    }
}

/// A compact set of vnodes: one bit per vnode.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct VnodeBitmap {
    words: Vec<u64>,
    len: u32,
}

impl VnodeBitmap {
    pub fn new(vnode_count: u32) -> Self {
        VnodeBitmap {
            words: vec![0; vnode_count.div_ceil(64) as usize],
            len: vnode_count,
        }
    }

    pub fn set(&mut self, v: Vnode) {
        assert!((v as u32) < self.len, "vnode {v} out of range {}", self.len);
        self.words[v as usize / 64] |= 1 << (v % 64);
    }

    pub fn contains(&self, v: Vnode) -> bool {
        (v as u32) < self.len && self.words[v as usize / 64] & (1 << (v % 64)) != 0
    }

    pub fn count(&self) -> u32 {
        self.words.iter().map(|w| w.count_ones()).sum()
    }

    pub fn iter(&self) -> impl Iterator<Item = Vnode> + '_ {
        (0..self.len as Vnode).filter(|v| self.contains(*v))
    }

    /// Contiguous runs, for logs: `[0..64, 128..192]`.
    pub fn ranges(&self) -> Vec<Range<Vnode>> {
        let mut out: Vec<Range<Vnode>> = Vec::new();
        for v in self.iter() {
            match out.last_mut() {
                Some(r) if r.end == v => r.end = v + 1,
                _ => out.push(v..v + 1),
            }
        }
        out
    }
}

impl fmt::Debug for VnodeBitmap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VnodeBitmap{:?}", self.ranges())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each vnode is its own bit: a bitmap holding one vnode holds no other (the `%`→`/` mutant
    /// of `contains` tested bit `v / 64` and was not caught before).
    #[test]
    fn a_bitmap_holds_exactly_the_vnodes_set() {
        for v in [1, 5, 63, 64, 70, 200] {
            let mut b = VnodeBitmap::new(256);
            b.set(v);
            let held: Vec<Vnode> = (0..256).filter(|&x| b.contains(x)).collect();
            assert_eq!(held, vec![v], "set {v}");
        }
    }

    #[test]
    fn partition_of_inverts_vnodes_of_for_every_shape() {
        for v in [1u32, 2, 7, 64, 255, 256, 1000] {
            for p in 1..=v.min(40) {
                let map = PartitionMap::new(v, p).unwrap();
                let mut next = 0;
                for part in 0..p {
                    let r = map.vnodes_of(part);
                    assert_eq!(r.start as u32, next, "V={v} P={p} part={part}");
                    assert!(r.end > r.start, "every partition owns a vnode");
                    next = r.end as u32;
                    for vn in r {
                        assert_eq!(map.partition_of(vn), part);
                    }
                }
                assert_eq!(next, v);
            }
        }
    }

    #[test]
    fn rejects_more_partitions_than_vnodes_and_bad_counts() {
        assert!(matches!(
            PartitionMap::new(4, 5),
            Err(CoreError::TooManyPartitions { .. })
        ));
        assert!(PartitionMap::new(0, 1).is_err());
        assert!(PartitionMap::new(MAX_VNODE_COUNT + 1, 1).is_err());
        assert!(PartitionMap::new(4, 0).is_err());
        let map = PartitionMap::new(256, 4).unwrap();
        let err = map.check_partition_count(6, "topic t").unwrap_err();
        assert_eq!(
            err.to_string(),
            "partition count of topic t changed from 4 to 6; a job's partition count is fixed (recreate the job to change it)"
        );
    }

    #[test]
    fn vnode_of_is_crc32_mod_v() {
        // crc32("123456789") = 0xCBF43926, the standard check value.
        assert_eq!(vnode_of(b"123456789", 256), (0xCBF4_3926u32 % 256) as Vnode);
        assert_eq!(
            vnode_of(b"123456789", 1000),
            (0xCBF4_3926u32 % 1000) as Vnode
        );
    }

    #[test]
    fn bitmap_sets_counts_and_ranges() {
        let map = PartitionMap::new(256, 4).unwrap();
        let b = map.bitmap_of([0, 2]);
        assert_eq!(b.count(), 128);
        assert_eq!(b.ranges(), vec![0..64, 128..192]);
        assert!(b.contains(0) && b.contains(191) && !b.contains(64) && !b.contains(256));
    }
}
