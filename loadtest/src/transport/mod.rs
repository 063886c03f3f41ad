//! Transports: how one inference request reaches the server.
//!
//! The runner only knows the [`Transport`] trait, so the load shapes (closed
//! loop, open loop), the statistics and the report are shared by every wire
//! protocol. HTTP/REST is implemented in [`http`], KServe v2 gRPC in [`grpc`]
//! (built from the same generated tensors), selected by `--protocol grpc`.

use std::future::Future;

use crate::outcome::ErrorKind;
use crate::sequence::SequenceRequest;

pub mod grpc;
pub mod http;

/// Sends inference requests and reports how each one ended.
///
/// Implementations pre-build everything they can (bodies, headers, the
/// target address) so that `infer` does as little work as possible: its cost
/// is part of every latency the tool measures.
pub trait Transport: Send + Sync + 'static {
    /// Sends request number `seq` (implementations rotate through their
    /// pre-built request variants with it) and waits until the whole
    /// response has been received. Timeouts are applied by the caller.
    fn infer(&self, seq: u64) -> impl Future<Output = Result<(), ErrorKind>> + Send;

    /// Sends one request of a sequence (sequence mode, `crate::sequence`), encoded now with
    /// its id and flags, and with `--check` requires the answer to carry the sequence's
    /// running sum.
    fn infer_sequence(
        &self,
        request: &SequenceRequest,
    ) -> impl Future<Output = Result<(), ErrorKind>> + Send;
}

/// The wire protocol selected with `--protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// KServe v2 over HTTP/REST (HTTP/1.1, or h2c with `--http2`).
    Http,
    /// KServe v2 over gRPC (`ModelInfer`, raw tensor contents).
    Grpc,
}

impl Protocol {
    /// The protocol's name as printed in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Grpc => "grpc",
        }
    }
}
