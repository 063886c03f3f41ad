#!/usr/bin/env bash
# Runs the request-validation fuzz target for a bounded time (not in CI: it needs nightly
# and cargo-fuzz). Usage: fuzz/run.sh [seconds, default 300] [extra libFuzzer flags...]
# Crashes land in fuzz/artifacts/validate_request/; add each as a regression test (see
# `fuzz_regressions` in src/validate/http.rs) before fixing it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
seconds="${1:-300}"
shift || true
command -v cargo-fuzz >/dev/null || { echo "run.sh: cargo install cargo-fuzz" >&2; exit 1; }
rustup toolchain list | grep -q nightly || { echo "run.sh: needs a nightly toolchain (rustup toolchain install nightly)" >&2; exit 1; }
mkdir -p corpus/validate_request
exec cargo +nightly fuzz run validate_request corpus/validate_request seeds -- \
    -max_total_time="$seconds" -max_len=8192 -dict=validate_request.dict -print_final_stats=1 "$@"
