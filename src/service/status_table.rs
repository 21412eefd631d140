//! `kafka-backfill status` for a person: a running service's `/status` as aligned tables, the way
//! `kafka-consumer-groups --describe` prints a group — one row per worker (job, phase, partitions,
//! rows, lag, ETA), then one row per partition. Epochs are printed as the UTC times they stand for,
//! and a value `/status` does not know (JSON `null`) as `-`, never as `null`. Reads the document
//! only; decides nothing.

use serde_json::Value;

use crate::core::Epoch;

/// The whole text `status` prints for one `/status` document.
pub fn render(status: &Value) -> String {
    let mut out = String::new();
    let jobs: Vec<&Value> = status["jobs"].as_array().into_iter().flatten().collect();
    if jobs.is_empty() {
        out.push_str("no job runs in this process yet\n");
    }
    let mut workers = vec![[
        "JOB",
        "WORKER",
        "PHASE",
        "GEN",
        "PARTITIONS",
        "VNODES",
        "SNAPSHOT-ROWS",
        "LOG-CHANGES",
        "LAG",
        "EPOCH-LAG",
        "RATE/S",
        "ETA",
        "STATE",
    ]
    .map(String::from)
    .to_vec()];
    let mut partitions = vec![[
        "JOB",
        "PARTITION",
        "WORKER",
        "COMMITTED-OFFSET",
        "HIGH-WATERMARK",
        "LAG",
        "COMMITTED-EPOCH",
    ]
    .map(String::from)
    .to_vec()];
    for job in &jobs {
        let name = text(&job["job"]);
        if let Some(e) = job["published_epoch"].as_u64() {
            out.push_str(&format!(
                "job {name}: the whole table is the upstream as of {} (consistency = \"epoch\")\n",
                epoch_time(e)
            ));
        }
        let held = &job["published_held_back_by"];
        if let Some(p) = held["partition"].as_u64() {
            out.push_str(&format!(
                "job {name}: held back by partition {p} (owner {}), committed to {}, {:.1} s behind the furthest partition\n",
                text(&held["owner"]),
                held["epoch"].as_u64().map_or("-".into(), epoch_time),
                held["seconds_behind"].as_f64().unwrap_or(0.0)
            ));
        }
        if let Some(n) = job["dead_letters"].as_u64().filter(|n| *n > 0) {
            out.push_str(&format!(
                "job {name}: {n} dead letter(s) (kafka-backfill verify lists them)\n"
            ));
        }
        for w in job["workers"].as_array().into_iter().flatten() {
            let worker = text(&w["worker"]);
            let parts: Vec<String> = w["partitions"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| text(&p["partition"]))
                .collect();
            let mut state = Vec::new();
            if w["paused"].as_bool() == Some(true) {
                state.push("paused".to_string());
            }
            if w["caught_up"].as_bool() == Some(true) {
                state.push("caught up".to_string());
            }
            if w["store_reachable"].as_bool() == Some(false) {
                state.push("store unreachable".to_string());
            }
            if let Some(e) = w["last_error"].as_str() {
                state.push(format!("last error: {e}"));
            }
            workers.push(vec![
                name.clone(),
                worker.clone(),
                text(&w["phase"]),
                text(&w["generation"]),
                if parts.is_empty() {
                    "-".into()
                } else {
                    parts.join(",")
                },
                text(&w["owned_vnodes"]),
                text(&w["rows"]["snapshot"]),
                text(&w["rows"]["log_store_changes"]),
                text(&w["lag_records"]),
                w["epoch_lag_seconds"]
                    .as_f64()
                    .map_or("-".into(), |s| format!("{s:.1}s")),
                w["records_per_second"]
                    .as_f64()
                    .map_or("-".into(), |r| format!("{r:.0}")),
                w["estimated_catch_up_seconds"]
                    .as_f64()
                    .map_or("-".into(), duration),
                if state.is_empty() {
                    "-".into()
                } else {
                    state.join(", ")
                },
            ]);
            for p in w["partitions"].as_array().into_iter().flatten() {
                partitions.push(vec![
                    name.clone(),
                    text(&p["partition"]),
                    worker.clone(),
                    text(&p["committed_offset"]),
                    text(&p["high_watermark"]),
                    text(&p["lag"]),
                    p["committed_epoch"].as_u64().map_or("-".into(), epoch_time),
                ]);
            }
        }
    }
    if workers.len() > 1 {
        out.push('\n');
        out.push_str(&table(&workers));
    }
    if partitions.len() > 1 {
        out.push('\n');
        out.push_str(&table(&partitions));
    }
    out
}

/// A JSON scalar as a cell: strings bare, `null` (unknown) as `-`.
fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// An epoch as the UTC time it stands for, to the millisecond; an epoch with no time in it (below
/// 2^16: a hand-written log's small numbers) as its number.
fn epoch_time(e: u64) -> String {
    let millis = Epoch(e).to_unix_millis();
    match chrono::DateTime::from_timestamp_millis(millis as i64) {
        Some(t) if e >= 1 << 16 => t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        _ => format!("epoch {e}"),
    }
}

fn duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// Left-aligned columns two spaces apart, the first row the header.
fn table(rows: &[Vec<String>]) -> String {
    let mut width = vec![0; rows[0].len()];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let last = r.len() - 1;
        for (i, c) in r.iter().enumerate() {
            out.push_str(c);
            if i < last {
                out.push_str(&" ".repeat(width[i] - c.chars().count() + 2));
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc() -> Value {
        let epoch = Epoch::from_unix_millis(1_764_460_800_123).0; // 2025-11-30T00:00:00.123Z
        json!({"jobs": [{
            "job": "accounts",
            "published_epoch": epoch,
            "published_held_back_by": null,
            "dead_letters": 0,
            "workers": [{
                "worker": "a-0", "phase": "log_store", "generation": 2, "owned_vnodes": 128,
                "rows": {"snapshot": 50000, "log_store_changes": 1200},
                "lag_records": 340, "epoch_lag_seconds": 1.25, "records_per_second": 4500.4,
                "estimated_catch_up_seconds": 75.0, "caught_up": false, "paused": true,
                "store_reachable": true, "last_error": null,
                "partitions": [
                    {"partition": 0, "committed_offset": 10, "high_watermark": null, "lag": null,
                     "committed_epoch": epoch},
                    {"partition": 1, "committed_offset": null, "high_watermark": 99, "lag": 89,
                     "committed_epoch": 5}
                ]
            }]
        }]})
    }

    #[test]
    fn a_person_reads_tables_with_times_and_no_null() {
        let text = render(&doc());
        assert!(!text.contains("null"), "{text}");
        assert!(
            text.contains("as of 2025-11-30T00:00:00.123Z"),
            "the published epoch as a time: {text}"
        );
        let lines: Vec<&str> = text.lines().collect();
        let header = lines.iter().position(|l| l.starts_with("JOB  ")).unwrap();
        let cols: Vec<&str> = lines[header].split_whitespace().collect();
        assert_eq!(
            cols,
            [
                "JOB",
                "WORKER",
                "PHASE",
                "GEN",
                "PARTITIONS",
                "VNODES",
                "SNAPSHOT-ROWS",
                "LOG-CHANGES",
                "LAG",
                "EPOCH-LAG",
                "RATE/S",
                "ETA",
                "STATE"
            ]
        );
        let row: Vec<&str> = lines[header + 1].split_whitespace().collect();
        assert_eq!(
            row,
            [
                "accounts",
                "a-0",
                "log_store",
                "2",
                "0,1",
                "128",
                "50000",
                "1200",
                "340",
                "1.2s",
                "4500",
                "1m15s",
                "paused"
            ]
        );
        // The columns line up: each cell starts where its header does.
        let at = lines[header].find("PHASE").unwrap();
        assert_eq!(&lines[header + 1][at..at + 9], "log_store");
        let p0 = lines.iter().find(|l| l.starts_with("accounts  0")).unwrap();
        assert!(
            p0.contains(" -  ") && p0.ends_with("2025-11-30T00:00:00.123Z"),
            "{p0}"
        );
        let p1 = lines.iter().find(|l| l.starts_with("accounts  1")).unwrap();
        assert!(p1.trim_end().ends_with("epoch 5"), "a small epoch: {p1}");
    }

    #[test]
    fn a_process_with_no_job_yet_says_so() {
        assert_eq!(
            render(&json!({"jobs": []})),
            "no job runs in this process yet\n"
        );
    }
}
