//! Calling a backend: on the workers, HTTP/1.1 connections driven by the requests that use them
//! (`driven`); elsewhere, and for TLS and h2c backends, one pooled hyper client per backend and
//! worker. Bodies stream both ways, and every failure becomes a `GatewayError` that says which
//! backend and what happened.

use super::Backend;
use super::driven::Driven;
use crate::config;
use crate::config::BackendUrl;
use crate::error::GatewayError;
use crate::worker::PerWorker;
use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, Method, Request, Response, StatusCode, Uri, header};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A keep-alive connection pool to one backend.
#[derive(Clone, Debug)]
pub struct UpstreamClient {
    /// One pool per worker, and one for background work (see `new`).
    clients: Arc<PerWorker<Client<crate::tls::HttpsConnector, Body>>>,
    /// A plain HTTP/1.1 backend's connections for the workers' requests.
    driven: Option<Arc<Driven>>,
    request_timeout: Duration,
    /// Named in the error when a connection attempt runs out of it.
    connect_timeout: Duration,
}

impl UpstreamClient {
    /// Builds the pool with the configured timeouts; HTTP/2 only when the URL asks for it,
    /// TLS (verified against `tls_ca`, else the system's roots) for `https://` URIs when `tls`
    /// (the backend has one: its base or metrics URL). A plain backend's connections stay
    /// plain TCP: the connector only wraps `https://`.
    pub fn new(
        url: &BackendUrl,
        config: &config::Upstream,
        tls: bool,
        tls_ca: Option<&std::path::Path>,
    ) -> Result<Self, String> {
        let connector = crate::tls::https_connector(tls, tls_ca, false, config.connect_timeout.0)?;
        let mut builder = Client::builder(TokioExecutor::new());
        builder
            .pool_idle_timeout(config.pool_idle_timeout.0)
            .pool_max_idle_per_host(config.pool_max_idle)
            .http2_only(url.http2);
        // A pool per worker, so a connection's task runs on the thread whose requests use it
        // (14-29% less CPU per request with two workers, measured in
        // loadtest/results/2026-12-02-workers-accept-path.md), and one for background work.
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        let driven = (!url.http2 && !url.tls).then(|| Driven::new(url.address(), workers, config));
        Ok(Self {
            clients: Arc::new(PerWorker::new(|| builder.build(connector.clone()))),
            driven,
            request_timeout: config.request_timeout.0,
            connect_timeout: config.connect_timeout.0,
        })
    }

    /// This thread's pool.
    fn client(&self) -> &Client<crate::tls::HttpsConnector, Body> {
        self.clients.get()
    }

    /// Sends a request and answers with the head of the answer, its body streaming behind,
    /// or `GatewayError::UpstreamTimeout` when that head has not come by `request_timeout`.
    async fn send(
        &self,
        backend: &str,
        request: Request<Body>,
    ) -> Result<Response<Body>, GatewayError> {
        if let Some(driven) = &self.driven
            && let Some(worker) = driven.worker()
        {
            return driven.send(worker, backend, request).await;
        }
        match tokio::time::timeout(self.request_timeout, self.client().request(request)).await {
            Ok(Ok(response)) => Ok(response.map(Body::new)),
            Ok(Err(error)) => Err(classify(backend, &error, self.connect_timeout)),
            Err(_) => Err(super::failure::no_answer_within(
                backend,
                self.request_timeout,
            )),
        }
    }

    /// Sends a small control request (health, index, load) to a path on the backend and
    /// reads the whole answer. Only `TritonClient` calls it: every control call is typed.
    pub(super) async fn call(
        &self,
        backend: &Backend,
        method: Method,
        path: &str,
        body: Bytes,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), GatewayError> {
        let uri = backend
            .url
            .join(path)
            .map_err(|e| GatewayError::BadRequest(format!("invalid path {path:?}: {e}")))?;
        self.fetch(&backend.name, method, uri, body, timeout).await
    }

    /// Sends a small request to any URI of this backend (its metrics port, say) and reads the
    /// whole answer within `timeout`.
    pub(super) async fn fetch(
        &self,
        backend: &str,
        method: Method,
        uri: Uri,
        body: Bytes,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), GatewayError> {
        let mut request = Request::builder().method(method).uri(uri);
        if !body.is_empty() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        let request = request.body(Body::from(body)).expect("valid request parts");
        let exchange = async {
            let response = self.client().request(request).await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((status, body))
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => Err(classify(backend, error.as_ref(), self.connect_timeout)),
            Err(_) => Err(super::failure::no_answer_within(backend, timeout)),
        }
    }
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) are about one connection and are never forwarded.
static HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // A request has a handful of headers and seldom more than one of these: one pass over
    // them finds what to remove, where removing every name would hash each of the eight.
    while let Some(name) = headers.keys().find(|name| is_hop_by_hop(name)).cloned() {
        headers.remove(&name);
    }
}

/// Transfer-Encoding is re-decided by hyper for each side; leaving it would double-chunk.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == header::TRANSFER_ENCODING || HOP_BY_HOP.contains(name)
}

/// Forwards a client request to a backend as it is (same method, path, query, headers and
/// streamed body) and streams the answer back. Passive health: connection failures (refused,
/// reset, closed before an answer) count against the backend, successes reset the count.
pub async fn forward(
    backend: &Arc<Backend>,
    request: Request<Body>,
) -> Result<Response<Body>, GatewayError> {
    let (mut parts, body) = request.into_parts();
    parts.uri = backend
        .url
        .forward_uri(&parts.uri)
        .map_err(|e| GatewayError::BadRequest(format!("invalid request path: {e}")))?;
    strip_hop_by_hop(&mut parts.headers);
    // The version is the backend's, not the client's: a client on HTTP/2 may be forwarded
    // to an HTTP/1.1 backend and the other way round. (With `http2_only` hyper speaks
    // HTTP/2 whatever the field says; it is set so the request says what goes on the wire.)
    if backend.url.http2 {
        parts.headers.remove(header::HOST); // HTTP/2 names the backend in :authority
        parts.version = http::Version::HTTP_2;
    } else {
        // The backend's own name, as hyper would write it, but made once per backend.
        parts
            .headers
            .insert(header::HOST, backend.url.host().clone());
        parts.version = http::Version::HTTP_11;
    }

    let started = Instant::now();
    let sent = backend
        .client
        .send(&backend.name, Request::from_parts(parts, body));
    let response = match sent.await {
        Ok(response) => response,
        Err(error) => {
            backend.record_error(&error);
            return Err(error);
        }
    };
    backend.record_answer(response.status());
    backend.record_latency(started.elapsed());
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, body))
}

/// Names the failure: a body over the limit is the client's; a connection that could not be
/// made means the backend is unreachable; a connection it closed or reset before any answer
/// came (ours, not the client's body failing) may be sent on again; anything else broke
/// mid-exchange. A connection attempt that timed out says so with the timeout (the
/// connector's own words are tokio's "deadline has elapsed", which names neither).
pub(super) fn classify(
    backend: &str,
    error: &(dyn std::error::Error + 'static),
    connect_timeout: Duration,
) -> GatewayError {
    if let Some(limit) = crate::body::too_large(error) {
        return GatewayError::BodyTooLarge { limit };
    }
    if let Some(slow) = crate::body::client_too_slow(error) {
        return slow;
    }
    let connect = super::failure::chain(error).any(|e| {
        e.downcast_ref::<hyper_util::client::legacy::Error>()
            .is_some_and(hyper_util::client::legacy::Error::is_connect)
    });
    let closed = super::failure::chain(error).any(|e| {
        e.downcast_ref::<hyper::Error>().is_some_and(|e| {
            e.is_incomplete_message() || (!e.is_user() && super::failure::reset(e))
        })
    });
    if connect {
        GatewayError::UpstreamUnreachable {
            backend: backend.to_string(),
            reason: super::failure::connect_reason(error, connect_timeout),
            refused: super::failure::refused(error),
        }
    } else if closed {
        GatewayError::UpstreamClosed {
            backend: backend.to_string(),
        }
    } else {
        GatewayError::UpstreamFailed {
            backend: backend.to_string(),
            reason: super::failure::innermost(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go_and_the_rest_stay_in_order() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("content-type", "application/json"),
            ("connection", "keep-alive"),
            ("x-request-id", "a"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("proxy-authorization", "Basic eA=="),
            ("x-request-id", "b"),
            ("upgrade", "h2c"),
            ("trailer", "grpc-status"),
            ("proxy-authenticate", "Basic"),
        ] {
            headers.append(HeaderName::from_static(name), value.parse().unwrap());
        }
        strip_hop_by_hop(&mut headers);
        let left: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            left,
            [
                ("content-type", "application/json"),
                ("x-request-id", "a"),
                ("x-request-id", "b")
            ]
        );
        let mut none = HeaderMap::new();
        strip_hop_by_hop(&mut none);
        assert!(none.is_empty());
    }
}
