//! The service as an operator meets it: configuration errors, HTTP endpoints, the Prometheus scrape
//! (real `promtool` and a real Prometheus server), `status`, and SIGTERM.

use crate::support;

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{
    doctor, doctor_line, documented_metric_families, free_port, http_get, serial, Fixture, BIN,
};

#[test]
fn config_errors_exit_2_naming_the_key() {
    let dir = std::env::temp_dir().join(format!("kb-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        "[[jobs]]\nname = \"a\"\ntopic = \"t\"\nvnode_count = 0\nkafka = { \"bootstrap.servers\" = \"x:1\" }\nsnapshot = { kind = \"files\", dir = \"s\" }\nstore = { kind = \"sqlite\", path = \"p\", table = \"t\" }\n",
    )
    .unwrap();
    for cmd in ["check-config", "run"] {
        let mut c = Command::new(BIN);
        if cmd == "run" {
            c.args(["run", "--config"]);
        } else {
            c.arg(cmd);
        }
        let out = c.arg(&bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("jobs[0].vnode_count: must be 1..=32768"),
            "{cmd}: {err}"
        );
    }
    std::fs::write(&bad, "[[jobs]]\nname = \"a\"\nbogus = 1\n").unwrap();
    let out = Command::new(BIN)
        .arg("check-config")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown field `bogus`"));
    for shipped in ["config/example.toml", "config/capture.toml"] {
        let out = Command::new(BIN)
            .args([
                "check-config",
                &format!("{}/{shipped}", env!("CARGO_MANIFEST_DIR")),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{shipped}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `check-config` reads a job's snapshot manifest when it exists and refuses what `run` would refuse
/// of it (here `store_datum = false` over a row schema with a record field), with the same message;
/// without a manifest it says it did not check it.
#[test]
fn check_config_refuses_what_run_refuses_of_the_snapshot() {
    use kafka_backfill::snapshot::files::{write_manifest, Manifest, ManifestStart};
    let dir = std::env::temp_dir().join(format!("kb-config-snap-{}", std::process::id()));
    let snap = dir.join("snap");
    std::fs::create_dir_all(&snap).unwrap();
    let config = dir.join("job.toml");
    let write_config = |store_datum: bool| {
        std::fs::write(
            &config,
            format!(
                "[[jobs]]\nname = \"typed\"\ntopic = \"t\"\nvnode_count = 16\nkafka = {{ \"bootstrap.servers\" = \"127.0.0.1:1\" }}\nsnapshot = {{ kind = \"files\", dir = \"{}\" }}\nstore = {{ kind = \"sqlite\", path = \"{}\", table = \"typed\", store_datum = {store_datum} }}\n",
                snap.display(),
                dir.join("state.sqlite").display()
            ),
        )
        .unwrap()
    };
    let check = || {
        Command::new(BIN)
            .arg("check-config")
            .arg(&config)
            .output()
            .unwrap()
    };
    write_config(false);
    let out = check();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("note: job typed: snapshot not checked")
            && stdout.contains("does not exist yet"),
        "{stdout}"
    );
    let table = kafka_backfill::workload::TableKind::Typed.schema().unwrap();
    write_manifest(
        &snap,
        &Manifest {
            snapshot_epoch: kafka_backfill::core::Epoch(1 << 16),
            vnode_count: 16,
            partition_count: 1,
            topic: None,
            row_schema: table.json.clone(),
            primary_key: table.primary_key.clone(),
            files: vec![],
            start: vec![ManifestStart {
                partition: 0,
                next_offset: 1,
                epoch: kafka_backfill::core::Epoch(2 << 16),
            }],
        },
    )
    .unwrap();
    let out = check();
    assert_eq!(out.status.code(), Some(2));
    let refused = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        refused.contains("job typed: store.store_datum = false needs a row schema of primitives")
            && refused.contains("manifest.json is "),
        "{refused}"
    );
    let run = Command::new(BIN)
        .args(["run", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!run.status.success());
    let run_err = String::from_utf8_lossy(&run.stderr);
    let message = refused
        .trim_start_matches("error: invalid configuration: ")
        .trim();
    assert!(
        run_err.contains(message),
        "run: {run_err}\ncheck-config: {message}"
    );
    write_config(true);
    let out = check();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn endpoints_prometheus_scrape_status_and_sigterm() {
    let _g = serial();
    let f = Fixture::new("service", 2, "");
    let addr = format!("127.0.0.1:{}", free_port());
    f.set_http(&addr);
    f.produce(&["--partitions", "4", "--rows", "2000", "--changes", "4000"]);
    let mut run = f.spawn_run("a", &[]);
    run.wait_for("serving /metrics", Duration::from_secs(30));
    let (code, body) = http_get(&format!("http://{addr}/livez"));
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, s) = http_get(&format!("http://{addr}/status"));
        let v: serde_json::Value = serde_json::from_str(&s).unwrap_or_default();
        let workers = v["jobs"][0]["workers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if workers.len() == 2
            && workers
                .iter()
                .all(|w| w["phase"] == "streaming" && w["caught_up"] == true)
        {
            assert_eq!(v["jobs"][0]["job"], "service");
            let vnodes: u64 = workers
                .iter()
                .map(|w| w["owned_vnodes"].as_u64().unwrap())
                .sum();
            assert_eq!(vnodes, 256, "the workers own every vnode between them");
            // Per vnode, from the store: all 256 streaming, finished, each owned by one of the
            // two workers, and both workers own some.
            let names: Vec<&str> = workers
                .iter()
                .map(|w| w["worker"].as_str().unwrap())
                .collect();
            let (code, body) = http_get(&format!("http://{addr}/status/jobs/service/vnodes"));
            assert_eq!(code, 200, "{body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            let rows = v["vnodes"].as_array().unwrap();
            assert_eq!(rows.len(), 256);
            let mut owners = std::collections::BTreeSet::new();
            for r in rows {
                assert_eq!(
                    (&r["phase"], &r["finished"]),
                    (&"streaming".into(), &true.into()),
                    "{r}"
                );
                assert!(r["epoch"].as_u64().unwrap() > 0, "{r}");
                owners.insert(r["owner"].as_str().unwrap().to_string());
            }
            assert_eq!(
                owners,
                names.iter().map(|n| n.to_string()).collect(),
                "owners are the two workers"
            );
            assert!(
                rows.iter()
                    .map(|r| r["row_count"].as_u64().unwrap())
                    .sum::<u64>()
                    > 0,
                "rows were counted"
            );
            assert_eq!(
                http_get(&format!("http://{addr}/status/jobs/nope/vnodes")).0,
                404
            );
            break;
        }
        assert!(Instant::now() < deadline, "not caught up: {s}");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(http_get(&format!("http://{addr}/readyz")).0, 200);
    assert_eq!(http_get(&format!("http://{addr}/nope")).0, 404);
    watch_plain_and_under_tmux(&addr);

    // The exposition is valid for promtool and holds the series.
    let (code, metrics) = http_get(&format!("http://{addr}/metrics"));
    assert_eq!(code, 200);
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(metrics.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for series in [
        "kafka_backfill_phase{job_name=\"service\"",
        "kafka_backfill_snapshot_rows_total{job_name=\"service\"} 2000",
        "kafka_backfill_checkpoints_total{cause=\"barrier\",job_name=\"service\"}",
        "kafka_backfill_checkpoint_commit_seconds_bucket",
        "kafka_backfill_log_records_applied_total",
        "kafka_backfill_epoch_lag_seconds",
        "kafka_backfill_catch_up_eta_seconds",
        "kafka_backfill_partition_lag",
        // What alerts read exists in a healthy run, at 0 (not absent until it first fires).
        "kafka_backfill_invariant_errors_total{job_name=\"service\"} 0",
        "kafka_backfill_decode_errors_total{job_name=\"service\"} 0",
        "kafka_backfill_dead_letters_total{job_name=\"service\"} 0",
        "kafka_backfill_kafka_client_errors_total{job_name=\"service\"}",
        "kafka_backfill_recreations_total{job_name=\"service\",reason=\"vnode_bitmap_update_in_log_store\"} 0",
        "kafka_backfill_snapshot_moves_total{job_name=\"service\"} 0",
        "kafka_backfill_vnode_bitmap_updates_total{job_name=\"service\",outcome=\"invariant_error\",phase=\"log_store\"} 0",
        "kafka_backfill_paused{job_name=\"service\",worker=",
        "kafka_backfill_store_unreachable{job_name=\"service\",worker=",
        // Which build, and the process.
        "kafka_backfill_build_info{commit=\"",
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
    ] {
        assert!(metrics.contains(series), "no {series} in:\n{metrics}");
    }
    assert!(
        metrics.contains(&format!("version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"))),
        "{metrics}"
    );
    // Every family docs/OPERATIONS.md's reference lists is in a healthy run of one table, but a
    // capture's (another process) and those only a job of several tables or of `consistency =
    // "epoch"` has: an alert or a dashboard panel never reads "no data" where the docs promise a
    // series.
    let exposed: BTreeSet<&str> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let missing: Vec<String> = documented_metric_families()
        .into_iter()
        .filter(|m| {
            !m.starts_with("kafka_backfill_capture_")
                && !m.starts_with("kafka_backfill_table_")
                && m != "kafka_backfill_publication_lag_seconds"
                && !exposed.contains(m.as_str())
        })
        .collect();
    assert!(
        missing.is_empty(),
        "documented in docs/OPERATIONS.md, absent from a healthy run: {missing:?}"
    );

    // A real Prometheus server scrapes it.
    let prom_dir = f.dir.join("prometheus");
    std::fs::create_dir_all(&prom_dir).unwrap();
    let prom_port = free_port();
    std::fs::write(
        prom_dir.join("prometheus.yml"),
        format!("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: kafka-backfill\n    static_configs:\n      - targets: ['{addr}']\n"),
    )
    .unwrap();
    let mut prom = Command::new("prometheus")
        .arg(format!(
            "--config.file={}",
            prom_dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            prom_dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus (Debian package)");
    let deadline = Instant::now() + Duration::from_secs(60);
    let scraped = loop {
        let (code, body) = http_get(&format!(
            "http://127.0.0.1:{prom_port}/api/v1/query?query=kafka_backfill_snapshot_rows_total"
        ));
        if code == 200 && body.contains("\"job_name\":\"service\"") && body.contains("2000") {
            break body;
        }
        if Instant::now() > deadline {
            break String::new();
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let _ = prom.kill();
    let _ = prom.wait();
    assert!(!scraped.is_empty(), "Prometheus never scraped the series");

    // `status` prints it for a person, finding the endpoint in the service's config.
    let out = Command::new(BIN)
        .args(["status", "--config"])
        .arg(&f.config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && text
                .lines()
                .any(|l| l.starts_with("service  a-0") && l.contains("streaming"))
            && !text.contains("null"),
        "{text}"
    );

    // SIGTERM: leaves the group and exits 0 within the grace period.
    let t = Instant::now();
    run.signal("TERM");
    let status = run.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{}", support::tail(&run.log_text()));
    assert!(t.elapsed() < Duration::from_secs(15));
    assert!(run.log_text().contains("worker stopped"));
}

#[test]
fn demo_runs_on_embedded_defaults_and_shows_the_recreation() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("demo-{}", std::process::id()));
    let out = Command::new(BIN)
        .args([
            "demo",
            "--rescale",
            "--rows",
            "4000",
            "--changes",
            "12000",
            "--throttle",
            "6000",
            "--dir",
        ])
        .arg(&dir)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("should not update vnode bitmap during consuming log store"),
        "{stderr}"
    );
    assert!(
        stdout.contains("0 missing, 0 extra, 0 different") && stdout.contains("clean"),
        "{stdout}"
    );
    assert!(stdout.contains("recreations: 1"), "{stdout}");
    assert!(dir.join("state.sqlite").is_file());
}

#[test]
fn a_second_signal_exits_at_once() {
    let _g = serial();
    let f = Fixture::new("twosignals", 1, "");
    // A dynamic member: its stop leaves the group, which takes long enough to send the second
    // signal into (a static member closes at once and may exit before it arrives).
    f.edit_config(
        "\"session.timeout.ms\" = \"6000\"",
        "\"session.timeout.ms\" = \"6000\"\n\"group.instance.id\" = \"\"",
    );
    f.produce(&["--partitions", "2", "--rows", "100", "--changes", "100"]);
    let mut run = f.spawn_run("a", &[]);
    run.wait_for("partitions assigned", Duration::from_secs(60));
    run.signal("INT");
    // The second signal after the first was taken (two signals sent back to back may be delivered
    // as one).
    run.wait_for("signal received: stopping", Duration::from_secs(10));
    run.signal("INT");
    let status = run.wait_exit(Duration::from_secs(10));
    assert_eq!(
        status.code(),
        Some(130),
        "{}",
        support::tail(&run.log_text())
    );
}

/// 2,000 idle HTTP connections opened while a job runs: `/livez` keeps answering and the job still
/// finishes and verifies clean.
#[test]
fn a_connection_flood_neither_stops_livez_nor_the_job() {
    let _g = serial();
    // Throttled, so the job is still running while the flood is on.
    let f = Fixture::new("flood", 1, "max_rows_per_second = 600");
    let addr = format!("127.0.0.1:{}", free_port());
    f.set_http(&addr);
    f.produce(&["--partitions", "2", "--rows", "3000", "--changes", "6000"]);
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    run.wait_for("serving /metrics", Duration::from_secs(30));
    let idle: Vec<std::net::TcpStream> = (0..2000)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    let started = Instant::now();
    let (code, body) = http_get(&format!("http://{addr}/livez"));
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    // Under the 5 s header timeout: /livez did not wait for idle connections to be cut.
    assert!(started.elapsed() < Duration::from_secs(4));
    let status = run.wait_exit(Duration::from_secs(120));
    assert!(status.success(), "{}", support::tail(&run.log_text()));
    drop(idle);
    let out = f.verify();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `status --watch` on a caught-up job: plain lines into a pipe, ended by `--until-caught-up`;
/// progress bars in a terminal (a detached tmux pane, read back with `capture-pane`).
fn watch_plain_and_under_tmux(addr: &str) {
    let url = format!("http://{addr}");
    let args = [
        "status",
        "--watch",
        "--until-caught-up",
        "--interval-ms",
        "200",
        "--url",
        url.as_str(),
    ];
    let out = Command::new(BIN).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.lines()
            .any(|l| l == "job service: snapshot 256/256 vnodes; log store: caught up"),
        "plain lines when stdout is a pipe: {text}"
    );

    let session = format!("kbwatch{}", std::process::id());
    let tmux = |a: &[&str]| {
        let o = Command::new("tmux")
            .args(["-f", "/dev/null"])
            .args(a)
            .output()
            .expect("tmux");
        assert!(
            o.status.success(),
            "tmux {a:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    tmux(&["new-session", "-d", "-s", &session, "-x", "150", "-y", "10"]);
    tmux(&["set-option", "-t", &session, "remain-on-exit", "on"]);
    // The live view (no --until-caught-up): read while it runs.
    let cmd = [
        BIN,
        "status",
        "--watch",
        "--interval-ms",
        "200",
        "--url",
        &url,
    ]
    .join(" ");
    tmux(&["respawn-pane", "-k", "-t", &session, &cmd]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let pane = loop {
        let pane = tmux(&["capture-pane", "-p", "-t", &session]);
        if pane.contains("256/256") && pane.contains("caught up") {
            break pane;
        }
        assert!(Instant::now() < deadline, "no view in the terminal: {pane}");
        std::thread::sleep(Duration::from_millis(100));
    };
    tmux(&["kill-session", "-t", &session]);
    assert!(
        pane.contains("service snapshot vnodes") && pane.contains("256/256"),
        "a snapshot bar: {pane}"
    );
    assert!(
        pane.contains("service log store records")
            && pane.contains("[=")
            && pane.contains("caught up"),
        "a log-store bar, drawn: {pane}"
    );
}

/// The worker's `rate_limits` in `/status`, once it reports.
fn worker_limits(addr: &str) -> Option<(u64, u64)> {
    let (_, s) = http_get(&format!("http://{addr}/status"));
    let v: serde_json::Value = serde_json::from_str(&s).ok()?;
    let l = &v["jobs"][0]["workers"][0]["rate_limits"];
    Some((
        l["snapshot_rows_per_second"].as_u64()?,
        l["log_records_per_second"].as_u64()?,
    ))
}

fn wait_limits(addr: &str, want: (u64, u64), within: Duration) -> Duration {
    let t = Instant::now();
    while worker_limits(addr) != Some(want) {
        assert!(
            t.elapsed() < within,
            "the worker reports {:?}, not {want:?}",
            worker_limits(addr)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    t.elapsed()
}

/// `kafka-backfill rate-limit` against a running job: applied by the worker within a second (as
/// `/status` and the gauge show), kept in the store across a restart; the write endpoint listens
/// only when `http.admin = true`, on its own (loopback) address.
#[test]
fn a_live_rate_limit_reaches_the_worker_within_a_second_and_survives_a_restart() {
    let _g = serial();
    let f = Fixture::new("ratelimit", 1, "max_rows_per_second = 400");
    let addr = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    f.set_http(&addr);
    let text = std::fs::read_to_string(&f.config).unwrap();
    std::fs::write(
        &f.config,
        text.replacen(
            "[http]\n",
            &format!("[http]\nadmin = true\nadmin_listen = \"{admin}\"\n"),
            1,
        ),
    )
    .unwrap();
    f.produce(&["--partitions", "2", "--rows", "300", "--changes", "20000"]);
    let mut run = f.spawn_run("a", &[]);
    run.wait_for(
        "serving /admin/jobs/{name}/rate-limit",
        Duration::from_secs(30),
    );
    // The configured limit holds until a live one is set.
    wait_limits(&addr, (400, 400), Duration::from_secs(30));
    let cli = |args: &[&str]| {
        support::run_json(
            Command::new(BIN)
                .args([
                    "rate-limit",
                    "--url",
                    &format!("http://{admin}"),
                    "--job",
                    "ratelimit",
                ])
                .args(args),
        )
    };
    assert_eq!(cli(&[])["source"], "max_rows_per_second");
    let set = cli(&["--log", "5000"]);
    assert_eq!(
        (
            &set["snapshot_rows_per_second"],
            &set["log_records_per_second"],
            &set["source"]
        ),
        (&400.into(), &5000.into(), &"store".into()),
        "a missing limit keeps its value"
    );
    let took = wait_limits(&addr, (400, 5000), Duration::from_secs(5));
    assert!(
        took <= Duration::from_secs(1),
        "applied {took:?} after the answer"
    );
    let (_, metrics) = http_get(&format!("http://{addr}/metrics"));
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("kafka_backfill_rate_limit{")
                && l.contains("kind=\"log_records\"")
                && l.ends_with(" 5000")),
        "the gauge shows it"
    );
    cli(&["--snapshot", "700", "--log", "300"]);
    wait_limits(&addr, (700, 300), Duration::from_secs(5));
    // Bad input is refused, naming it; an unknown job is 404.
    let bad = Command::new(BIN)
        .args([
            "rate-limit",
            "--url",
            &format!("http://{admin}"),
            "--job",
            "nope",
            "--log",
            "1",
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("404"));
    let (code, body) = kafka_backfill::service::http::request(
        "POST",
        &format!("http://{admin}/admin/jobs/ratelimit/rate-limit?log=x"),
    )
    .unwrap();
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("log=\"x\": not a whole number"), "{body}");
    assert_eq!(
        worker_limits(&addr),
        Some((700, 300)),
        "a refused change changes nothing"
    );
    // A restart starts with the store's limits, not the configured ones.
    run.signal("TERM");
    assert!(run.wait_exit(Duration::from_secs(60)).success());
    let mut again = f.spawn_run("a2", &[]);
    again.wait_for("serving /metrics", Duration::from_secs(30));
    wait_limits(&addr, (700, 300), Duration::from_secs(30));
    again.signal("TERM");
    assert!(again.wait_exit(Duration::from_secs(60)).success());
}

/// Sum over the first worker's partitions of `/status`'s `key` (`next_offset`, `high_watermark`).
fn offsets(w: &serde_json::Value, key: &str) -> u64 {
    w["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p[key].as_u64())
        .sum()
}

/// `kafka-backfill pause` / `resume` on a running job, through the write endpoint with a bearer
/// token: within a second the worker reports paused and stops reading (the high watermark moves on
/// while its read position stands), it stays in its group (no revocation), and after `resume` the
/// job catches up and verifies exactly. A missing or wrong token is 401, counted, and changes nothing.
#[test]
fn a_paused_job_stops_reading_stays_in_its_group_and_resumes_exactly() {
    let _g = serial();
    let f = Fixture::new("pause", 1, "max_rows_per_second = 3000");
    let addr = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    f.set_http(&addr);
    // The child reads the token from the environment it inherits.
    std::env::set_var("KB_TEST_ADMIN_TOKEN", "s3cret-pause-token");
    f.edit_config(
        "[http]\n",
        &format!("[http]\nadmin = true\nadmin_listen = \"{admin}\"\nadmin_token = \"${{KB_TEST_ADMIN_TOKEN}}\"\n"),
    );
    f.produce(&["--partitions", "4", "--rows", "300", "--changes", "40000"]);
    let mut run = f.spawn_run("a", &[]);
    run.wait_for(
        "serving /admin/jobs/{name}/rate-limit",
        Duration::from_secs(30),
    );
    run.wait_for("to=\"log_store\"", Duration::from_secs(60));
    let pause_url = format!("http://{admin}/admin/jobs/pause/pause");
    for token in [None, Some("wrong")] {
        let (code, body) =
            kafka_backfill::service::http::request_with("POST", &pause_url, token).unwrap();
        assert_eq!(code, 401, "{body}");
    }
    let (_, m) = http_get(&format!("http://{addr}/metrics"));
    assert!(
        m.lines()
            .any(|l| l == "kafka_backfill_http_unauthorized_total 2"),
        "both refusals counted"
    );
    assert_eq!(
        support::status(&addr)["jobs"][0]["workers"][0]["paused"],
        false
    );
    // The CLI reads the endpoint, the token and the job from the service's config.
    let cli = |what: &str| {
        support::run_json(
            Command::new(BIN)
                .args([what, "--config"])
                .arg(&f.config)
                .env_remove("KAFKA_BACKFILL_ADMIN_TOKEN"),
        )
    };
    assert_eq!(cli("pause")["paused"], true);
    let t = Instant::now();
    support::wait_status(&addr, Duration::from_secs(5), "paused", |w| {
        w["paused"] == true
    });
    assert!(
        t.elapsed() <= Duration::from_secs(1),
        "paused after {:?}",
        t.elapsed()
    );
    let log_at_pause = run.log_text().len();
    // Nothing is read any more: once the rate has dropped to nothing, the read position stands
    // while more changes arrive and the worker, still polling, sees the high watermark move on.
    support::wait_status(&addr, Duration::from_secs(30), "idle", |w| {
        w["records_per_second"].as_f64().is_some_and(|r| r < 1.0)
    });
    let w = &support::status(&addr)["jobs"][0]["workers"][0];
    let (read, high) = (offsets(w, "next_offset"), offsets(w, "high_watermark"));
    let writer = f.append(&["--changes", "2000", "--seed", "9"]);
    assert!(writer.wait_with_output().unwrap().status.success());
    support::wait_status(&addr, Duration::from_secs(30), "the new watermark", |w| {
        offsets(w, "high_watermark") > high
    });
    let w = &support::status(&addr)["jobs"][0]["workers"][0];
    assert_eq!(offsets(w, "next_offset"), read, "read while paused: {w}");
    assert!(
        !run.log_text()[log_at_pause..].contains("partitions revoked"),
        "the paused member left its group"
    );
    assert_eq!(cli("resume")["paused"], false);
    support::wait_status(&addr, Duration::from_secs(5), "resumed", |w| {
        w["paused"] == false
    });
    support::wait_status(&addr, Duration::from_secs(120), "caught up", |w| {
        w["caught_up"] == true
    });
    let text = f.verify_eventually(Duration::from_secs(60));
    assert!(text.contains(" 0 missing, 0 extra, 0 different"), "{text}");
    run.signal("TERM");
    assert!(run.wait_exit(Duration::from_secs(60)).success());
}

/// `doctor` passes on a job whose parts are all there, one line per check, and names each part it
/// cannot reach or find — a misspelt topic, a dead broker port, a wrong PostgreSQL port, a missing
/// snapshot folder — within seconds, exit 4.
#[test]
fn doctor_reaches_every_part_and_names_what_it_cannot() {
    let _g = serial();
    let f = Fixture::new("doctor", 1, "");
    f.produce(&["--partitions", "2", "--rows", "50", "--changes", "10"]);
    let (code, out, _) = doctor(&f);
    assert_eq!(code, 0, "{out}");
    doctor_line(&out, "ok", "topic e2e-doctor-");
    doctor_line(&out, "ok", "consumer group kb-doctor-");
    doctor_line(&out, "ok", "store (sqlite");
    assert!(
        doctor_line(&out, "ok", "snapshot").contains("manifest.json read and matches the job"),
        "{out}"
    );
    assert!(out.contains("all 4 checks passed"), "{out}");
    // The same checks as JSON.
    let json = Command::new(BIN)
        .args(["doctor", "--json", "--config"])
        .arg(&f.config)
        .output()
        .unwrap();
    let checks: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(checks.as_array().map(Vec::len), Some(4), "{checks}");
    assert!(
        checks
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["ok"] == true && c["job"] == "doctor"),
        "{checks}"
    );
    // The CLI reads the config: without the write endpoint, `pause` says how to turn it on.
    let pause = Command::new(BIN)
        .args(["pause", "--config"])
        .arg(&f.config)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&pause.stderr);
    assert!(
        !pause.status.success()
            && said.contains("http.admin is false, so the service has no write endpoint; set [http] admin = true"),
        "{said}"
    );

    // More partitions than vnodes: named on the topic's line.
    f.edit_config("workers = 1\n", "workers = 1\nvnode_count = 1\n");
    let (code, out, _) = doctor(&f);
    assert_eq!(code, 4, "{out}");
    assert!(
        doctor_line(&out, "FAIL", "topic e2e-doctor-")
            .contains("has 2 partition(s), but the job's vnode_count is 1"),
        "{out}"
    );
    f.edit_config("workers = 1\nvnode_count = 1\n", "workers = 1\n");

    let topic = format!("topic = \"{}\"", f.topic);
    f.edit_config(&topic, "topic = \"no-such-topic\"");
    let (code, out, _) = doctor(&f);
    assert_eq!(code, 4, "{out}"); // unreachable
    assert!(
        doctor_line(&out, "FAIL", "topic no-such-topic")
            .contains("topic no-such-topic does not exist"),
        "{out}"
    );
    f.edit_config("topic = \"no-such-topic\"", &topic);

    let bootstrap = format!("\"bootstrap.servers\" = \"{}\"", f.bootstrap);
    f.edit_config(&bootstrap, "\"bootstrap.servers\" = \"127.0.0.1:1\"");
    let (code, out, took) = doctor(&f);
    assert_eq!(code, 4, "{out}"); // unreachable
    doctor_line(&out, "FAIL", "kafka 127.0.0.1:1");
    assert!(took < Duration::from_secs(15), "{took:?}: {out}");
    f.edit_config("\"bootstrap.servers\" = \"127.0.0.1:1\"", &bootstrap);

    let snapshot = format!("dir = \"{}\"", f.dir.join("out/snapshot").display());
    f.edit_config(&snapshot, "dir = \"/nonexistent/snapshot\"");
    let (code, out, _) = doctor(&f);
    assert_eq!(code, 4, "{out}"); // unreachable
    assert!(
        doctor_line(&out, "FAIL", "snapshot")
            .contains("the folder /nonexistent/snapshot does not exist"),
        "{out}"
    );
    f.edit_config("dir = \"/nonexistent/snapshot\"", &snapshot);

    f.use_postgres("postgresql://postgres@127.0.0.1:1/kafka_backfill");
    let (code, out, took) = doctor(&f);
    assert_eq!(code, 4, "{out}"); // unreachable
    assert!(
        doctor_line(&out, "FAIL", "store (postgres").contains("127.0.0.1:1"),
        "{out}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}: {out}");
    f.use_postgres(&support::pg_url());
    let (code, out, _) = doctor(&f);
    assert_eq!(code, 0, "{out}");
    doctor_line(&out, "ok", "store (postgres");
}

/// `check-config` accepts what `run` accepts: the one-job form of a several-table file snapshot
/// (`store.tables`, `consistency = "epoch"`, no `snapshot.table`) — it read the snapshot its own
/// way and refused it ("the manifest holds 2 tables"); both now open it with one function.
#[test]
fn check_config_accepts_the_one_job_form_of_a_several_table_snapshot() {
    let _g = serial();
    let f = Fixture::new("severalcfg", 1, "consistency = \"epoch\"");
    f.produce(&[
        "--partitions",
        "2",
        "--rows",
        "40",
        "--changes",
        "20",
        "--tables",
        "2",
    ]);
    f.edit_config(
        "table = \"accounts\"",
        "tables = { accounts_1 = \"a1\", accounts_2 = \"a2\" }",
    );
    let out = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(&f.config)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    assert!(
        run.wait_exit(Duration::from_secs(120)).success(),
        "{}",
        support::tail(&run.log_text())
    );
    // A table the manifest does not hold is refused by both, naming it.
    f.edit_config("accounts_2 = \"a2\"", "accounts_9 = \"a9\"");
    let out = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(&f.config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("accounts_9"), "{text}");
}

/// One table of exit codes (`src/service/exit.rs`): a wrong flag is a usage error (64), not a
/// configuration error (2); `--help` ends with the table; a service that does not answer is
/// unreachable (4).
#[test]
fn exit_codes_tell_usage_configuration_and_unreachable_apart() {
    let out = Command::new(BIN)
        .args(["run", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let help = Command::new(BIN).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert_eq!(help.status.code(), Some(0));
    assert!(
        text.contains("Exit codes:") && text.contains(" 64  the command line is wrong"),
        "{text}"
    );
    let url = format!("http://127.0.0.1:{}", free_port());
    let out = Command::new(BIN)
        .args(["status", "--url", &url])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("connecting to 127.0.0.1:"), "{err}");
}

/// `run` at start reaches the job's brokers and store within a bound (`doctor::wait_reachable`): a
/// dead broker port or a wrong PostgreSQL port is one clear line and exit 4 within seconds — it
/// used to be 14 s of repeated client warnings, or 29.6 s of silence for the store.
#[test]
fn run_names_an_unreachable_broker_or_store_within_seconds() {
    let _g = serial();
    let f = Fixture::new("unreach", 1, "");
    f.produce(&["--partitions", "1", "--rows", "10", "--changes", "10"]);
    let run = |what: &str| {
        let started = std::time::Instant::now();
        let out = Command::new(BIN)
            .args(["run", "--config"])
            .arg(&f.config)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(4), "{what}: {err}");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{what}: {:?}",
            started.elapsed()
        );
        assert!(
            err.contains(what) && err.contains("did not answer within 10s"),
            "{what}: {err}"
        );
        assert_eq!(
            err.matches("retrying for up to 10 s").count(),
            1,
            "the retry said once: {err}"
        );
    };
    let bootstrap = format!("\"bootstrap.servers\" = \"{}\"", f.bootstrap);
    f.edit_config(&bootstrap, "\"bootstrap.servers\" = \"127.0.0.1:1\"");
    run("kafka 127.0.0.1:1");
    f.edit_config("\"bootstrap.servers\" = \"127.0.0.1:1\"", &bootstrap);
    f.use_postgres("postgresql://postgres@127.0.0.1:1/kafka_backfill");
    run("store (postgres");
}

/// `produce --config F` writes the log the configured job reads (its topic, vnodes and brokers
/// from the file, no flag repeated); the job then replays it exactly.
#[test]
fn produce_reads_the_job_from_the_config() {
    let _g = serial();
    let f = Fixture::new("produce-config", 1, "");
    let out = Command::new(BIN)
        .args(["produce", "--config"])
        .arg(&f.config)
        .args([
            "--partitions",
            "2",
            "--rows",
            "200",
            "--changes",
            "400",
            "--out",
        ])
        .arg(f.dir.join("out"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains(&f.topic), "{said}");
    // Before any run, verify says why the replica is empty rather than only "missing".
    let before = f.verify();
    let text = String::from_utf8_lossy(&before.stdout).to_string();
    assert_eq!(before.status.code(), Some(1), "{text}");
    assert!(
        text.contains("hint: job produce-config has committed nothing to this store: is `kafka-backfill run` running?"),
        "{text}"
    );
    let mut run = f.spawn_run("a", &["--exit-when-caught-up"]);
    assert!(run.wait_exit(Duration::from_secs(120)).success());
    let text = String::from_utf8_lossy(&f.verify().stdout).to_string();
    assert!(text.contains(" 0 missing, 0 extra, 0 different"), "{text}");
    // The commands that report say it as JSON too.
    let json = |args: &[&str]| -> serde_json::Value {
        let out = Command::new(BIN)
            .args(args)
            .arg("--config")
            .arg(&f.config)
            .arg("--json")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let expected = f.dir.join("out/expected");
    let v = json(&["verify", "--expected", expected.to_str().unwrap()]);
    assert_eq!(v["clean"], true, "{v}");
    assert_eq!(v["report"]["missing"], 0, "{v}");
    let c = json(&["check-log"]);
    assert_eq!(c["report"]["violation_count"], 0, "{c}");
    assert_eq!(c["report"]["partitions"], 2, "{c}");
    // A flag the configuration gives is refused beside it.
    let out = Command::new(BIN)
        .args(["produce", "--topic", "other", "--config"])
        .arg(&f.config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}
