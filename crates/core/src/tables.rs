//! Which tables of a log a job materialises, and how a row of several tables is keyed
//! (docs/design/several-tables.md §3).
//!
//! A log may carry several tables ([`crate::Change::table`]). A job of one table stages that
//! table's changes with their key bytes as they are, so last release's progress rows (a snapshot
//! cursor is a key) resume unchanged. A job of several tables keys every row by **(table, key)**:
//! the table's index in the log as two big-endian bytes, then the key bytes ([`table_key`]) —
//! RisingWave's storage key layout, where every state table's keys carry its table id as a prefix.
//! Everything between the codec and the store (staging, a checkpoint's rows, a snapshot cursor,
//! publication's pending units) treats a key as opaque bytes, so it needs nothing more: rows of
//! different tables never collide, a vnode's snapshot scan goes table by table in key order, and a
//! store routes each row to its table by the prefix ([`split_table_key`]). The vnode is still
//! `crc32(key bytes) mod vnode_count` of the *bare* key: the contract is checked before the prefix is
//! added.
//!
//! This module owns the layout; it must not know store table names (the shell maps indexes to them).

/// The tables of the log a job materialises.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobTables {
    /// One table, by its index in the log (0 in a one-table log): its rows keyed by their key
    /// bytes; the other tables' changes are checked against the contract and passed over.
    One(u16),
    /// Several tables, by their indexes in the log (ascending, distinct): rows keyed by
    /// [`table_key`]; a table not listed is passed over.
    Several(Vec<u16>),
}

impl Default for JobTables {
    fn default() -> Self {
        JobTables::One(0)
    }
}

impl JobTables {
    /// How a change of log table `table` with key `key` is staged: `None` when the job does not
    /// materialise the table, else the row's key in the job's layout.
    pub fn staged_key(&self, table: u16, key: Vec<u8>) -> Option<Vec<u8>> {
        match self {
            JobTables::One(t) => (*t == table).then_some(key),
            JobTables::Several(ts) => ts
                .binary_search(&table)
                .is_ok()
                .then(|| table_key(table, &key)),
        }
    }

    /// The prefix every staged key of log table `table` starts with: empty for a job of one table,
    /// the table's two bytes for several. What a truncation of the table deletes
    /// ([`crate::RowMutation::Truncate`]).
    pub fn table_prefix(&self, table: u16) -> Vec<u8> {
        match self {
            JobTables::One(_) => Vec::new(),
            JobTables::Several(_) => table.to_be_bytes().to_vec(),
        }
    }

    /// Whether the job materialises log table `table`.
    pub fn includes(&self, table: u16) -> bool {
        match self {
            JobTables::One(t) => *t == table,
            JobTables::Several(ts) => ts.binary_search(&table).is_ok(),
        }
    }

    /// The bytes of a staged row's key its vnode is computed from: the bare key (a snapshot row of
    /// several tables comes keyed by [`table_key`]).
    pub fn routing_key<'a>(&self, key: &'a [u8]) -> &'a [u8] {
        match self {
            JobTables::One(_) => key,
            JobTables::Several(_) => split_table_key(key).map_or(key, |(_, k)| k),
        }
    }

    /// Whether rows are keyed by [`table_key`].
    pub fn several(&self) -> bool {
        matches!(self, JobTables::Several(_))
    }

    /// The log table a row of the job's layout (a staged or snapshot row's key) belongs to.
    pub fn table_of(&self, key: &[u8]) -> u16 {
        match self {
            JobTables::One(t) => *t,
            JobTables::Several(_) => split_table_key(key).map_or(0, |(t, _)| t),
        }
    }

    /// The log tables of the job, ascending.
    pub fn indexes(&self) -> Vec<u16> {
        match self {
            JobTables::One(t) => vec![*t],
            JobTables::Several(ts) => ts.clone(),
        }
    }

    /// Per table of the job (ascending), how many of `vnode_count` vnodes have that table's
    /// snapshot done, from the vnodes' committed progress: a finished vnode has every table's; an
    /// unfinished one has the tables before its cursor's (a vnode's scan goes table by table, in
    /// ascending order), none without a cursor.
    pub fn snapshot_vnodes_done<'a>(
        &self,
        vnodes: impl IntoIterator<Item = &'a crate::VnodeProgress>,
    ) -> Vec<(u16, u32)> {
        let tables = self.indexes();
        let mut done = vec![0u32; tables.len()];
        for v in vnodes {
            let before = match (&v.cursor, v.finished) {
                (_, true) => tables.len(),
                (Some(cursor), false) if self.several() => {
                    let at = self.table_of(cursor);
                    tables.partition_point(|t| *t < at)
                }
                _ => 0,
            };
            for d in &mut done[..before] {
                *d += 1;
            }
        }
        tables.into_iter().zip(done).collect()
    }
}

/// A row's key in a job of several tables: the log table index (big-endian), then the key bytes.
pub fn table_key(table: u16, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + key.len());
    out.extend_from_slice(&table.to_be_bytes());
    out.extend_from_slice(key);
    out
}

/// The log table index and bare key of a [`table_key`]; `None` for fewer than two bytes.
pub fn split_table_key(key: &[u8]) -> Option<(u16, &[u8])> {
    let (t, rest) = key.split_first_chunk::<2>()?;
    Some((u16::from_be_bytes(*t), rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vnode_has_the_snapshot_of_the_tables_before_its_cursor_done() {
        let several = JobTables::Several(vec![0, 2, 5]);
        let at = |cursor: Option<Vec<u8>>, finished: bool| crate::VnodeProgress {
            cursor,
            finished,
            ..crate::VnodeProgress::fresh(0, crate::Epoch(1 << 16))
        };
        let vnodes = [
            at(None, false),                     // not started: none
            at(Some(table_key(0, b"k")), false), // in table 0: none
            at(Some(table_key(2, b"k")), false), // in table 2: table 0
            at(Some(table_key(5, b"")), false),  // in table 5: tables 0 and 2
            at(Some(table_key(5, b"z")), true),  // finished: all
        ];
        assert_eq!(
            several.snapshot_vnodes_done(&vnodes),
            [(0, 3), (2, 2), (5, 1)]
        );
        assert_eq!(
            JobTables::One(0).snapshot_vnodes_done(&vnodes),
            [(0, 1)],
            "one table: its vnodes finished"
        );
        assert_eq!(several.table_of(&table_key(2, b"k")), 2);
        assert_eq!(JobTables::One(3).table_of(b"k"), 3);
    }

    #[test]
    fn a_table_key_splits_back_and_sorts_table_by_table_then_by_key() {
        let a = table_key(1, &[0xff, 0xff]);
        let b = table_key(2, &[0x00]);
        assert!(a < b, "every key of table 1 sorts before table 2's");
        assert_eq!(split_table_key(&a), Some((1, &[0xff, 0xff][..])));
        assert_eq!(split_table_key(&table_key(7, &[])), Some((7, &[][..])));
        assert_eq!(split_table_key(&[3]), None);
    }

    #[test]
    fn one_table_keeps_bare_keys_several_prefix_theirs_and_others_are_passed_over() {
        let one = JobTables::One(1);
        assert_eq!(one.staged_key(1, vec![9]), Some(vec![9]));
        assert_eq!(one.staged_key(0, vec![9]), None);
        let several = JobTables::Several(vec![0, 2]);
        assert_eq!(several.staged_key(2, vec![9]), Some(vec![0, 2, 9]));
        assert_eq!(several.staged_key(1, vec![9]), None);
    }
}
