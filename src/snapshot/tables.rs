//! The snapshot of a job materialising several tables of a log (docs/design/several-tables.md §3):
//! one source per table, all of one snapshot (one epoch, one start per partition), scanned as one.
//!
//! A vnode's scan goes table by table in the log's order, each in key order, every row keyed by
//! [`table_key`] — so the rows of a vnode come in ascending (table, key) order and a snapshot
//! cursor (the last key applied) says both the table and the key to resume after. This module owns
//! that order; it must not read files itself (each table's source does).

use crate::core::{split_table_key, table_key, Row, Vnode};
use crate::ports::{RowIter, SnapshotInfo, SnapshotSource, SourceError};

/// Several tables' snapshots as one source.
pub struct TablesSnapshot {
    /// (log table index, its snapshot), ascending by index.
    tables: Vec<(u16, Box<dyn SnapshotSource>)>,
}

impl TablesSnapshot {
    /// `tables`: each table's log index and snapshot, which must all describe one snapshot (the same
    /// epoch, vnode count, partitions and start offsets; `what` names it in the error).
    pub fn new(
        mut tables: Vec<(u16, Box<dyn SnapshotSource>)>,
        what: &str,
    ) -> Result<Self, SourceError> {
        tables.sort_by_key(|(i, _)| *i);
        let Some((_, first)) = tables.first() else {
            return Err(SourceError::Other(format!("{what}: a job of no table")));
        };
        let info = first.info().clone();
        if let Some((i, _)) = tables.iter().find(|(_, s)| *s.info() != info) {
            return Err(SourceError::Other(format!(
                "{what}: table {i}'s snapshot is not the snapshot of table {} (its epoch, vnode count or start offsets differ): the tables of one job must come from one snapshot",
                tables[0].0
            )));
        }
        Ok(TablesSnapshot { tables })
    }
}

impl SnapshotSource for TablesSnapshot {
    fn info(&self) -> &SnapshotInfo {
        self.tables[0].1.info()
    }

    fn scan(&self, vnode: Vnode, after: Option<&[u8]>) -> Result<RowIter<'_>, SourceError> {
        let after = match after {
            None => None,
            Some(a) => Some(split_table_key(a).ok_or_else(|| {
                SourceError::Other(format!(
                    "vnode {vnode}: the snapshot cursor {} is not a (table, key) cursor of a job of several tables",
                    crate::ports::key_hex(a)
                ))
            })?),
        };
        let mut scans: Vec<RowIter<'_>> = Vec::new();
        for (index, source) in &self.tables {
            let index = *index;
            let from = match after {
                Some((t, _)) if index < t => continue,
                Some((t, key)) if index == t => Some(key),
                _ => None,
            };
            let rows = source.scan(vnode, from)?;
            scans.push(Box::new(rows.map(move |r| {
                r.map(|row| Row {
                    key: table_key(index, &row.key),
                    value: row.value,
                })
            })));
        }
        Ok(Box::new(scans.into_iter().flatten()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Epoch, PartitionProgress};
    use std::collections::BTreeMap;

    struct Fixed(SnapshotInfo, BTreeMap<Vec<u8>, Vec<u8>>);

    impl SnapshotSource for Fixed {
        fn info(&self) -> &SnapshotInfo {
            &self.0
        }
        fn scan(&self, _: Vnode, after: Option<&[u8]>) -> Result<RowIter<'_>, SourceError> {
            let rows: Vec<_> = self
                .1
                .iter()
                .filter(|(k, _)| after.is_none_or(|a| k.as_slice() > a))
                .map(|(k, v)| {
                    Ok(Row {
                        key: k.clone(),
                        value: v.clone(),
                    })
                })
                .collect();
            Ok(Box::new(rows.into_iter()))
        }
    }

    fn info(epoch: u64) -> SnapshotInfo {
        SnapshotInfo {
            snapshot_epoch: Epoch(epoch),
            vnode_count: 1,
            partition_count: 1,
            start: vec![PartitionProgress {
                partition: 0,
                next_offset: 1,
                epoch: Epoch(epoch + 1),
                streaming: false,
            }],
        }
    }

    fn table(epoch: u64, keys: &[u8]) -> Box<dyn SnapshotSource> {
        Box::new(Fixed(
            info(epoch),
            keys.iter().map(|k| (vec![*k], vec![*k])).collect(),
        ))
    }

    #[test]
    fn a_vnode_is_scanned_table_by_table_and_resumes_after_a_table_key_cursor() {
        let s =
            TablesSnapshot::new(vec![(3, table(5, &[1, 2])), (1, table(5, &[7, 8]))], "t").unwrap();
        let keys = |after: Option<&[u8]>| -> Vec<Vec<u8>> {
            s.scan(0, after).unwrap().map(|r| r.unwrap().key).collect()
        };
        assert_eq!(
            keys(None),
            vec![vec![0, 1, 7], vec![0, 1, 8], vec![0, 3, 1], vec![0, 3, 2]]
        );
        assert_eq!(
            keys(Some(&[0, 1, 7])),
            vec![vec![0, 1, 8], vec![0, 3, 1], vec![0, 3, 2]]
        );
        assert_eq!(keys(Some(&[0, 1, 8])), vec![vec![0, 3, 1], vec![0, 3, 2]]);
        assert_eq!(keys(Some(&[0, 3, 1])), vec![vec![0, 3, 2]]);
        let bare = s
            .scan(0, Some(&[1]))
            .err()
            .expect("a bare-key cursor is refused");
        assert!(bare.to_string().contains("(table, key) cursor"), "{bare}");
    }

    #[test]
    fn tables_of_different_snapshots_are_refused() {
        let e = TablesSnapshot::new(vec![(0, table(5, &[1])), (1, table(6, &[1]))], "snap")
            .err()
            .expect("refused");
        assert!(e.to_string().contains("must come from one snapshot"), "{e}");
    }
}
