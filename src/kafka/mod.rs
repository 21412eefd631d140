//! Kafka at the edges: client configuration, topic administration, the upstream writer's producer and
//! the worker's consumer loop. Turns rebalance callbacks into core events and carries out decisions;
//! decides nothing itself.
//!
//! librdkafka calls are synchronous here and run on dedicated threads, never on a tokio worker.

pub mod admin;
pub mod committer;
pub mod worker;
