//! The `kafka-backfill` command line: `run`, `produce`, `verify`, `status`, `check-config`, `demo`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use kafka_backfill::config::{Config, LogFormat, SnapshotConfig};
use kafka_backfill::service::exit::Exit;
use kafka_backfill::service::job::{self, RunOptions};
use kafka_backfill::service::process;
use kafka_backfill::workload::{self, Workload};

#[derive(Parser)]
#[command(
    name = "kafka-backfill",
    version,
    about = "Backfill a table from a snapshot plus a Kafka change log, then keep it streaming.",
    after_help = Exit::help()
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// A job on a running service's write endpoint (`rate-limit`, `pause`, `resume`).
#[derive(clap::Args)]
struct AdminTarget {
    /// The service's configuration: the endpoint (`http.admin_listen`), the token
    /// (`http.admin_token`) and, when it has one job, the job are read from it.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// The service's write endpoint (default: the config's `http.admin_listen`, else
    /// http://127.0.0.1:9465).
    #[arg(long)]
    url: Option<String>,
    /// The job's name (default: the config's only job).
    #[arg(long)]
    job: Option<String>,
    /// The write endpoint's bearer token (default: the config's `http.admin_token`, else the
    /// environment's KAFKA_BACKFILL_ADMIN_TOKEN).
    #[arg(long)]
    token: Option<String>,
}

/// `listen` (an `address:port` a server binds) as a URL a client on this machine reaches.
fn local_url(listen: &str) -> String {
    let reach = match listen.rsplit_once(':') {
        Some(("0.0.0.0" | "[::]" | "", port)) => format!("127.0.0.1:{port}"),
        _ => listen.to_string(),
    };
    format!("http://{reach}")
}

impl AdminTarget {
    /// The endpoint, token and job, from the flags, then the config, then the defaults.
    fn resolve(&self) -> Result<(String, Option<String>, String)> {
        let config =
            match &self.config {
                Some(path) => Some(Config::load(path).map_err(|e| {
                    anyhow::anyhow!("{}: invalid configuration: {e}", path.display())
                })?),
                None => None,
            };
        let url = match (&self.url, &config) {
            (Some(u), _) => u.clone(),
            (None, Some(c)) => {
                anyhow::ensure!(
                    c.http.admin,
                    "{}: http.admin is false, so the service has no write endpoint; set [http] admin = true and restart it",
                    self.config.as_ref().expect("a config").display()
                );
                local_url(&c.http.admin_listen)
            }
            (None, None) => "http://127.0.0.1:9465".to_string(),
        };
        let token = self
            .token
            .clone()
            .or_else(|| {
                config
                    .as_ref()
                    .and_then(|c| c.http.admin_token.as_ref())
                    .map(|t| t.expose().to_string())
            })
            .or_else(|| std::env::var("KAFKA_BACKFILL_ADMIN_TOKEN").ok());
        let job = match (&self.job, &config) {
            (Some(j), _) => j.clone(),
            (None, Some(c)) if c.jobs.len() == 1 => c.jobs[0].name.clone(),
            (None, Some(c)) => anyhow::bail!(
                "the configuration has {} jobs ({}): name one with --job",
                c.jobs.len(),
                c.jobs
                    .iter()
                    .map(|j| j.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            (None, None) => anyhow::bail!("name the job with --job (or give --config)"),
        };
        Ok((url, token, job))
    }

    /// One request to `/admin/jobs/{job}/{what}`; the body when it answers 200.
    fn call(&self, method: &str, what: &str) -> Result<String> {
        let (url, token, job) = self.resolve()?;
        let target = format!("{}/admin/jobs/{job}/{what}", url.trim_end_matches('/'));
        let (code, body) =
            kafka_backfill::service::http::request_with(method, &target, token.as_deref())?;
        anyhow::ensure!(code == 200, "{target} answered {code}: {}", body.trim());
        Ok(body)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run the configured jobs until SIGTERM/SIGINT (a second signal exits at once).
    Run {
        /// The configuration file (TOML; docs/OPERATIONS.md "Configuration reference").
        #[arg(long, short)]
        config: PathBuf,
        /// Exit 0 once every vnode of every job has caught up (read from the store, so a process
        /// that owns part of a job waits for the rest); exit 3 if the rest makes no progress for
        /// --job-wait-secs.
        #[arg(long)]
        exit_when_caught_up: bool,
        /// With --exit-when-caught-up: seconds to wait for progress of the job's other vnodes.
        #[arg(long, default_value_t = 60)]
        job_wait_secs: u64,
        /// Prefix of this process's worker names (default: <hostname>-p<pid>). Given, it is also
        /// each worker's static group membership (`group.instance.id` = <prefix>-<index>), so a
        /// restart under the same prefix gets its partitions back without a rebalance; a
        /// `group.instance.id` in [jobs.kafka] wins ("" turns static membership off).
        #[arg(long)]
        worker_prefix: Option<String>,
        /// Also run the capture of every job with a [jobs.capture] in this process (the embedded
        /// and demo case; docs/CAPTURE.md): a job starts once its capture published the snapshot,
        /// and the captures stop at a checkpoint when the jobs do.
        #[arg(long)]
        capture: bool,
    },
    /// Write a generated table: snapshot files at the snapshot epoch Es, then changes and barriers
    /// into the topic, then the table expected at the last checkpoint (for `verify`).
    Produce {
        /// Write the log a job of this configuration reads: its topic, vnode_count, brokers and
        /// security settings ([jobs.kafka], consumer-only keys left out) replace --topic,
        /// --vnodes, --bootstrap and -X.
        #[arg(long, short, conflicts_with_all = ["bootstrap", "topic", "vnodes", "properties"])]
        config: Option<PathBuf>,
        /// With --config: the job (default: the only job).
        #[arg(long, requires = "config")]
        job: Option<String>,
        /// Kafka bootstrap servers.
        #[arg(long, default_value = "127.0.0.1:19092")]
        bootstrap: String,
        /// The log topic (created with --partitions when absent).
        #[arg(long, default_value = "accounts-log")]
        topic: String,
        /// Partitions of the topic.
        #[arg(long, default_value_t = 4)]
        partitions: u32,
        /// Vnodes of the table (the job's vnode_count).
        #[arg(long, default_value_t = 256)]
        vnodes: u32,
        /// Rows in the snapshot.
        #[arg(long, default_value_t = 10_000)]
        rows: u64,
        /// Ids come from 0..key-space (default: 2 × rows).
        #[arg(long)]
        key_space: Option<u64>,
        /// Changes after the snapshot.
        #[arg(long, default_value_t = 50_000)]
        changes: u64,
        /// Changes per epoch (between two barriers).
        #[arg(long, default_value_t = 500)]
        epoch_changes: u64,
        /// Every n-th barrier is a checkpoint (the last one always is).
        #[arg(long, default_value_t = 4)]
        checkpoint_every: u64,
        /// Percent of changes to existing rows that are updates (the rest delete).
        #[arg(long, default_value_t = 70)]
        update_percent: u64,
        /// Approximate size of a row in bytes.
        #[arg(long, default_value_t = 100)]
        row_size: usize,
        /// Changes per second (0 = as fast as possible).
        #[arg(long, default_value_t = 0)]
        rate: u64,
        /// Folder for snapshot/ and expected/.
        #[arg(long, default_value = ".run/demo")]
        out: PathBuf,
        /// Seed of the generator (the same seed writes the same table and log).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Continue the log written earlier into --out (same topic): more changes, no new snapshot.
        #[arg(long)]
        append: bool,
        /// The table to generate: `accounts` (schemas/example_row.avsc) or `typed`
        /// (schemas/typed_row.avsc: every Avro type, primary key [region, id]).
        #[arg(long, value_enum, default_value_t)]
        table: kafka_backfill::workload::TableKind,
        /// Tables in the one log (docs/WIRE.md, "Several tables"): with more than one, tables
        /// `<table>_1` … `<table>_N` of the --table shape share the topic, the barriers and the
        /// epochs, each change of one drawn at random; the snapshot and expected folders hold a
        /// several-table manifest (a job names its table with `snapshot.table`).
        #[arg(long, default_value_t = 1)]
        tables: u32,
        /// A librdkafka property for every client, e.g. -X security.protocol=SASL_SSL (repeatable;
        /// a value may be ${ENV}).
        #[arg(short = 'X', long = "property", value_name = "KEY=VALUE")]
        properties: Vec<String>,
        /// Write with a transactional producer: a transaction per checkpoint, and some aborted
        /// transactions of deletes that must never be applied.
        #[arg(long)]
        transactional: bool,
        /// How the snapshot's rows are laid out in files: one file per vnode in key order, or one
        /// file of every vnode in random order (as a data-lake export usually is).
        #[arg(long, value_enum, default_value_t)]
        snapshot_layout: kafka_backfill::workload::SnapshotLayout,
        /// Change the row schema three times during the log, each at a checkpoint barrier (add
        /// two columns, widen one to a long, drop one: docs/WIRE.md "Schema changes"); the
        /// versions go to `<out>/snapshot/schema_versions/`.
        #[arg(long)]
        evolve: bool,
        /// With --evolve: hold the first schema change until this file exists (tests start a job
        /// on the snapshot first).
        #[arg(long, value_name = "FILE", requires = "evolve")]
        evolve_gate: Option<PathBuf>,
    },
    /// Check a job's snapshot and log topic against the wire contract without materialising
    /// anything: every violation is listed; exit 1 if there is any.
    CheckLog {
        /// The configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// Job name (default: the only job).
        #[arg(long)]
        job: Option<String>,
        /// Violations listed at most (all are counted).
        #[arg(long, default_value_t = 100)]
        max_report: usize,
        /// Print the report as one JSON object instead.
        #[arg(long)]
        json: bool,
    },
    /// Compare a job's materialised table with the writer's expected table.
    Verify {
        /// The configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// Job name (default: the only job).
        #[arg(long)]
        job: Option<String>,
        /// The writer's expected/ folder.
        #[arg(long, required_unless_present = "against_source")]
        expected: Option<PathBuf>,
        /// Compare with the job's captured PostgreSQL table as it is now ([jobs.capture]; the
        /// source quiet and the job caught up) instead of an expected/ folder.
        #[arg(long, conflicts_with = "expected")]
        against_source: bool,
        /// While the replica differs, compare again every second for up to this long (a job still
        /// catching up after its source or writer stopped); 0 compares once.
        #[arg(long, default_value_t = 0)]
        within_secs: u64,
        /// Print the report as one JSON object instead (per table for a job of several).
        #[arg(long)]
        json: bool,
    },
    /// Capture a PostgreSQL table into a job's snapshot and log topic ([jobs.capture];
    /// docs/CAPTURE.md): exactly once, until SIGTERM/SIGINT (stops at a checkpoint).
    Capture {
        /// The configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// Job name (default: the only job).
        #[arg(long)]
        job: Option<String>,
    },
    /// Ask a job's running capture for a new snapshot at a barrier of the live log
    /// (docs/CAPTURE.md "Snapshots of a running capture"), and wait until it is published: prints
    /// its epoch, folder and start offsets. The request is a record on the capture's state topic.
    Snapshot {
        /// The configuration file.
        #[arg(long, short)]
        config: PathBuf,
        /// Job name (default: the only job).
        #[arg(long)]
        job: Option<String>,
        /// How long to wait for the snapshot to be published (0: ask and return).
        #[arg(long, default_value_t = 600)]
        within_secs: u64,
    },
    /// Copy a file snapshot (a folder with manifest.json) into PostgreSQL, as a snapshot source.
    ExportSnapshot {
        /// The folder holding manifest.json.
        #[arg(long)]
        from: PathBuf,
        /// postgresql://user:password@host:port/database
        #[arg(long)]
        to_postgres: String,
        /// The snapshot's name in kb_snapshots (what `[jobs.snapshot] name` refers to).
        #[arg(long)]
        name: String,
        /// The table that receives the rows.
        #[arg(long)]
        table: String,
    },
    /// Validate a configuration file without running it: everything `run` would refuse before it
    /// reaches a broker or a store (reachability is `doctor`'s).
    CheckConfig {
        /// The configuration file (also accepted as `--config FILE`, like every other command).
        #[arg(required_unless_present = "config", conflicts_with = "config")]
        file: Option<PathBuf>,
        /// The configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Reach every part the configuration names — brokers and topic, consumer group, state store,
    /// snapshot, capture source — one line per check with its time; each check gives up after 5 s.
    /// Exit 0 when every check passes, 1 when one fails, 2 for a configuration that does not load.
    Doctor {
        /// The configuration file.
        #[arg(long, short = 'c')]
        config: PathBuf,
        /// Print the checks as one JSON array instead (job, check, seconds, ok, found or why not).
        #[arg(long)]
        json: bool,
    },
    /// Run the whole job on embedded defaults: an in-process mock Kafka, a generated snapshot and log,
    /// a SQLite store, live progress, then verify.
    Demo {
        /// Add a second worker during the log-store phase: see the invariant error and the recreation.
        #[arg(long)]
        rescale: bool,
        /// Folder for the snapshot, the expected table and the SQLite store (apart from the
        /// walk-through's `.run/demo`, whose store would otherwise hold the demo's job).
        #[arg(long, default_value = ".run/embedded")]
        dir: PathBuf,
        /// Partitions of the demo topic.
        #[arg(long, default_value_t = 4)]
        partitions: u32,
        /// Rows in the snapshot.
        #[arg(long, default_value_t = 20_000)]
        rows: u64,
        /// Changes after the snapshot.
        #[arg(long, default_value_t = 60_000)]
        changes: u64,
        /// At most this many snapshot rows per second and, separately, log records per second, per
        /// worker (0 = unlimited).
        #[arg(long, default_value_t = 20_000)]
        throttle: u64,
    },
    /// Read or set a running job's live rate limits (per worker per second; 0 = none), through the
    /// service's write endpoint (`http.admin = true`); every worker applies them within a second
    /// and they are kept in the store across restarts. Without --snapshot and --log: read them.
    RateLimit {
        #[command(flatten)]
        target: AdminTarget,
        /// Snapshot rows per second.
        #[arg(long)]
        snapshot: Option<u64>,
        /// Log records per second.
        #[arg(long)]
        log: Option<u64>,
    },
    /// Pause a running job: every worker of every process stops fetching and scanning within a
    /// second and stays in its group (no rebalance); kept in the store across restarts until
    /// `resume`. What is staged is committed at the next checkpoint it completes.
    Pause(AdminTarget),
    /// Resume a paused job.
    Resume(AdminTarget),
    /// Print a running service's /status for a person (or --json, or --watch it live).
    Status {
        /// The service's configuration: the endpoint is its `http.listen`.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// The service's read-only endpoint (default: the config's `http.listen`, else
        /// http://127.0.0.1:9464).
        #[arg(long, conflicts_with = "config")]
        url: Option<String>,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
        /// Keep watching: a progress bar per job and phase with lag, epoch lag, rate and ETA (plain
        /// lines when stdout is not a terminal), refreshed every --interval-ms.
        #[arg(long, conflicts_with = "json")]
        watch: bool,
        /// With --watch: refresh period.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// With --watch: exit 0 once every job has caught up.
        #[arg(long, requires = "watch")]
        until_caught_up: bool,
    },
}

fn init_logs(format: LogFormat, level: Option<&str>) {
    // pg_walstream reports every standby status update at info: kept to warnings unless asked for.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        let level = level.unwrap_or("info");
        let quiet = if level.contains("pg_walstream") {
            ""
        } else {
            ",pg_walstream=warn"
        };
        tracing_subscriber::EnvFilter::new(format!("{level}{quiet}"))
    });
    // Colour only for a person at a terminal: no escape codes in files, pipes and log collectors.
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => b
            .event_format(kafka_backfill::service::json_log::JsonLines)
            .init(),
        LogFormat::Text => b.init(),
    }
}

/// `status`'s endpoint: `--url`, else the config's `http.listen`, else the default.
fn status_url(url: Option<String>, config: Option<&std::path::Path>) -> Result<String> {
    Ok(match (url, config) {
        (Some(u), _) => u,
        (None, Some(path)) => {
            let c = Config::load(path)
                .map_err(|e| anyhow::anyhow!("{}: invalid configuration: {e}", path.display()))?;
            anyhow::ensure!(
                !c.http.listen.is_empty(),
                "{}: http.listen is empty, so the service serves no /status",
                path.display()
            );
            local_url(&c.http.listen)
        }
        (None, None) => "http://127.0.0.1:9464".to_string(),
    })
}

fn load(path: &std::path::Path) -> Result<Config, ExitCode> {
    Config::load(path).map_err(|e| {
        eprintln!("error: invalid configuration: {e}");
        Exit::Config.into()
    })
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version print to stdout and succeed; a wrong command line is a usage error.
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                Exit::Usage
            } else {
                Exit::Ok
            }
            .into();
        }
    };
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            if unreachable(&e) {
                Exit::Unreachable.into()
            } else {
                Exit::Failed.into()
            }
        }
    }
}

/// The error is a connection that could not be made (the service for `status` and the admin
/// commands): exit code 4, not 1.
fn unreachable(e: &anyhow::Error) -> bool {
    use std::io::ErrorKind::*;
    e.chain().any(|c| {
        c.downcast_ref::<kafka_backfill::service::doctor::Unreachable>()
            .is_some_and(|u| !u.permanent)
            || c.downcast_ref::<std::io::Error>().is_some_and(|io| {
                matches!(
                    io.kind(),
                    ConnectionRefused
                        | TimedOut
                        | HostUnreachable
                        | NetworkUnreachable
                        | AddrNotAvailable
                )
            })
    })
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Demo {
            rescale,
            dir,
            partitions,
            rows,
            changes,
            throttle,
        } => {
            init_logs(
                LogFormat::Text,
                Some("kafka_backfill=info,librdkafka=error"),
            );
            let clean = kafka_backfill::demo::run(&kafka_backfill::demo::DemoOptions {
                dir,
                partitions,
                rows,
                changes,
                throttle,
                rescale,
            })?;
            Ok(if clean {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::ExportSnapshot {
            from,
            to_postgres,
            name,
            table,
        } => {
            let files = kafka_backfill::snapshot::files::SnapshotFiles::open(&from)?;
            let n = kafka_backfill::snapshot::postgres::PostgresSnapshot::export(
                &files,
                &to_postgres,
                &name,
                &table,
            )?;
            println!(
                "exported {n} rows of {} as snapshot {name} (table {table}) to {}",
                from.display(),
                kafka_backfill::pg_tls::redact_url(&to_postgres)
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Pause(target) => {
            print!("{}", target.call("POST", "pause")?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Resume(target) => {
            print!("{}", target.call("POST", "resume")?);
            Ok(ExitCode::SUCCESS)
        }
        Command::RateLimit {
            target,
            snapshot,
            log,
        } => {
            let mut query = Vec::new();
            if let Some(n) = snapshot {
                query.push(format!("snapshot={n}"));
            }
            if let Some(n) = log {
                query.push(format!("log={n}"));
            }
            let body = if query.is_empty() {
                target.call("GET", "rate-limit")?
            } else {
                target.call("POST", &format!("rate-limit?{}", query.join("&")))?
            };
            print!("{body}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Status {
            watch: true,
            url,
            config,
            interval_ms,
            until_caught_up,
            ..
        } => {
            let url = status_url(url, config.as_deref())?;
            kafka_backfill::service::watch::watch(
                &url,
                std::time::Duration::from_millis(interval_ms),
                until_caught_up,
            )?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Status {
            url, config, json, ..
        } => {
            let url = status_url(url, config.as_deref())?;
            let (code, body) = kafka_backfill::service::http::get(&format!(
                "{}/status",
                url.trim_end_matches('/')
            ))?;
            anyhow::ensure!(code == 200, "{url}/status answered {code}");
            if json {
                println!("{body}");
            } else {
                print_status(&serde_json::from_str(&body)?);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Doctor { config: file, json } => {
            let config = match load(&file) {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            let checks = kafka_backfill::service::doctor::run(&config, |c| {
                if !json {
                    println!("{c}")
                }
            });
            let failed = checks.iter().filter(|c| c.outcome.is_err()).count();
            if json {
                let all: Vec<serde_json::Value> = checks
                    .iter()
                    .map(|c| {
                        serde_json::json!({
                            "job": c.job,
                            "check": c.what,
                            "seconds": c.took.as_secs_f64(),
                            "ok": c.outcome.is_ok(),
                            "text": match &c.outcome { Ok(t) | Err(t) => t },
                        })
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(all));
                return Ok(if failed > 0 {
                    Exit::Unreachable
                } else {
                    Exit::Ok
                }
                .into());
            }
            if failed > 0 {
                println!(
                    "{}: {failed} of {} checks failed",
                    file.display(),
                    checks.len()
                );
                return Ok(Exit::Unreachable.into());
            }
            println!("{}: all {} checks passed", file.display(), checks.len());
            Ok(ExitCode::SUCCESS)
        }
        Command::CheckConfig { file, config } => {
            let file = file.or(config).expect("clap requires one");
            let config = match load(&file) {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            for j in &config.jobs {
                println!(
                    "job {}: topic {}, {} worker(s), store {}, kafka {:?}",
                    j.name,
                    j.topic,
                    j.workers,
                    j.store.describe(),
                    j.kafka_redacted()
                );
            }
            for j in &config.jobs {
                match job::check_snapshot_files(j) {
                    Ok(None) => {}
                    Ok(Some(why)) => println!("note: {why}"),
                    Err(e) => {
                        eprintln!("error: invalid configuration: {e:#}");
                        return Ok(Exit::Config.into());
                    }
                }
            }
            for note in config.notes() {
                println!("note: {note}");
            }
            println!(
                "{}: ok (checked: each job's snapshot files when they exist; not checked: whether the brokers, stores and PostgreSQL snapshots are reachable — kafka-backfill doctor checks that)",
                file.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Run {
            config,
            exit_when_caught_up,
            job_wait_secs,
            worker_prefix,
            capture,
        } => {
            let config = match load(&config) {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            init_logs(config.log.format, config.log.level.as_deref());
            let flags = process::RunFlags {
                options: RunOptions {
                    exit_when_caught_up,
                    static_membership: worker_prefix.is_some(),
                    worker_prefix,
                    job_wait: std::time::Duration::from_secs(job_wait_secs),
                },
                capture,
            };
            let grace = std::time::Duration::from_secs(config.shutdown_grace_secs);
            process::run_until_signalled(grace, move |shutdown| {
                process::run(&config, flags, shutdown)
            })
        }
        Command::Produce {
            config,
            job,
            bootstrap,
            topic,
            partitions,
            vnodes,
            rows,
            key_space,
            changes,
            epoch_changes,
            checkpoint_every,
            update_percent,
            row_size,
            rate,
            out,
            seed,
            append,
            table,
            tables,
            properties,
            transactional,
            snapshot_layout,
            evolve,
            evolve_gate,
        } => {
            init_logs(LogFormat::Text, None);
            let (bootstrap, topic, vnodes, kafka_properties) = match &config {
                Some(path) => {
                    let config = match load(path) {
                        Ok(c) => c,
                        Err(code) => return Ok(code),
                    };
                    let j = pick_job(&config, job.as_deref())?;
                    let props = kafka_backfill::kafka::producer_properties(&j.kafka);
                    (
                        j.kafka["bootstrap.servers"].clone(),
                        j.topic.clone(),
                        j.vnode_count,
                        props,
                    )
                }
                None => (
                    bootstrap,
                    topic,
                    vnodes,
                    kafka_backfill::config::parse_properties(&properties)?,
                ),
            };
            let w = Workload {
                bootstrap,
                topic,
                partitions,
                vnode_count: vnodes,
                rows,
                key_space: key_space.unwrap_or(rows.max(1) * 2),
                changes,
                changes_per_epoch: epoch_changes.max(1),
                checkpoint_every: checkpoint_every.max(1),
                update_percent,
                row_size,
                rate,
                out: out.clone(),
                seed,
                progress: true,
                append,
                table,
                tables: tables.max(1),
                kafka_properties,
                transactional,
                snapshot_layout,
                evolve,
                evolve_gate,
            };
            let r = workload::produce(&w)?;
            if append {
                println!("appended {} changes and {} barriers to {}; expected table: {} rows at epoch {} in {}", r.changes, r.barriers, w.topic, r.final_rows, r.final_epoch, out.join("expected").display());
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "wrote {} snapshot rows at epoch {} to {}, then {} changes and {} barriers to {}; expected table: {} rows at epoch {} in {}",
                r.snapshot_rows,
                r.snapshot_epoch,
                out.join("snapshot").display(),
                r.changes,
                r.barriers,
                w.topic,
                r.final_rows,
                r.final_epoch,
                out.join("expected").display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Capture { config, job } => {
            let config = match load(&config) {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            init_logs(config.log.format, config.log.level.as_deref());
            let j = pick_job(&config, job.as_deref())?.clone();
            let grace = std::time::Duration::from_secs(config.shutdown_grace_secs);
            process::run_until_signalled(grace, move |shutdown| {
                process::capture(&config, &j, shutdown)
            })
        }
        Command::Snapshot {
            config,
            job,
            within_secs,
        } => {
            let config = match load(&config) {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            init_logs(LogFormat::Text, Some("warn"));
            let j = pick_job(&config, job.as_deref())?;
            if j.capture.is_none() {
                eprintln!(
                    "job {}: no [jobs.capture] section: only a capture takes snapshots",
                    j.name
                );
                return Ok(Exit::Config.into());
            }
            let within = std::time::Duration::from_secs(within_secs);
            match kafka_backfill::capture::snapshots::request_and_wait(j, within)? {
                Some(s) => {
                    println!(
                        "job {}: snapshot at epoch {} published in {} (start offsets {:?})",
                        j.name, s.snapshot_epoch, s.dir, s.start_offsets
                    );
                    Ok(Exit::Ok.into())
                }
                None if within_secs == 0 => {
                    println!("job {}: snapshot requested", j.name);
                    Ok(Exit::Ok.into())
                }
                None => {
                    eprintln!("job {}: no snapshot answered the request within {within_secs} s (is the capture running? its log says why a snapshot failed)", j.name);
                    Ok(Exit::Stalled.into())
                }
            }
        }
        Command::CheckLog {
            config,
            job,
            max_report,
            json,
        } => {
            let config = match load(&config) {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            init_logs(LogFormat::Text, Some("warn"));
            let j = pick_job(&config, job.as_deref())?;
            let r = kafka_backfill::check_log::check_log(j, max_report)?;
            if json {
                println!("{}", serde_json::json!({ "job": j.name, "report": r }));
                return Ok(if r.violation_count == 0 {
                    Exit::Ok
                } else {
                    Exit::Failed
                }
                .into());
            }
            for v in &r.violations {
                println!("violation: {v}");
            }
            println!(
                "check-log {}: {} snapshot rows, {} log records in {} partitions, {} row-schema versions: {} violations",
                j.name, r.snapshot_rows, r.records, r.partitions, r.schema_versions, r.violation_count
            );
            Ok(if r.violation_count == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Verify {
            config,
            job,
            expected,
            against_source,
            within_secs,
            json,
        } => {
            let config_path = config;
            let config = match load(&config_path) {
                Ok(c) => c,
                Err(code) => return Ok(code),
            };
            let j = pick_job(&config, job.as_deref())?;
            let prepared = job::prepare(j, false)?;
            let mut store = (prepared.open_store)()?;
            if !prepared.store_tables.is_empty() {
                let expected = if against_source {
                    None
                } else {
                    Some(
                        expected
                            .as_deref()
                            .context("verify needs --expected DIR or --against-source")?,
                    )
                };
                let reports = compared_within(
                    within_secs,
                    || {
                        kafka_backfill::verify::verify_several(
                            store.as_mut(),
                            j,
                            &config.jobs,
                            &prepared.store_tables,
                            expected,
                        )
                    },
                    |reports| reports.iter().all(|(_, r)| r.clean()),
                )?;
                let published = store.published_epoch(&j.name)?;
                if json {
                    let tables: serde_json::Map<String, serde_json::Value> = reports
                        .iter()
                        .map(|(t, r)| {
                            (
                                t.to_string(),
                                serde_json::json!({ "report": r, "clean": r.clean() }),
                            )
                        })
                        .collect();
                    println!(
                        "{}",
                        serde_json::json!({ "job": j.name, "tables": tables, "published_epoch": published })
                    );
                }
                for (table, r) in reports.iter().filter(|_| !json) {
                    println!("verify {} table {table}: {r}", j.name);
                }
                if !json {
                    println!(
                        "verify {}: published epoch {}",
                        j.name,
                        published.map_or("none".to_string(), |e| e.to_string())
                    );
                }
                return Ok(if reports.iter().all(|(_, r)| r.clean()) {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                });
            }
            let report = compared_within(
                within_secs,
                || match (&expected, against_source) {
                    (_, true) => kafka_backfill::verify::verify_against_source(
                        store.as_mut(),
                        j,
                        &config.jobs,
                    ),
                    (Some(expected), false) => {
                        let table = match &j.snapshot {
                            SnapshotConfig::Files { table, .. } => table.as_deref(),
                            SnapshotConfig::Postgres { .. } => None,
                        };
                        kafka_backfill::verify::verify_table(
                            store.as_mut(),
                            &j.name,
                            expected,
                            table,
                        )
                    }
                    (None, false) => {
                        anyhow::bail!("verify needs --expected DIR or --against-source")
                    }
                },
                |r| r.clean(),
            )?;
            let letters = store.dead_letters(&j.name)?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "job": j.name,
                        "report": report,
                        "clean": report.clean(),
                        "dead_letters": letters.len(),
                    })
                );
                return Ok(if report.clean() {
                    Exit::Ok
                } else {
                    Exit::Failed
                }
                .into());
            }
            println!("verify {}: {report}", j.name);
            if report.committed_epoch.is_none() {
                // The replica is empty because nothing ran, not because rows were lost.
                println!(
                    "hint: job {} has committed nothing to this store: is `kafka-backfill run` running? (`kafka-backfill status --config {}` shows its workers)",
                    j.name,
                    config_path.display()
                );
            }
            // What was skipped is part of the answer: a dead-lettered record's change is in
            // neither the store nor (it never decoded) the comparison.
            if !letters.is_empty() {
                println!(
                    "dead letters: {} recorded (kb_dead_letters; the records are on the dead-letter topic):",
                    letters.len()
                );
                for d in letters.iter().take(20) {
                    println!(
                        "  partition {} offset {} (epoch {}, generation {}): {}",
                        d.partition, d.offset, d.epoch, d.generation, d.reason
                    );
                }
                if letters.len() > 20 {
                    println!("  … and {} more", letters.len() - 20);
                }
            }
            if let kafka_backfill::config::StoreConfig::Sqlite { path, table, .. } = &j.store {
                println!(
                    "materialised table: sqlite3 {} 'SELECT * FROM {table} LIMIT 10'",
                    path.display()
                );
            }
            Ok(if report.clean() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

/// `verify`'s comparison, run again every second while `clean` says it differs, up to
/// `within_secs` (a replica still catching up after its source stopped): the last result.
fn compared_within<T>(
    within_secs: u64,
    mut compare: impl FnMut() -> Result<T>,
    clean: impl Fn(&T) -> bool,
) -> Result<T> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(within_secs);
    loop {
        let result = compare()?;
        if clean(&result) || std::time::Instant::now() >= deadline {
            return Ok(result);
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// The job named `name`, or the first one.
fn pick_job<'a>(
    config: &'a Config,
    name: Option<&str>,
) -> Result<&'a kafka_backfill::config::JobConfig> {
    match name {
        Some(name) => config
            .jobs
            .iter()
            .find(|j| j.name == name)
            .with_context(|| format!("no job {name} in the configuration")),
        None => Ok(config.jobs.first().expect("validated: at least one job")),
    }
}

/// `/status` for a person: tables of workers and partitions (`service::status_table`).
fn print_status(v: &serde_json::Value) {
    print!("{}", kafka_backfill::service::status_table::render(v));
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// What a new user reads: every subcommand and every flag says what it is.
    #[test]
    fn every_subcommand_and_flag_is_described() {
        let cli = Cli::command();
        let mut undescribed = Vec::new();
        for sub in cli.get_subcommands() {
            if sub.get_about().is_none() {
                undescribed.push(sub.get_name().to_string());
            }
            for arg in sub.get_arguments() {
                if arg.get_id() != "help" && arg.get_help().is_none() {
                    undescribed.push(format!("{} --{}", sub.get_name(), arg.get_id()));
                }
            }
        }
        assert!(undescribed.is_empty(), "no help text: {undescribed:?}");
    }
}
