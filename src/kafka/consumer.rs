//! librdkafka as the worker loop's [`ConsumerPort`] ([`KafkaConsumer`]): subscription with the
//! managed settings, records decoded on the worker thread, rebalances as events, and every client
//! call's failure returned to the loop. It decides nothing and knows nothing of the service.
//!
//! librdkafka calls the rebalance callback inside `poll`; [`Ctx`] only queues it as a
//! [`Polled::Assigned`] / [`Polled::Revoked`] event, returned by the next `poll` after the record of
//! the poll it came with. The loop completes it (`incremental_assign` / `incremental_unassign`) after
//! the core handled it, which librdkafka allows: the group waits for the assign call.
//!
//! Records are read in batches ([`FetchQueue`]) into a buffer the loop takes one by one. The buffer
//! keeps librdkafka's promises to the loop: after a pause, a seek or an unassign no buffered record
//! of that partition is returned (librdkafka drops its own queued ones the same way), a resume goes
//! back to the first record dropped, and the read position is not reported past a record the loop
//! has not had.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaResult;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tracing::{debug, error, info, warn};

use crate::codec::LogCodec;
use crate::core::{check_log_start, PartitionId, PartitionProgress};
use crate::kafka::admin::{cached_high_watermark, client_config};
use crate::kafka::fetch::FetchQueue;
use crate::ports::{AssignError, ConsumerPort, Polled};

type Events = Arc<EventQueue>;

/// The callbacks' events for the loop. `pending` lets the loop skip the lock on the path of every
/// record (it was a visible share of the worker's profile); an event pushed while the loop reads
/// `pending` is seen at its next poll, never lost.
#[derive(Default)]
struct EventQueue {
    pending: std::sync::atomic::AtomicUsize,
    queue: Mutex<VecDeque<Polled>>,
}

impl EventQueue {
    fn push(&self, event: Polled) {
        self.queue.lock().unwrap().push_back(event);
        self.pending.fetch_add(1, Ordering::Release);
    }

    fn pop(&self) -> Option<Polled> {
        if self.pending.load(Ordering::Acquire) == 0 {
            return None;
        }
        let e = self.queue.lock().unwrap().pop_front()?;
        self.pending.fetch_sub(1, Ordering::AcqRel);
        Some(e)
    }
}

/// The consumer context: rebalance callbacks and client errors become [`Polled`] events.
pub struct Ctx {
    events: Events,
    topic: String,
    /// Set when the consumer closes: there is no loop to complete rebalances any more, so the
    /// callback completes them itself (librdkafka's close waits for the revocation's unassign).
    closing: Arc<AtomicBool>,
}

/// A client error as the loop gets it: a non-fatal cause seen within the last minute is a repeat
/// (the loop counts it and logs it once, `kafka::client_log`); a fatal one is never a repeat.
fn client_error(reason: String, fatal: bool) -> Polled {
    let repeat = !fatal && crate::kafka::client_log::admit(&reason).is_none();
    Polled::ClientError {
        reason,
        fatal,
        repeat,
    }
}

impl ClientContext for Ctx {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        crate::kafka::client_log::log(level, fac, message);
    }

    /// librdkafka's own errors (a broker away, authentication): visible in `/status` `last_error`
    /// and counted while they last; librdkafka reconnects by itself.
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        let fatal = error.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::Fatal);
        // A fatal error's own code is read from the client when the loop polls it
        // (`KafkaConsumer::poll`, `fatal_reason`).
        self.events.push(client_error(reason.to_string(), fatal));
    }
}

impl ConsumerContext for Ctx {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let parts: Vec<PartitionId> = tpl
            .elements_for_topic(&self.topic)
            .iter()
            .map(|e| e.partition() as PartitionId)
            .collect();
        if self.closing.load(Ordering::SeqCst) {
            let r = match err {
                RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                    consumer.incremental_unassign(tpl)
                }
                _ => Ok(()),
            };
            if let Err(e) = r {
                debug!(error = %e, "unassign while closing failed");
            }
            return;
        }
        let event = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => Polled::Assigned(parts),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => Polled::Revoked {
                partitions: parts,
                lost: consumer.assignment_lost(),
            },
            other => {
                error!(error = ?other, "rebalance error");
                return;
            }
        };
        self.events.push(event);
    }
}

type Kc = BaseConsumer<Ctx>;

/// A fatal client error as operators read it, from librdkafka's fatal error *code* (never a
/// substring of its text): a fenced `group.instance.id` says what to do about it.
fn fatal_reason(
    fatal: Option<(rdkafka::types::RDKafkaErrorCode, String)>,
    reason: String,
) -> String {
    match fatal {
        Some((rdkafka::types::RDKafkaErrorCode::FencedInstanceId, text)) => format!(
            "{text}; another consumer joined with this worker's group.instance.id — give every worker a distinct one"
        ),
        // Under the consumer protocol (KIP-848) a duplicate instance id fences the *new* member.
        Some((rdkafka::types::RDKafkaErrorCode::UnreleasedInstanceId, text)) => format!(
            "{text}; this worker's group.instance.id is still held by a running member — give every worker a distinct one, or wait for the old member's session to end"
        ),
        Some((code, text)) => format!("{text} ({code:?})"),
        None => reason,
    }
}

/// What a consumer of a job is made from.
pub struct ConsumerSetup {
    pub job: String,
    pub topic: String,
    /// The job's librdkafka properties (the managed ones are set over them).
    pub kafka: BTreeMap<String, String>,
    pub codec: Arc<LogCodec>,
}

/// A record as the loop gets it, decoded here.
fn record(
    codec: &LogCodec,
    partition: i32,
    offset: i64,
    payload: &[u8],
    key: Option<&[u8]>,
) -> Polled {
    Polled::Record {
        partition: partition as PartitionId,
        offset: offset as u64,
        record: codec
            .decode(payload, key)
            .map_err(|e| crate::ports::Undecoded {
                reason: e.to_string(),
                key: key.map(<[u8]>::to_vec),
                value: payload.to_vec(),
            }),
    }
}

/// A record read in a batch, not yet returned to the loop.
struct Buffered {
    partition: PartitionId,
    offset: u64,
    polled: Polled,
}

/// librdkafka as the loop's [`ConsumerPort`]; records are decoded here.
pub struct KafkaConsumer {
    /// Declared before `consumer`: its queue handles are released before the client.
    fetch: FetchQueue,
    /// Read in the last batch, in librdkafka's order, not yet returned.
    buffered: VecDeque<Buffered>,
    /// Partitions whose buffered records were dropped by a pause, with the first offset dropped:
    /// librdkafka's position is past them until the loop positions the partition again.
    dropped: BTreeMap<PartitionId, u64>,
    consumer: Kc,
    events: Events,
    closing: Arc<AtomicBool>,
    topic: String,
    codec: Arc<LogCodec>,
}

impl KafkaConsumer {
    /// A consumer of the job's topic, subscribed, with the managed settings.
    pub fn subscribe(setup: &ConsumerSetup) -> Result<Self> {
        let mut config = client_config(&setup.kafka);
        for (k, v, _) in crate::kafka::managed_keys(&setup.kafka) {
            config.set(*k, *v);
        }
        if !setup.kafka.contains_key("fetch.wait.max.ms") {
            // A default, not managed: short fetch waits keep alignment and catch-up responsive.
            config.set("fetch.wait.max.ms", "100");
        }
        if !setup.kafka.contains_key("fetch.queue.backoff.ms") {
            // A default, not managed: librdkafka's 1,000 ms postpones a partition's next fetch
            // whenever its local queue is over `queued.min.messages` — while catching up that is most
            // of the time, and the worker sat in empty polls for 70 % of the log-store phase
            // (docs/BENCHMARKS.md, "What moved each figure").
            config.set("fetch.queue.backoff.ms", "10");
        }
        if !setup.kafka.contains_key("queued.max.messages.kbytes") {
            // A default, not managed: librdkafka's 64 MiB of prefetched messages grew with the
            // partitions (a worker of 64 held ~130 MiB more outside the Rust heap than one of 4);
            // 16 MiB ran the 64-partition replay as fast (docs/BENCHMARKS.md "Memory per partition").
            config.set("queued.max.messages.kbytes", "16384");
        }
        if !setup.kafka.contains_key("group.id") {
            config.set("group.id", format!("kafka-backfill-{}", setup.job));
        }
        let events = Events::default();
        let closing = Arc::new(AtomicBool::new(false));
        let consumer: Kc = config
            .create_with_context(Ctx {
                events: events.clone(),
                topic: setup.topic.clone(),
                closing: closing.clone(),
            })
            .with_context(|| format!("creating the consumer of job {}", setup.job))?;
        // SAFETY: the fetch queue is a field of the consumer's owner declared before the client,
        // so it is released first.
        let fetch = unsafe { FetchQueue::new(consumer.client().native_ptr()) }
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("creating the fetch queue of job {}", setup.job))?;
        consumer
            .subscribe(&[&setup.topic])
            .with_context(|| format!("subscribing to {}", setup.topic))?;
        Ok(KafkaConsumer {
            fetch,
            buffered: VecDeque::new(),
            dropped: BTreeMap::new(),
            consumer,
            events,
            closing,
            topic: setup.topic.clone(),
            codec: setup.codec.clone(),
        })
    }

    fn tpl(&self, p: PartitionId) -> TopicPartitionList {
        let mut t = TopicPartitionList::new();
        t.add_partition(&self.topic, p as i32);
        t
    }

    /// Serves the consumer queue without waiting: rebalances and client errors become events. A
    /// record there (none is expected: partitions are forwarded before they are assigned) is
    /// returned as it came.
    fn serve_consumer_queue(&mut self) -> Option<Polled> {
        match self.consumer.poll(Duration::ZERO) {
            Some(Ok(m)) => Some(record(
                &self.codec,
                m.partition(),
                m.offset(),
                m.payload().unwrap_or(&[]),
                m.key(),
            )),
            Some(Err(e)) => Some(client_error(e.to_string(), false)),
            None => None,
        }
    }

    /// Reads the next batch into the buffer, waiting up to `timeout_ms` for its first record.
    fn read_batch(&mut self, timeout_ms: u64) {
        let (codec, topic, buffered) = (&self.codec, &self.topic, &mut self.buffered);
        self.fetch.read(timeout_ms, |m| {
            let polled = match m.error() {
                None => record(codec, m.partition(), m.offset(), m.payload(), m.key()),
                // `auto.offset.reset = error`: the log no longer holds the offset the job reads
                // next (records deleted while it was behind): stop, never skip the gap.
                Some(_) if m.is_offset_reset() => client_error(
                    format!(
                        "topic {topic} partition {} offset {}: the log no longer holds the offset the job reads next; records were deleted (the topic's retention.ms / retention.bytes, or DeleteRecords) before the job read them, and nothing past that gap is read (docs/OPERATIONS.md, \"A log whose start is gone\")",
                        m.partition(),
                        m.offset()
                    ),
                    true,
                ),
                Some(e) => client_error(
                    format!(
                        "topic {topic} partition {} offset {}: {e}",
                        m.partition(),
                        m.offset()
                    ),
                    false,
                ),
            };
            buffered.push_back(Buffered {
                partition: m.partition() as PartitionId,
                offset: m.offset() as u64,
                polled,
            });
        });
    }

    /// Drops the buffered records of `partition` (librdkafka drops its own queued ones at a pause
    /// or a seek); returns the first offset dropped.
    fn drop_buffered(&mut self, partition: PartitionId) -> Option<u64> {
        let mut first = None;
        self.buffered.retain(|b| {
            let drop = b.partition == partition && matches!(b.polled, Polled::Record { .. });
            if drop {
                first.get_or_insert(b.offset);
            }
            !drop
        });
        first
    }

    fn next_event(&self) -> Option<Polled> {
        let e = self.events.pop()?;
        Some(match e {
            Polled::ClientError {
                reason,
                fatal: true,
                ..
            } => Polled::ClientError {
                reason: fatal_reason(self.consumer.client().fatal_error(), reason),
                fatal: true,
                repeat: false,
            },
            other => other,
        })
    }
}

impl ConsumerPort for KafkaConsumer {
    fn poll(&mut self, timeout_ms: u64) -> Option<Polled> {
        if let Some(e) = self.next_event() {
            return Some(e);
        }
        if let Some(b) = self.buffered.pop_front() {
            return Some(b.polled);
        }
        // A rebalance callback may run inside this.
        if let Some(p) = self.serve_consumer_queue().or_else(|| self.next_event()) {
            return Some(p);
        }
        self.read_batch(timeout_ms);
        if let Some(b) = self.buffered.pop_front() {
            return Some(b.polled);
        }
        // The wait may have ended for an operation on the consumer queue.
        self.serve_consumer_queue().or_else(|| self.next_event())
    }

    fn assign(&mut self, starts: &[(PartitionId, Option<u64>)]) -> Result<(), AssignError> {
        // Before anything is read: a needed offset the broker no longer holds is named, never
        // reset past (`auto.offset.reset` would skip the gap).
        for (p, offset) in starts {
            if let Some(needed) = offset {
                match self
                    .consumer
                    .fetch_watermarks(&self.topic, *p as i32, Duration::from_secs(5))
                {
                    Ok((low, _)) => {
                        check_log_start(&self.topic, *p, *needed, low.max(0) as u64)?;
                    }
                    // Unanswered, the check falls to the barrier chain: a reset past deleted
                    // records meets an epoch that does not follow the job's, and the job stops.
                    Err(e) => debug!(topic = %self.topic, partition = p, error = %e,
                        "earliest offset unknown at assignment; the barrier chain checks the start"),
                }
            }
        }
        let mut tpl = TopicPartitionList::new();
        for (p, offset) in starts {
            self.fetch
                .forward(&self.topic, *p as i32)
                .map_err(AssignError::Client)?;
            self.drop_buffered(*p);
            self.dropped.remove(p);
            match offset {
                Some(o) => tpl
                    .add_partition_offset(&self.topic, *p as i32, Offset::Offset(*o as i64))
                    .map_err(|e| {
                        AssignError::Client(format!(
                            "topic {} partition {p}: start offset {o}: {e}",
                            self.topic
                        ))
                    })?,
                // No claimed offset (the claim failed; the loop restarts before it reads): the
                // log's start, which always exists. The group's committed offset is not used:
                // with `auto.offset.reset = error` a group that never committed raises the
                // deleted-log error.
                None => tpl
                    .add_partition_offset(&self.topic, *p as i32, Offset::Beginning)
                    .map_err(|e| {
                        AssignError::Client(format!(
                            "topic {} partition {p}: start at the beginning: {e}",
                            self.topic
                        ))
                    })?,
            }
        }
        self.consumer.incremental_assign(&tpl).map_err(|e| {
            AssignError::Client(format!(
                "assigning topic {} partitions {:?}: {e}",
                self.topic,
                starts.iter().map(|s| s.0).collect::<Vec<_>>()
            ))
        })
    }

    fn unassign(&mut self, partitions: &[PartitionId]) -> Result<(), String> {
        let mut tpl = TopicPartitionList::new();
        for p in partitions {
            tpl.add_partition(&self.topic, *p as i32);
            self.drop_buffered(*p);
            self.dropped.remove(p);
        }
        self.consumer.incremental_unassign(&tpl).map_err(|e| {
            format!(
                "unassigning topic {} partitions {partitions:?}: {e}",
                self.topic
            )
        })
    }

    /// Seeks under [`Backoff::SEEK`](crate::core::retry::Backoff::SEEK): librdkafka refuses a seek
    /// until the partition's fetcher is set up, and while the broker is briefly away.
    fn seek(&mut self, partition: PartitionId, offset: u64) -> Result<(), String> {
        if let Some(first) = self.drop_buffered(partition) {
            // If the seek fails, a resume still goes back to them.
            self.dropped.entry(partition).or_insert(first);
        }
        let r: KafkaResult<()> = crate::retry::retry_sleeping(
            crate::core::retry::Backoff::SEEK,
            || {
                self.consumer.seek(
                    &self.topic,
                    partition as i32,
                    Offset::Offset(offset as i64),
                    Duration::from_secs(1),
                )
            },
            |_| true,
        );
        r.map_err(|e| e.to_string())?;
        self.dropped.remove(&partition);
        Ok(())
    }

    fn pause(&mut self, partition: PartitionId) -> Result<(), String> {
        self.consumer
            .pause(&self.tpl(partition))
            .map_err(|e| format!("pausing topic {} partition {partition}: {e}", self.topic))?;
        if let Some(first) = self.drop_buffered(partition) {
            self.dropped.entry(partition).or_insert(first);
        }
        Ok(())
    }

    /// Resumes, then seeks to `at`. librdkafka's resume does not wake the broker thread, which
    /// sleeps up to a second (`rd_kafka_max_block_ms`) when it has no fetch in flight — as when
    /// every partition was paused, through the snapshot phase or a paused job — so the first
    /// records after a resume came up to a second late (0.5–1 s at the start of every log-store
    /// phase: docs/BENCHMARKS.md "The fetcher woken at resume"). A seek sets the partition's fetch
    /// state active, which wakes its broker thread (`rd_kafka_toppar_set_fetch_state`); an
    /// offset without a leader epoch is not validated first, so no round trip is added.
    fn resume(&mut self, partition: PartitionId, at: Option<u64>) -> Result<(), String> {
        self.consumer
            .resume(&self.tpl(partition))
            .map_err(|e| format!("resuming topic {} partition {partition}: {e}", self.topic))?;
        // librdkafka would resume after the records dropped from the buffer at the pause.
        match at.or_else(|| self.dropped.get(&partition).copied()) {
            Some(offset) => self.seek(partition, offset).map_err(|e| {
                format!(
                    "restarting the fetch of topic {} partition {partition} at offset {offset}: {e}",
                    self.topic
                )
            }),
            None => Ok(()),
        }
    }

    fn commit_offsets(&mut self, progress: &[PartitionProgress], sync: bool) {
        let mut tpl = TopicPartitionList::new();
        for p in progress {
            let _ = tpl.add_partition_offset(
                &self.topic,
                p.partition as i32,
                Offset::Offset(p.next_offset as i64),
            );
            if let Some(mut e) = tpl.find_partition(&self.topic, p.partition as i32) {
                e.set_metadata(format!("epoch={}", p.epoch));
            }
        }
        let mode = if sync {
            CommitMode::Sync
        } else {
            CommitMode::Async
        };
        if let Err(e) = self.consumer.commit(&tpl, mode) {
            if sync {
                info!(error = %e, "final group offset commit failed (best effort; the store holds the offsets)");
            } else {
                debug!(error = %e, "group offset commit failed (best effort)");
            }
        }
    }

    /// The watermark of the last fetch response; a partition not fetched yet (paused from the
    /// start) is asked over the network.
    fn high_watermark(&mut self, partition: PartitionId) -> Option<u64> {
        cached_high_watermark(self.consumer.client(), &self.topic, partition as i32).or_else(|| {
            self.consumer
                .fetch_watermarks(&self.topic, partition as i32, Duration::from_secs(2))
                .ok()
                .map(|(_, h)| h as u64)
        })
    }

    /// librdkafka's cached watermark comes from fetch responses, which a paused partition gets
    /// none of: ask the broker.
    fn broker_high_watermark(&mut self, partition: PartitionId) -> Option<u64> {
        self.consumer
            .fetch_watermarks(&self.topic, partition as i32, Duration::from_secs(2))
            .ok()
            .map(|(_, h)| h as u64)
    }

    fn read_position(&mut self, partition: PartitionId) -> Option<u64> {
        // librdkafka's position is past every record of the batches read: not while one of the
        // partition's is buffered or was dropped from the buffer.
        if self.dropped.contains_key(&partition)
            || self.buffered.iter().any(|b| b.partition == partition)
        {
            return None;
        }
        super::consumer_position(&self.consumer, &self.topic, partition)
    }

    fn assignment(&mut self) -> Vec<PartitionId> {
        self.consumer
            .assignment()
            .map(|t| {
                t.elements_for_topic(&self.topic)
                    .iter()
                    .map(|e| e.partition() as PartitionId)
                    .collect()
            })
            .unwrap_or_default()
    }

    fn close(&mut self, leave: bool) {
        self.closing.store(true, Ordering::SeqCst);
        if !leave {
            // A static member: dropping the consumer closes it without leaving the group.
            return;
        }
        self.consumer.unsubscribe();
        // Serve the revocation the unsubscribe starts; done once nothing is assigned (it used to
        // poll out the whole 2 s, every stop).
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while std::time::Instant::now() < deadline {
            let _ = self.consumer.poll(Duration::from_millis(50));
            while let Some(e) = self.next_event() {
                if let Polled::Revoked { partitions, .. } = e {
                    if let Err(e) = self.unassign(&partitions) {
                        // Closing anyway: the group times the member out instead.
                        warn!(error = %e, "unassign while closing failed");
                        break;
                    }
                }
            }
            if self.assignment().is_empty() {
                break;
            }
        }
    }
}

impl Drop for KafkaConsumer {
    /// Dropping closes the consumer (also on a stopped job, without `close`): rebalances from here
    /// on complete in the callback.
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
    }
}
