//! The request metrics' series, registered once and kept. Building a series' labels (a
//! string copy each) and finding it in the registry cost more than recording into it, and a
//! request records into three; a kept series costs one hash and one read lock to find.

use crate::model::Served;
use crate::telemetry;
use foldhash::HashMap;
use metrics::{Counter, Gauge, Histogram};
use std::hash::BuildHasher;
use std::sync::{Arc, LazyLock, OnceLock, RwLock};

/// The wire protocol a request came in on: the `protocol` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// KServe v2 HTTP/REST.
    Http,
    /// KServe v2 gRPC.
    Grpc,
}

impl Protocol {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Grpc => "grpc",
        }
    }

    /// This protocol's series of `infergate_requests_in_flight`.
    pub fn in_flight(self) -> &'static Gauge {
        static HTTP: LazyLock<Gauge> = LazyLock::new(|| gauge(Protocol::Http));
        static GRPC: LazyLock<Gauge> = LazyLock::new(|| gauge(Protocol::Grpc));
        match self {
            Self::Http => &HTTP,
            Self::Grpc => &GRPC,
        }
    }
}

fn gauge(protocol: Protocol) -> Gauge {
    metrics::gauge!(telemetry::IN_FLIGHT, "protocol" => protocol.as_str())
}

/// Status classes, in the order of `RequestSeries::requests`.
const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// The series one (protocol, model, version, backend, route) records into.
pub struct RequestSeries {
    protocol: Protocol,
    served: Served,
    duration: Histogram,
    /// `infergate_requests_total` per status class, registered on first use so that only
    /// classes that happened are exported.
    requests: [OnceLock<Counter>; STATUS_CLASSES.len()],
}

impl RequestSeries {
    fn new(protocol: Protocol, served: &Served) -> Self {
        Self {
            protocol,
            served: served.clone(),
            duration: metrics::histogram!(telemetry::REQUEST_DURATION,
                "protocol" => protocol.as_str(),
                "model" => served.model.clone(),
                "version" => served.version.clone().unwrap_or_default(),
                "route" => served.route.clone().unwrap_or_default()),
            requests: Default::default(),
        }
    }

    fn is(&self, protocol: Protocol, served: &Served) -> bool {
        self.protocol == protocol && self.served == *served
    }

    /// `infergate_request_duration_seconds`.
    pub fn duration(&self) -> &Histogram {
        &self.duration
    }

    /// `infergate_requests_total` for a status class (`2xx`...).
    pub fn requests(&self, status_class: &'static str) -> &Counter {
        let i = STATUS_CLASSES
            .iter()
            .position(|c| *c == status_class)
            .unwrap_or(STATUS_CLASSES.len() - 1);
        self.requests[i].get_or_init(|| {
            let served = &self.served;
            metrics::counter!(telemetry::REQUESTS,
                "protocol" => self.protocol.as_str(),
                "model" => served.model.clone(),
                "version" => served.version.clone().unwrap_or_default(),
                "backend" => served.backend.clone(),
                "route" => served.route.clone().unwrap_or_default(),
                "status" => STATUS_CLASSES[i])
        })
    }

    /// The series of a request: found, or registered on first sight. Label values are only
    /// models that a backend serves, backends and routes, so the set stays small.
    pub fn of(protocol: Protocol, served: &Served) -> Arc<RequestSeries> {
        static SEEN: LazyLock<Seen> = LazyLock::new(Seen::default);
        SEEN.find_or_add(protocol, served)
    }
}

/// Every series registered so far, by a hash of its labels: foldhash, seeded per process
/// (SipHash cost a request some 600 instructions here; the labels are only names the
/// gateway serves, so no client can pick colliding keys).
#[derive(Default)]
struct Seen {
    hasher: foldhash::fast::RandomState,
    by_hash: RwLock<HashMap<u64, Vec<Arc<RequestSeries>>>>,
}

impl Seen {
    fn find_or_add(&self, protocol: Protocol, served: &Served) -> Arc<RequestSeries> {
        let hash = self.hasher.hash_one((protocol, served));
        let find = |map: &HashMap<u64, Vec<Arc<RequestSeries>>>| {
            map.get(&hash)?
                .iter()
                .find(|s| s.is(protocol, served))
                .cloned()
        };
        if let Some(series) = find(&self.by_hash.read().unwrap_or_else(|e| e.into_inner())) {
            return series;
        }
        let mut map = self.by_hash.write().unwrap_or_else(|e| e.into_inner());
        if let Some(series) = find(&map) {
            return series;
        }
        let series = Arc::new(RequestSeries::new(protocol, served));
        map.entry(hash).or_default().push(series.clone());
        series
    }
}

/// Counts a request in `infergate_requests_in_flight` until dropped.
pub struct InFlightGauge(&'static Gauge);

impl InFlightGauge {
    /// Starts counting one request of `protocol`.
    pub fn start(protocol: Protocol) -> Self {
        let gauge = protocol.in_flight();
        gauge.increment(1.0);
        Self(gauge)
    }
}

impl Drop for InFlightGauge {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_series_per_label_set() {
        let served = |model: &str, route: Option<&str>| Served {
            model: model.into(),
            version: None,
            backend: "b".into(),
            route: route.map(Into::into),
        };
        let a = RequestSeries::of(Protocol::Http, &served("series_a", None));
        let again = RequestSeries::of(Protocol::Http, &served("series_a", None));
        assert!(Arc::ptr_eq(&a, &again));
        let grpc = RequestSeries::of(Protocol::Grpc, &served("series_a", None));
        assert!(!Arc::ptr_eq(&a, &grpc));
        let routed = RequestSeries::of(Protocol::Http, &served("series_a", Some("r")));
        assert!(!Arc::ptr_eq(&a, &routed));
    }
}
