//! The checks before a run: `check-config` (the file), `check-log` (the log against the contract),
//! `doctor` (every part reached).

use super::*;
use kafka_backfill::service::job;

/// `check-config`'s flags.
#[derive(clap::Args)]
pub struct CheckConfigArgs {
    /// The configuration file (also accepted as `--config FILE`, like every other command).
    #[arg(required_unless_present = "config", conflicts_with = "config")]
    pub file: Option<PathBuf>,
    /// The configuration file.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// `check-config`: what `run` would refuse before it reaches anything.
pub fn check_config(args: CheckConfigArgs) -> Result<ExitCode> {
    let CheckConfigArgs { file, config } = args;
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
                eprintln!(
                    "error: invalid configuration: {}",
                    kafka_backfill::error::line(&e)
                );
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

/// `check-log`'s flags.
#[derive(clap::Args)]
pub struct CheckLogArgs {
    /// The configuration file.
    #[arg(long, short)]
    pub config: PathBuf,
    /// Job name (default: the only job).
    #[arg(long)]
    pub job: Option<String>,
    /// Violations listed at most (all are counted).
    #[arg(long, default_value_t = 100)]
    pub max_report: usize,
    /// Print the report as one JSON object instead.
    #[arg(long)]
    pub json: bool,
}

/// `check-log`: a job's snapshot and log against the wire contract.
pub fn check_log(args: CheckLogArgs) -> Result<ExitCode> {
    let CheckLogArgs {
        config,
        job,
        max_report,
        json,
    } = args;
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

/// `doctor`'s flags.
#[derive(clap::Args)]
pub struct DoctorArgs {
    /// The configuration file.
    #[arg(long, short = 'c')]
    pub config: PathBuf,
    /// Print the checks as one JSON array instead (job, check, seconds, ok, found or why not).
    #[arg(long)]
    pub json: bool,
}

/// `doctor`: every part the configuration names, reached.
pub fn doctor(args: DoctorArgs) -> Result<ExitCode> {
    let DoctorArgs { config: file, json } = args;
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
