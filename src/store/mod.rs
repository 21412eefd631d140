//! State stores: the protocol every store enforces (`protocol`), written once, and the backends,
//! which implement only its primitives: `sqlite` (one file), `postgres` (shared by workers on many
//! machines) and `memory` (the test double the simulation uses; feature `testing`).

#[cfg(any(test, feature = "testing"))]
pub mod memory;
pub mod postgres;
pub mod protocol;
pub mod sqlite;

use crate::core::Checkpoint;
use crate::ports::{DecodedRows, StateStore, StoreError};

/// Commits a group as one transaction; if that fails, one at a time (so the checkpoints before the
/// failing one are applied, and the failure is the failing checkpoint's own), stopping at the first
/// failure.
pub fn commit_in_order(
    store: &mut dyn StateStore,
    job: &str,
    group: &[Checkpoint],
    decoded: Vec<DecodedRows>,
) -> Vec<Result<(), StoreError>> {
    let whole = store.commit_group_decoded(job, group, decoded);
    if whole.is_ok() || group.len() == 1 {
        return group.iter().map(|_| whole.clone()).collect();
    }
    let mut out = Vec::with_capacity(group.len());
    for cp in group {
        let r = match out.last() {
            Some(Err(_)) => Err(StoreError::Backend(
                "an earlier checkpoint failed; later ones are not applied".into(),
            )),
            _ => store.commit(job, cp),
        };
        out.push(r);
    }
    out
}
