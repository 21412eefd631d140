//! `verify`: a job's materialised table compared with the expected table or with its source.

use super::*;
use kafka_backfill::config::SnapshotConfig;
use kafka_backfill::service::job;
use std::time::Instant;

/// `verify`'s flags.
#[derive(clap::Args)]
pub struct VerifyArgs {
    /// The configuration file.
    #[arg(long, short)]
    pub config: PathBuf,
    /// Job name (default: the only job).
    #[arg(long)]
    pub job: Option<String>,
    /// The writer's expected/ folder.
    #[arg(long, required_unless_present = "against_source")]
    pub expected: Option<PathBuf>,
    /// Compare with the job's captured table (PostgreSQL or MariaDB) as it is now
    /// ([jobs.capture]; the source quiet and the job caught up) instead of an expected/ folder.
    #[arg(long, conflicts_with = "expected")]
    pub against_source: bool,
    /// While the replica differs, compare again every second for up to this long (a job still
    /// catching up after its source or writer stopped; a captured job whose capture has not
    /// published its snapshot yet is waited for within the same time); 0 compares once.
    #[arg(long, default_value_t = 0)]
    pub within_secs: u64,
    /// Print the report as one JSON object instead (per table for a job of several).
    #[arg(long)]
    pub json: bool,
}

/// `verify`: a job's replica against the expected table or its source.
pub fn verify(args: VerifyArgs) -> Result<ExitCode> {
    let VerifyArgs {
        config,
        job,
        expected,
        against_source,
        within_secs,
        json,
    } = args;
    let config_path = config;
    let config = match load(&config_path) {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    let j = pick_job(&config, job.as_deref())?;
    let deadline = Instant::now() + std::time::Duration::from_secs(within_secs);
    wait_for_capture(j, deadline)?;
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
            deadline,
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
        deadline,
        || match (&expected, against_source) {
            (_, true) => {
                kafka_backfill::verify::verify_against_source(store.as_mut(), j, &config.jobs)
            }
            (Some(expected), false) => {
                let table = match &j.snapshot {
                    SnapshotConfig::Files { table, .. } => table.as_deref(),
                    SnapshotConfig::Postgres { .. } => None,
                };
                kafka_backfill::verify::verify_table(store.as_mut(), &j.name, expected, table)
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

/// A captured job whose capture has not published its snapshot yet (still copying): waits until
/// it is published or `deadline` passes, then `prepare` says what is missing.
fn wait_for_capture(j: &kafka_backfill::config::JobConfig, deadline: Instant) -> Result<()> {
    if job::snapshot_published(j)? || Instant::now() >= deadline {
        return Ok(());
    }
    eprintln!(
        "verify {}: waiting for its capture to publish its snapshot",
        j.name
    );
    while !job::snapshot_published(j)? && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    Ok(())
}

/// `verify`'s comparison, run again every second while `clean` says it differs, until `deadline`
/// (`--within-secs` from verify's start, shared with the wait for the snapshot: a replica still
/// catching up after its source stopped): the last result.
fn compared_within<T>(
    deadline: Instant,
    mut compare: impl FnMut() -> Result<T>,
    clean: impl Fn(&T) -> bool,
) -> Result<T> {
    loop {
        let result = compare()?;
        if clean(&result) || Instant::now() >= deadline {
            return Ok(result);
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}
