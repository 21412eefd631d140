//! The WAL checkpointer of one SQLite file: passive rounds off the commit path, and the commit gate
//! that holds commits back while a `TRUNCATE` round restarts a WAL past its bound.

use super::*;

/// Checkpoints the WAL off the commit path. The committing connection has `wal_autocheckpoint = 0`
/// (SQLite's default runs a checkpoint inside the commit that crosses 1,000 pages: 16 % of the
/// replay's CPU); after each commit the store nudges this thread, which runs `wal_checkpoint(PASSIVE)`
/// on its own connection — on the other core, while the worker stages the next checkpoint — and a
/// restart checkpoint when the WAL has grown past [`WAL_RESTART_BYTES`], with the `gate` closed:
/// a commit waits at the gate before its transaction begins while a restart is wanted. Without it
/// the checkpointer's busy handler polls for a moment with no writer while the committer begins
/// its next transaction at once, gives up, and the WAL grows by every commit (500 MiB for a
/// 1M-record replay, written to fresh pages of the file each time; the test
/// `the_wal_stays_bounded_under_continuous_commits`). A lock alone is not enough: a committer
/// that unlocks and locks again at once wins it every time. A failed checkpoint loses nothing (the frames
/// stay in the WAL, which every reader sees); it is logged and tried again at the next nudge.
///
/// Every store of one file in a process shares one checkpointer ([`Checkpointer::shared`]): its
/// gate holds back every job writing the file, so several jobs into one file (one job per table,
/// say) cannot starve the restart the way one committer alone could not either. With a gate per
/// store, the other jobs' commits kept the writer lock busy while the restart waited with its own
/// job's gate closed: that job's commits waited up to the 30 s busy timeout (`scripts/bench.sh
/// --only several-tables`, four jobs into one file with a reader sampling it: commit p99 20 s; the
/// test `jobs_sharing_a_file_share_its_checkpointer`).
///
/// The restart is a `TRUNCATE` (the WAL file back to zero bytes), so the file's length is what was
/// written since: a commit that leaves it past twice the threshold closes the gate itself
/// ([`Checkpointer::committed`]), and the next commit waits for the checkpointer's round. Without
/// that bound the WAL grew by every commit made while a slow `PASSIVE` round ran (a busy machine:
/// 34 MiB under a 1 MiB threshold in CI, 64 KiB pages making each scattered commit megabytes).
pub(super) struct Checkpointer {
    nudge: Option<std::sync::mpsc::SyncSender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub(super) gate: Arc<Gate>,
    /// The WAL file, and the length past which a commit waits for the checkpointer.
    wal: PathBuf,
    hold_bytes: u64,
}

/// Closed (`true`) while the checkpointer restarts the WAL.
#[derive(Default)]
pub(super) struct Gate {
    pub(super) closed: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
}

impl Gate {
    /// Waits until the gate is open (a poisoned lock only means a panic elsewhere).
    pub(super) fn pass(&self) {
        let mut closed = self.closed.lock().unwrap_or_else(|p| p.into_inner());
        while *closed {
            closed = self.opened.wait(closed).unwrap_or_else(|p| p.into_inner());
        }
    }

    pub(super) fn set(&self, closed: bool) {
        *self.closed.lock().unwrap_or_else(|p| p.into_inner()) = closed;
        if !closed {
            self.opened.notify_all();
        }
    }
}

/// The checkpointer of each SQLite file open in this process, by canonical path.
static CHECKPOINTERS: std::sync::OnceLock<
    std::sync::Mutex<std::collections::HashMap<PathBuf, std::sync::Weak<Checkpointer>>>,
> = std::sync::OnceLock::new();

impl Checkpointer {
    /// The file's checkpointer in this process, started by the first store to open it (whose
    /// settings it keeps); it stops when the last store of the file is dropped.
    pub(super) fn shared(
        path: &Path,
        restart_pages: i64,
        page_size: i64,
        pause: std::time::Duration,
    ) -> Result<Arc<Checkpointer>, StoreError> {
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mut all = CHECKPOINTERS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(c) = all.get(&key).and_then(std::sync::Weak::upgrade) {
            return Ok(c);
        }
        all.retain(|_, c| c.strong_count() > 0);
        let c = Arc::new(Checkpointer::start(path, restart_pages, page_size, pause)?);
        all.insert(key, Arc::downgrade(&c));
        Ok(c)
    }

    pub(super) fn start(
        path: &Path,
        restart_pages: i64,
        page_size: i64,
        pause: std::time::Duration,
    ) -> Result<Checkpointer, StoreError> {
        let conn = Connection::open(path)
            .map_err(|e| StoreError::rejected(format!("{}: {e}", path.display())))?;
        conn.busy_timeout(std::time::Duration::from_secs(30))
            .map_err(classify)?;
        let (nudge, nudged) = std::sync::mpsc::sync_channel::<()>(1);
        let file = path.display().to_string();
        let gate = Arc::new(Gate::default());
        let commits = gate.clone();
        let thread = std::thread::Builder::new()
            .name("sqlite-checkpoint".into())
            .spawn(move || {
                while nudged.recv().is_ok() {
                    if !pause.is_zero() {
                        std::thread::sleep(pause);
                    }
                    // (busy, frames in the WAL)
                    let checkpoint = |mode: &str| {
                        conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
                            Ok((r.get::<_, i64>(0)? != 0, r.get::<_, i64>(1)?))
                        })
                    };
                    let result = checkpoint("PASSIVE").and_then(|(busy, wal_pages)| {
                        if wal_pages > restart_pages {
                            commits.set(true);
                            checkpoint("TRUNCATE")
                        } else {
                            Ok((busy, wal_pages))
                        }
                    });
                    // Open whatever closed the gate (this round, or a commit past the hold).
                    commits.set(false);
                    match result {
                        Err(e) => tracing::warn!(file = %file, "SQLite WAL checkpoint failed (retried at the next commit): {e}"),
                        Ok((true, pages)) if pages > restart_pages => tracing::warn!(file = %file, wal_pages = pages, "SQLite WAL restart checkpoint was busy (a reader holds an old snapshot); retried at the next commit"),
                        Ok(_) => {}
                    }
                }
            })
            .map_err(|e| StoreError::backend(format!("starting the SQLite checkpointer: {e}")))?;
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        Ok(Checkpointer {
            nudge: Some(nudge),
            thread: Some(thread),
            gate,
            wal: PathBuf::from(wal),
            hold_bytes: 2 * (restart_pages * page_size).max(0) as u64,
        })
    }

    /// After a commit: past the hold, the next commit waits at the gate until the checkpointer's
    /// round (nudged here) has run.
    pub(super) fn committed(&self) {
        if std::fs::metadata(&self.wal).is_ok_and(|m| m.len() > self.hold_bytes) {
            self.gate.set(true);
        }
        self.nudge();
    }

    /// Asks for a checkpoint after a commit. A nudge already waiting covers this one.
    pub(super) fn nudge(&self) {
        if let Some(n) = &self.nudge {
            match n.try_send(()) {
                Ok(()) | Err(std::sync::mpsc::TrySendError::Full(())) => {}
                Err(std::sync::mpsc::TrySendError::Disconnected(())) => {
                    tracing::warn!("the SQLite checkpointer thread has stopped; the WAL is not checkpointed until the store is reopened");
                }
            }
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.nudge = None;
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::warn!("the SQLite checkpointer thread panicked");
            }
        }
    }
}
