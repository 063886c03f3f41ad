//! The OpenAI API's words, protocol-neutral (no HTTP server here): reading a chat or
//! completion request into a generate body by the parameter table (`request`), the model's
//! chat template and tokenizer (`text`), the answer and its stream of chunks made from the
//! backend's generate events (`answer`), and OpenAI's error shape (`error`). The HTTP
//! front-end (`frontend::http::openai`) only moves bytes between these and the pipeline,
//! which serves the request as the generate request it becomes: auth, routing, placement,
//! flow control, validation, metrics and the access log are the pipeline's.

pub mod answer;
pub mod error;
pub mod request;
pub mod text;

pub use request::{Call, Kind};
pub use text::{ModelText, TextCache};
