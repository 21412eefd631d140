//! Section `cluster` of the benchmark (benches/backfill.rs) (`scripts/bench.sh --only cluster`, issue
//! 43.6): what the pipeline costs the Kafka cluster and how fresh its replica is, **at the defaults a
//! user gets** — pgbench's four tables captured with no interval set (`[jobs.capture]` names the
//! source and the tables, nothing else) into one job of the four tables (`consistency = "epoch"`,
//! SQLite), pgbench's TPC-B-like load at a fixed rate throughout.
//!
//! In one run, the same window length each: the broker's CPU (its JVM's utime + stime from `/proc`)
//! under the load with no pipeline (its floor: KRaft, the group coordinator, log flushes), then with
//! the capture and the runner streaming — while probes measure a source commit → visible in the
//! published replica, and a checker reads the four sums in one read transaction per sample (torn
//! samples counted). The outside figures of Debezium's pipeline are the (measured beside it
//! from outside, not in this run): 4–6 broker CPU-s per streaming minute, lag median 0.53 s.

use std::path::Path;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::capture::psql;
use super::several_tables::{
    capture_config, checker, four_capture_tables, pgbench, pgbench_db, signal, spawn, wait_log,
    Replica,
};
use super::{dir, rand_suffix, Report};

/// Sizes of the section.
pub struct Sizes {
    /// pgbench's transactions per second.
    pub rate: u32,
    /// Seconds of each window (the floor, then the pipeline).
    pub window_secs: u64,
}

/// The Debezium pipeline's broker CPU per streaming minute at this load, measured from outside
/// (issue 43: "4–6"); the target takes its low end.
const DEBEZIUM_BROKER_CPU_S_PER_MIN: f64 = 4.0;
/// Debezium's replica lag median at this load, measured from outside (issue 43), in ms.
const DEBEZIUM_LAG_MEDIAN_MS: f64 = 530.0;

/// The broker's process id, from `scripts/kafka.sh`'s run folder.
fn broker_pid() -> u32 {
    let run = std::env::var("KB_RUN_DIR").unwrap_or_else(|_| ".run/kafka".into());
    let pid = std::fs::read_to_string(Path::new(&run).join("pid"))
        .expect("scripts/kafka.sh's pid file (the broker must be the repo's)");
    pid.trim().parse().expect("a pid")
}

/// The broker's CPU seconds per minute over `secs`, while `during` runs (called until it says done
/// or the window ends).
fn broker_cpu_per_min(pid: u32, secs: u64, mut during: impl FnMut() -> bool) -> f64 {
    let cpu = || super::cpu::pid_secs(pid).expect("the broker is up");
    let (t, before) = (Instant::now(), cpu());
    while t.elapsed() < Duration::from_secs(secs) {
        if !during() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    (cpu() - before) * 60.0 / t.elapsed().as_secs_f64()
}

fn percentile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 * q) as usize).min(v.len() - 1)]
}

/// What one pipeline did in its window.
struct Round {
    broker_cpu: f64,
    lag: Vec<f64>,
    seen: super::several_tables::Seen,
}

/// Runs the section; `pg` is the PostgreSQL server's URL (the source).
pub fn run(bin: &Path, bootstrap: &str, pg: &str, sizes: &Sizes, r: &mut Report) {
    let pid = broker_pid();
    eprintln!(
        "cluster: the broker's floor, {} s of pgbench at {}/s without the pipeline…",
        sizes.window_secs, sizes.rate
    );
    let floor = {
        let url = pgbench_db(pg, 1);
        let mut load = pgbench(&url, sizes.rate, 3600);
        let floor = broker_cpu_per_min(pid, sizes.window_secs, || false);
        signal(&mut load, "TERM");
        drop_db(pg, &url);
        floor
    };
    // The defaults, then the last release's (a checkpoint a second, the capture's producer
    // lingering 5 ms), set in the configuration: the A/B in one run.
    let now = round(bin, bootstrap, pg, pid, sizes, "", "");
    let before = round(
        bin,
        bootstrap,
        pg,
        pid,
        sizes,
        "checkpoint_interval_ms = 1000\n",
        "\"linger.ms\" = \"5\"\n",
    );

    for (id, label, x) in [
        ("cluster", "the defaults", &now),
        ("cluster_before", "the last release's defaults (checkpoint_interval_ms 1000, the capture's producer lingering 5 ms)", &before),
    ] {
        let over = x.broker_cpu - floor;
        r.figure(
            &format!("{id}_broker_cpu"),
            &format!("the broker's CPU (its JVM, /proc) per minute under pgbench at {}/s (four tables, scale 1), {} s windows in one run, with the capture and a four-table job streaming at {label}; the same load without them: {floor:.2} CPU-s/min (the broker's floor); Debezium's pipeline measured from outside at this load: 4–6 (issue 43)", sizes.rate, sizes.window_secs),
            format!("{:.2} CPU-s/min ({over:.2} over the floor)", x.broker_cpu),
            json!({"broker_cpu_s_per_min": x.broker_cpu, "floor_cpu_s_per_min": floor, "window_s": sizes.window_secs, "rate": sizes.rate}),
        );
        let mut lag = x.lag.clone();
        let n = lag.len();
        let (p50, p95) = (percentile(&mut lag, 0.5), percentile(&mut lag, 0.95));
        r.figure(
            &format!("{id}_lag"),
            &format!("the replica's lag at {label}: a probe's source commit → visible in the published four-table replica (SQLite, consistency = \"epoch\"), {n} probes at random moments in the same window; the checker read the four sums {} times: {} torn, the published epoch went back {} times", x.seen.samples, x.seen.torn, x.seen.went_back),
            format!("median {p50:.0} ms, p95 {p95:.0} ms ({:.2}× Debezium's 530 ms median from outside)", p50 / DEBEZIUM_LAG_MEDIAN_MS),
            json!({"probes": n, "p50_ms": p50, "p95_ms": p95, "samples": x.seen.samples, "torn": x.seen.torn, "went_back": x.seen.went_back}),
        );
    }
    let mut lag = now.lag.clone();
    let p50 = percentile(&mut lag, 0.5);
    r.target(
        "broker CPU per streaming minute at the pgbench load, defaults ≤ the Debezium pipeline's (4 CPU-s/min, from outside)",
        format!("{:.2} CPU-s/min (the last release's defaults: {:.2})", now.broker_cpu, before.broker_cpu),
        Some(now.broker_cpu <= DEBEZIUM_BROKER_CPU_S_PER_MIN),
    );
    r.target(
        "replica lag median at the defaults ≤ 0.5 × Debezium's (265 ms, from outside), 0 torn",
        format!(
            "{p50:.0} ms, {} torn of {}",
            now.seen.torn, now.seen.samples
        ),
        Some(p50 <= 0.5 * DEBEZIUM_LAG_MEDIAN_MS && now.seen.torn == 0 && now.seen.went_back == 0),
    );
}

/// One pipeline: a fresh pgbench database, the capture and a four-table job at the defaults plus
/// `capture_extra` (`[jobs.capture]` lines) and `kafka_extra` (`[jobs.kafka]` lines), measured over
/// one window under the load.
fn round(
    bin: &Path,
    bootstrap: &str,
    pg: &str,
    pid: u32,
    sizes: &Sizes,
    capture_extra: &str,
    kafka_extra: &str,
) -> Round {
    let url = pgbench_db(pg, 1);
    let name = format!("cluster{}", rand_suffix() % 100_000);
    let d = dir(&name);
    let db = d.join("replica.sqlite");
    // No interval, no client setting but the bootstrap servers, unless the round adds them.
    let job = format!(
        "[[jobs]]\nname = \"{name}\"\ntopic = \"bench-{name}\"\nconsistency = \"epoch\"\n\
         snapshot = {{ kind = \"files\", dir = \"{}\" }}\n\
         [jobs.kafka]\n\"bootstrap.servers\" = \"{bootstrap}\"\n{kafka_extra}\
         [jobs.store]\nkind = \"sqlite\"\npath = \"{}\"\n\
         tables = {{ pgbench_accounts = \"accounts\", pgbench_tellers = \"tellers\", pgbench_branches = \"branches\", pgbench_history = \"history\" }}\n",
        d.join("snapshot").display(),
        db.display()
    );
    let cfg = d.join("job.toml");
    std::fs::write(
        &cfg,
        capture_config("", &job, &url, &four_capture_tables(), capture_extra),
    )
    .unwrap();
    let mut load = pgbench(&url, sizes.rate, 3600);
    eprintln!("cluster: {name}: capture and run…");
    let capture_log = d.join("capture.log");
    let mut capture = spawn(bin, &["capture"], &cfg, &capture_log);
    wait_log(
        &mut capture,
        &capture_log,
        "capture checkpoint committed",
        1,
    );
    let run_log = d.join("run.log");
    let mut run = spawn(bin, &["run"], &cfg, &run_log);
    wait_log(&mut run, &run_log, "to=\"streaming\"", 1);
    let stop = Arc::new(AtomicBool::new(false));
    let replica = Replica::Sqlite(db.clone());
    let seen = checker(replica.clone(), Some(name.clone()), stop.clone());

    // The window: the broker's CPU while probes measure the replica's lag, one at a time at random
    // moments (a probe updates teller 1's filler; the replica is read until it shows it).
    eprintln!(
        "cluster: {name}: {} s streaming, broker CPU and lag probes…",
        sizes.window_secs
    );
    let mut client = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let mut read = replica.probe_reader();
    let mut lag = Vec::new();
    let broker_cpu = {
        let mut probe = || {
            let mark = format!("probe-{}-{}", lag.len(), rand_suffix());
            client
                .execute(
                    "UPDATE pgbench_tellers SET filler = $1 WHERE tid = 1",
                    &[&mark],
                )
                .unwrap();
            let t = Instant::now();
            let deadline = t + Duration::from_secs(120);
            while read().as_deref().map(str::trim_end) != Some(mark.as_str()) {
                assert!(
                    Instant::now() < deadline,
                    "a probe never reached the replica"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
            lag.push(t.elapsed().as_secs_f64() * 1000.0);
            std::thread::sleep(Duration::from_millis(50 + rand_suffix() % 700));
            true
        };
        broker_cpu_per_min(pid, sizes.window_secs, &mut probe)
    };
    stop.store(true, Ordering::SeqCst);
    let seen = seen.join().unwrap();
    stop_all([&mut run, &mut capture, &mut load]);
    // The capture's slot and the database go with the round: a slot left behind holds WAL, and
    // PostgreSQL's 32 slots (scripts/postgres.sh) ran out after a dozen runs of the section.
    psql(
        &url,
        &format!("SELECT pg_drop_replication_slot('kb_{name}')"),
    );
    drop_db(pg, &url);
    Round {
        broker_cpu,
        lag,
        seen,
    }
}

/// Drops the database of `url` (a round's or the floor's pgbench database) on the server `pg`.
fn drop_db(pg: &str, url: &str) {
    let db = url.rsplit('/').next().unwrap();
    psql(pg, &format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"));
}

fn stop_all<const N: usize>(children: [&mut Child; N]) {
    for c in children {
        signal(c, "TERM");
    }
}
