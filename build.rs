//! Generates the KServe v2 / Triton gRPC types, server and client from `proto/` at build time.
//!
//! protox parses the .proto files in pure Rust, so building needs no system `protoc`. Every
//! `bytes` field becomes `bytes::Bytes`: tensors in `raw_input_contents` are then slices of the
//! receive buffer, not copies. The encoded descriptor set is written next to the code for
//! server reflection.

use prost::Message;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile(["grpc_service.proto"], ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("inference_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;
    tonic_prost_build::configure()
        .bytes(".inference")
        .emit_rerun_if_changed(false)
        .compile_fds(descriptors)?;
    Ok(())
}
