//! The KServe v2 HTTP/REST transport, on hyper's pooled client.
//!
//! hyper-util's legacy `Client` keeps connections alive and reuses them, like
//! any production client would, and adds very little per-request overhead
//! (no middleware stack, no body re-encoding), which matters when the thing
//! being measured is a proxy that itself adds only tens of microseconds.

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::body::EncodedBody;
use crate::outcome::{ErrorKind, check_infer_response};
use crate::sequence::{SequenceRequest, SequenceTemplate, first_http_value};
use crate::transport::Transport;

/// Header of the binary tensor extension that gives the JSON header's length.
pub const INFERENCE_HEADER_CONTENT_LENGTH: &str = "inference-header-content-length";

/// Where requests go and which headers every request carries.
#[derive(Debug, Clone)]
pub struct HttpEndpoint {
    /// The full infer URI, e.g. `http://127.0.0.1:8000/v2/models/add_sub/infer`.
    pub uri: Uri,
    /// Headers added to every request: auth, `--header` values.
    pub headers: HeaderMap,
}

/// Per-step knobs of the HTTP transport.
#[derive(Debug, Clone, Copy)]
pub struct HttpOptions {
    /// Idle connections kept per host; the runner separately caps requests
    /// in flight at the same number, which bounds HTTP/1.1 connections.
    pub connections: usize,
    /// Speak HTTP/2 with prior knowledge (h2c) instead of HTTP/1.1.
    pub http2: bool,
    /// Validate responses (`--check`).
    pub check: bool,
}

/// Builds the infer URI `{base}/v2/models/{model}[/versions/{version}]/infer`.
///
/// Only `http://` is accepted: TLS would measure the TLS stack, and the
/// gateway's benchmarks run on loopback.
pub fn infer_uri(base: &str, model: &str, version: Option<&str>) -> Result<Uri> {
    let base = base.trim_end_matches('/');
    if base.starts_with("https://") {
        bail!("https:// URLs are not supported; use http:// (benchmarks run on loopback)");
    }
    if !base.starts_with("http://") {
        bail!("--url must start with http:// (got {base:?})");
    }
    if model.is_empty() {
        bail!("--model must not be empty");
    }
    let mut s = format!("{base}/v2/models/{}", encode_segment(model));
    if let Some(v) = version {
        s.push_str("/versions/");
        s.push_str(&encode_segment(v));
    }
    s.push_str("/infer");
    s.parse::<Uri>()
        .with_context(|| format!("invalid URL {s:?}"))
}

/// Percent-encodes a path segment (model names may contain characters such
/// as spaces or `/` that would otherwise change the path).
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Builds the headers every request carries from `--bearer`, `--api-key`
/// and the repeatable `--header NAME:VALUE`.
pub fn build_headers(
    bearer: Option<&str>,
    api_key: Option<&str>,
    extra: &[String],
) -> Result<HeaderMap> {
    let mut headers = HeaderMap::new();
    if let Some(token) = bearer {
        let mut v = HeaderValue::from_str(&format!("Bearer {token}"))
            .context("--bearer token is not a valid header value")?;
        v.set_sensitive(true);
        headers.insert(AUTHORIZATION, v);
    }
    if let Some(key) = api_key {
        let mut v = HeaderValue::from_str(key).context("--api-key is not a valid header value")?;
        v.set_sensitive(true);
        headers.insert(HeaderName::from_static("x-api-key"), v);
    }
    for h in extra {
        let Some((name, value)) = h.split_once(':') else {
            bail!("--header {h:?}: expected NAME:VALUE");
        };
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .with_context(|| format!("--header {h:?}: invalid header name"))?;
        let value = HeaderValue::from_str(value.trim())
            .with_context(|| format!("--header {h:?}: invalid header value"))?;
        headers.append(name, value);
    }
    Ok(headers)
}

/// The HTTP transport: a pooled hyper client plus the pre-built requests.
pub struct HttpTransport {
    client: Client<HttpConnector, Full<Bytes>>,
    uri: Uri,
    /// One (body, headers) pair per request variant.
    variants: Vec<(Bytes, HeaderMap)>,
    /// Headers every request carries (auth, `--header`), for requests encoded when sent.
    headers: HeaderMap,
    /// Sequence mode: what each request is made from.
    sequences: Option<SequenceTemplate>,
    check: bool,
}

impl HttpTransport {
    /// Creates a transport with a fresh connection pool. Must be called
    /// inside a tokio runtime (the pool spawns connection tasks).
    pub fn new(endpoint: &HttpEndpoint, bodies: &[EncodedBody], opts: HttpOptions) -> Result<Self> {
        if bodies.is_empty() {
            bail!("no request body to send");
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let mut builder = Client::builder(TokioExecutor::new());
        builder.pool_max_idle_per_host(opts.connections.max(1));
        if opts.http2 {
            builder.http2_only(true);
        }
        let client = builder.build(connector);
        let variants = bodies
            .iter()
            .map(|b| (b.bytes.clone(), content_headers(&endpoint.headers, b)))
            .collect();
        Ok(HttpTransport {
            client,
            uri: endpoint.uri.clone(),
            variants,
            headers: endpoint.headers.clone(),
            sequences: None,
            check: opts.check,
        })
    }

    /// Sequence mode: `infer_sequence` builds each request from `template`.
    pub fn with_sequences(mut self, template: SequenceTemplate) -> Self {
        self.sequences = Some(template);
        self
    }

    async fn send(&self, body: Bytes, headers: HeaderMap) -> Result<Response<Incoming>, ErrorKind> {
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = Method::POST;
        *req.uri_mut() = self.uri.clone();
        *req.headers_mut() = headers;
        self.client.request(req).await.map_err(|e| {
            if e.is_connect() {
                ErrorKind::Connect
            } else {
                ErrorKind::Request
            }
        })
    }
}

/// `base` plus the content headers of `body` (type, binary header length).
fn content_headers(base: &HeaderMap, body: &EncodedBody) -> HeaderMap {
    let mut h = base.clone();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(body.content_type()));
    if let Some(n) = body.header_len {
        h.insert(
            HeaderName::from_static(INFERENCE_HEADER_CONTENT_LENGTH),
            HeaderValue::from(n),
        );
    }
    h
}

/// A response's `Inference-Header-Content-Length`: `Some(Err(()))` when it is not a number.
fn binary_header_len(resp: &Response<Incoming>) -> Option<Result<usize, ()>> {
    resp.headers()
        .get(INFERENCE_HEADER_CONTENT_LENGTH)
        .map(|v| {
            v.to_str()
                .ok()
                .and_then(|s| s.parse::<usize>().ok())
                .ok_or(())
        })
}

impl Transport for HttpTransport {
    async fn infer_sequence(&self, request: &SequenceRequest) -> Result<(), ErrorKind> {
        let template = self.sequences.as_ref().ok_or(ErrorKind::Request)?;
        let body = template.body(request).map_err(|_| ErrorKind::Request)?;
        let headers = content_headers(&self.headers, &body);
        let resp = self.send(body.bytes, headers).await?;
        let status = resp.status();
        let binary_len = binary_header_len(&resp);
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|_| ErrorKind::Body)?
            .to_bytes();
        if status != StatusCode::OK {
            return Err(ErrorKind::Status(status.as_u16()));
        }
        if !self.check {
            return Ok(());
        }
        check_infer_response(&bytes, binary_len)?;
        let value = first_http_value(&bytes, binary_len.and_then(Result::ok));
        if value == Some(request.sum as f64) {
            Ok(())
        } else {
            Err(ErrorKind::CheckSequenceSum)
        }
    }

    async fn infer(&self, seq: u64) -> Result<(), ErrorKind> {
        let (body, headers) = &self.variants[(seq % self.variants.len() as u64) as usize];
        let resp = self.send(body.clone(), headers.clone()).await?;
        let status = resp.status();
        if self.check {
            let binary_len = binary_header_len(&resp);
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|_| ErrorKind::Body)?
                .to_bytes();
            if status != StatusCode::OK {
                return Err(ErrorKind::Status(status.as_u16()));
            }
            check_infer_response(&bytes, binary_len)
        } else {
            // Drain frame by frame without concatenating: the connection is
            // only reusable once the body has been read to the end.
            let mut body = resp.into_body();
            while let Some(frame) = body.frame().await {
                frame.map_err(|_| ErrorKind::Body)?;
            }
            if status.is_success() {
                Ok(())
            } else {
                Err(ErrorKind::Status(status.as_u16()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_infer_uris() {
        assert_eq!(
            infer_uri("http://127.0.0.1:8000", "add_sub", None).unwrap(),
            "http://127.0.0.1:8000/v2/models/add_sub/infer"
        );
        assert_eq!(
            infer_uri("http://localhost:8000/", "add_sub", Some("2")).unwrap(),
            "http://localhost:8000/v2/models/add_sub/versions/2/infer"
        );
        assert_eq!(
            infer_uri("http://h:1/prefix", "a b/c", None).unwrap(),
            "http://h:1/prefix/v2/models/a%20b%2Fc/infer"
        );
        assert!(infer_uri("https://h", "m", None).is_err());
        assert!(infer_uri("h:8000", "m", None).is_err());
        assert!(infer_uri("http://h", "", None).is_err());
    }

    #[test]
    fn builds_headers() {
        let h = build_headers(
            Some("tok"),
            Some("key1"),
            &["x-user-id: alice".into(), "X-Trace:a:b".into()],
        )
        .unwrap();
        assert_eq!(h["authorization"], "Bearer tok");
        assert!(h["authorization"].is_sensitive());
        assert_eq!(h["x-api-key"], "key1");
        assert_eq!(h["x-user-id"], "alice");
        assert_eq!(h["x-trace"], "a:b");
        assert!(build_headers(None, None, &["novalue".into()]).is_err());
        assert!(build_headers(None, None, &["bad name:v".into()]).is_err());
    }
}
