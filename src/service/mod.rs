//! The service around the worker loop (configured by `crate::config`): running jobs' workers under
//! one supervisor each (`job`), one worker's composition root (`worker`), the HTTP endpoints
//! (`http`), what `/status` and the job runner see of each worker (`status`), every metric
//! (`metrics`) and the observer that turns a worker's events into both (`observe`), the process's
//! life — signals, the shutdown token, the grace period, the composition of `run` and `capture`
//! (`process`), moving a running job onto a new snapshot of its capture (`resync`) — and `status --watch`, the live terminal view of a running service's `/status`
//! (`watch`).

pub mod doctor;
pub mod exit;
pub mod http;
pub mod job;
pub mod json_log;
pub mod metrics;
pub mod observe;
pub mod process;
pub mod resync;
pub mod runtime;
pub mod status;
pub mod status_table;
pub mod watch;
pub mod worker;
