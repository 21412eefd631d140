//! CPU time as the OS counts it (issue 22): user + system seconds of this process, of each of its
//! threads by name, and of the children it waited for, read from `/proc`. A phase's CPU is the
//! difference of two readings; the bench's own polling thread is left out.

use std::collections::BTreeMap;

/// Linux's clock tick for `/proc/*/stat` times (USER_HZ, 100 on every Linux ABI).
const TICK: f64 = 0.01;

/// (utime + stime, cutime + cstime) in seconds from one `/proc/*/stat` line.
fn stat_times(stat: &str) -> (f64, f64) {
    // Fields after the command's closing parenthesis, from field 3 (state) on.
    let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
    let f: Vec<f64> = rest
        .split_whitespace()
        .take(15)
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // utime = field 14, stime = 15, cutime = 16, cstime = 17.
    ((f[11] + f[12]) * TICK, (f[13] + f[14]) * TICK)
}

/// This process's own CPU seconds (every thread, including those that have ended).
pub fn process_secs() -> f64 {
    stat_times(&std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat")).0
}

/// CPU seconds of the children this process has waited for (a child's own children included
/// when it waited for them): ConsumerPerformance's JVM under `scripts/kafka.sh`.
pub fn children_secs() -> f64 {
    stat_times(&std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat")).1
}

/// Process `pid`'s CPU seconds (every thread), `None` once it is gone.
pub fn pid_secs(pid: u32) -> Option<f64> {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .map(|s| stat_times(&s).0)
}

/// The PostgreSQL server's CPU seconds on this machine: every live `postgres` process's own, plus
/// the postmaster's waited-for children's (a backend that served a connection and has exited —
/// a job's store connection once the job ended — counts there). The difference of two readings
/// is what the server spent between them, whoever it served (the bench is the only client).
pub fn postgres_server_secs() -> f64 {
    // (pid, parent pid, command, stat line) of every process.
    let mut procs: Vec<(u32, u32, String, String)> = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = stat[open + 1..close].to_string();
        // After the command: state, then the parent's pid.
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|x| x.parse().ok())
            .unwrap_or(0);
        procs.push((pid, ppid, comm, stat));
    }
    let pg: Vec<_> = procs.iter().filter(|p| p.2 == "postgres").collect();
    let mut secs = 0.0;
    for (_, ppid, _, stat) in &pg {
        let (own, children) = stat_times(stat);
        secs += own;
        // The postmaster (a postgres process whose parent is not one) holds its exited children's.
        if !pg.iter().any(|q| q.0 == *ppid) {
            secs += children;
        }
    }
    secs
}

/// The calling thread's own CPU seconds.
pub fn thread_secs() -> f64 {
    stat_times(&std::fs::read_to_string("/proc/thread-self/stat").expect("/proc/thread-self/stat"))
        .0
}

/// The calling thread's id.
pub fn current_tid() -> u64 {
    std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name()?.to_str()?.parse().ok())
        .expect("/proc/thread-self")
}

/// Every live thread of this process: id → (name, CPU seconds).
pub fn threads() -> BTreeMap<u64, (String, f64)> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
    {
        let Ok(tid) = e.file_name().to_string_lossy().parse::<u64>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue; // ended between the listing and the read
        };
        let name = stat
            .find('(')
            .zip(stat.rfind(')'))
            .map(|(a, b)| stat[a + 1..b].to_string())
            .unwrap_or_default();
        out.insert(tid, (name, stat_times(&stat).0));
    }
    out
}

/// A reading: the process's CPU and each live thread's.
#[derive(Clone, Debug)]
pub struct Reading {
    process: f64,
    threads: BTreeMap<u64, (String, f64)>,
}

pub fn read() -> Reading {
    Reading {
        process: process_secs(),
        threads: threads(),
    }
}

/// Which part of the service a thread is, by its name (names are cut to 15 bytes by the kernel:
/// the bench keeps job names short so `<job>/commit` survives).
fn part(name: &str) -> &'static str {
    if name.starts_with("rdk:") {
        "librdkafka"
    } else if name.ends_with("/commit") {
        "committer"
    } else if name.starts_with("sqlite-checkpoi") {
        "checkpointer"
    } else if name.contains('/') {
        "worker"
    } else {
        "other"
    }
}

/// CPU between two readings, leaving out thread `exclude` (the bench's poller): the total and its
/// split by part; threads that ended between the readings count as "ended threads".
#[derive(Clone, Debug, Default)]
pub struct Split {
    pub total: f64,
    pub by_part: BTreeMap<&'static str, f64>,
}

pub fn between(before: &Reading, after: &Reading, exclude: u64) -> Split {
    let mut by_part: BTreeMap<&'static str, f64> = BTreeMap::new();
    let mut live = 0.0;
    let mut excluded = 0.0;
    for (tid, (name, secs)) in &after.threads {
        let was = before.threads.get(tid).map_or(0.0, |t| t.1);
        let d = (secs - was).max(0.0);
        if *tid == exclude {
            excluded = d;
            continue;
        }
        live += d;
        *by_part.entry(part(name)).or_default() += d;
    }
    let total = (after.process - before.process - excluded).max(0.0);
    let ended = (total - live).max(0.0);
    if ended > 0.0 {
        by_part.insert("ended threads", ended);
    }
    Split { total, by_part }
}

impl Split {
    /// CPU seconds per million of `n` items.
    pub fn per_million(&self, n: u64) -> f64 {
        self.total * 1e6 / n.max(1) as f64
    }

    /// The split as shares of the total, e.g. `worker 61%, librdkafka 22%, committer 14%`.
    pub fn shares(&self) -> String {
        let mut parts: Vec<(&str, f64)> = self.by_part.iter().map(|(k, v)| (*k, *v)).collect();
        parts.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap());
        parts
            .iter()
            .filter(|(_, v)| *v > 0.0)
            .map(|(k, v)| format!("{k} {:.0}%", 100.0 * v / self.total.max(1e-9)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
