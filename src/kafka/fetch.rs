//! The consumer's records read in batches. Every assigned partition's librdkafka fetch queue is
//! forwarded to one queue of the consumer's own ([`FetchQueue`]), read with
//! `rd_kafka_consume_batch_queue`: one call, one pair of clock reads and one `max.poll.interval.ms`
//! mark per batch, where `BaseConsumer::poll` takes them per record (docs/BENCHMARKS.md "Records
//! read in batches").
//!
//! Rebalances, client errors and offset-commit replies stay on the consumer queue, which
//! `BaseConsumer::poll` serves as before; anything put on that queue wakes a batch read waiting on
//! this one (`rd_kafka_queue_yield`), so a rebalance is not held up behind an idle fetch.
//!
//! It owns the raw queue handles and every `unsafe` call of the consumer; it decides nothing.

use std::ffi::{c_void, CString};
use std::ptr;

use rdkafka::bindings as rd;

/// Most records one batch read takes.
pub const BATCH: usize = 512;

/// A queue of this consumer's own that the assigned partitions' fetch queues forward to.
pub struct FetchQueue {
    /// The queue the records arrive on (owned: `rd_kafka_queue_new`).
    queue: *mut rd::rd_kafka_queue_t,
    /// A handle on the consumer queue, whose enqueue callback wakes a read of `queue`.
    consumer: *mut rd::rd_kafka_queue_t,
    rk: *mut rd::rd_kafka_t,
    batch: Vec<*mut rd::rd_kafka_message_t>,
}

// SAFETY: librdkafka's queue handles may be used from any thread; this one is used by one at a
// time (the worker owning its consumer).
unsafe impl Send for FetchQueue {}

/// Wakes a batch read blocked on the fetch queue (`opaque`); called by librdkafka, under the
/// consumer queue's lock, when it enqueues an operation there.
unsafe extern "C" fn wake(_rk: *mut rd::rd_kafka_t, opaque: *mut c_void) {
    // SAFETY: `opaque` is the fetch queue, alive until `FetchQueue::drop` has disabled this
    // callback (under the same lock).
    unsafe { rd::rd_kafka_queue_yield(opaque as *mut rd::rd_kafka_queue_t) }
}

impl FetchQueue {
    /// A fetch queue of the consumer client `rk` (a high-level consumer, with a group).
    ///
    /// # Safety
    /// `rk` must be a live consumer client that outlives the returned queue.
    pub unsafe fn new(rk: *mut rd::rd_kafka_t) -> Result<FetchQueue, String> {
        // SAFETY: `rk` is live (the caller's contract).
        let (queue, consumer) = unsafe {
            (
                rd::rd_kafka_queue_new(rk),
                rd::rd_kafka_queue_get_consumer(rk),
            )
        };
        if queue.is_null() || consumer.is_null() {
            // SAFETY: each handle is destroyed once, if it was made.
            unsafe {
                if !queue.is_null() {
                    rd::rd_kafka_queue_destroy(queue);
                }
                if !consumer.is_null() {
                    rd::rd_kafka_queue_destroy(consumer);
                }
            }
            return Err("librdkafka gave no consumer queue (is group.id set?)".into());
        }
        // SAFETY: both handles are live; the callback is disabled before `queue` is destroyed.
        unsafe { rd::rd_kafka_queue_cb_event_enable(consumer, Some(wake), queue as *mut c_void) };
        Ok(FetchQueue {
            queue,
            consumer,
            rk,
            batch: vec![ptr::null_mut(); BATCH],
        })
    }

    /// Sends `partition` of `topic`'s records to this queue. Done before the partition is assigned,
    /// so librdkafka's fetch start keeps it (an application's forward is left alone) and no record
    /// of it reaches the consumer queue.
    pub fn forward(&mut self, topic: &str, partition: i32) -> Result<(), String> {
        let name = CString::new(topic).map_err(|e| format!("topic {topic:?}: {e}"))?;
        // SAFETY: `rk` is live (`new`'s contract); the partition handle is released once.
        unsafe {
            let pq = rd::rd_kafka_queue_get_partition(self.rk, name.as_ptr(), partition);
            if pq.is_null() {
                return Err(format!(
                    "librdkafka gave no queue for topic {topic} partition {partition}"
                ));
            }
            rd::rd_kafka_queue_forward(pq, self.queue);
            rd::rd_kafka_queue_destroy(pq);
        }
        Ok(())
    }

    /// Reads up to [`BATCH`] records (or per-partition errors), waiting up to `timeout_ms` for the
    /// first, and hands each to `each` (it must not keep the message), then releases it. A wait
    /// ends early when the consumer queue gets an operation (a rebalance to serve).
    pub fn read(&mut self, timeout_ms: u64, mut each: impl FnMut(Message<'_>)) -> usize {
        let timeout = timeout_ms.min(i32::MAX as u64) as i32;
        // SAFETY: `batch` has room for `BATCH` pointers; librdkafka fills the first `n`.
        let n = unsafe {
            rd::rd_kafka_consume_batch_queue(self.queue, timeout, self.batch.as_mut_ptr(), BATCH)
        };
        let n = n.max(0) as usize;
        for &m in &self.batch[..n] {
            // SAFETY: librdkafka returned `m` to us; it is read here and destroyed once, after.
            unsafe {
                each(Message(&*m));
                rd::rd_kafka_message_destroy(m);
            }
        }
        n
    }
}

impl Drop for FetchQueue {
    fn drop(&mut self) {
        // SAFETY: disabling takes the consumer queue's lock, which `wake` runs under, so no call
        // of it is under way or starts after; then each handle is released once.
        unsafe {
            rd::rd_kafka_queue_cb_event_enable(self.consumer, None, ptr::null_mut());
            rd::rd_kafka_queue_destroy(self.consumer);
            rd::rd_kafka_queue_destroy(self.queue);
        }
    }
}

/// One message of a batch, borrowed for the call that reads it.
pub struct Message<'a>(&'a rd::rd_kafka_message_t);

impl Message<'_> {
    pub fn partition(&self) -> i32 {
        self.0.partition
    }

    pub fn offset(&self) -> i64 {
        self.0.offset
    }

    /// librdkafka's error text, if this is a per-partition error and not a record.
    pub fn error(&self) -> Option<String> {
        if self.0.err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return None;
        }
        // SAFETY: `rd_kafka_err2str` returns a static NUL-terminated string for any code.
        let text = unsafe { std::ffi::CStr::from_ptr(rd::rd_kafka_err2str(self.0.err)) };
        Some(text.to_string_lossy().into_owned())
    }

    /// The error of `auto.offset.reset = error`: the offset to fetch is not in the log.
    pub fn is_offset_reset(&self) -> bool {
        self.0.err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET
    }

    pub fn payload(&self) -> &[u8] {
        // SAFETY: librdkafka's payload is `len` bytes, alive as long as the message.
        unsafe { bytes(self.0.payload, self.0.len) }
    }

    pub fn key(&self) -> Option<&[u8]> {
        (!self.0.key.is_null()).then(|| {
            // SAFETY: as `payload`.
            unsafe { bytes(self.0.key, self.0.key_len) }
        })
    }
}

/// # Safety
/// `p` is null or points at `len` readable bytes alive for `'a`.
unsafe fn bytes<'a>(p: *const c_void, len: usize) -> &'a [u8] {
    if p.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(p as *const u8, len) }
    }
}
