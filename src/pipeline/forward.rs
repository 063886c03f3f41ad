//! `forward`: the request goes to the copy placed for it, in the front-end's wire format
//! (`Wire`), and comes back once more when the copy had gone.
//!
//! Between placement and the backend's answer the copy may have left the backend: unloaded
//! behind the gateway's back, lost in a restart, or a race the books lost. Triton refuses such
//! a request before doing any work, with `Request for unknown model: 'm' has no available
//! versions` (or `is not found`, `... is not at ready state`): HTTP 404 or 503, gRPC
//! NOT_FOUND or UNAVAILABLE. A backend whose host refuses the connection has no copy either:
//! nothing listens there (the Triton died or is restarting, and its copies went with it).
//! Either way nothing ran, so the request may be sent again: the copy comes off the books,
//! the request is placed again and sent once more, as nginx's `proxy_next_upstream error`
//! passes a refused request to the next server. Only once: a second refusal is the answer.
//! Triton's python backend giving up on a copy's stalled stub (HTTP 500, gRPC INTERNAL) is
//! answered here for both wires too, as a 503 to retry (`Sent::Stalled`).

use super::{RequestCtx, place};
use crate::error::GatewayError;
use crate::model::ModelRef;
use crate::placement::SequenceRef;
use crate::routing::{Routed, Shadow};
use crate::upstream::Backend;
use crate::validate::{Signature, Verdict};
use std::sync::Arc;

/// What the phases after placement read of an inference in its wire format: a call's
/// `Wire`, or one message of a stream (`inspect` runs them for both).
pub(crate) trait Inspect {
    /// The validate phase's reader: reads the request in this wire's format and checks it
    /// against `signature`, the signature of `model` on the copy it was placed on. The
    /// phase (`validate`) decides whether to ask, and refuses and counts what this refuses.
    async fn read(
        &mut self,
        ctx: &RequestCtx,
        model: &ModelRef,
        signature: &Signature,
    ) -> Result<Verdict, GatewayError>;

    /// Sends copies of the request to the route's mirrors (shadow traffic).
    async fn mirror(&mut self, ctx: &RequestCtx, shadow: Shadow) -> Result<(), GatewayError>;
}

/// What a front-end does for the phases that touch its wire format. Everything else (the
/// order of the phases, the guard, the replay rule) is the pipeline's.
pub(crate) trait Wire: Inspect {
    /// The backend's answer, in the front-end's form.
    type Answer;

    /// A request header (HTTP) or metadata entry (gRPC): sticky keys and the pin.
    fn header(&self, name: &http::HeaderName) -> Option<&[u8]>;

    /// Names the route's target instead of the route (the URL path, or the message).
    fn retarget(&mut self, routed: &Routed);

    /// The request body's size, in memory once it has arrived (flow control's byte bound
    /// on waiting requests; asked only of a request that must wait).
    fn body_len(&self) -> usize;

    /// Has the request whole before the flow phase gives it a slot, so that a client slow
    /// to send it holds none (HTTP reads an inference's body within the body limit and the
    /// connection's read timeouts; a gRPC message arrives whole), and reads the sequence it
    /// belongs to, which placement needs (HTTP from the body, gRPC from the message's
    /// parameters).
    async fn arrive(&mut self, ctx: &RequestCtx) -> Result<Option<SequenceRef>, GatewayError>;

    /// Sends the request to `backend`, keeping what a second send needs.
    async fn send(
        &mut self,
        ctx: &RequestCtx,
        backend: &Arc<Backend>,
    ) -> Result<Self::Answer, GatewayError>;

    /// Whether this answer is the backend's refusal of a copy that has gone, or a
    /// connection it closed before answering, with the request ready to be sent again, or
    /// Triton's word that the copy's stub stalled (`stub_stalled`); otherwise the answer, as
    /// the client is to get it. (A refused connection is the pipeline's to tell: `send`.)
    async fn gone(&mut self, answer: Result<Self::Answer, GatewayError>) -> Sent<Self::Answer>;

    /// Whether the last send kept what another needs (gRPC keeps its message; HTTP its
    /// head and a body it had whole).
    fn may_send_again(&self) -> bool {
        true
    }

    /// Whether an answer counts as a failure of the target for the route's guard (a 5xx).
    fn failed(answer: &Self::Answer) -> bool;

    /// Whether this answer is a stream of tokens (a successful `generate_stream`), which
    /// the front-end times with a `tokens::TokenClock` as it passes.
    fn streams(&self, _answer: &Self::Answer) -> bool {
        false
    }

    /// The gateway's own answer about a servable model loaded nowhere (`place::Local`), in
    /// this wire's encoding.
    fn local(&mut self, answer: place::Local) -> Result<Self::Answer, GatewayError>;

    /// The answer when no copy could be placed: the failure, unless the wire answers it
    /// otherwise (gRPC's `ModelReady` answers `ready: false`, as Triton does).
    fn unplaced(&mut self, error: GatewayError) -> Result<Self::Answer, GatewayError> {
        Err(error)
    }
}

/// The copy a request was placed on: its backend, and the model it serves there.
#[derive(Clone, Copy)]
pub struct Placed<'a> {
    /// The backend that holds the copy.
    pub backend: &'a Arc<Backend>,
    /// The model (the route's target) as placed.
    pub model: &'a ModelRef,
}

/// What became of one send.
pub enum Sent<A> {
    /// The answer for the client.
    Answer(Result<A, GatewayError>),
    /// The copy had gone (or its backend refused the connection) and the request may go
    /// again, placed anew.
    Again,
    /// The backend closed the connection before answering (`UpstreamClosed`, the error
    /// kept): the request may go to the same copy again, on a new connection.
    Resend(GatewayError),
    /// Triton's python backend gave up on the copy's stub (`stub_stalled`; its words): a
    /// 503 to retry, not the model's 500. Not sent again: the request may have run, and
    /// that copy's next answer is not to be trusted (this Triton was seen to answer it with
    /// an output left out, then abort).
    Stalled(String),
}

/// Whether a backend's error message says it has no such model ready. Triton's own words;
/// a message from the model itself never starts a lookup error like this.
pub fn copy_is_gone(message: &str) -> bool {
    message.contains("Request for unknown model")
}

/// Whether a backend's error message is Triton's python backend giving up on a model
/// instance's stub process that did not answer within a second (stalled, or starved of
/// CPU): the backend's passing trouble, not the model's answer (`Sent::Stalled`).
pub fn stub_stalled(message: &str) -> bool {
    message.contains("Stub process") && message.contains("is not healthy")
}

/// Whether a send failed because the backend's host turned the connection away (refused,
/// or reset it as it was made): the request never reached it, and the copy the books had
/// there is gone with the process, or out of reach until a health check reads it again.
fn nothing_listens(error: &GatewayError) -> bool {
    matches!(
        error,
        GatewayError::UpstreamUnreachable { refused: true, .. }
    )
}

/// The forward phase: sends to the leased copy; once more to a copy placed again when that
/// one had gone, or to the same copy when its backend closed the connection before
/// answering (nothing came back; a request of a sequence is not sent twice, as its state
/// may have moved). A resend that finds the copy gone is placed again too.
pub(crate) async fn forward<W: Wire>(
    ctx: &mut RequestCtx,
    wire: &mut W,
) -> Result<W::Answer, GatewayError> {
    let backend = ctx.lease()?.backend().clone();
    let mut sent = send(ctx, wire, &backend).await;
    if let Sent::Resend(closed) = sent {
        if ctx.sequence.is_some() {
            return Err(closed);
        }
        sent = send(ctx, wire, &backend).await;
    }
    match sent {
        Sent::Answer(answer) => answer,
        Sent::Resend(closed) => Err(closed),
        Sent::Stalled(reason) => Err(GatewayError::UpstreamStalled {
            backend: backend.name.clone(),
            reason,
        }),
        Sent::Again => match place::again(ctx).await? {
            place::Placing::Leased => {
                let backend = ctx.lease()?.backend().clone();
                wire.send(ctx, &backend).await
            }
            place::Placing::Answered(local) => wire.local(local),
        },
    }
}

/// One send to `backend`, and what became of it: a refused connection, for either wire, is
/// a copy gone; the wire reads the rest (`Wire::gone`).
async fn send<W: Wire>(ctx: &RequestCtx, wire: &mut W, backend: &Arc<Backend>) -> Sent<W::Answer> {
    match wire.send(ctx, backend).await {
        Err(refused) if nothing_listens(&refused) && wire.may_send_again() => Sent::Again,
        answer => wire.gone(answer).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tritons_lookup_refusals() {
        for gone in [
            "Request for unknown model: 'fat_1' has no available versions",
            "Request for unknown model: 'm' is not found",
            "[request id: 7] Request for unknown model: 'm' version 2 is not at ready state",
        ] {
            assert!(copy_is_gone(gone), "{gone}");
        }
        assert!(!copy_is_gone(
            "unexpected shape for input 'INPUT0' for model 'm'"
        ));
    }

    #[test]
    fn reads_the_python_backends_stub_failure() {
        for stalled in [
            "Stub process 'sized_c_0_0' is not healthy.",
            "[request id: 7] Stub process is not healthy.",
        ] {
            assert!(stub_stalled(stalled), "{stalled}");
            assert!(!copy_is_gone(stalled), "{stalled}");
        }
        assert!(!stub_stalled("Failed to open the cudaIpcHandle"));
    }
}
