//! The binlog as a [`ReplicationPort`]: row events of the captured tables, a transaction per
//! `BEGIN` … `XID` (or `COMMIT`), handed to the capture loop whole.
//!
//! A reader thread owns the binlog connection (`COM_BINLOG_DUMP` from the resume position, with a
//! 1 s heartbeat so it notices when the port is dropped), encodes each captured row with the one
//! mapping (`types.rs`) and sends each committed transaction's events through a bounded channel;
//! [`ReplicationPort::next`] waits on it at most `idle`. A transaction is held in memory until its
//! commit event (the binlog writes a transaction contiguously at its commit). The binlog has no
//! slot to acknowledge: [`ReplicationPort::ack`] records nothing, and a binlog purged before the
//! capture resumes is a named permanent error.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::Duration;

use mysql::binlog::events::{EventData, RowsEventData};
use mysql::binlog::value::BinlogValue;
use mysql::prelude::Queryable;
use mysql::{BinlogRequest, Value};

use super::MyTable;
use crate::capture::{CaptureFailure, ReplicationPort};
use crate::core::capture::{Lsn, RowChange, SourceEvent, TableIndex};

/// The binlog stream of the captured tables.
pub struct MyReplication {
    url: String,
    snapshot_dir: PathBuf,
    server_id: u32,
    base: String,
    tables: Arc<Vec<MyTable>>,
    rx: Option<Receiver<Result<Vec<SourceEvent>, CaptureFailure>>>,
    queue: VecDeque<SourceEvent>,
    /// The end of the last event read outside a transaction (a transaction boundary).
    boundary: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl MyReplication {
    /// `tables` with the columns in force at the resume position; `snapshot_dir` holds the
    /// capture's manifest and announced schema versions.
    pub fn new(
        url: &str,
        server_id: u32,
        base: &str,
        tables: Vec<MyTable>,
        snapshot_dir: &Path,
    ) -> Self {
        MyReplication {
            url: url.to_string(),
            snapshot_dir: snapshot_dir.to_path_buf(),
            server_id,
            base: base.to_string(),
            tables: Arc::new(tables),
            rx: None,
            queue: VecDeque::new(),
            boundary: Arc::new(AtomicU64::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl Drop for MyReplication {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl ReplicationPort for MyReplication {
    fn start(&mut self, lsn: Lsn) -> Result<Lsn, CaptureFailure> {
        let (file, pos) = super::position(&self.base, lsn);
        let mut conn = super::connect(&self.url).map_err(|e| {
            CaptureFailure::transient_from("connecting to MariaDB for the binlog", e)
        })?;
        let (_, files) = super::binlogs(&mut conn)
            .map_err(|e| CaptureFailure::transient_from("listing the binary logs", e))?;
        if !files.contains(&file) {
            return Err(CaptureFailure::permanent(format!(
                "binlog {file}, which holds the capture's resume position {file}:{pos}, was purged from the server (it has {}): the changes since cannot be read; capture into a new topic",
                files.join(", ")
            )));
        }
        conn.query_drop("SET @master_heartbeat_period = 1000000000")
            .map_err(|e| CaptureFailure::transient_from("setting the binlog heartbeat", e))?;
        self.boundary.store(lsn, Ordering::SeqCst);
        let (tx, rx) = sync_channel(16);
        let reader = Reader {
            tables: self.tables.as_ref().clone(),
            url: self.url.clone(),
            snapshot_dir: self.snapshot_dir.clone(),
            base: self.base.clone(),
            boundary: self.boundary.clone(),
            stop: self.stop.clone(),
            tx,
            seq: (lsn >> 32) as u32,
        };
        let request = BinlogRequest::new(self.server_id)
            .with_filename(file.into_bytes())
            .with_pos(pos);
        let stream = conn
            .get_binlog_stream(request)
            .map_err(|e| CaptureFailure::transient_from("requesting the binlog", e))?;
        std::thread::Builder::new()
            .name("capture-binlog".into())
            .spawn(move || reader.run(stream))
            .map_err(|e| CaptureFailure::transient_from("starting the binlog reader", e))?;
        self.rx = Some(rx);
        Ok(lsn)
    }

    fn next(&mut self, idle: Duration) -> Result<SourceEvent, CaptureFailure> {
        if let Some(e) = self.queue.pop_front() {
            return Ok(e);
        }
        let rx = self
            .rx
            .as_ref()
            .ok_or_else(|| CaptureFailure::transient("the binlog was not started"))?;
        match rx.recv_timeout(idle) {
            Ok(Ok(events)) => {
                self.queue.extend(events);
                self.next(idle)
            }
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => {
                // The boundary first, then the channel once more: the reader stores a boundary
                // only after sending the transactions before it, so a boundary read here with
                // nothing in the channel has every transaction before it delivered. Read the
                // other way round, a transaction sent in between would be reported as passed
                // and dropped by the assembler (found by tests/it/capture_mariadb.rs's TPC-B run).
                let wal_end = self.boundary.load(Ordering::SeqCst);
                match rx.try_recv() {
                    Ok(Ok(events)) => {
                        self.queue.extend(events);
                        self.next(idle)
                    }
                    Ok(Err(e)) => Err(e),
                    Err(_) => Ok(SourceEvent::Idle {
                        wal_end,
                        now_ms: crate::capture::unix_ms(),
                    }),
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                Err(CaptureFailure::transient("the binlog reader stopped"))
            }
        }
    }

    fn ack(&mut self, _lsn: Lsn) -> Result<(), CaptureFailure> {
        Ok(())
    }
}

struct Reader {
    /// The captured tables with the columns the binlog's rows have now (a column added is
    /// followed here: [`Reader::columns_added`]).
    tables: Vec<MyTable>,
    url: String,
    /// Where announced schema versions are found again (a replayed ALTER announces none twice).
    snapshot_dir: PathBuf,
    base: String,
    boundary: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    tx: SyncSender<Result<Vec<SourceEvent>, CaptureFailure>>,
    seq: u32,
}

/// What a statement outside a transaction does to the captured tables.
#[derive(Debug, PartialEq, Eq)]
enum Ddl {
    /// Nothing (or it names none of them).
    Other,
    /// `TRUNCATE [TABLE] t` of the captured table at this index.
    Truncate(usize),
    /// Any other statement naming the captured table at this index.
    Changes(usize),
}

/// Reads a statement run in database `db`: which captured table it names, and whether it is a
/// TRUNCATE of it. A name is matched as an identifier (quoted or bare, with or without its
/// database), never as part of a longer one.
fn ddl(text: &str, db: &str, tables: &[MyTable]) -> Ddl {
    let words = identifiers(text);
    let Some(first) = words.first() else {
        return Ddl::Other;
    };
    let named = |w: &str| {
        tables.iter().position(|t| {
            let (wdb, wt) = w.rsplit_once('.').unwrap_or((db, w));
            wt.eq_ignore_ascii_case(&t.name.table) && wdb.eq_ignore_ascii_case(&t.database)
        })
    };
    if first.eq_ignore_ascii_case("truncate") {
        let target = match words.get(1) {
            Some(w) if w.eq_ignore_ascii_case("table") => words.get(2),
            other => other,
        };
        if let Some(i) = target.and_then(|w| named(w)) {
            return Ddl::Truncate(i);
        }
    }
    match words.iter().find_map(|w| named(w)) {
        Some(i) => Ddl::Changes(i),
        None => Ddl::Other,
    }
}

/// The statement's words and identifiers, backquotes removed and `a`.`b` joined as `a.b`.
fn identifiers(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = text.chars().peekable();
    let flush = |cur: &mut String, out: &mut Vec<String>| {
        if !cur.is_empty() {
            out.push(std::mem::take(cur));
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '`' => {
                while let Some(q) = chars.next() {
                    if q == '`' {
                        if chars.peek() == Some(&'`') {
                            chars.next();
                            cur.push('`');
                        } else {
                            break;
                        }
                    } else {
                        cur.push(q);
                    }
                }
            }
            '.' => cur.push('.'),
            c if c.is_alphanumeric() || c == '_' || c == '$' => cur.push(c),
            _ => flush(&mut cur, &mut out),
        }
    }
    flush(&mut cur, &mut out);
    out
}

/// The sequence number of binlog file `name` of `base` (`base.NNNNNN`, the checksum's 4 bytes
/// possibly after it).
fn rotated_seq(name: &str, base: &str) -> Option<u32> {
    let rest = name
        .as_bytes()
        .strip_prefix(format!("{base}.").as_bytes())?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    // Six digits then the checksum: the checksum's own bytes may look like digits, and the name
    // reaches here converted lossily (a byte that is not UTF-8 becomes the 3-byte U+FFFD), so
    // the checksum takes 4 to 12 bytes: ten or more after the base name are six digits and it.
    let n = if rest.len() >= 10 { 6 } else { digits };
    std::str::from_utf8(&rest[..n.min(digits)])
        .ok()?
        .parse()
        .ok()
}

fn cut(s: &str) -> String {
    s.chars().take(120).collect()
}

/// A binlog row image as the mapping's values.
fn values(row: mysql::binlog::row::BinlogRow) -> Result<Vec<Value>, String> {
    row.unwrap()
        .into_iter()
        .map(|v| match v {
            BinlogValue::Value(v) => Ok(v),
            BinlogValue::Jsonb(_) | BinlogValue::JsonDiff(_) => {
                Err("a MySQL binary JSON value (MariaDB's json is text)".to_string())
            }
        })
        .collect()
}

impl Reader {
    /// A statement named captured table `index`: the table's columns as the catalog has them now
    /// against the capture's. The same columns are no change (`None`); columns added at the end,
    /// each nullable without a default or with a literal one (`NOT NULL` or not), are a new
    /// schema version of the table (its
    /// event, and the reader's mapping moves to the new columns); anything else is the reason
    /// the capture stops (docs/CAPTURE.md, "MariaDB"). The catalog is read after the statement:
    /// if the table changed again since, a later row's column count differs and stops the
    /// capture before it is read with a wrong mapping.
    fn columns_added(&mut self, index: usize) -> Result<Option<SourceEvent>, String> {
        let t = &self.tables[index];
        let mut conn = super::connect(&self.url).map_err(|e| crate::error::line(&e))?;
        let mut now = super::table_info(&mut conn, &t.database, &t.name)
            .map_err(|e| crate::error::line(&e))?;
        // The columns already captured keep their unions' order; a new one is `[T, "null"]`
        // when it was added nullable with a default (below).
        for (c, was) in now.encoder.columns.iter_mut().zip(&t.encoder.columns) {
            c.null_last = was.null_last;
        }
        let names = |t: &MyTable| -> Vec<String> {
            t.encoder.columns.iter().map(|c| c.name.clone()).collect()
        };
        let (ours, theirs) = (names(t), names(&now));
        if now.encoder == t.encoder {
            return Ok(None);
        }
        let ours_: Vec<&str> = ours.iter().map(String::as_str).collect();
        let theirs_: Vec<&str> = theirs.iter().map(String::as_str).collect();
        let n = ours.len();
        let followed = crate::core::capture::columns_followed(&ours_, &theirs_).and_then(|()| {
            if now.encoder.columns[..n] == t.encoder.columns[..] && now.encoder.key == t.encoder.key
            {
                Ok(())
            } else {
                Err("a column was retyped; only columns added at the end are followed")
            }
        });
        if let Err(why) = followed {
            return Err(format!(
                "its columns are now {theirs:?}, captured {ours:?}: {why} (nothing after the last checkpoint is committed; capture into a new topic)"
            ));
        }
        // The value a column added with a literal default holds in the rows already there.
        let mut defaults: Vec<(String, serde_json::Value)> = Vec::new();
        for c in &mut now.encoder.columns[n..] {
            let default: Option<Option<String>> = conn
                .exec_first(
                    "SELECT COLUMN_DEFAULT FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND COLUMN_NAME = ?",
                    (&t.database, &t.name.table, &c.name),
                )
                .map_err(|e| format!("reading the catalog: {e}"))?;
            let default = default.flatten().filter(|d| d != "NULL");
            let literal = default
                .as_deref()
                .is_some_and(|d| d.starts_with('\'') || d.parse::<f64>().is_ok());
            match (c.nullable, &default) {
                (true, None) => {}
                (_, Some(_)) if literal => {
                    let column = format!("`{}`", c.name.replace('`', "``"));
                    let select = format!(
                        "SELECT {} FROM {} LIMIT 1",
                        c.ty.select(&format!("DEFAULT({column})")),
                        t.quoted()
                    );
                    let value: Option<mysql::Value> = conn
                        .exec_first(&select, ())
                        .map_err(|e| format!("reading column {}'s default: {e}", c.name))?;
                    let Some(value) = value else {
                        return Err(format!(
                            "column {} was added with a default to an empty table: add it nullable without a default (then UPDATE it, which the log carries)",
                            c.name
                        ));
                    };
                    let json = super::types::avro_default(&c.ty, &value)
                        .map_err(|e| format!("column {}'s default: {e:#}", c.name))?
                        .ok_or_else(|| {
                            format!(
                                "column {} was added with a default of a type whose value the log does not carry yet (binary, decimal): add it nullable without a default (then UPDATE it, which the log carries)",
                                c.name
                            )
                        })?;
                    // A nullable column's union holds the default in its first branch.
                    c.null_last = c.nullable;
                    defaults.push((c.name.clone(), json));
                }
                (_, Some(d)) => {
                    return Err(format!(
                        "column {} was added with the default {d}, an expression: the rows already there hold its value at the ALTER, which the catalog does not keep; add it nullable without a default (then UPDATE it, which the log carries)",
                        c.name
                    ))
                }
                (false, None) => {
                    return Err(format!(
                        "column {} was added NOT NULL without a default: the log cannot carry what the rows already there hold; add it with a default, or nullable (then UPDATE it, which the log carries)",
                        c.name
                    ))
                }
            }
        }
        let mut row_schema = super::types::row_schema(&t.name.to_string(), &now.encoder.columns);
        crate::capture::types::with_defaults(&mut row_schema, &defaults);
        let table = crate::codec::TableSchema::parse(&row_schema.to_string(), &now.primary_key)
            .map_err(|e| e.to_string())?;
        let fingerprint = crate::codec::LogCodec::new(table)
            .map_err(|e| e.to_string())?
            .fingerprint_hex();
        let announced = crate::snapshot::versions::read(&self.snapshot_dir)
            .map_err(|e| e.to_string())?
            .into_iter()
            .find(|v| v.named_fingerprint.as_deref() == Some(fingerprint.as_str()))
            .map(|v| v.from_epoch);
        tracing::info!(table = %now.quoted(), columns = ?theirs, "columns added at the end: a new schema version");
        self.tables[index].encoder = now.encoder;
        Ok(Some(SourceEvent::SchemaChange {
            table: index as crate::core::capture::TableIndex,
            row_schema: row_schema.to_string(),
            announced,
            now_ms: crate::capture::unix_ms(),
        }))
    }

    fn run(mut self, stream: mysql::BinlogStream) {
        if let Err(e) = self.read(stream) {
            // The port gone means nobody waits for the error.
            let _ = self.tx.send(Err(e));
        }
    }

    fn read(&mut self, mut stream: mysql::BinlogStream) -> Result<(), CaptureFailure> {
        let mut open: Option<(u64, Vec<SourceEvent>)> = None;
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let Some(event) = stream.next() else {
                return Err(CaptureFailure::transient(
                    "the server ended the binlog stream",
                ));
            };
            let event =
                event.map_err(|e| CaptureFailure::transient_from("reading the binlog", e))?;
            let header = event.header();
            let end = super::lsn(self.seq, header.log_pos() as u64);
            let data = event.read_data().map_err(|e| {
                CaptureFailure::permanent_from(
                    format!("decoding the binlog event ending at {end:#x}"),
                    e,
                )
            })?;
            let commit =
                |open: &mut Option<(u64, Vec<SourceEvent>)>| -> Result<(), CaptureFailure> {
                    if let Some((commit_ms, changes)) = open.take() {
                        if !changes.is_empty() {
                            let start = end - header.event_size() as u64;
                            let mut events = Vec::with_capacity(changes.len() + 2);
                            events.push(SourceEvent::Begin {
                                final_lsn: start,
                                commit_ms,
                            });
                            events.extend(changes);
                            events.push(SourceEvent::Commit { end_lsn: end });
                            if self.tx.send(Ok(events)).is_err() {
                                return Ok(());
                            }
                        }
                    }
                    self.boundary.store(end, Ordering::SeqCst);
                    Ok(())
                };
            match data {
                // A rotate names the file the next events are in: a real one ends a file, an
                // artificial one (timestamp 0) starts the stream and follows a server restart. An
                // artificial one comes before the format description, so its name may still carry
                // the 4 checksum bytes: the number is read from the base name's digits only.
                Some(EventData::RotateEvent(r)) => {
                    self.seq = rotated_seq(&r.name(), &self.base).ok_or_else(|| {
                        CaptureFailure::permanent(format!(
                            "binlog rotate to {:?}, not a file of {}",
                            r.name(),
                            self.base
                        ))
                    })?;
                }
                Some(EventData::QueryEvent(q)) => {
                    let text = q.query();
                    let text = text.trim();
                    if text.eq_ignore_ascii_case("BEGIN") {
                        open = Some((header.timestamp() as u64 * 1000, Vec::new()));
                    } else if text.eq_ignore_ascii_case("COMMIT") {
                        commit(&mut open)?;
                    } else if open.is_none() {
                        // A statement outside a transaction (DDL). TRUNCATE of a captured table is
                        // carried as a transaction of its own; any other statement naming one
                        // (ALTER, RENAME, DROP, …) stops the capture before a row of another shape
                        // is read with the old mapping. Otherwise a boundary.
                        let db = q.schema();
                        match ddl(text, &db, &self.tables) {
                            Ddl::Other => self.boundary.store(end, Ordering::SeqCst),
                            Ddl::Truncate(index) => {
                                let start = end - header.event_size() as u64;
                                let events = vec![
                                    SourceEvent::Begin {
                                        final_lsn: start,
                                        commit_ms: header.timestamp() as u64 * 1000,
                                    },
                                    SourceEvent::Truncate {
                                        tables: vec![index as TableIndex],
                                    },
                                    SourceEvent::Commit { end_lsn: end },
                                ];
                                if self.tx.send(Ok(events)).is_err() {
                                    return Ok(());
                                }
                                self.boundary.store(end, Ordering::SeqCst);
                            }
                            Ddl::Changes(index) => {
                                let at = super::format_lsn(&self.base, end);
                                let table = self.tables[index].quoted();
                                let refuse = |why: String| {
                                    CaptureFailure::permanent(format!(
                                        "{table} changed ({:?} at binlog {at}): {why}",
                                        cut(text),
                                    ))
                                };
                                let Some(change) = self.columns_added(index).map_err(refuse)?
                                else {
                                    // Named, but its columns are as they were (an index, a
                                    // comment, another table's statement): a boundary.
                                    self.boundary.store(end, Ordering::SeqCst);
                                    continue;
                                };
                                let start = end - header.event_size() as u64;
                                let events = vec![
                                    SourceEvent::Begin {
                                        final_lsn: start,
                                        commit_ms: header.timestamp() as u64 * 1000,
                                    },
                                    change,
                                    SourceEvent::Commit { end_lsn: end },
                                ];
                                if self.tx.send(Ok(events)).is_err() {
                                    return Ok(());
                                }
                                self.boundary.store(end, Ordering::SeqCst);
                            }
                        }
                    }
                }
                Some(EventData::XidEvent(_)) => commit(&mut open)?,
                Some(EventData::RowsEvent(rows)) => {
                    let Some(tme) = stream.get_tme(rows.table_id()) else {
                        return Err(CaptureFailure::permanent(format!(
                            "a row event of table id {} before its table map (binlog at {end:#x})",
                            rows.table_id()
                        )));
                    };
                    let (db, name) = (tme.database_name(), tme.table_name());
                    let Some(index) = self
                        .tables
                        .iter()
                        .position(|t| t.database == db && t.name.table == name)
                    else {
                        continue;
                    };
                    let t = &self.tables[index];
                    if tme.columns_count() as usize != t.encoder.columns.len() {
                        return Err(CaptureFailure::permanent(format!(
                            "the columns of {} changed (the binlog's row has {} columns, the capture {}) without a statement the capture followed; capture into a new topic",
                            t.quoted(),
                            tme.columns_count(),
                            t.encoder.columns.len()
                        )));
                    }
                    let Some((_, changes)) = open.as_mut() else {
                        return Err(CaptureFailure::permanent(format!(
                            "a row change of {} outside a transaction (binlog at {end:#x})",
                            t.quoted()
                        )));
                    };
                    for r in rows.rows(tme) {
                        let (before, after) = r.map_err(|e| {
                            CaptureFailure::permanent_from(
                                format!("decoding a row of {}", t.quoted()),
                                e,
                            )
                        })?;
                        let encode = |row: mysql::binlog::row::BinlogRow| {
                            let v = values(row).map_err(|m| {
                                CaptureFailure::permanent(format!("a row of {}: {m}", t.quoted()))
                            })?;
                            t.encoder.encode(&v).map_err(|e| {
                                CaptureFailure::permanent_from(
                                    format!(
                                        "encoding a row of {} (binlog at {end:#x})",
                                        t.quoted()
                                    ),
                                    e,
                                )
                            })
                        };
                        let change = match (&rows, before, after) {
                            (RowsEventData::WriteRowsEvent(_) | RowsEventData::WriteRowsEventV1(_), _, Some(a)) => {
                                let (row, key) = encode(a)?;
                                RowChange::Insert { key, row }
                            }
                            (RowsEventData::DeleteRowsEvent(_) | RowsEventData::DeleteRowsEventV1(_), Some(b), _) => {
                                let (row, key) = encode(b)?;
                                RowChange::Delete { key, row }
                            }
                            (_, Some(b), Some(a)) => {
                                let (old_row, old_key) = encode(b)?;
                                let (new_row, new_key) = encode(a)?;
                                RowChange::Update {
                                    old_key,
                                    old_row,
                                    new_key,
                                    new_row,
                                }
                            }
                            _ => {
                                return Err(CaptureFailure::permanent(format!(
                                    "a row event of {} without the images it needs (binlog_row_image = FULL?)",
                                    t.quoted()
                                )))
                            }
                        };
                        changes.push(SourceEvent::Change {
                            table: index as TableIndex,
                            change,
                        });
                    }
                }
                // Table maps are kept by the stream; format descriptions, heartbeats, MariaDB's
                // own events (GTID lists, annotations, checkpoints) carry nothing captured.
                // Outside a transaction such an event is a boundary too (a real one: an
                // artificial event has no position): after a rotation the binlog's end is past
                // the new file's first events, and a snapshot of the running capture taken on an
                // idle server there has its point at that end.
                _ => {
                    if open.is_none() && header.log_pos() > 0 {
                        self.boundary.fetch_max(end, Ordering::SeqCst);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::mariadb::types::MyEncoder;
    use crate::config::TableName;

    fn table(db: &str, name: &str) -> MyTable {
        MyTable {
            database: db.into(),
            name: TableName {
                schema: db.into(),
                table: name.into(),
            },
            encoder: MyEncoder {
                columns: Vec::new(),
                key: Vec::new(),
            },
            primary_key: Vec::new(),
        }
    }

    #[test]
    fn a_rotate_names_its_file_with_or_without_the_checksum() {
        assert_eq!(rotated_seq("mariadb-bin.000042", "mariadb-bin"), Some(42));
        assert_eq!(
            rotated_seq("mariadb-bin.0000427\u{1}x9", "mariadb-bin"),
            Some(42)
        );
        assert_eq!(
            rotated_seq("mariadb-bin.1000000", "mariadb-bin"),
            Some(1_000_000)
        );
        // A checksum whose first byte is a digit and the others not UTF-8, as the lossy name
        // has it (a test run resumed at mariadb-bin.000167 for .000016: "purged").
        assert_eq!(
            rotated_seq("mariadb-bin.0000167\u{FFFD}\u{FFFD}\u{FFFD}", "mariadb-bin"),
            Some(16)
        );
        assert_eq!(
            rotated_seq("mariadb-bin.00001678\u{FFFD}\u{FFFD}", "mariadb-bin"),
            Some(16)
        );
        assert_eq!(rotated_seq("other.000001", "mariadb-bin"), None);
    }

    #[test]
    fn statements_are_told_by_the_tables_they_name() {
        let tables = [table("shop", "t"), table("shop", "orders")];
        assert_eq!(ddl("TRUNCATE TABLE `t`", "shop", &tables), Ddl::Truncate(0));
        assert_eq!(
            ddl("truncate shop.orders", "other", &tables),
            Ddl::Truncate(1)
        );
        assert_eq!(ddl("TRUNCATE `shop`.`t`", "x", &tables), Ddl::Truncate(0));
        assert_eq!(
            ddl("ALTER TABLE t MODIFY v bigint", "shop", &tables),
            Ddl::Changes(0)
        );
        assert_eq!(
            ddl("RENAME TABLE orders TO o2", "shop", &tables),
            Ddl::Changes(1)
        );
        // Another database's t, a longer name, a table of another database named in passing.
        assert_eq!(ddl("TRUNCATE t", "other", &tables), Ddl::Other);
        assert_eq!(ddl("ALTER TABLE t2 ADD c int", "shop", &tables), Ddl::Other);
        assert_eq!(ddl("CREATE TABLE x (t int)", "other", &tables), Ddl::Other);
    }
}
