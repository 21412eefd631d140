//! A running service, reached over HTTP: `status` and the write endpoint's `pause`, `resume`,
//! `rate-limit`.

use super::*;

/// A job on a running service's write endpoint (`rate-limit`, `pause`, `resume`).
#[derive(clap::Args)]
pub struct AdminTarget {
    /// The service's configuration: the endpoint (`http.admin_listen`), the token
    /// (`http.admin_token`) and, when it has one job, the job are read from it.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// The service's write endpoint (default: the config's `http.admin_listen`, else
    /// http://127.0.0.1:9465).
    #[arg(long)]
    url: Option<String>,
    /// The job's name (default: the config's only job).
    #[arg(long)]
    job: Option<String>,
    /// The write endpoint's bearer token (default: the config's `http.admin_token`, else the
    /// environment's KAFKA_BACKFILL_ADMIN_TOKEN).
    #[arg(long)]
    token: Option<String>,
}

/// `listen` (an `address:port` a server binds) as a URL a client on this machine reaches.
fn local_url(listen: &str) -> String {
    let reach = match listen.rsplit_once(':') {
        Some(("0.0.0.0" | "[::]" | "", port)) => format!("127.0.0.1:{port}"),
        _ => listen.to_string(),
    };
    format!("http://{reach}")
}

impl AdminTarget {
    /// The endpoint, token and job, from the flags, then the config, then the defaults.
    fn resolve(&self) -> Result<(String, Option<String>, String)> {
        let config =
            match &self.config {
                Some(path) => Some(Config::load(path).map_err(|e| {
                    anyhow::anyhow!("{}: invalid configuration: {e}", path.display())
                })?),
                None => None,
            };
        let url = match (&self.url, &config) {
            (Some(u), _) => u.clone(),
            (None, Some(c)) => {
                anyhow::ensure!(
                    c.http.admin,
                    "{}: http.admin is false, so the service has no write endpoint; set [http] admin = true and restart it",
                    self.config.as_ref().expect("a config").display()
                );
                local_url(&c.http.admin_listen)
            }
            (None, None) => "http://127.0.0.1:9465".to_string(),
        };
        let token = self
            .token
            .clone()
            .or_else(|| {
                config
                    .as_ref()
                    .and_then(|c| c.http.admin_token.as_ref())
                    .map(|t| t.expose().to_string())
            })
            .or_else(|| std::env::var("KAFKA_BACKFILL_ADMIN_TOKEN").ok());
        let job = match (&self.job, &config) {
            (Some(j), _) => j.clone(),
            (None, Some(c)) if c.jobs.len() == 1 => c.jobs[0].name.clone(),
            (None, Some(c)) => anyhow::bail!(
                "the configuration has {} jobs ({}): name one with --job",
                c.jobs.len(),
                c.jobs
                    .iter()
                    .map(|j| j.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            (None, None) => anyhow::bail!("name the job with --job (or give --config)"),
        };
        Ok((url, token, job))
    }

    /// One request to `/admin/jobs/{job}/{what}`; the body when it answers 200.
    pub fn call(&self, method: &str, what: &str) -> Result<String> {
        let (url, token, job) = self.resolve()?;
        let target = format!("{}/admin/jobs/{job}/{what}", url.trim_end_matches('/'));
        let (code, body) =
            kafka_backfill::service::http::request_with(method, &target, token.as_deref())?;
        anyhow::ensure!(code == 200, "{target} answered {code}: {}", body.trim());
        Ok(body)
    }
}

/// `rate-limit`'s flags.
#[derive(clap::Args)]
pub struct RateLimitArgs {
    #[command(flatten)]
    pub target: AdminTarget,
    /// Snapshot rows per second.
    #[arg(long)]
    pub snapshot: Option<u64>,
    /// Log records per second.
    #[arg(long)]
    pub log: Option<u64>,
}

/// `rate-limit`: a running job's live limits, read or set.
pub fn rate_limit(args: RateLimitArgs) -> Result<ExitCode> {
    let RateLimitArgs {
        target,
        snapshot,
        log,
    } = args;
    let mut query = Vec::new();
    if let Some(n) = snapshot {
        query.push(format!("snapshot={n}"));
    }
    if let Some(n) = log {
        query.push(format!("log={n}"));
    }
    let body = if query.is_empty() {
        target.call("GET", "rate-limit")?
    } else {
        target.call("POST", &format!("rate-limit?{}", query.join("&")))?
    };
    print!("{body}");
    Ok(ExitCode::SUCCESS)
}

/// `status`'s flags.
#[derive(clap::Args)]
pub struct StatusArgs {
    /// The service's configuration: the endpoint is its `http.listen`.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// The service's read-only endpoint (default: the config's `http.listen`, else
    /// http://127.0.0.1:9464).
    #[arg(long, conflicts_with = "config")]
    pub url: Option<String>,
    /// Print the raw JSON.
    #[arg(long)]
    pub json: bool,
    /// Keep watching: a progress bar per job and phase with lag, epoch lag, rate and ETA (plain
    /// lines when stdout is not a terminal), refreshed every --interval-ms.
    #[arg(long, conflicts_with = "json")]
    pub watch: bool,
    /// With --watch: refresh period.
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u64,
    /// With --watch: exit 0 once every job has caught up.
    #[arg(long, requires = "watch")]
    pub until_caught_up: bool,
}

/// `status`: a running service's `/status` for a person, as JSON, or watched live.
pub fn status(args: StatusArgs) -> Result<ExitCode> {
    let url = status_url(args.url, args.config.as_deref())?;
    if args.watch {
        kafka_backfill::service::watch::watch(
            &url,
            std::time::Duration::from_millis(args.interval_ms),
            args.until_caught_up,
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    let (code, body) =
        kafka_backfill::service::http::get(&format!("{}/status", url.trim_end_matches('/')))?;
    anyhow::ensure!(code == 200, "{url}/status answered {code}");
    if args.json {
        println!("{body}");
    } else {
        // Tables of workers and partitions (`service::status_table`).
        print!(
            "{}",
            kafka_backfill::service::status_table::render(&serde_json::from_str(&body)?)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `status`'s endpoint: `--url`, else the config's `http.listen`, else the default.
fn status_url(url: Option<String>, config: Option<&std::path::Path>) -> Result<String> {
    Ok(match (url, config) {
        (Some(u), _) => u,
        (None, Some(path)) => {
            let c = Config::load(path)
                .map_err(|e| anyhow::anyhow!("{}: invalid configuration: {e}", path.display()))?;
            anyhow::ensure!(
                !c.http.listen.is_empty(),
                "{}: http.listen is empty, so the service serves no /status",
                path.display()
            );
            local_url(&c.http.listen)
        }
        (None, None) => "http://127.0.0.1:9464".to_string(),
    })
}
