#!/usr/bin/env bash
# Runs every test on a fresh machine: installs real Triton into .venv (scripts/setup.sh),
# then the whole cargo suite, whose integration tests start their own tritonserver processes
# and run the official Python tritonclient against the gateway.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --workspace --all-targets --locked 2>&1 | tail -n 3
cargo test --workspace --locked -- --test-threads=2
