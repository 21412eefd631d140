//! The simulated upstream: a table that writes changes and barriers into an in-memory log, and
//! remembers the table at the end of every epoch (the oracle's truth).

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
