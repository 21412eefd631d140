//! Column values to and from SQLite: typed parameters, in-place binds of a datum's fields, a
//! column read back as the codec's value, and a row error naming the key.

use super::*;

/// A column value as SQLite binds it, by reference. SQLite has no NaN (it would store NULL): NaN is
/// stored as the text `NaN`; ±Inf are REALs; −0.0 reads back as 0.0 (the exact value stays in `_kb_row`).
pub(super) struct SqliteValue<'a>(pub(super) &'a ColumnValue);

impl<'a> SqliteValue<'a> {
    /// The value as [`StaticStatement`] binds it (borrowed, no copy).
    pub(super) fn param(&self) -> Param<'a> {
        // One mapping: the rules (a boolean as 0 or 1, NaN as text) are `direct_param`'s.
        direct_param(match self.0 {
            ColumnValue::Null => DirectValue::Null,
            ColumnValue::Integer(i) => DirectValue::Integer(*i),
            ColumnValue::Boolean(b) => DirectValue::Boolean(*b),
            ColumnValue::Real(f) => DirectValue::Real(*f),
            ColumnValue::Text(s) | ColumnValue::Decimal(s) | ColumnValue::Json(s) => {
                DirectValue::Text(s)
            }
            ColumnValue::Blob(b) => DirectValue::Blob(b),
        })
    }
}

impl rusqlite::ToSql for SqliteValue<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput::Borrowed, ValueRef};
        // One mapping (`param`), whichever way the value is bound.
        Ok(Borrowed(match self.param() {
            Param::Null => ValueRef::Null,
            Param::Integer(i) => ValueRef::Integer(i),
            Param::Real(f) => ValueRef::Real(f),
            Param::Text(s) => ValueRef::Text(s.as_bytes()),
            Param::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

/// A column value as [`StaticStatement`] binds it, borrowed (a value read in place from a datum,
/// or [`SqliteValue::param`]'s): a boolean as 0 or 1, NaN as the text `NaN`.
pub(super) fn direct_param(v: DirectValue<'_>) -> Param<'_> {
    match v {
        DirectValue::Null => Param::Null,
        DirectValue::Integer(i) => Param::Integer(i),
        DirectValue::Boolean(b) => Param::Integer(b as i64),
        DirectValue::Real(f) if f.is_nan() => Param::Text("NaN"),
        DirectValue::Real(f) => Param::Real(f),
        DirectValue::Text(s) => Param::Text(s),
        DirectValue::Blob(b) => Param::Blob(b),
    }
}

/// A column value as SQLite holds it, read back the way [`SqliteValue`] wrote it (NaN as the text
/// `NaN`; a REAL may come back as an INTEGER when it is integral, and −0.0 as 0.0).
pub(super) fn column_from_sqlite(
    c: &crate::codec::Column,
    v: rusqlite::types::ValueRef<'_>,
    key: &[u8],
) -> Result<ColumnValue, StoreError> {
    use crate::codec::ColumnType as T;
    use rusqlite::types::ValueRef as V;
    Ok(match (c.ty, v) {
        (_, V::Null) => ColumnValue::Null,
        (T::Integer, V::Integer(i)) => ColumnValue::Integer(i),
        (T::Boolean, V::Integer(i)) => ColumnValue::Boolean(i != 0),
        (T::Real, V::Real(f)) => ColumnValue::Real(f),
        (T::Real, V::Integer(i)) => ColumnValue::Real(i as f64),
        (T::Real, V::Text(b"NaN")) => ColumnValue::Real(f64::NAN),
        (T::Text, V::Text(t)) => match std::str::from_utf8(t) {
            Ok(t) => ColumnValue::Text(t.to_string()),
            Err(e) => {
                return Err(StoreError::Value {
                    column: c.name.clone(),
                    key: crate::ports::key_hex(key),
                    reason: format!("not UTF-8: {e}"),
                })
            }
        },
        (T::Blob, V::Blob(b)) => ColumnValue::Blob(b.to_vec()),
        (ty, v) => {
            return Err(StoreError::Value {
                column: c.name.clone(),
                key: crate::ports::key_hex(key),
                reason: format!(
                    "holds {:?} where a {ty:?} column value is expected",
                    v.data_type()
                ),
            })
        }
    })
}

/// A failed row write: a constraint names its column where SQLite says which.
pub(super) fn row_error(e: rusqlite::Error, table: &TableSchema, key: &[u8]) -> StoreError {
    match classify(e) {
        StoreError::Rejected { what, cause } => {
            match table
                .columns
                .iter()
                .find(|c| what.contains(&format!(".{}", c.name)))
            {
                Some(c) => StoreError::Value {
                    column: c.name.clone(),
                    key: crate::ports::key_hex(key),
                    reason: what,
                },
                None => StoreError::Rejected { what, cause },
            }
        }
        other => other,
    }
}
