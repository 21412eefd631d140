//! The service as an operator meets it: configuration errors, HTTP endpoints, the Prometheus scrape
//! (real `promtool` and a real Prometheus server), `status`, and SIGTERM.

mod support;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{free_port, http_get, serial, Fixture, BIN};

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
    let out = Command::new(BIN)
        .args([
            "check-config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/example.toml"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
            break;
        }
        assert!(Instant::now() < deadline, "not caught up: {s}");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(http_get(&format!("http://{addr}/readyz")).0, 200);
    assert_eq!(http_get(&format!("http://{addr}/nope")).0, 404);

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
        "kafka_backfill_partition_lag",
    ] {
        assert!(metrics.contains(series), "no {series} in:\n{metrics}");
    }

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

    // `status` prints it for a person.
    let out = Command::new(BIN)
        .args(["status", "--url", &format!("http://{addr}")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("job service") && text.contains("phase streaming"),
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
