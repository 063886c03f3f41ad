//! A model's own text files, for the OpenAI endpoints: `tokenizer.json` (token counts for
//! `usage` and `finish_reason`) and `tokenizer_config.json` (its `chat_template`, and the
//! `bos_token` / `eos_token` a template names). Triton's API cannot hand out a model's files,
//! so they are read from a directory on the gateway's disk (`text_dir`), once per model,
//! and kept (`TextCache`).
//!
//! A model without a template still serves completions; a chat to it is refused. A file
//! that is there but cannot be read is logged once and treated as absent.

use super::request::Message;
use crate::config::Config;
use crate::error::GatewayError;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a model's text files are: `[[models]].tokenizer`, else the model's directory in
/// `placement.model_repository`. The one place that says so.
pub fn text_dir(config: &Config, model: &str) -> Option<PathBuf> {
    let configured = config.models.iter().find(|m| m.name == model);
    if let Some(dir) = configured.and_then(|m| m.tokenizer.clone()) {
        return Some(dir);
    }
    let repository = config.placement.model_repository.as_ref()?;
    Some(repository.join(model))
}

/// The model's context in tokens, for refusing a prompt too long for it: the
/// `[[models]].context_length` the operator set, else the tokenizer's own
/// `model_max_length` (`ModelText::context_length`). The one place that says which wins.
pub fn context_length(config: &Config, model: &str, text: &ModelText) -> Option<u64> {
    let configured = config.models.iter().find(|m| m.name == model);
    configured
        .and_then(|m| m.context_length)
        .or(text.context_length)
}

/// One model's tokenizer and chat template, either of which may be missing.
pub struct ModelText {
    tokenizer: Option<tokenizers::Tokenizer>,
    /// `tokenizer_config.json`'s `model_max_length`, when it is a count (Hugging Face
    /// writes 1e30 for "no limit", which is none here).
    context_length: Option<u64>,
    template: Option<minijinja::Environment<'static>>,
    bos_token: String,
    eos_token: String,
}

/// The template's name in its environment.
const CHAT: &str = "chat";

impl ModelText {
    /// No files: completions without `usage`, and no chat.
    pub fn none() -> Self {
        Self {
            tokenizer: None,
            context_length: None,
            template: None,
            bos_token: String::new(),
            eos_token: String::new(),
        }
    }

    /// Reads the files in `dir`. Blocking: run off the async workers.
    pub fn load(dir: &Path) -> Self {
        let mut text = Self::none();
        let tokenizer = dir.join("tokenizer.json");
        if tokenizer.is_file() {
            match tokenizers::Tokenizer::from_file(&tokenizer) {
                Ok(loaded) => text.tokenizer = Some(loaded),
                Err(error) => {
                    tracing::warn!(file = %tokenizer.display(), %error, "tokenizer not read: no token counts for this model");
                }
            }
        }
        let config = dir.join("tokenizer_config.json");
        if config.is_file()
            && let Err(error) = text.read_config(&config)
        {
            tracing::warn!(file = %config.display(), %error, "tokenizer config not read: no chat template for this model");
        }
        text
    }

    /// Reads `tokenizer_config.json`: its special tokens and its chat template.
    fn read_config(&mut self, path: &Path) -> Result<(), String> {
        let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
        let config: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
        self.bos_token = special_token(config.get("bos_token"));
        self.eos_token = special_token(config.get("eos_token"));
        self.context_length = config
            .get("model_max_length")
            .and_then(serde_json::Value::as_u64)
            .filter(|&n| n > 0);
        let Some(source) = config.get("chat_template").and_then(template_source) else {
            return Ok(());
        };
        let mut env = minijinja::Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(CHAT, source)
            .map_err(|e| format!("chat_template: {e}"))?;
        self.template = Some(env);
        Ok(())
    }

    /// Whether the model has a chat template.
    pub fn has_template(&self) -> bool {
        self.template.is_some()
    }

    /// The chat rendered as the model's template writes it, ready for the model to answer
    /// (`add_generation_prompt`). A model without a template is refused with 400.
    pub fn render(&self, model: &str, messages: &[Message]) -> Result<String, GatewayError> {
        let Some(env) = &self.template else {
            return Err(super::request::refuse(
                "messages",
                &format!(
                    "model '{model}' has no chat template (tokenizer_config.json's chat_template): use /v1/completions"
                ),
            ));
        };
        let template = env.get_template(CHAT).expect("added at load");
        template
            .render(minijinja::context! {
                messages => minijinja::value::Serde(messages),
                add_generation_prompt => true,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(|error| {
                super::request::refuse(
                    "messages",
                    &format!("model '{model}''s chat template refused the messages: {error}"),
                )
            })
    }

    /// The number of tokens in `text`, with the tokenizer's special tokens (`special`, as a
    /// completion's prompt gets them) or without (a rendered chat already has them); `None`
    /// without a tokenizer.
    pub fn count(&self, text: &str, special: bool) -> Option<u64> {
        let tokenizer = self.tokenizer.as_ref()?;
        let encoding = tokenizer.encode(text, special).ok()?;
        Some(encoding.len() as u64)
    }
}

/// A special token in `tokenizer_config.json`: a string, or an object with its `content`.
fn special_token(value: Option<&serde_json::Value>) -> String {
    match value {
        Some(serde_json::Value::String(token)) => token.clone(),
        Some(serde_json::Value::Object(token)) => token
            .get("content")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    }
}

/// The chat template: a string, or the `default` of a list of named templates.
fn template_source(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(source) => Some(source.clone()),
        serde_json::Value::Array(named) => named
            .iter()
            .find(|t| t.get("name").and_then(serde_json::Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_owned)),
        _ => None,
    }
}

/// `raise_exception(message)`, which Hugging Face's templates call to refuse a chat.
fn raise_exception(message: String) -> Result<String, minijinja::Error> {
    Err(minijinja::Error::new(
        minijinja::ErrorKind::InvalidOperation,
        message,
    ))
}

/// Each model's text files, read once and kept while the gateway runs (keyed by their
/// directory, so a config that moves them reads the new ones).
pub struct TextCache {
    cache: moka::future::Cache<PathBuf, Arc<ModelText>>,
}

impl Default for TextCache {
    fn default() -> Self {
        Self {
            cache: moka::future::Cache::new(1024),
        }
    }
}

impl TextCache {
    /// The text files in `dir` (none for `None`), read on first use by one request while
    /// others for the same model wait for it.
    pub async fn get(&self, dir: Option<PathBuf>) -> Arc<ModelText> {
        let Some(dir) = dir else {
            return Arc::new(ModelText::none());
        };
        self.cache
            .get_with(dir.clone(), async move {
                let loaded = tokio::task::spawn_blocking(move || ModelText::load(&dir)).await;
                Arc::new(loaded.unwrap_or_else(|_| ModelText::none()))
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level tokenizer over `words`, as tests/models/echo_words has.
    fn write_files(dir: &Path, template: Option<&str>) {
        let tokenizer = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 1, "b": 2},
                      "unk_token": "[UNK]"}
        });
        std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
        let config = serde_json::json!({"chat_template": template, "bos_token": "<s>",
            "model_max_length": 1e30});
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    }

    #[test]
    fn counts_tokens_and_renders_the_models_own_template() {
        let dir = tempfile::tempdir().unwrap();
        let template = "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content.strip() }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
        write_files(dir.path(), Some(template));
        let text = ModelText::load(dir.path());
        assert_eq!(text.count("a b zz a", false), Some(4));
        let config = serde_json::json!({"chat_template": template, "model_max_length": 16});
        std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
        assert_eq!(ModelText::load(dir.path()).context_length, Some(16));
        let messages = [Message {
            role: "user".into(),
            content: " a b ".into(),
            name: None,
        }];
        assert_eq!(
            text.render("m", &messages).unwrap(),
            "<s>user: a b\nassistant:"
        );
    }

    #[test]
    fn a_model_without_a_template_refuses_chat() {
        let dir = tempfile::tempdir().unwrap();
        write_files(dir.path(), None);
        let text = ModelText::load(dir.path());
        assert!(!text.has_template());
        assert_eq!(
            text.context_length, None,
            "1e30 is Hugging Face's 'no limit'"
        );
        assert!(matches!(
            text.render("m", &[]),
            Err(GatewayError::InvalidParameter { .. })
        ));
        assert_eq!(ModelText::none().count("a", false), None);
    }
}
