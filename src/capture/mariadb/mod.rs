//! The MariaDB (and MySQL-protocol) source of `kafka-backfill capture`: the same capture loop
//! ([`crate::capture::run_session`]) and Kafka log as PostgreSQL's, fed by a binlog.
//!
//! This module owns what is MariaDB's: the preconditions (each a named error saying how to fix it),
//! a table's columns and key from `information_schema`, the snapshot in one consistent snapshot
//! with its binlog position (`START TRANSACTION WITH CONSISTENT SNAPSHOT`, then
//! `binlog_snapshot_file` / `binlog_snapshot_position`), and a binlog position as the core's
//! [`Lsn`]. `types.rs` is the one MariaDB → Avro mapping, `binlog.rs` the replication port,
//! `job.rs` the session. It must not decide what the core decides (barriers, checkpoints,
//! resume rules) and must not import the service.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use mysql::prelude::Queryable;
use mysql::Value;

use crate::config::TableName;
use crate::core::capture::Lsn;

pub mod binlog;
pub mod job;
pub mod snapshots;
pub mod types;

use types::{MyColumn, MyEncoder, MyType};

pub use crate::config::{is_mariadb_url, mariadb_opts as opts};

/// Connects, with the session in UTC (a `timestamp` reads as UTC) and text in each column's own
/// character set.
pub fn connect(url: &str) -> Result<mysql::Conn> {
    let opts = opts(url).map_err(|m| anyhow::anyhow!(m))?;
    let where_ = format!("{}:{}", opts.get_ip_or_hostname(), opts.get_tcp_port());
    // A connection the server drops in its handshake (seen right after a capture holding a
    // binlog dump was killed) is tried again, up to 8 times a quarter second apart.
    let mut attempt = 0;
    let mut conn = loop {
        match mysql::Conn::new(opts.clone()) {
            Ok(c) => break c,
            Err(mysql::Error::IoError(_)) if attempt < 8 => {
                attempt += 1;
                std::thread::sleep(std::time::Duration::from_millis(250));
            }
            Err(e) => {
                return Err(
                    anyhow::Error::new(e).context(format!("connecting to MariaDB at {where_}"))
                )
            }
        }
    };
    // Results in each column's own character set (no conversion): the binlog carries a value
    // in it, so the snapshot and the stream decode the same bytes.
    conn.query_drop("SET time_zone = '+00:00', NAMES utf8mb4, character_set_results = NULL")
        .context("setting the session's time zone and character set")?;
    Ok(conn)
}

/// The database of `table`: its schema, or the URL's database when it has none (`public`).
pub fn database_of(table: &TableName, url: &str) -> String {
    if table.schema == "public" {
        opts(url)
            .ok()
            .and_then(|o| o.get_db_name().map(str::to_string))
            .unwrap_or_else(|| table.schema.clone())
    } else {
        table.schema.clone()
    }
}

/// A captured table as the capture reads it.
#[derive(Clone, Debug)]
pub struct MyTable {
    pub database: String,
    pub name: TableName,
    pub encoder: MyEncoder,
    pub primary_key: Vec<String>,
}

impl MyTable {
    /// `database`.`table`, quoted.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote(&self.database), quote(&self.name.table))
    }

    /// The snapshot's `SELECT` of every column, in column order.
    fn select(&self) -> String {
        let cols: Vec<String> = self
            .encoder
            .columns
            .iter()
            .map(|c| c.ty.select(&quote(&c.name)))
            .collect();
        format!("SELECT {} FROM {}", cols.join(", "), self.quoted())
    }
}

fn quote(s: &str) -> String {
    format!("`{}`", s.replace('`', "``"))
}

/// Checks the server's binary log settings, each failure naming its fix.
pub fn check_server(conn: &mut mysql::Conn, client_server_id: u32) -> Result<()> {
    type Settings = (Option<String>, Option<String>, Option<String>, Option<u32>);
    let row: Option<Settings> =
        conn.query_first("SELECT @@log_bin, @@binlog_format, @@binlog_row_image, @@server_id")?;
    let (log_bin, format, image, server_id) = row.context("the server answered no settings")?;
    if log_bin.as_deref() != Some("1") && log_bin.as_deref() != Some("ON") {
        bail!("the server's binary log is off (log_bin): capture reads the binlog; start MariaDB with --log-bin");
    }
    if format.as_deref() != Some("ROW") {
        bail!("the server's binlog_format is {}: capture needs ROW (SET GLOBAL binlog_format = 'ROW', and in the server's configuration)", format.unwrap_or_default());
    }
    if image.as_deref() != Some("FULL") {
        bail!("the server's binlog_row_image is {}: capture needs FULL (SET GLOBAL binlog_row_image = 'FULL', and in the server's configuration)", image.unwrap_or_default());
    }
    if server_id == Some(client_server_id) {
        bail!("capture.server_id {client_server_id} is the server's own server_id: a binlog client needs a server_id no server of the replication topology has");
    }
    let grants: Vec<String> = conn
        .query("SHOW GRANTS")
        .context("reading the capture user's privileges (SHOW GRANTS)")?;
    let missing = missing_privileges(&grants);
    if !missing.is_empty() {
        let user: Option<String> = conn.query_first("SELECT CURRENT_USER()")?;
        let user = user.unwrap_or_default();
        let (name, host) = user.rsplit_once('@').unwrap_or((&user, "%"));
        bail!(
            "the capture's user {user} lacks {}: a binlog client needs them (GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO '{name}'@'{host}'; BINLOG MONITOR is REPLICATION CLIENT before MariaDB 10.5)",
            missing.join(" and ")
        );
    }
    // The replicas registered with the server. Two binlog clients of one server_id cut each other
    // off (the server ends the older stream when the newer one asks), so a replica's server_id is
    // refused: one that reports its port (a server's `report_port`). A capture registers with
    // port 0 (the `mysql` crate's registration; the server shows the connection's host): such an
    // entry of our server_id may be this capture's own earlier stream (after a kill -9 the server
    // ends it when the new one asks), so it is never refused. Listing them needs REPLICATION MASTER
    // ADMIN (MariaDB 10.5 on), which a binlog client does not: without it the check is skipped,
    // saying so.
    const ACCESS_DENIED: u16 = 1227;
    match conn.query::<mysql::Row, _>("SHOW SLAVE HOSTS") {
        Ok(hosts) => {
            for row in hosts {
                let id: Option<u32> = row.get("Server_id");
                let host: Option<String> = row.get("Host");
                let port: Option<u32> = row.get("Port");
                if let Some(taken) = replica_taking(client_server_id, id, host.as_deref(), port) {
                    bail!("capture.server_id {client_server_id} is the server_id of the replica {taken} (SHOW SLAVE HOSTS): two binlog clients of one server_id cut each other off; set [jobs.capture] server_id to one no server of the replication topology has");
                }
            }
        }
        Err(mysql::Error::MySqlError(e)) if e.code == ACCESS_DENIED => {
            tracing::warn!(server_id = client_server_id, error = %e.message, "the capture's server_id is not checked against the server's replicas: its user may not list them (SHOW SLAVE HOSTS needs REPLICATION MASTER ADMIN); a replica of the same server_id would cut the capture's stream off");
        }
        Err(e) => return Err(e).context("listing the server's replicas (SHOW SLAVE HOSTS)"),
    }
    Ok(())
}

/// A registered replica (a row of `SHOW SLAVE HOSTS`: `id`, `host`, `port`) that holds the
/// capture's `server_id`: its `host:port` — `None` when it holds another one, or reports no port
/// (port 0: a capture's own registration, whose host the server fills in).
fn replica_taking(
    server_id: u32,
    id: Option<u32>,
    host: Option<&str>,
    port: Option<u32>,
) -> Option<String> {
    let host = host.unwrap_or_default();
    let port = port.unwrap_or_default();
    (id == Some(server_id) && port != 0).then(|| {
        if host.is_empty() {
            format!("registered with no host, port {port}")
        } else {
            format!("at {host}:{port}")
        }
    })
}

/// The global privileges a binlog client needs that `grants` (the lines of `SHOW GRANTS`, which
/// include the active role's) do not give: REPLICATION SLAVE for the binlog dump, BINLOG MONITOR
/// (REPLICATION CLIENT before 10.5, or SUPER) for `SHOW BINARY LOGS`.
fn missing_privileges(grants: &[String]) -> Vec<&'static str> {
    let global: Vec<String> = grants
        .iter()
        .map(|g| g.to_ascii_uppercase())
        .filter(|g| g.contains(" ON *.* "))
        .collect();
    let has = |any: &[&str]| {
        global
            .iter()
            .any(|g| g.contains("ALL PRIVILEGES") || any.iter().any(|p| g.contains(p)))
    };
    let mut missing = Vec::new();
    if !has(&["REPLICATION SLAVE", "REPLICATION REPLICA"]) {
        missing.push("REPLICATION SLAVE");
    }
    if !has(&["BINLOG MONITOR", "REPLICATION CLIENT", "SUPER"]) {
        missing.push("BINLOG MONITOR");
    }
    missing
}

/// Reads `table`'s columns and primary key (inside the snapshot's transaction for the copy, so
/// they are the snapshot's).
pub fn table_info(conn: &mut mysql::Conn, database: &str, table: &TableName) -> Result<MyTable> {
    #[allow(clippy::type_complexity)]
    let cols: Vec<(String, String, String, String, Option<u64>, Option<u64>, Option<String>)> = conn.exec(
        "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, NUMERIC_PRECISION, NUMERIC_SCALE, CHARACTER_SET_NAME \
         FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
        (database, &table.table),
    )?;
    if cols.is_empty() {
        bail!(
            "table {database}.{} does not exist (or the capture's user cannot see it)",
            table.table
        );
    }
    let mut columns = Vec::new();
    for (name, data_type, column_type, nullable, p, s, charset) in cols {
        let ty = MyType::from_catalog(
            &data_type.to_lowercase(),
            &column_type.to_lowercase(),
            p,
            s,
            charset.as_deref(),
        )
        .map_err(|m| anyhow::anyhow!("table {database}.{}, column {name}: {m}", table.table))?;
        columns.push(MyColumn {
            name,
            ty,
            nullable: nullable == "YES",
            null_last: false,
        });
    }
    let key_names: Vec<String> = conn.exec(
        "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE \
         WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND CONSTRAINT_NAME = 'PRIMARY' ORDER BY ORDINAL_POSITION",
        (database, &table.table),
    )?;
    if key_names.is_empty() {
        bail!("table {database}.{} has no primary key: capture keys every row by it (ALTER TABLE … ADD PRIMARY KEY)", table.table);
    }
    let key = key_names
        .iter()
        .map(|k| {
            columns
                .iter()
                .position(|c| &c.name == k)
                .context("a key column that is no column")
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(MyTable {
        database: database.to_string(),
        name: table.clone(),
        encoder: MyEncoder { columns, key },
        primary_key: key_names,
    })
}

/// A binlog file's sequence number: `mariadb-bin.000042` → 42.
pub fn file_seq(file: &str) -> Result<u32> {
    file.rsplit_once('.')
        .and_then(|(_, n)| n.parse().ok())
        .with_context(|| format!("binlog file name {file:?} does not end in .<number>"))
}

/// The position as the core's [`Lsn`]: the file's sequence number above the byte position.
pub fn lsn(seq: u32, pos: u64) -> Lsn {
    ((seq as u64) << 32) | (pos & 0xffff_ffff)
}

/// `base.NNNNNN` and the byte position of `lsn`.
pub fn position(base: &str, lsn: Lsn) -> (String, u64) {
    (format!("{base}.{:06}", lsn >> 32), lsn & 0xffff_ffff)
}

/// `lsn` as `file:position`, for logs and errors.
pub fn format_lsn(base: &str, lsn: Lsn) -> String {
    let (f, p) = position(base, lsn);
    format!("{f}:{p}")
}

/// The base name of the server's binlog files, and the files it still has.
pub fn binlogs(conn: &mut mysql::Conn) -> Result<(String, Vec<String>)> {
    let rows: Vec<mysql::Row> = conn.query("SHOW BINARY LOGS").context("SHOW BINARY LOGS")?;
    let files: Vec<String> = rows
        .into_iter()
        .filter_map(|r| r.get::<String, _>(0))
        .collect();
    let base = files
        .last()
        .and_then(|f| f.rsplit_once('.').map(|(b, _)| b.to_string()))
        .context("the server lists no binary log")?;
    Ok((base, files))
}

/// A table's columns changed between the capture's catalog read and its snapshot: the caller
/// reads the catalog again and takes the snapshot again (nothing was committed from it).
#[derive(Debug, thiserror::Error)]
#[error("the columns of {table} changed between the catalog read and the snapshot")]
pub struct ColumnsMoved {
    pub table: String,
}

/// A consistent snapshot opened on a connection of its own (`START TRANSACTION WITH CONSISTENT
/// SNAPSHOT`): the binlog position it is at and the server's clock then (the stream continues
/// there after the first snapshot). Its tables are read with
/// [`Opened::read`], each after [`Opened::table`] (MariaDB's catalog is not versioned: a table
/// is described inside the snapshot's transaction, right before its rows are read).
pub struct Opened {
    conn: mysql::Conn,
    pub lsn: Lsn,
    /// The same position as `file:offset`, for the log.
    pub position: String,
    pub now_ms: u64,
}

impl Opened {
    /// Opens a consistent snapshot of the server of `url`.
    pub fn open(url: &str) -> Result<Opened> {
        let mut conn = connect(url)?;
        conn.query_drop("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")?;
        conn.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            .context("starting the consistent snapshot")?;
        let status: Vec<(String, String)> = conn
            .query("SHOW STATUS LIKE 'binlog_snapshot_%'")
            .context("reading the snapshot's binlog position")?;
        let get = |name: &str| {
            status
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
                .with_context(|| format!("the server reports no {name} (MariaDB has it; MySQL needs a global read lock, not supported)"))
        };
        let file = get("Binlog_snapshot_file")?;
        let pos: u64 = get("Binlog_snapshot_position")?.parse()?;
        let now_ms: u64 = conn
            .query_first::<u64, _>("SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS UNSIGNED)")?
            .context("the server's clock")?;
        Ok(Opened {
            conn,
            lsn: lsn(file_seq(&file)?, pos),
            position: format!("{file}:{pos}"),
            now_ms,
        })
    }

    /// Table `name` of `database` as the catalog has it now.
    pub fn table(&mut self, database: &str, name: &TableName) -> Result<MyTable> {
        table_info(&mut self.conn, database, name)
    }

    /// Reads every row of `t` in the snapshot, calling `row(datum, key)` per row; returns how
    /// many.
    pub fn read(
        &mut self,
        t: &MyTable,
        mut row: impl FnMut(&[u8], &[u8]) -> Result<()>,
    ) -> Result<u64> {
        let mut rows = 0;
        let mut result = self
            .conn
            .exec_iter(t.select(), ())
            .with_context(|| format!("reading {}", t.quoted()))?;
        for r in result.by_ref() {
            let values: Vec<Value> = r?.unwrap();
            let (datum, key) = t
                .encoder
                .encode(&values)
                .with_context(|| format!("a row of {}", t.quoted()))?;
            row(&datum, &key)?;
            rows += 1;
        }
        Ok(rows)
    }

    /// Ends the snapshot's transaction.
    pub fn close(mut self) -> Result<()> {
        self.conn.query_drop("COMMIT")?;
        Ok(())
    }
}

/// The table as it is now, encoded by the capture's mapping: key bytes → row datum (for `verify`).
pub fn read_table(
    url: &str,
    table: &TableName,
    nulls_last: &[String],
) -> Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    let mut opened = Opened::open(url)?;
    let mut t = opened.table(&database_of(table, url), table)?;
    types::order_nulls(&mut t.encoder.columns, nulls_last);
    let mut rows = BTreeMap::new();
    opened.read(&t, |datum, key| {
        rows.insert(key.to_vec(), datum.to_vec());
        Ok(())
    })?;
    opened.close()?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_holding_the_server_id_is_named_and_a_capture_of_it_is_not() {
        assert_eq!(
            replica_taking(42, Some(42), Some("replica-1"), Some(3306)).as_deref(),
            Some("at replica-1:3306")
        );
        assert_eq!(
            replica_taking(42, Some(42), Some(""), Some(3306)).as_deref(),
            Some("registered with no host, port 3306")
        );
        assert_eq!(
            replica_taking(42, Some(7), Some("replica-1"), Some(3306)),
            None
        );
        // A capture registers with port 0 (the server shows the connection's host): maybe its
        // own stream of before a restart.
        assert_eq!(
            replica_taking(42, Some(42), Some("localhost"), Some(0)),
            None
        );
        assert_eq!(replica_taking(42, Some(42), Some(""), Some(0)), None);
        assert_eq!(replica_taking(42, Some(42), None, None), None);
    }

    #[test]
    fn the_privileges_a_binlog_client_lacks_are_named() {
        let g = |lines: &[&str]| lines.iter().map(|l| l.to_string()).collect::<Vec<_>>();
        assert!(missing_privileges(&g(&[
            "GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` WITH GRANT OPTION"
        ]))
        .is_empty());
        assert!(missing_privileges(&g(&[
            "GRANT USAGE ON *.* TO `kb`@`%`",
            "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `kb`@`%`",
            "GRANT SELECT ON `shop`.* TO `kb`@`%`",
        ]))
        .is_empty());
        assert_eq!(
            missing_privileges(&g(&[
                "GRANT RELOAD, REPLICATION CLIENT ON *.* TO `kb`@`%`",
                // A database's ALL is not a global privilege.
                "GRANT ALL PRIVILEGES ON `shop`.* TO `kb`@`%`",
            ])),
            vec!["REPLICATION SLAVE"]
        );
        assert_eq!(
            missing_privileges(&g(&["GRANT SELECT ON *.* TO `kb`@`%`"])),
            vec!["REPLICATION SLAVE", "BINLOG MONITOR"]
        );
    }
}
