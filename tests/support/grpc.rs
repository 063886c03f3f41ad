//! gRPC request builders the tests share.

use infergate::protocol::inference::infer_parameter::ParameterChoice;
use infergate::protocol::inference::model_infer_request::InferInputTensor;
use infergate::protocol::inference::{InferParameter, ModelInferRequest};

/// A `ModelInfer` request for `model` with FP32 `[4]` inputs, sent as raw contents.
pub fn fp32_infer(model: &str, inputs: &[(&str, [f32; 4])]) -> ModelInferRequest {
    ModelInferRequest {
        model_name: model.into(),
        inputs: inputs
            .iter()
            .map(|(name, _)| InferInputTensor {
                name: (*name).into(),
                datatype: "FP32".into(),
                shape: vec![4],
                ..Default::default()
            })
            .collect(),
        raw_input_contents: inputs
            .iter()
            .map(|(_, values)| values.iter().flat_map(|v| v.to_le_bytes()).collect())
            .collect(),
        ..Default::default()
    }
}

/// A `slow_model` request that takes `delay_ms` on the backend.
pub fn slow(delay_ms: i64) -> ModelInferRequest {
    let mut request = fp32_infer("slow_model", &[("INPUT0", [0.0; 4])]);
    request.parameters.insert(
        "delay_ms".into(),
        InferParameter {
            parameter_choice: Some(ParameterChoice::Int64Param(delay_ms)),
        },
    );
    request
}

/// What a gRPC call made by hand came back with: `grpc-status` and `grpc-message`
/// (percent-decoded), from the trailers or a trailers-only answer's headers.
pub struct RawAnswer {
    pub status: String,
    pub message: String,
}

/// One unary gRPC call over h2c made with hyper, not a gRPC client: the only timer is the
/// `grpc-timeout` header in `headers`, so whatever enforces it is the server's.
pub async fn raw_unary(
    addr: std::net::SocketAddr,
    method: &str,
    message: &impl prost::Message,
    headers: &[(&str, &str)],
) -> RawAnswer {
    use http_body_util::BodyExt;
    let encoded = message.encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&u32::try_from(encoded.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(&encoded);
    let mut request = http::Request::post(format!(
        "http://{addr}/inference.GRPCInferenceService/{method}"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(http_body_util::Full::new(bytes::Bytes::from(frame)))
        .unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let response = client.request(request).await.expect("the gateway answers");
    let headers = response.headers().clone();
    let trailers = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .trailers()
        .cloned()
        .unwrap_or_default();
    let field = |name: &str| {
        let value = trailers.get(name).or_else(|| headers.get(name));
        percent_decode(value.map_or(&b""[..], |v| v.as_bytes()))
    };
    RawAnswer {
        status: field("grpc-status"),
        message: field("grpc-message"),
    }
}

/// `grpc-message` is percent-encoded.
fn percent_decode(value: &[u8]) -> String {
    let mut out = Vec::with_capacity(value.len());
    let mut rest = value;
    while let Some((&byte, tail)) = rest.split_first() {
        match (byte, tail) {
            (b'%', [hi, lo, tail @ ..]) => {
                let hex = std::str::from_utf8(&[*hi, *lo]).unwrap().to_owned();
                out.push(u8::from_str_radix(&hex, 16).unwrap());
                rest = tail;
            }
            _ => {
                out.push(byte);
                rest = tail;
            }
        }
    }
    String::from_utf8(out).unwrap()
}
