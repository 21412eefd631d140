use super::*;

const GOOD: &str = r#"
[[jobs]]
name = "accounts"
topic = "accounts-log"
kafka = { "bootstrap.servers" = "127.0.0.1:19092" }
snapshot = { kind = "files", dir = "snap" }
store = { kind = "sqlite", path = "state.sqlite", table = "accounts" }
"#;

#[test]
fn example_and_minimal_configs_load() {
    let c = Config::parse(GOOD, "t.toml").unwrap();
    assert_eq!(c.jobs[0].vnode_count, 256);
    assert_eq!(c.jobs[0].group_id(), "kafka-backfill-accounts");
    assert_eq!(c.jobs[0].recreation.policy, RecreationPolicy::Recreate);
    Config::parse(
        include_str!("../../config/example.toml"),
        "config/example.toml",
    )
    .unwrap();
}

/// `store.tables` (a job of several tables): each error names its key path.
#[test]
fn several_tables_errors_name_the_key() {
    const SEVERAL: &str = r#"
[[jobs]]
name = "pgbench"
topic = "pgbench-log"
consistency = "epoch"
kafka = { "bootstrap.servers" = "127.0.0.1:19092" }
snapshot = { kind = "files", dir = "snap" }
store = { kind = "sqlite", path = "state.sqlite", tables = { pgbench_accounts = "accounts", pgbench_tellers = "tellers" } }
"#;
    let c = Config::parse(SEVERAL, "t.toml").unwrap();
    assert_eq!(
        c.jobs[0].store.table_names(),
        ["accounts".to_string(), "tellers".to_string()]
    );
    let msg = |text: &str| Config::parse(text, "t.toml").unwrap_err().to_string();
    let cases = [
        (
            SEVERAL.replace("consistency = \"epoch\"\n", ""),
            "jobs[0].consistency: a job of several tables (store.tables) needs consistency = \"epoch\"",
        ),
        (
            SEVERAL.replace("dir = \"snap\"", "dir = \"snap\", table = \"pgbench_accounts\""),
            "jobs[0].snapshot.table: names the one table of a job of one table",
        ),
        (
            SEVERAL.replace("tables = {", "table = \"a\", tables = {"),
            "jobs[0].store.table: set store.table (one table) or store.tables (several), not both",
        ),
        (
            SEVERAL.replace("= \"tellers\"", "= \"kb_tellers\""),
            "jobs[0].store.tables.pgbench_tellers: kb_tellers: names starting with kb_",
        ),
        (
            SEVERAL.replace("= \"tellers\"", "= \"tell-ers\""),
            "jobs[0].store.tables.pgbench_tellers: use letters, digits and _",
        ),
        (
            SEVERAL.replace("= \"tellers\"", "= \"Accounts\""),
            "jobs[0].store.tables.pgbench_tellers: table Accounts is named twice",
        ),
        (
            SEVERAL.replace("= \"tellers\"", "= \"\""),
            "jobs[0].store.tables.pgbench_tellers: missing",
        ),
        (
            SEVERAL.replace("tables = {", "store_datum = false, tables = {"),
            "jobs[0].store.store_datum: a job of several tables keeps each row's datum",
        ),
        (
            format!("{SEVERAL}{}", GOOD.replace("table = \"accounts\"", "table = \"tellers\"")),
            "jobs[1].store.table: job pgbench writes table tellers of this store too",
        ),
    ];
    for (text, expected) in cases {
        let e = msg(&text);
        assert!(e.starts_with(expected), "expected {expected:?}, got {e:?}");
    }
}

#[test]
fn unknown_keys_wrong_types_and_bad_combinations_name_the_key() {
    let e =
        Config::parse(&GOOD.replace("topic =", "topik = \"x\"\ntopic ="), "t.toml").unwrap_err();
    assert!(
        e.to_string()
            .starts_with("jobs[0].topik: unknown field `topik`"),
        "{e}"
    );
    let e = Config::parse(
        &GOOD.replace(
            "name = \"accounts\"",
            "name = \"accounts\"\nworkers = \"two\"",
        ),
        "t.toml",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "jobs[0].workers: invalid type: string \"two\", expected u32"
    );
    let e = Config::parse(&GOOD.replace("[[jobs]]", "[[jobs]\n"), "t.toml").unwrap_err();
    assert!(
        e.to_string().starts_with("t.toml:2: "),
        "a syntax error names the line: {e}"
    );
    let e = Config::parse(
        &GOOD.replace(
            "name = \"accounts\"",
            "name = \"accounts\"\nvnode_count = 40000",
        ),
        "t.toml",
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "jobs[0].vnode_count: must be 1..=32768");
    let e = Config::parse(
        &GOOD.replace(
            "name = \"accounts\"",
            "name = \"accounts\"\nmax_mib_ahead = 0",
        ),
        "t.toml",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "jobs[0].max_mib_ahead: must be from 1 to 1048576 (MiB)"
    );
    let rate =
        |extra: &str| Config::parse(&format!("{GOOD}rate_limit = {{ {extra} }}\n"), "t.toml");
    assert_eq!(
        rate("target_commit_p99_ms = 0").unwrap_err().to_string(),
        "jobs[0].rate_limit.target_commit_p99_ms: must be at least 1"
    );
    assert_eq!(
        rate("window_secs = 0").unwrap_err().to_string(),
        "jobs[0].rate_limit.window_secs: must be at least 1"
    );
    assert!(rate("target_p99 = 3")
        .unwrap_err()
        .to_string()
        .starts_with("jobs[0].rate_limit.target_p99: unknown field"));
    let c = rate("target_commit_p99_ms = 200, max_epoch_lag_secs = 60").unwrap();
    let a = c.jobs[0].rate_limit.core();
    assert_eq!(
        (
            a.target_commit_p99_ms,
            a.max_epoch_lag_secs,
            a.floor,
            a.window_ms
        ),
        (Some(200.0), Some(60.0), 100, 5_000)
    );
    let e = Config::parse(
        &GOOD.replace(
            "\"bootstrap.servers\"",
            "\"enable.auto.commit\" = \"true\", \"bootstrap.servers\"",
        ),
        "t.toml",
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "jobs[0].kafka.\"enable.auto.commit\": is managed by kafka-backfill (always false: offsets are committed to the group after each store commit, never on a timer); remove it"
    );
}

/// The last release accepted `auto.offset.reset = "earliest"` (then the managed value): such a
/// config is refused now with the way to migrate, since a reset would skip deleted records.
#[test]
fn the_earlier_managed_offset_reset_is_refused_with_the_way_to_migrate() {
    let e = Config::parse(
        &GOOD.replace(
            "\"bootstrap.servers\"",
            "\"auto.offset.reset\" = \"earliest\", \"bootstrap.servers\"",
        ),
        "t.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with(
            "jobs[0].kafka.\"auto.offset.reset\": is managed by kafka-backfill (always error: "
        ),
        "{e}"
    );
    assert!(
        e.ends_with("(earlier releases set earliest)); remove it"),
        "{e}"
    );
}

#[test]
fn dead_letter_settings_name_the_key() {
    let job = |extra: &str| {
        Config::parse(
            &GOOD.replace(
                "name = \"accounts\"",
                &format!("name = \"accounts\"\n{extra}"),
            ),
            "t.toml",
        )
    };
    assert_eq!(
        job("").unwrap().jobs[0].dead_letters(),
        None,
        "stop by default"
    );
    assert_eq!(
        job("on_bad_record = \"dead-letter\"").unwrap().jobs[0].dead_letters(),
        Some(("accounts-log.dead-letters".to_string(), 100))
    );
    assert_eq!(
        job("on_bad_record = \"dead-letter\"\ndead_letter_topic = \"dlq\"\nmax_dead_letters = 5")
            .unwrap()
            .jobs[0]
            .dead_letters(),
        Some(("dlq".to_string(), 5))
    );
    assert_eq!(
        job("on_bad_record = \"dead-letter\"\ndead_letter_topic = \"accounts-log\"")
            .unwrap_err()
            .to_string(),
        "jobs[0].dead_letter_topic: must be a topic of its own, not the job's log topic"
    );
    assert_eq!(
        job("on_bad_record = \"dead-letter\"\nmax_dead_letters = 0")
            .unwrap_err()
            .to_string(),
        "jobs[0].max_dead_letters: must be at least 1 with on_bad_record = \"dead-letter\""
    );
    assert!(job("dead_letter_topic = \"dlq\"")
        .unwrap_err()
        .to_string()
        .starts_with("jobs[0].dead_letter_topic: is used only with on_bad_record"));
    assert!(job("on_bad_record = \"skip\"")
        .unwrap_err()
        .to_string()
        .starts_with("jobs[0].on_bad_record: unknown variant `skip`"));
}

/// A MariaDB source: its URL checked, snapshots of the running capture (stored in Kafka too)
/// taken, and `server_id` only for it.
#[test]
fn a_mariadb_source_names_what_it_refuses() {
    let capture = |url: &str, extra: &str| {
        Config::parse(
            &format!("{GOOD}[jobs.capture]\nsource_url = \"{url}\"\ntable = \"t\"\n{extra}\n"),
            "t.toml",
        )
        .map_err(|e| e.to_string())
    };
    let ok = capture("mariadb://root@127.0.0.1:3306/shop", "").unwrap();
    let c = ok.jobs[0].capture.as_ref().unwrap();
    assert!(c.binlog_server_id("accounts") >= 0x8000_0000);
    assert_eq!(
        capture("mariadb://root@127.0.0.1:3306/shop", "server_id = 42")
            .unwrap()
            .jobs[0]
            .capture
            .as_ref()
            .unwrap()
            .binlog_server_id("accounts"),
        42
    );
    assert_eq!(
        capture("mariadb://root@127.0.0.1:3306", "").unwrap_err(),
        "jobs[0].capture.source_url: the URL names no database (mariadb://user@host:port/database)"
    );
    // Snapshots of the running capture, stored in Kafka too.
    let later = capture(
        "mysql://root@h/shop",
        "snapshot_interval_ms = 60000\nsnapshot_storage = \"kafka\"",
    )
    .unwrap();
    let c = later.jobs[0].capture.as_ref().unwrap();
    assert_eq!(c.snapshot_interval_ms, Some(60000));
    assert!(c.stores_in_kafka());
    assert!(capture("postgresql://u@h/db", "server_id = 42")
        .unwrap_err()
        .starts_with("jobs[0].capture.server_id: a MariaDB source's setting"));
}

#[test]
fn capture_settings_name_the_key() {
    let capture = |extra: &str| {
        Config::parse(
            &format!("{GOOD}[jobs.capture]\nsource_url = \"postgresql://u@h/db\"\ntable = \"public.t\"\n{extra}\n"),
            "t.toml",
        )
    };
    let c = capture("").unwrap();
    let section = c.jobs[0].capture.as_ref().unwrap();
    assert_eq!(section.copy_connections, 2);
    assert_eq!(section.publication_name("accounts"), "kb_accounts");
    assert_eq!(
        capture("copy_connections = 0").unwrap_err().to_string(),
        "jobs[0].capture.copy_connections: must be 1..=16"
    );
    assert!(capture("copy_connections = 16").is_ok());
    assert_eq!(
        capture("snapshot_interval_ms = 999").unwrap_err().to_string(),
        "jobs[0].capture.snapshot_interval_ms: must be at least 1000 (a snapshot copies every captured table)"
    );
    assert!(capture("snapshot_interval_ms = 60000").is_ok());
    assert_eq!(section.snapshot_storage, SnapshotStorage::Files);
    assert_eq!(
        capture("snapshot_storage = \"kafka\"").unwrap().jobs[0]
            .capture
            .as_ref()
            .unwrap()
            .snapshot_storage,
        SnapshotStorage::Kafka
    );
    let e = capture("snapshot_storage = \"s3\"")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("jobs[0].capture.snapshot_storage") && e.contains("kafka"),
        "{e}"
    );
    assert_eq!(
        capture("snapshot_keep = 0").unwrap_err().to_string(),
        "jobs[0].capture.snapshot_keep: must be at least 1 (a job that starts reads the newest snapshot)"
    );
    let long = "p".repeat(64);
    assert_eq!(
        capture(&format!("publication = \"{long}\"")).unwrap_err().to_string(),
        format!("jobs[0].capture.publication: \"{long}\": a publication name is 1 to 63 bytes (PostgreSQL would cut a longer one)")
    );
    assert!(capture(&format!("publication = \"{}\"", &long[..63])).is_ok());
    assert!(capture("slot = \"Bad-Slot\"")
        .unwrap_err()
        .to_string()
        .starts_with("jobs[0].capture.slot: "));
    assert!(capture("partitions = 0")
        .unwrap_err()
        .to_string()
        .starts_with("jobs[0].capture.partitions: must be 1..="));
}

/// The checkpoint interval's default (200 ms) follows a longer barrier interval: a configuration of
/// the last release (default 1000) that set only `barrier_interval_ms = 500` still validates, at 500;
/// one set below the barrier interval is refused naming the key.
#[test]
fn an_unset_checkpoint_interval_follows_a_longer_barrier_interval() {
    let capture = |extra: &str| {
        Config::parse(
            &format!("{GOOD}[jobs.capture]\nsource_url = \"postgresql://u@h/db\"\ntable = \"a\"\n{extra}\n"),
            "t.toml",
        )
    };
    let interval = |c: Config| c.jobs[0].capture.as_ref().unwrap().checkpoint_interval_ms();
    assert_eq!(interval(capture("").unwrap()), 200);
    assert_eq!(interval(capture("barrier_interval_ms = 500").unwrap()), 500);
    assert_eq!(
        interval(capture("barrier_interval_ms = 100\ncheckpoint_interval_ms = 700").unwrap()),
        700
    );
    assert_eq!(
        capture("barrier_interval_ms = 500\ncheckpoint_interval_ms = 300")
            .unwrap_err()
            .to_string(),
        "jobs[0].capture.checkpoint_interval_ms: barrier_interval_ms must be ≥ 1 and checkpoint_interval_ms ≥ barrier_interval_ms"
    );
}

/// A capture of several tables: `table` or `tables`, names distinct without their schema, and
/// the capturing job names the one it materialises; each refusal names its key.
#[test]
fn a_capture_of_several_tables_is_checked_naming_the_key() {
    let capture = |snapshot: &str, tables: &str| {
        let good = GOOD.replace(
            "snapshot = { kind = \"files\", dir = \"snap\" }",
            &format!("snapshot = {{ kind = \"files\", dir = \"snap\"{snapshot} }}"),
        );
        Config::parse(
            &format!("{good}[jobs.capture]\nsource_url = \"postgresql://u@h/db\"\n{tables}\n"),
            "t.toml",
        )
    };
    let c = capture(", table = \"b\"", "tables = [\"a\", \"s.b\"]").unwrap();
    let names = c.jobs[0].capture.as_ref().unwrap().table_names().unwrap();
    assert_eq!(
        names.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["public.a", "s.b"]
    );
    let refused = |snapshot: &str, tables: &str| capture(snapshot, tables).unwrap_err().to_string();
    assert_eq!(
        refused("", "tables = [\"a\", \"b\"]"),
        "jobs[0].snapshot.table: capture writes a log of several tables (a, b): name the one this job materialises"
    );
    assert_eq!(
        refused(", table = \"c\"", "tables = [\"a\", \"b\"]"),
        "jobs[0].snapshot.table: \"c\" is none of the captured tables (a, b)"
    );
    assert_eq!(
        refused(", table = \"a\"", "tables = [\"a\"]"),
        "jobs[0].snapshot.table: capture writes a log of one table: leave snapshot.table out"
    );
    assert_eq!(
        refused(", table = \"a\"", "tables = [\"public.a\", \"s.a\"]"),
        "jobs[0].capture.tables: public.a and s.a: the log names its tables without the schema, so their names must differ"
    );
    assert_eq!(
        refused("", "table = \"a\"\ntables = [\"b\"]"),
        "jobs[0].capture.tables: set table or tables, not both"
    );
    assert_eq!(
        refused("", ""),
        "jobs[0].capture.table: missing: the table to capture (or tables = [...])"
    );
    assert!(refused(", table = \"a\"", "tables = [\"a\", \"x.y.z\"]")
        .starts_with("jobs[0].capture.tables: \"x.y.z\" is not a table name"));
}

#[test]
fn environment_overrides_set_nested_keys_and_are_validated() {
    let o = |k: &str, v: &str| (format!("KAFKA_BACKFILL__{k}"), v.to_string());
    let c = Config::parse_with(
        GOOD,
        "t.toml",
        &[
            o("HTTP__LISTEN", "0.0.0.0:1234"),
            o("JOBS__0__WORKERS", "3"),
            o("JOBS__0__KAFKA__group.id", "g1"),
        ],
    )
    .unwrap();
    assert_eq!(c.http.listen, "0.0.0.0:1234");
    assert_eq!(c.jobs[0].workers, 3);
    assert_eq!(c.jobs[0].kafka["group.id"], "g1");
    let e = Config::parse_with(GOOD, "t.toml", &[o("JOBS__0__WORKERS", "0")]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "jobs[0].workers (set by KAFKA_BACKFILL__JOBS__0__WORKERS): must be 1..=64"
    );
    let e = Config::parse_with(GOOD, "t.toml", &[o("JOBS__0__WORKERZ", "2")]).unwrap_err();
    assert!(e.to_string().contains("unknown field `workerz`"), "{e}");
}

/// Every mistake `run` would refuse (or that would misbehave) is refused by validation, which is
/// all `check-config` runs, naming the key.
#[test]
fn validation_refuses_what_run_would_refuse() {
    let refused = |text: &str| {
        Config::parse_with(text, "t.toml", &[])
            .unwrap_err()
            .to_string()
    };
    let kafka = |extra: &str| {
        GOOD.replace(
            "kafka = { \"bootstrap.servers\" = \"127.0.0.1:19092\" }",
            &format!("kafka = {{ \"bootstrap.servers\" = \"127.0.0.1:19092\", {extra} }}"),
        )
    };
    let e = refused(&kafka("\"session.timout.ms\" = \"1\""));
    assert!(
        e.starts_with("jobs[0].kafka.\"session.timout.ms\": No such configuration property"),
        "{e}"
    );
    let e = refused(&kafka("\"session.timeout.ms\" = \"soon\""));
    assert!(
        e.starts_with("jobs[0].kafka.\"session.timeout.ms\": "),
        "{e}"
    );
    let e = refused(&kafka("\"group.id\" = \"\""));
    assert!(e.starts_with("jobs[0].kafka.\"group.id\": empty"), "{e}");
    let e = refused(&GOOD.replace("127.0.0.1:19092", " "));
    assert_eq!(e, "jobs[0].kafka.\"bootstrap.servers\": empty");
    let store = |s: &str| {
        GOOD.replace(
            "store = { kind = \"sqlite\", path = \"state.sqlite\", table = \"accounts\" }",
            s,
        )
    };
    let e = refused(&store(
        "store = { kind = \"postgres\", url = \"postgresql://u@h/db?sslmode=verify_full\", table = \"t\" }",
    ));
    assert!(
        e.starts_with("jobs[0].store.url: sslmode verify_full is not one of"),
        "{e}"
    );
    let e = refused(&GOOD.replace(
        "snapshot = { kind = \"files\", dir = \"snap\" }",
        "snapshot = { kind = \"postgres\", url = \"mysql://u@h/db\", name = \"s\" }",
    ));
    assert!(e.starts_with("jobs[0].snapshot.url: scheme mysql"), "{e}");
    let e = refused(&format!("[http]\nlisten = \"nine-four-six-four\"\n{GOOD}"));
    assert!(
        e.starts_with("http.listen: \"nine-four-six-four\" is not a host:port"),
        "{e}"
    );
    let e = refused(&format!(
        "[http]\nlisten = \"127.0.0.1:9464\"\nadmin = true\nadmin_listen = \"127.0.0.1:9464\"\n{GOOD}"
    ));
    assert!(
        e.starts_with("http.admin_listen: is http.listen's address"),
        "{e}"
    );
    let e = refused(&format!("[log]\nlevel = \"verbose=[\"\n{GOOD}"));
    assert!(
        e.starts_with("log.level: \"verbose=[\" is not a log filter"),
        "{e}"
    );
    let c = Config::parse(
        &GOOD.replace(
            "name = \"accounts\"",
            "name = \"accounts\"\nconsistency = \"epoch\"",
        ),
        "t.toml",
    )
    .unwrap();
    assert_eq!(c.jobs[0].consistency, Consistency::Epoch);
    let e = refused(&store(
        "store = { kind = \"sqlite\", path = \"state.sqlite\", table = \"kb_jobs\" }",
    ));
    assert!(
        e.starts_with("jobs[0].store.table: kb_jobs: names starting with kb_"),
        "{e}"
    );
    let two = format!(
        "{GOOD}{}",
        GOOD.replace("\"accounts\"\ntopic", "\"other\"\ntopic")
            .replace("path = \"state.sqlite\"", "path = \"./state.sqlite\"")
    );
    let e = refused(&two);
    assert_eq!(
        e,
        "jobs[1].store.table: job accounts writes table accounts of this store too; a table belongs to one job"
    );
    // The value kafka-backfill enforces is accepted, with a note.
    let c = Config::parse_with(
        &kafka("\"isolation.level\" = \"read_committed\""),
        "t.toml",
        &[],
    )
    .unwrap();
    assert_eq!(c.notes().len(), 1, "{:?}", c.notes());
    let e = refused(&kafka("\"isolation.level\" = \"read_uncommitted\""));
    assert!(e.contains("is managed by kafka-backfill"), "{e}");
}

/// KIP-848: the consumer protocol is accepted without the classic protocol's keys, which
/// librdkafka would refuse at client creation; validation names them first.
#[test]
fn the_consumer_group_protocol_refuses_the_classic_keys() {
    let with = |extra: &str| {
        GOOD.replace(
            "\"bootstrap.servers\" = \"127.0.0.1:19092\"",
            &format!("\"bootstrap.servers\" = \"127.0.0.1:19092\", \"group.protocol\" = \"consumer\"{extra}"),
        )
    };
    Config::parse_with(&with(""), "t.toml", &[]).unwrap();
    Config::parse_with(
        &with(", \"group.remote.assignor\" = \"uniform\""),
        "t.toml",
        &[],
    )
    .unwrap();
    for key in [
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "partition.assignment.strategy",
    ] {
        let e = Config::parse_with(&with(&format!(", \"{key}\" = \"6000\"")), "t.toml", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "jobs[0].kafka.\"{key}\": is not allowed with \"group.protocol\" = \"consumer\""
            )),
            "{e}"
        );
    }
    let e = Config::parse_with(
        &with(", \"max.poll.interval.ms\" = \"10000\""),
        "t.toml",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with("jobs[0].kafka.\"max.poll.interval.ms\": 10000 is below 60000"),
        "{e}"
    );
    Config::parse_with(
        &with(", \"max.poll.interval.ms\" = \"300000\""),
        "t.toml",
        &[],
    )
    .unwrap();
    let consumer: BTreeMap<String, String> =
        [("group.protocol".to_string(), "consumer".to_string())].into();
    assert!(crate::kafka::managed_keys(&consumer)
        .all(|(k, _, _)| *k != "partition.assignment.strategy"));
    assert_eq!(crate::kafka::managed_keys(&BTreeMap::new()).count(), 6);
}

#[test]
fn kafka_values_are_text_in_the_file_and_in_overrides() {
    let o = |k: &str, v: &str| (format!("KAFKA_BACKFILL__{k}"), v.to_string());
    let text = GOOD.replace(
        "\"bootstrap.servers\" = \"127.0.0.1:19092\"",
        "\"bootstrap.servers\" = \"127.0.0.1:19092\", \"session.timeout.ms\" = 45000, \"enable.idempotence\" = true",
    );
    let c = Config::parse_with(&text, "t.toml", &[]).unwrap();
    assert_eq!(c.jobs[0].kafka["session.timeout.ms"], "45000");
    assert_eq!(c.jobs[0].kafka["enable.idempotence"], "true");
    let c = Config::parse_with(
        GOOD,
        "t.toml",
        &[
            o("JOBS__0__KAFKA__session.timeout.ms", "45000"),
            o("JOBS__0__KAFKA__enable.idempotence", "true"),
            o("JOBS__0__KAFKA__FETCH_WAIT_MAX_MS", "50"),
            o("JOBS__0__TOPIC", "12345"),
        ],
    )
    .unwrap();
    let k = &c.jobs[0].kafka;
    assert_eq!(
        (
            k["session.timeout.ms"].as_str(),
            k["enable.idempotence"].as_str(),
            k["fetch.wait.max.ms"].as_str()
        ),
        ("45000", "true", "50")
    );
    assert_eq!(c.jobs[0].topic, "12345");
    // An error at a key an override set names the variable.
    let e = Config::parse_with(GOOD, "t.toml", &[o("JOBS__0__WORKERS", "many")])
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("jobs[0].workers (set by KAFKA_BACKFILL__JOBS__0__WORKERS): invalid type"),
        "{e}"
    );
    let e = Config::parse_with(
        GOOD,
        "t.toml",
        &[o("JOBS__0__KAFKA__SESSION_TIMEOUT_MS", "soon")],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.starts_with(
            "jobs[0].kafka.\"session.timeout.ms\" (set by KAFKA_BACKFILL__JOBS__0__KAFKA__SESSION_TIMEOUT_MS): "
        ),
        "{e}"
    );
}

#[test]
fn env_substitution_and_redaction() {
    std::env::set_var("KB_TEST_SECRET", "hunter2");
    let text = GOOD.replace(
        "\"bootstrap.servers\" = \"127.0.0.1:19092\"",
        "\"bootstrap.servers\" = \"127.0.0.1:19092\", \"sasl.password\" = \"${KB_TEST_SECRET}\"",
    );
    let c = Config::parse(&text, "t.toml").unwrap();
    assert_eq!(c.jobs[0].kafka["sasl.password"], "hunter2");
    assert_eq!(c.jobs[0].kafka_redacted()["sasl.password"], "***");
    let e = Config::parse(
        &text.replace("KB_TEST_SECRET", "KB_TEST_UNSET_VAR"),
        "t.toml",
    )
    .unwrap_err();
    assert!(e.to_string().contains("KB_TEST_UNSET_VAR is not set"));
    assert!(
        e.to_string()
            .starts_with("jobs[0].kafka.\"sasl.password\": "),
        "{e}"
    );
}

/// A secret holding quotes, backslashes, a newline, `#` and unicode is taken as it is, and
/// cannot add keys to the file.
#[test]
fn env_values_with_any_characters_round_trip_and_cannot_inject_keys() {
    let secret = "p\"a\\s#s\nworkers = 9\n[http]\nlisten = \"0.0.0.0:1\" ünï ${NOT}";
    std::env::set_var("KB_TEST_NASTY_SECRET", secret);
    let text = GOOD.replace(
        "\"bootstrap.servers\" = \"127.0.0.1:19092\"",
        "\"bootstrap.servers\" = \"127.0.0.1:19092\", \"sasl.password\" = \"${KB_TEST_NASTY_SECRET}\"",
    );
    let c = Config::parse(&text, "t.toml").unwrap();
    assert_eq!(c.jobs[0].kafka["sasl.password"], secret);
    assert_eq!(c.jobs[0].workers, 1);
    assert_eq!(c.http.listen, "127.0.0.1:9464");
}

/// Secrets never print: the store URL and Kafka passwords are masked in `Debug` (what a panic
/// or a `{:?}` would show) and in `check-config`'s output.
#[test]
fn secrets_never_print() {
    std::env::set_var("KB_TEST_PG_PW", "pg-hunter2");
    let text = GOOD
        .replace(
            "store = { kind = \"sqlite\", path = \"state.sqlite\", table = \"accounts\" }",
            "store = { kind = \"postgres\", url = \"postgresql://kb:${KB_TEST_PG_PW}@db/x\", table = \"accounts\" }",
        )
        .replace(
            "\"bootstrap.servers\" = \"127.0.0.1:19092\"",
            "\"bootstrap.servers\" = \"127.0.0.1:19092\", \"sasl.password\" = \"kafka-hunter2\"",
        );
    let c = Config::parse(&text, "t.toml").unwrap();
    let debug = format!("{c:?} {:?}", c.jobs[0]);
    assert!(!debug.contains("hunter2"), "{debug}");
    assert!(c.jobs[0].store.describe().contains("kb:***@db"));
    let StoreConfig::Postgres { url, .. } = &c.jobs[0].store else {
        panic!("postgres")
    };
    assert_eq!(url.expose(), "postgresql://kb:pg-hunter2@db/x");
    assert_eq!(url.to_string(), "***");
}

/// `${NAME}` falls back to the file named by `NAME_FILE` (Docker and Kubernetes secrets).
#[test]
fn env_values_can_come_from_secret_files() {
    let dir = std::env::temp_dir().join(format!("kb-secret-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pw");
    std::fs::write(&file, "from-a-file\n").unwrap();
    std::env::remove_var("KB_TEST_FILE_SECRET");
    std::env::set_var("KB_TEST_FILE_SECRET_FILE", &file);
    let text = GOOD.replace(
        "\"bootstrap.servers\" = \"127.0.0.1:19092\"",
        "\"bootstrap.servers\" = \"127.0.0.1:19092\", \"sasl.password\" = \"${KB_TEST_FILE_SECRET}\"",
    );
    let c = Config::parse(&text, "t.toml").unwrap();
    assert_eq!(c.jobs[0].kafka["sasl.password"], "from-a-file");
    std::env::set_var("KB_TEST_FILE_SECRET_FILE", dir.join("missing"));
    let e = Config::parse(&text, "t.toml").unwrap_err().to_string();
    assert!(
        e.starts_with("jobs[0].kafka.\"sasl.password\": KB_TEST_FILE_SECRET_FILE = "),
        "{e}"
    );
}
