//! Every SQL statement of the two SQL state stores, one `.sql` file per statement and dialect
//! (`sqlite/*.sql`, `postgres/*.sql` beside this file), included at build time: a statement is read
//! and changed in one place, and the two dialects of one statement share its file name.
//!
//! A statement on a materialised table (whose name and columns are the job's) is a template:
//! `{table}`, `{columns}` and the like are filled by [`render`], quoting left to the template. Owns
//! SQL text only: which statement runs when, and what its parameters mean, is the backend's.

/// Declares one constant per statement file of a dialect folder (`NAME` ← `name.sql`) and
/// `FILES`, the list the test below holds against the folder.
macro_rules! statements {
    ($dialect:literal: $($name:ident = $file:literal),* $(,)?) => {
        $(
            #[doc = concat!("`src/store/sql/", $dialect, "/", $file, ".sql`")]
            pub const $name: &str = include_str!(concat!($dialect, "/", $file, ".sql"));
        )*
        /// Every statement file of this dialect, by name.
        #[cfg(test)]
        pub const FILES: &[&str] = &[$($file),*];
    };
}

/// The statements both dialects have, each dialect's own after them: one list, so a statement
/// added to one dialect and not the other fails to build.
macro_rules! dialects {
    (
        both: [$($name:ident = $file:literal),* $(,)?],
        sqlite: [$($s_name:ident = $s_file:literal),* $(,)?],
        postgres: [$($p_name:ident = $p_file:literal),* $(,)?] $(,)?
    ) => {
        /// SQLite's statements (`?N` parameters, `INSERT OR REPLACE`, `WITHOUT ROWID`).
        pub mod sqlite {
            statements!("sqlite": $($name = $file,)* $($s_name = $s_file,)*);
        }
        /// PostgreSQL's statements (`$N` parameters, `ON CONFLICT`, arrays through `UNNEST`).
        pub mod postgres {
            statements!("postgres": $($name = $file,)* $($p_name = $p_file,)*);
        }
    };
}

dialects! {
    both: [
        COLUMN_ADD = "column_add",
        COLUMN_DROP = "column_drop",
        DEAD_LETTER_COUNT = "dead_letter_count",
        DEAD_LETTER_INSERT = "dead_letter_insert",
        DEAD_LETTERS_READ = "dead_letters_read",
        JOB_INSERT = "job_insert",
        JOB_RECREATE = "job_recreate",
        JOB_ROW = "job_row",
        JOB_SNAPSHOT_MOVE = "job_snapshot_move",
        JOB_TABLE_INSERT = "job_table_insert",
        JOB_TABLE_NAME = "job_table_name",
        JOB_TABLES = "job_tables",
        LEASE_WRITE = "lease_write",
        LEASES_DELETE_JOB = "leases_delete_job",
        NEXT_LEASE = "next_lease",
        OWNERS = "owners",
        PARTITION_PROGRESS_ALL = "partition_progress_all",
        PARTITION_PROGRESS_DELETE_JOB = "partition_progress_delete_job",
        PARTITION_PROGRESS_READ = "partition_progress_read",
        PARTITION_PROGRESS_WRITE = "partition_progress_write",
        PAUSED_READ = "paused_read",
        PAUSED_WRITE = "paused_write",
        PENDING_ROWS = "pending_rows",
        PENDING_ROWS_DELETE_JOB = "pending_rows_delete_job",
        PENDING_ROWS_DELETE_UNIT = "pending_rows_delete_unit",
        PENDING_ROWS_INSERT = "pending_rows_insert",
        PENDING_UNIT_COUNT = "pending_unit_count",
        PENDING_UNIT_DELETE = "pending_unit_delete",
        PENDING_UNIT_INSERT = "pending_unit_insert",
        PENDING_UNITS = "pending_units",
        PENDING_UNITS_DELETE_JOB = "pending_units_delete_job",
        PUBLICATION_DELETE = "publication_delete",
        PUBLICATION_READ = "publication_read",
        PUBLICATION_WRITE = "publication_write",
        RATE_LIMITS_READ = "rate_limits_read",
        RATE_LIMITS_WRITE = "rate_limits_write",
        ROW_VERSION_UPDATE = "row_version_update",
        ROWS_TRUNCATE = "rows_truncate",
        SCHEMA = "schema",
        SCHEMA_VERSION_INSERT = "schema_version_insert",
        SCHEMA_VERSION_LATEST = "schema_version_latest",
        SCHEMA_VERSION_ROW_SCHEMA = "schema_version_row_schema",
        TABLE_CLEAR = "table_clear",
        TABLE_CREATE = "table_create",
        TABLE_EXISTS = "table_exists",
        TABLE_OWNERS = "table_owners",
        TABLE_ROWS = "table_rows",
        TABLE_SWAP = "table_swap",
        VNODE_PROGRESS_DELETE_JOB = "vnode_progress_delete_job",
        VNODE_PROGRESS_READ = "vnode_progress_read",
        VNODE_PROGRESS_WRITE = "vnode_progress_write",
    ],
    sqlite: [
        LEASE_READ = "lease_read",
        ROW_DELETE = "row_delete",
        ROW_UPSERT = "row_upsert",
        ROWS_PAGE = "rows_page",
        TABLE_COLUMNS = "table_columns",
        TABLE_DROP = "table_drop",
        TABLE_HAS_COLUMNS = "table_has_columns",
        VNODE_COUNT = "vnode_count",
    ],
    postgres: [
        JOB_LOCK = "job_lock",
        TABLE_COLUMN_NAMES = "table_column_names",
        JOB_ROW_LOCKED = "job_row_locked",
        JOBS_LOCK = "jobs_lock",
        LEASES_READ = "leases_read",
        PUBLICATION_ENSURE = "publication_ensure",
        PUBLICATION_LOCK = "publication_lock",
        REPEATABLE_READ = "repeatable_read",
        ROWS_ALL = "rows_all",
        ROWS_DELETE = "rows_delete",
        ROWS_DELETE_BY_KEY = "rows_delete_by_key",
        ROWS_UPSERT = "rows_upsert",
        STAGE_COPY = "stage_copy",
        STAGE_CREATE = "stage_create",
        STAGE_MERGE = "stage_merge",
        STAGE_TRUNCATE = "stage_truncate",
        TABLE_COPY = "table_copy",
        TABLE_KEY_COLUMNS = "table_key_columns",
        TABLE_NEXT_CREATE = "table_next_create",
        TABLE_NEXT_CREATE_FRESH = "table_next_create_fresh",
        VNODE_PROGRESS_ALL = "vnode_progress_all",
    ],
}

/// A template with each `{name}` replaced by its value. Every placeholder must be given: one left
/// over is a bug of the caller (checked in debug builds and by the stores' tests).
pub fn render(template: &str, values: &[(&str, &str)]) -> String {
    let mut out = template.trim_end().to_string();
    for (name, value) in values {
        out = out.replace(&format!("{{{name}}}"), value);
    }
    debug_assert!(
        unfilled(&out).is_none(),
        "{:?} left unfilled in {out}",
        unfilled(&out)
    );
    out
}

/// The first `{name}` placeholder left in `sql`, if any.
fn unfilled(sql: &str) -> Option<&str> {
    let start = sql.find('{')?;
    let len = sql[start + 1..].find('}')?;
    let name = &sql[start + 1..start + 1 + len];
    (!name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        .then_some(&sql[start..start + len + 2])
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// Each dialect folder holds exactly the statements its module declares (no file left unused).
    #[test]
    fn every_statement_file_is_declared_and_every_declaration_has_a_file() {
        for (dialect, declared) in [
            ("sqlite", super::sqlite::FILES),
            ("postgres", super::postgres::FILES),
        ] {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("src/store/sql")
                .join(dialect);
            let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter_map(|n| n.strip_suffix(".sql").map(str::to_string))
                .collect();
            let declared: BTreeSet<String> = declared.iter().map(|s| s.to_string()).collect();
            assert_eq!(on_disk, declared, "{}", dir.display());
        }
    }

    #[test]
    fn render_fills_every_placeholder() {
        assert_eq!(
            super::render(
                "DELETE FROM \"{table}\" WHERE x = {x}\n",
                &[("table", "t"), ("x", "1")]
            ),
            "DELETE FROM \"t\" WHERE x = 1"
        );
    }
}
