//! Who the load is sent as: `--tenant NAME=KEY` and `--priority BAND`, for measuring a
//! gateway's flow control (infergate's fair queues per tenant and priority bands) with
//! several runs side by side, each as one tenant. Both become request headers (gRPC
//! metadata); the tenant's name only labels the report, its key is never printed.

use anyhow::{Context, Result, bail};
use http::{HeaderMap, HeaderName, HeaderValue};

/// The header infergate reads a request's priority band from.
pub const PRIORITY_HEADER: &str = "x-infergate-priority";

/// Where `--tenant`'s key goes unless `--tenant-header` says otherwise: infergate's API
/// key header.
pub const DEFAULT_TENANT_HEADER: &str = "x-api-key";

/// A priority band a request may ask for (`--priority`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Priority {
    /// Served before every other band.
    Critical,
    /// The default band.
    Standard,
    /// Shed first under pressure.
    Sheddable,
}

impl Priority {
    /// The header's value, and the report's.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Critical => "critical",
            Self::Standard => "standard",
            Self::Sheddable => "sheddable",
        }
    }
}

/// The run's tenant and band, as the report names them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// The tenant's name (`--tenant NAME=...`).
    pub tenant: Option<String>,
    /// The band asked for.
    pub priority: Option<Priority>,
}

/// Adds `--tenant`'s key (in `header`, default `x-api-key`) and `--priority` to the
/// request headers, and returns what the report says of them. A header another flag
/// already sets is refused rather than sent twice.
pub fn apply(
    tenant: Option<&str>,
    header: Option<&str>,
    priority: Option<Priority>,
    headers: &mut HeaderMap,
) -> Result<Identity> {
    if header.is_some() && tenant.is_none() {
        bail!("--tenant-header needs --tenant");
    }
    let name = match tenant {
        Some(spec) => {
            let (name, key) = spec
                .split_once('=')
                .filter(|(name, key)| !name.is_empty() && !key.is_empty())
                .with_context(|| format!("--tenant {:?}: expected NAME=KEY", redact(spec)))?;
            let header = header.unwrap_or(DEFAULT_TENANT_HEADER);
            let mut value =
                HeaderValue::from_str(key).context("--tenant's key is not a valid header value")?;
            value.set_sensitive(true);
            insert_once(headers, header, value, "--tenant")?;
            Some(name.to_owned())
        }
        None => None,
    };
    if let Some(band) = priority {
        let value = HeaderValue::from_static(band.as_str());
        insert_once(headers, PRIORITY_HEADER, value, "--priority")?;
    }
    Ok(Identity {
        tenant: name,
        priority,
    })
}

/// Sets `name`, unless another flag already did.
fn insert_once(headers: &mut HeaderMap, name: &str, value: HeaderValue, flag: &str) -> Result<()> {
    let name = HeaderName::from_bytes(name.as_bytes())
        .with_context(|| format!("{flag}: {name:?} is not a header name"))?;
    if headers.contains_key(&name) {
        bail!("{flag} sends {name}, which another flag (--api-key, --bearer or -H) sets too");
    }
    headers.insert(name, value);
    Ok(())
}

/// A `--tenant` value fit for an error message: the name, never the key.
fn redact(spec: &str) -> String {
    match spec.split_once('=') {
        Some((name, _)) => format!("{name}=…"),
        None => spec.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(
        tenant: Option<&str>,
        header: Option<&str>,
        priority: Option<Priority>,
    ) -> Result<(Identity, HeaderMap)> {
        let mut headers = HeaderMap::new();
        let identity = apply(tenant, header, priority, &mut headers)?;
        Ok((identity, headers))
    }

    #[test]
    fn a_tenant_sends_its_key_and_a_priority_its_band() {
        let (id, h) = applied(Some("flood=k=1"), None, Some(Priority::Critical)).unwrap();
        assert_eq!(id.tenant.as_deref(), Some("flood"));
        assert_eq!(id.priority, Some(Priority::Critical));
        assert_eq!(h["x-api-key"], "k=1");
        assert!(h["x-api-key"].is_sensitive());
        assert_eq!(h[PRIORITY_HEADER], "critical");

        let (_, h) = applied(Some("a=Bearer t"), Some("authorization"), None).unwrap();
        assert_eq!(h["authorization"], "Bearer t");
        assert!(!h.contains_key(PRIORITY_HEADER));
    }

    #[test]
    fn bad_or_doubled_settings_are_refused_without_showing_the_key() {
        let error = applied(Some("secret"), None, None).unwrap_err().to_string();
        assert!(error.contains("NAME=KEY"), "{error}");
        assert!(applied(Some("=k"), None, None).is_err());
        assert!(applied(Some("a="), None, None).is_err());
        assert!(applied(None, Some("authorization"), None).is_err());
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", HeaderValue::from_static("other"));
        let doubled = apply(Some("a=k"), None, None, &mut headers).unwrap_err();
        assert!(doubled.to_string().contains("x-api-key"), "{doubled}");
        assert!(!doubled.to_string().contains("=k"), "{doubled}");
    }
}
