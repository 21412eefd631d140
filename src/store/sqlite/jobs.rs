//! The statements of a job's transactions in SQLite (`store::transactions` is the rule): one
//! statement of `src/store/sql/sqlite/` per method, inside the store's `IMMEDIATE` transaction.

use super::*;
use crate::core::Lease;
use crate::store::transactions::{TxCommit, TxJob};

/// The protocol's reads inside a SQLite transaction.
impl TxRead for InTx<'_> {
    fn job_row(&mut self, job: &str) -> Result<Option<JobRow>, StoreError> {
        SqliteStore::job_row(self.tx, job)
    }

    fn leases(
        &mut self,
        job: &str,
        partitions: &[PartitionId],
    ) -> Result<BTreeMap<PartitionId, (String, Lease)>, StoreError> {
        let mut q = self
            .tx
            .prepare_cached(sql::sqlite::LEASE_READ)
            .map_err(classify)?;
        let mut out = BTreeMap::new();
        for &p in partitions {
            let found: Option<(String, i64)> = q
                .query_row(params![job, p], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
                .map_err(classify)?;
            if let Some((owner, lease)) = found {
                out.insert(p, (owner, Lease(lease as u64)));
            }
        }
        Ok(out)
    }

    fn vnodes(
        &mut self,
        job: &str,
        vnodes: &[Vnode],
    ) -> Result<BTreeMap<Vnode, VnodeProgress>, StoreError> {
        SqliteStore::vnode_rows(self.tx, job, vnodes.iter().copied())
    }
}

impl TxJob for InTx<'_> {
    fn lock_jobs(&mut self) -> Result<(), StoreError> {
        // The transaction is `IMMEDIATE`: the file's one writer already.
        Ok(())
    }

    fn table_name(&self) -> &str {
        self.table_name
    }

    fn table_names(&self) -> Vec<String> {
        if self.several.is_empty() {
            vec![self.table_name.to_string()]
        } else {
            self.several.iter().map(|t| t.name.clone()).collect()
        }
    }

    fn configured_tables(&self) -> Vec<(String, u16)> {
        self.several
            .iter()
            .map(|t| (t.name.clone(), t.index))
            .collect()
    }

    fn table_owners(&mut self, table: &str) -> Result<Vec<String>, StoreError> {
        self.tx
            .prepare_cached(sql::sqlite::TABLE_OWNERS)
            .and_then(|mut q| {
                q.query_map([table], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<String>, _>>()
            })
            .map_err(classify)
    }

    fn job_table_name(&mut self, job: &str) -> Result<Option<String>, StoreError> {
        self.tx
            .query_row(sql::sqlite::JOB_TABLE_NAME, [job], |r| r.get(0))
            .optional()
            .map_err(classify)
    }

    fn job_tables(&mut self, job: &str) -> Result<Vec<(String, u16)>, StoreError> {
        self.tx
            .prepare_cached(sql::sqlite::JOB_TABLES)
            .and_then(|mut q| {
                q.query_map([job], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u16>(1)?)))?
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(classify)
    }

    fn insert_job_table(&mut self, table: &str, job: &str, index: u16) -> Result<(), StoreError> {
        self.tx
            .execute(sql::sqlite::JOB_TABLE_INSERT, params![table, job, index])
            .map_err(classify)?;
        Ok(())
    }

    fn insert_job(&mut self, job: &str, info: &SnapshotInfo) -> Result<JobRow, StoreError> {
        self.tx
            .execute(
                sql::sqlite::JOB_INSERT,
                params![
                    job,
                    info.snapshot_epoch.0 as i64,
                    info.vnode_count,
                    info.partition_count,
                    self.table_name
                ],
            )
            .map_err(classify)?;
        SqliteStore::job_row(self.tx, job)?.ok_or_else(|| StoreError::NoJob { job: job.into() })
    }

    fn pending_unit_count(&mut self, job: &str) -> Result<i64, StoreError> {
        self.tx
            .query_row(sql::sqlite::PENDING_UNIT_COUNT, [job], |r| r.get(0))
            .map_err(classify)
    }

    fn next_lease(&mut self, job: &str) -> Result<Lease, StoreError> {
        self.tx
            .query_row(sql::sqlite::NEXT_LEASE, [job], |r| r.get::<_, i64>(0))
            .map(|l| Lease(l as u64))
            .map_err(classify)
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
                sql::sqlite::LEASE_WRITE,
                params![job, partition, worker, lease.0 as i64],
            )
            .map_err(classify)?;
        Ok(())
    }

    fn partition_progress(
        &mut self,
        job: &str,
        partition: PartitionId,
    ) -> Result<Option<PartitionProgress>, StoreError> {
        self.tx
            .query_row(
                sql::sqlite::PARTITION_PROGRESS_READ,
                params![job, partition],
                |r| {
                    Ok(PartitionProgress {
                        partition,
                        next_offset: r.get::<_, i64>(0)? as u64,
                        epoch: Epoch(r.get::<_, i64>(1)? as u64),
                        streaming: r.get::<_, i64>(2)? != 0,
                    })
                },
            )
            .optional()
            .map_err(classify)
    }

    fn next_generation(&mut self, job: &str) -> Result<(), StoreError> {
        self.tx
            .execute(sql::sqlite::JOB_RECREATE, [job])
            .map_err(classify)?;
        Ok(())
    }

    fn move_snapshot(&mut self, job: &str, epoch: Epoch) -> Result<(), StoreError> {
        self.tx
            .execute(sql::sqlite::JOB_SNAPSHOT_MOVE, params![job, epoch.0 as i64])
            .map_err(classify)?;
        Ok(())
    }

    fn delete_job_work(&mut self, job: &str) -> Result<(), StoreError> {
        for delete in [
            sql::sqlite::VNODE_PROGRESS_DELETE_JOB,
            sql::sqlite::PARTITION_PROGRESS_DELETE_JOB,
            sql::sqlite::LEASES_DELETE_JOB,
            sql::sqlite::PENDING_ROWS_DELETE_JOB,
            sql::sqlite::PENDING_UNITS_DELETE_JOB,
        ] {
            self.tx.execute(delete, [job]).map_err(classify)?;
        }
        Ok(())
    }

    fn create_next_tables(&mut self, job: &str) -> Result<(), StoreError> {
        for (name, schema) in self.schemas() {
            let versioned = self.versioned_schema(job, name, schema)?;
            let schema = versioned.as_ref().unwrap_or(schema);
            let next = next_table(name);
            self.tx
                .execute_batch(&format!(
                    "{} {}",
                    sql::render(sql::sqlite::TABLE_DROP, &[("table", &next)]),
                    table_ddl(&next, schema, self.datum)
                ))
                .map_err(classify)?;
        }
        Ok(())
    }

    fn create_missing_tables(&mut self) -> Result<(), StoreError> {
        for (name, schema) in self.schemas() {
            self.tx
                .execute_batch(&table_ddl(name, schema, self.datum))
                .map_err(classify)?;
        }
        Ok(())
    }

    fn clear_tables(&mut self) -> Result<(), StoreError> {
        for name in self.table_names() {
            self.tx
                .execute(
                    &sql::render(sql::sqlite::TABLE_CLEAR, &[("table", &name)]),
                    [],
                )
                .map_err(classify)?;
        }
        Ok(())
    }

    fn delete_publication(&mut self, job: &str) -> Result<(), StoreError> {
        self.tx
            .execute(sql::sqlite::PUBLICATION_DELETE, [job])
            .map_err(classify)?;
        Ok(())
    }
}

impl TxCommit for InTx<'_> {
    fn record_dead_letters(&mut self, job: &str, cp: &Checkpoint) -> Result<u64, StoreError> {
        let mut dq = self
            .tx
            .prepare_cached(sql::sqlite::DEAD_LETTER_INSERT)
            .map_err(classify)?;
        for d in &cp.dead_letters {
            dq.execute(params![
                job,
                d.partition,
                d.offset as i64,
                d.epoch.0 as i64,
                cp.generation.0 as i64,
                d.reason
            ])
            .map_err(classify)?;
        }
        let recorded: i64 = self
            .tx
            .query_row(sql::sqlite::DEAD_LETTER_COUNT, [job], |r| r.get(0))
            .map_err(classify)?;
        Ok(recorded as u64)
    }

    fn write(
        &mut self,
        evolved: Option<&protocol::Evolved>,
        next: bool,
        rows: &[RowMutation],
        decoded: DecodedRows,
        _snapshot: bool,
    ) -> Result<(), StoreError> {
        let (table, several) = match evolved {
            Some(e) if !e.tables.is_empty() => (self.table, e.tables.as_slice()),
            Some(e) => (&e.table, self.several),
            None => (self.table, self.several),
        };
        SqliteStore::write_to(
            self.tx,
            table,
            self.table_name,
            several,
            self.datum,
            next,
            rows,
            decoded,
        )
    }

    fn write_progress(&mut self, job: &str, cp: &Checkpoint) -> Result<(), StoreError> {
        {
            let mut vq = self
                .tx
                .prepare_cached(sql::sqlite::VNODE_PROGRESS_WRITE)
                .map_err(classify)?;
            for v in &cp.vnodes {
                vq.execute(params![
                    job,
                    v.vnode,
                    v.epoch.0 as i64,
                    v.row_count as i64,
                    v.finished as i64,
                    v.cursor
                ])
                .map_err(classify)?;
            }
            let mut pq = self
                .tx
                .prepare_cached(sql::sqlite::PARTITION_PROGRESS_WRITE)
                .map_err(classify)?;
            for p in &cp.partitions {
                pq.execute(params![
                    job,
                    p.partition,
                    p.next_offset as i64,
                    p.epoch.0 as i64,
                    p.streaming as i64
                ])
                .map_err(classify)?;
            }
        }
        if !cp.partitions.is_empty() {
            self.tx
                .execute(&crate::ports::job_phase_sql("streaming = 1", "?1"), [job])
                .map_err(classify)?;
        }
        Ok(())
    }
}

impl<'a> InTx<'a> {
    /// The job's table `name` (of `schema` as opened) at its recorded schema version, if it has
    /// one.
    fn versioned_schema(
        &self,
        job: &str,
        name: &str,
        schema: &TableSchema,
    ) -> Result<Option<TableSchema>, StoreError> {
        let key = protocol::history_key(job, (!self.several.is_empty()).then_some(name));
        let json: Option<String> = self
            .tx
            .query_row(sql::sqlite::SCHEMA_VERSION_ROW_SCHEMA, [&key], |r| r.get(0))
            .optional()
            .map_err(classify)?;
        json.map(|j| protocol::recorded_schema(job, &j, schema))
            .transpose()
    }

    /// Each of the job's tables with its schema.
    fn schemas(&self) -> Vec<(&'a str, &'a TableSchema)> {
        let several: &'a [StoreTable] = self.several;
        if several.is_empty() {
            vec![(self.table_name, self.table)]
        } else {
            several
                .iter()
                .map(|t| (t.name.as_str(), &t.schema))
                .collect()
        }
    }
}
