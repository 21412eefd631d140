//! Kafka at the edges: client configuration, topic administration, the upstream writer's producer and
//! the worker's consumer loop. Turns rebalance callbacks into core events and carries out decisions;
//! decides nothing itself.
//!
//! librdkafka calls are synchronous here and run on dedicated threads, never on a tokio worker.

pub mod admin;
pub mod committer;
pub mod worker;

/// The consumer properties kafka-backfill owns, with the value it sets and why: the one list the
/// worker applies and `check-config` refuses in a job's `[jobs.kafka]` (README "Configuration").
pub const MANAGED_CONSUMER_KEYS: [(&str, &str, &str); 6] = [
    (
        "isolation.level",
        "read_committed",
        "records of aborted transactions are never applied; a transactional log catches up past its commit markers",
    ),
    (
        "enable.auto.commit",
        "false",
        "offsets are committed to the group after each store commit, never on a timer",
    ),
    (
        "enable.auto.offset.store",
        "false",
        "the store, not the consumer's position, decides the committed offset",
    ),
    (
        "partition.assignment.strategy",
        "cooperative-sticky",
        "a rebalance moves only the partitions that change owner (a vnode-bitmap update)",
    ),
    (
        "auto.offset.reset",
        "earliest",
        "partitions start at offsets claimed from the store; a missing offset starts at the beginning",
    ),
    (
        "enable.partition.eof",
        "false",
        "catch-up is decided with watermark probes, not end-of-partition events",
    ),
];
