//! How a failed exchange with a backend is put into words, once for every way of reaching
//! one: the pooled HTTP client, the driven HTTP/1.1 connections and the gRPC connections.

use crate::error::GatewayError;
use std::error::Error;
use std::io::ErrorKind;
use std::time::Duration;

/// No answer from `backend` within `after` (`upstream.request_timeout`, or a control call's
/// own time), whichever way it was reached.
pub(super) fn no_answer_within(backend: &str, after: Duration) -> GatewayError {
    GatewayError::UpstreamTimeout {
        backend: backend.to_string(),
        after,
    }
}

/// A connection attempt that ran out of `upstream.connect_timeout`. The connector's own
/// words ("deadline has elapsed") name neither the timeout nor the setting.
pub(super) fn no_connection_within(connect_timeout: Duration) -> String {
    format!(
        "no connection within upstream.connect_timeout ({}ms)",
        connect_timeout.as_millis()
    )
}

/// The innermost cause's words ("Connection refused (os error 111)"), which say the most.
pub(super) fn innermost(error: &(dyn Error + 'static)) -> String {
    chain(error).last().unwrap_or(error).to_string()
}

/// Whether anything in the chain is an I/O timeout.
pub(super) fn timed_out(error: &(dyn Error + 'static)) -> bool {
    io_error_of(error, &[ErrorKind::TimedOut])
}

/// What a failed connection attempt says: the timeout when it ran out, else its cause.
pub(super) fn connect_reason(error: &(dyn Error + 'static), connect_timeout: Duration) -> String {
    if timed_out(error) {
        no_connection_within(connect_timeout)
    } else {
        innermost(error)
    }
}

/// Whether a connection attempt was turned away by the backend's host: refused (nothing
/// listens on the port) or reset as it was made (a listener going away, or one that cannot
/// take it, as a Triton stopped with a full accept queue). Either way the request never
/// reached the backend. (Asked only of a failed attempt to connect.)
pub(super) fn refused(error: &(dyn Error + 'static)) -> bool {
    io_error_of(
        error,
        &[ErrorKind::ConnectionRefused, ErrorKind::ConnectionReset],
    )
}

/// Whether the connection was reset or broken under an exchange: the peer closed it with
/// our request unread (a close with data pending is a reset), as a server dropping a
/// keep-alive connection does when the request arrives as it closes.
pub(super) fn reset(error: &(dyn Error + 'static)) -> bool {
    io_error_of(error, &[ErrorKind::ConnectionReset, ErrorKind::BrokenPipe])
}

/// Whether an I/O error of one of these kinds is anywhere in the chain: the one walk the
/// three questions above ask.
fn io_error_of(error: &(dyn Error + 'static), kinds: &[ErrorKind]) -> bool {
    chain(error).any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| kinds.contains(&e.kind()))
    })
}

/// The error and its sources, outermost first.
pub(super) fn chain<'e>(
    error: &'e (dyn Error + 'static),
) -> impl Iterator<Item = &'e (dyn Error + 'static)> {
    std::iter::successors(Some(error), |&e| e.source())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(std::io::Error);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("tcp connect error")
        }
    }
    impl Error for Outer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_timeout_names_the_setting_and_anything_else_its_cause_and_a_refusal_is_told() {
        let timeout = Duration::from_millis(300);
        let refused = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "Connection refused",
        ));
        assert_eq!(connect_reason(&refused, timeout), "Connection refused");
        assert!(super::refused(&refused));
        let slow = Outer(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "deadline has elapsed",
        ));
        assert_eq!(
            connect_reason(&slow, timeout),
            "no connection within upstream.connect_timeout (300ms)"
        );
        assert!(!super::refused(&slow), "a timeout is not a refusal");
        let reset = Outer(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "Connection reset by peer",
        ));
        assert!(super::refused(&reset), "a connection reset as it was made");
        assert!(super::reset(&reset), "and one reset under an exchange");
        let broken = Outer(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "Broken pipe",
        ));
        assert!(super::reset(&broken) && !super::refused(&broken));
        assert!(!super::reset(&refused) && !super::reset(&slow));
    }
}
