//! Pipelined checkpoint commits: a worker hands each checkpoint to its committer thread (its own store
//! handle) and keeps fetching and staging the next epochs while the store transaction runs.
//!
//! Group commit: the checkpoints that queued up while a transaction ran are committed together in the
//! next one (`StateStore::commit_group`: each checked against the state the earlier ones left, all or
//! nothing); if the group fails, they are retried one at a time so the failure is the failing
//! checkpoint's own. A store slower than the worker thus writes and syncs once per group, not once
//! per checkpoint.
//!
//! Order and safety: checkpoints are applied in the order they were handed over; after one fails, none
//! after it is applied (a later checkpoint holds only the changes since the failed one), so a failure
//! always leaves the store at a checkpoint boundary. The worker waits for every pending commit before it
//! acknowledges a rebalance, raises the invariant error, restarts or stops.

use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::core::Checkpoint;
use crate::ports::{
    CommitDone, CommitPort, DecodedRows, RowSchemas, StateStore, StoreError, StoreFactory,
    MAX_PENDING_COMMITS as MAX_PENDING,
};

/// The outcome of one commit.
struct Done {
    checkpoint: Checkpoint,
    result: Result<(), StoreError>,
    /// The transaction's latency, on its first checkpoint only.
    transaction: Option<Duration>,
    group_size: usize,
}

/// The committer thread of one worker, as the loop's [`CommitPort`].
pub struct Committer {
    job: String,
    open_store: StoreFactory,
    /// The row schemas: `submit` decodes each row's column values on the worker thread, so the
    /// committer thread only binds them (both cores busy).
    schemas: Arc<RowSchemas>,
    /// Started (with its own store handle) when the loop starts an executor.
    thread: Option<Thread>,
}

impl Committer {
    /// A committer of `job`; its thread starts at the loop's first `restart`.
    pub fn new(job: String, open_store: StoreFactory, schemas: Arc<RowSchemas>) -> Committer {
        Committer {
            job,
            open_store,
            schemas,
            thread: None,
        }
    }
}

impl CommitPort for Committer {
    fn submit(&mut self, checkpoint: Checkpoint) {
        let decoded = self.schemas.decode(&checkpoint);
        self.thread
            .as_mut()
            .expect("the loop starts the committer before it commits")
            .submit(checkpoint, decoded)
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

    fn restart(&mut self) -> Result<Vec<CommitDone>, StoreError> {
        let left = self.thread.take().map_or_else(Vec::new, |mut t| {
            t.drain().into_iter().map(Done::into_port).collect()
        });
        self.thread = Some(Thread::start(self.job.clone(), (self.open_store)()?));
        Ok(left)
    }
}

impl Done {
    fn into_port(self) -> CommitDone {
        CommitDone {
            checkpoint: self.checkpoint,
            result: self.result,
            transaction_ms: self.transaction.map(|d| d.as_secs_f64() * 1000.0),
            group_size: self.group_size,
        }
    }
}

/// The thread and its channels.
struct Thread {
    tx: Option<SyncSender<(Checkpoint, DecodedRows)>>,
    rx: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
    pending: usize,
}

impl Thread {
    fn start(job: String, mut store: Box<dyn StateStore>) -> Thread {
        let (tx, jobs) = mpsc::sync_channel::<(Checkpoint, DecodedRows)>(MAX_PENDING);
        let (done_tx, rx) = mpsc::channel::<Done>();
        let thread = std::thread::Builder::new()
            .name(format!("{job}/commit"))
            .spawn(move || {
                let mut poisoned = false;
                while let Ok(first) = jobs.recv() {
                    // Group commit: every checkpoint that queued up while the last transaction
                    // ran goes into the next one.
                    let mut group = vec![first];
                    while group.len() < MAX_PENDING {
                        match jobs.try_recv() {
                            Ok(c) => group.push(c),
                            Err(_) => break,
                        }
                    }
                    let (group, decoded): (Vec<Checkpoint>, Vec<DecodedRows>) =
                        group.into_iter().unzip();
                    let t = Instant::now();
                    let results: Vec<Result<(), StoreError>> = if poisoned {
                        group
                            .iter()
                            .map(|_| {
                                Err(StoreError::backend(
                                    "an earlier checkpoint failed; later ones are not applied",
                                ))
                            })
                            .collect()
                    } else {
                        crate::store::commit_in_order(store.as_mut(), &job, &group, decoded)
                    };
                    let elapsed = t.elapsed();
                    let group_size = group.len();
                    for (i, (checkpoint, result)) in group.into_iter().zip(results).enumerate() {
                        poisoned |= result.is_err();
                        if done_tx
                            .send(Done {
                                checkpoint,
                                result,
                                transaction: (i == 0).then_some(elapsed),
                                group_size,
                            })
                            .is_err()
                        {
                            return;
                        }
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
    fn submit(&mut self, checkpoint: Checkpoint, decoded: DecodedRows) {
        self.pending += 1;
        self.tx
            .as_ref()
            .expect("running")
            .send((checkpoint, decoded))
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
