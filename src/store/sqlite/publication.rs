//! Publication's primitives inside a SQLite commit (`consistency = "epoch"`: the replica readers
//! see moves by whole epochs; `protocol::publish` is the rule).

use super::*;
use crate::store::transactions::TxCommit;

/// `kb_publication`'s row of a job.
pub(super) fn read_publication(tx: &Connection, job: &str) -> Result<Publication, StoreError> {
    let epoch = |v: Option<i64>| v.map(|e| Epoch(e as u64));
    Ok(tx
        .query_row(sql::sqlite::PUBLICATION_READ, [job], |r| {
            Ok(Publication {
                published: epoch(r.get(0)?),
                visible: epoch(r.get(1)?),
            })
        })
        .optional()
        .map_err(classify)?
        .unwrap_or_default())
}

pub(super) fn write_publication(
    tx: &Connection,
    job: &str,
    p: &Publication,
) -> Result<(), StoreError> {
    tx.execute(
        sql::sqlite::PUBLICATION_WRITE,
        params![
            job,
            p.published.map(|e| e.0 as i64),
            p.visible.map(|e| e.0 as i64)
        ],
    )
    .map_err(classify)?;
    Ok(())
}

/// Publication's primitives inside a SQLite transaction (`protocol::publish` is the rule).
pub(super) struct InTx<'a> {
    pub(super) tx: &'a Connection,
    pub(super) table: &'a TableSchema,
    pub(super) table_name: &'a str,
    pub(super) several: &'a [StoreTable],
    pub(super) datum: bool,
}

impl protocol::TxPublish for InTx<'_> {
    fn lock_publication(&mut self, _job: &str) -> Result<(), StoreError> {
        // A commit's transaction is `IMMEDIATE`: the file's one writer already.
        Ok(())
    }

    fn publication(&mut self, job: &str) -> Result<Publication, StoreError> {
        read_publication(self.tx, job)
    }

    fn set_publication(&mut self, job: &str, p: &Publication) -> Result<(), StoreError> {
        write_publication(self.tx, job, p)
    }

    fn pending_units(&mut self, job: &str) -> Result<Vec<protocol::PendingUnit>, StoreError> {
        let mut q = self
            .tx
            .prepare_cached(sql::sqlite::PENDING_UNITS)
            .map_err(classify)?;
        let mut rs = q.query([job]).map_err(classify)?;
        let mut units = Vec::new();
        while let Some(r) = rs.next().map_err(classify)? {
            let text: String = r.get(2).map_err(classify)?;
            let partitions = text
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| s.parse::<PartitionId>())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    StoreError::rejected(format!(
                        "kb_pending_units of job {job}: partitions {text:?}: {e}"
                    ))
                })?;
            units.push((
                r.get(0).map_err(classify)?,
                Epoch(r.get::<_, i64>(1).map_err(classify)? as u64),
                partitions,
            ));
        }
        Ok(units)
    }

    fn take_unit(&mut self, unit: i64) -> Result<Vec<RowMutation>, StoreError> {
        let rows = {
            let mut q = self
                .tx
                .prepare_cached(sql::sqlite::PENDING_ROWS)
                .map_err(classify)?;
            let rows = q
                .query_map([unit], |r| {
                    Ok(protocol::pending_mutation(r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .map_err(classify)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(classify)?;
            rows
        };
        self.tx
            .execute(sql::sqlite::PENDING_ROWS_DELETE_UNIT, [unit])
            .map_err(classify)?;
        self.tx
            .execute(sql::sqlite::PENDING_UNIT_DELETE, [unit])
            .map_err(classify)?;
        Ok(rows)
    }

    fn add_unit(
        &mut self,
        job: &str,
        epoch: Epoch,
        partitions: &[PartitionId],
        rows: &[RowMutation],
    ) -> Result<(), StoreError> {
        let list: Vec<String> = partitions.iter().map(|p| p.to_string()).collect();
        self.tx
            .execute(
                sql::sqlite::PENDING_UNIT_INSERT,
                params![job, epoch.0 as i64, list.join(",")],
            )
            .map_err(classify)?;
        let unit = self.tx.last_insert_rowid();
        let mut q = self
            .tx
            .prepare_cached(sql::sqlite::PENDING_ROWS_INSERT)
            .map_err(classify)?;
        for (seq, m) in rows.iter().enumerate() {
            let (vnode, key, value) = protocol::pending_row(m);
            q.execute(params![unit, seq as i64, vnode, key, value])
                .map_err(classify)?;
        }
        Ok(())
    }

    fn write_rows(
        &mut self,
        evolved: Option<&protocol::Evolved>,
        next: bool,
        rows: &[RowMutation],
        decoded: DecodedRows,
    ) -> Result<(), StoreError> {
        TxCommit::write(self, evolved, next, rows, decoded, false)
    }

    fn replace_tables(&mut self) -> Result<(), StoreError> {
        let names: Vec<&str> = if self.several.is_empty() {
            vec![self.table_name]
        } else {
            self.several.iter().map(|t| t.name.as_str()).collect()
        };
        for table_name in names {
            let next = next_table(table_name);
            self.tx
                .execute_batch(&sql::render(
                    sql::sqlite::TABLE_SWAP,
                    &[("table", table_name), ("next", &next)],
                ))
                .map_err(classify)?;
        }
        Ok(())
    }
}
