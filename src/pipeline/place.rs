//! `place`: a copy of the routed target to serve the request. Only an inference may load
//! the model (`Placement::acquire_in`, on its first request); any other ask leases a copy
//! loaded now (`Placement::lease_loaded`). A request of a sequence goes to the copy that saw
//! the sequence start. A target that cannot be placed has failed the request, and a guard
//! counts that against it; a guard's latency starts once the target is placed.

use super::{RequestCtx, finish};
use crate::error::GatewayError;

/// The place phase: the lease goes on the context.
pub async fn place(ctx: &mut RequestCtx) -> Result<(), GatewayError> {
    let routed = ctx.routed.as_mut().expect("placed after route");
    let placement = ctx.gateway.placement();
    let placed = if ctx.ask.loads() {
        placement
            .acquire_in(&routed.target, ctx.sequence.as_ref(), ctx.deadline)
            .await
    } else {
        placement.lease_loaded(&routed.target, ctx.ask)
    };
    match placed {
        Ok(lease) => {
            if let Some(tally) = &mut routed.tally {
                tally.placed();
            }
            ctx.lease = Some(lease);
            Ok(())
        }
        Err(error) => {
            // A wait for room the client's deadline ended is the client's deadline.
            let error = ctx.deadline_passed(error);
            finish::settle(ctx, error.fails_target());
            Err(error)
        }
    }
}

/// Places the request again after the backend of its copy said it has no such model
/// (`forward`): that copy comes off the books first, so another is found or loaded. A later
/// request of a sequence that ran there is refused then (`SequenceLost`): its state went
/// with the copy.
pub async fn again(ctx: &mut RequestCtx) -> Result<(), GatewayError> {
    if let Some(gone) = ctx.lease.take() {
        ctx.gateway.placement().copy_gone(&gone);
    }
    place(ctx).await
}
