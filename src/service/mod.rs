//! The service around the worker loop: the configuration (`config`), running jobs' workers under
//! one supervisor each (`job`), one worker's composition root (`worker`), the HTTP endpoints
//! (`http`), what `/status` and the job runner see of each worker (`status`), every metric
//! (`metrics`) and the observer that turns a worker's events into both (`observe`), and
//! `status --watch`, the live terminal view of a running service's `/status` (`watch`).

pub mod config;
pub mod http;
pub mod job;
pub mod metrics;
pub mod observe;
pub mod runtime;
pub mod status;
pub mod watch;
pub mod worker;
