//! A table's row schema and primary key.

use apache_avro::types::Value;
use apache_avro::Schema;

use super::skip::skip;
use super::wire::CodecError;

/// How a column is stored downstream (SQLite affinity).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnType {
    Integer,
    Real,
    Text,
    Blob,
}

impl ColumnType {
    pub fn sql(self) -> &'static str {
        match self {
            ColumnType::Integer => "INTEGER",
            ColumnType::Real => "REAL",
            ColumnType::Text => "TEXT",
            ColumnType::Blob => "BLOB",
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
}

impl TableSchema {
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
        Ok(TableSchema {
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
        let mut ranges = vec![(0usize, 0usize); record.fields.len()];
        let mut rest = datum;
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
        s => (s, false),
    };
    let ty = match schema {
        Schema::Boolean | Schema::Int | Schema::Long | Schema::Date | Schema::TimeMillis | Schema::TimeMicros
        | Schema::TimestampMillis | Schema::TimestampMicros | Schema::TimestampNanos
        | Schema::LocalTimestampMillis | Schema::LocalTimestampMicros | Schema::LocalTimestampNanos => ColumnType::Integer,
        Schema::Float | Schema::Double => ColumnType::Real,
        Schema::String | Schema::Uuid | Schema::Enum(_) => ColumnType::Text,
        Schema::Bytes | Schema::Fixed(_) | Schema::Decimal(_) | Schema::BigDecimal | Schema::Duration => ColumnType::Blob,
        other => {
            return Err(CodecError::Schema(format!(
                "field {name}: type {other:?} has no column mapping (use a primitive, enum, fixed or a nullable one)"
            )))
        }
    };
    Ok(Column {
        name: name.to_string(),
        ty,
        nullable,
    })
}
