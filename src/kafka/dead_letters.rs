//! The dead-letter topic (`on_bad_record = "dead-letter"`): the [`DeadLetterSink`] the worker loop
//! writes a checkpoint's dead letters to before the checkpoint goes to the store. Each record keeps
//! the bad record's own key and bytes, with headers naming where it came from and why; the record's
//! place in the dead-letter topic is the broker's (one partition when this creates the topic).
//! Idempotent producer, `acks = all`; `send` waits for every delivery report.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;

use crate::ports::{DeadLetterRecord, DeadLetterSink};

/// Header names of a dead letter.
pub const HEADER_TOPIC: &str = "kb.source.topic";
pub const HEADER_PARTITION: &str = "kb.source.partition";
pub const HEADER_OFFSET: &str = "kb.source.offset";
pub const HEADER_EPOCH: &str = "kb.source.epoch";
pub const HEADER_ERROR: &str = "kb.error";
pub const HEADER_JOB: &str = "kb.job";

/// How long `send` waits for the broker's acknowledgements.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Counts failed deliveries (librdkafka reports each once, after its own retries).
#[derive(Default)]
struct Deliveries {
    failed: AtomicU64,
    last_error: std::sync::Mutex<Option<String>>,
}

impl ClientContext for Deliveries {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        crate::kafka::client_log::log(level, fac, message);
    }
}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.failed.fetch_add(1, Ordering::SeqCst);
            *self.last_error.lock().unwrap() = Some(e.to_string());
        }
    }
}

/// The job's dead-letter topic.
pub struct KafkaDeadLetters {
    producer: BaseProducer<Deliveries>,
    topic: String,
    source_topic: String,
    job: String,
}

impl KafkaDeadLetters {
    /// A producer for `topic` (created with one partition when absent), with the job's brokers and
    /// security (`props`, the consumer-only keys left out).
    pub fn new(
        props: &BTreeMap<String, String>,
        topic: &str,
        source_topic: &str,
        job: &str,
    ) -> Result<Self> {
        let producer_props = super::producer_properties(props);
        if super::admin::partition_count(&producer_props, topic)?.is_none() {
            super::admin::ensure_topic(&producer_props, topic, 1)
                .with_context(|| format!("creating the dead-letter topic {topic}"))?;
        }
        let mut config = super::admin::client_config(&producer_props);
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5");
        let producer: BaseProducer<Deliveries> = config
            .create_with_context(Deliveries::default())
            .with_context(|| format!("creating the producer of dead-letter topic {topic}"))?;
        Ok(KafkaDeadLetters {
            producer,
            topic: topic.to_string(),
            source_topic: source_topic.to_string(),
            job: job.to_string(),
        })
    }
}

impl DeadLetterSink for KafkaDeadLetters {
    fn send(&mut self, letters: &[DeadLetterRecord<'_>]) -> Result<(), String> {
        let failed_before = self.producer.context().failed.load(Ordering::SeqCst);
        for r in letters {
            let partition = r.letter.partition.to_string();
            let offset = r.letter.offset.to_string();
            let epoch = r.letter.epoch.0.to_string();
            let headers = OwnedHeaders::new()
                .insert(Header {
                    key: HEADER_TOPIC,
                    value: Some(self.source_topic.as_bytes()),
                })
                .insert(Header {
                    key: HEADER_PARTITION,
                    value: Some(partition.as_bytes()),
                })
                .insert(Header {
                    key: HEADER_OFFSET,
                    value: Some(offset.as_bytes()),
                })
                .insert(Header {
                    key: HEADER_EPOCH,
                    value: Some(epoch.as_bytes()),
                })
                .insert(Header {
                    key: HEADER_ERROR,
                    value: Some(r.letter.reason.as_bytes()),
                })
                .insert(Header {
                    key: HEADER_JOB,
                    value: Some(self.job.as_bytes()),
                });
            let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(&self.topic)
                .payload(r.value)
                .headers(headers);
            if let Some(k) = r.key {
                record = record.key(k);
            }
            loop {
                match self.producer.send(record) {
                    Ok(()) => break,
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        record = back;
                        self.producer.poll(Duration::from_millis(10));
                    }
                    Err((e, _)) => return Err(format!("topic {}: {e}", self.topic)),
                }
            }
        }
        super::flush::flush(&self.producer, DELIVERY_TIMEOUT)
            .map_err(|e| format!("topic {}: not acknowledged: {e}", self.topic))?;
        let ctx = self.producer.context();
        if ctx.failed.load(Ordering::SeqCst) != failed_before {
            let why = ctx.last_error.lock().unwrap().clone().unwrap_or_default();
            return Err(format!("topic {}: a delivery failed: {why}", self.topic));
        }
        Ok(())
    }
}
