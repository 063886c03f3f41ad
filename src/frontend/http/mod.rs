//! The KServe v2 HTTP/REST front-end: every endpoint of the protocol and Triton's
//! extensions. Each request passes the edge once (`edge`: its `RequestCtx`, admitted), is
//! read as an endpoint (`endpoint`), and a request about a model runs through the pipeline
//! (`wire` is this front-end's `pipeline::Wire`).

mod body;
mod edge;
mod endpoint;
mod openai;
mod validate;
mod wire;

pub(crate) use edge::{Gate, around};
pub(crate) use endpoint::{allow, decoded, segments};

use crate::error::{GatewayError, www_authenticate};
use crate::gateway::Gateway;
use crate::in_place::in_place;
use crate::model::{Ask, Served};
use crate::pipeline::admit;
use crate::pipeline::{self as pipeline, RequestCtx};
use crate::services::repository::{self, IndexRequest};
use crate::services::{server_metadata, statistics};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use endpoint::Endpoint;
use http::{HeaderValue, StatusCode, header};
use std::future::Future;
use std::pin::Pin;
use wire::HttpWire;

/// Every request on the KServe listener, as the listener calls it.
pub(crate) fn serve(
    gateway: crate::gateway::Gateway,
    request: Request,
) -> Pin<Box<dyn Future<Output = Response> + Send>> {
    in_place(|| async move {
        if let Some(endpoint) = openai::endpoint(request.method(), request.uri().path()) {
            let encode = openai::error_response;
            return around(
                &gateway,
                request,
                Gate::Clients,
                encode,
                async |ctx, request| {
                    let endpoint = endpoint?;
                    in_place(|| openai::answer(ctx, endpoint, request)).await
                },
            )
            .await;
        }
        let encode = IntoResponse::into_response;
        around(
            &gateway,
            request,
            Gate::Clients,
            encode,
            async |ctx, request| {
                let endpoint = endpoint::endpoint(request.method(), request.uri().path())?;
                // The pipeline's state machine is kilobytes (every phase's locals): boxed once
                // here, so the edge's future around it moves a pointer, not all of it
                // (instructions.sh counted such copies per request).
                in_place(|| answer(ctx, endpoint, request)).await
            },
        )
        .await
    })
}

/// The endpoint's answer.
async fn answer(
    ctx: &mut RequestCtx,
    endpoint: Endpoint,
    request: Request,
) -> Result<Response, GatewayError> {
    match endpoint {
        Endpoint::Model(model, ask) => {
            ctx.about(model, ask);
            if ask == Ask::Statistics {
                model_statistics(ctx, request.headers()).await
            } else {
                to_model(ctx, request).await
            }
        }
        Endpoint::ServerMetadata => {
            let metadata = server_metadata::server_metadata(&ctx.gateway).await;
            Ok(axum::Json(metadata).into_response())
        }
        Endpoint::Live => Ok(StatusCode::OK.into_response()),
        Endpoint::Ready => ctx
            .gateway
            .readiness()
            .map(|()| StatusCode::OK.into_response()),
        Endpoint::AllStatistics => {
            // Every model's statistics, including models the tenant may not use.
            admit::admin(ctx, "the statistics of all models")?;
            Ok(json_answer(&statistics::of_all(&ctx.gateway).await?))
        }
        Endpoint::RepositoryIndex => {
            admit::admin(ctx, "the repository API")?;
            repository_index(&ctx.gateway, request).await
        }
        Endpoint::Repository { model, load } => {
            admit::admin(ctx, "the repository API")?;
            let body = read_small_body(&ctx.gateway, request).await?;
            repository_action(&ctx.gateway, &model, load, body).await?;
            ctx.serving = Some(Served {
                model,
                ..Served::default()
            });
            Ok(json_response(StatusCode::OK, Bytes::new()))
        }
        // A region is local to one host, and the gateway and its backends are not one host.
        Endpoint::SharedMemory => Err(GatewayError::SharedMemoryUnsupported),
    }
}

/// Every request about one model, through the pipeline (`pipeline::serve`). The answer
/// streams back while its body holds the lease and the tenant's admission, so the copy
/// stays in use and the tenant's slot taken until the answer has gone.
async fn to_model(ctx: &mut RequestCtx, request: Request) -> Result<Response, GatewayError> {
    let mut wire = HttpWire::new(request);
    let response = pipeline::serve(ctx, &mut wire).await?;
    let response = timed(ctx, &wire, response);
    Ok(body::LeasedBody::hold(response, ctx))
}

/// A token stream's answer (`Wire::streams`) with its body timed by the request's token
/// clock (`tokens::clock`, which also takes the guard's count the pipeline left to the
/// first token); any other answer as it is. Both HTTP answers (KServe's and OpenAI's) pass
/// here, so no stream goes untimed.
fn timed<W: pipeline::Wire<Answer = Response>>(
    ctx: &mut RequestCtx,
    wire: &W,
    response: Response,
) -> Response {
    if wire.streams(&response) {
        body::TimedBody::wrap(response, pipeline::tokens::clock(ctx))
    } else {
        response
    }
}

/// A model's statistics, summed over the copies that serve it.
async fn model_statistics(
    ctx: &mut RequestCtx,
    headers: &http::HeaderMap,
) -> Result<Response, GatewayError> {
    let header = |name: &http::HeaderName| headers.get(name).map(|v| v.as_bytes());
    let answer = statistics::of_routed(ctx, header).await;
    ctx.serving = ctx.routed.as_ref().map(crate::routing::Routed::served);
    Ok(json_answer(&answer?))
}

/// A service's answer as a 200 with its JSON.
fn json_answer(answer: &impl serde::Serialize) -> Response {
    json_response(
        StatusCode::OK,
        Bytes::from(serde_json::to_vec(answer).expect("serializable")),
    )
}

/// Reads a small control body (repository requests) within the body limit.
async fn read_small_body(gateway: &Gateway, request: Request) -> Result<Bytes, GatewayError> {
    body::read_small(request, gateway.fixed_config().server.max_body_size.bytes()).await
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
async fn repository_index(gateway: &Gateway, request: Request) -> Result<Response, GatewayError> {
    let body = read_small_body(gateway, request).await?;
    let body = if body.is_empty() {
        Bytes::from_static(b"{}")
    } else {
        body
    };
    let rows = repository::index(gateway, &IndexRequest::Json(body)).await?;
    Ok(json_answer(&rows))
}

/// Load and unload through placement: a load is placed like a cold request (room first,
/// else LRU eviction) and answered once the model is ready; an unload takes the model off
/// every backend.
async fn repository_action(
    gateway: &Gateway,
    model: &str,
    load: bool,
    body: Bytes,
) -> Result<(), GatewayError> {
    if !load {
        gateway.placement().unload_explicitly(model).await;
        return Ok(());
    }
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
    let config = repository::load_config(model, parameters)?;
    gateway.placement().load(model, config).await?;
    Ok(())
}

/// A failure the gateway answers itself, in Triton's HTTP error shape (`{"error": "..."}`),
/// with `Retry-After` where a wait helps and a bearer challenge for a refused credential.
/// The edge counts and logs it (`GatewayError::report`).
impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let body = Bytes::from(crate::error::error_body(&self.to_string()));
        error_response(&self, body)
    }
}

/// A failure's answer with `body` (Triton's shape, or OpenAI's on its endpoints): its status,
/// `Retry-After` where a wait helps and a bearer challenge for a refused credential.
fn error_response(error: &GatewayError, body: Bytes) -> Response {
    let mut response = json_response(error.http_status(), body);
    let headers = response.headers_mut();
    if error.retries_after() {
        headers.insert(
            header::RETRY_AFTER,
            HeaderValue::from(error.retry_after_secs()),
        );
    }
    if let GatewayError::Unauthenticated { reason } = error {
        headers.insert(header::WWW_AUTHENTICATE, www_authenticate(reason));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

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
