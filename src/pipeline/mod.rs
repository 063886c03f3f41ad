//! The pipeline: the walk every request about a model takes, whatever its wire format, as
//! named phases over one per-request context (`RequestCtx`):
//!
//! ```text
//! edge ─▶ admit ─▶ route ─▶ place ─▶ validate ─▶ forward ─▶ finish
//!         (auth,    (route    (a copy,  (the input   (to the    (guard, metrics,
//!         limits)   → target) loaded    against the  copy, once  span, access log)
//!                             on demand) signature)  more if gone)
//! ```
//!
//! Each phase is a plain function over `&mut RequestCtx`; `serve` runs them in order. A
//! front-end decodes its wire format into the context and implements `Wire`, the small
//! trait for the phases that touch bytes (reading the sequence, the validation reader,
//! mirroring, sending); no rule lives in a front-end that the other would have to repeat.
//! Streams run the same phases per message.

pub mod admit;
mod ctx;
pub mod finish;
pub mod forward;
pub mod hold;
pub mod mirror;
mod place;
pub mod repository;
mod route;
pub mod sequence;
pub mod series;
pub mod server_metadata;
pub mod statistics;

pub use admit::Caller;
pub use ctx::{RequestCtx, Served, request_id};
pub(crate) use forward::{Sent, Wire};
pub use place::{Local, Placing, place};
pub use route::{PIN_HEADER, RouteTable, Routed, Tally, route};

use crate::error::GatewayError;

/// Every request about one model, in order: admit it for the model it names, route it,
/// read what placement needs, place it, validate an inference and copy it to the route's
/// mirrors, forward it; then the guard counts the answer. Statistics are read from every
/// copy instead (`statistics`).
pub(crate) async fn serve<W: Wire>(
    ctx: &mut RequestCtx,
    wire: &mut W,
) -> Result<W::Answer, GatewayError> {
    admit::model(ctx)?;
    route(ctx, |name| wire.header(name))?;
    wire.retarget(ctx.routed.as_ref().expect("routed"));
    let answer = placed(ctx, wire).await;
    let failed = match &answer {
        Ok(answer) => W::failed(answer),
        Err(error) => error.fails_target(),
    };
    finish::settle(ctx, failed);
    answer
}

/// The phases from reading the request to the backend's answer.
async fn placed<W: Wire>(ctx: &mut RequestCtx, wire: &mut W) -> Result<W::Answer, GatewayError> {
    ctx.sequence = wire.sequence(ctx).await?;
    match place(ctx).await {
        Ok(Placing::Leased) => {}
        Ok(Placing::Answered(local)) => return wire.local(local),
        Err(error) => return wire.unplaced(error),
    }
    if ctx.ask == Ask::Inference {
        let backend = ctx.lease()?.backend().clone();
        let model = &ctx.routed.as_ref().expect("routed").target;
        let on = forward::Placed {
            backend: &backend,
            model,
        };
        wire.validate(ctx, on).await?;
        if let Some(shadow) = ctx.routed.as_mut().and_then(Routed::shadow) {
            wire.mirror(ctx, shadow).await?;
        }
    }
    forward::forward(ctx, wire).await
}

/// A model's statistics: admitted and routed like any model request, then summed over the
/// copies that serve the target (`statistics::of_model`).
pub async fn model_statistics<'h>(
    ctx: &mut RequestCtx,
    header: impl Fn(&str) -> Option<&'h [u8]>,
) -> Result<statistics::Statistics, GatewayError> {
    admit::model(ctx)?;
    route(ctx, header)?;
    let target = &ctx.routed.as_ref().expect("routed").target;
    statistics::of_model(&ctx.gateway, target).await
}

/// What a model request asks. An inference, metadata and config may load the model (on its
/// first request: most Triton clients ask metadata and config before they infer); readiness
/// never loads, and answers what the gateway would do (ready for a model it would place);
/// statistics are read from the copies loaded now. Each words a model that is not servable
/// its own way (`GatewayError::NotLoaded`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    /// `infer`, `generate`, `generate_stream`, gRPC `ModelInfer` and streams.
    Inference,
    /// `GET .../ready`, gRPC `ModelReady`.
    Ready,
    /// `GET /v2/models/{m}[/versions/{v}]`, gRPC `ModelMetadata`.
    Metadata,
    /// `GET .../config`, gRPC `ModelConfig`.
    Config,
    /// `GET .../stats`, gRPC `ModelStatistics`.
    Statistics,
}

impl Ask {
    /// Whether this request may load the model when no copy is loaded (metadata and config
    /// only when the gateway has not seen the model's answer before, `place`).
    pub fn loads(self) -> bool {
        matches!(self, Self::Inference | Self::Metadata | Self::Config)
    }
}

/// The model a request names, as the client wrote it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ModelRef {
    /// Model name.
    pub name: String,
    /// A specific version, or `None` for the server's choice.
    pub version: Option<String>,
}

impl ModelRef {
    /// A model, any version.
    pub fn new(name: impl Into<String>, version: Option<String>) -> Self {
        Self {
            name: name.into(),
            version,
        }
    }

    /// The model and version a client's request names, refused (400 / INVALID_ARGUMENT, in
    /// Triton's words) when the version is not one Triton can read, before anything is
    /// placed or loaded. The version is kept as written: Triton reads it the same way.
    pub fn requested(
        name: impl Into<String>,
        version: Option<String>,
    ) -> Result<Self, GatewayError> {
        version_number(version.as_deref())?;
        Ok(Self::new(name, version))
    }

    /// The version asked for as a number (`Ok(None)`: none asked for).
    pub fn version_number(&self) -> Result<Option<u64>, GatewayError> {
        version_number(self.version.as_deref())
    }
}

/// A version as written (in a request or a route target) as a number, read as Triton reads
/// it (`std::stol`): leading whitespace, an optional sign, digits, and whatever follows
/// ignored (`" 1"` and `"1x"` are version 1); no digits, or more than 64 bits, or a
/// negative number, is an error with Triton's message. Version 0 reads, and names no version
/// that exists. The one rule for requests and route targets.
pub fn version_number(text: Option<&str>) -> Result<Option<u64>, GatewayError> {
    let Some(text) = text else {
        return Ok(None);
    };
    match stol(text) {
        Some(number) => u64::try_from(number).map(Some).map_err(|_| {
            GatewayError::BadRequest(format!(
                "invalid model version specified '{text}' , version should be an integral \
                 value > 0"
            ))
        }),
        None => Err(GatewayError::BadRequest(format!(
            "failed to get model version from specified version string '{text}' (details: \
             stol), version should be an integral value > 0"
        ))),
    }
}

/// C++'s `std::stol` in base 10: `None` where it throws (no digits, out of range).
fn stol(text: &str) -> Option<i64> {
    let text = text.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let (negative, rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit);
    let mut magnitude: i128 = 0;
    let mut any = false;
    for digit in digits {
        any = true;
        magnitude = magnitude * 10 + i128::from(digit - b'0');
        if magnitude > 1 << 63 {
            return None;
        }
    }
    let value = if negative { -magnitude } else { magnitude };
    any.then(|| i64::try_from(value).ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pipeline and what it calls know no wire format: axum and tonic belong to the
    /// front-ends (`src/frontend`), so a rule written here holds for HTTP and gRPC alike.
    #[test]
    fn protocol_neutral_modules_name_no_wire_crate() {
        fn sources(dir: &std::path::Path, found: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    sources(&path, found);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    found.push(path);
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        for dir in ["pipeline", "validate", "placement", "routing", "auth"] {
            sources(&root.join(dir), &mut files);
        }
        assert!(files.len() > 20, "{files:?}");
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            for crate_name in ["axum", "tonic"] {
                assert!(
                    !text.contains(&format!("{crate_name}::")),
                    "{} names {crate_name}",
                    file.display()
                );
            }
        }
    }

    /// Pinned against Triton 2.51's gRPC answers to the same version strings.
    #[test]
    fn versions_read_as_triton_reads_them() {
        for (text, number) in [
            ("1", 1),
            ("01", 1),
            ("+1", 1),
            (" 1", 1),
            ("\t1", 1),
            ("1x", 1),
            ("1.5", 1),
            ("1 ", 1),
            ("0", 0),
            ("-0", 0),
            ("0x1", 0),
            ("9223372036854775807", i64::MAX as u64),
            ("00000000000000000000000000001", 1),
        ] {
            assert_eq!(
                version_number(Some(text)).unwrap(),
                Some(number),
                "{text:?}"
            );
        }
        assert_eq!(version_number(None).unwrap(), None);
        for text in [
            "wrong",
            "",
            " ",
            "+",
            "-",
            "\u{a0}1",
            "9223372036854775808",
            "-9223372036854775809",
        ] {
            assert_eq!(
                version_number(Some(text)).unwrap_err().to_string(),
                format!(
                    "failed to get model version from specified version string '{text}' \
                     (details: stol), version should be an integral value > 0"
                ),
            );
        }
        for text in ["-1", " -1", "-5x", "-9223372036854775808"] {
            assert_eq!(
                version_number(Some(text)).unwrap_err().to_string(),
                format!(
                    "invalid model version specified '{text}' , version should be an integral value > 0"
                ),
            );
        }
        let refused = ModelRef::requested("add_sub", Some("wrong".into())).unwrap_err();
        assert_eq!(refused.http_status(), http::StatusCode::BAD_REQUEST);
    }
}
