//! The statements of a job's transactions in PostgreSQL (`store::transactions` is the rule): one
//! statement of `src/store/sql/postgres/` per method, inside the transaction
//! [`PostgresStore::with_tx`] opens (and replays whole after a lost connection).

use super::*;
use crate::store::transactions::TxJob;

/// The protocol's reads inside a PostgreSQL transaction (the job row locked `FOR UPDATE`).
impl TxRead for InTx<'_, '_> {
    fn job_row(&mut self, job: &str) -> Result<Option<JobRow>, StoreError> {
        job_row(self.tx, job, true)
    }

    fn leases(
        &mut self,
        job: &str,
        partitions: &[PartitionId],
    ) -> Result<BTreeMap<PartitionId, (String, u64)>, StoreError> {
        let ps: Vec<i32> = partitions.iter().map(|p| *p as i32).collect();
        Ok(self
            .tx
            .query(sql::postgres::LEASES_READ, &[&job, &ps])
            .map_err(classify)?
            .into_iter()
            .map(|r| {
                (
                    r.get::<_, i32>(0) as PartitionId,
                    (r.get(1), r.get::<_, i64>(2) as u64),
                )
            })
            .collect())
    }

    fn vnodes(
        &mut self,
        job: &str,
        vnodes: &[Vnode],
    ) -> Result<BTreeMap<Vnode, VnodeProgress>, StoreError> {
        let vs: Vec<i32> = vnodes.iter().map(|v| *v as i32).collect();
        vnode_rows(self.tx, job, Some(&vs))
    }
}

impl TxJob for InTx<'_, '_> {
    fn lock_jobs(&mut self) -> Result<(), StoreError> {
        self.tx
            .execute(sql::postgres::JOBS_LOCK, &[])
            .map_err(classify)?;
        Ok(())
    }

    fn table_name(&self) -> &str {
        self.table_name
    }

    fn table_names(&self) -> Vec<String> {
        self.several
            .names(self.table_name)
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    fn configured_tables(&self) -> Vec<(String, u16)> {
        self.several
            .tables
            .iter()
            .map(|t| (t.name.clone(), t.index))
            .collect()
    }

    fn table_owners(&mut self, table: &str) -> Result<Vec<String>, StoreError> {
        Ok(self
            .tx
            .query(sql::postgres::TABLE_OWNERS, &[&table])
            .map_err(classify)?
            .iter()
            .map(|r| r.get(0))
            .collect())
    }

    fn job_table_name(&mut self, job: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .tx
            .query_opt(sql::postgres::JOB_TABLE_NAME, &[&job])
            .map_err(classify)?
            .map(|r| r.get(0)))
    }

    fn job_tables(&mut self, job: &str) -> Result<Vec<(String, u16)>, StoreError> {
        Ok(self
            .tx
            .query(sql::postgres::JOB_TABLES, &[&job])
            .map_err(classify)?
            .iter()
            .map(|r| (r.get(0), r.get::<_, i32>(1) as u16))
            .collect())
    }

    fn insert_job_table(&mut self, table: &str, job: &str, index: u16) -> Result<(), StoreError> {
        self.tx
            .execute(
                sql::postgres::JOB_TABLE_INSERT,
                &[&table, &job, &(index as i32)],
            )
            .map_err(classify)?;
        Ok(())
    }

    fn insert_job(&mut self, job: &str, info: &SnapshotInfo) -> Result<(), StoreError> {
        self.tx
            .execute(
                sql::postgres::JOB_INSERT,
                &[
                    &job,
                    &(info.snapshot_epoch.0 as i64),
                    &(info.vnode_count as i32),
                    &(info.partition_count as i32),
                    &self.table_name,
                ],
            )
            .map_err(classify)?;
        Ok(())
    }

    fn pending_unit_count(&mut self, job: &str) -> Result<i64, StoreError> {
        Ok(self
            .tx
            .query_one(sql::postgres::PENDING_UNIT_COUNT, &[&job])
            .map_err(classify)?
            .get(0))
    }

    fn next_lease(&mut self, job: &str) -> Result<u64, StoreError> {
        Ok(self
            .tx
            .query_one(sql::postgres::NEXT_LEASE, &[&job])
            .map_err(classify)?
            .get::<_, i64>(0) as u64)
    }

    fn write_lease(
        &mut self,
        job: &str,
        partition: PartitionId,
        worker: &str,
        lease: u64,
    ) -> Result<(), StoreError> {
        self.tx
            .execute(
                sql::postgres::LEASE_WRITE,
                &[&job, &(partition as i32), &worker, &(lease as i64)],
            )
            .map_err(classify)?;
        Ok(())
    }

    fn partition_progress(
        &mut self,
        job: &str,
        partition: PartitionId,
    ) -> Result<Option<PartitionProgress>, StoreError> {
        Ok(self
            .tx
            .query_opt(
                sql::postgres::PARTITION_PROGRESS_READ,
                &[&job, &(partition as i32)],
            )
            .map_err(classify)?
            .map(|r| PartitionProgress {
                partition,
                next_offset: r.get::<_, i64>(0) as u64,
                epoch: Epoch(r.get::<_, i64>(1) as u64),
                streaming: r.get(2),
            }))
    }

    fn next_generation(&mut self, job: &str) -> Result<(), StoreError> {
        self.tx
            .execute(sql::postgres::JOB_RECREATE, &[&job])
            .map_err(classify)?;
        Ok(())
    }

    fn move_snapshot(&mut self, job: &str, epoch: Epoch) -> Result<(), StoreError> {
        self.tx
            .execute(sql::postgres::JOB_SNAPSHOT_MOVE, &[&job, &(epoch.0 as i64)])
            .map_err(classify)?;
        Ok(())
    }

    fn delete_job_work(&mut self, job: &str) -> Result<(), StoreError> {
        for delete in [
            sql::postgres::VNODE_PROGRESS_DELETE_JOB,
            sql::postgres::PARTITION_PROGRESS_DELETE_JOB,
            sql::postgres::LEASES_DELETE_JOB,
            sql::postgres::PENDING_ROWS_DELETE_JOB,
            sql::postgres::PENDING_UNITS_DELETE_JOB,
        ] {
            self.tx.execute(delete, &[&job]).map_err(classify)?;
        }
        Ok(())
    }

    fn create_next_tables(&mut self) -> Result<(), StoreError> {
        for name in self.table_names() {
            let next = next_table(&name);
            self.tx
                .batch_execute(&sql::render(
                    sql::postgres::TABLE_NEXT_CREATE,
                    &[("next", &next), ("table", &name)],
                ))
                .map_err(classify)?;
        }
        Ok(())
    }

    fn clear_tables(&mut self) -> Result<(), StoreError> {
        for name in self.table_names() {
            self.tx
                .execute(
                    &sql::render(sql::postgres::TABLE_CLEAR, &[("table", &name)]),
                    &[],
                )
                .map_err(classify)?;
        }
        Ok(())
    }

    fn delete_publication(&mut self, job: &str) -> Result<(), StoreError> {
        self.tx
            .execute(sql::postgres::PUBLICATION_DELETE, &[&job])
            .map_err(classify)?;
        Ok(())
    }
}
