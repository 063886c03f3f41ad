#!/usr/bin/env bash
# loadtest/openai_stream.sh — what streaming through the gateway adds (issue 34): time to
# first token and time per output token, as a client sees them, through infergate against
# Triton direct, for the echo model (tests/models/echo_words: one event per word).
#
# One real Triton (CPU, default flags, started empty) with a copy of echo_words that sends
# its words STREAM_DELAY_MS apart (0: as fast as the python backend can, so that what the
# gateway adds is as visible as it can be), behind infergate (release build, placement
# reading the model's tokenizer from its repository). Three ways to the same model, each
# at c=1 and c=8 (loadtest/stream_timing.py, aiohttp: each client sends its next request
# when its stream has ended):
#   direct     Triton's POST /v2/models/echo_words/generate_stream
#   generate   the same request through infergate
#   openai     POST /v1/completions with stream: true through infergate (token counts,
#              OpenAI chunks)
# Each run: 3 warm-up streams, then STREAM_DURATION seconds measured. Every command runs
# under `timeout`; the measurement takes about 70 s (under 3 minutes).
#
# Writes loadtest/results/<date>-<short sha>-openai-stream.md and prints it.
#
# Knobs: STREAM_BASE_PORT=29800  STREAM_DURATION=8  STREAM_WORDS=32  STREAM_DELAY_MS=0
#        STREAM_BUILD=1 (0 skips the release build)  STREAM_BIN=\$CARGO_TARGET_DIR/release
#        STREAM_OUT=path.md
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BASE="${STREAM_BASE_PORT:-29800}"
DURATION="${STREAM_DURATION:-8}"
WORDS="${STREAM_WORDS:-32}"
DELAY="${STREAM_DELAY_MS:-0}"
BUILD="${STREAM_BUILD:-1}"
BIN="${STREAM_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release}"
[[ "$BIN" == /* ]] || BIN="$ROOT/$BIN"
SHA="$(git rev-parse --short HEAD)"
DATE="$(date +%F)"
OUT="${STREAM_OUT:-loadtest/results/$DATE-$SHA-openai-stream.md}"
PYTHON="$ROOT/.venv/bin/python"
WORKERS=auto
ACCESS_LOG=off
STARTED=$SECONDS

# shellcheck source=loadtest/lib.sh
source loadtest/lib.sh
on_exit() { stop_tritons; }

IG=$((BASE + 10))
require_triton
[[ -x "$PYTHON" ]] || die "no $PYTHON: run scripts/setup.sh once"
check_ports "$BASE" $((BASE + 1)) $((BASE + 2)) "$IG" $((IG + 2)) $((IG + 3))
build_release infergate
describe_machine src Cargo.toml Cargo.lock

# The echo model with its words DELAY ms apart, its tokenizer beside it.
mkdir -p "$TMP/models"
cp -r tests/models/echo_words "$TMP/models/"
sed -i "s/key: \"delay_ms\" value { string_value: \"[0-9]*\" }/key: \"delay_ms\" value { string_value: \"$DELAY\" }/" \
    "$TMP/models/echo_words/config.pbtxt"
grep -q "string_value: \"$DELAY\"" "$TMP/models/echo_words/config.pbtxt" || die "could not set delay_ms"

MEASURE_STARTED=$SECONDS
start_tritons "$TMP/models" "$BASE"
cat >"$TMP/infergate.toml" <<EOF2
$(listen_table "$IG" http metrics admin)

[placement]
model_repository = "$TMP/models"

[[backends]]
name = "triton"
http = "http://127.0.0.1:$BASE"
metrics = "http://127.0.0.1:$((BASE + 2))/metrics"

# The test model's tokenizer says 24 tokens of context; these prompts are longer.
[[models]]
name = "echo_words"
context_length = 4096
EOF2
start_infergate stream "$TMP/infergate.toml"
wait_http "http://127.0.0.1:$IG/v2/health/ready" 20 || { tail -20 "$TMP/stream.log" >&2; die "infergate never became ready"; }
# The first request places echo_words on the empty Triton.
timeout 60 curl -sf -o /dev/null -H 'content-type: application/json' -d '{"model":"echo_words","prompt":"a b"}' \
    "http://127.0.0.1:$IG/v1/completions" || die "echo_words never answered through infergate"

# run NAME KIND URL CLIENTS — one measurement; its JSON goes to $TMP/NAME-CLIENTS.json.
run() {
    timeout $((DURATION + 60)) "$PYTHON" loadtest/stream_timing.py --url "$3" --kind "$2" \
        --words "$WORDS" --concurrency "$4" --duration "$DURATION" >"$TMP/$1-$4.json" 2>"$TMP/$1-$4.err" ||
        { cat "$TMP/$1-$4.err" >&2; die "stream_timing.py failed ($1, c=$4)"; }
    [[ "$(jq .errors "$TMP/$1-$4.json")" == 0 ]] || die "$1 at c=$4 had errors: $(jq -r .first_error "$TMP/$1-$4.json")"
    say "$1 c=$4: $(jq -c '{streams_per_s, ttft_ms, per_token_ms}' "$TMP/$1-$4.json")"
}
field() { jq ".$3" "$TMP/$1-$2.json"; }

ROWS=()
RATIOS=()
for clients in 1 8; do
    run direct generate "http://127.0.0.1:$BASE" "$clients"
    run generate generate "http://127.0.0.1:$IG" "$clients"
    run openai openai "http://127.0.0.1:$IG" "$clients"
    for path in direct generate openai; do
        ROWS+=("$(jq -r --arg path "$path" '
            def ms: . * 100 | round / 100;
            "| \($path) | \(.concurrency) | \(.requests) | \(.streams_per_s * 10 | round / 10) | \(.tokens_per_answer | round) | \(.ttft_ms.p50 | ms) | \(.ttft_ms.p90 | ms) | \(.per_token_ms.p50 | ms) | \(.per_token_ms.p90 | ms) |"' \
            "$TMP/$path-$clients.json")")
    done
    for path in generate openai; do
        RATIOS+=("| $path | $clients | $(ratio "$(field "$path" "$clients" ttft_ms.p50)" "$(field direct "$clients" ttft_ms.p50)") | $(calc '%+.2f' "$(field "$path" "$clients" ttft_ms.p50) - $(field direct "$clients" ttft_ms.p50)") | $(ratio "$(field "$path" "$clients" per_token_ms.p50)" "$(field direct "$clients" per_token_ms.p50)") | $(calc '%+.3f' "$(field "$path" "$clients" per_token_ms.p50) - $(field direct "$clients" per_token_ms.p50)") |")
    done
done
MEASURE_S=$((SECONDS - MEASURE_STARTED))

mkdir -p "$(dirname "$OUT")"
{
    echo "# Streaming overhead: OpenAI and generate_stream through infergate against Triton direct ($DATE, $SHA)"
    echo
    echo "\`loadtest/openai_stream.sh\`: \`echo_words\` (python, decoupled, one instance; $WORDS words a stream, one event each, $DELAY ms apart) on one Triton ($TRITON_VERSION, default flags, started empty) behind infergate ($BIN). Clients: \`loadtest/stream_timing.py\` (aiohttp), closed loop; each run 3 warm-up streams then ${DURATION} s measured. Time to first token: request sent to the first event carrying text; per token: first such event to the last, over the events after the first. \`direct\` is Triton's \`generate_stream\`, \`generate\` the same through infergate, \`openai\` \`/v1/completions\` with \`stream: true\` through infergate (prompt tokens counted, OpenAI chunks written)."
    echo
    echo "| path | clients | streams | streams/s | tokens | TTFT p50 ms | TTFT p90 ms | per token p50 ms | per token p90 ms |"
    echo "|---|--:|--:|--:|--:|--:|--:|--:|--:|"
    printf '%s\n' "${ROWS[@]}"
    echo
    echo "Through infergate against Triton direct (p50):"
    echo
    echo "| path | clients | TTFT ratio | TTFT added ms | per-token ratio | per-token added ms |"
    echo "|---|--:|--:|--:|--:|--:|"
    printf '%s\n' "${RATIOS[@]}"
    echo
    echo "Machine: $CPU_MODEL, $NPROC cores, $MEM, $KERNEL; load average $LOAD_BEFORE before, $(loadavg) after; binaries $BIN ($DIRTY files changed since $SHA). ${MEASURE_S} s from Triton's start to the last run's end; $((SECONDS - STARTED)) s in all."
} >"$OUT"
cat "$OUT"
