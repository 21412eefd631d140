//! The HTTP endpoints: `/metrics` (Prometheus text format), `/livez`, `/readyz` and `/status` (JSON).
//!
//! axum on hyper's HTTP/1.1 server, hardened (see [`spawn`]): it reads the status board and the
//! metrics registry and never touches the workers.

use std::net::SocketAddr;
use std::time::Duration;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::routing::get as route_get;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::kafka::worker::StatusBoard;
use crate::metrics::metrics;

/// The `/status` document.
pub fn status_json(board: &StatusBoard) -> Value {
    let board = board.lock().unwrap();
    let jobs: Vec<Value> = board
        .iter()
        .map(|(job, workers)| {
            let ws: Vec<Value> = workers
                .iter()
                .map(|(name, r)| {
                    let s = r.status.as_ref();
                    let partitions: Vec<Value> = s
                        .map(|s| {
                            s.partitions
                                .iter()
                                .map(|p| {
                                    let lag = p
                                        .high_watermark
                                        .map(|h| h.saturating_sub(p.committed_offset));
                                    json!({
                                        "partition": p.partition,
                                        "committed_offset": p.committed_offset,
                                        "next_offset": p.next_offset,
                                        "high_watermark": p.high_watermark,
                                        "lag": lag,
                                        "committed_epoch": p.committed_epoch.0,
                                        "paused": p.paused,
                                    })
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    let rate = s.map_or(0.0, |s| s.counters.changes.iter().sum::<u64>() as f64);
                    let lag_records: u64 =
                        partitions.iter().filter_map(|p| p["lag"].as_u64()).sum();
                    json!({
                        "worker": name,
                        "phase": s.map_or("stopped", |s| s.phase.as_str()),
                        "generation": s.map(|s| s.generation),
                        "owned_vnodes": s.map_or(0, |s| s.owned_vnodes),
                        "snapshot_vnodes_left": s.map_or(0, |s| s.snapshot_vnodes_left),
                        "partitions": partitions,
                        "rows": {
                            "snapshot": s.map_or(0, |s| s.counters.snapshot_rows),
                            "log_store_changes": rate as u64,
                        },
                        "checkpoints": s.map_or(0, |s| s.counters.checkpoints),
                        "committed_epoch": s.and_then(|s| s.committed_epoch).map(|e| e.0),
                        "epoch_lag_seconds": s.map_or(0.0, |s| s.epoch_lag_seconds),
                        "lag_records": lag_records,
                        "records_per_second": r.records_per_second,
                        "estimated_catch_up_seconds": r.estimated_catch_up_seconds,
                        "caught_up": r.caught_up,
                        "recreations": r.recreations,
                        "last_error": r.last_error,
                        "store_reachable": r.store_reachable,
                    })
                })
                .collect();
            let progress = crate::job::job_progress().lock().unwrap().get(job).cloned();
            json!({ "job": job, "progress": progress, "workers": ws })
        })
        .collect();
    json!({ "jobs": jobs })
}

/// Ready (Kubernetes may route to it) when every known worker has joined its group — owning no
/// partition is still ready — and reaches its state store.
pub fn ready(board: &StatusBoard) -> bool {
    let board = board.lock().unwrap();
    !board.is_empty()
        && board.values().all(|ws| {
            ws.values()
                .all(|r| r.store_reachable && r.status.as_ref().is_some_and(|s| s.joined))
        })
}

/// A worker whose loop has not reported for this long is stuck: `/livez` fails (the worker reports
/// every 0.5 s, and at most 30 s pass in a restart backoff).
pub const LIVENESS_STALL: Duration = Duration::from_secs(60);

/// Live (Kubernetes keeps it) while every worker's loop keeps reporting. A worker that stopped on a
/// fatal error ends the process, so it needs no rule here.
pub fn live(board: &StatusBoard) -> bool {
    let board = board.lock().unwrap();
    board.values().all(|ws| {
        ws.values()
            .all(|r| r.reported_at.is_none_or(|t| t.elapsed() < LIVENESS_STALL))
    })
}

/// How the endpoint protects itself (`[http]` in the configuration).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    /// A whole connection (head, handler, response written) ends within this.
    pub connection_timeout: Duration,
}

impl Limits {
    pub fn of(c: &crate::config::HttpConfig) -> Limits {
        Limits {
            max_connections: c.max_connections,
            header_timeout: Duration::from_millis(c.header_timeout_ms),
            connection_timeout: Duration::from_millis(c.header_timeout_ms)
                + Duration::from_secs(25),
        }
    }
}

/// GET (and HEAD) only; any other method is 405, any other path 404.
fn router(board: StatusBoard) -> Router {
    Router::new()
        .route(
            "/metrics",
            route_get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    metrics().render(),
                )
            }),
        )
        .route(
            "/livez",
            route_get(|State(board): State<StatusBoard>| async move {
                if live(&board) {
                    (StatusCode::OK, "ok\n")
                } else {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "a worker's loop has stopped\n",
                    )
                }
            }),
        )
        .route(
            "/readyz",
            route_get(|State(board): State<StatusBoard>| async move {
                if ready(&board) {
                    (StatusCode::OK, "ready\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                }
            }),
        )
        .route(
            "/status",
            route_get(|State(board): State<StatusBoard>| async move {
                (
                    [(header::CONTENT_TYPE, "application/json")],
                    serde_json::to_string_pretty(&status_json(&board)).expect("json"),
                )
            }),
        )
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") })
        .with_state(board)
}

/// Serves on its own thread until `shutdown` is set (then it stops accepting and lets requests in
/// flight finish) or the process ends. Binds before returning, so a bad address fails at start-up.
///
/// Hardened for a shared network: at most `max_connections` at once (more are closed as they
/// arrive, so the accept loop never stalls and descriptors stay bounded), the whole request head
/// within `header_timeout` (a client trickling bytes is cut off), each connection done within
/// `connection_timeout` (a client that never reads the response too), one request per connection,
/// request heads of at most 16 KiB, bodies never read.
pub fn spawn(
    listen: &str,
    board: StatusBoard,
    limits: Limits,
    shutdown: Arc<AtomicBool>,
) -> Result<SocketAddr> {
    let std_listener =
        std::net::TcpListener::bind(listen).with_context(|| format!("http.listen = {listen:?}"))?;
    std_listener.set_nonblocking(true)?;
    // A deeper accept queue than std's 128, so a burst of connections waits in the kernel instead
    // of stalling in SYN retransmits while the accept loop catches up.
    {
        use std::os::fd::AsRawFd;
        // SAFETY: listen(2) on a socket this function owns; a failure leaves the old backlog.
        let _ = unsafe { libc::listen(std_listener.as_raw_fd(), 4096) };
    }
    let addr = std_listener.local_addr()?;
    std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(serve(std_listener, router(board), limits, shutdown));
        })?;
    Ok(addr)
}

async fn serve(
    std_listener: std::net::TcpListener,
    app: Router,
    limits: Limits,
    shutdown: Arc<AtomicBool>,
) {
    let listener = TcpListener::from_std(std_listener).expect("listener");
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let service = TowerToHyperService::new(app);
    loop {
        if shutdown.load(Ordering::SeqCst) {
            break;
        }
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                if shutdown.load(Ordering::SeqCst) {
                    break;
                }
                continue;
            }
        };
        let sock = match accepted {
            Ok((sock, _)) => sock,
            Err(e) => {
                // Out of descriptors or memory: wait instead of spinning.
                tracing::warn!(error = %e, "http: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            crate::metrics::metrics().http_rejected.inc();
            drop(sock); // over the cap: closed at once
            continue;
        };
        let service = service.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .keep_alive(false)
                .max_buf_size(16 * 1024)
                .serve_connection(TokioIo::new(sock), service);
            let _ = tokio::time::timeout(limits.connection_timeout, conn).await;
        });
    }
    // New connections are refused; requests in flight finish (each bounded by the connection
    // timeout).
    drop(listener);
    let _ = tokio::time::timeout(
        limits.connection_timeout,
        slots.acquire_many(limits.max_connections as u32),
    )
    .await;
}

/// A minimal GET for `kafka-backfill status`.
pub fn get(url: &str) -> Result<(u16, String)> {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").context("only http:// URLs")?;
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let mut s =
        std::net::TcpStream::connect(host).with_context(|| format!("connecting to {host}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    // One write: a request split over several segments may be read in part and answered early.
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_string());
    Ok((code, body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Event, Executor, JobSpec, LocalCheckpointPolicy, PartitionMap};
    use crate::kafka::worker::WorkerReport;
    use std::time::Instant;

    fn board_with(joined: bool, store_reachable: bool, reported: Duration) -> StatusBoard {
        let mut x = Executor::new(
            JobSpec {
                topic: "t".into(),
                snapshot_epoch: crate::core::Epoch(1 << 16),
                map: PartitionMap::new(8, 2).unwrap(),
                generation: 0,
                worker: "w".into(),
                local_checkpoint: LocalCheckpointPolicy {
                    max_rows: 10,
                    max_interval_ms: 10,
                },
                max_epochs_ahead: 4,
            },
            0,
        );
        if joined {
            x.handle(Event::Assigned(vec![])).unwrap(); // a member that owns nothing
        }
        let board = crate::job::new_board();
        board.lock().unwrap().entry("j".into()).or_default().insert(
            "w".into(),
            WorkerReport {
                status: Some(x.status()),
                store_reachable,
                reported_at: Instant::now().checked_sub(reported),
                ..Default::default()
            },
        );
        board
    }

    #[test]
    fn ready_means_joined_and_store_reachable_even_with_no_partition() {
        assert!(ready(&board_with(true, true, Duration::ZERO)));
        assert!(
            !ready(&board_with(false, true, Duration::ZERO)),
            "not joined yet"
        );
        assert!(
            !ready(&board_with(true, false, Duration::ZERO)),
            "store away"
        );
    }

    #[test]
    fn live_until_a_workers_loop_stops_reporting() {
        assert!(live(&board_with(true, true, Duration::from_secs(1))));
        assert!(!live(&board_with(
            true,
            true,
            LIVENESS_STALL + Duration::from_secs(1)
        )));
    }
}
