//! Column values to PostgreSQL: typed parameters and placeholders, and the table's key layout.

use super::*;

/// A materialised table's primary key. New tables are keyed `(_kb_vnode, _kb_key)`, RisingWave's
/// state-table layout: a checkpoint's rows, sorted by (vnode, key), land on neighbouring index
/// pages instead of pages spread over the whole key space. Tables created before (keyed `_kb_key`
/// alone) keep their key and work as they did: the statements follow the layout found at open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyLayout {
    /// `PRIMARY KEY (_kb_key)`: tables of earlier releases.
    Key,
    /// `PRIMARY KEY (_kb_vnode, _kb_key)`.
    VnodeKey,
}

impl KeyLayout {
    /// The `ON CONFLICT` target.
    pub(super) fn conflict(self) -> &'static str {
        match self {
            KeyLayout::Key => "(_kb_key)",
            KeyLayout::VnodeKey => "(_kb_vnode, _kb_key)",
        }
    }

    /// What an upsert sets besides the row: a key's vnode is part of the new key, not a column to
    /// update.
    pub(super) fn set_vnode(self) -> &'static str {
        match self {
            KeyLayout::Key => "_kb_vnode = EXCLUDED._kb_vnode, ",
            KeyLayout::VnodeKey => "",
        }
    }
}

/// A column value bound as its PostgreSQL type (decimals and JSON go as text and are cast in the
/// statement).
pub(super) enum PgValue {
    Int(Option<i64>),
    Bool(Option<bool>),
    Real(Option<f64>),
    Text(Option<String>),
    Bytes(Option<Vec<u8>>),
}

impl PgValue {
    /// PostgreSQL's text and JSONB cannot hold U+0000: such a value is refused, naming the column.
    pub(super) fn of(
        ty: ColumnType,
        v: ColumnValue,
        column: &str,
        key: &[u8],
    ) -> Result<PgValue, StoreError> {
        Ok(match v {
            ColumnValue::Null => match ty {
                ColumnType::Integer => PgValue::Int(None),
                ColumnType::Boolean => PgValue::Bool(None),
                ColumnType::Real => PgValue::Real(None),
                ColumnType::Blob => PgValue::Bytes(None),
                ColumnType::Text | ColumnType::Decimal | ColumnType::Json => PgValue::Text(None),
            },
            ColumnValue::Integer(i) => PgValue::Int(Some(i)),
            ColumnValue::Boolean(b) => PgValue::Bool(Some(b)),
            ColumnValue::Real(f) => PgValue::Real(Some(f)),
            ColumnValue::Blob(b) => PgValue::Bytes(Some(b)),
            ColumnValue::Text(t) | ColumnValue::Decimal(t) | ColumnValue::Json(t) => {
                if t.contains('\0') || (ty == ColumnType::Json && t.contains("\\u0000")) {
                    return Err(StoreError::Value {
                        column: column.to_string(),
                        key: crate::ports::key_hex(key),
                        reason: "PostgreSQL text cannot hold the character U+0000".into(),
                    });
                }
                PgValue::Text(Some(t))
            }
        })
    }

    pub(super) fn sql(&self) -> &(dyn ToSql + Sync) {
        match self {
            PgValue::Int(v) => v,
            PgValue::Bool(v) => v,
            PgValue::Real(v) => v,
            PgValue::Text(v) => v,
            PgValue::Bytes(v) => v,
        }
    }
}

/// The placeholder for a column: decimals and JSON are bound as text and cast.
pub(super) fn placeholder(ty: ColumnType, n: usize) -> String {
    match ty {
        ColumnType::Decimal => format!("${n}::text::numeric"),
        ColumnType::Json => format!("${n}::text::jsonb"),
        _ => format!("${n}"),
    }
}
