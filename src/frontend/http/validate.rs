//! The HTTP reader of the `validate` phase: an inference request's body read as
//! `validate::http` describes it (JSON, or the binary tensor extension's JSON header), then
//! checked by the same `validate::check` as gRPC's requests. Only inference requests with
//! `validation.enabled` are read; any request whose signature is unavailable passes through
//! untouched and streaming. A binary request with a `Content-Length` is checked from its JSON
//! header alone (fixed-size tensors by their sizes) and forwarded as its bytes arrive; any
//! other body is collected once and forwarded as those same bytes.

use super::body::{self, collect, join, read_head, stream_on};
use crate::error::GatewayError;
use crate::model::ModelRef;
use crate::pipeline::RequestCtx;
use crate::upstream::Backend;
use crate::validate::{self, Rejection, Signature, check, generate};
use axum::body::Body;
use axum::extract::Request;
use std::sync::Arc;

/// The `Inference-Header-Content-Length` header of the binary tensor extension.
pub(super) const HEADER_LENGTH: http::HeaderName =
    http::HeaderName::from_static("inference-header-content-length");

/// Checks an inference request to `model` on `backend`, and returns the request to forward.
pub(super) async fn infer_request(
    ctx: &RequestCtx,
    backend: &Arc<Backend>,
    model: &ModelRef,
    request: Request,
) -> Result<Request, GatewayError> {
    let gateway = &ctx.gateway;
    if !gateway.fixed_config().validation.enabled {
        return Ok(request);
    }
    let Some(signature) = gateway.signatures().get(backend, model).await else {
        return Ok(request);
    };
    let path = request.uri().path();
    if path.ends_with("/generate") || path.ends_with("/generate_stream") {
        return generate_request(ctx, &signature, model, request).await;
    }
    let (parts, body) = request.into_parts();
    let limit = gateway.fixed_config().server.max_body_size.bytes();
    let declared = body::declared_length(&parts.headers);
    let header = |name: &http::HeaderName| parts.headers.get(name).map(http::HeaderValue::as_bytes);
    let read = |body: validate::http::BodyView<'_>| {
        validate::http::parse(
            body,
            header(&HEADER_LENGTH),
            header(&http::header::CONTENT_ENCODING),
            &model.name,
        )
    };
    let whole = match streamable(declared, limit, header(&HEADER_LENGTH)) {
        Some((length, header_length)) => {
            let (head, rest) = read_head(body, header_length, limit).await?;
            let view = validate::http::BodyView {
                arrived: &head,
                length,
            };
            match read(view) {
                Ok(validate::http::Parsed::Incomplete) => join(head, rest, limit, declared).await?,
                outcome => {
                    judge(outcome, view, &signature, model)?;
                    return Ok(Request::from_parts(parts, stream_on(head, rest)));
                }
            }
        }
        None => collect(body, limit, declared).await?,
    };
    let view = validate::http::BodyView::whole(&whole);
    judge(read(view), view, &signature, model)?;
    Ok(Request::from_parts(parts, Body::from(whole)))
}

/// A generate request: its (small) body read whole, checked as Triton converts it, and
/// forwarded as those same bytes.
async fn generate_request(
    ctx: &RequestCtx,
    signature: &Signature,
    model: &ModelRef,
    request: Request,
) -> Result<Request, GatewayError> {
    let (parts, body) = request.into_parts();
    let limit = ctx.gateway.fixed_config().server.max_body_size.bytes();
    let whole = collect(body, limit, body::declared_length(&parts.headers)).await?;
    let verdict = match generate::parse(&whole, signature) {
        Ok(generate::Generate::Request(parsed)) => check(&parsed, signature),
        Ok(generate::Generate::Unvalidated(why)) => {
            tracing::debug!(model = %model.name, why, "generate request forwarded unvalidated");
            Ok(())
        }
        Err(rejection) => Err(rejection),
    };
    verdict.map_err(|rejection| validate::refuse(rejection, model))?;
    Ok(Request::from_parts(parts, Body::from(whole)))
}

/// The body's length and JSON header's length when the request can be checked before its
/// tensors arrive: a binary request (`Inference-Header-Content-Length` between 1 and the
/// body's `Content-Length`) within the body limit.
fn streamable(
    declared: Option<u64>,
    limit: u64,
    header_length: Option<&[u8]>,
) -> Option<(usize, usize)> {
    let length = declared.filter(|&n| n <= limit)?;
    let header_length: u64 = std::str::from_utf8(header_length?)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (header_length > 0 && header_length < length)
        .then_some((length as usize, header_length as usize))
}

/// Turns the reader's and checker's verdict into the gateway's answer, counting a refusal.
fn judge(
    outcome: Result<validate::http::Parsed, Rejection>,
    body: validate::http::BodyView<'_>,
    signature: &Signature,
    model: &ModelRef,
) -> Result<(), GatewayError> {
    use validate::http::Parsed;
    let verdict = match outcome {
        Ok(Parsed::Request(parsed)) => check(&parsed, signature),
        Ok(Parsed::Raw) => validate::check::check_raw(body.length as u64, signature),
        Ok(Parsed::Unvalidated(why)) => {
            tracing::debug!(model = %model.name, why, "inference request forwarded unvalidated");
            Ok(())
        }
        Ok(Parsed::Incomplete) => unreachable!("read again with the whole body"),
        Err(rejection) => Err(rejection),
    };
    verdict.map_err(|rejection| validate::refuse(rejection, model))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_only_binary_requests_with_a_length_within_the_limit() {
        assert_eq!(streamable(Some(100), 1000, Some(b"40")), Some((100, 40)));
        assert_eq!(streamable(None, 1000, Some(b"40")), None, "chunked");
        assert_eq!(streamable(Some(100), 1000, None), None, "JSON");
        assert_eq!(
            streamable(Some(100), 50, Some(b"40")),
            None,
            "over the limit"
        );
        assert_eq!(streamable(Some(100), 1000, Some(b"0")), None, "raw binary");
        assert_eq!(
            streamable(Some(40), 1000, Some(b"40")),
            None,
            "no tensor bytes"
        );
    }
}
