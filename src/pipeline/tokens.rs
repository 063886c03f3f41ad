//! The clock of a streamed answer's tokens (Triton's `generate_stream`, and the OpenAI
//! endpoints, which call it): time to first token and time per output token, recorded per
//! target (`infergate_time_to_first_token_seconds`, `..._time_per_output_token_seconds`),
//! and, for a route whose guard times first tokens (`guard.latency = "first_token"`), the
//! guard's count of the answer, made when its first event comes rather than at its headers
//! (a stream's headers come at once, however slow the model). Each backend event counts as
//! one token: the backends this is for (TensorRT-LLM, vLLM) send one per event.

use super::RequestCtx;
use crate::routing::Tally;
use crate::telemetry;
use std::time::Instant;

/// Times one streamed answer; its front-end calls `event` for each backend event as it
/// passes, and drops it when the stream ends or the client leaves.
pub struct TokenClock {
    placed: Instant,
    first: Option<Instant>,
    last: Instant,
    events: u64,
    first_token: metrics::Histogram,
    per_token: metrics::Histogram,
    /// The guard's count, left to the first event (`finish::settle_answer`).
    tally: Option<Tally>,
}

/// The clock of the answer `ctx` is about to stream: it counts from the copy's placement,
/// and takes the guard's count when the answer left it to the first token.
pub fn clock(ctx: &mut RequestCtx) -> TokenClock {
    let served = ctx.served();
    let labels = [
        ("model", served.model),
        ("version", served.version.unwrap_or_default()),
        (
            "route",
            served.route.map(|r| r.to_string()).unwrap_or_default(),
        ),
    ];
    let now = Instant::now();
    let placed = ctx.placed.map_or(now, tokio::time::Instant::into_std);
    TokenClock {
        placed,
        first: None,
        last: placed,
        events: 0,
        first_token: metrics::histogram!(telemetry::TIME_TO_FIRST_TOKEN, &labels),
        per_token: metrics::histogram!(telemetry::TIME_PER_OUTPUT_TOKEN, &labels),
        tally: ctx.routed.as_mut().and_then(|r| r.tally.take()),
    }
}

impl TokenClock {
    /// `n` events of the backend's stream arrived now.
    pub fn events(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        let now = Instant::now();
        if self.first.is_none() {
            self.first = Some(now);
            self.first_token
                .record(now.duration_since(self.placed).as_secs_f64());
            if let Some(tally) = self.tally.take() {
                tally.finish(false);
            }
        }
        self.events += n;
        self.last = now;
    }
}

impl Drop for TokenClock {
    /// The stream ended (or its client left): its time per token, over the events after the
    /// first; a stream that sent nothing is counted by the guard at its end.
    fn drop(&mut self) {
        if let Some(tally) = self.tally.take() {
            tally.finish(false);
        }
        if let Some(first) = self.first
            && self.events >= 2
        {
            let per = self.last.duration_since(first).as_secs_f64() / (self.events - 1) as f64;
            self.per_token.record(per);
        }
    }
}
