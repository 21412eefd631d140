//! A PostgreSQL table as the snapshot source. The table holds `_kb_key BYTEA PRIMARY KEY, _kb_vnode INT,
//! _kb_row BYTEA` (the key bytes, the vnode and the Avro row datum), indexed by
//! `(_kb_vnode, _kb_key)` so that a vnode scans in key order from a cursor; beside it, a row of
//! `kb_snapshots` records the snapshot epoch, the vnode and partition counts, the per-partition start
//! offsets, the row schema and the primary key. `kafka-backfill export-snapshot` writes both from a
//! file snapshot.

use std::sync::Mutex;

use postgres::Client;

use crate::codec::TableSchema;
use crate::core::{Row, Vnode};
use crate::pg_tls::redact_url;
use crate::ports::{RowIter, SnapshotInfo, SnapshotSource, SourceError};
use crate::snapshot::files::SnapshotFiles;

const SNAPSHOTS: &str = "CREATE TABLE IF NOT EXISTS kb_snapshots (
  name TEXT PRIMARY KEY, table_name TEXT NOT NULL, info JSONB NOT NULL, row_schema JSONB NOT NULL,
  primary_key JSONB NOT NULL)";

fn err(what: impl std::fmt::Display) -> SourceError {
    SourceError::Other(what.to_string())
}

pub struct PostgresSnapshot {
    client: Mutex<Client>,
    name: String,
    table_name: String,
    table: TableSchema,
    info: SnapshotInfo,
}

impl PostgresSnapshot {
    /// Opens snapshot `name` recorded in `kb_snapshots`.
    pub fn open(url: &str, name: &str) -> Result<Self, SourceError> {
        let mut client = crate::pg_tls::connect(url).map_err(|e| err(e.message))?;
        let row = client
            .query_opt("SELECT table_name, info::text, row_schema::text, primary_key::text FROM kb_snapshots WHERE name = $1", &[&name])
            .map_err(|e| err(format!("{}: reading kb_snapshots: {e}", redact_url(url))))?
            .ok_or_else(|| err(format!("{}: no snapshot named {name} in kb_snapshots", redact_url(url))))?;
        let table_name: String = row.get(0);
        let info: SnapshotInfo = serde_json::from_str(row.get::<_, &str>(1))
            .map_err(|e| err(format!("kb_snapshots[{name}].info: {e}")))?;
        let pk: Vec<String> = serde_json::from_str(row.get::<_, &str>(3))
            .map_err(|e| err(format!("kb_snapshots[{name}].primary_key: {e}")))?;
        let table = TableSchema::parse(row.get::<_, &str>(2), &pk)
            .map_err(|e| err(format!("kb_snapshots[{name}].row_schema: {e}")))?;
        Ok(PostgresSnapshot {
            client: Mutex::new(client),
            name: name.to_string(),
            table_name,
            table,
            info,
        })
    }

    pub fn table(&self) -> &TableSchema {
        &self.table
    }

    /// Copies a file snapshot into PostgreSQL as snapshot `name` in table `table_name`.
    pub fn export(
        files: &SnapshotFiles,
        url: &str,
        name: &str,
        table_name: &str,
    ) -> Result<u64, SourceError> {
        crate::ports::check_table_name(table_name).map_err(err)?;
        let mut client = crate::pg_tls::connect(url).map_err(|e| err(e.message))?;
        let table = &files.table;
        let mut tx = client.transaction().map_err(err)?;
        tx.batch_execute(&format!(
            "{SNAPSHOTS}; DROP TABLE IF EXISTS \"{table_name}\"; CREATE TABLE \"{table_name}\" (_kb_key BYTEA PRIMARY KEY, _kb_vnode INT NOT NULL, _kb_row BYTEA NOT NULL); CREATE INDEX ON \"{table_name}\" (_kb_vnode, _kb_key);",
        ))
        .map_err(err)?;
        let insert = tx
            .prepare(&format!(
                "INSERT INTO \"{table_name}\" (_kb_key, _kb_vnode, _kb_row) VALUES ($1, $2, $3)"
            ))
            .map_err(err)?;
        let mut n = 0u64;
        for v in 0..files.info().vnode_count as Vnode {
            for row in files.scan(v, None)? {
                let row = row?;
                tx.execute(&insert, &[&row.key, &(v as i32), &row.value])
                    .map_err(err)?;
                n += 1;
            }
        }
        let info = serde_json::to_string(files.info()).expect("json");
        tx.execute(
            "INSERT INTO kb_snapshots VALUES ($1, $2, $3::text::jsonb, $4::text::jsonb, $5::text::jsonb) ON CONFLICT (name) DO UPDATE SET table_name = EXCLUDED.table_name, info = EXCLUDED.info, row_schema = EXCLUDED.row_schema, primary_key = EXCLUDED.primary_key",
            &[&name, &table_name, &info, &table.json.to_string(), &serde_json::to_string(&table.primary_key).expect("json")],
        )
        .map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(n)
    }
}

impl SnapshotSource for PostgresSnapshot {
    fn info(&self) -> &SnapshotInfo {
        &self.info
    }

    fn scan(&self, vnode: Vnode, after: Option<&[u8]>) -> Result<RowIter<'_>, SourceError> {
        let q = format!(
            "SELECT _kb_key, _kb_row FROM \"{}\" WHERE _kb_vnode = $1 AND _kb_key > $2 ORDER BY _kb_key",
            self.table_name
        );
        let after = after.unwrap_or(&[]).to_vec();
        let rows = self
            .client
            .lock()
            .unwrap()
            .query(&q, &[&(vnode as i32), &after])
            .map_err(|e| {
                err(format!(
                    "snapshot {} (table {}): {e}",
                    self.name, self.table_name
                ))
            })?;
        let (name, table_name) = (self.name.clone(), self.table_name.clone());
        let table = &self.table;
        Ok(Box::new(rows.into_iter().map(move |r| {
            let key: Vec<u8> = r.get(0);
            let value: Vec<u8> = r.get(1);
            table.check_row(&value).map_err(|e| {
                err(format!(
                    "snapshot {name} (table {table_name}) row with key {}: {e}",
                    crate::ports::key_hex(&key)
                ))
            })?;
            Ok(Row { key, value })
        })))
    }
}
