//! Generates, from `proto/` at build time, the KServe v2 / Triton gRPC types, server and
//! client, and the client of the part of etcd's v3 API `[cluster]` speaks (`proto/etcd/`).
//!
//! protox parses the .proto files in pure Rust, so building needs no system `protoc`. Every
//! `bytes` field of Triton's protocol becomes `bytes::Bytes`: tensors in `raw_input_contents`
//! are then slices of the receive buffer, not copies. The encoded descriptor set of Triton's
//! protocol (only: the etcd client is no service of ours) is written next to the code for
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
    let etcd = protox::compile(
        ["etcd/kv.proto", "etcd/rpc.proto", "etcd/election.proto"],
        ["proto"],
    )?;
    tonic_prost_build::configure()
        .build_server(false)
        .emit_rerun_if_changed(false)
        .compile_fds(etcd)?;
    Ok(())
}
