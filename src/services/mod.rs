//! The questions about the pool as a whole that are not the inference walk: its model
//! repository (the merged index, what a load asks for), the statistics of its models summed
//! over their copies, and what the server says about itself.
//!
//! Each answers both front-ends with protocol-neutral Rust values (rows, typed statistics,
//! the server's identity) or a `GatewayError` (a backend's own refusal included, as
//! `GatewayError::BackendRefused`); the HTTP front-end writes them as JSON, the gRPC one as
//! protobuf, neither through the other's format. A model's statistics are admitted and
//! routed by the pipeline's own phases first (`statistics::of_routed`), so the rules of who
//! may ask about a model and which model a route means are written once.

pub mod repository;
pub mod server_metadata;
pub mod statistics;
