//! A future boxed where it is built. `Box::pin(f)` takes `f` already built and copies all
//! of it into its allocation: for the pipeline's and the upstream's state machines that is
//! kilobytes per request, nearly all of it state not yet in use (`loadtest/instructions.sh`
//! counted the copies). A leaf: anything that boxes a large future may use it.

use std::future::Future;
use std::pin::Pin;

/// `Box::pin(make())`, with the box allocated first and `make()` written into it once, so
/// the compiler builds the future in the allocation instead of copying it there.
pub(crate) fn in_place<F: Future>(make: impl FnOnce() -> F) -> Pin<Box<F>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The boxed future is the one made: it runs once polled, to the value it was made for.
    #[tokio::test]
    async fn the_future_made_is_the_one_that_runs() {
        let mut ran = false;
        let value = in_place(|| async {
            ran = true;
            7
        })
        .await;
        assert_eq!((value, ran), (7, true));
    }
}
