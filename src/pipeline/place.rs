//! `place`: which backend serves this request. For now a model is served where a backend
//! reports it READY; the lease keeps the copy counted as in use until the answer has been
//! streamed back, which is what eviction will respect.

use super::ModelRef;
use crate::error::GatewayError;
use crate::upstream::{Backend, InFlight, Pool};
use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// A claim on one backend's copy of a model for the length of a request.
#[derive(Debug)]
pub struct Lease {
    in_flight: InFlight,
}

impl Lease {
    /// The backend to send to.
    pub fn backend(&self) -> &Arc<Backend> {
        self.in_flight.backend()
    }
}

/// Chooses the ready backend with the model READY that has the fewest requests in flight.
/// Fails with the answer Triton itself would give: unknown model, model not ready, or no
/// backend at all.
pub fn place(pool: &Pool, model: &ModelRef) -> Result<Lease, GatewayError> {
    let version = model.version.as_deref();
    let mut any_ready = false;
    let mut known = false;
    let mut best: Option<&Arc<Backend>> = None;
    for backend in pool.ready() {
        any_ready = true;
        let index = backend.index();
        if index.is_ready(&model.name, version) {
            if best.is_none_or(|b| backend.in_flight() < b.in_flight()) {
                best = Some(backend);
            }
        } else {
            known |= index.knows(&model.name);
        }
    }
    match best {
        Some(backend) => Ok(Lease {
            in_flight: backend.start_request(),
        }),
        None if !any_ready => Err(GatewayError::NoBackendReady),
        None if known => Err(GatewayError::ModelNotReady {
            model: model.name.clone(),
            version: model.version.clone(),
        }),
        None => Err(GatewayError::UnknownModel {
            model: model.name.clone(),
        }),
    }
}

/// A response body that holds its lease until the last byte is sent (or the client goes).
pub struct LeasedBody {
    inner: Body,
    _lease: Lease,
}

impl LeasedBody {
    /// Ties `lease` to the lifetime of `inner`.
    pub fn wrap(inner: Body, lease: Lease) -> Body {
        Body::new(Self {
            inner,
            _lease: lease,
        })
    }
}

impl HttpBody for LeasedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
