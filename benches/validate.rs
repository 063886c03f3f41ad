//! What validation costs per inference request: reading the body into the neutral request
//! (`validate::http::parse`) and checking it against the signature (`validate::check`), on
//! the bodies the loadtest uses (JSON and binary, 1 KB, 1 MB, 16 MB) and on BYTES, whose
//! length prefixes are walked one by one. The throughput figure is body bytes per second:
//! the gateway's added cost for an inference request of that size.
//!
//! - `json/*`: an FP32 input as a JSON `data` array (read once, counted and classified,
//!   never built);
//! - `binary/*`: the same tensor in the binary extension (checked by size: the cost should
//!   not grow with the body);
//! - `bytes/*`: a BYTES tensor of 16-byte strings in the binary extension;
//! - `add_sub/*`: the small request most clients send, two FP32 inputs of four elements in
//!   JSON, compact (`infergate-load --json`) and as `json.dumps` writes it (tritonclient):
//!   there the fixed cost per request, not the per-byte one, is what shows.
//!
//! Run: `cargo bench --bench validate`.

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use infergate::internals::{BodyView, DataType, InputSpec, Parsed, Signature, check, parse};
use std::hint::black_box;

const SIZES: [(&str, usize); 3] = [("1KB", 1 << 10), ("1MB", 1 << 20), ("16MB", 16 << 20)];

fn signature(datatype: DataType) -> Signature {
    signature_of(&["INPUT0"], datatype, vec![-1])
}

fn signature_of(inputs: &[&str], datatype: DataType, dims: Vec<i64>) -> Signature {
    Signature {
        name: "bench".into(),
        platform: "python".into(),
        max_batch_size: 8,
        instances: 1,
        decoupled: false,
        inputs: inputs
            .iter()
            .map(|name| InputSpec {
                name: (*name).into(),
                datatype,
                dims: dims.clone(),
                optional: false,
                allow_ragged_batch: false,
                is_shape_tensor: false,
            })
            .collect(),
        outputs: vec!["OUTPUT0".into()],
    }
}

/// add_sub's request, compact and as `json.dumps` writes it.
const ADD_SUB: [(&str, &str); 2] = [
    (
        "compact",
        r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[4],"data":[1.0,2.0,3.0,4.5]},{"name":"INPUT1","datatype":"FP32","shape":[4],"data":[0.5,0.25,0.0,1.0]}]}"#,
    ),
    (
        "json.dumps",
        r#"{"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.5]}, {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [0.5, 0.25, 0.0, 1.0]}], "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1"}]}"#,
    ),
];

/// A JSON request of about `size` bytes: FP32 values written as `0.123456,`.
fn json_body(size: usize) -> Bytes {
    let elements = (size / 9).max(1);
    let mut body = format!(
        r#"{{"id":"bench","inputs":[{{"name":"INPUT0","datatype":"FP32","shape":[1,{elements}],"data":["#
    );
    for i in 0..elements {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&format!("0.{:06}", i % 1_000_000));
    }
    body.push_str("]}]}");
    Bytes::from(body)
}

/// A binary-extension request with a `size`-byte FP32 tensor; returns the body and the
/// JSON header's length.
fn binary_body(size: usize, datatype: &str, shape: usize, tensor: Vec<u8>) -> (Bytes, String) {
    let header = format!(
        r#"{{"inputs":[{{"name":"INPUT0","datatype":"{datatype}","shape":[1,{shape}],"parameters":{{"binary_data_size":{}}}}}],"outputs":[{{"name":"OUTPUT0","parameters":{{"binary_data":true}}}}]}}"#,
        tensor.len()
    );
    let mut body = Vec::with_capacity(header.len() + size);
    body.extend_from_slice(header.as_bytes());
    body.extend_from_slice(&tensor);
    (Bytes::from(body), header.len().to_string())
}

fn validate(body: &Bytes, header_length: Option<&str>, signature: &Signature) {
    match parse(
        BodyView::whole(body),
        header_length.map(str::as_bytes),
        None,
        "bench",
    ) {
        Ok(Parsed::Request(request)) => {
            check(&request, signature).expect("a valid request");
            black_box(request);
        }
        other => panic!("not read: {other:?}"),
    }
}

fn bench(c: &mut Criterion) {
    let fp32 = signature(DataType::Fp32);
    let strings = signature(DataType::Bytes);
    let mut group = c.benchmark_group("validate");
    for (label, size) in SIZES {
        group.throughput(Throughput::Bytes(size as u64));
        group.sample_size(if size > 1 << 20 { 10 } else { 50 });

        let body = json_body(size);
        group.bench_with_input(BenchmarkId::new("json", label), &body, |b, body| {
            b.iter(|| validate(body, None, &fp32))
        });

        let (body, length) = binary_body(size, "FP32", size / 4, vec![0u8; size / 4 * 4]);
        group.bench_with_input(BenchmarkId::new("binary", label), &body, |b, body| {
            b.iter(|| validate(body, Some(&length), &fp32))
        });

        let count = (size / 20).max(1);
        let mut tensor = Vec::with_capacity(count * 20);
        for _ in 0..count {
            tensor.extend_from_slice(&16u32.to_le_bytes());
            tensor.extend_from_slice(&[b'x'; 16]);
        }
        let (body, length) = binary_body(size, "BYTES", count, tensor);
        group.bench_with_input(BenchmarkId::new("bytes", label), &body, |b, body| {
            b.iter(|| validate(body, Some(&length), &strings))
        });
    }
    group.finish();

    let mut add_sub = signature_of(&["INPUT0", "INPUT1"], DataType::Fp32, vec![4]);
    add_sub.max_batch_size = 0;
    add_sub.outputs.push("OUTPUT1".into());
    let mut group = c.benchmark_group("add_sub");
    for (label, body) in ADD_SUB {
        let body = Bytes::from_static(body.as_bytes());
        group.bench_with_input(BenchmarkId::new("json", label), &body, |b, body| {
            b.iter(|| validate(body, None, &add_sub))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
