//! State stores: the protocol every store enforces (`protocol`), written once; the backends
//! (`crate::sqlite_store`, `crate::postgres_store`, and `crate::memory` for tests and the
//! simulation) implement only its primitives.

pub mod protocol;
