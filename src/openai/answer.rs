//! The answer in OpenAI's wire format, made from the backend's generate events: Triton's
//! `generate_stream` server-sent events (`data: {"text_output": ...}`), read as they arrive
//! (`Events`). `Answering` turns them into one `chat.completion` / `text_completion`, or
//! into one chunk per event (`Answering::feed`), then the last chunk with the finish reason,
//! the usage chunk when asked, and `data: [DONE]`.

use super::request::{Call, Kind};
use super::text::ModelText;
use serde_json::{Value, json};
use std::sync::Arc;

/// The output a generate model writes its text to (TensorRT-LLM's and vLLM's name).
pub const TEXT_OUTPUT: &str = "text_output";

/// One event of the backend's stream.
#[derive(Debug, PartialEq)]
pub enum Event {
    /// A piece of the answer's text.
    Text(String),
    /// The backend's failure, in its words.
    Error(String),
}

/// Reads server-sent events from the bytes as they come: an event split across reads waits
/// for its end (`\n\n`); whole events go on at once.
#[derive(Default)]
pub struct Events {
    pending: Vec<u8>,
}

impl Events {
    /// The events completed by `bytes`.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Event> {
        self.pending.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = find(&self.pending, b"\n\n") {
            let event: Vec<u8> = self.pending.drain(..end + 2).collect();
            events.extend(parse(&event[..end]));
        }
        events
    }

    /// What was left when the stream ended without a last `\n\n`.
    pub fn end(&mut self) -> Option<Event> {
        let rest = std::mem::take(&mut self.pending);
        parse(&rest)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// One event's `data:` lines, read as the backend's JSON.
fn parse(event: &[u8]) -> Option<Event> {
    let text = String::from_utf8_lossy(event);
    let data: String = text
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(str::trim_start)
        .collect();
    if data.is_empty() {
        return None;
    }
    let Ok(value) = serde_json::from_str::<Value>(&data) else {
        return Some(Event::Error(format!(
            "the backend sent an unreadable event: {data}"
        )));
    };
    if let Some(error) = value.get("error") {
        let message = error
            .as_str()
            .map_or_else(|| error.to_string(), str::to_owned);
        return Some(Event::Error(message));
    }
    let text = match value.get(TEXT_OUTPUT) {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts.iter().filter_map(Value::as_str).collect(),
        _ => String::new(),
    };
    Some(Event::Text(text))
}

/// Tokens counted for `usage`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Usage {
    /// In the prompt as sent (a chat as rendered).
    pub prompt: u64,
    /// In the answer's text.
    pub completion: u64,
}

impl Usage {
    fn json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
        })
    }
}

/// Whose tokens an answer's are, for `infergate_tokens_total`, and what it reserved under
/// its tenant's `tokens_per_minute`, settled with the real count.
#[derive(Debug, Default)]
pub struct Tally {
    /// The caller's tenant ("" when none).
    pub tenant: String,
    /// The model that served it.
    pub model: String,
    /// Tokens reserved before the call (`pipeline::admit::tokens`).
    pub reservation: Option<crate::auth::limits::Reservation>,
}

/// One answer being made: what every chunk repeats, and the text so far. Its tokens are
/// counted in `infergate_tokens_total` when it is dropped: at its end, or when the client
/// left mid-stream (what the model had sent by then).
pub struct Answering {
    tally: Tally,
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    max_tokens: Option<u64>,
    include_usage: bool,
    text: Arc<ModelText>,
    prompt_tokens: Option<u64>,
    answer: String,
    started: bool,
    failed: bool,
}

impl Answering {
    /// The answer to `call`, whose prompt had `prompt_tokens` (`None` without a tokenizer),
    /// counted for `tally`.
    pub fn new(
        call: &Call,
        text: Arc<ModelText>,
        prompt_tokens: Option<u64>,
        tally: Tally,
    ) -> Self {
        let prefix = match call.kind {
            Kind::Chat => "chatcmpl-",
            Kind::Completion => "cmpl-",
        };
        Self {
            tally,
            kind: call.kind,
            id: format!("{prefix}{}", uuid::Uuid::new_v4().simple()),
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            model: call.model.clone(),
            max_tokens: call.max_tokens,
            include_usage: call.include_usage,
            text,
            prompt_tokens,
            answer: String::new(),
            started: false,
            failed: false,
        }
    }

    /// The usage so far, when the model has a tokenizer.
    fn usage(&self) -> Option<Usage> {
        let completion = self.text.count(&self.answer, false)?;
        Some(Usage {
            prompt: self.prompt_tokens?,
            completion,
        })
    }

    /// `length` when the answer reached `max_tokens`, else `stop`.
    fn finish_reason(&self) -> &'static str {
        match (self.usage(), self.max_tokens) {
            (Some(usage), Some(max)) if usage.completion >= max => "length",
            _ => "stop",
        }
    }

    /// The fields every object of this answer starts with.
    fn head(&self, object: &str) -> serde_json::Map<String, Value> {
        let mut head = serde_json::Map::new();
        head.insert("id".into(), self.id.clone().into());
        head.insert("object".into(), object.into());
        head.insert("created".into(), self.created.into());
        head.insert("model".into(), self.model.clone().into());
        head
    }

    /// One choice with `text` (a chat's `message` or `delta`, a completion's `text`).
    fn choice(&self, text: Option<&str>, finish: Option<&str>, whole: bool) -> Value {
        let mut choice = json!({"index": 0, "logprobs": null, "finish_reason": finish});
        match self.kind {
            Kind::Chat => {
                let mut message = serde_json::Map::new();
                if whole || !self.started {
                    message.insert("role".into(), "assistant".into());
                }
                if let Some(text) = text {
                    message.insert("content".into(), text.into());
                }
                let key = if whole { "message" } else { "delta" };
                choice[key] = Value::Object(message);
            }
            Kind::Completion => choice["text"] = text.unwrap_or_default().into(),
        }
        choice
    }

    fn chunk_object(&self) -> &'static str {
        match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        }
    }

    /// The whole answer, after every event (`feed` without streaming): the completion
    /// object, or the backend's failure.
    pub fn whole(&mut self, events: Vec<Event>) -> Result<Value, String> {
        for event in events {
            match event {
                Event::Text(text) => self.answer.push_str(&text),
                Event::Error(error) => return Err(error),
            }
        }
        let object = match self.kind {
            Kind::Chat => "chat.completion",
            Kind::Completion => "text_completion",
        };
        let mut answer = self.head(object);
        let choice = self.choice(Some(&self.answer), Some(self.finish_reason()), true);
        answer.insert("choices".into(), Value::Array(vec![choice]));
        answer.insert(
            "usage".into(),
            self.usage().map_or(Value::Null, Usage::json),
        );
        Ok(Value::Object(answer))
    }

    /// The server-sent events for the backend's `events`: one chunk each, sent on at once.
    pub fn feed(&mut self, events: Vec<Event>) -> Vec<u8> {
        let mut out = Vec::new();
        for event in events {
            if self.failed {
                break;
            }
            match event {
                Event::Text(text) => {
                    let mut chunk = self.head(self.chunk_object());
                    let choice = self.choice(Some(&text), None, false);
                    chunk.insert("choices".into(), Value::Array(vec![choice]));
                    self.started = true;
                    self.answer.push_str(&text);
                    sse(&mut out, &Value::Object(chunk));
                }
                Event::Error(message) => {
                    self.failed = true;
                    let error = super::error::body(
                        http::StatusCode::INTERNAL_SERVER_ERROR,
                        &message,
                        None,
                        "backend",
                    );
                    sse(&mut out, &error);
                }
            }
        }
        out
    }

    /// The end of the stream: the chunk with the finish reason, the usage chunk when asked
    /// (`stream_options.include_usage`), and `[DONE]`; nothing more after a failure.
    pub fn end(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        if self.failed {
            return out;
        }
        let mut last = self.head(self.chunk_object());
        let choice = self.choice(None, Some(self.finish_reason()), false);
        last.insert("choices".into(), Value::Array(vec![choice]));
        sse(&mut out, &Value::Object(last));
        if self.include_usage {
            let mut usage = self.head(self.chunk_object());
            usage.insert("choices".into(), Value::Array(Vec::new()));
            usage.insert(
                "usage".into(),
                self.usage().map_or(Value::Null, Usage::json),
            );
            sse(&mut out, &Value::Object(usage));
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        out
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        let Some(usage) = self.usage() else {
            return;
        };
        if let Some(reservation) = self.tally.reservation.take() {
            reservation.settle(usage.prompt + usage.completion);
        }
        for (kind, tokens) in [("prompt", usage.prompt), ("completion", usage.completion)] {
            metrics::counter!(crate::telemetry::TOKENS,
                "tenant" => self.tally.tenant.clone(),
                "model" => self.tally.model.clone(),
                "kind" => kind)
            .increment(tokens);
        }
    }
}

/// One server-sent event of `value`.
fn sse(out: &mut Vec<u8>, value: &Value) {
    out.extend_from_slice(b"data: ");
    serde_json::to_writer(&mut *out, value).expect("JSON serializes");
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_events_split_across_reads() {
        let mut events = Events::default();
        assert_eq!(
            events.push(b"data: {\"text_output\": \"a\"}\n\ndata: {\"text_"),
            [Event::Text("a".into())]
        );
        assert_eq!(
            events.push(b"output\": \" b\"}\n\n"),
            [Event::Text(" b".into())]
        );
        assert_eq!(events.push(b"data: {\"error\": \"boom\"}"), []);
        assert_eq!(events.end(), Some(Event::Error("boom".into())));
    }

    #[test]
    fn streams_a_chunk_per_event_then_the_finish_usage_and_done() {
        let call = super::super::request::decode(
            Kind::Chat,
            br#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": true,
                 "stream_options": {"include_usage": true}}"#,
        )
        .unwrap();
        let text = Arc::new(ModelText::none());
        let mut answering = Answering::new(&call, text, None, Tally::default());
        let first = String::from_utf8(answering.feed(vec![Event::Text("a".into())])).unwrap();
        assert!(
            first.starts_with("data: {") && first.ends_with("}\n\n"),
            "{first}"
        );
        let chunk: Value = serde_json::from_str(first[6..].trim()).unwrap();
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(
            chunk["choices"][0]["delta"],
            json!({"role": "assistant", "content": "a"})
        );
        let second = String::from_utf8(answering.feed(vec![Event::Text(" b".into())])).unwrap();
        let chunk: Value = serde_json::from_str(second[6..].trim()).unwrap();
        assert_eq!(chunk["choices"][0]["delta"], json!({"content": " b"}));
        let end = String::from_utf8(answering.end()).unwrap();
        let events: Vec<&str> = end.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.len(), 3, "{end}");
        assert!(events[0].contains("\"finish_reason\":\"stop\""));
        assert!(events[1].contains("\"choices\":[]"));
        assert_eq!(events[2], "data: [DONE]");
    }
}
