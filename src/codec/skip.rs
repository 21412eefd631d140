//! Walks one Avro datum against its schema without building values: the cheap way to check that a
//! row datum is complete and well-typed and to find where it ends.

use apache_avro::Schema;

use super::varint::get_long;

/// Advances `buf` past one datum of `schema`, or says why it cannot.
pub fn skip(schema: &Schema, buf: &mut &[u8]) -> Result<(), String> {
    match schema {
        Schema::Null => Ok(()),
        Schema::Boolean => match take(buf, 1)? {
            [0] | [1] => Ok(()),
            other => Err(format!("invalid boolean byte {:#04x}", other[0])),
        },
        Schema::Int
        | Schema::Long
        | Schema::Date
        | Schema::TimeMillis
        | Schema::TimeMicros
        | Schema::TimestampMillis
        | Schema::TimestampMicros
        | Schema::TimestampNanos
        | Schema::LocalTimestampMillis
        | Schema::LocalTimestampMicros
        | Schema::LocalTimestampNanos => long(buf).map(|_| ()),
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
        Schema::Decimal(d) => skip(&d.inner, buf),
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
            skip(branch, buf)
        }
        Schema::Record(r) => {
            for f in &r.fields {
                skip(&f.schema, buf).map_err(|e| format!("field {}: {e}", f.name))?;
            }
            Ok(())
        }
        Schema::Array(a) => blocks(buf, |buf| skip(&a.items, buf)),
        Schema::Map(m) => blocks(buf, |buf| {
            skip(&Schema::String, buf)?;
            skip(&m.types, buf)
        }),
        Schema::Ref { name } => Err(format!("unresolved schema reference {name}")),
    }
}

fn long(buf: &mut &[u8]) -> Result<i64, String> {
    get_long(buf).ok_or_else(|| "truncated integer".to_string())
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

fn blocks(
    buf: &mut &[u8],
    mut item: impl FnMut(&mut &[u8]) -> Result<(), String>,
) -> Result<(), String> {
    loop {
        let count = long(buf)?;
        if count == 0 {
            return Ok(());
        }
        if count < 0 {
            long(buf)?; // block size in bytes, then -count items
        }
        for _ in 0..count.unsigned_abs() {
            item(buf)?;
        }
    }
}
