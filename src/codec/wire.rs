//! Log records on the wire: Avro single-object encoding (`C3 01`, the CRC-64-AVRO fingerprint of the
//! writer schema little-endian, then the datum) of the log-record union `[Change, Barrier]`, or of
//! the truncation record (`schemas/truncate.avsc`).

use apache_avro::rabin::Rabin;
use std::sync::Arc;

use apache_avro::Schema;

use super::table::TableSchema;
use super::varint::{get_long, put_long};
use super::versions::{Evolution, SchemaChangeError, SchemaVersions};
use crate::core::{Barrier, BarrierKind, Change, Epoch, LogRecord, Op, Row, Truncate};

/// The two bytes every single-object-encoded datum starts with.
pub const SINGLE_OBJECT_MARKER: [u8; 2] = [0xC3, 0x01];

/// The log-record schema with the example row, as published in `schemas/log_record.avsc`.
const LOG_RECORD_TEMPLATE: &str = include_str!("../../schemas/log_record.avsc");

/// The truncation record's schema (`schemas/truncate.avsc`): one writer schema for every table,
/// which the record names by its index.
const TRUNCATE_SCHEMA: &str = include_str!("../../schemas/truncate.avsc");

/// The fingerprint of [`TRUNCATE_SCHEMA`] (its Parsing Canonical Form's CRC-64-AVRO).
pub fn truncate_fingerprint() -> [u8; 8] {
    static FP: std::sync::OnceLock<[u8; 8]> = std::sync::OnceLock::new();
    *FP.get_or_init(|| {
        let schema = Schema::parse_str(TRUNCATE_SCHEMA).expect("schemas/truncate.avsc parses");
        schema
            .fingerprint::<Rabin>()
            .bytes
            .try_into()
            .expect("8 bytes")
    })
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("bad schema: {0}")]
    Schema(String),
    #[error("not Avro single-object encoding: first bytes {0}")]
    NoMarker(String),
    #[error("unknown writer schema fingerprint {found} (expected {expected})")]
    UnknownFingerprint { found: String, expected: String },
    #[error("truncated or malformed datum: {0}")]
    Decode(String),
    #[error("cannot encode: {0}")]
    Encode(String),
    #[error(transparent)]
    SchemaChange(#[from] SchemaChangeError),
}

/// Encodes and decodes one table's log records. In a log of several tables (docs/WIRE.md,
/// "Several tables") it decodes its own table's changes whole and the other tables' by their
/// header only (epoch, op, vnode and the message key: what the contract checks), told apart by
/// their writer schemas' fingerprints.
#[derive(Clone, Debug)]
pub struct LogCodec {
    pub table: TableSchema,
    pub schema: Schema,
    fingerprint: [u8; 8],
    /// This table's index among the log's tables (0 in a one-table log).
    index: u16,
    /// The other tables' fingerprints and indexes, with the row schema of each the job also
    /// materialises (decoded whole; [`LogCodec::of_tables`]).
    others: Vec<([u8; 8], u16, Option<TableSchema>)>,
    /// The log's later schema versions (docs/WIRE.md "Schema changes"), when it has a place for
    /// them: a change written with one is read with its own version.
    evolution: Option<Arc<Evolution>>,
}

impl LogCodec {
    /// The codec for a table: the published log-record schema with the table's row record substituted.
    pub fn new(table: TableSchema) -> Result<Self, CodecError> {
        let mut json: serde_json::Value = serde_json::from_str(LOG_RECORD_TEMPLATE)
            .map_err(|e| CodecError::Schema(e.to_string()))?;
        let row_field = json[0]["fields"]
            .as_array_mut()
            .and_then(|fs| fs.iter_mut().find(|f| f["name"] == "row"))
            .ok_or_else(|| CodecError::Schema("log_record.avsc has no Change.row field".into()))?;
        row_field["type"] = table.json.clone();
        let schema = Schema::parse(&json).map_err(|e| CodecError::Schema(e.to_string()))?;
        let fp = schema.fingerprint::<Rabin>().bytes;
        let fingerprint: [u8; 8] = fp
            .try_into()
            .map_err(|_| CodecError::Schema("fingerprint size".into()))?;
        Ok(LogCodec {
            table,
            schema,
            fingerprint,
            index: 0,
            others: Vec::new(),
            evolution: None,
        })
    }

    /// This codec, reading changes written with any of `evolution`'s versions.
    pub fn with_evolution(mut self, evolution: Arc<Evolution>) -> Self {
        self.evolution = Some(evolution);
        self
    }

    /// The schema versions this codec reads, if the log has a place for them.
    pub fn evolution(&self) -> Option<&Arc<Evolution>> {
        self.evolution.as_ref()
    }

    /// The writer-schema fingerprint of this table's manifest version.
    pub fn fingerprint(&self) -> [u8; 8] {
        self.fingerprint
    }

    /// The codec of table `own` of a log carrying `tables` (in manifest order).
    pub fn of_log(tables: &[TableSchema], own: usize) -> Result<Self, CodecError> {
        let table = tables
            .get(own)
            .ok_or_else(|| CodecError::Schema(format!("no table {own} in the log")))?;
        let mut codec = LogCodec::new(table.clone())?;
        codec.index = own as u16;
        for (i, t) in tables.iter().enumerate() {
            if i != own {
                let other = LogCodec::new(t.clone())?;
                codec.others.push((other.fingerprint, i as u16, None));
            }
        }
        Ok(codec)
    }

    /// The codec of a job materialising tables `own` (indexes, ascending) of a log carrying
    /// `tables`: each of them decoded whole, the others by their header. Its [`table`](Self::table)
    /// is the first of `own`.
    pub fn of_tables(tables: &[TableSchema], own: &[u16]) -> Result<Self, CodecError> {
        let first = *own
            .first()
            .ok_or_else(|| CodecError::Schema("a job of no table".into()))?;
        let mut codec = LogCodec::of_log(tables, first as usize)?;
        for (_, i, whole) in codec.others.iter_mut() {
            if own.contains(i) {
                *whole = Some(tables[*i as usize].clone());
            }
        }
        Ok(codec)
    }

    /// The row schema of every table the job materialises, by its index among the log's tables:
    /// this table's, then the others of [`of_tables`](Self::of_tables).
    pub fn materialised(&self) -> Vec<(u16, TableSchema)> {
        let mut out = vec![(self.index, self.table.clone())];
        for (_, i, whole) in &self.others {
            if let Some(t) = whole {
                out.push((*i, t.clone()));
            }
        }
        out
    }

    /// This table's index among the log's tables.
    pub fn index(&self) -> u16 {
        self.index
    }

    pub fn fingerprint_hex(&self) -> String {
        hex(&self.fingerprint)
    }

    fn header(&self, out: &mut Vec<u8>, union_index: i64) {
        out.extend_from_slice(&SINGLE_OBJECT_MARKER);
        out.extend_from_slice(&self.fingerprint);
        put_long(out, union_index);
    }

    /// Encodes a change whose row datum is already encoded.
    pub fn encode_change(&self, epoch: Epoch, op: Op, vnode: u16, row_datum: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + row_datum.len());
        self.header(&mut out, 0);
        put_long(&mut out, epoch.0 as i64);
        put_long(
            &mut out,
            Op::ALL.iter().position(|o| *o == op).expect("op") as i64,
        );
        put_long(&mut out, vnode as i64);
        out.extend_from_slice(row_datum);
        out
    }

    pub fn encode_barrier(&self, b: &Barrier) -> Vec<u8> {
        let mut out = Vec::with_capacity(32);
        self.header(&mut out, 1);
        put_long(&mut out, b.prev.0 as i64);
        put_long(&mut out, b.curr.0 as i64);
        let kind = match b.kind {
            BarrierKind::Initial => 0,
            BarrierKind::Barrier => 1,
            BarrierKind::Checkpoint => 2,
        };
        put_long(&mut out, kind);
        out
    }

    /// Encodes the truncation of log table `table` at `epoch` (docs/WIRE.md "Truncate").
    pub fn encode_truncate(epoch: Epoch, table: u16) -> Vec<u8> {
        let mut out = Vec::with_capacity(24);
        out.extend_from_slice(&SINGLE_OBJECT_MARKER);
        out.extend_from_slice(&truncate_fingerprint());
        put_long(&mut out, epoch.0 as i64);
        put_long(&mut out, table as i64);
        out
    }

    /// How many tables the log has (this one and the others).
    fn log_tables(&self) -> usize {
        1 + self.others.len()
    }

    fn decode_truncate(&self, mut buf: &[u8]) -> Result<LogRecord, CodecError> {
        let mut long = |what: &str| {
            get_long(&mut buf).ok_or_else(|| CodecError::Decode(format!("{what}: truncated")))
        };
        let epoch = Epoch(long("Truncate.epoch")? as u64);
        let table = long("Truncate.table")?;
        if !buf.is_empty() {
            return Err(CodecError::Decode(format!(
                "{} trailing bytes after the truncation",
                buf.len()
            )));
        }
        // The manifest's tables, and those added to the log since (docs/WIRE.md "Tables added").
        let mut tables = self.log_tables();
        if let Some(ev) = &self.evolution {
            let mut vs = ev.current();
            if table >= vs.table_count() as i64 {
                vs = ev.refresh()?;
            }
            tables = tables.max(vs.table_count());
        }
        match u16::try_from(table) {
            Ok(t) if (t as usize) < tables => Ok(LogRecord::Truncate(Truncate { epoch, table: t })),
            _ => Err(CodecError::Decode(format!(
                "Truncate.table: the log has {tables} table(s), no table {table}"
            ))),
        }
    }

    /// Decodes one message value; `key` is the message key (the row's key bytes for a change).
    pub fn decode(&self, value: &[u8], key: Option<&[u8]>) -> Result<LogRecord, CodecError> {
        if value.len() < 10 || value[..2] != SINGLE_OBJECT_MARKER {
            return Err(CodecError::NoMarker(hex(&value[..value.len().min(4)])));
        }
        let fp = &value[2..10];
        if *fp == truncate_fingerprint() {
            return self.decode_truncate(&value[10..]);
        }
        // (table, version, the versions when a later one is involved)
        // (table, version, the versions when a later one is involved, the row schema of another
        // table decoded whole)
        let mut whole: Option<&TableSchema> = None;
        let (table, version, versions): (u16, usize, Option<Arc<SchemaVersions>>) =
            if *fp == self.fingerprint {
                (self.index, 0, None)
            } else if let Some((_, i, w)) = self.others.iter().find(|(f, _, _)| *fp == *f) {
                whole = w.as_ref();
                (*i, 0, None)
            } else if let Some(ev) = &self.evolution {
                // A later version: known, or announced since the versions were read.
                let mut vs = ev.current();
                if vs.by_fingerprint(fp).is_none() {
                    vs = ev.refresh()?;
                }
                let Some((t, k)) = vs.by_fingerprint(fp) else {
                    return Err(CodecError::UnknownFingerprint {
                        found: hex(fp),
                        expected: self.fingerprint_hex(),
                    });
                };
                (t as u16, k, Some(vs))
            } else {
                return Err(CodecError::UnknownFingerprint {
                    found: hex(fp),
                    expected: self.fingerprint_hex(),
                });
            };
        let mut buf = &value[10..];
        let long = |buf: &mut &[u8], what: &str| {
            get_long(buf).ok_or_else(|| CodecError::Decode(format!("{what}: truncated")))
        };
        match long(&mut buf, "union index")? {
            0 => {
                let epoch = Epoch(long(&mut buf, "Change.epoch")? as u64);
                let op = match long(&mut buf, "Change.op")? {
                    i @ 0..=3 => Op::ALL[i as usize],
                    i => {
                        return Err(CodecError::Decode(format!(
                            "Change.op: enum index {i} out of range"
                        )))
                    }
                };
                let vnode = long(&mut buf, "Change.vnode")?;
                let vnode = u16::try_from(vnode).map_err(|_| {
                    CodecError::Decode(format!("Change.vnode: {vnode} out of range"))
                })?;
                // A change is written with the version in force at its epoch.
                let versions = match (&self.evolution, versions) {
                    (Some(ev), None) if !ev.before_first_change(epoch) => Some(ev.current()),
                    (_, vs) => vs,
                };
                if let Some(vs) = &versions {
                    let due = vs.at(table as usize, epoch);
                    if due != version {
                        let v = &vs.of(table as usize)[due];
                        return Err(CodecError::Decode(format!(
                            "a change at epoch {epoch} is written with schema version {version} of table {}, but version {due} (fingerprint {}) is in force from epoch {}",
                            v.table.name,
                            hex(&v.fingerprint),
                            v.from_epoch
                        )));
                    }
                }
                let row_table = match (&versions, whole) {
                    (Some(vs), _) if table == self.index => &vs.of(table as usize)[version].table,
                    (_, Some(w)) => w,
                    _ => &self.table,
                };
                if table != self.index && whole.is_none() {
                    // Another table's change: its header for the contract, its row left unread.
                    let Some(key) = key else {
                        return Err(CodecError::Decode("change without a message key".into()));
                    };
                    return Ok(LogRecord::Change(Change {
                        epoch,
                        op,
                        vnode,
                        table,
                        row: Row {
                            key: key.to_vec(),
                            value: Vec::new(),
                        },
                    }));
                }
                let Some(key) = key else {
                    row_table
                        .check_row(buf)
                        .map_err(|e| CodecError::Decode(format!("Change.row: {e}")))?;
                    return Err(CodecError::Decode("change without a message key".into()));
                };
                // The message key must be the row's key bytes: they decide the vnode and which
                // stored row a DELETE or UPDATE replaces.
                let key_matches = row_table
                    .check_row_key(buf, key)
                    .map_err(|e| CodecError::Decode(format!("Change.row: {e}")))?;
                if !key_matches {
                    let row_key = row_table.key_of_datum(buf)?;
                    return Err(CodecError::Decode(format!(
                        "the message key {} is not the row's primary-key bytes {}",
                        hex(&key[..key.len().min(32)]),
                        hex(&row_key[..row_key.len().min(32)])
                    )));
                }
                Ok(LogRecord::Change(Change {
                    epoch,
                    op,
                    vnode,
                    table,
                    row: Row {
                        key: key.to_vec(),
                        value: buf.to_vec(),
                    },
                }))
            }
            1 => {
                let prev = Epoch(long(&mut buf, "Barrier.prev_epoch")? as u64);
                let curr = Epoch(long(&mut buf, "Barrier.curr_epoch")? as u64);
                let kind = match long(&mut buf, "Barrier.kind")? {
                    0 => BarrierKind::Initial,
                    1 => BarrierKind::Barrier,
                    2 => BarrierKind::Checkpoint,
                    i => {
                        return Err(CodecError::Decode(format!(
                            "Barrier.kind: enum index {i} out of range"
                        )))
                    }
                };
                if !buf.is_empty() {
                    return Err(CodecError::Decode(format!(
                        "{} trailing bytes after the barrier",
                        buf.len()
                    )));
                }
                // A version starts after a checkpoint barrier and is announced before it: at
                // each one, the versions are read again if more are announced.
                let mut schema_change = false;
                if let Some(ev) = &self.evolution {
                    let vs = if kind == BarrierKind::Checkpoint {
                        ev.refresh_if_grown()?
                    } else {
                        ev.current()
                    };
                    schema_change = vs.starts_at(curr);
                    if schema_change && kind != BarrierKind::Checkpoint {
                        return Err(CodecError::Decode(format!(
                            "the barrier into epoch {curr} is a {kind:?} barrier, but a schema version starts at epoch {curr}: a version starts after a CHECKPOINT barrier"
                        )));
                    }
                }
                Ok(LogRecord::Barrier(Barrier {
                    prev,
                    curr,
                    kind,
                    schema_change,
                }))
            }
            i => Err(CodecError::Decode(format!(
                "log record union index {i} out of range"
            ))),
        }
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
