//! The words every layer shares about a request for a model: which model and version it
//! names (`ModelRef`, read as Triton reads versions), what it asks of it (`Ask`), and what
//! served it (`Served`). A leaf: it imports nothing of the gateway, so the front-ends, the
//! pipeline, placement, validation and the error table can all speak of a model without
//! importing each other.

use std::fmt;

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
    pub fn requested(name: impl Into<String>, version: Option<String>) -> Result<Self, BadVersion> {
        version_number(version.as_deref())?;
        Ok(Self::new(name, version))
    }

    /// The version asked for as a number (`Ok(None)`: none asked for).
    pub fn version_number(&self) -> Result<Option<u64>, BadVersion> {
        version_number(self.version.as_deref())
    }
}

/// A version as written (in a request or a route target) as a number, read as Triton reads
/// it (`std::stol`): leading whitespace, an optional sign, digits, and whatever follows
/// ignored (`" 1"` and `"1x"` are version 1); no digits, or more than 64 bits, or a
/// negative number, is an error with Triton's message. Version 0 reads, and names no version
/// that exists. The one rule for requests and route targets.
pub fn version_number(text: Option<&str>) -> Result<Option<u64>, BadVersion> {
    let Some(text) = text else {
        return Ok(None);
    };
    match stol(text) {
        Some(number) => u64::try_from(number).map(Some).map_err(|_| {
            BadVersion(format!(
                "invalid model version specified '{text}' , version should be an integral \
                 value > 0"
            ))
        }),
        None => Err(BadVersion(format!(
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

/// A version Triton would not read, with Triton's own words (answered 400 /
/// INVALID_ARGUMENT, `GatewayError::from`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadVersion(pub String);

impl fmt::Display for BadVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadVersion {}

/// What served a request: the labels of its metrics and the fields of its log line.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Served {
    /// Model name.
    pub model: String,
    /// Version asked for, if any.
    pub version: Option<String>,
    /// Backend that answered.
    pub backend: String,
    /// The route the client called, when its model name was a route.
    pub route: Option<std::sync::Arc<str>>,
}

impl Served {
    /// Nothing served it (refused before a copy was placed): the labels a metric gets
    /// then, without building them per request.
    pub const NONE: &'static Served = &Served {
        model: String::new(),
        version: None,
        backend: String::new(),
        route: None,
    };
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
        assert!(ModelRef::requested("add_sub", Some("wrong".into())).is_err());
    }
}
