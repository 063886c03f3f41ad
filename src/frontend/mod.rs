//! Wire formats: each front-end decodes its protocol into pipeline calls and encodes the
//! answer back. No rule lives here that another front-end would have to repeat.

pub mod admin;
mod edge;
pub mod grpc;
pub mod http;
pub mod metrics;
mod series;

pub(crate) use edge::{
    InFlightGauge, SERVER_HEADER_VALUE, X_REQUEST_ID, grpc_status_class, record, request_id,
};
pub use edge::{RequestId, Served, Tenant};
pub use series::Protocol;
