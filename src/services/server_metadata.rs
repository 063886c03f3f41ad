//! What the server says about itself (`GET /v2`, gRPC `ServerMetadata`): the backends' own
//! name and version, because Triton clients (the official health and metadata examples
//! among them) check that the server is `triton`, with those of the backends' protocol
//! extensions that work through the gateway. The gateway names itself elsewhere: in the
//! `server` header and on the admin API.

use crate::gateway::Gateway;
use crate::protocol::{EXTENSIONS, SERVER_NAME, SERVER_VERSION};
use crate::upstream::TritonClient;
use crate::upstream::identity::ServerMetadata;
use serde::Deserialize;
use std::time::Duration;

/// How long a backend's identity is used before it is read again, so a pool upgraded one
/// Triton at a time reports the new version within a minute.
const REFRESH_AFTER: Duration = Duration::from_secs(60);

/// A backend's `GET /v2`.
#[derive(Deserialize)]
struct Reported {
    name: String,
    version: String,
    #[serde(default)]
    extensions: Vec<String>,
}

/// What `GET /v2` and `ServerMetadata` answer: the backends' identity (`server.name`, when
/// set, for the name). Before any backend has answered, the gateway's own name, version and
/// extensions: metadata is answered whenever the gateway is live, as Triton's is.
pub async fn server_metadata(gateway: &Gateway) -> ServerMetadata {
    let mut metadata = backends_identity(gateway)
        .await
        .unwrap_or_else(|| ServerMetadata {
            name: SERVER_NAME.into(),
            version: SERVER_VERSION.into(),
            extensions: EXTENSIONS.iter().map(|e| (*e).to_owned()).collect(),
        });
    if let Some(name) = &gateway.fixed_config().server.name {
        metadata.name.clone_from(name);
    }
    metadata
}

/// The backends' identity: from the cache while it is fresh, else read from the first ready
/// backend that answers (the stale entry when none does); `None` before any has answered.
pub async fn backends_identity(gateway: &Gateway) -> Option<ServerMetadata> {
    let cache = gateway.server_identity();
    let cached = cache.last();
    if let Some(entry) = &cached
        && entry.0.elapsed() < REFRESH_AFTER
    {
        return Some(entry.1.clone());
    }
    match read_from_backends(gateway).await {
        Some(fresh) => {
            cache.keep(fresh.clone());
            Some(fresh)
        }
        None => cached.map(|entry| entry.1.clone()),
    }
}

async fn read_from_backends(gateway: &Gateway) -> Option<ServerMetadata> {
    let timeout = gateway.fixed_config().upstream.health_timeout.0;
    for backend in gateway.pool().ready() {
        let answer = TritonClient::new(&backend, timeout)
            .server_metadata::<Reported>()
            .await;
        match answer {
            Ok(reported) => return Some(through_gateway(reported)),
            Err(error) => {
                let reason = error.describe("server metadata");
                tracing::debug!(backend = backend.name, reason, "no server metadata")
            }
        }
    }
    None
}

/// A backend's identity with only the extensions that work through the gateway.
fn through_gateway(reported: Reported) -> ServerMetadata {
    ServerMetadata {
        name: reported.name,
        version: reported.version,
        extensions: reported
            .extensions
            .into_iter()
            .filter(|e| EXTENSIONS.contains(&e.as_str()))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_extensions_that_cross_a_gateway_are_reported() {
        // Triton 2.51's own list, in its order.
        let triton: Reported = serde_json::from_str(
            r#"{"name":"triton","version":"2.51.0","extensions":["classification","sequence",
            "model_repository","model_repository(unload_dependents)","schedule_policy",
            "model_configuration","system_shared_memory","cuda_shared_memory",
            "binary_tensor_data","parameters","statistics","trace","logging"]}"#,
        )
        .unwrap();
        let reported = through_gateway(triton);
        assert_eq!(
            (reported.name.as_str(), reported.version.as_str()),
            ("triton", "2.51.0")
        );
        assert_eq!(
            reported.extensions,
            [
                "classification",
                "sequence",
                "model_repository",
                "schedule_policy",
                "model_configuration",
                "binary_tensor_data",
                "parameters",
                "statistics"
            ]
        );
    }
}
