//! Section `peer` of the benchmark (benches/backfill.rs) (`scripts/bench.sh --only peer`): issue 22's
//! outside check, run in-repo on one topic — the 4-partition log topic of section `log`:
//!
//! - Kafka's ConsumerPerformance, its fetch rate after the group's assignment (the speed figure's
//!   denominator);
//! - a Kafka Streams KTable of the same topic (`scripts/ktable/KTablePeer.java`, run by `scripts/kafka.sh
//!   ktable`: RocksDB store and changelog, `exactly_once_v2`, the JVM's default heap), timed from its
//!   first record to its last, its peak RSS (VmHWM) and its whole JVM's CPU (start-up included);
//! - `kafka-backfill run --exit-when-caught-up` in its own process (`outside_log_store` in
//!   benches/backfill.rs: the log-store phase timed from its phase lines), with its peak RSS.
//!
//! Targets: kafka-backfill's rate ≥ 0.4 × ConsumerPerformance's fetch rate, and its peak RSS ≤ 1/10 of
//! the KTable's. Each figure is a median of the run's repetitions; the memory ratio is of the medians.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{
    consumer_performance, cpu, fmt_rate, median, outside_log_store, rand_suffix, runs, sh,
    vm_hwm_kib, Report,
};

/// One run of the KTable peer.
struct KTableRun {
    /// Records per second from its first record to its last.
    rate: f64,
    /// Its JVM's peak resident memory, MiB.
    rss_mib: f64,
    /// Its JVM's CPU seconds, start-up, join and close included.
    cpu_secs: f64,
}

fn ktable(bootstrap: &str, topic: &str, records: u64, d: &Path, i: usize) -> KTableRun {
    let state = d.join(format!("ktable-state{i}"));
    let log = d.join(format!("ktable{i}.err"));
    let cpu_before = cpu::children_secs();
    let mut child = Command::new("bash")
        .arg("scripts/kafka.sh")
        .arg("ktable")
        .arg(bootstrap)
        .arg(topic)
        .arg(format!("bench-ktable-{}", rand_suffix()))
        .arg(&state)
        .arg(records.to_string())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // `kafka.sh ktable` execs the JVM in place, so the child's pid is the JVM's.
    let pid = child.id();
    let mut hwm = 0;
    let deadline = Instant::now() + Duration::from_secs(1800);
    let status = loop {
        hwm = hwm.max(vm_hwm_kib(pid));
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the KTable peer did not finish: see {}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let cpu_secs = cpu::children_secs() - cpu_before;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    assert!(
        status.success(),
        "the KTable peer exited with {status}: see {}",
        log.display()
    );
    // records=N first_to_last_s=S close_s=C
    let field = |name: &str| -> f64 {
        out.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("the KTable peer printed no {name}: {out:?}"))
    };
    let seen = field("records");
    assert!(
        seen >= records as f64,
        "the KTable peer saw {seen} of {records} records"
    );
    KTableRun {
        rate: records as f64 / field("first_to_last_s"),
        rss_mib: hwm as f64 / 1024.0,
        cpu_secs,
    }
}

/// Runs the section on `topic` (4 partitions, `records` records, its snapshot in `d/snapshot`).
pub fn run(
    r: &mut Report,
    bin: &Path,
    bootstrap: &str,
    topic: &str,
    d: &Path,
    records: u64,
    reps: usize,
) {
    sh("scripts/kafka.sh", &["ktable-build"], &[]);
    let (perf, perf_all) = runs(reps, |_| consumer_performance(bootstrap, topic, records));
    r.figure(
        "peer_consumer_performance_4p",
        &format!(
            "Kafka's ConsumerPerformance, fetch.nMsg.sec (after assignment), {records} records, median of {:?}",
            perf_all.iter().map(|x| x.round()).collect::<Vec<_>>()
        ),
        format!("{} records/s", fmt_rate(perf)),
        json!(perf),
    );

    let kt: Vec<KTableRun> = (0..reps)
        .map(|i| ktable(bootstrap, topic, records, d, i))
        .collect();
    let kt_rate = median(kt.iter().map(|k| k.rate).collect());
    let kt_rss = median(kt.iter().map(|k| k.rss_mib).collect());
    let kt_cpu = median(
        kt.iter()
            .map(|k| k.cpu_secs * 1e6 / records as f64)
            .collect(),
    );
    r.figure(
        "peer_ktable_4p",
        &format!(
            "Kafka Streams KTable of the same topic (scripts/ktable/KTablePeer.java: RocksDB, changelog, exactly_once_v2, the JVM's default heap), first to last record, median of {:?}",
            kt.iter().map(|k| k.rate.round()).collect::<Vec<_>>()
        ),
        format!("{} records/s", fmt_rate(kt_rate)),
        json!(kt_rate),
    );
    r.figure(
        "peer_ktable_peak_rss_4p",
        &format!(
            "its JVM's peak RSS (VmHWM), median of {:?}",
            kt.iter().map(|k| k.rss_mib.round()).collect::<Vec<_>>()
        ),
        format!("{kt_rss:.0} MiB"),
        json!(kt_rss),
    );
    r.figure(
        "peer_ktable_cpu_4p",
        "its JVM's CPU (start-up, join and close included) per million records, median",
        format!("{kt_cpu:.2} CPU-s per million records"),
        json!(kt_cpu),
    );

    let kb: Vec<(f64, f64)> = (0..reps)
        .map(|i| {
            let o = outside_log_store(bin, bootstrap, topic, d, 100 + i);
            (records as f64 / o.secs, o.peak_rss_mib)
        })
        .collect();
    let kb_rate = median(kb.iter().map(|k| k.0).collect());
    let kb_rss = median(kb.iter().map(|k| k.1).collect());
    r.figure(
        "peer_kafka_backfill_4p",
        &format!(
            "`kafka-backfill run` into SQLite, its own process, log-store phase timed from its phase lines, median of {:?}",
            kb.iter().map(|k| k.0.round()).collect::<Vec<_>>()
        ),
        format!("{} records/s", fmt_rate(kb_rate)),
        json!(kb_rate),
    );
    r.figure(
        "peer_kafka_backfill_peak_rss_4p",
        &format!(
            "its peak RSS (VmHWM, the whole run: start, snapshot phase, log store), median of {:?}",
            kb.iter().map(|k| k.1.round()).collect::<Vec<_>>()
        ),
        format!("{kb_rss:.0} MiB"),
        json!(kb_rss),
    );
    let speed = kb_rate / perf;
    let over_kt = kb_rate / kt_rate;
    let memory = kb_rss / kt_rss;
    r.figure(
        "peer_ratio_rate_over_consumer_performance_4p",
        "kafka-backfill's rate / ConsumerPerformance's fetch rate, same run",
        format!("{speed:.3}"),
        json!(speed),
    );
    r.figure(
        "peer_ratio_rate_over_ktable_4p",
        "kafka-backfill's rate / the KTable's, same run",
        format!("{over_kt:.2}"),
        json!(over_kt),
    );
    r.figure(
        "peer_ratio_rss_over_ktable_4p",
        "kafka-backfill's peak RSS / the KTable's, same run",
        format!("{memory:.3}"),
        json!(memory),
    );
    r.target(
        "peer: `kafka-backfill run` ≥ 0.4 × ConsumerPerformance's fetch rate (4 partitions)",
        format!("{speed:.3}"),
        Some(speed >= 0.4),
    );
    r.target(
        "peer: `kafka-backfill run`'s peak RSS ≤ 1/10 of a Kafka Streams KTable's (4 partitions)",
        format!("{memory:.3} ({kb_rss:.0} / {kt_rss:.0} MiB)"),
        Some(memory <= 0.1),
    );
}
