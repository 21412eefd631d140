//! The one MariaDB → Avro mapping: a captured table's row schema from `information_schema`, and
//! each value as the server hands it (the binary protocol of the snapshot's `SELECT`, or a binlog
//! row image) encoded as Avro binary. The snapshot and the stream both call [`MyEncoder::encode`],
//! so a value is encoded identically on both paths (docs/CAPTURE.md, "MariaDB", is this table):
//!
//! | MariaDB | Avro |
//! |---|---|
//! | tinyint, smallint, mediumint, int (signed); tinyint, smallint, mediumint unsigned; year | int |
//! | int unsigned, bigint | long |
//! | bigint unsigned | bytes, logicalType decimal (precision 20, scale 0) |
//! | decimal(p,s) | bytes, logicalType decimal (precision p, scale s) |
//! | float / double | float / double |
//! | char, varchar, text (all sizes; MariaDB's json is longtext) | string |
//! | binary, varbinary, blob (all sizes) | bytes |
//! | date | int, logicalType date |
//! | datetime | long, logicalType local-timestamp-micros |
//! | timestamp | long, logicalType timestamp-micros (UTC) |
//! | time | long, logicalType time-micros (negative and over 24 h kept as is) |
//! | enum | string (the label) |
//! | set | string (the labels, `,`-separated, in definition order) |
//! | bit(n) | long |
//! | a nullable column | union `["null", T]`, default null |
//!
//! Anything else is refused at start with an error naming the column and its type. No I/O here.

use anyhow::{bail, Context, Result};
use mysql::Value;
use serde_json::json;

use crate::capture::types::{
    days_from_civil, decimal_bytes, encode_fields, put_bytes, put_field_in,
};
use crate::codec::varint::put_long;

/// A column's MariaDB type, as far as the mapping knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MyType {
    /// `unsigned_bits`: the width of an unsigned column (0 when signed): a binlog without the
    /// signedness metadata (MariaDB's default `binlog_row_metadata = NO_LOG`) sends its values as
    /// signed, and they are read back modulo 2^bits.
    Int {
        unsigned_bits: u8,
    },
    Long {
        unsigned_bits: u8,
    },
    /// bigint unsigned and decimal(p,s).
    Decimal {
        precision: u32,
        scale: u32,
        unsigned_bits: u8,
    },
    Float,
    Double,
    /// Text in the column's character set: UTF-8 (utf8mb4, utf8mb3, ascii), or MariaDB's latin1
    /// (Windows-1252) decoded to UTF-8.
    Text {
        latin1: bool,
    },
    Bytes,
    Date,
    Datetime,
    Timestamp,
    Time,
    Enum(Vec<String>),
    Set(Vec<String>),
    Bit,
}

impl MyType {
    /// The mapping of an `information_schema.COLUMNS` row: `DATA_TYPE`, `COLUMN_TYPE` (which says
    /// `unsigned` and holds enum and set labels), `NUMERIC_PRECISION`, `NUMERIC_SCALE`.
    pub fn from_catalog(
        data_type: &str,
        column_type: &str,
        precision: Option<u64>,
        scale: Option<u64>,
        charset: Option<&str>,
    ) -> Result<MyType, String> {
        let latin1 = match charset {
            None | Some("utf8mb4" | "utf8mb3" | "utf8" | "ascii" | "binary") => false,
            Some("latin1") => true,
            Some(other) => {
                return Err(format!(
                    "character set {other} has no mapping (utf8mb4, utf8mb3, ascii and latin1 do; docs/CAPTURE.md, \"MariaDB\")"
                ))
            }
        };
        let unsigned = column_type.contains("unsigned");
        let bits = |b: u8| if unsigned { b } else { 0 };
        Ok(match data_type {
            "tinyint" => MyType::Int {
                unsigned_bits: bits(8),
            },
            "smallint" => MyType::Int {
                unsigned_bits: bits(16),
            },
            "mediumint" => MyType::Int {
                unsigned_bits: bits(24),
            },
            "year" => MyType::Int { unsigned_bits: 0 },
            "int" if !unsigned => MyType::Int { unsigned_bits: 0 },
            "int" => MyType::Long { unsigned_bits: 32 },
            "bigint" if !unsigned => MyType::Long { unsigned_bits: 0 },
            "bigint" => MyType::Decimal {
                precision: 20,
                scale: 0,
                unsigned_bits: 64,
            },
            "decimal" => MyType::Decimal {
                precision: precision.unwrap_or(10) as u32,
                scale: scale.unwrap_or(0) as u32,
                unsigned_bits: 0,
            },
            "float" => MyType::Float,
            "double" => MyType::Double,
            "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" | "json" => {
                MyType::Text { latin1 }
            }
            "binary" | "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => {
                MyType::Bytes
            }
            "date" => MyType::Date,
            "datetime" => MyType::Datetime,
            "timestamp" => MyType::Timestamp,
            "time" => MyType::Time,
            "enum" => MyType::Enum(labels(column_type)?),
            "set" => MyType::Set(labels(column_type)?),
            "bit" => MyType::Bit,
            other => {
                return Err(format!(
                    "type {other} has no mapping (docs/CAPTURE.md, \"MariaDB\")"
                ))
            }
        })
    }

    fn avro(&self) -> serde_json::Value {
        match self {
            MyType::Int { .. } => json!("int"),
            MyType::Long { .. } | MyType::Bit => json!("long"),
            MyType::Decimal {
                precision, scale, ..
            } => json!({
                "type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale
            }),
            MyType::Float => json!("float"),
            MyType::Double => json!("double"),
            MyType::Text { .. } | MyType::Enum(_) | MyType::Set(_) => json!("string"),
            MyType::Bytes => json!("bytes"),
            MyType::Date => json!({"type": "int", "logicalType": "date"}),
            MyType::Datetime => json!({"type": "long", "logicalType": "local-timestamp-micros"}),
            MyType::Timestamp => json!({"type": "long", "logicalType": "timestamp-micros"}),
            MyType::Time => json!({"type": "long", "logicalType": "time-micros"}),
        }
    }

    /// The expression the snapshot selects for a column `quoted`: enum, set and bit as their
    /// numbers, as the binlog carries them.
    pub fn select(&self, quoted: &str) -> String {
        match self {
            MyType::Enum(_) | MyType::Set(_) | MyType::Bit => format!("({quoted} + 0)"),
            _ => quoted.to_string(),
        }
    }
}

/// The quoted labels of `enum('a','b')` / `set('a','b')`.
fn labels(column_type: &str) -> Result<Vec<String>, String> {
    let inner = column_type
        .split_once('(')
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .ok_or_else(|| format!("{column_type}: no labels"))?;
    let mut out = Vec::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\'' {
            continue;
        }
        let mut label = String::new();
        loop {
            match chars.next() {
                Some('\'') if chars.peek() == Some(&'\'') => {
                    chars.next();
                    label.push('\'');
                }
                Some('\'') => break,
                Some('\\') => label.extend(chars.next()),
                Some(ch) => label.push(ch),
                None => return Err(format!("{column_type}: an unterminated label")),
            }
        }
        out.push(label);
    }
    Ok(out)
}

/// One column of a captured table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MyColumn {
    pub name: String,
    pub ty: MyType,
    pub nullable: bool,
    /// A nullable column added with a default: its union is `[T, "null"]`, as PostgreSQL's
    /// (`crate::capture::types::PgColumn::null_last`). Set from the row schema in force.
    pub null_last: bool,
}

/// A captured table's row schema (Avro JSON) for its columns, in column order.
pub fn row_schema(table: &str, columns: &[MyColumn]) -> serde_json::Value {
    let mut schema = crate::capture::types::record_schema(
        table,
        columns
            .iter()
            .map(|c| (c.name.as_str(), c.ty.avro(), c.nullable)),
    );
    if let Some(fields) = schema["fields"].as_array_mut() {
        for (f, c) in fields.iter_mut().zip(columns) {
            if c.nullable && c.null_last {
                *f = serde_json::json!({"name": c.name, "type": [c.ty.avro(), "null"]});
            }
        }
    }
    schema
}

/// Marks the nullable columns named in `nulls_last` as written `[T, "null"]`
/// ([`crate::capture::types::nulls_last`] of the row schema in force), the others `["null", T]`.
pub fn order_nulls(columns: &mut [MyColumn], nulls_last: &[String]) {
    for c in columns {
        c.null_last = c.nullable && nulls_last.contains(&c.name);
    }
}

/// Encodes rows of one table: server values in, row datum and key bytes out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MyEncoder {
    pub columns: Vec<MyColumn>,
    /// Column indices of the primary key, in key order.
    pub key: Vec<usize>,
}

impl MyEncoder {
    /// The row datum and its key bytes; `values[i]` is column `i`'s value.
    pub fn encode(&self, values: &[Value]) -> Result<(Vec<u8>, Vec<u8>)> {
        if values.len() != self.columns.len() {
            bail!(
                "the row has {} values, the table {} columns",
                values.len(),
                self.columns.len()
            );
        }
        encode_fields(self.columns.len(), &self.key, |i, datum| {
            let (c, v) = (&self.columns[i], &values[i]);
            let value = (*v != Value::NULL).then_some(v);
            put_field_in(
                datum,
                &c.name,
                c.nullable,
                c.null_last,
                value,
                |v, datum| {
                    encode_value(&c.ty, v, datum)
                        .with_context(|| format!("column {} ({:?}) value {v:?}", c.name, c.ty))
                },
            )
        })
    }
}

fn text(v: &Value) -> Result<&str> {
    match v {
        Value::Bytes(b) => std::str::from_utf8(b).context("not UTF-8"),
        other => bail!("expected text, got {other:?}"),
    }
}

/// An integer as the server sends it: a number, or its text; a negative number of an unsigned
/// column of `unsigned_bits` is read modulo 2^bits.
fn integer(v: &Value, unsigned_bits: u8) -> Result<i128> {
    Ok(match v {
        Value::Int(i) if *i < 0 && unsigned_bits > 0 => *i as i128 + (1i128 << unsigned_bits),
        Value::Int(i) => *i as i128,
        Value::UInt(u) => *u as i128,
        Value::Bytes(_) => text(v)?.trim().parse()?,
        other => bail!("expected an integer, got {other:?}"),
    })
}

/// An enum's index, a set's bit mask or a bit field's value: the snapshot selects each `+ 0` (a
/// number); the binlog sends an enum's index as a number, a set's mask little-endian and a bit
/// field big-endian.
fn number(ty: &MyType, v: &Value) -> Result<u64> {
    Ok(match (ty, v) {
        (_, Value::Int(i)) => *i as u64,
        (_, Value::UInt(u)) => *u,
        (MyType::Set(_), Value::Bytes(b)) => b
            .iter()
            .rev()
            .fold(0u64, |acc, byte| (acc << 8) | *byte as u64),
        (_, Value::Bytes(b)) => b.iter().fold(0u64, |acc, byte| (acc << 8) | *byte as u64),
        (_, other) => bail!("expected a number, got {other:?}"),
    })
}

/// The Avro default (JSON) of a column of type `ty` whose value is `v` (as the server returns
/// `DEFAULT(column)`): what the rows already there hold when a `NOT NULL` column is added with a
/// literal default. `None` for a type whose Avro default is not written here
/// (`capture::types::avro_json`).
pub fn avro_default(ty: &MyType, v: &Value) -> Result<Option<serde_json::Value>> {
    let mut datum = Vec::new();
    encode_value(ty, v, &mut datum)?;
    crate::capture::types::avro_json(&ty.avro(), &datum)
}

fn encode_value(ty: &MyType, v: &Value, out: &mut Vec<u8>) -> Result<()> {
    match ty {
        MyType::Int { unsigned_bits } => {
            put_long(out, i32::try_from(integer(v, *unsigned_bits)?)? as i64)
        }
        MyType::Long { unsigned_bits } => {
            put_long(out, i64::try_from(integer(v, *unsigned_bits)?)?)
        }
        MyType::Decimal {
            scale,
            unsigned_bits,
            ..
        } => {
            let t = match v {
                Value::Int(_) | Value::UInt(_) => integer(v, *unsigned_bits)?.to_string(),
                _ => text(v)?.to_string(),
            };
            put_bytes(out, &decimal_bytes(&t, *scale)?)
        }
        MyType::Float => match v {
            Value::Float(f) => out.extend_from_slice(&f.to_le_bytes()),
            Value::Double(d) => out.extend_from_slice(&(*d as f32).to_le_bytes()),
            _ => out.extend_from_slice(&text(v)?.parse::<f32>()?.to_le_bytes()),
        },
        MyType::Double => match v {
            Value::Double(d) => out.extend_from_slice(&d.to_le_bytes()),
            Value::Float(f) => out.extend_from_slice(&(*f as f64).to_le_bytes()),
            _ => out.extend_from_slice(&text(v)?.parse::<f64>()?.to_le_bytes()),
        },
        MyType::Text { latin1: false } => put_bytes(out, text(v)?.as_bytes()),
        MyType::Text { latin1: true } => match v {
            Value::Bytes(b) => put_bytes(out, latin1_to_utf8(b).as_bytes()),
            other => bail!("expected text, got {other:?}"),
        },
        MyType::Bytes => match v {
            Value::Bytes(b) => put_bytes(out, b),
            other => bail!("expected bytes, got {other:?}"),
        },
        MyType::Date => match v {
            Value::Date(y, m, d, ..) => {
                put_long(out, days_from_civil(*y as i64, *m as i64, *d as i64))
            }
            other => bail!("expected a date, got {other:?}"),
        },
        MyType::Datetime => put_long(out, civil_micros(v)?),
        MyType::Timestamp => {
            // The snapshot reads in time zone +00:00 (a civil time in UTC); the binlog sends the
            // Unix seconds, as a number or `seconds[.micros]` text.
            let micros = match v {
                Value::Date(..) => civil_micros(v)?,
                Value::Int(s) => s * 1_000_000,
                Value::Bytes(_) => {
                    let t = text(v)?;
                    let (s, f) = t.split_once('.').unwrap_or((t, ""));
                    let frac: i64 = if f.is_empty() {
                        0
                    } else {
                        format!("{f:0<6}")[..6].parse()?
                    };
                    s.parse::<i64>()? * 1_000_000 + frac
                }
                other => bail!("expected a timestamp, got {other:?}"),
            };
            put_long(out, micros)
        }
        MyType::Time => match v {
            Value::Time(neg, days, h, m, s, us) => {
                let micros = (((*days as i64 * 24 + *h as i64) * 60 + *m as i64) * 60 + *s as i64)
                    * 1_000_000
                    + *us as i64;
                put_long(out, if *neg { -micros } else { micros })
            }
            other => bail!("expected a time, got {other:?}"),
        },
        MyType::Enum(labels) => {
            let i = number(ty, v)?;
            let label = (i as usize)
                .checked_sub(1)
                .and_then(|i| labels.get(i))
                .with_context(|| format!("enum index {i} is none of {} labels", labels.len()))?;
            put_bytes(out, label.as_bytes())
        }
        MyType::Set(labels) => {
            let mask = number(ty, v)?;
            let chosen: Vec<&str> = labels
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1u64 << i) != 0)
                .map(|(_, l)| l.as_str())
                .collect();
            put_bytes(out, chosen.join(",").as_bytes())
        }
        MyType::Bit => put_long(out, number(ty, v)? as i64),
    }
    Ok(())
}

/// MariaDB's latin1 (Windows-1252, its five unassigned bytes kept as the C1 controls) as UTF-8.
fn latin1_to_utf8(b: &[u8]) -> String {
    const HIGH: [char; 32] = [
        '\u{20ac}', '\u{81}', '\u{201a}', '\u{192}', '\u{201e}', '\u{2026}', '\u{2020}',
        '\u{2021}', '\u{2c6}', '\u{2030}', '\u{160}', '\u{2039}', '\u{152}', '\u{8d}', '\u{17d}',
        '\u{8f}', '\u{90}', '\u{2018}', '\u{2019}', '\u{201c}', '\u{201d}', '\u{2022}', '\u{2013}',
        '\u{2014}', '\u{2dc}', '\u{2122}', '\u{161}', '\u{203a}', '\u{153}', '\u{9d}', '\u{17e}',
        '\u{178}',
    ];
    b.iter()
        .map(|&c| match c {
            0x80..=0x9f => HIGH[(c - 0x80) as usize],
            _ => c as char,
        })
        .collect()
}

/// Microseconds since 1970-01-01 00:00 of a civil date and time.
fn civil_micros(v: &Value) -> Result<i64> {
    match v {
        Value::Date(y, mo, d, h, mi, s, us) => {
            let days = days_from_civil(*y as i64, *mo as i64, *d as i64);
            Ok(((days * 24 + *h as i64) * 60 + *mi as i64) * 60_000_000
                + *s as i64 * 1_000_000
                + *us as i64)
        }
        other => bail!("expected a date and time, got {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(ty: MyType, v: Value) -> Vec<u8> {
        let e = MyEncoder {
            columns: vec![MyColumn {
                name: "c".into(),
                ty,
                nullable: false,
                null_last: false,
            }],
            key: vec![0],
        };
        e.encode(&[v]).unwrap().0
    }

    /// The snapshot's and the binlog's forms of one value encode to the same bytes.
    #[test]
    fn the_snapshot_form_and_the_binlog_form_encode_alike() {
        let labels = || vec!["a".to_string(), "b,c".to_string(), "d".to_string()];
        // A set: `+ 0` in the snapshot, a little-endian mask in the binlog.
        assert_eq!(
            one(MyType::Set(labels()), Value::UInt(5)),
            one(MyType::Set(labels()), Value::Bytes(vec![5]))
        );
        // A bit field: `+ 0` against big-endian bytes.
        assert_eq!(
            one(MyType::Bit, Value::UInt(258)),
            one(MyType::Bit, Value::Bytes(vec![1, 2]))
        );
        // A timestamp: a civil time in UTC against the binlog's Unix seconds.
        assert_eq!(
            one(
                MyType::Timestamp,
                Value::Date(2026, 12, 6, 17, 30, 1, 250_000)
            ),
            one(MyType::Timestamp, Value::Bytes(b"1796578201.25".to_vec()))
        );
        // Unsigned columns from a binlog without signedness metadata.
        let big = MyType::Decimal {
            precision: 20,
            scale: 0,
            unsigned_bits: 64,
        };
        assert_eq!(
            one(big.clone(), Value::UInt(u64::MAX)),
            one(big, Value::Int(-1))
        );
        let int = MyType::Long { unsigned_bits: 32 };
        assert_eq!(
            one(int.clone(), Value::UInt(4_000_000_000)),
            one(int, Value::Int(4_000_000_000 - (1 << 32)))
        );
        assert_eq!(
            one(MyType::Enum(labels()), Value::Int(2)),
            [6, b'b', b',', b'c'].to_vec()
        );
    }

    #[test]
    fn labels_are_read_with_quotes_and_commas() {
        assert_eq!(
            labels("enum('a','it''s','x,y')").unwrap(),
            vec!["a", "it's", "x,y"]
        );
        assert!(
            MyType::from_catalog("geometry", "geometry", None, None, None)
                .unwrap_err()
                .contains("geometry")
        );
        assert!(
            MyType::from_catalog("text", "text", None, None, Some("sjis"))
                .unwrap_err()
                .contains("sjis")
        );
        assert_eq!(latin1_to_utf8(b"caf\xe9 \x80"), "café €");
    }
}
