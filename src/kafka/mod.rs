//! Kafka at the edges: client configuration, topic administration, the upstream writer's producer and
//! the worker's consumer loop. Turns rebalance callbacks into core events and carries out decisions;
//! decides nothing itself.
//!
//! librdkafka calls are synchronous here and run on dedicated threads, never on a tokio worker.

pub mod admin;
pub mod consumer;

/// The consumer properties kafka-backfill owns, with the value it sets and why: the one list the
/// worker applies and `check-config` refuses in a job's `[jobs.kafka]` (docs/OPERATIONS.md "Configuration reference").
/// librdkafka's own check of the job's properties (with the managed ones set as the worker sets
/// them), without creating a client: every name must be a property and every value valid for it.
/// Returns the offending key and librdkafka's reason.
pub fn check_properties(
    kafka: &std::collections::BTreeMap<String, String>,
) -> Result<(), (String, String)> {
    let mut config = rdkafka::ClientConfig::new();
    for (k, v) in kafka {
        config.set(k, v);
    }
    for (k, v, _) in MANAGED_CONSUMER_KEYS {
        config.set(k, v);
    }
    match config.create_native_config() {
        Ok(_) => Ok(()),
        Err(rdkafka::error::KafkaError::ClientConfig(_, reason, key, _)) => Err((key, reason)),
        Err(other) => Err((String::new(), other.to_string())),
    }
}

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
