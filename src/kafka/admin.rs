//! Client configuration and topic administration.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use std::sync::Mutex;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, ClientContext};

/// A client configuration from the job's properties (security included: every client the binary
/// creates is built from them).
pub fn client_config(props: &BTreeMap<String, String>) -> ClientConfig {
    let mut c = ClientConfig::new();
    for (k, v) in props {
        c.set(k, v);
    }
    c
}

/// A client context that keeps the last error librdkafka reported (authentication, TLS, transport),
/// so that a request that fails can say why, and permanent causes end waiting at once.
#[derive(Default)]
pub struct ErrorCapture {
    last: Mutex<Option<String>>,
    /// The first error that waiting cannot cure (kept: later "all brokers down" errors follow it).
    permanent: Mutex<Option<String>>,
}

impl ErrorCapture {
    /// The most telling error reported: a permanent one, else the last.
    pub fn last(&self) -> Option<String> {
        let permanent = self.permanent.lock().unwrap().clone();
        permanent.or_else(|| self.last.lock().unwrap().clone())
    }

    /// Whether an error was reported that cannot go away by waiting: wrong credentials, a
    /// certificate that does not verify, a TLS or SASL set-up the broker refuses.
    pub fn permanent(&self) -> bool {
        self.permanent.lock().unwrap().is_some()
    }
}

impl ClientContext for ErrorCapture {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        crate::kafka::client_log::log(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if let Some(left_out) = crate::kafka::client_log::admit(reason) {
            tracing::warn!(error = %error, reason, left_out, "Kafka client error");
        }
        let text = format!("{reason} ({error})");
        let permanent = matches!(
            error.rdkafka_error_code(),
            Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SSL)
        ) || reason.contains("SASL authentication error")
            || reason.contains("SSL handshake failed")
            || reason.contains("certificate verify failed");
        if permanent {
            self.permanent.lock().unwrap().get_or_insert(text.clone());
        }
        *self.last.lock().unwrap() = Some(text);
    }
}

impl rdkafka::consumer::ConsumerContext for ErrorCapture {}

/// The partition count of a topic, or `None` if it does not exist. Fails fast, naming the cause, on an
/// authentication or TLS error.
pub fn partition_count(props: &BTreeMap<String, String>, topic: &str) -> Result<Option<u32>> {
    let consumer: BaseConsumer<ErrorCapture> = client_config(props)
        .create_with_context(ErrorCapture::default())
        .context("creating a metadata client")?;
    let bootstrap = props.get("bootstrap.servers").map_or("?", String::as_str);
    let md = while_broker_away(&consumer, crate::core::retry::Backoff::METADATA, || {
        consumer.fetch_metadata(Some(topic), Duration::from_secs(1))
    })
    .map_err(|cause| {
        anyhow::anyhow!(
            "fetching metadata of topic {topic} from {bootstrap}: {cause}; check bootstrap.servers, security.protocol, the SASL credentials and ssl.ca.location"
        )
    })?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        return Ok(None);
    };
    if t.error().is_some() || t.partitions().is_empty() {
        return Ok(None);
    }
    Ok(Some(t.partitions().len() as u32))
}

/// The earliest offset (low watermark) of each partition `0..partitions` of `topic`, by index:
/// where the log now starts after retention or `DeleteRecords`.
pub fn earliest_offsets(
    props: &BTreeMap<String, String>,
    topic: &str,
    partitions: u32,
) -> Result<Vec<u64>> {
    let consumer: BaseConsumer<ErrorCapture> = client_config(props)
        .create_with_context(ErrorCapture::default())
        .context("creating a metadata client")?;
    (0..partitions)
        .map(|p| {
            let (low, _) =
                while_broker_away(&consumer, crate::core::retry::Backoff::METADATA, || {
                    consumer.fetch_watermarks(topic, p as i32, Duration::from_secs(5))
                })
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("the earliest offset of topic {topic} partition {p}"))?;
            Ok(low.max(0) as u64)
        })
        .collect()
}

/// Runs a client request until it succeeds, retrying within `backoff` while the broker is away
/// (restarting, a connection dropped); an error waiting cannot cure (credentials, TLS) ends it at
/// once. The error is the most telling one the client reported ([`ErrorCapture::last`]).
pub fn while_broker_away<T>(
    consumer: &BaseConsumer<ErrorCapture>,
    backoff: crate::core::retry::Backoff,
    op: impl FnMut() -> rdkafka::error::KafkaResult<T>,
) -> Result<T, String> {
    crate::retry::retry(
        backoff,
        op,
        |_| !consumer.context().permanent(),
        |pause| {
            // Error events reach the context only when the client is polled.
            let _ = consumer.poll(pause);
        },
    )
    .map_err(|e| consumer.context().last().unwrap_or_else(|| e.to_string()))
}

/// Creates the topic with `partitions` partitions unless it exists (then checks the count).
pub fn ensure_topic(props: &BTreeMap<String, String>, topic: &str, partitions: u32) -> Result<()> {
    ensure_topic_with(props, topic, partitions, &[])
}

/// [`ensure_topic`] with topic configs for a new topic (e.g. `cleanup.policy = compact`).
pub fn ensure_topic_with(
    props: &BTreeMap<String, String>,
    topic: &str,
    partitions: u32,
    configs: &[(&str, &str)],
) -> Result<()> {
    if let Some(n) = partition_count(props, topic)? {
        if n != partitions {
            bail!("topic {topic} exists with {n} partitions, not {partitions}");
        }
        return Ok(());
    }
    let mut new = NewTopic::new(topic, partitions as i32, TopicReplication::Fixed(1));
    for (k, v) in configs {
        new = new.set(k, v);
    }
    let (admin, rt, options) = admin(props)?;
    let results = rt.block_on(admin.create_topics(&[new], &options))?;
    for r in results {
        if let Err((t, e)) = r {
            if e != RDKafkaErrorCode::TopicAlreadyExists {
                bail!("creating topic {t}: {e}");
            }
        }
    }
    wait_for_metadata(
        props,
        topic,
        |n| n == Some(partitions),
        "did not appear after its creation",
    )
}

/// Deletes `topic` if it exists and waits (bounded) until it is gone from the metadata.
pub fn delete_topic(props: &BTreeMap<String, String>, topic: &str) -> Result<()> {
    if partition_count(props, topic)?.is_none() {
        return Ok(());
    }
    let (admin, rt, options) = admin(props)?;
    let results = rt.block_on(admin.delete_topics(&[topic], &options))?;
    for r in results {
        if let Err((t, e)) = r {
            if e != RDKafkaErrorCode::UnknownTopicOrPartition {
                bail!("deleting topic {t}: {e}");
            }
        }
    }
    wait_for_metadata(
        props,
        topic,
        |n| n.is_none(),
        "is still listed after its deletion",
    )
}

/// An admin client, a runtime to wait on its requests, and their options (30 s operation timeout).
fn admin(
    props: &BTreeMap<String, String>,
) -> Result<(
    AdminClient<ErrorCapture>,
    tokio::runtime::Runtime,
    AdminOptions,
)> {
    let admin: AdminClient<ErrorCapture> = client_config(props)
        .create_with_context(ErrorCapture::default())
        .context("creating an admin client")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    Ok((admin, rt, options))
}

/// Metadata propagates asynchronously: waits (bounded) until `topic`'s partition count satisfies
/// `done`; else fails saying the topic `not`.
fn wait_for_metadata(
    props: &BTreeMap<String, String>,
    topic: &str,
    done: impl Fn(Option<u32>) -> bool,
    not: &str,
) -> Result<()> {
    crate::retry::retry_sleeping(
        crate::core::retry::Backoff::METADATA,
        || match partition_count(props, topic) {
            Ok(n) if done(n) => Ok(()),
            Ok(_) => Err(None),
            Err(e) => Err(Some(e)),
        },
        Option::is_none,
    )
    .map_err(|e| e.unwrap_or_else(|| anyhow::anyhow!("topic {topic} {not}")))
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
