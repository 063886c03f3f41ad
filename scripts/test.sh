#!/usr/bin/env bash
# Runs every test on a fresh machine: installs real Triton into .venv (scripts/setup.sh),
# then the whole cargo suite, whose integration tests start their own tritonserver processes
# and run the official Python tritonclient against the gateway.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --workspace -- --test-threads=2
