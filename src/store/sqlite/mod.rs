//! The embedded state store: one SQLite file (WAL) holding, per job, the materialised table as a real
//! SQL table plus the job, vnode-progress, partition-progress and lease tables. One checkpoint is one
//! `BEGIN IMMEDIATE` transaction that first runs the store protocol's checks (generation, every lease,
//! the checkpoint against committed progress: `store::protocol`), so a stale worker's commit changes
//! nothing.
//!
//! Owns SQL and type mapping and the protocol's primitives; decides nothing about progress (the core
//! does) and no rule of its own (the protocol does).
//!
//! Here: the store and its transactions; `values.rs` the column values' mapping, `checkpointer.rs`
//! the WAL checkpointer and its commit gate, `schema.rs` a schema change's primitives,
//! `publication.rs` publication's (`consistency = "epoch"`).

use crate::core::Generation;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::codec::versions::{Evolution, RowVersion};
use crate::codec::{ColumnValue, DirectValue, TableSchema};
use crate::core::{
    Checkpoint, ClaimedPartition, Epoch, PartitionId, PartitionProgress, RateLimits, RowMutation,
    Vnode, VnodeProgress,
};
use crate::ports::{
    row_columns, DeadLetterRow, DecodedRows, JobRow, SnapshotInfo, StateStore, StoreError,
};
use crate::store::protocol::{self, next_table, Publication, TxRead};
use crate::store::sql;
use crate::store::sqlite_static::{Param, StaticStatement};
use crate::store::transactions;
use crate::store::{in_table, row_refs, split_rows, RowRef, StoreTable};

const SCHEMA: &str = sql::sqlite::SCHEMA;

/// Sorts a SQLite error into transient (busy, locked, I/O, full disk: a retry can succeed) and
/// permanent (a constraint, a type, a malformed statement: it cannot).
fn classify(e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode as C;
    match &e {
        rusqlite::Error::SqliteFailure(f, _)
            if matches!(
                f.code,
                C::DatabaseBusy
                    | C::DatabaseLocked
                    | C::SystemIoFailure
                    | C::DiskFull
                    | C::CannotOpen
                    | C::OutOfMemory
                    | C::FileLockingProtocolFailed
            ) =>
        {
            StoreError::backend_from(e.to_string(), e)
        }
        _ => StoreError::rejected_from(e.to_string(), e),
    }
}

mod checkpointer;
mod jobs;
mod publication;
mod schema;
mod values;

use checkpointer::*;
use publication::*;

use values::*;

/// The page cache of a store connection, in KiB (SQLite's `cache_size` takes a negative number for
/// KiB): large enough that a table of a few hundred MiB keeps its inner B-tree pages cached, so a
/// commit does not re-read them (the default 2 MiB cache made `pread` a sixth of the replay's CPU).
/// Pages are allocated only as they are touched.
pub(super) const CACHE_KIB: i64 = 64 * 1024;

/// The WAL size (64 MiB, in the file's pages) past which the checkpointer stops being polite. A
/// passive checkpoint never waits for the writer, and SQLite starts the WAL over only when a write
/// begins after a checkpoint has copied every frame; under continuous commits that never happens, so
/// past this size the checkpointer closes the commit gate ([`Checkpointer`]) and runs a `TRUNCATE`
/// checkpoint, holding the next commit back while it copies the frames the passive ones left.
pub(super) const WAL_RESTART_BYTES: i64 = 64 << 20;

/// The page size of a file this store creates (SQLite's largest; its default is 4 KiB). A snapshot
/// phase appends each vnode's rows in key order and a log-store checkpoint rewrites rows all over
/// the table: both measured faster with 64 KiB pages — fewer B-tree levels and page splits, fewer
/// pages per commit — on tables of 77k and 1M rows (docs/BENCHMARKS.md, "SQLite pages of 64 KiB").
/// A file that exists keeps the page size it has (SQLite changes it in WAL mode only by rebuilding
/// the file), so a store of an earlier release opens as it was.
pub(super) const PAGE_SIZE: i64 = 64 * 1024;

/// The materialised table's `CREATE TABLE IF NOT EXISTS`.
pub(super) fn table_ddl(table_name: &str, table: &TableSchema, datum: bool) -> String {
    sql::render(
        sql::sqlite::TABLE_CREATE,
        &[
            ("table", table_name),
            (
                "columns",
                &table.column_ddl(crate::codec::ColumnType::sqlite),
            ),
            ("datum", if datum { ", _kb_row BLOB NOT NULL" } else { "" }),
        ],
    )
}

/// A SQLite state store for one job's table.
pub struct SqliteStore {
    conn: Connection,
    table: TableSchema,
    table_name: String,
    /// The table has a `_kb_row` column holding each row's datum (`store_datum`, the default);
    /// without it, [`StateStore::rows`] rebuilds the datum from the typed columns.
    datum: bool,
    /// Moves WAL frames into the database file on its own thread (see [`Checkpointer`]), shared by
    /// every store of the file in this process.
    checkpointer: Arc<Checkpointer>,
    /// `consistency = "epoch"`: log-store rows are published only at an epoch every partition
    /// stands at ([`SqliteOptions::publication`]).
    publication: bool,
    /// The log's schema versions and this table's index among the log's tables (docs/WIRE.md
    /// "Schema changes"), when the log has a place for them.
    evolution: Option<(Arc<Evolution>, usize)>,
    /// A job of several tables ([`SqliteStore::open_tables`]): every table, the first of them
    /// being `table`/`table_name`; rows are keyed by (table, key). Empty for one table.
    several: Vec<StoreTable>,
}

/// How a [`SqliteStore`] is opened.
#[derive(Clone, Copy, Debug)]
pub struct SqliteOptions {
    /// Whether a new table keeps each row's datum in `_kb_row` (`store_datum`, default `true`). An
    /// existing table keeps the layout it was created with; asking for the other one is refused,
    /// saying how to move.
    pub store_datum: bool,
    /// `consistency = "epoch"` (default `false`; docs/design/several-tables.md §2): a log-store
    /// checkpoint's rows wait in `kb_pending_units`/`kb_pending_rows` until every partition of
    /// the job stands at its epoch, then are applied in that commit's transaction, and
    /// `kb_publication.published_epoch` says which upstream epoch the table is; a checkpoint whose
    /// own epoch is published at once writes its rows straight into the table.
    pub publication: bool,
    /// The WAL size in bytes past which the checkpointer restarts it (default
    /// [`WAL_RESTART_BYTES`]; tests set it small), counted in the file's pages.
    pub restart_bytes: i64,
    /// Tests only (no setting reaches it): a pause before each of the checkpointer's rounds, the
    /// slow thread of a busy machine. Zero by default.
    pub checkpoint_pause: std::time::Duration,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            store_datum: true,
            publication: false,
            restart_bytes: WAL_RESTART_BYTES,
            checkpoint_pause: std::time::Duration::ZERO,
        }
    }
}

impl SqliteStore {
    /// Opens (creating) the file and the materialised table `table_name` with the row's columns.
    /// A transient failure (the file locked by another process's schema statement) is retried
    /// under [`Backoff::STORE`](crate::core::retry::Backoff::STORE).
    pub fn open(path: &Path, table_name: &str, table: TableSchema) -> Result<Self, StoreError> {
        Self::open_with(path, table_name, table, SqliteOptions::default())
    }

    /// [`open`](Self::open) with `store_datum` ([`SqliteOptions::store_datum`]).
    pub fn open_layout(
        path: &Path,
        table_name: &str,
        table: TableSchema,
        store_datum: bool,
    ) -> Result<Self, StoreError> {
        let options = SqliteOptions {
            store_datum,
            ..SqliteOptions::default()
        };
        Self::open_with(path, table_name, table, options)
    }

    /// [`open`](Self::open) with every option.
    pub fn open_with(
        path: &Path,
        table_name: &str,
        table: TableSchema,
        options: SqliteOptions,
    ) -> Result<Self, StoreError> {
        crate::retry::retry_sleeping(
            crate::core::retry::Backoff::STORE,
            || Self::open_once(path, table_name, table.clone(), options),
            StoreError::is_transient,
        )
    }

    fn open_once(
        path: &Path,
        table_name: &str,
        table: TableSchema,
        options: SqliteOptions,
    ) -> Result<Self, StoreError> {
        let store_datum = options.store_datum;
        crate::ports::check_table_name(table_name)?;
        if !store_datum {
            if let Some((field, ty)) = table.first_composite_field() {
                return Err(StoreError::rejected(format!(
                    "store_datum = false needs a row schema of primitives and nullable primitives (each row is rebuilt from its typed columns); field {field} is {ty}: keep store_datum = true for this table"
                )));
            }
        }
        // A file that cannot be opened is a configuration error, not an outage.
        let conn = Connection::open(path)
            .map_err(|e| StoreError::rejected(format!("{}: {e}", path.display())))?;
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .map_err(classify)?;
        // Before the file's first write; a file that exists keeps its page size.
        conn.pragma_update(None, "page_size", PAGE_SIZE)
            .map_err(classify)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(classify)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(classify)?;
        conn.pragma_update(None, "cache_size", -CACHE_KIB)
            .map_err(classify)?;
        // Checkpoints run on the checkpointer's connection, never inside a commit.
        conn.pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(classify)?;
        conn.execute_batch(SCHEMA).map_err(classify)?;
        conn.execute_batch(&table_ddl(table_name, &table, store_datum))
            .map_err(classify)?;
        // The layout the table was created with (by this call or an earlier release: every table
        // before `store_datum` has `_kb_row`).
        // A table that is not one of ours (no `_kb_vnode`) is left to fail at its first write.
        let (ours, has_datum): (bool, bool) = conn
            .query_row(sql::sqlite::TABLE_HAS_COLUMNS, [table_name], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .map_err(classify)?;
        if ours && has_datum != store_datum {
            return Err(StoreError::rejected(format!(
                "table {table_name} in {} was created {} _kb_row (the row datum), and [jobs.store] store_datum = {store_datum} asks for the other layout; a table keeps its layout: set store_datum = {has_datum}, or materialise into a new table (another table name or file) with the layout you want",
                path.display(),
                if has_datum { "with" } else { "without" }
            )));
        }
        let page_size: i64 = conn
            .pragma_query_value(None, "page_size", |r| r.get(0))
            .map_err(classify)?;
        Ok(SqliteStore {
            conn,
            table,
            table_name: table_name.to_string(),
            datum: store_datum,
            checkpointer: Checkpointer::shared(
                path,
                (options.restart_bytes / page_size).max(1),
                page_size,
                options.checkpoint_pause,
            )?,
            publication: options.publication,
            evolution: None,
            several: Vec::new(),
        })
    }

    /// Opens the file for a job materialising several tables of its log (docs/design/several-tables.md
    /// §3): each of `tables` created with its row's columns and the datum (`store_datum` must be
    /// on), every checkpoint's rows routed to their tables by their (table, key) keys, all in the
    /// checkpoint's one transaction.
    pub fn open_tables(
        path: &Path,
        tables: Vec<StoreTable>,
        options: SqliteOptions,
    ) -> Result<Self, StoreError> {
        let Some(first) = tables.first() else {
            return Err(StoreError::rejected("a store of no table"));
        };
        if !options.store_datum {
            return Err(StoreError::rejected(
                "store_datum = false is not available to a job of several tables: keep store_datum = true",
            ));
        }
        // Under publication a job's tables are created together, at its first open; once one
        // exists, a table missing from the set is one added to the job, which readers see only
        // when the generation that loads it is published (`transactions::ensure_job`).
        let together = !options.publication || !path.exists() || {
            let conn = Connection::open(path)
                .map_err(|e| StoreError::rejected(format!("{}: {e}", path.display())))?;
            let mut present = false;
            for t in &tables {
                let found: i64 = conn
                    .query_row(sql::sqlite::TABLE_EXISTS, [&t.name], |r| r.get(0))
                    .map_err(classify)?;
                present |= found > 0;
            }
            !present
        };
        let mut store = Self::open_with(path, &first.name, first.schema.clone(), options)?;
        for t in &tables[1..] {
            crate::ports::check_table_name(&t.name)?;
            if together {
                store
                    .conn
                    .execute_batch(&table_ddl(&t.name, &t.schema, true))
                    .map_err(classify)?;
            }
        }
        store.several = tables;
        Ok(store)
    }

    /// Writes rows into the job's table, or routes a several-table job's rows to theirs (`next`:
    /// into each one's [`next_table`]).
    #[allow(clippy::too_many_arguments)]
    fn write_to(
        tx: &Connection,
        table: &TableSchema,
        table_name: &str,
        several: &[StoreTable],
        datum: bool,
        next: bool,
        rows: &[RowMutation],
        decoded: DecodedRows,
    ) -> Result<(), StoreError> {
        let target = |name: &str| protocol::table_in(name, next);
        if several.is_empty() {
            let name = target(table_name);
            return Self::write_rows(tx, table, &name, datum, row_refs(rows), decoded);
        }
        for (t, rows, decoded) in split_rows(several, rows, decoded)? {
            if !rows.is_empty() {
                Self::write_rows(tx, &t.schema, &target(&t.name), datum, rows, decoded)
                    .map_err(|e| in_table(e, &t.name))?;
            }
        }
        Ok(())
    }

    /// Runs one of the job's transactions (`store::transactions`) in an `IMMEDIATE` transaction,
    /// committed when it returns `Ok`.
    fn in_tx<T>(
        &mut self,
        f: impl FnOnce(&mut InTx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(classify)?;
        let out = f(&mut InTx {
            tx: &tx,
            table: &self.table,
            table_name: &self.table_name,
            several: &self.several,
            datum: self.datum,
        })?;
        tx.commit().map_err(classify)?;
        Ok(out)
    }

    /// This store, following the log's schema versions (`table`: its table's index in the log):
    /// each commit brings the table to the version in force at its epoch (docs/WIRE.md "Schema
    /// changes").
    pub fn with_evolution(mut self, evolution: Arc<Evolution>, table: usize) -> Self {
        self.evolution = Some((evolution, table));
        self
    }

    fn job_row(conn: &Connection, job: &str) -> Result<Option<JobRow>, StoreError> {
        conn.query_row(sql::sqlite::JOB_ROW, [job], |r| {
            Ok(JobRow {
                job: job.to_string(),
                snapshot_epoch: Epoch(r.get::<_, i64>(0)? as u64),
                vnode_count: r.get(1)?,
                partition_count: r.get(2)?,
                generation: crate::core::Generation(r.get::<_, i64>(3)? as u64),
                phase: r.get(4)?,
                recreations: r.get::<_, i64>(5)? as u64,
            })
        })
        .optional()
        .map_err(classify)
    }

    fn vnode_rows(
        conn: &Connection,
        job: &str,
        vnodes: impl Iterator<Item = Vnode>,
    ) -> Result<BTreeMap<Vnode, VnodeProgress>, StoreError> {
        let mut stmt = conn
            .prepare_cached(sql::sqlite::VNODE_PROGRESS_READ)
            .map_err(classify)?;
        let mut out = BTreeMap::new();
        for v in vnodes {
            let row = stmt
                .query_row(params![job, v], |r| {
                    Ok(VnodeProgress {
                        vnode: v,
                        epoch: Epoch(r.get::<_, i64>(0)? as u64),
                        row_count: r.get::<_, i64>(1)? as u64,
                        finished: r.get::<_, i64>(2)? != 0,
                        cursor: r.get(3)?,
                    })
                })
                .optional()
                .map_err(classify)?;
            if let Some(p) = row {
                out.insert(v, p);
            }
        }
        Ok(out)
    }

    /// Committed vnode progress (for status and tests).
    pub fn vnode_progress(
        &mut self,
        job: &str,
        vnode_count: u32,
    ) -> Result<BTreeMap<Vnode, VnodeProgress>, StoreError> {
        Self::vnode_rows(&self.conn, job, 0..vnode_count as Vnode)
    }

    /// Committed partition progress.
    pub fn partition_progress(
        &mut self,
        job: &str,
    ) -> Result<BTreeMap<PartitionId, PartitionProgress>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(sql::sqlite::PARTITION_PROGRESS_ALL)
            .map_err(classify)?;
        let rows = stmt
            .query_map([job], |r| {
                Ok(PartitionProgress {
                    partition: r.get(0)?,
                    next_offset: r.get::<_, i64>(1)? as u64,
                    epoch: Epoch(r.get::<_, i64>(2)? as u64),
                    streaming: r.get::<_, i64>(3)? != 0,
                })
            })
            .map_err(classify)?;
        rows.map(|r| r.map(|p| (p.partition, p)).map_err(classify))
            .collect()
    }

    /// The rows of a table without `_kb_row` (`store_datum = false`): each datum rebuilt from the
    /// typed columns.
    fn rows_from_columns(&mut self) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, StoreError> {
        let cols: Vec<String> = self
            .table
            .columns
            .iter()
            .map(|c| format!("\"{}\"", c.name))
            .collect();
        let mut stmt = self
            .conn
            .prepare(&sql::render(
                sql::sqlite::TABLE_COLUMNS,
                &[("columns", &cols.join(", ")), ("table", &self.table_name)],
            ))
            .map_err(classify)?;
        let table = &self.table;
        let mut rows = stmt.query([]).map_err(classify)?;
        let mut out = BTreeMap::new();
        while let Some(r) = rows.next().map_err(classify)? {
            let key: Vec<u8> = r.get(0).map_err(classify)?;
            let values = table
                .columns
                .iter()
                .enumerate()
                .map(|(i, c)| column_from_sqlite(c, r.get_ref(i + 1).map_err(classify)?, &key))
                .collect::<Result<Vec<_>, _>>()?;
            let datum = table.datum_of_columns(&values).map_err(|e| {
                StoreError::rejected(format!("row with key {}: {e}", crate::ports::key_hex(&key)))
            })?;
            out.insert(key, datum);
        }
        Ok(out)
    }

    /// Upserts and deletes `rows` in the table (`decoded`: their column values, decoded off the
    /// committer's thread; missing ones are decoded here).
    fn write_rows<'r>(
        tx: &Connection,
        table: &TableSchema,
        table_name: &str,
        datum: bool,
        rows: impl IntoIterator<Item = RowRef<'r>>,
        decoded: DecodedRows,
    ) -> Result<(), StoreError> {
        let mut decoded = decoded.into_iter();
        {
            let t = table_name;
            let cols: Vec<String> = table
                .columns
                .iter()
                .map(|c| format!("\"{}\"", c.name))
                .collect();
            // ?1 key, ?2 vnode, [?3 datum,] then the columns.
            let first = if datum { 4 } else { 3 };
            let marks: Vec<String> = (0..cols.len()).map(|i| format!("?{}", i + first)).collect();
            // `INSERT OR REPLACE`, measured against `ON CONFLICT DO UPDATE` (which evaluates an
            // update of every column per row): 31 vs 34 ms for 10k upserts, 108 vs 129 ms for 100k
            // (`scripts/bench.sh --only commit`).
            // Binds the key, the datum and text columns without SQLite's copy of each
            // (`sqlite_static`; prepared once per checkpoint).
            let mut upsert = StaticStatement::prepare(
                tx,
                &sql::render(
                    sql::sqlite::ROW_UPSERT,
                    &[
                        ("table", t),
                        ("datum", if datum { "_kb_row, " } else { "" }),
                        ("columns", &cols.join(", ")),
                        ("datum_mark", if datum { "?3, " } else { "" }),
                        ("marks", &marks.join(", ")),
                    ],
                ),
            )
            .map_err(classify)?;
            let mut delete = tx
                .prepare_cached(&sql::render(sql::sqlite::ROW_DELETE, &[("table", t)]))
                .map_err(classify)?;
            let truncate = sql::render(sql::sqlite::ROWS_TRUNCATE, &[("table", t)]);
            // A row's values read in place from its datum, reused from row to row: no allocation
            // per row (docs/BENCHMARKS.md "Column values read in place").
            let mut in_place: Vec<DirectValue<'r>> = Vec::with_capacity(table.columns.len());
            for (m, key) in rows {
                match m {
                    RowMutation::Upsert { vnode, row, .. } => {
                        // Bound by reference and read by SQLite in place: no copy of the key, the
                        // datum or a column value (docs/BENCHMARKS.md "SQLite binds without a copy").
                        let head = [Param::Blob(key), Param::Integer(*vnode as i64)];
                        let stored = datum.then_some(Param::Blob(row.value.as_slice()));
                        let pre = decoded.next().flatten();
                        let bound = if pre.is_none() && table.is_direct() {
                            table
                                .direct_values(&row.value, &mut in_place)
                                .map_err(|e| crate::ports::undecodable_row(key, &e.to_string()))?;
                            let columns = in_place.iter().map(|v| direct_param(*v));
                            upsert.execute(head.into_iter().chain(stored).chain(columns))
                        } else {
                            let fields = row_columns(table, key, &row.value, pre)?;
                            let columns = fields.iter().map(|v| SqliteValue(v).param());
                            upsert.execute(head.into_iter().chain(stored).chain(columns))
                        };
                        bound.map_err(|e| row_error(e, table, key))?;
                    }
                    RowMutation::Delete { vnode, .. } => {
                        decoded.next();
                        delete.execute(params![vnode, key]).map_err(classify)?;
                    }
                    // Before the vnode's rows of this table: a checkpoint's rows are in (vnode,
                    // key) order and a truncation's prefix sorts first.
                    RowMutation::Truncate { vnode, .. } => {
                        decoded.next();
                        tx.prepare_cached(&truncate)
                            .and_then(|mut q| q.execute(params![vnode]))
                            .map_err(classify)?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl StateStore for SqliteStore {
    fn ensure_job(&mut self, job: &str, info: &SnapshotInfo) -> Result<JobRow, StoreError> {
        let publication = self.publication;
        self.in_tx(|tx| transactions::ensure_job(tx, job, info, publication))
    }

    fn job(&mut self, job: &str) -> Result<Option<JobRow>, StoreError> {
        Self::job_row(&self.conn, job)
    }

    fn claim(
        &mut self,
        job: &str,
        generation: Generation,
        worker: &str,
        partitions: &[PartitionId],
        info: &SnapshotInfo,
    ) -> Result<Vec<ClaimedPartition>, StoreError> {
        self.in_tx(|tx| transactions::claim(tx, job, generation, worker, partitions, info))
    }

    fn commit_group(&mut self, job: &str, cps: &[Checkpoint]) -> Result<(), StoreError> {
        self.commit_group_decoded(job, cps, Vec::new())
    }

    fn commit_group_decoded(
        &mut self,
        job: &str,
        cps: &[Checkpoint],
        decoded: Vec<DecodedRows>,
    ) -> Result<(), StoreError> {
        self.checkpointer.gate.pass();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(classify)?;
        let versions = match &self.evolution {
            Some((ev, t)) => Some((
                ev.refresh_if_grown()
                    .map_err(|e| StoreError::rejected(e.to_string()))?,
                *t,
            )),
            None => None,
        };
        let mut in_tx = InTx {
            tx: &tx,
            table: &self.table,
            table_name: &self.table_name,
            several: &self.several,
            datum: self.datum,
        };
        transactions::commit_group(
            &mut in_tx,
            job,
            cps,
            decoded,
            versions.as_ref().map(|(v, t)| (&**v, *t)),
            self.publication,
            &self.several,
        )?;
        tx.commit().map_err(classify)?;
        self.checkpointer.committed();
        Ok(())
    }

    fn recreate_onto(
        &mut self,
        job: &str,
        from_generation: Generation,
        onto: Option<Epoch>,
    ) -> Result<JobRow, StoreError> {
        let publication = self.publication;
        self.in_tx(|tx| transactions::recreate(tx, job, from_generation, onto, publication))
    }

    fn committed_vnodes(
        &mut self,
        job: &str,
    ) -> Result<BTreeMap<Vnode, VnodeProgress>, StoreError> {
        let n: u32 = self
            .conn
            .query_row(sql::sqlite::VNODE_COUNT, [job], |r| r.get(0))
            .optional()
            .map_err(classify)?
            .unwrap_or(0);
        self.vnode_progress(job, n)
    }

    fn committed_partitions(
        &mut self,
        job: &str,
    ) -> Result<BTreeMap<PartitionId, PartitionProgress>, StoreError> {
        self.partition_progress(job)
    }

    fn rate_limits(&mut self, job: &str) -> Result<Option<RateLimits>, StoreError> {
        self.conn
            .prepare_cached(sql::sqlite::RATE_LIMITS_READ)
            .map_err(classify)?
            .query_row([job], |r| {
                Ok(RateLimits {
                    snapshot_rows_per_second: r.get::<_, i64>(0)? as u64,
                    log_records_per_second: r.get::<_, i64>(1)? as u64,
                })
            })
            .optional()
            .map_err(classify)
    }

    fn set_rate_limits(&mut self, job: &str, limits: RateLimits) -> Result<(), StoreError> {
        self.conn
            .execute(
                sql::sqlite::RATE_LIMITS_WRITE,
                params![
                    job,
                    limits.snapshot_rows_per_second as i64,
                    limits.log_records_per_second as i64
                ],
            )
            .map_err(classify)?;
        Ok(())
    }

    fn dead_letters(&mut self, job: &str) -> Result<Vec<DeadLetterRow>, StoreError> {
        let mut q = self
            .conn
            .prepare_cached(sql::sqlite::DEAD_LETTERS_READ)
            .map_err(classify)?;
        let rows = q
            .query_map([job], |r| {
                Ok(DeadLetterRow {
                    partition: r.get(0)?,
                    offset: r.get::<_, i64>(1)? as u64,
                    epoch: r.get::<_, i64>(2)? as u64,
                    generation: crate::core::Generation(r.get::<_, i64>(3)? as u64),
                    reason: r.get(4)?,
                })
            })
            .map_err(classify)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(classify)
    }

    fn paused(&mut self, job: &str) -> Result<bool, StoreError> {
        self.conn
            .prepare_cached(sql::sqlite::PAUSED_READ)
            .map_err(classify)?
            .query_row([job], |r| r.get::<_, i64>(0))
            .optional()
            .map(|p| p.is_some_and(|p| p != 0))
            .map_err(classify)
    }

    fn set_paused(&mut self, job: &str, paused: bool) -> Result<(), StoreError> {
        self.conn
            .execute(sql::sqlite::PAUSED_WRITE, params![job, paused as i64])
            .map_err(classify)?;
        Ok(())
    }

    fn owners(&mut self, job: &str) -> Result<BTreeMap<PartitionId, String>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(sql::sqlite::OWNERS)
            .map_err(classify)?;
        let rows = stmt
            .query_map([job], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(classify)?;
        rows.map(|r| r.map_err(classify)).collect()
    }

    fn published_epoch(&mut self, job: &str) -> Result<Option<Epoch>, StoreError> {
        Ok(read_publication(&self.conn, job)?.visible)
    }

    fn datumless_table(&self) -> Option<TableSchema> {
        (!self.datum).then(|| self.table.clone())
    }

    /// `write_rows` binds a direct table's values read in place from each datum.
    fn reads_values_in_place(&self) -> bool {
        true
    }

    fn rows(&mut self, _job: &str) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, StoreError> {
        if !self.several.is_empty() {
            // Keyed by (table, key), as the job's checkpoints are; every table read in one read
            // transaction, so they are of one commit.
            let mut out = BTreeMap::new();
            let tx = self.conn.transaction().map_err(classify)?;
            for t in &self.several {
                let mut stmt = tx
                    .prepare(&sql::render(sql::sqlite::TABLE_ROWS, &[("table", &t.name)]))
                    .map_err(classify)?;
                let rows = stmt
                    .query_map([], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get(1)?)))
                    .map_err(classify)?;
                for r in rows {
                    let (key, value) = r.map_err(classify)?;
                    out.insert(crate::core::table_key(t.index, &key), value);
                }
            }
            tx.commit().map_err(classify)?;
            return Ok(out);
        }
        if !self.datum {
            return self.rows_from_columns();
        }
        let mut stmt = self
            .conn
            .prepare(&sql::render(
                sql::sqlite::TABLE_ROWS,
                &[("table", &self.table_name)],
            ))
            .map_err(classify)?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(classify)?;
        rows.map(|r| r.map_err(classify)).collect()
    }
}

#[cfg(test)]
mod tests;
