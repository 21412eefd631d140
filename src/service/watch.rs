//! `kafka-backfill status --watch`: a live view of a running service's `/status` for a person at a
//! terminal — per job a progress bar per phase (snapshot: vnodes done of all, and for a job of
//! several tables one bar per table; log store: records replayed of the most lag seen) with lag,
//! epoch lag, rate and ETA, drawn with `indicatif`; one plain
//! line per job per refresh when stdout is not a terminal. Reads `/status` only; decides nothing (lag,
//! rate and ETA come computed from the core through `/status`).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Result;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::Value;

/// One job as the view shows it, from one `/status` document.
#[derive(Clone, Debug, PartialEq)]
pub struct JobView {
    pub job: String,
    pub vnodes: u64,
    /// Vnodes whose snapshot is finished.
    pub snapshot_done: u64,
    /// Records between the committed offsets and the high watermarks, over this process's workers.
    pub lag_records: u64,
    pub epoch_lag_seconds: f64,
    pub records_per_second: f64,
    pub eta_seconds: Option<f64>,
    pub caught_up: bool,
    /// Every worker of this process reports the job paused.
    pub paused: bool,
    /// A job of several tables: each store table, the vnodes whose snapshot of it is done, and the
    /// log-store changes of it this process applied.
    pub tables: Vec<(String, u64, u64)>,
}

/// Every job of a `/status` document. Job-level vnode counts come from the store (`progress`); before
/// the first read, from this process's workers.
pub fn job_views(status: &Value) -> Vec<JobView> {
    status["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|j| {
            let workers: Vec<&Value> = j["workers"].as_array().into_iter().flatten().collect();
            let sum = |f: &dyn Fn(&Value) -> u64| workers.iter().map(|w| f(w)).sum::<u64>();
            let p = &j["progress"];
            let (vnodes, snapshot_done) = if p.is_object() {
                let n = |k: &str| p[k].as_u64().unwrap_or(0);
                let total = n("vnodes_snapshot") + n("vnodes_log_store") + n("vnodes_streaming");
                (total, total - n("vnodes_snapshot"))
            } else {
                let owned = sum(&|w| w["owned_vnodes"].as_u64().unwrap_or(0));
                let left = sum(&|w| w["snapshot_vnodes_left"].as_u64().unwrap_or(0));
                (owned, owned.saturating_sub(left))
            };
            JobView {
                job: j["job"].as_str().unwrap_or("?").to_string(),
                vnodes,
                snapshot_done,
                lag_records: sum(&|w| w["lag_records"].as_u64().unwrap_or(0)),
                epoch_lag_seconds: workers
                    .iter()
                    .filter_map(|w| w["epoch_lag_seconds"].as_f64())
                    .fold(0.0, f64::max),
                records_per_second: workers
                    .iter()
                    .filter_map(|w| w["records_per_second"].as_f64())
                    .sum(),
                eta_seconds: workers
                    .iter()
                    .filter_map(|w| w["estimated_catch_up_seconds"].as_f64())
                    .reduce(f64::max),
                caught_up: p["caught_up"].as_bool().unwrap_or(false),
                paused: !workers.is_empty()
                    && workers
                        .iter()
                        .all(|w| w["paused"].as_bool().unwrap_or(false)),
                tables: j["tables"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|t| {
                        (
                            t["table"].as_str().unwrap_or("?").to_string(),
                            t["snapshot_vnodes_done"].as_u64().unwrap_or(0),
                            t["log_store_changes"].as_u64().unwrap_or(0),
                        )
                    })
                    .collect(),
            }
        })
        .collect()
}

fn log_message(v: &JobView) -> String {
    if v.paused {
        return format!("paused (lag {} records)", v.lag_records);
    }
    if v.caught_up {
        return "caught up".into();
    }
    format!(
        "lag {} records, epoch lag {:.1} s, {:.0} records/s, ETA {}",
        v.lag_records,
        v.epoch_lag_seconds,
        v.records_per_second,
        v.eta_seconds
            .map_or("—".to_string(), |s| format!("{:.0} s", s.ceil()))
    )
}

/// The line a non-terminal gets for one job at one refresh.
pub fn plain_line(v: &JobView) -> String {
    let tables: String = v
        .tables
        .iter()
        .map(|(t, done, changes)| {
            format!(
                " (table {t}: snapshot {done}/{} vnodes, {changes} changes)",
                v.vnodes
            )
        })
        .collect();
    format!(
        "job {}: snapshot {}/{} vnodes{tables}; log store: {}",
        v.job,
        v.snapshot_done,
        v.vnodes,
        log_message(v)
    )
}

/// A snapshot bar's (position, length): empty until the job's vnodes are known (a bar of length 0
/// draws full).
fn snapshot_bar(done: u64, vnodes: u64) -> (u64, u64) {
    if vnodes == 0 {
        (0, 1)
    } else {
        (done.min(vnodes), vnodes)
    }
}

/// The log-store bar's (position, length): its length is the most lag seen; empty while no lag has
/// been seen and the job has not caught up, full once it has.
fn log_bar(v: &JobView, max_lag: u64) -> (u64, u64) {
    let len = max_lag.max(1);
    if v.caught_up {
        (len, len)
    } else if max_lag == 0 {
        (0, len)
    } else {
        (len - v.lag_records.min(len), len)
    }
}

/// The bars of one job (a snapshot bar per table of a job of several), and the most lag seen (the
/// log-store bar's length).
struct Bars {
    snapshot: ProgressBar,
    tables: Vec<ProgressBar>,
    log: ProgressBar,
    max_lag: u64,
}

/// Polls `{url}/status` every `interval` and draws it, until interrupted — or, with
/// `until_caught_up`, until every job has caught up. A failed poll is shown and retried at the next
/// refresh.
pub fn watch(url: &str, interval: Duration, until_caught_up: bool) -> Result<()> {
    let url = format!("{}/status", url.trim_end_matches('/'));
    let terminal = std::io::stdout().is_terminal();
    let multi = MultiProgress::with_draw_target(if terminal {
        ProgressDrawTarget::stdout_with_hz(4)
    } else {
        ProgressDrawTarget::hidden()
    });
    multi.set_move_cursor(true);
    let style = ProgressStyle::with_template("{prefix:<28} [{bar:32}] {pos:>9}/{len:<9} {msg}")
        .expect("template")
        .progress_chars("=> ");
    let mut bars: BTreeMap<String, Bars> = BTreeMap::new();
    loop {
        let views = match crate::service::http::get(&url) {
            Ok((200, body)) => job_views(&serde_json::from_str(&body)?),
            Ok((code, _)) => {
                eprintln!("{url} answered {code}; retrying");
                Vec::new()
            }
            Err(e) => {
                eprintln!("{url}: {}; retrying", crate::error::line(&e));
                Vec::new()
            }
        };
        for v in &views {
            if !terminal {
                println!("{}", plain_line(v));
                continue;
            }
            let b = bars.entry(v.job.clone()).or_insert_with(|| {
                let snapshot = multi.add(ProgressBar::new(0).with_style(style.clone()));
                snapshot.set_prefix(format!("{} snapshot vnodes", v.job));
                let tables = v
                    .tables
                    .iter()
                    .map(|(t, ..)| {
                        let bar = multi.add(ProgressBar::new(0).with_style(style.clone()));
                        bar.set_prefix(format!("  table {t}"));
                        bar
                    })
                    .collect();
                let log = multi.add(ProgressBar::new(0).with_style(style.clone()));
                log.set_prefix(format!("{} log store records", v.job));
                Bars {
                    snapshot,
                    tables,
                    log,
                    max_lag: 0,
                }
            });
            let (pos, len) = snapshot_bar(v.snapshot_done, v.vnodes);
            b.snapshot.set_length(len);
            b.snapshot.set_position(pos);
            for (bar, (_, done, changes)) in b.tables.iter().zip(&v.tables) {
                let (pos, len) = snapshot_bar(*done, v.vnodes);
                bar.set_length(len);
                bar.set_position(pos);
                bar.set_message(format!("{changes} changes"));
            }
            b.max_lag = b.max_lag.max(v.lag_records);
            let (pos, len) = log_bar(v, b.max_lag);
            b.log.set_length(len);
            b.log.set_position(pos);
            b.log.set_message(log_message(v));
        }
        if until_caught_up && !views.is_empty() && views.iter().all(|v| v.caught_up) {
            // The bars give way to one final line per job (a group of bars finished within its
            // first draw could lose a line on some terminals).
            if terminal {
                multi.clear()?;
                for v in &views {
                    println!("{}", plain_line(v));
                }
            }
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_job_view_sums_workers_and_takes_vnodes_from_the_store() {
        let status = json!({"jobs": [{
            "job": "accounts",
            "progress": {"vnodes_snapshot": 56, "vnodes_log_store": 100, "vnodes_streaming": 100,
                         "partitions_behind": [1], "caught_up": false},
            "workers": [
                {"worker": "a-0", "owned_vnodes": 128, "snapshot_vnodes_left": 0, "lag_records": 700,
                 "epoch_lag_seconds": 2.5, "records_per_second": 1000.0,
                 "estimated_catch_up_seconds": 0.7},
                {"worker": "a-1", "owned_vnodes": 128, "snapshot_vnodes_left": 56, "lag_records": 300,
                 "epoch_lag_seconds": 4.0, "records_per_second": 500.0,
                 "estimated_catch_up_seconds": 3.2}
            ]
        }]});
        let v = &job_views(&status)[0];
        assert_eq!((v.vnodes, v.snapshot_done, v.lag_records), (256, 200, 1000));
        assert_eq!(
            (v.epoch_lag_seconds, v.records_per_second, v.eta_seconds),
            (4.0, 1500.0, Some(3.2))
        );
        assert_eq!(
            plain_line(v),
            "job accounts: snapshot 200/256 vnodes; log store: lag 1000 records, epoch lag 4.0 s, 1500 records/s, ETA 4 s"
        );
    }

    #[test]
    fn a_job_of_several_tables_shows_each_table() {
        let status = json!({"jobs": [{
            "job": "pgbench",
            "progress": {"vnodes_snapshot": 40, "vnodes_log_store": 24, "vnodes_streaming": 0,
                         "partitions_behind": [], "caught_up": false},
            "tables": [
                {"table": "accounts", "snapshot_vnodes_done": 30, "log_store_changes": 12},
                {"table": "tellers", "snapshot_vnodes_done": 24, "log_store_changes": 5}
            ],
            "workers": [{"lag_records": 10, "epoch_lag_seconds": 1.0, "records_per_second": 5.0,
                         "estimated_catch_up_seconds": 2.0}]
        }]});
        let v = &job_views(&status)[0];
        assert_eq!(
            v.tables,
            [
                ("accounts".to_string(), 30, 12),
                ("tellers".to_string(), 24, 5)
            ]
        );
        assert_eq!(
            plain_line(v),
            "job pgbench: snapshot 24/64 vnodes (table accounts: snapshot 30/64 vnodes, 12 changes) (table tellers: snapshot 24/64 vnodes, 5 changes); log store: lag 10 records, epoch lag 1.0 s, 5 records/s, ETA 2 s"
        );
    }

    #[test]
    fn before_the_first_store_read_vnodes_come_from_the_workers_and_caught_up_is_said() {
        let status = json!({"jobs": [{
            "job": "j", "progress": null,
            "workers": [{"owned_vnodes": 64, "snapshot_vnodes_left": 60, "lag_records": 0,
                          "epoch_lag_seconds": 0.0, "records_per_second": 0.0,
                          "estimated_catch_up_seconds": null}]
        }]});
        let v = &job_views(&status)[0];
        assert_eq!((v.vnodes, v.snapshot_done, v.eta_seconds), (64, 4, None));
        assert!(plain_line(v).ends_with("ETA —"));
        let done = json!({"jobs": [{"job": "j", "progress": {"vnodes_snapshot": 0,
            "vnodes_log_store": 0, "vnodes_streaming": 8, "partitions_behind": [],
            "caught_up": true}, "workers": []}]});
        assert_eq!(
            plain_line(&job_views(&done)[0]),
            "job j: snapshot 8/8 vnodes; log store: caught up"
        );
    }

    #[test]
    fn bars_start_empty_and_are_full_when_caught_up() {
        let status = json!({"jobs": [{"job": "j", "progress": null, "workers": []}]});
        let v = job_views(&status)[0].clone();
        // Nothing known yet: both bars empty, not "0/0" drawn full.
        assert_eq!(snapshot_bar(v.snapshot_done, v.vnodes), (0, 1));
        assert_eq!(log_bar(&v, 0), (0, 1));
        // Replaying: the part of the most lag seen that is done.
        let replaying = JobView {
            vnodes: 8,
            snapshot_done: 8,
            lag_records: 250,
            ..v.clone()
        };
        assert_eq!(snapshot_bar(8, 8), (8, 8));
        assert_eq!(log_bar(&replaying, 1000), (750, 1000));
        // Caught up, with records still arriving: full, beside "caught up".
        let caught_up = JobView {
            caught_up: true,
            lag_records: 3,
            ..replaying
        };
        assert_eq!(log_bar(&caught_up, 1000), (1000, 1000));
        assert_eq!(log_bar(&caught_up, 0), (1, 1));
    }
}
