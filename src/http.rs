//! The HTTP endpoints: `/metrics` (Prometheus text format), `/livez`, `/readyz` and `/status` (JSON).
//!
//! A deliberately small HTTP/1.1 server on tokio (GET only, one request per connection): it reads the
//! status board and the metrics registry and never touches the workers.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

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

/// Ready when every known worker runs an executor that owns partitions and reaches its store.
pub fn ready(board: &StatusBoard) -> bool {
    let board = board.lock().unwrap();
    !board.is_empty()
        && board.values().all(|ws| {
            ws.values().all(|r| {
                r.store_reachable
                    && r.status
                        .as_ref()
                        .is_some_and(|s| s.phase != crate::core::Phase::Unassigned)
            })
        })
}

fn response(code: u16, reason: &str, ctype: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn route(path: &str, board: &StatusBoard) -> String {
    match path {
        "/metrics" => response(200, "OK", "text/plain; version=0.0.4", &metrics().render()),
        "/livez" => response(200, "OK", "text/plain", "ok\n"),
        "/readyz" if ready(board) => response(200, "OK", "text/plain", "ready\n"),
        "/readyz" => response(503, "Service Unavailable", "text/plain", "not ready\n"),
        "/status" => response(
            200,
            "OK",
            "application/json",
            &serde_json::to_string_pretty(&status_json(board)).expect("json"),
        ),
        _ => response(404, "Not Found", "text/plain", "not found\n"),
    }
}

/// Serves until the process ends. Binds before returning, so a bad address fails at start-up.
pub fn spawn(listen: &str, board: StatusBoard) -> Result<SocketAddr> {
    let std_listener =
        std::net::TcpListener::bind(listen).with_context(|| format!("http.listen = {listen:?}"))?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = TcpListener::from_std(std_listener).expect("listener");
                loop {
                    let Ok((mut sock, _)) = listener.accept().await else {
                        continue;
                    };
                    let board = board.clone();
                    tokio::spawn(async move {
                        // Read the request head (it may arrive in pieces).
                        let mut buf = Vec::with_capacity(1024);
                        let mut chunk = [0u8; 1024];
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
                            match tokio::time::timeout(
                                Duration::from_secs(5),
                                sock.read(&mut chunk),
                            )
                            .await
                            {
                                Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                                _ => return,
                            }
                        }
                        let req = String::from_utf8_lossy(&buf);
                        let path = req
                            .split_whitespace()
                            .nth(1)
                            .unwrap_or("/")
                            .split('?')
                            .next()
                            .unwrap_or("/")
                            .to_string();
                        let out = route(&path, &board);
                        let _ = sock.write_all(out.as_bytes()).await;
                        let _ = sock.shutdown().await;
                    });
                }
            });
        })?;
    Ok(addr)
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
