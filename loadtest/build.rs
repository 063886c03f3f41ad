//! Compiles the KServe v2 / Triton gRPC messages from the repository's `proto/` (the same
//! files the gateway serves) for the gRPC transport: client side only, in pure Rust (protox),
//! so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../proto");
    let descriptors = protox::compile(["grpc_service.proto"], ["../proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .bytes(".inference")
        .emit_rerun_if_changed(false)
        .compile_fds(descriptors)?;
    Ok(())
}
