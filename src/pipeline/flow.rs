//! `flow`: fair under overload. `priority` gives a model request its band: its tenant's
//! default, or what it asks for with `x-infergate-priority`, capped at its tenant's highest
//! (counted, not refused); a value that is no band is refused (400 / INVALID_ARGUMENT).
//! `enter` then takes a slot on the model's copies once an inference has arrived whole
//! (`Wire::arrive`: a client slow to send its body holds none), before it is placed: at
//! once below saturation, else (`wait`) in turn from the model's waiting room, or refused
//! with 503 / UNAVAILABLE and `Retry-After` (`crate::flow`). The slot stays on the context until
//! the answer has gone, and its drop lets the next waiting request in. A model's slots
//! follow its config and its Tritons' queues (`slots`), and its config is read again when
//! it is learned (`learned`).

use super::RequestCtx;
use crate::error::GatewayError;
use crate::flow::gate::lane_labels;
use crate::flow::queue::Bounds;
use crate::flow::{Band, Entry, Gate, Shed, copy_slots, default_per_copy};
use crate::telemetry;
use std::sync::Arc;
use tokio::time::Instant;

/// The priority phase, after admission: the request's band from its tenant's policy and
/// what it asked (`asked`: the header's or metadata's value, if any).
pub fn priority(ctx: &mut RequestCtx, asked: Option<&[u8]>) -> Result<(), GatewayError> {
    let policy = ctx.admission.flow;
    let Some(value) = asked else {
        ctx.band = policy.priority;
        return Ok(());
    };
    let band = Band::parse(value).ok_or_else(|| unknown_band(value))?;
    ctx.band = band.capped(policy.max_priority);
    if ctx.band != band {
        let tenant = metrics::SharedString::from(tenant_of(ctx));
        metrics::counter!(telemetry::FLOW_PRIORITY_CAPPED, "tenant" => tenant).increment(1);
    }
    Ok(())
}

/// A priority that names no band: the answer names the ones there are.
fn unknown_band(value: &[u8]) -> GatewayError {
    let shown: String = String::from_utf8_lossy(value).chars().take(32).collect();
    GatewayError::BadRequest(format!(
        "{} must be one of critical, standard, sheddable; got {shown:?}",
        crate::flow::PRIORITY_HEADER
    ))
}

/// Where a request that found its model's slots all taken waits (`wait`): the model's
/// gate, and the request's entry, the slots and the bounds read at that full moment.
pub struct Waiting {
    gate: Arc<Gate>,
    entry: Entry,
    slots: usize,
    bounds: Bounds,
}

/// The flow phase's first step, for an inference, with no await (so that what `bytes`
/// borrows need not be shared between threads): a slot on the routed model's copies at
/// once, kept on the context (`None`: done; also for a model no backend knows, which
/// placement refuses); or, when they are all taken, where to `wait`. `bytes`, the request
/// body's size, is read only then.
///
/// A request of a sequence takes no slot: Triton's sequence batcher keeps a sequence's
/// requests in its backlog until the sequence gets a batch slot, so slots held by waiting
/// sequences would keep the running sequence's next request out, and every sequence would
/// stand still until its idle timeout. Triton's own sequence slots bound them instead.
pub fn enter(ctx: &mut RequestCtx, bytes: impl FnOnce() -> usize) -> Option<Waiting> {
    if ctx.sequence.is_some() {
        return None;
    }
    let model = &ctx.routed.as_ref().expect("flow after route").target.name;
    let known = || {
        let backends = ctx.gateway.pool().backends();
        backends.iter().any(|b| b.knows(model))
    };
    let gate = ctx
        .gateway
        .flow()
        .gate(model, || slots(ctx, model), known)?;
    if let Some(permit) = gate.try_enter() {
        ctx.permit = Some(permit);
        return None;
    }
    let server = &ctx.live.config.server;
    let flow = ctx.admission.flow;
    let bounds = Bounds {
        per_tenant: flow.max_queued.unwrap_or(server.max_queued),
        total: server.max_queued,
        bytes: usize::try_from(server.max_queued_bytes.bytes()).unwrap_or(usize::MAX),
    };
    let until = Instant::now() + server.queue_timeout.0;
    let entry = Entry {
        band: ctx.band,
        tenant: tenant_of(ctx),
        flow,
        until: ctx.deadline.map_or(until, |d| d.min(until)),
        bytes: bytes(),
    };
    let slots = slots(ctx, model);
    Some(Waiting {
        gate,
        entry,
        slots,
        bounds,
    })
}

/// The flow phase's second step: a slot in turn from the model's waiting room, kept on the
/// context; or the refusal, counted.
pub async fn wait(ctx: &mut RequestCtx, waiting: Waiting) -> Result<(), GatewayError> {
    let Waiting {
        gate,
        entry,
        slots,
        bounds,
    } = waiting;
    match gate.wait(&entry, (slots, bounds)).await {
        Ok(permit) => {
            ctx.permit = Some(permit);
            Ok(())
        }
        Err(refusal) => Err(shed(ctx, refusal)),
    }
}

/// The model's config was just learned (its signature fetched for validation): its gate, if
/// it has one, takes the slots that gives at once, not at its next full moment.
pub(super) fn learned(ctx: &RequestCtx, model: &str) {
    if let Some(gate) = ctx.gateway.flow().existing(model) {
        gate.relimit(slots(ctx, model));
    }
}

/// The slots of `model`'s copies now: each copy's `max_in_flight` (`[[models]]`'s, else
/// twice the capacity its config gives, else `DEFAULT_MAX_IN_FLIGHT` while that is not
/// known or the model is decoupled: `default_per_copy`), less what its Triton has waiting
/// that this gateway did not send (`copy_slots`). Read when the
/// model's gate is made, at its full moments, and when its config is learned.
fn slots(ctx: &RequestCtx, model: &str) -> usize {
    let configured =
        (ctx.live.config.models.iter().find(|m| m.name == model)).and_then(|m| m.max_in_flight);
    let capacity = ctx.gateway.signatures().capacity(model);
    let per_copy = configured.unwrap_or_else(|| default_per_copy(capacity));
    let placement = ctx.gateway.placement();
    placement.flow_slots(model, |in_flight, pending| {
        copy_slots(per_copy, capacity, in_flight, pending)
    })
}

/// A refused request's error, counted (its access-log line at the edge logs it, with the
/// request id); one whose client's own deadline passed while it waited is that deadline's error.
fn shed(ctx: &RequestCtx, refusal: crate::flow::gate::Refusal) -> GatewayError {
    if refusal.shed == Shed::Deadline
        && let Some(deadline) = ctx.deadline
        && Instant::now() >= deadline
    {
        return ctx.deadline_exceeded(deadline);
    }
    let model: Arc<str> = Arc::from(ctx.model().map_or("", |m| m.name.as_str()));
    let (band, reason) = (ctx.band, refusal.shed.as_str());
    let mut labels = lane_labels(&model, &tenant_of(ctx), band).to_vec();
    labels.push(metrics::Label::new("reason", reason));
    metrics::counter!(telemetry::FLOW_SHED, labels).increment(1);
    GatewayError::Shed {
        model: model.to_string(),
        band: band.as_str(),
        reason,
        retry_after: refusal.retry_after,
    }
}

/// The request's tenant, "" for anonymous traffic (one queue for all of it).
fn tenant_of(ctx: &RequestCtx) -> Arc<str> {
    static ANONYMOUS: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from(""));
    ctx.tenant().unwrap_or(&ANONYMOUS).clone()
}
