//! `infergate-load`: the load generator behind every performance figure in
//! infergate's README, and `fake-triton`, the fast stand-in backend used to
//! measure the gateway's own overhead.
//!
//! The library holds all the logic so that it can be unit- and
//! integration-tested; the two binaries are thin command-line shells.
//! Each module has one job:
//!
//! - [`units`]: parsing `2s`, `1MB`, `10%`, `1,8,32`.
//! - [`spec`]: the `--input NAME:DATATYPE:SHAPE` tensor spec.
//! - [`data`]: tensor values and their raw little-endian layout.
//! - [`body`]: KServe v2 request bodies, JSON or binary extension.
//! - [`transport`]: the [`transport::Transport`] trait and its HTTP implementation.
//! - [`outcome`]: error kinds and `--check` response validation.
//! - [`runner`]: closed-loop and open-loop load, warmup and windows.
//! - [`sequence`]: sequence mode: ids, start/end flags, running sums to check.
//! - [`stats`]: histograms, percentiles, stability, max RPS at p95 target.
//! - [`report`]: the terminal table and the `--json` document.
//! - [`identity`]: `--tenant` and `--priority`, the tenant and band a run is sent as.
//! - [`cli`]: command-line arguments and their validation.
//! - [`fake`]: the fake Triton server.

#![warn(missing_docs)]

pub mod body;
pub mod cli;
pub mod data;
pub mod fake;
pub mod identity;
pub mod outcome;
pub mod report;
pub mod runner;
pub mod sequence;
pub mod spec;
pub mod stats;
pub mod transport;
pub mod units;
