//! OpenAI's error shape, `{"error": {"message", "type", "param", "code"}}`, for the gateway's
//! own failures (`of`) and a backend's passed on (`body`): OpenAI's clients read `type` and
//! `code` to tell a bad request from a rate limit or a server failure. The status is the one
//! the gateway's one table gives (`GatewayError::classify`).

use crate::error::GatewayError;
use http::StatusCode;
use serde_json::{Value, json};

/// OpenAI's error `type` for a status.
pub fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_exceeded",
        500.. => "server_error",
        _ => "invalid_request_error",
    }
}

/// The error object: `message`, its `type` by status, the parameter it is about, and a
/// stable `code` (the gateway's error kind).
pub fn body(status: StatusCode, message: &str, param: Option<&str>, code: &str) -> Value {
    json!({"error": {
        "message": message,
        "type": error_type(status),
        "param": param,
        "code": code,
    }})
}

/// A failure the gateway answers itself, in OpenAI's shape. A rate limit's code is
/// OpenAI's own `rate_limit_exceeded`, which its clients retry on.
pub fn of(error: &GatewayError) -> Value {
    let status = error.http_status();
    let param = match error {
        GatewayError::InvalidParameter { param, .. } if !param.is_empty() => Some(param.as_str()),
        GatewayError::ContextLengthExceeded { param, .. } => Some(*param),
        _ => None,
    };
    let code = match error {
        GatewayError::RateLimited { .. } => "rate_limit_exceeded",
        GatewayError::UnknownModel { .. } => "model_not_found",
        GatewayError::InvalidParameter { .. } => "invalid_value",
        other => other.kind(),
    };
    body(status, &error.to_string(), param, code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_parameter_and_the_kind() {
        let error = GatewayError::InvalidParameter {
            param: "n".into(),
            message: "only n = 1".into(),
        };
        assert_eq!(
            of(&error),
            json!({"error": {"message": "only n = 1", "type": "invalid_request_error",
                             "param": "n", "code": "invalid_value"}})
        );
        let limited = GatewayError::RateLimited {
            message: "over".into(),
            retry_after: std::time::Duration::from_secs(1),
        };
        assert_eq!(of(&limited)["error"]["type"], "rate_limit_exceeded");
        assert_eq!(of(&limited)["error"]["code"], "rate_limit_exceeded");
    }
}
