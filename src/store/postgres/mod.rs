//! The PostgreSQL state store: the same tables as the SQLite store, so several workers on several
//! machines share one job. A checkpoint is one transaction that locks the job row (`FOR UPDATE`),
//! checks the generation and every partition lease, then applies rows and progress; a zombie's or a
//! stale generation's commit changes nothing. On a lost connection the store reconnects with backoff
//! and retries the whole transaction: it is idempotent (upserts, deletes and progress at fixed values,
//! guarded by the same leases), so a retry after an unknown outcome cannot apply anything twice.
//!
//! Here: the store and its transactions; `values.rs` the column values and the key layout,
//! `schema.rs` a schema change's primitives, `publication.rs` publication's (`consistency =
//! "epoch"`), `copy.rs` binary `COPY` of a snapshot's rows.

use crate::core::Generation;
use std::collections::BTreeMap;
use std::sync::Arc;

use postgres::types::ToSql;
use postgres::{Client, Transaction};

use crate::codec::versions::{Evolution, RowVersion};
use crate::codec::{ColumnType, ColumnValue, TableSchema};
use crate::core::retry::Backoff;
use crate::core::{
    Checkpoint, ClaimedPartition, Epoch, PartitionId, PartitionProgress, RateLimits, RowMutation,
    Vnode, VnodeProgress,
};
use crate::pg_tls::redact_url;
use crate::ports::{
    row_columns, DeadLetterRow, DecodedRows, JobRow, SnapshotInfo, StateStore, StoreError,
};
use crate::store::protocol::{self, next_table, Publication, TxRead};
use crate::store::sql;
use crate::store::transactions;
use crate::store::{in_table, row_refs, split_rows, RowRef, StoreTable};

const SCHEMA: &str = sql::postgres::SCHEMA;

/// Rows per multi-row upsert, at most; wide rows get fewer (a statement takes 65,535 parameters).
const ROWS_PER_STATEMENT: usize = 500;

/// From this many upserts in one checkpoint, rows go through `COPY … (FORMAT binary)` into a
/// temporary staging table and one `INSERT … SELECT … ON CONFLICT` (`copy_upserts`).
const COPY_FROM_ROWS: usize = 1_000;

/// A PostgreSQL state store for one job's table.
pub struct PostgresStore {
    url: String,
    client: Client,
    table: TableSchema,
    table_name: String,
    /// `consistency = "epoch"` ([`PostgresStore::open_with`]).
    publication: bool,
    /// The table's primary key, as it was created.
    layout: KeyLayout,
    /// The log's schema versions and this table's index among the log's tables (docs/WIRE.md
    /// "Schema changes"), when the log has a place for them.
    evolution: Option<(Arc<Evolution>, usize)>,
    /// A job of several tables ([`PostgresStore::open_tables`]): every table with its key layout,
    /// the first being `table`/`table_name`; rows are keyed by (table, key). Empty for one table.
    /// Shared, so a commit's retry closure holds it without copying every table's schema.
    several: Arc<Several>,
}

/// A several-table job's tables and each one's key layout, in the same order.
#[derive(Default)]
struct Several {
    tables: Vec<StoreTable>,
    layouts: Vec<KeyLayout>,
}

impl Several {
    fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// Every table's name (`table_name` alone for a job of one table).
    fn names<'a>(&'a self, table_name: &'a str) -> Vec<&'a str> {
        if self.is_empty() {
            vec![table_name]
        } else {
            self.tables.iter().map(|t| t.name.as_str()).collect()
        }
    }
}

mod copy;
mod jobs;
mod publication;
mod schema;
mod values;

use copy::*;
use publication::*;

pub use values::KeyLayout;
use values::*;

/// Sorts a PostgreSQL error into transient (connection lost, serialization failure, deadlock, the
/// server shutting down or out of resources: a retry can succeed) and permanent (a constraint, a
/// type, a value: it cannot).
fn classify(e: postgres::Error) -> StoreError {
    let transient = match e.code() {
        None => true,
        Some(c) => {
            let c = c.code();
            c.starts_with("08")
                || c.starts_with("53")
                || c.starts_with("57P")
                || c == "40001"
                || c == "40P01"
                || c == "55P03"
        }
    };
    // "db error" alone tells an operator nothing: the server's message (and column) or the
    // underlying I/O cause.
    let message = match e.as_db_error() {
        Some(db) => match db.column() {
            Some(col) => format!("PostgreSQL: {} (column {col})", db.message()),
            None => format!("PostgreSQL: {}", db.message()),
        },
        None => {
            let mut m = format!("PostgreSQL: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                m.push_str(&format!(": {s}"));
                src = s.source();
            }
            m
        }
    };
    if transient || e.is_closed() {
        StoreError::backend_from(message, e)
    } else {
        StoreError::rejected_from(message, e)
    }
}

/// Creates a materialised table unless present (after `before`: the store's own tables, on the
/// first open), keyed `(_kb_vnode, _kb_key)`, and returns the key layout it has (a table of an
/// earlier release keeps its own).
fn create_table(
    client: &mut Client,
    before: &str,
    table_name: &str,
    table: &TableSchema,
) -> Result<KeyLayout, StoreError> {
    // `IF NOT EXISTS` on a present table is a NOTICE that the driver would log on every open
    // (one per worker, committer and pooled handle): this session hears warnings and up only.
    let ddl = sql::render(
        sql::postgres::TABLE_CREATE,
        &[
            ("before", before),
            ("table", table_name),
            ("columns", &table.column_ddl(ColumnType::postgres)),
        ],
    );
    // Concurrent first starts may race on CREATE TABLE IF NOT EXISTS: retry once.
    if client.batch_execute(&ddl).is_err() {
        client.batch_execute(&ddl).map_err(classify)?;
    }
    key_layout(client, table_name)
}

impl PostgresStore {
    /// Connects (retrying with backoff) and creates the tables.
    pub fn open(url: &str, table_name: &str, table: TableSchema) -> Result<Self, StoreError> {
        Self::open_with(url, table_name, table, false)
    }

    /// [`open`](Self::open); `publication`: `consistency = "epoch"` (docs/design/several-tables.md
    /// §2) — a log-store checkpoint's rows wait in `kb_pending_units`/`kb_pending_rows` until every
    /// partition of the job stands at its epoch, the job's commits taking its `kb_publication` row
    /// in turn so that each sees the units committed before it.
    pub fn open_with(
        url: &str,
        table_name: &str,
        table: TableSchema,
        publication: bool,
    ) -> Result<Self, StoreError> {
        crate::ports::check_table_name(table_name)?;
        let mut client = connect(url)?;
        let layout = create_table(&mut client, SCHEMA, table_name, &table)?;
        Ok(PostgresStore {
            url: url.to_string(),
            client,
            table,
            table_name: table_name.to_string(),
            publication,
            layout,
            evolution: None,
            several: Arc::default(),
        })
    }

    /// Connects for a job materialising several tables of its log (docs/design/several-tables.md
    /// §3): each of `tables` created with its row's columns, every checkpoint's rows routed to their
    /// tables by their (table, key) keys, all in the checkpoint's one transaction.
    pub fn open_tables(
        url: &str,
        tables: Vec<StoreTable>,
        publication: bool,
    ) -> Result<Self, StoreError> {
        let Some(first) = tables.first() else {
            return Err(StoreError::rejected("a store of no table"));
        };
        // Under publication a job's tables are created together, at its first open; once one
        // exists, a table missing from the set is one added to the job, which readers see only
        // when the generation that loads it is published (`transactions::ensure_job`).
        let together = !publication || {
            let mut client = connect(url)?;
            let mut present = false;
            for t in &tables {
                let found: bool = client
                    .query_one(sql::postgres::TABLE_EXISTS, &[&t.name])
                    .map_err(classify)?
                    .get(0);
                present |= found;
            }
            !present
        };
        let mut store = Self::open_with(url, &first.name, first.schema.clone(), publication)?;
        let mut layouts = vec![store.layout];
        for t in &tables[1..] {
            crate::ports::check_table_name(&t.name)?;
            let layout = if together {
                create_table(&mut store.client, "", &t.name, &t.schema)?
            } else {
                key_layout(&mut store.client, &t.name)?
            };
            layouts.push(layout);
        }
        store.several = Arc::new(Several { tables, layouts });
        Ok(store)
    }

    /// This store, following the log's schema versions (`table`: its table's index in the log):
    /// each commit brings the table to the version in force at its epoch (docs/WIRE.md "Schema
    /// changes").
    pub fn with_evolution(mut self, evolution: Arc<Evolution>, table: usize) -> Self {
        self.evolution = Some((evolution, table));
        self
    }

    /// Runs `f` in a transaction; a transient failure (connection lost, serialization failure,
    /// deadlock, server restarting) reconnects if needed and replays the whole transaction under
    /// [`Backoff::STORE`] (it is idempotent); a permanent one returns at once.
    fn with_tx<T>(
        &mut self,
        f: impl FnMut(&mut Transaction<'_>, &TableSchema, &str) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.with_tx_under(Backoff::STORE, f)
    }

    /// Runs one of the job's transactions (`store::transactions`) under [`Self::with_tx`]: replayed
    /// whole after a lost connection.
    fn in_tx<T>(
        &mut self,
        mut f: impl FnMut(&mut InTx<'_, '_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let layout = self.layout;
        let several = Arc::clone(&self.several);
        self.with_tx(|tx, table, table_name| {
            f(&mut InTx {
                tx,
                table,
                table_name,
                layout,
                several: &several,
            })
        })
    }

    fn with_tx_under<T>(
        &mut self,
        policy: Backoff,
        mut f: impl FnMut(&mut Transaction<'_>, &TableSchema, &str) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let url = self.url.clone();
        crate::retry::retry_sleeping(
            policy,
            || {
                if self.client.is_closed() {
                    self.client = crate::pg_tls::connect(&url).map_err(connect_error)?;
                }
                let result = (|| {
                    let mut tx = self.client.transaction().map_err(PgFail::Conn)?;
                    let out = f(&mut tx, &self.table, &self.table_name).map_err(PgFail::Store)?;
                    tx.commit().map_err(PgFail::Conn)?;
                    Ok(out)
                })();
                let e = match result {
                    Ok(v) => return Ok(v),
                    Err(PgFail::Store(e)) => e,
                    Err(PgFail::Conn(e)) => classify(e),
                };
                if e.is_transient() {
                    tracing::warn!(url = %redact_url(&url), error = %e, "PostgreSQL unavailable; retrying");
                }
                Err(e)
            },
            StoreError::is_transient,
        )
    }

    /// Committed vnode progress.
    pub fn vnode_progress(
        &mut self,
        job: &str,
    ) -> Result<BTreeMap<Vnode, VnodeProgress>, StoreError> {
        let job = job.to_string();
        self.with_tx(|tx, _, _| vnode_rows(tx, &job, None))
    }
}

/// One row to upsert: key bytes, vnode, datum, column values.
type UpsertRow = (Vec<u8>, i32, Vec<u8>, Vec<PgValue>);

enum PgFail {
    Conn(postgres::Error),
    Store(StoreError),
}

/// Connects under [`Backoff::STORE`]: a server that is down or starting is waited for; refused
/// credentials or certificates fail at once.
fn connect(url: &str) -> Result<Client, StoreError> {
    crate::retry::retry_sleeping(
        Backoff::STORE,
        || crate::pg_tls::connect(url).map_err(connect_error),
        StoreError::is_transient,
    )
}

fn connect_error(e: crate::pg_tls::ConnectError) -> StoreError {
    if e.permanent {
        StoreError::rejected_from(e.message.clone(), e)
    } else {
        StoreError::backend_from(e.message.clone(), e)
    }
}

fn job_row(tx: &mut Transaction<'_>, job: &str, lock: bool) -> Result<Option<JobRow>, StoreError> {
    let q = if lock {
        sql::postgres::JOB_ROW_LOCKED
    } else {
        sql::postgres::JOB_ROW
    };
    let row = tx.query_opt(q, &[&job]).map_err(classify)?;
    Ok(row.map(|r| JobRow {
        job: job.to_string(),
        snapshot_epoch: Epoch(r.get::<_, i64>(0) as u64),
        vnode_count: r.get::<_, i32>(1) as u32,
        partition_count: r.get::<_, i32>(2) as u32,
        generation: crate::core::Generation(r.get::<_, i64>(3) as u64),
        phase: r.get(4),
        recreations: r.get::<_, i64>(5) as u64,
    }))
}

fn vnode_rows(
    tx: &mut Transaction<'_>,
    job: &str,
    only: Option<&[i32]>,
) -> Result<BTreeMap<Vnode, VnodeProgress>, StoreError> {
    let rows = match only {
        Some(vs) => tx.query(sql::postgres::VNODE_PROGRESS_READ, &[&job, &vs]),
        None => tx.query(sql::postgres::VNODE_PROGRESS_ALL, &[&job]),
    }
    .map_err(classify)?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let v = r.get::<_, i32>(0) as Vnode;
            (
                v,
                VnodeProgress {
                    vnode: v,
                    epoch: Epoch(r.get::<_, i64>(1) as u64),
                    row_count: r.get::<_, i64>(2) as u64,
                    finished: r.get(3),
                    cursor: r.get(4),
                },
            )
        })
        .collect())
}

impl StateStore for PostgresStore {
    fn ensure_job(&mut self, job: &str, info: &SnapshotInfo) -> Result<JobRow, StoreError> {
        let publication = self.publication;
        self.in_tx(|tx| transactions::ensure_job(tx, job, info, publication))
    }

    /// One attempt, no retry: the worker's once-a-second look (generation, reachability) must
    /// answer at once.
    fn job(&mut self, job: &str) -> Result<Option<JobRow>, StoreError> {
        self.with_tx_under(Backoff::ONCE, |tx, _, _| job_row(tx, job, false))
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
        // The transaction may be retried (a lost connection): decoded values are taken on the
        // first attempt, and a retry decodes again.
        let mut decoded = Some(decoded);
        let publication = self.publication;
        let layout = self.layout;
        let several = Arc::clone(&self.several);
        let versions = match &self.evolution {
            Some((ev, t)) => Some((
                ev.refresh_if_grown()
                    .map_err(|e| StoreError::rejected(e.to_string()))?,
                *t,
            )),
            None => None,
        };
        self.with_tx(|tx, table, table_name| {
            let mut in_tx = InTx {
                tx,
                table,
                table_name,
                layout,
                several: &several,
            };
            transactions::commit_group(
                &mut in_tx,
                job,
                cps,
                decoded.take().unwrap_or_default(),
                versions.as_ref().map(|(v, t)| (&**v, *t)),
                publication,
                &several.tables,
            )
        })
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

    fn published_epoch(&mut self, job: &str) -> Result<Option<Epoch>, StoreError> {
        self.with_tx(|tx, _, _| Ok(read_publication(tx, job)?.visible))
    }

    fn rows(&mut self, _job: &str) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, StoreError> {
        if !self.several.is_empty() {
            // Keyed by (table, key), as the job's checkpoints are; every table read in one
            // snapshot of the database, so they are of one commit.
            let several = Arc::clone(&self.several);
            return self.with_tx(|tx, _, _| {
                tx.batch_execute(sql::postgres::REPEATABLE_READ)
                    .map_err(classify)?;
                let mut out = BTreeMap::new();
                for t in &several.tables {
                    for r in tx
                        .query(
                            &sql::render(sql::postgres::TABLE_ROWS, &[("table", &t.name)]),
                            &[],
                        )
                        .map_err(classify)?
                    {
                        let key: Vec<u8> = r.get(0);
                        out.insert(crate::core::table_key(t.index, &key), r.get(1));
                    }
                }
                Ok(out)
            });
        }
        self.with_tx(|tx, _, table_name| {
            Ok(tx
                .query(
                    &sql::render(sql::postgres::TABLE_ROWS, &[("table", table_name)]),
                    &[],
                )
                .map_err(classify)?
                .into_iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect())
        })
    }

    fn committed_vnodes(
        &mut self,
        job: &str,
    ) -> Result<BTreeMap<Vnode, VnodeProgress>, StoreError> {
        self.vnode_progress(job)
    }

    fn committed_partitions(
        &mut self,
        job: &str,
    ) -> Result<BTreeMap<PartitionId, PartitionProgress>, StoreError> {
        let job = job.to_string();
        self.with_tx(|tx, _, _| {
            let rows = tx
                .query(sql::postgres::PARTITION_PROGRESS_ALL, &[&job])
                .map_err(classify)?;
            Ok(rows
                .into_iter()
                .map(|r| {
                    let p = PartitionProgress {
                        partition: r.get::<_, i32>(0) as PartitionId,
                        next_offset: r.get::<_, i64>(1) as u64,
                        epoch: Epoch(r.get::<_, i64>(2) as u64),
                        streaming: r.get(3),
                    };
                    (p.partition, p)
                })
                .collect())
        })
    }

    fn rate_limits(&mut self, job: &str) -> Result<Option<RateLimits>, StoreError> {
        let job = job.to_string();
        self.with_tx(|tx, _, _| {
            Ok(tx
                .query_opt(sql::postgres::RATE_LIMITS_READ, &[&job])
                .map_err(classify)?
                .map(|r| RateLimits {
                    snapshot_rows_per_second: r.get::<_, i64>(0) as u64,
                    log_records_per_second: r.get::<_, i64>(1) as u64,
                }))
        })
    }

    fn set_rate_limits(&mut self, job: &str, limits: RateLimits) -> Result<(), StoreError> {
        let job = job.to_string();
        let (s, l) = (
            limits.snapshot_rows_per_second as i64,
            limits.log_records_per_second as i64,
        );
        self.with_tx(|tx, _, _| {
            tx.execute(sql::postgres::RATE_LIMITS_WRITE, &[&job, &s, &l])
                .map_err(classify)?;
            Ok(())
        })
    }

    fn dead_letters(&mut self, job: &str) -> Result<Vec<DeadLetterRow>, StoreError> {
        let job = job.to_string();
        self.with_tx(|tx, _, _| {
            let rows = tx
                .query(sql::postgres::DEAD_LETTERS_READ, &[&job])
                .map_err(classify)?;
            Ok(rows
                .into_iter()
                .map(|r| DeadLetterRow {
                    partition: r.get::<_, i32>(0) as PartitionId,
                    offset: r.get::<_, i64>(1) as u64,
                    epoch: r.get::<_, i64>(2) as u64,
                    generation: crate::core::Generation(r.get::<_, i64>(3) as u64),
                    reason: r.get(4),
                })
                .collect())
        })
    }

    fn paused(&mut self, job: &str) -> Result<bool, StoreError> {
        let job = job.to_string();
        self.with_tx(|tx, _, _| {
            Ok(tx
                .query_opt(sql::postgres::PAUSED_READ, &[&job])
                .map_err(classify)?
                .is_some_and(|r| r.get::<_, bool>(0)))
        })
    }

    fn set_paused(&mut self, job: &str, paused: bool) -> Result<(), StoreError> {
        let job = job.to_string();
        self.with_tx(|tx, _, _| {
            tx.execute(sql::postgres::PAUSED_WRITE, &[&job, &paused])
                .map_err(classify)?;
            Ok(())
        })
    }

    fn owners(&mut self, job: &str) -> Result<BTreeMap<PartitionId, String>, StoreError> {
        let job = job.to_string();
        self.with_tx(|tx, _, _| {
            let rows = tx.query(sql::postgres::OWNERS, &[&job]).map_err(classify)?;
            Ok(rows
                .into_iter()
                .map(|r| (r.get::<_, i32>(0) as PartitionId, r.get(1)))
                .collect())
        })
    }
}

/// The primary key `table_name` was created with: `_kb_key` alone (an earlier release's table) or
/// `(_kb_vnode, _kb_key)`.
fn key_layout(client: &mut Client, table_name: &str) -> Result<KeyLayout, StoreError> {
    let columns: Vec<String> = client
        .query(sql::postgres::TABLE_KEY_COLUMNS, &[&table_name])
        .map_err(classify)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    Ok(if columns == ["_kb_key"] {
        KeyLayout::Key
    } else {
        KeyLayout::VnodeKey
    })
}

/// Upserts and deletes `rows` in `table_name`: multi-row statements, or `COPY` for many.
/// `snapshot`: the rows are a snapshot scan's (a checkpoint without log data), which the table
/// cannot hold yet — many of them are copied straight into it ([`copy_fresh`]).
fn write_rows<'r>(
    tx: &mut Transaction<'_>,
    table: &TableSchema,
    table_name: &str,
    layout: KeyLayout,
    rows: impl IntoIterator<Item = RowRef<'r>>,
    decoded: DecodedRows,
    snapshot: bool,
) -> Result<(), StoreError> {
    let mut decoded = decoded.into_iter();
    // Rows in multi-row statements (one round trip per chunk, not per row): keys are unique
    // within a checkpoint (coalesced), so one statement never touches a row twice.
    let ncols = 3 + table.columns.len();
    let cols: Vec<String> = table
        .columns
        .iter()
        .map(|c| format!("\"{}\"", c.name))
        .collect();
    let sets: Vec<String> = cols.iter().map(|c| format!("{c} = EXCLUDED.{c}")).collect();
    let mut upserts: Vec<UpsertRow> = Vec::new();
    let mut deletes: Vec<(i32, Vec<u8>)> = Vec::new();
    let mut truncated: Vec<i32> = Vec::new();
    for (m, key) in rows {
        match m {
            RowMutation::Upsert { vnode, row, .. } => {
                let fields = row_columns(table, key, &row.value, decoded.next().flatten())?;
                let values = fields
                    .into_iter()
                    .zip(&table.columns)
                    .map(|(v, c)| PgValue::of(c.ty, v, &c.name, key))
                    .collect::<Result<_, _>>()?;
                upserts.push((key.to_vec(), *vnode as i32, row.value.clone(), values));
            }
            RowMutation::Delete { vnode, .. } => {
                decoded.next();
                deletes.push((*vnode as i32, key.to_vec()))
            }
            RowMutation::Truncate { vnode, .. } => {
                decoded.next();
                truncated.push(*vnode as i32);
            }
        }
    }
    // Truncations first: every other row of the checkpoint comes after them.
    if !truncated.is_empty() {
        tx.execute(
            &sql::render(sql::postgres::ROWS_TRUNCATE, &[("table", table_name)]),
            &[&truncated],
        )
        .map_err(classify)?;
    }
    if upserts.len() >= COPY_FROM_ROWS {
        let copied =
            snapshot && deletes.is_empty() && copy_fresh(tx, table, table_name, &cols, &upserts)?;
        if !copied {
            copy_upserts(tx, table, table_name, layout, &cols, &sets, &upserts)?;
        }
        upserts.clear();
    }
    let per_statement = ROWS_PER_STATEMENT.min(60_000 / ncols).max(1);
    for chunk in upserts.chunks(per_statement) {
        let tuples: Vec<String> = (0..chunk.len())
            .map(|r| {
                let mut marks: Vec<String> =
                    (1..=3).map(|c| format!("${}", r * ncols + c)).collect();
                marks.extend(
                    table
                        .columns
                        .iter()
                        .enumerate()
                        .map(|(i, col)| placeholder(col.ty, r * ncols + 4 + i)),
                );
                format!("({})", marks.join(", "))
            })
            .collect();
        let sql = sql::render(
            sql::postgres::ROWS_UPSERT,
            &[
                ("table", table_name),
                ("columns", &cols.join(", ")),
                ("tuples", &tuples.join(", ")),
                ("conflict", layout.conflict()),
                ("set_vnode", layout.set_vnode()),
                ("sets", &sets.join(", ")),
            ],
        );
        let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(chunk.len() * ncols);
        for (key, vnode, value, values) in chunk {
            params.push(key);
            params.push(vnode);
            params.push(value);
            params.extend(values.iter().map(|v| v.sql()));
        }
        tx.execute(&sql, &params).map_err(classify)?;
    }
    if !deletes.is_empty() {
        let (vnodes, keys): (Vec<i32>, Vec<Vec<u8>>) = deletes.into_iter().unzip();
        match layout {
            KeyLayout::Key => tx.execute(
                &sql::render(sql::postgres::ROWS_DELETE_BY_KEY, &[("table", table_name)]),
                &[&keys],
            ),
            // By the whole key: there is no index on `_kb_key` alone.
            KeyLayout::VnodeKey => tx.execute(
                &sql::render(sql::postgres::ROWS_DELETE, &[("table", table_name)]),
                &[&vnodes, &keys],
            ),
        }
        .map_err(classify)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
