//! The KServe v2 HTTP/REST front-end: every endpoint of the protocol and Triton's repository
//! extension, decoded into a `RequestCtx` and run through the pipeline (`wire` is this
//! front-end's `pipeline::Wire`).

mod body;
mod edge;
mod validate;
mod wire;

pub(crate) use edge::{Snapshot, Tenant, edge};

use crate::Gateway;
use crate::error::{GatewayError, www_authenticate};
use crate::model::{Ask, ModelRef, Served};
use crate::pipeline::admit::{self, CREDENTIAL_HEADERS, Caller};
use crate::pipeline::repository::{self, Index};
use crate::pipeline::statistics::Statistics;
use crate::pipeline::{self as pipeline, RequestCtx};
use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode, header};
use wire::HttpWire;

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

/// An inference (`POST /v2/models/{m}[/versions/{v}]/infer`), served without the router: the
/// same edge, `authenticate` and pipeline as through it (`to_model`), less the router's path
/// matching and its middleware chain, which cost more than the rest of the HTTP layer on this,
/// the one path that carries the load.
pub(crate) async fn infer(gateway: Gateway, request: Request, model: ModelRef) -> Response {
    edge::around(&gateway, request, |request| {
        authenticate_around(&gateway, request, |request| {
            // The pipeline's state machine is kilobytes (every phase's locals): boxed once
            // here, so the edge's layers above it move a pointer, not all of it, each time
            // one wraps the next (instructions.sh counted five such copies per request).
            Box::pin(to_model(&gateway, model, Ask::Inference, request))
        })
    })
    .await
}

/// The model of an inference URL that `infer` serves: a `POST` to
/// `/v2/models/{m}/infer` or `/v2/models/{m}/versions/{digits}/infer` whose segments the
/// router would read as written (no percent escapes). Anything else goes through the router,
/// which answers it (or refuses it) the same way as before.
pub(crate) fn inference_target(request: &Request) -> Option<ModelRef> {
    if request.method() != Method::POST {
        return None;
    }
    let rest = request
        .uri()
        .path()
        .strip_prefix("/v2/models/")?
        .strip_suffix("/infer")?;
    if rest.contains('%') {
        return None;
    }
    let mut segments = rest.split('/');
    match (
        segments.next()?,
        segments.next(),
        segments.next(),
        segments.next(),
    ) {
        (model, None, _, _) if !model.is_empty() => Some(ModelRef::new(model, None)),
        (model, Some("versions"), Some(version), None)
            if !model.is_empty()
                && !version.is_empty()
                && version.bytes().all(|b| b.is_ascii_digit()) =>
        {
            ModelRef::requested(model, Some(version.to_owned())).ok()
        }
        _ => None,
    }
}

/// The credentials a request carries.
pub(crate) fn credentials(request: &Request) -> crate::auth::Credentials<'_> {
    let headers = request.headers();
    admit::credentials(
        |name| headers.get(name).map(HeaderValue::as_bytes),
        request
            .extensions()
            .get::<crate::tls::PeerIdentity>()
            .map(|p| p.subject.as_str()),
    )
}

/// The admit phase's first half for every HTTP request but health probes: the credential
/// becomes a `Caller` extension (or the answer is 401), checked against the request's own
/// config snapshot; the credential headers are taken off so they never reach a backend,
/// and the tenant is left on the response for the access log.
pub(crate) async fn authenticate(
    State(gateway): State<Gateway>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    if edge::is_probe(request.uri().path()) {
        return next.run(request).await;
    }
    authenticate_around(&gateway, request, |request| next.run(request)).await
}

/// `authenticate` around `inner`, the rest of the request's walk.
async fn authenticate_around<F, Fut>(gateway: &Gateway, mut request: Request, inner: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: Future<Output = Response>,
{
    let mut ctx = request_ctx(gateway, &request);
    let strip = match admit::authenticate(&mut ctx, credentials(&request)).await {
        Ok(strip) => strip,
        Err(error) => return error.into_response(),
    };
    if strip {
        for name in &CREDENTIAL_HEADERS {
            request.headers_mut().remove(name);
        }
    }
    let tenant = ctx.tenant().cloned();
    request.extensions_mut().insert(ctx.caller);
    let mut response = inner(request).await;
    if let Some(tenant) = tenant {
        response.extensions_mut().insert(Tenant(tenant));
    }
    response
}

/// The request's context, as the edge and `authenticate` left it: the one config snapshot
/// taken at the edge, the request id, and the caller.
pub(crate) fn request_ctx(gateway: &Gateway, request: &Request) -> RequestCtx {
    let live = match request.extensions().get::<Snapshot>() {
        Some(snapshot) => snapshot.0.clone(),
        None => gateway.live(),
    };
    let id = request
        .headers()
        .get(&super::X_REQUEST_ID)
        .cloned()
        .unwrap_or_else(|| pipeline::request_id(None));
    let mut ctx = RequestCtx::new(gateway, live, id, None);
    if let Some(caller) = request.extensions().get::<Caller>() {
        ctx.caller = caller.clone();
    }
    ctx
}

/// The context of a request that must have passed `authenticate`. A missing caller (a
/// route outside that layer) is a refusal when auth is on, never a way around it.
fn authenticated(gateway: &Gateway, request: &Request) -> Result<RequestCtx, GatewayError> {
    let ctx = request_ctx(gateway, request);
    if request.extensions().get::<Caller>().is_none() && ctx.live.auth.is_on() {
        return Err(GatewayError::Unauthenticated {
            reason: "no credentials".into(),
        });
    }
    Ok(ctx)
}

/// Admits an endpoint that needs the admin role.
fn admit_admin(
    gateway: &Gateway,
    request: &Request,
    what: &'static str,
) -> Result<RequestCtx, GatewayError> {
    let mut ctx = authenticated(gateway, request)?;
    admit::admin(&mut ctx, what)?;
    Ok(ctx)
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
    Ok(ModelRef::requested(model, Some(version))?)
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

/// Every request about one model, through the pipeline (`pipeline::serve`). The answer
/// streams back while its body holds the lease, so the copy stays in use. Statistics are
/// read from every copy instead (`pipeline::model_statistics`).
async fn to_model(gateway: &Gateway, model: ModelRef, ask: Ask, request: Request) -> Response {
    let mut ctx = match authenticated(gateway, &request) {
        Ok(ctx) => ctx,
        Err(error) => return error.into_response(),
    };
    ctx.about(model, ask);
    if ask == Ask::Statistics {
        return model_statistics(ctx, request.headers()).await;
    }
    let mut wire = HttpWire::new(request);
    let answer = pipeline::serve(&mut ctx, &mut wire).await;
    let served = ctx.served();
    let mut response = match (answer, ctx.lease.take()) {
        (Ok(response), Some(lease)) => {
            let admission = std::mem::take(&mut ctx.admission);
            let (parts, body) = response.into_parts();
            Response::from_parts(parts, body::LeasedBody::wrap(body, lease, admission))
        }
        (Ok(response), None) => response,
        (Err(error), _) => error.into_response(),
    };
    if let Some(label) = ctx.target_label()
        && let Ok(value) = HeaderValue::from_str(label)
    {
        response.headers_mut().insert(TARGET_HEADER, value);
    }
    response.extensions_mut().insert(served);
    response
}

/// A model's statistics, summed over the copies that serve it.
async fn model_statistics(mut ctx: RequestCtx, headers: &http::HeaderMap) -> Response {
    let answer =
        pipeline::model_statistics(&mut ctx, |name| headers.get(name).map(|v| v.as_bytes())).await;
    let mut response = match answer {
        Ok(answer) => statistics_response(answer),
        Err(error) => error.into_response(),
    };
    if let Some(routed) = &ctx.routed {
        response.extensions_mut().insert(routed.served());
    }
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

const TARGET_HEADER: http::HeaderName =
    http::HeaderName::from_static(crate::protocol::TARGET_HEADER);

/// Reads a small control body (repository requests) within the body limit.
async fn read_small_body(gateway: &Gateway, request: Request) -> Result<Bytes, GatewayError> {
    body::read_small(request, gateway.config().server.max_body_size.bytes()).await
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
    let _ctx = admit_admin(&gateway, &request, "the repository API")?;
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
    let _ctx = admit_admin(&gateway, &request, "the repository API")?;
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
    let _ctx = admit_admin(&gateway, &request, "the statistics of all models")?;
    Ok(statistics_response(
        pipeline::statistics::of_all(&gateway).await?,
    ))
}

/// A failure the gateway answers itself, in Triton's HTTP error shape (`{"error": "..."}`),
/// with `Retry-After` where a wait helps and a bearer challenge for a refused credential.
/// What the edge counts and logs of it rides along (`ErrorKind`).
impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let status = self.http_status();
        let mut response = (status, crate::error::error_body(&self.to_string())).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.retries_after() {
            headers.insert(
                header::RETRY_AFTER,
                HeaderValue::from(self.retry_after_secs()),
            );
        }
        if let Self::Unauthenticated { reason } = &self {
            headers.insert(header::WWW_AUTHENTICATE, www_authenticate(reason));
        }
        if let Some(report) = self.report() {
            response.extensions_mut().insert(report);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_inference_urls_skip_the_router() {
        let target = |method: Method, path: &str| {
            let request = Request::builder()
                .method(method)
                .uri(path)
                .body(axum::body::Body::empty())
                .unwrap();
            inference_target(&request)
        };
        assert_eq!(
            target(Method::POST, "/v2/models/add_sub/infer"),
            Some(ModelRef::new("add_sub", None))
        );
        assert_eq!(
            target(Method::POST, "/v2/models/add_sub/versions/2/infer"),
            Some(ModelRef::new("add_sub", Some("2".into())))
        );
        // The router answers these (405, 404, a decoded name, Triton's version error).
        for (method, path) in [
            (Method::GET, "/v2/models/add_sub/infer"),
            (Method::POST, "/v2/models//infer"),
            (Method::POST, "/v2/models/add_sub/versions/x/infer"),
            (Method::POST, "/v2/models/add_sub/versions//infer"),
            (Method::POST, "/v2/models/a%2Fb/infer"),
            (Method::POST, "/v2/models/add_sub/generate"),
            (Method::POST, "/v2/models/add_sub/extra/infer"),
            (
                Method::POST,
                "/v2/models/add_sub/versions/99999999999999999999/infer",
            ),
        ] {
            assert_eq!(target(method.clone(), path), None, "{method} {path}");
        }
    }

    #[test]
    fn a_refused_credential_is_challenged_without_echoing_it() {
        let response = GatewayError::Unauthenticated {
            reason: "token expired".into(),
        }
        .into_response();
        assert_eq!(response.status(), 401);
        assert_eq!(
            response.headers()[header::WWW_AUTHENTICATE],
            "Bearer realm=\"infergate\", error=\"invalid_token\", error_description=\"token expired\""
        );
        let response = GatewayError::RateLimited {
            message: "tenant 'a' is over its limit".into(),
            retry_after: std::time::Duration::from_millis(1500),
        }
        .into_response();
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
    }
}
