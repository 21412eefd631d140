//! State stores: the protocol every store enforces (`protocol`), written once, and the backends,
//! which implement only its primitives: `sqlite` (one file), `postgres` (shared by workers on many
//! machines) and `memory` (the test double the simulation uses; feature `testing`). `committer` is
//! the production [`crate::ports::CommitPort`]: a worker's checkpoints applied on a thread of their
//! own, in order, group-committed. `sqlite_static` is the SQLite statement that binds a row's bytes
//! without a copy (`sqlite`'s upsert).

pub mod committer;
#[cfg(any(test, feature = "testing"))]
pub mod memory;
pub mod postgres;
pub mod protocol;
mod sql;
pub mod sqlite;
mod sqlite_static;
pub mod transactions;

use crate::codec::TableSchema;
use crate::core::{Checkpoint, RowMutation};
use crate::ports::{DecodedRows, StateStore, StoreError};

/// One store table of a job materialising several tables of its log (docs/design/several-tables.md
/// §3): the log table's index (the prefix of its rows' keys, [`crate::core::table_key`]), the SQL
/// table that receives its rows, and its row schema.
#[derive(Clone, Debug)]
pub struct StoreTable {
    pub index: u16,
    /// The log table's name (its manifest name; `store.tables`' key).
    pub source: String,
    pub name: String,
    pub schema: TableSchema,
}

/// A refusal of a row of table `table` (of several), saying which table.
pub fn in_table(e: StoreError, table: &str) -> StoreError {
    match e {
        StoreError::Rejected { what, cause } => StoreError::Rejected {
            what: format!("table {table}: {what}"),
            cause,
        },
        other => other,
    }
}

/// Which of `tables` (its position) a several-table job's row key is of, and the bare key; a key
/// of no table of the job is refused, naming it.
fn table_of<'k>(tables: &[StoreTable], key: &'k [u8]) -> Result<(usize, &'k [u8]), StoreError> {
    let (index, bare) = crate::core::split_table_key(key).ok_or_else(|| {
        StoreError::rejected(format!(
            "row with key {} is not keyed by (table, key), as a job of several tables writes",
            crate::ports::key_hex(key)
        ))
    })?;
    let at = tables
        .iter()
        .position(|t| t.index == index)
        .ok_or_else(|| {
            StoreError::rejected(format!(
            "row with key {} is of log table {index}, which is not one of this store's tables ({})",
            crate::ports::key_hex(key),
            tables.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ")
        ))
        })?;
    Ok((at, bare))
}

/// Refuses a checkpoint of a several-table job holding a row of no table of the job, before
/// anything of it is written (under publication its rows may wait as a pending unit, and a unit
/// that could not be applied later would stop the job at another worker's commit). Part of
/// [`protocol::check_commit`].
fn check_table_keys(tables: &[StoreTable], rows: &[RowMutation]) -> Result<(), StoreError> {
    rows.iter()
        .try_for_each(|m| table_of(tables, m.key()).map(|_| ()))
}

/// A row as a store writes it: its mutation and its key as its table keeps it (a several-table
/// job's (table, key) prefix stripped), borrowed from the checkpoint.
pub type RowRef<'r> = (&'r RowMutation, &'r [u8]);

/// A one-table checkpoint's rows as [`RowRef`]s (keys as they are).
pub fn row_refs(rows: &[RowMutation]) -> impl Iterator<Item = RowRef<'_>> {
    rows.iter().map(|m| (m, m.key()))
}

/// A several-table job's rows routed to their tables (in `tables`' order) by reference, each key
/// bare again, each table's rows in the order they came with their values decoded ahead
/// (`decoded`, aligned with `rows`, or empty when not decoded ahead). A key whose table is not one
/// of `tables` is refused.
#[allow(clippy::type_complexity)]
pub fn split_rows<'a, 'r>(
    tables: &'a [StoreTable],
    rows: &'r [RowMutation],
    decoded: DecodedRows,
) -> Result<Vec<(&'a StoreTable, Vec<RowRef<'r>>, DecodedRows)>, StoreError> {
    let mut out: Vec<(&StoreTable, Vec<RowRef<'r>>, DecodedRows)> =
        tables.iter().map(|t| (t, Vec::new(), Vec::new())).collect();
    let mut decoded = (decoded.len() == rows.len()).then(|| decoded.into_iter());
    for m in rows {
        let (at, key) = table_of(tables, m.key())?;
        out[at].1.push((m, key));
        if let Some(pre) = decoded.as_mut().and_then(|d| d.next()) {
            out[at].2.push(pre);
        }
    }
    Ok(out)
}

/// Commits a group as one transaction. If the store *refused* it (a permanent error: a value it
/// cannot hold, a broken invariant), the checkpoints are tried one at a time, so those before the
/// culprit are applied and the failure is the culprit's own, stopping at the first failure. A
/// transient failure (the store away: it already retried within its deadline) or fencing is the
/// whole group's: retrying each checkpoint alone would wait out the deadline again for each (the
/// loop blocked for minutes), and the worker restarts from what is committed anyway.
pub fn commit_in_order(
    store: &mut dyn StateStore,
    job: &str,
    group: &[Checkpoint],
    decoded: Vec<DecodedRows>,
) -> Vec<Result<(), StoreError>> {
    let whole = store.commit_group_decoded(job, group, decoded);
    let split = match &whole {
        Ok(()) => false,
        Err(e) => group.len() > 1 && !e.is_transient() && !e.is_fenced(),
    };
    if !split {
        return group.iter().map(|_| whole.clone()).collect();
    }
    let mut out = Vec::with_capacity(group.len());
    for cp in group {
        let r = match out.last() {
            Some(Err(_)) => Err(StoreError::backend(
                "an earlier checkpoint failed; later ones are not applied",
            )),
            _ => store.commit(job, cp),
        };
        out.push(r);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::core::{
        CheckpointCause, PartitionId, PartitionProgress, RateLimits, Vnode, VnodeProgress,
    };
    use crate::ports::{JobRow, SnapshotInfo};

    /// A store whose group commits fail with `error` (the single commits of a split succeed),
    /// counting the transactions it was asked for.
    struct Failing {
        error: StoreError,
        transactions: usize,
    }

    impl StateStore for Failing {
        fn ensure_job(&mut self, _: &str, _: &SnapshotInfo) -> Result<JobRow, StoreError> {
            unreachable!()
        }
        fn job(&mut self, _: &str) -> Result<Option<JobRow>, StoreError> {
            unreachable!()
        }
        fn claim(
            &mut self,
            _: &str,
            _: crate::core::Generation,
            _: &str,
            _: &[PartitionId],
            _: &SnapshotInfo,
        ) -> Result<Vec<crate::core::ClaimedPartition>, StoreError> {
            unreachable!()
        }
        fn commit_group(&mut self, _: &str, group: &[Checkpoint]) -> Result<(), StoreError> {
            self.transactions += 1;
            if group.len() > 1 {
                Err(self.error.clone())
            } else {
                Ok(())
            }
        }
        fn recreate_onto(
            &mut self,
            _: &str,
            _: crate::core::Generation,
            _: Option<crate::core::Epoch>,
        ) -> Result<JobRow, StoreError> {
            unreachable!()
        }
        fn rows(&mut self, _: &str) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, StoreError> {
            unreachable!()
        }
        fn committed_vnodes(
            &mut self,
            _: &str,
        ) -> Result<BTreeMap<Vnode, VnodeProgress>, StoreError> {
            unreachable!()
        }
        fn rate_limits(&mut self, _: &str) -> Result<Option<RateLimits>, StoreError> {
            unreachable!()
        }
        fn set_rate_limits(&mut self, _: &str, _: RateLimits) -> Result<(), StoreError> {
            unreachable!()
        }
        fn dead_letters(
            &mut self,
            _: &str,
        ) -> Result<Vec<crate::ports::DeadLetterRow>, StoreError> {
            unreachable!()
        }
        fn paused(&mut self, _: &str) -> Result<bool, StoreError> {
            unreachable!()
        }
        fn set_paused(&mut self, _: &str, _: bool) -> Result<(), StoreError> {
            unreachable!()
        }
        fn owners(&mut self, _: &str) -> Result<BTreeMap<PartitionId, String>, StoreError> {
            unreachable!()
        }
        fn committed_partitions(
            &mut self,
            _: &str,
        ) -> Result<BTreeMap<PartitionId, PartitionProgress>, StoreError> {
            unreachable!()
        }
    }

    fn group(n: usize) -> Vec<Checkpoint> {
        (0..n)
            .map(|_| Checkpoint {
                generation: crate::core::Generation(0),
                worker: "w".into(),
                cause: CheckpointCause::Barrier,
                epoch: None,
                leases: Vec::new(),
                rows: Vec::new(),
                vnodes: Vec::new(),
                partitions: Vec::new(),
                dead_letters: Vec::new(),
                max_dead_letters: 0,
            })
            .collect()
    }

    #[test]
    fn a_transient_or_fencing_group_failure_is_the_whole_groups_in_one_transaction() {
        for error in [
            StoreError::backend("connection refused"),
            StoreError::StaleGeneration {
                job: "j".into(),
                attempted: crate::core::Generation(0),
                current: crate::core::Generation(1),
            },
        ] {
            let mut store = Failing {
                error: error.clone(),
                transactions: 0,
            };
            let results = commit_in_order(&mut store, "j", &group(4), Vec::new());
            assert_eq!(store.transactions, 1, "{error}: retried one by one");
            assert!(results
                .iter()
                .all(|r| matches!(r, Err(e) if e.to_string() == error.to_string())));
        }
    }

    #[test]
    fn a_refused_group_is_split_to_find_the_culprit() {
        let mut store = Failing {
            error: StoreError::rejected("value too long"),
            transactions: 0,
        };
        let results = commit_in_order(&mut store, "j", &group(3), Vec::new());
        assert_eq!(store.transactions, 4);
        assert!(results.iter().all(|r| r.is_ok()));
    }

    /// Two one-column tables: `a` (index 1, a long) and `b` (index 3, a string).
    fn two_tables() -> Vec<StoreTable> {
        let schema = |name: &str, ty: &str| {
            TableSchema::parse(
                &format!(
                    r#"{{"type":"record","name":"{name}","fields":[{{"name":"k","type":"{ty}"}}]}}"#
                ),
                &["k".to_string()],
            )
            .unwrap()
        };
        vec![
            StoreTable {
                index: 1,
                source: "a".into(),
                name: "a".into(),
                schema: schema("a", "long"),
            },
            StoreTable {
                index: 3,
                source: "b".into(),
                name: "b".into(),
                schema: schema("b", "string"),
            },
        ]
    }

    fn upsert(table: &StoreTable, key: &[u8], field: apache_avro::types::Value) -> RowMutation {
        let value = table
            .schema
            .encode_row(&apache_avro::types::Value::Record(vec![(
                "k".into(),
                field,
            )]))
            .unwrap();
        RowMutation::Upsert {
            vnode: 0,
            row: crate::core::Row {
                key: crate::core::table_key(table.index, key),
                value,
            },
            offset: None,
        }
    }

    #[test]
    fn several_tables_rows_are_decoded_with_their_tables_schema_and_routed_with_bare_keys() {
        use crate::codec::ColumnValue;
        use apache_avro::types::Value;
        let tables = two_tables();
        let mut cp = group(1).remove(0);
        cp.rows = vec![
            upsert(&tables[1], b"x", Value::String("x".into())),
            upsert(&tables[0], b"7", Value::Long(7)),
            RowMutation::Delete {
                vnode: 0,
                key: crate::core::table_key(3, b"y"),
            },
        ];
        let schemas = crate::ports::RowSchemas::Several(
            tables.iter().map(|t| (t.index, t.schema.clone())).collect(),
        );
        let decoded = schemas.decode(&cp);
        let routed = split_rows(&tables, &cp.rows, decoded).unwrap();
        let (a, b) = (&routed[0], &routed[1]);
        assert_eq!((a.0.name.as_str(), b.0.name.as_str()), ("a", "b"));
        assert_eq!(
            a.1.iter().map(|r| r.1).collect::<Vec<_>>(),
            vec![b"7".as_slice()]
        );
        assert_eq!(
            b.1.iter().map(|r| r.1).collect::<Vec<_>>(),
            vec![b"x".as_slice(), b"y".as_slice()]
        );
        assert_eq!(a.2, vec![Some(Ok(vec![ColumnValue::Integer(7)]))]);
        assert_eq!(
            b.2,
            vec![Some(Ok(vec![ColumnValue::Text("x".into())])), None]
        );

        // Not decoded ahead: routed all the same, decoded by the store.
        let routed = split_rows(&tables, &cp.rows, Vec::new()).unwrap();
        assert!(routed
            .iter()
            .all(|(_, rows, pre)| !rows.is_empty() && pre.is_empty()));

        // A row of a table the job lacks: not decoded ahead, and refused at routing naming the tables.
        let lacking = StoreTable {
            index: 2,
            ..tables[0].clone()
        };
        cp.rows.push(upsert(&lacking, b"z", Value::Long(1)));
        assert_eq!(schemas.decode(&cp).last(), Some(&None));
        let err = split_rows(&tables, &cp.rows, Vec::new())
            .unwrap_err()
            .to_string();
        assert!(err.contains("log table 2") && err.contains("a, b"), "{err}");
    }
}
