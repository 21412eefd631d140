//! Client configuration and topic administration.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

/// A client configuration from passed-through properties.
pub fn client_config(props: &BTreeMap<String, String>) -> ClientConfig {
    let mut c = ClientConfig::new();
    for (k, v) in props {
        c.set(k, v);
    }
    c
}

/// The partition count of a topic, or `None` if it does not exist.
pub fn partition_count(bootstrap: &str, topic: &str) -> Result<Option<u32>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .context("creating a metadata client")?;
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .with_context(|| format!("fetching metadata of topic {topic} from {bootstrap}"))?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        return Ok(None);
    };
    if t.error().is_some() || t.partitions().is_empty() {
        return Ok(None);
    }
    Ok(Some(t.partitions().len() as u32))
}

/// Creates the topic with `partitions` partitions unless it exists (then checks the count).
pub fn ensure_topic(bootstrap: &str, topic: &str, partitions: u32) -> Result<()> {
    if let Some(n) = partition_count(bootstrap, topic)? {
        if n != partitions {
            bail!("topic {topic} exists with {n} partitions, not {partitions}");
        }
        return Ok(());
    }
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .context("creating an admin client")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let results = rt.block_on(admin.create_topics(
        &[NewTopic::new(
            topic,
            partitions as i32,
            TopicReplication::Fixed(1),
        )],
        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
    ))?;
    for r in results {
        if let Err((t, e)) = r {
            if e != rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists {
                bail!("creating topic {t}: {e}");
            }
        }
    }
    for _ in 0..100 {
        if partition_count(bootstrap, topic)? == Some(partitions) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("topic {topic} did not appear after creation")
}

/// The high watermark librdkafka cached from the partition's last fetch response (no network call),
/// or `None` if the partition has not been fetched yet.
pub fn cached_high_watermark<C: rdkafka::ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
    partition: i32,
) -> Option<u64> {
    let topic = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client pointer is valid for the borrow of `client`; the out-pointers are locals.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            client.native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0)
        .then_some(high as u64)
}
