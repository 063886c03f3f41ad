//! `infergate-simulate`: the placement simulator's command line (see the crate's docs and
//! docs/placement.md). A binary of its own, so the gateway's carries none of it.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = infergate_simulator::Args::parse();
    match infergate_simulator::simulate(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("infergate-simulate: {error:#}");
            ExitCode::FAILURE
        }
    }
}
