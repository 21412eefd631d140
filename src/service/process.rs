//! The process's life (mini-redis's shape): one shutdown token handed to the whole composition,
//! signals that cancel it, and a grace period the main thread waits out. `run` and `capture` are
//! composed here, not in `main.rs`, which parses and dispatches only.
//!
//! SIGTERM or SIGINT cancels the token: workers commit what is complete and leave their group,
//! captures stop at a checkpoint, HTTP servers stop accepting. The main thread waits for the work to
//! return; past `shutdown_grace_secs` it returns 0 anyway, abandoning in-flight work (the store
//! holds the last checkpoint); a second signal returns 130 at once. Nothing here calls
//! `process::exit`: `main` returns the code, which ends the process and every thread in it.

use std::process::ExitCode;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::config::{Config, JobConfig};
use crate::service::job::{self, RunOptions};
use crate::service::runtime::Runtimes;
use crate::service::{http, metrics};
use crate::shutdown::CancellationToken;

/// What the main thread hears while the work runs.
enum Event {
    Done(Result<ExitCode>),
    Signal,
    SecondSignal,
}

/// Runs `work` on a thread of its own, handed a fresh shutdown token, and returns its exit code —
/// or, once a signal cancelled the token, 0 when `grace` is over, or 130 at a second signal.
pub fn run_until_signalled<F>(grace: Duration, work: F) -> Result<ExitCode>
where
    F: FnOnce(CancellationToken) -> Result<ExitCode> + Send + 'static,
{
    let shutdown = CancellationToken::new();
    let (tx, rx) = mpsc::channel();
    install_signals(shutdown.clone(), tx.clone())?;
    let token = shutdown.clone();
    std::thread::Builder::new()
        .name("main-work".into())
        .spawn(move || {
            let r = work(token);
            // The receiver lives as long as the main thread waits.
            let _ = tx.send(Event::Done(r));
        })
        .context("starting the work thread")?;
    let mut deadline: Option<Instant> = None;
    loop {
        let event = match deadline {
            None => rx
                .recv()
                .context("the work thread ended without a result")?,
            Some(d) => match rx.recv_timeout(d.saturating_duration_since(Instant::now())) {
                Ok(e) => e,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    tracing::warn!("shutdown grace period over: abandoning in-flight work (the store holds the last checkpoint)");
                    return Ok(ExitCode::SUCCESS);
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    anyhow::bail!("the work thread ended without a result")
                }
            },
        };
        match event {
            Event::Done(r) => return r,
            Event::Signal => {
                tracing::info!(
                    grace_secs = grace.as_secs(),
                    "signal received: stopping (send again to exit at once)"
                );
                deadline = Some(Instant::now() + grace);
            }
            Event::SecondSignal => {
                eprintln!("second signal: exiting now");
                return Ok(ExitCode::from(130));
            }
        }
    }
}

/// SIGTERM or SIGINT: the first cancels `shutdown`, the next ones are told to the main thread.
fn install_signals(shutdown: CancellationToken, tx: mpsc::Sender<Event>) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Installed before the thread starts, so a signal right after start-up is not missed.
    let (mut term, mut int) = rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        Ok::<_, std::io::Error>((
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        ))
    })?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            rt.block_on(async move {
                loop {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                    let event = if shutdown.is_cancelled() {
                        Event::SecondSignal
                    } else {
                        shutdown.cancel();
                        Event::Signal
                    };
                    if tx.send(event).is_err() {
                        return;
                    }
                }
            })
        })?;
    Ok(())
}

/// What `run` does besides the jobs: its flags.
pub struct RunFlags {
    pub options: RunOptions,
    /// `run --capture`: each job's capture in this process too.
    pub capture: bool,
}

/// `kafka-backfill run`: the HTTP endpoints, the in-process captures, then every job, until
/// `shutdown` is cancelled or the jobs end. Exit 3 when a job did not complete (`JobIncomplete`).
pub fn run(config: &Config, flags: RunFlags, shutdown: CancellationToken) -> Result<ExitCode> {
    let board = job::new_board();
    let runtimes = Runtimes::default();
    if !config.http.listen.is_empty() {
        let addr = http::spawn(
            &config.http.listen,
            http::status_router(board.clone(), runtimes.clone()),
            http::Limits::of(&config.http),
            runtimes.metrics().http_rejected.clone(),
            shutdown.clone(),
        )?;
        tracing::info!(%addr, "serving /metrics /livez /readyz /status");
    }
    if config.http.admin {
        let addr = http::spawn(
            &config.http.admin_listen,
            http::admin_router(runtimes.clone(), config.http.admin_token.clone()),
            http::Limits::of(&config.http),
            runtimes.metrics().http_rejected.clone(),
            shutdown.clone(),
        )
        .context("http.admin_listen")?;
        tracing::info!(%addr, "serving /admin/jobs/{{name}}/rate-limit");
    }
    // The captures stop when the jobs do (`finish`), or at the process's signal.
    let captures = if flags.capture {
        Some(crate::capture::job::InProcess::start(
            &config.jobs,
            shutdown.clone(),
            runtimes.captures().clone(),
            Arc::new(metrics::CaptureMetrics(runtimes.metrics().clone())),
        )?)
    } else {
        None
    };
    let r = job::run(config, &flags.options, shutdown, board, runtimes);
    let r = match captures.map(|c| c.finish()) {
        Some(Err(e)) if r.is_ok() => Err(e),
        _ => r,
    };
    match r {
        Err(e) if e.downcast_ref::<job::JobIncomplete>().is_some() => {
            eprintln!("error: {e}");
            Ok(crate::service::exit::Exit::Stalled.into())
        }
        r => r.map(|()| ExitCode::SUCCESS),
    }
}

/// `kafka-backfill capture`: the HTTP endpoints, then the capture of `job` until `shutdown`.
pub fn capture(config: &Config, job: &JobConfig, shutdown: CancellationToken) -> Result<ExitCode> {
    let runtimes = Runtimes::default();
    if !config.http.listen.is_empty() {
        let addr = http::spawn(
            &config.http.listen,
            http::status_router(job::new_board(), runtimes.clone()),
            http::Limits::of(&config.http),
            runtimes.metrics().http_rejected.clone(),
            shutdown.clone(),
        )?;
        tracing::info!(%addr, "serving /metrics /livez /readyz /status");
    }
    crate::capture::job::run(
        job,
        shutdown,
        runtimes.captures().clone(),
        Arc::new(metrics::CaptureMetrics(runtimes.metrics().clone())),
    )?;
    Ok(ExitCode::SUCCESS)
}
