//! What a job does when the log it needs was deleted (the topic's retention, `DeleteRecords`):
//! decided here, carried out by the service at start (`service::job::prepare`).
//!
//! A job needs, per partition, its committed offset or else its snapshot's start offset. When one
//! lies below the log's earliest offset the job cannot go on from its snapshot; it moves to the
//! newest snapshot whose start offsets all still exist (a new generation of the job, its rows
//! reloaded from that snapshot), or, with none, stops naming the gap ([`LogStartGone`]). Owns no
//! I/O: the offsets are handed in.

use crate::error::{check_log_start, LogStartGone};
use crate::{Epoch, PartitionId};

/// The first partition whose needed offset is gone (`needed`: per partition the offset the job
/// reads next; `earliest`: per partition, by index, the log's earliest offset). A partition
/// `earliest` does not list is not checked.
pub fn first_gone(
    topic: &str,
    needed: &[(PartitionId, u64)],
    earliest: &[u64],
) -> Result<(), LogStartGone> {
    for (p, n) in needed {
        if let Some(low) = earliest.get(*p as usize) {
            check_log_start(topic, *p, *n, *low)?;
        }
    }
    Ok(())
}

/// Of `candidates` (a snapshot's epoch and its start offsets, by partition), the newest one newer
/// than `current` whose start offsets all still exist, if any.
pub fn newest_within(
    candidates: &[(Epoch, Vec<u64>)],
    current: Epoch,
    earliest: &[u64],
) -> Option<Epoch> {
    candidates
        .iter()
        .filter(|(e, starts)| {
            *e > current
                && starts.len() == earliest.len()
                && starts.iter().zip(earliest).all(|(s, low)| s >= low)
        })
        .map(|(e, _)| *e)
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_partition_whose_needed_offset_is_gone_is_named() {
        assert_eq!(first_gone("t", &[(0, 10), (1, 7)], &[10, 5]), Ok(()));
        let gone = first_gone("t", &[(0, 10), (1, 4)], &[10, 5]).unwrap_err();
        assert_eq!((gone.partition, gone.needed, gone.earliest), (1, 4, 5));
    }

    #[test]
    fn the_newest_snapshot_whose_start_still_exists_is_chosen() {
        let candidates = vec![
            (Epoch(100), vec![5, 5]),
            (Epoch(200), vec![20, 30]),
            (Epoch(300), vec![40, 9]), // partition 1's start is gone
        ];
        assert_eq!(
            newest_within(&candidates, Epoch(50), &[10, 10]),
            Some(Epoch(200))
        );
        assert_eq!(newest_within(&candidates, Epoch(200), &[10, 10]), None);
        assert_eq!(newest_within(&candidates, Epoch(50), &[50, 50]), None);
        assert_eq!(
            newest_within(&candidates, Epoch(50), &[0, 0]),
            Some(Epoch(300))
        );
        assert_eq!(
            newest_within(&candidates, Epoch(50), &[0]),
            None,
            "another partition count"
        );
    }
}
