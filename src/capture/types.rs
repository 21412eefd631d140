//! The one PostgreSQL → Avro mapping: a captured table's row schema from its catalog, and each
//! value's text form (what both `COPY … TO STDOUT` and pgoutput send) encoded as Avro binary. The
//! snapshot copy and the stream both call [`RowEncoder::encode`], so a value is encoded identically
//! on both paths (docs/CAPTURE.md, "Types", is this table):
//!
//! | PostgreSQL | Avro |
//! |---|---|
//! | smallint, integer | int |
//! | bigint | long |
//! | real / double precision (NaN, ±Infinity kept) | float / double |
//! | numeric(p,s) | bytes, logicalType decimal (precision p, scale s); NaN and ±Infinity refused |
//! | numeric (no typmod) | string (the exact text) |
//! | boolean | boolean |
//! | text, varchar, char(n), name | string |
//! | bytea | bytes |
//! | uuid | string, logicalType uuid |
//! | date | int, logicalType date (±infinity refused) |
//! | time | long, logicalType time-micros |
//! | timestamp | long, logicalType local-timestamp-micros |
//! | timestamptz | long, logicalType timestamp-micros (UTC) |
//! | interval | string (PostgreSQL's text) |
//! | json, jsonb | string |
//! | an enum type | string |
//! | a one-dimensional array of the above | array of the element's type (elements nullable) |
//! | a nullable column | union `["null", T]`, default null |
//! | a `NOT NULL` column added later with a default | T, with that value as its default ([`avro_default`]) |
//!
//! Anything else is refused at start with an error naming the column and its type. No I/O here.

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::codec::varint::put_long;

/// A column's PostgreSQL type, as far as the mapping knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PgType {
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    Numeric { precision: u32, scale: u32 },
    NumericText,
    Bool,
    Text,
    Bytea,
    Uuid,
    Date,
    Time,
    Timestamp,
    Timestamptz,
    Interval,
    Json,
    Enum,
    Array(Box<PgType>),
}

impl PgType {
    /// The mapping of a catalog type: its name, `typtype` ('e' for an enum), type modifier, and
    /// for an array its element's name and `typtype`.
    pub fn from_catalog(
        name: &str,
        typtype: &str,
        typmod: i32,
        element: Option<(&str, &str)>,
    ) -> Result<PgType, String> {
        if let Some((ename, etyptype)) = element {
            let inner = PgType::from_catalog(ename, etyptype, typmod, None)?;
            return Ok(PgType::Array(Box::new(inner)));
        }
        if typtype == "e" {
            return Ok(PgType::Enum);
        }
        Ok(match name {
            "int2" => PgType::Int2,
            "int4" => PgType::Int4,
            "int8" => PgType::Int8,
            "float4" => PgType::Float4,
            "float8" => PgType::Float8,
            "numeric" if typmod >= 4 => {
                let m = (typmod - 4) as u32;
                PgType::Numeric {
                    precision: (m >> 16) & 0xffff,
                    scale: m & 0xffff,
                }
            }
            "numeric" => PgType::NumericText,
            "bool" => PgType::Bool,
            "text" | "varchar" | "bpchar" | "name" => PgType::Text,
            "bytea" => PgType::Bytea,
            "uuid" => PgType::Uuid,
            "date" => PgType::Date,
            "time" => PgType::Time,
            "timestamp" => PgType::Timestamp,
            "timestamptz" => PgType::Timestamptz,
            "interval" => PgType::Interval,
            "json" | "jsonb" => PgType::Json,
            other => {
                return Err(format!(
                    "type {other} has no mapping (docs/CAPTURE.md, \"Types\")"
                ))
            }
        })
    }

    fn avro(&self) -> serde_json::Value {
        match self {
            PgType::Int2 | PgType::Int4 => json!("int"),
            PgType::Int8 => json!("long"),
            PgType::Float4 => json!("float"),
            PgType::Float8 => json!("double"),
            PgType::Numeric { precision, scale } => json!({
                "type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale
            }),
            PgType::NumericText | PgType::Text | PgType::Interval | PgType::Json | PgType::Enum => {
                json!("string")
            }
            PgType::Bool => json!("boolean"),
            PgType::Bytea => json!("bytes"),
            PgType::Uuid => json!({"type": "string", "logicalType": "uuid"}),
            PgType::Date => json!({"type": "int", "logicalType": "date"}),
            PgType::Time => json!({"type": "long", "logicalType": "time-micros"}),
            PgType::Timestamp => json!({"type": "long", "logicalType": "local-timestamp-micros"}),
            PgType::Timestamptz => json!({"type": "long", "logicalType": "timestamp-micros"}),
            PgType::Array(inner) => json!({"type": "array", "items": ["null", inner.avro()]}),
        }
    }
}

/// One column of a captured table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgColumn {
    pub name: String,
    pub ty: PgType,
    pub nullable: bool,
    /// A nullable column added with a default: its union is `[T, "null"]`, whose first branch
    /// holds the default the rows already there take (an Avro union's default is its first
    /// branch's), not `["null", T]`. Set from the row schema in force ([`order_nulls`]), never
    /// from the catalog alone.
    pub null_last: bool,
}

/// A captured table's row schema (Avro JSON) for its columns, in column order.
pub fn row_schema(table: &str, columns: &[PgColumn]) -> serde_json::Value {
    let mut schema = record_schema(
        table,
        columns
            .iter()
            .map(|c| (c.name.as_str(), c.ty.avro(), c.nullable)),
    );
    if let Some(fields) = schema["fields"].as_array_mut() {
        for (f, c) in fields.iter_mut().zip(columns) {
            if c.nullable && c.null_last {
                *f = json!({"name": c.name, "type": [c.ty.avro(), "null"]});
            }
        }
    }
    schema
}

/// The fields of `row_schema` whose union puts null last (`[T, "null"]`).
pub fn nulls_last(row_schema: &serde_json::Value) -> Vec<String> {
    row_schema["fields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| {
            f["type"]
                .as_array()
                .is_some_and(|u| u.len() == 2 && u[1] == "null" && u[0] != "null")
        })
        .filter_map(|f| f["name"].as_str().map(str::to_string))
        .collect()
}

/// Marks the nullable columns named in `nulls_last` (of the row schema in force,
/// [`nulls_last`]) as written `[T, "null"]`, the others `["null", T]`: the encoder then writes
/// each union branch as the schema in force declares it.
pub fn order_nulls(columns: &mut [PgColumn], nulls_last: &[String]) {
    for c in columns {
        c.null_last = c.nullable && nulls_last.contains(&c.name);
    }
}

/// The row schema of `table` for its fields (name, Avro type, nullable), in column order: the one
/// shape every source's mapping produces.
pub fn record_schema<'a>(
    table: &str,
    fields: impl Iterator<Item = (&'a str, serde_json::Value, bool)>,
) -> serde_json::Value {
    let fields: Vec<serde_json::Value> = fields
        .map(|(name, ty, nullable)| {
            if nullable {
                json!({"name": name, "type": ["null", ty], "default": null})
            } else {
                json!({"name": name, "type": ty})
            }
        })
        .collect();
    let name: String = table
        .chars()
        .map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '_' })
        .collect();
    json!({"type": "record", "name": name, "namespace": "kafka_backfill.capture", "fields": fields})
}

/// The Avro default (JSON) of a column of type `ty` whose value is `text` (PostgreSQL's text form):
/// what the rows already there hold when a `NOT NULL` column is added with a default, which the
/// new row-schema version declares so that a reader resolves the older rows to it (docs/WIRE.md
/// "Schema changes"). `None` for a type whose Avro default is not written here ([`avro_json`]).
pub fn avro_default(ty: &PgType, text: &str) -> Result<Option<serde_json::Value>> {
    let mut datum = Vec::new();
    encode_value(ty, text, &mut datum)?;
    avro_json(&ty.avro(), &datum)
}

/// The JSON an Avro reader takes as the default of a field of type `avro` for the value encoded as
/// `datum` (either source's mapping); `None` where that JSON is not the value's (bytes, fixed,
/// decimal, arrays: the JSON of their bytes is not written here).
pub(crate) fn avro_json(
    avro: &serde_json::Value,
    datum: &[u8],
) -> Result<Option<serde_json::Value>> {
    use apache_avro::Schema;
    let schema = Schema::parse(avro)?;
    if matches!(
        schema,
        Schema::Bytes
            | Schema::Fixed(_)
            | Schema::Decimal(_)
            | Schema::BigDecimal
            | Schema::Array(_)
    ) {
        return Ok(None);
    }
    let value = apache_avro::from_avro_datum(&schema, &mut &datum[..], None)?;
    Ok(Some(serde_json::Value::try_from(value)?))
}

/// Sets the `default` of each named field of `row_schema` (a record's JSON): the value the rows
/// already there hold for a `NOT NULL` column added with a default.
pub(crate) fn with_defaults(
    row_schema: &mut serde_json::Value,
    defaults: &[(String, serde_json::Value)],
) {
    let Some(fields) = row_schema["fields"].as_array_mut() else {
        return;
    };
    for (name, value) in defaults {
        if let Some(f) = fields.iter_mut().find(|f| f["name"] == name.as_str()) {
            f["default"] = value.clone();
        }
    }
}

/// Encodes rows of one table: text values in, row datum and key bytes out.
#[derive(Clone, Debug)]
pub struct RowEncoder {
    pub columns: Vec<PgColumn>,
    /// Column indices of the primary key, in key order.
    pub key: Vec<usize>,
}

impl RowEncoder {
    /// The row datum and its key bytes. `values[i]` is column `i`'s text form (`None` = NULL).
    pub fn encode(&self, values: &[Option<&str>]) -> Result<(Vec<u8>, Vec<u8>)> {
        if values.len() != self.columns.len() {
            bail!(
                "the row has {} values, the table {} columns",
                values.len(),
                self.columns.len()
            );
        }
        encode_fields(self.columns.len(), &self.key, |i, datum| {
            let c = &self.columns[i];
            put_field_in(
                datum,
                &c.name,
                c.nullable,
                c.null_last,
                values[i],
                |text, datum| {
                    encode_value(&c.ty, text, datum).with_context(|| {
                        format!("column {} ({:?}) value {:?}", c.name, c.ty, cut(text))
                    })
                },
            )
        })
    }
}

/// One row's datum, field by field (`field(i, datum)` appends column `i`, its union branch
/// included), and its key bytes: the key columns' encodings, concatenated in `key`'s order.
pub(crate) fn encode_fields(
    n: usize,
    key: &[usize],
    mut field: impl FnMut(usize, &mut Vec<u8>) -> Result<()>,
) -> Result<(Vec<u8>, Vec<u8>)> {
    let mut datum = Vec::with_capacity(64);
    let mut spans = vec![(0usize, 0usize); n];
    for (i, span) in spans.iter_mut().enumerate() {
        let start = datum.len();
        field(i, &mut datum)?;
        *span = (start, datum.len());
    }
    let mut out = Vec::new();
    for &k in key {
        let (s, e) = spans[k];
        out.extend_from_slice(&datum[s..e]);
    }
    Ok((datum, out))
}

/// One field of a row datum: a nullable column's union branch (`["null", T]`: 0 for NULL, 1 then
/// the value; `[T, "null"]` when `null_last`, [`PgColumn::null_last`]: 0 then the value, 1 for
/// NULL), the value encoded by `encode`; a NULL in a NOT NULL column is an error naming `column`.
/// Both sources' encoders write their fields through here.
pub(crate) fn put_field_in<V>(
    datum: &mut Vec<u8>,
    column: &str,
    nullable: bool,
    null_last: bool,
    value: Option<V>,
    encode: impl FnOnce(V, &mut Vec<u8>) -> Result<()>,
) -> Result<()> {
    let (null, some) = if null_last { (1, 0) } else { (0, 1) };
    match value {
        None if nullable => {
            put_long(datum, null);
            Ok(())
        }
        None => bail!("column {column} is NULL but NOT NULL"),
        Some(v) => {
            if nullable {
                put_long(datum, some);
            }
            encode(v, datum)
        }
    }
}

fn cut(s: &str) -> String {
    s.chars().take(64).collect()
}

pub(crate) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_long(out, b.len() as i64);
    out.extend_from_slice(b);
}

fn encode_value(ty: &PgType, text: &str, out: &mut Vec<u8>) -> Result<()> {
    match ty {
        PgType::Int2 | PgType::Int4 => put_long(out, text.parse::<i32>()? as i64),
        PgType::Int8 => put_long(out, text.parse::<i64>()?),
        PgType::Float4 => out.extend_from_slice(&text.parse::<f32>()?.to_le_bytes()),
        PgType::Float8 => out.extend_from_slice(&text.parse::<f64>()?.to_le_bytes()),
        PgType::Numeric { scale, .. } => put_bytes(out, &decimal_bytes(text, *scale)?),
        PgType::NumericText
        | PgType::Text
        | PgType::Interval
        | PgType::Json
        | PgType::Enum
        | PgType::Uuid => put_bytes(out, text.as_bytes()),
        PgType::Bool => out.push(match text {
            "t" | "true" => 1,
            "f" | "false" => 0,
            _ => bail!("not a boolean"),
        }),
        PgType::Bytea => {
            let hex = text
                .strip_prefix("\\x")
                .context("bytea is not in hex form (set bytea_output = hex)")?;
            put_bytes(out, &hex_decode(hex)?);
        }
        PgType::Date => put_long(out, days_from_text(text)?),
        PgType::Time => put_long(out, time_micros(text)?),
        PgType::Timestamp => {
            let (d, t) = text.split_once(' ').context("not a timestamp")?;
            put_long(out, days_from_text(d)? * 86_400_000_000 + time_micros(t)?)
        }
        PgType::Timestamptz => put_long(out, timestamptz_micros(text)?),
        PgType::Array(inner) => {
            let items = parse_array(text)?;
            if !items.is_empty() {
                put_long(out, items.len() as i64);
                for item in items {
                    match item {
                        None => put_long(out, 0),
                        Some(s) => {
                            put_long(out, 1);
                            encode_value(inner, &s, out)?;
                        }
                    }
                }
            }
            put_long(out, 0);
        }
    }
    Ok(())
}

fn hex_decode(hex: &str) -> Result<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        bail!("odd number of hex digits");
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).context("not hex"))
        .collect()
}

/// A decimal's text (`-12.340`) as the big-endian two's-complement bytes of its unscaled value at
/// `scale`.
pub fn decimal_bytes(text: &str, scale: u32) -> Result<Vec<u8>> {
    let (neg, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if int.is_empty() && frac.is_empty()
        || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
    {
        bail!("not a finite decimal (NaN and ±Infinity have no Avro decimal)");
    }
    if frac.len() > scale as usize {
        bail!("more than {scale} fraction digits");
    }
    // The unscaled magnitude as little-endian base-256 digits.
    let mut mag: Vec<u8> = vec![0];
    let pad = scale as usize - frac.len();
    for d in int
        .bytes()
        .chain(frac.bytes())
        .chain(std::iter::repeat_n(b'0', pad))
    {
        let mut carry = (d - b'0') as u32;
        for b in mag.iter_mut() {
            let v = *b as u32 * 10 + carry;
            *b = v as u8;
            carry = v >> 8;
        }
        if carry > 0 {
            mag.push(carry as u8);
        }
    }
    // Two's complement, big-endian, minimal with a sign bit.
    if neg {
        let mut carry = 1u16;
        for b in mag.iter_mut() {
            let v = (!*b) as u16 + carry;
            *b = v as u8;
            carry = v >> 8;
        }
        if mag.last().is_some_and(|b| b & 0x80 == 0) {
            mag.push(0xff);
        }
    } else if mag.last().is_some_and(|b| b & 0x80 != 0) {
        mag.push(0);
    }
    while mag.len() > 1 {
        let top = mag[mag.len() - 1];
        let next = mag[mag.len() - 2];
        if (top == 0 && next & 0x80 == 0) || (top == 0xff && next & 0x80 != 0) {
            mag.pop();
        } else {
            break;
        }
    }
    mag.reverse();
    Ok(mag)
}

/// Days since 1970-01-01 of `YYYY-MM-DD` (ISO DateStyle; BC dates and ±infinity refused).
fn days_from_text(text: &str) -> Result<i64> {
    let mut it = text.splitn(3, '-');
    let (Some(y), Some(m), Some(d)) = (it.next(), it.next(), it.next()) else {
        bail!("not an ISO date (set DateStyle = ISO)");
    };
    let (y, m, d): (i64, i64, i64) = (y.parse()?, m.parse()?, d.parse()?);
    Ok(days_from_civil(y, m, d))
}

/// Days since 1970-01-01 of the proleptic Gregorian date `y-m-d` (Howard Hinnant's
/// days_from_civil).
pub(crate) fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Microseconds since midnight of `HH:MM:SS[.ffffff]`.
fn time_micros(text: &str) -> Result<i64> {
    let mut it = text.splitn(3, ':');
    let (Some(h), Some(m), Some(s)) = (it.next(), it.next(), it.next()) else {
        bail!("not a time");
    };
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    if frac.len() > 6 {
        bail!("more than 6 fraction digits");
    }
    let micros: i64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<6}").parse()?
    };
    Ok(
        ((h.parse::<i64>()? * 60 + m.parse::<i64>()?) * 60 + secs.parse::<i64>()?) * 1_000_000
            + micros,
    )
}

/// Microseconds since the Unix epoch (UTC) of `YYYY-MM-DD HH:MM:SS[.ffffff]±HH[:MM[:SS]]`.
fn timestamptz_micros(text: &str) -> Result<i64> {
    let (d, rest) = text
        .split_once(' ')
        .context("not a timestamp with time zone")?;
    let at = rest
        .rfind(['+', '-'])
        .context("no UTC offset (set DateStyle = ISO)")?;
    let (t, off) = rest.split_at(at);
    let sign = if off.starts_with('-') { -1 } else { 1 };
    let mut secs = 0i64;
    for (i, part) in off[1..].split(':').enumerate() {
        secs += part.parse::<i64>()? * [3600, 60, 1].get(i).copied().context("bad offset")?;
    }
    Ok(days_from_text(d)? * 86_400_000_000 + time_micros(t)? - sign * secs * 1_000_000)
}

/// The elements of a one-dimensional array's text form (`{1,NULL,"a b"}`).
fn parse_array(text: &str) -> Result<Vec<Option<String>>> {
    let body = text
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .context("not an array (or one with explicit bounds)")?;
    if body.starts_with('{') {
        bail!("a multi-dimensional array has no mapping");
    }
    let mut items = Vec::new();
    if body.is_empty() {
        return Ok(items);
    }
    let mut chars = body.chars().peekable();
    loop {
        let mut item = String::new();
        let quoted = chars.peek() == Some(&'"');
        if quoted {
            chars.next();
            loop {
                match chars.next() {
                    Some('\\') => item.push(chars.next().context("a dangling escape")?),
                    Some('"') => break,
                    Some(c) => item.push(c),
                    None => bail!("an unterminated quoted element"),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ',' {
                    break;
                }
                item.push(c);
                chars.next();
            }
        }
        items.push(if !quoted && item == "NULL" {
            None
        } else {
            Some(item)
        });
        match chars.next() {
            Some(',') => continue,
            None => break,
            Some(c) => bail!("unexpected {c:?} after an element"),
        }
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::TableSchema;
    use apache_avro::types::Value;

    /// A NOT NULL column's default as the version declares it: the JSON an Avro reader resolves
    /// older rows with, equal to what the column's own encoding of the value decodes to.
    #[test]
    fn defaults_are_the_avro_json_of_the_value_and_none_where_its_json_is_not_the_value() {
        let d = |ty: PgType, text: &str| avro_default(&ty, text).unwrap();
        assert_eq!(d(PgType::Bool, "t"), Some(json!(true)));
        assert_eq!(d(PgType::Int4, "5"), Some(json!(5)));
        assert_eq!(
            d(PgType::Int8, "-1099511627776"),
            Some(json!(-1099511627776i64))
        );
        assert_eq!(d(PgType::Float8, "1.5"), Some(json!(1.5)));
        assert_eq!(d(PgType::Text, "x \"y\""), Some(json!("x \"y\"")));
        assert_eq!(d(PgType::Date, "1970-01-03"), Some(json!(2)));
        assert_eq!(
            d(PgType::Timestamptz, "1970-01-01 00:00:01.5+00"),
            Some(json!(1_500_000))
        );
        assert_eq!(d(PgType::Bytea, "\\x00"), None);
        assert_eq!(
            d(
                PgType::Numeric {
                    precision: 10,
                    scale: 2
                },
                "1.50"
            ),
            None
        );
        assert!(avro_default(&PgType::Int4, "five").is_err());
    }

    fn col(name: &str, ty: PgType, nullable: bool) -> PgColumn {
        PgColumn {
            name: name.into(),
            ty,
            nullable,
            null_last: false,
        }
    }

    /// Every mapped type: the encoder's bytes decode, through apache-avro and the row schema, to
    /// the value PostgreSQL's text means.
    #[test]
    fn every_mapped_type_decodes_to_what_its_text_means() {
        let columns = vec![
            col("id", PgType::Int8, false),
            col("s", PgType::Int2, false),
            col("r", PgType::Float4, true),
            col("d", PgType::Float8, true),
            col(
                "n",
                PgType::Numeric {
                    precision: 10,
                    scale: 3,
                },
                true,
            ),
            col("nt", PgType::NumericText, true),
            col("b", PgType::Bool, true),
            col("t", PgType::Text, true),
            col("by", PgType::Bytea, true),
            col("u", PgType::Uuid, true),
            col("day", PgType::Date, true),
            col("tod", PgType::Time, true),
            col("ts", PgType::Timestamp, true),
            col("tz", PgType::Timestamptz, true),
            col("a", PgType::Array(Box::new(PgType::Int4)), true),
        ];
        let schema = row_schema("public.all_types", &columns);
        let table = TableSchema::parse(&schema.to_string(), &["id".into()]).unwrap();
        let enc = RowEncoder {
            columns,
            key: vec![0],
        };
        let (datum, key) = enc
            .encode(&[
                Some("-7"),
                Some("12"),
                Some("-Infinity"),
                Some("NaN"),
                Some("-12.340"),
                Some("3.14159265358979323846"),
                Some("t"),
                Some("héllo"),
                Some("\\x00ff"),
                Some("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
                Some("2024-02-29"),
                Some("13:14:15.5"),
                Some("1969-12-31 23:59:59.999999"),
                Some("2024-01-01 05:30:00+05:30"),
                Some("{1,NULL,-3}"),
            ])
            .unwrap();
        assert_eq!(key, table.key_of_datum(&datum).unwrap());
        let v = table.decode_row(&datum).unwrap();
        let some = |v: Value| Value::Union(1, Box::new(v));
        assert_eq!(v[0], Value::Long(-7));
        assert_eq!(v[1], Value::Int(12));
        assert_eq!(v[2], some(Value::Float(f32::NEG_INFINITY)));
        assert!(
            matches!(&v[3], Value::Union(1, b) if matches!(**b, Value::Double(x) if x.is_nan()))
        );
        let Value::Union(1, n) = &v[4] else { panic!() };
        let Value::Decimal(dec) = &**n else {
            panic!("{n:?}")
        };
        let bytes: Vec<u8> = dec.try_into().unwrap();
        assert_eq!(crate::codec::signed_be_to_decimal(&bytes), "-12340");
        assert_eq!(v[5], some(Value::String("3.14159265358979323846".into())));
        assert_eq!(v[6], some(Value::Boolean(true)));
        assert_eq!(v[7], some(Value::String("héllo".into())));
        assert_eq!(v[8], some(Value::Bytes(vec![0, 255])));
        assert!(matches!(&v[9], Value::Union(1, _)));
        assert_eq!(v[10], some(Value::Date(19_782)));
        assert_eq!(v[11], some(Value::TimeMicros(47_655_500_000)));
        assert_eq!(v[12], some(Value::LocalTimestampMicros(-1)));
        assert_eq!(v[13], some(Value::TimestampMicros(1_704_067_200_000_000)));
        assert_eq!(
            v[14],
            some(Value::Array(vec![
                some(Value::Int(1)),
                Value::Union(0, Box::new(Value::Null)),
                some(Value::Int(-3))
            ]))
        );
    }

    #[test]
    fn refusals_name_the_column_and_why() {
        let enc = RowEncoder {
            columns: vec![col(
                "n",
                PgType::Numeric {
                    precision: 5,
                    scale: 2,
                },
                false,
            )],
            key: vec![0],
        };
        let e = enc.encode(&[Some("NaN")]).unwrap_err();
        assert!(crate::error::line(&e).contains("column n"), "{e:#}");
        assert!(crate::error::line(&e).contains("NaN"), "{e:#}");
        let e = enc.encode(&[None]).unwrap_err();
        assert!(e.to_string().contains("NOT NULL"));
        assert!(PgType::from_catalog("point", "b", -1, None)
            .unwrap_err()
            .contains("point"));
        let arr = RowEncoder {
            columns: vec![col("a", PgType::Array(Box::new(PgType::Int4)), false)],
            key: vec![0],
        };
        assert!(
            format!("{:#}", arr.encode(&[Some("{{1},{2}}")]).unwrap_err())
                .contains("multi-dimensional")
        );
    }

    #[test]
    fn decimals_are_minimal_twos_complement() {
        for (text, scale, want) in [
            ("0", 0, vec![0u8]),
            ("127", 0, vec![0x7f]),
            ("128", 0, vec![0x00, 0x80]),
            ("-128", 0, vec![0x80]),
            ("-129", 0, vec![0xff, 0x7f]),
            ("1.5", 2, vec![0x00, 0x96]),
            ("-0.01", 2, vec![0xff]),
        ] {
            assert_eq!(decimal_bytes(text, scale).unwrap(), want, "{text}");
        }
        assert_eq!(
            crate::codec::signed_be_to_decimal(
                &decimal_bytes("-123456789012345678901234567890", 0).unwrap()
            ),
            "-123456789012345678901234567890"
        );
    }

    /// A nullable column added with a default: `[T, "null"]` with the default in the first
    /// branch, which apache-avro accepts and decodes the encoder's branches by, and which
    /// [`nulls_last`] finds again (what a restart and a copy order their encoders by).
    #[test]
    fn a_nullable_column_with_a_default_puts_null_last() {
        let mut flag = col("flag", PgType::Int4, true);
        flag.null_last = true;
        let columns = vec![
            col("id", PgType::Int4, false),
            flag,
            col("n", PgType::Text, true),
        ];
        let mut schema = row_schema("public.t", &columns);
        with_defaults(&mut schema, &[("flag".into(), json!(3))]);
        assert_eq!(
            schema["fields"][1],
            json!({"name": "flag", "type": ["int", "null"], "default": 3})
        );
        assert_eq!(nulls_last(&schema), ["flag"]);
        let avro = apache_avro::Schema::parse(&schema).unwrap();
        let encoder = RowEncoder {
            columns: columns.clone(),
            key: vec![0],
        };
        use apache_avro::types::Value;
        for (values, want) in [
            (
                [Some("1"), Some("5"), None],
                [
                    Value::Union(0, Box::new(Value::Int(5))),
                    Value::Union(0, Box::new(Value::Null)),
                ],
            ),
            (
                [Some("2"), None, Some("x")],
                [
                    Value::Union(1, Box::new(Value::Null)),
                    Value::Union(1, Box::new(Value::String("x".into()))),
                ],
            ),
        ] {
            let (datum, _) = encoder.encode(&values).unwrap();
            let Value::Record(fields) =
                apache_avro::from_avro_datum(&avro, &mut &datum[..], None).unwrap()
            else {
                panic!("not a record");
            };
            assert_eq!(
                [fields[1].1.clone(), fields[2].1.clone()],
                want,
                "{values:?}"
            );
        }
        // A catalog's columns take their order from the schema in force.
        let mut catalog = vec![
            col("id", PgType::Int4, false),
            col("flag", PgType::Int4, true),
        ];
        order_nulls(&mut catalog, &nulls_last(&schema));
        assert!(!catalog[0].null_last && catalog[1].null_last);
    }
}
