//! Calling a backend over gRPC: one tonic `Channel` per backend (a single HTTP/2 connection,
//! multiplexed, kept alive with pings), and every transport failure turned into a
//! `GatewayError` that names the backend, while the backend's own answers (a wrong shape, an
//! unknown model) pass through as the backend wrote them.

use super::Backend;
use crate::config;
use crate::error::GatewayError;
use crate::protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use http::Uri;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tonic::Status;
use tonic::transport::{Channel, Endpoint};

/// The generated client over a backend's channel.
pub type InferenceClient = GrpcInferenceServiceClient<Channel>;

/// Keep-alive pings on idle and busy connections alike: a backend that vanishes without a
/// FIN (a host gone, a cable pulled) is noticed within interval + timeout, not at the next
/// TCP retransmission timeout minutes later.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Checks a backend's `grpc` URL: `http://host:port`, or `https://host:port` for TLS.
pub fn parse_url(text: &str) -> Result<Uri, String> {
    let (scheme, rest) = if let Some(rest) = text.strip_prefix("http://") {
        ("http", rest)
    } else if let Some(rest) = text.strip_prefix("https://") {
        ("https", rest)
    } else {
        return Err(format!(
            "unsupported URL {text:?} (expected http://host:port or https://host:port of the \
             backend's gRPC endpoint)"
        ));
    };
    let uri: Uri = format!("{scheme}://{}", rest.trim_end_matches('/'))
        .parse()
        .map_err(|e| format!("invalid URL {text:?}: {e}"))?;
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("URL {text:?} has no host"));
    }
    if uri.path() != "/" {
        return Err(format!(
            "URL {text:?} has a path; a gRPC endpoint is only http://host:port"
        ));
    }
    Ok(uri)
}

/// A backend's gRPC endpoint. The channel is made on first use: making one spawns its
/// connection task, which needs the runtime, and `infergate check` builds backends without
/// serving.
#[derive(Debug)]
pub struct GrpcUpstream {
    endpoint: Endpoint,
    /// For `https://`: rustls with ALPN h2 under tonic (tonic's own TLS features are off).
    tls: Option<crate::tls::HttpsConnector>,
    channel: OnceLock<Channel>,
}

impl GrpcUpstream {
    /// Prepares the endpoint from a (validated) URL and the upstream settings; connects lazily.
    /// `tls_ca` verifies an `https://` backend (else the system's roots).
    pub fn new(
        url: &str,
        upstream: &config::Upstream,
        tls_ca: Option<&std::path::Path>,
    ) -> Result<Self, String> {
        let uri = parse_url(url)?;
        let tls = if uri.scheme_str() == Some("https") {
            Some(crate::tls::https_connector(
                true,
                tls_ca,
                true,
                upstream.connect_timeout.0,
            )?)
        } else {
            None
        };
        let endpoint = Endpoint::from(uri)
            .connect_timeout(upstream.connect_timeout.0)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .keep_alive_while_idle(true)
            // Large tensors: let the HTTP/2 windows grow with the measured bandwidth instead
            // of stalling on the 64 KiB default.
            .http2_adaptive_window(true);
        Ok(Self {
            endpoint,
            tls,
            channel: OnceLock::new(),
        })
    }

    /// A client over the shared channel: cheap, one per call. Message sizes are not limited
    /// here: the front-end limits what clients send, and a backend's answers are trusted.
    pub fn client(&self) -> InferenceClient {
        let channel = self
            .channel
            .get_or_init(|| match &self.tls {
                Some(connector) => self.endpoint.connect_with_connector_lazy(connector.clone()),
                None => self.endpoint.connect_lazy(),
            })
            .clone();
        GrpcInferenceServiceClient::new(channel)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX)
    }
}

/// The backend's gRPC client, or an error saying that this backend has no gRPC endpoint.
pub fn client(backend: &Backend) -> Result<InferenceClient, GatewayError> {
    backend
        .grpc
        .as_ref()
        .map(GrpcUpstream::client)
        .ok_or_else(|| GatewayError::UpstreamUnreachable {
            backend: backend.name.clone(),
            reason: "no gRPC endpoint is configured for this backend (backends[].grpc)".into(),
        })
}

/// Makes one unary call within `timeout`, with passive health: connection failures count
/// against the backend, any answer (even an error status) resets the count.
pub async fn unary<R, Fut>(
    backend: &Arc<Backend>,
    timeout: Duration,
    call: impl FnOnce(InferenceClient) -> Fut,
) -> Result<tonic::Response<R>, GatewayError>
where
    Fut: Future<Output = Result<tonic::Response<R>, Status>>,
{
    let client = client(backend)?;
    let started = Instant::now();
    match tokio::time::timeout(timeout, call(client)).await {
        Ok(Ok(response)) => {
            backend.record_success();
            backend.record_latency(started.elapsed());
            Ok(response)
        }
        Ok(Err(status)) => Err(classify(backend, status, Some(timeout))),
        Err(_) => Err(GatewayError::UpstreamTimeout {
            backend: backend.name.clone(),
            after: timeout,
        }),
    }
}

/// Tells a transport failure (tonic made the status from an error of its own: it has a
/// source) from the backend's own answer (no source), and counts connection failures.
/// `timeout` is the `grpc-timeout` the call was sent with: tonic's client enforces it too,
/// and its expiry (which tonic calls CANCELLED) is the backend being too slow.
pub fn classify(backend: &Backend, status: Status, timeout: Option<Duration>) -> GatewayError {
    let Some(source) = std::error::Error::source(&status) else {
        backend.record_success();
        return GatewayError::Backend(status);
    };
    let mut connect = false;
    let mut expired = false;
    let mut innermost = source.to_string();
    let mut next = Some(source);
    while let Some(error) = next {
        connect |= error.is::<tonic::ConnectError>();
        expired |= error.is::<tonic::TimeoutExpired>();
        innermost = error.to_string();
        next = error.source();
    }
    if expired {
        return GatewayError::UpstreamTimeout {
            backend: backend.name.clone(),
            after: timeout.unwrap_or_default(),
        };
    }
    if connect {
        backend.record_connect_failure(&innermost);
        GatewayError::UpstreamUnreachable {
            backend: backend.name.clone(),
            reason: innermost,
        }
    } else {
        GatewayError::UpstreamFailed {
            backend: backend.name.clone(),
            reason: format!("{}: {innermost}", status.message()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_host_and_port_only() {
        assert_eq!(
            parse_url("http://127.0.0.1:8001/").unwrap().to_string(),
            "http://127.0.0.1:8001/"
        );
        assert!(
            parse_url("h2c://x:1")
                .unwrap_err()
                .contains("unsupported URL")
        );
        assert_eq!(
            parse_url("https://x:1").unwrap().scheme_str(),
            Some("https")
        );
        assert!(parse_url("http://").is_err());
        assert!(parse_url("http://x:1/v2").unwrap_err().contains("path"));
    }

    fn backend() -> Backend {
        let config = config::Config::parse(
            "[listen]\nhttp = \"127.0.0.1:0\"\n[[backends]]\nname = \"b\"\n\
             http = \"http://127.0.0.1:1\"\ngrpc = \"http://127.0.0.1:1\"",
        )
        .unwrap();
        Backend::new(&config.backends[0], &config.upstream, 1).unwrap()
    }

    #[test]
    fn answers_pass_through_and_failures_are_named() {
        let backend = backend();
        match classify(&backend, Status::invalid_argument("bad shape"), None) {
            GatewayError::Backend(status) => assert_eq!(status.message(), "bad shape"),
            other => panic!("{other:?}"),
        }
        // tonic's own expiry of the grpc-timeout it sent: the backend was too slow.
        let expired = Status::from_error(Box::new(tonic::TimeoutExpired(())));
        match classify(&backend, expired, Some(Duration::from_millis(300))) {
            error @ GatewayError::UpstreamTimeout { .. } => {
                assert_eq!(error.grpc_code(), tonic::Code::DeadlineExceeded);
                assert_eq!(error.to_string(), "backend 'b' did not answer within 300ms");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn an_unreachable_backend_is_unavailable_fast() {
        let config = config::Config::parse(
            "[listen]\nhttp = \"127.0.0.1:0\"\n[[backends]]\nname = \"gone\"\n\
             http = \"http://127.0.0.1:1\"\ngrpc = \"http://127.0.0.1:1\"",
        )
        .unwrap();
        let backend = Arc::new(Backend::new(&config.backends[0], &config.upstream, 1).unwrap());
        let started = Instant::now();
        let answer = unary(&backend, Duration::from_secs(5), |mut c| async move {
            c.server_live(crate::protocol::inference::ServerLiveRequest {})
                .await
        })
        .await;
        assert!(started.elapsed() < Duration::from_secs(2));
        match answer {
            Err(error @ GatewayError::UpstreamUnreachable { .. }) => {
                assert_eq!(error.grpc_code(), tonic::Code::Unavailable);
            }
            other => panic!("expected unreachable, got {other:?}"),
        }
        assert!(backend.last_error().is_some());
    }
}
