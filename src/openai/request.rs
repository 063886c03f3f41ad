//! Reading an OpenAI request (`/v1/chat/completions`, `/v1/completions`) into a `Call`:
//! the model it names, its prompt, and its parameters mapped by the one table
//! (`PARAMETERS`) onto the members of a generate body. Every member of the request is either
//! read here or refused with a 400 naming it: a parameter the gateway cannot honour is never
//! dropped without a word.

use crate::error::GatewayError;
use serde_json::{Map, Value};

/// Which OpenAI endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `POST /v1/chat/completions`: messages, rendered by the model's chat template.
    Chat,
    /// `POST /v1/completions`: a prompt sent as it is.
    Completion,
}

/// One message of a chat, as the chat template reads it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Message {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text (an array of text parts is joined).
    pub content: String,
    /// The participant's name, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// What the request asks the model to continue.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// A chat, to render with the model's template.
    Messages(Vec<Message>),
    /// A completion's prompt.
    Text(String),
}

/// A decoded OpenAI request.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// Which endpoint.
    pub kind: Kind,
    /// The gateway's model name (a route or a model): routing applies to it as to any.
    pub model: String,
    /// The prompt.
    pub prompt: Prompt,
    /// The parameters, as generate members (`PARAMETERS`' right column), with the OpenAI
    /// name each came from for a refusal to name.
    pub members: Vec<Member>,
    /// `max_tokens` (or `max_completion_tokens`): whether an answer stopped for length.
    pub max_tokens: Option<u64>,
    /// Server-sent events rather than one answer.
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
}

/// One parameter bound for the backend.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    /// The OpenAI parameter it came from.
    pub param: &'static str,
    /// The generate member (a model input) it becomes.
    pub input: &'static str,
    /// Its value.
    pub value: Value,
}

/// The parameter table: each OpenAI parameter the gateway passes on, and the generate
/// member it becomes. The names on the right are TensorRT-LLM's ensemble inputs, the most
/// common LLM model on Triton. A model honours a parameter when it has an input of that
/// name; otherwise the request is refused (`Call::check`).
pub const PARAMETERS: &[(&str, &str)] = &[
    ("max_tokens", "max_tokens"),
    ("max_completion_tokens", "max_tokens"),
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("stop", "stop_words"),
    ("seed", "random_seed"),
];

/// The generate member that carries the prompt, TensorRT-LLM's and vLLM's name.
pub const PROMPT_INPUT: &str = "text_input";

/// The generate member that says whether the model should stream: sent always, as a model
/// without such an input takes it as a request parameter it ignores (the gateway reads the
/// backend's events either way).
pub const STREAM_INPUT: &str = "stream";

/// The roles a chat message may have.
const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// Reads a request body sent to the endpoint of `kind`.
pub fn decode(kind: Kind, body: &[u8]) -> Result<Call, GatewayError> {
    let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(body) else {
        return Err(refuse(
            "",
            "the request body is not a JSON object (see the OpenAI API reference)",
        ));
    };
    fields.retain(|_, value| !value.is_null());
    let model = match fields.remove("model") {
        Some(Value::String(model)) if !model.is_empty() => model,
        Some(_) => return Err(refuse("model", "'model' must be a non-empty string")),
        None => return Err(refuse("model", "you must provide a model parameter")),
    };
    let prompt = match kind {
        Kind::Chat => Prompt::Messages(messages(fields.remove("messages"))?),
        Kind::Completion => Prompt::Text(prompt(fields.remove("prompt"))?),
    };
    let mut call = Call {
        kind,
        model,
        prompt,
        members: Vec::new(),
        max_tokens: None,
        stream: false,
        include_usage: false,
    };
    let options = fields.remove("stream_options");
    for (name, value) in fields {
        call.parameter(&name, value)?;
    }
    if let Some(options) = options {
        call.stream_options(options)?;
    }
    Ok(call)
}

impl Call {
    /// One top-level parameter: mapped by the table, or read by the gateway, or refused.
    fn parameter(&mut self, name: &str, value: Value) -> Result<(), GatewayError> {
        if let Some(&(param, input)) = PARAMETERS.iter().find(|(p, _)| *p == name) {
            let value = checked(param, value)?;
            if input == "max_tokens" {
                self.max_tokens = value.as_u64();
            }
            self.members.push(Member {
                param,
                input,
                value,
            });
            return Ok(());
        }
        match (name, value) {
            ("stream", Value::Bool(stream)) => self.stream = stream,
            ("stream", _) => return Err(refuse("stream", "'stream' must be a boolean")),
            ("n", value) if value.as_u64() == Some(1) => {}
            ("n", _) => {
                return Err(refuse(
                    "n",
                    "only n = 1 is supported: infergate asks the backend for one choice",
                ));
            }
            // An end-user id for the provider's abuse monitoring: nothing for a backend.
            ("user", Value::String(_)) => {}
            (name, _) => {
                return Err(refuse(
                    name,
                    &format!("the parameter '{name}' is not supported by infergate"),
                ));
            }
        }
        Ok(())
    }

    /// `stream_options`, allowed only with `stream: true`.
    fn stream_options(&mut self, options: Value) -> Result<(), GatewayError> {
        const PARAM: &str = "stream_options";
        if !self.stream {
            return Err(refuse(
                PARAM,
                "'stream_options' is only allowed when 'stream' is true",
            ));
        }
        let Value::Object(options) = options else {
            return Err(refuse(PARAM, "'stream_options' must be an object"));
        };
        for (name, value) in options {
            match (name.as_str(), value) {
                ("include_usage", Value::Bool(include)) => self.include_usage = include,
                ("include_usage", Value::Null) => {}
                (name, _) => {
                    return Err(refuse(
                        &format!("stream_options.{name}"),
                        &format!("'stream_options.{name}' is not supported by infergate"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Refuses a parameter the model cannot honour: each member must be one of its inputs
    /// (`has_input`, read from the model's signature).
    pub fn check(&self, model: &str, has_input: impl Fn(&str) -> bool) -> Result<(), GatewayError> {
        match self.members.iter().find(|m| !has_input(m.input)) {
            Some(member) => Err(refuse(
                member.param,
                &format!(
                    "model '{model}' cannot honour '{}': it has no input '{}'",
                    member.param, member.input
                ),
            )),
            None => Ok(()),
        }
    }

    /// Refuses a prompt of `prompt_tokens` that, with the tokens `max_tokens` asks for,
    /// does not fit in the model's `context`, in OpenAI's words and with its code.
    pub fn fits(&self, prompt_tokens: u64, context: u64) -> Result<(), GatewayError> {
        let completion = self.max_tokens.unwrap_or(0);
        let asked = prompt_tokens + completion;
        if asked <= context {
            return Ok(());
        }
        let param = match self.kind {
            Kind::Chat => "messages",
            Kind::Completion => "prompt",
        };
        Err(GatewayError::ContextLengthExceeded {
            param,
            message: format!(
                "This model's maximum context length is {context} tokens. However, you requested {asked} tokens ({prompt_tokens} in the {param}, {completion} in the completion). Please reduce the length of the {param} or completion."
            ),
        })
    }

    /// The generate body for the backend: the prompt as rendered, then the members.
    pub fn generate_body(&self, prompt: &str) -> Vec<u8> {
        let mut body = Map::new();
        body.insert(PROMPT_INPUT.into(), Value::String(prompt.into()));
        for member in &self.members {
            body.insert(member.input.into(), member.value.clone());
        }
        body.insert(STREAM_INPUT.into(), Value::Bool(self.stream));
        serde_json::to_vec(&body).expect("a JSON map serializes")
    }
}

/// A parameter's value, checked as OpenAI documents it; `stop` becomes an array.
fn checked(param: &'static str, value: Value) -> Result<Value, GatewayError> {
    let number = value.as_f64();
    let ok = match param {
        "max_tokens" | "max_completion_tokens" => value.as_u64().is_some_and(|n| n >= 1),
        "temperature" => number.is_some_and(|t| (0.0..=2.0).contains(&t)),
        "top_p" => number.is_some_and(|p| (0.0..=1.0).contains(&p)),
        "seed" => value.as_i64().is_some() || value.as_u64().is_some(),
        "stop" => {
            return match value {
                Value::String(stop) => Ok(Value::Array(vec![Value::String(stop)])),
                Value::Array(stops)
                    if (1..=4).contains(&stops.len()) && stops.iter().all(Value::is_string) =>
                {
                    Ok(Value::Array(stops))
                }
                _ => Err(refuse(
                    "stop",
                    "'stop' must be a string or an array of 1 to 4 strings",
                )),
            };
        }
        _ => true,
    };
    if !ok {
        let what = match param {
            "temperature" => "a number from 0 to 2",
            "top_p" => "a number from 0 to 1",
            "seed" => "an integer",
            _ => "an integer of at least 1",
        };
        return Err(refuse(param, &format!("'{param}' must be {what}")));
    }
    Ok(value)
}

/// A chat's `messages`: a non-empty array of messages with a known role and text content.
fn messages(value: Option<Value>) -> Result<Vec<Message>, GatewayError> {
    let Some(Value::Array(list)) = value else {
        return Err(refuse(
            "messages",
            "'messages' must be a non-empty array of messages",
        ));
    };
    if list.is_empty() {
        return Err(refuse(
            "messages",
            "'messages' must be a non-empty array of messages",
        ));
    }
    list.into_iter()
        .enumerate()
        .map(|(i, message)| self::message(i, message))
        .collect()
}

/// Message `i` of a chat.
fn message(i: usize, value: Value) -> Result<Message, GatewayError> {
    let at = |key: &str| format!("messages[{i}].{key}");
    let Value::Object(fields) = value else {
        return Err(refuse(
            &format!("messages[{i}]"),
            &format!("messages[{i}] must be an object with a 'role' and a 'content'"),
        ));
    };
    let mut message = Message {
        role: String::new(),
        content: String::new(),
        name: None,
    };
    for (key, value) in fields {
        match (key.as_str(), value) {
            ("role", Value::String(role)) if ROLES.contains(&role.as_str()) => message.role = role,
            ("role", role) => {
                return Err(refuse(
                    &at("role"),
                    &format!(
                        "{role} is not a valid role for messages[{i}]: one of {}",
                        ROLES.join(", ")
                    ),
                ));
            }
            ("content", content) => message.content = text_content(content, &at("content"))?,
            ("name", Value::String(name)) => message.name = Some(name),
            (key, _) => {
                return Err(refuse(
                    &at(key),
                    &format!("'{}' is not supported by infergate", at(key)),
                ));
            }
        }
    }
    if message.role.is_empty() {
        return Err(refuse(&at("role"), &format!("messages[{i}] has no 'role'")));
    }
    Ok(message)
}

/// A message's content: a string, or an array of text parts joined.
fn text_content(value: Value, param: &str) -> Result<String, GatewayError> {
    match value {
        Value::String(text) => Ok(text),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => parts
            .into_iter()
            .map(|part| match part {
                Value::Object(part) if part.get("type").and_then(Value::as_str) == Some("text") => {
                    part.get("text")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                        .ok_or_else(|| refuse(param, "a text part needs a string 'text'"))
                }
                _ => Err(refuse(
                    param,
                    "only text content parts are supported by infergate",
                )),
            })
            .collect(),
        _ => Err(refuse(
            param,
            "content must be a string or an array of parts",
        )),
    }
}

/// A completion's `prompt`: a string, or an array of one string.
fn prompt(value: Option<Value>) -> Result<String, GatewayError> {
    match value {
        Some(Value::String(prompt)) => Ok(prompt),
        Some(Value::Array(mut prompts)) if prompts.len() == 1 && prompts[0].is_string() => {
            Ok(prompts
                .pop()
                .and_then(|p| p.as_str().map(str::to_owned))
                .unwrap_or_default())
        }
        Some(_) => Err(refuse(
            "prompt",
            "'prompt' must be a string (token arrays and batches of prompts are not supported by infergate)",
        )),
        None => Err(refuse("prompt", "you must provide a prompt parameter")),
    }
}

/// A refusal naming `param`.
pub(crate) fn refuse(param: &str, message: &str) -> GatewayError {
    GatewayError::InvalidParameter {
        param: param.into(),
        message: message.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param_of(error: GatewayError) -> String {
        match error {
            GatewayError::InvalidParameter { param, .. } => param,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn maps_parameters_by_the_table() {
        let call = decode(
            Kind::Chat,
            br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}],
                 "max_tokens": 5, "temperature": 0.5, "stop": "x", "seed": 7, "n": 1,
                 "stream": true, "stream_options": {"include_usage": true}, "top_p": null}"#,
        )
        .unwrap();
        assert_eq!(call.model, "m");
        assert_eq!(call.max_tokens, Some(5));
        assert!(call.stream && call.include_usage);
        let body: Value = serde_json::from_slice(&call.generate_body("P")).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"text_input": "P", "max_tokens": 5, "temperature": 0.5,
                "stop_words": ["x"], "random_seed": 7, "stream": true})
        );
        let refused = call.check("m", |input| input != "random_seed").unwrap_err();
        assert_eq!(param_of(refused), "seed");
    }

    #[test]
    fn refuses_what_it_cannot_honour_naming_the_parameter() {
        for (kind, body, param) in [
            (Kind::Chat, r#"{"model": "m"}"#, "messages"),
            (
                Kind::Chat,
                r#"{"model": "m", "messages": "hi"}"#,
                "messages",
            ),
            (
                Kind::Chat,
                r#"{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}"#,
                "messages[0].role",
            ),
            (
                Kind::Chat,
                r#"{"model": "m", "messages": [{"content": "x"}]}"#,
                "messages[0].role",
            ),
            (
                Kind::Completion,
                r#"{"model": "m", "prompt": "p", "n": 2}"#,
                "n",
            ),
            (
                Kind::Completion,
                r#"{"model": "m", "prompt": "p", "logprobs": 2}"#,
                "logprobs",
            ),
            (
                Kind::Completion,
                r#"{"model": "m", "prompt": "p", "temperature": 3}"#,
                "temperature",
            ),
            (
                Kind::Completion,
                r#"{"model": "m", "prompt": [1, 2]}"#,
                "prompt",
            ),
            (
                Kind::Completion,
                r#"{"model": "m", "prompt": "p", "stream_options": {"include_usage": true}}"#,
                "stream_options",
            ),
            (Kind::Completion, r#"{"prompt": "p"}"#, "model"),
            (Kind::Completion, "[]", ""),
        ] {
            let refused = decode(kind, body.as_bytes()).unwrap_err();
            assert_eq!(param_of(refused), param, "{body}");
        }
    }

    #[test]
    fn a_prompt_past_the_context_is_refused_with_its_max_tokens() {
        let call = decode(
            Kind::Completion,
            br#"{"model": "m", "prompt": "p", "max_tokens": 3}"#,
        )
        .unwrap();
        assert!(call.fits(5, 8).is_ok());
        let Err(GatewayError::ContextLengthExceeded { param, message }) = call.fits(6, 8) else {
            panic!("refused")
        };
        assert_eq!(param, "prompt");
        assert!(message.contains("requested 9 tokens (6 in the prompt, 3 in the completion)"));
    }

    #[test]
    fn joins_text_parts() {
        let call = decode(
            Kind::Chat,
            br#"{"model": "m", "messages": [{"role": "user", "content":
                 [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]}]}"#,
        )
        .unwrap();
        let Prompt::Messages(messages) = call.prompt else {
            panic!()
        };
        assert_eq!(messages[0].content, "a b");
    }
}
