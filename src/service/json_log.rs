//! The `log.format = "json"` line: one JSON object per event — `timestamp`, `level`, `fields`
//! (with `message`) and `target`, the shape of `tracing-subscriber`'s own — where a field logged by
//! its Debug form that is itself JSON (a list of partitions, `[0, 1]`) is written as that JSON
//! value instead of a string holding it, so a log collector reads `fields.partitions` as an array.
//!
//! Owns the line's format only; the filter and the writer are `main`'s.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The JSON event format (`tracing_subscriber::fmt().event_format(JsonLines)`).
pub struct JsonLines;

/// An event's fields as JSON values.
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        let json = match text.as_bytes().first() {
            // The message is text whatever it looks like.
            Some(b'[' | b'{') if field.name() != "message" => serde_json::from_str(&text).ok(),
            _ => None,
        };
        self.0.insert(
            field.name().to_string(),
            json.unwrap_or(Value::String(text)),
        );
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_string(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_string(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_string(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_string(), value.into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0
            .insert(field.name().to_string(), value.to_string().into());
    }
}

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields(Map::new());
        event.record(&mut fields);
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        let timestamp = chrono::DateTime::from_timestamp_micros(micros)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
            .unwrap_or_default();
        let meta = event.metadata();
        let line = serde_json::json!({
            "timestamp": timestamp,
            "level": meta.level().as_str(),
            "fields": Value::Object(fields.0),
            "target": meta.target(),
        });
        writeln!(writer, "{line}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lists_are_arrays_and_the_rest_keeps_its_type() {
        let buffer = Buffer::default();
        let out = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .event_format(JsonLines)
            .with_writer(move || out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let parts: Vec<u32> = vec![1, 0];
            let ranges = vec![0..128u32, 200..256];
            tracing::info!(job = "j", partitions = ?parts, vnodes = ?ranges, lost = false, generation = 3u64, "[1] partitions assigned");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let line: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!(line["level"], "INFO");
        assert_eq!(
            line["fields"]["partitions"],
            serde_json::json!([1, 0]),
            "{text}"
        );
        // Not JSON (a Rust range): kept as its text.
        assert_eq!(line["fields"]["vnodes"], "[0..128, 200..256]");
        assert_eq!(line["fields"]["message"], "[1] partitions assigned");
        assert_eq!(line["fields"]["lost"], false);
        assert_eq!(line["fields"]["generation"], 3);
        assert_eq!(line["fields"]["job"], "j");
        assert!(line["timestamp"].as_str().unwrap().ends_with('Z'), "{text}");
    }
}
