//! Walks one Avro datum against its schema without building values: the cheap way to check that a
//! row datum is complete and well-typed and to find where it ends.
//!
//! Bounded on any input: work is linear in the bytes plus at most [`MAX_EMPTY_ITEMS`] array or map
//! items that take no bytes (an array of nulls may legally claim any count); nesting is bounded by
//! [`MAX_DEPTH`]; integers longer than 64 bits are refused. Never panics.

use apache_avro::Schema;

use super::varint::get_long;

/// Array and map items that take no bytes (e.g. nulls) one datum may hold.
pub const MAX_EMPTY_ITEMS: u64 = 1 << 20;
/// Schema nesting one datum may go through (JSON schemas parse to about 60 levels at most).
pub const MAX_DEPTH: usize = 48;

/// Whether a schema is written as an Avro long: `long` and the long-based logical types.
pub fn is_long_based(schema: &Schema) -> bool {
    matches!(
        schema,
        Schema::Long
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos
    )
}

/// Advances `buf` past one datum of `schema`, or says why it cannot.
pub fn skip(schema: &Schema, buf: &mut &[u8]) -> Result<(), String> {
    Walker {
        empty_items: MAX_EMPTY_ITEMS,
    }
    .skip(schema, buf, 0)
}

/// Skips a record's datum as [`skip`] of the record does (one walker, so one budget of empty items
/// and one depth for the whole row), calling `each(field, start, end)` with each field's byte range
/// in the datum.
pub fn skip_record(
    record: &apache_avro::schema::RecordSchema,
    datum: &[u8],
    mut each: impl FnMut(usize, usize, usize),
) -> Result<usize, String> {
    let mut w = Walker {
        empty_items: MAX_EMPTY_ITEMS,
    };
    let mut rest = datum;
    for (i, f) in record.fields.iter().enumerate() {
        let start = datum.len() - rest.len();
        w.skip(&f.schema, &mut rest, 1)
            .map_err(|e| format!("field {}: {e}", f.name))?;
        each(i, start, datum.len() - rest.len());
    }
    Ok(datum.len() - rest.len())
}

struct Walker {
    /// Zero-byte items still allowed.
    empty_items: u64,
}

impl Walker {
    fn skip(&mut self, schema: &Schema, buf: &mut &[u8], depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(format!("nested deeper than {MAX_DEPTH} levels"));
        }
        let depth = depth + 1;
        match schema {
            Schema::Null => Ok(()),
            Schema::Boolean => match take(buf, 1)? {
                [0] | [1] => Ok(()),
                other => Err(format!("invalid boolean byte {:#04x}", other[0])),
            },
            Schema::Int | Schema::Date | Schema::TimeMillis => {
                let i = long(buf)?;
                i32::try_from(i)
                    .map(|_| ())
                    .map_err(|_| format!("int {i} out of the 32-bit range"))
            }
            s if is_long_based(s) => long(buf).map(|_| ()),
            Schema::Float => take(buf, 4).map(|_| ()),
            Schema::Double => take(buf, 8).map(|_| ()),
            Schema::Bytes | Schema::BigDecimal => {
                let n = len(buf)?;
                take(buf, n).map(|_| ())
            }
            Schema::String | Schema::Uuid => {
                let n = len(buf)?;
                let s = take(buf, n)?;
                std::str::from_utf8(s)
                    .map(|_| ())
                    .map_err(|e| format!("string is not UTF-8: {e}"))
            }
            Schema::Fixed(f) => take(buf, f.size).map(|_| ()),
            Schema::Decimal(d) => self.skip(&d.inner, buf, depth),
            Schema::Duration => take(buf, 12).map(|_| ()),
            Schema::Enum(e) => {
                let i = long(buf)?;
                if i < 0 || i as usize >= e.symbols.len() {
                    return Err(format!("enum {} index {i} out of range", e.name.name));
                }
                Ok(())
            }
            Schema::Union(u) => {
                let i = long(buf)?;
                let branch = u
                    .variants()
                    .get(usize::try_from(i).map_err(|_| format!("union index {i} is negative"))?)
                    .ok_or_else(|| format!("union index {i} out of range"))?;
                self.skip(branch, buf, depth)
            }
            Schema::Record(r) => {
                for f in &r.fields {
                    self.skip(&f.schema, buf, depth)
                        .map_err(|e| format!("field {}: {e}", f.name))?;
                }
                Ok(())
            }
            Schema::Array(a) => self.blocks(buf, |w, buf| w.skip(&a.items, buf, depth)),
            Schema::Map(m) => self.blocks(buf, |w, buf| {
                w.skip(&Schema::String, buf, depth)?;
                w.skip(&m.types, buf, depth)
            }),
            Schema::Ref { name } => Err(format!("unresolved schema reference {name}")),
            other => Err(format!("no datum of schema {other:?} can be walked")),
        }
    }

    /// The items of an array or map: blocks of `count` items (a negative count is followed by the
    /// block's size in bytes), ending with a zero count.
    fn blocks(
        &mut self,
        buf: &mut &[u8],
        mut item: impl FnMut(&mut Self, &mut &[u8]) -> Result<(), String>,
    ) -> Result<(), String> {
        loop {
            let count = long(buf)?;
            if count == 0 {
                return Ok(());
            }
            if count < 0 {
                let size = long(buf)?; // block size in bytes, then -count items
                if size < 0 {
                    return Err(format!("negative block size {size}"));
                }
            }
            for _ in 0..count.unsigned_abs() {
                let before = buf.len();
                item(self, buf)?;
                if buf.len() == before {
                    if self.empty_items == 0 {
                        return Err(format!(
                            "more than {MAX_EMPTY_ITEMS} array or map items that take no bytes"
                        ));
                    }
                    self.empty_items -= 1;
                }
            }
        }
    }
}

fn long(buf: &mut &[u8]) -> Result<i64, String> {
    get_long(buf).ok_or_else(|| "truncated or over-64-bit integer".to_string())
}

fn len(buf: &mut &[u8]) -> Result<usize, String> {
    let n = long(buf)?;
    usize::try_from(n).map_err(|_| format!("negative length {n}"))
}

fn take<'a>(buf: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
    if buf.len() < n {
        return Err(format!("truncated: needs {n} bytes, {} left", buf.len()));
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}
