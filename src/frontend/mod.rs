//! Wire formats: each front-end decodes its protocol into pipeline calls and encodes the
//! answer back. No rule lives here that another front-end would have to repeat.

pub mod admin;
mod edge;
pub mod http;
pub mod metrics;

pub use edge::{RequestId, Served};
