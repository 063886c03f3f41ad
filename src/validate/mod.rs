//! `validate`: every inference request is checked against the model's signature before it
//! is sent to a backend, so a malformed request costs Triton nothing and the client still
//! gets Triton's own words for what was wrong (HTTP 400, `{"error": "..."}`).
//!
//! The pipeline's `validate` phase (`pipeline::validate`) owns the gate: validation on or
//! off, the signature known, and the refusal counted. What it calls lives here:
//! - a reader per wire format, side by side, turns the request into a protocol-neutral
//!   `InferRequest` (input names, datatypes, shapes, and where the data is, by size) and
//!   hands back a `Verdict`: `http` for HTTP/REST's JSON and binary bodies, with the checks
//!   Triton's HTTP reader makes while reading (and `generate` for the generate endpoints),
//!   `grpc` for `ModelInferRequest`; each front-end only feeds its reader the bytes;
//! - `check` compares that request with the model's `Signature`, in Triton's order;
//! - `SignatureCache` holds signatures per (model, version), fetched from a backend that
//!   serves the model.
//!
//! Never refuse what Triton would accept: when the signature cannot be had, or the request
//! is of a kind the gateway does not read (compressed, raw binary), it is forwarded as it
//! came. Checks were measured against Triton 2.51 request by request (tests/validation.rs
//! replays them against a real server).

pub mod check;
pub mod datatype;
pub mod generate;
pub mod grpc;
pub mod http;
pub mod json;
pub mod request;
pub mod signature;
pub mod triton_order;

pub use check::check;
pub use datatype::DataType;
pub use request::{InferRequest, InputTensor, Rejection, TensorData, Verdict};
pub use signature::{InputSpec, Signature, SignatureCache};
