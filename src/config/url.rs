//! The URLs a config names for its backends, read once when the config is: the HTTP base
//! (`BackendUrl`, which the upstream client forwards with) and the gRPC endpoint. They are
//! config's words, so a config is checked without the upstream code, and upstream builds
//! on what config read.

use http::uri::Authority;
use http::{HeaderValue, Uri};

/// A backend's base URL, whether it speaks HTTP/2 with prior knowledge (`h2c://`), and
/// whether it is reached over TLS (`https://`).
#[derive(Clone, Debug)]
pub struct BackendUrl {
    /// `http://host:port` (or `https://`) with any path prefix, no trailing slash.
    pub base: String,
    /// Use HTTP/2 without upgrade (h2c); otherwise HTTP/1.1 keep-alive.
    pub http2: bool,
    /// TLS (HTTP/1.1), verified against the backend's CA bundle.
    pub tls: bool,
    /// `host:port`, when the base has no path prefix: then a forwarded request's URI is
    /// put together from parts, without formatting or parsing it again.
    authority: Option<Authority>,
    /// The `Host` header sent to the backend (what hyper would write for the URI).
    host: HeaderValue,
}

impl BackendUrl {
    /// Parses a config URL; the error says which schemes work.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (http2, tls, rest) = if let Some(rest) = text.strip_prefix("h2c://") {
            (true, false, rest)
        } else if let Some(rest) = text.strip_prefix("http://") {
            (false, false, rest)
        } else if let Some(rest) = text.strip_prefix("https://") {
            (false, true, rest)
        } else {
            return Err(format!(
                "unsupported URL {text:?} (expected http://host:port, https://host:port or \
                 h2c://host:port)"
            ));
        };
        let scheme = if tls { "https" } else { "http" };
        let base = format!("{scheme}://{}", rest.trim_end_matches('/'));
        let uri: Uri = base
            .parse()
            .map_err(|e| format!("invalid URL {text:?}: {e}"))?;
        let Some(host) = uri.host().filter(|h| !h.is_empty()) else {
            return Err(format!("URL {text:?} has no host"));
        };
        let default_port = if tls { 443 } else { 80 };
        let host = match uri.port_u16() {
            Some(port) if port != default_port => format!("{host}:{port}"),
            _ => host.to_owned(),
        };
        let host =
            HeaderValue::from_str(&host).map_err(|e| format!("invalid URL {text:?}: {e}"))?;
        let authority = match uri.path() {
            "" | "/" => uri.authority().cloned(),
            _ => None,
        };
        Ok(Self {
            base,
            http2,
            tls,
            authority,
            host,
        })
    }

    /// The full URI of a path (with query) on this backend.
    pub fn join(&self, path_and_query: &str) -> Result<Uri, http::uri::InvalidUri> {
        let mut uri = String::with_capacity(self.base.len() + path_and_query.len());
        uri.push_str(&self.base);
        uri.push_str(path_and_query);
        uri.parse()
    }

    /// The URI of a client's request on this backend: its path and query, under the base.
    pub fn forward_uri(&self, client: &Uri) -> Result<Uri, http::Error> {
        let path = client.path_and_query().map_or("/", |p| p.as_str());
        match (&self.authority, client.path_and_query()) {
            (Some(authority), Some(path_and_query)) => {
                let mut parts = http::uri::Parts::default();
                parts.scheme = Some(if self.tls {
                    http::uri::Scheme::HTTPS
                } else {
                    http::uri::Scheme::HTTP
                });
                parts.authority = Some(authority.clone());
                parts.path_and_query = Some(path_and_query.clone());
                Ok(Uri::from_parts(parts)?)
            }
            _ => Ok(self.join(path)?),
        }
    }

    /// The `Host` header for this backend.
    pub fn host(&self) -> &HeaderValue {
        &self.host
    }

    /// `host:port` to connect to.
    pub fn address(&self) -> String {
        let uri: Uri = self.base.parse().expect("parsed when the URL was read");
        let port = uri.port_u16().unwrap_or(if self.tls { 443 } else { 80 });
        format!("{}:{port}", uri.host().unwrap_or_default())
    }
}

/// Checks a backend's `grpc` URL: `http://host:port`, or `https://host:port` for TLS.
pub fn grpc_endpoint(text: &str) -> Result<Uri, String> {
    let (scheme, rest) = if let Some(rest) = text.strip_prefix("http://") {
        ("http", rest)
    } else if let Some(rest) = text.strip_prefix("https://") {
        ("https", rest)
    } else {
        return Err(format!(
            "unsupported URL {text:?} (expected http://host:port or https://host:port of the \
             backend's gRPC endpoint)"
        ));
    };
    let uri: Uri = format!("{scheme}://{}", rest.trim_end_matches('/'))
        .parse()
        .map_err(|e| format!("invalid URL {text:?}: {e}"))?;
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("URL {text:?} has no host"));
    }
    if uri.path() != "/" {
        return Err(format!(
            "URL {text:?} has a path; a gRPC endpoint is only http://host:port"
        ));
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_scheme_and_prefix() {
        let url = BackendUrl::parse("http://127.0.0.1:19000/").unwrap();
        assert_eq!(url.base, "http://127.0.0.1:19000");
        assert!(!url.http2);
        assert_eq!(
            url.join("/v2/models/a/infer?x=1").unwrap().to_string(),
            "http://127.0.0.1:19000/v2/models/a/infer?x=1"
        );
        let client: Uri = "/v2/models/a/infer?x=1".parse().unwrap();
        assert_eq!(
            url.forward_uri(&client).unwrap().to_string(),
            "http://127.0.0.1:19000/v2/models/a/infer?x=1"
        );
        assert_eq!(url.host(), "127.0.0.1:19000");
        let prefixed = BackendUrl::parse("http://triton:80/prefix").unwrap();
        assert_eq!(
            prefixed.forward_uri(&client).unwrap().to_string(),
            "http://triton:80/prefix/v2/models/a/infer?x=1"
        );
        assert_eq!(prefixed.host(), "triton");
        assert!(BackendUrl::parse("h2c://triton:8000").unwrap().http2);
        let tls = BackendUrl::parse("https://triton:8443/").unwrap();
        assert!(tls.tls && !tls.http2);
        assert_eq!(tls.base, "https://triton:8443");
        assert_eq!(
            tls.forward_uri(&client).unwrap().to_string(),
            "https://triton:8443/v2/models/a/infer?x=1"
        );
        assert_eq!(tls.host(), "triton:8443");
        assert_eq!(BackendUrl::parse("https://t:443").unwrap().host(), "t");
        assert!(
            BackendUrl::parse("ftp://x")
                .unwrap_err()
                .contains("unsupported URL")
        );
        assert!(BackendUrl::parse("http://").is_err());
    }
}
