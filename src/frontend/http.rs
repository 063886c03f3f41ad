//! The KServe v2 HTTP/REST front-end: every endpoint of the protocol and Triton's repository
//! extension, decoded into pipeline calls. Bodies stream through untouched, so JSON and the
//! binary tensor extension work alike.

use super::Served;
use super::edge::{Tenant, edge};
use crate::Gateway;
use crate::auth::{Access, Credentials};
use crate::error::GatewayError;
use crate::pipeline::auth::{Caller, admit};
use crate::pipeline::repository::{self, Index};
use crate::pipeline::statistics::{self, Statistics};
use crate::pipeline::{Ask, LeasedBody, ModelRef, Outcome, mirror, replay, sequence};
use crate::placement::SequenceRef;
use crate::upstream;
use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use bytes::Bytes;
use http::{Method, StatusCode, header};
use http_body_util::BodyExt;

/// Builds the KServe v2 router over the gateway state.
pub fn router(gateway: Gateway) -> Router {
    Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(live))
        .route("/v2/health/ready", get(ready))
        .route("/v2/models/stats", get(all_model_stats))
        .route("/v2/models/{model}", get(model_metadata))
        .route(
            "/v2/models/{model}/versions/{version}",
            get(version_metadata),
        )
        .route("/v2/models/{model}/{action}", any(model_action))
        .route(
            "/v2/models/{model}/versions/{version}/{action}",
            any(version_action),
        )
        .route("/v2/repository/index", post(repository_index))
        .route("/v2/systemsharedmemory/{*rest}", any(shared_memory))
        .route("/v2/cudasharedmemory/{*rest}", any(shared_memory))
        .route(
            "/v2/repository/models/{model}/{action}",
            any(repository_action),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            gateway.clone(),
            authenticate,
        ))
        .layer(middleware::from_fn_with_state(gateway.clone(), edge))
        .with_state(gateway)
}

/// The credential headers, read by the `auth` stage and never forwarded to a backend.
pub(crate) const CREDENTIAL_HEADERS: [&str; 2] = ["authorization", "x-api-key"];

/// The credentials a request carries.
pub(crate) fn credentials(request: &Request) -> Credentials<'_> {
    let headers = request.headers();
    Credentials {
        authorization: headers.get(header::AUTHORIZATION).map(|v| v.as_bytes()),
        api_key: headers.get("x-api-key").map(|v| v.as_bytes()),
        peer: request
            .extensions()
            .get::<crate::tls::PeerIdentity>()
            .map(|p| p.subject.as_str()),
    }
}

/// The `auth` stage's first half for every HTTP request but health probes: the credential
/// becomes a `Caller` extension (or the answer is 401), the credential headers are taken off
/// so they never reach a backend, and the tenant is left on the response for the access log.
pub(crate) async fn authenticate(
    State(gateway): State<Gateway>,
    mut request: Request,
    next: axum::middleware::Next,
) -> Response {
    if request.uri().path().starts_with("/v2/health/") {
        return next.run(request).await;
    }
    let auth = gateway.live().auth.clone();
    let caller = match crate::pipeline::auth::authenticate(&auth, credentials(&request)).await {
        Ok(caller) => caller,
        Err(error) => return error.into_response(),
    };
    if auth.is_on() {
        for name in CREDENTIAL_HEADERS {
            request.headers_mut().remove(name);
        }
    }
    let tenant = caller.tenant().cloned();
    request.extensions_mut().insert(caller);
    let mut response = next.run(request).await;
    if let Some(tenant) = tenant {
        response.extensions_mut().insert(Tenant(tenant));
    }
    response
}

/// The caller the `authenticate` layer found. Its absence (a route outside that layer) is
/// a refusal when auth is on, never a way around it.
pub(crate) fn caller(gateway: &Gateway, request: &Request) -> Result<Caller, GatewayError> {
    match request.extensions().get::<Caller>() {
        Some(caller) => Ok(caller.clone()),
        None if gateway.live().auth.is_on() => Err(GatewayError::Unauthenticated {
            reason: "no credentials".into(),
        }),
        None => Ok(Caller::Open),
    }
}

/// Admits an endpoint that needs the admin role.
fn admit_admin(
    gateway: &Gateway,
    request: &Request,
    what: &'static str,
) -> Result<crate::auth::Admission, GatewayError> {
    let caller = caller(gateway, request)?;
    admit(&gateway.live().auth, &caller, Access::Admin(what))
}

async fn server_metadata(State(gateway): State<Gateway>) -> Response {
    axum::Json(crate::pipeline::server_metadata::server_metadata(&gateway).await).into_response()
}

/// The gateway's own process is alive.
async fn live() -> StatusCode {
    StatusCode::OK
}

/// Ready while at least one backend is, and not once shutdown has begun.
async fn ready(State(gateway): State<Gateway>) -> Result<StatusCode, GatewayError> {
    gateway.readiness().map(|()| StatusCode::OK)
}

/// The shared-memory extension (status, register, unregister; system and CUDA): a region is
/// local to one host, and the gateway and its backends are not one host.
async fn shared_memory() -> GatewayError {
    GatewayError::SharedMemoryUnsupported
}

async fn not_found(request: Request) -> GatewayError {
    GatewayError::NotFound {
        path: request.uri().path().to_owned(),
    }
}

async fn method_not_allowed(request: Request) -> GatewayError {
    GatewayError::MethodNotAllowed {
        method: request.method().to_string(),
        path: request.uri().path().to_owned(),
    }
}

fn path<T>(extracted: Result<Path<T>, PathRejection>) -> Result<T, GatewayError> {
    extracted.map(|Path(value)| value).map_err(|rejection| {
        GatewayError::BadRequest(format!("malformed URL: {}", rejection.body_text()))
    })
}

async fn model_metadata(
    State(gateway): State<Gateway>,
    model: Result<Path<String>, PathRejection>,
    request: Request,
) -> Response {
    match path(model) {
        Ok(model) => to_model(&gateway, ModelRef::new(model, None), Ask::Metadata, request).await,
        Err(error) => error.into_response(),
    }
}

async fn version_metadata(
    State(gateway): State<Gateway>,
    segments: Result<Path<(String, String)>, PathRejection>,
    request: Request,
) -> Response {
    match path(segments).and_then(|(model, version)| versioned(model, version, &request)) {
        Ok(model) => to_model(&gateway, model, Ask::Metadata, request).await,
        Err(error) => error.into_response(),
    }
}

async fn model_action(
    State(gateway): State<Gateway>,
    segments: Result<Path<(String, String)>, PathRejection>,
    request: Request,
) -> Response {
    match path(segments).and_then(|(model, action)| Ok((model, check_action(&action, &request)?))) {
        Ok((model, ask)) => to_model(&gateway, ModelRef::new(model, None), ask, request).await,
        Err(error) => error.into_response(),
    }
}

async fn version_action(
    State(gateway): State<Gateway>,
    segments: Result<Path<(String, String, String)>, PathRejection>,
    request: Request,
) -> Response {
    match path(segments).and_then(|(model, version, action)| {
        let ask = check_action(&action, &request)?;
        Ok((versioned(model, version, &request)?, ask))
    }) {
        Ok((model, ask)) => to_model(&gateway, model, ask, request).await,
        Err(error) => error.into_response(),
    }
}

/// The model and version of a `/versions/{v}` URL. Triton's HTTP routes take only digits
/// there: any other segment is an unknown path (404), as on Triton; digits Triton cannot
/// read as a version (past 64 bits) are its 400.
fn versioned(model: String, version: String, request: &Request) -> Result<ModelRef, GatewayError> {
    if version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit()) {
        return Err(GatewayError::NotFound {
            path: request.uri().path().to_owned(),
        });
    }
    ModelRef::requested(model, Some(version))
}

/// The per-model endpoints, what each asks, and the method each takes (`generate` and
/// `generate_stream` are Triton's generate extension: inferences with a flat JSON body).
fn check_action(action: &str, request: &Request) -> Result<Ask, GatewayError> {
    let (ask, expected) = match action {
        "ready" => (Ask::Ready, Method::GET),
        "config" => (Ask::Config, Method::GET),
        "stats" => (Ask::Statistics, Method::GET),
        "infer" | "generate" | "generate_stream" => (Ask::Inference, Method::POST),
        _ => {
            return Err(GatewayError::NotFound {
                path: request.uri().path().to_owned(),
            });
        }
    };
    if request.method() == expected {
        Ok(ask)
    } else {
        Err(GatewayError::MethodNotAllowed {
            method: request.method().to_string(),
            path: request.uri().path().to_owned(),
        })
    }
}

/// Every request about one model: find (or, for an inference, load) a copy, forward, stream
/// the answer back while the lease keeps the copy in use. Statistics are read from every
/// copy instead (`pipeline::statistics`).
async fn to_model(gateway: &Gateway, model: ModelRef, ask: Ask, mut request: Request) -> Response {
    let live = gateway.live();
    // The name the client called is what its tenant must be allowed (a route name, not its
    // targets: choosing a target is the admin's `infergate-target`).
    let admission = match caller(gateway, &request).and_then(|caller| {
        Ok((
            admit(&live.auth, &caller, Access::Model(&model.name))?,
            caller,
        ))
    }) {
        Ok(admitted) => admitted,
        Err(error) => return error.into_response(),
    };
    let (admission, caller) = admission;
    let headers = request.headers();
    let mut routed = match live.routes.resolve(
        model,
        |name| headers.get(name).map(|v| v.as_bytes()),
        &caller,
    ) {
        Ok(routed) => routed,
        Err(error) => return error.into_response(),
    };
    routed.for_inference(ask == Ask::Inference);
    if ask == Ask::Statistics {
        return model_statistics(gateway, routed, admission).await;
    }
    let copy = routed
        .mirror_copy()
        .map(|copy| (copy, request.uri().clone()));
    if routed.route.is_some() {
        *request.uri_mut() = target_uri(request.uri(), &routed.target);
    }
    let (request, sequence) = match read_sequence(gateway, &routed.target, ask, request).await {
        Ok(read) => read,
        Err(error) => {
            finish(routed.outcome, error.http_status());
            return error.into_response();
        }
    };
    let mut lease = match routed
        .place(gateway.placement(), ask, sequence.as_ref())
        .await
    {
        Ok(lease) => lease,
        Err(error) => return error.into_response(),
    };
    let forwarded = async {
        let mut request =
            crate::validate::http_request(gateway, lease.backend(), &routed.target, request)
                .await?;
        if let Some(copy) = copy {
            request = mirror::http(gateway, copy, request, target_uri).await?;
        }
        forward_placed(
            gateway,
            (&mut routed, ask, sequence.as_ref()),
            &mut lease,
            request,
        )
        .await
    }
    .await;
    finish(
        routed.outcome,
        forwarded
            .as_ref()
            .map_or_else(GatewayError::http_status, |r| r.status()),
    );
    let model = routed.target;
    let served = Served {
        model: model.name,
        version: model.version,
        backend: lease.backend().name.clone(),
        route: routed.route,
    };
    let mut response = match forwarded {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            Response::from_parts(parts, LeasedBody::wrap(body, lease, admission))
        }
        Err(error) => error.into_response(),
    };
    if let Some(label) = routed.label
        && let Ok(value) = http::HeaderValue::from_str(&label)
    {
        response.headers_mut().insert(TARGET_HEADER, value);
    }
    response.extensions_mut().insert(served);
    response
}

/// A model's statistics, summed over the copies that serve it.
async fn model_statistics(
    gateway: &Gateway,
    routed: crate::pipeline::Routed,
    _admission: crate::auth::Admission,
) -> Response {
    let mut response = match statistics::of_model(gateway, &routed.target).await {
        Ok(answer) => statistics_response(answer),
        Err(error) => error.into_response(),
    };
    response.extensions_mut().insert(Served {
        model: routed.target.name,
        version: routed.target.version,
        route: routed.route,
        ..Served::default()
    });
    response
}

fn statistics_response(answer: Statistics) -> Response {
    match answer {
        Statistics::Merged(value) => json_response(
            StatusCode::OK,
            Bytes::from(serde_json::to_vec(&value).expect("serializable")),
        ),
        Statistics::Refused { status, body } => json_response(status, body),
    }
}

/// Forwards to the leased copy. When the backend answers that it has no such model (the copy
/// went between placement and the answer), the request is placed again and sent once more,
/// with the same body (`pipeline::replay`); `lease` is then the copy that answered.
async fn forward_placed(
    gateway: &Gateway,
    (routed, ask, sequence): (&mut crate::pipeline::Routed, Ask, Option<&SequenceRef>),
    lease: &mut crate::placement::Lease,
    request: Request,
) -> Result<Response, GatewayError> {
    let (parts, body) = request.into_parts();
    let (body, replay) = crate::body::replayable(body);
    let mut again = http::Request::new(());
    *again.method_mut() = parts.method.clone();
    *again.uri_mut() = parts.uri.clone();
    *again.version_mut() = parts.version;
    *again.headers_mut() = parts.headers.clone();
    let response = upstream::forward(lease.backend(), Request::from_parts(parts, body)).await?;
    if !replay::may_be_gone(response.status()) {
        return Ok(response);
    }
    let (parts, body) = response.into_parts();
    // An error answer is small; past this it is not one of Triton's lookup refusals.
    let body = match http_body_util::Limited::new(body, 64 << 10).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            return Err(GatewayError::UpstreamFailed {
                backend: lease.backend().name.clone(),
                reason: format!("reading the error answer: {error}"),
            });
        }
    };
    let gone = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("error")?.as_str().map(replay::copy_is_gone))
        .unwrap_or(false);
    let retry = if gone { replay.take() } else { None };
    let Some(body_again) = retry else {
        return Ok(Response::from_parts(parts, axum::body::Body::from(body)));
    };
    *lease = routed
        .place_again(gateway.placement(), lease, ask, sequence)
        .await?;
    let (again, ()) = again.into_parts();
    upstream::forward(lease.backend(), Request::from_parts(again, body_again)).await
}

/// Applies the body limit, and for an inference request to a model that may have sequence
/// batching (`Placement::may_hold_sequences`) reads the sequence it belongs to, which
/// placement needs: from the whole body for JSON, from the JSON header alone for the binary
/// extension (its tensors keep streaming). The bytes read are handed on as the body, so
/// validation reads them again without another copy. Validation on or off alike; a
/// compressed body is not read (its sequence is not followed).
async fn read_sequence(
    gateway: &Gateway,
    model: &ModelRef,
    ask: Ask,
    request: Request,
) -> Result<(Request, Option<SequenceRef>), GatewayError> {
    let request = limit_body(gateway, request)?;
    if ask != Ask::Inference || !gateway.placement().may_hold_sequences(&model.name) {
        return Ok((request, None));
    }
    let headers = request.headers();
    if headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|e| !e.is_empty() && e != "identity")
    {
        return Ok((request, None));
    }
    let header_length: Option<usize> = headers
        .get(crate::validate::HEADER_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse().ok());
    let declared: Option<u64> = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let limit = gateway.config().server.max_body_size.bytes();
    let (parts, body) = request.into_parts();
    let (body, sequence) = match header_length {
        // Raw binary: the whole body is one tensor, no JSON.
        Some(0) => (body, None),
        Some(length) => {
            let (head, rest) = crate::validate::read_head(body, length, limit).await?;
            let sequence = sequence::from_json(&head[..length.min(head.len())]);
            (crate::validate::stream_on(head, rest), sequence)
        }
        None => {
            let whole = crate::validate::collect(body, limit, declared).await?;
            let sequence = sequence::from_json(&whole);
            (axum::body::Body::from(whole), sequence)
        }
    };
    Ok((Request::from_parts(parts, body), sequence))
}

/// Counts the answer for a guarded route: a 5xx is a failure of the target.
fn finish(outcome: Option<Outcome>, status: StatusCode) {
    if let Some(outcome) = outcome {
        outcome.finish(status.is_server_error());
    }
}

const TARGET_HEADER: http::HeaderName =
    http::HeaderName::from_static(crate::protocol::TARGET_HEADER);

/// `/v2/models/{route}{rest}` becomes `/v2/models/{target}[/versions/{v}]{rest}`.
fn target_uri(uri: &http::Uri, target: &ModelRef) -> http::Uri {
    let path = uri.path();
    let after_model = path
        .strip_prefix("/v2/models/")
        .map_or("", |tail| tail.find('/').map_or("", |i| &tail[i..]));
    let mut rewritten = format!("/v2/models/{}", upstream::path_segment(&target.name));
    if let Some(version) = &target.version {
        rewritten.push_str("/versions/");
        rewritten.push_str(&upstream::path_segment(version));
    }
    rewritten.push_str(after_model);
    if let Some(query) = uri.query() {
        rewritten.push('?');
        rewritten.push_str(query);
    }
    rewritten.parse().unwrap_or_else(|_| uri.clone())
}

/// Refuses a declared length over the limit at once, and cuts off a chunked body that grows
/// past it.
fn limit_body(gateway: &Gateway, request: Request) -> Result<Request, GatewayError> {
    let limit = gateway.config().server.max_body_size.bytes();
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(GatewayError::BodyTooLarge { limit });
    }
    // HTTP/1 delivers exactly the declared length (hyper refuses a body that differs), so
    // only a chunked body (or HTTP/2's) needs counting as it streams.
    if declared.is_some() && request.version() <= http::Version::HTTP_11 {
        return Ok(request);
    }
    Ok(request.map(|body| crate::body::limited(body, limit)))
}

/// Reads a small control body (repository requests) within the body limit.
async fn read_small_body(gateway: &Gateway, request: Request) -> Result<Bytes, GatewayError> {
    let request = limit_body(gateway, request)?;
    match request.into_body().collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) => {
            let limit = gateway.config().server.max_body_size.bytes();
            if std::error::Error::source(&error)
                .is_some_and(|e| e.is::<crate::body::BodyTooLarge>())
            {
                Err(GatewayError::BodyTooLarge { limit })
            } else {
                Err(GatewayError::BadRequest(format!(
                    "could not read request body: {error}"
                )))
            }
        }
    }
}

fn json_response(status: StatusCode, body: Bytes) -> Response {
    let mut response = (status, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// The pool's repository: one row per model and version, READY where any backend has it.
async fn repository_index(
    State(gateway): State<Gateway>,
    request: Request,
) -> Result<Response, GatewayError> {
    let _admission = admit_admin(&gateway, &request, "the repository API")?;
    let body = read_small_body(&gateway, request).await?;
    let body = if body.is_empty() {
        Bytes::from_static(b"{}")
    } else {
        body
    };
    match repository::index(&gateway, body).await? {
        Index::Merged(rows) => Ok(json_response(
            StatusCode::OK,
            Bytes::from(serde_json::to_vec(&rows).expect("serializable")),
        )),
        Index::Refused { status, body } => Ok(json_response(status, body)),
    }
}

/// Load and unload through placement: a load is placed like a cold request (room first,
/// else LRU eviction) and answered once the model is ready; an unload takes the model off
/// every backend.
async fn repository_action(
    State(gateway): State<Gateway>,
    segments: Result<Path<(String, String)>, PathRejection>,
    request: Request,
) -> Result<Response, GatewayError> {
    let (model, action) = path(segments)?;
    let _admission = admit_admin(&gateway, &request, "the repository API")?;
    if action != "load" && action != "unload" {
        return Err(GatewayError::NotFound {
            path: request.uri().path().to_owned(),
        });
    }
    if request.method() != Method::POST {
        return Err(GatewayError::MethodNotAllowed {
            method: request.method().to_string(),
            path: request.uri().path().to_owned(),
        });
    }
    let body = read_small_body(&gateway, request).await?;
    if action == "load" {
        let body: serde_json::Value = if body.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&body).map_err(|error| {
                GatewayError::BadRequest(format!("load request body is not JSON: {error}"))
            })?
        };
        let parameters = body
            .get("parameters")
            .and_then(serde_json::Value::as_object)
            .into_iter()
            .flatten()
            .map(|(name, value)| (name.as_str(), value.as_str()));
        let config = repository::load_config(&model, parameters)?;
        gateway.placement().load(&model, config).await?;
    } else {
        gateway.placement().unload_explicitly(&model).await;
    }
    let mut response = json_response(StatusCode::OK, Bytes::new());
    response.extensions_mut().insert(Served {
        model,
        ..Served::default()
    });
    Ok(response)
}

/// Statistics for every model on every ready backend, summed per model and version.
async fn all_model_stats(
    State(gateway): State<Gateway>,
    request: Request,
) -> Result<Response, GatewayError> {
    // Every model's statistics, including models the tenant may not use.
    let _admission = admit_admin(&gateway, &request, "the statistics of all models")?;
    Ok(statistics_response(statistics::of_all(&gateway).await?))
}
