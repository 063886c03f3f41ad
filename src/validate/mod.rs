//! `validate`: every inference request is checked against the model's signature before it
//! is sent to a backend, so a malformed request costs Triton nothing and the client still
//! gets Triton's own words for what was wrong (HTTP 400, `{"error": "..."}`).
//!
//! The stage has three parts, so gRPC can reuse all but the first:
//! - a front-end reader turns the wire format into a protocol-neutral `InferRequest` (input
//!   names, datatypes, shapes, and where the data is, by size): `http::parse` for HTTP/REST,
//!   with the checks Triton's HTTP reader makes while reading;
//! - `check` compares that request with the model's `Signature`, in Triton's order;
//! - `SignatureCache` holds signatures per (model, version), fetched from a backend that
//!   serves the model.
//!
//! Never refuse what Triton would accept: when the signature cannot be had, or the request
//! is of a kind the gateway does not read (compressed, raw binary), it is forwarded as it
//! came. Checks were measured against Triton 2.51 request by request (tests/validation.rs
//! replays them against a real server).

pub mod check;
pub mod datatype;
pub mod generate;
pub mod http;
pub mod json;
pub mod request;
pub mod signature;
pub mod triton_order;

pub use check::check;
pub use datatype::DataType;
pub use request::{InferRequest, InputTensor, Reason, Rejection, TensorData};
pub use signature::{InputSpec, Signature, SignatureCache};

use crate::Gateway;
use crate::error::GatewayError;
use crate::pipeline::ModelRef;
use crate::upstream::Backend;
use axum::body::Body;
use axum::extract::Request;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use std::sync::Arc;

/// The `Inference-Header-Content-Length` header of the binary tensor extension.
pub(crate) const HEADER_LENGTH: &str = "inference-header-content-length";

/// Checks an HTTP request to `model` before it is forwarded to `backend`, and returns the
/// request to forward. Only inference requests with `validation.enabled` are read; anything
/// else, and any inference request whose signature is unavailable, passes through untouched
/// and streaming. A binary request with a `Content-Length` is checked from its JSON header
/// alone (fixed-size tensors by their sizes) and forwarded as its bytes arrive; any other
/// body is collected once and forwarded as those same bytes.
pub async fn http_request(
    gateway: &Gateway,
    backend: &Arc<Backend>,
    model: &ModelRef,
    request: Request,
) -> Result<Request, GatewayError> {
    let path = request.uri().path();
    let post = request.method() == ::http::Method::POST;
    let is_infer = post && path.ends_with("/infer");
    let is_generate = post && (path.ends_with("/generate") || path.ends_with("/generate_stream"));
    if !gateway.config().validation.enabled || !(is_infer || is_generate) {
        return Ok(request);
    }
    let Some(signature) = gateway.signatures().get(backend, model).await else {
        return Ok(request);
    };
    if is_generate {
        return generate_request(gateway, &signature, model, request).await;
    }
    let (parts, body) = request.into_parts();
    let limit = gateway.config().server.max_body_size.bytes();
    let declared: Option<u64> = parts
        .headers
        .get(::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let header = |name| parts.headers.get(name).map(::http::HeaderValue::as_bytes);
    let read = |body: http::BodyView<'_>| {
        http::parse(
            body,
            header(HEADER_LENGTH),
            header(::http::header::CONTENT_ENCODING.as_str()),
            &model.name,
        )
    };
    let whole = match streamable(declared, limit, header(HEADER_LENGTH)) {
        Some((length, header_length)) => {
            let (head, rest) = read_head(body, header_length, limit).await?;
            let view = http::BodyView {
                arrived: &head,
                length,
            };
            match read(view) {
                Ok(http::Parsed::Incomplete) => join(head, rest, limit, declared).await?,
                outcome => {
                    judge(outcome, view, &signature, model)?;
                    return Ok(Request::from_parts(parts, stream_on(head, rest)));
                }
            }
        }
        None => collect(body, limit, declared).await?,
    };
    let view = http::BodyView::whole(&whole);
    judge(read(view), view, &signature, model)?;
    Ok(Request::from_parts(parts, Body::from(whole)))
}

/// A generate request: its (small) body read whole, checked as Triton converts it, and
/// forwarded as those same bytes.
async fn generate_request(
    gateway: &Gateway,
    signature: &Signature,
    model: &ModelRef,
    request: Request,
) -> Result<Request, GatewayError> {
    let (parts, body) = request.into_parts();
    let limit = gateway.config().server.max_body_size.bytes();
    let declared: Option<u64> = parts
        .headers
        .get(::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let whole = collect(body, limit, declared).await?;
    let verdict = match generate::parse(&whole, signature) {
        Ok(generate::Generate::Request(parsed)) => check(&parsed, signature),
        Ok(generate::Generate::Unvalidated(why)) => {
            tracing::debug!(model = %model.name, why, "generate request forwarded unvalidated");
            Ok(())
        }
        Err(rejection) => Err(rejection),
    };
    verdict.map_err(|rejection| refuse(rejection, model))?;
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

/// Reads frames until at least `wanted` bytes have arrived: those bytes (one frame kept as
/// it is, several joined), and the body with the rest.
pub(crate) async fn read_head(
    mut body: Body,
    wanted: usize,
    limit: u64,
) -> Result<(Bytes, Body), GatewayError> {
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut arrived = 0;
    while arrived < wanted {
        let Some(frame) = body.frame().await else {
            break;
        };
        if let Ok(data) = frame
            .map_err(|error| read_error(&error, limit))?
            .into_data()
        {
            arrived += data.len();
            chunks.push(data);
        }
    }
    let head = match chunks.len() {
        1 => chunks.pop().expect("one chunk"),
        _ => {
            let mut head = BytesMut::with_capacity(arrived);
            chunks
                .iter()
                .for_each(|chunk| head.extend_from_slice(chunk));
            head.freeze()
        }
    };
    Ok((head, body))
}

/// The whole body, when the head read first is not enough to check the request.
async fn join(
    head: Bytes,
    rest: Body,
    limit: u64,
    declared: Option<u64>,
) -> Result<Bytes, GatewayError> {
    let rest = collect(rest, limit, None).await?;
    if rest.is_empty() {
        return Ok(head);
    }
    let mut whole =
        BytesMut::with_capacity(declared.map_or(head.len() + rest.len(), |n| n as usize));
    whole.extend_from_slice(&head);
    whole.extend_from_slice(&rest);
    Ok(whole.freeze())
}

/// The body to forward: the head already read, then the rest as it arrives.
pub(crate) fn stream_on(head: Bytes, rest: Body) -> Body {
    use futures_util::StreamExt as _;
    let head = futures_util::stream::once(async move { Ok::<_, axum::Error>(head) });
    let rest = rest.into_data_stream();
    Body::from_stream(head.chain(rest))
}

/// Turns the reader's and checker's verdict into the gateway's answer, counting a refusal.
fn judge(
    outcome: Result<http::Parsed, Rejection>,
    body: http::BodyView<'_>,
    signature: &Signature,
    model: &ModelRef,
) -> Result<(), GatewayError> {
    let verdict = match outcome {
        Ok(http::Parsed::Request(parsed)) => check(&parsed, signature),
        Ok(http::Parsed::Raw) => check::check_raw(body.length as u64, signature),
        Ok(http::Parsed::Unvalidated(why)) => {
            tracing::debug!(model = %model.name, why, "inference request forwarded unvalidated");
            Ok(())
        }
        Ok(http::Parsed::Incomplete) => unreachable!("read again with the whole body"),
        Err(rejection) => Err(rejection),
    };
    verdict.map_err(|rejection| refuse(rejection, model))
}

/// The answer to a request the checks refused, counted in
/// `infergate_validation_rejections_total`: one place for both front-ends.
pub(crate) fn refuse(rejection: Rejection, model: &ModelRef) -> GatewayError {
    metrics::counter!(crate::telemetry::VALIDATION_REJECTIONS,
        "model" => model.name.clone(),
        "reason" => rejection.reason.as_str())
    .increment(1);
    GatewayError::InvalidInput {
        reason: rejection.reason.as_str(),
        message: rejection.message,
    }
}

/// The whole body, read within the body limit (a body that is already limited answers with
/// `BodyTooLarge` once it passes it). A body that arrives in one chunk is kept as it is; one
/// in several is copied once into a buffer sized by `Content-Length`, so a request never
/// holds much more than its own size.
pub(crate) async fn collect(
    mut body: Body,
    limit: u64,
    declared: Option<u64>,
) -> Result<Bytes, GatewayError> {
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| read_error(&error, limit))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        match (&mut joined, first.take()) {
            (Some(buffer), _) => buffer.extend_from_slice(&data),
            (None, None) => first = Some(data),
            (None, Some(head)) => {
                let capacity = declared.unwrap_or(0).min(limit) as usize;
                let mut buffer = BytesMut::with_capacity(capacity.max(head.len() + data.len()));
                buffer.extend_from_slice(&head);
                buffer.extend_from_slice(&data);
                joined = Some(buffer);
            }
        }
    }
    Ok(match joined {
        Some(buffer) => buffer.freeze(),
        None => first.unwrap_or_default(),
    })
}

fn read_error(error: &axum::Error, limit: u64) -> GatewayError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if e.is::<crate::body::BodyTooLarge>() {
            return GatewayError::BodyTooLarge { limit };
        }
        source = e.source();
    }
    GatewayError::BadRequest(format!("could not read request body: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked(chunks: &[&'static str]) -> Body {
        let chunks: Vec<Result<Bytes, std::io::Error>> = chunks
            .iter()
            .map(|c| Ok(Bytes::from_static(c.as_bytes())))
            .collect();
        Body::from_stream(futures_util::stream::iter(chunks))
    }

    #[tokio::test]
    async fn reads_a_head_and_streams_the_rest_unchanged() {
        let (head, rest) = read_head(chunked(&["ab", "cd", "ef", "gh"]), 3, 100)
            .await
            .unwrap();
        assert_eq!(head, "abcd", "whole frames until the wanted bytes are in");
        let forwarded = stream_on(head, rest).collect().await.unwrap().to_bytes();
        assert_eq!(forwarded, "abcdefgh");
        let (head, rest) = read_head(chunked(&["abcdef", "gh"]), 3, 100).await.unwrap();
        assert_eq!(head, "abcdef");
        assert_eq!(join(head, rest, 100, Some(8)).await.unwrap(), "abcdefgh");
        let (head, _) = read_head(chunked(&["ab"]), 3, 100).await.unwrap();
        assert_eq!(head, "ab", "a body shorter than wanted is all there is");
    }

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

    #[tokio::test]
    async fn collects_a_body_once_within_the_limit() {
        let body = collect(chunked(&["ab", "cd", "e"]), 100, Some(5))
            .await
            .unwrap();
        assert_eq!(body, "abcde");
        let whole = Bytes::from_static(b"one chunk");
        let kept = collect(Body::from(whole.clone()), 100, None).await.unwrap();
        assert_eq!(
            kept.as_ptr(),
            whole.as_ptr(),
            "a single chunk is not copied"
        );
        assert!(collect(chunked(&[]), 100, None).await.unwrap().is_empty());
        let limited = crate::body::limited(chunked(&["abc", "def"]), 4);
        assert!(matches!(
            collect(limited, 4, None).await,
            Err(GatewayError::BodyTooLarge { limit: 4 })
        ));
    }
}
