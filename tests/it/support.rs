//! Helpers for tests that run the real binary against the real broker (`scripts/kafka.sh`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_kafka-backfill");

/// The broker's bootstrap address: `KAFKA_BOOTSTRAP`, else `scripts/kafka.sh start` (idempotent).
pub fn bootstrap() -> String {
    static B: OnceLock<String> = OnceLock::new();
    B.get_or_init(|| {
        if let Ok(b) = std::env::var("KAFKA_BOOTSTRAP") {
            return b;
        }
        let out = Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kafka.sh"))
            .arg("start")
            .output()
            .expect("running scripts/kafka.sh start");
        assert!(
            out.status.success(),
            "scripts/kafka.sh start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    })
    .clone()
}

/// How many real-process tests run at once (`KB_TEST_LANES`, default 3). Each runs several
/// processes, but most of their time is spent waiting on the broker (group joins, session timeouts)
/// and on each other, not on the machine's two cores.
fn lanes() -> usize {
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("KB_TEST_LANES")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|n| *n > 0)
            .unwrap_or(3)
    })
}

/// A lane of the real-process tests (or all of them: [`alone`]), held for the test's length (see
/// [`serial`]).
pub struct Lane(usize);

impl Drop for Lane {
    fn drop(&mut self) {
        let (m, cv) = &*LANES;
        m.lock().unwrap_or_else(|e| e.into_inner()).busy -= self.0;
        cv.notify_all();
    }
}

static LANES: std::sync::LazyLock<(Mutex<Lanes>, std::sync::Condvar)> =
    std::sync::LazyLock::new(|| (Mutex::new(Lanes::default()), std::sync::Condvar::new()));

/// Real-process tests take a lane: at most [`lanes`] run at once. Their topics, groups, folders,
/// ports, databases and job names are their own, so they do not see each other. Tests that stop
/// or restart the shared broker or PostgreSQL live in the `outages` module, which
/// `scripts/test.sh` runs on its own after every other test.
pub fn serial() -> Lane {
    take_lanes(1)
}

/// Every lane: no other real-process test runs meanwhile. For a test that judges the machine's
/// own timing (commit latencies against a target), which the other lanes' processes would move.
pub fn alone() -> Lane {
    take_lanes(lanes())
}

/// Takes `n` lanes once they are free. A test waiting for every lane is served before any that
/// asks after it (no lane is handed out meanwhile), so it does not wait for the whole run.
fn take_lanes(n: usize) -> Lane {
    let (m, cv) = &*LANES;
    let mut lanes_now = m.lock().unwrap_or_else(|e| e.into_inner());
    let alone = n == lanes();
    if alone {
        while lanes_now.reserved {
            lanes_now = cv.wait(lanes_now).unwrap_or_else(|e| e.into_inner());
        }
        lanes_now.reserved = true;
    }
    while lanes_now.busy + n > lanes() || (!alone && lanes_now.reserved) {
        lanes_now = cv.wait(lanes_now).unwrap_or_else(|e| e.into_inner());
    }
    lanes_now.busy += n;
    if alone {
        lanes_now.reserved = false;
    }
    Lane(n)
}

/// The lanes handed out, and whether a test waits for all of them.
#[derive(Default)]
struct Lanes {
    busy: usize,
    reserved: bool,
}

/// One test's topic, folder and configuration.
pub struct Fixture {
    pub name: String,
    pub topic: String,
    pub group: String,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub bootstrap: String,
}

impl Fixture {
    pub fn new(name: &str, workers: u32, extra_job_toml: &str) -> Fixture {
        let bootstrap = bootstrap();
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis();
        let topic = format!("e2e-{name}-{stamp}");
        let group = format!("kb-{name}-{stamp}");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("e2e-{name}-{stamp}"));
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("job.toml");
        let toml = format!(
            r#"[http]
listen = ""
[[jobs]]
name = "{name}"
topic = "{topic}"
workers = {workers}
{extra_job_toml}
[jobs.kafka]
"bootstrap.servers" = "{bootstrap}"
"group.id" = "{group}"
"session.timeout.ms" = "6000"
"heartbeat.interval.ms" = "500"
[jobs.snapshot]
kind = "files"
dir = "{snap}"
[jobs.store]
kind = "sqlite"
path = "{db}"
table = "accounts"
[jobs.local_checkpoint]
max_rows = 500
interval_ms = 200
[jobs.recreation]
backoff_initial_ms = 100
backoff_max_ms = 1000
"#,
            snap = dir.join("out/snapshot").display(),
            db = dir.join("state.sqlite").display(),
        );
        std::fs::write(&config, toml).unwrap();
        Fixture {
            name: name.to_string(),
            topic,
            group,
            dir,
            config,
            bootstrap,
        }
    }

    /// Sets `[jobs.recreation] policy` in this fixture's config.
    pub fn set_recreation_policy(&self, policy: &str) {
        let text = std::fs::read_to_string(&self.config).unwrap();
        let text = text.replace(
            "[jobs.recreation]\n",
            &format!("[jobs.recreation]\npolicy = \"{policy}\"\n"),
        );
        std::fs::write(&self.config, text).unwrap();
    }

    /// Replaces `from` with `to` in this fixture's config (once; `from` must be there).
    pub fn edit_config(&self, from: &str, to: &str) {
        let text = std::fs::read_to_string(&self.config).unwrap();
        assert!(text.contains(from), "{from:?} is not in the config");
        std::fs::write(&self.config, text.replacen(from, to, 1)).unwrap();
    }

    /// KIP-848: `"group.protocol" = "consumer"`, without the classic protocol's timeouts (librdkafka
    /// refuses them under it; the broker's `group.consumer.*` settings in `scripts/kafka.sh` rule).
    pub fn use_consumer_protocol(&self) {
        self.edit_config(
            "\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n",
            "\"group.protocol\" = \"consumer\"\n",
        );
    }

    pub fn db(&self) -> PathBuf {
        self.dir.join("state.sqlite")
    }

    /// `kafka-backfill produce` into this fixture's topic and folder.
    pub fn produce(&self, args: &[&str]) {
        let out = Command::new(BIN)
            .args([
                "produce",
                "--bootstrap",
                &self.bootstrap,
                "--topic",
                &self.topic,
                "--out",
            ])
            .arg(self.dir.join("out"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "produce failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts `kafka-backfill produce --append` (more changes continuing this fixture's log chain) with
    /// extra flags; the caller waits for it.
    pub fn append(&self, args: &[&str]) -> Child {
        Command::new(BIN)
            .args([
                "produce",
                "--append",
                "--bootstrap",
                &self.bootstrap,
                "--topic",
                &self.topic,
                "--partitions",
                "4",
            ])
            .args(args)
            .arg("--out")
            .arg(self.dir.join("out"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Starts `kafka-backfill run`, logging to `<dir>/<prefix>.log`.
    pub fn spawn_run(&self, prefix: &str, args: &[&str]) -> Runner {
        self.spawn_run_serving(prefix, args, "")
    }

    /// [`Fixture::spawn_run`] serving `/status` and `/metrics` on `http` (an override of
    /// `http.listen`, so processes sharing the configuration do not share the port; "" = as
    /// configured).
    pub fn spawn_run_serving(&self, prefix: &str, args: &[&str], http: &str) -> Runner {
        let mut cmd = Command::new(BIN);
        if !http.is_empty() {
            cmd.env("KAFKA_BACKFILL__HTTP__LISTEN", http);
        }
        cmd.args(["run", "--config"])
            .arg(&self.config)
            .args(["--worker-prefix", prefix])
            .args(args);
        self.spawn_logging(prefix, cmd, false)
    }

    /// Starts `kafka-backfill <subcommand> --config <this job's>`, its output and its log both in
    /// `<dir>/<prefix>.log`.
    pub fn spawn_subcommand(&self, prefix: &str, subcommand: &str) -> Runner {
        let mut cmd = Command::new(BIN);
        cmd.args([subcommand, "--config"]).arg(&self.config);
        self.spawn_logging(prefix, cmd, true)
    }

    /// Spawns `cmd` logging to `<dir>/<prefix>.log`, with its stdout if `stdout` (else discarded).
    fn spawn_logging(&self, prefix: &str, mut cmd: Command, stdout: bool) -> Runner {
        let log = self.dir.join(format!("{prefix}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let out = if stdout {
            Stdio::from(file.try_clone().unwrap())
        } else {
            Stdio::null()
        };
        let child = cmd
            // What a user sees by default (info) for every crate, and the service's debug lines.
            .env("RUST_LOG", "info,kafka_backfill=debug,librdkafka=warn")
            .env("NO_COLOR", "1")
            .stdout(out)
            .stderr(file)
            .spawn()
            .unwrap();
        Runner { child, log }
    }

    pub fn verify(&self) -> Output {
        Command::new(BIN)
            .args(["verify", "--config"])
            .arg(&self.config)
            .arg("--expected")
            .arg(self.dir.join("out/expected"))
            .output()
            .unwrap()
    }

    /// Verifies until clean or the deadline.
    pub fn verify_eventually(&self, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let out = self.verify();
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            if out.status.success() {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "verify never became clean: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    pub fn sql<T: rusqlite::types::FromSql>(&self, query: &str) -> Vec<Vec<T>> {
        let conn = rusqlite::Connection::open(self.db()).unwrap();
        let mut stmt = conn.prepare(query).unwrap();
        let n = stmt.column_count();
        stmt.query_map([], |r| (0..n).map(|i| r.get(i)).collect())
            .unwrap()
            .map(|r| r.unwrap())
            .collect()
    }

    /// Deletes the records of the fixture's topic below `(partition, offset)` each (what retention
    /// does), with Kafka's `DeleteRecords` tool.
    pub fn delete_records(&self, below: &[(u32, u64)]) {
        let file = self.dir.join("delete.json");
        let partitions: Vec<serde_json::Value> = below
            .iter()
            .map(|(p, o)| serde_json::json!({"topic": self.topic, "partition": p, "offset": o}))
            .collect();
        std::fs::write(
            &file,
            serde_json::json!({"version": 1, "partitions": partitions}).to_string(),
        )
        .unwrap();
        self.kafka_tool(&[
            "org.apache.kafka.tools.DeleteRecordsCommand",
            "--bootstrap-server",
            &self.bootstrap,
            "--offset-json-file",
            file.to_str().unwrap(),
        ]);
    }

    /// Runs a Kafka tool class with the broker's classpath.
    pub fn kafka_tool(&self, args: &[&str]) -> String {
        let out = Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kafka.sh"))
            .arg("tool")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kafka tool failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }
}

/// A running `kafka-backfill run`.
pub struct Runner {
    pub child: Child,
    pub log: PathBuf,
}

impl Runner {
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle`.
    pub fn wait_for(&mut self, needle: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.log_text().contains(needle) {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "process exited ({status}) before logging {needle:?}:\n{}",
                    tail(&self.log_text())
                );
            }
            assert!(
                Instant::now() < deadline,
                "no {needle:?} within {within:?}:\n{}",
                tail(&self.log_text())
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the log contains `needle` at least `n` times.
    pub fn wait_for_count(&mut self, needle: &str, n: usize, within: Duration) {
        let deadline = Instant::now() + within;
        while self.log_text().matches(needle).count() < n {
            assert!(
                Instant::now() < deadline,
                "fewer than {n} {needle:?} within {within:?}:\n{}",
                tail(&self.log_text())
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for exit; returns the status.
    pub fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "process did not exit within {within:?}:\n{}",
                    tail(&self.log_text())
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn signal(&self, sig: &str) {
        Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap();
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `scripts/<name> <arg>`, which must succeed (service outages and restarts).
pub fn script(name: &str, arg: &str) {
    let out = Command::new("bash")
        .arg(format!("{}/scripts/{name}", env!("CARGO_MANIFEST_DIR")))
        .arg(arg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/{name} {arg}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The last 25 lines above DEBUG of every process log (`*.log`) in `dir`: what a failing end
/// assertion prints, so a failure on CI can be read without the files.
pub fn log_tails(dir: &Path) -> String {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    logs.retain(|p| p.extension().is_some_and(|e| e == "log"));
    logs.sort();
    let mut out = String::new();
    for p in logs {
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.contains(" DEBUG ")).collect();
        out.push_str(&format!("== {}\n", p.display()));
        for l in &lines[lines.len().saturating_sub(25)..] {
            out.push_str(&l.chars().take(300).collect::<String>());
            out.push('\n');
        }
    }
    out
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Fixture {
    /// Serves HTTP on `addr` (rewrites the configuration).
    pub fn set_http(&self, addr: &str) {
        let text = std::fs::read_to_string(&self.config).unwrap();
        std::fs::write(
            &self.config,
            text.replacen("listen = \"\"", &format!("listen = \"{addr}\""), 1),
        )
        .unwrap();
    }
}

/// The sum of the fixture topic's high watermarks: records written, committed or not (a
/// read_committed client, librdkafka's default, would be answered with the last stable offset).
pub fn high_watermarks(f: &Fixture, partitions: u32) -> i64 {
    end_offsets(f, partitions).iter().sum::<u64>() as i64
}

/// Each partition's high watermark (read_uncommitted), by index.
pub fn end_offsets(f: &Fixture, partitions: u32) -> Vec<u64> {
    let c: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &f.bootstrap)
        .set("isolation.level", "read_uncommitted")
        .create()
        .unwrap();
    (0..partitions as i32)
        .map(|i| {
            rdkafka::consumer::Consumer::fetch_watermarks(&c, &f.topic, i, Duration::from_secs(10))
                .unwrap()
                .1 as u64
        })
        .collect()
}

/// The test PostgreSQL's URL (`scripts/postgres.sh start`, idempotent).
pub fn pg_url() -> String {
    static U: OnceLock<String> = OnceLock::new();
    U.get_or_init(|| {
        let out = Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/postgres.sh"))
            .arg("start")
            .output()
            .expect("scripts/postgres.sh");
        assert!(
            out.status.success(),
            "scripts/postgres.sh start failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    })
    .clone()
}

impl Fixture {
    /// Points the job's store at PostgreSQL (table `accounts_<name>`).
    pub fn use_postgres(&self, url: &str) {
        let text = std::fs::read_to_string(&self.config).unwrap();
        let start = text.find("[jobs.store]").unwrap();
        let end = text[start..].find("[jobs.local_checkpoint]").unwrap() + start;
        let table = format!("accounts_{}", self.name.replace('-', "_"));
        let store =
            format!("[jobs.store]\nkind = \"postgres\"\nurl = \"{url}\"\ntable = \"{table}\"\n");
        std::fs::write(
            &self.config,
            format!("{}{}{}", &text[..start], store, &text[end..]),
        )
        .unwrap();
    }
}

impl Fixture {
    /// Points the job's snapshot at an exported PostgreSQL snapshot `name`.
    pub fn use_postgres_snapshot(&self, url: &str, name: &str) {
        let text = std::fs::read_to_string(&self.config).unwrap();
        let start = text.find("[jobs.snapshot]").unwrap();
        let end = text[start..].find("[jobs.store]").unwrap() + start;
        let source =
            format!("[jobs.snapshot]\nkind = \"postgres\"\nurl = \"{url}\"\nname = \"{name}\"\n");
        std::fs::write(
            &self.config,
            format!("{}{}{}", &text[..start], source, &text[end..]),
        )
        .unwrap();
    }
}

/// GET over HTTP/1.1: (status, body).
/// Runs a CLI command that must succeed and print JSON; its JSON.
pub fn run_json(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap()
}

pub fn http_get(url: &str) -> (u16, String) {
    kafka_backfill::service::http::get(url).unwrap_or((0, String::new()))
}

/// Produces a workload, then `kill -9`s the service in the snapshot, twice in the log store and once in
/// streaming (while more changes arrive), restarting each time; the final run must verify clean.
/// The most advanced phase any worker of a killed process had reached, by its log: `streaming` once
/// a worker entered it, else `log_store` once one entered that, else `snapshot`.
/// Milliseconds since the epoch: a suffix that keeps names unique in the shared PostgreSQL database.
pub fn stamp() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// The process's `/status` (null while it does not answer).
pub fn status(addr: &str) -> serde_json::Value {
    let (_, body) = http_get(&format!("http://{addr}/status"));
    serde_json::from_str(&body).unwrap_or_default()
}

/// Waits until `/status` satisfies `ok` for the first worker.
pub fn wait_status(
    addr: &str,
    within: Duration,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) {
    let deadline = Instant::now() + within;
    loop {
        let s = status(addr);
        if ok(&s["jobs"][0]["workers"][0]) {
            return;
        }
        assert!(Instant::now() < deadline, "never {what}: {s}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn phase_at_death(log: &str) -> &'static str {
    if log.contains("to=\"streaming\"") {
        "streaming"
    } else if log.contains("to=\"log_store\"") {
        "log_store"
    } else {
        "snapshot"
    }
}

pub fn kill_9_in_every_phase(f: &Fixture) {
    let min = Duration::from_secs(60);
    f.produce(&[
        "--partitions",
        "4",
        "--rows",
        "15000",
        "--changes",
        "30000",
        "--epoch-changes",
        "250",
    ]);
    let mut kills = Vec::new();
    let mut run = f.spawn_run("k1", &[]);
    run.wait_for("cause=Local", min);
    std::thread::sleep(Duration::from_millis(700));
    run.signal("KILL");
    run.wait_exit(min);
    assert_eq!(
        phase_at_death(&run.log_text()),
        "snapshot",
        "the kill meant for the snapshot phase"
    );
    kills.push("snapshot");
    for (i, delay) in [300u64, 1100].into_iter().enumerate() {
        let mut run = f.spawn_run(&format!("k2{i}"), &[]);
        run.wait_for("to=\"log_store\"", min);
        std::thread::sleep(Duration::from_millis(delay));
        run.signal("KILL");
        run.wait_exit(min);
        assert_eq!(
            phase_at_death(&run.log_text()),
            "log_store",
            "kill {i} meant for the log store"
        );
        kills.push("log_store");
    }
    let mut run = f.spawn_run("k3", &[]);
    run.wait_for("to=\"streaming\"", 2 * min);
    let writer = f.append(&[
        "--changes",
        "5000",
        "--rate",
        "5000",
        "--seed",
        "11",
        "--key-space",
        "30000",
    ]);
    std::thread::sleep(Duration::from_millis(600));
    run.signal("KILL");
    run.wait_exit(min);
    assert_eq!(phase_at_death(&run.log_text()), "streaming");
    kills.push("streaming");
    assert!(writer.wait_with_output().unwrap().status.success());
    let mut run = f.spawn_run("final", &["--exit-when-caught-up"]);
    assert!(
        run.wait_exit(3 * min).success(),
        "{}",
        tail(&run.log_text())
    );
    let text = f.verify_eventually(min);
    assert!(
        text.contains(" 0 missing, 0 extra, 0 different"),
        "after kills in {kills:?}: {text}"
    );
}

impl Fixture {
    /// `kafka-backfill check-log` on this fixture's job, which must pass; its report.
    pub fn check_log(&self) -> String {
        let out = Command::new(BIN)
            .args(["check-log", "--config"])
            .arg(&self.config)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "check-log: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    }
}

/// `doctor --config F` on a fixture: (exit code, output, how long it took).
pub fn doctor(f: &Fixture) -> (i32, String, Duration) {
    let started = Instant::now();
    let out = Command::new(BIN)
        .args(["doctor", "--config"])
        .arg(&f.config)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
        started.elapsed(),
    )
}

/// The line of `out` whose check names `what`, which must start with `mark` (`ok` or `FAIL`).
pub fn doctor_line<'a>(out: &'a str, mark: &str, what: &str) -> &'a str {
    out.lines()
        .find(|l| l.contains(what))
        .filter(|l| l.starts_with(mark))
        .unwrap_or_else(|| panic!("no {mark} line for {what:?} in:\n{out}"))
}

/// The number after `epoch=` in a log line (the first such field).
pub fn epoch_in(line: &str) -> u64 {
    number_after(line, "epoch=")
}

/// The number a log line gives after `key` (as `to=` in `… from=1 to=2`).
pub fn number_after(line: &str, key: &str) -> u64 {
    line.split(key)
        .nth(1)
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

/// The metric families docs/OPERATIONS.md's reference table names (its first column; a row naming
/// several, as "`kafka_backfill_capture_checkpoints_total`, `_transactions_total`", spelt out).
pub fn documented_metric_families() -> Vec<String> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/OPERATIONS.md"))
        .expect("docs/OPERATIONS.md");
    let mut families = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("| `kafka_backfill_")) {
        let cell = line.split('|').nth(1).unwrap_or_default();
        let names: Vec<&str> = cell.split('`').skip(1).step_by(2).collect();
        let first = names[0];
        for n in &names {
            families.push(match n.strip_prefix('_') {
                // "`_transactions_total`" after "`kafka_backfill_capture_checkpoints_total`".
                Some(tail) => {
                    let stem = first.rsplitn(3, '_').nth(2).expect("a family name's stem");
                    format!("{stem}_{tail}")
                }
                None => n.to_string(),
            });
        }
    }
    assert!(
        families.len() > 30,
        "the reference table read: {families:?}"
    );
    families
}

/// `cmd` started with `script` written to its standard input (closed after it), its output
/// discarded: a client fed a workload.
pub fn fed(mut cmd: Command, script: &str) -> std::process::Child {
    use std::io::Write;
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("a client to feed");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    child
}
