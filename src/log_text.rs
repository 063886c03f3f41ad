//! The text log format, written straight: each line byte for byte what tracing-subscriber's
//! `Full` format with `DefaultFields` writes without colours (and without the target).
//!
//! The stock writers go through `fmt::write` for every piece: the timestamp is a calendar
//! computation and a dozen formatted pieces, every field name and `=` is painted through a
//! no-op ANSI style, every string is quoted through `Debug`, a float is formatted through
//! `Debug`. For the access log, a line per request with a dozen fields, that was a tenth of the
//! gateway's instructions per request (`loadtest/instructions.sh`). Anything unusual (colours
//! on, the `message`, raw identifiers, errors, strings that need escaping, floats far from 1)
//! is left to the stock writers, so the output stays the same.

use crate::trace::TraceHex;
use http::HeaderValue;
use std::fmt;
use std::sync::Arc;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{DefaultFields, DefaultVisitor, Format, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The event format of the text log (see the module's doc): timestamp, level, the spans with
/// their fields, then the event's fields.
#[derive(Debug, Default)]
pub struct PlainLine;

impl<S, N> FormatEvent<S, N> for PlainLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        if writer.has_ansi_escapes() {
            return Format::default()
                .with_target(false)
                .format_event(ctx, writer, event);
        }
        write_now(&mut writer)?;
        writer.write_str(level(event.metadata().level()))?;
        writer.write_char(' ')?;
        let mut seen = false;
        if let Some(written) = with_current(|fields| write_scope(&mut writer, &fields.view())) {
            written?;
            seen = true;
        }
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                seen = true;
                writer.write_str(span.metadata().name())?;
                if let Some(fields) = span.extensions().get::<FormattedFields<N>>()
                    && !fields.is_empty()
                {
                    writer.write_char('{')?;
                    writer.write_str(fields)?;
                    writer.write_char('}')?;
                }
                writer.write_char(':')?;
            }
        }
        if seen {
            writer.write_char(' ')?;
        }
        ctx.format_fields(writer.by_ref(), event)?;
        writer.write_char('\n')
    }
}

/// The level as `Full` pads it.
fn level(level: &Level) -> &'static str {
    match *level {
        Level::TRACE => "TRACE",
        Level::DEBUG => "DEBUG",
        Level::INFO => " INFO",
        Level::WARN => " WARN",
        Level::ERROR => "ERROR",
    }
}

thread_local! {
    /// The second of the last line this thread wrote, and its `YYYY-MM-DDTHH:MM:SS.` text:
    /// lines come many a second, so the calendar is worked out (and its text checked as
    /// UTF-8) once a second.
    static SECOND: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((u64::MAX, String::new())) };
}

/// Writes the time now as the `SystemTime` timer does (RFC 3339, UTC, microseconds), then a
/// space.
fn write_now(writer: &mut Writer<'_>) -> fmt::Result {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    write_time(writer, since)
}

fn write_time(writer: &mut Writer<'_>, since: std::time::Duration) -> fmt::Result {
    let secs = since.as_secs();
    SECOND.with_borrow_mut(|(cached, text)| {
        if *cached != secs {
            let second = second_text(secs);
            text.clear();
            text.push_str(std::str::from_utf8(&second).map_err(|_| fmt::Error)?);
            *cached = secs;
        }
        writer.write_str(text)
    })?;
    let mut micros = *b"000000Z ";
    put_digits(&mut micros[..6], u64::from(since.subsec_micros()));
    // ASCII digits and punctuation.
    writer.write_str(std::str::from_utf8(&micros).map_err(|_| fmt::Error)?)
}

/// `YYYY-MM-DDTHH:MM:SS.` of `secs` since the Unix epoch (years 1970–9999).
fn second_text(secs: u64) -> [u8; 20] {
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    let mut text = *b"0000-00-00T00:00:00.";
    put_digits(&mut text[0..4], year as u64);
    put_digits(&mut text[5..7], month);
    put_digits(&mut text[8..10], day);
    put_digits(&mut text[11..13], rest / 3600);
    put_digits(&mut text[14..16], rest / 60 % 60);
    put_digits(&mut text[17..19], rest % 60);
    text
}

/// Writes `value`'s last `out.len()` decimal digits into `out`, zero-padded.
fn put_digits(out: &mut [u8], mut value: u64) {
    for digit in out.iter_mut().rev() {
        *digit = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// Year, month and day of a day count since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u64, u64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u64;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u64;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

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

/// A field's value as the text format writes it, for `write_line`.
pub enum Value<'a> {
    /// A string, written between quotes (`path="/v2/..."`).
    Text(&'a str),
    /// A value logged with `%` (its `Display`), written as it is (`method=POST`).
    Shown(&'a str),
    /// An unsigned number.
    Number(u64),
    /// A float.
    Float(f64),
}

/// The fields of a request's span (`pipeline::edge`), which the text format writes before
/// each line logged inside it: `request{request_id=.. trace_id=.. peer=".."}: `.
pub struct Scope<'a> {
    /// The request id (printable ASCII).
    pub request_id: &'a str,
    /// The trace id, 32 hex digits.
    pub trace_id: &'a str,
    /// The verified client certificate's subject (mTLS), when there is one.
    pub peer: Option<&'a str>,
}

/// The lead of the field `name` in a line written straight (`write_line`): ` name=`.
macro_rules! lead {
    ($name:ident) => {
        concat!(" ", stringify!($name), "=")
    };
}
pub(crate) use lead;

/// Writes into `out` the line `PlainLine` writes for an event at `level` with `message` and
/// `fields`, inside the request span `scope` (and no other span), byte for byte, but without
/// `tracing`'s event machinery: for the access log, a line per request, where that machinery
/// cost a tenth of the gateway's instructions. Each field is its lead, what the line has
/// before its value (` name=`, made at compile time: `lead!`), and its value. `None` when a
/// value needs what only the stock writers do (escaping, a float far from 1): the caller then
/// logs through `tracing`.
pub fn write_line(
    out: &mut String,
    level: &Level,
    scope: Option<&Scope<'_>>,
    message: &str,
    fields: &[(&str, Value<'_>)],
) -> Option<()> {
    let plain = |value: &Value<'_>| match value {
        Value::Text(text) => crate::plain_text::is_plain(text),
        Value::Float(value) => plain_float(*value),
        Value::Shown(_) | Value::Number(_) => true,
    };
    if !fields.iter().all(|(_, value)| plain(value)) {
        return None;
    }
    write_now(&mut Writer::new(out)).ok()?;
    out.push_str(self::level(level));
    out.push(' ');
    if let Some(scope) = scope {
        write_scope(out, scope).ok()?;
        out.push(' ');
    }
    out.push_str(message);
    for (lead, value) in fields {
        out.push_str(lead);
        match value {
            Value::Text(text) => {
                out.push('"');
                out.push_str(text);
                out.push('"');
            }
            Value::Shown(text) => out.push_str(text),
            Value::Number(n) => out.push_str(itoa::Buffer::new().format(*n)),
            Value::Float(f) => out.push_str(ryu::Buffer::new().format_finite(*f)),
        }
    }
    out.push('\n');
    Some(())
}

tokio::task_local! {
    /// The scope's fields of the request being polled, when its scope is no span
    /// (`telemetry::scope`).
    static CURRENT: Option<Arc<ScopeFields>>;
}

/// What a request's scope shows, owned: held in a task-local while the request's futures are
/// polled, where `PlainLine` finds it.
pub struct ScopeFields {
    /// The request id (printable ASCII).
    pub request_id: HeaderValue,
    /// The trace id.
    pub trace_id: TraceHex,
    /// The verified client certificate's subject (mTLS).
    pub peer: Option<Arc<str>>,
}

impl ScopeFields {
    /// The fields as the text format writes them.
    pub fn view(&self) -> Scope<'_> {
        Scope {
            request_id: self.request_id.to_str().unwrap_or_default(),
            trace_id: self.trace_id.as_str(),
            peer: self.peer.as_deref(),
        }
    }
}

/// `work`, with every line it logs while polled inside the scope `fields`.
pub fn in_scope<F: Future>(
    fields: Option<Arc<ScopeFields>>,
    work: F,
) -> impl Future<Output = F::Output> + use<F> {
    CURRENT.scope(fields, work)
}

/// Runs `work` with every line it logs inside the scope `fields`.
pub fn sync_in_scope<T>(fields: Option<Arc<ScopeFields>>, work: impl FnOnce() -> T) -> T {
    CURRENT.sync_scope(fields, work)
}

/// Calls `write` with the scope's fields of the request being polled, when there is one.
fn with_current<T>(write: impl FnOnce(&ScopeFields) -> T) -> Option<T> {
    CURRENT
        .try_with(|fields| fields.as_deref().map(write))
        .ok()
        .flatten()
}

/// Writes a request's scope as its span shows in the text format: `request{request_id=..
/// trace_id=.. peer=".."}:`, the peer as `Debug` quotes it.
fn write_scope(out: &mut impl fmt::Write, scope: &Scope<'_>) -> fmt::Result {
    out.write_str("request{request_id=")?;
    out.write_str(scope.request_id)?;
    out.write_str(" trace_id=")?;
    out.write_str(scope.trace_id)?;
    match scope.peer {
        Some(peer) if crate::plain_text::is_plain(peer) => {
            out.write_str(" peer=\"")?;
            out.write_str(peer)?;
            out.write_char('"')?;
        }
        Some(peer) => write!(out, " peer={peer:?}")?,
        None => {}
    }
    out.write_str("}:")
}

/// Whether `Debug` writes `value` as ryu does: between these, it writes the shortest decimal
/// that reads back.
fn plain_float(value: f64) -> bool {
    value == 0.0 || (1e-3..1e15).contains(&value.abs())
}

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if Self::special(field) || !crate::plain_text::is_plain(value) {
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

    fn record_f64(&mut self, field: &Field, value: f64) {
        if Self::special(field) || !plain_float(value) {
            return self.delegate(|v| v.record_f64(field, value));
        }
        self.write(field, |w| {
            w.write_str(ryu::Buffer::new().format_finite(value))
        });
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
pub(crate) mod tests {
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
            .with_target(false)
            .with_ansi(ansi)
            .with_writer(out.clone());
        if plain {
            tracing::subscriber::with_default(
                builder
                    .fmt_fields(PlainFields)
                    .event_format(PlainLine)
                    .finish(),
                log_everything,
            );
        } else {
            tracing::subscriber::with_default(builder.finish(), log_everything);
        }
        String::from_utf8(out.0.lock().unwrap().clone()).unwrap()
    }

    /// The lines `work` logs through the text format's `tracing` writers, without their
    /// timestamps.
    pub(crate) fn plain_lines(work: impl FnOnce()) -> Vec<String> {
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_target(false)
            .with_ansi(false)
            .with_writer(out.clone())
            .fmt_fields(PlainFields)
            .event_format(PlainLine)
            .finish();
        tracing::subscriber::with_default(subscriber, work);
        split_owned(String::from_utf8(out.0.lock().unwrap().clone()).unwrap()).0
    }

    /// Each line without its timestamp (the two ran at different times), and the timestamps.
    fn split(lines: &str) -> (Vec<&str>, Vec<&str>) {
        lines
            .lines()
            .map(|l| {
                let at = l.find(' ').unwrap();
                (&l[at..], &l[..at])
            })
            .unzip()
    }

    #[test]
    fn lines_are_byte_for_byte_those_of_the_default_format() {
        let (plain, plain_times) = split_owned(captured(true, false));
        let (stock, stock_times) = split_owned(captured(false, false));
        assert_eq!(plain, stock);
        let text = plain.join("\n");
        assert!(
            text.contains("path=\"/v2/models/add_sub/infer\" model=\"add_sub\" version=\"\""),
            "{text}"
        );
        assert!(text.contains("peer=\"CN=client \\\"one\\\"\""), "{text}");
        assert!(text.contains("latency_ms=0.123456 tiny=1e-9"), "{text}");
        // The same shape of timestamp: 2026-12-02T13:36:56.646684Z
        for time in plain_times.iter().chain(&stock_times) {
            assert_eq!(time.len(), 27, "{time}");
            assert!(time.ends_with('Z') && time.as_bytes()[10] == b'T', "{time}");
        }
        // With colours on, the stock writers write the line.
        let (ansi_plain, _) = split_owned(captured(true, true));
        let (ansi_stock, _) = split_owned(captured(false, true));
        assert_eq!(ansi_plain, ansi_stock);
    }

    fn split_owned(lines: String) -> (Vec<String>, Vec<String>) {
        let (rest, times) = split(&lines);
        (
            rest.into_iter().map(str::to_owned).collect(),
            times.into_iter().map(str::to_owned).collect(),
        )
    }

    #[test]
    fn timestamps_are_those_of_the_system_time_timer() {
        let written = |since: std::time::Duration| {
            let mut text = String::new();
            write_time(&mut Writer::new(&mut text), since).unwrap();
            text
        };
        let at = |secs: u64, micros: u32| written(std::time::Duration::new(secs, micros * 1000));
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z ");
        assert_eq!(at(951_782_399, 999_999), "2000-02-28T23:59:59.999999Z ");
        assert_eq!(at(951_782_400, 7), "2000-02-29T00:00:00.000007Z ");
        assert_eq!(at(1_796_217_225, 1_261), "2026-12-02T13:13:45.001261Z ");
        assert_eq!(at(4_102_444_800, 0), "2100-01-01T00:00:00.000000Z ");
        // Against the stock timer, to the second (the two read the clock apart).
        use tracing_subscriber::fmt::time::FormatTime;
        loop {
            let before = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            let mut stock = String::new();
            tracing_subscriber::fmt::time::SystemTime
                .format_time(&mut Writer::new(&mut stock))
                .unwrap();
            let after = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            if before.as_secs() == after.as_secs() {
                assert_eq!(written(before)[..20], stock[..20]);
                break;
            }
        }
    }

    #[test]
    fn floats_near_one_are_written_as_debug_writes_them() {
        let mut x = 0.000_7_f64;
        while x < 1e16 {
            for v in [x, -x, x * 1.000_000_7, x / 3.0] {
                let mut text = String::new();
                {
                    let mut visitor = Visitor {
                        writer: Writer::new(&mut text),
                        empty: true,
                        result: Ok(()),
                    };
                    let field = tracing::field::FieldSet::new(
                        &["v"],
                        tracing::callsite::Identifier(&CALLSITE),
                    )
                    .field("v")
                    .unwrap();
                    visitor.record_f64(&field, v);
                }
                assert_eq!(text, format!("v={v:?}"));
            }
            x *= 1.37;
        }
    }

    /// The access-log line written straight (`write_line`) is the line `tracing` writes
    /// through `PlainLine` for the same event in the request's span, byte for byte after the
    /// timestamp; what needs the stock writers is declined.
    #[test]
    fn lines_written_straight_are_those_written_through_tracing() {
        let peer = "CN=client one";
        let through_tracing = plain_lines(|| {
            let span = tracing::info_span!("request", request_id = %"abc-1",
                    trace_id = %"0af7651916cd43dd8448eb211c80319c", peer = tracing::field::Empty);
            span.record("peer", peer);
            let _entered = span.enter();
            let method = http::Method::POST;
            tracing::info!(%method, path = "/v2/models/add_sub/infer", model = "add_sub",
                    version = "", status = 200u16, latency_ms = 1.234_5_f64, "request");
        });
        let scope = Scope {
            request_id: "abc-1",
            trace_id: "0af7651916cd43dd8448eb211c80319c",
            peer: Some(peer),
        };
        let fields = |path| {
            [
                (lead!(method), Value::Shown("POST")),
                (lead!(path), Value::Text(path)),
                (lead!(model), Value::Text("add_sub")),
                (lead!(version), Value::Text("")),
                (lead!(status), Value::Number(200)),
                (lead!(latency_ms), Value::Float(1.234_5)),
            ]
        };
        let mut straight = String::new();
        write_line(
            &mut straight,
            &Level::INFO,
            Some(&scope),
            "request",
            &fields("/v2/models/add_sub/infer"),
        )
        .unwrap();
        assert_eq!(split(&straight).0, through_tracing);
        assert!(straight.ends_with('\n') && straight.lines().count() == 1);
        let declined = |fields: &[(&str, Value<'_>)], peer| {
            let scope = Scope { peer, ..scope };
            write_line(
                &mut String::new(),
                &Level::INFO,
                Some(&scope),
                "request",
                fields,
            )
            .is_none()
        };
        assert!(declined(&fields("/v2/\"quoted\""), None));
        assert!(!declined(&fields("/v2/x"), Some("CN=\\")));
        assert!(declined(&[(lead!(latency_ms), Value::Float(1e-9))], None));
        assert!(!declined(&fields("/v2/x"), None));
    }

    struct Callsite;
    impl tracing::callsite::Callsite for Callsite {
        fn set_interest(&self, _: tracing::subscriber::Interest) {}
        fn metadata(&self) -> &tracing::Metadata<'_> {
            unreachable!()
        }
    }
    static CALLSITE: Callsite = Callsite;
}
