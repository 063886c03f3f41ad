//! One more try for a request whose copy had gone. Between placement and the backend's
//! answer the copy a request was sent to may have left the backend: unloaded behind the
//! gateway's back, lost in a restart, or a race the books lost. Triton refuses such a request
//! before doing any work, with `Request for unknown model: 'm' has no available versions`
//! (or `is not found`, `... is not at ready state`): HTTP 404 or 503, gRPC NOT_FOUND or
//! UNAVAILABLE. Nothing ran, so the request may be sent again: the copy comes off the books
//! (`Placement::copy_gone`), the request is placed again (`Routed::place_again`) and sent
//! once more. Only once: a second refusal is the answer.

/// Whether a backend's error message says it has no such model ready. Triton's own words;
/// a message from the model itself never starts a lookup error like this.
pub fn copy_is_gone(message: &str) -> bool {
    message.contains("Request for unknown model")
}

/// Whether an HTTP answer of this status may be such a refusal (then its body is read).
pub fn may_be_gone(status: http::StatusCode) -> bool {
    matches!(
        status,
        http::StatusCode::NOT_FOUND | http::StatusCode::SERVICE_UNAVAILABLE
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tritons_lookup_refusals() {
        for gone in [
            "Request for unknown model: 'fat_1' has no available versions",
            "Request for unknown model: 'm' is not found",
            "[request id: 7] Request for unknown model: 'm' version 2 is not at ready state",
        ] {
            assert!(copy_is_gone(gone), "{gone}");
        }
        assert!(!copy_is_gone(
            "unexpected shape for input 'INPUT0' for model 'm'"
        ));
        assert!(may_be_gone(http::StatusCode::NOT_FOUND));
        assert!(!may_be_gone(http::StatusCode::BAD_REQUEST));
    }
}
