//! The commands of the `kafka-backfill` binary, one module per group; `main.rs` parses the command
//! line and dispatches here. A command reads its flags and the configuration, calls the library
//! (the service composes `run` and `capture`) and prints what it found; it decides nothing the
//! library should, and it never exits the process itself: it returns the exit code
//! (`service::exit`).

pub mod admin;
pub mod check;
pub mod produce;
pub mod run;
pub mod snapshot;
pub mod verify;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};

use kafka_backfill::config::{Config, LogFormat};
use kafka_backfill::service::exit::Exit;

/// Logs to stderr, as `format` and at `level` (RUST_LOG overrides).
pub fn init_logs(format: LogFormat, level: Option<&str>) {
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

/// The configuration at `path`, or the configuration error printed and its exit code.
pub fn load(path: &std::path::Path) -> Result<Config, ExitCode> {
    Config::load(path).map_err(|e| {
        eprintln!("error: invalid configuration: {e}");
        Exit::Config.into()
    })
}

/// The job named `name`, or the first one.
pub fn pick_job<'a>(
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
