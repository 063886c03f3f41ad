//! The HTTP front-end's side of the pipeline (`pipeline::Wire`): a KServe v2 request as the
//! phases need it. An inference's body arrives whole before it takes a flow slot, kept in
//! the chunks it came in; they go on untouched where nothing must read them, so JSON and
//! the binary tensor extension work alike. A body in one chunk is held as its bytes
//! (`body::Payload`): validation reads them, and a second send takes a clone of them. The
//! request's head stays in the wire from arrival to answer, read and changed where it is
//! (each phase used to take the request out and put it back: a few hundred bytes moved
//! each time), and each send takes a copy of it.

use super::body::{self, Payload};
use super::validate;
use crate::body::Replay;
use crate::error::GatewayError;
use crate::model::{Ask, ModelRef};
use crate::pipeline::mirror;
use crate::pipeline::{Inspect, Local, RequestCtx, Sent, Wire, forward, sequence};
use crate::placement::SequenceRef;
use crate::routing::{Routed, Shadow};
use crate::upstream::{self, Backend};
use crate::validate::{Signature, Verdict};
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use http::header;
use http::request::Parts;
use http_body_util::BodyExt;
use std::sync::Arc;

/// An HTTP model request on its way through the pipeline.
pub(super) struct HttpWire {
    /// The URI the client sent (naming the route, for mirrors).
    client_uri: http::Uri,
    /// The request's head as it is to be sent (retargeted, its body's headers replaced).
    head: Parts,
    /// The body to send; taken by the first send (and by a refusal, which drops it unread).
    body: Option<Payload>,
    /// What a second send needs of the body (`crate::body::Replay`).
    again: Option<Replay>,
    /// The backend of the last send, to name in a failure.
    sent_to: Option<Arc<Backend>>,
    /// The body's size once an inference's body has arrived whole (`arrive`).
    arrived: usize,
    /// What the head's headers say about the body to send.
    sent: body::BodyHeaders,
}

impl HttpWire {
    pub(super) fn new(request: Request) -> Self {
        let (head, body) = request.into_parts();
        Self {
            client_uri: head.uri.clone(),
            sent: body::BodyHeaders::of(&head.headers),
            head,
            body: Some(Payload::Streaming(body)),
            again: None,
            sent_to: None,
            arrived: 0,
        }
    }

    /// Replaces the body to send with `body`, a JSON body written by the gateway (the OpenAI
    /// wire's generate body), its length declared.
    pub(super) fn replace_body(&mut self, body: bytes::Bytes) {
        if self.body.is_some() {
            let headers = &mut self.head.headers;
            headers.insert(header::CONTENT_LENGTH, http::HeaderValue::from(body.len()));
            headers.insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            headers.remove(header::CONTENT_ENCODING);
            self.sent.declared = Some(body.len() as u64);
            self.sent.encoding = None;
            self.body = Some(Payload::Whole(body));
        }
    }

    /// Whether the last send kept what a second one needs (its whole body).
    fn replayable(&self) -> bool {
        self.again.as_ref().is_some_and(Replay::ready)
    }

    /// The body, taken to read or to send (a second taker has none: it was sent).
    fn take_body(&mut self) -> Result<Payload, GatewayError> {
        self.body.take().ok_or_else(already_sent)
    }

    /// A copy of the head for one send or a mirror's: method, URI, version and headers (the
    /// extensions the listener and hyper put on the client's request are for this side only).
    fn head_to_send(&self) -> Parts {
        let mut head = http::Request::new(());
        *head.method_mut() = self.head.method.clone();
        *head.uri_mut() = self.head.uri.clone();
        *head.version_mut() = self.head.version;
        *head.headers_mut() = self.head.headers.clone();
        head.into_parts().0
    }
}

impl Inspect for HttpWire {
    /// Reads the body (`validate::read`) and keeps the request to forward; a refused
    /// request is dropped here, its body unread, as nothing will send it.
    async fn read(
        &mut self,
        ctx: &RequestCtx,
        model: &ModelRef,
        signature: &Signature,
    ) -> Result<Verdict, GatewayError> {
        let body = self.take_body()?;
        let (body, verdict) =
            validate::read(ctx, model, signature, (&self.head, &self.sent), body).await?;
        if !matches!(verdict, Verdict::Refused(_)) {
            self.body = Some(body);
        }
        Ok(verdict)
    }

    /// The body is read whole (it usually already is, after validation: then this costs no
    /// copy) and handed back for the client's own request.
    async fn mirror(&mut self, ctx: &RequestCtx, shadow: Shadow) -> Result<(), GatewayError> {
        let limit = ctx.gateway.fixed_config().server.max_body_size.bytes();
        let bytes = self.take_body()?.collect(limit, None).await?;
        let (head, uri) = (self.head_to_send(), self.client_uri.clone());
        let copy = bytes.clone();
        mirror::spawn(&ctx.gateway, shadow, move |backend, target| {
            // The mirror's target is named from the client's path, as the route was.
            let mut head = head.clone();
            head.uri = target_uri(&uri, &target);
            let request = Request::from_parts(head, Body::from(copy.clone()));
            async move {
                let response = upstream::forward(&backend, request)
                    .await
                    .map_err(|e| e.to_string())?;
                let status = response.status();
                let _ = response.into_body().collect().await;
                if status.is_server_error() {
                    return Err(format!("answered {status}"));
                }
                Ok(())
            }
        });
        self.body = Some(Payload::Whole(bytes));
        Ok(())
    }
}

impl Wire for HttpWire {
    type Answer = Response;

    fn header(&self, name: &http::HeaderName) -> Option<&[u8]> {
        self.head.headers.get(name).map(|v| v.as_bytes())
    }

    /// The size of the body, which has arrived whole (`arrive`) and is in memory while the
    /// request waits.
    fn body_len(&self) -> usize {
        self.arrived
    }

    fn retarget(&mut self, routed: &Routed) {
        if routed.route.is_some() {
            self.head.uri = target_uri(&self.head.uri, &routed.target);
        }
    }

    /// Applies the body limit, and has an inference's body whole (`body::arrive`: read
    /// within the connection's read timeouts, kept as it came), so that the flow phase next
    /// gives a slot only to a request that can use it at once. For a model that may have
    /// sequence batching (`Placement::may_hold_sequences`) it then reads the sequence the
    /// request belongs to: from the whole body for JSON, from the JSON header alone for the
    /// binary extension. The bytes read are handed on as the body, so validation reads them
    /// again without another copy. A compressed body's sequence is not read (not followed).
    async fn arrive(&mut self, ctx: &RequestCtx) -> Result<Option<SequenceRef>, GatewayError> {
        let limit = ctx.gateway.fixed_config().server.max_body_size.bytes();
        let body = self.take_body()?.into_body();
        let body = body::limit((self.sent.declared, self.head.version), body, limit)?;
        if ctx.ask != Ask::Inference {
            self.body = Some(Payload::Streaming(body));
            return Ok(None);
        }
        let (whole, arrived) = body::arrive(body, limit).await?;
        self.arrived = arrived;
        let model = &ctx.routed.as_ref().expect("routed").target.name;
        if self.sent.compressed() || !ctx.gateway.placement().may_hold_sequences(model) {
            self.body = Some(whole);
            return Ok(None);
        }
        let header_length =
            (self.sent.header_length.as_ref()).and_then(|v| validate::header_length(v.as_bytes()));
        let declared = self.sent.declared;
        let (whole, sequence) = match (header_length, whole) {
            // Raw binary: the whole body is one tensor, no JSON.
            (Some(0), whole) => (whole, None),
            (Some(length), Payload::Streaming(whole)) => {
                let (head, rest) = body::read_head(whole, length, limit).await?;
                let sequence = sequence::from_json(json_part(&head, Some(length)));
                (Payload::Streaming(body::stream_on(head, rest)), sequence)
            }
            (length, whole) => {
                let bytes = whole.collect(limit, declared).await?;
                let sequence = sequence::from_json(json_part(&bytes, length));
                (Payload::Whole(bytes), sequence)
            }
        };
        self.body = Some(whole);
        Ok(sequence)
    }

    async fn send(
        &mut self,
        _ctx: &RequestCtx,
        backend: &Arc<Backend>,
    ) -> Result<Response, GatewayError> {
        self.sent_to = Some(backend.clone());
        let body = match (self.body.take(), self.again.take()) {
            (Some(body), _) => {
                let (body, replay) = match body {
                    Payload::Whole(bytes) => (Body::from(bytes.clone()), Replay::whole(bytes)),
                    Payload::Streaming(body) => crate::body::replayable(body),
                };
                self.again = Some(replay);
                body
            }
            (None, Some(replay)) => {
                // A body had whole may go once more after this send (a resend on a new
                // connection, then a copy placed again when that one is refused too).
                self.again = replay.whole_again();
                replay.take().unwrap_or_default()
            }
            (None, None) => return Err(already_sent()),
        };
        upstream::forward(backend, Request::from_parts(self.head_to_send(), body)).await
    }

    /// Reads the body of a 404, 500 or 503 (an error answer is small), and sees whether it
    /// is Triton's refusal of a model it no longer has, with the body kept to send again,
    /// or its python backend's stalled stub (`forward::stub_stalled`); a connection closed
    /// before any answer may go again too, when the body was kept.
    async fn gone(&mut self, answer: Result<Response, GatewayError>) -> Sent<Response> {
        let response = match answer {
            Ok(response) if may_be_gone(response.status()) => response,
            Err(closed @ GatewayError::UpstreamClosed { .. }) if self.replayable() => {
                return Sent::Resend(closed);
            }
            answer => return Sent::Answer(answer),
        };
        let (parts, answer_body) = response.into_parts();
        let bytes = match http_body_util::Limited::new(answer_body, 64 << 10)
            .collect()
            .await
        {
            Ok(collected) => collected.to_bytes(),
            Err(error) => {
                return Sent::Answer(Err(GatewayError::UpstreamFailed {
                    backend: self
                        .sent_to
                        .as_ref()
                        .map_or_else(String::new, |b| b.name.clone()),
                    reason: format!("reading the error answer: {error}"),
                }));
            }
        };
        let error = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
        let message = error.as_ref().and_then(|v| v.get("error")?.as_str());
        match message {
            Some(gone) if forward::copy_is_gone(gone) && self.replayable() => Sent::Again,
            Some(stalled) if forward::stub_stalled(stalled) => Sent::Stalled(stalled.to_owned()),
            _ => {
                self.again = None;
                Sent::Answer(Ok(Response::from_parts(parts, Body::from(bytes))))
            }
        }
    }

    fn may_send_again(&self) -> bool {
        self.replayable()
    }

    fn failed(answer: &Response) -> bool {
        answer.status().is_server_error()
    }

    fn streams(&self, answer: &Response) -> bool {
        answer.status().is_success() && self.client_uri.path().ends_with("/generate_stream")
    }

    /// Triton's answers: readiness is a 200 with no body, metadata and config its JSON.
    fn local(&mut self, answer: Local) -> Result<Response, GatewayError> {
        Ok(match answer {
            Local::Ready => Response::new(Body::empty()),
            Local::Described(json) => {
                let mut response = Response::new(Body::from(json));
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    http::HeaderValue::from_static("application/json"),
                );
                response
            }
        })
    }
}

/// A second take of a body that was sent (or dropped with its refusal).
fn already_sent() -> GatewayError {
    GatewayError::BadRequest("request already sent".into())
}

/// Whether an HTTP answer of this status may be Triton's refusal of a model it has not, or
/// its python backend's stalled stub (then its body is read).
fn may_be_gone(status: http::StatusCode) -> bool {
    matches!(
        status,
        http::StatusCode::NOT_FOUND
            | http::StatusCode::INTERNAL_SERVER_ERROR
            | http::StatusCode::SERVICE_UNAVAILABLE
    )
}

/// `/v2/models/{route}{rest}` becomes `/v2/models/{target}[/versions/{v}]{rest}`. An
/// inference's (`.../infer`, no query), the path of nearly every routed request, comes from
/// `INFER_URIS` after its first time on a thread.
pub(super) fn target_uri(uri: &http::Uri, target: &ModelRef) -> http::Uri {
    let path = uri.path();
    let after_model = path
        .strip_prefix("/v2/models/")
        .map_or("", |tail| tail.find('/').map_or("", |i| &tail[i..]));
    let query = uri.query();
    if after_model == "/infer" && query.is_none() {
        return INFER_URIS.with_borrow_mut(|recent| {
            recent.get(target, || built_uri(target, after_model, None, uri))
        });
    }
    built_uri(target, after_model, query, uri)
}

fn built_uri(target: &ModelRef, tail: &str, query: Option<&str>, sent: &http::Uri) -> http::Uri {
    let mut rewritten = upstream::model_path(&target.name, target.version.as_deref(), tail);
    if let Some(query) = query {
        rewritten.push('?');
        rewritten.push_str(query);
    }
    // From the string's own buffer: parsing a `&str` would copy it first.
    http::Uri::from_maybe_shared(bytes::Bytes::from(rewritten)).unwrap_or_else(|_| sent.clone())
}

thread_local! {
    /// The inference URIs of the last two targets retargeted to on this thread: a 90/10
    /// route's two, a canary's old and new. Building and parsing one cost about 1,100
    /// instructions, 2% of an everything-on request (`loadtest/instructions.sh`); a clone
    /// shares its bytes. A path is a function of its target alone, so nothing goes stale.
    static INFER_URIS: std::cell::RefCell<RecentUris> = const {
        std::cell::RefCell::new(RecentUris([None, None]))
    };
}

/// The two most recently used targets' URIs, the latest first.
struct RecentUris([Option<(ModelRef, http::Uri)>; 2]);

impl RecentUris {
    /// `target`'s URI, kept or `build` now (then kept in place of the older one).
    fn get(&mut self, target: &ModelRef, build: impl FnOnce() -> http::Uri) -> http::Uri {
        let at = self
            .0
            .iter()
            .position(|kept| kept.as_ref().is_some_and(|(t, _)| t == target));
        match at {
            Some(0) => {}
            Some(_) => self.0.swap(0, 1),
            None => {
                self.0.swap(0, 1);
                self.0[0] = Some((target.clone(), build()));
            }
        }
        self.0[0]
            .as_ref()
            .map(|(_, uri)| uri.clone())
            .expect("kept above")
    }
}

/// The JSON of a body read from its start: its first `header_length` bytes (the binary
/// extension's JSON header), or all of it.
fn json_part(body: &[u8], header_length: Option<usize>) -> &[u8] {
    header_length.map_or(body, |n| &body[..n.min(body.len())])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(text: &str) -> http::Uri {
        text.parse().unwrap()
    }

    /// A route's name in the path becomes its target's, with the version, the rest of the
    /// path and the query kept; an inference's is the same whether built or kept, for each
    /// of the targets in turn, and more targets than are kept.
    #[test]
    fn a_routed_path_names_the_target_built_or_kept() {
        let (a, b) = (
            ModelRef::new("m_a", None),
            ModelRef::new("m_b", Some("2".into())),
        );
        let c = ModelRef::new("m c", None);
        for _ in 0..3 {
            for (target, want) in [
                (&a, "/v2/models/m_a/infer"),
                (&b, "/v2/models/m_b/versions/2/infer"),
                (&a, "/v2/models/m_a/infer"),
                (&c, "/v2/models/m%20c/infer"),
                (&b, "/v2/models/m_b/versions/2/infer"),
            ] {
                assert_eq!(target_uri(&uri("/v2/models/route/infer"), target), want);
            }
        }
        let with_query = target_uri(&uri("/v2/models/route/infer?x=1"), &a);
        assert_eq!(with_query, "/v2/models/m_a/infer?x=1");
        let ready = target_uri(&uri("/v2/models/route/ready"), &b);
        assert_eq!(ready, "/v2/models/m_b/versions/2/ready");
        assert_eq!(target_uri(&uri("/v2/models/route"), &a), "/v2/models/m_a");
    }
}
