//! The pipeline: the walk every request about a model takes, whatever its wire format, as
//! named phases over one per-request context (`RequestCtx`):
//!
//! ```text
//! edge ─▶ admit ─▶ route ─▶ flow ─▶ place ─▶ validate ─▶ forward ─▶ finish
//!         (auth,    (route    (a slot   (a copy,  (the input   (to the    (guard, metrics,
//!         limits,   → target) on the    loaded    against the  copy, once  span, access log)
//!         band)               copies,   on demand) signature)  more if gone)
//!                             in turn)
//! ```
//!
//! Each phase is a plain function over `&mut RequestCtx`; `serve` runs them in order. A
//! front-end decodes its wire format into the context and implements `Wire`, the small
//! trait for the phases that touch bytes (having the request whole, the validation reader,
//! mirroring, sending); no rule lives in a front-end that the other would have to repeat.
//! Streams run the same phases per message.

pub mod admit;
mod ctx;
pub mod edge;
pub mod finish;
pub mod flow;
pub mod forward;
pub mod mirror;
mod place;
mod route;
pub mod sequence;
pub mod tokens;
mod validate;

pub use ctx::{RequestCtx, request_id};
pub(crate) use forward::{Inspect, Sent, Wire};
pub use place::{Local, Placing, place};
pub use route::route;
use validate::validate;

use crate::model::Ask;
use crate::routing::Routed;
use crate::upstream::Backend;
use std::sync::Arc;

use crate::error::GatewayError;

/// Every request about one model, in order: admit it for the model it names, route it,
/// read what placement needs, place it, validate an inference and copy it to the route's
/// mirrors, forward it; then the guard counts the answer (a token stream's at its first
/// token, when the guard times those: `tokens::clock`). Statistics are read from every
/// copy instead (`services::statistics`).
pub(crate) async fn serve<W: Wire>(
    ctx: &mut RequestCtx,
    wire: &mut W,
) -> Result<W::Answer, GatewayError> {
    admit::model(ctx)?;
    flow::priority(ctx, wire.header(&crate::flow::PRIORITY_HEADER))?;
    route(ctx, |name| wire.header(name))?;
    wire.retarget(ctx.routed.as_ref().expect("routed"));
    let answer = placed(ctx, wire).await;
    let (failed, streams) = match &answer {
        Ok(answer) => (W::failed(answer), wire.streams(answer)),
        Err(error) => (error.fails_target(), false),
    };
    finish::settle_answer(ctx, failed, streams);
    answer
}

/// The phases from reading the request to the backend's answer.
async fn placed<W: Wire>(ctx: &mut RequestCtx, wire: &mut W) -> Result<W::Answer, GatewayError> {
    ctx.sequence = wire.arrive(ctx).await?;
    if ctx.ask == Ask::Inference
        && let Some(waiting) = flow::enter(ctx, || wire.body_len())
        && let Err(error) = flow::wait(ctx, waiting).await
    {
        return wire.unplaced(error);
    }
    match place(ctx).await {
        Ok(Placing::Leased) => {}
        Ok(Placing::Answered(local)) => return wire.local(local),
        Err(error) => return wire.unplaced(error),
    }
    if ctx.ask == Ask::Inference {
        let backend = ctx.lease()?.backend().clone();
        inspect(ctx, wire, &backend).await?;
    }
    forward::forward(ctx, wire).await
}

/// An inference on the copy it was placed on (on `backend`), for a call and for each message
/// of a stream alike: validated against the copy's signature, then copied to its route's
/// mirrors.
pub(crate) async fn inspect<I: Inspect>(
    ctx: &mut RequestCtx,
    request: &mut I,
    backend: &Arc<Backend>,
) -> Result<(), GatewayError> {
    {
        let ctx: &RequestCtx = ctx;
        let model = &ctx.routed.as_ref().expect("routed").target;
        let on = forward::Placed { backend, model };
        validate(ctx, on, async |signature| {
            request.read(ctx, model, signature).await
        })
        .await?;
    }
    if let Some(shadow) = ctx.routed.as_mut().and_then(Routed::shadow) {
        request.mirror(ctx, shadow).await?;
    }
    Ok(())
}
