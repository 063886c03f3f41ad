//! The pool seen as one model repository, for every front-end: the merged index, what a
//! load's parameters ask for, and the fan-out that asks every ready backend the same
//! control question.

use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::upstream::{Backend, ModelEntry, TritonClient, TritonError};
use bytes::Bytes;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// The config override a load asks for, from its parameters (name, and the value when it is
/// a string), as Triton's repository API takes them: `config`, a JSON `ModelConfig` in a
/// string, is placement's to apply to every copy; `file:<path>` parameters (model files in
/// the request) and any other are refused, naming them. A `config` that is not a JSON
/// object is refused before any load, with Triton's "failed to load".
pub fn load_config<'a>(
    model: &str,
    parameters: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> Result<Option<Arc<str>>, GatewayError> {
    let mut config = None;
    let mut refused: Vec<&str> = Vec::new();
    for (name, value) in parameters {
        match (name, value) {
            ("config", Some(text)) => config = Some(text),
            ("config", None) => {
                return Err(GatewayError::BadRequest(format!(
                    "failed to load '{model}': the 'config' parameter must be a string holding \
                     the model configuration as JSON"
                )));
            }
            (name, _) if name.starts_with("file:") => {
                return Err(GatewayError::BadRequest(format!(
                    "failed to load '{model}': model files in the load request ('{name}') are \
                     not supported through infergate: each copy is loaded from its backend's \
                     model repository; put the files there"
                )));
            }
            (name, _) => refused.push(name),
        }
    }
    if !refused.is_empty() {
        refused.sort_unstable();
        return Err(GatewayError::BadRequest(format!(
            "failed to load '{model}': unknown load parameter(s) {}: only 'config' is taken",
            refused.join(", ")
        )));
    }
    let Some(text) = config else { return Ok(None) };
    crate::placement::check_override(text).map_err(|reason| {
        GatewayError::BadRequest(format!("failed to load '{model}': {reason}"))
    })?;
    Ok(Some(Arc::from(text)))
}

/// The backends that take traffic now, or `NoBackendReady`.
pub fn ready_backends(gateway: &Gateway) -> Result<Vec<Arc<Backend>>, GatewayError> {
    let ready: Vec<_> = gateway.pool().ready();
    if ready.is_empty() {
        Err(GatewayError::NoBackendReady)
    } else {
        Ok(ready)
    }
}

/// Asks every backend in `backends` the same control question (`ask`, over its Triton
/// API), concurrently, each within `upstream.request_timeout`; the answers in their order.
pub async fn ask_all<'a, T, F, Fut>(
    gateway: &Gateway,
    backends: &'a [Arc<Backend>],
    ask: F,
) -> Vec<Result<T, TritonError>>
where
    F: Fn(TritonClient<'a>) -> Fut,
    Fut: Future<Output = Result<T, TritonError>>,
{
    let timeout = gateway.fixed_config().upstream.request_timeout.0;
    let calls = backends
        .iter()
        .map(|backend| ask(TritonClient::new(backend, timeout)));
    futures_util::future::join_all(calls).await
}

/// What an index request asks of the repository, in the two forms clients send it.
#[derive(Clone, Debug)]
pub enum IndexRequest {
    /// Only the models that are ready (`true`), or every model: gRPC's `ready` field.
    Ready(bool),
    /// A client's JSON body as it wrote it (`{"ready": true}`, say), given to every backend
    /// unread so that Triton judges it, and words the refusal of a malformed one, as it
    /// would answer the client directly.
    Json(Bytes),
}

impl IndexRequest {
    /// The body of Triton's `POST /v2/repository/index`.
    fn body(&self) -> Bytes {
        match self {
            Self::Ready(true) => Bytes::from_static(br#"{"ready":true}"#),
            Self::Ready(false) => Bytes::from_static(br#"{"ready":false}"#),
            Self::Json(body) => body.clone(),
        }
    }
}

/// The pool's repository index: every ready backend's index, merged (one row per model and
/// version, READY where any backend has it). A backend's refusal of the request (a
/// malformed body, say) is passed on as `GatewayError::BackendRefused`.
pub async fn index(
    gateway: &Gateway,
    request: &IndexRequest,
) -> Result<Vec<ModelEntry>, GatewayError> {
    let backends = ready_backends(gateway)?;
    let body = request.body();
    let mut indexes = Vec::with_capacity(backends.len());
    let asked = ask_all(gateway, &backends, |triton| {
        let body = body.clone();
        async move { triton.repository_index(body).await }
    });
    for answer in asked.await {
        indexes.push(answer.map_err(TritonError::passed_on)?.into_entries());
    }
    Ok(merge(indexes))
}

/// Merges backends' indexes: one row per model and version, the READY row where any backend
/// has one; a model loaded somewhere is listed by its versions, not also as a bare name.
pub fn merge(indexes: impl IntoIterator<Item = Vec<ModelEntry>>) -> Vec<ModelEntry> {
    let mut merged: BTreeMap<(String, Option<String>), ModelEntry> = BTreeMap::new();
    for entry in indexes.into_iter().flatten() {
        let key = (entry.name.clone(), entry.version.clone());
        match merged.get(&key) {
            Some(existing) if existing.is_ready() || !entry.is_ready() => {}
            _ => {
                merged.insert(key, entry);
            }
        }
    }
    let versioned: HashSet<String> = merged
        .keys()
        .filter(|(_, version)| version.is_some())
        .map(|(name, _)| name.clone())
        .collect();
    merged
        .into_values()
        .filter(|e| e.version.is_some() || !versioned.contains(&e.name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, version: Option<&str>, state: Option<&str>) -> ModelEntry {
        ModelEntry {
            name: name.into(),
            version: version.map(Into::into),
            state: state.map(Into::into),
            reason: None,
        }
    }

    #[test]
    fn load_parameters_give_the_override_or_a_clear_refusal() {
        assert_eq!(load_config("m", []).unwrap(), None);
        let config = load_config("m", [("config", Some(r#"{"max_batch_size": 4}"#))]).unwrap();
        assert_eq!(config.as_deref(), Some(r#"{"max_batch_size": 4}"#));
        let refusal = |parameters: Vec<(&'static str, Option<&'static str>)>| {
            load_config("m", parameters).unwrap_err().to_string()
        };
        assert!(
            refusal(vec![("config", Some("{nope"))])
                .starts_with("failed to load 'm': the config override is not valid JSON")
        );
        assert!(refusal(vec![("config", None)]).contains("must be a string"));
        assert!(
            refusal(vec![("config", Some("{}")), ("file:1/model.py", None)])
                .contains("'file:1/model.py'")
        );
        assert!(refusal(vec![("b", None), ("a", Some("x"))]).contains("parameter(s) a, b"));
    }

    #[test]
    fn ready_rows_win_and_bare_names_of_loaded_models_go() {
        let a = vec![
            row("add_sub", Some("1"), Some("READY")),
            row("echo", None, None),
            row("old", Some("1"), Some("UNAVAILABLE")),
        ];
        let b = vec![
            row("add_sub", None, None),
            row("echo", None, None),
            row("old", Some("1"), Some("READY")),
        ];
        assert_eq!(
            merge([a, b]),
            vec![
                row("add_sub", Some("1"), Some("READY")),
                row("echo", None, None),
                row("old", Some("1"), Some("READY")),
            ]
        );
    }
}
