//! A table's row schema and primary key.

use apache_avro::types::Value;
use apache_avro::Schema;

use super::skip::skip;
use super::wire::CodecError;

/// How a column is stored downstream: one kind per Avro type (docs/OPERATIONS.md "Column types").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnType {
    /// int, long, date, time-*, timestamp-*, local-timestamp-*: the Avro number as it is.
    Integer,
    /// boolean.
    Boolean,
    /// float, double.
    Real,
    /// string, enum, uuid.
    Text,
    /// bytes, fixed, duration.
    Blob,
    /// decimal, big-decimal: the exact decimal number as text.
    Decimal,
    /// array, map, record, a union of several non-null branches: JSON.
    Json,
}

impl ColumnType {
    /// The SQLite column type.
    pub fn sqlite(self) -> &'static str {
        match self {
            ColumnType::Integer | ColumnType::Boolean => "INTEGER",
            ColumnType::Real => "REAL",
            ColumnType::Text | ColumnType::Decimal | ColumnType::Json => "TEXT",
            ColumnType::Blob => "BLOB",
        }
    }

    /// The PostgreSQL column type.
    pub fn postgres(self) -> &'static str {
        match self {
            ColumnType::Integer => "BIGINT",
            ColumnType::Boolean => "BOOLEAN",
            ColumnType::Real => "DOUBLE PRECISION",
            ColumnType::Text => "TEXT",
            ColumnType::Blob => "BYTEA",
            ColumnType::Decimal => "NUMERIC",
            ColumnType::Json => "JSONB",
        }
    }
}

/// One column's value of one row, as the stores bind it.
#[derive(Clone, Debug, PartialEq)]
pub enum ColumnValue {
    Null,
    Integer(i64),
    Boolean(bool),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
    /// The exact decimal number, e.g. `-12.340`.
    Decimal(String),
    /// A JSON document (see [`to_json`]).
    Json(String),
}

/// One column's value read in place from a row datum ([`TableSchema::direct_values`]): text and
/// bytes borrow the datum, so a row's values cost no allocation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DirectValue<'d> {
    Null,
    Integer(i64),
    Boolean(bool),
    Real(f64),
    Text(&'d str),
    Blob(&'d [u8]),
}

impl From<DirectValue<'_>> for ColumnValue {
    fn from(v: DirectValue<'_>) -> ColumnValue {
        match v {
            DirectValue::Null => ColumnValue::Null,
            DirectValue::Integer(i) => ColumnValue::Integer(i),
            DirectValue::Boolean(b) => ColumnValue::Boolean(b),
            DirectValue::Real(f) => ColumnValue::Real(f),
            DirectValue::Text(t) => ColumnValue::Text(t.to_string()),
            DirectValue::Blob(b) => ColumnValue::Blob(b.to_vec()),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub ty: ColumnType,
    pub nullable: bool,
}

/// The row record of a table, with the fields that form its primary key.
#[derive(Clone, Debug)]
pub struct TableSchema {
    pub name: String,
    pub schema: Schema,
    pub json: serde_json::Value,
    pub columns: Vec<Column>,
    pub primary_key: Vec<String>,
    pk_indices: Vec<usize>,
    /// Every field is a primitive (or a nullable primitive) whose column value can be read straight
    /// from the datum ([`direct_value`]); else rows go through apache-avro's decoder.
    direct: bool,
}

impl TableSchema {
    /// The row columns as a `CREATE TABLE` lists them, quoted, with `type_of` giving each column's
    /// SQL type (`ColumnType::sqlite` or `ColumnType::postgres`) and `NOT NULL` unless nullable.
    pub fn column_ddl(&self, type_of: fn(ColumnType) -> &'static str) -> String {
        self.columns
            .iter()
            .map(|c| {
                format!(
                    "\"{}\" {}{}",
                    c.name,
                    type_of(c.ty),
                    if c.nullable { "" } else { " NOT NULL" }
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Parses a row schema (an Avro record) and checks the primary-key fields exist.
    pub fn parse(json: &str, primary_key: &[String]) -> Result<Self, CodecError> {
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| CodecError::Schema(format!("not JSON: {e}")))?;
        let schema = Schema::parse(&value).map_err(|e| CodecError::Schema(e.to_string()))?;
        let Schema::Record(record) = &schema else {
            return Err(CodecError::Schema("the row schema must be a record".into()));
        };
        let columns: Vec<Column> = record
            .fields
            .iter()
            .map(|f| column_of(&f.name, &f.schema))
            .collect::<Result<_, _>>()?;
        if primary_key.is_empty() {
            return Err(CodecError::Schema("the primary key names no field".into()));
        }
        let pk_indices = primary_key
            .iter()
            .map(|k| {
                record
                    .fields
                    .iter()
                    .position(|f| &f.name == k)
                    .ok_or_else(|| {
                        CodecError::Schema(format!(
                            "primary-key field {k} is not a field of {}",
                            record.name.name
                        ))
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let direct = record.fields.iter().all(|f| is_direct(&f.schema));
        Ok(TableSchema {
            direct,
            name: record.name.name.clone(),
            json: value,
            columns,
            primary_key: primary_key.to_vec(),
            pk_indices,
            schema,
        })
    }

    /// Checks a row datum and returns it, or why it is not one.
    pub fn check_row(&self, datum: &[u8]) -> Result<(), String> {
        let mut rest = datum;
        skip(&self.schema, &mut rest)?;
        if !rest.is_empty() {
            return Err(format!("{} trailing bytes after the row", rest.len()));
        }
        Ok(())
    }

    /// The first field whose column value is not read straight from the datum (not a primitive or
    /// a nullable primitive), with its Avro type; `None` when every field is (such a table's row
    /// can be rebuilt from its typed columns: [`datum_of_columns`](Self::datum_of_columns)).
    pub fn first_composite_field(&self) -> Option<(String, String)> {
        let Schema::Record(record) = &self.schema else {
            unreachable!("checked in parse")
        };
        record
            .fields
            .iter()
            .find(|f| !is_direct(&f.schema))
            .map(|f| (f.name.clone(), format!("{:?}", f.schema)))
    }

    /// The datum of a row rebuilt from its typed column values, in field order: the inverse of
    /// [`column_values`](Self::column_values) for a table whose fields are all primitives or nullable
    /// primitives (`first_composite_field` is `None`); an error names a column whose value does not
    /// fit its field.
    pub fn datum_of_columns(&self, values: &[ColumnValue]) -> Result<Vec<u8>, CodecError> {
        let Schema::Record(record) = &self.schema else {
            unreachable!("checked in parse")
        };
        if values.len() != record.fields.len() {
            return Err(CodecError::Encode(format!(
                "{} column values for {} fields",
                values.len(),
                record.fields.len()
            )));
        }
        let mut out = Vec::with_capacity(64);
        for (f, v) in record.fields.iter().zip(values) {
            put_direct(&f.schema, v, &mut out)
                .map_err(|e| CodecError::Encode(format!("column {}: {e}", f.name)))?;
        }
        Ok(out)
    }

    /// Checks a row datum as [`check_row`](Self::check_row) does and whether its primary-key bytes
    /// are `key`, in one walk over the datum and without copying the key.
    pub fn check_row_key(&self, datum: &[u8], key: &[u8]) -> Result<bool, String> {
        let Schema::Record(record) = &self.schema else {
            unreachable!("checked in parse")
        };
        let mut matches = true;
        let used = if let [only] = self.pk_indices[..] {
            super::skip::skip_record(record, datum, |i, start, end| {
                if i == only {
                    matches = &datum[start..end] == key;
                }
            })?
        } else {
            let mut ranges = vec![(0usize, 0usize); record.fields.len()];
            let used =
                super::skip::skip_record(record, datum, |i, start, end| ranges[i] = (start, end))?;
            let mut at = 0;
            for &i in &self.pk_indices {
                let field = &datum[ranges[i].0..ranges[i].1];
                matches &= key.get(at..at + field.len()) == Some(field);
                at += field.len();
            }
            matches &= at == key.len();
            used
        };
        if used != datum.len() {
            return Err(format!(
                "{} trailing bytes after the row",
                datum.len() - used
            ));
        }
        Ok(matches)
    }

    /// Encodes a row value as its datum.
    pub fn encode_row(&self, row: &Value) -> Result<Vec<u8>, CodecError> {
        apache_avro::to_avro_datum(&self.schema, row.clone())
            .map_err(|e| CodecError::Encode(e.to_string()))
    }

    /// Decodes a row datum into its field values.
    pub fn decode_row(&self, datum: &[u8]) -> Result<Vec<Value>, CodecError> {
        let mut r = datum;
        match apache_avro::from_avro_datum(&self.schema, &mut r, None) {
            Ok(Value::Record(fields)) => Ok(fields.into_iter().map(|(_, v)| v).collect()),
            Ok(other) => Err(CodecError::Decode(format!("not a record: {other:?}"))),
            Err(e) => Err(CodecError::Decode(e.to_string())),
        }
    }

    /// The typed column values of a row datum, in field order; an error names the column.
    pub fn column_values(&self, datum: &[u8]) -> Result<Vec<ColumnValue>, CodecError> {
        let Schema::Record(record) = &self.schema else {
            unreachable!("checked in parse")
        };
        if self.direct {
            // Read straight from the bytes: apache-avro's decoder resolves the schema's names for
            // every datum, which was most of a commit's decoding (docs/BENCHMARKS.md, CPU per record).
            let mut values = Vec::with_capacity(record.fields.len());
            self.read_direct(datum, |v| values.push(ColumnValue::from(v)))?;
            return Ok(values);
        }
        let fields = self.decode_row(datum)?;
        fields
            .into_iter()
            .zip(&self.columns)
            .zip(&record.fields)
            .map(|((v, c), f)| {
                column_value(c.ty, &f.schema, v)
                    .map_err(|e| CodecError::Decode(format!("column {}: {e}", c.name)))
            })
            .collect()
    }

    /// Whether [`direct_values`](Self::direct_values) reads this table's rows: every field a
    /// primitive or a nullable primitive.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The typed column values of a row datum, in field order, read in place into `out` (cleared
    /// first; text and bytes borrow the datum): the values [`column_values`](Self::column_values)
    /// gives, without an allocation per row. Only for a table that [`is_direct`](Self::is_direct);
    /// an error names the column.
    pub fn direct_values<'d>(
        &self,
        datum: &'d [u8],
        out: &mut Vec<DirectValue<'d>>,
    ) -> Result<(), CodecError> {
        out.clear();
        self.read_direct(datum, |v| out.push(v))
    }

    /// Reads each field of a direct table's datum in order, handing its value to `each`.
    fn read_direct<'d>(
        &self,
        datum: &'d [u8],
        mut each: impl FnMut(DirectValue<'d>),
    ) -> Result<(), CodecError> {
        let Schema::Record(record) = &self.schema else {
            unreachable!("checked in parse")
        };
        if !self.direct {
            return Err(CodecError::Decode(format!(
                "table {}: a field is not a primitive, so its values are not read in place",
                self.name
            )));
        }
        let mut rest = datum;
        for f in &record.fields {
            each(
                direct_value(&f.schema, &mut rest)
                    .map_err(|e| CodecError::Decode(format!("column {}: {e}", f.name)))?,
            );
        }
        Ok(())
    }

    /// The key bytes of a row: the Avro binary encoding of its primary-key fields, in order (the
    /// encoding of a record of those fields).
    pub fn key_of(&self, fields: &[Value]) -> Result<Vec<u8>, CodecError> {
        let Schema::Record(record) = &self.schema else {
            unreachable!("checked in parse")
        };
        let mut out = Vec::new();
        for &i in &self.pk_indices {
            let bytes = apache_avro::to_avro_datum(&record.fields[i].schema, fields[i].clone())
                .map_err(|e| {
                    CodecError::Encode(format!("primary-key field {}: {e}", record.fields[i].name))
                })?;
            out.extend_from_slice(&bytes);
        }
        Ok(out)
    }

    /// The key bytes of a row datum, cut out of the datum without decoding it: a record's encoding is
    /// the concatenation of its fields', so each primary-key field is a byte range of the datum.
    pub fn key_of_datum(&self, datum: &[u8]) -> Result<Vec<u8>, CodecError> {
        let Schema::Record(record) = &self.schema else {
            unreachable!("checked in parse")
        };
        let mut rest = datum;
        if let [only] = self.pk_indices[..] {
            // One key field (the common case): no table of ranges.
            for (i, f) in record.fields.iter().enumerate().take(only + 1) {
                let start = datum.len() - rest.len();
                skip(&f.schema, &mut rest)
                    .map_err(|e| CodecError::Decode(format!("field {}: {e}", f.name)))?;
                if i == only {
                    return Ok(datum[start..datum.len() - rest.len()].to_vec());
                }
            }
            unreachable!("the key field is a field of the record");
        }
        let mut ranges = vec![(0usize, 0usize); record.fields.len()];
        let last = *self.pk_indices.iter().max().expect("non-empty key");
        for (i, f) in record.fields.iter().enumerate().take(last + 1) {
            let start = datum.len() - rest.len();
            skip(&f.schema, &mut rest)
                .map_err(|e| CodecError::Decode(format!("field {}: {e}", f.name)))?;
            ranges[i] = (start, datum.len() - rest.len());
        }
        let mut key = Vec::new();
        for &i in &self.pk_indices {
            key.extend_from_slice(&datum[ranges[i].0..ranges[i].1]);
        }
        Ok(key)
    }
}

fn column_of(name: &str, schema: &Schema) -> Result<Column, CodecError> {
    let (schema, nullable) = match schema {
        Schema::Union(u) if u.variants().len() == 2 && u.variants().contains(&Schema::Null) => (
            u.variants()
                .iter()
                .find(|s| **s != Schema::Null)
                .expect("non-null"),
            true,
        ),
        Schema::Union(u) => (schema, u.variants().contains(&Schema::Null)),
        s => (s, false),
    };
    let ty = match schema {
        Schema::Int | Schema::Long | Schema::Date | Schema::TimeMillis | Schema::TimeMicros
        | Schema::TimestampMillis | Schema::TimestampMicros | Schema::TimestampNanos
        | Schema::LocalTimestampMillis | Schema::LocalTimestampMicros | Schema::LocalTimestampNanos => ColumnType::Integer,
        Schema::Boolean => ColumnType::Boolean,
        Schema::Float | Schema::Double => ColumnType::Real,
        Schema::String | Schema::Uuid | Schema::Enum(_) => ColumnType::Text,
        Schema::Bytes | Schema::Fixed(_) | Schema::Duration => ColumnType::Blob,
        Schema::Decimal(_) | Schema::BigDecimal => ColumnType::Decimal,
        Schema::Array(_) | Schema::Map(_) | Schema::Record(_) | Schema::Union(_) => ColumnType::Json,
        Schema::Null => {
            return Err(CodecError::Schema(format!(
                "field {name}: a field of type null has no column (drop it or make it a nullable union)"
            )))
        }
        other => {
            return Err(CodecError::Schema(format!(
                "field {name}: type {other:?} has no column mapping"
            )))
        }
    };
    Ok(Column {
        name: name.to_string(),
        ty,
        nullable,
    })
}

/// Converts one decoded field to its column value.
fn column_value(ty: ColumnType, schema: &Schema, v: Value) -> Result<ColumnValue, String> {
    let (v, schema) = match (v, schema) {
        (Value::Union(i, inner), Schema::Union(u)) if ty != ColumnType::Json => {
            (*inner, u.variants().get(i as usize))
        }
        (v, s) => (v, Some(s)),
    };
    Ok(match (ty, v) {
        (_, Value::Null) => ColumnValue::Null,
        (ColumnType::Json, v) => ColumnValue::Json(to_json(v, schema)?.to_string()),
        (_, Value::Boolean(b)) => ColumnValue::Boolean(b),
        (_, v) if integer_of(&v).is_some() => {
            ColumnValue::Integer(integer_of(&v).expect("checked"))
        }
        (_, Value::Float(f)) => ColumnValue::Real(f as f64),
        (_, Value::Double(f)) => ColumnValue::Real(f),
        (_, Value::String(s) | Value::Enum(_, s)) => ColumnValue::Text(s),
        (_, Value::Uuid(u)) => ColumnValue::Text(u.to_string()),
        (_, Value::Bytes(b) | Value::Fixed(_, b)) => ColumnValue::Blob(b),
        (_, Value::Duration(d)) => {
            let mut b = Vec::with_capacity(12);
            b.extend_from_slice(&u32::from(d.months()).to_le_bytes());
            b.extend_from_slice(&u32::from(d.days()).to_le_bytes());
            b.extend_from_slice(&u32::from(d.millis()).to_le_bytes());
            ColumnValue::Blob(b)
        }
        (_, v @ (Value::Decimal(_) | Value::BigDecimal(_))) => {
            ColumnValue::Decimal(decimal_text(v, schema)?)
        }
        (ty, other) => return Err(format!("value {other:?} does not fit a {ty:?} column")),
    })
}

/// Whether a field's column value can be read straight from its bytes: a primitive whose column is
/// not JSON, or a two-branch union of null and one.
fn is_direct(schema: &Schema) -> bool {
    match schema {
        Schema::Union(u) => {
            u.variants().len() == 2
                && u.variants().contains(&Schema::Null)
                && u.variants()
                    .iter()
                    .all(|v| *v == Schema::Null || is_direct(v))
        }
        Schema::Boolean
        | Schema::Int
        | Schema::Float
        | Schema::Double
        | Schema::String
        | Schema::Bytes
        | Schema::Date
        | Schema::TimeMillis => true,
        s => super::skip::is_long_based(s),
    }
}

/// Appends one field's datum from its column value (a schema [`is_direct`] accepts): the inverse of
/// [`direct_value`].
fn put_direct(schema: &Schema, v: &ColumnValue, out: &mut Vec<u8>) -> Result<(), String> {
    use super::varint::put_long;
    match (schema, v) {
        (Schema::Union(u), v) => {
            let null = matches!(v, ColumnValue::Null);
            let (i, branch) = u
                .variants()
                .iter()
                .enumerate()
                .find(|(_, b)| (**b == Schema::Null) == null)
                .ok_or_else(|| format!("no union branch for {v:?}"))?;
            put_long(out, i as i64);
            if !null {
                put_direct(branch, v, out)?;
            }
        }
        (Schema::Boolean, ColumnValue::Boolean(b)) => out.push(*b as u8),
        (Schema::Int | Schema::Date | Schema::TimeMillis, ColumnValue::Integer(i)) => {
            i32::try_from(*i).map_err(|_| format!("int {i} out of the 32-bit range"))?;
            put_long(out, *i)
        }
        (Schema::Float, ColumnValue::Real(f)) => out.extend_from_slice(&(*f as f32).to_le_bytes()),
        (Schema::Double, ColumnValue::Real(f)) => out.extend_from_slice(&f.to_le_bytes()),
        (Schema::String, ColumnValue::Text(s)) => {
            put_long(out, s.len() as i64);
            out.extend_from_slice(s.as_bytes())
        }
        (Schema::Bytes, ColumnValue::Blob(b)) => {
            put_long(out, b.len() as i64);
            out.extend_from_slice(b)
        }
        (s, ColumnValue::Integer(i)) if super::skip::is_long_based(s) => put_long(out, *i),
        (s, v) => return Err(format!("{v:?} does not fit {s:?}")),
    }
    Ok(())
}

/// One field's column value read in place from the datum (a schema [`is_direct`] accepts): the
/// same value apache-avro's decoder and [`column_value`] give.
fn direct_value<'d>(schema: &Schema, buf: &mut &'d [u8]) -> Result<DirectValue<'d>, String> {
    fn take<'a>(buf: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
        if buf.len() < n {
            return Err(format!("truncated: {n} bytes wanted, {} left", buf.len()));
        }
        let (head, tail) = buf.split_at(n);
        *buf = tail;
        Ok(head)
    }
    fn long(buf: &mut &[u8]) -> Result<i64, String> {
        super::varint::get_long(buf).ok_or_else(|| "truncated or overlong integer".to_string())
    }
    fn bytes<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], String> {
        let n = long(buf)?;
        let n = usize::try_from(n).map_err(|_| format!("negative length {n}"))?;
        take(buf, n)
    }
    Ok(match schema {
        Schema::Union(u) => {
            let i = long(buf)?;
            let branch = usize::try_from(i)
                .ok()
                .and_then(|i| u.variants().get(i))
                .ok_or_else(|| format!("union index {i} out of range"))?;
            if *branch == Schema::Null {
                DirectValue::Null
            } else {
                direct_value(branch, buf)?
            }
        }
        Schema::Boolean => match take(buf, 1)?[0] {
            0 => DirectValue::Boolean(false),
            1 => DirectValue::Boolean(true),
            b => return Err(format!("invalid boolean byte {b:#04x}")),
        },
        Schema::Int | Schema::Date | Schema::TimeMillis => {
            let i = long(buf)?;
            i32::try_from(i).map_err(|_| format!("int {i} out of the 32-bit range"))?;
            DirectValue::Integer(i)
        }
        Schema::Float => {
            DirectValue::Real(f32::from_le_bytes(take(buf, 4)?.try_into().expect("4 bytes")) as f64)
        }
        Schema::Double => DirectValue::Real(f64::from_le_bytes(
            take(buf, 8)?.try_into().expect("8 bytes"),
        )),
        Schema::String => DirectValue::Text(
            std::str::from_utf8(bytes(buf)?).map_err(|e| format!("string is not UTF-8: {e}"))?,
        ),
        Schema::Bytes => DirectValue::Blob(bytes(buf)?),
        s if super::skip::is_long_based(s) => DirectValue::Integer(long(buf)?),
        other => return Err(format!("type {other:?} is not read directly")),
    })
}

/// The number an integer-like value (int, long, date, time-*, timestamp-*, local-timestamp-*)
/// carries, as it is; `None` for any other value. One list for the column and the JSON conversions.
fn integer_of(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) | Value::Date(i) | Value::TimeMillis(i) => Some(*i as i64),
        Value::Long(i)
        | Value::TimeMicros(i)
        | Value::TimestampMillis(i)
        | Value::TimestampMicros(i)
        | Value::TimestampNanos(i)
        | Value::LocalTimestampMillis(i)
        | Value::LocalTimestampMicros(i)
        | Value::LocalTimestampNanos(i) => Some(*i),
        _ => None,
    }
}

/// A decimal value as its exact text, e.g. `-12.340` (the scale comes from its schema).
fn decimal_text(v: Value, schema: Option<&Schema>) -> Result<String, String> {
    match v {
        Value::BigDecimal(d) => Ok(d.to_string()),
        Value::Decimal(d) => {
            let bytes: Vec<u8> = Vec::try_from(&d).map_err(|e| e.to_string())?;
            let scale = match schema {
                Some(Schema::Decimal(d)) => d.scale,
                _ => 0,
            };
            Ok(scale_decimal(&signed_be_to_decimal(&bytes), scale))
        }
        other => Err(format!("not a decimal: {other:?}")),
    }
}

/// Two's-complement big-endian bytes as a base-10 integer string.
pub fn signed_be_to_decimal(bytes: &[u8]) -> String {
    let negative = bytes.first().is_some_and(|b| b & 0x80 != 0);
    // Magnitude: negate two's complement if negative.
    let mut mag: Vec<u8> = bytes.to_vec();
    if negative {
        for b in mag.iter_mut() {
            *b = !*b;
        }
        for b in mag.iter_mut().rev() {
            let (v, carry) = b.overflowing_add(1);
            *b = v;
            if !carry {
                break;
            }
        }
    }
    let mut digits = Vec::new();
    while mag.iter().any(|&b| b != 0) {
        let mut rem = 0u32;
        for b in mag.iter_mut() {
            let cur = (rem << 8) | *b as u32;
            *b = (cur / 10) as u8;
            rem = cur % 10;
        }
        digits.push(b'0' + rem as u8);
    }
    if digits.is_empty() {
        digits.push(b'0');
    }
    if negative {
        digits.push(b'-');
    }
    digits.reverse();
    String::from_utf8(digits).expect("ascii")
}

/// Inserts a decimal point `scale` digits from the right of an integer string.
pub fn scale_decimal(int: &str, scale: usize) -> String {
    if scale == 0 {
        return int.to_string();
    }
    let (sign, digits) = match int.strip_prefix('-') {
        Some(d) => ("-", d),
        None => ("", int),
    };
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (i, f) = padded.split_at(padded.len() - scale);
    format!("{sign}{i}.{f}")
}

/// A value as JSON for a JSON column: numbers as numbers (NaN and ±Inf as the strings `"NaN"`,
/// `"Infinity"`, `"-Infinity"`), bytes and fixed as lowercase hex strings, decimals as exact strings,
/// enums and uuids as strings, unions as their branch's value, records and maps as objects.
/// `schema` is the value's schema where known (it gives a decimal its scale).
pub fn to_json(v: Value, schema: Option<&Schema>) -> Result<serde_json::Value, String> {
    use serde_json::Value as J;
    let float = |f: f64| {
        serde_json::Number::from_f64(f)
            .map(J::Number)
            .unwrap_or_else(|| {
                J::String(
                    if f.is_nan() {
                        "NaN"
                    } else if f > 0.0 {
                        "Infinity"
                    } else {
                        "-Infinity"
                    }
                    .into(),
                )
            })
    };
    let hex = |b: &[u8]| J::String(b.iter().map(|x| format!("{x:02x}")).collect());
    if let Some(i) = integer_of(&v) {
        return Ok(J::from(i));
    }
    Ok(match v {
        Value::Null => J::Null,
        Value::Boolean(b) => J::Bool(b),

        Value::Float(f) => float(f as f64),
        Value::Double(f) => float(f),
        Value::String(s) | Value::Enum(_, s) => J::String(s),
        Value::Uuid(u) => J::String(u.to_string()),
        Value::Bytes(b) | Value::Fixed(_, b) => hex(&b),
        v @ (Value::Decimal(_) | Value::BigDecimal(_)) => J::String(decimal_text(v, schema)?),
        Value::Duration(d) => serde_json::json!({
            "months": u32::from(d.months()), "days": u32::from(d.days()), "millis": u32::from(d.millis())
        }),
        Value::Union(i, inner) => {
            let s = match schema {
                Some(Schema::Union(u)) => u.variants().get(i as usize),
                _ => None,
            };
            to_json(*inner, s)?
        }
        Value::Array(items) => {
            let s = match schema {
                Some(Schema::Array(a)) => Some(&*a.items),
                _ => None,
            };
            J::Array(
                items
                    .into_iter()
                    .map(|v| to_json(v, s))
                    .collect::<Result<_, _>>()?,
            )
        }
        Value::Map(m) => {
            let s = match schema {
                Some(Schema::Map(m)) => Some(&*m.types),
                _ => None,
            };
            J::Object(
                m.into_iter()
                    .map(|(k, v)| Ok((k, to_json(v, s)?)))
                    .collect::<Result<_, String>>()?,
            )
        }
        Value::Record(fields) => {
            let schemas: Vec<&Schema> = match schema {
                Some(Schema::Record(r)) => r.fields.iter().map(|f| &f.schema).collect(),
                _ => Vec::new(),
            };
            J::Object(
                fields
                    .into_iter()
                    .enumerate()
                    .map(|(i, (k, v))| Ok((k, to_json(v, schemas.get(i).copied())?)))
                    .collect::<Result<_, String>>()?,
            )
        }
        other => return Err(format!("no JSON form for {other:?}")),
    })
}

#[cfg(test)]
mod direct_tests {
    use super::*;
    use crate::rng::SimRng;

    /// Every primitive the direct path reads, nullable in both branch orders.
    const SCHEMA: &str = r#"{"type": "record", "name": "r", "fields": [
        {"name": "id", "type": "long"},
        {"name": "i", "type": "int"},
        {"name": "b", "type": "boolean"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "y", "type": "bytes"},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "ns", "type": ["null", "string"]},
        {"name": "nl", "type": ["long", "null"]},
        {"name": "nd", "type": ["null", "double"]}
    ]}"#;

    fn same(a: &[ColumnValue], b: &[ColumnValue]) -> bool {
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| match (x, y) {
                (ColumnValue::Real(p), ColumnValue::Real(q)) => p.to_bits() == q.to_bits(),
                (x, y) => x == y,
            })
    }

    /// A random row of [`SCHEMA`]: extremes, NaN, ±Inf, −0.0, Unicode, both union orders.
    fn random_row(rng: &mut SimRng, n: u64) -> Value {
        let specials = [
            0.0,
            -0.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e-310,
            1.5,
        ];
        let long = |r: &mut SimRng| match r.below(4) {
            0 => i64::MIN,
            1 => i64::MAX,
            _ => r.below(1 << 40) as i64 - (1 << 39),
        };
        let double = |r: &mut SimRng| specials[r.below(specials.len() as u64) as usize];
        let text: String = (0..rng.below(12))
            .map(|i| ['a', 'é', '日', '\u{0}', '😀'][(i + n) as usize % 5])
            .collect();
        Value::Record(vec![
            ("id".into(), Value::Long(long(rng))),
            ("i".into(), Value::Int(rng.below(1 << 32) as i64 as i32)),
            ("b".into(), Value::Boolean(rng.chance(50))),
            ("f".into(), Value::Float(double(rng) as f32)),
            ("d".into(), Value::Double(double(rng))),
            ("s".into(), Value::String(text.clone())),
            ("y".into(), Value::Bytes(text.clone().into_bytes())),
            ("day".into(), Value::Date(rng.below(40_000) as i32 - 20_000)),
            ("ts".into(), Value::TimestampMicros(long(rng))),
            (
                "ns".into(),
                if rng.chance(50) {
                    Value::Union(0, Box::new(Value::Null))
                } else {
                    Value::Union(1, Box::new(Value::String(text)))
                },
            ),
            (
                "nl".into(),
                if rng.chance(50) {
                    Value::Union(1, Box::new(Value::Null))
                } else {
                    Value::Union(0, Box::new(Value::Long(long(rng))))
                },
            ),
            (
                "nd".into(),
                Value::Union(1, Box::new(Value::Double(double(rng)))),
            ),
        ])
    }

    #[test]
    fn the_direct_path_reads_what_apache_avro_reads() {
        let t = TableSchema::parse(SCHEMA, &["id".into()]).unwrap();
        assert!(t.direct);
        let mut rng = SimRng::new(7);
        for n in 0..5_000u64 {
            let row = random_row(&mut rng, n);
            let datum = t.encode_row(&row).unwrap();
            let direct = t.column_values(&datum).unwrap();
            let Schema::Record(record) = &t.schema else {
                unreachable!()
            };
            let via_avro: Vec<ColumnValue> = t
                .decode_row(&datum)
                .unwrap()
                .into_iter()
                .zip(&t.columns)
                .zip(&record.fields)
                .map(|((v, c), f)| column_value(c.ty, &f.schema, v).unwrap())
                .collect();
            assert!(
                same(&direct, &via_avro),
                "row {n}: {direct:?} vs {via_avro:?}"
            );
            // Read in place: the same values, borrowing the datum.
            let mut in_place = vec![DirectValue::Null; 9];
            t.direct_values(&datum, &mut in_place).unwrap();
            let owned: Vec<ColumnValue> = in_place.iter().map(|v| ColumnValue::from(*v)).collect();
            assert!(same(&owned, &direct), "row {n}: {owned:?} vs {direct:?}");
            // A cut datum is an error, never a wrong value.
            let cut = &datum[..datum.len() - 1];
            assert!(t.column_values(cut).is_err(), "row {n} cut");
            assert!(t.direct_values(cut, &mut in_place).is_err(), "row {n} cut");
        }
    }

    #[test]
    fn a_table_with_a_composite_field_is_not_read_in_place() {
        let typed = TableSchema::parse(
            crate::workload::TYPED_ROW_SCHEMA,
            &["region".into(), "id".into()],
        )
        .unwrap();
        assert!(!typed.is_direct());
        let e = typed.direct_values(&[], &mut Vec::new()).unwrap_err();
        assert!(e.to_string().contains("not read in place"), "{e}");
    }

    #[test]
    fn a_row_rebuilt_from_its_typed_columns_is_its_datum() {
        let t = TableSchema::parse(SCHEMA, &["id".into()]).unwrap();
        assert_eq!(t.first_composite_field(), None);
        let mut rng = SimRng::new(5);
        for n in 0..2_000u64 {
            let row = random_row(&mut rng, n);
            let datum = t.encode_row(&row).unwrap();
            let values = t.column_values(&datum).unwrap();
            assert_eq!(t.datum_of_columns(&values).unwrap(), datum, "row {n}");
        }
        let typed = TableSchema::parse(
            crate::workload::TYPED_ROW_SCHEMA,
            &["region".into(), "id".into()],
        )
        .unwrap();
        assert!(typed.first_composite_field().is_some());
        let mut values = t
            .column_values(&t.encode_row(&random_row(&mut rng, 0)).unwrap())
            .unwrap();
        values[0] = ColumnValue::Text("x".into());
        let e = t.datum_of_columns(&values).unwrap_err().to_string();
        assert!(e.contains("column id"), "{e}");
    }

    #[test]
    fn the_one_walk_key_check_agrees_with_check_row_then_key_of_datum() {
        use crate::workload::{example_row, typed_row, EXAMPLE_ROW_SCHEMA, TYPED_ROW_SCHEMA};
        let tables = [
            (
                TableSchema::parse(EXAMPLE_ROW_SCHEMA, &["id".into()]).unwrap(),
                example_row as fn(i64, i64, usize, &mut SimRng) -> Value,
            ),
            (
                TableSchema::parse(TYPED_ROW_SCHEMA, &["region".into(), "id".into()]).unwrap(),
                typed_row,
            ),
            (
                // The key fields in another order than the record's.
                TableSchema::parse(TYPED_ROW_SCHEMA, &["id".into(), "region".into()]).unwrap(),
                typed_row,
            ),
        ];
        let mut rng = SimRng::new(11);
        for (t, row) in &tables {
            for n in 0..500 {
                let datum = t.encode_row(&row(n, n % 7, 150, &mut rng)).unwrap();
                let key = t.key_of_datum(&datum).unwrap();
                assert_eq!(t.check_row_key(&datum, &key), Ok(true), "row {n}");
                let other = t.encode_row(&row(n + 1, 0, 150, &mut rng)).unwrap();
                let other_key = t.key_of_datum(&other).unwrap();
                assert_eq!(t.check_row_key(&datum, &other_key), Ok(false), "row {n}");
                assert_eq!(t.check_row_key(&datum, &key[..key.len() - 1]), Ok(false));
                assert_eq!(
                    t.check_row_key(&datum, &[key.as_slice(), b"x"].concat()),
                    Ok(false)
                );
                for bad in [
                    &datum[..datum.len() - 1],
                    &[datum.as_slice(), &[0]].concat(),
                ] {
                    assert_eq!(
                        t.check_row_key(bad, &key).unwrap_err(),
                        t.check_row(bad).unwrap_err(),
                        "row {n}: the same error as check_row"
                    );
                }
            }
        }
    }

    #[test]
    fn schemas_with_other_types_take_apache_avros_path() {
        for other in [
            r#"{"type": "string", "logicalType": "uuid"}"#,
            r#"{"type": "array", "items": "long"}"#,
            r#"["null", "long", "string"]"#,
            r#"{"type": "enum", "name": "e", "symbols": ["a"]}"#,
        ] {
            let json = format!(
                r#"{{"type": "record", "name": "r", "fields": [{{"name": "id", "type": "long"}}, {{"name": "x", "type": {other}}}]}}"#
            );
            let t = TableSchema::parse(&json, &["id".into()]).unwrap();
            assert!(!t.direct, "{other}");
        }
    }
}
