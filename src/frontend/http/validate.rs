//! The HTTP front-end's part of the `validate` phase's reader: the body plumbing. An
//! inference request's body is fed to `validate::http` (JSON, or the binary tensor
//! extension's JSON header), a generate request's to `validate::generate`; the phase
//! (`pipeline::validate`) has already decided to read it and refuses what they refuse. An
//! inference's body has arrived before this (`wire::HttpWire::arrive`): one that came in one
//! chunk is read as those bytes (`body::Payload::Whole`). Of one that came in several, a
//! binary request with a `Content-Length` is checked from its JSON header alone (fixed-size
//! tensors by their sizes) and its tensors forwarded in the chunks they came in, never
//! joined; any other body is collected once and forwarded as those same bytes.

use super::body::{BodyHeaders, Payload, collect, join, read_head, stream_on};
use crate::error::GatewayError;
use crate::model::ModelRef;
use crate::pipeline::RequestCtx;
use crate::validate::{self, Signature, Verdict, generate};
use http::request::Parts;

/// The `Inference-Header-Content-Length` header of the binary tensor extension.
pub(super) const HEADER_LENGTH: http::HeaderName =
    http::HeaderName::from_static("inference-header-content-length");

/// The JSON header's length a request's `HEADER_LENGTH` value gives, when it is a number:
/// the front-end's readings before validation (the sequence, whether the body can stream)
/// take it as given; `validate::http` refuses a malformed one in Triton's words.
pub(super) fn header_length(value: &[u8]) -> Option<usize> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

/// Reads an inference request to `model` (its head's parts and its body) and checks it against
/// `signature`: the verdict, and the body to forward (read, or its head read and the rest
/// streaming on).
pub(super) async fn read(
    ctx: &RequestCtx,
    model: &ModelRef,
    signature: &Signature,
    (parts, sent): (&Parts, &BodyHeaders),
    body: Payload,
) -> Result<(Payload, Verdict), GatewayError> {
    let path = parts.uri.path();
    let declared = sent.declared;
    if path.ends_with("/generate") || path.ends_with("/generate_stream") {
        return generate_request(ctx, signature, declared, body).await;
    }
    let limit = ctx.gateway.fixed_config().server.max_body_size.bytes();
    let headers = Headers {
        header_length: sent.header_length.as_ref().map(http::HeaderValue::as_bytes),
        encoding: sent.encoding.as_ref().map(http::HeaderValue::as_bytes),
    };
    let whole = match (body, streamable(declared, limit, headers.header_length)) {
        (Payload::Whole(whole), _) => whole,
        (Payload::Streaming(body), Some((length, header_length))) => {
            let (head, rest) = read_head(body, header_length, limit).await?;
            let view = validate::http::BodyView {
                arrived: &head,
                length,
            };
            match parse(view, headers, model) {
                Ok(validate::http::Parsed::Incomplete) => join(head, rest, limit, declared).await?,
                parsed => {
                    let verdict = validate::http::verdict(parsed, view, signature);
                    return Ok((Payload::Streaming(stream_on(head, rest)), verdict));
                }
            }
        }
        (Payload::Streaming(body), None) => collect(body, limit, declared).await?,
    };
    let view = validate::http::BodyView::whole(&whole);
    let verdict = validate::http::verdict(parse(view, headers, model), view, signature);
    Ok((Payload::Whole(whole), verdict))
}

/// The request's headers that the reader reads.
#[derive(Clone, Copy)]
struct Headers<'h> {
    /// `Inference-Header-Content-Length`.
    header_length: Option<&'h [u8]>,
    /// `Content-Encoding`.
    encoding: Option<&'h [u8]>,
}

/// Reads `body` as the request with these headers for `model` (`validate::http::parse`).
fn parse<'a>(
    body: validate::http::BodyView<'a>,
    headers: Headers<'_>,
    model: &ModelRef,
) -> Result<validate::http::Parsed<'a>, validate::Rejection> {
    validate::http::parse(body, headers.header_length, headers.encoding, &model.name)
}

/// A generate request: its (small) body read whole, checked as Triton converts it, and
/// forwarded as those same bytes.
async fn generate_request(
    ctx: &RequestCtx,
    signature: &Signature,
    declared: Option<u64>,
    body: Payload,
) -> Result<(Payload, Verdict), GatewayError> {
    let limit = ctx.gateway.fixed_config().server.max_body_size.bytes();
    let whole = body.collect(limit, declared).await?;
    let verdict = generate::verdict(&whole, signature);
    Ok((Payload::Whole(whole), verdict))
}

/// The body's length and JSON header's length when the request can be checked before its
/// tensors arrive: a binary request (`Inference-Header-Content-Length` between 1 and the
/// body's `Content-Length`) within the body limit.
fn streamable(
    declared: Option<u64>,
    limit: u64,
    header_length: Option<&[u8]>,
) -> Option<(usize, usize)> {
    let length = usize::try_from(declared.filter(|&n| n <= limit)?).ok()?;
    let header_length = self::header_length(header_length?)?;
    (header_length > 0 && header_length < length).then_some((length, header_length))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_only_binary_requests_with_a_length_within_the_limit() {
        assert_eq!(
            header_length(b" 40 "),
            Some(40),
            "blanks around it are read past"
        );
        assert_eq!(header_length(b"4o"), None);
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
