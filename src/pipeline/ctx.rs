//! `RequestCtx`: what one request carries from its first phase to its last. A front-end's
//! decoder builds it once, at the edge, and every phase reads and fills it, so no phase
//! looks anything up a second time: above all the config snapshot, taken once, so that a
//! reload landing mid-request never authenticates a request with one config and routes it
//! with another.

use crate::auth::Admission;
use crate::auth::Caller;
use crate::error::GatewayError;
use crate::flow::{Band, Permit};
use crate::gateway::Gateway;
use crate::live::Live;
use crate::model::{Ask, ModelRef, Served};
use crate::placement::{Lease, SequenceRef};
use crate::routing::Routed;
use http::HeaderValue;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// One request's state through the pipeline.
pub struct RequestCtx {
    /// The gateway's shared state.
    pub gateway: Gateway,
    /// The config snapshot this request sees in every phase.
    pub live: Arc<Live>,
    /// The request id (the client's, or made at the edge).
    pub id: HeaderValue,
    /// When the client stops waiting, when it said (gRPC's `grpc-timeout`).
    pub deadline: Option<Instant>,
    /// When the edge saw the request.
    pub started: Instant,
    /// The subject of the client's verified certificate (mTLS): a credential, read by
    /// `admit::authenticate`.
    pub peer: Option<Arc<str>>,
    /// Who is calling (`admit::authenticate`).
    pub caller: Caller,
    /// The tenant's concurrency slot, held until the answer has gone (`admit::model`).
    pub admission: Admission,
    /// What the request asks of its model.
    pub ask: Ask,
    /// The model and version the client named, until `route` resolves it.
    pub requested: Option<ModelRef>,
    /// Where the request goes (`route`).
    pub routed: Option<Routed>,
    /// The sequence the request belongs to, read before it is placed.
    pub sequence: Option<SequenceRef>,
    /// Its priority band (`flow::priority`).
    pub band: Band,
    /// The copy that serves it (`place`).
    pub lease: Option<Lease>,
    /// When the copy was placed: a streamed answer's time to first token counts from here
    /// (`tokens::clock`), so a cold model's load is not its answer's.
    pub placed: Option<Instant>,
    /// Its slot on the model's copies (`flow::enter`), after the lease so that the copy is
    /// released before the next waiting request is let in.
    pub permit: Option<Permit>,
    /// What served it, for its metrics and log line (`served`): set with the copy by
    /// `place`, or by an answer no single copy gives (statistics, a repository load).
    pub serving: Option<Served>,
}

impl RequestCtx {
    /// A request seen at the edge (`edge::Edge::begin`): the snapshot it will use
    /// throughout, its id, deadline and peer.
    pub(super) fn new(
        gateway: &Gateway,
        live: Arc<Live>,
        (id, deadline): (HeaderValue, Option<Instant>),
        peer: Option<Arc<str>>,
    ) -> Self {
        Self {
            gateway: gateway.clone(),
            live,
            id,
            deadline,
            started: Instant::now(),
            peer,
            caller: Caller::Open,
            admission: Admission::default(),
            ask: Ask::Inference,
            requested: None,
            routed: None,
            sequence: None,
            band: Band::Standard,
            lease: None,
            placed: None,
            permit: None,
            serving: None,
        }
    }

    /// The context of one message of a gRPC stream, a request of its own under the stream's
    /// edge: the stream's id, deadline, start and caller (authenticated once, when the
    /// stream opened), the snapshot `live` (a long stream follows reloads), and nothing else
    /// learned yet.
    pub fn next(&self, live: Arc<Live>) -> Self {
        Self {
            started: self.started,
            caller: self.caller.clone(),
            ..Self::new(
                &self.gateway,
                live,
                (self.id.clone(), self.deadline),
                self.peer.clone(),
            )
        }
    }

    /// Names the model the request is about, and what it asks of it (the decoder's last
    /// step for a model request).
    pub fn about(&mut self, requested: ModelRef, ask: Ask) {
        self.requested = Some(requested);
        self.ask = ask;
    }

    /// The model the request is for: the route's target once routed, else the name asked.
    pub fn model(&self) -> Option<&ModelRef> {
        self.routed
            .as_ref()
            .map(|r| &r.target)
            .or(self.requested.as_ref())
    }

    /// What served the request, for its metrics and log line: known only once a copy was
    /// placed (or the answer was made from every copy), so that names no backend has never
    /// become metric labels.
    pub fn served(&self) -> Served {
        self.serving.clone().unwrap_or_default()
    }

    /// The caller's tenant, for the log line (never the credential).
    pub fn tenant(&self) -> Option<&Arc<str>> {
        self.caller.tenant()
    }

    /// The `model[/version]` of the route target that serves it, when routed: sent back to
    /// the client (`infergate-target`).
    pub fn target_label(&self) -> Option<&str> {
        self.routed.as_ref()?.label.as_deref()
    }

    /// Time left for a call to a backend: `cap`, or less when the client's deadline comes
    /// first.
    pub fn budget(&self, cap: Duration) -> Duration {
        match self.deadline {
            Some(deadline) => cap.min(deadline.saturating_duration_since(Instant::now())),
            None => cap,
        }
    }

    /// A backend call given only what was left of the client's deadline ends with the
    /// gateway's own timer at about the moment the deadline passes, and a wait for room
    /// (`placement.room_wait`) ends there at the latest. When the deadline has passed, it is
    /// the client's deadline, not a slow backend or a full pool: answered and counted as
    /// `deadline_exceeded`, and not counted by route guards.
    pub fn deadline_passed(&self, error: GatewayError) -> GatewayError {
        match (error, self.deadline) {
            (
                GatewayError::UpstreamTimeout { .. } | GatewayError::NoRoom { .. },
                Some(deadline),
            ) if Instant::now() >= deadline => self.deadline_exceeded(deadline),
            (error, _) => error,
        }
    }

    /// The failure of a request whose client's deadline passed in the gateway.
    pub fn deadline_exceeded(&self, deadline: Instant) -> GatewayError {
        GatewayError::DeadlineExceeded {
            after: deadline - self.started,
        }
    }

    /// The copy the request was placed on.
    pub fn lease(&self) -> Result<&Lease, GatewayError> {
        self.lease
            .as_ref()
            .ok_or_else(|| GatewayError::ModelNotReady {
                model: self.model().map(|m| m.name.clone()).unwrap_or_default(),
                version: None,
            })
    }
}

/// A request's id: the client's `x-request-id` when it is short printable ASCII, else a new
/// one, so a hostile id cannot break log lines. A new id is made shared from the start: it
/// is cloned into the backend's request, the answer and the log scope, and bytes copied from
/// a slice would be copied again at the first clone.
pub fn request_id(client: Option<&HeaderValue>) -> HeaderValue {
    let mut id = client
        .filter(|v| {
            let bytes = v.as_bytes();
            !bytes.is_empty() && bytes.len() <= 128 && bytes.iter().all(|b| b.is_ascii_graphic())
        })
        .cloned()
        .unwrap_or_else(|| {
            let mut id = [0; uuid::fmt::Hyphenated::LENGTH];
            uuid::Uuid::new_v4().as_hyphenated().encode_lower(&mut id);
            HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(id))
                .expect("uuid is a valid header value")
        });
    crate::trace::never_indexed(&mut id);
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's printable id is kept; a missing, empty, over-long or unprintable one is
    /// replaced by a new UUID (v4, hyphenated, lower case), a different one each time.
    #[test]
    fn a_request_keeps_a_printable_id_or_gets_a_new_uuid() {
        let kept = HeaderValue::from_static("client-id.42");
        assert_eq!(request_id(Some(&kept)), kept);
        let long = HeaderValue::from_str(&"x".repeat(129)).unwrap();
        let spaced = HeaderValue::from_static("has space");
        let empty = HeaderValue::from_static("");
        for client in [None, Some(&long), Some(&spaced), Some(&empty)] {
            let id = request_id(client);
            let parsed = uuid::Uuid::parse_str(id.to_str().unwrap()).unwrap();
            assert_eq!(parsed.get_version_num(), 4);
            assert_eq!(id.to_str().unwrap(), parsed.hyphenated().to_string());
            assert_eq!(id.clone(), id);
            assert_ne!(request_id(client), id);
        }
    }

    /// Every request's id, kept or new, goes out never indexed by HTTP/2's header
    /// compression (`trace::never_indexed`): a value that never repeats would only churn
    /// the connection's table.
    #[test]
    fn a_request_id_is_never_indexed() {
        let kept = HeaderValue::from_static("client-id.42");
        assert!(!kept.is_sensitive());
        assert!(request_id(Some(&kept)).is_sensitive());
        assert!(request_id(None).is_sensitive());
        assert!(request_id(None).clone().is_sensitive(), "clones keep it");
    }
}
