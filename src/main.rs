//! The `kafka-backfill` command line: parsing and dispatch only; each command is in `src/cli/`.

mod cli;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use kafka_backfill::service::exit::Exit;

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

#[derive(Subcommand)]
enum Command {
    /// Run the configured jobs until SIGTERM/SIGINT (a second signal exits at once).
    Run(cli::run::RunArgs),
    /// Write a generated table: snapshot files at the snapshot epoch Es, then changes and barriers
    /// into the topic, then the table expected at the last checkpoint (for `verify`).
    Produce(cli::produce::ProduceArgs),
    /// Check a job's snapshot and log topic against the wire contract without materialising
    /// anything: every violation is listed; exit 1 if there is any.
    CheckLog(cli::check::CheckLogArgs),
    /// Compare a job's materialised table with the writer's expected table.
    Verify(cli::verify::VerifyArgs),
    /// Capture a PostgreSQL table into a job's snapshot and log topic ([jobs.capture];
    /// docs/CAPTURE.md): exactly once, until SIGTERM/SIGINT (stops at a checkpoint).
    Capture(cli::run::CaptureArgs),
    /// Ask a job's running capture for a new snapshot at a barrier of the live log
    /// (docs/CAPTURE.md "Snapshots of a running capture"), and wait until it is published: prints
    /// its epoch, folder and start offsets. The request is a record on the capture's state topic.
    Snapshot(cli::snapshot::SnapshotArgs),
    /// Rebuild a running job's replica online from a new snapshot of its capture (docs/CAPTURE.md
    /// "Resync a replica"): rows the source no longer has are deleted, changed rows rewritten,
    /// missing rows loaded. The job moves to that snapshot in its store; the `run` holding it
    /// starts it again there. Under `consistency = "epoch"` readers keep the old replica until the
    /// new one is published whole.
    Resync(cli::snapshot::SnapshotArgs),
    /// Copy a file snapshot (a folder with manifest.json) into PostgreSQL, as a snapshot source.
    ExportSnapshot(cli::snapshot::ExportSnapshotArgs),
    /// Validate a configuration file without running it: everything `run` would refuse before it
    /// reaches a broker or a store (reachability is `doctor`'s).
    CheckConfig(cli::check::CheckConfigArgs),
    /// Reach every part the configuration names — brokers and topic, consumer group, state store,
    /// snapshot, capture source — one line per check with its time; each check gives up after 5 s.
    /// Exit 0 when every check passes, 1 when one fails, 2 for a configuration that does not load.
    Doctor(cli::check::DoctorArgs),
    /// Run the whole job on embedded defaults: an in-process mock Kafka, a generated snapshot and log,
    /// a SQLite store, live progress, then verify.
    Demo(cli::run::DemoArgs),
    /// Read or set a running job's live rate limits (per worker per second; 0 = none), through the
    /// service's write endpoint (`http.admin = true`); every worker applies them within a second
    /// and they are kept in the store across restarts. Without --snapshot and --log: read them.
    RateLimit(cli::admin::RateLimitArgs),
    /// Pause a running job: every worker of every process stops fetching and scanning within a
    /// second and stays in its group (no rebalance); kept in the store across restarts until
    /// `resume`. What is staged is committed at the next checkpoint it completes.
    Pause(cli::admin::AdminTarget),
    /// Resume a paused job.
    Resume(cli::admin::AdminTarget),
    /// Print a running service's /status for a person (or --json, or --watch it live).
    Status(cli::admin::StatusArgs),
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
            eprintln!("error: {}", kafka_backfill::error::line(&e));
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

/// The command's work; its exit code, or an error `main` prints and maps to one.
fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Run(a) => cli::run::run(a),
        Command::Produce(a) => cli::produce::produce(a),
        Command::CheckLog(a) => cli::check::check_log(a),
        Command::Verify(a) => cli::verify::verify(a),
        Command::Capture(a) => cli::run::capture(a),
        Command::Snapshot(a) => cli::snapshot::snapshot(a),
        Command::Resync(a) => cli::snapshot::resync(a),
        Command::ExportSnapshot(a) => cli::snapshot::export_snapshot(a),
        Command::CheckConfig(a) => cli::check::check_config(a),
        Command::Doctor(a) => cli::check::doctor(a),
        Command::Demo(a) => cli::run::demo(a),
        Command::RateLimit(a) => cli::admin::rate_limit(a),
        Command::Pause(target) => {
            print!("{}", target.call("POST", "pause")?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Resume(target) => {
            print!("{}", target.call("POST", "resume")?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Status(a) => cli::admin::status(a),
    }
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
