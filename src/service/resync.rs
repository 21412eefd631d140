//! `kafka-backfill resync`: a running job's replica rebuilt online from a new snapshot of its
//! capture — rows the source no longer has deleted, changed rows rewritten, missing rows back.
//!
//! Owns: asking the job's capture for a snapshot at a barrier of the live log
//! ([`crate::capture::snapshots::request_and_wait`]) and moving the job's store onto it in one
//! compare-and-set ([`crate::ports::StateStore::recreate_onto`]: a new generation whose snapshot
//! epoch is the new snapshot's, its progress reset to that snapshot's start offsets). Under
//! `consistency = "epoch"` the new generation builds beside the replica readers see, which stays
//! as it was until the new one is published whole at one epoch; under `vnode` the replica is
//! emptied and each vnode comes back as its snapshot rows commit, as in any recreation. The job is
//! its capture's (`[jobs.capture]`) or another job of the capture's log (found by its topic's
//! state record); nothing is moved onto a snapshot the job could not open.
//!
//! Must not: touch the job's workers, or move a job it has not checked can read the new snapshot. The `run` process holding them sees the move (its workers
//! fail against the new generation, and the store names the newer snapshot epoch) and starts the
//! job again on that snapshot (`service::job::run`); a `run` started later reads it because the
//! store records it (`service::job::prepare`).

use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::capture::log::SnapshotRecord;
use crate::config::{Consistency, JobConfig, SnapshotConfig};
use crate::core::{Epoch, Generation};

/// What a resync did.
#[derive(Clone, Debug)]
pub struct Resynced {
    /// The snapshot epoch the job read before.
    pub from: Epoch,
    /// The new snapshot's epoch, which the job now reads.
    pub to: Epoch,
    /// The generation the job moved to.
    pub generation: Generation,
    /// Where the new snapshot is (its folder, as the capture's state record lists it).
    pub dir: String,
    /// Whether readers keep the old replica until the new one is published (`consistency =
    /// "epoch"`).
    pub published_whole: bool,
}

/// The job's tables by their manifest names: its `snapshot.table`, or a job of several's
/// `store.tables`; empty for a job of a one-table log that names none.
fn tables_of(job: &JobConfig) -> Vec<&str> {
    let mut tables: Vec<&str> = job.store.tables().keys().map(String::as_str).collect();
    if let SnapshotConfig::Files { table: Some(t), .. } = &job.snapshot {
        tables.push(t);
    }
    tables
}

/// Refuses, before anything is asked or moved: a job whose topic no capture writes (a job with
/// a `[jobs.capture]` section is its capture's; one without — a job of another table of the
/// capture's log — is the capture's whose state record its topic has), and a job of a table its
/// capture removed (docs/CAPTURE.md "Removing a table"): no new snapshot holds that table, so the
/// job moved onto one could not open it; it keeps its replica, as of the epoch the removal names.
fn check_capture(job: &JobConfig) -> Result<()> {
    let props = crate::kafka::producer_properties(&job.kafka);
    let record = crate::capture::log::read_capture_state(&props, &job.topic)
        .with_context(|| format!("job {}: reading its capture's state record", job.name))?;
    if job.capture.is_none() && record.is_none() {
        bail!(
            "job {}: no [jobs.capture] section, and no capture writes its topic {} (its state topic has no record): a resync reloads the replica from a new snapshot of the job's capture",
            job.name,
            job.topic
        );
    }
    let tables = tables_of(job);
    for (removed, from_epoch) in record.iter().flat_map(|r| r.removed()) {
        let name = removed.rsplit_once('.').map_or(removed, |(_, t)| t);
        if tables.contains(&name) {
            bail!(
                "job {}: its table {name} was removed from its capture at epoch {from_epoch} ({removed}; docs/CAPTURE.md \"Removing a table\"): no new snapshot holds it, so nothing was asked or moved; the job keeps its replica as of that epoch. Take the table out of the job",
                job.name
            );
        }
    }
    Ok(())
}

/// Refuses, before the move, a new snapshot the job could not open: one published outside the
/// job's `snapshot.dir` (a job without Kafka storage reads the capture's folder), or one without
/// the job's tables. A job moved onto a snapshot it cannot open could not run again.
fn check_readable(job: &JobConfig, snapshot: &SnapshotRecord) -> Result<()> {
    let SnapshotConfig::Files { dir, .. } = &job.snapshot else {
        return Ok(());
    };
    let in_kafka = job
        .capture
        .as_ref()
        .is_some_and(crate::config::CaptureSection::stores_in_kafka);
    if in_kafka {
        // Restored from Kafka at the job's start; its manifest is the one the capture wrote.
        return Ok(());
    }
    let to = snapshot.snapshot_epoch;
    let Some((_, folder)) = crate::snapshot::published::choose(dir, Some(to)) else {
        bail!(
            "job {}: the new snapshot at epoch {to} is published in {}, and the job's snapshot.dir {} holds none at that epoch: nothing was moved (a job reads its capture's snapshots from the capture's snapshot.dir, or from Kafka with snapshot_storage = \"kafka\")",
            job.name,
            snapshot.dir,
            dir.display()
        );
    };
    let tables = tables_of(job);
    let names: Vec<Option<&str>> = match tables.is_empty() {
        true => vec![None],
        false => tables.into_iter().map(Some).collect(),
    };
    for name in names {
        crate::snapshot::files::SnapshotFiles::open_table(&folder, name).with_context(|| {
            format!(
                "job {}: the new snapshot at epoch {to} cannot be read by the job, so nothing was moved",
                job.name
            )
        })?;
    }
    Ok(())
}

/// How many times the move is tried again when a recreation of the job's own raced it.
const ATTEMPTS: u32 = 3;

/// Asks `job`'s capture for a snapshot, waits up to `within` for it, and moves the job onto it.
pub fn resync(job: &JobConfig, within: Duration) -> Result<Resynced> {
    check_capture(job)?;
    let prepared = crate::service::job::prepare(job, false)
        .with_context(|| format!("job {}: opening its snapshot and store", job.name))?;
    let mut store =
        (prepared.open_store)().with_context(|| format!("job {}: opening its store", job.name))?;
    let Some(before) = store
        .job(&job.name)
        .with_context(|| format!("job {}: reading its job row", job.name))?
    else {
        bail!(
            "job {}: it has not started (its store has no row for it): `kafka-backfill run` starts it from the newest snapshot, so there is nothing to resync",
            job.name
        );
    };
    let Some(snapshot) = crate::capture::snapshots::request_and_wait(job, within)
        .with_context(|| format!("job {}: asking its capture for a snapshot", job.name))?
    else {
        bail!(
            "job {}: no snapshot answered the request within {} s: is `kafka-backfill capture` (or `run --capture`) running for its topic {}? Its log says why a snapshot failed",
            job.name,
            within.as_secs(),
            job.topic
        );
    };
    let to = snapshot.snapshot_epoch;
    check_readable(job, &snapshot)?;
    for _ in 0..ATTEMPTS {
        let row = store
            .job(&job.name)
            .with_context(|| format!("job {}: reading its job row", job.name))?
            .expect("a job row is never deleted");
        if row.snapshot_epoch >= to {
            bail!(
                "job {}: it reads the snapshot at epoch {} already, not older than the new one at epoch {to}",
                job.name,
                row.snapshot_epoch
            );
        }
        let moved = store
            .recreate_onto(&job.name, row.generation, Some(to))
            .with_context(|| {
                format!("job {}: moving it to the snapshot at epoch {to}", job.name)
            })?;
        if moved.snapshot_epoch == to {
            return Ok(Resynced {
                from: before.snapshot_epoch,
                to,
                generation: moved.generation,
                dir: snapshot.dir,
                published_whole: job.consistency == Consistency::Epoch,
            });
        }
        // The job recreated itself between the read and the move (a rebalance): again.
    }
    bail!(
        "job {}: its generation kept changing under the move to the snapshot at epoch {to} ({ATTEMPTS} attempts): is the job recreating itself in a loop? Its log says why",
        job.name
    )
}
