//! A prepared SQLite statement that binds blob and text parameters **without a copy**
//! (`SQLITE_STATIC`), for the one statement that runs once per upserted row: the checkpoint's
//! upsert into the job's table (`SqliteStore::write_rows`).
//!
//! rusqlite binds every blob and text `SQLITE_TRANSIENT`, so SQLite copies each key, datum and text
//! column into memory of its own before the step and frees it after; in a `perf record` of the
//! replay those copies were ≈ 4 % of the process's samples (docs/BENCHMARKS.md, "SQLite binds
//! without a copy"). rusqlite 0.37 has no way to bind a static pointer, so this module owns a raw
//! `sqlite3_stmt` on the connection's handle.
//!
//! Why it is sound: [`StaticStatement::execute`] binds every parameter, steps the statement to its
//! end, resets it and clears its bindings before it returns, so SQLite never holds a pointer past
//! the call that lent it. The statement borrows its connection, so it is finalized before the
//! connection can close. Owns nothing else: SQL text and the meaning of the parameters are the
//! caller's.

use std::ffi::{c_char, c_int, CStr};
use std::ptr::{self, NonNull};

use rusqlite::{ffi, Connection};

/// One parameter, borrowed for the length of one [`StaticStatement::execute`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Param<'a> {
    Null,
    Integer(i64),
    Real(f64),
    /// UTF-8 text (the caller's `&str` bytes).
    Text(&'a str),
    Blob(&'a [u8]),
}

/// A statement prepared on `conn`, finalized when dropped.
pub(crate) struct StaticStatement<'c> {
    conn: &'c Connection,
    stmt: NonNull<ffi::sqlite3_stmt>,
}

impl<'c> StaticStatement<'c> {
    /// Prepares `sql` (one statement) on `conn`.
    pub(crate) fn prepare(conn: &'c Connection, sql: &str) -> rusqlite::Result<Self> {
        let len = c_int::try_from(sql.len()).map_err(|_| too_big("the statement"))?;
        let mut stmt = ptr::null_mut();
        // SAFETY: the handle is the open connection `conn` borrows for 'c; the SQL pointer and
        // length describe `sql`, which SQLite reads during the call only.
        let rc = unsafe {
            ffi::sqlite3_prepare_v2(
                conn.handle(),
                sql.as_ptr().cast::<c_char>(),
                len,
                &mut stmt,
                ptr::null_mut(),
            )
        };
        if rc != ffi::SQLITE_OK {
            return Err(error(conn, rc));
        }
        let stmt = NonNull::new(stmt).ok_or_else(|| {
            rusqlite::Error::SqliteFailure(
                ffi::Error::new(ffi::SQLITE_MISUSE),
                Some(format!("no statement in {sql:?}")),
            )
        })?;
        Ok(StaticStatement { conn, stmt })
    }

    /// Binds `params` to ?1, ?2, … in order, runs the statement to its end and resets it. Every
    /// parameter of the statement must be given (one left unbound would read as NULL).
    pub(crate) fn execute<'p>(
        &mut self,
        params: impl IntoIterator<Item = Param<'p>>,
    ) -> rusqlite::Result<()> {
        let s = self.stmt.as_ptr();
        let mut result = Ok(());
        for (i, p) in params.into_iter().enumerate() {
            if let Err(e) = self.bind(i as c_int + 1, p) {
                result = Err(e);
                break;
            }
        }
        if result.is_ok() {
            // SAFETY: `s` is this statement, prepared on the open connection.
            let rc = unsafe { ffi::sqlite3_step(s) };
            if rc != ffi::SQLITE_DONE && rc != ffi::SQLITE_ROW {
                result = Err(error(self.conn, rc));
            }
        }
        // SAFETY: as above. Reset ends the step (a failed step's code is already read); clearing
        // the bindings drops every borrowed pointer before `params`' borrows end.
        unsafe {
            ffi::sqlite3_reset(s);
            ffi::sqlite3_clear_bindings(s);
        }
        result
    }

    fn bind(&mut self, i: c_int, p: Param<'_>) -> rusqlite::Result<()> {
        let s = self.stmt.as_ptr();
        // SAFETY: `s` is this statement; a text or blob pointer stays valid until `execute`
        // clears the bindings, before its caller's borrow ends (SQLITE_STATIC: not copied, not
        // freed). An empty slice binds a static empty value (never a dangling pointer).
        let rc = unsafe {
            match p {
                Param::Null => ffi::sqlite3_bind_null(s, i),
                Param::Integer(v) => ffi::sqlite3_bind_int64(s, i, v),
                Param::Real(v) => ffi::sqlite3_bind_double(s, i, v),
                Param::Text(t) => {
                    let len = c_int::try_from(t.len()).map_err(|_| too_big("a text value"))?;
                    let ptr = if t.is_empty() {
                        c"".as_ptr()
                    } else {
                        t.as_ptr().cast()
                    };
                    ffi::sqlite3_bind_text(s, i, ptr, len, ffi::SQLITE_STATIC())
                }
                Param::Blob(b) => {
                    let len = c_int::try_from(b.len()).map_err(|_| too_big("a blob"))?;
                    if b.is_empty() {
                        ffi::sqlite3_bind_zeroblob(s, i, 0)
                    } else {
                        ffi::sqlite3_bind_blob(s, i, b.as_ptr().cast(), len, ffi::SQLITE_STATIC())
                    }
                }
            }
        };
        if rc == ffi::SQLITE_OK {
            Ok(())
        } else {
            Err(error(self.conn, rc))
        }
    }
}

impl Drop for StaticStatement<'_> {
    fn drop(&mut self) {
        // SAFETY: prepared by `prepare`, finalized once, here; the connection outlives it ('c).
        unsafe {
            ffi::sqlite3_finalize(self.stmt.as_ptr());
        }
    }
}

/// The connection's error for result code `rc`, as rusqlite reports one (so the store classifies
/// it as it does every other: `sqlite::classify`).
fn error(conn: &Connection, rc: c_int) -> rusqlite::Error {
    // SAFETY: the handle is open; SQLite's message is copied before any other call on it.
    let msg = unsafe {
        let m = ffi::sqlite3_errmsg(conn.handle());
        (!m.is_null()).then(|| CStr::from_ptr(m).to_string_lossy().into_owned())
    };
    rusqlite::Error::SqliteFailure(ffi::Error::new(rc), msg)
}

fn too_big(what: &str) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        ffi::Error::new(ffi::SQLITE_TOOBIG),
        Some(format!("{what} is longer than SQLite binds (2 GiB)")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(
            "CREATE TABLE t (k BLOB PRIMARY KEY, s TEXT, i INTEGER, r REAL, n) WITHOUT ROWID",
        )
        .unwrap();
        c
    }

    /// A row of `t` as read back.
    type Read = (Vec<u8>, String, i64, f64, Option<Vec<u8>>);

    #[test]
    fn values_bound_without_a_copy_read_back_as_bound() {
        let c = conn();
        {
            let mut st = StaticStatement::prepare(
                &c,
                "INSERT OR REPLACE INTO t VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .unwrap();
            for i in 0..100i64 {
                // Fresh buffers each row, dropped right after the call: a pointer SQLite kept
                // would read freed memory (and the next row's bytes).
                let key = format!("key-{i}").into_bytes();
                let text = "é".repeat(i as usize % 7);
                st.execute([
                    Param::Blob(&key),
                    Param::Text(&text),
                    Param::Integer(i * 1_000_000_007),
                    Param::Real(i as f64 / 3.0),
                    if i % 2 == 0 {
                        Param::Null
                    } else {
                        Param::Blob(&[])
                    },
                ])
                .unwrap();
            }
        }
        let mut q = c.prepare("SELECT k, s, i, r, n FROM t ORDER BY i").unwrap();
        let rows: Vec<Read> = q
            .query_map([], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(rows.len(), 100);
        for (i, (k, s, n, r, z)) in rows.into_iter().enumerate() {
            let i = i as i64;
            assert_eq!(k, format!("key-{i}").into_bytes());
            assert_eq!(s, "é".repeat(i as usize % 7));
            assert_eq!(n, i * 1_000_000_007);
            assert_eq!(r, i as f64 / 3.0);
            assert_eq!(
                z,
                (i % 2 == 1).then(Vec::new),
                "row {i}: NULL or an empty blob"
            );
        }
    }

    #[test]
    fn a_failed_step_is_rusqlites_error_and_the_statement_runs_again() {
        let c = conn();
        c.execute_batch("CREATE TABLE u (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
            .unwrap();
        let mut st = StaticStatement::prepare(&c, "INSERT INTO u VALUES (?1, ?2)").unwrap();
        st.execute([Param::Integer(1), Param::Text("a")]).unwrap();
        let e = st
            .execute([Param::Integer(1), Param::Text("b")])
            .unwrap_err();
        match &e {
            rusqlite::Error::SqliteFailure(f, Some(m)) => {
                assert_eq!(f.code, rusqlite::ErrorCode::ConstraintViolation, "{e}");
                assert!(m.contains("UNIQUE"), "{m}");
            }
            other => panic!("not a SQLite failure: {other}"),
        }
        // NOT NULL: the bindings were cleared after the failure, a missing one is NULL.
        let e = st.execute([Param::Integer(2)]).unwrap_err();
        assert!(e.to_string().contains("NOT NULL"), "{e}");
        st.execute([Param::Integer(2), Param::Text("c")]).unwrap();
        drop(st);
        let n: i64 = c
            .query_row("SELECT COUNT(*) FROM u", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2);
    }

    #[test]
    fn a_statement_that_does_not_prepare_names_the_cause() {
        let c = conn();
        let e = StaticStatement::prepare(&c, "INSERT INTO missing VALUES (?1)")
            .err()
            .expect("no such table");
        assert!(e.to_string().contains("no such table: missing"), "{e}");
    }
}
