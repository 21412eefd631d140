//! A job's transactions, written once for every SQL store: creating (or reopening) the job
//! ([`ensure_job`]), claiming partitions ([`claim`]) and recreating the job ([`recreate`]). Each
//! runs inside the backend's transaction against [`TxJob`], the statements it needs, so the order of
//! the checks and writes — and what a failed check leaves unwritten — is one text for SQLite and
//! PostgreSQL. A backend owns the transaction (begin, commit, PostgreSQL's retry of a lost
//! connection) and one statement per method; it must not decide anything here. The checkpoints'
//! transaction ([`commit_group`]) is written here too, against [`TxCommit`]; only how its rows are
//! written is each backend's (SQLite's in-place binds, PostgreSQL's COPY).

use crate::codec::versions::SchemaVersions;
use crate::core::{
    Checkpoint, ClaimedPartition, Epoch, PartitionId, PartitionMap, PartitionProgress, RowMutation,
};
use crate::core::{Generation, Lease};
use crate::ports::{DecodedRows, JobRow, SnapshotInfo, StoreError};
use crate::store::protocol::{self, TxPublish, TxRead, TxSchema};
use crate::store::StoreTable;

/// The statements of a job's transactions, each one statement of the backend's dialect
/// (`src/store/sql/<dialect>/<name>.sql`), run inside the transaction the backend opened.
pub trait TxJob: TxRead + TxPublish {
    /// Serialises job creation, so two jobs starting at once cannot both find a table free
    /// (PostgreSQL locks `kb_jobs`; SQLite's `IMMEDIATE` transaction is the one writer already).
    fn lock_jobs(&mut self) -> Result<(), StoreError>;
    /// The store table a job of one table writes (its `kb_jobs` row's `table_name`), the first of
    /// a job of several.
    fn table_name(&self) -> &str;
    /// Every table of the job: its one table, or each of several.
    fn table_names(&self) -> Vec<String>;
    /// A job of several tables: each configured store table with its index in the log (none for
    /// a job of one table).
    fn configured_tables(&self) -> Vec<(String, u16)>;
    /// The jobs recorded with `table` (`kb_jobs.table_name` or `kb_job_tables`).
    fn table_owners(&mut self, table: &str) -> Result<Vec<String>, StoreError>;
    /// The table `job`'s row names, if the job exists.
    fn job_table_name(&mut self, job: &str) -> Result<Option<String>, StoreError>;
    /// `job`'s `kb_job_tables` rows.
    fn job_tables(&mut self, job: &str) -> Result<Vec<(String, u16)>, StoreError>;
    /// Records `table` as `job`'s (idempotent).
    fn insert_job_table(&mut self, table: &str, job: &str, index: u16) -> Result<(), StoreError>;
    /// Creates `job`'s row if absent (generation 1, phase snapshot), else leaves it; returns the
    /// row as it stands, read without locking it (PostgreSQL: a start must not wait on the row
    /// lock a running worker's commit holds while it holds `kb_jobs`' lock itself).
    fn insert_job(&mut self, job: &str, info: &SnapshotInfo) -> Result<JobRow, StoreError>;
    /// The job's pending publication units.
    fn pending_unit_count(&mut self, job: &str) -> Result<i64, StoreError>;
    /// The next lease of the job (greater than every lease it gave).
    fn next_lease(&mut self, job: &str) -> Result<Lease, StoreError>;
    fn write_lease(
        &mut self,
        job: &str,
        partition: PartitionId,
        worker: &str,
        lease: Lease,
    ) -> Result<(), StoreError>;
    /// A partition's committed progress.
    fn partition_progress(
        &mut self,
        job: &str,
        partition: PartitionId,
    ) -> Result<Option<PartitionProgress>, StoreError>;
    /// The next generation: generation + 1, recreations + 1, phase snapshot.
    fn next_generation(&mut self, job: &str) -> Result<(), StoreError>;
    /// The job's snapshot epoch becomes `epoch` (a recreation onto a newer snapshot).
    fn move_snapshot(&mut self, job: &str, epoch: Epoch) -> Result<(), StoreError>;
    /// Deletes the job's vnode and partition progress, leases and pending publication units.
    fn delete_job_work(&mut self, job: &str) -> Result<(), StoreError>;
    /// Each table's [`next_table`](protocol::next_table) dropped and created again, empty (with
    /// the columns of the table readers see, or of its schema when they see none yet: a table
    /// added to a job of several). A job's table at a recorded schema version takes that
    /// version's columns (the recorded version is the one rows are resolved to, and the table
    /// readers see may be behind it while an earlier generation was building).
    fn create_next_tables(&mut self, job: &str) -> Result<(), StoreError>;
    /// Each of the job's tables created from its schema where absent.
    fn create_missing_tables(&mut self) -> Result<(), StoreError>;
    /// Each of the job's tables emptied.
    fn clear_tables(&mut self) -> Result<(), StoreError>;
    fn delete_publication(&mut self, job: &str) -> Result<(), StoreError>;
}

/// Creates the job's row, or checks the existing one against this start (snapshot, vnode and
/// partition counts, its tables); a table another job owns, a changed set of tables, or leaving
/// publication with work in flight is refused before anything is written. `publication`: the
/// store runs under `consistency = "epoch"`.
pub fn ensure_job(
    tx: &mut impl TxJob,
    job: &str,
    info: &SnapshotInfo,
    publication: bool,
) -> Result<JobRow, StoreError> {
    tx.lock_jobs()?;
    // A table belongs to one job: the table a job is recorded with, or one of a several-table
    // job's (`kb_job_tables`).
    for name in tx.table_names() {
        let owners = tx.table_owners(&name)?;
        protocol::check_table_owner(job, &name, &owners, None)?;
    }
    let recorded = tx.job_table_name(job)?;
    let table_name = tx.table_name().to_string();
    protocol::check_table_owner(job, &table_name, &[], recorded.as_deref())?;
    let job_tables = tx.job_tables(job)?;
    let configured = tx.configured_tables();
    let added = protocol::tables_added(recorded.is_some(), &configured, &job_tables);
    if added.is_empty() {
        protocol::check_job_tables(job, recorded.is_some(), &configured, &job_tables)?;
    } else {
        // Tables added to a job of several (docs/CAPTURE.md "Adding a table"): the job moves to
        // the snapshot it was opened on, which holds them, and loads every table again from it.
        let row = protocol::job_row(tx, job)?;
        protocol::check_growth(&row, info, &added)?;
        next_generation(tx, job, Some(info.snapshot_epoch), publication)?;
    }
    if !publication || tx.publication(job)?.visible.is_none() {
        // Tables nobody reads through a publication yet: present before anything is written
        // (under publication, an open creates none of a job's tables once its first exists).
        tx.create_missing_tables()?;
    }
    for (name, index) in &configured {
        tx.insert_job_table(name, job, *index)?;
    }
    let row = tx.insert_job(job, info)?;
    protocol::check_job_matches(&row, info)?;
    if !publication {
        // Leaving publication with work in flight would lose it: the pending checkpoints (and a
        // generation building beside the visible table) are applied only under publication.
        let pending = tx.pending_unit_count(job)?;
        let building = tx.publication(job)?.building();
        protocol::check_leaving_publication(job, &table_name, pending, building)?;
    }
    Ok(row)
}

/// Claims `partitions` for `worker` in `generation`: each gets a new lease (fencing its earlier
/// owner) and comes back with its committed progress, or the snapshot's start.
pub fn claim(
    tx: &mut impl TxJob,
    job: &str,
    generation: Generation,
    worker: &str,
    partitions: &[PartitionId],
    info: &SnapshotInfo,
) -> Result<Vec<ClaimedPartition>, StoreError> {
    let map = PartitionMap::new(info.vnode_count, info.partition_count)
        .map_err(|e| StoreError::rejected(e.to_string()))?;
    protocol::check_claim(tx, job, generation)?;
    let mut out = Vec::with_capacity(partitions.len());
    for &p in partitions {
        let lease = tx.next_lease(job)?;
        tx.write_lease(job, p, worker, lease)?;
        let progress = tx.partition_progress(job, p)?;
        let vnodes: Vec<_> = map.vnodes_of(p).collect();
        let stored = tx.vnodes(job, &vnodes)?;
        out.push(protocol::claimed_partition(
            p, lease, progress, &stored, &map, info,
        )?);
    }
    Ok(out)
}

/// Recreates the job if it is still in `from_generation` (compare-and-set: of many workers raising
/// the invariant error, one recreation happens): the next generation, every progress, lease and
/// pending unit gone, the tables emptied — or, under publication with a visible replica, a new
/// generation building beside it. `onto`: the snapshot epoch the new generation reads, when it
/// moves to a newer snapshot. Returns the job row after it.
pub fn recreate(
    tx: &mut impl TxJob,
    job: &str,
    from_generation: Generation,
    onto: Option<Epoch>,
    publication: bool,
) -> Result<JobRow, StoreError> {
    let row = protocol::job_row(tx, job)?;
    if protocol::recreation_applies(&row, from_generation) {
        next_generation(tx, job, onto, publication)?;
    }
    protocol::job_row(tx, job)
}

/// The job's next generation, reading the snapshot at `onto` when it moves: its progress, leases
/// and pending units gone, its tables emptied — or, under publication with a visible replica, the
/// new generation building in tables of its own beside it.
fn next_generation(
    tx: &mut impl TxJob,
    job: &str,
    onto: Option<Epoch>,
    publication: bool,
) -> Result<(), StoreError> {
    tx.next_generation(job)?;
    if let Some(e) = onto {
        tx.move_snapshot(job, e)?;
    }
    tx.delete_job_work(job)?;
    let mut state = tx.publication(job)?;
    if publication && state.visible.is_some() {
        // Under publication the replica readers see stays in the table until the new
        // generation, building in its own table, reaches its epoch.
        tx.create_next_tables(job)?;
        state.recreated();
        tx.set_publication(job, &state)?;
    } else {
        tx.create_missing_tables()?;
        tx.clear_tables()?;
        tx.delete_publication(job)?;
    }
    Ok(())
}

/// The statements of the checkpoints' transaction beside the protocol's reads, publication's and a
/// schema change's primitives.
pub trait TxCommit: TxRead + TxPublish + TxSchema {
    /// Records the checkpoint's dead letters (a record recorded already, by this or an earlier
    /// generation, counts once) and returns how many the job now holds. PostgreSQL takes the job
    /// row first, so that the cap is exact across workers.
    fn record_dead_letters(&mut self, job: &str, cp: &Checkpoint) -> Result<u64, StoreError>;
    /// Writes rows into the job's tables (`next`: each one's
    /// [`next_table`](protocol::next_table)); `evolved`: the tables' schemas when a schema change
    /// resolved the rows to others than the store was opened with; `snapshot`: snapshot rows (no
    /// deletes, so PostgreSQL may copy them).
    fn write(
        &mut self,
        evolved: Option<&protocol::Evolved>,
        next: bool,
        rows: &[RowMutation],
        decoded: DecodedRows,
        snapshot: bool,
    ) -> Result<(), StoreError>;
    /// The checkpoint's vnode and partition progress, and the job's phase once a partition streams.
    fn write_progress(&mut self, job: &str, cp: &Checkpoint) -> Result<(), StoreError>;
}

/// The checkpoints of one group, in order, in one transaction: each one checked against what is
/// committed (and the group's earlier ones), its table brought to the schema version in force at
/// its epoch, its dead letters recorded under the cap, its rows written — or held for publication
/// under `consistency = "epoch"` — then its progress. `decoded`: each checkpoint's rows decoded
/// ahead (may be shorter than `cps`); `versions`: the log's schema versions and the table's index
/// in the log, when the store follows them; `several`: a several-table job's tables.
pub fn commit_group(
    tx: &mut impl TxCommit,
    job: &str,
    cps: &[Checkpoint],
    decoded: Vec<DecodedRows>,
    versions: Option<(&SchemaVersions, usize)>,
    publication: bool,
    several: &[StoreTable],
) -> Result<(), StoreError> {
    let mut decoded = decoded.into_iter();
    for cp in cps {
        let decoded = decoded.next().unwrap_or_default();
        let row = protocol::check_commit(tx, job, cp, several)?;
        let following = versions.map(|(versions, table)| protocol::Following {
            versions,
            table,
            several,
        });
        // Under publication rows of an epoch are brought to their version when it is published
        // (`protocol::publish`); snapshot rows, and every row under "vnode", now.
        // Snapshot rows under publication go where the generation builds.
        let next = publication && cp.epoch.is_none() && tx.publication(job)?.building();
        let evolved = match following {
            Some(f) if !publication || cp.epoch.is_none() => {
                f.evolve(tx, job, cp.epoch, &cp.rows, next)?
            }
            _ => None,
        };
        let (table, rows, decoded) = match &evolved {
            Some(e) => (Some(e), e.rows.as_deref().unwrap_or(&cp.rows), Vec::new()),
            None => (None, cp.rows.as_slice(), decoded),
        };
        if !cp.dead_letters.is_empty() {
            let recorded = tx.record_dead_letters(job, cp)?;
            protocol::check_dead_letter_cap(job, cp, recorded)?;
        }
        match cp.epoch {
            Some(epoch) if publication => {
                protocol::publish(tx, &row, cp, epoch, decoded, following)?
            }
            None if publication => tx.write(table, next, rows, decoded, true)?,
            _ => tx.write(table, false, rows, decoded, cp.epoch.is_none())?,
        }
        tx.write_progress(job, cp)?;
    }
    Ok(())
}
