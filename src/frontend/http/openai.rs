//! The OpenAI endpoints on the KServe HTTP listener (`/v1/models`, `/v1/chat/completions`,
//! `/v1/completions`). A thin wire over the generate extension: the request is decoded
//! (`openai::request`) into a `generate_stream` request for the model it names, which walks
//! the one pipeline as any generate request does (`OpenAiWire` is `HttpWire` with its body
//! rendered once the route's target is known), and the backend's events are encoded back
//! as OpenAI's answer or chunks (`openai::answer`) as they arrive. Failures are written in
//! OpenAI's error shape (`error_response`).

use super::body::{self, LeasedBody};
use super::wire::HttpWire;
use crate::auth::limits::Reservation;
use crate::error::GatewayError;
use crate::model::{Ask, ModelRef};
use crate::openai::answer::{Answering, Event, Events, Tally};
use crate::openai::{self, Call, Kind, ModelText};
use crate::pipeline::{self, Inspect, Local, RequestCtx, Sent, Wire};
use crate::placement::SequenceRef;
use crate::routing::{Routed, Shadow};
use crate::upstream::{self, Backend};
use crate::validate::{Signature, Verdict};
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt as _;
use http::{HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use std::sync::Arc;

/// One OpenAI endpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Endpoint {
    /// `GET /v1/models`.
    Models,
    /// `POST /v1/chat/completions` or `POST /v1/completions`.
    Generate(Kind),
}

/// The OpenAI endpoint of `method path`, when the path is under `/v1/` (else `None`: a
/// KServe path); a path or method it does not serve is its error.
pub(super) fn endpoint(method: &Method, path: &str) -> Option<Result<Endpoint, GatewayError>> {
    let rest = path.strip_prefix("/v1/")?;
    let (endpoint, expected) = match rest {
        "models" => (Endpoint::Models, Method::GET),
        "chat/completions" => (Endpoint::Generate(Kind::Chat), Method::POST),
        "completions" => (Endpoint::Generate(Kind::Completion), Method::POST),
        _ => {
            return Some(Err(GatewayError::NotFound {
                path: path.to_owned(),
            }));
        }
    };
    Some(super::allow(method, &expected, path).map(|()| endpoint))
}

/// A failure the gateway answers itself on an OpenAI endpoint: OpenAI's error shape, with
/// the headers any failure carries (`super::error_response`).
pub(super) fn error_response(error: GatewayError) -> Response {
    let body = serde_json::to_vec(&openai::error::of(&error)).expect("JSON serializes");
    super::error_response(&error, Bytes::from(body))
}

/// The endpoint's answer.
pub(super) async fn answer(
    ctx: &mut RequestCtx,
    endpoint: Endpoint,
    request: Request,
) -> Result<Response, GatewayError> {
    match endpoint {
        Endpoint::Models => Ok(models(ctx).await),
        Endpoint::Generate(kind) => generate(ctx, kind, request).await,
    }
}

/// The models this caller may name: every route, every `[[models]]` entry, and every model
/// in the pool's repositories (any of which is placed on its first request) that its
/// tenant's allow list admits.
async fn models(ctx: &RequestCtx) -> Response {
    let config = &ctx.live.config;
    let mut names: std::collections::BTreeSet<String> = config
        .routes
        .iter()
        .map(|r| r.model.clone())
        .chain(config.models.iter().map(|m| m.name.clone()))
        .collect();
    let index = crate::services::repository::IndexRequest::Ready(false);
    if let Ok(rows) = crate::services::repository::index(&ctx.gateway, &index).await {
        names.extend(rows.into_iter().map(|row| row.name));
    }
    let data: Vec<serde_json::Value> = names
        .into_iter()
        .filter(|name| ctx.live.auth.may_use(&ctx.caller, name))
        .map(|id| serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "infergate"}))
        .collect();
    json(
        StatusCode::OK,
        &serde_json::json!({"object": "list", "data": data}),
    )
}

/// A chat or a completion: decoded, served by the pipeline as a `generate_stream` request
/// for the model it names, and answered in OpenAI's format. The answer's body holds the
/// lease and the tenant's admission until it has gone, as a KServe answer does.
async fn generate(
    ctx: &mut RequestCtx,
    kind: Kind,
    request: Request,
) -> Result<Response, GatewayError> {
    let limit = ctx.gateway.fixed_config().server.max_body_size.bytes();
    let (parts, bytes) = body::read_whole(request, limit).await?;
    let mut headers = parts.headers;
    let call = openai::request::decode(kind, &bytes)?;
    ctx.about(ModelRef::new(call.model.clone(), None), Ask::Inference);
    for hop in [
        header::CONTENT_LENGTH,
        header::ACCEPT_ENCODING,
        header::ACCEPT,
    ] {
        headers.remove(hop);
    }
    let mut backend = Request::new(Body::empty());
    *backend.method_mut() = Method::POST;
    *backend.uri_mut() = upstream::model_path(&call.model, None, "/generate_stream")
        .parse()
        .map_err(|_| GatewayError::BadRequest(format!("malformed model name {:?}", call.model)))?;
    *backend.headers_mut() = headers;
    let mut wire = OpenAiWire {
        http: HttpWire::new(backend),
        call,
        text: None,
        prompt_tokens: None,
        reservation: None,
    };
    let response = pipeline::serve(ctx, &mut wire).await?;
    let response = super::timed(ctx, &wire, response);
    let tally = Tally {
        tenant: ctx.tenant().map(|t| t.to_string()).unwrap_or_default(),
        model: ctx.served().model,
        reservation: wire.reservation.take(),
    };
    let response = encode(response, wire, tally).await;
    Ok(LeasedBody::hold(response, ctx))
}

/// The backend's answer in OpenAI's format: its failure as an OpenAI error with the
/// backend's status, else the completion, or its chunks as the events arrive.
async fn encode(response: Response, wire: OpenAiWire, tally: Tally) -> Response {
    let (parts, backend_body) = response.into_parts();
    if !parts.status.is_success() {
        let bytes = backend_body
            .collect()
            .await
            .map(http_body_util::Collected::to_bytes)
            .unwrap_or_default();
        let message = GatewayError::from_backend_http(parts.status, &bytes).to_string();
        return json(
            parts.status,
            &openai::error::body(parts.status, &message, None, "backend"),
        );
    }
    let text = wire.text.unwrap_or_else(|| Arc::new(ModelText::none()));
    let mut answering = Answering::new(&wire.call, text, wire.prompt_tokens, tally);
    if wire.call.stream {
        let mut response = Response::new(stream(backend_body, answering));
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return response;
    }
    let mut events = Events::default();
    let mut all = Vec::new();
    let mut data = backend_body.into_data_stream();
    while let Some(chunk) = data.next().await {
        match chunk {
            Ok(bytes) => all.extend(events.push(&bytes)),
            Err(error) => all.push(Event::Error(format!(
                "reading the backend's answer: {error}"
            ))),
        }
    }
    all.extend(events.end());
    match answering.whole(all) {
        Ok(answer) => json(StatusCode::OK, &answer),
        Err(message) => {
            let status = StatusCode::INTERNAL_SERVER_ERROR;
            json(
                status,
                &openai::error::body(status, &message, None, "backend"),
            )
        }
    }
}

/// The chunks of a streamed answer: each read of the backend's body is turned into the
/// chunks of the events it completes and sent on at once; the end adds the finish, usage
/// and `[DONE]`.
fn stream(backend: Body, answering: Answering) -> Body {
    let state = Some((backend.into_data_stream(), Events::default(), answering));
    let chunks = futures_util::stream::unfold(state, |state| async move {
        let (mut data, mut events, mut answering) = state?;
        loop {
            let out = match data.next().await {
                Some(Ok(bytes)) => answering.feed(events.push(&bytes)),
                Some(Err(error)) => {
                    let failed = Event::Error(format!("reading the backend's answer: {error}"));
                    let out = answering.feed(vec![failed]);
                    return Some((Ok::<_, std::io::Error>(Bytes::from(out)), None));
                }
                None => {
                    let mut out = answering.feed(events.end().into_iter().collect());
                    out.extend(answering.end());
                    return Some((Ok(Bytes::from(out)), None));
                }
            };
            if !out.is_empty() {
                return Some((Ok(Bytes::from(out)), Some((data, events, answering))));
            }
        }
    });
    Body::from_stream(chunks)
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response {
    let body = serde_json::to_vec(value).expect("JSON serializes");
    super::json_response(status, Bytes::from(body))
}

/// An OpenAI request on its way through the pipeline: the generate request it becomes
/// (`HttpWire`), and what the answer needs back (the model's text files, the prompt's
/// tokens).
struct OpenAiWire {
    http: HttpWire,
    call: Call,
    text: Option<Arc<ModelText>>,
    prompt_tokens: Option<u64>,
    /// Tokens reserved under the tenant's `tokens_per_minute`, settled by the answer.
    reservation: Option<Reservation>,
}

impl OpenAiWire {
    /// Writes the generate body for the route's target: the prompt (a chat rendered by the
    /// target's template, refused when it has none) and the parameters by the table; the
    /// prompt's tokens counted by its tokenizer and, with `max_tokens`, reserved under the
    /// tenant's `tokens_per_minute` (the admit phase's token part).
    async fn render(&mut self, ctx: &RequestCtx) -> Result<(), GatewayError> {
        let target = &ctx.routed.as_ref().expect("routed").target.name;
        let dir = openai::text::text_dir(&ctx.live.config, target);
        let text = ctx.gateway.texts().get(dir).await;
        let (prompt, special) = match &self.call.prompt {
            openai::request::Prompt::Messages(messages) => (text.render(target, messages)?, false),
            openai::request::Prompt::Text(prompt) => (prompt.clone(), true),
        };
        self.prompt_tokens = text.count(&prompt, special);
        if let Some(prompt_tokens) = self.prompt_tokens {
            if let Some(context) = openai::text::context_length(&ctx.live.config, target, &text) {
                self.call.fits(prompt_tokens, context)?;
            }
            let estimate = prompt_tokens + self.call.max_tokens.unwrap_or(0);
            self.reservation = pipeline::admit::tokens(ctx, estimate)?;
        }
        self.text = Some(text);
        let body = self.call.generate_body(&prompt);
        self.http.replace_body(Bytes::from(body));
        Ok(())
    }
}

impl Inspect for OpenAiWire {
    /// Refuses a parameter the model has no input for, then reads the generate body as
    /// any generate request is read.
    async fn read(
        &mut self,
        ctx: &RequestCtx,
        model: &ModelRef,
        signature: &Signature,
    ) -> Result<Verdict, GatewayError> {
        self.call
            .check(&model.name, |input| signature.input(input).is_some())?;
        self.http.read(ctx, model, signature).await
    }

    async fn mirror(&mut self, ctx: &RequestCtx, shadow: Shadow) -> Result<(), GatewayError> {
        self.http.mirror(ctx, shadow).await
    }
}

impl Wire for OpenAiWire {
    type Answer = Response;

    fn header(&self, name: &http::HeaderName) -> Option<&[u8]> {
        self.http.header(name)
    }

    fn retarget(&mut self, routed: &Routed) {
        self.http.retarget(routed);
    }

    fn body_len(&self) -> usize {
        self.http.body_len()
    }

    /// The body is written here: the first phase that knows the route's target, before a
    /// copy is placed, so a chat to a model without a template is refused without loading
    /// it.
    async fn arrive(&mut self, ctx: &RequestCtx) -> Result<Option<SequenceRef>, GatewayError> {
        self.render(ctx).await?;
        self.http.arrive(ctx).await
    }

    async fn send(
        &mut self,
        ctx: &RequestCtx,
        backend: &Arc<Backend>,
    ) -> Result<Response, GatewayError> {
        self.http.send(ctx, backend).await
    }

    async fn gone(&mut self, answer: Result<Response, GatewayError>) -> Sent<Response> {
        self.http.gone(answer).await
    }

    fn may_send_again(&self) -> bool {
        self.http.may_send_again()
    }

    fn failed(answer: &Response) -> bool {
        HttpWire::failed(answer)
    }

    fn streams(&self, answer: &Response) -> bool {
        self.http.streams(answer)
    }

    fn local(&mut self, answer: Local) -> Result<Response, GatewayError> {
        self.http.local(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_three_paths_under_v1_and_leaves_the_rest_to_kserve() {
        let served = |method: Method, path: &str| endpoint(&method, path).map(|e| e.ok());
        assert_eq!(
            served(Method::GET, "/v1/models"),
            Some(Some(Endpoint::Models))
        );
        assert_eq!(
            served(Method::POST, "/v1/chat/completions"),
            Some(Some(Endpoint::Generate(Kind::Chat)))
        );
        assert_eq!(
            served(Method::POST, "/v1/completions"),
            Some(Some(Endpoint::Generate(Kind::Completion)))
        );
        assert_eq!(served(Method::GET, "/v1/completions"), Some(None));
        assert_eq!(served(Method::POST, "/v1/embeddings"), Some(None));
        assert_eq!(served(Method::POST, "/v2/models/m/infer"), None);
    }
}
