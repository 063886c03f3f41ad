//! What can go wrong with one request, and the `--check` response validation.
//!
//! Every failed request is counted under exactly one [`ErrorKind`], so the
//! report can tell "the gateway answered 503" apart from "we could not
//! connect" or "the response was not an inference result".

use std::fmt;

use serde::Deserialize;
use serde::de::IgnoredAny;

/// Why a request did not count as a successful inference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorKind {
    /// The server answered with this HTTP status (non-2xx, or non-200 with `--check`).
    Status(u16),
    /// The server answered with this gRPC status code (not OK).
    Grpc(i32),
    /// No connection could be established (refused, unreachable, DNS).
    Connect,
    /// No complete response within `--timeout` of the intended send time.
    Timeout,
    /// The request could not be sent or the response head never arrived
    /// (connection reset or closed mid-exchange, protocol error).
    Request,
    /// The response head arrived but reading the body failed.
    Body,
    /// `--check`: the response body is not valid JSON.
    CheckBadJson,
    /// `--check`: the JSON response has no `outputs` field.
    CheckNoOutputs,
    /// `--check`: a binary response's `Inference-Header-Content-Length` is
    /// missing, unparsable, or longer than the body.
    CheckBadBinaryHeader,
    /// `--check` in sequence mode: the answer's first output is not the running sum of the
    /// sequence so far (a request reached an instance that did not see the sequence start).
    CheckSequenceSum,
    /// Open loop only: the generator could not get a connection slot
    /// (`--connections`) before the request's timeout expired.
    NoConnectionSlot,
}

impl ErrorKind {
    /// The stable name used in the report and in the `--json` document
    /// (`http_503`, `connect`, `timeout`...).
    pub fn name(&self) -> String {
        match self {
            ErrorKind::Status(code) => format!("http_{code}"),
            ErrorKind::Grpc(code) => format!("grpc_{code}"),
            ErrorKind::Connect => "connect".into(),
            ErrorKind::Timeout => "timeout".into(),
            ErrorKind::Request => "request".into(),
            ErrorKind::Body => "body".into(),
            ErrorKind::CheckBadJson => "check_bad_json".into(),
            ErrorKind::CheckNoOutputs => "check_no_outputs".into(),
            ErrorKind::CheckBadBinaryHeader => "check_bad_binary_header".into(),
            ErrorKind::CheckSequenceSum => "check_sequence_sum".into(),
            ErrorKind::NoConnectionSlot => "no_connection_slot".into(),
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

#[derive(Deserialize)]
struct OutputsOnly {
    outputs: Option<IgnoredAny>,
}

/// `--check` validation of a 200 response body.
///
/// `binary_header_len` is the response's `Inference-Header-Content-Length`,
/// if it had one (`Some(Err(()))` when the header was present but not a
/// number): then only that many leading bytes are JSON, the rest raw tensors.
/// The JSON must contain an `outputs` field (its contents are skipped, not
/// parsed, to keep the check cheap).
pub fn check_infer_response(
    body: &[u8],
    binary_header_len: Option<Result<usize, ()>>,
) -> Result<(), ErrorKind> {
    let json = match binary_header_len {
        None => body,
        Some(Ok(n)) if n <= body.len() => &body[..n],
        Some(_) => return Err(ErrorKind::CheckBadBinaryHeader),
    };
    match serde_json::from_slice::<OutputsOnly>(json) {
        Ok(OutputsOnly { outputs: Some(_) }) => Ok(()),
        Ok(OutputsOnly { outputs: None }) => Err(ErrorKind::CheckNoOutputs),
        Err(_) => Err(ErrorKind::CheckBadJson),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable() {
        assert_eq!(ErrorKind::Status(503).name(), "http_503");
        assert_eq!(ErrorKind::Connect.to_string(), "connect");
        assert_eq!(ErrorKind::Timeout.name(), "timeout");
        assert_eq!(ErrorKind::Body.name(), "body");
        assert_eq!(ErrorKind::CheckNoOutputs.name(), "check_no_outputs");
    }

    #[test]
    fn json_response_needs_outputs() {
        let ok = br#"{"model_name":"add_sub","outputs":[{"name":"OUTPUT0"}]}"#;
        assert_eq!(check_infer_response(ok, None), Ok(()));
        let none = br#"{"model_name":"add_sub"}"#;
        assert_eq!(
            check_infer_response(none, None),
            Err(ErrorKind::CheckNoOutputs)
        );
        assert_eq!(
            check_infer_response(b"<html>", None),
            Err(ErrorKind::CheckBadJson)
        );
        assert_eq!(
            check_infer_response(b"", None),
            Err(ErrorKind::CheckBadJson)
        );
    }

    #[test]
    fn binary_response_checks_its_json_header() {
        let header = br#"{"outputs":[{"name":"OUTPUT0","parameters":{"binary_data_size":4}}]}"#;
        let mut body = header.to_vec();
        body.extend_from_slice(&[0, 0, 128, 63]);
        assert_eq!(check_infer_response(&body, Some(Ok(header.len()))), Ok(()));
        assert_eq!(
            check_infer_response(&body, Some(Ok(body.len() + 1))),
            Err(ErrorKind::CheckBadBinaryHeader)
        );
        assert_eq!(
            check_infer_response(&body, Some(Err(()))),
            Err(ErrorKind::CheckBadBinaryHeader)
        );
        // Header length cutting the JSON short is invalid JSON.
        assert_eq!(
            check_infer_response(&body, Some(Ok(5))),
            Err(ErrorKind::CheckBadJson)
        );
    }
}
