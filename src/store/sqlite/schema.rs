//! A schema change's primitives inside a SQLite commit (`protocol::evolve` is the rule).

use super::*;

/// A schema change's primitives inside a SQLite commit (`protocol::evolve` is the rule).
impl protocol::TxSchema for InTx<'_> {
    fn schema_version(&mut self, key: &str) -> Result<Option<(usize, String)>, StoreError> {
        self.tx
            .query_row(sql::sqlite::SCHEMA_VERSION_LATEST, [key], |r| {
                Ok((r.get::<_, i64>(0)? as usize, r.get::<_, String>(1)?))
            })
            .optional()
            .map_err(classify)
    }

    fn alter_table(
        &mut self,
        job: &str,
        table: Option<&str>,
        version: usize,
        from: &TableSchema,
        to: &RowVersion,
        applied_epoch: Option<Epoch>,
        next: bool,
    ) -> Result<(), StoreError> {
        let name = protocol::table_in(table.unwrap_or(self.table_name), next);
        let t = name.as_str();
        if !self.datum {
            return Err(StoreError::rejected(format!(
                "job {job}: table {t} cannot take schema version {version} (from epoch {}): schema changes are applied with store_datum = true (each row's datum is resolved to the new version)",
                to.from_epoch
            )));
        }
        let (added, dropped) = protocol::column_changes(from, &to.table);
        for c in &added {
            self.tx
                .execute(
                    &sql::render(
                        sql::sqlite::COLUMN_ADD,
                        &[("table", t), ("column", &c.name), ("type", c.ty.sqlite())],
                    ),
                    [],
                )
                .map_err(classify)?;
        }
        let sets: String = added
            .iter()
            .enumerate()
            .map(|(i, c)| format!(", \"{}\" = ?{}", c.name, i + 4))
            .collect();
        let mut update = self
            .tx
            .prepare(&sql::render(
                sql::sqlite::ROW_VERSION_UPDATE,
                &[("table", t), ("sets", &sets)],
            ))
            .map_err(classify)?;
        // In batches by key (the table's primary key), so memory holds one batch, not the table.
        let mut page = self
            .tx
            .prepare(&sql::render(
                sql::sqlite::ROWS_PAGE,
                &[
                    ("table", t),
                    ("limit", &protocol::REWRITE_BATCH.to_string()),
                ],
            ))
            .map_err(classify)?;
        let mut after: (i64, Vec<u8>) = (-1, Vec::new());
        loop {
            let rows: Vec<(i64, Vec<u8>, Vec<u8>)> = page
                .query_map(params![after.0, after.1], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })
                .map_err(classify)?
                .collect::<Result<_, _>>()
                .map_err(classify)?;
            let Some((vnode, key, _)) = rows.last() else {
                break;
            };
            after = (*vnode, key.clone());
            for (vnode, key, datum) in rows {
                let (next, values) =
                    protocol::resolve_stored_row(from, &to.table, version, &added, &key, &datum)?;
                update.raw_bind_parameter(1, vnode).map_err(classify)?;
                update
                    .raw_bind_parameter(2, key.as_slice())
                    .map_err(classify)?;
                update
                    .raw_bind_parameter(3, next.as_slice())
                    .map_err(classify)?;
                for (i, v) in values.iter().enumerate() {
                    update
                        .raw_bind_parameter(i + 4, SqliteValue(v))
                        .map_err(classify)?;
                }
                update.raw_execute().map_err(classify)?;
            }
        }
        drop((page, update));
        for c in &dropped {
            self.tx
                .execute(
                    &sql::render(sql::sqlite::COLUMN_DROP, &[("table", t), ("column", c)]),
                    [],
                )
                .map_err(classify)?;
        }
        self.tx
            .execute(
                sql::sqlite::SCHEMA_VERSION_INSERT,
                params![
                    protocol::history_key(job, table),
                    version as i64,
                    to.from_epoch.0 as i64,
                    crate::codec::versions::hex(&to.fingerprint),
                    to.table.json.to_string(),
                    applied_epoch.map(|e| e.0 as i64)
                ],
            )
            .map_err(classify)?;
        tracing::info!(job, table = t, version, from_epoch = %to.from_epoch, added = added.len(), dropped = dropped.len(), "schema change applied");
        Ok(())
    }
}
