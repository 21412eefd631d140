//! Publication's primitives inside a PostgreSQL commit (`consistency = "epoch"`: the replica
//! readers see moves by whole epochs; `protocol::publish` is the rule).

use super::*;
use crate::store::transactions::TxCommit;

/// `kb_publication`'s row of a job.
pub(super) fn read_publication(
    tx: &mut Transaction<'_>,
    job: &str,
) -> Result<Publication, StoreError> {
    let epoch = |v: Option<i64>| v.map(|e| Epoch(e as u64));
    Ok(tx
        .query_opt(sql::postgres::PUBLICATION_READ, &[&job])
        .map_err(classify)?
        .map(|r| Publication {
            published: epoch(r.get(0)),
            visible: epoch(r.get(1)),
        })
        .unwrap_or_default())
}

pub(super) fn write_publication(
    tx: &mut Transaction<'_>,
    job: &str,
    p: &Publication,
) -> Result<(), StoreError> {
    tx.execute(
        sql::postgres::PUBLICATION_WRITE,
        &[
            &job,
            &p.published.map(|e| e.0 as i64),
            &p.visible.map(|e| e.0 as i64),
        ],
    )
    .map_err(classify)?;
    Ok(())
}

/// Publication's primitives inside a PostgreSQL transaction (`protocol::publish` is the rule).
pub(super) struct InTx<'a, 'b> {
    pub(super) tx: &'a mut Transaction<'b>,
    pub(super) table: &'a TableSchema,
    pub(super) table_name: &'a str,
    pub(super) layout: KeyLayout,
    pub(super) several: &'a Several,
}

/// Where a commit's rows go: the job's table, or a several-table job's tables, each one's
/// [`next_table`] when `next`.
pub(super) struct Target<'a> {
    pub(super) table: &'a TableSchema,
    pub(super) table_name: &'a str,
    pub(super) layout: KeyLayout,
    pub(super) several: &'a Several,
    pub(super) next: bool,
}

impl Target<'_> {
    pub(super) fn name(&self, table_name: &str) -> String {
        protocol::table_in(table_name, self.next)
    }

    /// [`write_rows`] into the job's table, or each row into its own table of several.
    pub(super) fn write(
        &self,
        tx: &mut Transaction<'_>,
        rows: &[RowMutation],
        decoded: DecodedRows,
        snapshot: bool,
    ) -> Result<(), StoreError> {
        if self.several.is_empty() {
            let name = self.name(self.table_name);
            let rows = row_refs(rows);
            return write_rows(tx, self.table, &name, self.layout, rows, decoded, snapshot);
        }
        let routed = split_rows(&self.several.tables, rows, decoded)?;
        for ((t, rows, decoded), layout) in routed.into_iter().zip(&self.several.layouts) {
            if !rows.is_empty() {
                let name = self.name(&t.name);
                write_rows(tx, &t.schema, &name, *layout, rows, decoded, snapshot)
                    .map_err(|e| in_table(e, &t.name))?;
            }
        }
        Ok(())
    }
}

impl protocol::TxPublish for InTx<'_, '_> {
    /// Commits of several workers run concurrently here, and each must see every unit committed
    /// before it, or two commits completing the same epoch would each miss the other's unit and
    /// leave it unpublished: the job's `kb_publication` row is taken first (`FOR UPDATE`), and
    /// every later statement of this transaction sees what committed before it was granted.
    fn lock_publication(&mut self, job: &str) -> Result<(), StoreError> {
        self.tx
            .execute(sql::postgres::PUBLICATION_ENSURE, &[&job])
            .map_err(classify)?;
        self.tx
            .execute(sql::postgres::PUBLICATION_LOCK, &[&job])
            .map_err(classify)?;
        Ok(())
    }

    fn publication(&mut self, job: &str) -> Result<Publication, StoreError> {
        read_publication(self.tx, job)
    }

    fn set_publication(&mut self, job: &str, p: &Publication) -> Result<(), StoreError> {
        write_publication(self.tx, job, p)
    }

    fn pending_units(&mut self, job: &str) -> Result<Vec<protocol::PendingUnit>, StoreError> {
        Ok(self
            .tx
            .query(sql::postgres::PENDING_UNITS, &[&job])
            .map_err(classify)?
            .iter()
            .map(|r| {
                let ps: Vec<i32> = r.get(2);
                (
                    r.get(0),
                    Epoch(r.get::<_, i64>(1) as u64),
                    ps.into_iter().map(|p| p as PartitionId).collect(),
                )
            })
            .collect())
    }

    fn take_unit(&mut self, unit: i64) -> Result<Vec<RowMutation>, StoreError> {
        let rows = self
            .tx
            .query(sql::postgres::PENDING_ROWS, &[&unit])
            .map_err(classify)?
            .iter()
            .map(|r| protocol::pending_mutation(r.get(0), r.get(1), r.get(2)))
            .collect();
        self.tx
            .execute(sql::postgres::PENDING_ROWS_DELETE_UNIT, &[&unit])
            .map_err(classify)?;
        self.tx
            .execute(sql::postgres::PENDING_UNIT_DELETE, &[&unit])
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
        let unit: i64 = self
            .tx
            .query_one(
                sql::postgres::PENDING_UNIT_INSERT,
                &[
                    &job,
                    &(epoch.0 as i64),
                    &partitions.iter().map(|p| *p as i32).collect::<Vec<i32>>(),
                ],
            )
            .map_err(classify)?
            .get(0);
        let seqs: Vec<i32> = (0..rows.len() as i32).collect();
        let mut vnodes: Vec<i32> = Vec::with_capacity(rows.len());
        let mut keys: Vec<&[u8]> = Vec::with_capacity(rows.len());
        let mut values: Vec<Option<&[u8]>> = Vec::with_capacity(rows.len());
        for m in rows {
            let (v, k, r) = protocol::pending_row(m);
            vnodes.push(v);
            keys.push(k);
            values.push(r);
        }
        self.tx
            .execute(
                sql::postgres::PENDING_ROWS_INSERT,
                &[&unit, &seqs, &vnodes, &keys, &values],
            )
            .map_err(classify)?;
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
        for table_name in self.several.names(self.table_name) {
            let next = next_table(table_name);
            self.tx
                .batch_execute(&sql::render(
                    sql::postgres::TABLE_SWAP,
                    &[("table", table_name), ("next", &next)],
                ))
                .map_err(classify)?;
        }
        Ok(())
    }
}
