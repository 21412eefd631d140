//! MariaDB's snapshots of a running capture: the [`Exporter`] that the capture's shared
//! [`crate::capture::snapshots::OnDemand`] calls between source transactions. A snapshot is a
//! `START TRANSACTION WITH CONSISTENT SNAPSHOT` on a connection of its own; its point is the binlog
//! position the server reports for it (`binlog_snapshot_file` / `binlog_snapshot_position`): the
//! end of the last transaction it holds, so the transactions below it are in it and none at or
//! past it (the assembler places the snapshot's barrier before the first transaction whose commit
//! event starts there or later). The connection moves to the copy's thread; nothing stays open on
//! the capture's. Owns the copy of MariaDB tables into a later snapshot's folder; must not decide
//! where the barrier goes nor publish (the shared module does).

use std::path::Path;

use anyhow::{bail, Result};

use super::types::row_schema;
use super::{ColumnsMoved, MyTable, Opened};
use crate::capture::snapshots::{Copied, Exported, Exporter};
use crate::codec::TableSchema;
use crate::core::capture::Lsn;
use crate::core::vnode_of;
use crate::snapshot::files::{ManifestTable, SortedWriter};

/// The tables of a MariaDB capture, as it started, and where to read them.
pub struct MyExporter {
    pub url: String,
    /// In the log's order, with their columns when the capture started.
    pub tables: Vec<MyTable>,
    pub schemas: Vec<TableSchema>,
    pub vnode_count: u32,
    /// The binlog's base name (`mariadb-bin`), for positions in logs.
    pub base: String,
    /// The capture's snapshot folder, beside whose manifest the log's schema versions are: a copy
    /// writes each union as the newest version has it ([`super::types::MyColumn::null_last`]).
    pub dir: std::path::PathBuf,
}

impl Exporter for MyExporter {
    fn export(&mut self) -> Result<Exported> {
        let several = self.tables.len() > 1;
        let mut nulls_last = Vec::new();
        for (i, t) in self.tables.iter().enumerate() {
            let name = several.then_some(t.name.table.as_str());
            nulls_last.push(crate::capture::nulls_last_of(&self.dir, name, i == 0)?);
        }
        let opened = Opened::open(&self.url)?;
        let (tables, schemas, vnodes) =
            (self.tables.clone(), self.schemas.clone(), self.vnode_count);
        Ok(Exported {
            point: opened.lsn,
            side: None,
            copy: Box::new(move |folder: &Path| {
                copy(
                    opened,
                    &tables,
                    &schemas,
                    vnodes,
                    folder,
                    Columns::Appended(nulls_last),
                )
            }),
        })
    }

    fn show(&self, point: Lsn) -> String {
        super::format_lsn(&self.base, point)
    }
}

/// Which columns a copy takes.
#[derive(Clone, PartialEq, Eq)]
pub enum Columns {
    /// Exactly the captured ones (the first snapshot: a table changed since the catalog was read
    /// fails it with [`super::ColumnsMoved`], and the capture reads the catalog again).
    AsCaptured,
    /// Columns added at the end since the capture started too (a later snapshot: the log's version
    /// in force at its epoch must have them, checked at publication); any other change of a table
    /// fails the snapshot (the stream stops on it). Per table, the nullable columns the newest
    /// version writes `[T, "null"]`.
    Appended(Vec<Vec<String>>),
}

/// Copies every table in `opened` into sorted per-vnode files in `folder` (several tables: a
/// folder each), taking `columns`, and ends the snapshot's transaction.
pub fn copy(
    mut opened: Opened,
    tables: &[MyTable],
    schemas: &[TableSchema],
    vnodes: u32,
    folder: &Path,
    columns: Columns,
) -> Result<Copied> {
    let several = tables.len() > 1;
    let mut copied = Vec::new();
    let mut total = 0;
    for (i, (t, schema)) in tables.iter().zip(schemas).enumerate() {
        let mut at = opened.table(&t.database, &t.name)?;
        if let Columns::Appended(nulls_last) = &columns {
            super::types::order_nulls(&mut at.encoder.columns, &nulls_last[i]);
        }
        let n = t.encoder.columns.len();
        let now = &at.encoder.columns;
        // The columns the capture started with, whatever their union's order now.
        let started_with = |now: &[super::types::MyColumn]| {
            now.len() == n
                && now
                    .iter()
                    .zip(&t.encoder.columns)
                    .all(|(a, b)| (&a.name, &a.ty, a.nullable) == (&b.name, &b.ty, b.nullable))
        };
        let schema = if at.encoder == t.encoder {
            schema.clone()
        } else if columns == Columns::AsCaptured {
            return Err(ColumnsMoved { table: t.quoted() }.into());
        } else if now.len() >= n && started_with(&now[..n]) && at.encoder.key == t.encoder.key {
            let json = row_schema(&t.name.to_string(), now);
            TableSchema::parse(&json.to_string(), &t.primary_key)?
        } else {
            bail!(
                "the columns of {} changed since the capture started other than by columns added at the end; start it again",
                t.quoted()
            );
        };
        let dir = if several {
            folder.join(&t.name.table)
        } else {
            folder.to_path_buf()
        };
        let mut writer = SortedWriter::new(&dir, &schema, vnodes)?;
        total += opened.read(&at, |datum, key| {
            writer.add(vnode_of(key, vnodes), key, datum)?;
            Ok(())
        })?;
        let mut files = writer.finish()?;
        if several {
            for f in &mut files {
                f.path = format!("{}/{}", t.name.table, f.path);
            }
        }
        copied.push(ManifestTable {
            name: t.name.table.clone(),
            row_schema: schema.json.clone(),
            primary_key: schema.primary_key.clone(),
            files,
        });
    }
    let import_ms = opened.now_ms;
    opened.close()?;
    Ok(Copied {
        tables: copied,
        rows: total,
        import_ms,
    })
}
