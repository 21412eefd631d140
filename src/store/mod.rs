//! State stores: the protocol every store enforces (`protocol`), written once, and the backends,
//! which implement only its primitives: `sqlite` (one file), `postgres` (shared by workers on many
//! machines) and `memory` (the test double the simulation uses; feature `testing`).

#[cfg(any(test, feature = "testing"))]
pub mod memory;
pub mod postgres;
pub mod protocol;
pub mod sqlite;
