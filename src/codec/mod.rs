//! The wire format (docs/DESIGN.md §3): Avro single-object encoding of log records, the table's row schema
//! and its primary-key bytes.
//!
//! This module owns encoding and decoding; it knows nothing of Kafka or stores. Decoding a change
//! checks the whole datum against the writer schema (without allocating) and hands the core the row
//! datum bytes as they are.

mod skip;
mod table;
pub mod varint;
pub mod versions;
mod wire;

pub use skip::skip as skip_datum;
pub use table::{
    signed_be_to_decimal, to_json, Column, ColumnType, ColumnValue, DirectValue, TableSchema,
};
pub use wire::{truncate_fingerprint, CodecError, LogCodec, SINGLE_OBJECT_MARKER};
