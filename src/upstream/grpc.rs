//! Calling a backend over gRPC: an HTTP/2 connection per worker (`multiplex`, multiplexed,
//! kept alive with pings), and every transport failure turned into a `GatewayError` that names
//! the backend, while the backend's own answers (a wrong shape, an unknown model) pass through
//! as the backend wrote them.

use super::Backend;
use super::failure::innermost;
use super::multiplex::{ConnectFailed, Connections, Link};
use crate::config;
use crate::error::GatewayError;
use crate::protocol::encoded::{self, BackendCodec, Encoded};
use crate::protocol::inference::ModelInferRequest;
use crate::protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use http::Uri;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::Status;

/// A backend's gRPC service over this worker's connection: Triton's generated methods
/// (`methods`), and ModelInfer with its answer kept as the backend encoded it (`infer`).
/// Message sizes are not limited here: the front-end limits what clients send, and a
/// backend's answers are trusted.
pub struct InferenceClient {
    link: Link,
    origin: Uri,
}

impl InferenceClient {
    /// The generated client, for every method but a unary inference.
    pub fn methods(self) -> GrpcInferenceServiceClient<Link> {
        GrpcInferenceServiceClient::with_origin(self.link, self.origin)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX)
    }

    /// A unary inference whose answer is passed on unread (`protocol::encoded`). The message
    /// is shared: the caller keeps it for a second send.
    pub async fn infer(
        self,
        request: tonic::Request<Arc<ModelInferRequest>>,
    ) -> Result<tonic::Response<Encoded>, Status> {
        let mut grpc = tonic::client::Grpc::with_origin(self.link, self.origin)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        // A link is always ready (`multiplex::Link`); tower asks that it be asked.
        grpc.ready().await.map_err(Status::from_error)?;
        let path = http::uri::PathAndQuery::from_static(encoded::MODEL_INFER);
        grpc.unary(request, path, BackendCodec::default()).await
    }
}

/// Keep-alive pings on idle and busy connections alike: a backend that vanishes without a
/// FIN (a host gone, a cable pulled) is noticed within interval + timeout, not at the next
/// TCP retransmission timeout minutes later.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A backend's gRPC endpoint. Connections are made on first use, on the worker that uses
/// them: `infergate check` builds backends without serving.
#[derive(Debug)]
pub struct GrpcUpstream {
    connections: Arc<Connections>,
}

impl GrpcUpstream {
    /// Prepares the endpoint from a (validated) URL and the upstream settings; connects lazily.
    /// `tls_ca` verifies an `https://` backend (else the system's roots; rustls with ALPN h2).
    pub fn new(
        url: &str,
        upstream: &config::Upstream,
        tls_ca: Option<&std::path::Path>,
    ) -> Result<Self, String> {
        let uri = crate::config::grpc_endpoint(url)?;
        let tls = uri.scheme_str() == Some("https");
        let connector = crate::tls::https_connector(tls, tls_ca, true, upstream.connect_timeout.0)?;
        Ok(Self {
            connections: Arc::new(Connections::new(
                uri,
                connector,
                upstream.connect_timeout.0,
                (KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT),
            )),
        })
    }

    /// A client over this worker's connection: cheap, one per call.
    pub fn client(&self) -> InferenceClient {
        InferenceClient {
            link: self.connections.link(),
            origin: self.connections.origin(),
        }
    }
}

/// The backend's gRPC client, or an error saying that this backend has no gRPC endpoint.
fn client(backend: &Backend) -> Result<InferenceClient, GatewayError> {
    backend
        .grpc
        .as_ref()
        .map(GrpcUpstream::client)
        .ok_or_else(|| GatewayError::UpstreamUnreachable {
            backend: backend.name.clone(),
            reason: "no gRPC endpoint is configured for this backend (backends[].grpc)".into(),
            refused: false,
        })
}

/// Makes one unary call within `timeout`, with passive health (see `answered`) and the
/// backend's latency recorded.
pub async fn unary<R, Fut>(
    backend: &Arc<Backend>,
    timeout: Duration,
    call: impl FnOnce(InferenceClient) -> Fut,
) -> Result<tonic::Response<R>, GatewayError>
where
    Fut: Future<Output = Result<tonic::Response<R>, Status>>,
{
    let started = Instant::now();
    let response = answered(backend, Some(timeout), call).await?;
    backend.record_latency(started.elapsed());
    Ok(response)
}

/// Opens a stream: its answer's head within the client's deadline when it has one (a stream
/// may wait for its first message as long as the client lets it).
pub async fn open_stream<R, Fut>(
    backend: &Arc<Backend>,
    deadline: Option<Duration>,
    call: impl FnOnce(InferenceClient) -> Fut,
) -> Result<tonic::Response<R>, GatewayError>
where
    Fut: Future<Output = Result<tonic::Response<R>, Status>>,
{
    answered(backend, deadline, call).await
}

/// A call's answer (a unary answer, or a stream's head) within `timeout`, with passive
/// health: connection failures count against the backend, any answer (even an error status)
/// resets the count. The one place a gRPC call to a backend is bounded and its failure named.
async fn answered<R, Fut>(
    backend: &Arc<Backend>,
    timeout: Option<Duration>,
    call: impl FnOnce(InferenceClient) -> Fut,
) -> Result<tonic::Response<R>, GatewayError>
where
    Fut: Future<Output = Result<tonic::Response<R>, Status>>,
{
    let answer = call(client(backend)?);
    let answer = match timeout {
        Some(after) => tokio::time::timeout(after, answer)
            .await
            .map_err(|_| super::failure::no_answer_within(&backend.name, after))?,
        None => answer.await,
    };
    match answer {
        Ok(response) => {
            backend.record_success();
            Ok(response)
        }
        Err(status) => Err(classify(backend, status)),
    }
}

/// Tells a transport failure (the status was made from an error under tonic's client: it has
/// a source) from the backend's own answer (no source), and counts connection failures.
pub fn classify(backend: &Backend, status: Status) -> GatewayError {
    let Some(source) = std::error::Error::source(&status) else {
        backend.record_success();
        return GatewayError::Backend(status);
    };
    let mut next = Some(source);
    while let Some(error) = next {
        if let Some(failed) = error.downcast_ref::<ConnectFailed>() {
            let unreachable = GatewayError::UpstreamUnreachable {
                backend: backend.name.clone(),
                reason: failed.reason.clone(),
                refused: failed.refused,
            };
            backend.record_error(&unreachable);
            return unreachable;
        }
        next = error.source();
    }
    GatewayError::UpstreamFailed {
        backend: backend.name.clone(),
        reason: format!("{}: {}", status.message(), innermost(source)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_host_and_port_only() {
        assert_eq!(
            crate::config::grpc_endpoint("http://127.0.0.1:8001/")
                .unwrap()
                .to_string(),
            "http://127.0.0.1:8001/"
        );
        assert!(
            crate::config::grpc_endpoint("h2c://x:1")
                .unwrap_err()
                .contains("unsupported URL")
        );
        assert_eq!(
            crate::config::grpc_endpoint("https://x:1")
                .unwrap()
                .scheme_str(),
            Some("https")
        );
        assert!(crate::config::grpc_endpoint("http://").is_err());
        assert!(
            crate::config::grpc_endpoint("http://x:1/v2")
                .unwrap_err()
                .contains("path")
        );
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
        match classify(&backend, Status::invalid_argument("bad shape")) {
            GatewayError::Backend(status) => assert_eq!(status.message(), "bad shape"),
            other => panic!("{other:?}"),
        }
        // What tonic's client makes of a connection attempt that failed under it.
        let refused = Status::from_error(Box::new(ConnectFailed {
            reason: "Connection refused".into(),
            refused: true,
        }));
        match classify(&backend, refused) {
            error @ GatewayError::UpstreamUnreachable { .. } => {
                assert_eq!(error.grpc_code(), tonic::Code::Unavailable);
                assert!(error.to_string().contains("Connection refused"), "{error}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(backend.last_error().as_deref(), Some("Connection refused"));
        // A working connection that broke: named, but not counted as unreachable.
        let reset = Status::from_error(Box::new(std::io::Error::other("connection reset")));
        match classify(&backend, reset) {
            error @ GatewayError::UpstreamFailed { .. } => {
                assert!(error.to_string().contains("connection reset"), "{error}");
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
        let answer = unary(&backend, Duration::from_secs(5), |c| async move {
            c.methods()
                .server_live(crate::protocol::inference::ServerLiveRequest {})
                .await
        })
        .await;
        assert!(started.elapsed() < Duration::from_secs(2));
        match answer {
            Err(error @ GatewayError::UpstreamUnreachable { refused: true, .. }) => {
                assert_eq!(error.grpc_code(), tonic::Code::Unavailable);
            }
            other => panic!("expected a refused connection, got {other:?}"),
        }
        assert!(backend.last_error().is_some());
    }
}
