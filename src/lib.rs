//! infergate: a KServe v2 gateway in front of a pool of NVIDIA Triton Inference Servers.
//!
//! `Gateway` (`gateway`) is the shared state every request sees; `serve` (`run`) runs the
//! listeners on sockets the caller bound (so tests can bind port 0) until shutdown, then
//! drains. This file only names the modules and what the binary and tests may use.
#![forbid(unsafe_code)]

#[cfg(test)]
mod architecture_tests;
mod auth;
mod body;
mod cluster;
pub mod config;
mod connection_tasks;
mod deadline_timer;
mod discovery;
mod error;
mod flow;
mod fnv;
mod frontend;
mod gateway;
mod hold;
mod in_place;
mod listen;
mod live;
mod log_text;
mod model;
mod openai;
mod pipeline;
mod placement;
mod plain_text;
pub mod protocol;
mod reload;
mod routing;
mod run;
mod services;
mod telemetry;
mod tls;
mod trace;
mod upstream;
mod validate;
mod worker;

pub use auth::hash_key;
pub use telemetry::{LogFormat, flush_logs, init_logging};

/// Gateway internals for this workspace's own tools, and for nothing else: the placement
/// simulator (`simulator/`, the `infergate-simulate` binary) replays traces against the real
/// placement table, the criterion benches (`benches/`) time the hot paths, `infergate check`
/// builds what a config names, and the integration tests reach a few parts directly. One facade, so
/// what they reach is listed in one place; no stability promise, hidden from the docs.
#[doc(hidden)]
pub mod internals {
    pub use crate::auth::Caller;
    pub use crate::auth::{Auth, Credentials};
    pub use crate::config::{ByteSize, Config, EvictionPolicy, HumanDuration};
    pub use crate::error::GatewayError;
    pub use crate::model::ModelRef;
    pub use crate::placement::estimate::{Estimate, SizeSource};
    pub use crate::placement::policy::EvictionOrder;
    pub use crate::placement::table::{BackendView, Decision, Policy, Table};
    pub use crate::routing::{PIN_HEADER, RouteTable};
    pub use crate::tls::{ServerTls, certificate_identity, etcd_connector};
    pub use crate::trace::{Carried, RequestTrace, TRACEPARENT};
    pub use crate::upstream::{Backend, Pool};
    pub use crate::validate::http::{BodyView, Parsed, parse};
    pub use crate::validate::{DataType, InputSpec, Signature, check};
    pub use crate::validate::{SignatureCache, json};
}

pub use gateway::Gateway;
pub use run::{Listeners, cancel_on_signal, serve};
