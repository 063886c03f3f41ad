//! Request bodies with a size limit that is enforced while they stream.
//!
//! A `Content-Length` over the limit is refused before anything is read; a chunked body is
//! cut off the moment it passes the limit, and the error carries the limit so the client is
//! told exactly what it was.

use axum::body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};

/// The error a limited body yields once it has passed its limit.
#[derive(Debug, thiserror::Error)]
#[error("request body is larger than the limit of {limit} bytes")]
pub struct BodyTooLarge {
    /// The configured limit in bytes.
    pub limit: u64,
}

/// Wraps a body so that reading past `limit` bytes fails with `BodyTooLarge`.
pub fn limited(body: Body, limit: u64) -> Body {
    let limit_usize = usize::try_from(limit).unwrap_or(usize::MAX);
    Body::new(Limited::new(body, limit_usize).map_err(move |error| {
        if error.is::<LengthLimitError>() {
            Box::new(BodyTooLarge { limit }) as axum::BoxError
        } else {
            error
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[tokio::test]
    async fn cuts_off_past_the_limit() {
        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from_static(b"0123")),
            Ok(Bytes::from_static(b"4567")),
        ];
        let body = Body::from_stream(futures_util::stream::iter(chunks));
        let error = limited(body, 6).collect().await.unwrap_err();
        let too_large = std::error::Error::source(&error)
            .and_then(|e| e.downcast_ref::<BodyTooLarge>())
            .expect("BodyTooLarge in the chain");
        assert_eq!(too_large.limit, 6);

        let fits = limited(Body::from("0123"), 6).collect().await.unwrap();
        assert_eq!(fits.to_bytes(), "0123");
    }
}
