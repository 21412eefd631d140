//! Order that cannot drift (docs/DESIGN.md §7, "Key order"): every comparison of keys — the
//! snapshot's per-vnode sort, the snapshot phase's cursor against the log's changes, the store's
//! upserts and its primary key, a resync — is of the encoded primary-key bytes, never of a database
//! collation. Against the real PostgreSQL (source and store) and broker: tables whose keys the
//! source orders otherwise than their bytes — text under an ICU collation ('a' < 'A' < 'b'), uuid,
//! a composite key of an integer and collated text, byte strings that differ only in trailing
//! bytes — captured while a load changes, inserts, deletes and moves keys on both sides of every
//! snapshot cursor; the replica equals the source, and once damaged by hand and resynced, equals
//! it again.

use crate::capture_e2e::{
    database, psql, resync_command, spawn_capture, stop_capture, tables_config,
    verify_against_source, verify_job_eventually, wait_child, MIN,
};
use crate::support::*;

use std::process::{Child, Command};

/// The four tables and their first rows: about 12,000 rows in all.
const TABLES: &str = r#"
CREATE TABLE k_text (k text COLLATE "en-x-icu" PRIMARY KEY, v int NOT NULL);
INSERT INTO k_text SELECT w, 0 FROM unnest(ARRAY['a', 'A', 'b', 'B', 'á', 'ä', 'a b', 'ab', 'a-b',
  'Z', 'z', 'ß', 'ss', '', 'ab ', 'ab  ', '😀', 'Ω', 'ω', 'ÅB', 'åb']) w;
INSERT INTO k_text SELECT md5(g::text) || CASE WHEN g % 3 = 0 THEN upper(md5(g::text)) ELSE '' END, 0
  FROM generate_series(1, 3000) g;
CREATE TABLE k_uuid (k uuid PRIMARY KEY, v int NOT NULL);
INSERT INTO k_uuid SELECT md5(g::text)::uuid, 0 FROM generate_series(1, 3000) g;
CREATE TABLE k_comp (a int, b text COLLATE "en-x-icu", v int NOT NULL, PRIMARY KEY (a, b));
INSERT INTO k_comp SELECT g % 7 - 3, chr(65 + g % 58) || g, 0 FROM generate_series(1, 3000) g;
CREATE TABLE k_bytes (k bytea PRIMARY KEY, v int NOT NULL);
INSERT INTO k_bytes SELECT decode(w, 'hex'), 0
  FROM unnest(ARRAY['', '00', '0000', '61', '6100', '610000', '6101', '61ff', 'ff', 'ff00']) w;
INSERT INTO k_bytes SELECT decode(md5(g::text), 'hex') || CASE WHEN g % 2 = 0 THEN '\x00'::bytea ELSE '\x'::bytea END, 0
  FROM generate_series(1, 3000) g;
ALTER TABLE k_text REPLICA IDENTITY FULL;
ALTER TABLE k_uuid REPLICA IDENTITY FULL;
ALTER TABLE k_comp REPLICA IDENTITY FULL;
ALTER TABLE k_bytes REPLICA IDENTITY FULL;
"#;

/// `n` transactions from one `psql`, about 100 a second: each updates, inserts, deletes and moves
/// keys of every table, rows picked at random by the server. One that meets a key a move would
/// duplicate rolls back (psql goes on).
fn load(url: &str, n: u32) -> Child {
    let pick = |t: &str, cols: &str| {
        format!("({cols}) = (SELECT {cols} FROM {t} OFFSET floor(random() * 2900) LIMIT 1)")
    };
    let mut script = String::new();
    for _ in 0..n {
        script.push_str(&format!(
            "BEGIN;\n\
             UPDATE k_text SET v = v + 1 WHERE {};\n\
             INSERT INTO k_text VALUES (upper(md5(random()::text)), 1) ON CONFLICT (k) DO UPDATE SET v = k_text.v + 1;\n\
             DELETE FROM k_text WHERE {};\n\
             UPDATE k_text SET k = k || ' ' WHERE {};\n\
             UPDATE k_uuid SET v = v + 1 WHERE {};\n\
             INSERT INTO k_uuid VALUES (gen_random_uuid(), 1);\n\
             DELETE FROM k_uuid WHERE {};\n\
             UPDATE k_comp SET b = b || 'x', v = v + 1 WHERE {};\n\
             UPDATE k_comp SET a = a + 10 WHERE {};\n\
             INSERT INTO k_bytes VALUES (decode(md5(random()::text), 'hex') || '\\x00'::bytea, 1) ON CONFLICT DO NOTHING;\n\
             UPDATE k_bytes SET k = k || '\\x00'::bytea WHERE {};\n\
             DELETE FROM k_bytes WHERE {};\n\
             COMMIT;\n\
             SELECT pg_sleep(0.01);\n",
            pick("k_text", "k"),
            pick("k_text", "k"),
            pick("k_text", "k"),
            pick("k_uuid", "k"),
            pick("k_uuid", "k"),
            pick("k_comp", "a, b"),
            pick("k_comp", "a, b"),
            pick("k_bytes", "k"),
            pick("k_bytes", "k"),
        ));
    }
    let mut psql = Command::new("psql");
    psql.args([url, "-q"]);
    fed(psql, &script)
}

/// Each table's row count at the source and the verify report's line for it.
fn assert_every_table_exact(f: &Fixture, url: &str, suffix: &str) {
    let report = verify_job_eventually(f, None, MIN);
    for t in ["k_text", "k_uuid", "k_comp", "k_bytes"] {
        let rows = psql(url, &format!("SELECT count(*) FROM {t}"));
        assert!(
            report.contains(&format!("table {t}{suffix}: {rows} rows compared")),
            "{t}: {rows} rows at the source; {report}"
        );
    }
}

#[test]
fn keys_a_collation_orders_otherwise_than_their_bytes_stay_exact_through_snapshot_log_and_resync() {
    let _serial = serial();
    let name = &format!("keyorder-{}", stamp() % 1_000_000);
    let source = database(name);
    psql(&source.url, TABLES);
    // The collation orders otherwise than the bytes: the premise of the test.
    assert_eq!(
        psql(
            &source.url,
            "SELECT string_agg(k, ',' ORDER BY k) FROM k_text WHERE k IN ('a', 'A', 'b', 'B')"
        ),
        "a,A,b,B"
    );
    // A job of the four tables into PostgreSQL, its snapshot phase slowed (2,000 rows/s) so the
    // load meets every vnode's cursor.
    let f = Fixture::new(
        name,
        2,
        "vnode_count = 64\nmax_rows_per_second = 2000\nconsistency = \"epoch\"",
    );
    f.use_postgres(&pg_url());
    let suffix = format!("_{}", name.replace('-', "_"));
    let store_tables: Vec<String> = ["k_text", "k_uuid", "k_comp", "k_bytes"]
        .iter()
        .map(|t| format!("{t} = \"{t}{suffix}\""))
        .collect();
    tables_config(
        &f,
        &source.url,
        &store_tables.join(", "),
        "tables = [\"public.k_text\", \"public.k_uuid\", \"public.k_comp\", \"public.k_bytes\"]",
        "",
    );
    // The load runs through the capture's copy and the job's snapshot phase.
    let mut writes = load(&source.url, 800);
    let mut capture = spawn_capture(&f, "capture");
    capture.wait_for("snapshot copied", MIN);
    let mut run = f.spawn_run("r1", &[]);
    run.wait_for("to=\"log_store\"", MIN);
    wait_child(&mut writes, MIN);
    assert_every_table_exact(&f, &source.url, &suffix);
    // The replica damaged by hand: a vnode emptied in each table, a key the source never had (a
    // trailing zero byte) in one; resynced under the load, it equals the source again.
    for t in ["k_text", "k_uuid", "k_comp", "k_bytes"] {
        psql(
            &pg_url(),
            &format!("DELETE FROM {t}{suffix} WHERE _kb_vnode = 7"),
        );
    }
    psql(
        &pg_url(),
        &format!(
            "INSERT INTO k_bytes{suffix} SELECT _kb_key || '\\x00'::bytea, _kb_vnode, k || '\\x00'::bytea, v, _kb_row \
             FROM k_bytes{suffix} WHERE _kb_vnode = 11 LIMIT 3"
        ),
    );
    let (clean, damaged) = verify_against_source(&f, None);
    assert!(!clean, "verify did not see the damage: {damaged}");
    let mut writes = load(&source.url, 300);
    resync_command(&f);
    run.wait_for("starting it again on that snapshot", MIN);
    wait_child(&mut writes, MIN);
    assert_every_table_exact(&f, &source.url, &suffix);
    let log = f.check_log();
    assert!(log.contains(" 0 violations"), "{log}");
    run.signal("TERM");
    assert!(run.wait_exit(MIN).success());
    stop_capture(&mut capture);
}
