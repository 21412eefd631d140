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
use crate::ports::{StateStore, StoreError};

/// How many checkpoints may wait for the store before the worker blocks.
const MAX_PENDING: usize = 2;

/// The outcome of one commit.
pub struct Done {
    pub checkpoint: Checkpoint,
    pub result: Result<(), StoreError>,
    pub elapsed: Duration,
}

pub struct Committer {
    tx: Option<SyncSender<Checkpoint>>,
    rx: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
    pending: usize,
}

impl Committer {
    pub fn start(job: String, mut store: Box<dyn StateStore>) -> Committer {
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
        Committer {
            tx: Some(tx),
            rx,
            thread: Some(thread),
            pending: 0,
        }
    }

    /// Hands a checkpoint over (blocks while `MAX_PENDING` are waiting).
    pub fn submit(&mut self, checkpoint: Checkpoint) {
        self.pending += 1;
        self.tx
            .as_ref()
            .expect("running")
            .send(checkpoint)
            .expect("committer alive");
    }

    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Finished commits, without waiting.
    pub fn finished(&mut self) -> Vec<Done> {
        let mut out = Vec::new();
        while let Ok(d) = self.rx.try_recv() {
            self.pending -= 1;
            out.push(d);
        }
        out
    }

    /// Waits for every pending commit.
    pub fn drain(&mut self) -> Vec<Done> {
        let mut out = Vec::new();
        while self.pending > 0 {
            let d = self.rx.recv().expect("committer alive");
            self.pending -= 1;
            out.push(d);
        }
        out
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
