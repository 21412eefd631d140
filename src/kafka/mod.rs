//! Kafka at the edges: client configuration, topic administration, the upstream writer's producer and
//! the worker's consumer loop. Turns rebalance callbacks into core events and carries out decisions;
//! decides nothing itself.
//!
//! librdkafka calls are synchronous here and run on dedicated threads, never on a tokio worker.

use std::collections::BTreeMap;

pub mod admin;
pub mod client_log;
pub mod consumer;
pub mod dead_letters;
pub mod fetch;
pub mod flush;

/// The job's `kafka` properties a producer takes: all but the consumer's alone.
pub fn producer_properties(
    props: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<String, String> {
    props
        .iter()
        .filter(|(k, _)| !is_consumer_only(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Whether a librdkafka property is the consumer's alone (the job's `kafka` table serves the
/// consumers; the producers of the capture and of the dead-letter topic take the rest: brokers,
/// security, client id).
pub fn is_consumer_only(key: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "group.",
        "partition.assignment",
        "session.timeout",
        "heartbeat.",
        "max.poll",
        "auto.",
        "enable.auto",
        "isolation.level",
        "fetch.",
        "queued.",
        "check.crcs",
        "enable.partition.eof",
        "consume",
    ];
    PREFIXES.iter().any(|p| key.starts_with(p))
}

/// Produces one record to `partition` of `topic`, waiting (polling delivery reports) while the
/// producer's queue is full; any other error is returned. Shared by `produce` and `capture`.
pub fn send_waiting<C: rdkafka::producer::ProducerContext<DeliveryOpaque = ()>>(
    producer: &rdkafka::producer::BaseProducer<C>,
    topic: &str,
    partition: i32,
    key: &[u8],
    value: &[u8],
) -> Result<(), rdkafka::error::KafkaError> {
    use rdkafka::error::KafkaError;
    use rdkafka::producer::BaseRecord;
    use rdkafka::types::RDKafkaErrorCode;
    let mut record = BaseRecord::to(topic)
        .partition(partition)
        .key(key)
        .payload(value);
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                producer.poll(std::time::Duration::from_millis(10));
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// librdkafka's own check of the job's properties (with the managed ones set as the worker sets
/// them), without creating a client: every name must be a property and every value valid for it.
/// Returns the offending key and librdkafka's reason.
pub fn check_properties(kafka: &BTreeMap<String, String>) -> Result<(), (String, String)> {
    let mut config = rdkafka::ClientConfig::new();
    for (k, v) in kafka {
        config.set(k, v);
    }
    for (k, v, _) in managed_keys(kafka) {
        config.set(*k, *v);
    }
    match config.create_native_config() {
        Ok(_) => Ok(()),
        Err(rdkafka::error::KafkaError::ClientConfig(_, reason, key, _)) => Err((key, reason)),
        Err(other) => Err((String::new(), other.to_string())),
    }
}

/// Whether the job's consumers use the KIP-848 consumer group protocol (`group.protocol =
/// "consumer"`): assignment by the broker, incremental, every member reconciling on its own.
pub fn uses_consumer_protocol(kafka: &BTreeMap<String, String>) -> bool {
    kafka
        .get("group.protocol")
        .is_some_and(|p| p.trim().eq_ignore_ascii_case("consumer"))
}

/// Keys of the classic protocol that librdkafka refuses at client creation under `group.protocol =
/// "consumer"`, with what decides them there instead.
pub const CLASSIC_PROTOCOL_KEYS: [(&str, &str); 4] = [
    (
        "session.timeout.ms",
        "the broker's group.consumer.session.timeout.ms decides it",
    ),
    (
        "heartbeat.interval.ms",
        "the broker's group.consumer.heartbeat.interval.ms decides it",
    ),
    (
        "partition.assignment.strategy",
        "assignment is the broker's; name its assignor with group.remote.assignor",
    ),
    ("group.protocol.type", "the classic protocol's setting"),
];

/// The managed keys that apply to a job's consumers: all of [`MANAGED_CONSUMER_KEYS`], but the
/// assignment strategy under the consumer protocol (the broker assigns, always incrementally, so a
/// rebalance still moves only the partitions that change owner).
pub fn managed_keys(
    kafka: &BTreeMap<String, String>,
) -> impl Iterator<Item = &'static (&'static str, &'static str, &'static str)> {
    let consumer = uses_consumer_protocol(kafka);
    MANAGED_CONSUMER_KEYS
        .iter()
        .filter(move |(k, _, _)| !(consumer && *k == "partition.assignment.strategy"))
}

/// The consumer properties kafka-backfill owns, with the value it sets and why: the one list the
/// worker applies and `check-config` refuses in a job's `[jobs.kafka]` (docs/OPERATIONS.md
/// "Configuration reference").
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
        "error",
        "partitions start at offsets claimed from the store, and an offset the log no longer holds stops the job instead of skipping the deleted records (earlier releases set earliest)",
    ),
    (
        "enable.partition.eof",
        "false",
        "catch-up is decided with watermark probes, not end-of-partition events",
    ),
];

/// The consumer's position in `partition` (the next offset it will return), if known.
pub fn consumer_position<C: rdkafka::consumer::ConsumerContext>(
    consumer: &rdkafka::consumer::BaseConsumer<C>,
    topic: &str,
    partition: u32,
) -> Option<u64> {
    use rdkafka::consumer::Consumer;
    let tpl = consumer.position().ok()?;
    match tpl.find_partition(topic, partition as i32)?.offset() {
        rdkafka::Offset::Offset(o) if o >= 0 => Some(o as u64),
        _ => None,
    }
}
