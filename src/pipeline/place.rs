//! Keeping a placement lease for as long as the answer streams back.

use crate::auth::Admission;
use crate::placement::Lease;
use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use std::pin::Pin;
use std::task::{Context, Poll};

/// A response body that holds its lease until the last byte is sent (or the client goes),
/// so a model is never evicted while its answer is still streaming; and the caller's
/// admission, so the tenant's concurrency slot is busy for just as long.
pub struct LeasedBody {
    inner: Body,
    _lease: Lease,
    _admission: Admission,
}

impl LeasedBody {
    /// Ties `lease` and `admission` to the lifetime of `inner`.
    pub fn wrap(inner: Body, lease: Lease, admission: Admission) -> Body {
        Body::new(Self {
            inner,
            _lease: lease,
            _admission: admission,
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
