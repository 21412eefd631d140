//! The statements of a job's transactions in PostgreSQL (`store::transactions` is the rule): one
//! statement of `src/store/sql/postgres/` per method, inside the transaction
//! [`PostgresStore::with_tx`] opens (and replays whole after a lost connection).

use super::*;
use crate::core::Lease;
use crate::store::transactions::{TxCommit, TxJob};

/// The protocol's reads inside a PostgreSQL transaction (the job row locked `FOR UPDATE`).
impl TxRead for InTx<'_, '_> {
    fn job_row(&mut self, job: &str) -> Result<Option<JobRow>, StoreError> {
        job_row(self.tx, job, true)
    }

    fn leases(
        &mut self,
        job: &str,
        partitions: &[PartitionId],
    ) -> Result<BTreeMap<PartitionId, (String, Lease)>, StoreError> {
        let ps: Vec<i32> = partitions.iter().map(|p| *p as i32).collect();
        Ok(self
            .tx
            .query(sql::postgres::LEASES_READ, &[&job, &ps])
            .map_err(classify)?
            .into_iter()
            .map(|r| {
                (
                    r.get::<_, i32>(0) as PartitionId,
                    (r.get(1), Lease(r.get::<_, i64>(2) as u64)),
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

    fn insert_job(&mut self, job: &str, info: &SnapshotInfo) -> Result<JobRow, StoreError> {
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
        job_row(self.tx, job, false)?.ok_or_else(|| StoreError::NoJob { job: job.into() })
    }

    fn pending_unit_count(&mut self, job: &str) -> Result<i64, StoreError> {
        Ok(self
            .tx
            .query_one(sql::postgres::PENDING_UNIT_COUNT, &[&job])
            .map_err(classify)?
            .get(0))
    }

    fn next_lease(&mut self, job: &str) -> Result<Lease, StoreError> {
        Ok(Lease(
            self.tx
                .query_one(sql::postgres::NEXT_LEASE, &[&job])
                .map_err(classify)?
                .get::<_, i64>(0) as u64,
        ))
    }

    fn write_lease(
        &mut self,
        job: &str,
        partition: PartitionId,
        worker: &str,
        lease: Lease,
    ) -> Result<(), StoreError> {
        self.tx
            .execute(
                sql::postgres::LEASE_WRITE,
                &[&job, &(partition as i32), &worker, &(lease.0 as i64)],
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

    fn create_next_tables(&mut self, job: &str) -> Result<(), StoreError> {
        for (name, schema) in self.schemas() {
            let versioned = self.versioned_schema(job, name, schema)?;
            let next = next_table(name);
            let visible: bool = self
                .tx
                .query_one(sql::postgres::TABLE_EXISTS, &[&name])
                .map_err(classify)?
                .get(0);
            let schema = versioned.as_ref().unwrap_or(schema);
            let ddl = if visible {
                sql::render(
                    sql::postgres::TABLE_NEXT_CREATE,
                    &[("next", &next), ("table", name)],
                )
            } else {
                // A table added to a job of several: readers see none of it before this
                // generation is published.
                sql::render(
                    sql::postgres::TABLE_NEXT_CREATE_FRESH,
                    &[
                        ("next", &next),
                        ("columns", &schema.column_ddl(ColumnType::postgres)),
                    ],
                )
            };
            self.tx.batch_execute(&ddl).map_err(classify)?;
            if let (true, Some(versioned)) = (visible, &versioned) {
                // Like the visible table (its key layout), with the columns of the recorded
                // version, which the visible table lags while an earlier generation was building.
                self.versioned_columns(&next, versioned)?;
            }
        }
        Ok(())
    }

    fn create_missing_tables(&mut self) -> Result<(), StoreError> {
        for (name, schema) in self.schemas() {
            self.tx
                .batch_execute(&sql::render(
                    sql::postgres::TABLE_CREATE,
                    &[
                        ("before", ""),
                        ("table", name),
                        ("columns", &schema.column_ddl(ColumnType::postgres)),
                    ],
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

impl TxCommit for InTx<'_, '_> {
    fn record_dead_letters(&mut self, job: &str, cp: &Checkpoint) -> Result<u64, StoreError> {
        // Commits that record dead letters take the job row in turn, so the cap is exact
        // across workers; a record read again after a recreation is recorded once.
        self.tx
            .execute(sql::postgres::JOB_LOCK, &[&job])
            .map_err(classify)?;
        let generation = cp.generation.0 as i64;
        for d in &cp.dead_letters {
            self.tx
                .execute(
                    sql::postgres::DEAD_LETTER_INSERT,
                    &[
                        &job,
                        &(d.partition as i32),
                        &(d.offset as i64),
                        &(d.epoch.0 as i64),
                        &generation,
                        &d.reason,
                    ],
                )
                .map_err(classify)?;
        }
        let recorded: i64 = self
            .tx
            .query_one(sql::postgres::DEAD_LETTER_COUNT, &[&job])
            .map_err(classify)?
            .get(0);
        Ok(recorded as u64)
    }

    fn write(
        &mut self,
        evolved: Option<&protocol::Evolved>,
        next: bool,
        rows: &[RowMutation],
        decoded: DecodedRows,
        snapshot: bool,
    ) -> Result<(), StoreError> {
        // A job of several tables whose tables changed schema: each one's schema now, its key
        // layout as it was.
        let changed = evolved.filter(|e| !e.tables.is_empty()).map(|e| Several {
            tables: e.tables.clone(),
            layouts: self.several.layouts.clone(),
        });
        let to = Target {
            table: evolved.map_or(self.table, |e| &e.table),
            table_name: self.table_name,
            layout: self.layout,
            several: changed.as_ref().unwrap_or(self.several),
            next,
        };
        to.write(self.tx, rows, decoded, snapshot)
    }

    fn write_progress(&mut self, job: &str, cp: &Checkpoint) -> Result<(), StoreError> {
        if !cp.vnodes.is_empty() {
            let vnodes: Vec<i32> = cp.vnodes.iter().map(|v| v.vnode as i32).collect();
            let epochs: Vec<i64> = cp.vnodes.iter().map(|v| v.epoch.0 as i64).collect();
            let counts: Vec<i64> = cp.vnodes.iter().map(|v| v.row_count as i64).collect();
            let finished: Vec<bool> = cp.vnodes.iter().map(|v| v.finished).collect();
            let cursors: Vec<Option<Vec<u8>>> =
                cp.vnodes.iter().map(|v| v.cursor.clone()).collect();
            self.tx
                .execute(
                    sql::postgres::VNODE_PROGRESS_WRITE,
                    &[&job, &vnodes, &epochs, &counts, &finished, &cursors],
                )
                .map_err(classify)?;
        }
        for p in &cp.partitions {
            self.tx
                .execute(
                    sql::postgres::PARTITION_PROGRESS_WRITE,
                    &[
                        &job,
                        &(p.partition as i32),
                        &(p.next_offset as i64),
                        &(p.epoch.0 as i64),
                        &p.streaming,
                    ],
                )
                .map_err(classify)?;
        }
        if !cp.partitions.is_empty() {
            self.tx
                .execute(&crate::ports::job_phase_sql("streaming", "$1"), &[&job])
                .map_err(classify)?;
        }
        Ok(())
    }
}

impl<'a> InTx<'a, '_> {
    /// Table `name` given exactly `schema`'s typed columns: the missing added, the others dropped.
    fn versioned_columns(&mut self, name: &str, schema: &TableSchema) -> Result<(), StoreError> {
        let have: Vec<String> = self
            .tx
            .query(sql::postgres::TABLE_COLUMN_NAMES, &[&name])
            .map_err(classify)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        for c in schema.columns.iter().filter(|c| !have.contains(&c.name)) {
            self.tx
                .batch_execute(&sql::render(
                    sql::postgres::COLUMN_ADD,
                    &[
                        ("table", name),
                        ("column", &c.name),
                        ("type", c.ty.postgres()),
                    ],
                ))
                .map_err(classify)?;
        }
        for c in have
            .iter()
            .filter(|c| !c.starts_with("_kb_") && !schema.columns.iter().any(|s| &s.name == *c))
        {
            self.tx
                .batch_execute(&sql::render(
                    sql::postgres::COLUMN_DROP,
                    &[("table", name), ("column", c)],
                ))
                .map_err(classify)?;
        }
        Ok(())
    }

    /// The job's table `name` (of `schema` as opened) at its recorded schema version, if it has
    /// one.
    fn versioned_schema(
        &mut self,
        job: &str,
        name: &str,
        schema: &TableSchema,
    ) -> Result<Option<TableSchema>, StoreError> {
        let key = protocol::history_key(job, (!self.several.is_empty()).then_some(name));
        self.tx
            .query_opt(sql::postgres::SCHEMA_VERSION_ROW_SCHEMA, &[&key])
            .map_err(classify)?
            .map(|r| protocol::recorded_schema(job, &r.get::<_, String>(0), schema))
            .transpose()
    }

    /// Each of the job's tables with its schema.
    fn schemas(&self) -> Vec<(&'a str, &'a TableSchema)> {
        let several: &'a Several = self.several;
        if several.is_empty() {
            vec![(self.table_name, self.table)]
        } else {
            several
                .tables
                .iter()
                .map(|t| (t.name.as_str(), &t.schema))
                .collect()
        }
    }
}
