//! `place`: a copy of the routed target to serve the request. An inference loads the model
//! when no copy has it (`Placement::acquire_in`, on its first request); so do metadata and
//! config, which most clients ask before their first inference, unless the gateway already
//! has the model's answer from a copy it saw (`SignatureCache::described`). Readiness never
//! loads: a model the gateway would place on the next request is ready. A request of a
//! sequence goes to the copy that saw the sequence start. A target that cannot be placed has
//! failed the request, and a guard counts that against it; a guard's latency starts once the
//! target is placed. A request nothing can take right now waits for the pool (`hold`).

use super::{RequestCtx, finish};
use crate::error::GatewayError;
use crate::model::{Ask, Served};
use crate::placement::Lease;
use bytes::Bytes;
use std::time::Duration;

/// How the place phase ended.
pub enum Placing {
    /// A copy is leased (`ctx.lease`): forward to it.
    Leased,
    /// No copy is loaded, and none is needed: the gateway answers itself.
    Answered(Local),
}

/// An answer the gateway gives about a model it serves but has loaded nowhere right now,
/// where a load would only make the client wait for what is already known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Local {
    /// Readiness: the model is servable, so the next request is served (it loads it).
    Ready,
    /// Metadata or config, as a copy of the model answered them (Triton's JSON).
    Described(Bytes),
}

/// The place phase: the lease goes on the context, or the answer the gateway gives itself.
/// A request the pool cannot take right now is held for it (`hold`), readiness excepted:
/// it answers what is true now.
pub async fn place(ctx: &mut RequestCtx) -> Result<Placing, GatewayError> {
    let server = &ctx.live.config.server;
    let wait = match ctx.ask {
        Ask::Ready => Duration::ZERO,
        _ => server.ready_wait.0,
    };
    let model = &ctx.routed.as_ref().expect("placed after route").target.name;
    let holding = ctx.gateway.holding();
    let leased = holding
        .hold(model, (wait, server.max_waiting), ctx.deadline, || {
            lease(ctx)
        })
        .await;
    let placed = match leased {
        Ok(Some(lease)) => lease,
        Ok(None) => return Ok(Placing::Answered(local(ctx))),
        Err(error) => {
            // A wait for room the client's deadline ended is the client's deadline.
            let error = ctx.deadline_passed(error);
            finish::settle(ctx, error.fails_target());
            return Err(error);
        }
    };
    let routed = ctx.routed.as_mut().expect("placed after route");
    if let Some(tally) = &mut routed.tally {
        tally.placed();
    }
    ctx.serving = Some(Served {
        backend: placed.backend().name.clone(),
        ..routed.served()
    });
    ctx.lease = Some(placed);
    ctx.placed = Some(tokio::time::Instant::now());
    Ok(Placing::Leased)
}

/// A lease on a copy, loading one where the ask may; `None` when the gateway answers itself
/// (`local`).
async fn lease(ctx: &RequestCtx) -> Result<Option<Lease>, GatewayError> {
    let target = &ctx.routed.as_ref().expect("placed after route").target;
    let placement = ctx.gateway.placement();
    if ctx.ask != Ask::Inference {
        if let Some(lease) = placement.lease_loaded(target, ctx.ask)? {
            return Ok(Some(lease));
        }
        if !ctx.ask.loads() || described(ctx).is_some() {
            return Ok(None);
        }
    }
    placement
        .acquire_in(target, ctx.sequence.as_ref(), ctx.deadline)
        .await
        .map(Some)
}

/// What a copy answered for the target's metadata or config, if the gateway has it.
fn described(ctx: &RequestCtx) -> Option<Bytes> {
    let target = &ctx.routed.as_ref()?.target;
    let description = ctx.gateway.signatures().described(target)?;
    match ctx.ask {
        Ask::Metadata => Some(description.metadata.clone()),
        Ask::Config => Some(description.config.clone()),
        _ => None,
    }
}

/// The gateway's own answer for a servable model loaded nowhere (`lease` returned `None`).
fn local(ctx: &RequestCtx) -> Local {
    match described(ctx) {
        Some(json) => Local::Described(json),
        None => Local::Ready,
    }
}

/// Places the request again after the backend of its copy said it has no such model, or
/// refused the connection (`forward`): that copy comes off the books first, so another is
/// found or loaded. A later request of a sequence that ran there is refused then
/// (`SequenceLost`): its state went with the copy.
pub async fn again(ctx: &mut RequestCtx) -> Result<Placing, GatewayError> {
    if let Some(gone) = ctx.lease.take() {
        ctx.gateway.placement().copy_gone(&gone);
    }
    place(ctx).await
}
