//! The KServe v2 protocol as both front-ends speak it: what infergate says about itself, and
//! the gRPC types generated from `proto/` by build.rs.

/// The gateway's own name (the `server` header, the admin API). Server metadata reports the
/// backends' name instead (`services::server_metadata`), as clients check for Triton's.
pub const SERVER_NAME: &str = "infergate";

/// The gateway's own version.
pub const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The `server` header on every answer of the KServe listeners (HTTP and gRPC), so whoever
/// looks can tell the gateway answered, while server metadata speaks for the backends.
pub const SERVER_HEADER: &str = concat!("infergate/", env!("CARGO_PKG_VERSION"));

/// Why shared memory is refused, on both protocols alike: the extension's endpoints, and an
/// inference whose input or output names a region.
pub const NO_SHARED_MEMORY: &str = "shared memory cannot cross a gateway: infergate and its \
    backends do not share memory; send tensors in the request (binary tensor data over HTTP, \
    raw_input_contents over gRPC)";

/// The protocol extensions that work end to end through the gateway, on HTTP and gRPC alike:
/// server metadata reports those of a backend's extensions that are in this list. Not in it:
/// shared memory (a region is local to one host), `trace` and `logging` (settings of each
/// Triton), `model_repository(unload_dependents)` (unloads go through placement).
pub const EXTENSIONS: [&str; 8] = [
    "classification",
    "sequence",
    "model_repository",
    "schedule_policy",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
];

/// The response header (HTTP) and metadata (gRPC) naming the route target that served a
/// request, `model[/version]`, when the model name the client called was a route.
pub const TARGET_HEADER: &str = "infergate-target";

pub mod encoded;

/// Triton's `inference` package: messages, the `GRPCInferenceService` server trait and client.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod inference {
    tonic::include_proto!("inference");

    /// The encoded descriptor set of `proto/`, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/inference_descriptor.bin"));
}
