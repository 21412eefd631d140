//! Validation: what types cannot say (ranges, combinations, uniqueness, librdkafka's own check of
//! every property, URLs, listen addresses, the log filter, reserved table names), each refusal naming
//! the key path. Reads the configuration only: no broker or store is reached.

use std::path::{Path, PathBuf};

use super::*;

/// What a job of several tables (`store.tables`) needs of the rest of its configuration.
fn check_several_tables(job: &JobConfig, at: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
    if job.consistency != Consistency::Epoch {
        return Err(err(
            at("consistency"),
            "a job of several tables (store.tables) needs consistency = \"epoch\": its tables then move together by whole epochs, across every worker (docs/design/several-tables.md §2)",
        ));
    }
    match &job.snapshot {
        SnapshotConfig::Files { table: Some(_), .. } => {
            return Err(err(
                at("snapshot.table"),
                "names the one table of a job of one table; a job of several names its tables in store.tables: leave snapshot.table out",
            ))
        }
        SnapshotConfig::Files { .. } => {}
        SnapshotConfig::Postgres { .. } => {
            return Err(err(
                at("snapshot.kind"),
                "a job of several tables reads a file snapshot (a PostgreSQL snapshot holds one table)",
            ))
        }
    }
    match &job.store {
        StoreConfig::Sqlite {
            store_datum: false, ..
        } => Err(err(
            at("store.store_datum"),
            "a job of several tables keeps each row's datum: leave store_datum out (true)",
        )),
        StoreConfig::Sqlite { .. } | StoreConfig::Postgres { .. } => Ok(()),
    }
}

impl Config {
    /// What validation accepted but an operator should know (a managed key set to the value
    /// kafka-backfill enforces anyway), as `key path: note` lines for `check-config`.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        for (i, job) in self.jobs.iter().enumerate() {
            for (k, value, _) in crate::kafka::managed_keys(&job.kafka) {
                if job.kafka.get(*k).is_some_and(|v| v == value) {
                    notes.push(format!(
                        "jobs[{i}].kafka.\"{k}\": {value} is what kafka-backfill sets anyway; the key can be removed"
                    ));
                }
            }
        }
        notes
    }

    /// Checks what types cannot: ranges, combinations, uniqueness.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.jobs.is_empty() {
            return Err(err("jobs", "no job configured"));
        }
        if self.http.max_connections == 0 {
            return Err(err("http.max_connections", "must be at least 1"));
        }
        if self.http.admin && self.http.admin_listen.is_empty() {
            return Err(err(
                "http.admin_listen",
                "must be an address when http.admin = true",
            ));
        }
        if self.http.header_timeout_ms == 0 {
            return Err(err("http.header_timeout_ms", "must be at least 1"));
        }
        let listen = listen_addr("http.listen", &self.http.listen)?;
        if self.http.admin {
            let admin = listen_addr("http.admin_listen", &self.http.admin_listen)?;
            if admin.is_some() && admin == listen {
                return Err(err(
                    "http.admin_listen",
                    "is http.listen's address: the write endpoint needs its own listener",
                ));
            }
            if let Some(t) = &self.http.admin_token {
                if t.expose().trim().is_empty() {
                    return Err(err("http.admin_token", "empty"));
                }
            } else if admin.is_some_and(|a| !a.ip().is_loopback()) {
                return Err(err(
                    "http.admin_token",
                    format!("required: http.admin_listen ({}) is not a loopback address, and anyone who reaches it could pause a job or change its limits; set admin_token = \"${{KB_ADMIN_TOKEN}}\"", self.http.admin_listen),
                ));
            }
        }
        if let Some(level) = &self.log.level {
            check_log_filter(level).map_err(|m| err("log.level", m))?;
        }
        let mut names = std::collections::BTreeSet::new();
        // (store identity, table) → the job that writes it.
        let mut tables: BTreeMap<(String, String), String> = BTreeMap::new();
        for (i, job) in self.jobs.iter().enumerate() {
            let at = |k: &str| format!("jobs[{i}].{k}");
            if job.name.is_empty()
                || !job
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(err(at("name"), "use letters, digits, - and _"));
            }
            if !names.insert(job.name.clone()) {
                return Err(err(
                    at("name"),
                    format!("job {} is configured twice", job.name),
                ));
            }
            if job.topic.is_empty() {
                return Err(err(at("topic"), "empty"));
            }
            if job.workers == 0 || job.workers > 64 {
                return Err(err(at("workers"), "must be 1..=64"));
            }
            if job.vnode_count == 0 || job.vnode_count > MAX_VNODE_COUNT {
                return Err(err(
                    at("vnode_count"),
                    format!("must be 1..={MAX_VNODE_COUNT}"),
                ));
            }
            match job.kafka.get("bootstrap.servers") {
                None => return Err(err(at("kafka"), "bootstrap.servers is required")),
                Some(b) if b.trim().is_empty() => {
                    return Err(err(at("kafka.\"bootstrap.servers\""), "empty"))
                }
                _ => {}
            }
            if job
                .kafka
                .get("group.id")
                .is_some_and(|g| g.trim().is_empty())
            {
                return Err(err(
                    at("kafka.\"group.id\""),
                    "empty (leave it out for kafka-backfill-<job name>)",
                ));
            }
            if let Some(c) = &job.capture {
                let SnapshotConfig::Files { table, .. } = &job.snapshot else {
                    return Err(err(
                        at("capture"),
                        "capture writes the snapshot as files: set snapshot = { kind = \"files\", dir = … }",
                    ));
                };
                let tables = c
                    .table_names()
                    .map_err(|(key, m)| err(at(&format!("capture.{key}")), m))?;
                match (tables.as_slice(), table) {
                    ([_], Some(_)) => {
                        return Err(err(
                            at("snapshot.table"),
                            "capture writes a log of one table: leave snapshot.table out",
                        ))
                    }
                    ([_], None) => {}
                    (_, None) if !job.store.tables().is_empty() => {
                        for name in job.store.tables().keys() {
                            if !tables.iter().any(|t| &t.table == name) {
                                return Err(err(
                                    at(&format!("store.tables.{name}")),
                                    format!(
                                        "{name:?} is none of the captured tables ({})",
                                        tables.iter().map(|t| t.table.as_str()).collect::<Vec<_>>().join(", ")
                                    ),
                                ));
                            }
                        }
                    }
                    (_, None) => {
                        return Err(err(
                            at("snapshot.table"),
                            format!(
                                "capture writes a log of several tables ({}): name the one this job materialises",
                                tables.iter().map(|t| t.table.as_str()).collect::<Vec<_>>().join(", ")
                            ),
                        ))
                    }
                    (_, Some(name)) => {
                        if !tables.iter().any(|t| &t.table == name) {
                            return Err(err(
                                at("snapshot.table"),
                                format!(
                                    "{name:?} is none of the captured tables ({})",
                                    tables.iter().map(|t| t.table.as_str()).collect::<Vec<_>>().join(", ")
                                ),
                            ));
                        }
                    }
                }
                if super::is_mariadb_url(c.source_url.expose()) {
                    super::mariadb_opts(c.source_url.expose())
                        .map_err(|m| err(at("capture.source_url"), m))?;
                } else {
                    crate::pg_tls::check_url(c.source_url.expose())
                        .map_err(|m| err(at("capture.source_url"), m))?;
                    if c.server_id.is_some() {
                        return Err(err(
                            at("capture.server_id"),
                            "a MariaDB source's setting; this source is PostgreSQL".to_string(),
                        ));
                    }
                }
                let slot = c.slot_name(&job.name);
                if slot.len() > 63
                    || !slot
                        .chars()
                        .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_')
                {
                    return Err(err(
                        at("capture.slot"),
                        format!(
                            "{slot:?}: a slot name is at most 63 lower-case letters, digits and _"
                        ),
                    ));
                }
                let publication = c.publication_name(&job.name);
                if publication.is_empty() || publication.len() > 63 {
                    return Err(err(
                        at("capture.publication"),
                        format!("{publication:?}: a publication name is 1 to 63 bytes (PostgreSQL would cut a longer one)"),
                    ));
                }
                if !(1..=16).contains(&c.copy_connections) {
                    return Err(err(at("capture.copy_connections"), "must be 1..=16"));
                }
                if c.snapshot_keep == 0 {
                    return Err(err(
                        at("capture.snapshot_keep"),
                        "must be at least 1 (a job that starts reads the newest snapshot)",
                    ));
                }
                if c.snapshot_interval_ms.is_some_and(|ms| ms < 1000) {
                    return Err(err(
                        at("capture.snapshot_interval_ms"),
                        "must be at least 1000 (a snapshot copies every captured table)",
                    ));
                }
                if c.partitions == 0 || c.partitions > job.vnode_count {
                    return Err(err(
                        at("capture.partitions"),
                        format!("must be 1..={} (the job's vnode_count)", job.vnode_count),
                    ));
                }
                if c.barrier_interval_ms == 0 || c.checkpoint_interval_ms() < c.barrier_interval_ms
                {
                    return Err(err(
                        at("capture.checkpoint_interval_ms"),
                        "barrier_interval_ms must be ≥ 1 and checkpoint_interval_ms ≥ barrier_interval_ms",
                    ));
                }
            }
            match job.dead_letters() {
                Some((topic, max)) => {
                    if topic == job.topic || topic.is_empty() {
                        return Err(err(
                            at("dead_letter_topic"),
                            "must be a topic of its own, not the job's log topic",
                        ));
                    }
                    if max == 0 {
                        return Err(err(
                            at("max_dead_letters"),
                            "must be at least 1 with on_bad_record = \"dead-letter\"",
                        ));
                    }
                }
                None if job.dead_letter_topic.is_some() => {
                    return Err(err(
                        at("dead_letter_topic"),
                        "is used only with on_bad_record = \"dead-letter\"; set it, or remove this key",
                    ));
                }
                None => {}
            }
            if crate::kafka::uses_consumer_protocol(&job.kafka) {
                for (k, why) in crate::kafka::CLASSIC_PROTOCOL_KEYS {
                    if job.kafka.contains_key(k) {
                        return Err(err(
                            at(&format!("kafka.\"{k}\"")),
                            format!("is not allowed with \"group.protocol\" = \"consumer\" (librdkafka refuses it: {why}); remove it"),
                        ));
                    }
                }
            }
            for (k, value, why) in crate::kafka::managed_keys(&job.kafka) {
                if job.kafka.get(*k).is_some_and(|v| v != value) {
                    return Err(err(
                        at(&format!("kafka.\"{k}\"")),
                        format!("is managed by kafka-backfill (always {value}: {why}); remove it"),
                    ));
                }
            }
            if let Some(v) = job.kafka.get("max.poll.interval.ms") {
                let min = 2 * crate::core::retry::Backoff::STORE.deadline_ms;
                if v.trim().parse::<u64>().is_ok_and(|ms| ms < min) {
                    return Err(err(
                        at("kafka.\"max.poll.interval.ms\""),
                        format!("{v} is below {min}: the loop acknowledges a revocation only once the commits before it are durable, which the store may take its whole retry deadline ({} ms) to confirm; under \"group.protocol\" = \"consumer\" it is also the rebalance timeout", crate::core::retry::Backoff::STORE.deadline_ms),
                    ));
                }
            }
            crate::kafka::check_properties(&job.kafka)
                .map_err(|(k, m)| err(at(&format!("kafka.\"{k}\"")), m))?;
            let several = job.store.tables();
            // (the key path of each SQL table's name, the name)
            let names: Vec<(String, &str)> = if several.is_empty() {
                vec![(at("store.table"), job.store.table())]
            } else {
                if !job.store.table().is_empty() {
                    return Err(err(
                        at("store.table"),
                        "set store.table (one table) or store.tables (several), not both",
                    ));
                }
                several
                    .iter()
                    .map(|(t, n)| (at(&format!("store.tables.{t}")), n.as_str()))
                    .collect()
            };
            if !several.is_empty() {
                check_several_tables(job, &at)?;
            }
            let store_id = match &job.store {
                StoreConfig::Sqlite { path, .. } => format!("sqlite:{}", lexical(path).display()),
                StoreConfig::Postgres { url, .. } => {
                    crate::pg_tls::check_url(url.expose()).map_err(|m| err(at("store.url"), m))?;
                    format!("postgres:{}", url.expose())
                }
            };
            for (key, table) in names {
                if table.is_empty() {
                    return Err(err(
                        key,
                        "missing: name the SQL table that receives the rows (or store.tables for several)",
                    ));
                }
                if !table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    return Err(err(key, "use letters, digits and _"));
                }
                if table.to_ascii_lowercase().starts_with("kb_") {
                    return Err(err(
                        key,
                        format!("{table}: names starting with kb_ are kafka-backfill's own tables"),
                    ));
                }
                if let Some(other) = tables.insert(
                    (store_id.clone(), table.to_ascii_lowercase()),
                    job.name.clone(),
                ) {
                    return Err(err(
                        key,
                        if other == job.name {
                            format!("table {table} is named twice; each table of the log goes to a table of its own")
                        } else {
                            format!("job {other} writes table {table} of this store too; a table belongs to one job")
                        },
                    ));
                }
            }
            if let SnapshotConfig::Postgres { url, .. } = &job.snapshot {
                crate::pg_tls::check_url(url.expose()).map_err(|m| err(at("snapshot.url"), m))?;
            }
            match &job.store {
                StoreConfig::Sqlite { path, .. } if path.as_os_str().is_empty() => {
                    return Err(err(at("store.path"), "empty"));
                }
                StoreConfig::Postgres { url, .. }
                    if !(url.expose().starts_with("postgresql://")
                        || url.expose().starts_with("postgres://")) =>
                {
                    return Err(err(
                        at("store.url"),
                        "a PostgreSQL store needs a postgresql:// URL",
                    ));
                }
                _ => {}
            }
            if job.rate_limit.target_commit_p99_ms == Some(0) {
                return Err(err(
                    at("rate_limit.target_commit_p99_ms"),
                    "must be at least 1",
                ));
            }
            if job.rate_limit.window_secs == 0 || job.rate_limit.min_per_second == 0 {
                return Err(err(
                    at(if job.rate_limit.window_secs == 0 {
                        "rate_limit.window_secs"
                    } else {
                        "rate_limit.min_per_second"
                    }),
                    "must be at least 1",
                ));
            }
            if job.local_checkpoint.max_rows == 0 {
                return Err(err(at("local_checkpoint.max_rows"), "must be at least 1"));
            }
            if job.max_mib_ahead == 0 || job.max_mib_ahead > 1 << 20 {
                return Err(err(at("max_mib_ahead"), "must be from 1 to 1048576 (MiB)"));
            }
            let r = &job.recreation;
            if r.backoff_initial_ms > r.backoff_max_ms {
                return Err(err(
                    at("recreation.backoff_initial_ms"),
                    "exceeds recreation.backoff_max_ms",
                ));
            }
        }
        Ok(())
    }
}

/// Log levels a filter directive may name.
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// A `log.level` filter as `RUST_LOG` takes it, and no looser: each comma-separated directive is a
/// level, `target=level`, or a bare module path (`a::b`) or one of this binary's crates. tracing
/// would take any bare word as a target to log at every level, so `verbose` would silently mean
/// "trace the target `verbose`" and log nothing more.
fn check_log_filter(filter: &str) -> Result<(), String> {
    const CRATES: [&str; 8] = [
        "kafka_backfill",
        "kafka_backfill_core",
        "librdkafka",
        "rdkafka",
        "postgres",
        "tokio_postgres",
        "hyper",
        "axum",
    ];
    tracing_subscriber::EnvFilter::builder()
        .parse(filter)
        .map_err(|e| format!("{filter:?} is not a log filter: {e}"))?;
    for d in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let ok = match d.split_once('=') {
            Some((_, level)) => LEVELS.contains(&level.to_ascii_lowercase().as_str()),
            None => {
                LEVELS.contains(&d.to_ascii_lowercase().as_str())
                    || d.contains("::")
                    || d.contains('[')
                    || CRATES.contains(&d)
            }
        };
        if !ok {
            return Err(format!(
                "{d:?} in {filter:?} is neither a level ({}) nor target=level",
                LEVELS.join(", ")
            ));
        }
    }
    Ok(())
}

/// A listen address (`host:port`); empty = off.
fn listen_addr(key: &str, value: &str) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    if value.is_empty() {
        return Ok(None);
    }
    use std::net::ToSocketAddrs;
    value
        .parse::<std::net::SocketAddr>()
        .map(Some)
        .or_else(|_| {
            // A host name (`localhost:9464`) resolves locally, without a network.
            value
                .to_socket_addrs()
                .map(|mut a| a.next())
                .map_err(|e| e.to_string())
        })
        .map_err(|e| {
            err(
                key,
                format!("{value:?} is not a host:port listen address: {e}"),
            )
        })
}

/// A path with `.` and `..` folded (no file system access): `./state.sqlite` and `state.sqlite`
/// are one store.
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir if out.file_name().is_some() => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}
