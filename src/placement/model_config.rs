//! The load body that makes Triton serve chosen versions of a model.
//!
//! Triton's load API takes `{"parameters": {"config": "<JSON>"}}`, and that JSON *replaces*
//! the model's config.pbtxt: checked on Triton 2.51, an override holding only
//! `version_policy` loads a python model with no inputs or outputs at all. So the override is
//! the model's whole config.pbtxt, read from `placement.model_repository` and parsed with
//! Triton's own `ModelConfig` schema (proto/model_config.proto, already compiled into the
//! descriptor set for gRPC reflection), with `version_policy` set to the versions wanted.
//! Asking a backend for its config (`GET /v2/models/{m}/config`) would need the model loaded
//! there first, and returns what an earlier override left.
//!
//! What Triton then does (observed on 2.51, python backend): loading a model that is already
//! loaded, with another version set, loads the new versions while the old ones keep serving,
//! and unloads versions no longer named only after their in-flight requests finish; not one
//! request of a concurrent loop failed. A plain load (no override) of a loaded model whose
//! directory has not changed keeps the override in force; once the directory changed (a new
//! version), a plain load reads config.pbtxt again and drops every overridden version.

use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use std::path::Path;
use std::sync::OnceLock;

/// Triton's `ModelConfig` message, from the descriptor set build.rs writes.
fn model_config_schema() -> &'static prost_reflect::MessageDescriptor {
    static SCHEMA: OnceLock<prost_reflect::MessageDescriptor> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        DescriptorPool::decode(crate::protocol::inference::FILE_DESCRIPTOR_SET)
            .expect("build.rs writes a valid descriptor set")
            .get_message_by_name("inference.ModelConfig")
            .expect("proto/model_config.proto defines inference.ModelConfig")
    })
}

/// config.pbtxt (protobuf text format) as the JSON Triton's load API takes.
pub fn config_json(pbtxt: &str) -> Result<serde_json::Value, String> {
    let text = with_list_colons(pbtxt);
    let message = DynamicMessage::parse_text_format(model_config_schema().clone(), &text)
        .map_err(|e| format!("config.pbtxt does not parse as a ModelConfig: {e}"))?;
    // Field names and plain numbers, as Triton itself writes a config.
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .stringify_64_bit_integers(false);
    message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|e| format!("config.pbtxt cannot be written as JSON: {e}"))
}

/// The text with a colon between a field name and a list: `input [ { ... } ]` is how Triton's
/// own examples write lists of messages, which protobuf's text format allows (the colon is
/// optional before message values) but prost-reflect 0.16's parser refuses. Strings and
/// comments are left alone.
fn with_list_colons(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut chars = text.chars();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(_), '\\') => {
                out.push(c);
                out.extend(chars.next());
                continue;
            }
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '#') => {
                out.push(c);
                out.extend(chars.by_ref().take_while(|&c| c != '\n'));
                out.push('\n');
                continue;
            }
            (None, '[') => {
                let before = out.trim_end();
                if before.ends_with(|p: char| p.is_ascii_alphanumeric() || p == '_') {
                    out.truncate(before.len());
                    out.push_str(": ");
                }
            }
            _ => {}
        }
        out.push(c);
    }
    out
}

/// Where the config a load sends comes from.
#[derive(Clone, Copy, Debug)]
pub enum Source<'a> {
    /// config.pbtxt under `placement.model_repository`.
    Repository(&'a Path),
    /// A client's override (JSON `ModelConfig` text), sent through the repository API.
    Override(&'a str),
}

/// Checks an override before any load: Triton takes only a JSON object.
pub fn check_override(text: &str) -> Result<(), String> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        Ok(_) => Err("the config override is not a JSON object".into()),
        Err(e) => Err(format!("the config override is not valid JSON: {e}")),
    }
}

/// The load request body for `model` with the config from `source`, serving exactly
/// `versions` when given (a `specific` version policy), else the config's own policy. An
/// override for the config's own policy is sent as the client wrote it.
pub fn load_body(
    source: Source<'_>,
    model: &str,
    versions: Option<&[u64]>,
) -> Result<String, String> {
    let mut config = match (source, versions) {
        (Source::Override(text), None) => return Ok(config_body(text)),
        (Source::Override(text), Some(_)) => serde_json::from_str::<serde_json::Value>(text)
            .map_err(|e| format!("the config override is not valid JSON: {e}"))?,
        (Source::Repository(repository), _) => {
            let path = repository.join(model).join("config.pbtxt");
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let mut config = config_json(&text)?;
            // Triton names the model by the load path; the file may leave `name` out.
            config["name"] = serde_json::json!(model);
            config
        }
    };
    if let Some(versions) = versions {
        config["version_policy"] = serde_json::json!({ "specific": { "versions": versions } });
    }
    Ok(config_body(&config.to_string()))
}

fn config_body(config: &str) -> String {
    serde_json::json!({ "parameters": { "config": config } }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pbtxt_becomes_tritons_json_with_the_versions_asked_for() {
        let repo = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(repo.path().join("m")).unwrap();
        std::fs::write(
            repo.path().join("m/config.pbtxt"),
            "# comment\nbackend: \"python\"\nmax_batch_size: 0\n\
             version_policy: { latest: { num_versions: 1 } }\n\
             input [ { name: \"INPUT0\", data_type: TYPE_FP32, dims: [ 4 ] } ]\n\
             instance_group [ { kind: KIND_CPU } ] # a list [ without a colon\n\
             parameters { key: \"k [\" value: { string_value: \"x\" } }\n",
        )
        .unwrap();
        let body: serde_json::Value = serde_json::from_str(
            &load_body(Source::Repository(repo.path()), "m", Some(&[1, 3])).unwrap(),
        )
        .unwrap();
        let config: serde_json::Value =
            serde_json::from_str(body["parameters"]["config"].as_str().unwrap()).unwrap();
        assert_eq!(
            config,
            serde_json::json!({
                "name": "m",
                "backend": "python",
                "version_policy": {"specific": {"versions": [1, 3]}},
                "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
                "instance_group": [{"kind": "KIND_CPU"}],
                "parameters": {"k [": {"string_value": "x"}},
            })
        );
        assert!(config_json("no_such_field: 1").is_err());
    }

    #[test]
    fn an_override_is_sent_as_written_or_with_the_versions_asked_for() {
        let text = r#"{"max_batch_size": 4, "version_policy": {"latest": {"num_versions": 1}}}"#;
        let body: serde_json::Value =
            serde_json::from_str(&load_body(Source::Override(text), "m", None).unwrap()).unwrap();
        assert_eq!(body["parameters"]["config"], text);
        let body: serde_json::Value =
            serde_json::from_str(&load_body(Source::Override(text), "m", Some(&[2])).unwrap())
                .unwrap();
        let config: serde_json::Value =
            serde_json::from_str(body["parameters"]["config"].as_str().unwrap()).unwrap();
        assert_eq!(
            config,
            serde_json::json!({"max_batch_size": 4, "version_policy": {"specific": {"versions": [2]}}})
        );
        assert!(check_override(text).is_ok());
        assert!(
            check_override("[1]")
                .unwrap_err()
                .contains("not a JSON object")
        );
        assert!(
            check_override("{nope")
                .unwrap_err()
                .contains("not valid JSON")
        );
    }

    #[test]
    fn every_test_model_config_parses() {
        let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/models");
        for entry in std::fs::read_dir(models).unwrap() {
            let path = entry.unwrap().path().join("config.pbtxt");
            let text = std::fs::read_to_string(&path).unwrap();
            let config = config_json(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(
                config["backend"].is_string(),
                "{}: {config}",
                path.display()
            );
        }
    }
}
