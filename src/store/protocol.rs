//! The store protocol, written once: the checks every state store makes inside its transaction
//! before it changes anything (generation, leases, the checkpoint against committed progress, the
//! job's shape), the shape of a claim, and publication under `consistency = "epoch"` ([`publish`]).
//! A backend implements only primitives — reading the job row, a lease and vnode progress inside its
//! transaction ([`TxRead`]), the pending units and the table swap of publication ([`TxPublish`]),
//! and writing what the protocol allowed — so the rules cannot drift between SQLite and PostgreSQL
//! (the in-memory store models publication on its own, and the conformance suite holds all three to
//! one scenario). The job's whole transactions built from these checks are `store::transactions`.
//! `tests/it/store_conformance.rs` runs one suite unchanged against all three.

use crate::core::{Generation, Lease};
use std::collections::BTreeMap;

use crate::core::faults::{self, Fault};
use crate::core::{
    Checkpoint, ClaimedPartition, PartitionId, PartitionMap, PartitionProgress, Vnode,
    VnodeProgress,
};
use crate::ports::{JobRow, SnapshotInfo, StoreError};
use crate::store::StoreTable;

/// What the protocol reads inside a backend's transaction.
pub trait TxRead {
    fn job_row(&mut self, job: &str) -> Result<Option<JobRow>, StoreError>;
    /// The current owner and lease of each of these partitions that is claimed (one read).
    fn leases(
        &mut self,
        job: &str,
        partitions: &[PartitionId],
    ) -> Result<BTreeMap<PartitionId, (String, Lease)>, StoreError>;
    /// Committed progress of these vnodes (absent = none committed).
    fn vnodes(
        &mut self,
        job: &str,
        vnodes: &[Vnode],
    ) -> Result<BTreeMap<Vnode, VnodeProgress>, StoreError>;
}

/// The job row, which must exist.
pub fn job_row(tx: &mut impl TxRead, job: &str) -> Result<JobRow, StoreError> {
    tx.job_row(job)?
        .ok_or_else(|| StoreError::NoJob { job: job.into() })
}

/// A worker of `generation` may act only while the job is in that generation (a recreation fences
/// every worker of the earlier one).
pub fn check_generation(
    job: &str,
    current: Generation,
    attempted: Generation,
) -> Result<(), StoreError> {
    if current != attempted && fences_by_generation() {
        return Err(StoreError::StaleGeneration {
            job: job.into(),
            attempted,
            current,
        });
    }
    Ok(())
}

/// Whether a generation fences its predecessors: always, except under the simulation's deliberate
/// bug `SkipGenerationCheck` (where a recreation also keeps the old leases, so nothing else fences).
pub fn fences_by_generation() -> bool {
    !faults::active(Fault::SkipGenerationCheck)
}

/// Before a claim: the job exists and is in the claimer's generation. Returns the job row.
pub fn check_claim(
    tx: &mut impl TxRead,
    job: &str,
    generation: Generation,
) -> Result<JobRow, StoreError> {
    let row = job_row(tx, job)?;
    check_generation(job, row.generation, generation)?;
    Ok(row)
}

/// A claimed partition: its committed progress (or the snapshot's start offset) and its vnodes'
/// committed progress (or fresh at the snapshot epoch).
pub fn claimed_partition(
    partition: PartitionId,
    lease: Lease,
    stored: Option<PartitionProgress>,
    stored_vnodes: &BTreeMap<Vnode, VnodeProgress>,
    map: &PartitionMap,
    info: &SnapshotInfo,
) -> Result<ClaimedPartition, StoreError> {
    let progress = match stored {
        Some(p) => p,
        None => info.start_of(partition).cloned().ok_or_else(|| {
            StoreError::rejected(format!(
                "the snapshot has no start offset for partition {partition}"
            ))
        })?,
    };
    let vnodes = map
        .vnodes_of(partition)
        .map(|v| {
            stored_vnodes
                .get(&v)
                .cloned()
                .unwrap_or_else(|| VnodeProgress::fresh(v, info.snapshot_epoch))
        })
        .collect();
    Ok(ClaimedPartition {
        partition,
        lease,
        progress,
        vnodes,
    })
}

/// Before a commit: the generation, every lease the checkpoint holds, the checkpoint against
/// committed progress ([`check_checkpoint`]) and, for a job of several `tables` (empty for one),
/// every row of one of them ([`super::check_table_keys`]). Returns the job row.
pub fn check_commit(
    tx: &mut impl TxRead,
    job: &str,
    cp: &Checkpoint,
    tables: &[StoreTable],
) -> Result<JobRow, StoreError> {
    let row = job_row(tx, job)?;
    check_generation(job, row.generation, cp.generation)?;
    let ps: Vec<PartitionId> = cp.leases.iter().map(|(p, _)| *p).collect();
    let mut current = tx.leases(job, &ps)?;
    for (p, lease) in &cp.leases {
        match current.remove(p) {
            Some((_, l)) if l == *lease => {}
            other => {
                return Err(StoreError::NotOwner {
                    job: job.into(),
                    partition: *p,
                    attempted: *lease,
                    current: other.as_ref().map_or(Lease(0), |o| o.1),
                    owner: other.map_or_else(|| "nobody".into(), |o| o.0),
                })
            }
        }
    }
    let map = PartitionMap::new(row.vnode_count, row.partition_count)
        .map_err(|e| StoreError::rejected(e.to_string()))?;
    let vnodes: Vec<Vnode> = cp.vnodes.iter().map(|v| v.vnode).collect();
    let committed = tx.vnodes(job, &vnodes)?;
    check_checkpoint(job, &map, &committed, cp)?;
    if !tables.is_empty() {
        super::check_table_keys(tables, &cp.rows)?;
    }
    Ok(row)
}

fn invariant(job: &str, detail: String) -> StoreError {
    StoreError::Invariant {
        job: job.to_string(),
        detail,
    }
}

/// A checkpoint against committed state: rows and progress only of leased partitions, vnode epochs
/// never backwards, a snapshot cursor that only increases (or a replay of the same progress), a
/// finished vnode never unfinished again.
pub fn check_checkpoint(
    job: &str,
    map: &PartitionMap,
    committed_vnodes: &BTreeMap<Vnode, VnodeProgress>,
    cp: &Checkpoint,
) -> Result<(), StoreError> {
    let leased = |v: Vnode| cp.leases.iter().any(|(p, _)| *p == map.partition_of(v));
    for m in &cp.rows {
        if !leased(m.vnode()) {
            return Err(invariant(
                job,
                format!("row of vnode {} outside the leased partitions", m.vnode()),
            ));
        }
    }
    for v in &cp.vnodes {
        if !leased(v.vnode) {
            return Err(invariant(
                job,
                format!(
                    "progress of vnode {} outside the leased partitions",
                    v.vnode
                ),
            ));
        }
        if let Some(old) = committed_vnodes.get(&v.vnode) {
            if v.epoch < old.epoch {
                return Err(invariant(
                    job,
                    format!(
                        "vnode {} epoch would go back from {} to {}",
                        v.vnode, old.epoch, v.epoch
                    ),
                ));
            }
            if v.epoch == old.epoch && !old.finished {
                if let (Some(o), Some(n)) = (&old.cursor, &v.cursor) {
                    // The very same progress again is a replay of this checkpoint (a transaction
                    // retried after its commit's answer was lost): it writes the same values.
                    if n < o || (n == o && v != old) {
                        return Err(invariant(
                            job,
                            format!("vnode {} snapshot cursor would not increase", v.vnode),
                        ));
                    }
                }
            }
            if old.finished && !v.finished {
                return Err(invariant(
                    job,
                    format!("vnode {} would be unfinished again", v.vnode),
                ));
            }
        }
    }
    for p in &cp.partitions {
        if !cp.leases.iter().any(|(q, _)| *q == p.partition) {
            return Err(invariant(
                job,
                format!("progress of partition {} without its lease", p.partition),
            ));
        }
    }
    Ok(())
}

/// A stored job row must agree with the snapshot and configuration it is run with.
pub fn check_job_matches(row: &JobRow, info: &SnapshotInfo) -> Result<(), StoreError> {
    let mismatch = |what: &'static str, expected: String, found: String| StoreError::JobMismatch {
        job: row.job.clone(),
        what,
        expected,
        found,
    };
    if row.partition_count != info.partition_count {
        return Err(mismatch(
            "partition count",
            info.partition_count.to_string(),
            row.partition_count.to_string(),
        ));
    }
    if row.vnode_count != info.vnode_count {
        return Err(mismatch(
            "vnode count",
            info.vnode_count.to_string(),
            row.vnode_count.to_string(),
        ));
    }
    if row.snapshot_epoch != info.snapshot_epoch {
        return Err(mismatch(
            "snapshot epoch",
            info.snapshot_epoch.to_string(),
            row.snapshot_epoch.to_string(),
        ));
    }
    Ok(())
}

/// A table belongs to one job: `owners` are the jobs recorded with `table` in the store's `kb_jobs`,
/// `recorded` the table `job`'s own row names (absent for a new job). Checked inside the
/// transaction that would create the job row, so nothing is written when it fails.
pub fn check_table_owner(
    job: &str,
    table: &str,
    owners: &[String],
    recorded: Option<&str>,
) -> Result<(), StoreError> {
    if let Some(owner) = owners.iter().find(|o| o.as_str() != job) {
        return Err(StoreError::TableOwned {
            table: table.into(),
            owner: owner.clone(),
            job: job.into(),
        });
    }
    match recorded {
        Some(t) if t != table => Err(StoreError::JobMismatch {
            job: job.into(),
            what: "table",
            expected: table.into(),
            found: t.into(),
        }),
        _ => Ok(()),
    }
}

/// The tables a job of several tables recorded already (`exists`) gains in this start: every one
/// of `recorded` (its `kb_job_tables` rows) is `configured` still, with its log index, and
/// `configured` has more. Empty for any other start (a job of one table records none). A job
/// gains tables only by moving to a snapshot holding them all ([`check_growth`]).
pub fn tables_added(
    exists: bool,
    configured: &[(String, u16)],
    recorded: &[(String, u16)],
) -> Vec<(String, u16)> {
    if !exists || recorded.is_empty() || !recorded.iter().all(|r| configured.contains(r)) {
        return Vec::new();
    }
    configured
        .iter()
        .filter(|c| !recorded.contains(c))
        .cloned()
        .collect()
}

/// A job gaining `added` tables moves to the snapshot `info` it was opened on, which holds them all:
/// its rows are loaded again from that snapshot in a new generation (the replica readers see stays
/// until it is published whole under `consistency = "epoch"`). A snapshot older than the job's
/// would take the replica back: refused.
pub fn check_growth(
    row: &JobRow,
    info: &SnapshotInfo,
    added: &[(String, u16)],
) -> Result<(), StoreError> {
    if info.snapshot_epoch < row.snapshot_epoch {
        let names: Vec<&str> = added.iter().map(|(t, _)| t.as_str()).collect();
        return Err(StoreError::rejected(format!(
            "job {} gains table(s) {}: the snapshot it was opened on (epoch {}) is older than the one it reads (epoch {}); a job gains tables by moving to a newer snapshot of its capture holding them",
            row.job,
            names.join(", "),
            info.snapshot_epoch,
            row.snapshot_epoch
        )));
    }
    Ok(())
}

/// A job's set of tables changes only by growing ([`tables_added`]): otherwise a job recorded
/// already (`exists`) must be opened on the tables it was recorded with (`recorded`, its
/// `kb_job_tables` rows: none for a job of one table) — one left out would go stale unseen.
pub fn check_job_tables(
    job: &str,
    exists: bool,
    configured: &[(String, u16)],
    recorded: &[(String, u16)],
) -> Result<(), StoreError> {
    let describe = |tables: &[(String, u16)]| {
        let mut tables = tables.to_vec();
        tables.sort();
        if tables.is_empty() {
            return "one table".to_string();
        }
        let names: Vec<String> = tables
            .iter()
            .map(|(t, i)| format!("{t} (log table {i})"))
            .collect();
        format!("[{}]", names.join(", "))
    };
    let (expected, found) = (describe(configured), describe(recorded));
    if exists && expected != found {
        return Err(StoreError::JobMismatch {
            job: job.into(),
            what: "set of tables",
            expected,
            found,
        });
    }
    Ok(())
}

/// A recreation applies only if the job is still in `from_generation` (compare-and-set: of many
/// workers raising the error, one recreation happens).
pub fn recreation_applies(row: &JobRow, from_generation: Generation) -> bool {
    row.generation == from_generation
}

/// After a checkpoint's dead letters were recorded (a record already recorded, by this or an
/// earlier generation, counts once): refuses the checkpoint when the job now holds more than its
/// cap, before the backend commits.
pub fn check_dead_letter_cap(job: &str, cp: &Checkpoint, recorded: u64) -> Result<(), StoreError> {
    if !cp.dead_letters.is_empty() && recorded > cp.max_dead_letters {
        return Err(StoreError::DeadLetterCap {
            job: job.into(),
            max: cp.max_dead_letters,
            would_be: recorded,
        });
    }
    Ok(())
}

/// A job's publication state under `consistency = "epoch"` (`kb_publication`;
/// docs/design/several-tables.md §2), read and written by each backend in its transaction: the
/// epoch the current generation's rows stand at (`published`), and the epoch of what the table shows
/// (`visible`: the previous generation's while the current one builds in [`next_table`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Publication {
    pub published: Option<crate::core::Epoch>,
    pub visible: Option<crate::core::Epoch>,
}

impl Publication {
    /// The current generation builds in [`next_table`]: an older replica is visible and it has not
    /// reached it.
    pub fn building(&self) -> bool {
        self.visible
            .is_some_and(|v| self.published.is_none_or(|p| p < v))
    }

    /// The table the current generation writes.
    pub fn target(&self, table_name: &str) -> String {
        if self.building() {
            next_table(table_name)
        } else {
            table_name.to_string()
        }
    }

    /// The current generation now stands at `at`. Returns `true` when it has just reached the
    /// visible replica's epoch while building beside it: the backend then replaces the table by
    /// [`next_table`] in the same transaction.
    pub fn publish_at(&mut self, at: crate::core::Epoch) -> bool {
        let was_building = self.building();
        self.published = Some(at);
        if self.building() {
            return false;
        }
        self.visible = Some(at);
        was_building
    }

    /// A recreation while a replica is visible: it stays, and the new generation starts building
    /// beside it.
    pub fn recreated(&mut self) {
        if !self.building() {
            self.visible = self.published;
        }
        self.published = None;
    }
}

/// A job opened without publication: refused while it holds work only publication applies —
/// `pending` checkpoints waiting for publication, or a generation `building` beside the visible
/// table — which `"vnode"` would lose.
pub fn check_leaving_publication(
    job: &str,
    table_name: &str,
    pending: i64,
    building: bool,
) -> Result<(), StoreError> {
    if pending == 0 && !building {
        return Ok(());
    }
    Err(StoreError::rejected(format!(
        "job {job}: table {table_name} was run with consistency = \"epoch\" and holds {pending} checkpoint(s) waiting for publication{}; set consistency = \"epoch\" again (with \"vnode\" they would be lost), or recreate the job",
        if building {
            format!(" and a new generation building in {}", next_table(table_name))
        } else {
            String::new()
        }
    )))
}

/// Under publication, where a new generation builds while an older replica stays visible in the
/// table itself.
pub fn next_table(table_name: &str) -> String {
    format!("{table_name}__kb_next")
}

/// The table rows of `table_name` go to: itself, or (`next`) its [`next_table`].
pub fn table_in(table_name: &str, next: bool) -> String {
    if next {
        next_table(table_name)
    } else {
        table_name.to_string()
    }
}

/// A pending unit as a backend lists it: its id, epoch and the partitions it puts at that epoch.
pub type PendingUnit = (i64, crate::core::Epoch, Vec<PartitionId>);

/// A pending row as both backends keep it (`kb_pending_rows`: vnode, key, row): an upsert holds
/// its row, a delete none, and a truncation of vnode `v` is kept as vnode `-1 - v` (no row) with
/// its table prefix as the key — a vnode is never negative, so nothing else reads as one.
pub fn pending_row(m: &crate::core::RowMutation) -> (i32, &[u8], Option<&[u8]>) {
    use crate::core::RowMutation;
    match m {
        RowMutation::Upsert { vnode, row, .. } => (*vnode as i32, &row.key, Some(&row.value)),
        RowMutation::Delete { vnode, key } => (*vnode as i32, key, None),
        RowMutation::Truncate { vnode, prefix } => (-1 - *vnode as i32, prefix, None),
    }
}

/// The mutation a pending row holds ([`pending_row`]).
pub fn pending_mutation(
    vnode: i32,
    key: Vec<u8>,
    value: Option<Vec<u8>>,
) -> crate::core::RowMutation {
    use crate::core::RowMutation;
    match value {
        Some(value) => RowMutation::Upsert {
            vnode: vnode as Vnode,
            row: crate::core::Row { key, value },
            offset: None,
        },
        None if vnode < 0 => RowMutation::Truncate {
            vnode: (-1 - vnode) as Vnode,
            prefix: key,
        },
        None => RowMutation::Delete {
            vnode: vnode as Vnode,
            key,
        },
    }
}

/// What publication needs of a backend inside its transaction: the primitives; the rule is
/// [`publish`], written once.
pub trait TxPublish {
    /// Serialises the job's publishing commits (PostgreSQL takes the job's `kb_publication` row;
    /// SQLite's write transactions are serial already), so that each sees every unit committed
    /// before it.
    fn lock_publication(&mut self, job: &str) -> Result<(), StoreError>;
    fn publication(&mut self, job: &str) -> Result<Publication, StoreError>;
    fn set_publication(&mut self, job: &str, p: &Publication) -> Result<(), StoreError>;
    /// The job's pending units, by epoch and then by the order they were committed.
    fn pending_units(&mut self, job: &str) -> Result<Vec<PendingUnit>, StoreError>;
    /// A pending unit's rows in their order, deleting the unit.
    fn take_unit(&mut self, unit: i64) -> Result<Vec<crate::core::RowMutation>, StoreError>;
    fn add_unit(
        &mut self,
        job: &str,
        epoch: crate::core::Epoch,
        partitions: &[PartitionId],
        rows: &[crate::core::RowMutation],
    ) -> Result<(), StoreError>;
    /// Writes rows into the job's tables (`next`: into each one's [`next_table`], where a new
    /// generation builds), with their pre-decoded columns; `evolved`: the tables' schemas when a
    /// schema change resolved the rows to others than the store was opened with ([`evolve`]).
    fn write_rows(
        &mut self,
        evolved: Option<&Evolved>,
        next: bool,
        rows: &[crate::core::RowMutation],
        decoded: crate::ports::DecodedRows,
    ) -> Result<(), StoreError>;
    /// Replaces each of the job's tables by its [`next_table`] (drop, rename), in the transaction.
    fn replace_tables(&mut self) -> Result<(), StoreError>;
}

/// A log-store checkpoint through `epoch` under publication (docs/design/several-tables.md §2), in
/// the backend's transaction after [`check_commit`] passed (`row` is what it returned): the epoch
/// every partition now stands at is computed over the pending units and this one
/// ([`publication_epoch`](crate::core::publication::publication_epoch)); the pending units at or
/// below it are applied in epoch order and deleted; this checkpoint's rows go straight into the
/// table when its own epoch is published, or wait as a unit otherwise. A generation building beside
/// the visible replica replaces it once it reaches that replica's epoch.
pub fn publish(
    tx: &mut (impl TxPublish + TxSchema),
    row: &JobRow,
    cp: &Checkpoint,
    epoch: crate::core::Epoch,
    decoded: crate::ports::DecodedRows,
    versions: Option<Following<'_>>,
) -> Result<(), StoreError> {
    let job = row.job.as_str();
    tx.lock_publication(job)?;
    let map = PartitionMap::new(row.vnode_count, row.partition_count)
        .map_err(|e| StoreError::rejected(format!("job {job}: {e}")))?;
    let parts = crate::core::publication::partitions_at(map, epoch, cp);
    let mut state = tx.publication(job)?;
    if state.published.is_some_and(|p| epoch <= p) {
        // Only a replay (a transaction retried after its answer was lost) can be at or below the
        // published epoch, whose rows every partition had past it: applied already.
        return Ok(());
    }
    let next = state.building();
    let units = tx.pending_units(job)?;
    let at = crate::core::publication::publication_epoch(
        row.partition_count,
        state.published,
        units
            .iter()
            .map(|(_, e, ps)| (*e, ps.as_slice()))
            .chain(std::iter::once((epoch, parts.as_slice()))),
    );
    if let Some(at) = at {
        // In epoch order, each unit's rows after the table is brought to the version in force
        // at its epoch: a version announced from an epoch changes the table readers see together
        // with that epoch's rows.
        for (unit, e, _) in units.iter().filter(|(_, e, _)| *e <= at) {
            let rows = tx.take_unit(*unit)?;
            write_published(tx, job, versions, next, *e, &rows, Vec::new())?;
        }
        if epoch <= at {
            write_published(tx, job, versions, next, epoch, &cp.rows, decoded)?;
        }
        if state.publish_at(at) {
            tx.replace_tables()?;
        }
        tx.set_publication(job, &state)?;
        if epoch <= at {
            return Ok(());
        }
    }
    tx.add_unit(job, epoch, &parts, &cp.rows)
}

/// Rows of `epoch` written as [`publish`] applies them, the table first brought to the version
/// in force at that epoch ([`evolve`]).
#[allow(clippy::too_many_arguments)]
fn write_published(
    tx: &mut (impl TxPublish + TxSchema),
    job: &str,
    versions: Option<Following<'_>>,
    next: bool,
    epoch: crate::core::Epoch,
    rows: &[crate::core::RowMutation],
    decoded: crate::ports::DecodedRows,
) -> Result<(), StoreError> {
    let evolved = match versions {
        Some(f) => f.evolve(tx, job, Some(epoch), rows, next)?,
        None => None,
    };
    match &evolved {
        Some(e) => tx.write_rows(Some(e), next, e.rows.as_deref().unwrap_or(rows), Vec::new()),
        None => tx.write_rows(None, next, rows, decoded),
    }
}

/// The table schema of a row schema `json` recorded in `kb_schema_history` for `job`, keyed as
/// `table` (every version keeps the table's primary key).
pub fn recorded_schema(
    job: &str,
    json: &str,
    table: &crate::codec::TableSchema,
) -> Result<crate::codec::TableSchema, StoreError> {
    crate::codec::TableSchema::parse(json, &table.primary_key).map_err(|e| {
        StoreError::rejected(format!(
            "job {job}: the row schema kb_schema_history records does not parse: {e}"
        ))
    })
}

/// A schema change's primitives inside a backend's commit transaction ([`evolve`] is the rule).
pub trait TxSchema {
    /// The recorded schema version of the table whose history is kept under `key`
    /// ([`history_key`]) and its fingerprint (hex); `None`: never changed (the manifest's,
    /// version 0).
    fn schema_version(&mut self, key: &str) -> Result<Option<(usize, String)>, StoreError>;
    /// Alters job `job`'s table `table` (`None`: its one table) from `from` to version `version`
    /// (`to`): adds and drops columns, rewrites every row (its datum resolved to `to`, the added
    /// columns' values), and records the version in `kb_schema_history` under
    /// [`history_key`] with `applied_epoch`. `next`: the table a generation builds in
    /// ([`next_table`]), not the visible one.
    #[allow(clippy::too_many_arguments)]
    fn alter_table(
        &mut self,
        job: &str,
        table: Option<&str>,
        version: usize,
        from: &crate::codec::TableSchema,
        to: &crate::codec::versions::RowVersion,
        applied_epoch: Option<crate::core::Epoch>,
        next: bool,
    ) -> Result<(), StoreError>;
}

/// What a checkpoint's rows are written as after [`evolve`]: the table's schema now, and the rows
/// resolved to it when they were written with an older version (`None`: as they are).
pub struct Evolved {
    pub table: crate::codec::TableSchema,
    pub rows: Option<Vec<crate::core::RowMutation>>,
    /// A job of several tables: every table with its schema now (empty for one table).
    pub tables: Vec<crate::store::StoreTable>,
}

/// Where a table's schema versions are recorded in `kb_schema_history`: under the job for a job
/// of one table, under `<job>/<SQL table>` for each table of a job of several (a job's name has no
/// `/`, so no job's history is another's).
pub fn history_key(job: &str, table: Option<&str>) -> String {
    match table {
        Some(t) => format!("{job}/{t}"),
        None => job.to_string(),
    }
}

/// What a job follows of its log's schema versions: the versions, its table's index in the log
/// (a job of one table) or its tables (a job of several, each with its index).
#[derive(Clone, Copy)]
pub struct Following<'a> {
    pub versions: &'a crate::codec::versions::SchemaVersions,
    pub table: usize,
    pub several: &'a [crate::store::StoreTable],
}

impl Following<'_> {
    /// [`evolve`] for the job's one table, or for each of its several tables with its own rows:
    /// `None` while every table is at the manifest's version and the rows are of it.
    pub fn evolve(
        &self,
        tx: &mut impl TxSchema,
        job: &str,
        epoch: Option<crate::core::Epoch>,
        rows: &[crate::core::RowMutation],
        next: bool,
    ) -> Result<Option<Evolved>, StoreError> {
        if self.several.is_empty() {
            return evolve(tx, job, None, self.versions, self.table, epoch, rows, next);
        }
        if self
            .several
            .iter()
            .all(|t| self.versions.of(t.index as usize).len() == 1)
        {
            // No version of any of its tables announced: nothing to apply, nothing copied.
            return Ok(None);
        }
        let mut tables = Vec::with_capacity(self.several.len());
        let mut resolved = Vec::with_capacity(rows.len());
        let mut any = false;
        for (t, refs, _) in crate::store::split_rows(self.several, rows, Vec::new())? {
            let own: Vec<crate::core::RowMutation> =
                refs.iter().map(|(m, _)| (*m).clone()).collect();
            let e = evolve(
                tx,
                job,
                Some(&t.name),
                self.versions,
                t.index as usize,
                epoch,
                &own,
                next,
            )
            .map_err(|e| crate::store::in_table(e, &t.name))?;
            let mut t = t.clone();
            match e {
                Some(e) => {
                    any = true;
                    t.schema = e.table;
                    resolved.extend(e.rows.unwrap_or(own));
                }
                None => resolved.extend(own),
            }
            tables.push(t);
        }
        Ok(any.then(|| Evolved {
            table: tables[0].schema.clone(),
            rows: Some(resolved),
            tables,
        }))
    }
}

/// Before rows of `epoch` are written (docs/WIRE.md "Schema changes"): brings the table to the
/// version in force at that epoch, each change since the recorded version applied in order in this
/// transaction, and resolves the rows (written with that version, or the manifest's for snapshot
/// rows, `epoch` `None`) to the table's version, which another worker's later commit may have moved
/// on. `None` while the table is at the manifest's version and the rows are of it. Under
/// `consistency = "vnode"` a checkpoint's rows are written at its commit; under `"epoch"` when
/// their epoch is published ([`publish`]), so readers see the table change at the version's epoch
/// with the rows of it; `next`: the table a generation builds in beside the visible replica (which
/// the building one replaces whole: the recorded version is the building table's).
#[allow(clippy::too_many_arguments)]
pub fn evolve(
    tx: &mut impl TxSchema,
    job: &str,
    store_table: Option<&str>,
    versions: &crate::codec::versions::SchemaVersions,
    table: usize,
    epoch: Option<crate::core::Epoch>,
    rows: &[crate::core::RowMutation],
    next: bool,
) -> Result<Option<Evolved>, StoreError> {
    let all = versions.of(table);
    if all.len() == 1 {
        // No version announced: nothing to apply (and no query in the commit's transaction).
        return Ok(None);
    }
    // The table's version is found in the list by its fingerprint, not by its number: numbers
    // count from the snapshot the job reads, and a job moved onto a later snapshot (a resync)
    // reads a list whose first version is the one its table was already brought to. The numbers
    // recorded go on from the last one.
    let (stored, recorded) = match tx.schema_version(&history_key(job, store_table))? {
        None => (0, 0),
        Some((n, fp)) => match all
            .iter()
            .rposition(|v| crate::codec::versions::hex(&v.fingerprint) == fp)
        {
            Some(k) => (k, n),
            None => {
                return Err(StoreError::rejected(format!(
                    "the table of job {job} is at schema version {n} (fingerprint {fp}), which the log's schema versions do not have: the store was written from another log"
                )))
            }
        },
    };
    let rows_version = epoch.map_or(0, |e| versions.at(table, e));
    let target = stored.max(rows_version);
    for k in stored + 1..=target {
        let number = recorded + (k - stored);
        tx.alter_table(
            job,
            store_table,
            number,
            &all[k - 1].table,
            &all[k],
            epoch,
            next,
        )?;
    }
    if target == 0 {
        return Ok(None);
    }
    let to = &all[target].table;
    let rows = if rows_version == target {
        None
    } else {
        let from = &all[rows_version].table;
        Some(
            rows
                .iter()
                .map(|m| match m {
                    crate::core::RowMutation::Upsert { vnode, row, offset } => {
                        let value = crate::codec::versions::resolve(&row.value, from, to)
                            .map_err(|e| {
                                StoreError::rejected(format!(
                                    "row with key {} (schema version {rows_version}) does not resolve to version {target}: {e}",
                                    crate::ports::key_hex(&row.key)
                                ))
                            })?;
                        Ok(crate::core::RowMutation::Upsert {
                            vnode: *vnode,
                            row: crate::core::Row {
                                key: row.key.clone(),
                                value,
                            },
                            offset: *offset,
                        })
                    }
                    d => Ok(d.clone()),
                })
                .collect::<Result<Vec<_>, StoreError>>()?,
        )
    };
    Ok(Some(Evolved {
        table: to.clone(),
        rows,
        tables: Vec::new(),
    }))
}

/// The columns a schema change adds and drops, by name.
pub fn column_changes(
    from: &crate::codec::TableSchema,
    to: &crate::codec::TableSchema,
) -> (Vec<crate::codec::Column>, Vec<String>) {
    let added = to
        .columns
        .iter()
        .filter(|c| !from.columns.iter().any(|f| f.name == c.name))
        .cloned()
        .collect();
    let dropped = from
        .columns
        .iter()
        .filter(|c| !to.columns.iter().any(|t| t.name == c.name))
        .map(|c| c.name.clone())
        .collect();
    (added, dropped)
}

/// Rows read at a time when a schema change rewrites a table (memory holds one batch).
pub const REWRITE_BATCH: usize = 10_000;

/// One stored row under a schema change from `from` to version `version` (`to`): its datum
/// resolved to `to`, and the values of the columns `added` (in that order).
pub fn resolve_stored_row(
    from: &crate::codec::TableSchema,
    to: &crate::codec::TableSchema,
    version: usize,
    added: &[crate::codec::Column],
    key: &[u8],
    datum: &[u8],
) -> Result<(Vec<u8>, Vec<crate::codec::ColumnValue>), StoreError> {
    let next = crate::codec::versions::resolve(datum, from, to).map_err(|e| {
        StoreError::rejected(format!(
            "row with key {} does not resolve to schema version {version}: {e}",
            crate::ports::key_hex(key)
        ))
    })?;
    if added.is_empty() {
        return Ok((next, Vec::new()));
    }
    let mut values = to
        .column_values(&next)
        .map_err(|e| StoreError::rejected(e.to_string()))?;
    let added = added
        .iter()
        .map(|c| {
            let at = to
                .columns
                .iter()
                .position(|x| x.name == c.name)
                .expect("an added column of the new version");
            std::mem::replace(&mut values[at], crate::codec::ColumnValue::Null)
        })
        .collect();
    Ok((next, added))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::versions::{AnnouncedVersion, SchemaVersions};
    use crate::codec::TableSchema;
    use crate::core::{Epoch, Generation};
    use crate::store::StoreTable;

    fn table(name: &str, extra: &str) -> TableSchema {
        TableSchema::parse(
            &format!(
                r#"{{"type":"record","name":"{name}","fields":[{{"name":"id","type":"long"}}{extra}]}}"#
            ),
            &["id".to_string()],
        )
        .unwrap()
    }

    #[test]
    fn a_job_of_several_tables_grows_only_by_tables_added_to_its_set() {
        let t = |list: &[(&str, u16)]| -> Vec<(String, u16)> {
            list.iter().map(|(n, i)| (n.to_string(), *i)).collect()
        };
        let recorded = t(&[("a", 0), ("b", 1)]);
        assert_eq!(
            tables_added(true, &t(&[("a", 0), ("b", 1), ("c", 2)]), &recorded),
            t(&[("c", 2)])
        );
        // Nothing added, one left out, another log index, a new job, a job of one table.
        assert!(tables_added(true, &recorded, &recorded).is_empty());
        assert!(tables_added(true, &t(&[("a", 0), ("c", 2)]), &recorded).is_empty());
        assert!(tables_added(true, &t(&[("a", 0), ("b", 3), ("c", 2)]), &recorded).is_empty());
        assert!(tables_added(false, &t(&[("a", 0), ("b", 1), ("c", 2)]), &recorded).is_empty());
        assert!(tables_added(true, &t(&[("a", 0), ("c", 2)]), &[]).is_empty());
        let row = JobRow {
            job: "j".into(),
            snapshot_epoch: Epoch(100),
            vnode_count: 16,
            partition_count: 2,
            generation: Generation(1),
            phase: "streaming".into(),
            recreations: 0,
        };
        let info = |e: u64| SnapshotInfo {
            snapshot_epoch: Epoch(e),
            vnode_count: 16,
            partition_count: 2,
            start: Vec::new(),
        };
        assert!(check_growth(&row, &info(200), &t(&[("c", 2)])).is_ok());
        assert!(check_growth(&row, &info(100), &t(&[("c", 2)])).is_ok());
        let e = check_growth(&row, &info(50), &t(&[("c", 2)])).unwrap_err();
        assert!(
            e.to_string().contains(
                "job j gains table(s) c: the snapshot it was opened on (epoch 50) is older"
            ),
            "{e}"
        );
    }

    /// Schema versions recorded and tables altered, as a backend would ([`TxSchema`]).
    #[derive(Default)]
    struct Histories {
        recorded: BTreeMap<String, (usize, String)>,
        altered: Vec<(String, Option<String>, usize)>,
    }

    impl TxSchema for Histories {
        fn schema_version(&mut self, key: &str) -> Result<Option<(usize, String)>, StoreError> {
            Ok(self.recorded.get(key).cloned())
        }

        fn alter_table(
            &mut self,
            job: &str,
            table: Option<&str>,
            version: usize,
            _from: &crate::codec::TableSchema,
            to: &crate::codec::versions::RowVersion,
            _applied_epoch: Option<Epoch>,
            _next: bool,
        ) -> Result<(), StoreError> {
            self.altered
                .push((job.to_string(), table.map(str::to_string), version));
            self.recorded.insert(
                history_key(job, table),
                (version, crate::codec::versions::hex(&to.fingerprint)),
            );
            Ok(())
        }
    }

    /// A job of several tables follows each table's versions on its own: a version of one table
    /// alters that table alone, from the version's epoch, recorded under `<job>/<table>`; the
    /// other table keeps its schema and its rows are untouched.
    #[test]
    fn a_job_of_several_tables_follows_each_tables_versions() {
        let base = [table("a", ""), table("b", "")];
        let v1 = table(
            "b",
            r#",{"name":"note","type":["null","string"],"default":null}"#,
        );
        let vs = SchemaVersions::new(
            &base,
            &[Some("a".into()), Some("b".into())],
            Epoch(10),
            &[AnnouncedVersion {
                source: "b.json".into(),
                table: Some("b".into()),
                from_epoch: Epoch(20),
                row_schema: v1.json.to_string(),
                named_fingerprint: None,
                primary_key: None,
            }],
        )
        .unwrap();
        let own = |i: u16, name: &str| StoreTable {
            index: i,
            source: name.into(),
            name: format!("{name}_replica"),
            schema: base[i as usize].clone(),
        };
        let both = [own(0, "a"), own(1, "b")];
        let following = Following {
            versions: &vs,
            table: 0,
            several: &both,
        };
        // Rows are routed by their (table, key) prefix; these are not decoded (no version to
        // resolve them from: a's has none, b's are written with the version in force).
        let row = |t: u16| crate::core::RowMutation::Upsert {
            vnode: 0,
            row: crate::core::Row {
                key: crate::core::table_key(t, b"k"),
                value: vec![t as u8],
            },
            offset: Some(1),
        };
        let rows = vec![row(0), row(1)];
        let mut tx = Histories::default();
        for before in [None, Some(Epoch(15)), Some(Epoch(19))] {
            assert!(following
                .evolve(&mut tx, "j", before, &rows, false)
                .unwrap()
                .is_none());
        }
        assert!(tx.altered.is_empty());
        let e = following
            .evolve(&mut tx, "j", Some(Epoch(25)), &rows, false)
            .unwrap()
            .expect("b is at version 1 from epoch 20");
        assert_eq!(tx.altered, vec![("j".into(), Some("b_replica".into()), 1)]);
        assert!(tx.recorded.contains_key("j/b_replica") && !tx.recorded.contains_key("j"));
        assert_eq!(e.tables.len(), 2);
        assert_eq!(e.tables[0].schema.json, base[0].json);
        assert_eq!(e.tables[1].schema.json, v1.json);
        assert_eq!(e.rows.as_deref(), Some(&rows[..]));
        // Applied once: a later commit finds the version recorded.
        following
            .evolve(&mut tx, "j", Some(Epoch(30)), &rows[..1], false)
            .unwrap();
        assert_eq!(tx.altered.len(), 1);
    }
}
