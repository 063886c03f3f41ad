//! The scope of a request's log lines: its id, its trace id and its peer, before every line
//! logged while the request is served.
//!
//! Through `tracing` that scope is a span, and a span costs a slab slot, its fields formatted
//! into a string, and a registry update each time a task enters and leaves it: about a twelfth
//! of the gateway's instructions per request (`loadtest/instructions.sh`). The plain text log
//! (`telemetry::init_logging`), the default, needs none of that: the scope's fields ride in a
//! task-local while the request's futures are polled (`log_text::in_scope`), and `log_text`
//! writes them, byte for byte what the span wrote. Every other format (JSON, colours, a
//! `RUST_LOG` directive on span values) keeps the real span, which it reads.

use crate::log_text::{self, ScopeFields};
use crate::trace::TraceHex;
use http::HeaderValue;
use std::sync::Arc;
use tracing::{Instrument, Span};

/// A request's log scope: a span, or its fields alone (see the module's doc). Cheap to clone,
/// for the tasks the request spawns.
#[derive(Clone)]
pub struct LogScope {
    span: Span,
    fields: Option<Arc<ScopeFields>>,
}

impl LogScope {
    /// The scope of a request with this id, trace id and verified peer: a span unless the
    /// process logs in the plain text format. No scope at all when its span would be off
    /// (`RUST_LOG` above info for the gateway), as a disabled span shows nothing.
    pub fn new(id: &HeaderValue, trace_id: TraceHex, peer: Option<&Arc<str>>) -> Self {
        if !super::plain_text() {
            return Self {
                span: request_span(id, &trace_id, peer.map(|p| &**p)),
                fields: None,
            };
        }
        let fields = tracing::span_enabled!(tracing::Level::INFO).then(|| {
            Arc::new(ScopeFields {
                request_id: id.clone(),
                trace_id,
                peer: peer.cloned(),
            })
        });
        Self {
            span: Span::none(),
            fields,
        }
    }

    /// The fields the text log writes before a line, when it writes them itself.
    pub fn fields(&self) -> Option<&ScopeFields> {
        self.fields.as_deref()
    }

    /// `work`, polled inside this scope.
    pub fn wrap<F: Future>(&self, work: F) -> impl Future<Output = F::Output> + use<F> {
        log_text::in_scope(self.fields.clone(), work.instrument(self.span.clone()))
    }

    /// Runs `work` inside this scope, for what is logged outside the request's futures.
    pub fn run<T>(&self, work: impl FnOnce() -> T) -> T {
        let _entered = self.span.enter();
        log_text::sync_in_scope(self.fields.clone(), work)
    }
}

/// The span every log line of a request carries: its id, its trace id, and the verified
/// client certificate's subject (mTLS), so every line, the access-log line included, names
/// the peer.
fn request_span(id: &HeaderValue, trace_id: &TraceHex, peer: Option<&str>) -> Span {
    let span = tracing::info_span!(
        "request",
        request_id = %id.to_str().unwrap_or_default(),
        trace_id = %trace_id.as_str(),
        peer = tracing::field::Empty
    );
    if let Some(peer) = peer {
        span.record("peer", peer);
    }
    span
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log_text::tests::plain_lines;
    use crate::trace::RequestTrace;

    /// The lines a request logs, inside its scope, from its futures and outside them.
    fn log_in(scope: &LogScope) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(scope.wrap(async {
            tracing::info!(model = "add_sub", "placed");
            tokio::task::yield_now().await;
            tracing::warn!(status = 503u16, "request failed");
        }));
        scope.run(|| tracing::info!(latency_ms = 1.5_f64, "request"));
        tracing::info!("outside");
    }

    /// In the plain text format a request's scope is no span, yet every line logged in it
    /// shows it as the span did, byte for byte, whatever its peer needs quoted.
    #[test]
    fn a_plain_scope_writes_what_the_span_wrote() {
        for peer in [None, Some("CN=client one"), Some("CN=client \"one\"\\")] {
            let id = HeaderValue::from_static("abc-1");
            let hex = RequestTrace::start(None, true).trace_id_hex();
            let peer: Option<Arc<str>> = peer.map(Arc::from);
            let spanned = plain_lines(|| {
                let scope = LogScope {
                    span: request_span(&id, &hex, peer.as_deref()),
                    fields: None,
                };
                log_in(&scope);
            });
            let plain = plain_lines(|| {
                let fields = ScopeFields {
                    request_id: id.clone(),
                    trace_id: hex,
                    peer: peer.clone(),
                };
                let scope = LogScope {
                    span: Span::none(),
                    fields: Some(Arc::new(fields)),
                };
                log_in(&scope);
            });
            assert_eq!(plain, spanned);
            assert_eq!(plain.len(), 4, "{plain:?}");
            let expected = format!("INFO request{{request_id=abc-1 trace_id={}}}", hex.as_str());
            let scoped = format!("INFO request{{request_id=abc-1 trace_id={}", hex.as_str());
            assert!(plain[0].trim_start().starts_with(&scoped), "{plain:?}");
            assert_eq!(peer.is_none(), plain[0].contains(&expected), "{plain:?}");
            assert_eq!(plain[3].trim_start(), "INFO outside");
        }
    }
}
