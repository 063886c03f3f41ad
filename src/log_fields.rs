//! The text log format's fields, written straight: `name=value`, byte for byte what
//! tracing-subscriber's `DefaultFields` writes without colours.
//!
//! `DefaultFields` paints every field name and `=` through a no-op ANSI style when colours are
//! off, and quotes every string through `Debug`. For the access log, a line per request with
//! a dozen fields, that was 8% of the gateway's instructions per request
//! (`loadtest/instructions.sh`). Anything unusual (colours on, the `message`, raw identifiers,
//! errors, strings that need escaping) is left to `DefaultFields` itself, so the output stays
//! the same.

use std::fmt;
use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::{DefaultFields, DefaultVisitor, Writer};

/// The field formatter of the text format (see the module's doc).
#[derive(Debug, Default)]
pub struct PlainFields;

impl<'w> FormatFields<'w> for PlainFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        if writer.has_ansi_escapes() {
            return DefaultFields::new().format_fields(writer, fields);
        }
        let mut visitor = Visitor {
            writer,
            empty: true,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct Visitor<'w> {
    writer: Writer<'w>,
    empty: bool,
    result: fmt::Result,
}

impl Visitor<'_> {
    /// Whether `DefaultFields` treats the field in a way of its own (see `record_debug` there).
    fn special(field: &Field) -> bool {
        let name = field.name();
        name == "message" || name.starts_with("r#") || name.starts_with("log.")
    }

    /// Writes `name=` (after a space unless first), then `value`.
    fn write(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        let empty = std::mem::replace(&mut self.empty, false);
        self.result = (|| {
            if !empty {
                self.writer.write_char(' ')?;
            }
            self.writer.write_str(field.name())?;
            self.writer.write_char('=')?;
            value(&mut self.writer)
        })();
    }

    /// Leaves the field to `DefaultFields`' own visitor.
    fn delegate(&mut self, record: impl FnOnce(&mut DefaultVisitor<'_>)) {
        if self.result.is_err() {
            return;
        }
        let empty = std::mem::replace(&mut self.empty, false);
        let mut visitor = DefaultVisitor::new(self.writer.by_ref(), empty);
        record(&mut visitor);
        self.result = tracing_subscriber::field::VisitOutput::finish(visitor);
    }
}

/// Whether `Debug` would print `text` as it is, between quotes.
fn needs_no_escape(text: &str) -> bool {
    text.bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
}

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if Self::special(field) || !needs_no_escape(value) {
            return self.delegate(|v| v.record_str(field, value));
        }
        self.write(field, |w| {
            w.write_char('"')?;
            w.write_str(value)?;
            w.write_char('"')
        });
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if Self::special(field) {
            return self.delegate(|v| v.record_u64(field, value));
        }
        self.write(field, |w| w.write_str(itoa::Buffer::new().format(value)));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if Self::special(field) {
            return self.delegate(|v| v.record_i64(field, value));
        }
        self.write(field, |w| w.write_str(itoa::Buffer::new().format(value)));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if Self::special(field) {
            return self.delegate(|v| v.record_bool(field, value));
        }
        self.write(field, |w| w.write_str(if value { "true" } else { "false" }));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.delegate(|v| v.record_error(field, value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if Self::special(field) {
            return self.delegate(|v| v.record_debug(field, value));
        }
        self.write(field, |w| write!(w, "{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::MakeWriter;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    #[derive(Debug)]
    struct Outer(std::io::Error);
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("outer failed")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    /// Every kind of field the gateway logs, and the awkward ones.
    fn log_everything() {
        let span = tracing::info_span!("request", request_id = %"abc-1", trace_id = %"00ff", peer = tracing::field::Empty);
        span.record("peer", "CN=client \"one\"");
        let _entered = span.enter();
        let method = http::Method::POST;
        tracing::info!(
            %method, path = "/v2/models/add_sub/infer", model = "add_sub", version = "",
            status = 200u16, latency_ms = 0.123_456_f64, tiny = 1e-9_f64, signed = -3i64,
            ok = true, quoted = "say \"hi\"\\", newline = "a\nb", accent = "café", escape = "\u{1b}[31m",
            r#type = "raw", debugged = ?Some("x"), "request"
        );
        let error = Outer(std::io::Error::other("inner \"cause\""));
        tracing::warn!(
            error = &error as &(dyn std::error::Error + 'static),
            "request failed: {}",
            7
        );
        tracing::info!("message only");
        tracing::info!(first = 1u64);
    }

    fn captured(plain: bool, ansi: bool) -> String {
        let out = Captured::default();
        let builder = tracing_subscriber::fmt()
            .without_time()
            .with_target(false)
            .with_ansi(ansi)
            .with_writer(out.clone());
        if plain {
            tracing::subscriber::with_default(
                builder.fmt_fields(PlainFields).finish(),
                log_everything,
            );
        } else {
            tracing::subscriber::with_default(builder.finish(), log_everything);
        }
        String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn lines_are_byte_for_byte_those_of_the_default_fields() {
        let plain = captured(true, false);
        assert_eq!(plain, captured(false, false));
        assert!(
            plain.contains("path=\"/v2/models/add_sub/infer\" model=\"add_sub\" version=\"\""),
            "{plain}"
        );
        assert!(plain.contains("peer=\"CN=client \\\"one\\\"\""), "{plain}");
        // With colours on, the default writes the line.
        assert_eq!(captured(true, true), captured(false, true));
    }
}
