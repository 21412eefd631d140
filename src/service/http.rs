//! The HTTP endpoints: `/metrics` (Prometheus text format), `/livez`, `/readyz` and `/status` (JSON).
//!
//! axum on hyper's HTTP/1.1 server, hardened (see [`spawn`]): it reads the status board and the
//! metrics registry and never touches the workers.

use std::net::SocketAddr;
use std::time::Duration;

use std::sync::Arc;

use anyhow::{Context, Result};
use axum::extract::Path;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::routing::get as route_get;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::shutdown::CancellationToken;

use crate::service::runtime::{JobRuntime, RateLimitChange, Runtimes};
use crate::service::status::{live, ready, status_json, StatusBoard};

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

/// The status listener: GET (and HEAD) only; any other method is 405, any other path 404.
/// The status page at `/`: plain HTML and one script that reads `/status` and each job's vnodes
/// every second (`src/service/status_page.html`); no build step, nothing from elsewhere.
pub const STATUS_PAGE: &str = include_str!("status_page.html");

pub fn status_router(board: StatusBoard, jobs: Runtimes) -> Router {
    let metrics = jobs.metrics().clone();
    Router::new()
        .route(
            "/",
            route_get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                    STATUS_PAGE,
                )
            }),
        )
        .route(
            "/metrics",
            route_get(move || async move {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    metrics.render(),
                )
            }),
        )
        .route(
            "/livez",
            route_get(|State((board, _)): State<Shared>| async move {
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
            route_get(|State((board, jobs)): State<Shared>| async move {
                let waiting = jobs.waiting();
                if waiting.is_empty() && ready(&board) {
                    (StatusCode::OK, "ready\n".to_string())
                } else {
                    let mut body = "not ready\n".to_string();
                    for (job, what) in waiting {
                        body.push_str(&format!("job {job} waits for {what}\n"));
                    }
                    (StatusCode::SERVICE_UNAVAILABLE, body)
                }
            }),
        )
        .route(
            "/status",
            route_get(|State((board, jobs)): State<Shared>| async move {
                (
                    [(header::CONTENT_TYPE, "application/json")],
                    serde_json::to_string_pretty(&status_json(&board, &jobs)).expect("json"),
                )
            }),
        )
        .route(
            "/status/jobs/{name}/vnodes",
            route_get(
                |State((_, jobs)): State<Shared>, Path(name): Path<String>| async move {
                    // Store reads block: off the runtime.
                    let read = tokio::task::spawn_blocking(move || match jobs.get(&name) {
                        Some(job) => job.vnodes_json().map(|v| (name, Some(v))),
                        None => Ok((name, None)),
                    })
                    .await;
                    match read {
                        Ok(Ok((_, Some(v)))) => (
                            StatusCode::OK,
                            [(header::CONTENT_TYPE, "application/json")],
                            serde_json::to_string_pretty(&v).expect("json"),
                        ),
                        Ok(Ok((name, None))) => (
                            StatusCode::NOT_FOUND,
                            [(header::CONTENT_TYPE, "text/plain")],
                            format!("no job named {name:?} in this process\n"),
                        ),
                        Ok(Err(e)) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            [(header::CONTENT_TYPE, "text/plain")],
                            format!("{}\n", crate::error::line(&e)),
                        ),
                        Err(e) => (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            [(header::CONTENT_TYPE, "text/plain")],
                            format!("reading the vnodes failed: {e}\n"),
                        ),
                    }
                },
            ),
        )
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") })
        .with_state((board, jobs))
}

/// What the status routes read: the workers' reports and the jobs' runtimes.
type Shared = (StatusBoard, Runtimes);

/// The write listener (`http.admin = true`, on `http.admin_listen`): a job's live rate limits and
/// its pause. With a `token`, every request must carry `Authorization: Bearer <token>`; a missing
/// or wrong one is 401 and counted (`kafka_backfill_http_unauthorized_total`).
/// `GET /admin/jobs/{name}/rate-limit` reads them from the job's store; `POST` with the query
/// `snapshot=N` and/or `log=N` (per worker per second, 0 = none; a missing one keeps its value) sets
/// them in the store, which every worker of every process reads within its housekeeping interval.
/// No request body is read.
pub fn admin_router(jobs: Runtimes, token: Option<crate::config::Secret>) -> Router {
    use axum::http::Uri;
    use axum::routing::MethodRouter;
    fn reply(
        r: Result<Option<Value>>,
        name: &str,
    ) -> (StatusCode, [(header::HeaderName, &'static str); 1], String) {
        match r {
            Ok(Some(v)) => (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                format!("{v}\n"),
            ),
            Ok(None) => (
                StatusCode::NOT_FOUND,
                [(header::CONTENT_TYPE, "text/plain")],
                format!("no job named {name:?} in this process\n"),
            ),
            Err(e) => (
                StatusCode::BAD_REQUEST,
                [(header::CONTENT_TYPE, "text/plain")],
                format!("{}\n", crate::error::line(&e)),
            ),
        }
    }
    /// Runs `f` on job `name`'s runtime off the async runtime (store calls block) and replies.
    async fn on_job(
        jobs: Runtimes,
        name: String,
        f: impl FnOnce(&JobRuntime) -> Result<Value> + Send + 'static,
    ) -> (StatusCode, [(header::HeaderName, &'static str); 1], String) {
        let n = name.clone();
        let r = tokio::task::spawn_blocking(move || jobs.get(&n).map(|j| f(&j)).transpose())
            .await
            .unwrap_or_else(|e| Err(anyhow::anyhow!("the request failed: {e}")));
        reply(r, &name)
    }
    let route: MethodRouter<Runtimes> =
        route_get(|State(jobs): State<Runtimes>, Path(name): Path<String>| {
            on_job(jobs, name, |j| j.rate_limits_json(None))
        })
        .post(
            |State(jobs): State<Runtimes>, Path(name): Path<String>, uri: Uri| async move {
                // A bad query is refused before the job is looked up.
                match RateLimitChange::parse(uri.query().unwrap_or("")) {
                    Err(e) => reply(Err(e), &name),
                    Ok(c) => on_job(jobs, name, move |j| j.rate_limits_json(Some(c))).await,
                }
            },
        );
    let pause = |set: Option<bool>| {
        move |State(jobs): State<Runtimes>, Path(name): Path<String>| {
            on_job(jobs, name, move |j| j.pause_json(set))
        }
    };
    let pause_route: MethodRouter<Runtimes> = route_get(pause(None)).post(pause(Some(true)));
    let resume_route: MethodRouter<Runtimes> = axum::routing::post(pause(Some(false)));
    let unauthorized = jobs.metrics().http_unauthorized.clone();
    Router::new()
        .route("/admin/jobs/{name}/rate-limit", route)
        .route("/admin/jobs/{name}/pause", pause_route)
        .route("/admin/jobs/{name}/resume", resume_route)
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") })
        .with_state(jobs)
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let token = token.clone();
                let unauthorized = unauthorized.clone();
                async move {
                    if let Some(t) = &token {
                        let given = req
                            .headers()
                            .get(header::AUTHORIZATION)
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.strip_prefix("Bearer "));
                        if !given.is_some_and(|g| same_secret(g.as_bytes(), t.expose().as_bytes()))
                        {
                            unauthorized.inc();
                            return axum::response::IntoResponse::into_response((
                                StatusCode::UNAUTHORIZED,
                                [(header::WWW_AUTHENTICATE, "Bearer")],
                                "a bearer token is required (http.admin_token)\n",
                            ));
                        }
                    }
                    next.run(req).await
                }
            },
        ))
}

/// Compares two secrets in time independent of where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Serves on its own thread until `shutdown` is cancelled (then it stops accepting and lets requests in
/// flight finish) or the process ends. Binds before returning, so a bad address fails at start-up.
///
/// Hardened for a shared network: at most `max_connections` at once (more are closed as they
/// arrive, so the accept loop never stalls and descriptors stay bounded), the whole request head
/// within `header_timeout` (a client trickling bytes is cut off), each connection done within
/// `connection_timeout` (a client that never reads the response too), one request per connection,
/// request heads of at most 16 KiB, bodies never read. `rejected` counts the connections closed
/// over the cap.
pub fn spawn(
    listen: &str,
    router: Router,
    limits: Limits,
    rejected: prometheus::IntCounter,
    shutdown: CancellationToken,
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
            rt.block_on(serve(std_listener, router, limits, rejected, shutdown));
        })?;
    Ok(addr)
}

async fn serve(
    std_listener: std::net::TcpListener,
    app: Router,
    limits: Limits,
    rejected: prometheus::IntCounter,
    shutdown: CancellationToken,
) {
    let listener = TcpListener::from_std(std_listener).expect("listener");
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let service = TowerToHyperService::new(app);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.cancelled() => break,
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
            rejected.inc();
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
    request("GET", url)
}

/// A minimal request without a body (`kafka-backfill rate-limit` posts its query).
pub fn request(method: &str, url: &str) -> Result<(u16, String)> {
    request_with(method, url, None)
}

/// [`request`] with a bearer token (the write endpoint's `http.admin_token`).
pub fn request_with(method: &str, url: &str, token: Option<&str>) -> Result<(u16, String)> {
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
        format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n{}\r\n",
            token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"))
        )
        .as_bytes(),
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
