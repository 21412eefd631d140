//! Every integration test in one binary (one link of the crate instead of one per file): each module
//! is one area (docs/TESTING.md's layers), `support` is what the real-process tests share.
//!
//! Run one area with `cargo test --features testing --test it <module>::`, e.g.
//! `cargo test --features testing --test it kafka_e2e::`.

mod support;

mod adaptive;
mod alerts;
mod architecture;
mod capture_e2e;
mod capture_mariadb;
#[cfg(feature = "testing")]
mod capture_simulation;
mod capture_snapshots;
mod codec_hostile;
mod consistency_e2e;
mod contract_e2e;
mod doc_commands;
mod docs;
mod golden_vectors;
mod http_limits;
mod kafka_e2e;
mod key_order;
mod manifest_schema;
mod mock_faults;
mod outages;
mod postgres_store;
mod scale_out;
#[cfg(feature = "testing")]
mod scenarios;
mod schema_changes_e2e;
mod schema_versions;
mod security;
mod service;
#[cfg(feature = "testing")]
mod simulation;
mod static_membership;
mod status_page;
mod store_conformance;
mod store_types;
