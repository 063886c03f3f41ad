//! One client for either wire the gateway speaks, for tests of a rule that must hold the same
//! over HTTP and gRPC (calls and streams): the test is written once and run over each, so
//! they cannot drift.

use super::gateway::TestGateway;
use infergate::protocol::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use infergate::protocol::inference::{
    ModelInferRequest, ModelInferResponse, ModelStreamInferResponse,
};
use std::time::Duration;
use tonic::transport::Channel;

/// The wire a client speaks to the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    Http,
    Grpc,
    /// gRPC's `ModelStreamInfer`: every request a message on one stream.
    GrpcStream,
}

impl Wire {
    /// `http` or `grpc`, for names in configs (gateways, routes) that must not clash.
    pub fn name(self) -> &'static str {
        match self {
            Wire::Http => "http",
            Wire::Grpc => "grpc",
            Wire::GrpcStream => "grpc_stream",
        }
    }
}

/// A connected client of one wire.
pub enum WireClient {
    Http(reqwest::Client, String),
    Grpc(GrpcInferenceServiceClient<Channel>),
    /// An open stream: where its requests go, and its answers.
    GrpcStream(
        tokio::sync::mpsc::Sender<ModelInferRequest>,
        tonic::Streaming<ModelStreamInferResponse>,
    ),
}

impl WireClient {
    /// A client of `wire` for `gateway`.
    pub async fn connect(wire: Wire, gateway: &TestGateway) -> WireClient {
        let grpc = || async {
            GrpcInferenceServiceClient::connect(gateway.grpc_url())
                .await
                .expect("gateway gRPC listener")
        };
        match wire {
            Wire::Http => WireClient::Http(reqwest::Client::new(), gateway.url()),
            Wire::Grpc => WireClient::Grpc(grpc().await),
            Wire::GrpcStream => {
                let (requests, queue) = tokio::sync::mpsc::channel(8);
                let answers = grpc()
                    .await
                    .model_stream_infer(tokio_stream::wrappers::ReceiverStream::new(queue))
                    .await
                    .expect("the stream opens")
                    .into_inner();
                WireClient::GrpcStream(requests, answers)
            }
        }
    }

    /// One FP32 `[4]` inference with `INPUT0 = [x; 4]` (what the identity models take):
    /// the model that answered and its first output, or the error as the client saw it.
    pub async fn identity(&mut self, model: &str, x: f32) -> Result<(String, Vec<f32>), String> {
        match self {
            WireClient::Http(client, base) => {
                let request = serde_json::json!({"inputs": [
                    {"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [x, x, x, x]}]});
                let (status, text) = super::infer(client, base, model, &request).await;
                if status != 200 {
                    return Err(format!("{status}: {text}"));
                }
                let body: serde_json::Value =
                    serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
                let output = body["outputs"][0]["data"]
                    .as_array()
                    .ok_or_else(|| format!("no outputs: {text}"))?
                    .iter()
                    .map(|v| v.as_f64().unwrap() as f32)
                    .collect();
                Ok((body["model_name"].as_str().unwrap_or("").to_owned(), output))
            }
            WireClient::Grpc(client) => {
                let request = super::grpc::fp32_infer(model, &[("INPUT0", [x; 4])]);
                let answer = client
                    .model_infer(request)
                    .await
                    .map_err(|status| format!("{:?}: {}", status.code(), status.message()))?
                    .into_inner();
                Ok(first_output(answer))
            }
            WireClient::GrpcStream(requests, answers) => {
                let request = super::grpc::fp32_infer(model, &[("INPUT0", [x; 4])]);
                requests.send(request).await.expect("the stream is open");
                let answer = tokio::time::timeout(Duration::from_secs(30), answers.message())
                    .await
                    .expect("an answer within 30 s")
                    .map_err(|status| format!("{:?}: {}", status.code(), status.message()))?
                    .expect("the stream goes on");
                if !answer.error_message.is_empty() {
                    return Err(answer.error_message);
                }
                Ok(first_output(answer.infer_response.expect("a response")))
            }
        }
    }
}

/// The model that answered and its first output, read as FP32.
fn first_output(answer: ModelInferResponse) -> (String, Vec<f32>) {
    let output = answer.raw_output_contents[0]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (answer.model_name, output)
}
