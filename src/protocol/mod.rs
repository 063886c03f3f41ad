//! The KServe v2 protocol as both front-ends speak it: what infergate says about itself, and
//! the gRPC types generated from `proto/` by build.rs.

/// The name infergate gives in server metadata (`GET /v2`, `ServerMetadata`).
pub const SERVER_NAME: &str = "infergate";

/// The version infergate gives in server metadata.
pub const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The protocol extensions the gateway itself supports end to end, on HTTP and gRPC alike.
pub const EXTENSIONS: [&str; 6] = [
    "binary_tensor_data",
    "classification",
    "model_repository",
    "model_configuration",
    "parameters",
    "statistics",
];

/// The response header (HTTP) and metadata (gRPC) naming the route target that served a
/// request, `model[/version]`, when the model name the client called was a route.
pub const TARGET_HEADER: &str = "infergate-target";

/// Triton's `inference` package: messages, the `GRPCInferenceService` server trait and client.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod inference {
    tonic::include_proto!("inference");

    /// The encoded descriptor set of `proto/`, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/inference_descriptor.bin"));
}
