//! Epochs in RisingWave's layout.
//!
//! An epoch is a `u64` whose high 48 bits are milliseconds since 2021-04-01T00:00:00Z and whose low
//! 16 bits order epochs within one millisecond. The difference between two epochs therefore converts to
//! wall-clock time, which is how epoch lag is reported in seconds.

use std::fmt;

/// 2021-04-01T00:00:00Z in milliseconds since the Unix epoch.
pub const EPOCH_BASE_UNIX_MILLIS: u64 = 1_617_235_200_000;
const PHYSICAL_SHIFT: u32 = 16;

/// A RisingWave-style epoch.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct Epoch(pub u64);

impl Epoch {
    /// The epoch of a wall-clock instant (milliseconds since the Unix epoch), sequence bits zero.
    /// Instants before the base clamp to the base.
    pub fn from_unix_millis(unix_millis: u64) -> Epoch {
        Epoch(unix_millis.saturating_sub(EPOCH_BASE_UNIX_MILLIS) << PHYSICAL_SHIFT)
    }

    /// Milliseconds since 2021-04-01T00:00:00Z.
    pub fn physical_millis(self) -> u64 {
        self.0 >> PHYSICAL_SHIFT
    }

    /// Milliseconds since the Unix epoch.
    pub fn to_unix_millis(self) -> u64 {
        self.physical_millis() + EPOCH_BASE_UNIX_MILLIS
    }

    /// The smallest epoch that is both after `self` and not before the wall-clock instant given:
    /// how a writer picks the next epoch so that epochs strictly increase even within a millisecond.
    pub fn next_at(self, unix_millis: u64) -> Epoch {
        Epoch::from_unix_millis(unix_millis).max(Epoch(self.0 + 1))
    }

    /// Wall-clock seconds from `older` to `self`; zero when `older` is not older.
    pub fn seconds_since(self, older: Epoch) -> f64 {
        self.physical_millis()
            .saturating_sub(older.physical_millis()) as f64
            / 1000.0
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A job's generation: raised by each recreation, the fence a stale worker's commit is rejected
/// by (DESIGN.md "Invariants", fencing). Stored and serialised as its number.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct Generation(pub u64);

impl Generation {
    /// The generation a recreation of this one starts.
    pub fn next(self) -> Generation {
        Generation(self.0 + 1)
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A partition's ownership token, handed out by the store when a worker claims the partition. A
/// commit carries the leases of the partitions it writes; the store rejects it if a newer claim
/// exists. Stored and serialised as its number.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct Lease(pub u64);

impl fmt::Display for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_wall_clock_millis() {
        let t = 1_764_460_800_123; // 2025-11-30T00:00:00.123Z
        let e = Epoch::from_unix_millis(t);
        assert_eq!(e.to_unix_millis(), t);
        assert_eq!(e.0 & 0xffff, 0);
        assert_eq!(e.physical_millis(), t - EPOCH_BASE_UNIX_MILLIS);
    }

    #[test]
    fn next_at_is_strictly_increasing_within_a_millisecond() {
        let e = Epoch::from_unix_millis(EPOCH_BASE_UNIX_MILLIS + 5);
        let n = e.next_at(EPOCH_BASE_UNIX_MILLIS + 5);
        assert_eq!(n.0, e.0 + 1);
        assert_eq!(n.physical_millis(), 5);
        let later = n.next_at(EPOCH_BASE_UNIX_MILLIS + 9);
        assert_eq!(later.physical_millis(), 9);
    }

    #[test]
    fn lag_converts_to_seconds() {
        let a = Epoch::from_unix_millis(EPOCH_BASE_UNIX_MILLIS + 1_000);
        let b = Epoch::from_unix_millis(EPOCH_BASE_UNIX_MILLIS + 3_500);
        assert_eq!(b.seconds_since(a), 2.5);
        assert_eq!(a.seconds_since(b), 0.0);
    }
}
