//! Which KServe v2 endpoint an HTTP request is for, read off its method and path once, at
//! the edge: the protocol's paths and Triton's extensions (repository, statistics, shared
//! memory, generate). A path no endpoint has is 404, a method an endpoint does not take is
//! 405, and a path segment that does not decode (percent escapes that are not UTF-8) is 400,
//! each named as Triton's clients expect.

use crate::error::GatewayError;
use crate::model::{Ask, ModelRef};
use http::Method;
use std::borrow::Cow;

/// One endpoint, with what its path names.
#[derive(Debug, PartialEq)]
pub(super) enum Endpoint {
    /// `GET /v2`.
    ServerMetadata,
    /// `GET /v2/health/live`.
    Live,
    /// `GET /v2/health/ready`.
    Ready,
    /// `GET /v2/models/stats`: every model's statistics.
    AllStatistics,
    /// `/v2/models/{m}[/versions/{v}][/{action}]`: metadata, readiness, config, statistics
    /// or an inference of one model.
    Model(ModelRef, Ask),
    /// `POST /v2/repository/index`.
    RepositoryIndex,
    /// `POST /v2/repository/models/{m}/load` (true) or `/unload` (false).
    Repository { model: String, load: bool },
    /// The shared-memory extension, system or CUDA: a region cannot cross a gateway.
    SharedMemory,
}

/// The endpoint of `method path`, or the error its client gets.
pub(super) fn endpoint(method: &Method, path: &str) -> Result<Endpoint, GatewayError> {
    let not_found = || GatewayError::NotFound {
        path: path.to_owned(),
    };
    let takes = |expected: &Method, endpoint: Endpoint| {
        allow(method, expected, path)?;
        Ok(endpoint)
    };
    let rest = match path.strip_prefix("/v2") {
        Some("") => return takes(&Method::GET, Endpoint::ServerMetadata),
        Some(rest) => rest.strip_prefix('/').ok_or_else(not_found)?,
        None => return Err(not_found()),
    };
    let (segments, count) = segments(rest);
    let segments = &segments[..count];
    match segments {
        ["health", "live"] => takes(&Method::GET, Endpoint::Live),
        ["health", "ready"] => takes(&Method::GET, Endpoint::Ready),
        ["models", "stats"] => takes(&Method::GET, Endpoint::AllStatistics),
        ["repository", "index"] => takes(&Method::POST, Endpoint::RepositoryIndex),
        ["systemsharedmemory" | "cudasharedmemory", rest @ ..]
            if rest.iter().any(|s| !s.is_empty()) =>
        {
            Ok(Endpoint::SharedMemory)
        }
        ["repository", "models", model, action] if !model.is_empty() => {
            let load = match *action {
                "load" => true,
                "unload" => false,
                _ => return Err(not_found()),
            };
            let model = decoded(model)?.into_owned();
            takes(&Method::POST, Endpoint::Repository { model, load })
        }
        ["models", model] if !model.is_empty() => {
            let model = ModelRef::new(decoded(model)?, None);
            takes(&Method::GET, Endpoint::Model(model, Ask::Metadata))
        }
        ["models", model, "versions", version] if !model.is_empty() => {
            let model = versioned(model, version, path)?;
            takes(&Method::GET, Endpoint::Model(model, Ask::Metadata))
        }
        ["models", model, action] if !model.is_empty() => {
            let (ask, expected) = action_of(action).ok_or_else(not_found)?;
            let model = ModelRef::new(decoded(model)?, None);
            takes(&expected, Endpoint::Model(model, ask))
        }
        ["models", model, "versions", version, action] if !model.is_empty() => {
            if action.is_empty() {
                return Err(not_found());
            }
            let (ask, expected) = action_of(action).ok_or_else(not_found)?;
            let model = versioned(model, version, path)?;
            takes(&expected, Endpoint::Model(model, ask))
        }
        _ => Err(not_found()),
    }
}

/// Segments read of a path at most; the longest endpoint has five. The last holds the rest
/// of a longer path (with its slashes), so a longer path matches no endpoint of fewer.
const MAX_SEGMENTS: usize = 6;

/// A path's `/`-separated segments (`rest`, the part after a listener's prefix), without
/// allocating: this runs for every request.
pub(crate) fn segments(rest: &str) -> ([&str; MAX_SEGMENTS], usize) {
    // By byte, not `str::splitn`: its pattern searcher cost about 500 instructions for a
    // three-segment path (callgrind, loadtest/instructions.sh), this loop a tenth of that.
    let mut segments = [""; MAX_SEGMENTS];
    let (mut rest, mut count) = (rest, 1);
    while count < MAX_SEGMENTS
        && let Some(slash) = rest.bytes().position(|b| b == b'/')
    {
        segments[count - 1] = &rest[..slash];
        rest = &rest[slash + 1..];
        count += 1;
    }
    segments[count - 1] = rest;
    (segments, count)
}

/// The method an endpoint takes, or 405 naming the method sent; HEAD is GET without the
/// body, as for any HTTP server.
pub(crate) fn allow(method: &Method, expected: &Method, path: &str) -> Result<(), GatewayError> {
    if method == expected || (expected == Method::GET && method == Method::HEAD) {
        Ok(())
    } else {
        Err(GatewayError::MethodNotAllowed {
            method: method.to_string(),
            path: path.to_owned(),
        })
    }
}

/// What each per-model action asks, and the method it takes (`generate` and
/// `generate_stream` are Triton's generate extension: inferences with a flat JSON body).
fn action_of(action: &str) -> Option<(Ask, Method)> {
    Some(match action {
        "ready" => (Ask::Ready, Method::GET),
        "config" => (Ask::Config, Method::GET),
        "stats" => (Ask::Statistics, Method::GET),
        "infer" | "generate" | "generate_stream" => (Ask::Inference, Method::POST),
        _ => return None,
    })
}

/// The model and version of a `/versions/{v}` URL. Triton's HTTP routes take only digits
/// there: any other segment is an unknown path (404), as on Triton; digits Triton cannot
/// read as a version (past 64 bits) are its 400.
fn versioned(model: &str, version: &str, path: &str) -> Result<ModelRef, GatewayError> {
    if version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit()) {
        return Err(GatewayError::NotFound {
            path: path.to_owned(),
        });
    }
    Ok(ModelRef::requested(
        decoded(model)?,
        Some(version.to_owned()),
    )?)
}

/// A path segment with its percent escapes decoded (a model named `a/b` arrives as
/// `a%2Fb`).
pub(crate) fn decoded(segment: &str) -> Result<Cow<'_, str>, GatewayError> {
    if !segment.contains('%') {
        return Ok(Cow::Borrowed(segment));
    }
    percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .map_err(|_| {
            GatewayError::BadRequest(format!(
                "malformed URL: the path segment {segment:?} is not UTF-8 once decoded"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(method: Method, path: &str) -> Option<(ModelRef, Ask)> {
        match endpoint(&method, path) {
            Ok(Endpoint::Model(model, ask)) => Some((model, ask)),
            _ => None,
        }
    }

    fn status(method: Method, path: &str) -> u16 {
        match endpoint(&method, path) {
            Ok(_) => 200,
            Err(error) => error.http_status().as_u16(),
        }
    }

    /// The segments are `splitn`'s: at most `MAX_SEGMENTS`, the last holding the rest.
    #[test]
    fn segments_split_as_splitn_does() {
        for rest in [
            "",
            "/",
            "models",
            "models/add_sub/infer",
            "models//x/",
            "a/b/c/d/e/f/g/h",
            "a/b/c/d/e/",
            "a/b/c/d/e/f",
            "//////",
        ] {
            let (segments, count) = segments(rest);
            let expected: Vec<&str> = rest.splitn(MAX_SEGMENTS, '/').collect();
            assert_eq!(segments[..count], expected[..], "{rest:?}");
        }
    }

    #[test]
    fn model_paths_name_the_model_the_version_and_what_is_asked() {
        assert_eq!(
            model(Method::POST, "/v2/models/add_sub/infer"),
            Some((ModelRef::new("add_sub", None), Ask::Inference))
        );
        assert_eq!(
            model(Method::POST, "/v2/models/add_sub/versions/2/generate"),
            Some((ModelRef::new("add_sub", Some("2".into())), Ask::Inference))
        );
        assert_eq!(
            model(Method::GET, "/v2/models/a%2Fb"),
            Some((ModelRef::new("a/b", None), Ask::Metadata))
        );
        assert_eq!(
            model(Method::HEAD, "/v2/models/m/versions/3/ready"),
            Some((ModelRef::new("m", Some("3".into())), Ask::Ready))
        );
        assert_eq!(
            endpoint(&Method::GET, "/v2/models/stats").unwrap(),
            Endpoint::AllStatistics
        );
        assert_eq!(
            endpoint(&Method::POST, "/v2/repository/models/m%20x/unload").unwrap(),
            Endpoint::Repository {
                model: "m x".into(),
                load: false
            }
        );
    }

    #[test]
    fn unknown_paths_wrong_methods_and_bad_escapes_are_refused_as_triton_does() {
        for (method, path, expected) in [
            (Method::GET, "/v2", 200),
            (Method::GET, "/v2/", 404),
            (Method::GET, "/v2x", 404),
            (Method::GET, "/v2/nothing/here", 404),
            (Method::GET, "/v2/models/add_sub/infer", 405),
            (Method::POST, "/v2/models/add_sub", 405),
            (Method::POST, "/v2/health/live", 405),
            (Method::GET, "/v2/repository/index", 405),
            (Method::GET, "/v2/models/add_sub/frobnicate", 404),
            (Method::POST, "/v2/models//infer", 404),
            (Method::GET, "/v2/models/m/", 404),
            (Method::POST, "/v2/models/m/versions/x/infer", 404),
            (Method::POST, "/v2/models/m/versions//infer", 404),
            (Method::POST, "/v2/models/m/versions/1/", 404),
            (Method::POST, "/v2/models/m/extra/infer", 404),
            (
                Method::POST,
                "/v2/models/m/versions/99999999999999999999/infer",
                400,
            ),
            (Method::GET, "/v2/models/%FF%FE", 400),
            (Method::POST, "/v2/repository/models/m/reload", 404),
            (Method::GET, "/v2/repository/models/m/load", 405),
            (Method::GET, "/v2/systemsharedmemory/status", 200),
            (Method::POST, "/v2/cudasharedmemory/region/r/register", 200),
            (Method::GET, "/v2/systemsharedmemory/", 404),
            (Method::POST, "/v2/models/m/versions/1/infer/x", 404),
            (Method::POST, "/v2/models/m/versions/1/infer/x/y/z", 404),
            (
                Method::POST,
                "/v2/systemsharedmemory/region/a/b/c/d/e/register",
                200,
            ),
        ] {
            assert_eq!(status(method.clone(), path), expected, "{method} {path}");
        }
    }
}
