//! A producer's flush that ends when its last delivery report is served, with librdkafka's
//! `linger.ms` waived while it waits.
//!
//! rdkafka's `BaseProducer::flush` asks librdkafka with a zero timeout, then polls for 100 ms, a
//! poll that runs its whole time even when the reports arrive at once; it asks again after each.
//! Every flush with a record outstanding therefore took at least 100 ms, and a batch still
//! lingering was waited out, since librdkafka waives the linger only while its own
//! `rd_kafka_flush` waits. Measured on the capture (docs/BENCHMARKS.md "What the pipeline costs
//! the cluster"): each checkpoint's Kafka commit took 0.10 s at a 5 or 50 ms linger, 0.20 s at
//! 100 ms; librdkafka alone commits the same transaction in about 5 ms.
//!
//! Here librdkafka's flush waits with the whole timeout while a scoped thread serves the delivery
//! reports (the producer hands them out as events, only when polled, and a record counts as
//! outstanding until its report is served). It owns the producer's one `unsafe` call; it decides
//! nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};

/// How long the reporting thread's polls wait for an event before looking at the flag again.
const POLL_STEP: Duration = Duration::from_millis(1);

/// Waits until every record `producer` holds is delivered (or failed) and its report served, at
/// most `timeout`. The reports reach the producer's context before this returns.
pub fn flush<C>(producer: &BaseProducer<C>, timeout: Duration) -> KafkaResult<()>
where
    C: ProducerContext + Sync,
{
    if producer.in_flight_count() == 0 {
        return Ok(());
    }
    let done = AtomicBool::new(false);
    let err = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Acquire) {
                producer.poll(POLL_STEP);
            }
        });
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: the client is borrowed from `producer`, alive for the whole call; librdkafka's
        // client may be used from several threads at once.
        let err = unsafe { rdkafka::bindings::rd_kafka_flush(producer.client().native_ptr(), ms) };
        done.store(true, Ordering::Release);
        err
    });
    // librdkafka counts a record until its report is destroyed, after our context saw it; a
    // report served by the last poll is in the context already. Serve any left (a timeout).
    producer.poll(Duration::ZERO);
    match err {
        rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR => Ok(()),
        e => Err(KafkaError::Flush(e.into())),
    }
}
