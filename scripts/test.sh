#!/usr/bin/env bash
# Runs every test on a fresh machine: installs real Triton into .venv (scripts/setup.sh),
# then the whole cargo suite, whose integration tests start their own tritonserver processes
# and run the official Python tritonclient against the gateway. Ends with one summary line
# over every test binary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# A clean build gains nothing from incremental state, which only costs disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --no-fail-fast -- --test-threads=2 2>&1 | tee "$log" || status=$?
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed;?$/) p += $i; if ($(i+1) ~ /^failed;?$/) f += $i } }
     END { printf "total: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
