//! A schema change's primitives inside a PostgreSQL commit (`protocol::evolve` is the rule).

use super::*;

impl protocol::TxSchema for InTx<'_, '_> {
    fn schema_version(&mut self, key: &str) -> Result<Option<(usize, String)>, StoreError> {
        Ok(self
            .tx
            .query_opt(sql::postgres::SCHEMA_VERSION_LATEST, &[&key])
            .map_err(classify)?
            .map(|r| (r.get::<_, i32>(0) as usize, r.get::<_, String>(1))))
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
        // Commits of one job change the table in turn: a second worker's commit waits here, then
        // finds the version recorded and resolves its rows to it.
        self.tx
            .execute(sql::postgres::JOB_LOCK, &[&job])
            .map_err(classify)?;
        let (added, dropped) = protocol::column_changes(from, &to.table);
        for c in &added {
            self.tx
                .batch_execute(&sql::render(
                    sql::postgres::COLUMN_ADD,
                    &[("table", t), ("column", &c.name), ("type", c.ty.postgres())],
                ))
                .map_err(classify)?;
        }
        let sets: String = added
            .iter()
            .enumerate()
            .map(|(i, c)| format!(", \"{}\" = {}", c.name, placeholder(c.ty, i + 4)))
            .collect();
        let update = self
            .tx
            .prepare(&sql::render(
                sql::postgres::ROW_VERSION_UPDATE,
                &[("table", t), ("sets", &sets)],
            ))
            .map_err(classify)?;
        // Through a cursor (a portal of this transaction, which sees the table as it was when
        // opened), a batch at a time, so memory holds one batch, not the table.
        let portal = self
            .tx
            .bind(&sql::render(sql::postgres::ROWS_ALL, &[("table", t)]), &[])
            .map_err(classify)?;
        loop {
            let rows = self
                .tx
                .query_portal(&portal, protocol::REWRITE_BATCH as i32)
                .map_err(classify)?;
            if rows.is_empty() {
                break;
            }
            for r in rows {
                let vnode: i32 = r.get(0);
                let key: Vec<u8> = r.get(1);
                let datum: Vec<u8> = r.get(2);
                let (next, values) =
                    protocol::resolve_stored_row(from, &to.table, version, &added, &key, &datum)?;
                let bound = added
                    .iter()
                    .zip(values)
                    .map(|(c, v)| PgValue::of(c.ty, v, &c.name, &key))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut params: Vec<&(dyn ToSql + Sync)> = vec![&vnode, &key, &next];
                params.extend(bound.iter().map(PgValue::sql));
                self.tx.execute(&update, &params).map_err(classify)?;
            }
        }
        // Closed before the table is altered again (PostgreSQL refuses to while it is open).
        drop(portal);
        for c in &dropped {
            self.tx
                .batch_execute(&sql::render(
                    sql::postgres::COLUMN_DROP,
                    &[("table", t), ("column", c)],
                ))
                .map_err(classify)?;
        }
        self.tx
            .execute(
                sql::postgres::SCHEMA_VERSION_INSERT,
                &[
                    &protocol::history_key(job, table),
                    &(version as i32),
                    &(to.from_epoch.0 as i64),
                    &crate::codec::versions::hex(&to.fingerprint),
                    &to.table.json.to_string(),
                    &applied_epoch.map(|e| e.0 as i64),
                ],
            )
            .map_err(classify)?;
        tracing::info!(job, table = t, version, from_epoch = %to.from_epoch, added = added.len(), dropped = dropped.len(), "schema change applied");
        Ok(())
    }
}
