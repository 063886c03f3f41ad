//! Command line of `infergate-load`, and its validation into a [`Plan`].
//!
//! Everything the run needs is checked and computed here (bodies encoded,
//! URIs built, sweeps parsed) so that mistakes fail before any load is sent
//! and the rest of the program works with typed values only.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;

use crate::body::{EncodedBody, Encoding, build_bodies, spec_for_body_size};
use crate::data::DataMode;
use crate::identity::{Identity, Priority};
use crate::sequence::{SequenceTemplate, Sequences};
use crate::spec::{DataType, TensorSpec};
use crate::stats::Load;
use crate::transport::Protocol;
use crate::transport::grpc::{GrpcOptions, GrpcTransport};
use crate::transport::http::{HttpEndpoint, HttpOptions, HttpTransport, build_headers, infer_uri};
use crate::units::{parse_duration, parse_list, parse_percent, parse_size};

/// How many differently-randomised bodies to pre-build and rotate through.
pub const RANDOM_BODY_VARIANTS: usize = 16;

/// Pre-built bodies are capped at this total size; large `--body-size`
/// runs get fewer variants instead of eating memory.
pub const MAX_TOTAL_BODY_BYTES: u64 = 256 * 1024 * 1024;

/// Default connection cap for open-loop steps, which have no concurrency to
/// derive it from. Enough for 12,800 infer/s at 10 ms per request.
pub const DEFAULT_OPEN_LOOP_CONNECTIONS: usize = 128;

/// `infergate-load`: KServe v2 inference load generator.
///
/// Sends inference requests to a KServe v2 / Open Inference Protocol HTTP
/// endpoint (Triton, or infergate in front of Triton) in a closed loop at
/// one or more concurrency levels or in an open loop at fixed rates, and
/// reports throughput, latency percentiles, errors by kind and the highest
/// throughput that still meets a p95 latency target.
#[derive(Debug, Parser)]
#[command(name = "infergate-load", version)]
pub struct Args {
    /// Base URL of the server (scheme, host, port, optional path prefix).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,

    /// Model name to infer against; with a gateway, the route name clients call.
    #[arg(short, long, visible_alias = "route", default_value = "add_sub")]
    pub model: String,

    /// Model version: sends to /v2/models/{model}/versions/{V}/infer.
    #[arg(long)]
    pub model_version: Option<String>,

    /// Wire protocol: `http` (KServe v2 REST) or `grpc` (KServe v2 gRPC ModelInfer, tensors
    /// as raw contents; --url is then the gRPC endpoint, http://host:port).
    #[arg(long, value_enum, default_value = "http")]
    pub protocol: Protocol,

    /// Use HTTP/2 with prior knowledge (h2c) instead of HTTP/1.1.
    #[arg(long)]
    pub http2: bool,

    /// Input tensor NAME:DATATYPE:SHAPE, e.g. INPUT0:FP32:4 or INPUT0:FP32:1x4 (repeatable).
    #[arg(short, long = "input", value_name = "SPEC")]
    pub inputs: Vec<String>,

    /// Output to request by name (repeatable); by default the server returns all outputs.
    #[arg(long = "output", value_name = "NAME")]
    pub outputs: Vec<String>,

    /// Tensor values: random (seeded by --seed) or a fixed pattern.
    #[arg(long, value_enum, default_value = "random")]
    pub data: DataMode,

    /// Seed for random tensor values.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// Send this JSON request body verbatim instead of generating one.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["inputs", "binary", "body_size", "outputs"])]
    pub request_file: Option<PathBuf>,

    /// Use the binary tensor extension instead of JSON tensor data.
    #[arg(long)]
    pub binary: bool,

    /// Target request body size (e.g. 64KB, 1MB, 1MiB): generates one FP32
    /// input shaped [N] with N chosen so the body is just under this size.
    #[arg(long, value_name = "SIZE")]
    pub body_size: Option<String>,

    /// Closed loop: comma-separated concurrency levels, one step each (e.g. 1,8,32).
    #[arg(short, long, value_name = "LIST", conflicts_with = "rate")]
    pub concurrency: Option<String>,

    /// Open loop: comma-separated request rates per second, one step each (e.g. 500).
    #[arg(short, long, value_name = "LIST")]
    pub rate: Option<String>,

    /// Warmup before each step's measurement (not measured).
    #[arg(long, default_value = "2s", value_name = "DURATION")]
    pub warmup: String,

    /// Length of one measurement window.
    #[arg(short, long, default_value = "10s", value_name = "DURATION")]
    pub duration: String,

    /// Measurement windows per step (each reported, compared for stability).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub windows: usize,

    /// A step is unstable if any window's throughput deviates from the mean by more than this.
    #[arg(long, default_value = "10%", value_name = "PERCENT")]
    pub stability: String,

    /// Latency objective for "max RPS at p95 target".
    #[arg(long, default_value = "10ms", value_name = "DURATION")]
    pub p95_target: String,

    /// Steps failing more than this share of requests never count as meeting the p95 target.
    #[arg(long, default_value = "1%", value_name = "PERCENT")]
    pub max_error_rate: String,

    /// Per-request timeout, counted from the intended send time.
    #[arg(long, default_value = "5s", value_name = "DURATION")]
    pub timeout: String,

    /// Cap on requests in flight / pooled connections (default: the step's
    /// concurrency; 128 for --rate).
    #[arg(long, value_name = "N")]
    pub connections: Option<usize>,

    /// Validate responses: status must be 200 and the JSON must contain `outputs`.
    #[arg(long)]
    pub check: bool,

    /// Send `Authorization: Bearer TOKEN`.
    #[arg(long, value_name = "TOKEN")]
    pub bearer: Option<String>,

    /// Send `x-api-key: KEY`.
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,

    /// Extra request header NAME:VALUE (repeatable), e.g. x-user-id:alice.
    #[arg(short = 'H', long = "header", value_name = "NAME:VALUE")]
    pub headers: Vec<String>,

    /// Send as tenant NAME with its API key KEY (NAME=KEY): the key goes in `x-api-key` (or
    /// the header --tenant-header names); the name labels the report, so runs of several
    /// tenants side by side can be told apart.
    #[arg(long, value_name = "NAME=KEY")]
    pub tenant: Option<String>,

    /// The header --tenant's key goes in (default x-api-key), e.g. `authorization` with
    /// KEY `Bearer <token>`.
    #[arg(long, value_name = "HEADER")]
    pub tenant_header: Option<String>,

    /// Ask for a priority band: sends `x-infergate-priority: BAND` (gRPC: metadata).
    #[arg(long, value_enum, value_name = "BAND")]
    pub priority: Option<Priority>,

    /// Print one JSON document on stdout (the table then goes to stderr).
    #[arg(long)]
    pub json: bool,

    /// No progress line on stderr (and with --json, no table on stderr either).
    #[arg(short, long)]
    pub quiet: bool,

    /// Tokio worker threads for the load generator (default: all cores).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,

    /// Sequence mode: each of the --concurrency workers runs sequences of this many
    /// requests back to back (sequence_id on each, sequence_start on the first,
    /// sequence_end on the last), as perf_analyzer --sequence-length does; with --check each
    /// answer must carry the sequence's running sum.
    #[arg(long, value_name = "L", conflicts_with_all = ["rate", "request_file"])]
    pub sequence_length: Option<usize>,

    /// Sequence mode: the first sequence's id; each next sequence takes the next number.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub sequence_id_start: u64,

    /// Sequence mode: send ids as strings (`seq-<n>`) instead of numbers.
    #[arg(long)]
    pub string_sequence_ids: bool,
}

/// How the request body was produced, for the report.
#[derive(Debug, Clone)]
pub enum BodySource {
    /// Generated from `--input` specs (or `--body-size`).
    Generated {
        /// The tensors sent.
        specs: Vec<TensorSpec>,
        /// JSON or binary.
        encoding: Encoding,
    },
    /// `--request-file`, sent verbatim.
    File(PathBuf),
}

/// A validated run: what to send, where, and the steps to run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Base URL as given.
    pub url: String,
    /// Model (route) name.
    pub model: String,
    /// Model version, if pinned.
    pub model_version: Option<String>,
    /// Wire protocol.
    pub protocol: Protocol,
    /// HTTP/2 prior knowledge.
    pub http2: bool,
    /// Target URI and per-request headers.
    pub endpoint: HttpEndpoint,
    /// The tenant and band the requests are sent as (`--tenant`, `--priority`).
    pub identity: Identity,
    /// Pre-built bodies to rotate through.
    pub bodies: Vec<EncodedBody>,
    /// Where the bodies came from.
    pub body_source: BodySource,
    /// The steps, in order, with their connection caps.
    pub steps: Vec<crate::runner::StepConfig>,
    /// Warmup / windows / timeout.
    pub timing: crate::runner::Timing,
    /// Allowed window spread, as a fraction.
    pub stability: f64,
    /// p95 objective for the headline figure.
    pub p95_target: Duration,
    /// Error-rate ceiling for the headline figure, as a fraction.
    pub max_error_rate: f64,
    /// Validate responses.
    pub check: bool,
    /// Emit the JSON document.
    pub json: bool,
    /// Suppress progress and stderr table.
    pub quiet: bool,
    /// Worker threads.
    pub threads: Option<usize>,
    /// Sequence mode: the sequences, and what their requests are made from.
    pub sequences: Option<(Sequences, SequenceTemplate)>,
}

impl Plan {
    /// A fresh HTTP transport for one step (its own pool of `connections`), with the
    /// sequences' template in sequence mode.
    pub fn http_transport(&self, connections: usize) -> Result<HttpTransport> {
        let transport = HttpTransport::new(
            &self.endpoint,
            &self.bodies,
            HttpOptions {
                connections,
                http2: self.http2,
                check: self.check,
            },
        )?;
        Ok(match &self.sequences {
            Some((_, template)) => transport.with_sequences(template.clone()),
            None => transport,
        })
    }

    /// A fresh gRPC transport for one step (`connections` channels), with the sequences'
    /// template in sequence mode.
    pub fn grpc_transport(&self, connections: usize) -> Result<GrpcTransport> {
        let transport = GrpcTransport::new(
            &self.url,
            &self.model,
            self.model_version.as_deref(),
            &self.bodies,
            &self.endpoint.headers,
            GrpcOptions {
                connections,
                check: self.check,
            },
        )?;
        Ok(match &self.sequences {
            Some((_, template)) => transport.with_sequences(
                template.clone(),
                &self.model,
                self.model_version.as_deref(),
            ),
            None => transport,
        })
    }
}

impl Args {
    /// Validates the arguments and builds everything the run needs.
    pub fn into_plan(self) -> Result<Plan> {
        if self.protocol == Protocol::Grpc && self.request_file.is_some() {
            bail!("--request-file is a JSON body for HTTP; with --protocol grpc use --input");
        }
        let uri = match self.protocol {
            Protocol::Http => infer_uri(&self.url, &self.model, self.model_version.as_deref())?,
            Protocol::Grpc => crate::transport::grpc::infer_uri(&self.url)?,
        };
        let mut headers = build_headers(
            self.bearer.as_deref(),
            self.api_key.as_deref(),
            &self.headers,
        )?;
        let identity = crate::identity::apply(
            self.tenant.as_deref(),
            self.tenant_header.as_deref(),
            self.priority,
            &mut headers,
        )?;

        let timing = self.timing()?;
        if self.connections == Some(0) {
            bail!("--connections must be at least 1");
        }
        if self.threads == Some(0) {
            bail!("--threads must be at least 1");
        }
        let loads = self.loads()?;
        let (bodies, body_source) = self.bodies()?;
        let sequences = self.sequences(&body_source)?;
        let steps = loads
            .into_iter()
            .map(|load| crate::runner::StepConfig {
                load,
                connections: self.connections.unwrap_or(match load {
                    Load::Closed { concurrency } => concurrency,
                    Load::Open { .. } => DEFAULT_OPEN_LOOP_CONNECTIONS,
                }),
                sequences: sequences.as_ref().map(|(plan, _)| *plan),
            })
            .collect();

        Ok(Plan {
            url: self.url,
            model: self.model,
            model_version: self.model_version,
            protocol: self.protocol,
            http2: self.http2,
            endpoint: HttpEndpoint { uri, headers },
            identity,
            bodies,
            body_source,
            steps,
            timing,
            stability: parse_percent(&self.stability).context("--stability")?,
            p95_target: parse_duration(&self.p95_target).context("--p95-target")?,
            max_error_rate: parse_percent(&self.max_error_rate).context("--max-error-rate")?,
            check: self.check,
            json: self.json,
            quiet: self.quiet,
            threads: self.threads,
            sequences,
        })
    }

    /// Warm-up, window length and count, and the request timeout: a zero window or timeout
    /// would measure nothing.
    fn timing(&self) -> Result<crate::runner::Timing> {
        let timing = crate::runner::Timing {
            warmup: parse_duration(&self.warmup).context("--warmup")?,
            window: parse_duration(&self.duration).context("--duration")?,
            windows: self.windows,
            timeout: parse_duration(&self.timeout).context("--timeout")?,
        };
        if timing.window.is_zero() {
            bail!("--duration must be greater than zero");
        }
        if timing.windows == 0 {
            bail!("--windows must be at least 1");
        }
        if timing.timeout.is_zero() {
            bail!("--timeout must be greater than zero");
        }
        Ok(timing)
    }

    /// The load steps: open-loop rates win over closed-loop concurrencies; neither means
    /// one request at a time.
    fn loads(&self) -> Result<Vec<Load>> {
        Ok(match (&self.concurrency, &self.rate) {
            (_, Some(rates)) => parse_list::<f64>(rates)
                .context("--rate")?
                .into_iter()
                .map(|rate| Load::Open { rate })
                .collect(),
            (Some(c), None) => parse_list::<usize>(c)
                .context("--concurrency")?
                .into_iter()
                .map(|concurrency| Load::Closed { concurrency })
                .collect(),
            (None, None) => vec![Load::Closed { concurrency: 1 }],
        })
    }

    /// Sequences, when asked for: they build their own requests, so they need generated
    /// bodies, and ids from 1 (id 0 means no sequence to Triton).
    fn sequences(&self, body_source: &BodySource) -> Result<Option<(Sequences, SequenceTemplate)>> {
        let sequences = match (self.sequence_length, body_source) {
            (None, _) => None,
            (Some(0), _) => bail!("--sequence-length must be at least 1"),
            (Some(length), BodySource::Generated { specs, encoding }) => Some((
                Sequences {
                    length,
                    first_id: self.sequence_id_start,
                    string_ids: self.string_sequence_ids,
                },
                SequenceTemplate::new(specs, &self.outputs, *encoding)?,
            )),
            (Some(_), BodySource::File(_)) => bail!("--sequence-length builds its own requests"),
        };
        if sequences.is_some() && self.sequence_id_start == 0 && !self.string_sequence_ids {
            bail!("--sequence-id-start must be at least 1: sequence id 0 means no sequence");
        }
        Ok(sequences)
    }

    fn bodies(&self) -> Result<(Vec<EncodedBody>, BodySource)> {
        if let Some(path) = &self.request_file {
            let bytes = std::fs::read(path)
                .with_context(|| format!("reading --request-file {}", path.display()))?;
            serde_json::from_slice::<serde_json::Value>(&bytes)
                .with_context(|| format!("--request-file {} is not valid JSON", path.display()))?;
            let body = EncodedBody {
                bytes: bytes.into(),
                header_len: None,
            };
            return Ok((vec![body], BodySource::File(path.clone())));
        }

        // gRPC sends tensors as raw contents, built from binary bodies.
        let encoding = if self.binary || self.protocol == Protocol::Grpc {
            Encoding::Binary
        } else {
            Encoding::Json
        };
        let mut specs: Vec<TensorSpec> = self
            .inputs
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_>>()?;
        if let Some(size) = &self.body_size {
            let target = parse_size(size).context("--body-size")?;
            let name = match specs.as_slice() {
                [] => "INPUT0".to_string(),
                [one] if one.datatype == DataType::Fp32 => one.name.clone(),
                _ => bail!(
                    "--body-size builds a single FP32 input: give at most one --input, \
                     of type FP32 (its shape is then chosen for you)"
                ),
            };
            specs = vec![spec_for_body_size(
                &name,
                target,
                &self.outputs,
                encoding,
                self.data,
                self.seed,
            )?];
        }
        if specs.is_empty() {
            bail!(
                "nothing to send: give --input NAME:DATATYPE:SHAPE (e.g. --input INPUT0:FP32:4 \
                 --input INPUT1:FP32:4 for add_sub), --body-size, or --request-file"
            );
        }
        // Rotate through several random bodies, within a memory budget.
        let one = build_bodies(&specs, &self.outputs, encoding, self.data, self.seed, 1)?;
        let size = one[0].bytes.len().max(1) as u64;
        let variants = (MAX_TOTAL_BODY_BYTES / size).clamp(1, RANDOM_BODY_VARIANTS as u64) as usize;
        let bodies = if variants > 1 && self.data == DataMode::Random {
            build_bodies(
                &specs,
                &self.outputs,
                encoding,
                self.data,
                self.seed,
                variants,
            )?
        } else {
            one
        };
        Ok((bodies, BodySource::Generated { specs, encoding }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(args: &[&str]) -> Result<Plan> {
        let mut v = vec!["infergate-load"];
        v.extend_from_slice(args);
        Args::try_parse_from(v)?.into_plan()
    }

    #[test]
    fn add_sub_defaults() {
        let p = plan(&["-i", "INPUT0:FP32:4", "-i", "INPUT1:FP32:4"]).unwrap();
        assert_eq!(
            p.endpoint.uri,
            "http://127.0.0.1:8000/v2/models/add_sub/infer"
        );
        assert_eq!(p.steps.len(), 1);
        assert_eq!(p.steps[0].load, Load::Closed { concurrency: 1 });
        assert_eq!(p.steps[0].connections, 1);
        assert_eq!(p.bodies.len(), RANDOM_BODY_VARIANTS);
        assert_eq!(p.timing.window, Duration::from_secs(10));
        assert_eq!(p.timing.windows, 3);
        assert_eq!(p.p95_target, Duration::from_millis(10));
        assert!((p.stability - 0.10).abs() < 1e-12);
    }

    #[test]
    fn sweeps_and_connection_defaults() {
        let p = plan(&["-i", "X:INT32:1", "--concurrency", "1,16,64"]).unwrap();
        let c: Vec<usize> = p.steps.iter().map(|s| s.connections).collect();
        assert_eq!(c, vec![1, 16, 64]);
        let p = plan(&["-i", "X:INT32:1", "-c", "8,32", "--connections", "4"]).unwrap();
        assert!(p.steps.iter().all(|s| s.connections == 4));
        let p = plan(&["-i", "X:INT32:1", "--rate", "500"]).unwrap();
        assert_eq!(p.steps[0].load, Load::Open { rate: 500.0 });
        assert_eq!(p.steps[0].connections, DEFAULT_OPEN_LOOP_CONNECTIONS);
        assert!(plan(&["-i", "X:INT32:1", "-c", "1", "--rate", "5"]).is_err());
        assert!(plan(&["-i", "X:INT32:1", "-c", "0"]).is_err());
    }

    #[test]
    fn route_alias_and_version() {
        let p = plan(&["--route", "chat", "--model-version", "3", "-i", "X:FP32:1"]).unwrap();
        assert_eq!(
            p.endpoint.uri,
            "http://127.0.0.1:8000/v2/models/chat/versions/3/infer"
        );
    }

    #[test]
    fn grpc_builds_binary_bodies() {
        let p = plan(&["--protocol", "grpc", "-i", "X:FP32:1"]).unwrap();
        assert_eq!(p.protocol, Protocol::Grpc);
        assert!(p.bodies.iter().all(|b| b.header_len.is_some()));
        let err = plan(&["--protocol", "grpc", "--request-file", "x.json"]).unwrap_err();
        assert!(err.to_string().contains("--request-file"), "{err}");
    }

    #[test]
    fn needs_something_to_send() {
        assert!(plan(&[]).is_err());
        assert!(plan(&["-i", "bad"]).is_err());
    }

    #[test]
    fn body_size_builds_single_fp32_input() {
        let p = plan(&["--body-size", "64KB", "--binary", "--data", "fixed"]).unwrap();
        let BodySource::Generated { specs, encoding } = &p.body_source else {
            panic!()
        };
        assert_eq!(*encoding, Encoding::Binary);
        assert_eq!(specs.len(), 1);
        assert_eq!(specs[0].name, "INPUT0");
        let len = p.bodies[0].bytes.len();
        assert!(len <= 64_000 && len > 63_000, "{len}");
        let p = plan(&["--body-size", "10KB", "-i", "data:FP32:1"]).unwrap();
        let BodySource::Generated { specs, .. } = &p.body_source else {
            panic!()
        };
        assert_eq!(specs[0].name, "data");
        assert!(plan(&["--body-size", "10KB", "-i", "x:INT8:1"]).is_err());
    }

    #[test]
    fn request_file_is_sent_verbatim() {
        let dir = std::env::temp_dir().join(format!("infergate-load-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("req.json");
        let text = r#"{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[1],"data":[1]}]}"#;
        std::fs::write(&path, text).unwrap();
        let p = plan(&["--request-file", path.to_str().unwrap()]).unwrap();
        assert_eq!(&p.bodies[0].bytes[..], text.as_bytes());
        assert!(plan(&["--request-file", path.to_str().unwrap(), "--binary"]).is_err());
        std::fs::write(&path, "not json").unwrap();
        assert!(plan(&["--request-file", path.to_str().unwrap()]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sequence_mode_is_a_closed_loop_of_sequences() {
        let p = plan(&[
            "-m",
            "sequence_sum",
            "-i",
            "INPUT0:FP32:1",
            "--sequence-length",
            "40",
            "-c",
            "8",
        ])
        .unwrap();
        let (sequences, _) = p.sequences.as_ref().unwrap();
        assert_eq!(sequences.length, 40);
        assert_eq!(sequences.first_id, 1);
        assert!(!sequences.string_ids);
        assert_eq!(p.steps[0].sequences, Some(*sequences));
        let base = ["-i", "INPUT0:FP32:1", "--sequence-length"];
        let with = |extra: &[&str]| plan(&[&base[..], extra].concat());
        assert!(with(&["40", "--rate", "5"]).is_err());
        assert!(with(&["0"]).is_err());
        assert!(with(&["4", "--sequence-id-start", "0"]).is_err());
        assert!(with(&["4", "--sequence-id-start", "0", "--string-sequence-ids"]).is_ok());
        assert!(plan(&["-i", "S:BYTES:1", "--sequence-length", "4"]).is_err());
    }

    #[test]
    fn auth_and_headers() {
        let p = plan(&[
            "-i",
            "X:FP32:1",
            "--bearer",
            "t",
            "--api-key",
            "k",
            "-H",
            "x-user-id:u1",
        ])
        .unwrap();
        assert_eq!(p.endpoint.headers["authorization"], "Bearer t");
        assert_eq!(p.endpoint.headers["x-api-key"], "k");
        assert_eq!(p.endpoint.headers["x-user-id"], "u1");
    }

    #[test]
    fn tenant_and_priority_become_headers_and_label_the_plan() {
        let p = plan(&[
            "-i",
            "X:FP32:1",
            "--tenant",
            "flood=key-1",
            "--priority",
            "sheddable",
        ])
        .unwrap();
        assert_eq!(p.endpoint.headers["x-api-key"], "key-1");
        assert_eq!(p.endpoint.headers["x-infergate-priority"], "sheddable");
        assert_eq!(p.identity.tenant.as_deref(), Some("flood"));
        assert!(plan(&["-i", "X:FP32:1", "--priority", "urgent"]).is_err());
        let doubled = ["-i", "X:FP32:1", "--tenant", "a=k", "--api-key", "k"];
        assert!(plan(&doubled).is_err());
    }
}
