//! Snapshots outside a run: `snapshot` (asked of a running capture), `resync` (a running job moved
//! onto a new one), `export-snapshot`.

use super::*;

/// `snapshot`'s and `resync`'s flags.
#[derive(clap::Args)]
pub struct SnapshotArgs {
    /// The configuration file.
    #[arg(long, short)]
    pub config: PathBuf,
    /// Job name (default: the only job).
    #[arg(long)]
    pub job: Option<String>,
    /// How long to wait for the snapshot to be published (0: ask and return).
    #[arg(long, default_value_t = 600)]
    pub within_secs: u64,
}

/// `snapshot`: a snapshot asked of a running capture, awaited.
pub fn snapshot(args: SnapshotArgs) -> Result<ExitCode> {
    let SnapshotArgs {
        config,
        job,
        within_secs,
    } = args;
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

/// `resync`: the job moved onto a new snapshot of its capture; the `run` holding it reloads it.
pub fn resync(args: SnapshotArgs) -> Result<ExitCode> {
    let SnapshotArgs {
        config,
        job,
        within_secs,
    } = args;
    let config = match load(&config) {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    init_logs(LogFormat::Text, Some("warn"));
    let j = pick_job(&config, job.as_deref())?;
    let within = std::time::Duration::from_secs(within_secs);
    let done = kafka_backfill::service::resync::resync(j, within)?;
    println!(
        "job {}: moved from the snapshot at epoch {} to the one at epoch {} ({}), generation {}; the run holding the job reloads it from there{}",
        j.name,
        done.from,
        done.to,
        done.dir,
        done.generation,
        if done.published_whole {
            ", and readers see the old replica until the new one is published whole"
        } else {
            " (consistency = \"vnode\": each vnode is emptied and comes back as its snapshot rows commit)"
        }
    );
    Ok(Exit::Ok.into())
}

/// `export-snapshot`'s flags.
#[derive(clap::Args)]
pub struct ExportSnapshotArgs {
    /// The folder holding manifest.json.
    #[arg(long)]
    pub from: PathBuf,
    /// postgresql://user:password@host:port/database
    #[arg(long)]
    pub to_postgres: String,
    /// The snapshot's name in kb_snapshots (what `[jobs.snapshot] name` refers to).
    #[arg(long)]
    pub name: String,
    /// The table that receives the rows.
    #[arg(long)]
    pub table: String,
}

/// `export-snapshot`: a file snapshot copied into PostgreSQL.
pub fn export_snapshot(args: ExportSnapshotArgs) -> Result<ExitCode> {
    let ExportSnapshotArgs {
        from,
        to_postgres,
        name,
        table,
    } = args;
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
