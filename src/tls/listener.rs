//! The server side of a TLS connection: the handshake, with a deadline, and who the client
//! certificate says the peer is. The accept loop (`crate::listen`) runs it in the
//! connection's own task, so a slow or silent client never holds up the next one.

use super::{PeerIdentity, ServerTls};
use crate::telemetry;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the TLS handshake on an accepted connection with the (reloadable) `tls` state; `None`
/// when it fails or takes longer than 10 s, counted by `listener` (`http`, `grpc`, `admin`)
/// and logged at debug level (scanners and health checkers that only open a TCP connection
/// end up here too).
pub async fn handshake(
    tls: &ServerTls,
    stream: TcpStream,
    remote: SocketAddr,
    listener: &'static str,
) -> Option<(TlsStream<TcpStream>, Option<PeerIdentity>)> {
    let acceptor = TlsAcceptor::from(tls.server_config());
    let failure = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => {
            let identity = tls.peer_identity(stream.get_ref().1);
            return Some((stream, identity));
        }
        Ok(Err(error)) => error.to_string(),
        Err(_) => "handshake timed out".to_string(),
    };
    tracing::debug!(%remote, listener, error = failure, "TLS handshake failed");
    metrics::counter!(telemetry::TLS_HANDSHAKE_FAILURES, "listener" => listener).increment(1);
    None
}
