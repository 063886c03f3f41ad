//! `validate`: an inference request is checked against the signature of the model on the
//! copy it was placed on, before anything is sent to a backend. The phase owns the gate,
//! once for every wire format: validation on or off (`validation.enabled`), the signature
//! known (when it cannot be had, the request passes through untouched), then the wire's
//! reader (`crate::validate::{http, generate, grpc}`) reads the request and checks it, and
//! a refusal is counted here, in one place.

use super::RequestCtx;
use super::forward::Placed;
use crate::error::GatewayError;
use crate::model::ModelRef;
use crate::validate::{Rejection, Signature, Verdict};

/// The validate phase. `read` is the wire's reader: it reads the request (for HTTP, the body,
/// which it hands back to the wire to forward) and checks it against the signature; a
/// failure to read the bytes at all (a body over the limit) is its error, not a verdict.
/// Unary calls and each message of a stream go through here alike.
pub(crate) async fn validate(
    ctx: &RequestCtx,
    on: Placed<'_>,
    read: impl AsyncFnOnce(&Signature) -> Result<Verdict, GatewayError>,
) -> Result<(), GatewayError> {
    let gateway = &ctx.gateway;
    if !gateway.fixed_config().validation.enabled {
        return Ok(());
    }
    let signatures = gateway.signatures();
    let signature = match signatures.hit(on.model) {
        Some(signature) => signature,
        None => {
            let Some(signature) = signatures.get(on.backend, on.model).await else {
                return Ok(());
            };
            // The model's config is known now: its flow gate's slots follow it.
            super::flow::learned(ctx, &on.model.name);
            signature
        }
    };
    match read(&signature).await? {
        Verdict::Passed => Ok(()),
        Verdict::Unvalidated(why) => {
            tracing::debug!(model = %on.model.name, why, "inference request forwarded unvalidated");
            Ok(())
        }
        Verdict::Refused(rejection) => Err(refuse(rejection, on.model)),
    }
}

/// The answer to a request the checks refused, counted in
/// `infergate_validation_rejections_total`. It is logged once, at the edge (`finish`), with
/// the request id and never the payload, as every failure is.
fn refuse(rejection: Rejection, model: &ModelRef) -> GatewayError {
    let reason = rejection.reason.as_str();
    metrics::counter!(crate::telemetry::VALIDATION_REJECTIONS,
        "model" => model.name.clone(),
        "reason" => reason)
    .increment(1);
    GatewayError::InvalidInput {
        reason,
        message: rejection.message,
    }
}
