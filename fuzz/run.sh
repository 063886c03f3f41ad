#!/usr/bin/env bash
# Runs the request-validation fuzz target for a bounded time. Not in CI: it needs cargo-fuzz
# and nightly, or stable with RUSTC_BOOTSTRAP=1 (set here when no nightly is installed).
# Usage: fuzz/run.sh [seconds, default 300] [extra libFuzzer flags...]
# Crashes land in fuzz/artifacts/validate_request/; add each as a regression test beside the
# reader's tests in src/validate/ before fixing it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
seconds="${1:-300}"
shift || true
command -v cargo-fuzz >/dev/null || { echo "run.sh: cargo install cargo-fuzz" >&2; exit 1; }
# cargo-fuzz needs nightly flags; without a nightly toolchain, stable takes them when told it
# is bootstrapping (how it runs on machines that can fetch no other toolchain).
toolchain=(+nightly)
if ! rustup toolchain list | grep -q nightly; then
    toolchain=()
    export RUSTC_BOOTSTRAP=1
fi
mkdir -p corpus/validate_request
exec cargo "${toolchain[@]}" fuzz run validate_request corpus/validate_request seeds -- \
    -max_total_time="$seconds" -max_len=8192 -dict=validate_request.dict -print_final_stats=1 "$@"
