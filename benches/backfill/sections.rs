//! The benchmark's sections, one function each, in the order `main` runs them (its table of
//! sections): each measures its figures and adds them, with their targets, to the report.

use super::*;

/// (a)–(c): the log-store phase against the consumers, 4 and 16 partitions.
pub fn log(c: &Ctx, r: &mut Report) {
    let a = &c.a;
    let bootstrap = c.bootstrap.as_str();
    let pg = c.pg.as_str();
    let pg_label = c.pg_label.as_str();
    let durable = c.durable;
    let pid = c.pid;
    let log_topics = &c.log_topics;
    for (partitions, topic, d, records) in log_topics {
        let p = *partitions;
        let mut perf_cpu = Vec::new();
        let (perf, perf_all) = runs(a.reps, |_| {
            let before = cpu::children_secs();
            let rate = consumer_performance(bootstrap, topic, *records);
            perf_cpu.push((cpu::children_secs() - before) * 1e6 / *records as f64);
            rate
        });
        r.figure(
                &format!("a_consumer_performance_{p}p"),
                &format!("Kafka's ConsumerPerformance, fetch.nMsg.sec (after assignment), {records} records, {p} partitions, median of {:?}", perf_all.iter().map(|x| x.round()).collect::<Vec<_>>()),
                format!("{} records/s", fmt_rate(perf)),
                json!(perf),
            );
        let mut bare_cpu = Vec::new();
        let (bare, bare_all) = runs(a.reps, |_| {
            let before = cpu::process_secs();
            let rate = bare_consume(bootstrap, topic, *records);
            bare_cpu.push((cpu::process_secs() - before) * 1e6 / *records as f64);
            rate
        });
        r.figure(
                &format!("a_bare_rdkafka_{p}p"),
                &format!("bare rdkafka BaseConsumer subscribing like the service (cooperative-sticky, read_committed, same fetch settings), no decoding, first to last record, median of {:?}", bare_all.iter().map(|x| x.round()).collect::<Vec<_>>()),
                format!("{} records/s", fmt_rate(bare)),
                json!(bare),
            );
        let mut log_cpu: Vec<cpu::Split> = Vec::new();
        let (log, log_all) = runs(a.reps, |i| {
            // Short job names: the kernel keeps 15 bytes of a thread's name, and the CPU
            // split tells `<job>/commit` from `<job>/<worker>` by them.
            let t = timed_run_cpu(&job_config(
                &format!("b{p}s{i}"),
                topic,
                bootstrap,
                &d.join("snapshot"),
                sqlite(d.join(format!("s{i}.sqlite"))),
            ));
            log_cpu.push(t.log_cpu);
            *records as f64 / t.log_secs
        });
        r.figure(
                &format!("b_log_store_sqlite_{p}p"),
                &format!("log-store phase into SQLite (fetch, decode, align, stage, commit; from the snapshot_done commit to the caught_up commit), median of {:?}", log_all.iter().map(|x| x.round()).collect::<Vec<_>>()),
                format!("{} records/s", fmt_rate(log)),
                json!(log),
            );
        let ratio = log / perf;
        r.figure(
            &format!("ratio_b_over_consumer_performance_{p}p"),
            "(b) / ConsumerPerformance's fetch rate",
            format!("{ratio:.3}"),
            json!(ratio),
        );
        r.figure(
            &format!("ratio_b_over_bare_{p}p"),
            "(b) / the bare rdkafka consumer",
            format!("{:.3}", log / bare),
            json!(log / bare),
        );
        // Issue 43's targets (issue 12's were 0.5 at both): counted to the commit of the end
        // offsets (`caught_up`), against ConsumerPerformance in the same run.
        let want = if p == 4 { 0.45 } else { 0.4 };
        r.target(
                &format!("log-store replay into SQLite ≥ {want} × ConsumerPerformance's fetch rate ({p} partitions)"),
                format!("{ratio:.3}"),
                Some(ratio >= want),
            );
        // CPU per million records: the OS's user + system seconds (`benches/backfill/cpu.rs`).
        let perf_c = median(perf_cpu);
        let bare_c = median(bare_cpu);
        let mut log_c: Vec<(f64, String)> = log_cpu
            .iter()
            .map(|c| (c.per_million(*records), c.shares()))
            .collect();
        log_c.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
        let (log_cm, log_split) = log_c[log_c.len() / 2].clone();
        r.figure(
                &format!("cpu_log_store_sqlite_{p}p"),
                &format!("CPU of the log-store phase into SQLite (user + system, the whole service: worker, committer, checkpointer, librdkafka; from the snapshot_done to the caught_up commit), per million records, median of {:?}; split of that run by thread: {log_split}", log_c.iter().map(|x| (x.0 * 100.0).round() / 100.0).collect::<Vec<_>>()),
                format!("{log_cm:.2} CPU-s per million records"),
                json!({"cpu_s_per_million": log_cm, "split": log_split}),
            );
        r.figure(
                &format!("cpu_consumer_performance_{p}p"),
                "CPU of Kafka's ConsumerPerformance (its whole JVM process, start-up included), per million records, median",
                format!("{perf_c:.2} CPU-s per million records"),
                json!(perf_c),
            );
        r.figure(
                &format!("cpu_bare_rdkafka_{p}p"),
                "CPU of the bare rdkafka consumer (in the bench's process: client start, subscription, polling to the last record), per million records, median",
                format!("{bare_c:.2} CPU-s per million records"),
                json!(bare_c),
            );
        r.target(
            &format!(
                "log-store replay into SQLite ≤ 2.3 CPU-s per million records ({p} partitions)"
            ),
            format!("{log_cm:.2} (ConsumerPerformance {perf_c:.2}, bare rdkafka {bare_c:.2})"),
            Some(log_cm <= 2.3),
        );
        // The host's speed moves every CPU figure together (the same build measured 2.16 and
        // 5.91 on two days, ConsumerPerformance 1.78 and 5.35): the same target against the
        // consumer measured in the same run, the 2.3 over its ConsumerPerformance ≈ 1.9.
        let cpu_ratio = log_cm / perf_c;
        r.figure(
                &format!("cpu_ratio_log_store_sqlite_over_consumer_performance_{p}p"),
                "CPU per record of the log-store phase into SQLite over ConsumerPerformance's, same run",
                format!("{cpu_ratio:.2}"),
                json!(cpu_ratio),
            );
        r.target(
                &format!(
                    "log-store replay into SQLite ≤ {CPU_RATIO_TARGET:.2} × ConsumerPerformance's CPU per record, same run ({p} partitions)"
                ),
                format!("{cpu_ratio:.2}"),
                Some(cpu_ratio <= CPU_RATIO_TARGET),
            );
        // Issue 43's form of it (from 1.58× measured from outside).
        r.target(
                &format!(
                    "log-store replay into SQLite ≤ 1.3 × ConsumerPerformance's CPU per record, same run ({p} partitions)"
                ),
                format!("{cpu_ratio:.2}"),
                Some(cpu_ratio <= 1.3),
            );
        // The same replay by the real binary in a process of its own, timed from outside.
        let mut out_cpu = Vec::new();
        let (out, out_all) = runs(a.reps, |i| {
            let o = outside_log_store(&a.bin, bootstrap, topic, d, i);
            out_cpu.push(o.cpu_secs * 1e6 / *records as f64);
            *records as f64 / o.secs
        });
        let out_c = median(out_cpu.clone());
        r.figure(
                &format!("b_outside_log_store_sqlite_{p}p"),
                &format!("log-store phase into SQLite of `kafka-backfill run` in its own process (HTTP serving, info logs), timed from its log_store line to the moment its store holds every end offset, as an outside harness sees it, median of {:?}", out_all.iter().map(|x| x.round()).collect::<Vec<_>>()),
                format!("{} records/s", fmt_rate(out)),
                json!(out),
            );
        r.figure(
                &format!("cpu_outside_log_store_sqlite_{p}p"),
                &format!("CPU of that phase (the whole process, from /proc), per million records, median of {:?}", out_cpu.iter().map(|x| (x * 100.0).round() / 100.0).collect::<Vec<_>>()),
                format!("{out_c:.2} CPU-s per million records"),
                json!(out_c),
            );
        let out_ratio = out / perf;
        r.figure(
            &format!("ratio_b_outside_over_consumer_performance_{p}p"),
            "(b, outside) / ConsumerPerformance's fetch rate, same run",
            format!("{out_ratio:.3}"),
            json!(out_ratio),
        );
        r.target(
                &format!("`kafka-backfill run` (its own process) log-store phase into SQLite ≥ 0.4 × ConsumerPerformance's fetch rate ({p} partitions)"),
                format!("{out_ratio:.3}"),
                Some(out_ratio >= 0.4),
            );
        // The same replay into a table without `_kb_row` (`store_datum = false`, opt-in):
        // interleaved with nothing else, right after the default's runs.
        let mut nd_cpu: Vec<f64> = Vec::new();
        let (nd, nd_all) = runs(a.reps, |i| {
            let t = timed_run_cpu(&job_config(
                &format!("n{p}s{i}"),
                topic,
                bootstrap,
                &d.join("snapshot"),
                sqlite_no_datum(d.join(format!("n{i}.sqlite"))),
            ));
            nd_cpu.push(t.log_cpu.per_million(*records));
            *records as f64 / t.log_secs
        });
        let nd_c = median(nd_cpu);
        r.figure(
            &format!("b_log_store_sqlite_no_datum_{p}p"),
            &format!(
                "log-store phase into SQLite with store_datum = false (no _kb_row), median of {:?}",
                nd_all.iter().map(|x| x.round()).collect::<Vec<_>>()
            ),
            format!("{} records/s", fmt_rate(nd)),
            json!(nd),
        );
        r.figure(
            &format!("cpu_log_store_sqlite_no_datum_{p}p"),
            "CPU of the same replay with store_datum = false, per million records, median",
            format!(
                "{nd_c:.2} CPU-s per million records ({:.2}× the default's)",
                nd_c / log_cm
            ),
            json!(nd_c),
        );
        r.target(
                &format!(
                    "log-store replay into SQLite with store_datum = false ≤ 2.3 CPU-s per million records ({p} partitions)"
                ),
                format!("{nd_c:.2}"),
                Some(nd_c <= 2.3),
            );
        if p == 4 {
            let mut pg_cpu = Vec::new();
            let mut server_cpu = Vec::new();
            let (pgr, pg_all) = runs(a.reps, |i| {
                let server = cpu::postgres_server_secs();
                // The job row outlives the run in PostgreSQL: a name of its own each time,
                // short enough for the thread names (see above).
                let t = timed_run_cpu(&job_config(
                    &format!("p{}{i}", rand_suffix() % 100_000),
                    topic,
                    bootstrap,
                    &d.join("snapshot"),
                    postgres(pg, &format!("bench_log_{pid}_{i}_{}", rand_suffix())),
                ));
                pg_cpu.push(t.log_cpu.per_million(*records));
                // The whole run's (its snapshot phase too, ≈ 0.1 of the records): the server's
                // CPU is not split by phase.
                server_cpu.push((cpu::postgres_server_secs() - server) * 1e6 / *records as f64);
                *records as f64 / t.log_secs
            });
            let pg_c = median(pg_cpu);
            let server_c = median(server_cpu.clone());
            r.figure(
                    "cpu_server_log_store_postgres_4p",
                    &format!("CPU of the PostgreSQL server (every postgres process, exited backends included) over the whole run into {pg_label} (snapshot phase, log store, the job's start and end), per million log records, median of {:?}", server_cpu.iter().map(|x| (x * 100.0).round() / 100.0).collect::<Vec<_>>()),
                    format!("{server_c:.2} CPU-s per million records"),
                    json!(server_c),
                );
            r.figure(
                    "cpu_log_store_postgres_4p",
                    &format!("CPU of the log-store phase into {pg_label}: kafka-backfill's process only (the server's backends not counted), per million records, median"),
                    format!("{pg_c:.2} CPU-s per million records"),
                    json!(pg_c),
                );
            r.figure(
                &format!("c_log_store_postgres_{p}p"),
                &format!(
                    "log-store phase into {pg_label}, median of {:?}",
                    pg_all.iter().map(|x| x.round()).collect::<Vec<_>>()
                ),
                format!("{} records/s", fmt_rate(pgr)),
                json!(pgr),
            );
            let ratio = pgr / bare;
            r.figure(
                "ratio_c_over_bare_4p",
                "(c) / the bare rdkafka consumer",
                format!("{ratio:.3}"),
                json!(ratio),
            );
            // Issue 43's target (issue 12's was 0.3 × the bare consumer).
            let over_perf = pgr / perf;
            r.figure(
                "ratio_c_over_consumer_performance_4p",
                "(c) / ConsumerPerformance's fetch rate",
                format!("{over_perf:.3}"),
                json!(over_perf),
            );
            r.target(
                "durable PostgreSQL log-store replay ≥ 0.2 × ConsumerPerformance's fetch rate (4 partitions)",
                format!("{over_perf:.3} (the server's CPU {server_c:.2} CPU-s per million records beside kafka-backfill's {pg_c:.2})"),
                durable.then_some(over_perf >= 0.2),
            );
        }
    }
}

/// (d), (e): the snapshot phase
pub fn snapshot(c: &Ctx, r: &mut Report) {
    let a = &c.a;
    let bootstrap = c.bootstrap.as_str();
    let pg = c.pg.as_str();
    let pg_label = c.pg_label.as_str();
    let durable = c.durable;
    let pid = c.pid;
    eprintln!("snapshot: {} rows…", a.snapshot_rows);
    let d = dir("snap");
    let topic = format!("bench-snap-{}", rand_suffix());
    produce(log_workload(
        bootstrap,
        &topic,
        4,
        a.snapshot_rows,
        1_000,
        150,
        &d,
    ));
    let (rows, decode, mean) = bare_decode(&d.join("snapshot"));
    r.figure(
            "e_bare_read_rows_per_s",
            &format!("bare read + check + key extraction of the snapshot files ({rows} rows, mean datum {mean:.0} bytes)"),
            format!("{} rows/s", fmt_rate(decode)),
            json!(decode),
        );
    let mut snap_cpu = Vec::new();
    let (snap, snap_all) = runs(a.reps, |i| {
        let t = timed_run_cpu(&job_config(
            &format!("sn{i}"),
            &topic,
            bootstrap,
            &d.join("snapshot"),
            sqlite(d.join(format!("s{i}.sqlite"))),
        ));
        snap_cpu.push((t.snapshot_cpu.per_million(rows), t.snapshot_cpu.shares()));
        rows as f64 / t.snapshot_secs
    });
    snap_cpu.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    let (snap_c, snap_split) = snap_cpu[snap_cpu.len() / 2].clone();
    r.figure(
            "cpu_snapshot_sqlite",
            &format!("CPU of the snapshot phase into SQLite (phase entry to the snapshot_done commit), per million rows, median; split of that run by thread: {snap_split}"),
            format!("{snap_c:.2} CPU-s per million rows"),
            json!({"cpu_s_per_million": snap_c, "split": snap_split}),
        );
    r.figure(
            "d_snapshot_sqlite_rows_per_s",
            &format!("snapshot phase into SQLite, committed (phase entry to the snapshot_done commit), median of {:?}", snap_all.iter().map(|x| x.round()).collect::<Vec<_>>()),
            format!("{} rows/s", fmt_rate(snap)),
            json!(snap),
        );
    r.figure(
        "ratio_d_over_e",
        "(d) / (e)",
        format!("{:.3}", snap / decode),
        json!(snap / decode),
    );
    r.target(
        "snapshot phase into SQLite ≥ 1,000,000 rows/s committed",
        format!("{} rows/s", fmt_rate(snap)),
        Some(snap >= 1_000_000.0),
    );
    // The same into a table without `_kb_row` (`store_datum = false`, opt-in).
    let mut nd_cpu = Vec::new();
    let (nd, nd_all) = runs(a.reps, |i| {
        let t = timed_run_cpu(&job_config(
            &format!("sd{i}"),
            &topic,
            bootstrap,
            &d.join("snapshot"),
            sqlite_no_datum(d.join(format!("n{i}.sqlite"))),
        ));
        nd_cpu.push(t.snapshot_cpu.per_million(rows));
        rows as f64 / t.snapshot_secs
    });
    let nd_c = median(nd_cpu);
    r.figure(
            "d_snapshot_sqlite_no_datum_rows_per_s",
            &format!("snapshot phase into SQLite with store_datum = false (no _kb_row), committed, median of {:?}; {nd_c:.2} CPU-s per million rows", nd_all.iter().map(|x| x.round()).collect::<Vec<_>>()),
            format!("{} rows/s", fmt_rate(nd)),
            json!({"rows_per_s": nd, "cpu_s_per_million": nd_c}),
        );
    r.target(
        "snapshot phase into SQLite with store_datum = false ≥ 1,000,000 rows/s committed",
        format!("{} rows/s", fmt_rate(nd)),
        Some(nd >= 1_000_000.0),
    );
    let t = timed_run_cpu(&job_config(
        &format!("q{}", rand_suffix() % 1_000_000),
        &topic,
        bootstrap,
        &d.join("snapshot"),
        postgres(pg, &format!("bench_snap_{pid}_{}", rand_suffix())),
    ));
    let snap_pg = rows as f64 / t.snapshot_secs;
    let snap_pg_c = t.snapshot_cpu.per_million(rows);
    r.figure(
            "cpu_snapshot_postgres",
            &format!("CPU of the snapshot phase into {pg_label}: kafka-backfill's process only, per million rows, one run; split by thread: {}", t.snapshot_cpu.shares()),
            format!("{snap_pg_c:.2} CPU-s per million rows"),
            json!(snap_pg_c),
        );
    r.figure(
        "d_snapshot_postgres_rows_per_s",
        &format!("snapshot phase into {pg_label}, committed, one run"),
        format!("{} rows/s", fmt_rate(snap_pg)),
        json!(snap_pg),
    );
    r.target(
        "durable PostgreSQL snapshot phase ≥ 300,000 rows/s",
        format!("{} rows/s", fmt_rate(snap_pg)),
        durable.then_some(snap_pg >= 300_000.0),
    );
}

/// (f): commit latency
pub fn commit(c: &Ctx, r: &mut Report) {
    let a = &c.a;
    eprintln!("checkpoint commit latency…");
    for (n, samples) in [
        (1_000usize, a.commit_samples),
        (10_000, a.commit_samples),
        (100_000, (a.commit_samples / 10).max(2)),
    ] {
        let (mut t, cpu_secs, upserts) = commit_latency(n, samples);
        r.figure(
                &format!("f_commit_{n}_rows_cpu_us_per_upsert"),
                &format!("the committing thread's CPU per upserted row over those {samples} commits ({upserts} rows; SQLite's checkpointer thread not counted)"),
                format!("{:.2} µs", cpu_secs * 1e6 / upserts.max(1) as f64),
                json!({"cpu_secs": cpu_secs, "upserts": upserts}),
            );
        t.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let pct = |p: f64| t[((t.len() as f64 - 1.0) * p).round() as usize];
        let (shown, p99) = if samples >= 200 {
            (
                format!(
                    "p50 {:.1} ms, p99 {:.1} ms ({samples} samples)",
                    pct(0.5),
                    pct(0.99)
                ),
                Some(pct(0.99)),
            )
        } else {
            (
                format!(
                    "p50 {:.1} ms, max of {samples} {:.1} ms",
                    pct(0.5),
                    t[t.len() - 1]
                ),
                None,
            )
        };
        r.figure(
                &format!("f_commit_{n}_rows"),
                &format!("SQLite checkpoint commit of {n} upserts (ids from 100,000 keys) + 256 vnode-progress rows"),
                shown,
                json!({"p50_ms": pct(0.5), "p99_ms": p99, "max_ms": t[t.len() - 1], "samples": samples}),
            );
        if n == 10_000 {
            r.target(
                "SQLite checkpoint commit of 10k rows: p99 ≤ 20 ms over ≥ 200 samples",
                p99.map_or(format!("max of {samples}: {:.1} ms", t[t.len() - 1]), |p| {
                    format!("{p:.1} ms")
                }),
                p99.map(|p| p <= 20.0),
            );
        }
    }
}

/// (g): memory
pub fn memory(c: &Ctx, r: &mut Report) {
    let a = &c.a;
    let bootstrap = c.bootstrap.as_str();
    eprintln!("peak memory while catching up…");
    let mut peaks = Vec::new();
    for size in [a.memory_small, a.memory_large] {
        let (recs, mib, secs) = peak_memory(&a.bin, bootstrap, size, 4);
        r.figure(
                &format!("g_peak_rss_backlog_{size}"),
                &format!("peak RSS (VmHWM) of `kafka-backfill run` catching up a {recs}-record backlog into SQLite ({secs:.1} s end to end)"),
                format!("{mib:.1} MiB"),
                json!({"mib": mib, "records": recs, "seconds": secs}),
            );
        peaks.push(mib);
    }
    let growth = peaks[1] / peaks[0];
    r.target(
        "peak RSS ≤ 256 MiB, flat (≤ 1.25×) from the small to the 10× backlog",
        format!("{:.0} → {:.0} MiB ({growth:.2}×)", peaks[0], peaks[1]),
        Some(peaks[1] <= 256.0 && growth <= 1.25),
    );
}

/// (g2): one big snapshot file
pub fn single_file(c: &Ctx, r: &mut Report) {
    let a = &c.a;
    let bootstrap = c.bootstrap.as_str();
    eprintln!("peak memory backfilling one multi-vnode snapshot file…");
    let mut peaks = Vec::new();
    for rows in [a.single_file_small, a.single_file_large] {
        let (bytes, mib, secs) = single_file_snapshot(&a.bin, bootstrap, rows);
        let file_mib = bytes as f64 / (1 << 20) as f64;
        r.figure(
                &format!("g2_peak_rss_single_file_{rows}"),
                &format!("peak RSS (VmHWM) of `kafka-backfill run` backfilling a snapshot of {rows} rows in ONE Avro file of {file_mib:.0} MiB holding all 256 vnodes in random order (spilled by vnode), into SQLite ({secs:.1} s end to end)"),
                format!("{mib:.1} MiB ({:.2}× the file)", mib / file_mib),
                json!({"mib": mib, "file_mib": file_mib, "rows": rows, "seconds": secs}),
            );
        peaks.push((file_mib, mib));
    }
    let growth = peaks[1].1 / peaks[0].1;
    r.target(
            "peak RSS of a single-file snapshot bounded by the vnode, not the file: ≤ 1.25× from the small to the 10× file",
            format!(
                "{:.0} MiB file → {:.0} MiB RSS; {:.0} MiB file → {:.0} MiB RSS ({growth:.2}×)",
                peaks[0].0, peaks[0].1, peaks[1].0, peaks[1].1
            ),
            Some(growth <= 1.25),
        );
}

/// (h): recreation
pub fn recreate(c: &Ctx, r: &mut Report) {
    let bootstrap = c.bootstrap.as_str();
    eprintln!("recreation turnaround…");
    let (join, turnaround) = recreation_turnaround(bootstrap, 4);
    let defaults = RecreationConfig::default();
    r.figure(
        "h_join_to_rebalance_s",
        "a second worker joins in the log store → the invariant error (the group's rebalance)",
        format!("{join:.2} s"),
        json!(join),
    );
    r.figure(
            "h_rebalance_to_first_snapshot_row_s",
            &format!("the invariant error → the first row of the new generation's snapshot scan, default settings (includes the {} ms initial backoff)", defaults.backoff_initial_ms),
            format!("{turnaround:.2} s"),
            json!(turnaround),
        );
}

/// scaling out in the middle of the log store: reschedule vs recreate
pub fn reschedule(c: &Ctx, r: &mut Report) {
    let a = &c.a;
    let bootstrap = c.bootstrap.as_str();
    let pg = c.pg.as_str();
    let pg_label = c.pg_label.as_str();
    eprintln!("a scale-out mid log store, reschedule vs recreate…");
    let d = dir("scaleout");
    let topic = format!("bench-scaleout-{}", rand_suffix());
    // Fixed sizes, whatever `--quick`/`--ci` say: the log store must outlast a group join
    // (≈ 2.5 s, figure h) for the second process to land in it (checked in the function).
    let (rows, changes) = (SCALE_OUT_ROWS, SCALE_OUT_CHANGES);
    produce(log_workload(bootstrap, &topic, 4, rows, changes, 100, &d));
    // `--ci` proves the section runs with one policy (the tests cover both: `capture_e2e`'s
    // joins under `reschedule` and `recreate`); the comparison is the other sizes'.
    let policies: &[&str] = if a.size == "ci" {
        &["reschedule"]
    } else {
        &["reschedule", "recreate"]
    };
    for &policy in policies {
        let (secs, recreations) =
            scale_out_mid_log_store(&a.bin, bootstrap, pg, &d, &topic, policy);
        r.figure(
                &format!("r_scale_out_mid_log_store_{policy}"),
                &format!("time to finish one backfill ({rows} snapshot rows, {changes} changes, 4 partitions, {pg_label}) when a second process joins mid log store, recreation.policy = {policy}: first start → last exit; recreations {recreations}"),
                format!("{secs:.1} s"),
                json!({"seconds": secs, "recreations": recreations}),
            );
    }
}

/// staging: the core's stage + take_through in process, against the rows alone.
pub fn staging(c: &Ctx, r: &mut Report) {
    let a = &c.a;
    staging::run(a.log_changes as usize, a.reps, r);
}

/// adaptive rate limiting against a competing application on the same PostgreSQL.
pub fn adaptive(c: &Ctx, r: &mut Report) {
    let a = &c.a;
    let bootstrap = c.bootstrap.as_str();
    let pg = c.pg.as_str();
    let pg_label = c.pg_label.as_str();
    eprintln!("adaptive rate limiting under a competing load…");
    // (changes, then seconds of warm-up and of window: unlimited runs, adaptive runs). The
    // adaptive runs settle first (a decision a second, a p99 from 100 commits).
    let (changes, unlimited, adaptive) = match a.size {
        "full" => (3_000_000, (8, 20), (30, 60)),
        "quick" => (1_500_000, (5, 8), (15, 30)),
        // 2.5× what 4 s of this machine's fastest replay (release, unloaded) reads.
        // --ci proves the section runs (the dev build replays a tenth as fast): a third of that.
        _ => (200_000, (2, 2), (2, 2)),
    };
    let secs = |(w, n): (u64, u64)| (Duration::from_secs(w), Duration::from_secs(n));
    let target: u64 = a.adaptive_target_ms;
    let load = Some((2usize, a.load_tps / 2.0));
    let d = dir("adaptive");
    let topic = format!("bench-adaptive-{}", rand_suffix());
    // Small checkpoints (1,000 changes: 500 per epoch, a checkpoint every 2 barriers) for
    // enough commit samples in the window.
    produce(Workload {
        changes_per_epoch: 500,
        checkpoint_every: 2,
        ..log_workload(bootstrap, &topic, 4, 1_000, changes, 100, &d)
    });
    let what = format!("{pg_label}; 1 worker replaying the log (1,000 changes per checkpoint); the competing application: 2 connections, {:.0} transactions/s in all, each 100 random row updates and a durable commit, timed from when it was due; window {} s after {} s in the log store ({} s after {} s when adaptive)", a.load_tps, unlimited.1, unlimited.0, adaptive.1, adaptive.0);
    let mut p99s = BTreeMap::new();
    for (id, label, with_load, t) in [
        (
            "alone_unlimited",
            "no competing load, no rate limit",
            false,
            None,
        ),
        (
            "loaded_unlimited",
            "competing load, no rate limit",
            true,
            None,
        ),
        (
            "loaded_adaptive",
            "competing load, adaptive",
            true,
            Some(target),
        ),
        (
            "alone_adaptive",
            "no competing load, adaptive",
            false,
            Some(target),
        ),
    ] {
        let run = loaded_run(
            &a.bin,
            bootstrap,
            pg,
            &d,
            &topic,
            if with_load { load } else { None },
            t,
            secs(if t.is_some() && with_load {
                adaptive
            } else {
                unlimited
            }),
        );
        let (commits, p99) = p99_shown(run.commit_ms.clone());
        let (load_shown, load_p99) = p99_shown(run.load_ms.clone());
        let t_shown = t.map_or(String::new(), |t| format!(" (target_commit_p99_ms = {t})"));
        r.figure(
                &format!("k_{id}"),
                &format!("{label}{t_shown}: the job's checkpoint commits, its committed changes/s, and the competing application's transactions — {what}"),
                format!(
                    "commits {commits}; {} changes/s; competing transactions {}",
                    fmt_rate(run.changes_per_second),
                    if with_load { load_shown } else { "none".into() }
                ),
                json!({"commit_p99_ms": p99, "commit_samples": run.commit_ms.len(), "changes_per_second": run.changes_per_second, "load_p99_ms": load_p99, "load_samples": run.load_ms.len()}),
            );
        p99s.insert(id, (p99, load_p99));
    }
    let (adaptive, _) = p99s["loaded_adaptive"];
    r.target(
            &format!("adaptive: the job's commit p99 under the competing load within ±25 % of target_commit_p99_ms = {target} (≥ 200 samples)"),
            adaptive.map_or("too few samples".into(), |p| {
                format!("{p:.1} ms ({:.2}× the target)", p / target as f64)
            }),
            adaptive.map(|p| (p / target as f64 - 1.0).abs() <= 0.25),
        );
    let (unl, adp) = (p99s["loaded_unlimited"].1, p99s["loaded_adaptive"].1);
    r.target(
        "adaptive: the competing application's transaction p99 lower than beside the unlimited job",
        format!(
            "{} → {}",
            unl.map_or("-".into(), |p| format!("{p:.1} ms")),
            adp.map_or("-".into(), |p| format!("{p:.1} ms"))
        ),
        unl.zip(adp).map(|(u, a)| a < u),
    );
}

/// peer: ConsumerPerformance, a Kafka Streams KTable and the binary on one topic
pub fn peer(c: &Ctx, r: &mut Report) {
    let a = &c.a;
    let bootstrap = c.bootstrap.as_str();
    let log_topics = &c.log_topics;
    eprintln!("peer…");
    let (_, topic, d, records) = log_topics
        .iter()
        .find(|t| t.0 == 4)
        .expect("the 4-partition log topic");
    peer::run(r, &a.bin, bootstrap, topic, d, *records, a.reps);
}

/// scale: workers, processes, partitions on durable PostgreSQL
pub fn scale(c: &Ctx, r: &mut Report) {
    let a = &c.a;
    let bootstrap = c.bootstrap.as_str();
    let pg = c.pg.as_str();
    let pg_label = c.pg_label.as_str();
    let pid = c.pid;
    let log_topics = &c.log_topics;
    eprintln!("scale…");
    let mut topics = log_topics.clone();
    let d = dir("log64");
    let topic = format!("bench-log64-{}", rand_suffix());
    produce(log_workload(
        bootstrap,
        &topic,
        64,
        10_000,
        a.log_changes,
        100,
        &d,
    ));
    let records = topic_records(bootstrap, &topic, 64);
    topics.push((64, topic, d, records));
    let cases: Vec<(u32, usize, u32)> = vec![
        // (partitions, processes, workers per process)
        (4, 1, 1),
        (4, 1, 2),
        (4, 1, 4),
        (4, 2, 1),
        (4, 4, 1),
        (16, 1, 1),
        (64, 1, 1),
    ];
    for (partitions, processes, workers) in cases {
        let (_, topic, d, records) = topics.iter().find(|t| t.0 == partitions).unwrap();
        let table = format!("bench_scale_{pid}_{}", rand_suffix());
        let store = format!("kind = \"postgres\"\nurl = \"{pg}\"\ntable = \"{table}\"");
        let cfg = d.join(format!("scale-{processes}x{workers}.toml"));
        // Members that join while others are in the log store are absorbed, not recreated.
        write_job_toml(
            &cfg,
            &job_toml(
                &format!("scale{partitions}p{processes}x{workers}{}", rand_suffix()),
                topic,
                bootstrap,
                &d.join("snapshot"),
                &store,
                workers,
                "reschedule",
            ),
        );
        let (secs, mib) = run_processes(&a.bin, &cfg, processes);
        let rate = *records as f64 / secs;
        r.figure(
                &format!("s_{partitions}p_{processes}proc_{workers}w"),
                &format!("{partitions} partitions, {processes} process(es) × {workers} worker(s), {pg_label}: {records} records, end to end (spawn → every process exited; group join included), summed peak RSS {mib:.0} MiB"),
                format!("{} records/s ({secs:.1} s)", fmt_rate(rate)),
                json!({"records_per_s": rate, "seconds": secs, "peak_rss_mib": mib}),
            );
    }
}

/// consistency: what "epoch" costs against "vnode", two workers, each store
pub fn consistency(c: &Ctx, r: &mut Report) {
    let a = &c.a;
    let bootstrap = c.bootstrap.as_str();
    let pg = c.pg.as_str();
    let pg_label = c.pg_label.as_str();
    let log_topics = &c.log_topics;
    eprintln!("consistency…");
    let (_, topic, d, records) = log_topics
        .iter()
        .find(|t| t.0 == 4)
        .expect("the 4-partition log topic")
        .clone();
    for store_kind in ["sqlite", "postgres"] {
        let mut rates = BTreeMap::new();
        for consistency in ["vnode", "epoch"] {
            let mut cpus = Vec::new();
            let (rate, all) = runs(a.reps, |i| {
                let name = format!("cons{store_kind}{consistency}{i}{}", rand_suffix());
                let store = if store_kind == "sqlite" {
                    format!(
                        "kind = \"sqlite\"\npath = \"{}\"\ntable = \"accounts\"",
                        d.join(format!("{name}.sqlite")).display()
                    )
                } else {
                    format!("kind = \"postgres\"\nurl = \"{pg}\"\ntable = \"bench_{name}\"")
                };
                let cfg = d.join(format!("{name}.toml"));
                write_job_toml(
                    &cfg,
                    &job_toml(
                        &name,
                        &topic,
                        bootstrap,
                        &d.join("snapshot"),
                        &store,
                        2,
                        "reschedule",
                    )
                    .replace(
                        "max_epochs_ahead = 256\n",
                        &format!("max_epochs_ahead = 256\nconsistency = \"{consistency}\"\n"),
                    ),
                );
                let before = cpu::children_secs();
                let (secs, _) = run_processes(&a.bin, &cfg, 1);
                cpus.push((cpu::children_secs() - before) * 1e6 / records as f64);
                records as f64 / secs
            });
            let cpu_m = median(cpus);
            let label = if store_kind == "sqlite" {
                "SQLite".to_string()
            } else {
                pg_label.to_string()
            };
            r.figure(
                    &format!("k_consistency_{store_kind}_{consistency}"),
                    &format!("consistency = \"{consistency}\", {label}: one process of 2 workers, {records} records over 4 partitions, end to end (spawn → exit when caught up: join, 10,000-row snapshot, log store), median of {:?}; {cpu_m:.2} CPU-s per million records (the process's user + system)", all.iter().map(|x| x.round()).collect::<Vec<_>>()),
                    format!("{} records/s", fmt_rate(rate)),
                    json!({"records_per_s": rate, "cpu_s_per_million": cpu_m}),
                );
            rates.insert(consistency, rate);
        }
        let ratio = rates["epoch"] / rates["vnode"];
        r.figure(
                &format!("ratio_k_epoch_over_vnode_{store_kind}"),
                "consistency = \"epoch\" / \"vnode\", same log, same run: the cost of publishing the whole table at one epoch",
                format!("{ratio:.3}"),
                json!(ratio),
            );
    }
}

/// schema: a log of three schema versions against the same log without them
pub fn schema(c: &Ctx, r: &mut Report) {
    let a = &c.a;
    let bootstrap = c.bootstrap.as_str();
    // The hand measurement's shape at full size: 200,000 rows, 400,000 changes, 4 partitions.
    let rows = (a.snapshot_rows / 5).max(1_000);
    let changes = (a.log_changes * 2 / 5).max(4_000);
    eprintln!("schema: {rows}-row snapshot, {changes} changes, without and with 3 versions…");
    let logs: Vec<(bool, String, PathBuf, u64)> = [false, true]
        .into_iter()
        .map(|evolve| {
            let d = dir(&format!("schema-{evolve}"));
            let topic = format!("bench-schema-{evolve}-{}", rand_suffix());
            let mut w = log_workload(bootstrap, &topic, 4, rows, changes, 100, &d);
            w.evolve = evolve;
            // Checkpoints enough for a version at each quarter, also at the smallest size.
            w.changes_per_epoch = (changes / 100).clamp(20, 2_000);
            produce(w);
            let records = topic_records(bootstrap, &topic, 4);
            (evolve, topic, d, records)
        })
        .collect();
    // (wall s, CPU-s, peak MiB) per run, the two logs alternating so both meet the same machine.
    let mut runs_of: BTreeMap<bool, Vec<(f64, f64, f64)>> = BTreeMap::new();
    let mut table_rows = 0i64;
    for i in 0..a.reps {
        for (evolve, topic, d, _) in &logs {
            let name = format!("schema{evolve}{i}{}", rand_suffix());
            let db = d.join(format!("{name}.sqlite"));
            let store = format!(
                "kind = \"sqlite\"\npath = \"{}\"\ntable = \"accounts\"",
                db.display()
            );
            let cfg = d.join(format!("{name}.toml"));
            write_job_toml(
                &cfg,
                &job_toml(
                    &name,
                    topic,
                    bootstrap,
                    &d.join("snapshot"),
                    &store,
                    1,
                    "recreate",
                ),
            );
            let before = cpu::children_secs();
            let (secs, mib) = run_processes(&a.bin, &cfg, 1);
            let cpu_s = cpu::children_secs() - before;
            let c = rusqlite::Connection::open(&db).unwrap();
            let applied: i64 = c
                .query_row("SELECT count(*) FROM kb_schema_history", [], |r| r.get(0))
                .unwrap();
            assert_eq!(applied, if *evolve { 3 } else { 0 }, "versions applied");
            table_rows = c
                .query_row("SELECT count(*) FROM accounts", [], |r| r.get(0))
                .unwrap();
            runs_of.entry(*evolve).or_default().push((secs, cpu_s, mib));
        }
    }
    let med = |evolve: bool, k: usize| {
        median(
            runs_of[&evolve]
                .iter()
                .map(|r| [r.0, r.1, r.2][k])
                .collect(),
        )
    };
    for (evolve, label) in [
        (false, "one schema"),
        (true, "three versions (add 2 columns, widen, drop)"),
    ] {
        r.figure(
                &format!("s_schema_{}", if evolve { "evolved" } else { "plain" }),
                &format!("{label}: {rows}-row snapshot + {} records over 4 partitions into SQLite, one worker, end to end (spawn → exit when caught up), median of {}; wall, process CPU (user + system), peak RSS", logs[evolve as usize].3, a.reps),
                format!(
                    "{:.2} s, {:.2} CPU-s, {:.0} MiB",
                    med(evolve, 0),
                    med(evolve, 1),
                    med(evolve, 2)
                ),
                json!({"seconds": med(evolve, 0), "cpu_s": med(evolve, 1), "peak_mib": med(evolve, 2)}),
            );
    }
    let extra = med(true, 1) - med(false, 1);
    let per_row_us = extra / 3.0 / table_rows.max(1) as f64 * 1e6;
    r.figure(
            "ratio_s_evolved_over_plain",
            &format!("the log with three versions / without, same run: CPU and peak RSS; the extra CPU over 3 versions and the {table_rows} rows the table ends with is {extra:.2} CPU-s, {per_row_us:.1} µs a row a version (an upper bound: the evolved log's rows also differ — two more columns, then no payload)"),
            format!(
                "CPU {:.2}×, RSS {:.2}×",
                med(true, 1) / med(false, 1),
                med(true, 2) / med(false, 2)
            ),
            json!({"cpu": med(true, 1) / med(false, 1), "rss": med(true, 2) / med(false, 2), "extra_cpu_s": extra, "us_per_row_version": per_row_us}),
        );
}

/// pg-key: the PostgreSQL table keyed (_kb_vnode, _kb_key) against the last release's _kb_key
pub fn pg_key(c: &Ctx, r: &mut Report) {
    let a = &c.a;
    let bootstrap = c.bootstrap.as_str();
    let pg = c.pg.as_str();
    let pg_label = c.pg_label.as_str();
    let pid = c.pid;
    // A table larger than the server's buffers, so that where an index insert lands matters:
    // the snapshot's rows (appended vnode by vnode in key order), then the log over them.
    let rows = a.snapshot_rows;
    eprintln!("pg-key: {rows}-row snapshot, {} changes…", a.log_changes);
    let d = dir("pgkey");
    let topic = format!("bench-pgkey-{}", rand_suffix());
    produce(log_workload(
        bootstrap,
        &topic,
        4,
        rows,
        a.log_changes,
        100,
        &d,
    ));
    let records = topic_records(bootstrap, &topic, 4);
    let mut client = postgres::Client::connect(pg, postgres::NoTls).unwrap();
    let columns = workload::TableKind::Accounts
        .schema()
        .unwrap()
        .column_ddl(kafka_backfill::codec::ColumnType::postgres);
    let mut rates: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut cpus: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut snapshot_rates: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    // Alternating, so that both layouts meet the same machine, broker and server state.
    for i in 0..a.reps {
        for layout in ["vnode_key", "key"] {
            let table = format!("bench_key_{layout}_{pid}_{i}_{}", rand_suffix());
            if layout == "key" {
                // As the last release created its tables.
                client
                        .batch_execute(&format!("CREATE TABLE \"{table}\" (_kb_key BYTEA PRIMARY KEY, _kb_vnode INT NOT NULL, {columns}, _kb_row BYTEA NOT NULL)"))
                        .unwrap();
            }
            let t = timed_run_cpu(&job_config(
                &format!("k{}{i}", rand_suffix() % 100_000),
                &topic,
                bootstrap,
                &d.join("snapshot"),
                postgres(pg, &table),
            ));
            rates
                .entry(layout)
                .or_default()
                .push(records as f64 / t.log_secs);
            snapshot_rates
                .entry(layout)
                .or_default()
                .push(rows as f64 / t.snapshot_secs);
            cpus.entry(layout)
                .or_default()
                .push(t.log_cpu.per_million(records));
        }
    }
    let mut medians = BTreeMap::new();
    for (layout, what) in [
        ("vnode_key", "PRIMARY KEY (_kb_vnode, _kb_key), new tables"),
        ("key", "PRIMARY KEY (_kb_key), the last release's tables"),
    ] {
        let rate = median(rates[layout].clone());
        let cpu_m = median(cpus[layout].clone());
        let snap = median(snapshot_rates[layout].clone());
        r.figure(
                &format!("l_pg_key_snapshot_{layout}"),
                &format!("snapshot phase into {pg_label}, table keyed {what}: {rows} rows, 1 worker, median of {:?}", snapshot_rates[layout].iter().map(|x| x.round()).collect::<Vec<_>>()),
                format!("{} rows/s", fmt_rate(snap)),
                json!(snap),
            );
        r.figure(
                &format!("l_pg_key_log_{layout}"),
                &format!("log-store phase over it, same table: {records} records over 4 partitions, median of {:?}; {cpu_m:.2} CPU-s per million records (kafka-backfill's process)", rates[layout].iter().map(|x| x.round()).collect::<Vec<_>>()),
                format!("{} records/s", fmt_rate(rate)),
                json!({"records_per_s": rate, "cpu_s_per_million": cpu_m}),
            );
        medians.insert(layout, (snap, rate));
    }
    for (i, phase) in ["snapshot", "log"].into_iter().enumerate() {
        let pick = |m: (f64, f64)| if i == 0 { m.0 } else { m.1 };
        let ratio = pick(medians["vnode_key"]) / pick(medians["key"]);
        r.figure(
                &format!("ratio_l_{phase}_vnode_key_over_key"),
                &format!("{phase} phase: PostgreSQL table keyed (_kb_vnode, _kb_key) / keyed _kb_key, same log, same run, alternating"),
                format!("{ratio:.3}"),
                json!(ratio),
            );
    }
}

/// pg-ceiling: the server's own rate for the store's statement shapes, one session and two
pub fn pg_ceiling(c: &Ctx, r: &mut Report) {
    let a = &c.a;
    let pg = c.pg.as_str();
    let pg_label = c.pg_label.as_str();
    pg_ceiling::run(pg, pg_label, a.snapshot_rows, a.log_changes, a.reps, r);
}

/// capture: PostgreSQL → the log store, against COPY and pg_recvlogical
pub fn capture(c: &Ctx, r: &mut Report) {
    let a = &c.a;
    let bootstrap = c.bootstrap.as_str();
    let pg = c.pg.as_str();
    let sizes = match a.size {
        "full" => capture::Sizes {
            small_scale: 10,
            large_scale: 100,
            backlog_txns: 100_000,
            latency_samples: 200,
            stream_tps: 200,
        },
        "quick" => capture::Sizes {
            small_scale: 1,
            large_scale: 10,
            backlog_txns: 20_000,
            latency_samples: 200,
            stream_tps: 100,
        },
        _ => capture::Sizes {
            small_scale: 1,
            large_scale: 1,
            backlog_txns: 2_000,
            latency_samples: 8,
            stream_tps: 100,
        },
    };
    let sizes = capture::Sizes {
        small_scale: a.capture_small_scale.unwrap_or(sizes.small_scale),
        large_scale: a.capture_large_scale.unwrap_or(sizes.large_scale),
        stream_tps: a.stream_tps.unwrap_or(sizes.stream_tps),
        ..sizes
    };
    capture::run(&a.bin, bootstrap, pg, &sizes, r);
}

/// several tables: one job of pgbench's four tables against one job per table
pub fn several_tables(c: &Ctx, r: &mut Report) {
    let a = &c.a;
    let bootstrap = c.bootstrap.as_str();
    let pg = c.pg.as_str();
    let pg_label = c.pg_label.as_str();
    let sizes = match a.size {
        "full" => several_tables::Sizes {
            rate: 200,
            churn_secs: 120,
            probes: 200,
            stores: vec!["sqlite", "postgres"],
            replays: 3,
        },
        "quick" => several_tables::Sizes {
            rate: 200,
            churn_secs: 40,
            probes: 50,
            stores: vec!["sqlite", "postgres"],
            replays: 1,
        },
        _ => several_tables::Sizes {
            rate: 50,
            churn_secs: 8,
            probes: 5,
            stores: vec!["sqlite"],
            replays: 1,
        },
    };
    several_tables::run(&a.bin, bootstrap, pg, pg_label, &sizes, r);
}

/// Section `dba-copy` (`dba_copy.rs`): pgbench's four tables end to end against `pg_dump | psql`.
pub fn dba_copy(c: &Ctx, r: &mut Report) {
    let scale = match c.a.size {
        "full" => 10,
        "quick" => 10,
        _ => 1,
    };
    dba_copy::run(
        &c.a.bin,
        &c.bootstrap,
        &c.pg,
        &c.pg_label,
        scale,
        &["postgres", "sqlite"],
        r,
    );
}

/// Section `many-tables` (`many_tables.rs`): 4 to 200 tables in one log and one job.
pub fn many_tables(c: &Ctx, r: &mut Report) {
    let sizes = match c.a.size {
        "full" => many_tables::Sizes {
            counts: &[4, 50, 200],
            rows: 2_000,
            load_secs: 30,
        },
        "quick" => many_tables::Sizes {
            counts: &[4, 50, 200],
            rows: 2_000,
            load_secs: 15,
        },
        _ => many_tables::Sizes {
            counts: &[4, 8],
            rows: 500,
            load_secs: 3,
        },
    };
    many_tables::run(&c.a.bin, &c.bootstrap, &c.pg, &c.pg_label, &sizes, r);
}

/// Section `mariadb` (`mariadb.rs`): the MariaDB capture against mariadb-dump and mariadb-binlog.
pub fn mariadb(c: &Ctx, r: &mut Report) {
    let sizes = match c.a.size {
        "full" => mariadb::Sizes {
            rows: 1_000_000,
            changes: 1_000_000,
        },
        "quick" => mariadb::Sizes {
            rows: 200_000,
            changes: 200_000,
        },
        _ => mariadb::Sizes {
            rows: 20_000,
            changes: 10_000,
        },
    };
    mariadb::run(&c.a.bin, &c.bootstrap, &sizes, r);
}

/// Section `cluster` (`cluster.rs`): the broker's CPU and the replica's lag at the defaults.
pub fn cluster(c: &Ctx, r: &mut Report) {
    let sizes = match c.a.size {
        "full" => cluster::Sizes {
            rate: 200,
            window_secs: 60,
        },
        "quick" => cluster::Sizes {
            rate: 200,
            window_secs: 30,
        },
        _ => cluster::Sizes {
            rate: 200,
            window_secs: 5,
        },
    };
    cluster::run(&c.a.bin, &c.bootstrap, &c.pg, &sizes, r);
}
