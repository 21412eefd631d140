//! A seeded, deterministic simulation of `kafka-backfill capture`: the production capture loop
//! ([`crate::capture::run_session`]) and assembler against a model PostgreSQL (a WAL of committed
//! transactions, a slot whose confirmed position only moves when acknowledged, a snapshot at the
//! slot's consistent point) and a model transactional Kafka (what a transaction wrote becomes
//! visible only at its commit; a newer producer fences the older; the state topic holds the last
//! committed state).
//!
//! Faults: the process crashes before a Kafka commit, after it and before the acknowledgement, in
//! the middle of a transaction's changes, during an acknowledgement; a commit lands but reports a
//! failure (each session, like `capture::job`'s, starts from the state Kafka holds); the replication connection
//! drops; the source silently replays from its confirmed position (as a library reconnect does);
//! a frozen process comes back as a zombie after its successor started and tries to commit. The
//! database meanwhile writes transactions to the captured tables (three, one capture: a
//! transaction may touch several) and WAL of other tables.
//!
//! Now and then, between transactions, the capture is asked for a snapshot of the running capture
//! at the end of the WAL (the model of a temporary slot's consistent point).
//!
//! The oracle is the model database: the committed log must be a valid log store (barrier chain,
//! the same barriers in every partition, each change in its barrier's epoch, update pairs
//! adjacent, each change tagged with its key's table), and per key its changes must be exactly the source's committed changes after the
//! snapshot, in commit order, up to the resume position; the snapshot plus the log must equal the
//! table at that position. Each snapshot of the running capture must be the first snapshot plus
//! the log before its barrier (the last record before its start offsets in every partition), and
//! it plus the log after them the source table.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use crate::capture::{run_session, CaptureFailure, LogPort, ReplicationPort};
use crate::core::capture::{
    Assembler, CaptureConfig, CaptureState, Lsn, RowChange, SourceEvent, TableIndex,
};
use crate::core::{Barrier, BarrierKind, Epoch, Op, PartitionId, PartitionMap, Vnode};
use crate::rng::SimRng;

/// One committed source transaction: each change is `(key, old row, new row)` (`None` = absent).
#[derive(Clone, Debug)]
struct Txn {
    final_lsn: Lsn,
    end_lsn: Lsn,
    commit_ms: u64,
    changes: Vec<RowChange>,
}

/// The model's keys belong to three tables of one capture: a key's table is fixed by its byte
/// (a key move stays in its table), so the oracle can check every change's tag.
const TABLES: u8 = 3;

fn table_of(key: &[u8]) -> TableIndex {
    TableIndex::from(key[0] % TABLES)
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Rec {
    Barrier(Barrier),
    Change {
        table: TableIndex,
        epoch: Epoch,
        op: Op,
        key: Vec<u8>,
        row: Vec<u8>,
    },
}

/// A table of the model: key → row.
type Rows = BTreeMap<Vec<u8>, Vec<u8>>;

/// A snapshot as the model takes it: (consistent position, rows, snapshot epoch).
type ModelSnapshot = (Lsn, Rows, Epoch);

/// A snapshot of the running capture whose barrier committed.
#[derive(Clone, Debug)]
struct LaterSnapshot {
    epoch: Epoch,
    next: Epoch,
    consistent: Lsn,
    offsets: Vec<usize>,
    rows: Rows,
}

struct World {
    rng: SimRng,
    now_ms: u64,
    // The database.
    wal: Vec<Txn>,
    wal_end: Lsn,
    table: BTreeMap<Vec<u8>, Vec<u8>>,
    version: u64,
    txns_left: u64,
    confirmed: Lsn,
    /// Taken at slot creation: (consistent position, rows, snapshot epoch); published with the
    /// initial barrier's commit.
    snapshot_taken: Option<ModelSnapshot>,
    snapshot: Option<ModelSnapshot>,
    /// Snapshots of the running capture asked for: (consistent position, the table there).
    requested: Vec<(Lsn, Rows)>,
    /// Those whose barrier committed: (snapshot epoch, next epoch, per partition the offset
    /// just after the barrier, the table at the consistent position).
    later: Vec<LaterSnapshot>,
    // Kafka.
    log: Vec<Vec<Rec>>,
    state: Option<CaptureState>,
    producer_epoch: u64,
    // Faults.
    crashed: bool,
    crashes: u64,
    drops: u64,
    replays: u64,
    fault_level: u64,
}

type Shared = Rc<RefCell<World>>;

impl World {
    /// A crash here, at `per_mille` × the seed's fault level.
    fn crash_now(&mut self, per_mille: u64) -> bool {
        if self.fault_level > 0 && self.rng.below(1000) < per_mille * self.fault_level {
            self.crashed = true;
            self.crashes += 1;
            return true;
        }
        false
    }

    /// The database commits one transaction touching 1–4 keys of a small key space.
    fn write_transaction(&mut self) {
        let n = 1 + self.rng.below(4);
        let mut changes = Vec::new();
        let mut table = self.table.clone();
        for _ in 0..n {
            let key = vec![self.rng.below(24) as u8];
            self.version += 1;
            let row = [key.clone(), self.version.to_be_bytes().to_vec()].concat();
            match table.get(&key).cloned() {
                None => {
                    table.insert(key.clone(), row.clone());
                    changes.push(RowChange::Insert { key, row });
                }
                Some(old) if self.rng.chance(25) => {
                    table.remove(&key);
                    changes.push(RowChange::Delete { key, row: old });
                }
                Some(old) => {
                    // Sometimes the update moves the row to a free key of its table.
                    let new_key = if self.rng.chance(20) {
                        let r = key[0] % TABLES;
                        let j = self.rng.below(if r < 2 { 3 } else { 2 }) as u8;
                        let k = vec![24 + TABLES * j + r];
                        if table.contains_key(&k) {
                            key.clone()
                        } else {
                            k
                        }
                    } else {
                        key.clone()
                    };
                    let new_row = [new_key.clone(), self.version.to_be_bytes().to_vec()].concat();
                    table.remove(&key);
                    table.insert(new_key.clone(), new_row.clone());
                    changes.push(RowChange::Update {
                        old_key: key,
                        old_row: old,
                        new_key,
                        new_row,
                    });
                }
            }
        }
        self.table = table;
        let final_lsn = self.wal_end + 10 + 8 * changes.len() as u64;
        let end_lsn = final_lsn + 8;
        self.wal_end = end_lsn;
        self.wal.push(Txn {
            final_lsn,
            end_lsn,
            commit_ms: self.now_ms,
            changes,
        });
        self.txns_left -= 1;
    }

    fn table_at(
        &self,
        snapshot: &BTreeMap<Vec<u8>, Vec<u8>>,
        from: Lsn,
        to: Lsn,
    ) -> BTreeMap<Vec<u8>, Vec<u8>> {
        let mut t = snapshot.clone();
        for txn in self
            .wal
            .iter()
            .filter(|t| t.final_lsn >= from && t.end_lsn <= to)
        {
            for c in &txn.changes {
                match c {
                    RowChange::Insert { key, row } => {
                        t.insert(key.clone(), row.clone());
                    }
                    RowChange::Delete { key, .. } => {
                        t.remove(key);
                    }
                    RowChange::Update {
                        old_key,
                        new_key,
                        new_row,
                        ..
                    } => {
                        t.remove(old_key);
                        t.insert(new_key.clone(), new_row.clone());
                    }
                }
            }
        }
        t
    }
}

/// The model slot's stream.
struct SimRepl {
    w: Shared,
    /// The events still to deliver, in order.
    queue: std::collections::VecDeque<SourceEvent>,
    /// The next WAL transaction to queue.
    next_txn: usize,
}

impl SimRepl {
    fn queue_from(&mut self, lsn: Lsn) {
        let w = self.w.borrow();
        // PostgreSQL forwards a start before the confirmed position to it, and skips transactions
        // whose commit record starts before the start.
        let from = lsn.max(w.confirmed);
        self.queue.clear();
        self.next_txn = w
            .wal
            .iter()
            .position(|t| t.final_lsn >= from)
            .unwrap_or(w.wal.len());
    }
}

impl ReplicationPort for SimRepl {
    fn start(&mut self, lsn: Lsn) -> Result<Lsn, CaptureFailure> {
        self.queue_from(lsn);
        Ok(self.w.borrow().confirmed)
    }

    fn next(&mut self, _idle: Duration) -> Result<SourceEvent, CaptureFailure> {
        let confirmed = {
            let mut w = self.w.borrow_mut();
            w.now_ms += w.rng.below(250);
            if w.txns_left > 0 && w.rng.chance(35) {
                w.write_transaction();
            }
            if w.rng.chance(10) {
                // WAL of other tables.
                w.wal_end += 40;
            }
            let fp = w.fault_level * 3;
            if w.rng.below(1000) < fp {
                w.drops += 1;
                return Err(CaptureFailure::transient("replication connection dropped"));
            }
            if self.next_txn > 0 && w.rng.below(1000) < fp {
                w.replays += 1;
                Some(w.confirmed)
            } else {
                None
            }
        };
        if let Some(confirmed) = confirmed {
            // A silent reconnect: the stream starts again at the confirmed position.
            self.queue_from(confirmed);
        }
        if self.queue.is_empty() {
            let w = self.w.borrow();
            if let Some(t) = w.wal.get(self.next_txn) {
                self.queue.push_back(SourceEvent::Begin {
                    final_lsn: t.final_lsn,
                    commit_ms: t.commit_ms,
                });
                self.queue.extend(t.changes.iter().cloned().map(|change| {
                    let key = match &change {
                        RowChange::Insert { key, .. }
                        | RowChange::Delete { key, .. }
                        | RowChange::Update { old_key: key, .. } => key,
                    };
                    SourceEvent::Change {
                        table: table_of(key),
                        change,
                    }
                }));
                self.queue
                    .push_back(SourceEvent::Commit { end_lsn: t.end_lsn });
                self.next_txn += 1;
            }
        }
        Ok(self.queue.pop_front().unwrap_or_else(|| {
            let w = self.w.borrow();
            SourceEvent::Idle {
                wal_end: w.wal_end,
                now_ms: w.now_ms,
            }
        }))
    }

    fn ack(&mut self, lsn: Lsn) -> Result<(), CaptureFailure> {
        let mut w = self.w.borrow_mut();
        if w.crash_now(30) {
            return Err(CaptureFailure::permanent(
                "crashed before the acknowledgement",
            ));
        }
        w.confirmed = w.confirmed.max(lsn);
        Ok(())
    }
}

/// The model transactional producer of one process.
struct SimLog {
    w: Shared,
    epoch: u64,
    open: Option<Vec<(PartitionId, Rec)>>,
    partitions: u32,
    /// A snapshot barrier in the open transaction: (snapshot epoch, next epoch, its point).
    snapshot_point: Option<(Epoch, Epoch, Lsn)>,
}

impl SimLog {
    fn fenced(&self) -> Result<(), CaptureFailure> {
        if self.w.borrow().producer_epoch != self.epoch {
            return Err(CaptureFailure::permanent("producer fenced"));
        }
        Ok(())
    }

    fn write(&mut self, p: PartitionId, rec: Rec) -> Result<(), CaptureFailure> {
        self.fenced()?;
        if self.w.borrow_mut().crash_now(1) {
            return Err(CaptureFailure::permanent("crashed mid-transaction"));
        }
        self.open
            .as_mut()
            .ok_or_else(|| CaptureFailure::permanent("write outside a transaction"))?
            .push((p, rec));
        Ok(())
    }
}

impl LogPort for SimLog {
    fn announce_schema(
        &mut self,
        _: TableIndex,
        from_epoch: Epoch,
        _: &str,
    ) -> Result<(), CaptureFailure> {
        // The model source never changes its table's columns.
        Err(CaptureFailure::permanent(format!(
            "the simulated log has no schema versions (one announced from epoch {from_epoch})"
        )))
    }

    fn truncate(&mut self, table: TableIndex, epoch: Epoch) -> Result<(), CaptureFailure> {
        // The model source never truncates a table.
        Err(CaptureFailure::permanent(format!(
            "the simulated source truncates nothing (table {table} at epoch {epoch})"
        )))
    }

    fn snapshot_point(&mut self, e: Epoch, next: Epoch, c: Lsn) -> Result<(), CaptureFailure> {
        self.snapshot_point = Some((e, next, c));
        Ok(())
    }

    fn begin(&mut self) -> Result<(), CaptureFailure> {
        self.fenced()?;
        self.open = Some(Vec::new());
        self.snapshot_point = None;
        Ok(())
    }

    fn barrier(&mut self, b: &Barrier) -> Result<(), CaptureFailure> {
        for p in 0..self.partitions {
            self.write(p, Rec::Barrier(*b))?;
        }
        Ok(())
    }

    fn change(
        &mut self,
        table: TableIndex,
        partition: PartitionId,
        _vnode: Vnode,
        epoch: Epoch,
        op: Op,
        key: &[u8],
        row: &[u8],
    ) -> Result<(), CaptureFailure> {
        self.write(
            partition,
            Rec::Change {
                table,
                epoch,
                op,
                key: key.to_vec(),
                row: row.to_vec(),
            },
        )
    }

    fn commit(&mut self, state: &CaptureState) -> Result<(), CaptureFailure> {
        self.fenced()?;
        let mut w = self.w.borrow_mut();
        if w.crash_now(20) {
            return Err(CaptureFailure::permanent("crashed before the Kafka commit"));
        }
        let open = self.open.take().unwrap_or_default();
        for (p, rec) in open {
            w.log[p as usize].push(rec);
        }
        if let Some((epoch, next, consistent)) = self.snapshot_point.take() {
            let rows = w
                .requested
                .iter()
                .find(|r| r.0 == consistent)
                .map(|r| r.1.clone())
                .ok_or_else(|| {
                    CaptureFailure::permanent(format!("no snapshot was asked for at {consistent}"))
                })?;
            let offsets = w.log.iter().map(Vec::len).collect();
            w.later.push(LaterSnapshot {
                epoch,
                next,
                consistent,
                offsets,
                rows,
            });
        }
        w.state = Some(*state);
        if state.checkpoints == 0 {
            w.snapshot = w.snapshot_taken.clone();
        }
        if w.fault_level > 0 && w.rng.below(1000) < 10 * w.fault_level {
            // The commit landed but its answer was lost: the next session must read the state
            // back rather than trust what it last knew.
            return Err(CaptureFailure::transient(
                "the Kafka commit timed out (its outcome unknown)",
            ));
        }
        if w.crash_now(20) {
            return Err(CaptureFailure::permanent(
                "crashed after the Kafka commit, before the acknowledgement",
            ));
        }
        Ok(())
    }

    fn abort(&mut self) -> Result<(), CaptureFailure> {
        self.open = None;
        Ok(())
    }
}

/// What a seed did.
#[derive(Clone, Debug, Default)]
pub struct CaptureSimReport {
    pub transactions: u64,
    pub changes: u64,
    pub checkpoints: u64,
    pub processes: u64,
    pub crashes: u64,
    pub drops: u64,
    pub replays: u64,
    pub zombies_fenced: u64,
    /// Snapshots of the running capture placed in the log (their barriers committed).
    pub later_snapshots: u64,
}

/// Runs seed `seed`: a capture of `txns` source transactions under faults, checked by the oracle.
pub fn run_capture_sim(seed: u64, txns: u64) -> Result<CaptureSimReport, String> {
    let mut rng = SimRng::new(seed);
    let partitions = 1 + rng.below(3) as u32;
    let map = PartitionMap::new(16, partitions).map_err(|e| e.to_string())?;
    let fault_level = [0, 1, 2, 4][rng.below(4) as usize];
    let config = CaptureConfig {
        barrier_interval_ms: 50 + rng.below(300),
        checkpoint_interval_ms: 300 + rng.below(1500),
        max_epoch_changes: 2 + rng.below(20),
    };
    let w: Shared = Rc::new(RefCell::new(World {
        rng: SimRng::new(seed ^ 0x9e37_79b9_7f4a_7c15),
        now_ms: 1_700_000_000_000,
        wal: Vec::new(),
        wal_end: 1000,
        table: BTreeMap::new(),
        version: 0,
        txns_left: txns,
        confirmed: 0,
        snapshot_taken: None,
        snapshot: None,
        requested: Vec::new(),
        later: Vec::new(),
        log: vec![Vec::new(); partitions as usize],
        state: None,
        producer_epoch: 0,
        crashed: false,
        crashes: 0,
        drops: 0,
        replays: 0,
        fault_level,
    }));
    // Rows before the capture starts.
    for _ in 0..rng.below(6) {
        w.borrow_mut().write_transaction();
        w.borrow_mut().txns_left += 1;
    }
    let mut report = CaptureSimReport::default();
    let mut zombie: Option<SimLog> = None;
    for process in 0..200 {
        report.processes += 1;
        // A new process: its producer fences every older one (init_transactions), then it reads
        // the state topic.
        let epoch = {
            let mut b = w.borrow_mut();
            b.producer_epoch += 1;
            b.crashed = false;
            b.producer_epoch
        };
        if let Some(mut z) = zombie.take() {
            let before = w.borrow().log.clone();
            let state = w.borrow().state;
            let tried = z.commit(&state.unwrap_or(CaptureState {
                lsn: u64::MAX,
                epoch: Epoch(0),
                checkpoints: u64::MAX,
            }));
            if tried.is_ok() || w.borrow().log != before {
                return Err(format!(
                    "seed {seed}: a zombie producer committed after its successor started"
                ));
            }
            report.zombies_fenced += 1;
        }
        let now = w.borrow().now_ms;
        let state = w.borrow().state;
        let (mut a, initial) = match state {
            Some(state) => (Assembler::resume(config, map, state), Vec::new()),
            None => {
                // No committed state: (re)create the slot with an exported snapshot of the table
                // as it is now.
                let mut b = w.borrow_mut();
                let c = b.wal_end;
                b.confirmed = c;
                let es = Epoch::from_unix_millis(b.now_ms);
                b.snapshot_taken = Some((c, b.table.clone(), es));
                drop(b);
                Assembler::fresh(config, map, es, c, now)
            }
        };
        let mut repl = SimRepl {
            w: w.clone(),
            queue: Default::default(),
            next_txn: 0,
        };
        let mut log = SimLog {
            w: w.clone(),
            epoch,
            open: None,
            partitions,
            snapshot_point: None,
        };
        let mut steps = 0u64;
        let result = run_session(
            &mut a,
            initial,
            &mut repl,
            &mut log,
            Duration::from_millis(100),
            &mut |a: &mut Assembler| {
                steps += 1;
                // Now and then a snapshot of the running capture: a slot exported at the end of
                // the WAL sees every transaction committed so far.
                if !a.snapshot_waiting() && w.borrow_mut().rng.chance(3) {
                    let mut b = w.borrow_mut();
                    let (c, rows) = (b.wal_end, b.table.clone());
                    a.snapshot_at(c)?;
                    b.requested.push((c, rows));
                }
                let b = w.borrow();
                let done = b.txns_left == 0
                    && b.state
                        .is_some_and(|s| s.lsn >= b.wal.last().map_or(0, |t| t.end_lsn))
                    && a.committed().lsn >= b.wal.last().map_or(0, |t| t.end_lsn);
                Ok(done || steps > 200_000)
            },
            &mut (),
        );
        match result {
            Ok(stats) => {
                report.transactions += stats.transactions;
                report.changes += stats.changes;
                report.checkpoints += stats.checkpoints;
                if steps > 200_000 {
                    return Err(format!("seed {seed}: the capture did not catch up"));
                }
                break;
            }
            Err(CaptureFailure::Transient { .. }) => {
                log.abort().map_err(|e| e.describe())?;
            }
            Err(e @ CaptureFailure::Permanent { .. }) => {
                if !w.borrow().crashed {
                    return Err(format!(
                        "seed {seed}: the capture stopped: {}",
                        e.describe()
                    ));
                }
                // A crash: sometimes the process was only frozen and lives on as a zombie.
                if log.open.is_some() && w.borrow_mut().rng.chance(30) {
                    zombie = Some(log);
                }
            }
        }
        if process == 199 {
            return Err(format!(
                "seed {seed}: 200 processes did not finish the capture"
            ));
        }
    }
    let b = w.borrow();
    report.crashes = b.crashes;
    report.drops = b.drops;
    report.replays = b.replays;
    report.later_snapshots = b.later.len() as u64;
    check_log(&b, map).map_err(|e| format!("seed {seed}: {e}"))?;
    check_later_snapshots(&b).map_err(|e| format!("seed {seed}: {e}"))?;
    Ok(report)
}

/// The oracle of the snapshots of the running capture: each one's barrier is the checkpoint
/// barrier out of its epoch, the last record before its offsets in every partition; and the
/// snapshot plus the log after those offsets is the source table.
fn check_later_snapshots(w: &World) -> Result<(), String> {
    for s in &w.later {
        for (p, recs) in w.log.iter().enumerate() {
            let before = s.offsets[p].checked_sub(1).and_then(|i| recs.get(i));
            match before {
                Some(Rec::Barrier(b))
                    if b.kind == BarrierKind::Checkpoint && b.prev == s.epoch && b.curr == s.next => {}
                other => {
                    return Err(format!(
                        "snapshot at {} (epoch {}): partition {p} has {other:?} before its start offset",
                        s.consistent, s.epoch
                    ))
                }
            }
        }
        // The first snapshot plus the log before the barrier is this snapshot.
        let (_, first, _) = w.snapshot.clone().ok_or("no snapshot was published")?;
        let mut before = first;
        for (p, recs) in w.log.iter().enumerate() {
            apply(&mut before, &recs[..s.offsets[p]]);
        }
        if before != s.rows {
            return Err(format!(
                "the snapshot at {} (epoch {}) is not the first snapshot plus the log before its barrier",
                s.consistent, s.epoch
            ));
        }
        let mut replica = s.rows.clone();
        for (p, recs) in w.log.iter().enumerate() {
            apply(&mut replica, &recs[s.offsets[p]..]);
        }
        if replica != w.table {
            return Err(format!(
                "the snapshot at {} (epoch {}) plus the log after it is not the source table",
                s.consistent, s.epoch
            ));
        }
    }
    Ok(())
}

/// Applies the changes of `recs` to `table`.
fn apply(table: &mut Rows, recs: &[Rec]) {
    for rec in recs {
        if let Rec::Change { op, key, row, .. } = rec {
            match op {
                Op::Insert | Op::UpdateInsert => {
                    table.insert(key.clone(), row.clone());
                }
                Op::Delete | Op::UpdateDelete => {
                    table.remove(key);
                }
            }
        }
    }
}

/// The oracle (see the module's doc).
fn check_log(w: &World, map: PartitionMap) -> Result<(), String> {
    let (c, snapshot, es) = w.snapshot.clone().ok_or("no snapshot was published")?;
    let state = w.state.ok_or("no state was committed")?;
    let mut barriers_of: Vec<Vec<Barrier>> = Vec::new();
    let mut by_key: BTreeMap<Vec<u8>, Vec<(Op, Vec<u8>)>> = BTreeMap::new();
    for (p, recs) in w.log.iter().enumerate() {
        let mut open: Option<Epoch> = None;
        let mut barriers = Vec::new();
        let mut pending_update: Option<Vec<u8>> = None;
        for (i, rec) in recs.iter().enumerate() {
            match rec {
                Rec::Barrier(b) => {
                    match open {
                        None if b.kind == BarrierKind::Initial && b.prev == es => {}
                        None => {
                            return Err(format!(
                            "partition {p} starts with {b:?}, not the initial barrier from {es}"
                        ))
                        }
                        Some(e) if b.prev != e || b.curr <= b.prev => {
                            return Err(format!(
                                "partition {p} record {i}: barrier {b:?} does not follow epoch {e}"
                            ))
                        }
                        _ => {}
                    }
                    if pending_update.is_some() {
                        return Err(format!(
                            "partition {p} record {i}: a barrier splits an update pair"
                        ));
                    }
                    open = Some(b.curr);
                    barriers.push(*b);
                }
                Rec::Change {
                    table,
                    epoch,
                    op,
                    key,
                    row,
                } => {
                    if *table != table_of(key) {
                        return Err(format!(
                            "partition {p} record {i}: a change of table {} tagged table {table}",
                            table_of(key)
                        ));
                    }
                    if open != Some(*epoch) {
                        return Err(format!(
                            "partition {p} record {i}: change of epoch {epoch} in epoch {open:?}"
                        ));
                    }
                    if map.partition_of(crate::core::vnode_of(key, map.vnode_count())) != p as u32 {
                        return Err(format!(
                            "partition {p} record {i}: key in the wrong partition"
                        ));
                    }
                    match (pending_update.take(), op) {
                        (Some(k), Op::UpdateInsert) if &k == key => {}
                        (Some(_), _) | (None, Op::UpdateInsert) => {
                            return Err(format!(
                                "partition {p} record {i}: an update pair is broken"
                            ))
                        }
                        (None, Op::UpdateDelete) => pending_update = Some(key.clone()),
                        _ => {}
                    }
                    by_key
                        .entry(key.clone())
                        .or_default()
                        .push((*op, row.clone()));
                }
            }
        }
        if pending_update.is_some() {
            return Err(format!("partition {p}: the log ends inside an update pair"));
        }
        barriers_of.push(barriers);
    }
    if barriers_of.windows(2).any(|w| w[0] != w[1]) {
        return Err("the partitions do not carry the same barriers".into());
    }
    // Per key, exactly the source's changes after the snapshot, up to the resume position.
    let mut want: BTreeMap<Vec<u8>, Vec<(Op, Vec<u8>)>> = BTreeMap::new();
    for txn in w
        .wal
        .iter()
        .filter(|t| t.final_lsn >= c && t.end_lsn <= state.lsn)
    {
        for ch in &txn.changes {
            match ch {
                RowChange::Insert { key, row } => want
                    .entry(key.clone())
                    .or_default()
                    .push((Op::Insert, row.clone())),
                RowChange::Delete { key, row } => want
                    .entry(key.clone())
                    .or_default()
                    .push((Op::Delete, row.clone())),
                RowChange::Update {
                    old_key,
                    old_row,
                    new_key,
                    new_row,
                } if old_key == new_key => {
                    let e = want.entry(old_key.clone()).or_default();
                    e.push((Op::UpdateDelete, old_row.clone()));
                    e.push((Op::UpdateInsert, new_row.clone()));
                }
                RowChange::Update {
                    old_key,
                    old_row,
                    new_key,
                    new_row,
                } => {
                    want.entry(old_key.clone())
                        .or_default()
                        .push((Op::Delete, old_row.clone()));
                    want.entry(new_key.clone())
                        .or_default()
                        .push((Op::Insert, new_row.clone()));
                }
            }
        }
    }
    if want != by_key {
        let k = want
            .keys()
            .chain(by_key.keys())
            .find(|k| want.get(*k) != by_key.get(*k))
            .cloned()
            .unwrap_or_default();
        return Err(format!(
            "key {k:?}: the log holds {:?}, the source committed {:?} (snapshot at {c}, resume at {})",
            by_key.get(&k),
            want.get(&k),
            state.lsn
        ));
    }
    // The snapshot plus the log is the table at the resume position, which is the final table.
    let mut replica = snapshot.clone();
    for (key, ops) in &by_key {
        for (op, row) in ops {
            match op {
                Op::Insert | Op::UpdateInsert => {
                    replica.insert(key.clone(), row.clone());
                }
                Op::Delete | Op::UpdateDelete => {
                    replica.remove(key);
                }
            }
        }
    }
    if replica != w.table_at(&snapshot, c, state.lsn) || replica != w.table {
        return Err("the snapshot plus the log is not the source table".into());
    }
    Ok(())
}
