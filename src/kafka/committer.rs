//! Pipelined checkpoint commits: a worker hands each checkpoint to its committer thread (its own store
//! handle) and keeps fetching and staging the next epochs while the store transaction runs.
//!
//! Order and safety: checkpoints are applied in the order they were handed over; after one fails, none
//! after it is applied (a later checkpoint holds only the changes since the failed one), so a failure
//! always leaves the store at a checkpoint boundary. The worker waits for every pending commit before it
//! acknowledges a rebalance, raises the invariant error, restarts or stops.

use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::core::Checkpoint;
use crate::kafka::worker::StoreFactory;
use crate::ports::{CommitDone, CommitPort, StateStore, StoreError};

/// How many checkpoints may wait for the store before the worker blocks.
const MAX_PENDING: usize = 2;

/// The outcome of one commit.
struct Done {
    checkpoint: Checkpoint,
    result: Result<(), StoreError>,
    elapsed: Duration,
}

/// The committer thread of one worker, as the loop's [`CommitPort`].
pub struct Committer {
    job: String,
    open_store: StoreFactory,
    /// Started (with its own store handle) when the loop starts an executor.
    thread: Option<Thread>,
}

impl Committer {
    /// A committer of `job`; its thread starts at the loop's first `restart`.
    pub fn new(job: String, open_store: StoreFactory) -> Committer {
        Committer {
            job,
            open_store,
            thread: None,
        }
    }
}

impl CommitPort for Committer {
    fn submit(&mut self, checkpoint: Checkpoint) {
        self.thread
            .as_mut()
            .expect("the loop starts the committer before it commits")
            .submit(checkpoint)
    }

    fn finished(&mut self) -> Vec<CommitDone> {
        self.thread.as_mut().map_or_else(Vec::new, |t| {
            t.finished().into_iter().map(Done::into_port).collect()
        })
    }

    fn drain(&mut self) -> Vec<CommitDone> {
        self.thread.as_mut().map_or_else(Vec::new, |t| {
            t.drain().into_iter().map(Done::into_port).collect()
        })
    }

    fn restart(&mut self) -> Result<(), StoreError> {
        if let Some(mut t) = self.thread.take() {
            let _ = t.drain();
        }
        self.thread = Some(Thread::start(self.job.clone(), (self.open_store)()?));
        Ok(())
    }
}

impl Done {
    fn into_port(self) -> CommitDone {
        CommitDone {
            checkpoint: self.checkpoint,
            result: self.result,
            elapsed_ms: self.elapsed.as_secs_f64() * 1000.0,
        }
    }
}

/// The thread and its channels.
struct Thread {
    tx: Option<SyncSender<Checkpoint>>,
    rx: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
    pending: usize,
}

impl Thread {
    fn start(job: String, mut store: Box<dyn StateStore>) -> Thread {
        let (tx, jobs) = mpsc::sync_channel::<Checkpoint>(MAX_PENDING);
        let (done_tx, rx) = mpsc::channel::<Done>();
        let thread = std::thread::Builder::new()
            .name(format!("{job}/commit"))
            .spawn(move || {
                let mut poisoned = false;
                for checkpoint in jobs {
                    let t = Instant::now();
                    let result = if poisoned {
                        Err(StoreError::Backend(
                            "an earlier checkpoint failed; later ones are not applied".into(),
                        ))
                    } else {
                        store.commit(&job, &checkpoint)
                    };
                    poisoned |= result.is_err();
                    if done_tx
                        .send(Done {
                            checkpoint,
                            result,
                            elapsed: t.elapsed(),
                        })
                        .is_err()
                    {
                        return;
                    }
                }
            })
            .expect("spawn committer");
        Thread {
            tx: Some(tx),
            rx,
            thread: Some(thread),
            pending: 0,
        }
    }

    /// Hands a checkpoint over (blocks while `MAX_PENDING` are waiting).
    fn submit(&mut self, checkpoint: Checkpoint) {
        self.pending += 1;
        self.tx
            .as_ref()
            .expect("running")
            .send(checkpoint)
            .expect("committer alive");
    }

    /// Finished commits, without waiting.
    fn finished(&mut self) -> Vec<Done> {
        let mut out = Vec::new();
        while let Ok(d) = self.rx.try_recv() {
            self.pending -= 1;
            out.push(d);
        }
        out
    }

    /// Waits for every pending commit.
    fn drain(&mut self) -> Vec<Done> {
        let mut out = Vec::new();
        while self.pending > 0 {
            let d = self.rx.recv().expect("committer alive");
            self.pending -= 1;
            out.push(d);
        }
        out
    }
}

impl Drop for Thread {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
