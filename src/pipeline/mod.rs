//! The walk every model request takes, whatever its wire format: check the caller (`auth`),
//! resolve the route to a target model (`route`), find or load a copy of it
//! (`Placement::acquire`), check the input (`validate`), then forward. Each stage is a plain function over the gateway state and the
//! request, so HTTP and gRPC share every rule.

pub mod auth;
pub mod mirror;
mod place;
pub mod replay;
pub mod repository;
mod route;
pub mod sequence;
pub mod server_metadata;
pub mod statistics;

pub use auth::Caller;

use crate::error::GatewayError;
pub use place::LeasedBody;
pub use route::{Outcome, PIN_HEADER, RouteTable, Routed};

/// What a model request asks. Only an inference may load the model (on its first request);
/// readiness, metadata, config and statistics are answered from the copies loaded now, as
/// Triton answers them from what it has loaded, and each words a model that is not loaded
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
    /// Whether this request may load the model when no copy is loaded.
    pub fn loads(self) -> bool {
        self == Self::Inference
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
        assert_eq!(refused.grpc_code(), tonic::Code::InvalidArgument);
    }
}
