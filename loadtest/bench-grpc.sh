#!/usr/bin/env bash
# loadtest/bench-grpc.sh — infergate's gRPC path next to Triton direct and nginx grpc_pass.
#
# One run, one machine, one real Triton (CPU, python add_sub from tests/models, explicit
# model control, started empty; the first gateway loads add_sub on its first request), the
# same KServe v2 ModelInfer load for each stage:
#   1. direct      straight to Triton's gRPC port
#   2. nginx       nginx (Debian package) grpc_pass, HTTP/2 listener, keep-alive upstream
#                  (loadtest/nginx/grpc.conf.template)
#   3. ig-off      infergate listen.grpc, validation off
#   4. ig-on       infergate listen.grpc, validation on (the default, as users run it)
# Load: `infergate-load --protocol grpc -i INPUT0:FP32:4 -i INPUT1:FP32:4 --check`, closed
# loop; at each concurrency level the stages take turns (direct, nginx, ig-off, ig-on at c=1,
# then at c=16, ...) so a change in machine load hits every stage alike. Each step is its own
# infergate-load invocation: warm-up, then several windows. The whole sequence runs
# BENCH_ROUNDS times, the stage order rotated each round, and every figure reported is the
# median over the rounds (the machine is shared: one slow round must not decide a ratio).
# Reported: infer/s, p50/p99, added latency vs direct, ratios to nginx and direct, proxy CPU
# µs/request (from /proc, warm-up included) and peak RSS (VmHWM), load average per step.
#
# Writes loadtest/results/<date>-<short sha>-grpc.md and prints it. Needs root only to
# `apt-get install nginx` when it is missing; needs scripts/setup.sh to have run once (the
# venv with nvidia-pytriton). Stays on loopback; stops only what it started (trap on exit).
# About 4½–5½ minutes with the defaults (more on a busy machine), plus the build.
#
# Knobs (environment):
#   BENCH_BASE_PORT=29500    ports used: base..base+2 (Triton http/grpc/metrics),
#                            base+10 (nginx), base+20..23, base+30..33, base+40..43 (infergate)
#   BENCH_WARMUP=1s BENCH_WINDOW=2s BENCH_WINDOWS=3   per step (infergate-load flags)
#   BENCH_CONCURRENCY="1 16 64"
#   BENCH_ROUNDS=3           times every stage is measured at every level (median reported)
#   BENCH_VALIDATION_OFF=1   0 drops the ig-off stage
#   BENCH_BEFORE=BINARY      an A/B: a fifth stage, ig-before, runs this other infergate
#                            binary exactly as ig-on (validation on), in the same turns
#   BENCH_PROXY_WORKERS=1    nginx worker_processes and infergate's server.workers;
#                            "auto" = one per core for both
#   BENCH_LOAD_THREADS=1     load generator threads
#   BENCH_ACCESS_LOG=on      on: both proxies write a line per request to a file; off: neither
#   BENCH_BUILD=1            0 skips `cargo build --release`
#   BENCH_OUT=path.md        results file (default loadtest/results/<date>-<sha>-grpc.md)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BASE="${BENCH_BASE_PORT:-29500}"
WARMUP="${BENCH_WARMUP:-1s}"
WINDOW="${BENCH_WINDOW:-2s}"
ROUNDS="${BENCH_ROUNDS:-3}"
WINDOWS="${BENCH_WINDOWS:-3}"
read -r -a LEVELS <<<"${BENCH_CONCURRENCY:-1 16 64}"
WORKERS="${BENCH_PROXY_WORKERS:-1}"
LOAD_THREADS="${BENCH_LOAD_THREADS:-1}"
ACCESS_LOG="${BENCH_ACCESS_LOG:-on}"
BUILD="${BENCH_BUILD:-1}"
SHA="$(git rev-parse --short HEAD)"
DATE="$(date +%F)"
OUT="${BENCH_OUT:-loadtest/results/$DATE-$SHA-grpc.md}"
BIN="$ROOT/target/release"
STARTED=$SECONDS

STAGES=(direct nginx ig-off ig-on)
[[ "${BENCH_VALIDATION_OFF:-1}" == 1 ]] || STAGES=(direct nginx ig-on)
BEFORE="${BENCH_BEFORE:+$(realpath "$BENCH_BEFORE")}"
[[ -n "$BEFORE" ]] && STAGES+=(ig-before)

# shellcheck source=loadtest/lib.sh
source loadtest/lib.sh
# tritonserver runs in its own process group (setsid) with its python stubs.
TRITON_PID=""
on_exit() {
    local i
    [[ -n "$TRITON_PID" ]] && kill -0 "$TRITON_PID" 2>/dev/null || return 0
    # TERM to the group lets Triton unload add_sub and end its stub; KILL after 10 s.
    kill -TERM -- "-$TRITON_PID" 2>/dev/null || kill -TERM "$TRITON_PID" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do kill -0 "$TRITON_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$TRITON_PID" 2>/dev/null || true
    wait "$TRITON_PID" 2>/dev/null || true
    TRITON_PID=""
}

require curl jq
ensure_nginx

# The venv (tritonserver, and numpy for the python stub); scripts/setup.sh makes it.
# shellcheck disable=SC1091
source scripts/env.sh >/dev/null 2>&1 || true
[[ -x "${TRITONSERVER:-}" ]] || die "no tritonserver in .venv: run scripts/setup.sh once"
[[ -x "$TRITON_BACKENDS/python/triton_python_backend_stub" ]] ||
    die "the python backend stub is not in place: run scripts/setup.sh once"

check_ports "$BASE" $((BASE + 1)) $((BASE + 2)) $((BASE + 10)) $((BASE + 20)) $((BASE + 21)) $((BASE + 22)) \
    $((BASE + 23)) $((BASE + 30)) $((BASE + 31)) $((BASE + 32)) $((BASE + 33)) $((BASE + 40)) $((BASE + 41)) \
    $((BASE + 42)) $((BASE + 43))
build_release infergate infergate-load

LOAD_ARGS=(--protocol grpc -i INPUT0:FP32:4 -i INPUT1:FP32:4 --check --threads "$LOAD_THREADS"
    --warmup "$WARMUP" --duration "$WINDOW" --windows "$WINDOWS" --json -q)

describe_machine src Cargo.toml Cargo.lock proto

# infergate with a gRPC listener in front of the one Triton; validation on or off.
infergate_config() { # http_port triton_http_port validation(true|false)
    cat <<EOF
$(listen_table "$1")

[[backends]]
name = "triton"
http = "http://127.0.0.1:$2"
grpc = "http://127.0.0.1:$(($2 + 1))"
capacity = "16GiB"

[validation]
enabled = $3
EOF
}

# One short gRPC run through a stage, before measuring: every answer must check.
check_grpc() { # stage url
    local out="$TMP/check-$1.json"
    "$BIN/infergate-load" --url "$2" --protocol grpc -i INPUT0:FP32:4 -i INPUT1:FP32:4 --check \
        --threads 1 --warmup 0s --duration 0.5s --windows 1 -c 2 --json -q >"$out" 2>"$out.err" ||
        { cat "$out.err" >&2; die "gRPC infer through $1 ($2) failed"; }
    jq -e '.steps[0].ok > 0 and .steps[0].errors == 0' "$out" >/dev/null ||
        die "gRPC infer through $1 ($2): $(jq -c '.steps[0] | {ok, errors_by_kind}' "$out")"
}

# measure STAGE URL C ROUND PROXY_PIDS... — one infergate-load step; JSON plus CPU figures.
measure() {
    local stage="$1" url="$2" c="$3" round="$4"; shift 4
    load_step "$TMP/$stage-c$c-r$round.json" "round $round $stage c=$c" "$url" "$c" "${BACKEND_PIDS[*]}" "$@"
}

# ---------------------------------------------------------------- Triton
TPORT="$BASE"
say "starting Triton (http :$TPORT, grpc :$((TPORT + 1)), nothing loaded; temp dir $TMP)"
# As scripts/triton.sh does: its own session, so the python stub can be stopped with it.
# Started empty: the first gateway loads add_sub on its first request (load_through); the
# direct stage and nginx then use that copy, and the other gateways adopt it.
setsid "$TRITONSERVER" --model-repository="$ROOT/tests/models" --backend-directory="$TRITON_BACKENDS" \
    --model-control-mode=explicit \
    --http-address=127.0.0.1 --http-port="$TPORT" \
    --grpc-address=127.0.0.1 --grpc-port=$((TPORT + 1)) \
    --metrics-address=127.0.0.1 --metrics-port=$((TPORT + 2)) --allow-metrics=true \
    --exit-timeout-secs=5 </dev/null >"$TMP/triton.log" 2>&1 &
TRITON_PID=$!
wait_http "http://127.0.0.1:$TPORT/v2/health/ready" 60 ||
    { tail -20 "$TMP/triton.log" >&2; die "Triton never became ready"; }
TRITON_VERSION="$(curl -s "127.0.0.1:$TPORT/v2" | jq -r .version)"

# ---------------------------------------------------------------- proxies
start_nginx nginx $((BASE + 10)) $((TPORT + 1)) grpc.conf.template
infergate_config $((BASE + 20)) "$TPORT" false >"$TMP/ig-off.toml"
infergate_config $((BASE + 30)) "$TPORT" true >"$TMP/ig-on.toml"
infergate_config $((BASE + 40)) "$TPORT" true >"$TMP/ig-before.toml"
IG_STAGES=()
for s in "${STAGES[@]}"; do [[ "$s" == ig-* ]] && IG_STAGES+=("$s"); done
for s in "${IG_STAGES[@]}"; do
    if [[ "$s" == ig-before ]]; then start_infergate "$s" "$TMP/$s.toml" "$BEFORE"; else start_infergate "$s" "$TMP/$s.toml"; fi
done
declare -A URL=([direct]="http://127.0.0.1:$((TPORT + 1))" [nginx]="http://127.0.0.1:$((BASE + 10))"
    [ig-off]="http://127.0.0.1:$((BASE + 21))" [ig-on]="http://127.0.0.1:$((BASE + 31))"
    [ig-before]="http://127.0.0.1:$((BASE + 41))")
declare -A ADMIN=([ig-off]=$((BASE + 23)) [ig-on]=$((BASE + 33)) [ig-before]=$((BASE + 43)))
wait_port $((BASE + 10)) || die "nginx did not start: $(cat "$TMP/nginx-nginx/error.log")"
for s in "${IG_STAGES[@]}"; do
    wait_port "${URL[$s]##*:}" || die "infergate $s did not start: $(tail "$TMP/$s.log")"
done
first="${IG_STAGES[0]}"
load_through "$first" "http://127.0.0.1:$((${URL[$first]##*:} - 1))" add_sub
wait_http "http://127.0.0.1:$TPORT/v2/models/add_sub/ready" 60 || die "add_sub never became ready on Triton"
for s in "${IG_STAGES[@]}"; do wait_placement "$s" "${ADMIN[$s]}" add_sub; done
# Backend CPU: tritonserver and its python stub (a child process, one per loaded model, so
# read once the model is loaded).
read -r -a BACKEND_PIDS <<<"$TRITON_PID $(children "$TRITON_PID")"
for s in "${STAGES[@]}"; do check_grpc "$s" "${URL[$s]}"; done
PLACEMENT="$(curl -s "127.0.0.1:${ADMIN[ig-on]}/admin/placement" |
    jq -c '[.backends[] | {name, models: [.models[] | {name, state}]}]')"

declare -A PROXY_PIDS=([direct]="" [nginx]="${PID[nginx]} $(children "${PID[nginx]}")")
for s in "${IG_STAGES[@]}"; do PROXY_PIDS[$s]="${PID[$s]}"; done

# ---------------------------------------------------------------- measuring, in turns
MEASURE_STARTED=$SECONDS
for ((r = 1; r <= ROUNDS; r++)); do
    for c in "${LEVELS[@]}"; do
        # Rotate the order each round so no stage always follows the same one.
        for ((i = 0; i < ${#STAGES[@]}; i++)); do
            s="${STAGES[$(((i + r - 1) % ${#STAGES[@]}))]}"
            # shellcheck disable=SC2086
            measure "$s" "${URL[$s]}" "$c" "$r" ${PROXY_PIDS[$s]}
        done
    done
done
MEASURE_S=$((SECONDS - MEASURE_STARTED))
declare -A HWM
for s in nginx "${IG_STAGES[@]}"; do
    # shellcheck disable=SC2086
    HWM[$s]="$(hwm_kib ${PROXY_PIDS[$s]})"
done
HWM[triton]="$(hwm_kib "${BACKEND_PIDS[@]}")"
LOAD_AFTER="$(loadavg)"
STUBS_AFTER="$(pgrep -c -P "$TRITON_PID" || true)"
ELAPSED=$((SECONDS - STARTED))

# ---------------------------------------------------------------- report
f() { # f stage-cC field — the field's median over the rounds
    local r
    for ((r = 1; r <= ROUNDS; r++)); do jq -r ".steps[0]$2" "$TMP/$1-r$r.json"; done | median
}
fint() { calc %.0f "$(f "$@")"; } # the same, rounded to an integer
cpu_of() { # cpu_of stage-cC column(1 proxy, 2 Triton) — median over the rounds
    local r
    local m
    m="$(for ((r = 1; r <= ROUNDS; r++)); do cut -d' ' -f"$2" "$TMP/$1-r$r.json.cpu"; done | grep -v '^-$' | median)"
    if [[ "$m" == - ]]; then echo -; else calc %.1f "$m"; fi
}
spread() { # lowest–highest throughput over the rounds
    local r
    for ((r = 1; r <= ROUNDS; r++)); do jq -r '.steps[0].throughput_rps | floor' "$TMP/$1-r$r.json"; done |
        sort -n | sed -n '1p;$p' | paste -sd '-' | sed 's/-/–/'
}
errors_of() { local r t=0; for ((r = 1; r <= ROUNDS; r++)); do t=$((t + $(jq '.steps[0].errors' "$TMP/$1-r$r.json"))); done; echo "$t"; }
load_of() { local r; calc %.2f "$(for ((r = 1; r <= ROUNDS; r++)); do cat "$TMP/$1-r$r.json.load"; done | median)"; }
label() {
    case "$1" in
        direct) echo "direct to Triton" ;;
        nginx) echo "nginx grpc_pass" ;;
        ig-off) echo "infergate, validation off" ;;
        ig-on) echo "infergate, validation on" ;;
        ig-before) echo "infergate before (\`$BEFORE\`), validation on" ;;
    esac
}

main_table() {
    local c s k d thr p50 p99 dp50 dp99
    echo "| stage | c | infer/s | p50 µs | p99 µs | added p50 µs | added p99 µs | proxy CPU µs/req | Triton CPU µs/req | errors | infer/s, lowest–highest round | load avg |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for c in "${LEVELS[@]}"; do
        d="direct-c$c"
        for s in "${STAGES[@]}"; do
            k="$s-c$c"
            thr="$(f "$k" .throughput_rps)"; p50="$(fint "$k" .latency_us.p50)"; p99="$(fint "$k" .latency_us.p99)"
            if [[ "$s" == direct ]]; then dp50="—"; dp99="—"; else
                dp50=$((p50 - $(fint "$d" .latency_us.p50))); dp99=$((p99 - $(fint "$d" .latency_us.p99)))
            fi
            printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$(label "$s")" "$c" \
                "$(calc %.0f "$thr")" "$p50" "$p99" "$dp50" "$dp99" "$(cpu_of "$k" 1)" "$(cpu_of "$k" 2)" \
                "$(errors_of "$k")" "$(spread "$k")" "$(load_of "$k")"
        done
    done
}

ratio_table() {
    local c s k n d
    echo "| stage | c | throughput × nginx | throughput × direct | p50 × nginx | p99 × nginx | added p50 × nginx | added p99 × nginx | proxy CPU/req × nginx |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    for s in "${IG_STAGES[@]}"; do
        for c in "${LEVELS[@]}"; do
            k="$s-c$c"; n="nginx-c$c"; d="direct-c$c"
            printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$(label "$s")" "$c" \
                "$(ratio "$(f "$k" .throughput_rps)" "$(f "$n" .throughput_rps)")" \
                "$(ratio "$(f "$k" .throughput_rps)" "$(f "$d" .throughput_rps)")" \
                "$(ratio "$(f "$k" .latency_us.p50)" "$(f "$n" .latency_us.p50)")" \
                "$(ratio "$(f "$k" .latency_us.p99)" "$(f "$n" .latency_us.p99)")" \
                "$(ratio $(($(fint "$k" .latency_us.p50) - $(fint "$d" .latency_us.p50))) $(($(fint "$n" .latency_us.p50) - $(fint "$d" .latency_us.p50))))" \
                "$(ratio $(($(fint "$k" .latency_us.p99) - $(fint "$d" .latency_us.p99))) $(($(fint "$n" .latency_us.p99) - $(fint "$d" .latency_us.p99))))" \
                "$(ratio "$(cpu_of "$k" 1)" "$(cpu_of "$n" 1)")"
        done
    done
}

WORKERS_LABEL="$WORKERS"
[[ "$WORKERS" == auto ]] && WORKERS_LABEL="one per core ($NPROC)"

report() {
    echo "# infergate gRPC benchmark: $DATE, commit $SHA"
    echo
    echo "Produced by \`loadtest/bench-grpc.sh\` in ${ELAPSED} s (${BUILD_S} s of it building, ${MEASURE_S} s measuring)."
    echo
    echo "## Machine and setup"
    echo
    echo "- Machine: $NPROC × $CPU_MODEL, $MEM memory, $KERNEL."
    echo "- Load average (1, 5, 15 min): $LOAD_BEFORE before, $LOAD_AFTER after. The machine is shared: the per-step load average is in the table; compare stages within this run, and prefer CPU per request (from /proc/PID/stat, warm-up included, requests estimated from the measured rate), which is less sensitive to other work than throughput."
    echo "- infergate: commit $SHA$( ((DIRTY)) && echo " plus $DIRTY uncommitted changed paths under src/, proto/, Cargo.toml, Cargo.lock at run time"), release profile, \`listen.grpc\` with the backend's \`grpc\` URL (one HTTP/2 connection to Triton per worker). nginx: $("$NGINX" -v 2>&1 | cut -d/ -f2) (Debian package), config \`loadtest/nginx/grpc.conf.template\` (\`grpc_pass\`, \`listen ... http2\`, keep-alive upstream: nginx sends one request at a time on each upstream connection). Triton: $TRITON_VERSION (nvidia-pytriton wheel, CPU, python backend, \`add_sub\` from tests/models, explicit model control)."
    echo "- Load: \`infergate-load --protocol grpc -i INPUT0:FP32:4 -i INPUT1:FP32:4 --check\` (KServe v2 \`ModelInfer\`, tensors as \`raw_input_contents\`), closed loop, one HTTP/2 connection per concurrent worker (the tool's default), warm-up $WARMUP then $WINDOWS × $WINDOW windows per step, $LOAD_THREADS load-generator thread(s); the stages take turns at each concurrency level, and the whole sequence ran $ROUNDS times (stage order rotated each round)."
    echo "- Proxies: $WORKERS_LABEL worker(s) each (nginx \`worker_processes\`, infergate \`server.workers\`). Access logs: $ACCESS_LOG for both (a line per request to a file)."
    echo "- Triton CPU counts tritonserver and its python stub process. Python stubs left under Triton at the end: $STUBS_AFTER (1 expected: add_sub)."
    echo "- Placement (validation-on infergate, /admin/placement after start): \`$PLACEMENT\`."
    echo
    echo "## Throughput and latency"
    echo
    echo "Every figure is the median over the $ROUNDS rounds (percentiles: the median of each round's percentile). Added latency is the stage's percentile minus direct's at the same concurrency. Errors are summed over the rounds."
    echo
    main_table
    echo
    echo "## infergate as a ratio of nginx and of direct"
    echo
    ratio_table
    echo
    echo "## Peak RSS (VmHWM)"
    echo
    echo "| process | peak RSS | × nginx |"
    echo "|---|---:|---:|"
    local s
    for s in nginx "${IG_STAGES[@]}"; do
        echo "| $(label "$s")$([[ $s == nginx ]] && echo " (master + workers)") | $(calc %.1f "${HWM[$s]} / 1024") MiB | $(ratio "${HWM[$s]}" "${HWM[nginx]}") |"
    done
    echo "| Triton (tritonserver + python stub, for scale) | $(calc %.1f "${HWM[triton]} / 1024") MiB | |"
}

mkdir -p "$(dirname "$OUT")"
report >"$OUT"
cat "$OUT"
say "wrote $OUT"
