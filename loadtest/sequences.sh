#!/usr/bin/env bash
# loadtest/sequences.sh — concurrent sequences through infergate while placement scales the
# model out, as `perf_analyzer -m sequence_sum --sequence-length 40 --concurrency-range 8`
# runs them against Triton.
#
# Two real Tritons (CPU, tests/models, explicit model control, Triton's default flags,
# nothing loaded at start) behind one infergate whose placement gives a busy model a second
# copy (scale_up_rps 5, max_copies 2). `infergate-load --sequence-length L -c N --check`
# keeps N sequences of L requests going (sequence_id on every request, sequence_start on the
# first, sequence_end on the last) and checks every answer: sequence_sum answers the running
# sum of its input over the sequence, so a request sent to a copy that did not see its
# sequence start is caught (a wrong sum, or Triton's "must specify the START flag").
#
# Runs, one after the other, each SEQ_DURATION long: direct to one Triton (the reference),
# then through infergate over HTTP (JSON, numeric ids), HTTP (binary, string ids), gRPC
# (numeric ids) and gRPC (string ids). The first infergate run loads the model and sees the
# second copy come; the others run on two copies. Reported per run: infer/s, p50/p99, errors
# by kind (any is a failure), the copies on the gateway's books after it, and how many
# requests each Triton served (nv_inference_request_success): both must have served.
#
# Writes loadtest/results/<date>-<short sha>-sequences.md and prints it. Stays on loopback,
# stops only what it started. About a minute plus the build.
#
# Knobs (environment):
#   SEQ_BASE_PORT=29700    ports used: base..base+2 and base+10..12 (the Tritons),
#                          base+20..23 (infergate)
#   SEQ_LENGTH=40 SEQ_CONCURRENCY=8 SEQ_DURATION=8s
#   SEQ_BUILD=1            0 skips `cargo build --release`
#   SEQ_BIN=target/release where the binaries are (target/debug works for a quick check)
#   SEQ_OUT=path.md        results file (default loadtest/results/<date>-<sha>-sequences.md)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BASE="${SEQ_BASE_PORT:-29700}"
LENGTH="${SEQ_LENGTH:-40}"
CONCURRENCY="${SEQ_CONCURRENCY:-8}"
DURATION="${SEQ_DURATION:-8s}"
BUILD="${SEQ_BUILD:-1}"
BIN="$ROOT/${SEQ_BIN:-target/release}"
SHA="$(git rev-parse --short HEAD)"
DATE="$(date +%F)"
OUT="${SEQ_OUT:-loadtest/results/$DATE-$SHA-sequences.md}"
WORKERS=auto
ACCESS_LOG=off
STARTED=$SECONDS

# shellcheck source=loadtest/lib.sh
source loadtest/lib.sh
on_exit() { stop_tritons; }

require_triton
check_ports "$BASE" $((BASE + 1)) $((BASE + 2)) $((BASE + 10)) $((BASE + 11)) $((BASE + 12)) \
    $((BASE + 20)) $((BASE + 21)) $((BASE + 22)) $((BASE + 23))
build_release infergate infergate-load
describe_machine src Cargo.toml Cargo.lock loadtest/src

# ---------------------------------------------------------------- Tritons, empty
start_tritons "$ROOT/tests/models" "$BASE" $((BASE + 10))

# ---------------------------------------------------------------- infergate
IG=$((BASE + 20))
cat >"$TMP/infergate.toml" <<EOF
$(listen_table "$IG")

[placement]
model_repository = "$ROOT/tests/models"
scale_up_rps = 5.0
max_copies = 2
rebalance_interval = "500ms"

[[backends]]
name = "t0"
http = "http://127.0.0.1:$BASE"
grpc = "http://127.0.0.1:$((BASE + 1))"
capacity = "4GiB"

[[backends]]
name = "t1"
http = "http://127.0.0.1:$((BASE + 10))"
grpc = "http://127.0.0.1:$((BASE + 11))"
capacity = "4GiB"
EOF
start_infergate infergate "$TMP/infergate.toml"
wait_http "http://127.0.0.1:$IG/v2/health/ready" 20 || die "infergate never became ready: $(tail "$TMP/infergate.log")"

# ---------------------------------------------------------------- runs
successes() { # triton http port -> nv_inference_request_success of sequence_sum
    curl -s "127.0.0.1:$(($1 + 2))/metrics" |
        awk '/^nv_inference_request_success\{/ && /model="sequence_sum"/ { s += $NF } END { print s + 0 }'
}
copies() {
    curl -s "127.0.0.1:$((IG + 3))/admin/placement" |
        jq -r '[.backends[] | .name as $b | .models[] | select(.name == "sequence_sum") | "\($b) \(.state)"] | join(", ")'
}
ROWS=()
FAILED=0
run() { # label url extra args...
    local label="$1" url="$2" out="$TMP/run-${#ROWS[@]}.json" before0 before1
    shift 2
    before0="$(successes "$BASE")"; before1="$(successes $((BASE + 10)))"
    "$BIN/infergate-load" --url "$url" -m sequence_sum -i INPUT0:FP32:1 \
        --sequence-length "$LENGTH" -c "$CONCURRENCY" --check --warmup 0s --duration "$DURATION" \
        --windows 1 --timeout 10s --json -q "$@" >"$out" 2>"$out.err" ||
        { cat "$out.err" >&2; die "infergate-load failed for $label"; }
    local errors
    errors="$(jq -r '.steps[0].errors_by_kind | to_entries | map("\(.key) \(.value)") | join(", ")' "$out")"
    [[ -z "$errors" ]] || FAILED=1
    ROWS+=("| $label | $(jq -r '.steps[0] | "\(.throughput_rps | floor) | \(.latency_us.p50) / \(.latency_us.p99) | \(.ok)"' "$out") | ${errors:-none} | $(($(successes "$BASE") - before0)) / $(($(successes $((BASE + 10))) - before1)) | $(copies) |")
    say "$label: ${ROWS[-1]}"
}
# The reference: Triton alone (its own copy, loaded here and unloaded after).
curl -s -o /dev/null -XPOST "127.0.0.1:$BASE/v2/repository/models/sequence_sum/load"
run "direct to t0, HTTP" "http://127.0.0.1:$BASE"
curl -s -o /dev/null -XPOST "127.0.0.1:$BASE/v2/repository/models/sequence_sum/unload"
until ! curl -s -XPOST -d '{}' "127.0.0.1:$BASE/v2/repository/index" | jq -e '.[] | select(.name == "sequence_sum" and (.state == "READY" or .state == "UNLOADING"))' >/dev/null; do sleep 0.1; done
run "infergate, HTTP JSON, numeric ids (cold, scaling out)" "http://127.0.0.1:$IG"
run "infergate, HTTP binary, string ids" "http://127.0.0.1:$IG" --binary --string-sequence-ids
run "infergate, gRPC, numeric ids" "http://127.0.0.1:$((IG + 1))" --protocol grpc --sequence-id-start 100000
run "infergate, gRPC, string ids" "http://127.0.0.1:$((IG + 1))" --protocol grpc --string-sequence-ids --sequence-id-start 200000
START_ERRORS="$(cat "$TMP"/triton-*.log | grep -c "must specify the START flag" || true)"
LOAD_AFTER="$(loadavg)"

# ---------------------------------------------------------------- report
mkdir -p "$(dirname "$OUT")"
{
    echo "# Concurrent sequences through infergate ($DATE, $SHA)"
    echo
    echo "\`loadtest/sequences.sh\`: $CONCURRENCY sequences of $LENGTH requests at a time (\`infergate-load --sequence-length $LENGTH -c $CONCURRENCY --check\`, as \`perf_analyzer --sequence-length $LENGTH --concurrency-range $CONCURRENCY\`) on \`sequence_sum\` (direct sequence batching: one sequence slot per copy), $DURATION per run, over two Tritons ($TRITON_VERSION, started empty with default flags) behind infergate with \`scale_up_rps = 5\`, \`max_copies = 2\`. Every answer is checked to be its sequence's running sum."
    echo
    echo "| run | infer/s | p50 / p99 µs | answers checked | errors | served by t0 / t1 | copies after |"
    echo "|---|--:|--:|--:|---|--:|---|"
    printf '%s\n' "${ROWS[@]}"
    echo
    echo "Triton's \"must specify the START flag\" refusals in both logs: $START_ERRORS."
    echo
    echo "Machine: $CPU_MODEL, $NPROC cores, $MEM, $KERNEL; load average $LOAD_BEFORE before, $LOAD_AFTER after; binaries $BIN ($DIRTY uncommitted files). $((SECONDS - STARTED)) s in all."
} >"$OUT"
cat "$OUT"
((FAILED == 0 && START_ERRORS == 0)) || die "some sequences went wrong (see $OUT)"
