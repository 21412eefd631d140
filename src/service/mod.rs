//! The service around the worker loop: the configuration (`config`), running jobs' workers under
//! one supervisor each (`job`), the HTTP endpoints (`http`), what `/status` and the job runner see of
//! each worker (`status`), every metric (`metrics`) and `status --watch`, the live terminal view of
//! a running service's `/status` (`watch`).

pub mod config;
pub mod http;
pub mod job;
pub mod metrics;
pub mod status;
pub mod watch;
