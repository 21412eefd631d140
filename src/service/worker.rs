//! The composition root of one worker: its librdkafka consumer (`kafka::consumer`), its committer
//! thread (`store::committer`), the system clock and the service's observer, put together around the
//! one loop (`driver`) on a thread of its own. The job runner (`service::job`) starts one per
//! configured worker.

use crate::shutdown::CancellationToken;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, Context, Result};
use tracing::info;

use crate::codec::LogCodec;
use crate::core::Supervisor;
use crate::driver::{Driver, DriverConfig};
use crate::kafka::consumer::{ConsumerSetup, KafkaConsumer};
use crate::ports::{Clock, RowSchemas, SnapshotSource, StoreFactory};
use crate::service::observe::ServiceObserver;
use crate::service::status::StatusBoard;
use crate::store::committer::Committer;

/// Messages handled between two looks at the snapshot scan, the clock and the watermarks.
const MAX_MESSAGES_PER_ROUND: usize = 10_000;

/// Everything a worker thread needs.
#[derive(Clone)]
pub struct WorkerSetup {
    pub job: String,
    pub topic: String,
    pub worker: String,
    pub kafka: BTreeMap<String, String>,
    pub snapshot: Arc<dyn SnapshotSource>,
    pub codec: Arc<LogCodec>,
    pub open_store: StoreFactory,
    /// The job's behaviour, built once from its configuration (`JobConfig::policy`).
    pub policy: crate::core::JobPolicy,
    pub supervisor: Arc<Mutex<Supervisor>>,
    /// Cancelled when the process stops: the worker commits what is complete and leaves.
    pub shutdown: CancellationToken,
    pub board: StatusBoard,
    /// Snapshot rows per second and, separately, log records per second; 0 = unlimited.
    pub max_rows_per_second: u64,
    /// Adaptive rate limiting (`[jobs.rate_limit]`).
    pub adaptive: crate::core::AdaptiveConfig,
    /// `on_bad_record = "dead-letter"`: the dead-letter topic (the cap is the policy's).
    pub dead_letter_topic: Option<String>,
    /// A job of several tables: each table's counts, which `/status` reads (empty for one).
    pub tables: std::sync::Arc<[crate::service::runtime::TableCounts]>,
    /// The process's metrics, which the worker's observer counts into.
    pub metrics: std::sync::Arc<crate::service::metrics::Metrics>,
}

/// Wall-clock time; throttling sleeps the thread.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    fn sleep_ms(&mut self, ms: u64) {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

/// Runs one worker until shutdown or a failure the supervisor will not retry.
pub fn run_worker(setup: WorkerSetup) -> Result<()> {
    let store = (setup.open_store)()
        .with_context(|| format!("opening the state store of job {}", setup.job))?;
    let committer = Committer::new(
        setup.job.clone(),
        setup.open_store.clone(),
        // Rows are decoded on this thread ahead of the commit (a several-table job's each with
        // its table's schema), except where the store reads them in place; the store's thread
        // only routes and binds them.
        Arc::new(
            if setup.policy.tables.several() {
                RowSchemas::Several(setup.codec.materialised())
            } else {
                RowSchemas::One(Box::new(setup.codec.table.clone()))
            }
            .for_store(store.reads_values_in_place()),
        ),
    );
    let consumer = KafkaConsumer::subscribe(&ConsumerSetup {
        job: setup.job.clone(),
        topic: setup.topic.clone(),
        kafka: setup.kafka.clone(),
        codec: setup.codec.clone(),
    })?;
    let cfg = DriverConfig {
        job: setup.job.clone(),
        topic: setup.topic.clone(),
        worker: setup.worker.clone(),
        policy: setup.policy.clone(),
        max_rows_per_second: setup.max_rows_per_second,
        adaptive: setup.adaptive,
        max_messages_per_round: MAX_MESSAGES_PER_ROUND,
        max_scan_rows_per_round: 1_000,
        idle_poll_ms: 50,
        housekeeping_ms: 500,
        static_member: setup.kafka.contains_key("group.instance.id"),
    };
    let driver = Driver::new(
        cfg,
        consumer,
        committer,
        SystemClock,
        store,
        setup.snapshot.clone(),
        setup.supervisor.clone(),
        Box::new(ServiceObserver::new(
            setup.metrics.clone(),
            &setup.job,
            &setup.worker,
            setup.board.clone(),
            setup.tables.clone(),
        )),
    )
    .map_err(|f| anyhow!("{f}"))?;
    let mut driver = match &setup.dead_letter_topic {
        Some(topic) => driver.with_dead_letters(Box::new(
            crate::kafka::dead_letters::KafkaDeadLetters::new(
                &setup.kafka,
                topic,
                &setup.topic,
                &setup.job,
            )
            .with_context(|| format!("job {}: the dead-letter topic", setup.job))?,
        )),
        None => driver,
    };
    info!(job = %setup.job, worker = %setup.worker, topic = %setup.topic, "worker started");
    loop {
        if setup.shutdown.is_cancelled() {
            driver.shutdown();
            return Ok(());
        }
        driver.step()?;
    }
}
