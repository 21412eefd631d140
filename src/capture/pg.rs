//! The PostgreSQL side of the capture: the catalog and its preconditions, the exported snapshot's
//! copy, and the slot's pgoutput stream as a [`ReplicationPort`].
//!
//! The replication connection is `pg_walstream`'s (libpq backend: one TLS stack, OpenSSL, for the
//! whole binary), driven on a current-thread runtime owned by the capture's thread; only
//! `LogicalReplicationStream::next_event` is used, which never reconnects on its own, so a dropped
//! connection is an error the loop answers by aborting the open Kafka transaction and resuming
//! from the last committed state. Feedback is sent only from [`ReplicationPort::ack`]. The catalog,
//! the checks and the copy use the `postgres` crate on ordinary connections.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use pg_walstream::{
    CancellationToken, ColumnValue, EventType, LogicalReplicationStream, ReplicationSlotOptions,
    ReplicationStreamConfig, RetryConfig, RowData, StreamingMode,
};

use super::types::{PgColumn, PgType, RowEncoder};
use super::{CaptureFailure, ReplicationPort};
pub use crate::config::TableName;
use crate::core::capture::{Lsn, RowChange, SourceEvent, TableIndex};

/// The session settings that fix every type's text form (docs/CAPTURE.md, "Types").
pub const SESSION_SETTINGS: &str =
    "-c DateStyle=ISO -c IntervalStyle=postgres -c TimeZone=UTC -c bytea_output=hex -c extra_float_digits=3";

/// Table names as SQL.
impl TableName {
    /// The quoted SQL identifier.
    pub fn sql(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.table))
    }
}

pub use super::unix_ms;

pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// A PostgreSQL LSN as text (`16/B374D848`).
pub fn parse_lsn(s: &str) -> Result<Lsn> {
    let (hi, lo) = s
        .split_once('/')
        .with_context(|| format!("{s:?} is not an LSN"))?;
    Ok((u64::from_str_radix(hi, 16)? << 32) | u64::from_str_radix(lo, 16)?)
}

pub fn format_lsn(lsn: Lsn) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff)
}

/// An ordinary connection with the session settings.
pub fn connect(url: &str) -> Result<postgres::Client> {
    let mut client = crate::pg_tls::connect(url).context("connecting to the capture's source")?;
    client.batch_execute(
        "SET DateStyle = ISO; SET IntervalStyle = postgres; SET TimeZone = 'UTC'; \
         SET bytea_output = hex; SET extra_float_digits = 3; SET client_min_messages TO warning",
    )?;
    Ok(client)
}

/// What the catalog says of the captured table, checked.
#[derive(Clone, Debug)]
pub struct TableInfo {
    pub oid: u32,
    pub encoder: RowEncoder,
    pub primary_key: Vec<String>,
}

/// Checks the preconditions on `client` (each a named error saying how to fix it) and reads the
/// table's columns and key. Runs inside the snapshot's transaction for the copy, so the schema
/// is the one the snapshot has.
pub fn table_info(
    client: &mut impl postgres::GenericClient,
    table: &TableName,
) -> Result<TableInfo> {
    let wal_level: String = client.query_one("SHOW wal_level", &[])?.get(0);
    if wal_level != "logical" {
        bail!("the source's wal_level is {wal_level}: capture needs wal_level = logical (set it in postgresql.conf, or ALTER SYSTEM SET wal_level = logical, and restart PostgreSQL)");
    }
    let row = client
        .query_opt(
            "SELECT c.oid, c.relreplident::text, c.relkind::text FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
            &[&table.schema, &table.table],
        )?
        .with_context(|| format!("table {table} does not exist in the source"))?;
    let oid: u32 = row.get(0);
    let ident: String = row.get(1);
    let kind: String = row.get(2);
    if kind != "r" {
        bail!("{table} is not an ordinary table (relkind {kind}); capture reads ordinary tables");
    }
    let rows = client.query(
        "SELECT a.attname::text, t.typname::text, t.typtype::text, a.atttypmod, a.attnotnull, \
                a.attgenerated::text, et.typname::text, et.typtype::text, a.attndims \
         FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
         LEFT JOIN pg_type et ON et.oid = t.typelem AND t.typcategory = 'A' \
         WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        &[&oid],
    )?;
    let mut columns = Vec::new();
    for r in &rows {
        let name: String = r.get(0);
        let generated: String = r.get(5);
        if !generated.is_empty() {
            bail!("column {name} of {table} is a generated column: pgoutput does not send it; capture refuses such tables (drop the column or compute it downstream)");
        }
        let element: Option<String> = r.get(6);
        let etyptype: Option<String> = r.get(7);
        let typname: String = r.get(1);
        let ty = PgType::from_catalog(
            &typname,
            &r.get::<_, String>(2),
            r.get(3),
            element.as_deref().zip(etyptype.as_deref()),
        )
        .map_err(|e| anyhow::anyhow!("column {name} of {table}: {e}"))?;
        columns.push(PgColumn {
            name,
            ty,
            nullable: !r.get::<_, bool>(4),
            null_last: false,
        });
    }
    let key_rows = client.query(
        "SELECT a.attname::text FROM pg_index i \
         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
         WHERE i.indrelid = $1 AND i.indisprimary \
         ORDER BY array_position(i.indkey::int2[], a.attnum)",
        &[&oid],
    )?;
    let primary_key: Vec<String> = key_rows.iter().map(|r| r.get(0)).collect();
    if primary_key.is_empty() {
        bail!("table {table} has no primary key: capture keys every row by it (ALTER TABLE {} ADD PRIMARY KEY (…))", table.sql());
    }
    if ident != "f" {
        bail!("table {table} has REPLICA IDENTITY {}: capture needs whole old rows and unchanged TOASTed values; run ALTER TABLE {} REPLICA IDENTITY FULL",
            match ident.as_str() { "d" => "DEFAULT", "n" => "NOTHING", "i" => "USING INDEX", _ => "?" }, table.sql());
    }
    let key = primary_key
        .iter()
        .map(|k| {
            columns
                .iter()
                .position(|c| &c.name == k)
                .expect("a key column is a column")
        })
        .collect();
    Ok(TableInfo {
        oid,
        encoder: RowEncoder { columns, key },
        primary_key,
    })
}

/// The tables of `tables` that `publication` does not publish; `None` when it does not exist.
pub fn unpublished(
    client: &mut postgres::Client,
    publication: &str,
    tables: &[TableName],
) -> Result<Option<Vec<TableName>>> {
    let exists = client
        .query_opt(
            "SELECT 1 FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )?
        .is_some();
    if !exists {
        return Ok(None);
    }
    let mut lacking = Vec::new();
    for table in tables {
        let has = client
            .query_opt(
                "SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
                &[&publication, &table.schema, &table.table],
            )?
            .is_some();
        if !has {
            lacking.push(table.clone());
        }
    }
    Ok(Some(lacking))
}

/// What to do about a publication that does not publish `table`, which the capture refuses.
pub fn unpublished_fix(publication: &str, table: &TableName) -> String {
    format!(
        "publication {publication} exists but does not publish {table} (ALTER PUBLICATION {} ADD TABLE {}, or name another publication in capture.publication; the capture's own, when capture.publication is not set, gains a table added to tables itself)",
        quote_ident(publication),
        table.sql()
    )
}

/// Creates the publication for the tables when absent. One that does not publish each of them
/// gains those it lacks when it is the capture's own (`owned`: a table added to `tables`), and is
/// refused otherwise (one that publishes others too is fine: their changes are passed over).
pub fn ensure_publication(
    client: &mut postgres::Client,
    publication: &str,
    tables: &[TableName],
    owned: bool,
) -> Result<()> {
    let Some(lacking) = unpublished(client, publication, tables)? else {
        let list: Vec<String> = tables.iter().map(TableName::sql).collect();
        client.batch_execute(&format!(
            "CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert, update, delete, truncate')",
            quote_ident(publication),
            list.join(", ")
        ))?;
        return Ok(());
    };
    for table in lacking {
        if !owned {
            bail!("{}", unpublished_fix(publication, &table));
        }
        // The capture's own publication (`kb_<job>`): a table added to `tables` joins it.
        alter_publication(client, publication, "ADD", &table)?;
        tracing::info!(%publication, %table, "table added to the capture's publication");
    }
    Ok(())
}

/// `ALTER PUBLICATION publication ADD|DROP TABLE table`.
fn alter_publication(
    client: &mut postgres::Client,
    publication: &str,
    verb: &str,
    table: &TableName,
) -> Result<()> {
    client.batch_execute(&format!(
        "ALTER PUBLICATION {} {verb} TABLE {}",
        quote_ident(publication),
        table.sql()
    ))?;
    Ok(())
}

/// Drops `tables` from the capture's own publication where it still publishes them (a table
/// dropped upstream left it by itself): tables removed from the capture, once the state record
/// naming them is committed, so the server stops decoding their changes for the slot.
pub fn unpublish(
    client: &mut postgres::Client,
    publication: &str,
    tables: &[TableName],
) -> Result<()> {
    let lacking = unpublished(client, publication, tables)?.unwrap_or_default();
    for table in tables.iter().filter(|t| !lacking.contains(t)) {
        alter_publication(client, publication, "DROP", table)?;
        tracing::info!(%publication, %table, "table removed from the capture's publication");
    }
    Ok(())
}

/// The slot as `pg_replication_slots` shows it: confirmed position, whether it is active.
pub fn slot_state(client: &mut postgres::Client, slot: &str) -> Result<Option<(Lsn, bool)>> {
    let Some(r) = client.query_opt(
        "SELECT confirmed_flush_lsn::text, active, coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1",
        &[&slot],
    )?
    else {
        return Ok(None);
    };
    let wal_status: String = r.get(2);
    if wal_status == "lost" {
        bail!("replication slot {slot} is lost (wal_status = lost: the WAL it needed was removed, max_slot_wal_keep_size); the log cannot be continued: drop the slot and capture into a new topic");
    }
    let lsn: Option<String> = r.get(0);
    Ok(Some((
        lsn.map(|s| parse_lsn(&s)).transpose()?.unwrap_or(0),
        r.get(1),
    )))
}

/// Splits one line of `COPY … TO STDOUT` text format into its fields (`None` = NULL).
pub fn copy_fields(line: &str) -> Result<Vec<Option<String>>> {
    let mut out = Vec::new();
    copy_fields_into(line, &mut out)?;
    Ok(out.into_iter().map(|f| f.map(|c| c.into_owned())).collect())
}

/// [`copy_fields`] into `out` (cleared first); a field without escapes is borrowed, not copied.
pub fn copy_fields_into<'a>(
    line: &'a str,
    out: &mut Vec<Option<std::borrow::Cow<'a, str>>>,
) -> Result<()> {
    out.clear();
    for field in line.split('\t') {
        if field == "\\N" {
            out.push(None);
            continue;
        }
        if !field.contains('\\') {
            out.push(Some(std::borrow::Cow::Borrowed(field)));
            continue;
        }
        let mut s = String::with_capacity(field.len());
        let mut chars = field.chars();
        while let Some(c) = chars.next() {
            if c != '\\' {
                s.push(c);
                continue;
            }
            match chars.next() {
                Some('t') => s.push('\t'),
                Some('n') => s.push('\n'),
                Some('r') => s.push('\r'),
                Some('b') => s.push('\u{8}'),
                Some('f') => s.push('\u{c}'),
                Some('v') => s.push('\u{b}'),
                Some('\\') => s.push('\\'),
                Some(d) if d.is_digit(8) => {
                    // \ooo octal (COPY writes it for control bytes).
                    let mut v = d.to_digit(8).unwrap();
                    for _ in 0..2 {
                        match chars.as_str().chars().next().and_then(|c| c.to_digit(8)) {
                            Some(n) => {
                                v = v * 8 + n;
                                chars.next();
                            }
                            None => break,
                        }
                    }
                    s.push(char::from_u32(v).context("bad octal escape")?);
                }
                Some(other) => s.push(other),
                None => bail!("a field ends in a backslash"),
            }
        }
        out.push(Some(std::borrow::Cow::Owned(s)));
    }
    Ok(())
}

/// `COPY`s the table's columns out inside `tx` (the rows whose ctid is in `range`, or all of
/// them), each row encoded (see [`copy_rows`]).
fn copy_table(
    tx: &mut postgres::Transaction<'_>,
    table: &TableName,
    encoder: &RowEncoder,
    range: Option<CtidRange>,
    row: impl FnMut(&[u8], &[u8]) -> Result<()>,
) -> Result<u64> {
    let cols = encoder
        .columns
        .iter()
        .map(|c| quote_ident(&c.name))
        .collect::<Vec<_>>()
        .join(", ");
    let filter = match range {
        None => String::new(),
        Some(r) => r.sql(),
    };
    let reader = tx.copy_out(&format!(
        "COPY (SELECT {cols} FROM {}{filter}) TO STDOUT",
        table.sql()
    ))?;
    copy_rows(reader, table, encoder, row)
}

/// Reads a `COPY … TO STDOUT` stream line by line (fields borrowed where they can be), encoding
/// each row; `row` gets (datum, key). Returns the row count. PostgreSQL sends each row of the text
/// format as one message; the reader hands it over as one buffer, so a row is read without copying
/// it first unless it arrives split.
fn copy_rows(
    reader: impl std::io::BufRead,
    table: &TableName,
    encoder: &RowEncoder,
    mut row: impl FnMut(&[u8], &[u8]) -> Result<()>,
) -> Result<u64> {
    let mut reader = reader;
    let mut partial: Vec<u8> = Vec::new();
    let mut n = 0u64;
    let mut one = |line: &[u8], n: u64| -> Result<()> {
        let mut fields = Vec::with_capacity(encoder.columns.len());
        let text = std::str::from_utf8(line)
            .with_context(|| format!("{table}: row {n} of the copy is not UTF-8"))?;
        copy_fields_into(text, &mut fields)
            .with_context(|| format!("{table}: row {n} of the copy"))?;
        let refs: Vec<Option<&str>> = fields.iter().map(|f| f.as_deref()).collect();
        let (datum, key) = encoder
            .encode(&refs)
            .with_context(|| format!("{table}: row {n} of the copy"))?;
        row(&datum, &key)
    };
    loop {
        let buf = reader
            .fill_buf()
            .with_context(|| format!("reading the copy of {table}"))?;
        if buf.is_empty() {
            if !partial.is_empty() {
                bail!("{table}: the copy ended inside row {n}");
            }
            return Ok(n);
        }
        let len = buf.len();
        let mut start = 0;
        while let Some(end) = memchr_newline(&buf[start..]) {
            let line = &buf[start..start + end];
            if partial.is_empty() {
                one(line, n)?;
            } else {
                partial.extend_from_slice(line);
                one(&partial, n)?;
                partial.clear();
            }
            n += 1;
            start += end + 1;
        }
        partial.extend_from_slice(&buf[start..]);
        reader.consume(len);
    }
}

fn memchr_newline(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}

/// A range of the table's pages, `[from, to)` (`to = None`: to the end), read by one connection
/// of a parallel copy: `WHERE ctid >= '(from,0)' AND ctid < '(to,0)'`, a TID range scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtidRange {
    pub from: u64,
    pub to: Option<u64>,
}

impl CtidRange {
    fn sql(&self) -> String {
        match self.to {
            Some(to) => format!(
                " WHERE ctid >= '({},0)'::tid AND ctid < '({to},0)'::tid",
                self.from
            ),
            None => format!(" WHERE ctid >= '({},0)'::tid", self.from),
        }
    }
}

/// The copy's ranges: `parts` ranges of equal page counts over a table of `pages` pages (the last
/// open-ended: pages added after the size was read hold no row the snapshot sees, but the ranges
/// never depend on it); one range (no filter) when the table is too small to pay for more
/// connections.
pub fn ctid_ranges(pages: u64, parts: usize) -> Vec<Option<CtidRange>> {
    let parts = (parts.max(1) as u64)
        .min(pages / PAGES_PER_COPY_CONNECTION)
        .max(1);
    if parts == 1 {
        return vec![None];
    }
    let step = pages.div_ceil(parts);
    (0..parts)
        .map(|i| {
            Some(CtidRange {
                from: i * step,
                to: (i + 1 < parts).then_some((i + 1) * step),
            })
        })
        .collect()
}

/// A copy connection pays for itself only over this many pages (8 KiB each: 64 MiB).
const PAGES_PER_COPY_CONNECTION: u64 = 2048;

/// Bytes of rows a copy connection hands to the writer at once (and at most 4 such batches in
/// flight per connection: the parallel copy's memory is bounded by them, not by the table).
const COPY_BATCH_BYTES: usize = 1 << 20;

/// Appends one row to a copy batch: key length, datum length (u32 LE), key, datum. One buffer
/// crosses threads per batch, not two per row.
fn batch_push(batch: &mut Vec<u8>, key: &[u8], datum: &[u8]) {
    batch.extend_from_slice(&(key.len() as u32).to_le_bytes());
    batch.extend_from_slice(&(datum.len() as u32).to_le_bytes());
    batch.extend_from_slice(key);
    batch.extend_from_slice(datum);
}

/// The rows of a copy batch, in order: (key, datum).
fn batch_rows(batch: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let mut rest = batch;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let k = u32::from_le_bytes(rest[0..4].try_into().unwrap()) as usize;
        let d = u32::from_le_bytes(rest[4..8].try_into().unwrap()) as usize;
        let (key, tail) = rest[8..].split_at(k);
        let (datum, tail) = tail.split_at(d);
        rest = tail;
        Some((key, datum))
    })
}

/// Opens a read-only `REPEATABLE READ` transaction that imports the exported snapshot.
fn snapshot_transaction<'a>(
    client: &'a mut postgres::Client,
    snapshot_name: &str,
) -> Result<postgres::Transaction<'a>> {
    let mut tx = client
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()?;
    tx.batch_execute(&format!(
        "SET TRANSACTION SNAPSHOT '{}'",
        snapshot_name.replace('\'', "''")
    ))
    .context("importing the slot's exported snapshot")?;
    Ok(tx)
}

/// One connection inside the exported snapshot `snapshot_name`, for every table's copy: a
/// connection per table (TLS set up, the snapshot imported) was most of a 200-table capture's copy.
pub struct SnapshotSession {
    client: postgres::Client,
    url: String,
    snapshot_name: String,
}

impl SnapshotSession {
    pub fn open(url: &str, snapshot_name: &str) -> Result<Self> {
        Ok(SnapshotSession {
            client: connect(url)?,
            url: url.to_string(),
            snapshot_name: snapshot_name.to_string(),
        })
    }

    /// The columns and key of `table` in this session's snapshot.
    pub fn info(&mut self, table: &TableName) -> Result<TableInfo> {
        let mut tx = snapshot_transaction(&mut self.client, &self.snapshot_name)?;
        let info = table_info(&mut tx, table)?;
        tx.commit()?;
        Ok(info)
    }

    /// [`copy_snapshot`] of `table` in this session's snapshot.
    /// `nulls_last`: the nullable columns written `[T, "null"]` ([`PgColumn::null_last`]).
    pub fn copy(
        &mut self,
        table: &TableName,
        connections: usize,
        nulls_last: &[String],
        row: impl FnMut(&[u8], &[u8]) -> Result<()>,
    ) -> Result<(TableInfo, u64, u64)> {
        let mut tx = snapshot_transaction(&mut self.client, &self.snapshot_name)?;
        let out = copy_snapshot(
            &mut tx,
            &self.url,
            table,
            &self.snapshot_name,
            connections,
            nulls_last,
            row,
        )?;
        tx.commit()?;
        Ok(out)
    }
}

/// Copies the table inside the exported snapshot `snapshot_name` (which `tx` imported), calling
/// `row` with each row's (datum, key) on the calling thread. Tables of more than
/// [`PAGES_PER_COPY_CONNECTION`] pages are read in up to `connections` ctid ranges in parallel,
/// each by its own connection importing the same snapshot (so together they read exactly the
/// snapshot's rows) and encoding on its own thread. Returns the table info read in that snapshot,
/// the server's clock (Unix ms) at the import, and the row count.
fn copy_snapshot(
    tx: &mut postgres::Transaction<'_>,
    url: &str,
    table: &TableName,
    snapshot_name: &str,
    connections: usize,
    nulls_last: &[String],
    mut row: impl FnMut(&[u8], &[u8]) -> Result<()>,
) -> Result<(TableInfo, u64, u64)> {
    let mut info = table_info(tx, table)?;
    super::types::order_nulls(&mut info.encoder.columns, nulls_last);
    let (now_ms, pages): (i64, i64) = {
        let r = tx.query_one(
            "SELECT (extract(epoch FROM statement_timestamp()) * 1000)::int8, \
                    (pg_relation_size($1::oid) / current_setting('block_size')::int8)::int8",
            &[&info.oid],
        )?;
        (r.get(0), r.get(1))
    };
    let ranges = ctid_ranges(pages.max(0) as u64, connections);
    if ranges.len() == 1 {
        let n = copy_table(tx, table, &info.encoder, None, &mut row)?;
        return Ok((info, now_ms.max(0) as u64, n));
    }
    tracing::debug!(%table, pages, connections = ranges.len(), "copying in ctid ranges");
    let n = std::thread::scope(|scope| -> Result<u64> {
        let (send, recv) = std::sync::mpsc::sync_channel::<(usize, u64, Vec<u8>)>(4 * ranges.len());
        // Batches the writer is done with go back to their reader: fresh 1 MiB buffers would be
        // fresh pages the kernel zeroes, a tenth of the writer's time.
        let mut pools = Vec::new();
        let mut readers = Vec::new();
        for (i, range) in ranges.iter().enumerate() {
            let send = send.clone();
            let (give_back, pool) = std::sync::mpsc::sync_channel::<Vec<u8>>(8);
            pools.push(give_back);
            let fresh = move || match pool.try_recv() {
                Ok(mut b) => {
                    b.clear();
                    b
                }
                Err(_) => Vec::with_capacity(COPY_BATCH_BYTES + 4096),
            };
            let encoder = &info.encoder;
            let range = *range;
            readers.push(
                std::thread::Builder::new()
                    .name(format!("capture-copy-{i}"))
                    .spawn_scoped(scope, move || -> Result<()> {
                        let mut client = connect(url)?;
                        let mut tx = snapshot_transaction(&mut client, snapshot_name)?;
                        let mut batch = fresh();
                        let mut rows = 0u64;
                        copy_table(&mut tx, table, encoder, range, |datum, key| {
                            batch_push(&mut batch, key, datum);
                            rows += 1;
                            if batch.len() >= COPY_BATCH_BYTES {
                                let full = std::mem::replace(&mut batch, fresh());
                                // The writer gone means it failed: its error is the one reported.
                                send.send((i, std::mem::take(&mut rows), full))
                                    .map_err(|_| anyhow::anyhow!("writer stopped"))?;
                            }
                            Ok(())
                        })?;
                        if !batch.is_empty() {
                            send.send((i, rows, batch))
                                .map_err(|_| anyhow::anyhow!("writer stopped"))?;
                        }
                        tx.commit()?;
                        Ok(())
                    })
                    .context("starting a copy thread")?,
            );
        }
        drop(send);
        let mut n = 0u64;
        let mut written: Result<()> = Ok(());
        for (from, rows, batch) in recv.iter() {
            n += rows;
            for (key, datum) in batch_rows(&batch) {
                written = row(datum, key);
                if written.is_err() {
                    break;
                }
            }
            if written.is_err() {
                break;
            }
            // Back to its reader's pool; a full pool or a finished reader frees it instead.
            if let Err(
                std::sync::mpsc::TrySendError::Full(b)
                | std::sync::mpsc::TrySendError::Disconnected(b),
            ) = pools[from].try_send(batch)
            {
                drop(b);
            }
        }
        drop(recv);
        // A reader's own error first (the writer stopping makes the others fail after it).
        let mut first: Option<anyhow::Error> = None;
        for (i, r) in readers.into_iter().enumerate() {
            let r = r
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("copy thread {i} panicked")));
            if let Err(e) = r {
                if first.is_none() && written.is_ok() {
                    first = Some(e.context(format!("copying {table}, ctid range {i}")));
                }
            }
        }
        written?;
        match first {
            Some(e) => Err(e),
            None => Ok(n),
        }
    })?;
    Ok((info, now_ms.max(0) as u64, n))
}

/// The table as it is now, encoded by the capture's mapping: key bytes → row datum (for `verify`).
pub fn read_table(
    url: &str,
    table: &TableName,
    nulls_last: &[String],
) -> Result<std::collections::BTreeMap<Vec<u8>, Vec<u8>>> {
    let mut client = connect(url)?;
    let mut tx = client
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()?;
    let mut info = table_info(&mut tx, table)?;
    super::types::order_nulls(&mut info.encoder.columns, nulls_last);
    let mut rows = std::collections::BTreeMap::new();
    copy_table(&mut tx, table, &info.encoder, None, |datum, key| {
        rows.insert(key.to_vec(), datum.to_vec());
        Ok(())
    })?;
    tx.commit()?;
    Ok(rows)
}

/// The replication connection's URL: `replication=database` and the session settings.
fn replication_url(url: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    let options: String = SESSION_SETTINGS
        .bytes()
        .map(|b| match b {
            b' ' => "%20".to_string(),
            b'=' => "%3D".to_string(),
            _ => (b as char).to_string(),
        })
        .collect();
    format!("{url}{sep}replication=database&options={options}")
}

/// A captured table as the stream knows it: changes are told apart by the relation's OID.
#[derive(Clone, Debug)]
pub struct StreamTable {
    pub name: TableName,
    pub oid: u32,
    pub encoder: RowEncoder,
}

/// The slot's stream of the captured tables' committed transactions (a change of another table the
/// publication publishes is passed over).
pub struct PgReplication {
    rt: tokio::runtime::Runtime,
    stream: LogicalReplicationStream,
    cancel: CancellationToken,
    /// In the capture's order: a change of `tables[i]` is the log's table `i`.
    tables: Vec<StreamTable>,
    /// Where the current transaction's events came from, for errors.
    last_lsn: Lsn,
    /// The source (a regular connection reads the catalog when the table's columns change) and the
    /// snapshot folder (where an announced schema version is found again).
    source_url: String,
    snapshot_dir: std::path::PathBuf,
    /// Column changes to announce at a transaction's start, kept across sessions.
    pub announcements: Announcements,
    /// The open transaction: its commit position and the tables it changed so far.
    tx_final_lsn: Lsn,
    tx_changed: Vec<bool>,
    /// An event to hand out before reading the stream again (an announcement after its Begin).
    pending: Option<SourceEvent>,
}

/// A table whose columns changed inside a transaction that had already changed another captured
/// table: its new version must start at an epoch before that transaction, whose earlier changes
/// are already in the open Kafka transaction. The session fails transiently, and the next one
/// (resuming from the last checkpoint, before this transaction) announces the version as the
/// transaction begins, before any of its changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnnounceAt {
    /// The transaction's commit position (its Begin message's `final_lsn`).
    pub final_lsn: Lsn,
    pub table: usize,
    /// The table's columns from that transaction on (its Relation message).
    pub names: Vec<String>,
}

/// [`AnnounceAt`]s, shared by a capture's sessions.
pub type Announcements = std::sync::Arc<std::sync::Mutex<Vec<AnnounceAt>>>;

impl PgReplication {
    /// Connects the replication session; `create` makes the slot with an exported snapshot (whose
    /// name [`Self::exported_snapshot`] gives until [`ReplicationPort::start`]).
    pub fn connect(
        url: &str,
        slot: &str,
        publication: &str,
        tables: Vec<StreamTable>,
        create: bool,
        snapshot_dir: &std::path::Path,
    ) -> Result<PgReplication> {
        Self::open(url, slot, publication, tables, create, false, snapshot_dir)
    }

    /// A second replication session with a new `TEMPORARY` slot created with an exported
    /// snapshot, for a snapshot of a running capture: returns the session (the snapshot lives
    /// while it does and runs no other command; the slot goes with it), the snapshot's name and
    /// the slot's consistent point, read on `client`. Creating the slot waits for the
    /// transactions open at the time.
    pub fn export_snapshot(
        url: &str,
        slot: &str,
        publication: &str,
        client: &mut postgres::Client,
    ) -> Result<(PgReplication, String, Lsn)> {
        let side = Self::open(
            url,
            slot,
            publication,
            Vec::new(),
            true,
            true,
            std::path::Path::new(""),
        )?;
        let name = side
            .exported_snapshot()
            .with_context(|| format!("slot {slot} was created without an exported snapshot"))?;
        let (consistent, _) = slot_state(client, slot)?
            .with_context(|| format!("temporary slot {slot} vanished after its creation"))?;
        Ok((side, name, consistent))
    }

    fn open(
        url: &str,
        slot: &str,
        publication: &str,
        tables: Vec<StreamTable>,
        create: bool,
        temporary: bool,
        snapshot_dir: &std::path::Path,
    ) -> Result<PgReplication> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let config = ReplicationStreamConfig::new(
            slot.to_string(),
            publication.to_string(),
            1,
            StreamingMode::Off,
            Duration::from_secs(10),
            Duration::from_secs(30),
            Duration::from_secs(60),
            RetryConfig {
                max_attempts: 1,
                ..RetryConfig::default()
            },
        )
        .with_slot_options(ReplicationSlotOptions {
            snapshot: Some(if create { "export" } else { "nothing" }.to_string()),
            temporary,
            ..Default::default()
        })
        .with_existing_slot_required(!create);
        let mut stream = rt
            .block_on(LogicalReplicationStream::new(&replication_url(url), config))
            .map_err(|e| anyhow::anyhow!("opening the replication connection: {e}"))?;
        if create {
            rt.block_on(stream.ensure_replication_slot())
                .map_err(|e| anyhow::anyhow!("creating replication slot {slot}: {e}"))?;
        }
        Ok(PgReplication {
            rt,
            stream,
            cancel: CancellationToken::new(),
            tables,
            last_lsn: 0,
            source_url: url.to_string(),
            snapshot_dir: snapshot_dir.to_path_buf(),
            announcements: Announcements::default(),
            tx_final_lsn: 0,
            tx_changed: Vec::new(),
            pending: None,
        })
    }

    /// The table's columns changed to `names` (a Relation message): columns appended, each
    /// nullable without a default, is a new schema version; any other change stops the capture
    /// (docs/CAPTURE.md "Schema changes"). Returns the new version's row
    /// schema and the epoch it was announced from already, if it was; the encoder then writes the
    /// new columns.
    fn columns_changed(
        &mut self,
        t: usize,
        names: &[String],
    ) -> Result<SourceEvent, CaptureFailure> {
        let captured = &self.tables[t];
        let ours: Vec<&str> = captured
            .encoder
            .columns
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        let refuse = |why: String| {
            CaptureFailure::permanent(format!(
                "the columns of {} changed at LSN {} (now {names:?}, captured {ours:?}): {why} (nothing after the last checkpoint is committed)",
                captured.name,
                format_lsn(self.last_lsn)
            ))
        };
        let now: Vec<&str> = names.iter().map(String::as_str).collect();
        crate::core::capture::columns_followed(&ours, &now).map_err(|why| refuse(why.into()))?;
        let mut client = connect(&self.source_url)
            .map_err(|e| CaptureFailure::transient_from("reading the catalog", e))?;
        let mut info =
            table_info(&mut client, &captured.name).map_err(|e| refuse(crate::error::line(&e)))?;
        let now: Vec<&str> = info
            .encoder
            .columns
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        // Columns added since by a later statement (a capture behind its source meets them in a
        // later Relation message): this version has the message's columns.
        let later = now.len() > names.len() && now[..names.len()] == *names;
        if later {
            info.encoder.columns.truncate(names.len());
        } else if now != names {
            return Err(refuse(format!(
                "the catalog now has {now:?}: the table changed again since"
            )));
        }
        // The columns already captured keep their unions' order; a new one is `[T, "null"]`
        // when it was added nullable with a default (below).
        for (c, was) in info
            .encoder
            .columns
            .iter_mut()
            .zip(&captured.encoder.columns)
        {
            c.null_last = was.null_last;
        }
        // The value a column added with a default holds in the rows already there.
        let mut defaults: Vec<(String, serde_json::Value)> = Vec::new();
        for c in &mut info.encoder.columns[ours.len()..] {
            let row = client
                .query_one(
                    "SELECT a.atthasdef, a.atthasmissing, a.attmissingval::text, format_type(a.atttypid, a.atttypmod) \
                     FROM pg_attribute a WHERE a.attrelid = $1 AND a.attname = $2",
                    &[&info.oid, &c.name],
                )
                .map_err(|e| CaptureFailure::transient_from("reading the catalog", e))?;
            let (has_default, has_missing): (bool, bool) = (row.get(0), row.get(1));
            match (has_default, c.nullable) {
                (false, true) => {}
                (true, _) if has_missing => {
                    // PostgreSQL's missing value: the default evaluated once at the ALTER.
                    let (missing, ty): (Option<String>, String) = (row.get(2), row.get(3));
                    let text: Option<String> = client
                        .query_one(&format!("SELECT (($1::text)::{ty}[])[1]::text"), &[&missing])
                        .map_err(|e| CaptureFailure::transient_from("reading the catalog", e))?
                        .get(0);
                    let value = text
                        .as_deref()
                        .map(|t| super::types::avro_default(&c.ty, t))
                        .transpose()
                        .map_err(|e| refuse(format!("column {}'s default: {e:#}", c.name)))?
                        .flatten()
                        .ok_or_else(|| {
                            refuse(format!(
                                "column {} was added with a default of type {ty}, whose value the log does not carry yet (bytes, numeric with a scale, arrays): add it nullable without a default (then UPDATE it, which the log carries)",
                                c.name
                            ))
                        })?;
                    // A nullable column's union holds the default in its first branch.
                    c.null_last = c.nullable;
                    defaults.push((c.name.clone(), value));
                }
                (true, _) => {
                    return Err(refuse(format!(
                        "column {} was added with a volatile default (or the table was rewritten since): the rows already there hold values the log cannot carry; add it without a default (nullable, then UPDATE it, which the log carries)",
                        c.name
                    )))
                }
                (false, false) => {
                    return Err(refuse(format!(
                        "column {} was added NOT NULL without a default: the log cannot carry what the rows already there hold; add it with a default, or nullable (then UPDATE it, which the log carries)",
                        c.name
                    )))
                }
            }
        }
        let mut row_schema =
            super::types::row_schema(&captured.name.to_string(), &info.encoder.columns);
        super::types::with_defaults(&mut row_schema, &defaults);
        let table = crate::codec::TableSchema::parse(&row_schema.to_string(), &info.primary_key)
            .map_err(|e| refuse(e.to_string()))?;
        let fingerprint = crate::codec::LogCodec::new(table)
            .map_err(|e| refuse(e.to_string()))?
            .fingerprint_hex();
        let announced = crate::snapshot::versions::read(&self.snapshot_dir)
            .map_err(|e| refuse(e.to_string()))?
            .into_iter()
            .find(|v| v.named_fingerprint.as_deref() == Some(fingerprint.as_str()))
            .map(|v| v.from_epoch);
        self.tables[t].encoder = info.encoder;
        Ok(SourceEvent::SchemaChange {
            table: t as TableIndex,
            row_schema: row_schema.to_string(),
            announced,
            now_ms: unix_ms(),
        })
    }

    /// The open transaction changed captured table `t`.
    fn changed(&mut self, t: usize) {
        if let Some(c) = self.tx_changed.get_mut(t) {
            *c = true;
        }
    }

    /// Table `t`'s columns changed to `names` inside the open transaction after it changed other
    /// captured tables (never `t`: a change of `t` before its new columns stops the capture in
    /// [`Self::columns_changed`]'s caller, the core): remembered for the next session, which
    /// announces the version as this transaction begins ([`AnnounceAt`]); this one fails
    /// transiently, and its Kafka transaction is aborted.
    fn announce_at_begin(&mut self, t: usize, names: Vec<String>) -> CaptureFailure {
        let table = self.tables[t].name.to_string();
        let at = format_lsn(self.tx_final_lsn);
        self.announcements.lock().unwrap().push(AnnounceAt {
            final_lsn: self.tx_final_lsn,
            table: t,
            names,
        });
        CaptureFailure::transient(format!(
            "the columns of {table} changed inside the transaction committing at {at}, after its changes to another captured table: resuming from the last checkpoint to announce the new version as that transaction begins"
        ))
    }

    pub fn exported_snapshot(&self) -> Option<String> {
        self.stream.exported_snapshot_name().map(str::to_string)
    }

    /// The server's system identifier and timeline.
    pub fn identity(&self) -> (u64, u32) {
        let id = self.stream.server_identity();
        (id.system_id(), id.timeline())
    }

    /// The captured table a change of relation `oid` (`schema.table`) belongs to; `None` for
    /// another table of the publication. A captured table's name under another OID was dropped and
    /// created again: its changes are not the captured table's, so the capture stops.
    fn table_of(
        &self,
        oid: u32,
        schema: &str,
        table: &str,
    ) -> Result<Option<usize>, CaptureFailure> {
        if let Some(t) = self.tables.iter().position(|t| t.oid == oid) {
            return Ok(Some(t));
        }
        match self
            .tables
            .iter()
            .find(|t| t.name.schema == schema && t.name.table == table)
        {
            Some(t) => Err(CaptureFailure::permanent(format!(
                "{} at LSN {} is relation {oid}, captured as relation {}: the table was dropped and created again; capture it again into a new topic",
                t.name,
                format_lsn(self.last_lsn),
                t.oid
            ))),
            None => Ok(None),
        }
    }

    fn row(
        &self,
        t: usize,
        data: &RowData,
        old: Option<&RowData>,
    ) -> Result<(Vec<u8>, Vec<u8>), CaptureFailure> {
        let captured = &self.tables[t];
        let mut values: Vec<Option<&str>> = Vec::with_capacity(captured.encoder.columns.len());
        for c in &captured.encoder.columns {
            // An unchanged TOASTed value is absent from the new row: the old row (REPLICA
            // IDENTITY FULL) has it.
            let v = data
                .get(&c.name)
                .or_else(|| old.and_then(|o| o.get(&c.name)));
            values.push(match v {
                None | Some(ColumnValue::Null) => None,
                Some(v) => Some(v.as_str().ok_or_else(|| {
                    CaptureFailure::permanent(format!(
                        "{}: column {} is not text at {}",
                        captured.name,
                        c.name,
                        format_lsn(self.last_lsn)
                    ))
                })?),
            });
        }
        captured.encoder.encode(&values).map_err(|e| {
            CaptureFailure::permanent_from(
                format!("{} at LSN {}", captured.name, format_lsn(self.last_lsn)),
                e,
            )
        })
    }
}

impl ReplicationPort for PgReplication {
    fn start(&mut self, lsn: Lsn) -> Result<Lsn, CaptureFailure> {
        let confirmed = self
            .rt
            .block_on(self.stream.slot_confirmed_flush_lsn())
            .map_err(|e| {
                CaptureFailure::transient_from("reading the slot's confirmed position", e)
            })?;
        self.rt
            .block_on(self.stream.start(Some(lsn)))
            .map_err(|e| {
                CaptureFailure::transient_from(
                    format!("START_REPLICATION at {}", format_lsn(lsn)),
                    e,
                )
            })?;
        Ok(confirmed.map_or(0, |l| l.0))
    }

    fn next(&mut self, idle: Duration) -> Result<SourceEvent, CaptureFailure> {
        if let Some(event) = self.pending.take() {
            return Ok(event);
        }
        loop {
            let (stream, cancel) = (&mut self.stream, &self.cancel);
            let event = match self
                .rt
                .block_on(async { tokio::time::timeout(idle, stream.next_event(cancel)).await })
            {
                Err(_) => {
                    return Ok(SourceEvent::Idle {
                        wal_end: self.stream.current_lsn(),
                        now_ms: unix_ms(),
                    })
                }
                Ok(Err(e)) => return Err(CaptureFailure::transient_from("replication stream", e)),
                Ok(Ok(event)) => event,
            };
            // A Relation message carries no position of its own: the transaction's is kept.
            if event.lsn.0 != 0 {
                self.last_lsn = event.lsn.0;
            }
            match event.event_type {
                EventType::Begin {
                    final_lsn,
                    commit_timestamp,
                    ..
                } => {
                    self.tx_final_lsn = final_lsn.0;
                    self.tx_changed.clear();
                    self.tx_changed.resize(self.tables.len(), false);
                    let due = {
                        let mut list = self.announcements.lock().unwrap();
                        let due = list.iter().position(|a| a.final_lsn == final_lsn.0);
                        due.map(|i| list.remove(i))
                    };
                    if let Some(a) = due {
                        // Before any change of the transaction: the version starts at the
                        // barrier the core puts before it.
                        self.pending = Some(self.columns_changed(a.table, &a.names)?);
                    }
                    return Ok(SourceEvent::Begin {
                        final_lsn: final_lsn.0,
                        commit_ms: commit_timestamp.timestamp_millis().max(0) as u64,
                    });
                }
                EventType::Commit { end_lsn, .. } => {
                    return Ok(SourceEvent::Commit { end_lsn: end_lsn.0 })
                }
                EventType::Insert {
                    schema,
                    table,
                    relation_oid,
                    data,
                } => {
                    let Some(t) = self.table_of(relation_oid, &schema, &table)? else {
                        continue;
                    };
                    self.changed(t);
                    let (row, key) = self.row(t, &data, None)?;
                    let change = RowChange::Insert { key, row };
                    return Ok(SourceEvent::Change {
                        table: t as TableIndex,
                        change,
                    });
                }
                EventType::Update {
                    schema,
                    table,
                    relation_oid,
                    old_data,
                    new_data,
                    ..
                } => {
                    let Some(t) = self.table_of(relation_oid, &schema, &table)? else {
                        continue;
                    };
                    self.changed(t);
                    let old = old_data.ok_or_else(|| {
                        CaptureFailure::permanent(format!("{}: an update at LSN {} came without its old row: the table's REPLICA IDENTITY is no longer FULL", self.tables[t].name, format_lsn(self.last_lsn)))
                    })?;
                    let (old_row, old_key) = self.row(t, &old, None)?;
                    let (new_row, new_key) = self.row(t, &new_data, Some(&old))?;
                    let change = RowChange::Update {
                        old_key,
                        old_row,
                        new_key,
                        new_row,
                    };
                    return Ok(SourceEvent::Change {
                        table: t as TableIndex,
                        change,
                    });
                }
                EventType::Delete {
                    schema,
                    table,
                    relation_oid,
                    old_data,
                    ..
                } => {
                    let Some(t) = self.table_of(relation_oid, &schema, &table)? else {
                        continue;
                    };
                    self.changed(t);
                    let (row, key) = self.row(t, &old_data, None)?;
                    let change = RowChange::Delete { key, row };
                    return Ok(SourceEvent::Change {
                        table: t as TableIndex,
                        change,
                    });
                }
                EventType::Truncate { tables, .. } => {
                    // The captured tables among those emptied (another table of the publication
                    // is nothing for the log): a truncation of each (docs/WIRE.md "Truncate").
                    let truncated: Vec<TableIndex> = self
                        .tables
                        .iter()
                        .enumerate()
                        .filter(|(_, t)| tables.iter().any(|n| **n == t.name.to_string()))
                        .map(|(i, _)| i as TableIndex)
                        .collect();
                    if !truncated.is_empty() {
                        return Ok(SourceEvent::Truncate { tables: truncated });
                    }
                }
                EventType::Relation {
                    relation_id,
                    columns,
                    ..
                } => {
                    let Some(t) = self.tables.iter().position(|t| t.oid == relation_id) else {
                        continue;
                    };
                    let encoder = &self.tables[t].encoder;
                    let same = columns.len() == encoder.columns.len()
                        && columns
                            .iter()
                            .zip(&encoder.columns)
                            .all(|(c, o)| *c.name == o.name);
                    if !same {
                        let names: Vec<String> =
                            columns.iter().map(|c| c.name.to_string()).collect();
                        if self.tx_changed.iter().any(|c| *c) && !self.tx_changed[t] {
                            return Err(self.announce_at_begin(t, names));
                        }
                        return self.columns_changed(t, &names);
                    }
                }
                // Types, origins, messages: nothing for the log.
                _ => {}
            }
        }
    }

    fn ack(&mut self, lsn: Lsn) -> Result<(), CaptureFailure> {
        self.stream.shared_lsn_feedback.update_flushed_lsn(lsn);
        self.stream.shared_lsn_feedback.update_applied_lsn(lsn);
        self.rt.block_on(self.stream.send_feedback()).map_err(|e| {
            CaptureFailure::transient_from(format!("acknowledging {}", format_lsn(lsn)), e)
        })
    }
}

impl Drop for PgReplication {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::types::{PgColumn, PgType};

    #[test]
    fn ctid_ranges_cover_every_page_once_and_small_tables_get_one_copy() {
        assert_eq!(ctid_ranges(0, 4), vec![None]);
        assert_eq!(
            ctid_ranges(PAGES_PER_COPY_CONNECTION * 2 - 1, 2),
            vec![None]
        );
        assert_eq!(ctid_ranges(PAGES_PER_COPY_CONNECTION * 10, 1), vec![None]);
        for (pages, parts) in [
            (2 * PAGES_PER_COPY_CONNECTION, 2),
            (100_003, 3),
            (99_999, 16),
        ] {
            let r = ctid_ranges(pages, parts);
            assert!(r.len() > 1 && r.len() <= parts, "{pages} {parts}: {r:?}");
            let r: Vec<CtidRange> = r.into_iter().map(Option::unwrap).collect();
            assert_eq!(r[0].from, 0);
            for w in r.windows(2) {
                assert_eq!(w[0].to, Some(w[1].from), "{r:?}");
                assert!(w[0].from < w[1].from);
            }
            assert_eq!(r.last().unwrap().to, None, "the last range is open-ended");
        }
    }

    /// A `BufRead` that hands over the stream in pieces of `piece` bytes.
    struct Pieces<'a> {
        data: &'a [u8],
        piece: usize,
    }

    impl std::io::Read for Pieces<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let n = out.len().min(self.piece).min(self.data.len());
            out[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    impl std::io::BufRead for Pieces<'_> {
        fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
            Ok(&self.data[..self.piece.min(self.data.len())])
        }
        fn consume(&mut self, n: usize) {
            self.data = &self.data[n..];
        }
    }

    #[test]
    fn copy_rows_reads_rows_split_across_buffers_and_refuses_a_cut_one() {
        let encoder = RowEncoder {
            columns: vec![
                PgColumn {
                    name: "id".into(),
                    ty: PgType::Int4,
                    nullable: false,
                    null_last: false,
                },
                PgColumn {
                    name: "s".into(),
                    ty: PgType::Text,
                    nullable: true,
                    null_last: false,
                },
            ],
            key: vec![0],
        };
        let table = TableName::parse("public.t").unwrap();
        let text = b"1\tone\n2\t\\N\n3\ttab\\there\n";
        let want = {
            let mut rows = Vec::new();
            copy_rows(
                Pieces {
                    data: text,
                    piece: text.len(),
                },
                &table,
                &encoder,
                |d, k| {
                    rows.push((k.to_vec(), d.to_vec()));
                    Ok(())
                },
            )
            .unwrap();
            rows
        };
        assert_eq!(want.len(), 3);
        for piece in 1..text.len() {
            let mut rows = Vec::new();
            let n = copy_rows(Pieces { data: text, piece }, &table, &encoder, |d, k| {
                rows.push((k.to_vec(), d.to_vec()));
                Ok(())
            })
            .unwrap();
            assert_eq!((n, &rows), (3, &want), "pieces of {piece}");
        }
        let cut = copy_rows(
            Pieces {
                data: &text[..text.len() - 3],
                piece: 5,
            },
            &table,
            &encoder,
            |_, _| Ok(()),
        )
        .unwrap_err();
        assert!(cut.to_string().contains("ended inside row 2"), "{cut}");
    }

    #[test]
    fn a_copy_batch_gives_back_its_rows_in_order() {
        let mut batch = Vec::new();
        let rows: Vec<(Vec<u8>, Vec<u8>)> = (0..100u32)
            .map(|i| (i.to_be_bytes().to_vec(), vec![b'x'; i as usize]))
            .collect();
        for (k, d) in &rows {
            batch_push(&mut batch, k, d);
        }
        let back: Vec<(Vec<u8>, Vec<u8>)> = batch_rows(&batch)
            .map(|(k, d)| (k.to_vec(), d.to_vec()))
            .collect();
        assert_eq!(back, rows);
    }
}
