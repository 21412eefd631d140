//! `kafka-backfill doctor --config F`: reaches every part a configuration names — each job's
//! brokers and topic, its consumer group, its state store, its snapshot and its capture's source —
//! and prints one line per check with its time, so what `run` would fail on after seconds of retries
//! is named at once. Every check is bounded ([`TIMEOUT`]) and reads only: nothing is created, no
//! group is joined, no slot is taken.
//!
//! Owns the checks and their report; the rules they apply are the ones `run` applies (the store
//! protocol's table ownership, the capture's preconditions in `capture::pg::table_info`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::config::{Config, JobConfig, SnapshotConfig, StoreConfig};
use crate::kafka::admin::{client_config, ErrorCapture};

/// How long one check may take: a broker or a server that does not answer within it is
/// unreachable.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// One check's outcome, as printed.
pub struct Check {
    pub job: String,
    pub what: String,
    pub took: Duration,
    /// What was found, or why it fails.
    pub outcome: Result<String, String>,
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (mark, text) = match &self.outcome {
            Ok(t) => ("ok  ", t),
            Err(e) => ("FAIL", e),
        };
        write!(
            f,
            "{mark} {:>6.2}s  job {}: {}: {text}",
            self.took.as_secs_f64(),
            self.job,
            self.what
        )
    }
}

/// Runs every check of every job of `config`, printing each line as it completes; the checks.
pub fn run(config: &Config, mut each: impl FnMut(&Check)) -> Vec<Check> {
    let mut out = Vec::new();
    let captured = super::job::captured_tables(config);
    for job in &config.jobs {
        let mut check = |what: String, f: &mut dyn FnMut() -> Result<String>| {
            let started = Instant::now();
            let outcome = f().map_err(|e| crate::error::line(&e));
            let c = Check {
                job: job.name.clone(),
                what,
                took: started.elapsed(),
                outcome,
            };
            each(&c);
            out.push(c);
        };
        let bootstrap = job
            .kafka
            .get("bootstrap.servers")
            .cloned()
            .unwrap_or_default();
        check(
            format!("kafka {bootstrap}, topic {}", job.topic),
            &mut || kafka_topic(job),
        );
        if let Some(group) = job.kafka.get("group.id") {
            check(format!("consumer group {group}"), &mut || {
                consumer_group(&job.kafka, group)
            });
        }
        check(format!("store ({})", job.store.describe()), &mut || {
            store(job)
        });
        check("snapshot".to_string(), &mut || snapshot(job, &captured));
        if let Some(capture) = &job.capture {
            check(
                format!(
                    "capture source {}",
                    crate::pg_tls::redact_url(capture.source_url.expose())
                ),
                &mut || capture_source(job),
            );
        }
    }
    out
}

/// How long `run` waits at start for a job's brokers and store to answer before it gives up.
pub const START_WITHIN: Duration = Duration::from_secs(10);

/// A part `run` could not reach at start (exit code 4, `service::exit`).
#[derive(Debug, thiserror::Error)]
#[error("job {job}: {part} {}: {cause} (kafka-backfill doctor --config … checks every part)",
    if *.permanent { "refused the connection".to_string() } else { format!("did not answer within {}s", START_WITHIN.as_secs()) })]
pub struct Unreachable {
    pub job: String,
    /// `kafka <bootstrap.servers>` or `store (<description>)`.
    pub part: String,
    pub cause: String,
    /// Refused for a reason waiting cannot cure (credentials, certificates): exit code 1, not 4.
    pub permanent: bool,
}

/// One part's reachability probe: the cause of a failure, and whether retrying cannot cure it.
type Reach<'a> = Box<dyn Fn() -> Result<(), (String, bool)> + 'a>;

/// What `run` checks before it starts a job: its brokers answer and its PostgreSQL store accepts a
/// connection, each attempt bounded by [`TIMEOUT`], retried (said once in the log) until
/// [`START_WITHIN`]; a refusal retrying cannot cure (credentials, certificates) ends it at once. An
/// unreachable part is then one clear line within seconds, where the loops' own retries would
/// spend their whole deadlines in silence or in repeated client warnings.
pub fn wait_reachable(job: &JobConfig) -> Result<(), Unreachable> {
    let bootstrap = job
        .kafka
        .get("bootstrap.servers")
        .cloned()
        .unwrap_or_default();
    // One client for every attempt: the errors librdkafka reported (a refused password) are its
    // context's, served by polling it.
    let client = metadata_client(&job.kafka).map_err(|e| Unreachable {
        job: job.name.clone(),
        part: format!("kafka {bootstrap}"),
        cause: crate::error::line(&e),
        permanent: true,
    })?;
    let mut parts: Vec<(String, Reach)> = vec![(
        format!("kafka {bootstrap}"),
        Box::new(|| {
            client
                .fetch_metadata(Some(&job.topic), TIMEOUT)
                .map(|_| ())
                .map_err(|e| {
                    let _ = client.poll(Duration::from_millis(100));
                    (kafka_cause(&client, e), client.context().permanent())
                })
        }),
    )];
    if let StoreConfig::Postgres { url, .. } = &job.store {
        parts.push((
            format!("store ({})", job.store.describe()),
            Box::new(move || {
                crate::pg_tls::connect(&bounded(url.expose()))
                    .map(|_| ())
                    .map_err(|e| (e.message, e.permanent))
            }),
        ));
    }
    let started = Instant::now();
    for (part, reach) in parts {
        let mut said = false;
        loop {
            match reach() {
                Ok(()) => break,
                Err((cause, permanent)) => {
                    if permanent || started.elapsed() + Duration::from_millis(500) >= START_WITHIN {
                        return Err(Unreachable {
                            job: job.name.clone(),
                            part,
                            cause,
                            permanent,
                        });
                    }
                    if !said {
                        tracing::warn!(job = %job.name, %part, %cause,
                            "does not answer; retrying for up to {} s", START_WITHIN.as_secs());
                        said = true;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            }
        }
    }
    Ok(())
}

/// A metadata client that gives up after [`TIMEOUT`].
fn metadata_client(props: &BTreeMap<String, String>) -> Result<BaseConsumer<ErrorCapture>> {
    client_config(props)
        .create_with_context(ErrorCapture::default())
        .context("creating a Kafka client")
}

/// The broker's cause when it reported one (refused connection, authentication), else librdkafka's.
fn kafka_cause(client: &BaseConsumer<ErrorCapture>, e: rdkafka::error::KafkaError) -> String {
    client.context().last().unwrap_or_else(|| e.to_string())
}

fn kafka_topic(job: &JobConfig) -> Result<String> {
    let client = metadata_client(&job.kafka)?;
    let md = client
        .fetch_metadata(Some(&job.topic), TIMEOUT)
        .map_err(|e| {
            // The client's error callbacks (a refused password) are served by polling it.
            let _ = client.poll(Duration::from_millis(100));
            anyhow::anyhow!("{}; check bootstrap.servers, security.protocol, the SASL credentials and ssl.ca.location", kafka_cause(&client, e))
        })?;
    let brokers = md.brokers().len();
    let Some(t) = md
        .topics()
        .iter()
        .find(|t| t.name() == job.topic && t.error().is_none() && !t.partitions().is_empty())
    else {
        if job.capture.is_some() {
            return Ok(format!(
                "{brokers} broker(s); the topic does not exist yet: the capture creates it"
            ));
        }
        bail!(
            "{brokers} broker(s) answered, but topic {} does not exist (a misspelt name, or not created yet)",
            job.topic
        );
    };
    let partitions = t.partitions().len();
    // Every partition needs a vnode of its own (`PartitionMap::new`, which `run` applies).
    crate::core::PartitionMap::new(job.vnode_count, partitions as u32).map_err(|e| {
        anyhow::anyhow!(
            "topic {} has {partitions} partition(s), but the job's vnode_count is {}: {e}",
            job.topic,
            job.vnode_count
        )
    })?;
    Ok(format!(
        "{brokers} broker(s), {partitions} partition(s) for {} vnodes",
        job.vnode_count
    ))
}

fn consumer_group(props: &BTreeMap<String, String>, group: &str) -> Result<String> {
    let client = metadata_client(props)?;
    let groups = client
        .fetch_group_list(Some(group), TIMEOUT)
        .map_err(|e| anyhow::anyhow!("{}", kafka_cause(&client, e)))?;
    Ok(match groups.groups().iter().find(|g| g.name() == group) {
        Some(g) if !g.members().is_empty() => {
            format!("{}, {} member(s)", g.state(), g.members().len())
        }
        Some(g) if !g.state().is_empty() && g.state() != "Dead" => {
            format!("{}, no member", g.state())
        }
        _ => "not created yet (the first worker creates it)".to_string(),
    })
}

/// `url` with a connect timeout of [`TIMEOUT`] unless it names one.
fn bounded(url: &str) -> String {
    if url.contains("connect_timeout=") {
        return url.to_string();
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}connect_timeout={}", TIMEOUT.as_secs())
}

fn store(job: &JobConfig) -> Result<String> {
    match &job.store {
        StoreConfig::Sqlite { path, .. } => {
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            if path.exists() {
                let meta = std::fs::metadata(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                if meta.permissions().readonly() {
                    bail!("{} is read-only", path.display());
                }
                return Ok(format!("{} exists and is writable", path.display()));
            }
            let mut d = dir;
            while !d.exists() {
                d = d.parent().unwrap_or(Path::new("."));
            }
            let probe = d.join(format!(".kb-doctor-{}", std::process::id()));
            std::fs::write(&probe, b"").with_context(|| {
                format!(
                    "{} cannot be created: {} is not writable",
                    path.display(),
                    d.display()
                )
            })?;
            std::fs::remove_file(&probe)
                .with_context(|| format!("removing {}", probe.display()))?;
            Ok(format!(
                "{} will be created (its folder is writable)",
                path.display()
            ))
        }
        StoreConfig::Postgres { url, .. } => {
            let mut client = crate::pg_tls::connect(&bounded(url.expose()))?;
            let row = client.query_one(
                "SELECT current_user::text, has_schema_privilege(current_schema(), 'CREATE'), to_regclass('kb_jobs') IS NOT NULL",
                &[],
            )?;
            let (user, can_create, has_jobs): (String, bool, bool) =
                (row.get(0), row.get(1), row.get(2));
            let mut owners = Vec::new();
            if has_jobs {
                for table in job.store.table_names() {
                    let rows = client.query(
                        "SELECT job FROM kb_jobs WHERE table_name = $1 AND job <> $2",
                        &[&table, &job.name],
                    )?;
                    owners.extend(rows.iter().map(|r| (table, r.get::<_, String>(0))));
                }
            }
            if let Some((table, other)) = owners.first() {
                bail!("table {table} belongs to job {other} in this store; a table belongs to one job (name another table, or remove job {other}'s rows from kb_jobs)");
            }
            if !can_create && !has_jobs {
                bail!("user {user} cannot create tables in the current schema (GRANT CREATE ON SCHEMA … TO {user})");
            }
            Ok(format!("connected as {user}"))
        }
    }
}

fn snapshot(job: &JobConfig, captured: &super::job::CapturedTables) -> Result<String> {
    match &job.snapshot {
        SnapshotConfig::Files { dir, table } => {
            let manifest = dir.join("manifest.json");
            // A table that joined (or joins) the capture after the snapshots published so far:
            // `run` waits for the one the capture takes.
            if let Some(added) = super::job::AddedTable::of(job, false)? {
                if let Some(joined) = added.pending(captured)? {
                    return Ok(format!(
                        "table {} is in no published snapshot yet: {}; run waits for the snapshot its capture takes",
                        table.as_deref().unwrap_or_default(),
                        joined.map_or("its capture lists it".to_string(), |f| format!(
                            "it joined its capture's log at epoch {f}"
                        ))
                    ));
                }
            }
            if manifest.exists() {
                return match super::job::check_snapshot_files(job)? {
                    None => Ok(format!("{} read and matches the job", manifest.display())),
                    Some(note) => Ok(note),
                };
            }
            if job.capture.is_some() {
                return Ok(format!(
                    "{} not published yet: the capture writes it (run waits for it)",
                    manifest.display()
                ));
            }
            if !dir.exists() {
                bail!("the folder {} does not exist", dir.display());
            }
            bail!(
                "{} does not exist: write the snapshot first (kafka-backfill produce, or your producer)",
                manifest.display()
            )
        }
        SnapshotConfig::Postgres { url, name } => {
            let mut client = crate::pg_tls::connect(&bounded(url.expose()))?;
            let found = client
                .query_opt("SELECT 1 FROM kb_snapshots WHERE name = $1", &[&name])
                .map_err(|e| anyhow::anyhow!("reading kb_snapshots: {e}"))?;
            match found {
                Some(_) => Ok(format!("snapshot {name} found")),
                None => bail!("no snapshot named {name} in kb_snapshots (kafka-backfill export-snapshot writes it)"),
            }
        }
    }
}

fn capture_source(job: &JobConfig) -> Result<String> {
    let capture = job.capture.as_ref().expect("a capture section");
    let mut client = crate::capture::pg::connect(&bounded(capture.source_url.expose()))?;
    let tables = capture
        .table_names()
        .map_err(|(key, why)| anyhow::anyhow!("capture.{key}: {why}"))?;
    for t in &tables {
        crate::capture::pg::table_info(&mut client, t)?;
    }
    // A publication named in the configuration must publish every table (the capture refuses to
    // start otherwise); the capture's own gains a table added to `tables` itself.
    if let Some(publication) = &capture.publication {
        let lacking = crate::capture::pg::unpublished(&mut client, publication, &tables)?;
        if let Some(t) = lacking.unwrap_or_default().first() {
            bail!("{}", crate::capture::pg::unpublished_fix(publication, t));
        }
    }
    let row = client.query_one(
        "SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user",
        &[],
    )?;
    if !row.get::<_, bool>(0) {
        bail!(
            "the source user has neither REPLICATION nor SUPERUSER: ALTER ROLE … WITH REPLICATION"
        );
    }
    let slot = capture.slot_name(&job.name);
    let has_slot = client
        .query_opt(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )?
        .is_some();
    Ok(format!(
        "wal_level logical, {} table(s) keyed with REPLICA IDENTITY FULL, replication allowed, slot {slot} {}",
        tables.len(),
        if has_slot { "exists" } else { "not created yet" }
    ))
}
