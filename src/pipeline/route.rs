//! `route`: the phase that resolves the model a client named (a route, or a model itself)
//! against the request's snapshot of the route table (`routing::RouteTable`).

use super::RequestCtx;
use crate::error::GatewayError;
use crate::model::Ask;

/// The route phase: resolves the model the client named against the request's snapshot of
/// the route table. `header(name)` reads a request header or metadata entry (sticky keys,
/// the pin).
pub fn route<'h>(
    ctx: &mut RequestCtx,
    header: impl Fn(&http::HeaderName) -> Option<&'h [u8]>,
) -> Result<(), GatewayError> {
    let requested = ctx.requested.take().expect("the decoder names the model");
    let mut routed = ctx.live.routes.resolve(requested, header, &ctx.caller)?;
    routed.for_inference(ctx.ask == Ask::Inference);
    ctx.routed = Some(routed);
    Ok(())
}
