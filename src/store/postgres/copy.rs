//! Binary `COPY` of a snapshot checkpoint's rows: straight into a fresh table, or through a
//! temporary table and one upsert when the table may hold them.

use super::*;

/// The binary type a column is copied as: the type its [`PgValue`] binds (decimals and JSON as text,
/// cast on the way into the table, as [`placeholder`] does).
pub(super) fn copy_type(ty: ColumnType) -> postgres::types::Type {
    use postgres::types::Type;
    match ty {
        ColumnType::Integer => Type::INT8,
        ColumnType::Boolean => Type::BOOL,
        ColumnType::Real => Type::FLOAT8,
        ColumnType::Blob => Type::BYTEA,
        ColumnType::Text | ColumnType::Decimal | ColumnType::Json => Type::TEXT,
    }
}

/// `upserts` in `COPY … FROM STDIN (FORMAT binary)` rows of `types`: key, vnode, datum, columns.
pub(super) fn copy_binary(
    tx: &mut Transaction<'_>,
    copy: &str,
    types: &[postgres::types::Type],
    upserts: &[UpsertRow],
) -> Result<(), postgres::Error> {
    let sink = tx.copy_in(copy)?;
    let mut writer = postgres::binary_copy::BinaryCopyInWriter::new(sink, types);
    let mut row: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(types.len());
    for (key, vnode, value, values) in upserts {
        row.clear();
        row.push(key);
        row.push(vnode);
        row.push(value);
        row.extend(values.iter().map(|v| v.sql()));
        writer.write(&row)?;
    }
    writer.finish().map(|_| ())
}

/// A snapshot scan's rows, `COPY`ed straight into the table: one pass of the server over them
/// instead of a staging table and an `INSERT … ON CONFLICT` (`scripts/bench.sh --only pg-key,
/// pg-ceiling`: the two shapes' ceilings side by side). A snapshot scan resumes after its committed
/// cursor, so the table holds none of these rows — unless a transaction is replayed after a lost
/// answer: then the `COPY` meets a row it holds, is rolled back to its savepoint, and the rows take
/// the idempotent path (returns `false`). Not for tables with columns the staging path casts
/// (`NUMERIC`, `JSONB` are copied as text).
pub(super) fn copy_fresh(
    tx: &mut Transaction<'_>,
    table: &TableSchema,
    table_name: &str,
    cols: &[String],
    upserts: &[UpsertRow],
) -> Result<bool, StoreError> {
    use postgres::error::SqlState;
    use postgres::types::Type;
    if table
        .columns
        .iter()
        .any(|c| matches!(c.ty, ColumnType::Decimal | ColumnType::Json))
    {
        return Ok(false);
    }
    let types: Vec<Type> = [Type::BYTEA, Type::INT4, Type::BYTEA]
        .into_iter()
        .chain(table.columns.iter().map(|c| copy_type(c.ty)))
        .collect();
    let copy = sql::render(
        sql::postgres::TABLE_COPY,
        &[("table", table_name), ("columns", &cols.join(", "))],
    );
    let mut savepoint = tx.savepoint("kb_fresh").map_err(classify)?;
    match copy_binary(&mut savepoint, &copy, &types, upserts) {
        Ok(()) => {
            savepoint.commit().map_err(classify)?;
            Ok(true)
        }
        Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
            savepoint.rollback().map_err(classify)?;
            tracing::debug!(
                table = table_name,
                rows = upserts.len(),
                "snapshot rows already in the table (a replayed checkpoint): upserted instead"
            );
            Ok(false)
        }
        Err(e) => Err(classify(e)),
    }
}

/// Many upserts at once: `COPY … FROM STDIN (FORMAT binary)` into a temporary table of this
/// session (emptied at commit), then one `INSERT … SELECT … ON CONFLICT DO UPDATE`. Idempotent like
/// the multi-row statements (a transaction replayed after a lost answer upserts the same rows
/// again), where a `COPY` straight into the table would fail on the rows it already holds.
pub(super) fn copy_upserts(
    tx: &mut Transaction<'_>,
    table: &TableSchema,
    table_name: &str,
    layout: KeyLayout,
    cols: &[String],
    sets: &[String],
    upserts: &[UpsertRow],
) -> Result<(), StoreError> {
    use postgres::types::Type;
    let stage_cols: Vec<String> = table
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| format!("c{i} {}", copy_type(c.ty)))
        .collect();
    // One staging table per session and row shape: a schema change (docs/WIRE.md "Schema
    // changes") gives the table other columns, and the session's earlier staging table keeps its own.
    let stage = format!(
        "kb_stage_{:08x}",
        crc32fast::hash(format!("{table_name}\0{}", stage_cols.join(",")).as_bytes())
    );
    tx.batch_execute(&sql::render(
        sql::postgres::STAGE_CREATE,
        &[("stage", &stage), ("columns", &stage_cols.join(", "))],
    ))
    .map_err(classify)?;
    let types: Vec<Type> = [Type::BYTEA, Type::INT4, Type::BYTEA]
        .into_iter()
        .chain(table.columns.iter().map(|c| copy_type(c.ty)))
        .collect();
    copy_binary(
        tx,
        &sql::render(sql::postgres::STAGE_COPY, &[("stage", &stage)]),
        &types,
        upserts,
    )
    .map_err(classify)?;
    let selected: Vec<String> = table
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| match c.ty {
            ColumnType::Decimal => format!("c{i}::numeric"),
            ColumnType::Json => format!("c{i}::jsonb"),
            _ => format!("c{i}"),
        })
        .collect();
    tx.execute(
        &sql::render(
            sql::postgres::STAGE_MERGE,
            &[
                ("table", table_name),
                ("columns", &cols.join(", ")),
                ("selected", &selected.join(", ")),
                ("stage", &stage),
                ("conflict", layout.conflict()),
                ("set_vnode", layout.set_vnode()),
                ("sets", &sets.join(", ")),
            ],
        ),
        &[],
    )
    .map_err(classify)?;
    // Emptied now too: a group commits several checkpoints in one transaction.
    tx.batch_execute(&sql::render(
        sql::postgres::STAGE_TRUNCATE,
        &[("stage", &stage)],
    ))
    .map_err(classify)?;
    Ok(())
}
