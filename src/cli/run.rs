//! The commands that run work until a signal or to its end: `run`, `capture`, `demo`.

use super::*;
use kafka_backfill::service::job::RunOptions;
use kafka_backfill::service::process;

/// `run`'s flags.
#[derive(clap::Args)]
pub struct RunArgs {
    /// The configuration file (TOML; docs/OPERATIONS.md "Configuration reference").
    #[arg(long, short)]
    pub config: PathBuf,
    /// Exit 0 once every vnode of every job has caught up (read from the store, so a process
    /// that owns part of a job waits for the rest); exit 3 if the rest makes no progress for
    /// --job-wait-secs.
    #[arg(long)]
    pub exit_when_caught_up: bool,
    /// With --exit-when-caught-up: seconds to wait for progress of the job's other vnodes.
    #[arg(long, default_value_t = 60)]
    pub job_wait_secs: u64,
    /// Prefix of this process's worker names (default: <hostname>-p<pid>). Given, it is also
    /// each worker's static group membership (`group.instance.id` = <prefix>-<index>), so a
    /// restart under the same prefix gets its partitions back without a rebalance; a
    /// `group.instance.id` in [jobs.kafka] wins ("" turns static membership off).
    #[arg(long)]
    pub worker_prefix: Option<String>,
    /// Also run the capture of every job with a [jobs.capture] in this process (the embedded
    /// and demo case; docs/CAPTURE.md): a job starts once its capture published the snapshot,
    /// and the captures stop at a checkpoint when the jobs do.
    #[arg(long)]
    pub capture: bool,
}

/// `run`: the configured jobs until a signal (`service::process`).
pub fn run(args: RunArgs) -> Result<ExitCode> {
    let RunArgs {
        config,
        exit_when_caught_up,
        job_wait_secs,
        worker_prefix,
        capture,
    } = args;
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

/// `capture`'s flags.
#[derive(clap::Args)]
pub struct CaptureArgs {
    /// The configuration file.
    #[arg(long, short)]
    pub config: PathBuf,
    /// Job name (default: the only job).
    #[arg(long)]
    pub job: Option<String>,
}

/// `capture`: one job's capture until a signal.
pub fn capture(args: CaptureArgs) -> Result<ExitCode> {
    let CaptureArgs { config, job } = args;
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

/// `demo`'s flags.
#[derive(clap::Args)]
pub struct DemoArgs {
    /// Add a second worker during the log-store phase: see the invariant error and the recreation.
    #[arg(long)]
    pub rescale: bool,
    /// Folder for the snapshot, the expected table and the SQLite store (apart from the
    /// walk-through's `.run/demo`, whose store would otherwise hold the demo's job).
    #[arg(long, default_value = ".run/embedded")]
    pub dir: PathBuf,
    /// Partitions of the demo topic.
    #[arg(long, default_value_t = 4)]
    pub partitions: u32,
    /// Rows in the snapshot.
    #[arg(long, default_value_t = 20_000)]
    pub rows: u64,
    /// Changes after the snapshot.
    #[arg(long, default_value_t = 60_000)]
    pub changes: u64,
    /// At most this many snapshot rows per second and, separately, log records per second, per
    /// worker (0 = unlimited).
    #[arg(long, default_value_t = 20_000)]
    pub throttle: u64,
}

/// `demo`: the whole job on embedded defaults.
pub fn demo(args: DemoArgs) -> Result<ExitCode> {
    let DemoArgs {
        rescale,
        dir,
        partitions,
        rows,
        changes,
        throttle,
    } = args;
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
